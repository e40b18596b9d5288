"""GPU evidence from node agents (or dcgm-exporter) applied to a run's claims, after `evaluate`.

One pure step the controller runs on each evaluation, kept apart from the claim modules:
- scheduled: where a fresh agent covers a bound pod's node, the GPUs the kubelet actually
  allocated must match what the pod requests; a pod bound (and past a grace period) with fewer
  devices than it requests makes scheduled false, blocked in device allocation;
- running/progressing: a GPU lost under a pod is named; a stall gets the GPUs' activity (busy but
  cold → suspected collective hang; idle) when Ray's metrics gave none. GPU activity corroborates,
  it never proves progress, so it changes reasons and evidence, not `observed`.
Evidence older than `evidence_max_age` is not used (fail closed); when the evidence used now will
age past it is folded into the claims' `recheck_at`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from collector.claims.common import Clock, hm
from collector.claims.energy import energy_per_step
from collector.claims.gpuspread import gpu_spread
from collector.claims.workrisk import with_gpu_signals
from collector.correlate import RunEvidence
from collector.gpu import PodGpuEvidence, gpu_summary
from collector.model import Blocked, Claim, Evidence, Observed, Plane, PodFacts, RunClaims, Stage, verdict_for
from collector.settings import ClaimSettings

# A pod just bound has no devices until the kubelet admits it; an agent read this soon after the
# bind proves nothing about allocation.
ALLOCATION_GRACE = timedelta(seconds=60)
BUSY = 0.80
IDLE = 0.10


class _Unset:
    """`apply_gpu`'s `newest` not given."""


_UNSET = _Unset()


def _add(c: Claim, reason: str, evidence: list[Evidence], observed: Observed | None = None,
         since: datetime | None = None) -> Claim:
    obs = observed if observed is not None else c.observed
    return replace(c, observed=obs, verdict=verdict_for(c.asserted, obs), reason=reason,
                   since=since if observed is not None else c.since, evidence=(*c.evidence, *evidence))


def apply_gpu(rc: RunClaims, ev: RunEvidence, gpus: Mapping[tuple[str, str], PodGpuEvidence],
              nodes: Mapping[str, datetime], now: datetime, s: ClaimSettings, *,
              newest: datetime | None | _Unset = _UNSET) -> RunClaims:
    """`gpus`: the newest GPU evidence by (namespace, pod); `nodes`: node → when an agent there was
    last read (a node absent here has no agent, or none read recently); `newest`: the latest of
    those reads, where the caller keeps it (`max(nodes.values())` once a pass: asked per run, it
    was a walk over every node for each evaluation of a run with no GPU evidence, ×15,000 at 150k pods)."""
    if rc.finished:
        return rc
    max_age = s.evidence_max_age

    def fresh(node: str) -> bool:  # (per node asked: `nodes` is every agent's node, 5,600 at fleet size)
        at = nodes.get(node)
        return at is not None and now - at <= max_age

    live = [p for p in ev.pods if isinstance(p.facts, PodFacts) and not p.facts.terminal and not p.facts.deleting]
    keys = [(p.ref.namespace, p.ref.name) for p in live]
    summary = gpu_summary([g for k in keys if (g := gpus.get(k)) is not None], keys, now, max_age)
    if isinstance(newest, _Unset):
        newest = max(nodes.values(), default=None)
    if summary.pods == 0 and (newest is None or now - newest > max_age):  # (no agent read recently)
        return rc  # nothing fresh (stale stays stale): no change now or later
    # What this run reads ages out at read time + bound: its pods' GPU readings and their nodes' agents.
    clock = Clock(now)
    for k in keys:
        g = gpus.get(k)
        if g is not None:
            clock.within(g.read_at, s.evidence_max_age)
    for p in live:
        node = p.facts.node_name if isinstance(p.facts, PodFacts) else ""
        if node in nodes:
            clock.within(nodes[node], s.evidence_max_age)
    scheduled, blocked = rc.scheduled, rc.blocked
    # --- scheduled: devices actually allocated on covered nodes ---
    short: list[tuple[str, str, int, int, datetime | None]] = []  # (pod, node, allocated, requested, bound at)
    requested = allocated = 0
    for p in live:
        f = p.facts
        assert isinstance(f, PodFacts)
        if not f.node_name or f.gpus <= 0 or not fresh(f.node_name):
            continue
        g = gpus.get((p.ref.namespace, p.ref.name))
        have = g.device_count if g is not None and now - g.read_at <= s.evidence_max_age else 0
        requested += f.gpus
        allocated += min(have, f.gpus)
        bound_at = next((c.last_transition for c in p.conditions if c.type == "PodScheduled" and c.is_true), None)
        agent_at = nodes[f.node_name]
        if have < f.gpus and f.phase != "Running" and (bound_at is None or agent_at - bound_at >= ALLOCATION_GRACE):
            short.append((p.ref.name, f.node_name, have, f.gpus, bound_at))
    if requested:
        ev_alloc = Evidence(Plane.GPU, f"Pod/{ev.root.ref.namespace}/*", "pod-resources devices",
                            f"{allocated}/{requested} GPUs allocated", summary.read_at or now)
        if short and scheduled.observed is Observed.TRUE:
            pod, node, have, want, bound_at = short[0]
            why = f"pod {pod} bound to {node} but holds {have}/{want} GPUs (kubelet pod-resources)"
            # the wait began when the pod was bound (the kubelet allocates right after)
            scheduled = _add(scheduled, f"{scheduled.reason}; {why}", [ev_alloc], Observed.FALSE, bound_at)
            blocked = Blocked(Stage.DEVICE_ALLOCATION, why, bound_at, (ev_alloc,))
        elif scheduled.observed is Observed.TRUE:
            scheduled = _add(scheduled, f"{scheduled.reason}; {allocated}/{requested} GPUs allocated", [ev_alloc])
    # --- lost GPUs, XIDs ---
    running, progressing = rc.running, rc.progressing
    if summary.lost:
        lost_ev = [Evidence(Plane.GPU, u, "lost", True, summary.read_at) for u in summary.lost[:4]]
        xids = f" (XID {', '.join(map(str, summary.xids))})" if summary.xids else ""
        note = f"{len(summary.lost)} GPU(s) lost under the run's pods{xids}"
        running = _add(running, f"{running.reason}; {note}", lost_ev)
        if progressing.observed is not Observed.TRUE:
            progressing = _add(progressing, f"{progressing.reason}; {note}", lost_ev)
    # --- activity on a stall, when Ray gave none ---
    if (progressing.observed is Observed.FALSE and progressing.cause in ("stalled", "hung")
            and "GPUs" not in progressing.reason and summary.utilization is not None):
        util = summary.utilization
        watts = ""
        if summary.power_w is not None:
            watts = f" at {summary.power_w:.0f} W" + (f" of {summary.power_limit_w:.0f} W"
                                                    if summary.power_limit_w else "")
        act = [Evidence(Plane.GPU, str(ev.root.ref), "gpu_utilization",
                        f"{util * 100:.0f}% over {summary.allocated} GPUs{watts}", summary.read_at)]
        if summary.hang_hint:
            act.append(Evidence(Plane.GPU, summary.hang_hint[0], "hang_hint", len(summary.hang_hint),
                                summary.read_at))
            progressing = _add(progressing, f"{progressing.reason}; GPUs {util * 100:.0f}% busy{watts}, "
                                            "power and SM activity low → suspected collective hang", act)
        elif util >= BUSY:
            progressing = _add(progressing, f"{progressing.reason}; GPUs {util * 100:.0f}% busy{watts}", act)
        elif util <= IDLE:
            progressing = _add(progressing, f"{progressing.reason}; GPUs idle ({util * 100:.0f}%{watts})", act)
    elif summary.hang_hint and progressing.observed is not Observed.FALSE:
        # its own signal: said and kept as evidence, never a verdict by itself
        progressing = _add(progressing, f"{progressing.reason}; hang hint on {len(summary.hang_hint)} GPU(s) "
                                        f"since before {hm(summary.read_at or now)}",
                           [Evidence(Plane.GPU, summary.hang_hint[0], "hang_hint", len(summary.hang_hint),
                                     summary.read_at)])
    recheck, other = rc.recheck_at, rc.recheck_other
    if clock.recheck_at is not None and (recheck is None or clock.recheck_at < recheck):
        recheck = clock.recheck_at
    if clock.other is not None and (other is None or clock.other < other):
        other = clock.other
    # a GPU apart from the run's others while the run is slower than its baseline; untrusted readings
    held = [g for k in keys if (g := gpus.get(k)) is not None]
    st = gpu_spread(rc.stragglers, ev, held, now, max_age)
    # lost GPUs and hardware XIDs on the nodes under the run join its work at risk
    wr = with_gpu_signals(rc.work_at_risk, held, now, max_age)
    energy = energy_per_step(ev, held, now, max_age)  # joules per step over the run's GPUs
    if (scheduled, running, progressing, blocked, st, wr, energy) == (
            rc.scheduled, rc.running, rc.progressing, rc.blocked, rc.stragglers, rc.work_at_risk, rc.energy):
        return rc if (recheck, other) == (rc.recheck_at, rc.recheck_other) else \
            replace(rc, recheck_at=recheck, recheck_other=other)
    return replace(rc, scheduled=scheduled, running=running, progressing=progressing, blocked=blocked,
                   recheck_at=recheck, recheck_other=other, stragglers=st, work_at_risk=wr, energy=energy)
