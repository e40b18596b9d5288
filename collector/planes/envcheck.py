"""Runs the supported-environment check (collector/envcontract.py) periodically and exports it.

Kept out of the controller's loop: versions change at upgrades, not per event, so one read of
`/version`, the CRDs and the Deployments every few minutes is enough. The manager is the
controller's own API; workers (MultiKueue) are passed explicitly, never discovered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry

from collector.envcontract import EnvironmentReport
from collector.planes.base import SourceContext, SourceHealth, SourceState
from collector.sources.inventory import read_environment
from collector.sources.kube_api import KubeApi
from exporters.prometheus_envcontract import EnvironmentExporter

__all__ = ["DEFAULT_INTERVAL", "EnvironmentPoller", "EnvironmentSource"]

log = logging.getLogger("taugrid.environment")
DEFAULT_INTERVAL = timedelta(minutes=5)


class EnvironmentPoller:
    def __init__(self, manager: KubeApi, registry: CollectorRegistry, now: Callable[[], datetime], *,
                 workers: Sequence[tuple[str, KubeApi]] = (), manager_name: str = "manager",
                 interval: timedelta = DEFAULT_INTERVAL, deployment_namespaces: Sequence[str] = ()) -> None:
        self.clusters: list[tuple[str, KubeApi]] = [(manager_name, manager), *workers]
        self.deployment_namespaces = tuple(deployment_namespaces)  # (): Deployments cluster-wide
        self.exporter = EnvironmentExporter(registry)
        self.now = now
        self.interval = interval
        self.report: EnvironmentReport | None = None
        self.errors: tuple[str, ...] = ()

    def check_once(self) -> EnvironmentReport:
        report, errors = read_environment(self.clusters, deployment_namespaces=self.deployment_namespaces)
        for e in errors:
            log.warning("environment read failed", extra={"error": e})
        self.report, self.errors = report, errors
        self.exporter.update(report, self.now())
        return report

    def run(self, stop: threading.Event, state: SourceState | None = None) -> None:
        """Check now, then every `interval`, until `stop` is set."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.check_once()
            except Exception as e:  # a bug here must not end the controller; the next pass retries
                log.exception("environment check failed")
                if state is not None:
                    state.note(f"{type(e).__name__}: {e}")
            else:
                if state is not None:
                    state.passed(time.monotonic() - started)
            stop.wait(self.interval.total_seconds())


class EnvironmentSource:
    """The `environment` source: thread `environment-check`, always on. The manager is the
    controller's own API; MultiKueue workers are the configured ones."""

    name = "environment"
    thread = "environment-check"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.state = SourceState(self.name, ctx.health)
        self.poller = EnvironmentPoller(ctx.api, ctx.registry, ctx.now, workers=[(w.name, w.api) for w in ctx.workers],
                                        deployment_namespaces=sorted(ctx.settings.controller.environment_namespaces))

    @classmethod
    def build(cls, ctx: SourceContext) -> EnvironmentSource:
        return cls(ctx)

    def open(self) -> None:
        self.ctx.loop.spawn(lambda: self.poller.run(self.ctx.stop, self.state), self.thread, self.state)

    def close(self) -> None:
        pass

    def health(self) -> SourceHealth:
        return self.state.health()
