"""The collector's own health on Prometheus: client_python counters, gauges and a histogram the
controller and its sources call into as things happen (`HealthMetrics`), on the registry the claims
exporter (`exporters.prometheus`) renders. Every family is documented in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.registry import Collector

__all__ = ["EVALUATION_BUCKETS", "THREADS", "ErrorClass", "HealthMetrics", "epoch_seconds"]

# The controller's threads, each started again if it raises (taugrid_collector_thread_restarts_total):
# their series exist from the start, so that `increase()` sees the first restart.
THREADS: tuple[str, ...] = ("controller-loop", "log-poller", "checkpoint-poller", "ray-poller", "agent-poller",
                            "environment-check", "http")
# Claim evaluation is pure code over in-memory data: sub-millisecond per run, seconds only
# for a whole fleet. The buckets span both.
EVALUATION_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def epoch_seconds(t: datetime) -> float:
    # Naive datetimes are taken as UTC, like the rest of the collector, not as local time.
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


class ErrorClass(StrEnum):
    RETRYABLE = "retryable"
    PERMANENT = "permanent"


class _NoCreated(Collector):
    """Yields client_python metrics without their `_created` samples.

    Those would double the counter and histogram series, and this Prometheus (2.42) stores them as
    ordinary series rather than as created timestamps.
    """

    def __init__(self, metrics: Sequence[Counter | Gauge | Histogram]):
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        for m in self._metrics:
            yield from m.describe()

    def collect(self) -> Iterator[Metric]:
        for m in self._metrics:
            for family in m.collect():
                out = Metric(family.name, family.documentation, family.type, family.unit)
                out.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield out


class HealthMetrics:
    """The collector's own health; the controller calls these as things happen.

    `resource` is a watched resource ("pods", "workloads.kueue.x-k8s.io"), `source` a fixed source
    name ("kubernetes", "ray", "expstore", "node-agent"): both come from configuration, never from
    object data, so they stay bounded. Names passed up front start at 0, so rate() and absent()
    work before the first event.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        resources: Iterable[str] = (),
        sources: Iterable[str] = (),
        buckets: Sequence[float] = EVALUATION_BUCKETS,
        version: str | None = None,
    ):
        # registry=None: the metrics reach `registry` only through _NoCreated below.
        self._watch_restarts = Counter(
            "taugrid_collector_watch_restarts",
            "Watch streams re-opened (closed by the server, timed out or failed), by resource.",
            ["resource"],
            registry=None,
        )
        self._relists = Counter(
            "taugrid_collector_relists",
            "Full relists (initial list, or after 410 Gone), by resource.",
            ["resource"],
            registry=None,
        )
        self._events = Counter(
            "taugrid_collector_events_processed",
            "Watch events (and relist diffs) applied to the run index, by resource.",
            ["resource"],
            registry=None,
        )
        self._errors = Counter(
            "taugrid_collector_errors",
            "Errors by source and class (retryable: will be retried; permanent: input skipped).",
            ["source", "class"],
            registry=None,
        )
        self._last_sync = Gauge(
            "taugrid_collector_last_sync_timestamp_seconds",
            "When a list or watch of the resource last succeeded, unix seconds.",
            ["resource"],
            registry=None,
        )
        self._runs = Gauge(
            "taugrid_collector_runs_tracked",
            "Runs in the collector's run index, finished ones included.",
            registry=None,
        )
        self._untracked = Gauge(
            "taugrid_collector_runs_untracked",
            "Runs not tracked because a cap on tracked runs was reached (max_runs, max_runs_per_namespace), "
            "by namespace; absent for a namespace with none.",
            ["namespace"],
            registry=None,
        )
        self._untracked_ns: set[str] = set()
        self._failing = Gauge(
            "taugrid_collector_source_failing_since_timestamp_seconds",
            "When a source started failing with no answer since (a watched resource, or `lease`: the "
            "Lease cannot be renewed), unix seconds on the API server's clock; absent while it answers.",
            ["source"],
            registry=None,
        )
        self._failing_sources: set[str] = set()
        self._evaluation = Histogram(
            "taugrid_collector_evaluation_duration_seconds",
            "Time to evaluate claims in one pass (one run or a whole tick), seconds.",
            buckets=list(buckets),
            registry=None,
        )
        self._leader = Gauge(
            "taugrid_collector_leader",
            "1 on the replica that holds the Lease and exports claims, 0 on standbys; identity in a label.",
            ["identity"],
            registry=None,
        )
        self._poll_pass = Gauge(
            "taugrid_collector_poll_pass_seconds",
            "How long the last pass of a polled source took (logs, agents), seconds; past the source's "
            "poll interval, the source is read less often than configured.",
            ["source"],
            registry=None,
        )
        self._thread_restarts = Counter(
            "taugrid_collector_thread_restarts",
            "Collector threads (the loop, pollers, checks) that raised and were started again, by thread.",
            ["thread"],
            registry=None,
        )
        self._coalesced = Counter(
            "taugrid_collector_log_changes_coalesced",
            "Log changes whose run was re-evaluated up to 30 s later, the loop being behind the node agents' "
            "documents (the log backlog at least half spent); rising: the controller lacks CPU for its fleet.",
            registry=None,
        )
        self._build = Gauge(
            "taugrid_collector_build_info",
            "Always 1; the collector's version in a label.",
            ["version"],
            registry=None,
        )
        self._build.labels(version or _own_version()).set(1)
        for r in resources:
            self._watch_restarts.labels(r)
            self._relists.labels(r)
            self._events.labels(r)
        for s in sources:
            for c in ErrorClass:
                self._errors.labels(s, c.value)
        for t in THREADS:
            self._thread_restarts.labels(t)
        registry.register(
            _NoCreated(
                [
                    self._watch_restarts,
                    self._relists,
                    self._events,
                    self._errors,
                    self._last_sync,
                    self._runs,
                    self._untracked,
                    self._failing,
                    self._evaluation,
                    self._leader,
                    self._poll_pass,
                    self._thread_restarts,
                    self._coalesced,
                    self._build,
                ]
            )
        )

    def watch_restarted(self, resource: str) -> None:
        self._watch_restarts.labels(resource).inc()

    def relisted(self, resource: str) -> None:
        self._relists.labels(resource).inc()

    def events_processed(self, resource: str, count: int = 1) -> None:
        self._events.labels(resource).inc(count)

    def error(self, source: str, error_class: ErrorClass | str) -> None:
        """Count one error; `error_class` must be "retryable" or "permanent" (ValueError otherwise)."""
        self._errors.labels(source, ErrorClass(error_class).value).inc()

    def synced(self, resource: str, at: datetime) -> None:
        self._last_sync.labels(resource).set(epoch_seconds(at))

    def set_leader(self, identity: str, leader: bool) -> None:
        """This replica's leadership ("" identity: leader election off, always the exporter)."""
        self._leader.labels(identity).set(1 if leader else 0)

    def poll_pass(self, source: str, seconds: float) -> None:
        self._poll_pass.labels(source).set(seconds)

    def thread_restarted(self, thread: str) -> None:
        self._thread_restarts.labels(thread).inc()

    def log_change_coalesced(self) -> None:
        self._coalesced.inc()

    def set_runs_tracked(self, count: int) -> None:
        self._runs.set(count)

    def set_failing(self, since: dict[str, datetime]) -> None:
        """Sources failing now and since when (a source that answers again loses its series)."""
        for source in self._failing_sources - since.keys():
            self._failing.remove(source)
        for source, at in since.items():
            self._failing.labels(source).set(epoch_seconds(at))
        self._failing_sources = set(since)

    def set_runs_untracked(self, by_namespace: dict[str, int]) -> None:
        """Runs a cap kept out, by namespace (a namespace back to none loses its series)."""
        for ns in self._untracked_ns - by_namespace.keys():
            self._untracked.remove(ns)
        for ns, n in by_namespace.items():
            self._untracked.labels(ns).set(n)
        self._untracked_ns = set(by_namespace)

    def observe_evaluation(self, seconds: float) -> None:
        self._evaluation.observe(seconds)

    def time_evaluation(self) -> AbstractContextManager[object]:
        """`with health.time_evaluation(): ...` observes the block's duration."""
        return self._evaluation.time()


def _own_version() -> str:
    try:
        return metadata.version("taugrid-evidence")
    except metadata.PackageNotFoundError:
        return "unknown"
