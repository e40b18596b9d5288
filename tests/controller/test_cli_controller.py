"""`taugrid-evidence controller` as a process: kubeconfig, config file, /readyz, /metrics, JSON logs, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubesim.kubeconfig import write_kubeconfig
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, apply_run, ensure_namespaces
from tests.netutil import free_port

EXE = str(Path(sys.executable).with_name("taugrid-evidence"))


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def start_controller(sim: Simulator, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """The real `controller` process against the simulator playing one run, `llm`."""
    sim.start()
    ensure_namespaces(sim, "default")
    apply_run(sim, "llm")
    kc = write_kubeconfig(tmp_path / "kubeconfig", sim.base_url)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("controller:\n  tick: 1s\n  log_poll_interval: 0\n  ray_poll_interval: 0\n"
                   "  checkpoint_poll_interval: 0\n  lease_renew: 1s\nclaims:\n  evidence_max_age: 1h\n")
    port = free_port()
    proc = subprocess.Popen([EXE, "controller", "--kubeconfig", str(kc), "--config", str(cfg),
                             "--metrics-address", f"127.0.0.1:{port}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def test_controller_process_serves_claims_and_stops_on_sigterm(tmp_path: Path) -> None:
    with Simulator(settings=FAST) as sim:
        proc, port = start_controller(sim, tmp_path)
        try:
            deadline = time.monotonic() + 30
            body = ""
            while time.monotonic() < deadline:
                ready, _ = get(f"http://127.0.0.1:{port}/readyz")
                code, body = get(f"http://127.0.0.1:{port}/metrics")
                if ready == 200 and 'run="llm"' in body:
                    break
                time.sleep(0.2)
            assert 'taugrid_run_claim_state{claim="running",kind="TauRun",namespace="research",observed="true",' \
                   'run="llm",verdict="verified"} 1.0' in body, body[-2000:]
            assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            lease = sim.store.get(sim.resource("coordination.k8s.io/v1", "Lease"), "default",
                                  "taugrid-evidence-controller")
            assert lease["spec"]["holderIdentity"]
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode()[-2000:]
    logs = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert any(rec["msg"] == "serving" and rec["lease_namespace"] == "default" for rec in logs)
    assert all({"ts", "level", "logger", "msg"} <= rec.keys() for rec in logs)


def test_bad_config_names_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("controller:\n  tick: soon\n")
    proc = subprocess.run([EXE, "controller", "--kubeconfig", str(cfg), "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"{cfg}: config.controller.tick: not a duration: 'soon'" in proc.stderr


def test_controller_process_exports_to_the_embedded_store_and_query_answers(tmp_path: Path) -> None:
    store = tmp_path / "evidence.duckdb"
    with Simulator(settings=FAST) as sim:
        proc, port = start_controller(sim, tmp_path, "--export-store", str(store), "--cluster-name", "east-1")
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                _, body = get(f"http://127.0.0.1:{port}/metrics")
                if 'run="llm"' in body:
                    break
                time.sleep(0.2)
            time.sleep(6)  # one seal interval: the rows are acknowledged and written to the store
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()[-2000:]
    q = tmp_path / "claims.kql"
    q.write_text("RunClaims | where Run == 'llm' | summarize n = count() by Cluster, Claim | order by Claim asc")
    res = subprocess.run([EXE, "query", str(q), "--store", str(store), "-o", "json"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert {r["Claim"] for r in rows} == {"progressing", "running", "scheduled"}, rows
    assert all(r["Cluster"] == "east-1" and r["n"] >= 1 for r in rows), rows
