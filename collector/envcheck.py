"""Runs the supported-environment check (collector/envcontract.py) periodically and exports it.

Kept out of the controller's loop: versions change at upgrades, not per event, so one read of
`/version`, the CRDs and the Deployments every few minutes is enough. The manager is the
controller's own API; workers (MultiKueue) are passed explicitly, never discovered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry

from collector.envcontract import EnvironmentReport
from collector.sources.inventory import read_environment
from collector.sources.kube_api import KubeApi
from exporters.prometheus_envcontract import EnvironmentExporter

__all__ = ["DEFAULT_INTERVAL", "EnvironmentPoller"]

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

    def run(self, stop: threading.Event) -> None:
        """Check now, then every `interval`, until `stop` is set."""
        while not stop.is_set():
            try:
                self.check_once()
            except Exception:  # a bug here must not end the controller; the next pass retries
                log.exception("environment check failed")
            stop.wait(self.interval.total_seconds())
