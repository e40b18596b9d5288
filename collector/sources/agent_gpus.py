"""The GPU section of an agent's evidence document → each pod's `PodGpuEvidence` (`agents.parse_evidence`).

Version 1 lists one object a GPU. Version 2 holds the same entries column by column: each key of a
version 1 entry maps to a list with one value a GPU, in order. Version 3 (what the reader asks for:
`?version=3`) is version 2 with the columns read here only, and is read as version 2.
A pod's devices are then packed from slices of the columns (`PodGpuEvidence.from_columns`), without a
dict or a `GpuDevice` a GPU: at fleet size (360,000 GPUs every 30 s) the per-GPU objects were the
poller's cost. A device with anything rarer than readings, flags and throttle reasons (an XID, an XID's
age, a value that does not pack) takes the general path (`_device`) from its entry, the same in both
versions; tests/agent/test_evidence_columns.py holds the two versions' records equal byte for byte.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable
from datetime import datetime
from sys import intern
from typing import Any

from collector.gpu import Columns, GpuDevice, NodeColumns, PodGpuEvidence, uuid_at
from collector.gpupack import ENERGY_MAX_W, ENERGY_WINDOW_MAX_S, MAX_SENT_BYTES, MAX_SENT_DEVICES, sent_problem

MAX_RECORD_CHARS = 4 * -(-MAX_SENT_BYTES // 3)  # the largest record a controller takes, in base64 (19,128)

# Names longer than any real one (Kubernetes: a DNS subdomain, 253; NVML: a GPU/MIG UUID, ~44; a DRA
# device name, 63 per segment) are refused, not cut: two cut names could become one.
MAX_NAME = 253
MAX_UUID = 128
MAX_CONTAINERS = 64  # container names read from a packed record's pod (Kubernetes allows more; a GPU pod has a few)
MAX_XID_CODES = 64  # XID codes read per GPU from one document (NVIDIA's catalogue has 172; a GPU shows a few)


def _f(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _i(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _entries(v: object) -> list[Any]:
    """A list field of the document: anything else (an agent of another build, a hostile peer)
    holds no entries."""
    return v if isinstance(v, list) else []


def _name(v: object, limit: int = MAX_NAME) -> str | None:
    """A name field within `limit` characters (None: absent, not a string, or too long); interned,
    as every document repeats it and the controller holds it until the next one."""
    return intern(v) if isinstance(v, str) and 0 < len(v) <= limit else None


def _uuid(v: object) -> str | None:
    """A GPU/MIG UUID within `MAX_UUID` characters, not interned: `collector.gpu` packs a canonical one
    in 16 bytes (interned, 8 a pod left the names' table ~380 B a pod larger: it does not shrink)."""
    return v if isinstance(v, str) and 0 < len(v) <= MAX_UUID else None


def _pod_key(v: object) -> tuple[str, str] | None:
    """(namespace, pod) of an entry naming a pod (None: no pod name, or a name no pod can have)."""
    if not isinstance(v, dict):
        return None
    pod = _name(v.get("pod"))
    ns = v.get("namespace") or ""
    if pod is None or not isinstance(ns, str) or len(ns) > MAX_NAME:
        return None
    return intern(ns), pod


def _reasons(v: object) -> tuple[str, ...]:
    """Clocks-event reason names (bounded: NVML defines nine; a hostile peer's list is cut)."""
    if not isinstance(v, list):
        return ()
    return tuple(sorted({x[:40] for x in v[:16] if isinstance(x, str) and x}))


def _energy(v: object, doc_at: float | None) -> tuple[float, float, float] | None:
    """[from, to, joules] on the agent's clock → (joules, from, to seconds before the document's
    instant); None where it does not hold together (a hostile or broken peer's numbers)."""
    if doc_at is None or not isinstance(v, list) or len(v) != 3:
        return None
    a, b, j = v
    if not (type(a) is float and type(b) is float and type(j) is float):
        a, b, j = _f(a), _f(b), _f(j)
        if a is None or b is None or j is None:
            return None
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(j) and math.isfinite(doc_at)):
        return None
    from_s, to_s = doc_at - a, doc_at - b
    if not (0 <= to_s < from_s <= ENERGY_WINDOW_MAX_S) or not 0 <= j <= ENERGY_MAX_W * (b - a):
        return None
    return j, from_s, to_s


def _ratio(v: object) -> float | None:
    x = _f(v)
    return x if x is not None and 0.0 <= x <= 1.0 else None


def _rate(v: object) -> float | None:
    x = _f(v)
    return x if x is not None and math.isfinite(x) and 0.0 <= x < 1e13 else None  # bytes/s: 10 TB/s is no GPU link


def _xid_ages(first_seen: Any, doc_at: float | None) -> tuple[tuple[int, float], ...]:
    """`xid_first_seen` ({"code": unix seconds on the agent's clock}) as (code, seconds before the
    document's `at`): ages survive the agent's clock being off; an entry that is not a code and a time
    at or before `at`, or with no `at` to age it by, is left out."""
    if not isinstance(first_seen, dict) or doc_at is None:
        return ()
    out: list[tuple[int, float]] = []
    for code, at in list(first_seen.items())[:MAX_XID_CODES]:
        t = _f(at)
        if isinstance(code, str) and code.isascii() and code.isdigit() and len(code) <= 4 and t is not None \
                and doc_at - t >= 0:
            out.append((int(code), doc_at - t))
    return tuple(sorted(out))


def _count(ecc: Any) -> int | None:
    """The volatile count of an `ecc_uncorrected` object ({"volatile": n, "aggregate": n}); None
    where it is missing or not a count."""
    n = _i(ecc.get("volatile")) if isinstance(ecc, dict) else None
    return n if n is not None and 0 <= n < 1 << 53 else None


def _device(g: dict[str, Any], uuid: str, doc_at: float | None, xids_by_uuid: dict[str, set[int]]) -> GpuDevice:
    """A GPU's entry of the document, any field (both versions)."""
    energy = _energy(g.get("energy"), doc_at)
    return GpuDevice(uuid=uuid, index=_i(g.get("index")), utilization=_f(g.get("utilization")),
                     sm_active=_f(g.get("sm_active")), power_w=_f(g.get("power_w")),
                     power_limit_w=_f(g.get("power_limit_w")), lost=g.get("lost") is True,
                     hang_hint=g.get("hang_hint") is True, xids=tuple(sorted(xids_by_uuid.get(uuid, ()))),
                     shared=g.get("shared") is True, sm_clock_hz=_f(g.get("sm_clock_hz")),
                     clock_reasons=_reasons(g.get("clocks_event_reasons")),
                     memory_util=_ratio(g.get("memory_util")), pcie_bps=_rate(g.get("pcie_bps")),
                     nvlink_bps=_rate(g.get("nvlink_bps")), energy_j=energy[0] if energy else None,
                     energy_from_s=energy[1] if energy else None, energy_to_s=energy[2] if energy else None,
                     remap_pending=g.get("remap_pending") is True, remap_failed=g.get("remap_failed") is True,
                     xid_ages=_xid_ages(g.get("xid_first_seen"), doc_at),
                     ecc_uncorrected=_count(g.get("ecc_uncorrected")))


# A pod's GPUs: its devices (v1, and devices of `allocations`) or indexes into the columns (v2)
_Held = tuple[list[GpuDevice], list[int], set[str]]


def gpu_evidence(doc: dict[str, Any], version: int, node: str, read_at: datetime, url: str, nvml_ok: bool,
                 problems: list[str]) -> tuple[PodGpuEvidence, ...]:
    """Each pod's GPU evidence in `doc` (`gpus`, `xids`, `allocations`; `version` 1, 2 or 3), by pod."""
    xids_by_uuid: dict[str, set[int]] = {}
    for x in _entries(doc.get("xids")):
        uuid = _uuid(x.get("uuid")) if isinstance(x, dict) else None
        code = _i(x.get("code")) if uuid is not None else None
        if uuid is not None and code is not None:
            xids_by_uuid.setdefault(uuid, set()).add(code)
    doc_at = _f(doc.get("at"))
    pods: dict[tuple[str, str], _Held] = {}
    listed: set[str] = set()
    gpus = doc.get("gpus")
    table = _Table(gpus if isinstance(gpus, dict) else {}, url, problems) if version >= 2 else None
    if table is not None and gpus is not None and not isinstance(gpus, dict):
        problems.append(f"{url}: version {version} but its GPUs are not an object of columns: none read")
    if table is not None:
        last: object = None
        last_held: _Held | None = None
        last_container = ""
        for i, uuid in enumerate(table.uuids):
            if uuid is None:
                problems.append(f"{url}: a GPU entry without a uuid (or one over {MAX_UUID} characters) skipped")
                continue
            held = False
            for p in _entries(table.pods[i]):
                if p is not last:  # (consecutive GPUs of a pod name it alike: its entry and container once)
                    if p != last:
                        key = _pod_key(p)
                        last_held = None if key is None else pods.get(key)
                        if key is not None and last_held is None:
                            last_held = pods[key] = ([], [], set())
                        last_container = _name(p.get("container")) or "" if last_held is not None else ""
                    last = p
                if last_held is not None:
                    last_held[1].append(i)
                    last_held[2].add(last_container)
                    held = True
            if held:
                listed.add(uuid)
    else:
        for g in _entries(gpus):
            uuid = _uuid(g.get("uuid")) if isinstance(g, dict) else None
            if uuid is None:
                problems.append(f"{url}: a GPU entry without a uuid (or one over {MAX_UUID} characters) skipped")
                continue
            dev = _device(g, uuid, doc_at, xids_by_uuid)
            for p in _entries(g.get("pods")):
                key = _pod_key(p)
                if key is not None:
                    devs, _, containers = pods.setdefault(key, ([], [], set()))
                    devs.append(dev)
                    containers.add(_name(p.get("container")) or "")
                    listed.add(uuid)
    sent = _sent(doc, node, read_at, url, xids_by_uuid, problems) if version >= 4 else {}
    if sent and doc.get("allocations"):
        listed.update(uuid_at(e, i) for e in sent.values() for i in range(e.device_count))
    # Devices the kubelet allocated that NVML does not list (a GPU gone entirely) still count as held;
    # a ResourceClaim's device the agent found no UUID for (`resolved: false`) is held, not lost.
    for a in _entries(doc.get("allocations")):
        device = _uuid(a.get("device")) if isinstance(a, dict) else None
        key = _pod_key(a) if device is not None and device not in listed else None  # (most are listed)
        if key is not None and device is not None:
            devs, _, containers = pods.setdefault(key, ([], [], set()))
            devs.append(GpuDevice(uuid=device, lost=nvml_ok and a.get("resolved") is not False,
                                  shared=a.get("shared") is True))
            containers.add(_name(a.get("container")) or "")
    for key in sent.keys() & pods.keys():
        problems.append(f"{url}: {key[0]}/{key[1]} both sent packed and by its GPUs: the packed record left out")
        del sent[key]
    out = []
    for (ns, pod), (devs, idx, cs) in sorted(pods.items()):
        names = tuple(sorted(c for c in cs if c))
        ev = None
        if table is not None and idx and not devs:
            ev = PodGpuEvidence.from_columns(ns, pod, node, "agent", read_at, table.packed(doc_at, xids_by_uuid),
                                             idx, names)
        if ev is None:
            if idx:
                assert table is not None
                devs = [table.device(i, doc_at, xids_by_uuid) for i in idx] + devs
            ev = PodGpuEvidence(ns, pod, node, "agent", read_at, tuple(devs), names)
        out.append(ev)
    if sent:
        out += sent.values()
        out.sort(key=lambda e: (e.namespace, e.pod))
    return tuple(out)


def _sent(doc: dict[str, Any], node: str, read_at: datetime, url: str, xids_by_uuid: dict[str, set[int]],
          problems: list[str]) -> dict[tuple[str, str], PodGpuEvidence]:
    """Version 4's `records`: each pod's devices as `PodGpuEvidence` packs them (base64), checked as its
    columns would be (`PodGpuEvidence.from_sent`), with their containers and each device's clocks-event
    reasons. A record that does not hold, a pod named twice, or a device with an XID in the document
    (its XIDs are read from the columns) is left out and named."""
    out: dict[tuple[str, str], PodGpuEvidence] = {}
    twice: set[tuple[str, str]] = set()
    for r in _entries(doc.get("records")):
        key = _pod_key(r)
        raw = r.get("record") if key is not None else None
        if key is None or type(raw) is not str or len(raw) > MAX_RECORD_CHARS:
            problems.append(f"{url}: a packed record without a pod or a record (or one over {MAX_RECORD_CHARS} "
                            "characters) skipped")
            continue
        ns, pod = key
        try:
            p = binascii.a2b_base64(raw, strict_mode=True)
        except (binascii.Error, ValueError):
            p = b""
        rs = r.get("reasons")
        reasons = None if rs is None else \
            [_reasons(x) if x else () for x in rs[:MAX_SENT_DEVICES + 1]] if type(rs) is list else []
        cs = r.get("containers")
        names = tuple(sorted({c for c in map(_name, cs[:MAX_CONTAINERS]) if c})) if type(cs) is list else ()
        ev = PodGpuEvidence.from_sent(ns, pod, node, "agent", read_at, p, reasons, names)
        if ev is None:
            why = sent_problem(p) or "its reasons not one a device"
            problems.append(f"{url}: {ns}/{pod}'s packed record left out: {why}")
        elif xids_by_uuid and any(uuid_at(ev, i) in xids_by_uuid for i in range(ev.device_count)):
            problems.append(f"{url}: {ns}/{pod}'s packed record left out: a device of it has XIDs")
        elif key in out or key in twice:
            problems.append(f"{url}: {ns}/{pod} sent packed twice: left out")
            out.pop(key, None)
            twice.add(key)
        else:
            out[key] = ev
    return out


# version 2's columns read as readings, in `gpudevice._READINGS`' order (the energy window's three after)
_READING_COLUMNS: tuple[tuple[str, Callable[[object], float | None]], ...] = (
    ("utilization", _f), ("sm_active", _f), ("power_w", _f), ("power_limit_w", _f), ("sm_clock_hz", _f),
    ("memory_util", _ratio), ("pcie_bps", _rate), ("nvlink_bps", _rate))
_FLAGS = ("lost", "hang_hint", "shared", "remap_pending", "remap_failed")
_FLOAT_NONE, _INT_NONE = {float, type(None)}, {int, type(None)}
_ON_FLOATS = (_f, _ratio, _rate)


class _Table:
    """Version 2's `gpus`: the columns, each checked once a document (a column not a list of one value a
    GPU is left out and named: its key absent on every GPU, as in version 1)."""

    def __init__(self, gpus: dict[str, Any], url: str, problems: list[str]) -> None:
        raw = gpus.get("uuid")
        raw = raw if isinstance(raw, list) else []
        n = len(raw)
        self.cols: dict[str, list[Any]] = {}
        bad = []
        for k, c in gpus.items():
            if isinstance(c, list) and len(c) == n:
                self.cols[k] = c
            else:
                bad.append(k[:64])
        if bad:
            problems.append(f"{url}: GPU columns not lists of one value a GPU ({n}), left out: "
                            f"{', '.join(sorted(bad)[:8])}")
        self.n = n
        self.uuids = [_uuid(u) for u in raw]
        self.pods: list[Any] = self.cols.get("pods") or [None] * n
        self._packed: NodeColumns | None = None

    def _col(self, key: str, conv: Callable[[object], Any]) -> list[Any] | None:
        """Column `key` converted as version 1 converts a value (None: absent on every GPU)."""
        c = self.cols.get(key)
        if c is None:
            return None
        out: list[Any]
        if conv is _flag:
            return [v is True for v in c] if True in c else None  # (`in` by ==: a 1 is read exactly)
        kinds = set(map(type, c))
        if kinds <= _FLOAT_NONE and conv in _ON_FLOATS:  # (what an agent sends: a list comprehension, not a call)
            out = c if conv is _f else [x if x is None or 0.0 <= x <= 1.0 else None for x in c] if conv is _ratio \
                else [x if x is None or 0.0 <= x < 1e13 else None for x in c]  # (`_rate`: NaN and ±inf fail too)
        elif conv is _i and kinds <= _INT_NONE:
            out = c
        else:
            out = list(map(conv, c))
        return None if out.count(None) == len(out) else out

    def entry(self, i: int) -> dict[str, Any]:
        return {k: c[i] for k, c in self.cols.items()}

    def device(self, i: int, doc_at: float | None, xids_by_uuid: dict[str, set[int]]) -> GpuDevice:
        uuid = self.uuids[i]
        assert uuid is not None
        return _device(self.entry(i), uuid, doc_at, xids_by_uuid)

    def packed(self, doc_at: float | None, xids_by_uuid: dict[str, set[int]]) -> NodeColumns:
        """The columns checked and packed once (`NodeColumns`); a GPU with an XID or an XID's age beside it
        is left to the general path."""
        if self._packed is None:
            seen = self.cols.get("xid_first_seen")
            skip = [u is None or u in xids_by_uuid for u in self.uuids] if xids_by_uuid else None
            if seen is not None and doc_at is not None and any(seen):
                skip = skip or [False] * self.n
                for i, x in enumerate(seen):
                    if x and _xid_ages(x, doc_at):
                        skip[i] = True
            readings = [self._col(k, conv) for k, conv in _READING_COLUMNS]
            energy = self.cols.get("energy")
            if energy is not None and doc_at is not None:
                windows = [None if e is None else _energy(e, doc_at) for e in energy]
                if any(w is not None for w in windows):
                    readings += [[None if w is None else w[j] for w in windows] for j in range(3)]
            reasons = self.cols.get("clocks_event_reasons")
            self._packed = NodeColumns(Columns(
                self.uuids, self._col("index", _i), self._col("ecc_uncorrected", _count), readings,
                [self._col(k, _flag) for k in _FLAGS],
                None if reasons is None else [_reasons(r) if r else () for r in reasons]), skip)
        return self._packed


def _flag(v: object) -> bool:
    return v is True
