"""`explain RUN` live for a run waiting for quota: its position from Kueue's visibility API (the
ClusterQueue's, else the LocalQueue's a researcher is allowed), the quota not free, the estimate; a
user allowed neither gets the refusals named instead of a position. The JSON contract's `queue`."""

from __future__ import annotations

import json
from pathlib import Path

from kubesim.clock import ManualClock
from kubesim.kubeconfig import write_kubeconfig
from kubesim.rbac import READ_VERBS, Rule
from kubesim.server import Simulator
from tests.controller.test_live_explain import CLUSTER, NAMESPACED, cluster, explain, runs

__all__ = ["cluster"]  # the module's simulator fixture, used here
VIS = "visibility.kueue.x-k8s.io"
QUEUE_KEYS = {"cluster_queue", "local_queue", "workload", "position_in_cluster_queue", "position_in_local_queue",
              "pending_in_cluster_queue", "ahead", "quota_short", "admission_eta", "source"}


def _user(sim: Simulator, tmp: Path, name: str, extra: list[Rule]) -> Path:
    sim.rbac.add_user(name, f"{name}-token", [Rule(READ_VERBS, NAMESPACED, namespaces=("research",)),
                                             Rule(READ_VERBS, CLUSTER), *extra])
    path = tmp / name
    write_kubeconfig(path, (tmp / "tls_url").read_text(), namespace="research", token=f"{name}-token",
                     ca_file=str(tmp / "kubesim.crt"))
    return path


def test_position_quota_and_estimate_in_text_and_json(cluster: tuple[Simulator, ManualClock, Path]) -> None:
    sim, _, tmp = cluster
    out = explain("--kubeconfig", str(tmp / "admin"), "-n", "research", "vision-finetune", "-o", "json")
    assert out.returncode == 0, out.stderr
    run = runs(json.loads(out.stdout))["research/vision-finetune"]
    q = run["queue"]
    assert set(q) == QUEUE_KEYS
    assert (q["cluster_queue"], q["local_queue"], q["position_in_cluster_queue"], q["position_in_local_queue"]) == \
        ("gpu-a100", "a100", 0, 0)
    assert q["source"] == "Kueue visibility API (ClusterQueue/gpu-a100)"
    assert q["quota_short"] == [{"flavor": "a100", "resource": "nvidia.com/gpu", "needed": 16.0, "free": 8.0,
                                 "nominal": 40.0, "short": 8.0}]
    eta = q["admission_eta"]
    assert set(eta) == {"estimate", "low_seconds", "mid_seconds", "high_seconds", "level", "basis"}
    assert eta["estimate"] == "unknown" and eta["low_seconds"] is None and "at least 5 admissions" in eta["basis"]
    # runs not waiting for quota carry no queue
    every = runs(json.loads(explain("--kubeconfig", str(tmp / "admin"), "-n", "research", "-o", "json").stdout))
    assert [n for n, r in every.items() if "queue" in r] == ["research/vision-finetune"]
    text = explain("--kubeconfig", str(tmp / "admin"), "-n", "research", "vision-finetune")
    assert "position 1 of 2 in ClusterQueue gpu-a100, 1 in LocalQueue a100" in text.stdout
    assert "quota not free: nvidia.com/gpu in flavor a100: needs 16, 8 of 40 free (8 short)" in text.stdout
    assert "admission     estimate unknown: " in text.stdout


def test_a_researcher_reads_her_local_queue_and_refusals_are_named(
        cluster: tuple[Simulator, ManualClock, Path]) -> None:
    sim, _, tmp = cluster
    lq_only = _user(sim, tmp, "lq-reader", [Rule(("get",), ("localqueues/pendingworkloads",), (VIS,), ("research",))])
    out = explain("--kubeconfig", str(lq_only), "vision-finetune", "-o", "json")
    assert out.returncode == 0, out.stderr
    q = runs(json.loads(out.stdout))["research/vision-finetune"]["queue"]
    assert q["source"] == "Kueue visibility API (LocalQueue/research/a100)"
    assert (q["position_in_cluster_queue"], q["position_in_local_queue"]) == (0, 0)
    assert q["pending_in_cluster_queue"] is None  # the LocalQueue's answer lists its own workloads only

    plain = _user(sim, tmp, "no-visibility", [])
    out = explain("--kubeconfig", str(plain), "vision-finetune", "-o", "json")
    assert out.returncode == 0, out.stderr
    q = runs(json.loads(out.stdout))["research/vision-finetune"]["queue"]
    assert q["position_in_cluster_queue"] is None and q["admission_eta"]["estimate"] == "unknown"
    assert q["source"] == (f"get clusterqueues/pendingworkloads.{VIS} gpu-a100: refused; "
                           f"get localqueues/pendingworkloads.{VIS} research/a100: refused")
    text = explain("--kubeconfig", str(plain), "vision-finetune")
    assert "ClusterQueue gpu-a100: position unknown (get clusterqueues/pendingworkloads" in text.stdout


def test_the_notebook_api_has_the_queue_columns(cluster: tuple[Simulator, ManualClock, Path]) -> None:
    import pandas as pd

    import taugrid_evidence as te

    _, _, tmp = cluster
    ex = te.explain(kubeconfig=str(tmp / "admin"), namespace="research")
    frame = ex.runs.set_index("name")
    queued = frame.loc["vision-finetune"]
    assert queued["queue_position"] == 0 and pd.isna(queued["admission_eta_mid_s"])
    assert "at least 5 admissions" in queued["admission_eta_basis"]
    assert frame["queue_position"].isna().sum() == len(frame) - 1  # only the queued run has a position
