"""The Ray source against a real local Ray head (tests/rayserver.py) running a real job.

The job increments `ray.util.metrics.Counter("train_steps")` once a second, stalls (printing an
NCCL watchdog line, as a hung collective would) until the test creates a file, then resumes.
`RayPoller` reads the head; `collector.claims.progress.analyze` must see the advances, the stall
(last advance older than the window) and the resumption.
"""

from __future__ import annotations

import http.server
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collector.claims.progress import ProgressView, analyze
from collector.correlate import RayRuntime, Signal
from collector.model import Plane, Ref
from collector.settings import ClaimSettings
from collector.sources.ray import RayHead, RayPoller, RayTarget
from tests.rayserver import RayHeadServer, free_port

PHASE1 = 12  # steps before the stall
PHASE2 = 6  # steps after it
SETTINGS = ClaimSettings(stall_floor=timedelta(seconds=10), scrape_interval=timedelta(seconds=1))
CLUSTER = Ref("RayCluster", "default", "local")

JOB = textwrap.dedent(
    """
    import pathlib, sys, time
    import ray
    from ray.util.metrics import Counter, Gauge

    ray.init()
    steps = Counter("train_steps", description="training steps")
    loss = Gauge("train_loss", description="training loss")
    stalled, resume = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    n = 0

    def train(k):
        global n
        for _ in range(k):
            n += 1
            steps.inc(1.0)
            loss.set(1.0 / n)
            print(f"step {n}", flush=True)
            time.sleep(1.0)

    train(int(sys.argv[3]))
    print("[rank0]:[E1129 21:30:00.123456 1234 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
          "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
          "Timeout(ms)=600000) ran for 600022 milliseconds before timing out.", flush=True)
    stalled.touch()
    while not resume.exists():
        time.sleep(0.2)
    train(int(sys.argv[4]))
    print("done", flush=True)
    """
)


def _now() -> datetime:
    return datetime.now(UTC)


class Watch:
    """Polls one target every `interval` and keeps what the engine would be handed."""

    def __init__(self, poller: RayPoller, target: RayTarget, interval: float = 1.0) -> None:
        self.poller, self.target, self.interval = poller, target, interval
        self.runtime: RayRuntime | None = None
        self.signal: Signal | None = None
        self.statuses: list[str] = []

    def poll(self) -> tuple[RayRuntime, Signal | None]:
        [(ref, runtime, sig)] = self.poller.poll([self.target], _now())
        assert ref == self.target.cluster
        assert runtime.error == "", runtime.error
        self.runtime = runtime
        if sig is not None:
            self.signal = sig
        if not self.statuses or self.statuses[-1] != runtime.job_status:
            self.statuses.append(runtime.job_status)
        return runtime, sig

    def view(self) -> ProgressView:
        assert self.signal is not None
        return analyze([self.signal], SETTINGS)

    def until(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        t0 = time.monotonic()
        while True:
            self.poll()
            if check():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                sig = self.signal
                seen = [(s.step, f"{s.at:%H:%M:%S}" if s.at else None) for s in sig.scan.samples] if sig else None
                raise AssertionError(f"{what}: not within {timeout}s; runtime={self.runtime}; samples={seen}; "
                                     f"diagnostics={sig.scan.diagnostics if sig else None}")
            time.sleep(self.interval)


def test_real_job_advances_stalls_and_resumes(ray_head: RayHeadServer, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    stalled, resume = tmp_path / "stalled", tmp_path / "resume"
    sid = ray_head.submit(f"{sys.executable} {script} {stalled} {resume} {PHASE1} {PHASE2}")
    poller = RayPoller(log_interval=timedelta(seconds=2))
    w = Watch(poller, RayTarget(CLUSTER, ray_head.dashboard_url, ray_head.metrics_url, job_id=sid))
    timings: dict[str, float] = {}
    try:
        # 1. Running: the counter advances, one node alive, the Ray job RUNNING.
        timings["first advances"] = w.until(
            "three advances while running", lambda: len(w.view().advances) >= 3, timeout=40)
        runtime, sig = w.poll()
        assert runtime.alive_nodes == 1
        assert runtime.job_status == "RUNNING"
        assert sig is not None and sig.plane is Plane.RAY and sig.source == "ray-metrics" and sig.ref == CLUSTER
        view = w.view()
        steps = [a.step for a in view.advances]
        assert steps == sorted(set(steps)) and view.replayed == 0
        assert all(s.format == "ray-metric" and s.line == 0 for s in sig.scan.samples)
        assert view.last_loss is not None and 0 < view.last_loss <= 1
        assert _now() - view.advances[-1].at <= view.window  # progressing now

        # 2. Stall: the job reaches the stall; the last advance grows older than the window.
        w.until("the job reaches its stall", stalled.exists, timeout=30)
        timings["stalled after"] = w.until(
            "the stall is flagged",
            lambda: _now() - w.view().advances[-1].at > w.view().window and w.view().last_step == PHASE1,
            timeout=45)
        view = w.view()
        assert view.last_step == PHASE1
        assert w.runtime is not None and w.runtime.job_status == "RUNNING"  # RUNNING, yet not progressing
        assert w.signal is not None
        hangs = w.signal.scan.hangs
        assert [h.kind for h in hangs] == ["nccl-watchdog-timeout"], w.signal.scan
        assert hangs[0].collective == "ALLREDUCE" and hangs[0].timeout_ms == 600000
        stalled_advances = len(view.advances)

        # 3. Resume: new advances above the old maximum, progressing again.
        resume.touch()
        timings["resumed after"] = w.until(
            "a new advance after resuming", lambda: (w.view().last_step or 0) > PHASE1, timeout=20)
        view = w.view()
        assert len(view.advances) > stalled_advances
        assert _now() - view.advances[-1].at <= view.window

        # 4. The job ends: SUCCEEDED, with every step counted once.
        timings["succeeded after"] = w.until(
            "the job succeeds", lambda: w.runtime is not None and w.runtime.job_status == "SUCCEEDED", timeout=30)
        w.until("the final step", lambda: w.view().last_step == PHASE1 + PHASE2, timeout=12)
        assert w.statuses[-1] == "SUCCEEDED" and "RUNNING" in w.statuses
        assert w.statuses.index("RUNNING") < w.statuses.index("SUCCEEDED")
        assert w.view().replayed == 0
    finally:
        resume.touch()
        ray_head.stop_job(sid)
    print(f"\nray head started in {ray_head.started_in:.1f}s; " +
          "; ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


def test_head_shapes(ray_head: RayHeadServer) -> None:
    head = RayHead(ray_head.dashboard_url, ray_head.metrics_url)
    assert head.alive_nodes() == 1
    families = head.metrics()
    assert any(f.name.startswith("ray_") for f in families)
    for job in head.jobs():
        assert job.submission_id.startswith("raysubmit_") and job.type == "SUBMISSION"
        assert job.start_time is not None and job.start_time.tzinfo is not None


class _Bad(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/cut":  # declares more than it sends, then closes
            body = b'# TYPE ray_train_steps_total counter\nray_train_steps_total{WorkerId="a"} 5.0\n'
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body) + 500))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        body = b'ray_train_steps_total{WorkerId="a} 5\x00\x01garbage\n'  # truncated label, junk
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def bad_metrics() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Bad)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("which", ["html", "garbage", "cut"])
def test_garbage_metrics_give_a_diagnostic_and_no_samples(
        ray_head: RayHeadServer, bad_metrics: str, which: str) -> None:
    url = {"html": f"{ray_head.dashboard_url}/", "garbage": f"{bad_metrics}/metrics",
           "cut": f"{bad_metrics}/cut"}[which]
    expect = {"html": "not Prometheus text exposition (Content-Type text/html)",
              "garbage": "not Prometheus text", "cut": "body cut"}[which]
    poller = RayPoller()
    target = RayTarget(Ref("RayCluster", "default", f"bad-{which}"), ray_head.dashboard_url, url)
    for _ in range(2):
        [(_, runtime, sig)] = poller.poll([target], _now())
        assert runtime.error == "" and runtime.alive_nodes == 1  # the head itself is fine
        assert sig is not None
        assert sig.scan.samples == () and sig.scan.format is None
        assert any(expect in d for d in sig.scan.diagnostics), sig.scan.diagnostics
        assert analyze([sig], SETTINGS).advances == ()


def test_unreachable_head_fails_closed() -> None:
    poller = RayPoller(connect_timeout=0.5)
    port = free_port()  # nothing listens there
    target = RayTarget(Ref("RayCluster", "default", "gone"), f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics")
    now = _now()
    [(_, runtime, sig)] = poller.poll([target], now)
    assert sig is None and runtime.alive_nodes is None and runtime.job_status == ""
    assert f"http://127.0.0.1:{port}" in runtime.error
    [(_, again, sig)] = poller.poll([target], now + timedelta(seconds=0.5))
    assert sig is None and "next try in" in again.error  # backing off, not hammering a dead head


def test_worker_node_metrics_are_summed_with_the_head(ray_head: RayHeadServer) -> None:
    """KubeRay workers export their own metrics: the counter is the sum over head and workers."""
    from tests.dumpkit import fixture_path

    # A real Ray worker node's /metrics scrape, plus the training counter a worker would export.
    body = fixture_path("metrics/ray_worker_node_metrics_datadog_fixture_head16k.txt").read_bytes()
    count = {"value": 40}

    class Worker(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            return

        def do_GET(self) -> None:  # noqa: N802
            extra = (f'ray_train_steps_total{{WorkerId="w1",SessionName="s"}} {count["value"]}.0\n').encode()
            data = body + extra
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    target = RayTarget(Ref("RayCluster", "default", "with-workers"), ray_head.dashboard_url,
                       ray_head.metrics_url, worker_metrics_urls=(worker,))
    poller = RayPoller()
    # The head's own series: earlier jobs of this module may have left a count there (Ray keeps
    # counter series until the node restarts), and no job runs now, so it holds still.
    head_only = RayTarget(Ref("RayCluster", "default", "head-only"), ray_head.dashboard_url, ray_head.metrics_url)
    [(_, _, sig)] = RayPoller().poll([head_only], _now())
    head = sig.scan.samples[-1].step if sig is not None and sig.scan.samples else 0
    try:
        [(_, runtime, sig)] = poller.poll([target], _now())
        assert runtime.error == "" and sig is not None
        assert [s.step for s in sig.scan.samples] == [head + 40]
        count["value"] = 45
        [(_, _, sig)] = poller.poll([target], _now())
        assert sig is not None and [s.step for s in sig.scan.samples] == [head + 40, head + 45]
    finally:
        server.shutdown()
        server.server_close()
    # One node unreachable: no sample this round (a partial sum would read as a counter reset).
    [(_, runtime, sig)] = poller.poll([target], _now())
    assert runtime.error == "" and sig is not None and sig.scan.samples == ()
    assert any(worker in d for d in sig.scan.diagnostics)
