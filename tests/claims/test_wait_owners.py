"""Whose wait it is, on real message text (issue: claims fail closed by construction, "Wrong owner").

- "N Insufficient nvidia.com/gpu" blames the device plugin only for short nodes the pod could use:
  its nodeSelector, required node affinity and tolerations decide.
- A pod on its node whose DRA devices the kubelet cannot prepare (FailedPrepareDynamicResources) is
  not scheduled: its devices are not allocated to it; the wait is device allocation's.
- A Workload Kueue evicted while its quota is still reserved (KubeRay suspending the job) is not
  scheduled, whatever its pods say: the wait is queue admission's.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.dumpkit import event, fixture_path, fixture_status, node, owner_of, pod, ts, write_dump
from tests.test_explain_fixtures import NOW, admitted_job, claim, explain, only_run

# The scheduler's message when one node is short of GPUs and the other does not match the selector.
FAILED_SCHEDULING = ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
                     "affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found for "
                     "incoming pod, 1 Preemption is not helpful for scheduling.")


def short_node(name: str, pool: str, *, taint: bool = False) -> dict[str, Any]:
    """A node whose device plugin advertises 4 of its 8 GPUs."""
    n = node(name, NOW, labels={"pool": pool})
    n["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    if taint:
        n["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    return n


def waiting(tmp_path: Path, name: str, *, selector: dict[str, str] | None = None,
            tolerations: list[dict[str, Any]] | None = None, taint: bool = False) -> dict[str, Any]:
    job, wl = admitted_job(NOW - timedelta(minutes=20))
    p = pod("train-abcde", "team-a", NOW - timedelta(minutes=20), node=None, phase="Pending", gpus=8,
            owner=owner_of(job))
    if selector:
        p["spec"]["nodeSelector"] = selector
    if tolerations:
        p["spec"]["tolerations"] = tolerations
    ev = event("train-abcde.1", "team-a", p, "FailedScheduling", FAILED_SCHEDULING, NOW - timedelta(minutes=1),
               type_="Warning", component="default-scheduler")
    objs = [job, wl, p, ev, short_node("gpu-a100-0", "a100", taint=taint), node("gpu-h100-0", NOW,
                                                                                labels={"pool": "h100"})]
    return only_run(explain(write_dump(tmp_path / name, objs, captured=NOW)), "train")


def test_a_short_node_the_pod_cannot_use_is_not_the_device_plugins_fault(tmp_path: Path) -> None:
    run = waiting(tmp_path, "excluded", selector={"pool": "h100"})
    assert run["blocked"]["stage"] == "pod-scheduling", run["blocked"]
    # control: the pod selects the short node's pool: the device plugin's missing GPUs are its wait
    run = waiting(tmp_path, "usable", selector={"pool": "a100"})
    assert run["blocked"]["stage"] == "device-allocation" and "gpu-a100-0 4/8 allocatable" in run["blocked"]["reason"]


def test_a_short_node_tainted_against_the_pod_is_not_its_wait(tmp_path: Path) -> None:
    run = waiting(tmp_path, "tainted", taint=True)
    assert run["blocked"]["stage"] == "pod-scheduling", run["blocked"]
    tolerated = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    run = waiting(tmp_path, "tolerated", taint=True, tolerations=tolerated)
    assert run["blocked"]["stage"] == "device-allocation", run["blocked"]


def test_devices_the_kubelet_cannot_prepare_are_not_allocated(tmp_path: Path) -> None:
    messages = fixture_path("events/failed_prepare_dynamic_resources_messages.txt").read_text().splitlines()
    for i, message in enumerate(messages):
        job, wl = admitted_job(NOW - timedelta(minutes=20))
        p = pod("train-abcde", "team-a", NOW - timedelta(minutes=20), node="gpu-1", phase="Pending", ready=False,
                gpus=8, owner=owner_of(job), containers=[
                    {"name": "main", "ready": False, "restartCount": 0,
                     "state": {"waiting": {"reason": "ContainerCreating"}}}])
        ev = event("train-abcde.1", "team-a", p, "FailedPrepareDynamicResources", message,
                   NOW - timedelta(minutes=1), type_="Warning", component="kubelet")
        run = only_run(explain(write_dump(tmp_path / f"d{i}", [job, wl, p, ev], captured=NOW)), "train")
        assert claim(run, "scheduled")[1] == "false", run["claims"]["scheduled"]
        assert "devices are not prepared" in run["claims"]["scheduled"]["reason"]
        b = run["blocked"]
        assert b["stage"] == "device-allocation" and message in b["reason"], b


def test_an_eviction_with_its_quota_still_reserved_is_queue_admission(tmp_path: Path) -> None:
    """Kueue evicted the Workload (Preempted) and waits for KubeRay to suspend the job: QuotaReserved and
    Admitted still True, the pods still running."""
    job, wl = admitted_job(NOW - timedelta(hours=1))
    evicted = fixture_status("kueue/workload_preempted_evicted_kueue_docs.yaml")["conditions"][1]
    assert evicted["type"] == "Evicted" and evicted["reason"] == "Preempted"
    wl["status"]["conditions"].append({**evicted, "lastTransitionTime": ts(NOW - timedelta(seconds=40))})
    p = pod("train-abcde", "team-a", NOW - timedelta(minutes=50), node="gpu-1", gpus=8, owner=owner_of(job))
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p], captured=NOW)), "train")
    assert claim(run, "scheduled")[1] == "false", run["claims"]["scheduled"]
    assert "Kueue evicted the workload (Preempted)" in run["claims"]["scheduled"]["reason"]
    b = run["blocked"]
    assert b["stage"] == "queue-admission" and "evicted (Preempted)" in b["reason"], b


def test_no_live_pod_and_no_workload_names_no_stage(tmp_path: Path) -> None:
    """A bare cluster-info dump of a run submitted again: the only pods in view are the old run's,
    terminating; no Workload says whether the new one was admitted. "Admitted, but no pod yet" would
    blame pod scheduling on no evidence: no stage is named."""
    old = pod("llm-raycluster-gpu-worker-abcde", "team-a", NOW - timedelta(hours=2), node="gpu-1", gpus=8,
              labels={"ray.io/cluster": "llm-raycluster", "ray.io/node-type": "worker",
                      "kueue.x-k8s.io/queue-name": "team-a"})
    old["metadata"]["deletionTimestamp"] = ts(NOW + timedelta(seconds=25))
    run = only_run(explain(write_dump(tmp_path / "d", [old], captured=NOW)), "llm-raycluster")
    assert run["claims"]["scheduled"]["observed"] == "false"
    assert run["blocked"] is None, run["blocked"]
