"""One tenant's Ray head cannot hold back the others' Ray evidence (issue 26).

A head that trickles its answer a byte at a time never trips a per-read socket timeout: each
request has a total deadline, and the controller publishes each cluster's result as soon as it
is read instead of after the slowest head of the pass.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from collector.controller import Controller
from collector.model import Ref
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.ray import RayHead, RayPoller, RaySourceError, RayTarget
from tests.controller.test_controller import T0, settings
from tests.security.hostile_http import http_server, ray_head, trickler


@pytest.mark.parametrize("in_header", [False, True], ids=["body", "status-line"])
def test_a_trickling_head_is_cut_at_the_request_deadline(in_header: bool) -> None:
    with trickler(every_s=0.3, lasting_s=20, in_header=in_header) as url:
        head = RayHead(url, connect_timeout=1.0, read_timeout=2.0)
        t0 = time.monotonic()
        with pytest.raises(RaySourceError, match="timed out") as e:
            head.jobs()
        took = time.monotonic() - t0
    assert e.value.retryable
    assert took < 5, f"a byte every 0.3 s held the read for {took:.1f} s (deadline: 1 + 2 s)"


def test_a_cluster_budget_bounds_every_request_of_a_pass() -> None:
    """The poller gives each cluster one budget for all its reads: a head whose every answer
    trickles is cut once, at the budget, not at each request's own deadline in turn."""
    with trickler(every_s=0.2, lasting_s=20) as url:
        poller = RayPoller(connect_timeout=1.0, read_timeout=10.0, cluster_budget=timedelta(seconds=1.5))
        t0 = time.monotonic()
        [(_, runtime, sig)] = poller.poll([RayTarget(Ref("RayCluster", "a", "slow"), url, url + "/metrics")], T0)
        took = time.monotonic() - t0
    assert sig is None and "timed out" in (runtime.error or "")
    assert took < 4, took


def test_one_trickling_head_does_not_hold_back_another_tenants_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's Ray poller, with a trickling head (tenant a) and a healthy one (tenant b):
    b's runtime and progress reach the loop within a poll interval, while a's read is still out."""
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")),
                   settings(ray_poll_interval=timedelta(seconds=0.2)), lambda: T0)
    put: list[tuple[float, Any]] = []
    monkeypatch.setattr(c, "put", lambda change: put.append((time.monotonic(), change)))

    def published(name: str) -> list[float]:
        return [at for at, ch in put if ch.op == "ray" and ch.payload[1].name == name]

    with trickler(every_s=0.5, lasting_s=30) as slow, http_server(ray_head(step=11)) as good:
        ray = c.sources["ray"]
        ray.targets.current = [
            (Ref("RayJob", ns, name), RayTarget(Ref("RayCluster", ns, name), url, url + "/metrics"))
            for ns, name, url in (("tenant-a", "slow", slow), ("tenant-b", "good", good))
        ]
        t0 = time.monotonic()
        poller = threading.Thread(target=ray.run, daemon=True)
        poller.start()
        try:
            deadline = t0 + 10
            while not published("good") and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            c._stop.set()
        good_at = published("good")
        slow_at = published("slow")
    assert good_at, "tenant b's Ray evidence never reached the loop while tenant a's head trickled"
    assert good_at[0] - t0 < 3, f"tenant b's evidence waited {good_at[0] - t0:.1f} s behind tenant a's head"
    assert not slow_at or slow_at[0] > good_at[0]  # a's, if out at all, came after
    _, _, runtime, sig = next(ch.payload for at, ch in put if at == good_at[0])
    assert runtime.error == "" and sig is not None and [s.step for s in sig.scan.samples] == [11]
    poller.join(15)  # the slow read ends at its own deadline (or when the trickler goes)
