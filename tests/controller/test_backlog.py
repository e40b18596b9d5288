"""`collector.backlog.Backlog`: producers of log evidence wait while its budget is spent."""

from __future__ import annotations

import threading
import time

import pytest

from collector.backlog import Backlog


def test_a_producer_waits_until_the_consumer_gives_back() -> None:
    backlog, stop = Backlog(10), threading.Event()
    assert backlog.take(6, stop) and backlog.take(4, stop)
    took = threading.Event()
    t = threading.Thread(target=lambda: backlog.take(1, stop) and took.set(), daemon=True)
    t.start()
    assert not took.wait(0.3)  # 10 of 10 held
    backlog.give(6)
    assert took.wait(2) and backlog.held == 5


def test_one_item_heavier_than_the_limit_passes_alone() -> None:
    backlog, stop = Backlog(10), threading.Event()
    assert backlog.take(50, stop) and backlog.held == 50  # nothing else held: it goes
    waited = threading.Event()
    t = threading.Thread(target=lambda: backlog.take(1, stop) and waited.set(), daemon=True)
    t.start()
    assert not waited.wait(0.3)
    backlog.give(50)
    assert waited.wait(2)


def test_stop_ends_a_wait_with_false() -> None:
    backlog, stop = Backlog(1), threading.Event()
    assert backlog.take(1, stop)
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(backlog.take(1, stop)), daemon=True)
    t.start()
    time.sleep(0.1)
    stop.set()
    t.join(2)
    assert out == [False] and backlog.held == 1
    assert not backlog.take(0, stop)  # stopped: nothing more is taken


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Backlog(0)
