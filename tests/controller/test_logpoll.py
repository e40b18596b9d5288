"""The API log poller (collector/sources/logs.py) against the simulator's log endpoint: reads in
flight at once, the same evidence as reading one after the other, a pass that stops on demand,
failures handed on and a bug not swallowed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from collector.correlate import Signal
from collector.logrotation import RESYNC, _slot
from collector.model import Ref
from collector.sources.kube_api import KubeApi, PermanentSourceError, api_client_for
from collector.sources.logs import ApiLogPoller, ApiLogSettings, LogFresh, LogTarget
from kubesim.server import Simulator
from tests.controller.test_controller import T0, apply_run

PODS = 12


class _Counting:
    """The real client, with how many GETs are in flight at once."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.now_in = 0
        self.peak = 0
        self.calls = 0

    def get_text(self, path: str, query: Sequence[tuple[str, object]] = ()) -> bytes:
        with self.lock:
            self.now_in += 1
            self.calls += 1
            self.peak = max(self.peak, self.now_in)
        try:
            return self.api.get_text(path, query)
        finally:
            with self.lock:
                self.now_in -= 1


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(watch_window=50) as s:
        s.start()
        apply_run(s, "llm", workers=PODS)
        for i in range(PODS):
            for n in range(1, 6):
                at = T0 - timedelta(seconds=60 - 10 * n)
                s.store.append_log("research", f"llm-w{i}", "main",
                                   [f"{{'loss': {3 - n * 0.1 - i * 0.01:.3f}, 'step': {n * (i + 1)}}}"], at)
        yield s


def _targets() -> list[LogTarget]:
    return [(Ref("Pod", "research", f"llm-w{i}"), "main", "", 0, 0) for i in range(PODS)]


def _one_pass(poller: ApiLogPoller, targets: list[LogTarget], held: bool = False,
              stop: threading.Event | None = None) -> list[Any]:
    return list(poller.run_pass(targets, agent_pods=frozenset(), held=lambda ref, c: held,
                                stop=stop or threading.Event()))


def _poller(api: Any, concurrency: int) -> ApiLogPoller:
    p = ApiLogPoller(api, ApiLogSettings(concurrency=concurrency, quiet_every=1), lambda: T0)
    p.open()
    return p


def test_reads_are_in_flight_at_once_and_find_what_one_at_a_time_finds(sim: Simulator) -> None:
    fault = sim.faults.delay(0.2, verbs=("logs",))  # a kubelet round trip, slowed so the overlap shows
    try:
        results = {}
        for concurrency in (1, 4):
            api = _Counting(KubeApi(api_client_for(sim.base_url)))
            poller = _poller(api, concurrency)
            try:
                out = _one_pass(poller, _targets())
            finally:
                poller.close()
            assert api.calls == PODS and api.peak == concurrency, (concurrency, api.peak)
            assert all(isinstance(s, Signal) for s in out) and poller.reads == PODS
            results[concurrency] = {s.ref.name: s.scan for s in out}
    finally:
        sim.faults.remove(fault.id)
    assert results[1] == results[4]  # same scans, whatever order the answers came in
    assert [s.step for s in results[4]["llm-w3"].samples] == [4, 8, 12, 16, 20]


def test_a_second_pass_asks_for_the_lines_since_and_an_unchanged_answer_is_fresh(sim: Simulator) -> None:
    poller = _poller(KubeApi(api_client_for(sim.base_url)), 4)
    try:
        first = _one_pass(poller, _targets())
        again = _one_pass(poller, _targets(), held=True)
    finally:
        poller.close()
    assert all(isinstance(s, Signal) for s in first)
    # the second read asks since the last line's second and gets that line again: not unchanged
    # (the first read was a whole read, a different question), so a scan of one line; except
    # where the container's slot makes this its whole read (one read in RESYNC): the first
    # read's question and answer again, so the held evidence stands (fresh)
    whole = {f"llm-w{i}" for i in range(PODS) if _slot(("research", f"llm-w{i}", "main")) % RESYNC == 0}
    assert {r.ref.name: len(r.scan.samples) if isinstance(r, Signal) else type(r).__name__ for r in again} == {
        f"llm-w{i}": "LogFresh" if f"llm-w{i}" in whole else 1 for i in range(PODS)}
    poller = _poller(KubeApi(api_client_for(sim.base_url)), 4)
    try:
        for _ in range(3):
            last = _one_pass(poller, _targets(), held=True)
    finally:
        poller.close()
    assert sum(isinstance(r, LogFresh) for r in last) >= PODS - 2  # (a resync read asks another question)


def test_stop_ends_a_pass_whose_reads_hang_and_the_next_pass_ignores_their_answers(sim: Simulator) -> None:
    fault = sim.faults.delay(1.5, verbs=("logs",), count=PODS)
    poller = _poller(KubeApi(api_client_for(sim.base_url)), 4)
    try:
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        assert _one_pass(poller, _targets(), stop=stop) == []
        assert time.monotonic() - started < 1.2  # not the 1.5 s the reads in flight still take
        time.sleep(1.5)  # their answers arrive now, for a pass that ended
        out = _one_pass(poller, _targets())
        assert sorted(s.ref.name for s in out) == sorted(f"llm-w{i}" for i in range(PODS))  # each once
    finally:
        poller.close()
        sim.faults.remove(fault.id)


def test_a_429_with_retry_after_holds_new_reads_until_then(sim: Simulator) -> None:
    """API priority and fairness throttles the controller: the poller asks nothing new for the
    Retry-After (1 s here); the read already asked finishes, the throttled one is due next pass."""
    fault = sim.faults.fail(429, count=1, verbs=("logs",), retry_after_s=1)
    api = KubeApi(api_client_for(sim.base_url))
    starts: list[float] = []
    get_text = api.get_text

    def timed(path: str, query: Sequence[tuple[str, object]] = ()) -> bytes:
        starts.append(time.monotonic())
        return get_text(path, query)
    api.get_text = timed  # type: ignore[method-assign]
    poller = _poller(api, 1)
    try:
        first = _one_pass(poller, _targets())
        throttled_at = starts[0]  # the first read is the one the fault answers
        second = _one_pass(poller, _targets())
    finally:
        poller.close()
        sim.faults.remove(fault.id)
    errors = [r for r in first if not isinstance(r, Signal)]
    assert len(errors) == 1 and "429" in str(errors[0]) and errors[0].retry_after == 1
    gaps = [t - throttled_at for t in starts[1:PODS]]
    assert sum(g < 0.5 for g in gaps) <= 2  # asked before the 429 came back (concurrency 1: a window of 2)
    assert sum(g >= 0.95 for g in gaps) >= PODS - 3  # the rest waited out the Retry-After
    assert len(first) == PODS and len(second) == PODS  # the pass still read everything else; then every one


def test_a_failed_read_is_handed_on_and_due_again() -> None:
    class Refusing:
        calls = 0

        def get_text(self, path: str, query: Sequence[tuple[str, object]] = ()) -> bytes:
            Refusing.calls += 1
            if Refusing.calls == 1:
                raise PermanentSourceError(f"GET {path}: 403 Forbidden")
            return b"2026-12-01T00:00:00.000000000Z step 1\n"
    poller = _poller(Refusing(), 2)
    try:
        target = _targets()[:1]
        first = _one_pass(poller, target)
        second = _one_pass(poller, target)
    finally:
        poller.close()
    assert len(first) == 1 and isinstance(first[0], PermanentSourceError) and "403" in str(first[0])
    assert len(second) == 1 and isinstance(second[0], Signal)


def test_a_bug_in_a_read_is_raised_on_the_polling_thread() -> None:
    class Broken:
        def get_text(self, path: str, query: Sequence[tuple[str, object]] = ()) -> bytes:
            raise KeyError("not an I/O failure")
    poller = _poller(Broken(), 2)
    try:
        with pytest.raises(KeyError, match="not an I/O failure"):
            _one_pass(poller, _targets()[:3])
    finally:
        poller.close()


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ApiLogPoller(KubeApi(api_client_for("http://127.0.0.1:9")), ApiLogSettings(concurrency=0), lambda: T0)
