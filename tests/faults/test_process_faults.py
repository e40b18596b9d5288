"""The `controller` process: signals while the API never answers, a malformed kubeconfig, and the
API server's clock (its Date header)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from collector.controller import Controller
from collector.sources.kube_api import KubeApi, ServerClock, api_client_for
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, settings, wait_until
from tests.faults.streams import claim_rows, sink, stream_problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    p = tmp_path / "kubeconfig"
    p.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return p


def _controller(kubeconfig: Path, *extra: str) -> subprocess.Popen[str]:
    code = "from collector.entry import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, "controller", "--kubeconfig", str(kubeconfig),
                             "--metrics-address", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_controller_whose_api_never_answers(tmp_path: Path, sig: signal.Signals) -> None:
    kc = _kubeconfig(tmp_path, f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    proc = _controller(kc)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        seen = ""
        while "discovery failed" not in seen:  # it is up, retrying discovery
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, f"controller never tried the API: {seen[-2000:]}"
            seen += line
        # Bounded: the controller's own shutdown, from the signal to its "stopped" line (everything
        # closed). The interpreter's teardown after it (module finalization, ~0.2 s of CPU: 1.1 s
        # measured with a fifth of a core) is not the controller's and is bounded only loosely.
        t0 = time.monotonic()
        proc.send_signal(sig)
        took = None
        for line in proc.stdout:
            seen += line
            if '"stopped"' in line:
                took = time.monotonic() - t0
                break
        assert took is not None, f"{sig.name}: no 'stopped' line: {seen[-2000:]}"
        assert took <= 2.0, f"{sig.name}: stopped after {took:.2f} s"
        proc.stdout.read()
        proc.wait(timeout=10)
        assert proc.returncode == 0, seen[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("text", [
    "clusters: [\n  - {name: c\n",  # broken YAML
    "clusters: 5\ncontexts: 7\ncurrent-context: x\n",  # wrong shapes
    "- just\n- a list\n",
])
def test_malformed_kubeconfig_is_one_clear_line(tmp_path: Path, text: str) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(text)
    proc = _controller(kc)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert "Traceback" not in out, out
    assert len(lines) == 1 and "kubeconfig" in lines[0], out


def test_server_clock_follows_the_date_header() -> None:
    local = datetime(2026, 1, 10, 12, 0, 0, 300_000, tzinfo=UTC)
    clock = ServerClock(lambda: local)
    clock.observe("Sat, 10 Jan 2026 12:07:00 GMT")  # the API server is 7 minutes ahead
    assert abs((clock.now() - (local + timedelta(minutes=7))).total_seconds()) <= 1.0
    clock.observe("Sat, 10 Jan 2026 12:00:00 GMT")  # within the header's resolution: no skew
    assert clock.now() == local
    clock.observe("not a date")  # ignored, not a crash
    assert clock.now() == local


def test_kube_api_reads_the_servers_date() -> None:
    with Simulator() as s:
        s.start()
        api = KubeApi(api_client_for(s.base_url))
        api.get_json("/api/v1")
        assert api.clock.seen
        # The simulator's Date is its scenario clock; Simulator() plays on the host's: no skew here.
        # (tests/faults/test_server_clock.py has a sped-up and a manual one.)
        assert abs((api.clock.now() - datetime.now(UTC)).total_seconds()) < 2


def _observed(port: int) -> dict[tuple[str, str, str], str]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "taugrid_run_claim_state":
            for s in fam.samples:
                if s.value == 1.0:
                    out[(s.labels["namespace"], s.labels["run"], s.labels["claim"])] = s.labels["observed"]
    return out


class _KillRig:
    """A `controller` process exporting to one store and spool (started, killed and restarted by the
    test), beside the uninterrupted reference: an in-process controller on the same cluster, on the
    API server's clock as the process is, exporting to its own store."""

    CONFIG = ("controller:\n  leader_election: false\n  log_poll_interval: 0\n  ray_poll_interval: 0\n"
              "  checkpoint_poll_interval: 0\n  tick: 1s\n")

    def __init__(self, tmp_path: Path, sim: Simulator) -> None:
        self.tmp_path = tmp_path
        self.cfg = tmp_path / "config.yaml"
        self.cfg.write_text(self.CONFIG)
        self.store = tmp_path / "evidence.duckdb"
        self.kubeconfig = _kubeconfig(tmp_path, sim.base_url)
        self.port = _free_port()
        api = KubeApi(api_client_for(sim.base_url))
        self.ref_sink = sink(tmp_path / "reference")
        self.ref = Controller(api, settings(), api.clock.now, sink=self.ref_sink)
        self.ref.open()
        # Synced before the process is compared with it: a reference that agrees from a partial view
        # exports nothing until synced, then the state it has then as first rows (a transition the
        # test waits for would be missing from its stream).
        wait_until(self.ref.ready.is_set, what="reference synced")
        self.proc: subprocess.Popen[str] | None = None

    def reference(self) -> dict[tuple[str, str, str], str]:
        return {(r.ref.namespace, r.ref.name, k): c.observed.value
                for r in self.ref.claims.values() for k, c in r.claims.items()}

    def agrees(self) -> bool:
        return bool(_safe(self.port)) and _safe(self.port) == self.reference()

    def spawn(self) -> None:
        self.proc = _controller(self.kubeconfig, "--config", str(self.cfg), "--metrics-address",
                                f"127.0.0.1:{self.port}", "--export-store", str(self.store))

    def kill(self, clock: Clock) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        # Time passes while it is dead: on a clock that stood still, both processes would stamp their
        # rows at the same instant give or take each one's Date offset, and the streams are read in
        # Timestamp order (the restarted one's transition could sort before the first one's rows).
        clock.advance(5)

    def close(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Stop the process (its store is read next: let it close) and the reference; the claim
        transitions each exported."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.ref.close()
        self.ref_sink.close()
        return claim_rows(self.store), claim_rows(self.tmp_path / "reference" / "store.duckdb")


def test_sigkilled_controller_restarts_to_the_claims_of_an_uninterrupted_one(tmp_path: Path) -> None:
    """Claims and the exported claim transitions (tests/faults/streams.py) after a SIGKILL and a
    restart on the same store and spool equal those of a controller that ran throughout."""
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        apply_run(s, "other", ns="team-b")
        rig = _KillRig(tmp_path, s)
        try:
            rig.spawn()
            wait_until(rig.agrees, timeout=60, what="first process agrees with the reference")
            rig.kill(clock)
            apply_run(s, "llm", crash=True)  # the cluster moves on while the controller is dead
            wait_until(lambda: rig.reference().get(("research", "llm", "running")) == "false",
                       what="reference sees it")
            rig.spawn()
            wait_until(lambda: _safe(rig.port) == rig.reference(), timeout=60, what="restarted process agrees")
            assert _safe(rig.port)[("research", "llm", "running")] == "false"
        finally:
            rows, want = rig.close()
    seen = sorted((r["Timestamp"], r["Run"], r["Claim"], r["PreviousVerdict"], r["Verdict"]) for r in want)
    assert ("llm", "running", "verified", "contradicted") in {t[1:] for t in seen}, seen
    assert stream_problems(rows, want) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkilled_at_random_points_restarts_to_the_uninterrupted_stream(tmp_path: Path, seed: int) -> None:
    """SIGKILL at seeded random moments, each time restarted on the same store and spool: during
    start-up and listing, and just after the cluster changed (mid evaluation or export). The claims,
    and the exported claim transitions taken together, equal an uninterrupted controller's.

    The cluster changes only while a process runs and agreed with the reference before the change: a
    state that comes and goes while no process runs is seen by none, and is not a lost transition.
    The test clock moves on while a process is dead, as time does: standing still, rows of two
    processes would carry the same instant and their order would be undefined."""
    rng = random.Random(seed)
    clock = Clock(T0)
    points: list[str] = []
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        for i in range(6):
            apply_run(s, f"run-{i}", ns=f"team-{i % 2}")
        rig = _KillRig(tmp_path, s)
        try:
            rig.spawn()
            for n in range(3):
                after = rng.uniform(0.0, 4.0)  # start-up, discovery, listing, the first export
                time.sleep(after)
                rig.kill(clock)
                points.append(f"{after:.2f} s after start")
                rig.spawn()
                wait_until(rig.agrees, timeout=90, what=f"agreement after the kill at {points[-1]}")
                run = rng.randrange(6)
                key, crash = (f"team-{run % 2}", f"run-{run}", "running"), n % 2 == 0
                apply_run(s, f"run-{run}", ns=f"team-{run % 2}", crash=crash)  # the cluster moves
                want = "false" if crash else "true"
                wait_until(lambda k=key, w=want: rig.reference().get(k) == w,  # type: ignore[misc]
                           what="the reference sees the change")
                after = rng.uniform(0.0, 1.5)  # mid evaluation and export of that change
                time.sleep(after)
                rig.kill(clock)
                points.append(f"{after:.2f} s after a change")
                rig.spawn()
            wait_until(rig.agrees, timeout=90, what=f"the process killed at {points} agrees with the reference")
        finally:
            rows, want = rig.close()
    assert want and rows
    problems = stream_problems(rows, want)
    assert problems == [], f"killed at {points}:\n" + "\n".join(problems)


def _safe(port: int) -> dict[tuple[str, str, str], str]:
    try:
        return _observed(port)
    except OSError:
        return {}


def test_server_clock_follows_a_server_running_fast() -> None:
    """A simulator playing its scenario at 10x: after Dates spanning 10 s, now() runs at 10x between
    answers instead of lagging until the next one; a server at rate 1 keeps the plain offset."""
    local = [datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC)]
    server0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)
    clock = ServerClock(lambda: local[0])

    def answer(real_s: float) -> None:
        local[0] = datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=real_s)
        clock.observe(format_datetime(server0 + timedelta(seconds=10 * real_s), usegmt=True))

    for t in range(0, 12):
        answer(t)
    assert abs(clock.rate - 10.0) < 0.2
    local[0] += timedelta(seconds=3)  # no answer for 3 s: the server is now 30 s further
    expected = server0 + timedelta(seconds=10 * 14)
    assert abs((clock.now() - expected).total_seconds()) <= 1.0
    answer(14.05)  # a truncated Date a little behind now(): now() does not step back
    assert clock.now() >= expected - timedelta(seconds=1)

    steady = ServerClock(lambda: local[0])
    for t in range(0, 30, 3):
        local[0] = datetime(2026, 1, 10, 12, 0, 0, 900_000, tzinfo=UTC) + timedelta(seconds=t)
        steady.observe(format_datetime(datetime(2026, 1, 10, 12, 7, 0, tzinfo=UTC) + timedelta(seconds=t),
                                       usegmt=True))
    assert steady.rate == 1.0
    assert abs((steady.now() - (local[0] + timedelta(minutes=7))).total_seconds()) <= 1.0
