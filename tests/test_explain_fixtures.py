"""`explain --from-dump` on dumps assembled from the real fixtures: every field that matters."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.explaincmd import EXIT_SKIPPED
from tests.dumpkit import (
    describe_events,
    event,
    fixture_docs,
    fixture_object,
    fixture_path,
    fixture_status,
    meta,
    owner_of,
    pod,
    ts,
    write_dump,
)


def explain(dump: Path, *args: str, expect_exit: int = 0) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--output", "json", *args])
    assert result.exit_code == expect_exit, result.output + result.stderr
    return cast(dict[str, Any], json.loads(result.stdout))


def only_run(out: dict[str, Any], name: str) -> dict[str, Any]:
    runs: list[dict[str, Any]] = [r for r in out["runs"] if r["name"] == name]
    assert len(runs) == 1, [r["name"] for r in out["runs"]]
    return runs[0]


def claim(run: dict[str, Any], name: str) -> tuple[Any, str, str]:
    c = run["claims"][name]
    return c["asserted"], c["observed"], c["verdict"]


def kueue_job(name: str, ns: str, created: datetime, *, queue: str = "team-a", suspend: bool = False,
              conditions: list[dict[str, Any]] | None = None, parallelism: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta(name, ns, f"uid-{name}", created, labels={"kueue.x-k8s.io/queue-name": queue}),
        "spec": {"parallelism": parallelism, "suspend": suspend, "template": {"spec": {"containers": []}}},
        "status": {"conditions": conditions or [], **({} if suspend else {"active": parallelism})},
    }


def workload_for(owner: dict[str, Any], status: dict[str, Any], *, queue: str = "team-a") -> dict[str, Any]:
    name = f"job-{owner['metadata']['name']}-1a2b3"
    created = datetime.fromisoformat(owner["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": meta(name, owner["metadata"]["namespace"], f"uid-{name}", created, owner=owner_of(owner)),
        "spec": {"queueName": queue, "podSets": [{"name": "main", "count": owner["spec"].get("parallelism", 1)}]},
        "status": status,
    }


# --- KubeRay ---------------------------------------------------------------------------------------


def ray_head(rayjob: dict[str, Any], *, created: datetime, **kw: Any) -> dict[str, Any]:
    st = rayjob["status"]
    return pod(st["rayClusterStatus"]["head"]["podName"], rayjob["metadata"]["namespace"], created,
               labels={"ray.io/cluster": st["rayClusterName"], "ray.io/node-type": "head"}, **kw)


def test_rayjob_running_while_ray_job_failed(tmp_path: Path) -> None:
    rj = fixture_object("kuberay/rayjob_jobstatus_failed_deployment_running_karta_recorded.yaml")
    head = ray_head(rj, created=datetime(2026, 9, 16, 11, 5, 48, tzinfo=UTC), node="karta-e2e-worker")
    out = explain(write_dump(tmp_path / "d", [rj, head]))
    run = only_run(out, "karta-e2e-rayjob-failed")
    assert run["kind"] == "RayJob" and run["namespace"] == "test-4jj2n"
    assert run["uid"] == "3065960a-23e3-4e14-bbc8-1a13accdd61d"
    assert claim(run, "scheduled") == (True, "true", "verified")
    assert claim(run, "running") == (True, "false", "contradicted")
    reason = run["claims"]["running"]["reason"]
    assert "Ray job FAILED" in reason and "exit code 1" in reason and "deployment still says Running" in reason
    assert claim(run, "progressing") == (True, "false", "contradicted")
    assert run["blocked"] is None
    job_status = [e for e in run["claims"]["running"]["evidence"] if e["field"] == "status.jobStatus"]
    assert job_status and job_status[0]["value"] == "FAILED" and job_status[0]["plane"] == "kuberay"


def test_rayjob_stuck_initializing_with_head_image_pull_failing(tmp_path: Path) -> None:
    rj = fixture_object("kuberay/rayjob_initializing_head_containercreating_karta_recorded.yaml")
    created = datetime(2026, 9, 16, 11, 5, 47, tzinfo=UTC)
    head = ray_head(rj, created=created, node="karta-e2e-worker", phase="Pending", ready=False, containers=[
        {"name": "ray-head", "ready": False, "restartCount": 0, "image": "ray-e2e:local",
         "state": {"waiting": {"reason": "ImagePullBackOff",
                               "message": 'Back-off pulling image "ray-e2e:local"'}}}])
    pull = event("head.pull", "test-4jj2n", head, "Failed", 'Failed to pull image "ray-e2e:local"',
                 created + timedelta(seconds=30), type_="Warning")
    out = explain(write_dump(tmp_path / "d", [rj, head, pull]))
    run = only_run(out, "karta-e2e-rayjob-failed")
    # KubeRay still says Initializing, yet the head is bound: evidence is ahead of status.
    assert claim(run, "scheduled") == (False, "true", "ahead")
    assert claim(run, "running") == (False, "false", "pending")
    assert "ImagePullBackOff" in run["claims"]["running"]["reason"]
    assert claim(run, "progressing") == (False, "false", "pending")
    assert run["blocked"] is None


def test_rayjob_succeeded_before_kuberay_marks_complete(tmp_path: Path) -> None:
    rj = fixture_object("kuberay/rayjob_jobstatus_succeeded_karta_recorded.yaml")
    head = ray_head(rj, created=datetime(2026, 9, 16, 11, 5, 27, tzinfo=UTC), node="karta-e2e-worker2")
    run = only_run(explain(write_dump(tmp_path / "d", [rj, head])), "karta-e2e-rayjob")
    assert claim(run, "running") == (True, "false", "contradicted")
    assert "Ray job SUCCEEDED" in run["claims"]["running"]["reason"]


# --- Kueue -----------------------------------------------------------------------------------------

T0 = datetime(2024, 3, 21, 13, 40, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fixture", "stage", "owner", "needle"),
    [
        ("kueue/workload_pending_insufficient_quota_kueue_docs.yaml", "queue-admission", "Kueue",
         "insufficient quota for cpu in flavor default-flavor"),
        ("kueue/workload_inadmissible_localqueue_missing_kueue_docs.yaml", "queue-admission", "Kueue",
         "LocalQueue user-queue doesn't exist"),
        ("kueue/workload_preempted_evicted_kueue_docs.yaml", "queue-admission", "Kueue",
         "evicted (Preempted): Preempted to accommodate a higher priority Workload"),
        ("kueue/workload_pending_admissioncheck_provreq_kueue_docs.yaml", "node-scaling",
         "Cluster infrastructure", "admission check dws-prov Pending"),
    ],
)
def test_kueue_wait_owns_the_blocked_stage(tmp_path: Path, fixture: str, stage: str, owner: str,
                                           needle: str) -> None:
    job = kueue_job("train", "team-a", T0, suspend=True)
    wl = workload_for(job, fixture_status(fixture))
    extra = []
    if "provreq" in fixture:  # the check is a ProvisioningRequest by its AdmissionCheck's controllerName
        extra.append(fixture_object("kueue/admissioncheck_dws_prov_provisioning_request_kueue_docs.yaml"))
    out = explain(write_dump(tmp_path / "d", [job, wl, *extra]))
    run = only_run(out, "train")
    assert run["kind"] == "Job"
    assert claim(run, "scheduled") == (False, "false", "pending")
    assert claim(run, "running") == (False, "false", "pending")
    assert run["blocked"]["stage"] == stage
    assert run["blocked"]["owner"] == owner
    assert needle in run["blocked"]["reason"]
    assert any(e["plane"] == "kueue" for e in run["blocked"]["evidence"])


def test_inactive_queues_named_in_admission_wait(tmp_path: Path) -> None:
    job = kueue_job("train", "team-a", T0, suspend=True, queue="user-queue")
    wl = workload_for(job, fixture_status("kueue/workload_pending_insufficient_quota_kueue_docs.yaml"),
                      queue="user-queue")
    wl["status"]["conditions"][0]["message"] = "couldn't assign flavors"  # keep real reason, shorter text
    lq = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
          "metadata": meta("user-queue", "team-a", "lq", T0), "spec": {"clusterQueue": "cluster-queue"},
          "status": fixture_status("kueue/localqueue_status_inactive_kueue_docs.yaml")}
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
          "metadata": {"name": "cluster-queue", "uid": "cq", "creationTimestamp": ts(T0)},
          "status": fixture_status("kueue/clusterqueue_status_flavornotfound_kueue_docs.yaml")}
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, lq, cq])), "train")
    b = run["blocked"]
    assert b["stage"] == "queue-admission"
    assert "LocalQueue user-queue inactive: Can't submit new workloads to clusterQueue" in b["reason"]
    assert "ClusterQueue cluster-queue inactive: Can't admit new workloads: FlavorNotFound" in b["reason"]


def test_workload_finished_while_quota_reserved(tmp_path: Path) -> None:
    [items] = fixture_docs("kueue/datadog_fixture_workload_evicted_preempted_finished.json")
    wl = dict(items[0], apiVersion="kueue.x-k8s.io/v1beta1", kind="Workload")
    created = datetime(2026, 6, 16, 10, 0, tzinfo=UTC)
    job = kueue_job("training-job", "team-a", created, queue="gpu", conditions=[
        {"type": "Complete", "status": "True", "lastTransitionTime": "2026-06-16T10:01:30Z"}])
    job["status"] = {"succeeded": 1, "conditions": job["status"]["conditions"]}
    wl["metadata"] = dict(wl["metadata"], ownerReferences=[{**owner_of(job), "controller": True}])
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl])), "training-job")
    assert run["finished"] is True
    assert claim(run, "scheduled") == (False, "false", "pending")
    finished = [e for e in run["claims"]["scheduled"]["evidence"] if e["field"] == "status.conditions[Finished]"]
    assert finished and "still holding its quota reservation" in finished[0]["value"]
    assert run["blocked"] is None  # finished runs wait for nothing


# --- pods: device allocation, scheduling, node scaling, crash loops ----------------------------------


def admitted_job(tmp_t: datetime, name: str = "train") -> tuple[dict[str, Any], dict[str, Any]]:
    job = kueue_job(name, "team-a", tmp_t)
    wl = workload_for(job, fixture_status("kueue/workload_admitted_kueue_docs.yaml"))
    return job, wl


def test_unexpected_admission_error_is_device_allocation(tmp_path: Path) -> None:
    t = datetime(2024, 11, 19, 3, 4, 50, tzinfo=UTC)
    job, wl = admitted_job(t)
    p = pod("train-abcde", "team-a", t, node="gpu-node-1", gpus=8, owner=owner_of(job),
            status=fixture_status("pods/pod_status_unexpectedadmissionerror_no_healthy_devices_k8s_128854.yaml"))
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p])), "train")
    # The Job's status.active counts the rejected pod's slot: it asserts nothing about scheduling.
    assert claim(run, "scheduled") == (None, "false", "unasserted")
    b = run["blocked"]
    assert b["stage"] == "device-allocation" and b["owner"] == "Device plugin or DRA"
    assert "UnexpectedAdmissionError" in b["reason"] and "no healthy devices present" in b["reason"]
    assert "gpu-node-1" in b["reason"]


NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def pending_gpu_pod(job: dict[str, Any], name: str) -> dict[str, Any]:
    return pod(name, "team-a", NOW - timedelta(minutes=8), node=None, phase="Pending", gpus=1,
               owner=owner_of(job))


def test_failed_scheduling_gpu_then_triggered_scale_up_is_node_scaling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending_gpu_pod(job, "vllm-1")
    evs = describe_events(
        "events/describe_pod_vllm_aks_notriggerscaleup_triggeredscaleup_failedscheduling_gpu_llm_inference.txt",
        pod_name="vllm-1", ns="team-a", now=NOW)
    # The dump is taken before the node arrived: drop what happened in the last two minutes.
    evs = [e for e in evs if e["lastTimestamp"] <= ts(NOW - timedelta(seconds=130))]
    assert [e["reason"] for e in evs] == ["NotTriggerScaleUp", "TriggeredScaleUp", "FailedScheduling"]
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, *evs], captured=NOW), "--at", ts(NOW)), "train")
    assert claim(run, "scheduled") == (None, "false", "unasserted")  # status.active asserts nothing
    b = run["blocked"]
    assert b["stage"] == "node-scaling" and b["owner"] == "Cluster infrastructure"
    assert "scale-up triggered" in b["reason"] and "aks-gpunp-98036146-vmss 1->2 (max: 2)" in b["reason"]
    assert "Insufficient nvidia.com/gpu" in b["reason"]


def test_not_trigger_scale_up_for_gpu_is_node_scaling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending_gpu_pod(job, "vllm-1")
    evs = describe_events(
        "events/describe_pod_vllm_aks_notriggerscaleup_triggeredscaleup_failedscheduling_gpu_llm_inference.txt",
        pod_name="vllm-1", ns="team-a", now=NOW)
    evs = [e for e in evs if e["reason"] in ("NotTriggerScaleUp", "FailedScheduling")][:2]
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, *evs], captured=NOW), "--at", ts(NOW)), "train")
    assert run["blocked"]["stage"] == "node-scaling"
    assert "cannot add a matching node" in run["blocked"]["reason"]
    assert "max node group size reached" in run["blocked"]["reason"]


def test_affinity_mismatch_with_no_scale_up_is_pod_scheduling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending_gpu_pod(job, "train-x")
    evs = describe_events("events/describe_pod_failedscheduling_nottriggerscaleup_kueue_docs.txt",
                          pod_name="train-x", ns="team-a", now=NOW)
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, *evs], captured=NOW), "--at", ts(NOW)), "train")
    b = run["blocked"]
    assert b["stage"] == "pod-scheduling" and b["owner"] == "Kubernetes"
    assert "didn't match Pod's node affinity/selector" in b["reason"]
    assert "NotTriggerScaleUp" in b["reason"]


def test_insufficient_gpu_without_autoscaler_is_pod_scheduling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending_gpu_pod(job, "train-y")
    evs = describe_events(
        "events/describe_pod_event_failedscheduling_insufficient_gpu_unschedulable_device_plugin_119.txt",
        pod_name="train-y", ns="team-a", now=NOW)
    assert evs[0]["count"] == 2
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, *evs], captured=NOW), "--at", ts(NOW)), "train")
    b = run["blocked"]
    assert b["stage"] == "pod-scheduling"
    assert "1 Insufficient nvidia.com/gpu" in b["reason"] and "no node scale-up observed" in b["reason"]
    assert "FailedScheduling (x2)" in b["evidence"][0]["value"]


def test_karpenter_nominated_ray_worker_is_node_scaling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=45))
    p = pending_gpu_pod(job, "worker-gpu-85d22")
    evs = describe_events(
        "events/describe_pod_ray_gpu_worker_failedscheduling_karpenter_nominated_data_on_eks.txt",
        pod_name="worker-gpu-85d22", ns="team-a", now=NOW)
    evs = [e for e in evs if e["reason"] in ("FailedScheduling", "Nominated")]
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, *evs], captured=NOW), "--at", ts(NOW)), "train")
    assert run["blocked"]["stage"] == "node-scaling"
    assert "nodeclaim/gpu-ljvhl" in run["blocked"]["reason"]


def taurun(name: str, ns: str, phase: str, created: datetime, *, workers: int = 2,
           profile: str = "a100-2x8") -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
            "metadata": {**meta(name, ns, f"uid-{name}", created), "generation": 1},
            "spec": {"profile": profile, "workers": workers, "gpusPerWorker": 8},
            "status": {"phase": phase, "conditions": []}}


def test_crash_loop_oomkilled_contradicts_running(tmp_path: Path) -> None:
    run_obj = taurun("llm-pretrain", "research", "Running", NOW - timedelta(hours=2), workers=1)
    ok = pod("llm-pretrain-w0", "research", NOW - timedelta(hours=2), node="gpu-1", gpus=8,
             labels={"taugrid.io/run": "llm-pretrain"}, ready=False, containers=[
                 {"name": "main", "ready": False, "restartCount": 5,
                  "state": {"waiting": {"reason": "CrashLoopBackOff",
                                        "message": "back-off 5m0s restarting failed container"}},
                  "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                               "finishedAt": ts(NOW - timedelta(minutes=3))}}}])
    run = only_run(explain(write_dump(tmp_path / "d", [run_obj, ok], captured=NOW), "--at", ts(NOW)), "llm-pretrain")
    assert run["kind"] == "TauRun"
    assert claim(run, "scheduled") == (True, "true", "verified")
    assert claim(run, "running") == (True, "false", "contradicted")
    reason = run["claims"]["running"]["reason"]
    assert "CrashLoopBackOff, last exit OOMKilled (137), 5 restarts" in reason
    assert claim(run, "progressing") == (True, "false", "contradicted")
    assert run["context"]["workers"] == 1 and run["context"]["gpus_per_worker"] == 8


def test_pytorchjob_recording_final_state_is_finished(tmp_path: Path) -> None:
    rec = fixture_docs("pods/pytorchjob_watch_recording_created_running_failed_karta_recorded.yaml")[0]
    final = rec["events"][-1]["object"]
    run = only_run(explain(write_dump(tmp_path / "d", [final])), "karta-e2e-pytorch-failed")
    assert run["kind"] == "PyTorchJob" and run["finished"] is True
    assert claim(run, "running") == (False, "false", "pending")
    assert run["blocked"] is None
    # The middle of the recording: the operator says Running, no pods were dumped.
    middle = rec["events"][1]["object"]
    run = only_run(explain(write_dump(tmp_path / "m", [middle])), "karta-e2e-pytorch-failed")
    assert claim(run, "running") == (True, "false", "contradicted")


def test_pod_fixture_waiting_podinitializing_not_running(tmp_path: Path) -> None:
    p = fixture_object("pods/pod_k8s134_init_completed_worker_podinitializing_conditions_karta_recorded.yaml")
    job = kueue_job("karta", p["metadata"]["namespace"], datetime(2026, 9, 16, 10, 57, 50, tzinfo=UTC))
    p["metadata"]["ownerReferences"] = [{**owner_of(job), "controller": True}]
    run = only_run(explain(write_dump(tmp_path / "d", [job, p])), "karta")
    assert claim(run, "scheduled")[1] == "true"
    assert claim(run, "running")[1] == "false"
    assert "PodInitializing" in run["claims"]["running"]["reason"]


# --- TauGrid target resolution -------------------------------------------------------------------


def taucluster(*, generation: int, observed: int, ready: str = "True", resolved: tuple[str, ...] = ("a100-2x8",),
               resolved_at: datetime = NOW) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauCluster",
            "metadata": {"name": "cluster", "uid": "tc", "generation": generation,
                         "creationTimestamp": ts(NOW - timedelta(days=3))},
            "spec": {"workloadProfiles": [{"name": "a100-2x8"}, {"name": "h100-4x8"}]},
            "status": {"observedGeneration": observed, "lastResolvedTime": ts(resolved_at),
                       "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": ts(resolved_at)}],
                       "resolvedProfiles": [{"name": n, "localQueue": "team-a", "clusterQueue": "gpu-cq",
                                             "workers": 2, "gpusPerWorker": 8} for n in resolved]}}


@pytest.mark.parametrize(
    ("tc", "needle"),
    [
        (taucluster(generation=4, observed=3), "observedGeneration 3 < generation 4"),
        (taucluster(generation=4, observed=4, ready="False"), "TauCluster Ready is False"),
        (taucluster(generation=4, observed=4, resolved=("h100-4x8",)), "profile 'a100-2x8' is not resolved"),
        (taucluster(generation=4, observed=4, resolved_at=NOW - timedelta(hours=3)), "older than the trust bound"),
        (taucluster(generation=4, observed=4), "has not created the run's workload yet"),
    ],
)
def test_target_resolution_fails_closed(tmp_path: Path, tc: dict[str, Any], needle: str) -> None:
    tr = taurun("llm", "research", "Pending", NOW - timedelta(minutes=5))
    run = only_run(explain(write_dump(tmp_path / "d", [tr, tc], captured=NOW), "--at", ts(NOW)), "llm")
    assert claim(run, "scheduled") == (False, "false", "pending")
    assert run["blocked"]["stage"] == "target-resolution" and run["blocked"]["owner"] == "TauGrid"
    assert needle in run["blocked"]["reason"]


# --- progress from logs -----------------------------------------------------------------------------


def megatron_log(start: datetime, interval_s: float = 87.0) -> tuple[str, datetime]:
    """The real Megatron fixture lines, stamped as `kubectl logs --timestamps` writes them."""
    lines = fixture_path("training_logs/megatron_iteration_log_lines_epfllm_megatron_llm_11_truncated.txt") \
        .read_text().splitlines()
    out = []
    t = start
    for line in lines:
        if not line.strip():
            continue
        out.append(f"{t.strftime('%Y-%m-%dT%H:%M:%S.%f')}123Z {line}")
        last = t
        t += timedelta(seconds=interval_s)
    return "\n".join(out) + "\n", last


def healthy_taurun(tmp_path: Path, log: str, captured: datetime | None = None) -> Path:
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8,
            labels={"taugrid.io/run": "llm"})
    return write_dump(tmp_path / "d", [tr, p], logs={("research", "llm-w0"): log}, captured=captured)


def test_megatron_progress_verified_then_stalled(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log)
    run = only_run(explain(dump, "--at", ts(last + timedelta(seconds=60))), "llm")
    assert claim(run, "progressing") == (True, "true", "verified")
    ev = {e["field"]: e["value"] for e in run["claims"]["progressing"]["evidence"]}
    assert ev["last_step"] == 125 and ev["last_loss"] == pytest.approx(2.477393)
    # 87 s cadence → window max(3 × 87 s, 60 s) + 15 s = 276 s; judged past it, a dump captured before
    # the window closed cannot tell whether a step came after the capture: unknown, not STALLED ...
    run = only_run(explain(dump, "--at", ts(last + timedelta(seconds=290))), "llm")
    assert claim(run, "progressing") == (True, "unknown", "unconfirmed")
    assert "a stall is judged on a read after the window" in run["claims"]["progressing"]["reason"]
    # ... while a dump captured after the window closed shows the stall
    late = healthy_taurun(tmp_path / "late", log, captured=last + timedelta(seconds=290))
    run = only_run(explain(late), "llm")
    assert claim(run, "progressing") == (True, "false", "contradicted")
    assert run["claims"]["progressing"]["reason"].startswith("STALLED 4m50s: last step 125")


def test_goodput_splits_allocated_time(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log)
    scheduled_at = NOW - timedelta(hours=1) + timedelta(seconds=1)  # PodScheduled of the only pod
    run = only_run(explain(dump, "--at", ts(last + timedelta(seconds=60))), "llm")
    g = run["goodput"]
    assert g["allocated_seconds"] == pytest.approx((last + timedelta(seconds=60) - scheduled_at).total_seconds())
    assert g["productive_seconds"] == pytest.approx(3 * 87 + 60)
    # the log's first line is its first step: the time before it was not observed (not "starting")
    assert g["badput_seconds"]["unobserved"] == pytest.approx((NOW - timedelta(minutes=10) - scheduled_at)
                                                              .total_seconds())
    assert g["badput_seconds"]["starting"] == 0
    assert g["badput_seconds"]["stalled"] == 0
    assert g["ratio"] == pytest.approx(g["productive_seconds"] / g["allocated_seconds"], abs=1e-4)
    stalled = only_run(explain(dump, "--at", ts(last + timedelta(seconds=290))), "llm")["goodput"]
    assert stalled["productive_seconds"] == pytest.approx(3 * 87)
    assert stalled["badput_seconds"]["stalled"] == pytest.approx(290)
    text = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", ts(last + timedelta(seconds=290))])
    assert "goodput" in text.stdout and "stalled 4m50s" in text.stdout


def test_nccl_watchdog_named_in_stall(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    watchdog = fixture_path("training_logs/nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt").read_text()
    stamp = (last + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")
    log += "".join(f"{stamp} {line}\n" for line in watchdog.splitlines())
    dump = healthy_taurun(tmp_path, log)
    run = only_run(explain(dump, "--at", ts(last + timedelta(minutes=11))), "llm")
    reason = run["claims"]["progressing"]["reason"]
    assert reason.startswith("STALLED") and "ALLREDUCE" in reason and "600000 ms" in reason


def test_watchdog_after_the_last_step_is_a_stall_inside_the_window(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    watchdog = fixture_path("training_logs/nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt").read_text()
    stamp = (last + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")
    log += "".join(f"{stamp} {line}\n" for line in watchdog.splitlines())
    dump = healthy_taurun(tmp_path, log)
    run = only_run(explain(dump, "--at", ts(last + timedelta(seconds=40))), "llm")  # window is 276 s
    assert claim(run, "progressing") == (True, "false", "contradicted")
    assert run["claims"]["progressing"]["reason"].startswith("STALLED 40s") and "ALLREDUCE" in \
        run["claims"]["progressing"]["reason"]
    # Before the watchdog line, the same run is progressing.
    run = only_run(explain(dump, "--at", ts(last + timedelta(seconds=20))), "llm")
    assert claim(run, "progressing")[1] == "true"


def test_nan_loss_is_not_progress(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    stamp = (last + timedelta(seconds=87)).strftime("%Y-%m-%dT%H:%M:%SZ")
    log += (f"{stamp}  iteration      126/  250000 | consumed samples:       129024 | elapsed time per iteration "
            f"(ms): 87000.0 | learning rate: 9.450E-06 | global batch size:  1024 | lm loss: nan | loss scale: 1.0 |"
            f" number of skipped iterations:   0 | number of nan iterations:   1 |\n")
    run = only_run(explain(healthy_taurun(tmp_path, log), "--at", ts(last + timedelta(seconds=100))), "llm")
    assert claim(run, "progressing") == (True, "false", "contradicted")
    assert "since step 126" in run["claims"]["progressing"]["reason"]


def test_untimestamped_progress_is_unknown(tmp_path: Path) -> None:
    lines = fixture_path("training_logs/megatron_iteration_log_lines_epfllm_megatron_llm_11_truncated.txt")
    run = only_run(explain(healthy_taurun(tmp_path, lines.read_text(), captured=NOW), "--at", ts(NOW)), "llm")
    assert claim(run, "progressing") == (True, "unknown", "unconfirmed")
    assert "no timestamps (last step 125)" in run["claims"]["progressing"]["reason"]


# --- fail closed, selection, bad input ----------------------------------------------------------------


def test_evaluating_long_after_the_dump_fails_closed(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log)
    run = only_run(explain(dump, "--captured-at", ts(last), "--at", ts(last + timedelta(hours=2))), "llm")
    for name in ("scheduled", "running", "progressing"):
        # The TauRun's own status is as old as the rest: it asserts nothing either.
        assert claim(run, name) == (None, "unknown", "unasserted"), name
    assert run["claims"]["scheduled"]["reason"] == "Pod evidence is 2h00m old (bound 5m00s)"
    # Without --captured-at the files' own times say when the dump was written.
    old = (last - timedelta(minutes=1)).timestamp()
    for f in dump.rglob("*"):
        if f.is_file():
            os.utime(f, (old, old))
    run = only_run(explain(dump, "--at", ts(last + timedelta(minutes=30))), "llm")
    assert claim(run, "running")[1] == "unknown"
    run = only_run(explain(dump, "--at", ts(last + timedelta(minutes=2))), "llm")
    assert claim(run, "running")[1] == "true"


def test_select_runs_and_unknown_run(tmp_path: Path) -> None:
    log, _ = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log)
    assert [r["name"] for r in explain(dump, "research/llm")["runs"]] == ["llm"]
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "nope"])
    assert result.exit_code == 2 and "no run matches nope" in result.stderr and "research/llm" in result.stderr


def test_text_output_reads_like_the_design(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log, captured=last + timedelta(minutes=6))
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("research/llm") and "TauRun" in lines[0] and "1 workers × 8 GPUs" in lines[0]
    assert any(line.strip().startswith("scheduled") and "verified" in line for line in lines)
    assert any(line.strip().startswith("progressing") and "STALLED" in line for line in lines)


def test_bad_input_is_named_and_skipped_without_losing_the_rest(tmp_path: Path) -> None:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    dump = healthy_taurun(tmp_path, log)
    (dump / "broken.json").write_text('{"kind": "List", "items": [')
    (dump / "truncated.yaml").write_text(
        "apiVersion: ray.io/v1\nkind: RayJob\nmetadata:\n  name: ok-one\n  namespace: research\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n")
    (dump / "odd.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {namespace: research}\n---\n"
        "apiVersion: example.com/v1\nkind: Gizmo\nmetadata: {name: g, namespace: research}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: weird\n  namespace: research\n"
        "status: {phase: Exploded}\n")
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json",
                                       "--at", ts(last + timedelta(seconds=60))])
    assert result.exit_code == EXIT_SKIPPED, result.output
    err = result.stderr
    assert "skipped: broken.json: not valid JSON" in err
    assert "skipped: truncated.yaml: YAML error at line 11" in err and "kept the 1 document(s)" in err
    assert "skipped: odd.yaml: Pod without metadata.name" in err
    assert "unknown kind 'Gizmo'" in err
    assert "warning: odd.yaml#3: status.phase: value 'Exploded' never seen before" in err
    out = json.loads(result.stdout)
    assert {r["name"] for r in out["runs"]} == {"llm", "ok-one"}
    assert claim(only_run(out, "llm"), "progressing") == (True, "true", "verified")
