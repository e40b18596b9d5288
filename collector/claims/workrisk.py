"""Work at risk: the GPU-hours a failure now would throw away, and the risk of the nodes under it.

Pure: run evidence (its pods, their nodes, its checkpoint listing) and a clock in, one `WorkAtRisk`
out; `with_gpu_signals` adds what node agents say about the GPUs (XIDs, lost devices) after
`claims.gpu.apply_gpu` has them; `drain_advice` ranks the fleet's nodes from every run's record.

- Work at risk = the run's GPUs (requested by its live, bound pods) × the time since the later of
  its last durable checkpoint (`sources.checkpoints`: complete saves only) and the start of its
  current pods (work lost before a restart is lost already, not at risk).
- Fail closed: no checkpoint listing read for the run, a listing older than the evidence bound, or
  a checkpoint stamped in the future leave it unknown (None), never 0. A fresh listing that holds
  no checkpoint yet puts everything since the pods started at risk (basis `run-start`).
- Node risk: a score 0-100 from the signals the controller holds, each with its reason: the node
  NotReady now, a GPU lost (NVML cannot see it), XIDs NVIDIA's catalogue counts as hardware or
  infrastructure faults (48, 63, 64, 74, 79, 94, 95), uncorrected ECC errors since the GPU's last reset
  and row remaps pending or failed (NVML) from the node agents, a cordon (`spec.unschedulable`: a
  drain is coming), a NotReady spell that ended within the lookback.
  XID lines in the run's own container logs are not used: a tenant prints them at will, and a drain
  score a tenant can raise would let it empty another tenant's node. Not in the evidence (named in
  `missing`): ECC counter trends (the controller holds each GPU's latest uncorrected count, a signal
  when above 0, not the rate of corrected errors over time), and the Node objects themselves when
  their source is older than the evidence bound (no signal from them then). XIDs from the agents
  carry when the agent first saw them (the reason says how long ago).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from collector.claims.common import FUTURE_SKEW, Clock, human_age
from collector.correlate import RunEvidence
from collector.gpu import PodGpuEvidence, faulty
from collector.model import NodeFacts, PodFacts, Ref, RunClaims, rfc3339
from collector.riskfacts import NodeRisk, WorkAtRisk, at_risk_reason, gpu_hours, new_node_risk

# XIDs that say the node's hardware (or its driver's hold on it) is failing, with a weight: how much
# each adds to a node's drain score. Application faults (13, 31, 43, 45) say nothing about the node.
RISK_XIDS: Mapping[int, float] = {
    79: 80.0,  # fell off the bus
    95: 70.0,  # uncontained ECC error: the whole GPU must be reset
    48: 60.0,  # double-bit ECC error
    64: 60.0,  # a row remap could not be recorded
    74: 50.0,  # NVLink error
    94: 40.0,  # contained ECC error: the process was killed, the GPU goes on
    63: 20.0,  # a row remap is pending the next reset
}
WEIGHTS: Mapping[str, float] = {
    "not-ready": 100.0,
    "gpu-lost": 80.0,
    "cordoned": 30.0,
    "not-ready-recently": 25.0,
    "row-remap-failed": 60.0,  # as XID 64: the GPU has no spare rows left to remap; replace it
    "row-remap-pending": 20.0,  # as XID 63: a remap waits for the next GPU reset
    "ecc-uncorrected": 50.0,  # uncorrected ECC errors since the GPU's last reset (as XIDs 48/94/95 say)
}
# How far back a NotReady spell still counts against a node.
LOOKBACK = timedelta(hours=6)
# A node Ready since this long after it was created had a spell of not being Ready (else it just joined).
_JOINED = timedelta(minutes=10)
MISSING = ("ecc-trend",)  # corrected-error rates over time: the controller holds the latest counts only
MAX_NODES = 64  # nodes kept per run (a run of 64 nodes × 8 GPUs); the riskiest first


def _kube_signals(ev: RunEvidence, name: str, clock: Clock) -> list[tuple[str, str]]:
    """(signal, reason) from the Node object: NotReady now, a recent NotReady spell, a cordon."""
    out: list[tuple[str, str]] = []
    rec = ev.nodes.get(name)
    nf = rec.facts if rec is not None else None
    if rec is None or type(nf) is not NodeFacts:
        return out
    if nf.ready == "True" and nf.ready_since is None and not nf.unschedulable:
        return out  # the common case, at once
    if nf.ready != "True":
        since = f" since {rfc3339(nf.ready_since)}" if nf.ready_since is not None else ""
        why = f" ({nf.ready_reason})" if nf.ready_reason else ""
        out.append(("not-ready", f"Ready is {nf.ready or 'absent'}{why}{since}"))
    elif (nf.ready_since is not None and rec.created is not None and nf.ready_since - rec.created > _JOINED
          and clock.within(nf.ready_since, LOOKBACK)):
        out.append(("not-ready-recently", f"Ready again only since {rfc3339(nf.ready_since)} "
                                          f"({human_age(clock.now - nf.ready_since)} ago): it was not Ready before"))
    if nf.unschedulable:
        out.append(("cordoned", "cordoned (spec.unschedulable): a drain is likely coming"))
    return out


def _score(signals: Sequence[tuple[str, str]]) -> float:
    total = 0.0
    for sig, _ in signals:
        total += RISK_XIDS[int(sig[4:])] if sig.startswith("xid-") else WEIGHTS.get(sig, 0.0)
    return min(100.0, total)


def _checkpoint(ev: RunEvidence, clock: Clock, max_age: timedelta) -> tuple[str, int | None, datetime | None, str]:
    """(state, step, at, why): state "ok" (a checkpoint), "none" (a fresh listing holds none yet), or
    "unknown" with why."""
    durable = [s for s in ev.signals if s.durable and not s.retired]
    if not durable:
        return "unknown", None, None, "no checkpoint evidence: no Expstore listing was read for the run"
    fresh = [s for s in durable if clock.within(s.read_at, max_age)]
    if not fresh:
        newest = max(s.read_at for s in durable)
        return "unknown", None, None, (f"the checkpoint listing is {human_age(clock.now - newest)} old "
                                       f"(bound {human_age(max_age)}): not trusted")
    samples = [x for s in fresh for x in s.scan.samples if x.step is not None]
    if not samples:
        return "none", None, None, "the checkpoint listing holds no complete checkpoint yet"
    best = max(samples, key=lambda x: (x.step or 0, x.at is not None))
    if best.at is None:
        return "unknown", None, None, f"checkpoint step {best.step} has no time"
    if best.at - FUTURE_SKEW > clock.horizon:
        return "unknown", None, None, (f"checkpoint step {best.step} is stamped {rfc3339(best.at)}, in the future:"
                                       " its time cannot be trusted")
    return "ok", best.step, best.at, ""


def work_at_risk(ev: RunEvidence, clock: Clock, max_age: timedelta) -> WorkAtRisk | None:
    """The run's work at risk at `clock.now`, with the Kubernetes plane's node signals; None for a run
    that holds no GPUs on bound pods (nothing to lose on a GPU)."""
    now = clock.now
    per_node: dict[str, int] = {}
    pods = 0
    started: datetime | None = None
    all_started = True
    for p in ev.pods:
        f = p.facts
        if type(f) is not PodFacts or f.gpus <= 0 or not f.node_name or f.deleting or f.terminal:
            continue
        pods += 1
        per_node[f.node_name] = per_node.get(f.node_name, 0) + f.gpus
        if f.start_time is None:
            all_started = False
        elif started is None or f.start_time > started:
            started = f.start_time  # the last of them: work since then is all-GPU
    if not pods:
        return None
    if not all_started:
        started = None
    gpus = sum(per_node.values())
    state, step, at, why = _checkpoint(ev, clock, max_age)
    since: datetime | None = None
    basis = ""
    if state == "ok" and at is not None:
        since, basis = (at if started is None or at >= started else started), "checkpoint"
        reason = f"{gpus} GPUs since checkpoint step {step} at {rfc3339(at)}"
        if since != at:
            reason = f"{gpus} GPUs since its pods started at {rfc3339(since)} (last checkpoint step {step} before)"
    elif state == "none" and started is not None:
        since, basis, reason = started, "run-start", f"{gpus} GPUs since its pods started; {why}"
    elif state == "none":
        reason = f"{why}, and a pod's start time is unknown"
    else:
        reason = why
    hours = None if since is None else gpu_hours(since, now, gpus)
    if since is not None and since >= now:
        clock.expires(since)  # nothing at risk until then (the nodes rank by name), then it grows
    if hours is not None:
        reason = at_risk_reason(hours, reason)
    # Node objects older than the evidence bound say nothing now: no signal from them (and none cleared)
    synced = ev.synced.get("Node")
    node_fresh = synced is not None and clock.within(synced, max_age)
    nodes = [_node(name, n, gpus, hours, _kube_signals(ev, name, clock) if node_fresh else ())
             for name, n in per_node.items()]
    missing = MISSING if node_fresh else (*MISSING, "node-objects")
    return WorkAtRisk(hours, gpus, since, basis, reason, step, at, _ranked(nodes), missing)


def _node(name: str, n: int, gpus: int, hours: float | None, signals: Sequence[tuple[str, str]]) -> NodeRisk:
    share = None if hours is None else hours * n / gpus
    if not signals:
        return new_node_risk(name, 0.0, (), (), n, share)
    return new_node_risk(name, _score(signals), tuple(s for s, _ in signals), tuple(r for _, r in signals), n,
                         share)


def _ranked(nodes: Iterable[NodeRisk]) -> tuple[NodeRisk, ...]:
    return tuple(sorted(nodes, key=lambda x: (-x.score, -(x.gpu_hours or 0.0), x.node))[:MAX_NODES])


def with_gpu_signals(w: WorkAtRisk | None, evidence: Iterable[PodGpuEvidence], now: datetime,
                     max_age: timedelta) -> WorkAtRisk | None:
    """`w` with what fresh node-agent readings show on its nodes: lost GPUs, row remaps pending or failed,
    hardware XIDs. Readings
    older than `max_age` add nothing (fail closed: an old reading is not a healthy one either, so the
    node keeps only the signals it had)."""
    if w is None or not w.nodes:
        return w
    found: dict[str, list[tuple[str, str]]] = {}
    for e in evidence:
        if not timedelta(0) - FUTURE_SKEW <= now - e.read_at <= max_age:
            continue
        for d in faulty(e):  # (every evaluation: a device object only where a fault signal is)
            if d.lost:
                found.setdefault(e.node, []).append(("gpu-lost", f"GPU {d.uuid} lost (NVML cannot reach it)"))
            if d.remap_failed:
                found.setdefault(e.node, []).append(("row-remap-failed", f"GPU {d.uuid}: a row remap failed "
                                                                         "(NVML remapped rows; replace the GPU)"))
            elif d.remap_pending:
                found.setdefault(e.node, []).append(("row-remap-pending", f"GPU {d.uuid}: a row remap waits for "
                                                                          "the next GPU reset"))
            if d.ecc_uncorrected:
                why = f"GPU {d.uuid}: {d.ecc_uncorrected} uncorrected ECC error(s) since its last reset"
                found.setdefault(e.node, []).append(("ecc-uncorrected", why))
            ages = dict(d.xid_ages) if d.xids else {}
            for code in d.xids:
                if code in RISK_XIDS:
                    when = f", first seen {human_age(timedelta(seconds=ages[code]) + (now - e.read_at))} ago" \
                        if code in ages else ""
                    why = f"XID {code} on GPU {d.uuid} (node agent{when})"
                    found.setdefault(e.node, []).append((f"xid-{code}", why))
    if not found:
        return w
    nodes = []
    for n in w.nodes:
        signals = list(zip(n.signals, n.reasons, strict=True))
        for sig, why in found.get(n.node, ()):
            if all(s != sig for s, _ in signals):
                signals.append((sig, why))
        nodes.append(_node(n.node, n.gpus, w.gpus, w.gpu_hours, signals) if len(signals) > len(n.signals) else n)
    return replace(w, nodes=_ranked(nodes))


# --- the fleet: which nodes to drain first, which runs to checkpoint before -----------------------


@dataclass(frozen=True, slots=True)
class DrainAdvice:
    """One node worth draining, with the runs a drain would cost and how much (GPU-hours at risk)."""

    node: str
    score: float
    signals: tuple[str, ...]
    reasons: tuple[str, ...]
    gpu_hours: float  # the known GPU-hours at risk on it, over its runs
    runs: tuple[tuple[Ref, float | None], ...]  # checkpoint these first: most GPU-hours at risk first
    unknown: int  # runs on it whose work at risk is unknown

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "score": round(self.score, 1), "signals": list(self.signals),
                "reasons": list(self.reasons), "gpu_hours_at_risk": round(self.gpu_hours, 3),
                "runs": [{"namespace": r.namespace, "name": r.name, "kind": r.kind,
                          "gpu_hours_at_risk": None if h is None else round(h, 3)} for r, h in self.runs],
                "runs_unknown": self.unknown}


def drain_advice(claims: Iterable[RunClaims]) -> list[DrainAdvice]:
    """Nodes with any risk signal, riskiest first (score, then GPU-hours at risk on them); a node seen
    by several runs takes the union of their signals (each run's view may be of another instant)."""
    seen: dict[str, dict[str, str]] = {}
    runs: dict[str, list[tuple[Ref, float | None]]] = {}
    for rc in claims:
        w = rc.work_at_risk
        if w is None or rc.finished:
            continue
        for n in w.nodes:
            if n.score <= 0:
                continue
            sigs = seen.setdefault(n.node, {})
            for s, r in zip(n.signals, n.reasons, strict=True):
                sigs.setdefault(s, r)
            runs.setdefault(n.node, []).append((rc.ref, n.gpu_hours))
    out = []
    for node, sigs in seen.items():
        rs = sorted(runs[node], key=lambda x: (x[1] is None, -(x[1] or 0.0), x[0].key))
        pairs = list(sigs.items())
        out.append(DrainAdvice(node, _score(pairs), tuple(sigs), tuple(sigs.values()),
                               sum(h for _, h in rs if h is not None), tuple(rs),
                               sum(1 for _, h in rs if h is None)))
    return sorted(out, key=lambda a: (-a.score, -a.gpu_hours, a.node))
