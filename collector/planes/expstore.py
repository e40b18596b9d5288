"""Each running run's checkpoint location listed every `checkpoint_poll_interval`: durable progress
from Expstore (collector/sources/checkpoints.py). A location a run's namespace may not reach is
refused once, said, and never fetched (docs/security.md)."""

from __future__ import annotations

import logging

from collector.correlate import Key, RunEvidence
from collector.model import Ref, RunClaims, TauRunFacts
from collector.planes.base import Change, PolledSource, SourceContext, SourceState, Targets
from collector.sources.checkpoints import CheckpointSourceError, CheckpointStore, read_checkpoints, store_for
from exporters.prometheus_health import ErrorClass

__all__ = ["CheckpointSource"]

log = logging.getLogger("taugrid.controller")
REFUSED_MAX = 10_000  # locations remembered as refused (then forgotten all at once, and said again)


class CheckpointSource(PolledSource):
    """The `expstore` source: thread `checkpoint-poller`."""

    name = "expstore"
    thread = "checkpoint-poller"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.targets: Targets[tuple[Ref, str]] = Targets()  # (run root, checkpoint URI)
        self.state = SourceState(self.name, ctx.health)

    @classmethod
    def build(cls, ctx: SourceContext) -> CheckpointSource | None:
        return cls(ctx) if ctx.settings.controller.checkpoint_poll_interval.total_seconds() > 0 else None

    def track(self, key: Key, ev: RunEvidence, rc: RunClaims) -> None:
        t = ev.taurun.facts if ev.taurun is not None else None
        self.targets.set(key, ((rc.ref, t.checkpoints),) if not rc.finished and isinstance(t, TauRunFacts)
                         and t.checkpoints else ())

    def forget(self, key: Key) -> None:
        self.targets.set(key, ())

    def publish(self) -> None:
        self.targets.publish()

    def run(self) -> None:
        ctx = self.ctx
        stores: dict[tuple[str, str], tuple[CheckpointStore, str]] = {}
        refused: set[tuple[str, str]] = set()
        interval = ctx.settings.controller.checkpoint_poll_interval.total_seconds()
        try:
            while not ctx.stop.wait(interval if self.targets.current else min(interval, 1.0)):
                for ref, uri in list(self.targets.current):
                    key = (ref.namespace, uri)  # what a location may reach depends on the run's namespace
                    if key in refused:
                        continue
                    try:
                        if key not in stores:
                            store, prefix = store_for(uri, ctx.settings.storage, namespace=ref.namespace)
                            store.open()
                            stores[key] = (store, prefix)
                        store, prefix = stores[key]
                        sig = read_checkpoints(store, prefix, ref, ctx.now())
                    except ValueError as e:  # refused or unusable (docs/security.md): say so once, never fetch
                        if len(refused) > REFUSED_MAX:
                            refused.clear()
                        refused.add(key)
                        self.state.error(ErrorClass.PERMANENT, str(e))
                        ctx.loop.skip(f"{ref}: {e}")
                        continue
                    except CheckpointSourceError as e:
                        self.state.error(ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT, str(e))
                        log.warning("checkpoint listing failed", extra={"run": str(ref), "error": str(e)})
                        continue
                    ctx.loop.put(Change("signal", None, sig))
        finally:
            for store, _ in stores.values():
                store.close()
