"""A replica that does not lead says why (rate-limited), and a stopped elector never leads again."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from collector.sources.kube_api import JSON, KubeApi, api_client_for
from collector.sources.lease import LeaseElector
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, settings, wait_until

LEASE = ("coordination.k8s.io/v1", "Lease")


def _sim(clock: Clock) -> Simulator:
    s = Simulator(settings=FAST, watch_window=50, clock=clock)
    s.start()
    s.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    return s


def test_a_lease_left_by_a_gone_replica_is_logged_then_taken_over(caplog: pytest.LogCaptureFixture) -> None:
    """The start-up case: a Lease a killed replica never released. The new replica waits it out
    (leaseDurationSeconds from when it first saw it), and says so at once, not once per round."""
    clock = Clock(T0)
    with _sim(clock) as s:
        cfg = replace(settings().controller, leader_election=True, lease_namespace="default",
                      lease_renew=timedelta(seconds=0.1), lease_duration=timedelta(seconds=2))
        s.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": cfg.lease_name, "namespace": "default"},
                 "spec": {"holderIdentity": "killed-replica", "leaseDurationSeconds": 2,
                          "renewTime": "2026-01-10T11:59:59.000000Z", "acquireTime": "2026-01-10T11:00:00.000000Z",
                          "leaseTransitions": 0}})
        b = LeaseElector(KubeApi(api_client_for(s.base_url)), cfg, clock.now, identity="replica-b")
        with caplog.at_level(logging.INFO, logger="taugrid.lease"):
            b.start()
            try:
                wait_until(lambda: b.is_leader, timeout=10, what="b takes the abandoned Lease")
            finally:
                b.stop()
        said = [r for r in caplog.records if r.getMessage() == "not leading"]
        reasons = [str(getattr(r, "reason", "")) for r in said]
        # ~20 rounds not leading: told at once, and again only when the reason turned to "not renewed"
        assert 1 <= len(said) <= 3, reasons
        assert "killed-replica" in reasons[0]
        assert any("not renewed" in r for r in reasons) and any(r.levelno == logging.WARNING for r in said)
        lease = s.store.get(s.resource(*LEASE), "default", cfg.lease_name)
        assert lease["spec"]["holderIdentity"] == ""  # released by stop()


class _SlowWrites:
    """The API, with the first write held until `go` is set (a request in flight at stop())."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.go = threading.Event()
        self.first = True
        self.writing = threading.Event()

    def get_json(self, path: str, query: Any = ()) -> JSON:
        return self.api.get_json(path, query)

    def write_json(self, method: str, path: str, body: JSON) -> JSON:
        if self.first:
            self.first = False
            self.writing.set()
            assert self.go.wait(10)
        return self.api.write_json(method, path, body)


def test_a_request_in_flight_at_stop_never_makes_a_stopped_replica_lead() -> None:
    """stop() returns while the acquiring write is still in flight; when it completes, the replica
    neither leads nor keeps the Lease (a standby would otherwise wait out its duration)."""
    clock = Clock(T0)
    with _sim(clock) as s:
        cfg = replace(settings().controller, leader_election=True, lease_namespace="default",
                      lease_renew=timedelta(seconds=0.1), lease_duration=timedelta(minutes=5))
        api = _SlowWrites(KubeApi(api_client_for(s.base_url)))
        a = LeaseElector(api, cfg, clock.now, identity="replica-a")  # type: ignore[arg-type]
        a.start()
        assert api.writing.wait(5)
        a.stop(timeout=0.1)  # gives up on the request in flight
        api.go.set()
        assert a._thread is not None
        a._thread.join(5)
        assert not a._thread.is_alive()
        assert not a.is_leader
        lease = s.store.get(s.resource(*LEASE), "default", cfg.lease_name)
        assert lease["spec"]["holderIdentity"] == ""  # taken by the late write, then released
        time.sleep(0.3)
        assert not a.is_leader
