"""MultiKueue worker clusters, configured explicitly (never discovered): each is watched into its
own run index (collector/workerwatch.py), and a change there re-evaluates the runs dispatched to it
(collector/multicluster.py joins them at evaluation time). Failures count per worker
(`worker:NAME`)."""

from __future__ import annotations

import threading

from collector.planes.base import Change, SourceContext, SourceHealth, SourceState
from collector.sources.kube_api import SourceError
from exporters.prometheus_health import ErrorClass

__all__ = ["WorkerSource"]


class WorkerSource:
    """The MultiKueue workers: their reflectors' threads are their own (`watch-*`)."""

    name = "multikueue"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.state = SourceState(self.name, ctx.health)
        self._lock = threading.Lock()
        self._queued: set[str] = set()  # workers with a change queued and not yet applied (coalesced)
        for w in self.workers:
            w.on_change, w.on_error = self._changed, self._error

    @classmethod
    def build(cls, ctx: SourceContext) -> WorkerSource | None:
        return cls(ctx) if ctx.workers else None

    def open(self) -> None:
        for w in self.workers:
            w.open()

    def close(self) -> None:
        for w in self.workers:
            w.close()

    def health(self) -> SourceHealth:
        return self.state.health()

    def _changed(self, name: str) -> None:
        """A worker's index changed (reflector thread): one queued change covers every change until
        the loop takes it."""
        with self._lock:
            if name in self._queued:
                return
            self._queued.add(name)
        self.ctx.loop.put(Change("worker", None, name, ack=lambda: self._taken(name)))

    def _taken(self, name: str) -> None:
        with self._lock:
            self._queued.discard(name)

    def _error(self, name: str, error: SourceError) -> None:
        self.state.error(ErrorClass.RETRYABLE if error.retryable else ErrorClass.PERMANENT, str(error),
                         source=f"worker:{name}")
