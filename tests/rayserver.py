"""A real local Ray head for tests: `ray start --head --block` on loopback, its own temp dir.

    with RayHeadServer.start(tmp_path) as head:
        sid = head.submit(f"{sys.executable} job.py")
        head.wait_job(sid, {"SUCCEEDED"})

or the module-scoped `ray_head` fixture below (one head shared by a module's tests). Settings
follow ../shared/TOOLS.md: every listener on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0),
token auth explicitly off (RAY_AUTH_MODE=disabled, so no ~/.ray/auth_token is used or written),
metrics reported every 5 s, all ports chosen free (the metrics port from the ephemeral range, so
outside Ray's worker ports 10002–19999), a short --temp-dir (unix sockets ≤ 107 chars).
It is stopped by process id: SIGTERM to `ray start --block` (which drains and stops its children),
then SIGKILL to any descendant still alive. Never `ray stop`: it kills every Ray on the machine.
A head that does not start FAILS the test with the log tails; it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.netutil import free_port as _free_port

RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # bind and advertise 127.0.0.1, not 0.0.0.0
    "RAY_AUTH_MODE": "disabled",  # explicit: unset + an existing ~/.ray/auth_token turns token auth on
    "RAY_metrics_report_interval_ms": "5000",  # a custom metric shows ~5 s after it changes
    "RAY_USAGE_STATS_ENABLED": "0",
}
WORKER_PORTS = range(10002, 20000)  # Ray's default worker port range: keep our fixed ports out of it
SOCKET_MAX = 107  # AF_UNIX path limit
# <temp>/session_YYYY-MM-DD_HH-MM-SS_ffffff_PID/sockets/plasma_store: Ray adds ~60 characters.
TEMP_DIR_MAX = SOCKET_MAX - 64


def free_port() -> int:
    return _free_port(avoid=WORKER_PORTS)


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) from /proc, or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> list[tuple[int, int]]:
    """Every process below `root` as (pid, start time), parents before children."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append((int(entry), st[1]))
    out: list[tuple[int, int]] = []
    todo = [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid[0])
    return out


def _alive(pid: int, started: int) -> bool:
    st = _proc_stat(pid)
    if st is None:
        return False
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return st[1] == started and state != "Z"


class RayHeadServer:
    """One running Ray head. Use `start`; stop with `stop()` or a `with` block."""

    def __init__(self, proc: subprocess.Popen[bytes], workdir: Path, temp_dir: Path, log: Path,
                 ports: dict[str, int], owned_temp: bool) -> None:
        self.proc = proc
        self.workdir = workdir
        self.temp_dir = temp_dir
        self.log = log
        self.ports = ports
        self._owned_temp = owned_temp
        self.dashboard_url = f"http://127.0.0.1:{ports['dashboard']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        self.gcs_address = f"127.0.0.1:{ports['gcs']}"
        self.started_in: float = 0.0

    @classmethod
    def start(cls, workdir: Path, *, num_cpus: int = 2, ready_timeout: float = 60.0,
              attempts: int = 2) -> RayHeadServer:
        exe = Path(sys.executable).with_name("ray")
        if not exe.exists():
            pytest.fail(f"`ray` CLI not found next to {sys.executable}: install the dev extra "
                        "(pip install -e '.[dev]', which includes ray[default])", pytrace=False)
        workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for attempt in range(attempts):
            temp_dir, owned = cls._temp_dir(workdir, attempt)
            ports = {name: free_port() for name in (
                "gcs", "dashboard", "metrics", "client", "agent_http", "agent_grpc", "runtime_env",
                "node_manager", "object_manager")}
            log = workdir / f"ray-start-{attempt}.log"
            env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
            env.update(RAY_ENV)
            cmd = [
                str(exe), "start", "--head", "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={ports['gcs']}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={ports['dashboard']}",
                f"--metrics-export-port={ports['metrics']}",
                f"--ray-client-server-port={ports['client']}",
                f"--dashboard-agent-listen-port={ports['agent_http']}",
                f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
                f"--runtime-env-agent-port={ports['runtime_env']}",
                f"--node-manager-port={ports['node_manager']}",
                f"--object-manager-port={ports['object_manager']}",
                f"--num-cpus={num_cpus}",
                "--object-store-memory=100000000",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
            ]
            t0 = time.monotonic()
            with log.open("wb") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=workdir)
            server = cls(proc, workdir, temp_dir, log, ports, owned)
            why = server._wait_ready(ready_timeout)
            if not why:
                server.started_in = time.monotonic() - t0
                return server
            last = f"attempt {attempt + 1}: {why}\n{server.log_tail()}"
            server.stop()
        pytest.fail(f"the Ray head did not become ready:\n{last}", pytrace=False)

    @staticmethod
    def _temp_dir(workdir: Path, attempt: int) -> tuple[Path, bool]:
        candidate = workdir / f"r{attempt}"
        if len(str(candidate)) <= TEMP_DIR_MAX:
            candidate.mkdir(parents=True, exist_ok=True)
            return candidate, False
        # The test's tmp dir is too deep for unix socket paths: a short one, removed at stop.
        return Path(tempfile.mkdtemp(prefix="tgray", dir="/tmp")), True

    def _get_json(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(self.dashboard_url + path, timeout=timeout) as r:
            return json.load(r)

    def _wait_ready(self, timeout: float) -> str:
        """"" when the dashboard, the state API (one ALIVE node) and the metrics endpoint answer."""
        deadline = time.monotonic() + timeout
        step = "dashboard /api/version"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"`ray start` exited with {self.proc.returncode} while waiting for {step}"
            try:
                step = "dashboard /api/version"
                self._get_json("/api/version", 2)
                step = "an ALIVE node in /api/v0/nodes"
                nodes = self._get_json("/api/v0/nodes", 5)["data"]["result"]["result"]
                if not any(n.get("state") == "ALIVE" for n in nodes):
                    raise ValueError("no ALIVE node yet")
                step = "the metrics endpoint"
                with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                    r.read()
                step = "the Jobs API"
                self._get_json("/api/jobs/", 5)
                return ""
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError, TypeError):
                time.sleep(0.2)
        return f"not ready after {timeout:.0f}s: waiting for {step}"

    # --- Jobs API (the test side; the collector has its own client) ------------------------------

    def submit(self, entrypoint: str, *, submission_id: str | None = None, timeout: float = 30.0) -> str:
        body: dict[str, Any] = {"entrypoint": entrypoint}
        if submission_id:
            body["submission_id"] = submission_id
        deadline = time.monotonic() + timeout
        while True:
            req = urllib.request.Request(self.dashboard_url + "/api/jobs/", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return str(json.load(r)["submission_id"])
            except urllib.error.HTTPError as e:
                text = e.read().decode(errors="replace")[:500]
                e.close()
                if e.code < 500 or time.monotonic() > deadline:  # 5xx: the job agent may still be starting
                    raise AssertionError(f"job submission failed: HTTP {e.code}: {text}") from e
            time.sleep(0.5)

    def job(self, submission_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self._get_json(f"/api/jobs/{submission_id}")
        return doc

    def job_logs(self, submission_id: str) -> str:
        return str(self._get_json(f"/api/jobs/{submission_id}/logs")["logs"])

    def stop_job(self, submission_id: str) -> None:
        req = urllib.request.Request(f"{self.dashboard_url}/api/jobs/{submission_id}/stop", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10):
                pass
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass

    def wait_job(self, submission_id: str, statuses: set[str], timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = self.job(submission_id)
            if doc.get("status") in statuses:
                return doc
            time.sleep(0.25)
        raise AssertionError(f"job {submission_id} not in {statuses} after {timeout}s: {doc}\n"
                             f"logs:\n{self.job_logs(submission_id)[-3000:]}")

    # --- diagnostics and lifecycle ---------------------------------------------------------------

    def log_tail(self, chars: int = 3000) -> str:
        parts = [f"--- {self.log.name}\n{self.log.read_text(errors='replace')[-chars:]}"] if self.log.exists() else []
        logs = self.temp_dir / "session_latest" / "logs"
        for name in ("dashboard.log", "raylet.out", "gcs_server.out", "dashboard_agent.log"):
            path = logs / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-chars // 2:]}")
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM `ray start --block` by its id (it drains and stops its children), then SIGKILL
        whatever of its process tree is still alive."""
        tree = descendants(self.proc.pid)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_alive(pid, t) for pid, t in tree):
            time.sleep(0.1)
        for pid, started in tree:
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self._owned_temp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayHeadServer:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHeadServer]:
    """One real Ray head shared by a module's tests; stopped by process id at module teardown.

    Make it visible with `from tests.rayserver import ray_head` in a conftest.py.
    """
    server = RayHeadServer.start(tmp_path_factory.mktemp("ray", numbered=True))
    try:
        yield server
    finally:
        server.stop()
