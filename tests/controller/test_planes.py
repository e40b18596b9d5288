"""The controller composed of sources (collector/planes): the registry builds the sources the
settings enable, each counts its failures under its own name and keeps its last error, per-run
sources publish what they read only when it changed, and a coalescing source queues its next
change once the loop has taken the one before."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from collector.controller import Controller
from collector.planes.base import Change, EvidenceSource, PerRun, SourceState, Targets
from collector.planes.kueue_visibility import QueueSource
from collector.planes.multikueue import WorkerSource
from collector.settings import AgentSourceSettings
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.queuewatch import QueueWatch
from collector.workerwatch import WorkerCluster
from tests.controller.test_controller import T0, settings

UNREACHABLE = "http://127.0.0.1:9"


def controller(**kw: Any) -> Controller:
    return Controller(KubeApi(api_client_for(UNREACHABLE)), settings(**kw), lambda: T0)


def test_the_registry_builds_only_the_sources_the_settings_enable() -> None:
    off = controller(log_poll_interval=timedelta(0), checkpoint_poll_interval=timedelta(0),
                     ray_poll_interval=timedelta(0), agents=AgentSourceSettings(poll_interval=timedelta(0)))
    assert set(off.sources) == {"kube", "kueue-visibility", "environment"}
    assert off.composed.per_run == ()
    on = controller(log_poll_interval=timedelta(seconds=5), checkpoint_poll_interval=timedelta(seconds=5),
                    ray_poll_interval=timedelta(seconds=5),
                    agents=AgentSourceSettings(poll_interval=timedelta(seconds=5)))
    assert set(on.sources) == {"kube", "logs", "expstore", "ray", "agents", "kueue-visibility", "environment"}
    assert {s.name for s in on.composed.per_run if isinstance(s, EvidenceSource)} == {"logs", "expstore", "ray"}
    assert all(isinstance(s, EvidenceSource) for s in on.sources.values())
    assert on.composed.all[0] is on.watch  # discovery first: the other sources start after it
    # Error counters exist from the start for the sources' own names, enabled or not.
    for c in (off, on):
        for source in ("logs", "expstore", "ray", "kueue-visibility", "controller", "export", "lease"):
            assert c.registry.get_sample_value("taugrid_collector_errors_total",
                                               {"source": source, "class": "retryable"}) == 0, source


def test_a_failing_visibility_pass_counts_as_its_own_source_not_the_controllers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = controller()
    src = c.sources["kueue-visibility"]
    assert isinstance(src, QueueSource) and src.thread == "queue-poller"

    def poll(self: QueueWatch) -> list[Any]:
        raise RuntimeError("visibility API answered nonsense")
    monkeypatch.setattr(QueueWatch, "poll", poll)
    src.interval_s = 0.02
    c.spawn(src.run, src.thread, src.state)
    try:
        deadline = time.monotonic() + 10
        while src.health().errors < 1:
            assert time.monotonic() < deadline, "the pass never failed"
            time.sleep(0.02)
    finally:
        c.request_stop()
        for t in c._threads:
            t.join(5)
    assert c.registry.get_sample_value("taugrid_collector_errors_total",
                                       {"source": "kueue-visibility", "class": "permanent"}) >= 1
    assert c.registry.get_sample_value("taugrid_collector_errors_total",
                                       {"source": "controller", "class": "permanent"}) == 0
    assert c.registry.get_sample_value("taugrid_collector_thread_restarts_total", {"thread": "queue-poller"}) >= 1
    h = src.health()
    assert h.name == "kueue-visibility" and "nonsense" in h.last_error and h.last_error_at is not None
    assert h in c.source_health()


def test_source_state_keeps_errors_passes_and_the_pass_gauge() -> None:
    c = controller()
    state = SourceState("logs", c.health, pass_gauge=True)
    state.passed(1.5)
    state.note("read refused")
    h = state.health()
    assert (h.passes, h.last_pass_s, h.errors, h.last_error) == (1, 1.5, 1, "read refused")
    assert c.registry.get_sample_value("taugrid_collector_poll_pass_seconds", {"source": "logs"}) == 1.5
    assert c.registry.get_sample_value("taugrid_collector_errors_total",
                                       {"source": "logs", "class": "permanent"}) == 0  # noted, not counted


def test_targets_publish_a_new_list_only_when_a_runs_part_changed() -> None:
    t: Targets[str] = Targets()
    a, b = ("Job", "ns", "a"), ("Job", "ns", "b")
    t.set(a, ("a1", "a2"))
    t.set(b, ("b1",))
    assert t.current == []  # nothing until published (after the evaluation)
    t.publish()
    first = t.current
    assert first == ["a1", "a2", "b1"]
    t.set(a, ("a1", "a2"))
    t.publish()
    assert t.current is first  # unchanged: the same list, nothing rebuilt
    t.set(a, ())
    t.publish()
    assert t.current == ["b1"] and first == ["a1", "a2", "b1"]  # swapped whole: a reader's list stays


class _Loop:
    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.agents_first = threading.Event()
        self.agent_log_pods: frozenset[tuple[str, str]] = frozenset()

    def put(self, change: Change) -> None:
        self.changes.append(change)


def test_a_worker_queues_one_change_until_the_loop_takes_it() -> None:
    c = controller()
    worker = WorkerCluster("w1", KubeApi(api_client_for(UNREACHABLE)), lambda: T0, ())
    loop = _Loop()
    ctx = c.composed.watch.ctx
    from dataclasses import replace
    src = WorkerSource(replace(ctx, loop=loop, workers=(worker,)))  # type: ignore[arg-type]
    assert worker.on_change is not None
    worker.on_change("w1")
    worker.on_change("w1")
    assert [ch.op for ch in loop.changes] == ["worker"]  # coalesced
    ack = loop.changes[0].ack
    assert ack is not None
    ack()  # the loop takes it (before applying it)
    worker.on_change("w1")
    assert len(loop.changes) == 2
    assert isinstance(src, EvidenceSource) and not isinstance(src, PerRun)
