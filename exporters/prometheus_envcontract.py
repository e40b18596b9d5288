"""Prometheus export of the supported-environment check (collector/envcontract.py).

`taugrid_environment_supported` is 1 when the manager and every worker satisfy the admin guide's
contract, 0 otherwise, and absent before the first check. `taugrid_environment_violation` has one
series per failing (checked_cluster, check, reason); `checked_cluster` comes from configuration,
`check` and `reason` are enums, so every label stays bounded (details go to `explain`, not to labels).
Not `cluster`: multi-cluster Prometheus setups (Thanos, Mimir, kube-prometheus mixins) reserve that
label for the Prometheus that scraped the series, and a target's own `cluster` would shadow it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from collector.envcontract import EnvironmentReport

__all__ = ["EnvironmentExporter"]


class EnvironmentExporter(Collector):
    def __init__(self, registry: CollectorRegistry | None = None):
        self._lock = threading.Lock()
        self._report: EnvironmentReport | None = None
        self._at: float | None = None
        if registry is not None:
            registry.register(self)

    def update(self, report: EnvironmentReport, at: datetime) -> None:
        with self._lock:
            self._report = report
            self._at = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            report, at = self._report, self._at
        fam = self._families()
        if report is not None and at is not None:
            fam["supported"].add_metric([], 1.0 if report.supported else 0.0)
            fam["checked"].add_metric([], at)
            seen: set[tuple[str, str, str]] = set()
            for v in report.violations:
                key = (v.cluster, v.check.value, v.reason.value)
                if key not in seen:  # several CRDs skewed on one worker: one series
                    seen.add(key)
                    fam["violation"].add_metric(list(key), 1.0)
        return list(fam.values())

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            "supported": GaugeMetricFamily(
                "taugrid_environment_supported",
                "1 when the manager and every worker satisfy the supported-environment contract, else 0.",
                labels=[],
            ),
            "violation": GaugeMetricFamily(
                "taugrid_environment_violation",
                "1 per cluster, contract row (check) and reason that fails the supported-environment contract.",
                labels=["checked_cluster", "check", "reason"],
            ),
            "checked": GaugeMetricFamily(
                "taugrid_environment_checked_timestamp_seconds",
                "When the environment was last checked, unix seconds.",
                labels=[],
            ),
        }
