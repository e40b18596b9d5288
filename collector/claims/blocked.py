"""Which of the seed's five stages owns the wait of a run that is not scheduled yet."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

from collector.claims.common import Clock, Freshness, event_evidence, latest
from collector.claims.membership import taucluster_distrust, work_pods
from collector.correlate import RunEvidence
from collector.kube import KUEUE_QUEUE_LABEL, MULTIKUEUE_MANAGER
from collector.model import (
    AdmissionCheck,
    AdmissionCheckFacts,
    Blocked,
    EventFacts,
    Evidence,
    NodeClaimFacts,
    NodeFacts,
    ObjectRecord,
    Placement,
    Plane,
    PodFacts,
    QueueFacts,
    ResourceClaimFacts,
    Stage,
    TauClusterFacts,
    TauRunFacts,
    WorkloadFacts,
)
from collector.settings import ClaimSettings

# Events a node provisioner records on a pending pod: cluster-autoscaler's two pod events
# (TriggeredScaleUp, NotTriggerScaleUp; its other events go to its status ConfigMap and to nodes) and
# Karpenter's Nominated ("Pod should schedule on: nodeclaim/...").
AUTOSCALER_REASONS = frozenset({"TriggeredScaleUp", "NotTriggerScaleUp", "Nominated"})
DEVICE_REASONS = frozenset({"UnexpectedAdmissionError", "FailedPrepareDynamicResources", "FailedAllocateResource"})
# FailedScheduling phrases that node capacity could cure (as opposed to selectors, taints, volumes).
_CAPACITY = re.compile(r"Insufficient |Too many pods|didn't have free ports", re.I)
_GPU_SHORT = re.compile(r"Insufficient [a-z0-9.-]+/gpu", re.I)
# The scheduler's DynamicResources plugin: why a pod's ResourceClaims cannot be allocated or used.
_DRA = re.compile(r"cannot allocate all claims|resourceclaim in use|resourceclaim must be reallocated|"
                  r"unallocated immediate resourceclaim|waiting for dynamic resource controller|"
                  r"resourceclaim not found|pod has unallocated claims", re.I)
# Kueue's AdmissionCheck controllers, by spec.controllerName (never by the check's own name).
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
GATED_BY = "kueue.x-k8s.io/admission-gated-by"  # the controllers that must clear a Workload's AdmissionGated
KUEUE_TOPOLOGY_GATE = "kueue.x-k8s.io/topology"  # TAS: Kueue ungates each pod once it has placed it
# Kueue's QuotaReserved=False reasons (tiered since UnadmittedWorkloadsObservability) and what they mean.
_QUOTA_REASONS = {
    "WaitingForQuota": "waiting for quota to free up",
    "ExceedsMaxQuota": "the request exceeds the most the ClusterQueue and its cohort can ever lend: waiting will"
                       " not help",
    "NoMatchingFlavor": "no ResourceFlavor matches the request",
    "TopologyPlacementFailed": "topology-aware scheduling found no placement for the pod sets",
    "WaitingForPreemptedWorkloads": "waiting for preempted workloads to release their quota",
    "WaitingForPodsReady": "waiting for another workload's pods to become ready (waitForPodsReady)",
    "PendingEvaluation": "not evaluated by the scheduler yet",
    # Workload-wide holds (Kueue's tiers 1-6): no quota is sought until someone acts; who, `_who_acts` says.
    "Deactivated": "the Workload is deactivated (spec.active: false); Kueue will not admit it until it is"
                   " reactivated",
    "OnHold": "its job's controller released the quota on purpose (e.g. a StatefulSet scaled to zero)",
    "Misconfigured": "the Workload cannot be queued as configured",
    "Suspended": "its LocalQueue or ClusterQueue is stopped (stopPolicy)",
    "AdmissionGated": "admission is gated by an external controller (annotation kueue.x-k8s.io/admission-gated-by)",
}
# Who has to act on a hold that waiting alone never lifts: the run's owner (its user), a queue admin
# (LocalQueue/ClusterQueue objects and their stopPolicy) or the platform (a gating controller).
USER, QUEUE_ADMIN, PLATFORM = "the run's owner", "a Kueue queue admin", "the platform"
_HOLDERS = {"Deactivated": USER, "OnHold": USER, "Suspended": QUEUE_ADMIN, "AdmissionGated": PLATFORM}
_QUEUE_STOPPED = frozenset({"ClusterQueueStopped", "LocalQueueStopped"})  # Evicted reasons


def _who_acts(reason: str, message: str) -> str:
    """Who must act on a QuotaReserved=False (or Evicted) hold; "" where waiting is the remedy."""
    if reason in _HOLDERS:
        return _HOLDERS[reason]
    if reason.startswith("DeactivatedDueTo"):  # Evicted: Kueue set spec.active false (requeuing limit, ...)
        return USER
    if reason in _QUEUE_STOPPED:
        return QUEUE_ADMIN
    if reason in ("Misconfigured", "Inadmissible"):
        # A missing LocalQueue is the run's (it names the queue); a missing or inactive ClusterQueue,
        # or a LocalQueue pointing at one, is the queue admin's.
        if re.search(r"ClusterQueue|is inactive|is stopped", message):
            return QUEUE_ADMIN
        if "LocalQueue" in message:
            return USER
        return f"{USER} or {QUEUE_ADMIN}"
    return ""


def blocked_stage(ev: RunEvidence, clock: Clock, fresh: Freshness, s: ClaimSettings) -> Blocked | None:
    """First unmet stage in pipeline order; None when evidence is too old to say."""
    events = [e for e in ev.events if isinstance(e.facts, EventFacts)
              and (e.facts.last is None or clock.within(e.facts.last, s.event_horizon))]

    if ev.taurun is not None and not (ev.workloads or ev.rayjobs or ev.jobs or ev.pods):
        return _target_resolution(ev, clock, fresh, s)

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
    pods = work_pods(ev)
    live = [p for p in pods if isinstance(p.facts, PodFacts) and not p.facts.terminal and not p.facts.deleting]
    device = _device_allocation(ev, pods, live, events)
    if device is not None:
        return device
    unbound = [p for p in live if isinstance(p.facts, PodFacts) and not p.facts.node_name]
    if unbound:
        return _scheduling(ev, unbound, events, clock)
    if not live:
        queued = KUEUE_QUEUE_LABEL in ev.root.labels or any(KUEUE_QUEUE_LABEL in j.labels for j in ev.jobs)
        if ev.inferred or (queued and not ev.workloads):
            # No pod lives and nothing says it was admitted (a dump without the Workload, a run made up
            # from its pods): whose wait it is cannot be told from here.
            return None
        what = "RayCluster" if (ev.rayjobs or ev.rayclusters) else "job controller"
        when = latest(c.last_transition for w in ev.workloads for c in w.conditions if c.type == "Admitted")
        return Blocked(
            Stage.POD_SCHEDULING,
            f"admitted, but the {what} has not created any pod yet",
            when,
            (Evidence(Plane.KUBERNETES, str(ev.root.ref), "pods", 0, fresh.at("Pod")),),
        )
    return None


def _target_resolution(ev: RunEvidence, clock: Clock, fresh: Freshness, s: ClaimSettings) -> Blocked:
    run = ev.taurun
    assert run is not None and isinstance(run.facts, TauRunFacts)
    profile = run.facts.profile
    tc = ev.taucluster
    evidence: list[Evidence] = [Evidence(Plane.TAUGRID, str(run.ref), "spec.profile", profile, run.created)]
    if tc is None or not isinstance(tc.facts, TauClusterFacts):
        reason = "TauCluster not observed: the run's profile cannot be resolved"
        return Blocked(Stage.TARGET_RESOLUTION, reason, run.created, tuple(evidence))
    f = tc.facts
    stale_reason = taucluster_distrust(ev, clock, s)
    if stale_reason:
        ready = tc.condition("Ready")
        evidence += [
            Evidence(Plane.TAUGRID, str(tc.ref), "status.observedGeneration", f.observed_generation, tc.newest),
            Evidence(Plane.TAUGRID, str(tc.ref), "status.conditions[Ready]", ready.status if ready else None,
                     ready.last_transition if ready else None),
            Evidence(Plane.TAUGRID, str(tc.ref), "status.lastResolvedTime", None, f.last_resolved),
        ]
    if stale_reason:
        return Blocked(Stage.TARGET_RESOLUTION, stale_reason + " (fails closed)", run.created, tuple(evidence))
    if profile and f.profiles and profile not in f.profiles:
        evidence.append(Evidence(Plane.TAUGRID, str(tc.ref), "spec.workloadProfiles", list(f.profiles), tc.newest))
        return Blocked(Stage.TARGET_RESOLUTION, f"profile {profile!r} is not declared in TauCluster spec",
                       run.created, tuple(evidence))
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
    if evicted is not None and evicted.is_true and reserved is not None and reserved.is_true:
        # Kueue evicted it and waits for its integration to suspend the job and release the quota.
        reason = f"evicted ({evicted.reason})" + (f": {evicted.message}" if evicted.message else "")
        return Blocked(Stage.QUEUE_ADMISSION, reason + "; its quota is released once the job is suspended",
                       evicted.last_transition, tuple(evidence))
    if reserved is not None and reserved.is_true:
        pending = [a for a in f.admission_checks if a.state not in ("Ready",)]
        if admitted is not None and admitted.is_true or (admitted is None and not pending):
            return None
        for a in pending:
            evidence.append(Evidence(Plane.KUEUE, ref, f"status.admissionChecks[{a.name}]", a.state,
                                     a.last_transition))
        if pending:
            return _admission_check_wait(ev, pending[0], evidence)
        return Blocked(Stage.QUEUE_ADMISSION, "quota reserved but the Workload is not admitted yet",
                       reserved.last_transition, tuple(evidence))
    if evicted is not None and evicted.is_true:
        reason = f"evicted ({evicted.reason}): {evicted.message}" if evicted.message else f"evicted ({evicted.reason})"
        if reserved is not None and reserved.message:
            reason += f"; now pending: {reserved.message}"
        who = _who_acts(reserved.reason, reserved.message) if reserved is not None else ""
        who = who or _who_acts(evicted.reason, evicted.message)
        if who:
            reason += f"; for {who} to act on"
        return Blocked(Stage.QUEUE_ADMISSION, reason, evicted.last_transition, tuple(evidence))
    queue = f.queue_name or "?"
    if reserved is not None and reserved.message:
        meaning = _QUOTA_REASONS.get(reserved.reason)
        reason = f"Kueue has not reserved quota ({reserved.reason}" + (f": {meaning}" if meaning else "") + \
            f"): {reserved.message}"
    elif reserved is not None and reserved.reason in _QUOTA_REASONS:
        reason = f"Kueue has not reserved quota ({reserved.reason}: {_QUOTA_REASONS[reserved.reason]})"
    else:
        reason = f"waiting in LocalQueue {queue} for quota"
    held = reserved.reason if reserved is not None else ""
    if not f.active and held != "Deactivated":
        # spec.active is false: Kueue's own word may lag (or predate its tiered reasons)
        reason += f"; {_QUOTA_REASONS['Deactivated']}"
        evidence.append(Evidence(Plane.KUEUE, ref, "spec.active", False, wl.newest))
        held = "Deactivated"
    who = _who_acts(held, reserved.message if reserved is not None else "")
    if who:
        reason += f"; for {who} to act on: waiting will not lift it"
    if held == "AdmissionGated" and f.gated_by:
        reason += f" (gated by {f.gated_by})"
        evidence.append(Evidence(Plane.KUEUE, ref, f"metadata.annotations[{GATED_BY}]", f.gated_by, wl.newest))
    for q in (ev.local_queue, ev.cluster_queue):
        active = q.condition("Active") if q is not None else None
        if q is not None and active is not None and not active.is_true:
            reason += f"; {q.ref.kind} {q.ref.name} inactive: {active.message or active.reason}"
    cq = ev.cluster_queue.facts if ev.cluster_queue is not None else None
    if ev.cluster_queue is not None and isinstance(cq, QueueFacts) and cq.pending is not None:
        reason += f"; ClusterQueue {ev.cluster_queue.ref.name}: {cq.pending} pending, {cq.admitted or 0} admitted"
        evidence.append(Evidence(Plane.KUEUE, str(ev.cluster_queue.ref), "status.pendingWorkloads", cq.pending,
                                 ev.cluster_queue.newest))
    wl_events = [e for e in events if isinstance(e.facts, EventFacts) and e.facts.regarding.kind == "Workload"]
    evidence.extend(event_evidence(wl_events[-3:]))
    since = reserved.last_transition if reserved is not None else wl.created
    return Blocked(Stage.QUEUE_ADMISSION, reason, since, tuple(evidence))


def _admission_check_wait(ev: RunEvidence, check: AdmissionCheck, evidence: list[Evidence]) -> Blocked:
    """Quota is reserved; an admission check holds the Workload. Its controller says whose wait it is."""
    detail = f": {check.message}" if check.message else ""
    ac = ev.admission_checks.get(check.name)
    controller = ac.facts.controller_name if ac is not None and isinstance(ac.facts, AdmissionCheckFacts) else ""
    if ac is not None:
        evidence.append(Evidence(Plane.KUEUE, str(ac.ref), "spec.controllerName", controller or None, ac.newest))
    if controller == PROVISIONING_CONTROLLER:
        return Blocked(Stage.NODE_SCALING,
                       f"quota reserved; admission check {check.name} {check.state}: the ProvisioningRequest"
                       f" ({controller}) is waiting for capacity to be provisioned{detail}",
                       check.last_transition, tuple(evidence))
    if controller == MULTIKUEUE_MANAGER:
        what = "MultiKueue has not admitted it on a worker cluster yet"
    elif controller:
        what = f"waiting for {controller}"
    else:
        what = f"its controller is unknown (AdmissionCheck {check.name} not observed)"
    return Blocked(Stage.QUEUE_ADMISSION, f"quota reserved; admission check {check.name} is {check.state}: {what}"
                   f"{detail}", check.last_transition, tuple(evidence))


def _device_allocation(ev: RunEvidence, pods: list[ObjectRecord], live: list[ObjectRecord],
                       events: list[ObjectRecord]) -> Blocked | None:
    """Device plugin or DRA: a pod rejected by the kubelet's device manager, a ResourceClaim that
    cannot be allocated or prepared, or a bound pod stuck on an unhealthy device."""
    # A terminal pod's rejection explains the wait only while no newer pod replaced it.
    newest_created = max((p.created for p in live if p.created is not None), default=None)
    for p in pods:
        f = p.facts
        if not (isinstance(f, PodFacts) and f.node_name and f.reason in DEVICE_REASONS):
            continue
        if f.terminal and (live and (newest_created is None or p.created is None or p.created < newest_created)):
            continue
        return Blocked(
            Stage.DEVICE_ALLOCATION,
            f"pod {p.ref.name} on {f.node_name} rejected: {f.reason}: {f.message}".rstrip(": "),
            f.start_time or p.newest,
            (Evidence(Plane.KUBERNETES, str(p.ref), "status.reason", f.reason, f.start_time or p.newest),
             Evidence(Plane.KUBERNETES, str(p.ref), "status.message", f.message, f.start_time or p.newest)),
        )
    for p in live:
        f = p.facts
        if isinstance(f, PodFacts) and f.node_name and f.phase == "Pending" and f.unhealthy_devices:
            return Blocked(Stage.DEVICE_ALLOCATION,
                           f"pod {p.ref.name} on {f.node_name} holds unhealthy devices: "
                           + ", ".join(f.unhealthy_devices[:3]), p.newest,
                           (Evidence(Plane.KUBERNETES, str(p.ref), "containerStatuses[].allocatedResourcesStatus",
                                     list(f.unhealthy_devices[:3]), p.newest),))
    live_names = {p.ref.name for p in live}
    dra = _dra_wait(ev, live, events)
    if dra is not None:
        return dra
    device_events = [e for e in events if isinstance(e.facts, EventFacts) and e.facts.reason in DEVICE_REASONS
                     and (e.facts.regarding.kind != "Pod" or e.facts.regarding.name in live_names)]
    if device_events:
        e = device_events[-1]
        assert isinstance(e.facts, EventFacts)
        return Blocked(Stage.DEVICE_ALLOCATION, f"{e.facts.reason}: {e.facts.message}", e.facts.first,
                       tuple(event_evidence(device_events[-3:])))
    return None


def _dra_wait(ev: RunEvidence, live: list[ObjectRecord], events: list[ObjectRecord]) -> Blocked | None:
    """Unbound pods whose ResourceClaims are not allocated, or whom the scheduler's DRA plugin refuses."""
    unbound = [p for p in live if isinstance(p.facts, PodFacts) and not p.facts.node_name]
    if not unbound:
        return None
    claims = {c.ref.name: c for c in ev.resource_claims}
    evidence: list[Evidence] = []
    waiting: list[str] = []
    for p in unbound:
        f = p.facts
        assert isinstance(f, PodFacts)
        for name in f.claims:
            c = claims.get(name)
            cf = c.facts if c is not None else None
            if c is not None and isinstance(cf, ResourceClaimFacts) and not cf.allocated:
                waiting.append(name)
                evidence.append(Evidence(Plane.KUBERNETES, str(c.ref), "status.allocation", None, c.newest))
            elif not name:
                waiting.append(f"(claim of pod {p.ref.name} not created yet)")
    message, source = _unschedulable_message(unbound, events)
    if message is not None and _DRA.search(message):
        evidence.append(source)
        what = f"ResourceClaim(s) {', '.join(waiting[:3])} not allocated; " if waiting else ""
        return Blocked(Stage.DEVICE_ALLOCATION, f"{len(unbound)} pod(s) unbound; {what}scheduler: {_short(message)}",
                       _since(unbound), tuple(evidence))
    if waiting and (message is None or not _CAPACITY.search(message)):
        return Blocked(Stage.DEVICE_ALLOCATION,
                       f"{len(unbound)} pod(s) unbound; ResourceClaim(s) {', '.join(waiting[:3])} not allocated",
                       _since(unbound), tuple(evidence))
    return None


def _since(pods: list[ObjectRecord]) -> datetime | None:
    return min((p.created for p in pods if p.created), default=None)


def _unschedulable_message(unbound: list[ObjectRecord], events: list[ObjectRecord]) -> tuple[str | None, Evidence]:
    """The scheduler's latest word on the unbound pods: its FailedScheduling event, else the pods'
    PodScheduled=False condition (all there is when events have expired or were not collected)."""
    names = {p.ref.name for p in unbound}
    failed = [e for e in events if isinstance(e.facts, EventFacts) and e.facts.reason == "FailedScheduling"
              and e.facts.regarding.kind == "Pod" and e.facts.regarding.name in names
              and not _is_karpenter(e.facts)]
    if failed:
        f = failed[-1].facts
        assert isinstance(f, EventFacts)
        return f.message, event_evidence(failed[-1:])[0]
    for p in unbound:
        c = p.condition("PodScheduled")
        if c is not None and not c.is_true and c.message:
            return c.message, Evidence(Plane.KUBERNETES, str(p.ref), "status.conditions[PodScheduled]",
                                       f"{c.status}: {c.reason}: {c.message[:200]}", c.last_transition)
    return None, Evidence(Plane.KUBERNETES, "", "", None, None)


def _is_karpenter(e: EventFacts) -> bool:
    return e.component.startswith("karpenter")


def _nodeclaim_wait(ev: RunEvidence) -> tuple[str, list[Evidence]] | None:
    """A Karpenter NodeClaim nominated for the run's pods that has not become a ready node."""
    warnings = [e for e in ev.nodeclaim_events if isinstance(e.facts, EventFacts) and e.facts.type == "Warning"]
    if warnings:
        w = warnings[-1].facts
        assert isinstance(w, EventFacts)
        return f"Karpenter {w.reason}: {_short(w.message, 240)}", event_evidence(warnings[-1:])
    for nc in ev.nodeclaims:
        if not isinstance(nc.facts, NodeClaimFacts):
            continue
        for ctype in ("Launched", "Registered", "Initialized", "Ready"):
            c = nc.condition(ctype)
            if c is None or not c.is_true:
                detail = f"{c.status}" + (f" ({c.reason})" if c and c.reason else "") if c else "not yet"
                msg = f": {c.message[:200]}" if c is not None and c.message else ""
                ev_ = Evidence(Plane.KUBERNETES, str(nc.ref), f"status.conditions[{ctype}]",
                               f"{detail}{msg}", c.last_transition if c else nc.created)
                pool = f" (NodePool {nc.facts.node_pool})" if nc.facts.node_pool else ""
                return f"Karpenter NodeClaim {nc.ref.name}{pool} {ctype} {detail}{msg}", [ev_]
    return None


def _gated(unbound: list[ObjectRecord]) -> Blocked | None:
    """Pods the scheduler may not even consider yet: their scheduling gates name who holds them."""
    for p in unbound:
        f = p.facts
        if not isinstance(f, PodFacts) or not f.scheduling_gates:
            continue
        gate = f.scheduling_gates[0]
        ev_ = Evidence(Plane.KUBERNETES, str(p.ref), "spec.schedulingGates", list(f.scheduling_gates), p.created)
        if gate.startswith("kueue.x-k8s.io/"):
            what = " (topology-aware scheduling has not placed it yet)" if gate == KUEUE_TOPOLOGY_GATE else ""
            return Blocked(Stage.QUEUE_ADMISSION, f"{len(unbound)} pod(s) unbound; pod {p.ref.name} held by Kueue's"
                           f" scheduling gate {gate}{what}", _since(unbound), (ev_,))
        return Blocked(Stage.POD_SCHEDULING, f"{len(unbound)} pod(s) unbound; pod {p.ref.name} held by scheduling"
                       f" gate {gate}", _since(unbound), (ev_,))
    return None


def _scheduling(ev: RunEvidence, unbound: list[ObjectRecord], events: list[ObjectRecord], clock: Clock) -> Blocked:
    gated = _gated(unbound)
    if gated is not None:
        return gated
    now = clock.now
    names = {p.ref.name for p in unbound}
    pod_events = sorted(
        (e for e in events if isinstance(e.facts, EventFacts) and e.facts.regarding.kind == "Pod"
         and e.facts.regarding.name in names),
        key=lambda e: e.facts.last or now if isinstance(e.facts, EventFacts) else now,
    )
    if any(isinstance(e.facts, EventFacts) and e.facts.last is None for e in pod_events):
        # Undated events sort as "now": one stamped ahead of the clock moves before them once reached.
        for e in pod_events:
            if isinstance(e.facts, EventFacts) and e.facts.last is not None:
                clock.reached(e.facts.last)
    scaler = [e for e in pod_events if isinstance(e.facts, EventFacts) and e.facts.reason in AUTOSCALER_REASONS]
    karpenter_failed = [e for e in pod_events if isinstance(e.facts, EventFacts)
                        and e.facts.reason == "FailedScheduling" and _is_karpenter(e.facts)]
    count = f"{len(unbound)} pod(s) unbound"
    since = _since(unbound)
    message, source = _unschedulable_message(unbound, events)
    capacity_short = message is not None and bool(_CAPACITY.search(message))
    scheduler_ev = [source] if message is not None else []
    nodeclaim = _nodeclaim_wait(ev)
    if nodeclaim is not None and (capacity_short or message is None):
        text, nc_ev = nodeclaim
        return Blocked(Stage.NODE_SCALING, f"{count}; {text}", since,
                       tuple([*scheduler_ev, *nc_ev, *event_evidence(scaler[-1:])]))
    if karpenter_failed and (capacity_short or message is None):
        last_k = karpenter_failed[-1].facts
        assert isinstance(last_k, EventFacts)
        return Blocked(Stage.NODE_SCALING, f"{count}; Karpenter cannot provision a node: {_short(last_k.message, 240)}",
                       since, tuple([*scheduler_ev, *event_evidence(karpenter_failed[-1:])]))
    if scaler and (capacity_short or message is None):
        last = scaler[-1].facts
        assert isinstance(last, EventFacts)
        verb = {
            "TriggeredScaleUp": "scale-up triggered, waiting for the node",
            "Nominated": "node provisioner nominated a node, waiting for it",
            "NotTriggerScaleUp": "cluster autoscaler cannot add a matching node",
        }[last.reason]
        reason = f"{count}; {verb}: {last.message}"
        if message is not None:
            reason += f" (scheduler: {_short(message)})"
        return Blocked(Stage.NODE_SCALING, reason, since, tuple([*scheduler_ev, *event_evidence(scaler[-2:])]))
    if message is not None and _GPU_SHORT.search(message):
        # The device plugin owns the wait only on nodes the pods could use: a short node their
        # selector, affinity or tolerations exclude says nothing about them.
        short = [n for n in ev.gpu_short_nodes
                 if any(could_run(p.facts.placement, n) for p in unbound if isinstance(p.facts, PodFacts))]
        if short:
            nf = short[0].facts
            assert isinstance(nf, NodeFacts)
            return Blocked(Stage.DEVICE_ALLOCATION,
                           f"{count}; scheduler: {_short(message)}; the device plugin advertises fewer GPUs than"
                           f" installed on {len(short)} node(s), e.g. {short[0].ref.name}"
                           f" {nf.gpu_allocatable}/{nf.gpu_capacity} allocatable",
                           since, tuple([*scheduler_ev, *(Evidence(Plane.KUBERNETES, str(n.ref),
                                                                   "status.allocatable/capacity GPUs",
                                                                   f"{n.facts.gpu_allocatable}/{n.facts.gpu_capacity}",
                                                                   n.newest)
                                                          for n in short[:3] if isinstance(n.facts, NodeFacts))]))
    if message is not None:
        reason = f"{count}; scheduler: {_short(message)}"
        if scaler:
            last = scaler[-1].facts
            assert isinstance(last, EventFacts)
            reason += f"; {last.reason}: {last.message}".rstrip(": ")
        elif capacity_short:
            reason += "; no node scale-up observed"
        return Blocked(Stage.POD_SCHEDULING, reason, since, tuple([*scheduler_ev, *event_evidence(scaler[-1:])]))
    return Blocked(Stage.POD_SCHEDULING, f"{count}; no scheduler events or PodScheduled message observed", since,
                   tuple(Evidence(Plane.KUBERNETES, str(p.ref), "spec.nodeName", None, p.created)
                         for p in unbound[:3]))


def could_run(placement: Placement | None, node: ObjectRecord) -> bool:
    """Whether a pod with this placement could be scheduled on `node` at all (its nodeSelector, its
    required node affinity, the node's NoSchedule/NoExecute taints), capacity aside."""
    nf = node.facts
    if not isinstance(nf, NodeFacts):
        return False
    pl = placement or Placement()
    labels = nf.labels
    if any(labels.get(k) != v for k, v in pl.selector):
        return False
    if pl.terms and not any(term and all(_matches(labels, e) for e in term) for term in pl.terms):
        return False
    return all(effect not in ("NoSchedule", "NoExecute") or any(_tolerates(t, key, value, effect)
                                                                for t in pl.tolerations)
               for key, value, effect in nf.taints)


def _matches(labels: Mapping[str, str], expr: tuple[str, str, tuple[str, ...]]) -> bool:
    key, op, values = expr
    v = labels.get(key)
    if op == "In":
        return v is not None and v in values
    if op == "NotIn":
        return v is None or v not in values
    if op == "Exists":
        return v is not None
    if op == "DoesNotExist":
        return v is None
    if op in ("Gt", "Lt") and v is not None and len(values) == 1:
        try:
            a, b = int(v), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _tolerates(t: tuple[str, str, str, str], key: str, value: str, effect: str) -> bool:
    tkey, op, tvalue, teffect = t
    if teffect and teffect != effect:
        return False
    if op == "Exists":
        return not tkey or tkey == key
    return tkey == key and tvalue == value


def _short(message: str, limit: int = 160) -> str:
    head = message.split(" preemption:")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"
