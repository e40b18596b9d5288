"""Which of the seed's five stages owns the wait of a run that is not scheduled yet."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from collector.claims.common import Freshness, event_evidence, latest
from collector.correlate import RunEvidence
from collector.model import (
    Blocked,
    EventFacts,
    Evidence,
    ObjectRecord,
    Plane,
    PodFacts,
    Stage,
    TauClusterFacts,
    TauRunFacts,
    WorkloadFacts,
)
from collector.settings import ClaimSettings

AUTOSCALER_REASONS = frozenset({"TriggeredScaleUp", "NotTriggerScaleUp", "Nominated", "ScaleUpTimedOut"})
DEVICE_REASONS = frozenset({"UnexpectedAdmissionError", "FailedPrepareDynamicResources", "FailedAllocateResource"})
# FailedScheduling phrases that node capacity could cure (as opposed to selectors, taints, volumes).
_CAPACITY = re.compile(r"Insufficient |Too many pods|didn't have free ports", re.I)
_PROVISIONING = re.compile(r"prov|ProvisioningRequest|capacity", re.I)


def blocked_stage(ev: RunEvidence, now: datetime, fresh: Freshness, s: ClaimSettings) -> Blocked | None:
    """First unmet stage in pipeline order; None when evidence is too old to say."""
    horizon = now - s.event_horizon
    events = [e for e in ev.events if isinstance(e.facts, EventFacts) and (e.facts.last or now) >= horizon]

    if ev.taurun is not None and not (ev.workloads or ev.rayjobs or ev.jobs or ev.pods):
        return _target_resolution(ev, now, fresh, s)

    for wl in ev.workloads:
        b = _queue_admission(ev, wl, events, fresh)
        if b is not None:
            return b
    if not ev.workloads:
        suspended = [j for j in ev.jobs if getattr(j.facts, "suspended", False)]
        if suspended and fresh.ok("Job"):
            j = suspended[0]
            return Blocked(
                Stage.QUEUE_ADMISSION,
                f"{j.ref.kind} {j.ref.name} is suspended, waiting for Kueue to admit it (no Workload observed)",
                j.created,
                (Evidence(Plane.KUBERNETES, str(j.ref), "spec.suspend", True, j.created),),
            )

    if not fresh.ok("Pod"):
        return None
    live = [p for p in ev.pods if isinstance(p.facts, PodFacts) and not p.facts.terminal]
    device = _device_allocation(ev, events)
    if device is not None:
        return device
    unbound = [p for p in live if isinstance(p.facts, PodFacts) and not p.facts.node_name]
    if unbound:
        return _scheduling(unbound, events, now)
    if not live:
        what = "RayCluster" if (ev.rayjobs or ev.rayclusters) else "job controller"
        when = latest(c.last_transition for w in ev.workloads for c in w.conditions if c.type == "Admitted")
        return Blocked(
            Stage.POD_SCHEDULING,
            f"admitted, but the {what} has not created any pod yet",
            when,
            (Evidence(Plane.KUBERNETES, str(ev.root.ref), "pods", 0, fresh.at("Pod")),),
        )
    return None


def _target_resolution(ev: RunEvidence, now: datetime, fresh: Freshness, s: ClaimSettings) -> Blocked:
    run = ev.taurun
    assert run is not None and isinstance(run.facts, TauRunFacts)
    profile = run.facts.profile
    tc = ev.taucluster
    evidence: list[Evidence] = [Evidence(Plane.TAUGRID, str(run.ref), "spec.profile", profile, run.created)]
    if tc is None or not isinstance(tc.facts, TauClusterFacts):
        reason = "TauCluster/cluster not observed: the run's profile cannot be resolved"
        return Blocked(Stage.TARGET_RESOLUTION, reason, run.created, tuple(evidence))
    f = tc.facts
    ready = tc.condition("Ready")
    stale_reason = ""
    if f.observed_generation is not None and tc.generation is not None and f.observed_generation < tc.generation:
        stale_reason = (f"TauCluster status is stale: observedGeneration {f.observed_generation}"
                        f" < generation {tc.generation}")
        evidence.append(Evidence(Plane.TAUGRID, str(tc.ref), "status.observedGeneration", f.observed_generation,
                                 tc.newest))
    elif ready is None or not ready.is_true:
        stale_reason = f"TauCluster Ready is {ready.status if ready else 'absent'}" + (
            f": {ready.message}" if ready and ready.message else "")
        evidence.append(Evidence(Plane.TAUGRID, str(tc.ref), "status.conditions[Ready]",
                                 ready.status if ready else None, ready.last_transition if ready else None))
    elif f.last_resolved is None or now - f.last_resolved > s.taucluster_max_age:
        stale_reason = "TauCluster lastResolvedTime is older than the trust bound"
        evidence.append(Evidence(Plane.TAUGRID, str(tc.ref), "status.lastResolvedTime", None, f.last_resolved))
    if stale_reason:
        return Blocked(Stage.TARGET_RESOLUTION, stale_reason + " (fails closed)", run.created, tuple(evidence))
    if profile and profile not in {p.name for p in f.resolved}:
        evidence.append(Evidence(Plane.TAUGRID, str(tc.ref), "status.resolvedProfiles",
                                 [p.name for p in f.resolved], tc.newest))
        return Blocked(Stage.TARGET_RESOLUTION, f"profile {profile!r} is not resolved in TauCluster status",
                       run.created, tuple(evidence))
    ws = ev.workspace
    if ws is not None:
        wr = ws.condition("Ready")
        if wr is None or not wr.is_true:
            evidence.append(Evidence(Plane.TAUGRID, str(ws.ref), "status.conditions[Ready]",
                                     wr.status if wr else None, wr.last_transition if wr else None))
            return Blocked(Stage.TARGET_RESOLUTION, f"TauWorkspace {ws.ref.name} is not Ready", run.created,
                           tuple(evidence))
    return Blocked(Stage.TARGET_RESOLUTION, "TauGrid has not created the run's workload yet", run.created,
                   tuple(evidence))


def _queue_admission(
    ev: RunEvidence, wl: ObjectRecord, events: list[ObjectRecord], fresh: Freshness
) -> Blocked | None:
    f = wl.facts
    if not isinstance(f, WorkloadFacts) or not fresh.ok("Workload"):
        return None
    reserved = wl.condition("QuotaReserved")
    admitted = wl.condition("Admitted")
    evicted = wl.condition("Evicted")
    finished = wl.condition("Finished")
    if finished is not None and finished.is_true:
        return None
    ref = str(wl.ref)
    evidence: list[Evidence] = []
    for cond in (reserved, admitted, evicted):
        if cond is not None:
            evidence.append(Evidence(Plane.KUEUE, ref, f"status.conditions[{cond.type}]",
                                     f"{cond.status}: {cond.reason}" if cond.reason else cond.status,
                                     cond.last_transition))
    for q in (ev.local_queue, ev.cluster_queue):
        if q is not None:
            active = q.condition("Active")
            if active is not None and not active.is_true:
                evidence.append(Evidence(Plane.KUEUE, str(q.ref), "status.conditions[Active]",
                                         f"{active.status}: {active.reason}", active.last_transition))
    if reserved is not None and reserved.is_true:
        pending = [a for a in f.admission_checks if a.state not in ("Ready",)]
        if admitted is not None and admitted.is_true or (admitted is None and not pending):
            return None
        for a in pending:
            evidence.append(Evidence(Plane.KUEUE, ref, f"status.admissionChecks[{a.name}]", a.state,
                                     a.last_transition))
        if pending:
            check = pending[0]
            detail = f": {check.message}" if check.message else ""
            if _PROVISIONING.search(check.name) or _PROVISIONING.search(check.message):
                return Blocked(Stage.NODE_SCALING,
                               f"quota reserved; admission check {check.name} {check.state} waiting for capacity"
                               f" to be provisioned{detail}", check.last_transition, tuple(evidence))
            return Blocked(Stage.QUEUE_ADMISSION, f"quota reserved; admission check {check.name} is "
                           f"{check.state}{detail}", check.last_transition, tuple(evidence))
        return Blocked(Stage.QUEUE_ADMISSION, "quota reserved but the Workload is not admitted yet",
                       reserved.last_transition, tuple(evidence))
    if evicted is not None and evicted.is_true:
        reason = f"evicted ({evicted.reason}): {evicted.message}" if evicted.message else f"evicted ({evicted.reason})"
        if reserved is not None and reserved.message:
            reason += f"; now pending: {reserved.message}"
        return Blocked(Stage.QUEUE_ADMISSION, reason, evicted.last_transition, tuple(evidence))
    queue = f.queue_name or "?"
    if reserved is not None and reserved.message:
        reason = f"Kueue has not reserved quota ({reserved.reason}): {reserved.message}"
    else:
        reason = f"waiting in LocalQueue {queue} for quota"
    for q in (ev.local_queue, ev.cluster_queue):
        active = q.condition("Active") if q is not None else None
        if q is not None and active is not None and not active.is_true:
            reason += f"; {q.ref.kind} {q.ref.name} inactive: {active.message or active.reason}"
    wl_events = [e for e in events if isinstance(e.facts, EventFacts) and e.facts.regarding.kind == "Workload"]
    evidence.extend(event_evidence(wl_events[-3:]))
    since = reserved.last_transition if reserved is not None else wl.created
    return Blocked(Stage.QUEUE_ADMISSION, reason, since, tuple(evidence))


def _device_allocation(ev: RunEvidence, events: Iterable[ObjectRecord]) -> Blocked | None:
    """A bound pod rejected by the kubelet's device manager, or a DRA claim not prepared."""
    for p in ev.pods:
        f = p.facts
        if isinstance(f, PodFacts) and f.node_name and f.reason in DEVICE_REASONS:
            return Blocked(
                Stage.DEVICE_ALLOCATION,
                f"pod {p.ref.name} on {f.node_name} rejected: {f.reason}: {f.message}".rstrip(": "),
                f.start_time or p.newest,
                (Evidence(Plane.KUBERNETES, str(p.ref), "status.reason", f.reason, f.start_time or p.newest),
                 Evidence(Plane.KUBERNETES, str(p.ref), "status.message", f.message, f.start_time or p.newest)),
            )
    device_events = [e for e in events if isinstance(e.facts, EventFacts) and e.facts.reason in DEVICE_REASONS]
    if device_events:
        e = device_events[-1]
        assert isinstance(e.facts, EventFacts)
        return Blocked(Stage.DEVICE_ALLOCATION, f"{e.facts.reason}: {e.facts.message}", e.facts.first,
                       tuple(event_evidence(device_events[-3:])))
    return None


def _scheduling(unbound: list[ObjectRecord], events: list[ObjectRecord], now: datetime) -> Blocked:
    names = {p.ref.name for p in unbound}
    pod_events = sorted(
        (e for e in events if isinstance(e.facts, EventFacts) and e.facts.regarding.kind == "Pod"
         and e.facts.regarding.name in names),
        key=lambda e: e.facts.last or now if isinstance(e.facts, EventFacts) else now,
    )
    failed = [e for e in pod_events if isinstance(e.facts, EventFacts) and e.facts.reason == "FailedScheduling"]
    scaler = [e for e in pod_events if isinstance(e.facts, EventFacts) and e.facts.reason in AUTOSCALER_REASONS]
    count = f"{len(unbound)} pod(s) unbound"
    since = min((p.created for p in unbound if p.created), default=None)
    last_failed = failed[-1].facts if failed else None
    assert last_failed is None or isinstance(last_failed, EventFacts)
    capacity_short = last_failed is not None and bool(_CAPACITY.search(last_failed.message))
    if scaler and (capacity_short or last_failed is None):
        last = scaler[-1].facts
        assert isinstance(last, EventFacts)
        verb = {
            "TriggeredScaleUp": "scale-up triggered, waiting for the node",
            "Nominated": "node provisioner nominated a node, waiting for it",
            "NotTriggerScaleUp": "cluster autoscaler cannot add a matching node",
            "ScaleUpTimedOut": "scale-up timed out",
        }[last.reason]
        reason = f"{count}; {verb}: {last.message}"
        if last_failed is not None:
            reason += f" (scheduler: {_short(last_failed.message)})"
        return Blocked(Stage.NODE_SCALING, reason, since, tuple(event_evidence([*failed[-1:], *scaler[-2:]])))
    if last_failed is not None:
        reason = f"{count}; scheduler: {_short(last_failed.message)}"
        if scaler:
            last = scaler[-1].facts
            assert isinstance(last, EventFacts)
            reason += f"; {last.reason}: {last.message}".rstrip(": ")
        elif capacity_short:
            reason += "; no node scale-up observed"
        return Blocked(Stage.POD_SCHEDULING, reason, since, tuple(event_evidence([*failed[-1:], *scaler[-1:]])))
    return Blocked(Stage.POD_SCHEDULING, f"{count}; no scheduler events observed", since,
                   tuple(Evidence(Plane.KUBERNETES, str(p.ref), "spec.nodeName", None, p.created)
                         for p in unbound[:3]))


def _short(message: str, limit: int = 160) -> str:
    head = message.split(" preemption:")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"
