"""Run index: the links of `collector.runlinks` and what is filed into each run's evidence.

`RunIndex` applies writes (upserts, deletes; the Events a live index keeps) to the links, and keeps what
is read per object besides them: progress signals (and a deleted pod's, for its run), Ray runtimes, node
clocks, nodes short of GPUs. `evidence()` gathers one run's members and all of that into a `RunEvidence`
for the pure claim engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

from collector.kube import (
    JOB_KINDS,
    KUEUE_QUEUE_LABEL,
    RAY_CLUSTER_LABEL,
    RUN_LABEL,
    TRAINING_JOB_KINDS,
)
from collector.model import (
    EventFacts,
    NodeFacts,
    ObjectRecord,
    Plane,
    PodFacts,
    RayJobFacts,
    Ref,
    WorkloadFacts,
)
from collector.runlinks import (
    ROOT_KINDS,
    Key,
    RunLinks,
    job_parents,
    named_children,
    named_parents,
    pod_parents,
)
from collector.settings import TauGridContract
from collector.timeunits import EPOCH

if TYPE_CHECKING:
    from collector.progress import LogScan

__all__ = [  # (Key and job_parents are collector.runlinks', named here too: where the collector reads them)
    "CLAIM_EVENT_KINDS", "CLAIM_EVENT_REASONS", "CREATE_EVENT_KINDS", "CREATE_EVENT_REASONS",
    "EVENTS_PER_OBJECT", "ClockMarks", "Key", "RayRuntime", "RunEvidence", "RunIndex", "Signal", "build_index",
    "claims_read", "clock_marks", "job_parents",
]


_by_name = attrgetter("ref.name")  # records in name order (in C: a run's pods are sorted on each evaluation)
# Events kept per regarded object: the newest, enough to explain a wait without unbounded growth.
EVENTS_PER_OBJECT = 32
# What the claims read of Events (collector/claims/blocked.py, evidence() below), so a live index keeps:
# every Event that is not Normal; Normal ones about a Workload (the queue-admission evidence) or a
# NodeClaim; the reasons the scheduling and device stages look for, whatever their type; and any whose
# message names a NodeClaim. The rest (kubelet's Scheduled, Pulling, Pulled, Created, Started, the
# operators' CreatedWorkerPod, ...) are ~95% of a fleet's Events and no claim reads them: a live
# index does not keep them (they are exported at upsert all the same). tests/scale checks these sets
# against the claims'.
CLAIM_EVENT_REASONS = frozenset({
    "FailedScheduling",  # the scheduler's word on unbound pods
    "TriggeredScaleUp", "NotTriggerScaleUp", "Nominated",  # node provisioners (Normal)
    "UnexpectedAdmissionError", "FailedPrepareDynamicResources", "FailedAllocateResource",  # devices
})
CLAIM_EVENT_KINDS = frozenset({"Workload", "NodeClaim"})
# A run's controllers creating its pods (KubeRay, job-controller, training-operator): an Event naming a
# pod that is gone shows its successor replaced it (claims.lineage). Not ReplicaSets' (most of a fleet's).
CREATE_EVENT_REASONS = frozenset({"CreatedWorkerPod", "SuccessfulCreate", "SuccessfulCreatePod"})
CREATE_EVENT_KINDS = frozenset({*JOB_KINDS, "RayCluster"})


def claims_read(f: EventFacts) -> bool:
    """Whether any claim can read this Event (see CLAIM_EVENT_REASONS)."""
    return (f.type != "Normal" or f.reason in CLAIM_EVENT_REASONS or f.regarding.kind in CLAIM_EVENT_KINDS
            or "nodeclaim/" in f.message
            or (f.reason in CREATE_EVENT_REASONS and f.regarding.kind in CREATE_EVENT_KINDS))


@dataclass(slots=True)
class Signal:
    """One progress source of a run as last read, and when (that source's freshness).

    Logs of a container, a Ray metrics counter, a checkpoint listing: each arrives as a scan of
    samples (and hang findings) so the progress analysis treats them alike.
    """

    ref: Ref  # the object it was read for: a pod (logs), a RayCluster (metrics), the run root (checkpoints)
    source: str  # container name, "ray-metrics", "checkpoints"
    scan: LogScan
    read_at: datetime
    plane: Plane = Plane.LOGS
    durable: bool = False  # checkpoints: progress that survives a restart
    # a deleted pod's last read, kept for its run: the high-water mark its replacement must pass
    retired: bool = False
    # what of this source is not in view and may hold newer progress (a dump holding a restarted
    # container's `kubectl logs --previous` but not its current log): no stall can rest on it
    unseen: str = ""

    def read_again(self, read_at: datetime, ref: Ref) -> Signal:
        """This signal read again at `read_at`, nothing new, for `ref` (an equal one): `replace`, built
        directly (a node agent's quiet containers, by the 100,000 each pass at fleet size; `replace`
        costs six times as much). Every field but those two copied (the tests hold the class's fields
        to this list)."""
        return Signal(ref, self.source, self.scan, read_at, self.plane, self.durable, self.retired, self.unseen)


@dataclass(frozen=True, slots=True)
class RayRuntime:
    """What a Ray cluster's own head says (dashboard Jobs and state APIs), and when it said it."""

    alive_nodes: int | None
    job_status: str  # Ray job status: PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED, "" when unknown
    job_message: str
    read_at: datetime
    error: str = ""  # why the head could not be read, if it could not
    # GPU activity from the head's metrics (Ray exports NVML readings per node and GPU index):
    # utilization stays high in a hung collective while power falls, so both are kept.
    gpus: int = 0
    gpu_utilization: float | None = None  # mean percent across the cluster's GPUs
    gpu_power_w: float | None = None  # mean watts per GPU


@dataclass(slots=True)
class RunEvidence:
    """Everything known about one run, handed to the pure claim engine."""

    root: ObjectRecord
    taurun: ObjectRecord | None = None
    rayjobs: list[ObjectRecord] = field(default_factory=list)
    rayclusters: list[ObjectRecord] = field(default_factory=list)
    workloads: list[ObjectRecord] = field(default_factory=list)
    jobs: list[ObjectRecord] = field(default_factory=list)
    pods: list[ObjectRecord] = field(default_factory=list)
    events: list[ObjectRecord] = field(default_factory=list)
    local_queue: ObjectRecord | None = None
    cluster_queue: ObjectRecord | None = None
    taucluster: ObjectRecord | None = None
    workspace: ObjectRecord | None = None
    nodes: dict[str, ObjectRecord] = field(default_factory=dict)
    signals: list[Signal] = field(default_factory=list)
    ray: dict[str, RayRuntime] = field(default_factory=dict)  # by RayCluster name
    synced: Mapping[str, datetime] = field(default_factory=dict)
    admission_checks: dict[str, ObjectRecord] = field(default_factory=dict)  # Kueue AdmissionChecks by name
    resource_claims: list[ObjectRecord] = field(default_factory=list)  # DRA claims the run's pods use
    nodeclaims: list[ObjectRecord] = field(default_factory=list)  # Karpenter NodeClaims nominated for its pods
    # Karpenter's events on those NodeClaims (an InsufficientCapacityError outlives the deleted NodeClaim).
    nodeclaim_events: list[ObjectRecord] = field(default_factory=list)
    # A run inferred from its pods (its root object was not observed, e.g. a bare cluster-info dump):
    # the planes whose objects are missing, so claims that need them say so.
    inferred: bool = False
    gpu_short_nodes: list[ObjectRecord] = field(default_factory=list)  # nodes advertising fewer GPUs than installed
    # How far ahead of the evaluation clock each of its pods' nodes' clocks run (their kubelets stamp
    # log lines, heartbeats and Leases): their stamps are read that much earlier.
    node_skew: dict[str, timedelta] = field(default_factory=dict)
    # Its pods' nodes whose clock has not been measured yet (no fresh heartbeat seen since the live
    # controller started): a log line they stamp past its read time shows theirs runs ahead.
    node_clock_unsure: set[str] = field(default_factory=set)
    # Its pods' nodes whose clock may run behind by an amount nothing measures, at most by how much
    # (None: nothing bounds it): a dump's (`Dump.node_behind`). A clock behind makes steps look older:
    # a stall holds only if it holds that much later.
    node_behind: dict[str, timedelta | None] = field(default_factory=dict)
    # Pods of the run deleted since (a JobSet restart, a recreated Ray worker): gone from `pods`, their
    # last record and logs kept as the marks their replacements must pass (`signals`, retired).
    retired_pods: list[ObjectRecord] = field(default_factory=list)
    # `root.ref.key`; the index's own tuple where it built this (`RunIndex.key_of`), so what is kept
    # per run between evaluations (collector/claims/memo.py) holds no copy of its own
    key: Key = field(init=False)

    def __post_init__(self) -> None:
        self.key = self.root.ref.key


_NODECLAIM_REF = re.compile(r"nodeclaim/([a-z0-9][a-z0-9.-]{0,252})")


# What a run's nodes' clocks say of their stamps: the nodes skewed ahead (by how much), those whose
# clock is not placed (unsure), those that may run behind (by how much at most); each sorted by node.
ClockMarks = tuple[tuple[tuple[str, timedelta], ...], tuple[str, ...], tuple[tuple[str, timedelta | None], ...]]


def clock_marks(skew: Mapping[str, timedelta], unsure: Iterable[str],
                behind: Mapping[str, timedelta | None]) -> ClockMarks | None:
    """A run's `ClockMarks` from its evidence's `node_skew`, `node_clock_unsure` and `node_behind`; None
    when every clock of its nodes runs with ours (most runs: nothing is kept for them)."""
    if not skew and not unsure and not behind:
        return None
    return tuple(sorted(skew.items())), tuple(sorted(unsure)), tuple(sorted(behind.items(), key=itemgetter(0)))


class RunIndex(RunLinks):
    """The links, and per object what the sources last read: signals, Ray runtimes, node clocks.

    A live index (the controller's) keeps only the Events a claim can read (`claims_read`); with
    `all_events` (dumps, through build_index) it keeps every Event, for bundles and explain.
    """

    def __init__(self, contract: TauGridContract | None = None, *, all_events: bool = False) -> None:
        super().__init__()
        self.tau_cluster_name = (contract or TauGridContract()).cluster_name
        self.all_events = all_events
        self._gpu_short: set[Key] = set()  # nodes whose device plugin advertises fewer GPUs than installed
        self._gpu_short_view: list[Key] | None = None  # the first few, sorted; rebuilt after a change
        # per object, its signals by source: a tuple up to SMALL_SIGNALS (a pod's containers: 80 bytes for
        # two instead of a dict's 200, by the 100,000 at fleet size), a dict past it (a pod of hundreds)
        self._signals: dict[Key, tuple[Signal, ...] | dict[str, Signal]] = {}
        self._workspaces: dict[str, Key] = {}  # namespace → its TauWorkspace
        self._ray: dict[Key, RayRuntime] = {}
        self.synced: dict[str, datetime] = {}
        self.node_skew: dict[str, timedelta] = {}  # node → how far its clock runs ahead (set by the sources)
        # nodes whose clock is not measured (live: not yet; a dump: ahead by more than a heartbeat shows)
        self.node_clock_unsure: set[str] = set()
        self.node_behind: dict[str, timedelta | None] = {}  # a dump's nodes that may run behind, by how much
        # run root → its deleted pods with signals: (last record, signals), oldest first (bounded)
        self._retired: dict[Key, dict[Key, tuple[ObjectRecord, tuple[Signal, ...]]]] = {}

    # --- writes --------------------------------------------------------------------------------

    def upsert(self, rec: ObjectRecord) -> None:
        key = rec.ref.key
        if not self.keeps(rec):
            if key in self._objects:
                self.delete(rec.ref)
            return
        old = self._objects.get(key)
        if type(rec.facts) is not EventFacts:  # (the held one, `key_of`; an Event is keyed by no other map)
            key = self._keys.setdefault(key, key)
        self._objects[key] = rec
        if old is not None and type(rec.facts) is PodFacts and rec.labels is old.labels and rec.owners == old.owners:
            return  # a pod's update that keeps its links (the watch's usual event): nothing else moves
        ups = tuple(named_parents(rec))
        if type(rec.facts) is PodFacts:
            ups = pod_parents(ups)
        adopted = tuple(named_children(rec))
        relink = old is None or self._up.get(key) != ups or self._adopted.get(key, ()) != adopted
        leaf = old is None and not adopted and self._is_leaf_event(rec)
        # what roots and member walks read besides the links: labels (Kueue's queue label), owners and
        # their uids (`orphaned`), the record's own uid, whether it stands in for an absent object
        if not leaf and (old is None or relink or key in self._inferred or rec.labels != old.labels
                         or rec.owners != old.owners or rec.ref.uid != old.ref.uid):
            self.shape += 1
        self._inferred.discard(key)  # the real object arrived: it replaces the inferred one
        if relink:
            self._unlink(key)
            self._up[key] = ups
            if adopted:
                self._adopted[key] = adopted
            else:
                self._adopted.pop(key, None)
            for p in ups:
                self._link(p, key)
            for c in adopted:
                self._link(key, c)
                self._adopters[c].add(key)
        if leaf:
            self._forget_walks_to(key)
        if rec.ref.kind in ROOT_KINDS:
            self._root_candidates.add(key)
        elif rec.ref.kind == "TauWorkspace":
            self._workspaces[rec.ref.namespace] = key
        if isinstance(rec.facts, EventFacts):
            self._trim_events(rec)
        elif isinstance(rec.facts, NodeFacts):
            short = rec.facts.gpu_allocatable < rec.facts.gpu_capacity
            if short != (key in self._gpu_short):
                (self._gpu_short.add if short else self._gpu_short.discard)(key)
                self._gpu_short_view = None

    def keeps(self, rec: ObjectRecord) -> bool:
        """Whether `upsert` keeps this record (only Events no claim reads are let go). Reads nothing
        that changes: safe from a reflector thread."""
        return self.all_events or not isinstance(rec.facts, EventFacts) or claims_read(rec.facts)

    def delete(self, ref: Ref) -> ObjectRecord | None:
        key = ref.key
        if key in self._signals and key[0] == "Pod":
            self._retire(ref)
        self._retired.pop(key, None)  # a run root gone: so are its retired pods
        rec = self._objects.get(key)
        if rec is not None and self._is_leaf_event(rec):
            self._forget_walks_to(key)
        else:
            self.shape += 1
        rec = self._objects.pop(key, None)
        self._unlink(key)
        self._up.pop(key, None)
        self._adopted.pop(key, None)
        self._root_candidates.discard(key)
        self._inferred.discard(key)
        if key in self._gpu_short:
            self._gpu_short.discard(key)
            self._gpu_short_view = None
        if self._workspaces.get(ref.namespace) == key:
            del self._workspaces[ref.namespace]
        self._signals.pop(key, None)
        self._ray.pop(key, None)
        self._keys.pop(key, None)
        return rec

    def _retire(self, ref: Ref) -> None:
        """Keep a deleted pod's signals for its run: a replacement for its rank (a new pod, after a JobSet
        restart or a Ray worker recreation) continues its signal and must pass its mark. Bounded per run
        and in all; dropped with the run."""
        rec = self._objects.get(ref.key)
        root = self.root_of(ref) if rec is not None else None
        sigs = tuple(s for s in self.signals_of(ref.key) if s.scan.samples)
        if rec is None or root is None or not sigs:
            return
        kept = self._retired.setdefault(root.key, {})
        kept.pop(ref.key, None)
        kept[ref.key] = (rec, tuple(replace(s, retired=True) for s in sigs))
        while len(kept) > RETIRED_PER_RUN:
            del kept[next(iter(kept))]
        if len(self._retired) > RETIRED_RUNS:
            del self._retired[next(iter(self._retired))]

    def signal_of(self, ref: Ref, source: str) -> Signal | None:
        return self.signal_at(ref.key, source)

    def signal_at(self, key: Key, source: str) -> Signal | None:
        """`signal_of` the object of `key`."""
        held = self._signals.get(key)
        if isinstance(held, tuple):
            for s in held:
                if s.source == source:
                    return s
            return None
        return held.get(source) if held is not None else None

    def signals_of(self, key: Key) -> Iterable[Signal]:
        """The object's signals, in the order their sources came."""
        held = self._signals.get(key, ())
        return held if isinstance(held, tuple) else held.values()

    def all_signals(self) -> Iterator[Signal]:
        for key in list(self._signals):
            yield from self.signals_of(key)

    def set_signal(self, sig: Signal) -> None:
        key, source = sig.ref.key, sig.source
        held = self._signals.get(key)
        if held is None:
            self._signals[self._keys.get(key, key)] = (sig,)
        elif isinstance(held, tuple):
            for i, s in enumerate(held):
                if s.source == source:
                    self._signals[key] = (*held[:i], sig, *held[i + 1:])  # (its place kept, as a dict's)
                    return
            self._signals[key] = (*held, sig) if len(held) < SMALL_SIGNALS else \
                {**{s.source: s for s in held}, source: sig}
        else:
            held[source] = sig

    def read_again(self, key: Key, source: str, read_at: datetime, same: Callable[[LogScan], bool]) -> Signal | None:
        """`key`'s signal of `source`, where `same(its scan)`, replaced by itself read again at `read_at`
        (`Signal.read_again`; a pod's with the index's own `Ref` of the pod, an equal one: one object a pod,
        not one a container); that signal as it was, returned. None, nothing replaced: none is held, or
        its scan is not the same. `signal_at`, then `set_signal`, in one look (a node agent's quiet
        containers, by the 100,000 each pass at fleet size: issue 30)."""
        held = self._signals.get(key)
        if held is None:
            return None
        i = 0
        if isinstance(held, tuple):
            for prev in held:
                if prev.source == source:
                    break
                i += 1
            else:
                return None
        else:
            got = held.get(source)
            if got is None:
                return None
            prev = got
        if not same(prev.scan):
            return None
        ref = prev.ref
        if ref.kind == "Pod":
            rec = self._objects.get(ref.key)
            if rec is not None and rec.ref == ref:
                ref = rec.ref
        again = prev.read_again(read_at, ref)
        if isinstance(held, tuple):
            self._signals[key] = (*held[:i], again, *held[i + 1:])  # (its place kept, as `set_signal`)
        else:
            held[source] = again
        return prev

    def drop_signal(self, ref: Ref, source: str) -> None:
        key = ref.key
        held = self._signals.get(key)
        if isinstance(held, tuple):
            kept = tuple(s for s in held if s.source != source)
            if len(kept) < len(held):
                self._signals[key] = kept
        elif held is not None:
            held.pop(source, None)

    def set_ray(self, cluster: Ref, runtime: RayRuntime) -> None:
        """The runtime of a RayCluster, by namespace and name (the object itself may be unseen)."""
        self._ray[cluster.key] = runtime

    def _trim_events(self, rec: ObjectRecord) -> None:
        parents = self._up.get(rec.ref.key) or ()
        if not parents:
            return
        siblings = [k for k in self._down.get(parents[-1], ()) if k[0] == "Event"]
        if len(siblings) <= EVENTS_PER_OBJECT:
            return

        def last(k: Key) -> datetime:
            f = self._objects[k].facts
            return f.last or EPOCH if isinstance(f, EventFacts) else EPOCH

        for k in sorted(siblings, key=last)[: len(siblings) - EVENTS_PER_OBJECT]:
            gone = self._objects[k].ref
            self.delete(gone)

    # --- reads ---------------------------------------------------------------------------------

    def _run_signals(self, root: Key, member_keys: Iterable[Key], *, ordered: bool = True) -> list[Signal]:
        """The run's progress signals, its retired pods' too (a pod recreated under its name continues
        its signal), by object and source (`ordered`; else in no set order)."""
        out: list[Signal] = list(self.signals_of(root))
        for key in member_keys:
            out.extend(self.signals_of(key))
        for _, sigs in self._retired.get(root, {}).values():
            out.extend(sigs)
        if ordered and len(out) > 1:
            out.sort(key=lambda g: (g.ref.key, g.source))
        return out

    def run_signals(self, root: Ref) -> tuple[list[Signal], ClockMarks | None]:
        """`evidence(root).signals` in no set order, and what its pods' nodes' clocks say of their stamps
        (`clock_marks` of `evidence`'s `node_skew`, `node_clock_unsure`, `node_behind`), without filing
        the run's objects: a node agent's increment asks it of its run, by the hundred a second at fleet
        size (`ChangeApplier._deferred`, whose reads of them, `planes.signals.alone`, do not depend on
        their order; sorting was a third of the deferral)."""
        member_keys = self._member_keys(root)
        node_skew, unsure, behind = self.node_skew, self.node_clock_unsure, self.node_behind
        marks: tuple[dict[str, timedelta], set[str], dict[str, timedelta | None]] | None = None
        if node_skew or unsure or behind:
            for k in member_keys:
                if k[0] == "Pod":
                    f = self._objects[k].facts
                    node = f.node_name if isinstance(f, PodFacts) else ""
                    if not node:
                        continue
                    skew = node_skew.get(node)
                    if skew or node in unsure or node in behind:
                        if marks is None:
                            marks = ({}, set(), {})
                        if skew:
                            marks[0][node] = skew
                        if node in unsure:
                            marks[1].add(node)
                        if node in behind:
                            marks[2][node] = behind[node]
        signals = self._run_signals(root.key, member_keys, ordered=False)
        return signals, clock_marks(*marks) if marks is not None else None

    def evidence(self, root: Ref) -> RunEvidence:
        rec = self._objects[root.key]
        ev = RunEvidence(root=rec, synced=self.synced)
        ev.key = self.key_of(root)
        self._file(ev, rec)
        member_keys = self._member_keys(root)
        objects, pods = self._objects, ev.pods
        for k in member_keys:
            member = objects[k]
            if member.ref.kind == "Pod":  # (most members: filed here, not through _file's chain of kinds)
                pods.append(member)
            else:
                self._file(ev, member)
        # Kueue workloads of a member found by owner name, for workloads whose owner link is by uid only.
        ev.taucluster = self._objects.get(("TauCluster", "", self.tau_cluster_name))
        ev.inferred = root.key in self._inferred
        if self._gpu_short_view is None:
            self._gpu_short_view = sorted(self._gpu_short)[:GPU_SHORT_VIEW]
        ev.gpu_short_nodes = [self._objects[k] for k in self._gpu_short_view]
        ns = root.namespace
        for wl in ev.workloads:
            f = wl.facts
            if isinstance(f, WorkloadFacts):
                if f.queue_name and ev.local_queue is None:
                    ev.local_queue = self._objects.get(("LocalQueue", ns, f.queue_name))
                cq = f.cluster_queue
                if not cq and ev.local_queue is not None:
                    lq = ev.local_queue.facts
                    cq = getattr(lq, "cluster_queue", "")
                if cq and ev.cluster_queue is None:
                    ev.cluster_queue = self._objects.get(("ClusterQueue", "", cq))
        if ev.local_queue is None:
            qname = rec.labels.get(KUEUE_QUEUE_LABEL)
            if qname:
                ev.local_queue = self._objects.get(("LocalQueue", ns, qname))
        ws_key = self._workspaces.get(ns)
        ev.workspace = self._objects.get(ws_key) if ws_key else None
        for wl in ev.workloads:
            wf = wl.facts
            if isinstance(wf, WorkloadFacts):
                for check in wf.admission_checks:
                    ac = self._objects.get(("AdmissionCheck", "", check.name))
                    if ac is not None:
                        ev.admission_checks[check.name] = ac
        claims: dict[Key, ObjectRecord] = {}
        nodeclaims: set[str] = set()
        nodes, node_skew, unsure, behind = ev.nodes, self.node_skew, self.node_clock_unsure, self.node_behind
        for pod in ev.pods:
            pf = pod.facts
            if not isinstance(pf, PodFacts):
                continue
            node_name = pf.node_name
            if node_name:
                node = objects.get(("Node", "", node_name))
                if node is not None:
                    nodes[node_name] = node
                skew = node_skew.get(node_name)
                if skew:
                    ev.node_skew[node_name] = skew
                if node_name in unsure:
                    ev.node_clock_unsure.add(node_name)
                if node_name in behind:
                    ev.node_behind[node_name] = behind[node_name]
            for name in pf.claims:
                claim = objects.get(("ResourceClaim", ns, name)) if name else None
                if claim is not None:
                    claims[claim.ref.key] = claim
        for mk in member_keys:
            if mk[0] == "ResourceClaim":
                claims[mk] = self._objects[mk]
        ev.resource_claims = sorted(claims.values(), key=lambda r: r.ref.name)
        for e in ev.events:
            f = e.facts
            if isinstance(f, EventFacts) and f.regarding.kind == "Pod":
                nodeclaims.update(_NODECLAIM_REF.findall(f.message[:500]))
        ev.nodeclaims = [nc for name in sorted(nodeclaims)
                         if (nc := self._objects.get(("NodeClaim", "", name))) is not None]
        ev.nodeclaim_events = sorted(
            (nce for name in nodeclaims for k in self._down.get(("NodeClaim", "", name), ())
             if k[0] == "Event" and (nce := self._objects.get(k)) is not None),
            key=lambda r: (r.facts.last or EPOCH if isinstance(r.facts, EventFacts) else EPOCH, r.ref.name))
        # Set iteration order is arbitrary; claims and their reasons must not be.
        for group in (ev.pods, ev.workloads, ev.jobs, ev.rayjobs, ev.rayclusters):
            if len(group) > 1:  # (most are empty or one: a sort's key calls cost more than the rest)
                group.sort(key=_by_name)
        if len(ev.events) > 1:
            ev.events.sort(key=lambda r: (r.facts.last or EPOCH if isinstance(r.facts, EventFacts) else EPOCH,
                                          r.ref.name))
        ev.signals = self._run_signals(root.key, member_keys)
        ev.retired_pods.extend(rec_ for rec_, _ in self._retired.get(root.key, {}).values())
        clusters = {rc.ref.name for rc in ev.rayclusters}
        clusters.update(f.cluster_name for rj in ev.rayjobs
                        if isinstance(f := rj.facts, RayJobFacts) and f.cluster_name)
        for name in clusters:
            runtime = self._ray.get(("RayCluster", ns, name))
            if runtime is not None:
                ev.ray[name] = runtime
        return ev

    @staticmethod
    def _file(ev: RunEvidence, rec: ObjectRecord) -> None:
        kind = rec.ref.kind
        if kind == "TauRun":
            ev.taurun = rec
        elif kind == "RayJob":
            ev.rayjobs.append(rec)
        elif kind == "RayCluster":
            ev.rayclusters.append(rec)
        elif kind == "Workload":
            ev.workloads.append(rec)
        elif kind in JOB_KINDS:
            ev.jobs.append(rec)
        elif kind == "Pod":
            ev.pods.append(rec)
        elif kind == "Event":
            ev.events.append(rec)

    def all_evidence(self) -> list[RunEvidence]:
        return [self.evidence(r) for r in self.roots()]

    def infer_missing_roots(self) -> list[Ref]:
        """Runs whose root object is not observed, made up from their pods' owners and labels.

        A bare `kubectl cluster-info dump` holds pods but no custom resources and no Jobs: a pod
        naming a TauRun, a training job, a RayCluster, or a Kueue-queued or GPU-requesting Job that
        is absent stands for that run. The made-up root declares nothing (its status says nothing,
        its expected pod count is unknown), so no claim rests on it.
        """
        found: dict[Key, list[ObjectRecord]] = {}
        for rec in list(self._objects.values()):
            f = rec.facts
            if not isinstance(f, PodFacts) or self.root_of(rec.ref) is not None or self.orphaned(rec):
                continue
            key = _inferred_root(rec, f, self._objects)
            if key is not None and key not in self._objects:
                found.setdefault(key, []).append(rec)
        out: list[Ref] = []
        for key, pods in sorted(found.items()):
            created = min((p.created for p in pods if p.created is not None), default=None)
            labels = {KUEUE_QUEUE_LABEL: q} if (q := next((p.labels.get(KUEUE_QUEUE_LABEL) for p in pods
                                                           if p.labels.get(KUEUE_QUEUE_LABEL)), None)) else {}
            rec = ObjectRecord(ref=Ref(*key), api_version="", resource_version="", generation=None,
                               created=created, labels=labels, owners=(), conditions=(), facts=None,
                               newest=None)
            self.upsert(rec)
            self._inferred.add(key)
            self.shape += 1
            out.append(rec.ref)
        return out


def _inferred_root(pod: ObjectRecord, f: PodFacts, objects: Mapping[Key, ObjectRecord]) -> Key | None:
    """The outermost absent run root a pod names, in order: TauRun, training job, RayCluster, Job."""
    ns = pod.ref.namespace
    run = pod.labels.get(RUN_LABEL)
    if run:
        return ("TauRun", ns, run)
    parents = [(o.kind, ns, o.name) for o in pod.owners] + job_parents(pod)
    cluster = pod.labels.get(RAY_CLUSTER_LABEL)
    if cluster:
        parents.append(("RayCluster", ns, cluster))
    absent = [k for k in parents if k not in objects]
    for kinds in (TRAINING_JOB_KINDS, frozenset({"RayJob", "RayCluster"})):
        for k in absent:
            if k[0] in kinds:
                return k
    # A plain Job is a training run only when Kueue queues it or it asks for GPUs.
    if f.gpus > 0 or KUEUE_QUEUE_LABEL in pod.labels:
        return next((k for k in absent if k[0] == "Job"), None)
    return None


def build_index(records: Iterable[ObjectRecord], contract: TauGridContract | None = None) -> RunIndex:
    """The index of a dump: every Event kept (a dump is bounded, and bundles and explain show them)."""
    idx = RunIndex(contract, all_events=True)
    for r in records:
        idx.upsert(r)
    return idx


SMALL_SIGNALS = 8  # an object's signals held as a tuple up to this many (`RunIndex.set_signal`)
RETIRED_PER_RUN = 64  # deleted pods whose last signals a run keeps (the marks of their ranks)
RETIRED_RUNS = 4096  # runs that keep some
GPU_SHORT_VIEW = 64  # short nodes handed to a run's evidence (those its pods could use are named)
