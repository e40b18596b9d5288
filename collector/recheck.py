"""When each run's claims must be re-evaluated with no new evidence: at their `recheck_at`.

Claims change by the clock alone when evidence ages past a bound (a source's freshness, a stall or
restart window). `collector.claims` reports the earliest such instant per run; the controller keeps
them here and re-evaluates only the runs that are due, on time, instead of waiting for a full pass.

- `Rechecks`: a heap of (due, run) with lazy deletion (a run re-evaluated early gets a new entry;
  the old one is skipped when it surfaces) and compaction, so its size stays within a small factor
  of the number of runs however often they are re-evaluated.
- `CpuBudget`: a token bucket that bounds the CPU those re-evaluations may take on average, so
  deadlines that keep coming (evidence stamped ahead of the clock, many runs ageing at once) are
  batched instead of spinning the loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from datetime import datetime, timedelta
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Claims change strictly after a deadline (`now - t <= bound` holds at `t + bound`): recheck a
# little after it, so one re-evaluation sees the change rather than landing just before it.
SLACK = timedelta(milliseconds=200)


class Rechecks(Generic[K]):
    """Runs by the instant (the claims' clock) at which they are due for re-evaluation."""

    def __init__(self, slack: timedelta = SLACK) -> None:
        self.slack = slack
        self._heap: list[tuple[datetime, K]] = []
        self._due: dict[K, datetime] = {}  # the one entry per run that counts

    def __len__(self) -> int:
        return len(self._due)

    def set(self, key: K, at: datetime | None, now: datetime) -> None:
        """Schedule `key` for `at` + slack, as reported by an evaluation at `now`; None (or an instant
        before `now`, which an evaluation never reports) leaves it unscheduled."""
        if at is None or at < now:
            self._due.pop(key, None)
            return
        try:
            due = at + self.slack
        except OverflowError:  # the end of time: never
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        if len(self._heap) > 2 * len(self._due) + 1024:
            # Superseded entries pile up while runs are re-evaluated before they are due: rebuild.
            self._heap = [(d, k) for k, d in self._due.items()]
            heapq.heapify(self._heap)

    def forget(self, key: K) -> None:
        self._due.pop(key, None)

    def next_due(self) -> datetime | None:
        """The earliest instant any run is due, None when none is scheduled."""
        heap = self._heap
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # superseded or forgotten
        return heap[0][0] if heap else None

    def pop_due(self, now: datetime) -> list[K]:
        """Every run due at or before `now`, unscheduled (its re-evaluation reschedules it)."""
        out: list[K] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, key = heapq.heappop(heap)
            if self._due.get(key) == due:
                del self._due[key]
                out.append(key)
        return out


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
