"""A real Prometheus server for tests: Debian's `prometheus` binary on loopback, its own data dir.

    with PromServer.start(["127.0.0.1:9100"], workdir=tmp_path) as prom:
        prom.wait_for('taugrid_run_claim_state{claim="running"}', lambda r: len(r) == 1)

or, from a conftest, the `prometheus_server` fixture factory below (servers stop at teardown).
A missing binary FAILS the test (CI installs the package; skipping would hide a broken setup).
Prometheus applies new targets only every ~5 s, so the first sample arrives ~5.5 s after start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.netutil import free_port, stop_process  # noqa: E402

INSTALL_HINT = "apt-get update && apt-get install -y --no-install-recommends prometheus"

Result = list[dict[str, Any]]


def find_binary(binary: str | None = None) -> str:
    """The prometheus executable, or pytest.fail saying how to install it."""
    path = shutil.which(binary or "prometheus")
    if path is None:
        pytest.fail(
            f"the `prometheus` binary was not found on PATH ({binary or 'prometheus'}); "
            f"real-Prometheus tests need it: {INSTALL_HINT}",
            pytrace=False,
        )
    return path




def _config(targets: Sequence[str], interval: str, honor_labels: bool, rule_files: Sequence[Path] = ()) -> str:
    # JSON is valid YAML: no YAML library needed, and quoting is exact.
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "taugrid",
                "honor_labels": honor_labels,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    if rule_files:
        cfg["rule_files"] = [str(p) for p in rule_files]
    return json.dumps(cfg, indent=2)


class PromServer:
    """One running Prometheus process. Use `start`; stop with `stop()` or a `with` block."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, workdir: Path, config: Path, log: Path):
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.config = config
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def start(
        cls,
        targets: Sequence[str],
        workdir: Path,
        *,
        scrape_interval: str = "1s",
        honor_labels: bool = True,
        binary: str | None = None,
        ready_timeout: float = 20.0,
        rule_files: Sequence[Path] = (),
    ) -> PromServer:
        """Start Prometheus scraping `targets` ("host:port", path /metrics) and wait until ready;
        `rule_files` are loaded and evaluated every `scrape_interval`."""
        exe = find_binary(binary)
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(_config(targets, scrape_interval, honor_labels, rule_files))
        last_error = ""
        # The free port can be taken between probing and binding: retry with another.
        for attempt in range(3):
            port = free_port()
            log = workdir / f"prometheus-{attempt}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        exe,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / f'data-{attempt}'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--web.enable-lifecycle",
                        "--log.level=warn",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            server = cls(proc, port, workdir, config, log)
            if server._wait_ready(ready_timeout):
                return server
            server.stop()
            last_error = log.read_text(errors="replace")[-2000:]
        pytest.fail(f"prometheus did not become ready; last log:\n{last_error}", pytrace=False)

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    # --- HTTP API ---------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry Prometheus's error text
            with e:
                body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> Result:
        """Instant query: the result list (`[{"metric": {...}, "value": [t, "v"]}, ...]`)."""
        data = self._get("/api/v1/query", {"query": promql})
        result: Result = data["result"] if data["resultType"] in ("vector", "matrix") else [data]
        return result

    def alerts(self) -> Result:
        """The pending and firing alerts (`/api/v1/alerts`): labels, annotations, state, activeAt."""
        active: Result = self._get("/api/v1/alerts")["alerts"]
        return active

    def targets(self) -> Result:
        active: Result = self._get("/api/v1/targets")["activeTargets"]
        return active

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[Result], bool] = bool,
        timeout: float = 15.0,
        interval: float = 0.25,
    ) -> Result:
        """Poll `promql` until `predicate(result)` holds; AssertionError with the details if not."""
        deadline = time.monotonic() + timeout
        result: Result = []
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                break
            time.sleep(interval)
        health = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in self.targets()]
        raise AssertionError(
            f"after {timeout}s, {promql!r} gave {result!r}, which the predicate refused; targets: {health}"
        )

    def reload(
        self, targets: Sequence[str], *, scrape_interval: str = "1s", honor_labels: bool = True
    ) -> None:
        """Replace the scraped targets (lifecycle API); they apply within ~5 s."""
        self.config.write_text(_config(targets, scrape_interval, honor_labels))
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise RuntimeError(f"reload failed: HTTP {r.status}")

    # --- lifecycle --------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM this process by its id, SIGKILL if it lingers."""
        stop_process(self.proc, timeout)

    def __enter__(self) -> PromServer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


StartPrometheus = Callable[..., PromServer]


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[StartPrometheus]:
    """Factory fixture: `prom = prometheus_server(["127.0.0.1:PORT"])`; every server stops at teardown.

    Make it visible with `from promserver import prometheus_server` in a conftest.py.
    """
    started: list[PromServer] = []

    def start(targets: Sequence[str], **kwargs: Any) -> PromServer:
        server = PromServer.start(targets, tmp_path / f"prometheus-{len(started)}", **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
