"""The claim engine: scheduled, running and progressing from run evidence and a clock.

Pure: no I/O, no wall clock. The same evidence and `now` give the same claims, which is what
lets `explain --from-dump` and the live controller agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from collector.claims import memo
from collector.claims.asserted import Assertion, assertion_of
from collector.claims.blocked import blocked_stage
from collector.claims.common import Clock, Freshness, human_age, latest, latest_condition
from collector.claims.common import claim as _claim
from collector.claims.common import hm as _hm
from collector.claims.goodput import goodput
from collector.claims.lineage import Lineage, RunPods, lineages, replaced_pods
from collector.claims.membership import Expected, work_pods
from collector.claims.membership import expected_pods as _expected
from collector.claims.memo import newest_stamp
from collector.claims.progress import ProgressView, analyze
from collector.claims.progress_walk import ByScan
from collector.claims.progressing import progressing_claim
from collector.claims.stragglers import stragglers
from collector.claims.workrisk import work_at_risk
from collector.correlate import Key, RunEvidence, Signal
from collector.kube import MULTIKUEUE_MANAGER
from collector.model import (
    AdmissionCheckFacts,
    Claim,
    EventFacts,
    Evidence,
    JobFacts,
    NodeFacts,
    ObjectRecord,
    Observed,
    Plane,
    PodFacts,
    RayClusterFacts,
    RayJobFacts,
    RunClaims,
    TauRunFacts,
    WorkloadFacts,
)
from collector.progress import shift_scan
from collector.progress.model import LogScan
from collector.settings import ClaimSettings

# A log line stamped this long after it was read comes from a clock ahead (or a tenant's own forged
# time): more than synchronized clocks and a read's latency explain.
NODE_CLOCK_TOLERANCE = timedelta(seconds=30)

# Container waiting reasons that mean "cannot start", worth naming to a human.
_STUCK_WAITING = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "ContainerCannotRun",
    }
)


def _root_plane(root: ObjectRecord) -> Plane:
    kind = root.ref.kind
    if kind.startswith("Tau"):
        return Plane.TAUGRID
    if kind in ("RayJob", "RayCluster"):
        return Plane.KUBERAY
    return Plane.KUBERNETES


def expected_pods(ev: RunEvidence) -> tuple[int | None, str]:
    """How many pods the run should have, and which declaration said so (kept for callers)."""
    e = _expected(ev)
    return e.count, e.source


def _dispatched(ev: RunEvidence) -> tuple[str, list[Evidence]]:
    """MultiKueue: the worker cluster an admitted Workload was dispatched to, with the evidence."""
    for wl in ev.workloads:
        f = wl.facts
        if not isinstance(f, WorkloadFacts):
            continue
        adm = wl.condition("Admitted")
        mk = [a for a in f.admission_checks if (ac := ev.admission_checks.get(a.name)) is not None
              and isinstance(ac.facts, AdmissionCheckFacts) and ac.facts.controller_name == MULTIKUEUE_MANAGER]
        managed = [r for r in (ev.root, *ev.jobs, *ev.rayjobs)
                   if isinstance(r.facts, JobFacts | RayJobFacts) and r.facts.managed_by == MULTIKUEUE_MANAGER]
        # status.clusterName is written only by MultiKueue's dispatcher; the check and managedBy,
        # when observed, are kept as corroborating evidence.
        if f.cluster_name and adm is not None and adm.is_true:
            out = [Evidence(Plane.KUEUE, str(wl.ref), "status.clusterName", f.cluster_name, adm.last_transition)]
            out += [Evidence(Plane.KUEUE, str(wl.ref), f"status.admissionChecks[{a.name}]",
                             f"{a.state} ({MULTIKUEUE_MANAGER})", a.last_transition) for a in mk]
            out += [Evidence(Plane.KUBERNETES, str(r.ref), "spec.managedBy", MULTIKUEUE_MANAGER, r.created)
                    for r in managed[:1]]
            return f.cluster_name, out
    return "", []


def _root_assertion(ev: RunEvidence, fresh: Freshness) -> Assertion:
    """The root's own status, if its source is fresh: a stale status asserts nothing."""
    a = assertion_of(ev.root)
    kind = ev.root.ref.kind
    if ev.inferred or a.source == "status" and not a.value:
        return a
    if not fresh.ok(kind):
        return Assertion.silent(a.source, f"{a.value or '(unset)'} (not trusted: {fresh.why_not(kind)})")
    return a


def evaluate(ev: RunEvidence, now: datetime, s: ClaimSettings, *,
             slack: timedelta | None = timedelta(0)) -> RunClaims:
    """The run's claims at `now`. `recheck_at` on the result is the earliest later instant at which
    they could change with no new evidence (a bound passed, a window closed); None: never.

    `slack`: the evidence may have been captured up to this much after `now` (a dump's capture time
    is bounded by control-plane stamps, `sources.dump.CaptureClock`); None: no upper bound known."""
    clock = Clock(now, slack)
    if ev.taurun is not None and isinstance(ev.taurun.facts, TauRunFacts):
        s = s.for_profile(ev.taurun.facts.profile)
    fresh = Freshness(ev.synced, clock, s.evidence_max_age)
    a = _root_assertion(ev, fresh)
    status_ev = Evidence(_root_plane(ev.root), str(ev.root.ref), a.source, a.value or None, ev.root.newest)
    pods = work_pods(ev)
    live = [p for p in pods if isinstance(p.facts, PodFacts) and not p.facts.terminal and not p.facts.deleting]
    exp = _expected(ev, clock, s)
    worker, dispatch_ev = _dispatched(ev)

    # Only sources read recently count; a stale one is no evidence (fail closed). A pod on a node whose
    # clock runs ahead stamps its lines ahead: they are read on the evaluation clock.
    # A retired pod's last read is history (the mark its replacement must pass), not a fresh read.
    fresh_signals = [_on_our_clock(sig, ev) for sig in ev.signals
                     if sig.retired or clock.within(sig.read_at, s.evidence_max_age)]
    # Rate comes from step counters (logs, metrics); checkpoints are durability, judged apart
    # (their lower steps would read as replays), and stand in for rate only when nothing else exists.
    # A helper container's lines (a log shipper's, a metrics sidecar's) are not the trainer's progress.
    helpers = {(p.ref.key, c) for p in ev.pods if isinstance(p.facts, PodFacts) for c in p.facts.helpers} \
        if fresh_signals else set()
    # Lines stamped after they were read come from a clock ahead by an unknown amount or a tenant's
    # forged times: they cannot be placed (fail closed).
    off_clock = _off_clock(ev, fresh_signals, clock) if fresh_signals else {}
    rate = [sig for sig in fresh_signals if not sig.durable and (sig.ref.key, sig.source) not in helpers
            and (sig.ref.key, sig.source) not in off_clock]
    durable = [sig for sig in fresh_signals if sig.durable]
    run_pods = memo.run_pods(ev)  # (kept while its records stand: collector/claims/memo.py)
    lineage = lineages(ev, run_pods) if rate else None
    view = analyze(rate or durable, s, now, clock=clock, lineage=lineage) if fresh_signals else None
    durable_view = analyze(durable, s, now, clock=clock) if durable and rate else None
    if worker and not live:
        why = (f"MultiKueue dispatched the run to worker cluster {worker}; its pods run there and are not"
               " observed from this cluster")
        scheduled = _claim(a.scheduled, Observed.UNKNOWN, None, why, dispatch_ev, status_ev)
        running = _claim(a.running, Observed.UNKNOWN, None, why, dispatch_ev, status_ev)
    else:
        scheduled = _scheduled(ev, a, status_ev, live, exp, fresh)
        running = _running(ev, a, status_ev, live, exp, scheduled, fresh, clock, s, Recovery(view, lineage, clock),
                           run_pods)
    progressing = progressing_claim(ev, a, status_ev, running, fresh_signals, view, clock, s, durable_view, lineage,
                                    off_clock=tuple(dict.fromkeys(off_clock.values())))
    scheduled_at = scheduled.since if scheduled.observed is Observed.TRUE else None
    crash_looping = running.observed is Observed.FALSE and "CrashLoopBackOff" in running.reason
    blocked = None
    # Only a fresh "not scheduled" has a stage to blame; unknown stays unknown (fail closed).
    if scheduled.observed is Observed.FALSE and not a.finished:
        blocked = blocked_stage(ev, clock, fresh, s)
    extra = _context(ev, exp.count)
    if worker:
        extra["worker_cluster"] = worker
    if ev.inferred:
        extra["inferred_from"] = "pods"
    return RunClaims(
        ref=ev.root.ref,
        scheduled=scheduled,
        running=running,
        progressing=progressing,
        blocked=blocked,
        evaluated_at=now,
        finished=a.finished,
        extra=extra,
        # Goodput grows with the clock: linearly until `recheck_at` (its own bends are noted on the clock),
        # so exporters carry it forward at their clock (`Goodput.at`) between evaluations.
        goodput=goodput(ev, view, scheduled_at, now, crash_looping=crash_looping,
                        stalled_now=progressing.observed is Observed.FALSE and running.observed is Observed.TRUE,
                        clock=clock),
        stragglers=None if a.finished else stragglers(ev, rate, now, lineage),
        work_at_risk=None if a.finished else work_at_risk(ev, clock, s.evidence_max_age),
        recheck_at=clock.recheck_at,
        recheck_other=clock.other,
    )


def _node_of(ev: RunEvidence, sig: Signal) -> str:
    if sig.ref.kind != "Pod":
        return ""
    pod = next((p for p in ev.pods if p.ref.key == sig.ref.key), None)
    return pod.facts.node_name if pod is not None and isinstance(pod.facts, PodFacts) else ""


def _nodes(ev: RunEvidence) -> dict[Key, str]:
    """Pod key → its node (one pass: a run of 64 pods has 64 signals or more)."""
    return {p.ref.key: p.facts.node_name for p in ev.pods if isinstance(p.facts, PodFacts)}


def _off_clock(ev: RunEvidence, signals: list[Signal], clock: Clock) -> dict[tuple[Key, str], str]:
    """Signals whose stamps cannot be placed, with why: a line stamped after the signal was read (after
    the latest instant a dump can have been captured) comes from a clock that runs ahead or from a
    tenant's own forged time; on a node whose clock is not measured yet, every signal of that node
    goes with it (its kubelet's stamps are all on that clock)."""
    out: dict[tuple[Key, str], str] = {}
    ahead_nodes: dict[str, str] = {}
    nodes = _nodes(ev)
    for sig in signals:
        if sig.retired or sig.durable:
            continue
        newest = newest_stamp(sig.scan)  # (once per scan object: collector/claims/memo.py)
        if newest is None:
            continue
        # the latest instant the read can have happened: a dump's capture lies within the clock's slack
        latest = sig.read_at + clock.slack if clock.slack is not None else None
        node = nodes.get(sig.ref.key, "") if sig.ref.kind == "Pod" else ""
        if node in ev.node_clock_unsure:
            # seen only in a list, whose heartbeat may be minutes old: how far its clock runs ahead is
            # not measured, and a clock 90 s ahead makes a stall 90 s younger
            ahead_nodes.setdefault(node, f"node {node}'s clock is not measured yet: its stamps cannot be placed"
                                         " (live: no node Lease read, and no heartbeat posted since the collector"
                                         " started, until its kubelet's next one; a dump: its kubelet's Events show"
                                         " it off, or no Lease of it and its heartbeat stands far past the other"
                                         " nodes')")
        elif latest is not None and newest - latest > NODE_CLOCK_TOLERANCE:
            out[(sig.ref.key, sig.source)] = (
                f"{sig.ref.name}/{sig.source} holds lines stamped {human_age(newest - latest)} after it was read:"
                " its clock runs ahead or its times are not the kubelet's; its stamps cannot be placed")
    for sig in signals if ahead_nodes else ():
        why = ahead_nodes.get(nodes.get(sig.ref.key, "") if sig.ref.kind == "Pod" else "")
        if why is not None and not sig.retired:
            out[(sig.ref.key, sig.source)] = why
    return out


def _on_our_clock(sig: Signal, ev: RunEvidence) -> Signal:
    """`sig` with its stamps moved back by how far its pod's node's clock runs ahead (they come from
    that node's kubelet and container runtime, or the trainer's own clock there)."""
    if not ev.node_skew or sig.ref.kind != "Pod":
        return sig
    skew = ev.node_skew.get(_node_of(ev, sig))
    if not skew:
        return sig
    # The same scan shifted by the same skew is the same object on the next evaluation, so that its
    # progress walk is reused (collector/claims/progress_walk.py keeps walks by scan identity).
    kept = _SHIFTED.get(sig.scan)
    if kept is None or kept[0] != skew:
        kept = (skew, shift_scan(sig.scan, -skew))
        _SHIFTED.put(sig.scan, kept)
    return replace(sig, scan=kept[1])


_SHIFTED: ByScan[tuple[timedelta, LogScan]] = ByScan()  # a scan's stamps on our clock, by the scan


def _context(ev: RunEvidence, expected: int | None) -> dict[str, object]:
    ctx: dict[str, object] = {}
    for wl in ev.workloads:
        f = wl.facts
        if isinstance(f, WorkloadFacts):
            ctx["queue"] = f.queue_name
            if f.cluster_queue:
                ctx["cluster_queue"] = f.cluster_queue
    if ev.taurun is not None and isinstance(ev.taurun.facts, TauRunFacts):
        t = ev.taurun.facts
        ctx["profile"] = t.profile
        if t.workers is not None:
            ctx["workers"] = t.workers
        if t.gpus_per_worker is not None:
            ctx["gpus_per_worker"] = t.gpus_per_worker
    if expected is not None:
        ctx["expected_pods"] = expected
    return ctx


# --- scheduled -----------------------------------------------------------------------------------


def _admission(ev: RunEvidence) -> tuple[bool | None, datetime | None, list[Evidence]]:
    """Kueue's verdict on the run's workloads: admitted?, since when, evidence. None: no Kueue plane."""
    if not ev.workloads:
        return None, None, []
    evidence: list[Evidence] = []
    admitted_all = True
    since: datetime | None = None
    for wl in ev.workloads:
        qr, adm, evc, fin = (wl.condition(t) for t in ("QuotaReserved", "Admitted", "Evicted", "Finished"))
        ok = qr is not None and qr.is_true and (adm is None or adm.is_true)
        if evc is not None and evc.is_true:
            # Evicted (preempted) while the quota is still reserved and Admitted still True: Kueue is
            # taking the run back (KubeRay suspends it); it is not scheduled, whatever the pods say.
            ok = False
            evidence.append(Evidence(Plane.KUEUE, str(wl.ref), "status.conditions[Evicted]",
                                     f"True: {evc.reason}", evc.last_transition))
        if fin is not None and fin.is_true:
            ok = False
            holds = " while still holding its quota reservation" if qr is not None and qr.is_true else ""
            evidence.append(Evidence(Plane.KUEUE, str(wl.ref), "status.conditions[Finished]",
                                     f"True: {fin.reason}{holds}", fin.last_transition))
        c = adm if adm is not None else qr
        if c is not None:
            evidence.append(Evidence(Plane.KUEUE, str(wl.ref), f"status.conditions[{c.type}]",
                                     f"{c.status}: {c.reason}" if c.reason else c.status, c.last_transition))
            since = latest((since, c.last_transition))
        admitted_all = admitted_all and ok
    return admitted_all, since, evidence


def _scheduled(ev: RunEvidence, a: Assertion, status_ev: Evidence, live: list[ObjectRecord], exp: Expected,
               fresh: Freshness) -> Claim:
    if not fresh.ok("Pod"):
        return _claim(a.scheduled, Observed.UNKNOWN, None, fresh.why_not("Pod"), [], status_ev)
    admitted, admitted_at, evidence = _admission(ev)
    if admitted is not None and not fresh.ok("Workload"):
        return _claim(a.scheduled, Observed.UNKNOWN, None, fresh.why_not("Workload"), evidence, status_ev)
    # Bound to a node but its allocated devices unhealthy before it ever started, or the kubelet could
    # not prepare its DRA devices (driver not registered, NodePrepareResources failed): not allocated.
    unprepared = _unprepared(ev, live)
    bound = [p for p in live if isinstance(p.facts, PodFacts) and p.facts.node_name
             and not (p.facts.phase == "Pending" and p.facts.unhealthy_devices) and p.ref.name not in unprepared]
    unbound = len(live) - len(bound)
    gpus = sum(p.facts.gpus for p in bound if isinstance(p.facts, PodFacts))
    pod_at = fresh.at("Pod")
    # A run always needs at least one pod; a declared zero is a misconfiguration, not "done".
    want = max(exp.count, 1) if exp.count is not None else None
    of = str(want) if want is not None else "?"
    evidence.append(Evidence(Plane.KUBERNETES, f"Pod/{ev.root.ref.namespace}/*", "spec.nodeName",
                             f"{len(bound)}/{of} bound" + (f" ({exp.source})" if exp.source else ""), pod_at))
    bound_since = latest_condition(bound, "PodScheduled", true=True)
    if admitted is False:
        evicted = next((c for wl in ev.workloads if (c := wl.condition("Evicted")) is not None and c.is_true), None)
        why = ("run finished; Kueue no longer admits it" if a.finished else
               f"Kueue evicted the workload ({evicted.reason})" if evicted is not None else
               "Kueue has not admitted the workload")
        return _claim(a.scheduled, Observed.FALSE, admitted_at, why, evidence, status_ev)
    if a.finished and not live:
        return _claim(a.scheduled, Observed.FALSE, ev.root.newest, "run finished; no pod holds resources",
                      evidence, status_ev)
    unhealthy = [(p, d) for p in bound if isinstance(p.facts, PodFacts) for d in p.facts.unhealthy_devices]
    for p, d in unhealthy[:3]:
        evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), "containerStatuses[].allocatedResourcesStatus", d,
                                 pod_at))
    if want is not None and len(bound) >= want and bound and not unbound:
        parts = [f"{len(bound)}/{want} pods bound"]
        if gpus:
            parts.append(f"{gpus} GPUs requested on bound pods")
        if admitted:
            parts.append(f"Kueue admitted{' ' + _hm(admitted_at) if admitted_at else ''}")
        if unhealthy:
            parts.append(f"{len(unhealthy)} allocated device(s) unhealthy: {unhealthy[0][1]}")
        return _claim(a.scheduled, Observed.TRUE, latest((bound_since, admitted_at)), "; ".join(parts),
                      evidence, status_ev)
    if want is None and (unbound == 0 and bound):
        # Every pod in view is bound, but nothing trustworthy says how many there should be.
        return _claim(a.scheduled, Observed.UNKNOWN, None, f"{len(bound)} pods bound; {exp.why_unknown}",
                      evidence, status_ev)
    reason = f"{len(bound)}/{of} pods bound"
    if unprepared:
        name, why = next(iter(unprepared.items()))
        reason += f"; pod {name} is on its node but its devices are not prepared ({why[:200]})"
    if want is not None and unbound and len(bound) >= want:
        reason += f", {unbound} more unbound"
    if want is None:
        reason += f" ({unbound} unbound; {exp.why_unknown})" if unbound else f"; {exp.why_unknown}"
    return _claim(a.scheduled, Observed.FALSE, bound_since or ev.root.created, reason, evidence, status_ev)


def _unprepared(ev: RunEvidence, live: list[ObjectRecord]) -> dict[str, str]:
    """Bound pods that have not started because the kubelet could not prepare their DRA devices
    (FailedPrepareDynamicResources), by name, with the kubelet's message."""
    if not ev.events:
        return {}  # (at once: no Event names one)
    waiting = {p.ref.name for p in live if isinstance(p.facts, PodFacts) and p.facts.node_name
               and p.facts.phase == "Pending" and not any(c.state == "running" for c in p.facts.containers)}
    out: dict[str, str] = {}
    for e in ev.events:
        f = e.facts
        if isinstance(f, EventFacts) and f.reason == "FailedPrepareDynamicResources" and f.regarding.kind == "Pod" \
                and f.regarding.name in waiting:
            out[f.regarding.name] = f.message
    return out


# --- running -------------------------------------------------------------------------------------


class Recovery:
    """Whether a container that restarted (or a pod that replaced another) has recovered: its own
    stream advanced past its pre-restart high-water mark since, inside the stall window. Only the
    same rank's steps say so: another log that started earlier proves nothing about this one."""

    def __init__(self, view: ProgressView | None, lineage: Mapping[tuple[Key, str], Lineage] | None,
                 clock: Clock) -> None:
        ok = view is not None and view.invalid is None and view.nonfinite_since is None
        self._last: dict[str, datetime] = {}
        if ok and view is not None:
            for v in view.streams:
                if clock.within(v.last.at, v.window, step=True):
                    self._last[v.last.stream] = v.last.at
        self._lineage = lineage or {}

    def since(self, pod: ObjectRecord, container: str, at: datetime) -> bool:
        lin = self._lineage.get((pod.ref.key, container))
        last = self._last.get(lin.stream if lin is not None else f"{pod.ref.name}/{container}")
        return last is not None and last > at

    def pod_since(self, pod: ObjectRecord, at: datetime) -> bool:
        f = pod.facts
        return isinstance(f, PodFacts) and any(self.since(pod, c.name, at) for c in f.containers if not c.init)


def _running(ev: RunEvidence, a: Assertion, status_ev: Evidence, live: list[ObjectRecord], exp: Expected,
             scheduled: Claim, fresh: Freshness, clock: Clock, s: ClaimSettings,
             recovery: Recovery | None = None, run_pods: RunPods | None = None) -> Claim:
    now = clock.now
    want = max(exp.count, 1) if exp.count is not None else None
    if not fresh.ok("Pod"):
        return _claim(a.running, Observed.UNKNOWN, None, fresh.why_not("Pod"), [], status_ev)
    evidence: list[Evidence] = []
    problems: list[str] = []
    since: datetime | None = None
    # KubeRay mirrors the Ray job's state; a RayJob "Running" whose Ray job ended is not running.
    for rj in ev.rayjobs:
        f = rj.facts
        if isinstance(f, RayJobFacts) and f.job_status:
            evidence.append(Evidence(Plane.KUBERAY, str(rj.ref), "status.jobStatus", f.job_status, rj.newest))
            if f.job_status != "RUNNING":
                msg = f"Ray job {f.job_status}"
                if f.message:
                    msg += f": {f.message.splitlines()[0][:160]}"
                if f.deployment_status == "Running" and f.job_status in ("FAILED", "STOPPED", "SUCCEEDED"):
                    msg += " (RayJob deployment still says Running)"
                problems.append(msg)
                since = latest((since, f.end_time or rj.newest))
    problems.extend(_ray_runtime(ev, evidence, problems, clock, s))
    for rc in ev.rayclusters:
        cf = rc.facts
        if isinstance(cf, RayClusterFacts) and cf.desired_workers and cf.ready_workers is not None:
            evidence.append(Evidence(Plane.KUBERAY, str(rc.ref), "status.readyWorkerReplicas",
                                     f"{cf.ready_workers}/{cf.desired_workers}", rc.newest))
            if cf.ready_workers < cf.desired_workers:
                problems.append(f"RayCluster {cf.ready_workers}/{cf.desired_workers} workers ready")
    ready = 0
    restarts = 0
    unseen: list[tuple[str, str]] = []  # (pod, node) on a node not in the evidence: health unknown
    # Pods that replaced an earlier incarnation of their rank are restarts too (a new pod, not a count).
    replaced = {p.ref.key: why for p, why in replaced_pods(ev, run_pods)}
    for p in live:
        f = p.facts
        assert isinstance(f, PodFacts)
        rc_ = p.condition("Ready")
        pod_ready = f.phase == "Running" and rc_ is not None and rc_.is_true
        for c in f.containers:
            restarts += c.restart_count
            if c.state == "waiting" and (c.state_reason in _STUCK_WAITING or c.init is False and c.state_reason):
                detail = c.state_reason
                if c.last_reason:
                    detail += f", last exit {c.last_reason}"
                    if c.last_exit_code is not None:
                        detail += f" ({c.last_exit_code})"
                if c.restart_count:
                    detail += f", {c.restart_count} restarts"
                problems.append(f"pod {p.ref.name} container {c.name}: {detail}")
                evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), f"containerStatuses[{c.name}].state",
                                         f"waiting: {c.state_reason}" + (f" {c.state_message[:120]}"
                                                                         if c.state_message else ""),
                                         c.state_since or fresh.at("Pod")))
                since = latest((since, c.last_finished, c.state_since))
                pod_ready = False
            elif (c.last_finished is not None and not c.init and c.state == "running" and pod_ready
                  and recovery is not None and recovery.since(p, c.name, c.last_finished)
                  and clock.recent(c.last_finished, s.restart_window)):
                evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), f"containerStatuses[{c.name}].lastState",
                                         f"terminated: {c.last_reason} ({c.last_exit_code}); recovered: steps"
                                         " advanced past the pre-restart high-water mark since", c.last_finished))
            elif c.last_finished is not None and not c.init and clock.recent(c.last_finished, s.restart_window):
                problems.append(f"pod {p.ref.name} container {c.name} restarted {human_age(now - c.last_finished)}"
                                f" ago ({c.last_reason or 'exit'}"
                                + (f" {c.last_exit_code}" if c.last_exit_code is not None else "") + ")")
                evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), f"containerStatuses[{c.name}].lastState",
                                         f"terminated: {c.last_reason} ({c.last_exit_code})", c.last_finished))
                since = latest((since, c.last_finished))
        node = ev.nodes.get(f.node_name) if f.node_name and fresh.ok("Node") else None
        nf = node.facts if node is not None else None
        if isinstance(nf, NodeFacts) and nf.ready != "True":
            # A node that stopped reporting leaves its pods' last status (Ready) in place for a while.
            assert node is not None
            problems.append(f"node {f.node_name} under pod {p.ref.name} is "
                            f"{'NotReady' if nf.ready == 'False' else 'Unknown'}"
                            + (f" ({nf.ready_reason})" if nf.ready_reason else ""))
            evidence.append(Evidence(Plane.KUBERNETES, str(node.ref), "status.conditions[Ready]",
                                     f"{nf.ready or 'absent'}: {nf.ready_reason}: {nf.ready_message}".rstrip(": "),
                                     nf.ready_since))
            since = latest((since, nf.ready_since))
            pod_ready = False
        for d in f.unhealthy_devices[:2] if f.unhealthy_devices else ():
            problems.append(f"pod {p.ref.name} device unhealthy ({d})")
            pod_ready = False
        replacement = replaced.get(p.ref.key) if replaced else None
        if replacement and p.created is not None and pod_ready and clock.recent(p.created, s.restart_window):
            if recovery is not None and recovery.pod_since(p, p.created):
                evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), "metadata.creationTimestamp",
                                         f"replacement ({replacement}); recovered: steps advanced past the"
                                         " pre-restart high-water mark since", p.created))
            else:
                problems.append(f"{replacement} {human_age(now - p.created)} ago")
                evidence.append(Evidence(Plane.KUBERNETES, str(p.ref), "metadata.creationTimestamp",
                                         f"replacement: {replacement}", p.created))
                since = latest((since, p.created))
        if pod_ready and f.node_name and not isinstance(nf, NodeFacts):
            unseen.append((p.ref.name, f.node_name))
        if pod_ready:
            ready += 1
        else:
            if f.phase != "Running":
                problems.append(f"pod {p.ref.name} {f.phase or 'phase unknown'}"
                                + (f" ({f.reason})" if f.reason else ""))
            elif rc_ is not None and not rc_.is_true:
                problems.append(f"pod {p.ref.name} not Ready ({rc_.reason or rc_.status})")
            since = latest((since, rc_.last_transition if rc_ else None))
    of = str(want) if want is not None else "?"
    n_replaced = sum(1 for p in live if p.ref.key in replaced) if replaced else 0
    counted = f"{restarts} restarts" + (f", {n_replaced} pod(s) replaced" if n_replaced else "")
    evidence.append(Evidence(Plane.KUBERNETES, f"Pod/{ev.root.ref.namespace}/*", "status.conditions[Ready]",
                             f"{ready}/{of} Running and Ready, {counted}", fresh.at("Pod")))
    if scheduled.observed is Observed.UNKNOWN and not problems:
        return _claim(a.running, Observed.UNKNOWN, None, "scheduled is unknown: " + scheduled.reason,
                      evidence, status_ev)
    if want is not None and ready >= want and not problems and scheduled.observed is Observed.TRUE and unseen:
        # Absent evidence is not healthy evidence: a node nobody sees may be down with its pods' last
        # status (Ready) still in place.
        pod_name, node_name = unseen[0]
        why = ("the evidence holds no Nodes" if not fresh.ok("Node") else f"node {node_name} is not in the evidence")
        more = f" (+{len(unseen) - 1} more pods)" if len(unseen) > 1 else ""
        return _claim(a.running, Observed.UNKNOWN, None,
                      f"{ready}/{want} pods Running and Ready, but pod {pod_name} runs on {node_name}{more} and {why}: "
                      "its health is unknown", evidence, status_ev)
    if want is not None and ready >= want and not problems and scheduled.observed is Observed.TRUE:
        ready_since = latest_condition(live, "Ready")
        return _claim(a.running, Observed.TRUE, ready_since,
                      f"{ready}/{want} pods Running and Ready, {counted}"
                      + (", none recent" if restarts or n_replaced else ""), evidence, status_ev)
    if not problems:
        problems.append(f"{ready}/{of} pods Running and Ready")
        if scheduled.observed is Observed.FALSE:
            problems[-1] += " (not scheduled)"
    unique = list(dict.fromkeys(problems))
    reason = "; ".join(unique[:3]) + (f"; +{len(unique) - 3} more" if len(unique) > 3 else "")
    return _claim(a.running, Observed.FALSE, since or scheduled.since, reason, evidence, status_ev)


def _ray_runtime(ev: RunEvidence, evidence: list[Evidence], problems: list[str], clock: Clock,
                 s: ClaimSettings) -> list[str]:
    """What each Ray head says about its job and nodes (the Ray plane), when it said it recently."""
    out: list[str] = []
    ns = ev.root.ref.namespace
    expected: dict[str, int] = {}
    for rj in ev.rayjobs:
        jf = rj.facts
        if isinstance(jf, RayJobFacts) and jf.cluster_name and jf.expected_pods is not None:
            expected[jf.cluster_name] = jf.expected_pods
    for rcl in ev.rayclusters:
        cf = rcl.facts
        if isinstance(cf, RayClusterFacts) and cf.expected_pods is not None:
            expected[rcl.ref.name] = cf.expected_pods
    for name, rt in sorted(ev.ray.items()):
        if not clock.within(rt.read_at, s.evidence_max_age):
            continue
        ref = f"RayCluster/{ns}/{name}"
        if rt.error:
            evidence.append(Evidence(Plane.RAY, ref, "head", f"unreadable: {rt.error[:160]}", rt.read_at))
            continue
        if rt.job_status:
            evidence.append(Evidence(Plane.RAY, ref, "job.status", rt.job_status, rt.read_at))
            if rt.job_status != "RUNNING" and not any(p.startswith("Ray job") for p in problems):
                msg = f": {rt.job_message.splitlines()[0][:160]}" if rt.job_message else ""
                out.append(f"Ray head says the job is {rt.job_status}{msg}")
        want = expected.get(name)
        if rt.alive_nodes is not None:
            evidence.append(Evidence(Plane.RAY, ref, "alive_nodes",
                                     f"{rt.alive_nodes}/{want}" if want else rt.alive_nodes, rt.read_at))
            if want and rt.alive_nodes < want:
                out.append(f"Ray reports {rt.alive_nodes}/{want} nodes alive")
    return out
