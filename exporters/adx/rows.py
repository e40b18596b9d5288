"""Rows for the ADX tables, from the collector's records: pure functions plus the small state that
turns a stream of evaluations into transitions and periodic snapshots.

Free text (reasons, event messages, evidence values) is redacted here, before it reaches the spool.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.model import (
    BADPUT_CAUSES,
    CLAIM_NAMES,
    Claim,
    EventFacts,
    ObjectRecord,
    Observed,
    Ref,
    RunClaims,
    rfc3339,
)
from collector.progress.model import HANG_KINDS, LogScan
from collector.progress.xid import describe
from collector.redact import redact
from exporters.adx.schema import GPU_SAMPLES, GPU_XIDS, KUBE_EVENTS, PROGRESS_SAMPLES, RUN_CLAIMS, RUN_SNAPSHOTS

Row = dict[str, Any]
MAX_EVIDENCE = 8
MAX_VALUE = 256
_TICK = timedelta(microseconds=1)  # the finest step every store of the Timestamp keeps


def row_id(*parts: object) -> str:
    return hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU reading from a node agent."""

    at: datetime
    node: str
    gpu: int
    uuid: str = ""
    utilization: float | None = None
    memory_used_bytes: int | None = None
    power_watts: float | None = None
    temperature_c: float | None = None
    namespace: str = ""
    pod: str = ""
    run: str = ""


@dataclass(frozen=True, slots=True)
class GpuXid:
    """One XID error on a GPU, from a node agent (kernel log or NVML event)."""

    at: datetime
    node: str
    code: int
    gpu: int | None = None
    uuid: str = ""
    pci: str = ""
    meaning: str = ""
    action: str = ""
    namespace: str = ""
    pod: str = ""
    run: str = ""


def _text(s: str, limit: int = 1024) -> str:
    return redact(s[:limit])


def _run_columns(rc: RunClaims, cluster: str) -> Row:
    ctx = rc.extra
    return {
        "Cluster": cluster,
        "Namespace": rc.ref.namespace,
        "Run": rc.ref.name,
        "Kind": rc.ref.kind,
        "RunUid": rc.ref.uid,
        "Queue": str(ctx.get("queue") or ctx.get("cluster_queue") or ""),
        "Team": rc.ref.namespace,
    }


def _identity(rc: RunClaims) -> str:
    return rc.ref.uid or f"{rc.ref.kind}/{rc.ref.namespace}/{rc.ref.name}"


_LONG = 1 << 63


def _value(v: Any) -> Any:
    if isinstance(v, str):
        return _text(v, MAX_VALUE)
    if isinstance(v, int) and not -_LONG <= v < _LONG:
        return f"{v.bit_length()}-bit integer"  # evidence of a value no column or JSON reader holds
    if isinstance(v, int | float | bool) or v is None:
        return v
    return _text(str(v), MAX_VALUE)


def claim_row(rc: RunClaims, name: str, claim: Claim, previous: str, cluster: str,
              previous_since: datetime | None = None, at: datetime | None = None) -> Row:
    """A transition's row. Its RowId is made of the transition (from the previous verdict and its
    since to this one), so a claim going the same way again later is a new row, while replicas that
    saw the same transition write it under the same id."""
    ev = claim.evidence[:MAX_EVIDENCE]
    return {
        "Timestamp": rfc3339(at or rc.evaluated_at),
        "RowId": row_id(cluster, _identity(rc), name, previous, rfc3339(previous_since), claim.verdict.value,
                        claim.observed.value, rfc3339(claim.since)),
        **_run_columns(rc, cluster),
        "Claim": name,
        "Asserted": claim.asserted,
        "Observed": claim.observed.value,
        "Verdict": claim.verdict.value,
        "PreviousVerdict": previous,
        "Since": rfc3339(claim.since),
        "Reason": _text(claim.reason),
        "Planes": sorted({e.plane.value for e in claim.evidence}),
        "Evidence": [{"plane": e.plane.value, "ref": _text(e.ref, MAX_VALUE), "field": e.field,
                      "value": _value(e.value), "at": rfc3339(e.at)} for e in ev],
    }


def stall_cause(rc: RunClaims) -> str:
    """Why progressing is false, in a word; "" when it is not false."""
    p = rc.progressing
    if p.observed is not Observed.FALSE:
        return ""
    for e in p.evidence:
        if e.field in HANG_KINDS:
            return e.field
    for kind in HANG_KINDS:  # the reason names the hang even when its evidence item was cut
        if kind.replace("-", " ") in p.reason:
            return kind
    if rc.running.observed is Observed.FALSE and "CrashLoopBackOff" in rc.running.reason:
        return "crash-loop"
    if "suspected collective hang" in p.reason:
        return "gpus-busy"
    if "GPUs idle" in p.reason:
        return "gpus-idle"
    if p.cause == "invalid-steps":  # a loss that is NaN, infinite, or stuck at exactly 0.0
        return "invalid-loss"
    if p.cause in ("skipped-steps", "replaying"):  # replaying: below the pre-restart mark, not past it yet
        return p.cause
    if p.cause in ("not-running", "finished"):  # running false always makes progressing one of these
        return "not-running"
    return "no-progress"


def last_step(rc: RunClaims) -> int | None:
    for e in rc.progressing.evidence:
        if e.field == "last_step" and isinstance(e.value, int) and not isinstance(e.value, bool):
            return e.value
    return None


def evidence_age(rc: RunClaims) -> float | None:
    newest: dict[str, datetime] = {}
    for c in rc.claims.values():
        for e in c.evidence:
            if e.at is not None and (e.plane.value not in newest or e.at > newest[e.plane.value]):
                newest[e.plane.value] = e.at
    if not newest:
        return None
    return max(0.0, max((rc.evaluated_at - t).total_seconds() for t in newest.values()))


def snapshot_row(rc: RunClaims, cluster: str, rate: float | None) -> Row:
    g = rc.goodput
    b = rc.blocked
    return {
        "Timestamp": rfc3339(rc.evaluated_at),
        "RowId": row_id(cluster, _identity(rc), rfc3339(rc.evaluated_at)),
        **_run_columns(rc, cluster),
        "Finished": rc.finished,
        **{f"{n.capitalize()}Verdict": rc.claims[n].verdict.value for n in CLAIM_NAMES},
        **{f"{n.capitalize()}Observed": rc.claims[n].observed.value for n in CLAIM_NAMES},
        "BlockedStage": b.stage.value if b else "",
        "BlockedOwner": b.stage.owner if b else "",
        "BlockedSince": rfc3339(b.since) if b else None,
        "StallCause": stall_cause(rc),
        "LastStep": last_step(rc),
        "ProgressRate": rate,
        "QueuedSeconds": g.badput_s.get("queued") if g else None,
        "AllocatedSeconds": g.allocated_s if g else None,
        "ProductiveSeconds": g.productive_s if g else None,
        "GoodputRatio": g.ratio if g else None,
        "Badput": {k: round(g.badput_s.get(k, 0.0), 3) for k in BADPUT_CAUSES} if g else None,
        "EvidenceAgeSeconds": evidence_age(rc),
        **_queue_columns(rc),
        **_risk_columns(rc),
        "JoulesPerStep": rc.energy.joules_per_step if rc.energy is not None else None,  # issue 28
        "JoulesPerToken": rc.energy.joules_per_token if rc.energy is not None else None,
    }


def _risk_columns(rc: RunClaims) -> Row:
    """Work at risk and its nodes, and the straggler suspects: what the drain advisor and the lemon
    score read from history (queries/drain_advisor.kql, queries/gpu_lemons.kql)."""
    w = rc.work_at_risk
    st = rc.stragglers
    return {
        "WorkAtRiskGpuHours": None if w is None or w.gpu_hours is None else round(w.gpu_hours, 4),
        "LastCheckpoint": rfc3339(w.checkpoint_at) if w is not None else None,
        "Nodes": [{"Node": _text(n.node, MAX_VALUE), "Gpus": n.gpus,
                   "GpuHoursAtRisk": None if n.gpu_hours is None else round(n.gpu_hours, 4),
                   "Risk": round(n.score, 1), "Signals": list(n.signals)} for n in w.nodes] if w is not None else [],
        "Stragglers": [{"Kind": x.kind, "Rank": _text(x.rank, MAX_VALUE), "Pod": _text(x.pod, MAX_VALUE),
                        "Node": _text(x.node, MAX_VALUE), "GpuUuid": _text(x.gpu, MAX_VALUE), "Basis": x.basis,
                        "LagRatio": round(x.lag_ratio, 4)} for x in st.suspects] if st is not None else [],
    }


def _suspects(rc: RunClaims) -> str:
    """Who the run's straggler suspects are, as one word: a snapshot is written when it changes."""
    st = rc.stragglers
    return ",".join(sorted(f"{x.pod}/{x.rank}/{x.gpu}" for x in st.suspects)) if st is not None else ""


def _queue_columns(rc: RunClaims) -> Row:
    q = rc.queue
    e = q.eta if q is not None else None
    return {"QueuePosition": q.position_cq if q is not None else None,
            "AdmissionEtaLowSeconds": e.low_s if e is not None else None,
            "AdmissionEtaMidSeconds": e.mid_s if e is not None else None,
            "AdmissionEtaHighSeconds": e.high_s if e is not None else None,
            "AdmissionEtaLevel": e.level if e is not None and e.known else None}


def event_row(rec: ObjectRecord, run: str, cluster: str) -> Row | None:
    f = rec.facts
    if not isinstance(f, EventFacts):
        return None
    uid = rec.ref.uid or f"{rec.ref.namespace}/{rec.ref.name}"
    at = f.last or f.first or rec.created
    return {
        "Timestamp": rfc3339(at),
        "RowId": row_id(cluster, uid, f.count),
        "Cluster": cluster,
        "Namespace": rec.ref.namespace,
        "Uid": uid,
        "Count": f.count,
        "Type": f.type,
        "Reason": _text(f.reason, MAX_VALUE),
        "Message": _text(f.message),
        "RegardingKind": f.regarding.kind,
        "RegardingName": f.regarding.name,
        "Component": f.component,
        "FirstSeen": rfc3339(f.first),
        "Run": run,
    }


def progress_rows(run: Ref, source: str, plane: str, durable: bool, scan: LogScan, cluster: str,
                  after: int | None) -> list[Row]:
    """One row per dated, non-skipped step past `after` (the source's high-water mark)."""
    out = []
    for s in scan.samples:
        if s.at is None or s.skipped or s.step is None or (after is not None and s.step <= after):
            continue
        loss = s.loss if s.loss is not None and s.loss == s.loss and abs(s.loss) != float("inf") else None
        out.append({
            "Timestamp": rfc3339(s.at),
            "RowId": row_id(cluster, run.namespace, run.name, source, s.step),
            "Cluster": cluster,
            "Namespace": run.namespace,
            "Run": run.name,
            "Source": _text(source, MAX_VALUE),
            "Plane": plane,
            "Step": s.step,
            "Loss": loss,
            "Format": s.format,
            "Durable": durable,
        })
    return out


def gpu_sample_row(s: GpuSample, cluster: str) -> Row:
    return {
        "Timestamp": rfc3339(s.at), "RowId": row_id(cluster, s.node, s.gpu, rfc3339(s.at)), "Cluster": cluster,
        "Node": s.node, "Gpu": s.gpu, "GpuUuid": s.uuid, "Namespace": s.namespace, "Pod": s.pod, "Run": s.run,
        "Utilization": s.utilization, "MemoryUsedBytes": s.memory_used_bytes, "PowerWatts": s.power_watts,
        "TemperatureC": s.temperature_c,
    }


def xid_row(x: GpuXid, cluster: str) -> Row:
    """A record without a meaning or action (an older agent, a DCGM reading) is explained from NVIDIA's
    catalogue here; a code the catalogue lacks stays "unknown XID n"."""
    meaning, action = describe(x.code)
    x = replace(x, meaning=x.meaning or meaning, action=x.action or action)
    return {
        "Timestamp": rfc3339(x.at), "RowId": row_id(cluster, x.node, x.pci or x.gpu, x.code, rfc3339(x.at)),
        "Cluster": cluster, "Node": x.node, "Gpu": x.gpu, "GpuUuid": x.uuid, "Pci": x.pci, "Code": x.code,
        "Meaning": _text(x.meaning, MAX_VALUE), "Action": _text(x.action, MAX_VALUE), "Namespace": x.namespace,
        "Pod": x.pod, "Run": x.run,
    }


@dataclass(slots=True)
class _ClaimState:
    """What the RowBuilder follows per run and claim."""

    verdict: str
    observed: str
    previous: str  # the verdict before this one ("" at first sight)
    since: datetime | None  # the claim's `since` as last seen: it moves without a transition too
    row_id: str | None  # the RowId of the transition into this state; None: a standby's first sight (the
    # resume window decides whether it is written on taking over; past it, the leader then wrote it)
    at: datetime | None = None  # the Timestamp of this state's row


class RowBuilder:
    """Turns evaluations into rows: claim transitions, snapshots every `interval`, events once per
    uid and count, progress samples once per source and step. Memory is bounded by `max_keys`."""

    def __init__(self, cluster: str, snapshot_interval: timedelta, max_keys: int = 100_000,
                 resume_window: timedelta = timedelta(minutes=1)) -> None:
        self.cluster = cluster
        self.interval = snapshot_interval
        self.max_keys = max_keys
        self.resume_window = resume_window
        self._claims: dict[tuple[str, str], _ClaimState] = {}
        # A standby's view (`track`): the transitions it saw within `resume_window`, written on takeover.
        self._tracking = False
        self._recent: list[tuple[datetime, bool, Row]] = []  # (seen at, first sight, row)
        self._led_until: datetime | None = None
        self._snap: dict[str, tuple[datetime, int | None, tuple[str, ...]]] = {}
        self._events: OrderedDict[str, None] = OrderedDict()
        self._hwm: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def _follow(self, rc: RunClaims, name: str, *, standby: bool = False) -> Row | None:
        """Follow one claim: its transition's row when its verdict or observed value moved."""
        c = rc.claims[name]
        key = (_identity(rc), name)
        st = self._claims.get(key)
        if st is not None and (st.verdict, st.observed) == (c.verdict.value, c.observed.value):
            st.since = c.since
            return None
        at = rc.evaluated_at
        if st is not None and st.at is not None and at <= st.at:
            # Queries take each claim's latest row by Timestamp, so a claim's rows must not tie: a move
            # at the instant of its last row (a manual clock, two evaluations between events) is
            # stamped one microsecond after it. Deferring it instead would hold the final state
            # back until the clock moved, which a stopped clock or a shutdown never does.
            at = st.at + _TICK
        previous = st.verdict if st is not None else ""
        row = claim_row(rc, name, c, previous, self.cluster, st.since if st is not None else None, at)
        self._claims[key] = _ClaimState(c.verdict.value, c.observed.value, previous, c.since,
                                        None if st is None and standby else str(row["RowId"]), at)
        return row

    def claims(self, runs: Iterable[RunClaims]) -> dict[str, list[Row]]:
        claims: list[Row] = []
        snaps: list[Row] = []
        takeover, recent = self._tracking, set[tuple[str, str]]()
        if takeover:
            # Taking over from a standby's view: first the transitions seen in the resume window (the
            # old leader may have died before writing them; a first sight only when no other replica
            # led then), then each claim's latest transition, all under the RowIds the old leader
            # used for them: what it wrote comes again as the same rows.
            led = self._led_until
            for t, first, r in self._recent:
                recent.add((r["RunUid"] or f'{r["Kind"]}/{r["Namespace"]}/{r["Run"]}', r["Claim"]))
                if not (first and led is not None and t <= led):
                    claims.append(r)
            self._tracking, self._recent = False, []
        for rc in runs:
            ident = _identity(rc)
            changed = False
            for name in CLAIM_NAMES:
                row = self._follow(rc, name)
                if row is not None:
                    claims.append(row)
                    changed = True
                elif takeover and (ident, name) not in recent:
                    st = self._claims[(ident, name)]
                    if st.row_id is not None:
                        claims.append({**claim_row(rc, name, rc.claims[name], st.previous, self.cluster),
                                       "RowId": st.row_id})
                    elif self._led_until is None:  # first seen when no replica led: nobody wrote it
                        claims.append(claim_row(rc, name, rc.claims[name], "", self.cluster))
            last = self._snap.get(ident)
            state = (rc.blocked.stage.value if rc.blocked else "", stall_cause(rc), str(rc.finished), _suspects(rc))
            due = changed or last is None or last[2] != state or rc.evaluated_at - last[0] >= self.interval
            if due and last is not None and rc.evaluated_at <= last[0]:
                # One snapshot per run and instant (queries take the latest by Timestamp): a change
                # seen again at the same instant is written at the next evaluation.
                self._snap[ident] = (last[0], last[1], ("pending",))
                continue
            if due:
                step = last_step(rc)
                rate = None
                if last is not None and last[1] is not None and step is not None:
                    dt = (rc.evaluated_at - last[0]).total_seconds()
                    rate = max(0, step - last[1]) / dt if dt > 0 else None
                snaps.append(snapshot_row(rc, self.cluster, rate))
                self._snap[ident] = (rc.evaluated_at, step, state)
        # Runs come and go: keep the newest `max_keys` (a forgotten run only re-emits its state).
        while len(self._snap) > self.max_keys:
            del self._snap[next(iter(self._snap))]
        while len(self._claims) > 3 * self.max_keys:
            del self._claims[next(iter(self._claims))]
        return {RUN_CLAIMS.name: claims, RUN_SNAPSHOTS.name: snaps}

    def track(self, runs: Iterable[RunClaims], *, led_until: datetime | None = None) -> None:
        """A standby's evaluations: follow each claim's transitions without writing rows, so that on
        taking over (the next `claims`) it writes what the old leader may have missed and repeats what
        it wrote under the same RowIds, instead of a first row per claim with no PreviousVerdict.

        `led_until`: the renewTime of another replica's live Lease, or when it released the Lease.
        What this one sees for the first time before then, that replica saw and wrote (with a
        previous verdict this one cannot know): it is not written again; a first sight after then is
        (a first row, as a restart writes each claim's state, docs/adx.md)."""
        if led_until is not None and (self._led_until is None or led_until > self._led_until):
            self._led_until = led_until
        for rc in runs:
            ident = _identity(rc)
            for name in CLAIM_NAMES:
                first = (ident, name) not in self._claims
                row = self._follow(rc, name, standby=True)
                if row is not None:
                    self._recent.append((rc.evaluated_at, first, row))
            horizon = rc.evaluated_at - self.resume_window
            if self._recent and self._recent[0][0] < horizon:
                self._recent = [x for x in self._recent if x[0] >= horizon]
        del self._recent[:-self.max_keys]
        while len(self._claims) > 3 * self.max_keys:
            del self._claims[next(iter(self._claims))]
        self._tracking = True

    def resume(self, latest: Iterable[Row]) -> None:
        """Carry on from the rows a previous process exported last (per run and claim): the next
        `claims` writes a transition from there, or nothing new for an unchanged claim (its latest
        row again, under its RowId), instead of a first row per claim."""
        for r in latest:
            since = r["Since"]
            if isinstance(since, datetime) and since.tzinfo is None:
                since = since.replace(tzinfo=UTC)
            ident = r["RunUid"] or f'{r["Kind"]}/{r["Namespace"]}/{r["Run"]}'
            self._claims[(ident, r["Claim"])] = _ClaimState(r["Verdict"], r["Observed"], r["PreviousVerdict"] or "",
                                                             since, r["RowId"])
        self._tracking = True

    def forget(self, runs: Iterable[RunClaims]) -> None:
        for rc in runs:
            ident = _identity(rc)
            self._snap.pop(ident, None)
            for name in CLAIM_NAMES:
                self._claims.pop((ident, name), None)

    def event(self, rec: ObjectRecord, run: str) -> dict[str, list[Row]]:
        row = event_row(rec, run, self.cluster)
        if row is None or row["RowId"] in self._events:
            return {}
        self._events[row["RowId"]] = None
        while len(self._events) > self.max_keys:
            self._events.popitem(last=False)
        return {KUBE_EVENTS.name: [row]}

    def signal(self, run: Ref, source: str, plane: str, durable: bool, scan: LogScan) -> dict[str, list[Row]]:
        key = (f"{run.namespace}/{run.name}", source, plane)
        rows = progress_rows(run, source, plane, durable, scan, self.cluster, self._hwm.get(key))
        if rows:
            self._hwm[key] = max(r["Step"] for r in rows)
            self._hwm.move_to_end(key)
            while len(self._hwm) > self.max_keys:
                self._hwm.popitem(last=False)
        return {PROGRESS_SAMPLES.name: rows} if rows else {}

    def gpu(self, samples: Iterable[GpuSample], xids: Iterable[GpuXid]) -> dict[str, list[Row]]:
        return {GPU_SAMPLES.name: [gpu_sample_row(s, self.cluster) for s in samples],
                GPU_XIDS.name: [xid_row(x, self.cluster) for x in xids]}
