"""When each run's claims must be re-evaluated with no new evidence: at their `recheck_at`.

Claims change by the clock alone when evidence ages past a bound (a source's freshness, a stall or
restart window). `collector.claims` reports the earliest such instant per run; the controller keeps
them here and re-evaluates only the runs that are due, on time, instead of waiting for a full pass.

- `Rechecks`: a heap of (due, run) with lazy deletion (a run re-evaluated early gets a new entry;
  the old one is skipped when it surfaces) and compaction, so its size stays within a small factor
  of the number of runs however often they are re-evaluated; and a second one of re-evaluations a
  change deferred (`defer`), which an evaluation of the run covers.
- `CpuBudget`: a token bucket that bounds the CPU those re-evaluations may take on average, so
  deadlines that keep coming (evidence stamped ahead of the clock, many runs ageing at once) are
  batched instead of spinning the loop.
- `DirtyRuns`: the runs that changes marked for re-evaluation, oldest mark first, each with when
  it was marked: the loop evaluates a burst's runs in slices, oldest first (collector/controller.py),
  each unmarked as its turn comes (a slice costs what it evaluates, not what is still marked).
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Hashable, Iterable
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta
from typing import Generic, NoReturn, Self, TypeVar

from collector.timeunits import EPOCH, US

K = TypeVar("K", bound=Hashable)

# Claims change strictly after a deadline (`now - t <= bound` holds at `t + bound`): recheck a
# little after it, so one re-evaluation sees the change rather than landing just before it.
SLACK = timedelta(milliseconds=200)

# The refreshes' phases fall on whole seconds: at 50k pods about 20 runs share each second's pass. With
# a phase of its own each run had the loop wake for a pass of its own (20 a second; in one 50k pair the
# loop's thread read a quarter more CPU than with one burst every 240 s, and a 10k profile put the
# difference after the passes, not in the evaluations: 2026-12-07).
REFRESH_GRAIN = timedelta(seconds=1)


def refresh_due(key: tuple[str, ...], evaluated_at: datetime, every: timedelta) -> datetime:
    """When a deferred run evaluated at `evaluated_at` is refreshed: its next slot on its own wheel of
    period `every` (the phase a stable hash of `key`), but not sooner than half a period after the
    evaluation: always within [evaluated_at + every / 2, evaluated_at + every]. A run evaluated on
    its slot is due exactly one period later; one evaluated off it (at start, on a change) is on it
    from its next refresh. A refresh due `every` after each evaluation kept a fleet evaluated
    together (its start) evaluated together for good: at 50k pods, 5,000 runs at once every 240 s, a
    burst of seconds that held every change back and made a window's evaluations count its phase
    (issue 30). On their wheels the same runs cost the same evaluations, spread over the period; the
    half-period floor bounds what an evaluation just before a slot adds."""
    period = every // US
    if period <= 0:
        return evaluated_at
    grain = min(REFRESH_GRAIN // US, period)  # (phases on whole seconds: the runs of a slot share a pass)
    phase = zlib.crc32("\x00".join(key).encode()) % (period // grain) * grain
    late = ((evaluated_at - EPOCH) // US - phase) % period  # how far past its last slot it was evaluated
    return evaluated_at + timedelta(microseconds=max(period - late, period // 2))


class _Schedule(Generic[K]):
    """A heap of (due, key) with lazy deletion: one due per key counts, superseded entries are skipped
    as they surface and the heap rebuilt when they pile up."""

    def __init__(self) -> None:
        self.heap: list[tuple[datetime, K]] = []
        self.due: dict[K, datetime] = {}  # the one entry per key that counts

    def put(self, key: K, due: datetime) -> None:
        if self.due.get(key) == due:
            return
        self.due[key] = due
        heapq.heappush(self.heap, (due, key))
        if len(self.heap) > 2 * len(self.due) + 1024:
            # Superseded entries pile up while runs are re-evaluated before they are due: rebuild.
            self.heap = [(d, k) for k, d in self.due.items()]
            heapq.heapify(self.heap)

    def next_due(self) -> datetime | None:
        heap = self.heap
        while heap and self.due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # superseded or forgotten
        return heap[0][0] if heap else None

    def pop_due(self, now: datetime) -> list[K]:
        out: list[K] = []
        heap = self.heap
        while heap and heap[0][0] <= now:
            due, key = heapq.heappop(heap)
            if self.due.get(key) == due:
                del self.due[key]
                out.append(key)
        return out


class Rechecks(Generic[K]):
    """Runs by the instant (the claims' clock) at which they are due for re-evaluation: by their
    claims' clock (`set`), and runs whose re-evaluation a change only deferred (`defer`)."""

    def __init__(self, slack: timedelta = SLACK) -> None:
        self.slack = slack
        self._clock: _Schedule[K] = _Schedule()
        # Deferred re-evaluations (collector/changes.py: a node agent's increment that only confirms a
        # progressing run's claims): each stands for an evaluation the change would have made at once,
        # so the loop makes them when due without the CPU budget of the clock's (`CpuBudget`).
        self._deferred: _Schedule[K] = _Schedule()
        self.deferrals = 0  # changes whose evaluation was deferred
        self.deferred_due = 0  # runs re-evaluated when a deferral came due
        self._came_due: dict[K, datetime] = {}  # each run's last deferral that came due, when
        self._firm: dict[K, datetime] = {}  # deferrals a later one may not move later (`defer(firm=True)`)

    def __len__(self) -> int:
        return len(self._clock.due)

    @property
    def _heap(self) -> list[tuple[datetime, K]]:  # (the clock's heap: tests hold its size bounded)
        return self._clock.heap

    def set(self, key: K, at: datetime | None, now: datetime) -> None:
        """Schedule `key` for `at` + slack, as reported by an evaluation at `now`; None (or an instant
        before `now`, which an evaluation never reports) leaves it unscheduled. The evaluation covers
        any re-evaluation deferred until then."""
        self._deferred.due.pop(key, None)
        self._firm.pop(key, None)
        if at is None or at < now:
            self._clock.due.pop(key, None)
            return
        try:
            due = at + self.slack
        except OverflowError:  # the end of time: never
            self._clock.due.pop(key, None)
            return
        self._clock.put(key, due)

    def due_of(self, key: K) -> datetime | None:
        """When `key` is due by its claims' clock (slack included), None: not scheduled."""
        return self._clock.due.get(key)

    def deferred_items(self) -> list[tuple[K, datetime]]:
        """Every deferred re-evaluation: (run, when it is due)."""
        return list(self._deferred.due.items())

    def deferred_of(self, key: K) -> datetime | None:
        """When `key`'s deferred re-evaluation is due, None: none is."""
        return self._deferred.due.get(key)

    def defer(self, key: K, at: datetime, *, firm: bool = False) -> None:
        """Re-evaluate `key` at `at` instead of when its clock says: the change computed `at` from every
        bound the run is due by but the stall windows of its progress log's newest step, which the
        change's newer step moved (collector/changes.py `_deferred`, `RunClaims.recheck_other`). So
        `at` replaces the run's clock entry and any earlier deferral, but a firm one: `firm`, a
        deferral that stands for a change not judged yet (`_coalesced`), is never moved later before
        the run is evaluated."""
        self.deferrals += 1
        self._clock.due.pop(key, None)
        held = self._firm.get(key)
        if held is not None and held < at:
            at = held
        elif firm:
            self._firm[key] = at
        self._deferred.put(key, at)

    def forget(self, key: K) -> None:
        self._clock.due.pop(key, None)
        self._deferred.due.pop(key, None)
        self._came_due.pop(key, None)
        self._firm.pop(key, None)

    def next_due(self) -> datetime | None:
        """The earliest instant any run is due by its clock, None when none is scheduled."""
        return self._clock.next_due()

    def pop_due(self, now: datetime) -> list[K]:
        """Every run due by its clock at or before `now`, unscheduled (its re-evaluation reschedules it)."""
        return self._clock.pop_due(now)

    def next_deferred(self) -> datetime | None:
        """The earliest instant a deferred re-evaluation is due, None when none is."""
        return self._deferred.next_due()

    def pop_deferred(self, now: datetime) -> list[K]:
        """Every run whose deferred re-evaluation is due at or before `now`, unscheduled (its clock entry
        went when it was deferred)."""
        out = self._deferred.pop_due(now)
        self.deferred_due += len(out)
        came, firm = self._came_due, self._firm
        for key in out:
            came[key] = now
            firm.pop(key, None)
        return out

    def came_due_since(self, since: datetime) -> list[K]:
        """The runs whose deferral came due after `since` (`pop_deferred`); older marks are dropped."""
        came = self._came_due
        old = [key for key, at in came.items() if at <= since]
        for key in old:
            del came[key]
        return list(came)


class CpuBudget:
    """At most `share` of one core on average, in bursts of up to `burst_s` CPU seconds."""

    def __init__(self, share: float, burst_s: float, now_m: float) -> None:
        self.share, self.burst_s = share, burst_s
        self._tokens = burst_s
        self._at = now_m

    def _refill(self, now_m: float) -> None:
        self._tokens = min(self.burst_s, self._tokens + max(0.0, now_m - self._at) * self.share)
        self._at = max(self._at, now_m)

    def wait_s(self, now_m: float) -> float:
        """Seconds until there is something left to spend (0: now)."""
        self._refill(now_m)
        return 0.0 if self._tokens > 0 else -self._tokens / self.share + 1e-3

    def spend(self, cpu_s: float, now_m: float) -> None:
        self._refill(now_m)
        self._tokens -= cpu_s


class DirtyRuns(set[K]):
    """Runs marked for re-evaluation: a set (what changes mark runs with: add, update, |=) that also
    keeps, in the order they were first marked, the `stamp` in effect when each was first marked
    since its last evaluation. The loop sets `stamp` to the arrival of the change it applies."""

    def __init__(self) -> None:
        super().__init__()
        self.since: dict[K, float] = {}
        self.stamp = 0.0

    def add(self, key: K, /) -> None:
        if key not in self.since:
            self.since[key] = self.stamp
            super().add(key)

    def update(self, *others: Iterable[K]) -> None:
        for keys in others:
            for key in keys:
                self.add(key)

    def __ior__(self, other: AbstractSet[K], /) -> Self:  # type: ignore[override,misc]
        self.update(other)
        return self

    def discard(self, key: object, /) -> None:
        if key in self.since:
            del self.since[key]
            super().discard(key)

    def remove(self, key: K, /) -> None:
        del self.since[key]
        super().remove(key)

    def pop(self) -> K:
        key = next(iter(self.since))  # the oldest
        self.remove(key)
        return key

    def clear(self) -> None:
        self.since.clear()
        super().clear()

    def _unsupported(self, *args: object) -> NoReturn:
        raise TypeError("DirtyRuns: only add, update, |=, discard, remove, pop and clear change it")

    difference_update = intersection_update = symmetric_difference_update = _unsupported
    __isub__ = __iand__ = __ixor__ = _unsupported

    def oldest(self) -> float:
        """The earliest stamp of a marked run (inf: none): every change that arrived before it is covered."""
        return min(self.since.values(), default=math.inf)

    def first(self, upto: float, n: int) -> list[K]:
        """Up to `n` runs marked at or before `upto`, oldest first, left marked: the loop unmarks each as
        its turn in a slice comes (collector/controller.py `_slice`). From the front, O(n) in a burst:
        runs first marked since `upto` are behind them."""
        out: list[K] = []
        for key, t in self.since.items():
            if t <= upto:
                out.append(key)
                if len(out) >= n:
                    break
        return out
