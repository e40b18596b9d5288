"""Run links: which objects belong to which run, kept incrementally.

Every object records the parents it names (owner references, the `taugrid.io/run` label,
`ray.io/cluster`, an event's `involvedObject`/`regarding`, a TauRun's child references). The
root of an object is found by walking up through parents that exist; a run's members are the
root's descendants. Upserts are O(1) so the live controller can apply watch events at speed,
and a parent arriving after its children re-roots them without any bookkeeping.

`RunLinks` holds the objects, their links and what is read from them (roots, member walks, `shape`);
`collector.correlate.RunIndex` builds on it: its writes, and what it files into each run's evidence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from collector.interning import Interner
from collector.kube import (
    JOB_KINDS,
    JOB_NAME_LABELS,
    KUBEFLOW_OPERATOR_LABEL,
    KUEUE_QUEUE_LABEL,
    RAY_CLUSTER_LABEL,
    RUN_LABEL,
    TRAINING_JOB_KINDS,
)
from collector.model import EventFacts, ObjectRecord, PodFacts, RayJobFacts, Ref, TauRunFacts

Key = tuple[str, str, str]  # (kind, namespace, name)

MAX_DEPTH = 8
# runs whose member walk `_member_keys` remembers: a 50k-pod fleet's 4,000 all (~0.2 KB each), so a full
# pass over them walks none again while no write moved a link
MEMBERS_MEMO_MAX = 8192
ROOT_KINDS = frozenset({"TauRun", "RayJob", "RayCluster"} | JOB_KINDS)
CLUSTER_SCOPED_KINDS = frozenset({"Node", "NodeClaim", "ClusterQueue", "AdmissionCheck", "TauCluster"})
_OPERATOR_KINDS = {k.lower(): k for k in TRAINING_JOB_KINDS}


# One tuple per distinct key that records name as a parent or child: a run's pods all name its TauRun and
# RayCluster, and each named key is held in `RunLinks._up` for as long as the pod is (~64 B a pod a
# parent at fleet size). Bounded by clearing; a refill costs one tuple per distinct key.
_KEYS: Interner[Key] = Interner(1 << 16)
# A pod's parents (its RayCluster or Job, its TauRun): the same for every pod of its run, so one tuple a
# run in `RunLinks._up` rather than one a pod (~56 B a pod). Bounded as `_KEYS`.
_POD_PARENTS: Interner[tuple[Key, ...]] = Interner(1 << 16)

# A parent's children (`RunLinks._down`): a tuple while few (most parents: a run's TauRun and
# RayCluster hold its pods, an object its few Events), 8 B a child where a set takes ~50, plus ~200 B
# a set; a set past SMALL_KIDS, so a parent of thousands (a big Job's pods) adds and drops in O(1).
# Both hold each child once, as the set always did.
SMALL_KIDS = 32
Kids = tuple[Key, ...] | set[Key]


def shared_key(kind: str, namespace: str, name: str) -> Key:
    """(kind, namespace, name), the same tuple for every record that names it."""
    return _KEYS((kind, namespace, name))


def job_parents(rec: ObjectRecord) -> list[Key]:
    """Jobs a pod names in its labels (the job objects may be absent, as in a bare dump)."""
    out: list[Key] = []
    ns = rec.ref.namespace
    for label, kind in JOB_NAME_LABELS:
        name = rec.labels.get(label)
        if not name:
            continue
        if label.startswith("training.kubeflow.org"):
            op = rec.labels.get(KUBEFLOW_OPERATOR_LABEL, "").removesuffix("-controller")
            kind = _OPERATOR_KINDS.get(op, kind)
        key = shared_key(kind, ns, name)
        if key not in out:
            out.append(key)
    return out


def named_parents(rec: ObjectRecord) -> list[Key]:
    """Parents a record names: owners, run and Ray cluster labels, an Event's object, a pod's jobs."""
    ns = rec.ref.namespace
    out: list[Key] = [shared_key(o.kind, ns, o.name) for o in rec.owners]
    run = rec.labels.get(RUN_LABEL)
    if run and rec.ref.kind != "TauRun":
        out.append(shared_key("TauRun", ns, run))
    cluster = rec.labels.get(RAY_CLUSTER_LABEL)
    if cluster and rec.ref.kind != "RayCluster" and ("RayCluster", ns, cluster) not in out:
        out.append(shared_key("RayCluster", ns, cluster))
    if rec.ref.kind == "RayCluster" and rec.labels.get("ray.io/originated-from-crd") == "RayJob":
        origin = rec.labels.get("ray.io/originated-from-cr-name")
        if origin:
            out.append(shared_key("RayJob", ns, origin))
    if isinstance(rec.facts, EventFacts):
        g = rec.facts.regarding
        if g.kind and g.name:
            # Events about cluster-scoped objects live in some namespace ("default"); the object has none.
            out.append(shared_key(g.kind, "" if g.kind in CLUSTER_SCOPED_KINDS else g.namespace or ns, g.name))
    if isinstance(rec.facts, PodFacts):
        out.extend(k for k in job_parents(rec) if k not in out)
    return out


def pod_parents(parents: tuple[Key, ...]) -> tuple[Key, ...]:
    """A pod's `named_parents`, the same tuple for every pod that names the same ones (its run's)."""
    return _POD_PARENTS(parents)


def named_children(rec: ObjectRecord) -> list[Key]:
    """Children a record names itself (a TauRun's references to its RayJob and Workload)."""
    if isinstance(rec.facts, TauRunFacts):
        ns = rec.ref.namespace
        out: list[Key] = []
        if rec.facts.ray_job:
            out.append(shared_key("RayJob", ns, rec.facts.ray_job))
        if rec.facts.workload:
            out.append(shared_key("Workload", ns, rec.facts.workload))
        return out
    if isinstance(rec.facts, RayJobFacts) and rec.facts.cluster_name:
        return [shared_key("RayCluster", rec.ref.namespace, rec.facts.cluster_name)]
    return []


class RunLinks:
    """Objects by key and their parent/child links: each object's run, each run's members.

    `shape` counts the writes that may move a link or a root; what a reader remembers from the links
    (the roots, a run's members) holds while it is unchanged. The writes are `RunIndex`'s.
    """

    def __init__(self) -> None:
        self._inferred: set[Key] = set()  # roots made up from their pods (RunIndex.infer_missing_roots)
        self._objects: dict[Key, ObjectRecord] = {}
        # Each held object's key, one tuple an object (`key_of`): the maps keyed by it (the index's, the
        # loop's, the exporters') share it, not a copy each (`Ref.key` builds a new one on every read:
        # ~15 copies a run and 3 a pod at fleet size, issue 30).
        self._keys: dict[Key, Key] = {}
        # Tuples, not lists: one per indexed object (hundreds of thousands with Events); an empty one is shared.
        self._up: dict[Key, tuple[Key, ...]] = {}
        self._adopted: dict[Key, tuple[Key, ...]] = {}  # only those that adopt some (most adopt none)
        self._down: dict[Key, Kids] = {}  # (see SMALL_KIDS)
        self._adopters: defaultdict[Key, set[Key]] = defaultdict(set)
        self._root_candidates: set[Key] = set()
        # Counts writes that may move a link or a root: a new object or a deleted one, or one whose links,
        # labels, owners, uid or inferred standing changed (a status update keeps it: a node's heartbeat,
        # a RayJob's progress, an Event counted again); what a reader caches from the links (a pod's
        # root, a run's members, the roots) holds while it is unchanged.
        self.shape = 0
        self._members_memo: dict[Key, tuple[Key, ...]] = {}  # a run's member keys while `shape` holds
        self._members_shape = -1
        self._roots_memo: list[Ref] | None = None  # `roots` while `shape` holds
        self._roots_shape = -1

    def key_of(self, ref: Ref) -> Key:
        """`ref.key`, as the index holds it while it holds the object (an equal tuple otherwise): what a
        map that lives as long as the object keys it by."""
        key = ref.key
        return self._keys.get(key, key)

    # --- what the writes (RunIndex's) keep up --------------------------------------------------

    def _is_leaf_event(self, rec: ObjectRecord) -> bool:
        """An Event nothing links under (no record names it as owner or parent) and that stands in
        for nothing: its coming or going moves no link but its own, no root (`_is_root` reads no
        Event), no other record's run; only the member walks that reach it (`_forget_walks_to`), so
        it leaves `shape` as it is. (A fleet's Events come and go by the second; a moved `shape`
        makes every run's next evaluation walk its members again.)"""
        key = rec.ref.key
        return type(rec.facts) is EventFacts and not self._down.get(key) and key not in self._adopters \
            and key not in self._inferred and not self._adopted.get(key)

    def _forget_walks_to(self, key: Key) -> None:
        """The remembered member walks of every run that can reach `key` (through its parents, up to
        every root above them), forgotten."""
        memo = self._members_memo
        stack = [*self._up.get(key, ()), *self._adopters.get(key, ())]
        seen: set[Key] = set()
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            memo.pop(k, None)
            stack.extend(self._up.get(k, ()))
            stack.extend(self._adopters.get(k, ()))

    def _link(self, parent: Key, child: Key) -> None:
        """`child` among `parent`'s children (once, as a set holds it)."""
        kids = self._down.get(parent)
        if kids is None:
            self._down[parent] = (child,)
        elif isinstance(kids, tuple):
            if child not in kids:
                self._down[parent] = (*kids, child) if len(kids) < SMALL_KIDS else {*kids, child}
        else:
            kids.add(child)

    def _drop_link(self, parent: Key, child: Key) -> None:
        """`child` no longer among `parent`'s children; a parent left with none has no entry."""
        kids = self._down.get(parent)
        if kids is None:
            return
        if isinstance(kids, tuple):
            try:
                i = kids.index(child)
            except ValueError:
                return
            if len(kids) == 1:
                del self._down[parent]
            else:
                self._down[parent] = kids[:i] + kids[i + 1:]
            return
        kids.discard(child)
        if len(kids) <= SMALL_KIDS // 2:  # (half: a parent at the bound does not switch on each write)
            if kids:
                self._down[parent] = tuple(kids)
            else:
                del self._down[parent]

    def _unlink(self, key: Key) -> None:
        for p in self._up.get(key, ()):
            self._drop_link(p, key)
        for c in self._adopted.get(key, ()):
            self._drop_link(key, c)
            adopters = self._adopters.get(c)
            if adopters is not None:
                adopters.discard(key)
                if not adopters:
                    del self._adopters[c]

    # --- reads ---------------------------------------------------------------------------------

    def keys_of_kind(self, kind: str) -> set[Key]:
        """Every indexed object of one kind (a scan: for relists, not hot paths)."""
        return {k for k in self._objects if k[0] == kind}

    def get(self, kind: str, namespace: str, name: str) -> ObjectRecord | None:
        return self._objects.get((kind, namespace, name))

    def __len__(self) -> int:
        return len(self._objects)

    def objects(self) -> Iterator[ObjectRecord]:
        return iter(self._objects.values())

    def is_root(self, key: Key) -> bool:
        return self._is_root(key)

    def _is_root(self, key: Key) -> bool:
        rec = self._objects.get(key)
        if rec is None or rec.ref.kind not in ROOT_KINDS:
            return False
        if rec.ref.kind == "TauRun" or key in self._inferred:
            return True
        if rec.owners and self.orphaned(rec):
            return False  # left over from a run that is gone (its owner's name now has a new object)
        if self._owning_run(key, 0) is not None:
            return False
        if rec.ref.kind == "RayJob" or rec.ref.kind in TRAINING_JOB_KINDS:
            return True
        # A batch Job or bare RayCluster is a run only when Kueue manages it.
        return KUEUE_QUEUE_LABEL in rec.labels or any(k[0] == "Workload" for k in self._down.get(key, ()))

    def _owning_run(self, key: Key, depth: int) -> Key | None:
        """The nearest existing ancestor that can be a run root, if any."""
        if depth > MAX_DEPTH:
            return None
        for p in self._parents_of(key):
            if p[0] in ROOT_KINDS and (p[0] in ("TauRun", "RayJob") or p[0] in TRAINING_JOB_KINDS or
                                         self._is_root(p)):
                return p
            found = self._owning_run(p, depth + 1)
            if found is not None:
                return found
        return None

    def orphaned(self, rec: ObjectRecord) -> bool:
        """Whether an owner the record names is present under another uid: its owner was deleted and a
        new object took the name (a run submitted again). Such a record belongs to the run that is
        gone, not to the new one, whatever its labels say."""
        ns = rec.ref.namespace
        for o in rec.owners:
            if o.uid:
                cur = self._objects.get((o.kind, "" if o.kind in CLUSTER_SCOPED_KINDS else ns, o.name))
                if cur is not None and cur.ref.uid and cur.ref.uid != o.uid:
                    return True
        return False

    def _parents_of(self, key: Key) -> list[Key]:
        rec = self._objects.get(key)
        if rec is not None and rec.owners and self.orphaned(rec):
            return []
        # A parent that is absent but adopted by a present object (a RayCluster missing from a
        # dump, named by its RayJob's status) still links its children through to the adopter.
        out = [p for p in self._up.get(key, ()) if p in self._objects or p in self._adopters]
        out.extend(p for p in self._adopters.get(key, ()) if p in self._objects and p not in out)
        return out

    def root_of(self, ref: Ref) -> Ref | None:
        key = ref.key
        if self._is_root(key):
            return self._objects[key].ref
        found = self._owning_run(key, 0)
        while found is not None and not self._is_root(found):
            found = self._owning_run(found, 0)
        return self._objects[found].ref if found is not None else None

    def roots(self) -> list[Ref]:
        """Every run's root, by namespace, name and kind: remembered while `shape` holds (what
        `_is_root` reads moves it), so a full pass's marking and its first slice walk the roots once."""
        if self._roots_memo is None or self._roots_shape != self.shape:
            self._roots_memo = sorted(
                (self._objects[k].ref for k in self._root_candidates if self._is_root(k)),
                key=lambda r: (r.namespace, r.name, r.kind),
            )
            self._roots_shape = self.shape
        return list(self._roots_memo)  # (a copy: a caller may change its list)

    def members(self, root: Ref) -> Iterator[ObjectRecord]:
        """Root's descendants, stopping at nested runs' roots (a run never swallows another)."""
        return (rec for _, rec in self._walk(root))

    def _walk(self, root: Ref) -> Iterator[tuple[Key, ObjectRecord]]:
        """`members` with each one's key as the links hold it (the tuple `_objects` is keyed by: a
        remembered walk holds no copy of it)."""
        seen: set[Key] = {root.key}
        stack = [root.key]
        while stack:
            key = stack.pop()
            for child in self._down.get(key, ()):
                if child in seen:
                    continue
                seen.add(child)
                rec = self._objects.get(child)
                if rec is None:
                    stack.append(child)  # an absent link (see _parents_of): walk through it
                    continue
                if self._is_root(child) or rec.owners and self.orphaned(rec):
                    continue
                yield child, rec
                stack.append(child)

    def member_pods(self, root: Key) -> Iterator[tuple[str, str]]:
        """The Pods among `root`'s members as (namespace, name): the pods whose GPU records its
        evaluation reads (`RunIndex.evidence`)."""
        return ((k[1], k[2]) for k in self._member_keys(Ref(*root)) if k[0] == "Pod")

    def _member_keys(self, root: Ref) -> tuple[Key, ...]:
        """`members` as keys, remembered while no write moved a link or a root (`shape`): between
        two evaluations of a run under a burst of pod updates, the walk is the same."""
        if self._members_shape != self.shape:
            self._members_memo.clear()
            self._members_shape = self.shape
        keys = self._members_memo.get(root.key)
        if keys is None:
            keys = tuple(k for k, _ in self._walk(root))
            if len(self._members_memo) < MEMBERS_MEMO_MAX:  # (bounded: cleared when `shape` moves)
                self._members_memo[self.key_of(root)] = keys
        return keys
