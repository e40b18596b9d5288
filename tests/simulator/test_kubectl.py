"""The simulator through kubectl 1.32, an independent real client: what it prints is what we assert."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from kubesim import ScenarioEngine, Simulator
from tests.simulator.conftest import KUBECTL, KubectlRun


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()[1:]]


def test_get_across_namespaces_and_groups(engine: ScenarioEngine, kubectl: KubectlRun) -> None:
    engine.step_to(190)  # 3m10s: bert-large in its 2nd crash back-off, rl-sweep waiting for nodes
    pods = kubectl("get", "pods", "-A")
    header = pods.splitlines()[0].split()
    assert header == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    by_name = {r[1]: r for r in _rows(pods)}
    # kubectl's chunked listing follows the continue tokens to the same rows
    assert [r[:2] for r in _rows(kubectl("get", "pods", "-A", "--chunk-size=2"))] == [r[:2] for r in _rows(pods)]
    head = next(r for n, r in by_name.items() if n.startswith("llm-pretrain-") and "-head-" in n)
    assert head[0] == "research" and head[2:4] == ["1/1", "Running"]
    bert = next(r for n, r in by_name.items() if n.startswith("bert-large-") and "worker" in n)
    assert bert[0] == "team-b" and bert[2:4] == ["0/1", "CrashLoopBackOff"]
    assert bert[4:7] == ["1", "(12s", "ago)"]  # restarted once; last termination 12 s ago
    rl = [r for n, r in by_name.items() if n.startswith("rl-sweep-") and "worker" in n]
    assert len(rl) == 2 and all(r[3] == "Pending" for r in rl)

    tauruns = _rows(kubectl("get", "tauruns", "-A"))
    phases = {r[1]: r[2] for r in tauruns}
    assert phases == {
        "llm-pretrain": "Running",
        "llm-sft": "Running",
        "vision-finetune": "Pending",
        "bert-large": "Running",
        "rl-sweep": "Admitted",
    }
    rayjobs = {r[1]: r for r in _rows(kubectl("get", "rayjobs", "-A"))}
    assert rayjobs["llm-pretrain"][2:4] == ["RUNNING", "Running"]
    assert rayjobs["vision-finetune"][2] == "Suspended"  # no job status yet, deployment Suspended
    workloads = {r[1]: r for r in _rows(kubectl("get", "workloads.kueue.x-k8s.io", "-A"))}
    vision = next(r for n, r in workloads.items() if "vision-finetune" in n)
    assert vision[2] == "a100" and len(vision) == 4  # no ClusterQueue reserved, not admitted
    assert any("data-prep" in n and r[3:5] == ["gpu-a100", "True"] for n, r in workloads.items())
    nodes = _rows(kubectl("get", "nodes"))
    assert len(nodes) == 6 and all(r[1] == "Ready" for r in nodes)
    events = kubectl("get", "events", "-n", "team-b", "--field-selector", "reason=TriggeredScaleUp")
    assert "pod triggered scale-up: [{aks-gpuh100-vmss 0->2 (max: 4)}]" in events
    assert "cluster-autoscaler" in kubectl(
        "get", "events.events.k8s.io", "-n", "team-b", "-o", "jsonpath={.items[*].reportingController}"
    )
    cq = kubectl("get", "clusterqueues", "-o", "json")
    assert {i["metadata"]["name"] for i in json.loads(cq)["items"]} == {"gpu-a100", "gpu-h100"}
    assert kubectl("get", "taucluster", "cluster", "-o", "jsonpath={.status.conditions[0].status}") == "True"
    logs = kubectl("logs", "-n", "research", head[1], "--tail=1")
    assert logs.startswith(" [2026-01-10 10:") and " iteration " in logs and "| lm loss: " in logs


def test_watch_sees_scenario_changes(engine: ScenarioEngine, kubeconfig: Path) -> None:
    assert KUBECTL is not None
    engine.step_to(30)
    proc = subprocess.Popen(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "tauruns",
            "-n",
            "team-b",
            "-w",
            "--output-watch-events",
            "--request-timeout=20s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        header = proc.stdout.readline()
        assert header.split()[:3] == ["EVENT", "NAME", "PHASE"]
        first = {proc.stdout.readline().split()[1] for _ in range(1)}
        assert first <= {"bert-large", "rl-sweep"}
        engine.step_to(400)  # rl-sweep: Admitted -> Scheduled -> Running
        seen: list[list[str]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = proc.stdout.readline().split()
            seen.append(row)
            if row[:3] == ["MODIFIED", "rl-sweep", "Running"]:
                break
        assert ["MODIFIED", "rl-sweep", "Scheduled"] in [r[:3] for r in seen]
        assert ["MODIFIED", "rl-sweep", "Running"] in [r[:3] for r in seen]
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_create_replace_apply_delete(sim: Simulator, kubectl: KubectlRun, tmp_path: Path) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: taugrid.io/v1alpha1\nkind: TauRun\nmetadata:\n  name: demo\n  namespace: default\n"
        "  labels: {team: a}\nspec:\n  profile: a100-2x8\n  workers: 2\n  gpusPerWorker: 8\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: demo-pod\n  namespace: default\n"
        "spec:\n  containers:\n  - name: main\n    image: busybox\n"
    )
    assert kubectl("create", "-f", str(manifest)).split() == [
        "taurun.taugrid.io/demo",
        "created",
        "pod/demo-pod",
        "created",
    ]
    assert "already exists" in kubectl("create", "-f", str(manifest), ok=False)
    current = json.loads(kubectl("get", "taurun", "demo", "-o", "json"))
    current["spec"]["workers"] = 4
    replaced = tmp_path / "replaced.json"
    replaced.write_text(json.dumps(current))
    assert kubectl("replace", "-f", str(replaced)).strip() == "taurun.taugrid.io/demo replaced"
    got = json.loads(kubectl("get", "taurun", "demo", "-o", "json"))
    assert got["spec"]["workers"] == 4 and got["metadata"]["generation"] == 2
    # replacing with the stale copy is a conflict
    assert "the object has been modified" in kubectl("replace", "-f", str(replaced), ok=False)
    assert kubectl("apply", "-f", str(manifest)).split() == [
        "taurun.taugrid.io/demo",
        "configured",
        "pod/demo-pod",
        "configured",
    ]
    assert kubectl("get", "taurun", "demo", "-o", "jsonpath={.spec.workers}") == "2"
    kubectl("label", "pod", "demo-pod", "tier=x")
    assert kubectl("get", "pods", "-l", "tier=x", "-o", "name").strip() == "pod/demo-pod"
    assert kubectl("delete", "-f", str(manifest)).split() == [
        "taurun.taugrid.io",
        '"demo"',
        "deleted",
        "pod",
        '"demo-pod"',
        "deleted",
    ]
    assert "No resources found" in kubectl("get", "tauruns,pods", ok=False)


def test_cluster_info_dump(engine: ScenarioEngine, kubectl: KubectlRun, tmp_path: Path) -> None:
    engine.step_to(200)
    out = tmp_path / "dump"
    kubectl("cluster-info", "dump", "--all-namespaces", "--output-directory", str(out))
    nodes = json.loads((out / "nodes.json").read_text())
    assert len(nodes["items"]) == 6
    for ns in ("research", "team-b", "default", "kube-system"):
        for kind in (
            "pods",
            "events",
            "services",
            "deployments",
            "daemonsets",
            "replicasets",
            "replication-controllers",
        ):
            assert (out / ns / f"{kind}.json").is_file()
    pods = json.loads((out / "research" / "pods.json").read_text())["items"]
    head = next(
        p
        for p in pods
        if p["metadata"]["labels"].get("ray.io/node-type") == "head"
        and p["metadata"]["labels"].get("taugrid.io/run") == "llm-pretrain"
    )
    log = (out / "research" / head["metadata"]["name"] / "logs.txt").read_text()
    assert "Ray runtime started." in log and "| lm loss: " in log
    events = json.loads((out / "team-b" / "events.json").read_text())["items"]
    reasons = {e["reason"] for e in events}
    assert {"FailedScheduling", "TriggeredScaleUp", "BackOff", "Scheduled", "Pulled"} <= reasons
