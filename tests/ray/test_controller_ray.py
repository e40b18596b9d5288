"""The live controller against a real Ray head: progressing, then STALLED within the window, then back.

The cluster objects (TauRun → RayJob → RayCluster → head pod) live in the API simulator; the Ray
runtime is a real local head running a real job that counts `train_steps`, hangs, and resumes.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from collector.controller import Controller
from collector.model import Observed, RunClaims
from collector.settings import ClaimSettings, ControllerSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.server import Simulator, SimulatorSettings
from tests.ray.test_ray_source import JOB
from tests.rayserver import RayHeadServer


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def cluster_objects(sid: str, started: datetime) -> list[dict[str, Any]]:
    ns, run = "research", "ray-llm"
    labels = {"taugrid.io/run": run}
    head_spec = {"template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun", "metadata": {"name": run, "namespace": ns},
         "spec": {"profile": "cpu", "workers": 0}, "status": {"phase": "Running", "rayJobName": run}},
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": run, "namespace": ns, "labels": labels},
         "spec": {"entrypoint": "python train.py", "rayClusterSpec": {"headGroupSpec": head_spec}},
         "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "rc",
                    "jobId": sid, "startTime": ts(started)}},
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "namespace": ns, "labels": labels},
         "spec": {"headGroupSpec": head_spec}, "status": {"state": "ready", "head": {"serviceName": "rc-head-svc"}}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "rc-head-x1", "namespace": ns,
                      "labels": {**labels, "ray.io/cluster": "rc", "ray.io/node-type": "head"}},
         "spec": {"nodeName": "node-0", "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]},
         "status": {"phase": "Running",
                    "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(started)},
                                   {"type": "Ready", "status": "True", "lastTransitionTime": ts(started)}],
                    "containerStatuses": [{"name": "ray-head", "ready": True, "restartCount": 0,
                                           "state": {"running": {"startedAt": ts(started)}}}]}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-0"}, "spec": {},
         "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}},
    ]


def progressing(c: Controller) -> RunClaims | None:
    return next((r for r in c.claims.values() if r.ref.name == "ray-llm"), None)


def wait_for(c: Controller, what: str, check: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        rc = progressing(c)
        if rc is not None and check(rc):
            return time.monotonic() - t0
        time.sleep(0.2)
    rc = progressing(c)
    raise AssertionError(f"{what} not within {timeout}s: {rc.progressing if rc else None}")


def test_controller_flags_the_stall_of_a_real_ray_job_and_clears_it(ray_head: RayHeadServer, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    stalled, resume = tmp_path / "stalled", tmp_path / "resume"
    sid = ray_head.submit(f"{sys.executable} {script} {stalled} {resume} 12 8")
    now = datetime.now(UTC)
    claims = ClaimSettings(stall_floor=timedelta(seconds=10), scrape_interval=timedelta(seconds=1))
    ctl_cfg = replace(ControllerSettings(), leader_election=False, tick=timedelta(seconds=0.5),
                      log_poll_interval=timedelta(0), checkpoint_poll_interval=timedelta(0),
                      ray_poll_interval=timedelta(seconds=1),
                      ray_dashboards={"research/rc": ray_head.dashboard_url},
                      ray_metrics={"research/rc": ray_head.metrics_url})
    with Simulator(settings=SimulatorSettings(bookmark_interval_s=0.5)) as sim:
        sim.start()
        for obj in cluster_objects(sid, now):
            sim.apply(obj)
        ctl = Controller(KubeApi(api_client_for(sim.base_url)), Settings(claims=claims, controller=ctl_cfg),
                         lambda: datetime.now(UTC))
        ctl.open()
        try:
            wait_for(ctl, "progressing verified", lambda rc: rc.progressing.observed is Observed.TRUE, 40)
            rc = progressing(ctl)
            assert rc is not None and rc.running.observed is Observed.TRUE
            alive = [e for e in rc.running.evidence if e.field == "alive_nodes"]
            assert alive and alive[0].value == "1/1" and alive[0].plane.value == "ray"
            # The job hangs: no new step. Flagged within the adaptive window plus one poll.
            t_stall = time.monotonic()
            while not stalled.exists():
                assert time.monotonic() - t_stall < 40, "job never reached its stall"
                time.sleep(0.2)
            took = wait_for(ctl, "STALLED", lambda rc: rc.progressing.observed is Observed.FALSE, 60)
            rc = progressing(ctl)
            assert rc is not None
            # "(window 16s: 3 × 5s from p99 of ...)": the window and what it was built from
            m = re.search(r"\(window (\d+)s[:)]", rc.progressing.reason)
            assert m is not None, rc.progressing.reason
            window = float(m.group(1))
            assert rc.progressing.reason.startswith("STALLED") and rc.progressing.verdict.value == "contradicted"
            # Detected no later than the window, one Ray report interval (5 s) and two polls after the stall.
            assert took <= window + 5 + 2 + 2, (took, window)
            assert rc.goodput is not None and rc.goodput.badput_s["stalled"] > 0, (rc.progressing.reason, rc.goodput)
            # Progress resumes: the stall clears.
            resume.touch()
            wait_for(ctl, "progressing again", lambda rc: rc.progressing.observed is Observed.TRUE, 30)
        finally:
            ctl.close()
            ray_head.stop_job(sid)
