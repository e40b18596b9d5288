"""An API outage against the `controller` process with leader election on (issue 26).

`test_api_faults.py::test_outage_readyz_unknown_with_cause_then_recovery` runs an in-process
controller with leader election off and an evidence bound of 2 s: it shows claims turning unknown
with the outage as their reason and `/readyz` 503 once that bound passes. It cannot show what an
outage does to a leader: the Lease can no longer be renewed, the replica stops leading, and (before
this issue) withdrew every run's series within seconds, while `/readyz` answered 200 until the
evidence bound (5 minutes by default) passed. Here the controller is its own process, with the
default evidence bound, against the simulator with every request dropped.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kubesim.server import Simulator
from tests.controller.test_controller import FAST, apply_run, ensure_namespaces, wait_until
from tests.faults.test_process_faults import _controller, _free_port, _kubeconfig

LEASE_S, RENEW_S = 4.0, 0.5
CONFIG = ("controller:\n  leader_election: true\n  lease_namespace: default\n"
          f"  lease_duration: {LEASE_S}s\n  lease_renew: {RENEW_S}s\n"
          "  log_poll_interval: 0\n  ray_poll_interval: 0\n  checkpoint_poll_interval: 0\n"
          "  tick: 1s\n  watch_timeout_s: 5\n")  # watches open before the outage end within 5 s
RUNS = (("research", "llm"), ("team-b", "other"))
CLAIMS = ("scheduled", "running", "progressing")


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except (OSError, http.client.HTTPException):
        return 0, ""


def _samples(port: int, name: str) -> list[tuple[dict[str, str], float]]:
    _, text = _get(port, "/metrics")
    return [(dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def _observed(port: int) -> dict[tuple[str, str, str], str]:
    return {(lb["namespace"], lb["run"], lb["claim"]): lb["observed"]
            for lb, v in _samples(port, "taugrid_run_claim_state") if v == 1.0}


def _leads(port: int) -> bool:
    return any(v == 1.0 for _, v in _samples(port, "taugrid_collector_leader"))


def _failing(port: int) -> set[str]:
    return {lb["source"] for lb, _ in _samples(port, "taugrid_collector_source_failing_since_timestamp_seconds")}


def test_api_outage_keeps_every_run_exported_unknown_and_readyz_says_why(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    port = _free_port()
    with Simulator(settings=FAST, watch_window=50) as s:
        s.start()
        ensure_namespaces(s, "default")
        for ns, name in RUNS:
            apply_run(s, name, ns=ns)
        proc = _controller(_kubeconfig(tmp_path, s.base_url), "--config", str(cfg), "--metrics-address",
                           f"127.0.0.1:{port}")
        try:
            healthy = {(ns, name, "running"): "true" for ns, name in RUNS}
            wait_until(lambda: _leads(port) and healthy.items() <= _observed(port).items(), timeout=90,
                       what="leading, both runs running")
            wait_until(lambda: _get(port, "/readyz")[0] == 200, what="/readyz 200")
            assert _failing(port) == set()

            s.faults.drop(count=None)  # the API server stops answering: every request, every watch
            s.faults.drop_watch(count=None)
            wait_until(lambda: not _leads(port), timeout=30, what="the Lease lost (it cannot be renewed)")
            time.sleep(2 * LEASE_S)  # well past the Lease's duration: no replica can hold it now
            unknown = {(ns, name, claim): "unknown" for ns, name in RUNS for claim in CLAIMS}
            assert _observed(port) == unknown  # every run still exported, as unknown: not withdrawn
            assert "lease" in _failing(port)  # the cause, since when, for dashboards
            # Not ready (the evidence bound is 5 minutes: it is the sources failing that say so).
            wait_until(lambda: _get(port, "/readyz")[0] == 503, timeout=30, what="/readyz 503")
            code, body = _get(port, "/readyz")
            assert "sources failing" in body and "lease since" in body, body
            # ... and the watches, once those open before the outage ended and could not start again.
            wait_until(lambda: "pods since" in _get(port, "/readyz")[1], timeout=30, what="pods failing")
            for _ in range(3):  # and it stays so while the outage lasts
                time.sleep(1)
                assert _observed(port) == unknown

            s.faults.clear()
            wait_until(lambda: _leads(port) and healthy.items() <= _observed(port).items(), timeout=60,
                       what="leading again, the runs running again")
            wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="/readyz 200 again")
            wait_until(lambda: _failing(port) == set(), timeout=30, what="no source failing")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
                proc.wait()
