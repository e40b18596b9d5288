"""Scenario files and the engine: lifecycle on a manual clock, validation, real-time play, the CLI entry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from kubesim import (
    ManualClock,
    ScaledClock,
    ScenarioEngine,
    ScenarioError,
    Simulator,
    default_scenario_path,
    load_scenario,
    start_simulation,
)
from kubesim.scenario import scenario_from_dict
from tests.simulator.conftest import T0


def _list(sim: Simulator, api_version: str, kind: str, namespace: str = "", **labels: str) -> list[dict[str, Any]]:
    items = sim.store.list_page(sim.resource(api_version, kind), namespace).items
    return [o for o in items if all(o["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())]


def _one(sim: Simulator, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
    return sim.store.get(sim.resource(api_version, kind), namespace, name)


def _pods(sim: Simulator, ns: str, run: str, node_type: str = "") -> list[dict[str, Any]]:
    pods = _list(sim, "v1", "Pod", ns, **{"taugrid.io/run": run})
    return [p for p in pods if not node_type or p["metadata"]["labels"].get("ray.io/node-type") == node_type]


def _events(sim: Simulator, ns: str, name: str) -> list[dict[str, Any]]:
    evs = [e for e in _list(sim, "v1", "Event", ns) if e["involvedObject"]["name"] == name]
    return sorted(evs, key=lambda e: int(e["metadata"]["resourceVersion"]))  # creation order


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def _log_lines(sim: Simulator, pod: dict[str, Any]) -> int:
    container = pod["spec"]["containers"][0]["name"]
    return sim.store.log_lines(pod["metadata"]["namespace"], pod["metadata"]["name"], container)


def test_default_scenario_lifecycle(sim: Simulator, engine: ScenarioEngine, clock: ManualClock) -> None:
    engine.step_to(60)
    assert engine.errors == []
    assert clock.now() == T0.replace(minute=1)
    # TauCluster: resolved, fresh, authoritative
    tc = _one(sim, "taugrid.io/v1alpha1", "TauCluster", "", "cluster")
    assert _cond(tc, "Ready")["status"] == "True" and tc["status"]["observedGeneration"] == tc["metadata"]["generation"]
    assert {p["name"] for p in tc["status"]["resolvedProfiles"]} == {"a100-2x8", "a100-1x8", "h100-2x8"}
    # healthy RayJob run: the whole chain, with references and labels
    run = _one(sim, "taugrid.io/v1alpha1", "TauRun", "research", "llm-pretrain")
    assert run["status"]["phase"] == "Running" and run["spec"]["workers"] == 2
    rayjob = _one(sim, "ray.io/v1", "RayJob", "research", run["status"]["rayJobName"])
    assert rayjob["status"]["jobDeploymentStatus"] == "Running" and rayjob["status"]["jobStatus"] == "RUNNING"
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    wl = _one(sim, "kueue.x-k8s.io/v1beta1", "Workload", "research", run["status"]["workloadName"])
    assert _cond(wl, "QuotaReserved")["status"] == "True" and _cond(wl, "Admitted")["status"] == "True"
    assert wl["status"]["admission"]["clusterQueue"] == "gpu-a100"
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    rc = _one(sim, "ray.io/v1", "RayCluster", "research", rayjob["status"]["rayClusterName"])
    assert rc["metadata"]["ownerReferences"][0]["uid"] == rayjob["metadata"]["uid"]
    assert rc["status"]["state"] == "ready" and rc["status"]["readyWorkerReplicas"] == 2
    pods = _pods(sim, "research", "llm-pretrain")
    assert sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in pods) == ["head", "worker", "worker"]
    for pod in pods:
        assert pod["metadata"]["labels"]["ray.io/cluster"] == rc["metadata"]["name"]
        assert pod["spec"]["nodeName"] and pod["status"]["phase"] == "Running"
        assert _cond(pod, "PodScheduled")["status"] == "True" and _cond(pod, "Ready")["status"] == "True"
    head = _pods(sim, "research", "llm-pretrain", "head")[0]
    reasons = [e["reason"] for e in _events(sim, "research", head["metadata"]["name"])]
    assert reasons == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]
    # blocked on quota
    vision = _one(sim, "taugrid.io/v1alpha1", "TauRun", "research", "vision-finetune")
    assert vision["status"]["phase"] == "Pending"
    vwl = _one(sim, "kueue.x-k8s.io/v1beta1", "Workload", "research", vision["status"]["workloadName"])
    assert _cond(vwl, "QuotaReserved")["status"] == "False"
    assert (
        "insufficient unused quota for nvidia.com/gpu in flavor a100, 16 more needed"
        in _cond(vwl, "QuotaReserved")["message"]
    )
    assert _pods(sim, "research", "vision-finetune") == []
    # waiting for scale-up: scheduler and autoscaler events, pods unbound
    workers = _pods(sim, "team-b", "rl-sweep", "worker")
    assert len(workers) == 2 and not any(p["spec"].get("nodeName") for p in workers)
    assert _cond(workers[0], "PodScheduled")["reason"] == "Unschedulable"
    evs = {e["reason"]: e for e in _events(sim, "team-b", workers[0]["metadata"]["name"])}
    assert evs["FailedScheduling"]["source"]["component"] == "default-scheduler"
    assert evs["FailedScheduling"]["message"].startswith("0/6 nodes are available: ")
    assert "5 Insufficient nvidia.com/gpu" in evs["FailedScheduling"]["message"]
    assert evs["TriggeredScaleUp"]["source"]["component"] == "cluster-autoscaler"

    # 3m10s: OOMKilled crash loop
    engine.step_to(190)
    worker = _pods(sim, "team-b", "bert-large", "worker")[0]
    cs = worker["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1 and cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["lastState"]["terminated"]["reason"] == "OOMKilled" and cs["lastState"]["terminated"]["exitCode"] == 137
    assert worker["status"]["phase"] == "Running" and _cond(worker, "Ready")["status"] == "False"
    backoff = [e for e in _events(sim, "team-b", worker["metadata"]["name"]) if e["reason"] == "BackOff"]
    assert backoff[0]["type"] == "Warning" and backoff[0]["count"] == 2
    # FailedScheduling repeats are aggregated into one event with a count
    fs = [e for e in _events(sim, "team-b", workers[0]["metadata"]["name"]) if e["reason"] == "FailedScheduling"]
    assert len(fs) == 1 and fs[0]["count"] == 3 and fs[0]["lastTimestamp"] > fs[0]["firstTimestamp"]

    # 6m30s: nodes joined, rl-sweep runs; llm-sft stalled at 6m05s while its pods stay Running
    engine.step_to(390)
    assert _one(sim, "taugrid.io/v1alpha1", "TauRun", "team-b", "rl-sweep")["status"]["phase"] == "Running"
    assert {p["spec"]["nodeName"] for p in _pods(sim, "team-b", "rl-sweep", "worker")} == {
        "aks-gpuh100-vmss000000",
        "aks-gpuh100-vmss000001",
    }
    sft_head = _pods(sim, "research", "llm-sft", "head")[0]
    pretrain_before, sft_before = _log_lines(sim, head), _log_lines(sim, sft_head)
    engine.step_to(600)
    assert _log_lines(sim, head) == pretrain_before + 21  # one line per 10 s
    assert _log_lines(sim, sft_head) == sft_before  # stalled: no new lines...
    sft_head = _pods(sim, "research", "llm-sft", "head")[0]
    assert sft_head["status"]["phase"] == "Running" and _cond(sft_head, "Ready")["status"] == "True"  # ...but Running

    # 8m+: the batch Job is preempted (Evicted/Preempted), re-queued, re-admitted, and finishes
    engine.step_to(500)  # no-op: time never goes back
    engine.step_to(8 * 60 + 5)
    jwl = next(
        w for w in _list(sim, "kueue.x-k8s.io/v1beta1", "Workload", "team-b") if "data-prep" in w["metadata"]["name"]
    )
    assert _cond(jwl, "Evicted")["reason"] == "Preempted" and _cond(jwl, "Admitted")["status"] == "False"
    assert "admission" not in jwl["status"]
    job = _one(sim, "batch/v1", "Job", "team-b", "data-prep")
    assert job["spec"]["suspend"] is True and _list(sim, "v1", "Pod", "team-b", **{"job-name": "data-prep"}) == []
    engine.step_to(17 * 60)
    job = _one(sim, "batch/v1", "Job", "team-b", "data-prep")
    assert _cond(job, "Complete")["status"] == "True" and job["status"]["succeeded"] == 1
    (pod,) = _list(sim, "v1", "Pod", "team-b", **{"job-name": "data-prep"})
    assert pod["status"]["phase"] == "Succeeded" and pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert _cond(_list(sim, "kueue.x-k8s.io/v1beta1", "Workload", "team-b")[0], "Finished")["status"] == "True"
    # the NCCL watchdog line lands in the stalled run's logs, with the scenario clock's timestamp
    text, _ = sim.store.read_log("research", sft_head["metadata"]["name"], "ray-head", tail_lines=2, timestamps=True)
    assert text.startswith(b"2026-01-10T10:16:05") and b"Watchdog caught collective operation timeout" in text
    # TauCluster status stays fresh
    tc = _one(sim, "taugrid.io/v1alpha1", "TauCluster", "", "cluster")
    assert tc["status"]["lastResolvedTime"] == "2026-01-10T10:15:00Z"
    assert engine.errors == []


def test_scenario_is_deterministic(clock: ManualClock) -> None:
    names = []
    for _ in range(2):
        with Simulator(clock=ManualClock(T0)) as sim:
            eng = ScenarioEngine(load_scenario(default_scenario_path()), sim.start(), ManualClock(T0))
            eng.step_to(120)
            names.append(sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in _list(sim, "v1", "Pod")))
            eng.stop()
    assert names[0] == names[1] and len(names[0]) > 10


_SMALL: dict[str, Any] = {
    "name": "small",
    "cluster": {
        "namespaces": ["ml"],
        "nodes": [{"name": "gpu", "count": 2, "gpus": 8}],
        "flavors": ["a100"],
        "clusterQueues": [{"name": "cq", "flavor": "a100", "gpus": 16}],
        "localQueues": [{"name": "lq", "namespace": "ml", "clusterQueue": "cq"}],
        "profiles": [{"name": "p", "localQueue": "lq", "clusterQueue": "cq", "workers": 1, "gpusPerWorker": 8}],
    },
    "runs": [
        {
            "name": "lost",
            "namespace": "ml",
            "profile": "p",
            "timeline": [
                {"at": 1, "admit": {}},
                {"at": 2, "schedule": {}},
                {"at": 3, "start": {}},
                {"at": 4, "train": {"every": "1s"}},
                {"at": 10, "nodeLoss": {}},
            ],
        },
        {
            "name": "badimage",
            "namespace": "ml",
            "profile": "p",
            "timeline": [{"at": 1, "admit": {}}, {"at": 2, "schedule": {}}, {"at": 3, "pullFail": {}}],
        },
        {
            "name": "broken",
            "namespace": "ml",
            "kind": "Job",
            "queue": "lq",
            "workers": 1,
            "gpusPerWorker": 0,
            "timeline": [
                {"at": 1, "admit": {}},
                {"at": 2, "schedule": {}},
                {"at": 3, "start": {}},
                {"at": 5, "fail": {"message": "exit 3", "exitCode": 3}},
            ],
        },
    ],
}


def test_node_loss_image_pull_failure_and_job_failure(sim: Simulator, clock: ManualClock) -> None:
    eng = ScenarioEngine(scenario_from_dict(_SMALL), sim.base_url, clock)
    eng.step_to(70)  # node lost at 10 s, noticed after the monitor grace period (50 s)
    assert eng.errors == []
    worker = _pods(sim, "ml", "lost", "worker")[0]
    node = _one(sim, "v1", "Node", "", worker["spec"]["nodeName"])
    assert _cond(node, "Ready")["status"] == "Unknown"
    assert any(t["key"] == "node.kubernetes.io/unreachable" for t in node["spec"]["taints"])
    assert worker["status"]["phase"] == "Unknown" and worker["status"]["reason"] == "NodeLost"
    head = _pods(sim, "ml", "lost", "head")[0]
    assert _log_lines(sim, head) == 6 + 6  # startup lines + iterations at 4..9 s; node lost at 10 s: silence
    bad = _pods(sim, "ml", "badimage", "worker")[0]
    assert bad["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    assert {"Failed", "BackOff"} <= {e["reason"] for e in _events(sim, "ml", bad["metadata"]["name"])}
    job = _one(sim, "batch/v1", "Job", "ml", "broken")
    assert _cond(job, "Failed")["reason"] == "BackoffLimitExceeded"
    (pod,) = _list(sim, "v1", "Pod", "ml", **{"job-name": "broken"})
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    eng.stop()


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d["runs"][0]["timeline"].append({"at": 5, "explode": {}}), "runs[0].timeline[5]: unknown action"),
        (lambda d: d["runs"][0]["timeline"].append({"at": "soon", "stall": {}}), "runs[0].timeline[5].at"),
        (lambda d: d["runs"][0].update(namespace="nope"), "runs[0].namespace: 'nope' is not one of"),
        (lambda d: d["runs"][0].update(profile="nope"), "runs[0].profile"),
        (lambda d: d["runs"][1]["timeline"][0].update(admit={"bogus": 1}), "runs[1].timeline[0].admit: unknown key"),
        (lambda d: d["runs"][0]["timeline"][3].update(train={"every": True}), "train.every"),
        (lambda d: d["cluster"]["clusterQueues"][0].update(flavor="h100"), "cluster.clusterQueues[0].flavor"),
        (lambda d: d.update(colour="red"), "top level: unknown key(s) ['colour']"),
    ],
)
def test_bad_scenarios_name_file_and_place(tmp_path: Path, mutate: Any, problem: str) -> None:
    data = yaml.safe_load(yaml.safe_dump(_SMALL))
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value).startswith(f"{path}: ") and problem in str(err.value)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: not valid YAML"):
        load_scenario(bad)


def test_real_time_engine_with_speed(tmp_path: Path) -> None:
    with start_simulation(address="127.0.0.1:0", speed=120.0, kubeconfig=tmp_path / "kc") as session:
        assert isinstance(session.engine.clock, ScaledClock)
        assert (tmp_path / "kc").read_text().count(session.base_url) == 1
        cfg = k8s.Configuration()
        cfg.host = session.base_url
        with k8s.ApiClient(cfg) as api:
            co = k8s.CustomObjectsApi(api)
            deadline = time.monotonic() + 10
            phase = ""
            while time.monotonic() < deadline and phase != "Running":  # 50 scenario s ≈ 0.4 s
                time.sleep(0.05)
                try:
                    phase = (
                        co.get_namespaced_custom_object("taugrid.io", "v1alpha1", "research", "tauruns", "llm-pretrain")
                        .get("status", {})
                        .get("phase", "")
                    )
                except k8s.ApiException:
                    continue
            assert phase == "Running"
        assert session.engine.errors == []


def test_run_simulator_command(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from kubesim import run_simulator; "
        f"run_simulator(None, '127.0.0.1:0', 60.0, kubeconfig=Path({str(tmp_path / 'kc')!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "Kubernetes API simulator serving 'default' at http://127.0.0.1:" in first
        assert proc.stdout.readline().strip() == f"kubeconfig: {tmp_path / 'kc'}"
        assert "server: http://127.0.0.1:" in (tmp_path / "kc").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "simulator stopped" in err
