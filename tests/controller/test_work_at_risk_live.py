"""Work at risk through the live controller (issue 28): the checkpoint poller lists a real directory,
the claims carry the GPU-hours since the last complete checkpoint, and /metrics ranks the cordoned node
under the run; the controller needed no change for it."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.settings import StorageSettings
from kubesim.server import Simulator
from tests.controller.test_controller import (
    T0,
    Clock,
    ensure_namespaces,
    server_side,
    sim,  # noqa: F401  (fixture)
    start,
    wait_until,
)
from tests.dumpkit import pod
from tests.test_explain_fixtures import taurun


def _gauges(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text.decode())}


def test_controller_exports_work_at_risk_and_the_cordoned_node(sim: Simulator, tmp_path: Path) -> None:  # noqa: F811
    clock = Clock(T0)
    ckpt = tmp_path / "ckpt"
    d = ckpt / "checkpoint-3000"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x" * 16)
    t = (T0 - timedelta(minutes=30)).timestamp()
    os.utime(d / "model.safetensors", (t, t))
    os.utime(d, (t, t))
    ensure_namespaces(sim, "research")
    tr = taurun("ft", "research", "Running", T0 - timedelta(hours=2), workers=1)
    tr["spec"]["checkpointUri"] = ckpt.as_uri()
    sim.apply(server_side(tr))
    sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"}, "spec": {"unschedulable": True},
               "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                          "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}})
    sim.apply(server_side(pod("ft-w0", "research", T0 - timedelta(hours=2), node="gpu-0", gpus=8,
                              labels={"taugrid.io/run": "ft"})))
    c = start(sim, clock, checkpoint_poll_interval=timedelta(seconds=0.2),
              storage=StorageSettings(local_roots=frozenset({str(tmp_path)})))
    try:
        def risk() -> float | None:
            rc = next((r for r in c.claims.values() if r.ref.name == "ft"), None)
            w = rc.work_at_risk if rc is not None else None
            return w.gpu_hours if w is not None else None

        wait_until(lambda: risk() is not None, what="work at risk known")
        assert risk() == 4.0  # 8 GPUs × 30 min since checkpoint 3000
        rc = next(r for r in c.claims.values() if r.ref.name == "ft")
        assert rc.work_at_risk is not None and rc.work_at_risk.nodes[0].signals == ("cordoned",)
        got = _gauges(c.exporter.exposition())
        assert [(s["run"], v) for s, v in got["taugrid_run_work_at_risk_gpu_hours"]] == [("ft", 4.0)]
        assert [(s["node"], v) for s, v in got["taugrid_node_drain_risk"]] == [("gpu-0", 30.0)]
        assert [(s["node"], s["run"], v) for s, v in got["taugrid_run_drain_exposure_gpu_hours"]] == [
            ("gpu-0", "ft", 4.0)]
        # the clock moves on: the next listing is read later and more is at risk
        clock.advance(1800)
        wait_until(lambda: risk() == 8.0, what="work at risk grows with the clock")
    finally:
        c.close()
