"""What one evaluation of a run derives and the next would derive again from the same objects, kept
between them, keyed on those objects' identity (issue 30: the live controller re-evaluates a run on
every log increment, while its GPU evidence, most of its records and most of its scans did not
change).

Every input is an immutable record (frozen dataclasses, tuples); a kept value is served only when
the very objects it was computed from are asked about again, in the same order, and the kept entry
holds them (their ids cannot be reused while it is kept). A new object, equal or not, is a miss:
evidence that changed, or was read again, is never judged on a stale value (fail closed). Nothing
kept depends on the clock: what ages (freshness against `evidence_max_age`) is decided on each
evaluation, before the key is taken. Pure and bounded: one entry per run (the oldest dropped past
`MAX_RUNS`), one per live scan (dropped with the scan).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from operator import is_
from typing import Generic, TypeVar

from collector.claims.lineage import RunPods
from collector.claims.progress_walk import ByScan
from collector.correlate import Key, RunEvidence
from collector.model import ObjectRecord, PodFacts
from collector.progress.model import LogScan, PackedSamples

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_RUNS = 1 << 16  # entries per memo: a fleet's runs (the controller caps them well below)


class ByInputs(Generic[K, V]):
    """One value per slot (a run), with the objects it was computed from."""

    __slots__ = ("_kept", "_max", "hits", "misses")

    def __init__(self, max_slots: int = MAX_RUNS) -> None:
        self._kept: dict[K, tuple[tuple[object, ...], V, object]] = {}
        self._max = max_slots
        self.hits = 0
        self.misses = 0

    def get(self, slot: K, inputs: Sequence[object], equal: object = None) -> tuple[V] | None:
        """The value kept for exactly these objects (a 1-tuple), or None. `equal`: a value of plain
        data (immutable) the kept one must equal as well."""
        e = self._kept.get(slot)
        if e is None or len(e[0]) != len(inputs) or e[2] != equal \
                or not all(map(is_, e[0], inputs)):  # (lengths equal: map in C, ~5x a generator)
            self.misses += 1
            return None
        self.hits += 1
        return (e[1],)

    def put(self, slot: K, inputs: Sequence[object], value: V, equal: object = None) -> None:
        if slot not in self._kept and len(self._kept) >= self._max:
            del self._kept[next(iter(self._kept))]  # the oldest slot: a bound, not a policy
        self._kept[slot] = (tuple(inputs), value, equal)

    def forget(self, slot: K) -> None:
        self._kept.pop(slot, None)

    def forget_unless(self, current: Callable[[object], bool]) -> None:
        """Forget every slot kept for an object that is not `current` (one that can never be asked
        about again: what it was computed from goes with it, instead of at the slot's next miss)."""
        stale = [slot for slot, (inputs, _, _) in self._kept.items() if not all(map(current, inputs))]
        for slot in stale:
            del self._kept[slot]

    def __len__(self) -> int:
        return len(self._kept)


_NEWEST: ByScan[tuple[datetime | None]] = ByScan()


def newest_stamp(scan: LogScan) -> datetime | None:
    """The latest stamp among the scan's samples (None: none stamped), once per scan object."""
    if not scan.samples:
        return None  # (no memo on a quiet container's scan: most of a fleet's)
    kept = _NEWEST.get(scan)
    if kept is None:
        samples = scan.samples
        # (a plain pack: every sample stamped, its stamps read without building the samples or
        # unpacking its other columns)
        cols = samples.steps_stamps() if isinstance(samples, PackedSamples) else None
        if cols is not None:
            assert isinstance(samples, PackedSamples)
            kept = (samples.stamp(max(cols[1])),)
        else:
            kept = (max((x.at for x in samples if x.at is not None), default=None),)
        _NEWEST.put(scan, kept)
    return kept[0]


_SEP = object()  # between the lists of a key: a pod moved from `pods` to `retired_pods` is another key
_RUN_PODS: ByInputs[Key, RunPods] = ByInputs()


def _pod_fields(p: ObjectRecord) -> tuple[object, ...]:
    """What the replacement answers read of a pod (claims/lineage.py: `RunPods`, `_replacement`,
    `_late_ray_worker`, `_created_gone`): its status otherwise (conditions, containers, restart
    counts) may change without changing them."""
    f = p.facts
    if type(f) is not PodFacts:
        return (p.ref, p.created, p.owners, type(f))
    return (p.ref, p.created, p.owners, f.role, f.rank, f.phase, f.deleting, f.attempt, f.ray_node_type)


def _same_pod(a: ObjectRecord, b: ObjectRecord) -> bool:
    """`_pod_fields(a) == _pod_fields(b)`, field by field without building them (a burst of watch
    events changes most pods of a run between two of its evaluations). No field holds a float."""
    if a is b:
        return True
    fa, fb = a.facts, b.facts
    if type(fa) is not PodFacts or type(fb) is not PodFacts:
        return _pod_fields(a) == _pod_fields(b)
    return (a.ref == b.ref and a.created == b.created and a.owners == b.owners and fa.role == fb.role
            and fa.rank == fb.rank and fa.phase == fb.phase and fa.deleting == fb.deleting
            and fa.attempt == fb.attempt and fa.ray_node_type == fb.ray_node_type)


def _same_pods(before: Sequence[ObjectRecord], now: Sequence[ObjectRecord]) -> bool:
    """The same pods, place by place, as far as the replacement answers read them."""
    return len(before) == len(now) and all(map(_same_pod, before, now))


def _lineage_view(ev: RunEvidence) -> RunEvidence:
    """Only what the answers read (`RunPods`, claims/lineage.py), in copies: a kept `RunPods` holds no
    signals, scans or nodes past their time, and a caller that changes its evidence's lists in place
    changes no key. Its other fields are left unset rather than filled with empty lists, dicts and
    sets (~1 KB a run kept): reading one raises, never answers from nothing."""
    view: RunEvidence = object.__new__(RunEvidence)
    view.root = ev.root
    view.pods, view.retired_pods, view.events = _copy(ev.pods), _copy(ev.retired_pods), _copy(ev.events)
    view.workloads, view.jobs, view.rayclusters = _copy(ev.workloads), _copy(ev.jobs), _copy(ev.rayclusters)
    return view


# A kept view's empty lists (most runs have no retired pods, no Job, few Events): one shared list, not
# one a field a run. A `RunPods` reads its view and never changes it (`lineage._pods_of`).
_NO_RECORDS: list[ObjectRecord] = []


def _copy(records: list[ObjectRecord]) -> list[ObjectRecord]:
    return list(records) if records else _NO_RECORDS


def run_pods(ev: RunEvidence) -> RunPods:
    """The run's `RunPods`, with the replacement answers the last evaluation worked out, while what
    they read stands: the same Events, Workloads, Jobs and RayClusters (the objects themselves), its
    root's name and birth, and its pods, place by place, the same objects (then the same `RunPods`
    is served) or the same in every field those answers read (a watch event that bumps a restart
    count or moves a condition: the answers are carried to a new `RunPods`; a pod created,
    deleted, failed, renamed or re-owned is another key). A run re-evaluated on a log increment, a
    GPU pass or a tick has the very same pods."""
    same = (*ev.events, _SEP, *ev.workloads, _SEP, *ev.jobs, _SEP, *ev.rayclusters)
    root = (ev.root.ref, ev.root.created)
    key = ev.key
    kept = _RUN_PODS.get(key, same, root)
    if kept is not None:
        before = kept[0]
        if len(before.ev.pods) == len(ev.pods) and len(before.ev.retired_pods) == len(ev.retired_pods) and \
                all(map(is_, before.ev.pods, ev.pods)) and all(map(is_, before.ev.retired_pods, ev.retired_pods)):
            return before  # the very same records: RunPods is a function of them
    if kept is not None and _same_pods(kept[0].ev.retired_pods, ev.retired_pods) and \
            _same_pods(kept[0].ev.pods, ev.pods):
        rp = RunPods.moved(kept[0], _lineage_view(ev))
    else:
        rp = RunPods(_lineage_view(ev))
    _RUN_PODS.put(key, same, rp, root)
    return rp


def forget(run: Key) -> None:
    """A run gone: what was kept for it goes with it."""
    _RUN_PODS.forget(run)
