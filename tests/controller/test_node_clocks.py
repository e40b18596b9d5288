"""The live controller's node clocks: node Leases (kube-node-lease, renewed every 10 s on each node's
own clock) say how far a clock runs ahead, in a list as soon as the controller starts and in each
renewal after; a node only a heartbeat has shown (minutes old, perhaps) is unsure until measured,
and its pods' progress is unknown meanwhile."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from collector.controller import Controller
from collector.correlate import RunIndex
from collector.kube import NodeLease
from collector.nodeclock import NODE_SKEW_TOLERANCE, NodeClocks
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
from kubesim.scenario import scenario_from_dict
from tests.controller.test_controller import settings, wait_until
from tests.simulator.conftest import T0


def _scenario(heartbeats: bool) -> object:
    return scenario_from_dict({
        "name": "clocks", "seed": 3, "start": T0.isoformat(),
        "cluster": {"namespaces": ["ml"], "kubeletHeartbeats": heartbeats,
                    "nodes": [{"name": "sys", "cpu": "16"},
                              {"name": "fast", "pool": "gpu", "gpus": 8, "clockSkew": "90s"},
                              {"name": "slow", "pool": "gpu", "gpus": 8, "clockSkew": "-40s"},
                              {"name": "right", "pool": "gpu", "gpus": 8}],
                    "flavors": ["a100"]},
        "runs": []})


class _Played:
    """A cluster `after` seconds in, and the live controller started then."""

    def __init__(self, heartbeats: bool, after: float) -> None:
        self.clock = ManualClock(T0)
        self.sim = Simulator(clock=self.clock, settings=SimulatorSettings(seed=3, bookmark_interval_s=0.5))
        url = self.sim.start("127.0.0.1:0")
        self.engine = ScenarioEngine(_scenario(heartbeats), url, clock=self.clock)  # type: ignore[arg-type]
        self.engine.step_to(after)
        self.ctl = Controller(KubeApi(api_client_for(url)), settings(), self.clock.now)
        self.ctl.open()
        wait_until(self.ctl.ready.is_set, timeout=30, what="ready")
        wait_until(lambda: all(r.synced_once.is_set() for r in self.ctl.watch.reflectors), timeout=30, what="listed")
        self.applied()

    def applied(self) -> None:
        wait_until(self.ctl._changes.empty, timeout=30, what="applied")
        time.sleep(0.3)

    def close(self) -> None:
        self.ctl.close()
        self.engine.stop()
        self.sim.close()


def test_node_leases_measure_each_clock_as_the_controller_starts() -> None:
    """Four minutes in (heartbeats up to 5 min old), the list of node Leases alone says fast runs 90 s
    ahead (to within one renewal, taken at the top: its stamps read no fresher than they are). slow's
    Lease, 40 s behind, looks older than its duration: listed, it cannot be told from a kubelet gone
    quiet, so slow is unsure until its next renewal, seen as it happens, measures it (behind needs
    no correction: its stamps look older, never fresher)."""
    p = _Played(True, 240)
    try:
        idx = p.ctl.index
        assert any(r.resource.kind == "Lease" for r in p.ctl.watch.reflectors)
        assert set(idx.node_skew) == {"fast"} and idx.node_clock_unsure == {"slow"}
        assert timedelta(seconds=90) <= idx.node_skew["fast"] <= timedelta(seconds=100)
        p.engine.step_to(260)  # every kubelet renews its Lease: watch events
        wait_until(lambda: not idx.node_clock_unsure, timeout=30, what="slow measured")
        p.applied()
        assert set(idx.node_skew) == {"fast"}
        assert timedelta(seconds=85) <= idx.node_skew["fast"] <= timedelta(seconds=95)
    finally:
        p.close()


def test_without_leases_a_node_seen_only_in_a_list_is_unsure() -> None:
    """No node Lease to read (kubelet heartbeats off: the node status was written once, minutes ago):
    no node's clock is measured, so none of their stamps are placed."""
    p = _Played(False, 240)
    try:
        assert {"fast", "slow", "right"} <= p.ctl.index.node_clock_unsure
    finally:
        p.close()


def test_node_clocks_from_leases_and_heartbeats() -> None:
    """The rules alone: a listed Lease older than its duration measures nothing; one seen in a watch
    event is taken as it is; once a Lease measured a node, heartbeats no longer decide; a Lease gone
    from a relist hands the node back to heartbeats."""
    idx = RunIndex()
    clocks = NodeClocks(idx)
    now = datetime(2026, 1, 10, 12, 0, tzinfo=T0.tzinfo)
    period = timedelta(seconds=40)
    clocks.lease(NodeLease("a", now - timedelta(minutes=5), period), -timedelta(minutes=5), listed=True)
    clocks.heartbeat("a", now - timedelta(minutes=3), None, now)
    assert "a" in idx.node_clock_unsure  # a stale Lease, an old heartbeat: not measured
    clocks.lease(NodeLease("a", now + timedelta(seconds=60), period), timedelta(seconds=60), listed=False)
    assert "a" not in idx.node_clock_unsure and idx.node_skew["a"] == timedelta(seconds=60)
    clocks.heartbeat("a", now - timedelta(minutes=1), now - timedelta(minutes=3), now)  # a post: ignored now
    assert idx.node_skew["a"] == timedelta(seconds=60)
    clocks.lease(NodeLease("a", now, period), timedelta(0), listed=False)
    assert "a" not in idx.node_skew  # back in step
    clocks.lease(NodeLease("b", now - timedelta(seconds=5), period), -timedelta(seconds=5), listed=True)
    assert "b" not in idx.node_skew and "b" not in idx.node_clock_unsure
    clocks.leases_listed({"b"})
    clocks.heartbeat("a", now + timedelta(minutes=2), None, now)  # "a" has no Lease now: a first sight
    assert "a" in idx.node_clock_unsure and idx.node_skew["a"] > NODE_SKEW_TOLERANCE


def test_a_node_clock_behind_seen_in_a_watch_event_is_unsure_until_in_step() -> None:
    """A renewal seen as it happens but stamped 90 s before now: the node's clock runs behind, and its
    pods' steps would look 90 s older than they are (a steady run judged stalled). Its stamps are not
    placed until a renewal arrives in step; a listed Lease that old says nothing (it may just be old)."""
    idx = RunIndex()
    clocks = NodeClocks(idx)
    now = datetime(2026, 1, 10, 12, 0, tzinfo=T0.tzinfo)
    period = timedelta(seconds=40)
    clocks.lease(NodeLease("slow", now - timedelta(seconds=90), period), -timedelta(seconds=90), listed=False)
    assert "slow" in idx.node_clock_unsure and "slow" not in idx.node_skew
    clocks.lease(NodeLease("slow", now - timedelta(seconds=2), period), -timedelta(seconds=2), listed=False)
    assert "slow" not in idx.node_clock_unsure
    clocks.heartbeat("quiet", now - timedelta(minutes=3), now - timedelta(minutes=8), now)  # a post, 3 min behind
    assert "quiet" in idx.node_clock_unsure
