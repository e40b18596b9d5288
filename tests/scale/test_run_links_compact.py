"""Run links held compactly (issue 30, fleet memory): a parent's children as a tuple while few (a set
past `SMALL_KIDS`), adoptions kept only where there are some, a run's pods sharing one parents tuple,
`RunPods`' evidence view without the fields it never reads, an idle watch's read asking for little.
Each gives the answers the structures before it gave: random writes (relinks, re-created owners,
adoptions, deletions, a Job of more pods than `SMALL_KIDS` shrinking and growing) against the links
as they were (a set per parent, an adoption entry per object) agree on every parent, child, root,
member, run and evidence."""

from __future__ import annotations

import gc
import random
import sys
import tracemalloc
from collections import defaultdict
from datetime import timedelta
from typing import Any
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector import runlinks
from collector.claims import memo
from collector.claims.lineage import RunPods, lineages, replaced_pods
from collector.correlate import RunEvidence, RunIndex
from collector.kube import normalize
from collector.model import EventFacts, NodeFacts, ObjectRecord, PodFacts
from collector.runlinks import ROOT_KINDS, SMALL_KIDS, Key, named_children, named_parents
from collector.sources.chunked import IDLE_READ_SIZE, READ_SIZE, chunked_lines
from collector.sources.decode import listed
from tests.controller.test_index_shape import NS, T0, _object
from tests.dumpkit import event, meta, pod
from tests.scale.test_object_path_memory import _gang, taurun

BIG = SMALL_KIDS + 12  # pods of one Job: past the tuple's bound, and back under it as they go


class _SetLinks(RunIndex):
    """The links as they were before (15e9453): a set of children per parent, an adoption entry (maybe
    empty) per object, a parents tuple per pod. Its writes are that tree's, word for word."""

    def __init__(self) -> None:
        super().__init__()
        self._down = defaultdict(set)

    def upsert(self, rec: ObjectRecord) -> None:
        key = rec.ref.key
        if not self.keeps(rec):
            if key in self._objects:
                self.delete(rec.ref)
            return
        old = self._objects.get(key)
        self._objects[key] = rec
        if old is not None and type(rec.facts) is PodFacts and rec.labels is old.labels and rec.owners == old.owners:
            return
        ups = tuple(named_parents(rec))
        adopted = tuple(named_children(rec))
        relink = old is None or self._up.get(key) != ups or self._adopted.get(key) != adopted
        leaf = old is None and not adopted and self._is_leaf_event(rec)
        if not leaf and (old is None or relink or key in self._inferred or rec.labels != old.labels
                         or rec.owners != old.owners or rec.ref.uid != old.ref.uid):
            self.shape += 1
        self._inferred.discard(key)
        if relink:
            self._unlink(key)
            self._up[key] = ups
            self._adopted[key] = adopted
            for p in ups:
                self._down[p].add(key)  # type: ignore[union-attr]
            for c in adopted:
                self._down[key].add(c)  # type: ignore[union-attr]
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

    def _unlink(self, key: Key) -> None:
        for p in self._up.get(key, ()):
            kids = self._down.get(p)
            if kids is not None:
                kids.discard(key)  # type: ignore[union-attr]
                if not kids:
                    del self._down[p]
        for c in self._adopted.get(key, ()):
            kids = self._down.get(key)
            if kids is not None:
                kids.discard(c)  # type: ignore[union-attr]
            adopters = self._adopters.get(c)
            if adopters is not None:
                adopters.discard(key)
                if not adopters:
                    del self._adopters[c]


def _big_pod(rng: random.Random) -> dict[str, Any]:
    """One of a big Job's pods (the Job re-created under another uid now and then)."""
    labels = {"taugrid.io/run": "r1"} if rng.random() < 0.2 else None
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "big", "uid": f"uid-big-{rng.randrange(2)}"} \
        if rng.random() < 0.9 else None
    return pod(f"b{rng.randrange(BIG)}", NS, T0, node="gpu-1", labels=labels, owner=owner)


def _big_job(rng: random.Random) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "q"} if rng.random() < 0.5 else None
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("big", NS, f"uid-big-{rng.randrange(2)}", T0,
                                                                      labels=labels),
            "spec": {"parallelism": BIG}, "status": {"active": rng.randrange(BIG)}}


def _write(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.35:
        return _big_pod(rng)
    if r < 0.4:
        return _big_job(rng)
    if r < 0.45:
        target = _big_pod(rng)
        return event(f"be{rng.randrange(6)}", NS, target, "BackOff", "back-off", T0, type_="Warning")
    return _object(rng)


def _kids(idx: RunIndex) -> dict[Key, set[Key]]:
    return {k: set(v) for k, v in idx._down.items() if v}  # (the sets before could stay behind empty)


def _evidence(idx: RunIndex, root: Any) -> dict[str, object]:
    ev = idx.evidence(root)
    keys = {f: [r.ref.key for r in getattr(ev, f)] for f in
            ("pods", "events", "workloads", "jobs", "rayjobs", "rayclusters", "resource_claims", "nodeclaims",
             "nodeclaim_events", "retired_pods")}
    return {**keys, "root": ev.root.ref.key, "taurun": ev.taurun and ev.taurun.ref.key,
            "local_queue": ev.local_queue and ev.local_queue.ref.key, "inferred": ev.inferred,
            "nodes": sorted(ev.nodes), "signals": [(s.ref.key, s.source) for s in ev.signals]}


def _same(new: RunIndex, old: RunIndex, why: object) -> None:
    assert new._objects.keys() == old._objects.keys(), why
    assert _kids(new) == _kids(old), why
    assert new._up == old._up, why
    assert {k: v for k, v in old._adopted.items() if v} == new._adopted, why  # only those with some
    assert dict(new._adopters) == dict(old._adopters), why
    assert new.shape == old.shape, why
    roots = new.roots()
    assert roots == old.roots(), why
    for root in roots:
        assert set(new._member_keys(root)) == set(old._member_keys(root)), (why, root)
        assert _evidence(new, root) == _evidence(old, root), (why, root)
    for key, rec in new._objects.items():
        assert new.root_of(rec.ref) == old.root_of(rec.ref), (why, key)
        assert new._parents_of(key) == old._parents_of(key), (why, key)
        assert new._is_leaf_event(rec) == old._is_leaf_event(rec), (why, key)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), writes=st.integers(20, 160), small=st.sampled_from([1, 2, 4, SMALL_KIDS]))
def test_compact_links_answer_as_the_sets_did(seed: int, writes: int, small: int) -> None:
    """`small`: the tuple's bound, low enough that parents switch between a tuple and a set both ways."""
    rng = random.Random(seed)
    new, old = RunIndex(), _SetLinks()
    with patch.object(runlinks, "SMALL_KIDS", small):
        _write_both(rng, new, old, writes, seed)


def _write_both(rng: random.Random, new: RunIndex, old: RunIndex, writes: int, seed: int) -> None:
    for i in range(writes):
        if rng.random() < 0.05:  # roots made up from pods (a dump's, a worker cluster's)
            assert new.infer_missing_roots() == old.infer_missing_roots()
        obj = _write(rng)
        rec = normalize(obj).record
        assert rec is not None
        if rng.random() < 0.15 and new.get(*rec.ref.key) is not None:
            a, b = new.delete(rec.ref), old.delete(rec.ref)
            assert (a and a.ref) == (b and b.ref)
        else:
            new.upsert(rec)
            old.upsert(rec)
        _same(new, old, (seed, i, obj["kind"], obj["metadata"]["name"]))


def test_a_parent_of_many_holds_a_set_and_a_tuple_again_once_few() -> None:
    idx = RunIndex()
    rng = random.Random(3)
    job = _big_job(rng)
    pods = [pod(f"b{i}", NS, T0, node="gpu-1", owner={"apiVersion": "batch/v1", "kind": "Job", "name": "big",
                                                      "uid": job["metadata"]["uid"]}) for i in range(BIG)]
    parent = ("Job", NS, "big")
    for i, p in enumerate(pods):
        rec = normalize(p).record
        assert rec is not None
        idx.upsert(rec)
        idx.upsert(rec)  # again: held once
        kids = idx._down[parent]
        assert len(kids) == i + 1 and isinstance(kids, tuple if i < SMALL_KIDS else set)
    for i, p in enumerate(pods[:-1]):
        rec = normalize(p).record
        assert rec is not None
        idx.delete(rec.ref)
        left = BIG - i - 1
        assert len(idx._down[parent]) == left
        assert isinstance(idx._down[parent], tuple) == (left <= SMALL_KIDS // 2)
    last = normalize(pods[-1]).record
    assert last is not None
    idx.delete(last.ref)
    assert parent not in idx._down and parent not in idx._adopted  # nothing left behind


def _upsert_all(idx: RunIndex, recs: list[ObjectRecord]) -> RunIndex:
    for r in recs:
        idx.upsert(r)
    return idx


def _fleet(runs: int, per_run: int) -> list[ObjectRecord]:
    out = []
    for i in range(runs):
        root = normalize(taurun(f"r{i}", "team-a")).record
        assert root is not None
        out.append(root)
        for p in _gang(f"r{i}", per_run):
            rec = normalize(listed(p, "Pod", "v1")).record
            assert rec is not None
            out.append(rec)
    return out


def _traced(fn: Any) -> tuple[int, Any]:
    """Bytes `fn()` leaves allocated (what it returns holds), and what it returns."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def test_the_links_of_a_pod_cost_less_than_before() -> None:
    """An index of 300 runs of 10 pods each (records made before): what the links take per pod. The
    links before (a set of children per parent, an adoption entry and a parents tuple per pod) took
    ~430 B a pod here (15e9453's tree: the same); now ~200 B (the objects dict, the parents dict, a pointer
    per parent; ~230 B with the first run's keys and parents tuples interned)."""
    recs = _fleet(300, 10)
    pods = sum(type(r.facts) is PodFacts for r in recs)
    size, idx = _traced(lambda: _upsert_all(RunIndex(), recs))
    assert len(idx) == len(recs)
    assert size / pods < 300, size / pods
    old_size, old = _traced(lambda: _upsert_all(_SetLinks(), recs))
    assert old_size / pods > 400, old_size / pods  # (the measure can tell them apart)
    assert [len(idx._member_keys(r)) for r in idx.roots()] == [len(old._member_keys(r)) for r in old.roots()]


def test_run_pods_kept_per_run_cost_less_than_before() -> None:
    """The `RunPods` a fleet's runs keep between evaluations (10 pods a run): its evidence view no
    longer carries the empty lists, dicts and sets of every field it never reads: ~1.75 KB a run kept
    here, ~2.7 KB before."""
    recs = _fleet(200, 10)
    idx = RunIndex()
    _upsert_all(idx, recs)
    evs = [idx.evidence(r) for r in idx.roots()]
    for ev in evs:
        memo.forget(ev.root.ref.key)

    def keep(view: Any) -> list[RunPods]:
        return [RunPods(view(ev)) for ev in evs]

    size, kept = _traced(lambda: keep(memo._lineage_view))
    full, _ = _traced(lambda: keep(lambda ev: RunEvidence(
        root=ev.root, pods=list(ev.pods), retired_pods=list(ev.retired_pods), events=list(ev.events),
        workloads=list(ev.workloads), jobs=list(ev.jobs), rayclusters=list(ev.rayclusters))))
    per_run, before = size / len(evs), full / len(evs)
    assert per_run < before - 800 and per_run < 2000, (per_run, before)
    for ev, rp in zip(evs, kept, strict=True):  # the same answers from the view as from the evidence
        whole = RunPods(ev)
        assert rp.every == whole.every and rp.by_role == whole.by_role and rp.first == whole.first
        assert replaced_pods(ev, rp) == replaced_pods(ev, whole) and lineages(ev, rp) == lineages(ev, whole)


def test_a_lineage_view_holds_copies_of_what_lineage_reads_only() -> None:
    recs = _fleet(1, 3)
    idx = RunIndex()
    _upsert_all(idx, recs)
    ev = idx.evidence(idx.roots()[0])
    view = memo._lineage_view(ev)
    assert view.root is ev.root and view.pods == ev.pods and view.pods is not ev.pods
    for f in ("retired_pods", "events", "workloads", "jobs", "rayclusters"):
        assert getattr(view, f) == getattr(ev, f) and getattr(view, f) is not getattr(ev, f)
    ev.pods.append(ev.pods[0])
    assert len(view.pods) == 3  # the caller's list changed, the view did not
    for f in ("signals", "nodes", "node_skew", "taurun", "gpu_short_nodes"):  # never filled: reading one fails
        try:
            getattr(view, f)
        except AttributeError:
            continue
        raise AssertionError(f"{f} is set on the view")


def test_an_idle_watch_asks_for_little_and_a_burst_for_much() -> None:
    """A read allocates what it asks for while it waits: after a read that brought little, the next
    asks for IDLE_READ_SIZE; after one that brought IDLE_READ_SIZE or more, for READ_SIZE. The
    lines are the same whatever is asked (tests/scale/test_chunked_watch.py cuts reads anywhere)."""
    small = b"%x\r\n%s\r\n" % (10, b"x" * 9 + b"\n")
    big = b"%x\r\n%s\r\n" % (40_000, b"y" * 39_999 + b"\n")
    pieces = [big, small, small, big + big, small, b"0\r\n\r\n"]
    asked: list[int] = []

    def read(n: int) -> bytes:
        asked.append(n)
        if not pieces:
            return b""
        piece = pieces.pop(0)
        assert len(piece) <= n or n == IDLE_READ_SIZE
        if len(piece) > n:
            pieces.insert(0, piece[n:])
            piece = piece[:n]
        return piece

    got = [line for batch in chunked_lines(read) for line in batch]
    assert got == [b"y" * 39_999, b"x" * 9, b"x" * 9, b"y" * 39_999, b"y" * 39_999, b"x" * 9]
    assert asked[0] == READ_SIZE  # a watch that opens: its backlog
    assert asked[1] == READ_SIZE  # after 40 KB
    assert asked[2] == IDLE_READ_SIZE and asked[3] == IDLE_READ_SIZE  # after 10 B: quiet
    # a burst met with a small read: the next one asks for all
    assert asked[4] == READ_SIZE and asked[5:] == [READ_SIZE, IDLE_READ_SIZE]


def test_a_read_is_not_held_while_its_lines_are_handled() -> None:
    """The generator keeps no reference to a read once its lines are out (an idle watch holds none)."""
    reads: list[bytes] = []

    def read(n: int) -> bytes:
        reads.append(bytes(bytearray(b"5\r\nabcd\n\r\n")))  # (a new object each read)
        return reads[-1]

    gen = chunked_lines(read)
    assert next(gen) == [b"abcd"] and next(gen) == [b"abcd"]
    control = [bytes(bytearray(b"x"))]  # held as the reads are: by a list, and the call's argument
    assert sys.getrefcount(reads[0]) == sys.getrefcount(reads[1]) == sys.getrefcount(control[0])


def test_lineages_read_the_evaluations_evidence_not_the_kept_view() -> None:
    """A kept view has no node_skew: lineages take it from the evaluation's evidence."""
    recs = _fleet(1, 2)
    idx = RunIndex()
    _upsert_all(idx, recs)
    root = idx.roots()[0]
    ev = idx.evidence(root)
    ev.node_skew = {"gpu-0000": timedelta(seconds=5)}
    memo.forget(root.key)
    rp = memo.run_pods(ev)
    assert lineages(ev, rp) == lineages(ev, RunPods(ev))
