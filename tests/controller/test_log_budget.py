"""The API log pass's plan (collector/sources/logs.py): a ceiling on GETs and bytes that the
operator sets, tenants served in turn when it bites (none starves another), the containers it cut
read first next pass, and no GET for a container whose run's claims need none before the next pass;
against the simulator's log endpoint with the official client, and through a live controller's
/metrics and log."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest

from collector.controller import Controller
from collector.correlate import Signal
from collector.logrotation import LogKey
from collector.model import Ref
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.logs import ApiLogPoller, ApiLogSettings, Candidate, LogFresh, LogTarget, fair_order
from kubesim.server import Simulator
from tests.controller.test_controller import T0, Clock, apply_run, settings, wait_until

BIG, SMALL = "team-big", "team-small"


def _cand(ns: str, pod: str, urgent: bool = False) -> Candidate:
    return Candidate((ns, pod, "main"), (Ref("Pod", ns, pod), "main", "", 0, 0), urgent)


# --- the order, pure ----------------------------------------------------------------------------


def test_a_cut_order_gives_each_tenant_an_equal_share_urgent_reads_first() -> None:
    cands = [_cand(BIG, f"p{i}") for i in range(100)] + [_cand(SMALL, f"s{i}") for i in range(3)] \
        + [_cand("team-new", "n0", urgent=True)]
    order = fair_order(cands, {}, turn=0)
    assert sorted(c.key for c in order) == sorted(c.key for c in cands)  # each once
    assert order[0].key[0] == "team-new"  # a never-read container before any due one
    first = Counter(c.key[0] for c in order[1:7])
    assert first == {BIG: 3, SMALL: 3}, first  # a ceiling of 7 leaves the small tenant all it asked
    assert [c.key[1] for c in order if c.key[0] == BIG][:3] == ["p0", "p1", "p2"]  # in the targets' order


def test_every_pods_first_container_before_any_pods_second() -> None:
    cands = [Candidate((BIG, f"p{i}", c), (Ref("Pod", BIG, f"p{i}"), c, "", 0, 0), False, rank=r)
             for i in range(3) for r, c in enumerate(("main", "fluentbit"))]
    assert [(c.key[1], c.key[2]) for c in fair_order(cands, {}, turn=0)] == [
        ("p0", "main"), ("p1", "main"), ("p2", "main"), ("p0", "fluentbit"), ("p1", "fluentbit"), ("p2", "fluentbit")]


def test_what_waited_longest_comes_first_within_a_tenant_and_the_first_tenant_turns() -> None:
    cands = [_cand(BIG, f"p{i}") for i in range(6)] + [_cand(SMALL, "s0")]
    waited: dict[LogKey, int] = {(BIG, "p4", "main"): 2, (BIG, "p5", "main"): 1}
    order = fair_order(cands, waited, turn=0)
    assert [c.key[1] for c in order if c.key[0] == BIG][:2] == ["p4", "p5"]
    assert fair_order(cands, waited, turn=0)[0].key[0] != fair_order(cands, waited, turn=1)[0].key[0]


# --- the poller against the simulator ------------------------------------------------------------

LINES = 4


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(watch_window=50) as s:
        s.start()
        for ns, n in ((BIG, 30), (SMALL, 3)):
            apply_run(s, "llm", ns, workers=n)
            for i in range(n):
                s.store.append_log(ns, f"llm-w{i}", "main", [f"loading shard {k}" for k in range(LINES)],
                                   T0 - timedelta(seconds=30))  # quiet: no step, read at the rotation's cadence
        yield s


class _Counting:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.pods: Counter[tuple[str, str]] = Counter()

    def get_text(self, path: str, query: Sequence[tuple[str, object]] = ()) -> bytes:
        parts = path.split("/")
        with self.lock:
            self.pods[(parts[-4], parts[-2])] += 1
        return self.api.get_text(path, query)


def _targets(ns: str, n: int) -> list[LogTarget]:
    return [(Ref("Pod", ns, f"llm-w{i}"), "main", "", 0, 0) for i in range(n)]


def _poller(sim: Simulator, **kw: Any) -> tuple[ApiLogPoller, _Counting]:
    api = _Counting(KubeApi(api_client_for(sim.base_url)))
    p = ApiLogPoller(api, ApiLogSettings(concurrency=2, quiet_every=4, **kw), lambda: T0)
    p.open()
    return p, api


def _pass(p: ApiLogPoller, targets: list[LogTarget], **kw: Any) -> list[Any]:
    return list(p.run_pass(targets, agent_pods=frozenset(), held=lambda ref, c: True, stop=threading.Event(), **kw))


def test_a_ceiling_on_gets_serves_tenants_in_turn_and_starves_none(sim: Simulator) -> None:
    targets = _targets(BIG, 30) + _targets(SMALL, 3)
    p, api = _poller(sim, max_gets=6)
    try:
        first = _pass(p, targets)
        r = p.last_pass
        assert r.gets == len(first) == 6 and r.due == 33 and r.deferred == 27 and r.ceiling == "gets"
        assert sum(api.pods.values()) == 6  # the ceiling is what reached the API server
        assert {ns for ns, _ in api.pods} == {BIG, SMALL}  # the small tenant is not behind the big one
        assert sum(n for (ns, _), n in api.pods.items() if ns == SMALL) == 3
        passes = 1
        while len(api.pods) < 33:  # every one read within ceil(33 / 6) passes: what a ceiling cut comes first
            _pass(p, targets)
            passes += 1
            assert p.last_pass.gets <= 6
        assert passes <= 6, (passes, api.pods)
        assert max(api.pods.values()) <= 2, api.pods  # (a quiet one read early may be due again in its slot)
    finally:
        p.close()


def test_a_ceiling_on_bytes_stops_asking_once_reached(sim: Simulator) -> None:
    p, api = _poller(sim, max_bytes=1)
    try:
        out = _pass(p, _targets(BIG, 30))
    finally:
        p.close()
    r = p.last_pass
    assert r.ceiling == "bytes" and r.bytes > 0 and r.deferred > 0
    assert r.gets == len(out) <= 2 * 2  # what was asked ahead (twice the concurrency) before the first answer
    assert r.gets + r.deferred == 30


def test_a_run_whose_claims_stand_past_the_next_pass_costs_no_get(sim: Simulator) -> None:
    targets = _targets(SMALL, 3)
    p, api = _poller(sim, interval_s=30.0)
    far, near = T0 + timedelta(minutes=2), T0 + timedelta(seconds=20)
    try:
        _pass(p, targets)  # the first read of each: whatever the claims say
        assert sum(api.pods.values()) == 3 and p.last_pass.skipped["claims"] == 0
        for i in range(3):  # as if every container printed steps (read every pass by the rotation)
            p.rotation.read((SMALL, f"llm-w{i}", "main"), progress=True)
        api.pods.clear()
        out = _pass(p, targets, quiet={(SMALL, "llm-w0"): far, (SMALL, "llm-w1"): near})
        # p0's run stands past the next pass (30 s + the last pass's length): not read, and no
        # result either (a LogFresh would move its read time: the evidence must age)
        assert set(api.pods) == {(SMALL, "llm-w1"), (SMALL, "llm-w2")}, api.pods
        assert {r.ref.name for r in out} == {"llm-w1", "llm-w2"} and p.last_pass.skipped["claims"] == 1
        assert not [r for r in out if isinstance(r, LogFresh | Signal) and r.ref.name == "llm-w0"]
        # ... a restart is new evidence: read at once
        api.pods.clear()
        _pass(p, [(Ref("Pod", SMALL, "llm-w0"), "main", "", 1, 0)], quiet={(SMALL, "llm-w0"): far})
        assert api.pods[(SMALL, "llm-w0")] >= 1
        # ... and a signal the index does not hold is read, whatever the claims say
        api.pods.clear()
        list(p.run_pass(targets[:1], agent_pods=frozenset(), held=lambda ref, c: False, stop=threading.Event(),
                        quiet={(SMALL, "llm-w0"): far}))
        assert api.pods[(SMALL, "llm-w0")] == 1
        # ... and at the quiet cadence at the latest, however far the deadline
        api.pods.clear()
        for _ in range(4):
            _pass(p, targets[:1], quiet={(SMALL, "llm-w0"): far})
        assert api.pods[(SMALL, "llm-w0")] == 1, api.pods
    finally:
        p.close()


def test_a_skipped_read_still_comes_before_its_deadline_when_passes_run_long(sim: Simulator) -> None:
    """The skip's horizon is the next pass's end: one interval away, or as far as the clock moved since
    the last pass began when that is more (a loaded poller, a server clock that runs fast). A deadline
    inside it is read now: read later, the read would come after the window closed."""
    now = [T0]
    api = _Counting(KubeApi(api_client_for(sim.base_url)))
    p = ApiLogPoller(api, ApiLogSettings(concurrency=2, quiet_every=100, interval_s=30.0), lambda: now[0])
    p.open()
    targets = _targets(SMALL, 1)
    key = (SMALL, "llm-w0", "main")
    try:
        _pass(p, targets)
        p.rotation.read(key, progress=True)
        deadline = {(SMALL, "llm-w0"): T0 + timedelta(seconds=150)}
        now[0] = T0 + timedelta(seconds=30)  # passes an interval apart: 2 min to the deadline, not read
        _pass(p, targets, quiet=deadline)
        assert p.last_pass.skipped["claims"] == 1
        now[0] = T0 + timedelta(seconds=100)  # this pass began 70 s after the last: the next ends past it
        api.pods.clear()
        _pass(p, targets, quiet=deadline)
        assert p.last_pass.skipped["claims"] == 0 and api.pods[(SMALL, "llm-w0")] == 1
    finally:
        p.close()


def test_a_read_is_timed_when_its_answer_came_not_when_it_was_handled(sim: Simulator) -> None:
    """A read's time is the clock as its answer arrived (on the reader thread): handled later, a line
    printed in between is not in it, and a later time would call a stall window that closed unread
    "read after it"."""
    def clock() -> Any:
        on_reader = threading.current_thread().name.startswith("log-read")
        return T0 if on_reader else T0 + timedelta(minutes=5)

    p = ApiLogPoller(KubeApi(api_client_for(sim.base_url)), ApiLogSettings(concurrency=2), clock)
    p.open()
    try:
        out = [r for r in _pass(p, _targets(SMALL, 3)) if isinstance(r, Signal)]
    finally:
        p.close()
    assert len(out) == 3 and {s.read_at for s in out} == {T0}


# --- a live controller: the pass's cost on /metrics, a log line when the ceiling bites ---------


def test_controller_states_each_pass_cost_and_logs_the_ceiling(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(T0)
    with Simulator(watch_window=50, clock=clock) as s:
        s.start()
        for ns in ("team-a", "team-b", "team-c"):
            apply_run(s, "llm", ns, workers=2)
            for w in range(2):
                s.store.append_log(ns, f"llm-w{w}", "main", ["step=1 loss=2.0"], T0 - timedelta(seconds=20))
        c = Controller(KubeApi(api_client_for(s.base_url)),
                       settings(log_poll_interval=timedelta(seconds=0.1), log_pass_max_gets=2,
                                log_pass_max_bytes=1 << 20), clock.now)
        caplog.set_level(logging.WARNING, logger="taugrid.controller")
        c.open()
        try:
            # every container read in the end (2 a pass, tenants in turn), none starved
            wait_until(lambda: sum(1 for _ in c.index.all_signals()) >= 6,
                       what="every container's log held")
            text = generate_latest(c.registry).decode()
        finally:
            c.close()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("taugrid_collector_log_")}
    assert values['taugrid_collector_log_pass_ceiling{limit="gets"}'] == 2
    assert values['taugrid_collector_log_pass_ceiling{limit="bytes"}'] == 1 << 20
    assert 0 <= values["taugrid_collector_log_gets_per_pass"] <= 2
    assert any("ceiling reached" in r.getMessage() and getattr(r, "deferred", 0) > 0 for r in caplog.records)


def test_agent_logs_of_pods_no_run_owns_are_not_held() -> None:
    """With the agents reading every pod on their node (the chart's logScope: all), their documents
    carry the node's own pods (a DaemonSet's, here in kube-system): the controller holds no evidence
    for them (no claim reads it), and still holds the run's."""
    from collector.planes.base import Change
    from collector.progress import scan_text
    from tests.controller.test_controller import ensure_namespaces, server_side
    from tests.dumpkit import pod

    clock = Clock(T0)
    with Simulator(watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm", "team-a", workers=1)
        ensure_namespaces(s, "kube-system")
        system = pod("kube-proxy-x1", "kube-system", T0 - timedelta(hours=1), node="gpu-0")
        system["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-proxy",
                                                  "uid": "uid-kp", "controller": True}]
        s.apply(server_side(system))
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now)
        c.open()
        try:
            wait_until(c.ready.is_set, what="synced")
            for ns, name in (("kube-system", "kube-proxy-x1"), ("team-a", "llm-w0")):
                scan = scan_text(b"2026-01-10T11:59:50Z step=5 loss=1.0\n", source=f"{ns}/{name}/main")
                c.put(Change("agent-log", None, (Signal(Ref("Pod", ns, name), "main", scan, T0), None)))
            wait_until(lambda: c.index.signal_of(Ref("Pod", "team-a", "llm-w0"), "main") is not None,
                       what="the run's pod's log held")
            assert c.index.signal_of(Ref("Pod", "kube-system", "kube-proxy-x1"), "main") is None
        finally:
            c.close()
