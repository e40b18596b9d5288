"""What an evidence source is to the controller: one small protocol that every plane implements.

A source is built from the settings (collector/planes/registry.py), opened once and closed once,
like the readers under collector/sources and the exporters. While open it reads its plane on
threads of its own and delivers what it reads into the controller's loop as `Change`s, through the
`Loop` it was built with; it never touches the run index, which only the loop's thread changes.
It counts its failures under its own name (taugrid_collector_errors_total{source}) and keeps its
last error and the length of its last pass (`SourceHealth`).

A source that reads something per run (container logs, checkpoint locations, Ray heads) is also
`PerRun`: each evaluation says what it should read for the run it evaluated, and the new lists are
swapped in whole after the evaluation (`Targets`), so the source's thread reads them without a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from collector.correlate import Key, RunEvidence
from collector.model import ObjectRecord, Ref, RunClaims, TauRunFacts
from collector.progress.model import LogScan
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, Resource
from exporters.prometheus_health import ErrorClass, HealthMetrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from collector.capture import EvidenceCapture
    from collector.sources.queuewatch import QueueWatch
    from collector.workerwatch import WorkerCluster

__all__ = ["Change", "EvidenceSource", "Loop", "PerRun", "SourceContext", "SourceHealth", "SourceState",
           "Targets", "profile_of"]

T = TypeVar("T")
Now = Callable[[], datetime]


@dataclass(slots=True)
class Change:
    """One thing a source saw, for the loop to apply to the index."""

    op: str  # "upsert" | "delete" | "replace" | "listed" | "synced" | "log" | "error" | "restart" | "worker" | ...
    resource: Resource | None
    payload: Any
    received: float = 0.0  # time.monotonic() when queued (`Loop.put`); 0 inside a batch
    weight: int = 0  # log evidence: what it took from the backlog (`Loop.put_log`), given back once applied
    # Called by the loop as it takes the change, before applying it: a source that coalesces its
    # changes (one queued change covers all until it is applied) may queue the next from then on.
    ack: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """A source's own account of itself: errors counted, the last one, and its passes."""

    name: str
    errors: int = 0
    last_error: str = ""
    last_error_at: float | None = None  # time.monotonic()
    passes: int = 0
    last_pass_s: float | None = None


class Loop(Protocol):
    """What a source sees of the controller: its loop's queue, its supervision, and the few facts
    of the index a source reads to decide what not to read."""

    agents_first: threading.Event  # set once the loop holds the node agents' first pass
    agent_log_pods: frozenset[tuple[str, str]]  # pods whose logs a node agent reads

    def put(self, change: Change) -> None:
        """Queue a change, waiting while the queue is full, but never past shutdown."""

    def put_log(self, change: Change, scan: LogScan) -> None:
        """Queue a change carrying log evidence, waiting while the backlog's budget is spent."""

    def put_logs(self, changes: Iterable[tuple[Change, int]]) -> None:
        """Changes carrying log evidence, each with its weight (`log_weight`), queued in batches (a node
        agent's document: one queue entry for many), waiting while the backlog's budget is spent."""

    def spawn(self, target: Callable[[], None], name: str, state: SourceState | None) -> None:
        """`target` on a supervised thread of its own, started again after a back-off if it fails;
        each failure is counted as the source's (`state`: its name, its last error)."""

    def skip(self, what: str) -> None:
        """Something that could not be read, logged and kept for the record (bounded)."""

    def holds_signal(self, ref: Ref, container: str) -> bool: ...

    def keeps(self, rec: ObjectRecord) -> bool:
        """Whether the index keeps `rec` (most Events it does not)."""


# What a signal and its scan weigh in the loop's log backlog beside what they carry: all a quiet
# container's change weighs (`log_weight`; `planes.node_agents.log_changes`' rows weigh it each).
SCAN_WEIGHT = 2


def log_weight(scan: LogScan) -> int:
    """What a change carrying `scan` takes from the loop's log backlog: its samples and findings, and
    the signal and scan themselves."""
    return len(scan.samples) + len(scan.hangs) + len(scan.xids) + SCAN_WEIGHT


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What every source is built with."""

    api: KubeApi
    settings: Settings
    now: Now
    loop: Loop
    health: HealthMetrics
    stop: threading.Event
    registry: CollectorRegistry
    queues: QueueWatch  # the queues runs wait in (set by evaluations, read by the visibility source)
    capture: EvidenceCapture | None = None
    exporting: bool = False  # records go to a sink (ADX, embedded): the watch hands on every Event
    workers: tuple[WorkerCluster, ...] = ()


@runtime_checkable
class EvidenceSource(Protocol):
    """One evidence plane, as the controller composes it."""

    name: str  # the `source` label its failures are counted under

    def open(self) -> None:
        """Start reading (threads spawned through the loop, so that they are supervised)."""

    def close(self) -> None:
        """Stop reading and let go of what was opened; the loop's stop event is set by then."""

    def health(self) -> SourceHealth: ...


@runtime_checkable
class PerRun(Protocol):
    """A source that reads something per run, told what by each evaluation."""

    def track(self, key: Key, ev: RunEvidence, rc: RunClaims) -> None:
        """What to read for the run just evaluated (nothing once it finished)."""

    def forget(self, key: Key) -> None:
        """Nothing more to read for this run (gone, or its evaluation failed)."""

    def publish(self) -> None:
        """After an evaluation: swap in the new list if any run's part changed."""


class PolledSource:
    """A source read by one thread of its own (`run`), spawned through the loop so that it is
    supervised and its failures counted under `state`; it ends with the controller's stop event."""

    thread: str
    ctx: SourceContext
    state: SourceState

    def open(self) -> None:
        self.ctx.loop.spawn(self.run, self.thread, self.state)

    def close(self) -> None:
        pass  # the thread ends on ctx.stop, closing what it opened

    def health(self) -> SourceHealth:
        return self.state.health()

    def run(self) -> None:
        raise NotImplementedError


class SourceState:
    """The bookkeeping every source shares: errors counted under its name, its last error, and its
    passes (the pass-duration gauge for the sources that export one)."""

    def __init__(self, name: str, health: HealthMetrics, *, pass_gauge: bool = False) -> None:
        self.name = name
        self._metrics = health
        self._pass_gauge = pass_gauge
        self._lock = threading.Lock()
        self._health = SourceHealth(name)

    def error(self, error_class: ErrorClass, message: str = "", *, source: str | None = None) -> None:
        """Count one error under this source's name (or `source`, for a part of it: a worker)."""
        self._metrics.error(source or self.name, error_class)
        self.note(message)

    def note(self, message: str) -> None:
        """An error this source saw and keeps as its last, outside the error counter (one it
        logs and retries by design, as the environment check does)."""
        with self._lock:
            h = self._health
            self._health = SourceHealth(h.name, h.errors + 1, message[:300] or h.last_error, time.monotonic(),
                                        h.passes, h.last_pass_s)

    def passed(self, seconds: float) -> None:
        if self._pass_gauge:
            self._metrics.poll_pass(self.name, seconds)
        with self._lock:
            h = self._health
            self._health = SourceHealth(h.name, h.errors, h.last_error, h.last_error_at, h.passes + 1, seconds)

    def health(self) -> SourceHealth:
        with self._lock:
            return self._health


class Targets(Generic[T]):
    """What a per-run source reads, by run: set from the loop's thread during evaluations, and
    published as one new list that the source's thread reads without a lock. Only runs with
    something to read are held."""

    def __init__(self) -> None:
        self._by_run: dict[Key, tuple[T, ...]] = {}
        self._changed = False
        self.current: list[T] = []

    def set(self, key: Key, targets: tuple[T, ...]) -> None:
        if self._by_run.get(key, ()) != targets:
            if targets:
                self._by_run[key] = targets
            else:
                del self._by_run[key]
            self._changed = True

    def publish(self) -> None:
        if self._changed:
            self.current = [t for ts in self._by_run.values() for t in ts]
            self._changed = False


def profile_of(ev: RunEvidence) -> str:
    """The run's TauGrid profile ("" for a run without a TauRun): per-profile settings key on it."""
    t = ev.taurun.facts if ev.taurun is not None else None
    return t.profile if isinstance(t, TauRunFacts) else ""
