"""Cross-cluster correlation for MultiKueue: a dispatched run is one run, judged on the worker's evidence.

Pure: functions of the manager's `RunEvidence`, each worker's runs (one `RunIndex` per cluster,
built by the caller), a clock and settings. The join key is the manager Workload's
`status.clusterName` (which worker), then the Workload of the same namespace and name on that
worker carrying the `kueue.x-k8s.io/multikueue-origin` label (MultiKueue's copy keeps the name;
its Job copy names it through the prebuilt-workload label). Records keep no annotations, so the
origin-uid annotation is not part of the key.

The joined run keeps the manager's root, Workloads and queues (what the user submitted and what
MultiKueue decided) and takes pods, events, nodes, Ray and log signals from the worker. Every piece
of evidence is then tagged with the cluster it came from. A run that is not dispatched by MultiKueue,
or with no workers configured, goes through `evaluate` unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from collector.claims import evaluate
from collector.correlate import RunEvidence
from collector.model import (
    AdmissionCheckFacts,
    Blocked,
    Claim,
    Evidence,
    Observed,
    Plane,
    RunClaims,
    Stage,
    WorkloadFacts,
)
from collector.settings import ClaimSettings

__all__ = ["ORIGIN_LABEL", "dispatch_target", "evaluate_multicluster", "find_copy", "join"]

ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
DEFAULT_ORIGIN = "multikueue"  # Kueue's multiKueue.origin default
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
_REF_END = re.compile(r"[A-Za-z0-9._-]")


def _multikueue_workload(ev: RunEvidence) -> tuple[str, str, str] | None:
    """(namespace, workload name, worker) of a run waiting on or dispatched by MultiKueue; worker ""
    while none holds it. None for any other run."""
    for wl in ev.workloads:
        f = wl.facts
        if not isinstance(f, WorkloadFacts):
            continue
        mk = any((ac := ev.admission_checks.get(a.name)) is not None and isinstance(ac.facts, AdmissionCheckFacts)
                 and ac.facts.controller_name == MULTIKUEUE_CONTROLLER for a in f.admission_checks)
        if f.cluster_name or mk:
            return wl.ref.namespace, wl.ref.name, f.cluster_name
    return None


def dispatch_target(ev: RunEvidence) -> str:
    """The worker a manager's run was dispatched to (`status.clusterName`), "" when none."""
    found = _multikueue_workload(ev)
    return found[2] if found else ""


def find_copy(worker_runs: Iterable[RunEvidence], namespace: str, workload: str,
              origin: str = DEFAULT_ORIGIN) -> RunEvidence | None:
    """The worker's run holding this manager's MultiKueue copy of `namespace/workload`: the origin
    label must name this manager's origin (a worker may serve several managers, whose Workloads can
    share a namespace and name)."""
    for ev in worker_runs:
        for wl in ev.workloads:
            if wl.ref.namespace == namespace and wl.ref.name == workload and wl.labels.get(ORIGIN_LABEL) == origin:
                return ev
    return None


def join(manager: RunEvidence, worker: RunEvidence) -> RunEvidence:
    """The manager's run with the worker's execution evidence."""
    synced = dict(manager.synced)
    for kind, at in worker.synced.items():
        # A kind read on both sides is as fresh as the older read (fail closed).
        synced[kind] = min(at, synced[kind]) if kind in synced else at
    return replace(
        manager,
        pods=list(worker.pods),
        events=[*manager.events, *worker.events],
        nodes=dict(worker.nodes),
        signals=list(worker.signals),
        ray=dict(worker.ray),
        rayclusters=[*manager.rayclusters, *worker.rayclusters],
        resource_claims=list(worker.resource_claims),
        nodeclaims=list(worker.nodeclaims),
        nodeclaim_events=list(worker.nodeclaim_events),
        gpu_short_nodes=list(worker.gpu_short_nodes),
        synced=synced,
    )


def _worker_refs(worker: RunEvidence) -> frozenset[str]:
    # Only what `join` takes from the worker: the Job and Workload copies share the manager's names.
    recs = [*worker.pods, *worker.events, *worker.nodes.values(), *worker.rayclusters, *worker.resource_claims,
            *worker.nodeclaims, *worker.nodeclaim_events]
    return frozenset(str(r.ref) for r in recs)


def _from(ref: str, refs: frozenset[str]) -> bool:
    if ref in refs:
        return True
    if ref.endswith("/*"):  # an aggregate over objects of one kind and namespace ("Pod/ns/*")
        return any(r.startswith(ref[:-1]) for r in refs)
    # Evidence refs may extend an object's ref ("Pod/ns/name container", "Pod/ns/name:trainer").
    return any(ref.startswith(r) and not _REF_END.match(ref[len(r)]) for r in refs)


def _tag(evidence: tuple[Evidence, ...], worker: str, manager: str, refs: frozenset[str]) -> tuple[Evidence, ...]:
    return tuple(replace(e, cluster=worker if _from(e.ref, refs) else manager) for e in evidence)


def _tag_claims(rc: RunClaims, worker: str, manager: str, refs: frozenset[str]) -> RunClaims:
    def claim(c: Claim) -> Claim:
        return replace(c, evidence=_tag(c.evidence, worker, manager, refs))

    blocked = rc.blocked
    if blocked is not None:
        blocked = replace(blocked, evidence=_tag(blocked.evidence, worker, manager, refs))
    return replace(rc, scheduled=claim(rc.scheduled), running=claim(rc.running),
                   progressing=claim(rc.progressing), blocked=blocked)


def _dispatch_blocked(ev: RunEvidence, worker: str, copy: RunEvidence | None, manager: str) -> Blocked | None:
    """The dispatch step: waiting for a worker, or dispatched but not admitted on it."""
    wl = next((w for w in ev.workloads if isinstance(w.facts, WorkloadFacts)), None)
    if wl is None or not isinstance(wl.facts, WorkloadFacts):
        return None
    checks = [a for a in wl.facts.admission_checks
              if (ac := ev.admission_checks.get(a.name)) is None or not isinstance(ac.facts, AdmissionCheckFacts)
              or ac.facts.controller_name == MULTIKUEUE_CONTROLLER]
    check_ev = tuple(Evidence(Plane.KUEUE, str(wl.ref), f"status.admissionChecks[{a.name}]", a.state,
                              a.last_transition, cluster=manager) for a in checks)
    if not worker:
        since = max((a.last_transition for a in checks if a.last_transition), default=wl.created)
        return Blocked(Stage.MULTICLUSTER_DISPATCH,
                       "waiting for a MultiKueue worker to reserve quota (no worker holds the run yet)", since,
                       check_ev)
    if copy is None:
        return None
    cwl = next((w for w in copy.workloads if w.ref.name == wl.ref.name), None)
    if cwl is None:
        return None
    adm = cwl.condition("Admitted")
    if adm is not None and adm.is_true:
        return None
    why = f"dispatched to worker cluster {worker} but not admitted there"
    if adm is not None and adm.message:
        why += f": {adm.message}"
    at = adm.last_transition if adm is not None else cwl.created
    return Blocked(Stage.MULTICLUSTER_DISPATCH, why, at,
                   (*check_ev, Evidence(Plane.KUEUE, str(cwl.ref), "status.conditions[Admitted]",
                                        adm.status if adm is not None else None, at, cluster=worker)))


def evaluate_multicluster(ev: RunEvidence, workers: Mapping[str, Sequence[RunEvidence]], now: datetime,
                          s: ClaimSettings, *, manager: str = "manager",
                          slack: timedelta | None = timedelta(0), origin: str = DEFAULT_ORIGIN) -> RunClaims:
    """Claims of one manager run, joined with its worker's evidence when MultiKueue dispatched it.

    `workers` maps each configured worker cluster to its runs. Single-cluster runs, and every run
    when no worker is configured, are evaluated exactly as `evaluate` does."""
    found = _multikueue_workload(ev) if workers else None
    if found is None:
        return evaluate(ev, now, s, slack=slack)
    namespace, workload, worker = found
    copy = find_copy(workers.get(worker, ()), namespace, workload, origin) if worker else None
    joined = join(ev, copy) if copy is not None else ev
    rc = evaluate(joined, now, s, slack=slack)
    refs = _worker_refs(copy) if copy is not None else frozenset()
    rc = _tag_claims(rc, worker, manager, refs)
    extra = dict(rc.extra)
    extra["clusters"] = {"manager": manager, "worker": worker or None, "worker_copy_seen": copy is not None,
                         "worker_configured": bool(worker) and worker in workers}
    rc = replace(rc, extra=extra)
    if not rc.finished and rc.scheduled.observed is not Observed.TRUE:
        blocked = _dispatch_blocked(ev, worker, copy, manager)
        if blocked is not None:
            rc = replace(rc, blocked=blocked)
    return rc
