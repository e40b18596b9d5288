"""The agent's compact JSON evidence document (`GET /evidence`), read by the controller.

Version 1, or asked `?version=2`, version 2: the same, but `gpus` column by column, each key of a
GPU's entry to the list of its values, one a GPU, in order (the controller packs a pod's GPUs from
slices of them, not from an object a GPU). Asked `?version=3` (the controller does), version 3:
version 2 with what the controller reads only (`CONTROLLER_COLUMNS`; a GPU's pods without their
resource; no allocation a GPU's entry already says), about half its bytes. Parsed evidence only: GPU
readings with the pods holding each GPU (and whether several share it), when the agent first saw
each XID code on it and its ECC counts, device allocations (device plugins' and ResourceClaims'),
recent XIDs, and per container the progress samples, hang and XID findings its logs showed. No
raw log lines; the only free text (an XID's kernel message) is redacted where it is read.

Increments: the document names the log poller's `epoch` (this process) and `poll` (polls done).
A reader that sends them back (`/evidence?epoch=E&poll=P`) gets, for each container whose line
count at poll P is still known, only what came after: `after` is that count, `samples` are the
ones on later lines led by the last one before them (its loss may have been redrawn since), and
`hangs`/`xids` those on later lines. A container without `after` is whole (new to the reader, or
P is older than its marks); another epoch, or no cursor, gets every container whole. GPU readings
are always whole.

One bad entry costs only itself: a container (or GPU, or XID) whose entry JSON cannot hold (a step
number past 64 bits in a tenant's log) is left out and named under `errors`, and the rest of the
node's document is served.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson

from collector.agent.logs import ContainerLog
from collector.agent.nvml import CLOCKS_EVENT_REASONS, GpuReading, NvmlStatus
from collector.agent.podresources import Allocation
from collector.agent.xids import XidEvent
from collector.gpu import sendable
from collector.sources.agent_gpus import _pod_key, _uuid, gpu_evidence

VERSION = 1
VERSION_COLUMNS = 2  # `?version=2`: the GPUs column by column
VERSION_CONTROLLER = 3  # `?version=3`: version 2 with what the controller reads only
VERSION_PACKED = 4  # `?version=4`: version 3 with each pod's devices packed as the controller holds them (it asks)
# A GPU entry's keys the controller reads (`collector.sources.agent_gpus`): a reading it does not use
# (name, PCI address, memory, temperature, corrected ECC counts, ...) and the allocations the GPUs'
# entries repeat were half of every document's bytes and a sixth of the controller's decode, every
# pass. tests/agent/test_evidence_columns.py holds version 3's records and problems to version 1's.
CONTROLLER_COLUMNS = ("uuid", "index", "pods", "utilization", "sm_active", "power_w", "power_limit_w", "sm_clock_hz",
                      "memory_util", "pcie_bps", "nvlink_bps", "energy", "clocks_event_reasons", "lost", "hang_hint",
                      "shared", "remap_pending", "remap_failed", "xid_first_seen", "ecc_uncorrected")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the agent knows at one instant (what /metrics and /evidence render)."""

    node: str
    at: float
    nvml: NvmlStatus
    gpus: tuple[GpuReading, ...]
    hang_since: dict[str, float]
    hang_sustain_s: float
    allocations: tuple[Allocation, ...]
    podresources_up: bool
    podresources_last_success: float
    podresources_error: str
    xids: tuple[XidEvent, ...]
    logs: tuple[ContainerLog, ...]
    log_epoch: str = ""
    log_poll: int = 0  # log polls done when the snapshot was taken (a reader's next cursor)
    # uuid → XID code → when the agent first saw it (NVML events, kernel log): `XidCounter.first_seen`
    xid_first_seen: Mapping[str, Mapping[int, float]] = field(default_factory=dict)


def _iso(at: datetime | None) -> str | None:
    """`at.isoformat()`; for the UTC stamps the scanners make, orjson's spelling of it (the same
    text, about three times faster: a whole document formats one per sample)."""
    if at is None:
        return None
    if at.tzinfo is UTC:
        return orjson.dumps(at)[1:-1].decode()
    return at.isoformat()


def _loss(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return str(x)  # "nan", "inf", "-inf": JSON has no such numbers, and a NaN loss is evidence


def _gpu(r: GpuReading, snap: Snapshot, holders: dict[str, list[Allocation]]) -> dict[str, object]:
    since = snap.hang_since.get(r.uuid)
    sharers = len({(a.namespace, a.pod) for a in holders.get(r.uuid, [])})
    return {
        "index": r.index, "uuid": r.uuid, "name": r.name, "pci": r.pci, "parent_uuid": r.parent_uuid,
        "lost": r.lost, "error": r.error, "at": r.at,
        "utilization": r.utilization, "sm_active": r.sm_active,
        "power_w": r.power_w, "power_limit_w": r.power_limit_w,
        "sm_clock_hz": r.sm_clock_hz,
        # bandwidth: memory (share of time read or written), PCIe and NVLink bytes/s (TX + RX)
        "memory_util": r.memory_util, "pcie_bps": _sum(r.pcie_tx_bps, r.pcie_rx_bps),
        "nvlink_bps": _sum(r.nvlink_tx_bps, r.nvlink_rx_bps),
        # the energy counter's window on this agent's clock: [from, to, joules]; none without two points
        "energy": None if r.energy_from is None or r.energy_mj is None else
        [r.energy_from[0], r.at, (r.energy_mj - r.energy_from[1]) / 1000.0],
        # the clocks-event (throttle) reasons that hold its clocks down now, by name
        "clocks_event_reasons": None if r.clocks_event_reasons is None else
        [name for bit, name in CLOCKS_EVENT_REASONS if r.clocks_event_reasons & bit],
        "memory_used_bytes": r.memory_used_bytes, "memory_total_bytes": r.memory_total_bytes,
        "temperature_c": r.temperature_c, "remap_pending": r.remap_pending, "remap_failed": r.remap_failed,
        "hang_since": since, "hang_hint": since is not None and snap.at - since >= snap.hang_sustain_s,
        "pods": [{"namespace": a.namespace, "pod": a.pod, "container": a.container, "resource": a.resource}
                 for a in holders.get(r.uuid, [])],
        # several pods on one device (time-slicing, MPS, a shared claim): its readings are all of theirs
        "sharers": sharers, "shared": sharers > 1 or any(a.shared for a in holders.get(r.uuid, [])),
        "unsupported": sorted(r.unsupported),
        # when this agent first saw each XID code on the GPU (NVML events and the kernel log, never a
        # tenant's log), unix seconds by code: a fault's age, for the work-at-risk record
        "xid_first_seen": {str(code): at for code, at in sorted(snap.xid_first_seen.get(r.uuid, {}).items())},
        # NVML's uncorrected and corrected ECC error counts, volatile (since the driver loaded or the
        # GPU reset) and aggregate (the GPU's life); null where not read (no ECC, MIG, a failure)
        "ecc_uncorrected": _ecc(r, "uncorrected"), "ecc_corrected": _ecc(r, "corrected"),
    }


def _ecc(r: GpuReading, kind: str) -> dict[str, int] | None:
    counts = {scope: n for etype, scope, n in r.ecc if etype == kind}
    return counts or None


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _log(c: ContainerLog, samples: int) -> dict[str, object]:
    s = c.scan
    after = c.lines_then
    kept = s.samples[-samples:]
    hangs, xids, resumes = s.hangs, s.xids, s.resumes
    if after is not None:
        # the samples on later lines, led by the last one before them (a redraw may have changed
        # it); all of them (the agent keeps a bounded number), so the reader's history has no hole
        first = len(s.samples)
        while first > 0 and s.samples[first - 1].line > after:
            first -= 1
        if first == 0 and s.summary is not None and s.summary.dropped:
            after = None  # samples after the cursor may be gone already: whole, not a false gap
        else:
            kept = s.samples[max(0, first - 1):]
            hangs = tuple(h for h in hangs if h.line > after)
            xids = tuple(x for x in xids if x.line > after)
            resumes = tuple(r for r in resumes if r.line > after)
    return {
        "namespace": c.namespace, "pod": c.pod, "uid": c.uid, "container": c.container,
        "read_at": c.read_at, "lines": s.lines, "format": s.format, "after": after,
        # [step, at, loss, skipped, total, line]
        "samples": [[x.step, _iso(x.at), _loss(x.loss), x.skipped, x.total, x.line] for x in kept],
        "hangs": [{"kind": h.kind, "line": h.line, "collective": h.collective, "timeout_ms": h.timeout_ms,
                   "rank": h.rank, "at": _iso(h.at), "seq": h.seq, "completed": h.completed, "pg": h.pg}
                  for h in hangs],
        "xids": [{"code": x.code, "pci": x.pci, "line": x.line, "at": _iso(x.at)} for x in xids],
        # a trainer's resume or torchrun's worker-group restart: the only word of a restart inside
        # the container, which the claims need to tell replayed steps from progress
        "resumes": [{"line": r.line, "at": _iso(r.at), "step": r.step, "format": r.format} for r in resumes],
        # the newest tokens/s per GPU the trainer printed: [per GPU, at] (energy per token)
        "tokens": None if s.tokens is None else [s.tokens.per_gpu, _iso(s.tokens.at)],
        "diagnostics": list(s.diagnostics[-10:]),
    }


def _each(items: Iterable[_T], render: Callable[[_T], dict[str, object]], name: Callable[[_T], dict[str, object]],
          errors: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each item's entry, checked to serialize; one that does not is named in `errors` instead."""
    out = []
    for item in items:
        try:
            entry = render(item)
            orjson.dumps(entry)
        except (TypeError, ValueError) as e:  # orjson.JSONEncodeError is a TypeError
            errors.append({**name(item), "error": f"left out: {str(e)[:200]}"})
            continue
        out.append(entry)
    return out


def _columns(entries: list[Any]) -> dict[str, list[object]]:
    """Version 2's `gpus`: each key of the entries to the list of its values, one a GPU, in order (an
    entry that is not an object: none of them)."""
    rows = [e if isinstance(e, dict) else {} for e in entries]
    keys = dict.fromkeys(("uuid", *(k for e in rows for k in e)))
    return {k: [e.get(k) for e in rows] for k in keys}


def as_columns(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 document as version 2 (what the agent answers `?version=2`)."""
    gpus = doc.get("gpus")
    return {**doc, "version": VERSION_COLUMNS, "gpus": _columns(gpus if isinstance(gpus, list) else [])}


def for_controller(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 or 2 document as version 3 (what the agent answers `?version=3`): `CONTROLLER_COLUMNS`
    of its GPUs, column by column, each GPU's pods without their resource; the allocations no GPU's
    entry says (a GPU NVML no longer lists, one whose entry could not be rendered)."""
    v2 = as_columns(doc) if doc.get("version") != VERSION_COLUMNS else doc
    gpus = v2.get("gpus")
    cols = gpus if isinstance(gpus, dict) else {}
    out = {k: cols[k] for k in CONTROLLER_COLUMNS if k in cols}
    if "pods" in out:
        out["pods"] = [[{k: v for k, v in p.items() if k != "resource"} if isinstance(p, dict) else p for p in ps]
                       if isinstance(ps, list) else ps for ps in out["pods"]]
    # an allocation its device's entry already says (the pod among the GPU's pods): the reader reads a
    # device's allocations only where no entry lists it
    said = {(u, p.get("namespace"), p.get("pod")) for u, ps in zip(cols.get("uuid") or (), cols.get("pods") or (),
                                                                   strict=False)
            if isinstance(u, str) and isinstance(ps, list) for p in ps
            if isinstance(p, dict) and _str_or_none(p.get("namespace")) and _str_or_none(p.get("pod"))}
    allocations = v2.get("allocations")
    kept = [a for a in allocations if not isinstance(a, dict) or not _str_or_none(a.get("device"))
            or not _str_or_none(a.get("namespace")) or not _str_or_none(a.get("pod"))
            or (a.get("device"), a.get("namespace"), a.get("pod")) not in said] \
        if isinstance(allocations, list) else allocations
    return {**v2, "version": VERSION_CONTROLLER, "gpus": out, "allocations": kept}


def _str_or_none(v: object) -> bool:
    return isinstance(v, str | None)


def packed(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A version 3 document as version 4 (what the agent answers `?version=4`): each pod's devices the
    controller would pack from the columns, packed here as it packs them (`agent_gpus.gpu_evidence`,
    `gpu.sendable`) under `records`, base64, with the pod's containers and each device's clocks-event
    reasons; the columns keep the GPUs of every other pod (an XID, a UUID not canonical, a device only
    an allocation names, ...). The controller checks each record as it would the columns
    (`PodGpuEvidence.from_sent`) and holds it as it came: a pod's GPUs cost it a base64 decode and a
    check instead of parsing, converting and packing every reading (most of its cost at fleet size).
    tests/agent/test_evidence_packed.py holds version 4's records to version 3's."""
    gpus = doc.get("gpus")
    cols: dict[str, Any] = gpus if isinstance(gpus, dict) else {}
    uuids = cols.get("uuid")
    n = len(uuids) if isinstance(uuids, list) else 0
    if not isinstance(uuids, list) or not n or any(not isinstance(c, list) or len(c) != n for c in cols.values()):
        return {**doc, "version": VERSION_PACKED, "records": []}
    nv = doc.get("nvml")
    problems: list[str] = []
    evs = gpu_evidence({**doc, "allocations": []}, VERSION_CONTROLLER, str(doc.get("node") or ""), _PACKED_AT, "",
                       isinstance(nv, dict) and nv.get("state") == "ok", problems)
    allocations = doc.get("allocations")
    # a pod an allocation names holds a device no column lists: its record stays the columns' and the allocation's
    named = {_pod_key(a) for a in allocations} if isinstance(allocations, list) else set()
    records, keys = [], set()
    for ev in evs:
        sent = sendable(ev) if (ev.namespace, ev.pod) not in named else None
        if sent is None:
            continue
        record: dict[str, Any] = {"namespace": ev.namespace, "pod": ev.pod, "containers": list(ev.containers),
                                  "record": base64.b64encode(sent[0]).decode("ascii")}
        if sent[1] is not None:
            record["reasons"] = [list(r) for r in sent[1]]
        records.append(record)
        keys.add((ev.namespace, ev.pod))
    keep = []
    pods = cols.get("pods") or [None] * n
    left: list[Any] = list(pods)
    for i, (u, ps) in enumerate(zip(uuids, pods, strict=True)):
        if isinstance(ps, list) and ps and _uuid(u) is not None:  # (else: named as read)
            rest = [p for p in ps if _pod_key(p) not in keys]
            if not rest:
                continue
            left[i] = rest
        keep.append(i)
    out = {k: [c[i] for i in keep] for k, c in cols.items()} if keep else {}
    if "pods" in out:
        out["pods"] = [left[i] for i in keep]
    return {**doc, "version": VERSION_PACKED, "gpus": out, "records": records}


_PACKED_AT = datetime.fromtimestamp(0, UTC)  # (the records' read time: the controller's own replaces it)


def evidence_document(snap: Snapshot, *, samples: int = 256, version: int = VERSION) -> dict[str, Any]:
    doc = _document(snap, samples, VERSION_COLUMNS if version in (VERSION_CONTROLLER, VERSION_PACKED) else version)
    if version == VERSION_PACKED:
        return packed(for_controller(doc))
    return for_controller(doc) if version == VERSION_CONTROLLER else doc


def _document(snap: Snapshot, samples: int, version: int) -> dict[str, Any]:
    holders: dict[str, list[Allocation]] = {}
    for a in snap.allocations:
        holders.setdefault(a.device, []).append(a)
    errors: list[dict[str, object]] = []
    gpus = _each(snap.gpus, lambda r: _gpu(r, snap, holders), lambda r: {"gpu": r.uuid}, errors)
    xids = _each(snap.xids, _xid, lambda x: {"xid": x.code, "pci": str(x.pci)}, errors)
    logs = _each(snap.logs, lambda c: _log(c, samples),
                 lambda c: {"namespace": c.namespace, "pod": c.pod, "container": c.container}, errors)
    return {
        "version": version,
        "node": snap.node,
        "at": snap.at,
        "epoch": snap.log_epoch,
        "poll": snap.log_poll,
        "nvml": {"state": snap.nvml.state, "message": snap.nvml.message, "driver": snap.nvml.driver},
        "podresources": {"up": snap.podresources_up, "last_success": snap.podresources_last_success or None,
                         "error": snap.podresources_error},
        "gpus": _columns(gpus) if version == VERSION_COLUMNS else gpus,
        "allocations": [{"namespace": a.namespace, "pod": a.pod, "container": a.container,
                         "resource": a.resource, "device": a.device, "claim": a.claim, "driver": a.driver,
                         "pool": a.pool, "dra_device": a.dra_device, "shared": a.shared, "resolved": a.resolved}
                        for a in snap.allocations],
        "xids": xids,
        "logs": logs,
        "errors": errors,
    }


def _xid(x: XidEvent) -> dict[str, object]:
    return {"code": x.code, "uuid": x.uuid, "pci": x.pci, "origin": x.origin, "at": x.at,
            "meaning": x.meaning, "action": x.action, "message": x.message}
