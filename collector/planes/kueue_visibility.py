"""Kueue's visibility API, every `QUEUE_POLL_S`, for the queues runs blocked in queue admission wait
in (collector/sources/queuewatch.py): a changed answer re-evaluates the runs waiting there. Kueue
computes each answer on demand, so it is read on a thread of its own, never inside an evaluation."""

from __future__ import annotations

import time

from collector.planes.base import Change, PolledSource, SourceContext, SourceState

__all__ = ["QUEUE_POLL_S", "QueueSource"]

QUEUE_POLL_S = 30.0


class QueueSource(PolledSource):
    """The `kueue-visibility` source: thread `queue-poller`."""

    name = "kueue-visibility"
    thread = "queue-poller"

    def __init__(self, ctx: SourceContext, interval_s: float = QUEUE_POLL_S) -> None:
        self.ctx = ctx
        self.queues = ctx.queues
        self.interval_s = interval_s
        self.state = SourceState(self.name, ctx.health)

    @classmethod
    def build(cls, ctx: SourceContext) -> QueueSource | None:
        return cls(ctx) if QUEUE_POLL_S > 0 else None

    def run(self) -> None:
        """A pass that fails is counted under this source's name by the thread's supervisor
        (`Loop.spawn`), which starts it again after a back-off."""
        while not self.ctx.stop.wait(self.interval_s):
            started = time.monotonic()
            for key in self.queues.poll():
                self.ctx.loop.put(Change("queue", None, key))
            self.state.passed(time.monotonic() - started)
