"""The simulator's `Date` header is its scenario clock, and the `controller` process evaluates on it:
against a simulator sped up 30×, a stall is judged at its scenario time and a healthy run is not
taken for stale (issue 9, clock skew). The controller is a real process, as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from collector.controller import Controller
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.clock import ManualClock
from kubesim.run import start_simulation
from kubesim.server import Simulator
from tests.controller.test_controller import settings, wait_until
from tests.faults.test_process_faults import _free_port

SPEED = 30.0

# Two one-pod runs training every 10 s; `stuck` stops logging at scenario 60 s while its pod stays
# Running. Stall window: max(3 × 10 s, 60 s floor) + 15 s scrape = 75 s, so it is stalled from ~135 s.
SCENARIO = """
name: clock
seed: 3
cluster:
  namespaces: [research]
  nodes:
    - {name: gpu, count: 2, pool: gpua100, gpus: 8}
  flavors: [a100]
  clusterQueues: [{name: cq, flavor: a100, gpus: 16}]
  localQueues: [{name: lq, namespace: research, clusterQueue: cq}]
  profiles: [{name: p, localQueue: lq, clusterQueue: cq, flavors: [a100], workers: 1, gpusPerWorker: 8}]
runs:
  - name: healthy
    namespace: research
    profile: p
    timeline:
      - {at: 1s, admit: {}}
      - {at: 2s, schedule: {}}
      - {at: 3s, start: {}}
      - {at: 5s, train: {every: 10s}}
  - name: stuck
    namespace: research
    profile: p
    timeline:
      - {at: 1s, admit: {}}
      - {at: 2s, schedule: {}}
      - {at: 3s, start: {}}
      - {at: 5s, train: {every: 10s}}
      - {at: 60s, stall: {}}
"""


def test_date_header_is_the_scenario_clock_on_every_answer() -> None:
    clock = ManualClock(datetime(2026, 1, 10, 10, 0, tzinfo=UTC))
    with Simulator(clock=clock) as s:
        s.start()
        api = k8s.ApiClient(k8s.Configuration(host=s.base_url))
        core = k8s.CoreV1Api(api)
        _, _, headers = core.list_namespace_with_http_info()
        assert parsedate_to_datetime(headers["Date"]) == datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
        clock.advance(3600)
        # Errors and watch streams carry it too (a watch's headers go out before any event).
        with urllib.request.urlopen(f"{s.base_url}/api/v1/pods?watch=true&timeoutSeconds=1", timeout=10) as r:
            assert r.headers["Transfer-Encoding"] == "chunked"
            assert parsedate_to_datetime(r.headers["Date"]) == datetime(2026, 1, 10, 11, 0, tzinfo=UTC)
        try:
            urllib.request.urlopen(f"{s.base_url}/api/v1/namespaces/nope", timeout=10)
        except urllib.error.HTTPError as e:
            assert e.code == 404
            assert parsedate_to_datetime(e.headers["Date"]) == datetime(2026, 1, 10, 11, 0, tzinfo=UTC)
        api.close()


def _metrics(port: int) -> dict[str, dict[tuple[str, ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            key = tuple(f"{k}={v}" for k, v in sorted(smp.labels.items()) if k in ("run", "claim", "observed"))
            out.setdefault(smp.name, {})[key] = smp.value
    return out


def _observed(m: dict[str, dict[tuple[str, ...], float]], run: str, claim: str) -> str | None:
    for key, v in m.get("taugrid_run_claim_state", {}).items():
        if v == 1.0 and f"run={run}" in key and f"claim={claim}" in key:
            return next(k.split("=", 1)[1] for k in key if k.startswith("observed="))
    return None


def test_controller_process_evaluates_on_a_sped_up_simulators_clock(tmp_path: Path) -> None:
    scenario = tmp_path / "clock.yaml"
    scenario.write_text(SCENARIO)
    cfg = tmp_path / "config.yaml"
    # Log polls every second: each read also brings the server's Date, so the controller's clock
    # follows a server that runs 30× faster than its own host. (Every pass: with the settled-run skip,
    # reads are too rare for a clock that moves 30 s a second before its rate is measured, 10 s in; a
    # node Lease seen between two Dates then measures its node's clock a minute ahead, and its steps
    # are placed a minute early.)
    cfg.write_text("controller:\n  leader_election: false\n  log_poll_interval: 1s\n  ray_poll_interval: 0\n"
                   "  checkpoint_poll_interval: 0\n  tick: 1s\n  log_skip_settled: false\n")
    port = _free_port()
    with start_simulation(scenario, speed=SPEED, kubeconfig=tmp_path / "kubeconfig") as session:
        clock = session.engine.clock
        origin = session.engine.origin
        code = "from collector.entry import main; main()"
        proc = subprocess.Popen([sys.executable, "-c", code, "controller", "--kubeconfig", str(session.kubeconfig),
                                 "--config", str(cfg), "--metrics-address", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).resolve().parents[2])
        # The same evaluation in process, on the same kind of clock (the API's Date), to read reasons.
        api = KubeApi(api_client_for(session.base_url))
        ref = Controller(api, settings(log_poll_interval=timedelta(seconds=1), log_skip_settled=False), api.clock.now)
        ref.open()
        try:
            def scraped() -> dict[str, dict[tuple[str, ...], float]]:
                try:
                    return _metrics(port)
                except OSError:
                    return {}

            wait_until(lambda: _observed(scraped(), "stuck", "progressing") == "false", timeout=40,
                       what="the stalled run judged stalled")
            scenario_s = (clock.now() - origin).total_seconds()
            m = scraped()
            since = max(v for k, v in m["taugrid_run_claim_since_timestamp_seconds"].items()
                        if "run=stuck" in k and "claim=progressing" in k)
            # Not before its last step (scenario ~55 s, earlier where a loaded host made the simulator
            # write late) plus the 60 s floor of the stall window, on the scenario's clock.
            last_s = since - origin.timestamp()
            assert scenario_s >= last_s + 60, f"stalled at scenario {scenario_s:.0f} s, last step at {last_s:.0f} s"
            assert _observed(m, "healthy", "progressing") == "true"  # fresh, not stale or unknown
            assert _observed(m, "healthy", "running") == "true"
            # Evaluated on the server's (scenario) clock: minutes ahead of this host's by now.
            evaluated = max(v for k, v in m["taugrid_run_evaluated_timestamp_seconds"].items() if "run=stuck" in k)
            host_now = datetime.now(UTC).timestamp()
            # Minutes past this host's clock (it could not have produced that), never past the server's.
            assert host_now + 30 < evaluated <= clock.now().timestamp() + 2, (host_now, evaluated, clock.now())
            assert (origin + timedelta(seconds=30)).timestamp() <= since <= clock.now().timestamp()

            wait_until(lambda: next((r.progressing.reason for r in ref.claims.values() if r.ref.name == "stuck"),
                                    "").startswith("STALLED"), timeout=20, what="the in-process reason")
            stuck = next(r for r in ref.claims.values() if r.ref.name == "stuck")
            assert stuck.progressing.observed.value == "false"
            healthy = next(r for r in ref.claims.values() if r.ref.name == "healthy")
            assert healthy.progressing.observed.value == "true", healthy.progressing.reason
        finally:
            ref.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
