"""How much log evidence may wait for the controller's loop at once.

The change queue is bounded by count (`queue_max`), which bounds watch events well: each is one
object. A log change is not: a container's first read (an API read of its whole tail, or a node
agent's first document) carries up to 500 samples, so 20,000 queued log changes could hold ten
million of them while the loop catches up with a first pass. So producers of log evidence also
take its weight (samples and findings) from a shared budget and wait while it is spent; the loop
gives the weight back once it has applied the change (and compacted its history). At fleet size it
took 17 MiB off the peak (docs/benchmarks.md): what stays after a first pass is the evidence the
index keeps, not the queue.
"""

from __future__ import annotations

import threading


class Backlog:
    """A budget of weight shared by producer threads; the consumer gives back what it has applied."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a backlog limit must be at least 1, not {limit}")
        self.limit = limit
        self.held = 0
        self._cond = threading.Condition()

    def take(self, weight: int, stop: threading.Event) -> bool:
        """Wait until `weight` fits (or nothing is held: one item heavier than the limit still
        passes, alone); False when `stop` is set first."""
        with self._cond:
            while self.held > 0 and self.held + weight > self.limit:
                if stop.is_set():
                    return False
                self._cond.wait(0.5)
            if stop.is_set():
                return False
            self.held += weight
            return True

    def give(self, weight: int) -> None:
        with self._cond:
            self.held -= weight
            self._cond.notify_all()
