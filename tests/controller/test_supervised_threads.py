"""A poller thread that fails is started again: one source tripping on a bug or on input nobody
foresaw must not stop for good while /healthz and every other source look fine."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from collector.planes import node_agents
from collector.settings import AgentSourceSettings
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, start, wait_until


def test_a_poller_that_raises_is_logged_counted_and_started_again(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    discover = node_agents.discover_agents

    def tripping(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("'int' object is not iterable")  # what a bug looks like
        return discover(*a, **k)
    monkeypatch.setattr(node_agents, "discover_agents", tripping)
    caplog.set_level(logging.ERROR, logger="taugrid.controller")
    with Simulator(settings=FAST, watch_window=50) as sim:
        sim.start()
        c = start(sim, Clock(T0), agents=AgentSourceSettings(poll_interval=timedelta(seconds=0.2), namespace="default"))
        try:
            wait_until(lambda: len(calls) >= 3, timeout=10, what="the agent poller running again after its failure")
            errors = c.registry.get_sample_value("taugrid_collector_errors_total",
                                                 {"source": "agents", "class": "permanent"})
            assert errors == 1
            restarts = c.registry.get_sample_value("taugrid_collector_thread_restarts_total",
                                                   {"thread": "agent-poller"})
            assert restarts == 1
            assert c.registry.get_sample_value("taugrid_collector_thread_restarts_total", {"thread": "log-poller"}) == 0
            failed = [r for r in caplog.records if r.getMessage() == "thread failed; starting it again"]
            assert len(failed) == 1 and getattr(failed[0], "thread_name", "") == "agent-poller"
            assert failed[0].exc_info is not None and "not iterable" in str(failed[0].exc_info[1])
        finally:
            c.close()
