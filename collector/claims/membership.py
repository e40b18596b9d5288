"""Which pods do a run's work, how many it declares, and whether the TauCluster can be trusted.

Expected counts come from declarations only (TauRun workers or its resolved profile, RayCluster
worker groups, Workload podSets, Job parallelism), never from the pods that happen to exist; helper
pods (KubeRay's K8sJobMode submitter, init or helper Jobs) never count as workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.claims.common import Clock, human_age
from collector.correlate import RunEvidence, job_parents
from collector.kube import JOB_KINDS
from collector.model import (
    JobFacts,
    ObjectRecord,
    PodFacts,
    RayClusterFacts,
    RayJobFacts,
    ResolvedProfile,
    TauClusterFacts,
    TauRunFacts,
    WorkloadFacts,
)
from collector.settings import ClaimSettings


@dataclass(frozen=True, slots=True)
class Expected:
    count: int | None
    source: str  # the declaration that said so
    why_unknown: str = ""  # when count is None: why no declaration can be trusted


def taucluster_distrust(ev: RunEvidence, clock: Clock, s: ClaimSettings) -> str:
    """Why the TauCluster's resolved status cannot be trusted now; "" when it can."""
    tc = ev.taucluster
    if tc is None or not isinstance(tc.facts, TauClusterFacts):
        return "TauCluster not observed: the run's profile cannot be resolved"
    f = tc.facts
    if f.observed_generation is not None and tc.generation is not None and f.observed_generation < tc.generation:
        return f"TauCluster status is stale: observedGeneration {f.observed_generation} < generation {tc.generation}"
    ready = tc.condition("Ready")
    if ready is None or not ready.is_true:
        return f"TauCluster Ready is {ready.status if ready else 'absent'}" + (
            f": {ready.message}" if ready and ready.message else "")
    if f.last_resolved is None:
        return "TauCluster has no lastResolvedTime"
    # trusted only if still inside the bound at the latest instant the evidence can have been captured
    # (a dump's capture lies within the clock's slack); with no upper bound known, at the capture time
    fresh = (clock.within_latest(f.last_resolved, s.taucluster_max_age) if clock.latest is not None
             else clock.within(f.last_resolved, s.taucluster_max_age))
    if not fresh:
        age = (clock.latest or clock.now) - f.last_resolved
        return (f"TauCluster lastResolvedTime is {human_age(age)} old, older than the trust bound"
                f" ({human_age(s.taucluster_max_age)})")
    return ""


def resolved_profile(ev: RunEvidence) -> ResolvedProfile | None:
    t = ev.taurun.facts if ev.taurun is not None else None
    tc = ev.taucluster.facts if ev.taucluster is not None else None
    if not isinstance(t, TauRunFacts) or not isinstance(tc, TauClusterFacts):
        return None
    return next((p for p in tc.resolved if p.name == t.profile), None)


def is_ray(ev: RunEvidence) -> bool:
    return bool(ev.rayjobs or ev.rayclusters) or any(
        isinstance(p.facts, PodFacts) and p.facts.ray_node_type for p in ev.pods)


# Owners whose pods are the run's own work pods (not a helper controller's).
_RUN_OWNERS = frozenset({"RayCluster", "TauRun"})


def _run_owned(p: ObjectRecord) -> bool:
    """Every owner of the pod is the run's own (none: so too). A loop, not all() over a generator (~2x):
    asked of each pod on every evaluation."""
    for o in p.owners:  # noqa: SIM110
        if o.kind not in _RUN_OWNERS:
            return False
    return True


def _work_jobs(ev: RunEvidence) -> set[tuple[str, str]]:
    """(kind, name) of the jobs whose pods are the run's workers: the root job, Kueue-managed jobs."""
    out: set[tuple[str, str]] = set()
    if ev.root.ref.kind in JOB_KINDS:
        out.add((ev.root.ref.kind, ev.root.ref.name))
    for wl in ev.workloads:
        for o in wl.owners:
            if o.kind in JOB_KINDS:
                out.add((o.kind, o.name))
    return out


def work_pods(ev: RunEvidence) -> list[ObjectRecord]:
    """The run's pods that do its work (see the module docstring)."""
    pods = [p for p in ev.pods if isinstance(p.facts, PodFacts)]
    if is_ray(ev):
        # KubeRay's head and workers are the RayCluster's pods (labelled ray.io/node-type); the
        # K8sJobMode submitter is a batch Job's pod, and other controllers' pods are helpers too.
        return [p for p in pods if _run_owned(p)]
    jobs = _work_jobs(ev)
    if not jobs:
        return pods
    parent_of = {(j.ref.kind, j.ref.name): j.controller for j in ev.jobs}

    def works(p: ObjectRecord) -> bool:
        if _run_owned(p) and not job_parents(p):
            return True  # the run's own pods (ownerless, or owned by the run object itself)
        names = [(o.kind, o.name) for o in p.owners] + [(k[0], k[2]) for k in job_parents(p)]
        for kn in names:
            if kn in jobs:
                return True
            up = parent_of.get(kn)  # a JobSet's child Job, owned by the JobSet
            if up is not None and (up.kind, up.name) in jobs:
                return True
        return False

    return [p for p in pods if works(p)]


def expected_pods(ev: RunEvidence, clock: Clock | None = None, s: ClaimSettings | None = None) -> Expected:
    """How many work pods the run declares, and which declaration said so."""
    ray = is_ray(ev)
    t = ev.taurun.facts if ev.taurun is not None else None
    if isinstance(t, TauRunFacts):
        head = 1 if ray or t.ray_job else 0
        plus = " + Ray head" if head else ""
        if t.workers is not None:
            return Expected(t.workers + head, "TauRun workers" + plus)
        distrust = taucluster_distrust(ev, clock, s) if clock is not None and s is not None else ""
        if distrust:
            return Expected(None, "", f"expected workers unknown: {distrust} (fails closed)")
        prof = resolved_profile(ev)
        if prof is not None and prof.workers is not None:
            return Expected(prof.workers + head, f"resolved profile {prof.name} workers" + plus)
        if t.profile:
            return Expected(None, "", f"expected workers unknown: profile {t.profile!r} not resolved in TauCluster")
    for rec in (*ev.rayclusters, *ev.rayjobs):
        f = rec.facts
        if isinstance(f, RayJobFacts | RayClusterFacts) and f.expected_pods is not None:
            return Expected(f.expected_pods, f"{rec.ref.kind} head + workers")
    for rec in ev.workloads:
        wf = rec.facts
        if isinstance(wf, WorkloadFacts) and wf.pod_count is not None and not ray:
            return Expected(wf.pod_count, "Workload podSets")
    jobs = _work_jobs(ev)
    for rec in ev.jobs:
        jf = rec.facts
        if isinstance(jf, JobFacts) and jf.expected_pods is not None and (rec.ref.kind, rec.ref.name) in jobs:
            return Expected(jf.expected_pods, f"{rec.ref.kind} spec")
    if ev.inferred:
        return Expected(None, "", f"expected pod count unknown: {ev.root.ref} not observed (run inferred from its"
                                  " pods)")
    return Expected(None, "", "expected pod count unknown: nothing declares it")
