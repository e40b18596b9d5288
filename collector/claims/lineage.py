"""Which progress signals are one rank's across pod incarnations, and where each started over.

A rank restarts in place (the kubelet restarts its container), by replacement (a Job with
`restartPolicy: Never`, JobSet, a training operator or KubeRay creates a new pod), or inside one
process (torchrun elastic: the step drops within one log, `claims.progress`). After a restart the
trainer resumes from a checkpoint and replays steps it had already made: they are not progress
until they pass the rank's pre-restart high-water mark. So a signal is a role and rank of the run
(DESIGN.md §3), continued by the pod that replaces its predecessor, and each instant it started
over is a `Restart` whose mark must be known before a later step can count as progress.

Replacement is told from what the cluster shows, never assumed away:
- an earlier pod of the same role and rank (any state), or of the same role that failed or is
  being deleted;
- JobSet's restart attempt label; a Workload evicted (preempted) before the pod was created; a
  training job's Restarting condition or failed pods counted before it;
- its controller's Event for creating an earlier pod of the same name stem that is gone now (a
  recreated Ray worker; an indexed Job's pod brought back);
- a pod created well after the first pod of its run (`LATE`): a recreated Ray worker, a pod a
  controller brought back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from collector.claims.common import human_age
from collector.correlate import Key, RunEvidence
from collector.kube import JOB_KINDS
from collector.model import EventFacts, JobFacts, ObjectRecord, PodFacts, RayClusterFacts

# The pods of one incarnation of a run are created within seconds of each other (a gang, a Ray
# cluster's head and workers); one created this much later than the run's first replaced another
# (or joined later, which is no better evidence of where the run was).
LATE = timedelta(minutes=5)
ZERO = timedelta(0)
# A training operator's condition while it recreates failed replicas (kubeflow training-operator).
RESTARTING_CONDITIONS = frozenset({"Restarting"})
EVICTION_CONDITIONS = frozenset({"Evicted", "Preempted"})  # a Workload's, present only after an eviction


@dataclass(frozen=True, slots=True)
class Restart:
    """An instant a signal's process started over, and what shows it."""

    at: datetime
    why: str


@dataclass(frozen=True, slots=True)
class Lineage:
    """One container signal's place in its run."""

    stream: str  # signals of one role, rank and container across pod incarnations (or this pod's own)
    restarts: tuple[Restart, ...] = ()  # when this signal started over, oldest first


class RunPods:
    """A run's pods grouped by role (within the controller that owns them), and its first pod's birth;
    built once per evaluation (lineages and running's replaced pods both ask it). Kept per run between
    evaluations (`collector.claims.memo.run_pods`): what it holds is what its answers need, no more
    (no set of live pods, no index by id; the names of its pods only once an Event asks)."""

    def __init__(self, ev: RunEvidence) -> None:
        self.ev = ev
        self.pods = _pods_of(ev.pods)
        # deleted pods the live controller kept (their records and last logs): earlier incarnations
        self.retired = _pods_of(ev.retired_pods)
        every = [*self.retired, *self.pods] if self.retired else self.pods
        self.every = every  # (by position: `moved` carries answers across evaluations)
        self.first = min((p.created for p in every if p.created is not None), default=None)
        self.by_role: dict[str, list[ObjectRecord]] = {}
        for p in every:
            if (role := self.role_of(p)):
                self.by_role.setdefault(role, []).append(p)
        for pods in self.by_role.values():  # by birth: a pod's predecessors are a prefix
            pods.sort(key=_born)
        live = {id(p) for p in self.pods if isinstance(p.facts, PodFacts) and not p.facts.terminal
                and not p.facts.deleting}
        self.alive_in = {role: sum(id(q) in live for q in pods) for role, pods in self.by_role.items()}
        self._present: set[str] | None = None
        self._why: list[str | None] = [None] * len(every)  # each pod's answer, by its place in `every`

    @property
    def present(self) -> set[str]:
        """The names of the run's pods (live and retired), built when first asked (only a controller's
        create Event asks: `_created_gone`)."""
        if self._present is None:
            self._present = {p.ref.name for p in self.every}
        return self._present

    @staticmethod
    def role_of(pod: ObjectRecord) -> str:
        """The pod's role within what its controller runs (a RayCluster's group, a JobSet's child Job's)."""
        f = pod.facts
        if not isinstance(f, PodFacts) or not f.role:
            return ""
        o = pod.controller
        return f"{o.kind}/{o.name}:{f.role}" if o is not None else f.role

    @classmethod
    def moved(cls, before: RunPods, ev: RunEvidence) -> RunPods:
        """`RunPods(ev)` with `before`'s answers carried, built from `before` place by place instead of
        grouped anew: only for pods `memo.run_pods` found the same in every field `RunPods` reads (a
        watch event that bumps a restart count, ~3x cheaper; tests/claims/test_eval_memo.py compares
        every field with a fresh one)."""
        rp = cls.__new__(cls)
        rp.ev = ev
        rp.pods = _pods_of(ev.pods)
        rp.retired = _pods_of(ev.retired_pods)
        every = rp.every = [*rp.retired, *rp.pods] if rp.retired else rp.pods
        to_new = {id(old): new for old, new in zip(before.every, every, strict=True)}
        rp.first = before.first  # (the same births)
        rp.by_role = {role: [to_new[id(p)] for p in pods] for role, pods in before.by_role.items()}
        # alive reads phase and deleting, both among the fields found the same
        rp.alive_in = before.alive_in  # (read only)
        rp._present = before._present  # (read only: the same names)
        rp._why = list(before._why)  # (place by place: the same pods as far as the answers read them)
        return rp

    def replacement(self, pod: ObjectRecord) -> str:
        """What shows that `pod` (one of this run's records) replaces an earlier incarnation; "" when
        nothing does."""
        return self.replacement_at(next(i for i, p in enumerate(self.every) if p is pod))

    def replacement_at(self, i: int) -> str:
        """`replacement` of the pod at place `i` of `every`."""
        why = self._why[i]
        if why is None:
            pod = self.every[i]
            f = pod.facts
            assert isinstance(f, PodFacts)
            why = self._why[i] = _replacement(self.ev, pod, f, self.by_role.get(self.role_of(pod), ()),
                                              self.first, self)
        return why


def _pods_of(records: list[ObjectRecord]) -> list[ObjectRecord]:
    """The records that are pods: the list itself where all are (a `RunPods` reads, never changes it)."""
    if all(isinstance(p.facts, PodFacts) for p in records):
        return records
    return [p for p in records if isinstance(p.facts, PodFacts)]


def _born(p: ObjectRecord) -> tuple[bool, datetime]:
    return (p.created is None, p.created or datetime.min.replace(tzinfo=UTC))


def lineages(ev: RunEvidence, run: RunPods | None = None) -> dict[tuple[Key, str], Lineage]:
    """(pod key, container) → lineage, for every container of the run's pods that has a signal."""
    run = run or RunPods(ev)
    # a pod's place in `every`, by its key: a live pod after a retired one of its name replaces it here
    by_key = {p.ref.key: i for i, p in enumerate(run.every)}
    out: dict[tuple[Key, str], Lineage] = {}
    for sig in ev.signals:
        place = by_key.get(sig.ref.key)
        if place is None:
            continue
        pod = run.every[place]
        f = pod.facts
        assert isinstance(f, PodFacts)
        role = run.role_of(pod)
        # A rank is one member of its role across incarnations; a role without ranks is one lineage
        # only while one pod of it lives at a time (a one-pod Job's successive pods).
        rank = f.rank or ("solo" if role and run.alive_in.get(role, 0) <= 1 else "")
        stream = f"{role}#{rank}/{sig.source}" if role and rank else f"{pod.ref.name}/{sig.source}"
        restarts: list[Restart] = []
        replaced = run.replacement_at(place)
        if replaced and pod.created is not None:
            # Every line of a replacement's log comes after the replacement, whatever the clocks say:
            # pod.created is the API server's, the lines are its node's (a clock behind, unmeasured,
            # stamps them before the pod existed and would make its own replay the mark it passes).
            born = pod.created
            first = sig.scan.first_at
            if first is not None:
                born = min(born, first - ev.node_skew.get(f.node_name, ZERO) - BEFORE)
            restarts.append(Restart(born, replaced))
        c = next((c for c in f.containers if c.name == sig.source and not c.init), None)
        if c is not None and c.restart_count > 0:
            # When it last started over; not known: as early as it can be (the pod's start), so no
            # step of the pre-restart process is taken for a mark it does not hold.
            at = c.last_finished or f.start_time
            if at is not None:  # the kubelet's stamps, on its node's clock, as the pod's log lines are
                at -= ev.node_skew.get(f.node_name, ZERO)
            at = at or pod.created
            if at is not None:
                restarts.append(Restart(at, f"container {c.name} of pod {pod.ref.name} restarted "
                                            f"({c.restart_count} restart{'s' if c.restart_count != 1 else ''}"
                                            + (f", last exit {c.last_reason}" if c.last_reason else "") + ")"))
        out[(pod.ref.key, sig.source)] = Lineage(stream, tuple(sorted(restarts, key=lambda r: r.at)))
    return out


# A restart sorts after the samples of its own instant: placed this much before a pod's first line,
# it sorts before it.
BEFORE = timedelta(microseconds=1)


def replaced_pods(ev: RunEvidence, run: RunPods | None = None) -> list[tuple[ObjectRecord, str]]:
    """The run's pods that replace an earlier incarnation, with what shows it (running's restart count)."""
    run = run or RunPods(ev)
    skip = len(run.every) - len(run.pods)  # (the live pods come after the retired ones in `every`)
    return [(p, why) for i, p in enumerate(run.pods) if (why := run.replacement_at(skip + i))]


def _replacement(ev: RunEvidence, pod: ObjectRecord, f: PodFacts, role_pods: list[ObjectRecord] | tuple[()],
                 first: datetime | None, run: RunPods) -> str:
    """What shows that `pod` replaces an earlier incarnation of its rank; "" when nothing does.
    `role_pods`: by birth (`RunPods`). What this reads of a pod (and `_late_ray_worker`,
    `_created_gone`, `RunPods`) must be in `collector.claims.memo._pod_fields`, which decides when an
    answer is carried to the next evaluation."""
    born = pod.created
    if born is None:
        return ""
    for q in role_pods:
        qf = q.facts
        if q.created is None or q.created >= born:
            break  # the rest were born with it or after it
        if q is pod or not isinstance(qf, PodFacts):
            continue
        if q.ref.key == pod.ref.key:  # the same name, deleted and created again (a training operator's way)
            return f"pod {pod.ref.name} was created again after its predecessor of the same name was deleted"
        if f.rank and qf.rank == f.rank:
            return f"pod {pod.ref.name} replaces pod {q.ref.name} ({f.role} rank {f.rank})"
        if not f.rank and (qf.phase == "Failed" or qf.deleting):
            return f"pod {pod.ref.name} was created after pod {q.ref.name} of {f.role} " \
                   f"{'failed' if qf.phase == 'Failed' else 'was deleted'}"
    if f.attempt > 0:
        return f"pod {pod.ref.name} is JobSet restart attempt {f.attempt}"
    gone = _created_gone(ev, pod, run)
    if gone:
        return gone
    late_worker = _late_ray_worker(ev, pod, f)
    if late_worker:
        return late_worker
    for wl in ev.workloads:
        for c in wl.conditions:
            # Kueue sets these only once it evicts, and keeps them after re-admission (False, "Previously: ...")
            if c.type in EVICTION_CONDITIONS and c.last_transition is not None and c.last_transition <= born:
                return (f"Workload {wl.ref.name} was evicted ({c.reason or c.type}) before pod {pod.ref.name}"
                        " was created")
    for e in ev.events:
        # A training operator's Warning on its job when it recreates failed replicas ("PyTorchJob x is
        # restarting because 2 Worker replica(s) failed."): its Restarting condition goes once the job
        # runs again, the Event stays for its time to live.
        ef = e.facts
        if isinstance(ef, EventFacts) and ef.reason.endswith("Restarting") and ef.regarding.kind in JOB_KINDS:
            at = ef.first or ef.last
            if at is not None and at <= born:  # (one second's resolution: the pod may share its stamp)
                return (f"{ef.regarding.kind} {ef.regarding.name} restarted its replicas before pod {pod.ref.name} "
                        f"was created ({ef.reason}: {ef.message[:120]})")
    for j in ev.jobs:
        for c in j.conditions:
            if c.type in RESTARTING_CONDITIONS and c.last_transition is not None and c.last_transition <= born:
                return f"{j.ref.kind} {j.ref.name} restarted replicas ({c.reason or c.type}) before pod " \
                       f"{pod.ref.name} was created"
        jf = j.facts
        if isinstance(jf, JobFacts) and (jf.failed or 0) > 0 and first is not None and born - first > LATE:
            return f"{j.ref.kind} {j.ref.name} counts {jf.failed} failed pod(s) and pod {pod.ref.name} came later"
    if first is not None and born - first > LATE:
        return f"pod {pod.ref.name} was created {human_age(born - first)} after the run's first pod"
    o = pod.controller
    job = next((j for j in ev.jobs if o is not None and (j.ref.kind, j.ref.name) == (o.kind, o.name)), None)
    jf = job.facts if job is not None else None
    if job is not None and isinstance(jf, JobFacts) and jf.start_time is not None and born - jf.start_time > LATE:
        # a job controller creates its pods as it starts (its startTime is set again when it resumes
        # from suspension): one created well after came back for a pod that was lost
        return (f"pod {pod.ref.name} was created {human_age(born - jf.start_time)} after {job.ref.kind} "
                f"{job.ref.name} started")
    return ""


# KubeRay creates a cluster's head and its workers in one reconcile (workers wait for the head in an
# init container): a worker of a cluster that does not autoscale born this long after the cluster's
# first pod came back for one that was lost.
RAY_LATE = timedelta(seconds=90)


def _late_ray_worker(ev: RunEvidence, pod: ObjectRecord, f: PodFacts) -> str:
    o = pod.controller
    if o is None or o.kind != "RayCluster" or f.ray_node_type != "worker" or pod.created is None:
        return ""
    rc = next((r for r in ev.rayclusters if r.ref.name == o.name), None)
    if rc is None or not isinstance(rc.facts, RayClusterFacts) or rc.facts.autoscaling:
        return ""  # not in view, or its autoscaler adds workers when it likes
    first = min((p.created for p in (*ev.retired_pods, *ev.pods) if p.created is not None and p.controller is not None
                 and (p.controller.kind, p.controller.name) == (o.kind, o.name)), default=None)
    if first is None or pod.created - first <= RAY_LATE:
        return ""
    return (f"pod {pod.ref.name} is a worker RayCluster {o.name} created {human_age(pod.created - first)} after its"
            " first pod, and the cluster does not autoscale: it replaced a lost worker")


# What a controller's Event says when it creates a pod (KubeRay: "Created worker Pod ns/name";
# job-controller and training-operator: "Created pod: name").
CREATE_REASONS = frozenset({"CreatedWorkerPod", "SuccessfulCreate", "SuccessfulCreatePod"})


def _stem(name: str) -> str:
    """A pod's name without its random suffix: a Ray worker group's, an indexed Job's index."""
    return name.rsplit("-", 1)[0]


def _created_gone(ev: RunEvidence, pod: ObjectRecord, run: RunPods) -> str:
    """Its controller's Event for creating another pod of its stem, earlier, that is gone now: a
    recreated Ray worker, a Job's pod brought back after one was lost (the lost one's record and log
    are gone; the Event stays for its time to live)."""
    o, born = pod.controller, pod.created
    if o is None or born is None:
        return ""
    stem = _stem(pod.ref.name)
    # Events name the object they regard by name alone: one older than the controller itself is an
    # earlier incarnation's (a run deleted and submitted again under its name)
    owner = next((r for r in (ev.root, *ev.jobs, *ev.rayclusters) if (r.ref.kind, r.ref.name) == (o.kind, o.name)),
                 None)
    since = owner.created if owner is not None else None
    for e in ev.events:
        ef = e.facts
        if not isinstance(ef, EventFacts) or ef.reason not in CREATE_REASONS or \
                (ef.regarding.kind, ef.regarding.name) != (o.kind, o.name):
            continue
        at = ef.first or ef.last
        words = ef.message.split()
        named = words[-1].rsplit("/", 1)[-1] if words else ""
        if at is not None and at <= born and (since is None or at >= since) and named and \
                named != pod.ref.name and named not in run.present and _stem(named) == stem:
            return (f"{o.kind} {o.name} created pod {named} before pod {pod.ref.name} ({ef.reason}), and "
                    f"{named} is gone")
    return ""
