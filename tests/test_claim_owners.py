"""Fail closed, membership and the owner of every wait, on real object shapes and message text.

Messages are the upstream components' own (scheduler DynamicResources plugin, Kueue's tiered
QuotaReserved reasons, Karpenter's events and NodeClaim conditions, cluster-autoscaler's pod events);
the describe-table fixtures in tests/fixtures/events are real captures (SOURCES.tsv).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from collector.cli import main
from tests.dumpkit import describe_events, event, fixture_object, fixture_status, meta, owner_of, pod, ts, write_dump
from tests.test_explain_fixtures import NOW, admitted_job, claim, explain, kueue_job, only_run, taurun, workload_for

GPU = "nvidia.com/gpu"


def taucluster(*, resolved_at: Any = None, ready: str = "True", generation: int = 3, observed: int = 3,
               workers: int = 8) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauCluster",
            "metadata": {**meta("cluster", "", "tc", NOW - timedelta(days=1)), "generation": generation},
            "spec": {"workloadProfiles": [{"name": "a100-8x8"}]},
            "status": {"observedGeneration": observed,
                       "lastResolvedTime": ts(resolved_at or NOW - timedelta(minutes=5)),
                       "conditions": [{"type": "Ready", "status": ready, "reason": "Resolved",
                                       "lastTransitionTime": ts(NOW - timedelta(hours=1))}],
                       "resolvedProfiles": [{"name": "a100-8x8", "localQueue": "team-a", "clusterQueue": "gpu",
                                             "workers": workers, "gpusPerWorker": 8}]}}


def profile_run(tmp_path: Path, tc: dict[str, Any] | None) -> dict[str, Any]:
    """A TauRun that declares only its profile: its worker count is the TauCluster's to say."""
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), profile="a100-8x8")
    del tr["spec"]["workers"]
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    dump = write_dump(tmp_path / "d", [tr, p, *([tc] if tc else [])], captured=NOW)
    return only_run(explain(dump, "--at", ts(NOW)), "llm")


# --- fail closed -------------------------------------------------------------------------------------


def test_one_pod_of_an_eight_worker_profile_is_not_one_of_one(tmp_path: Path) -> None:
    run = profile_run(tmp_path / "fresh", taucluster())
    assert claim(run, "scheduled") == (True, "false", "contradicted")
    assert "1/8 pods bound" in run["claims"]["scheduled"]["reason"]


def test_stale_or_missing_taucluster_makes_counts_unknown(tmp_path: Path) -> None:
    cases = {
        "old": (taucluster(resolved_at=NOW - timedelta(hours=3)), "older than the trust bound"),
        "generation": (taucluster(generation=4, observed=3), "observedGeneration 3 < generation 4"),
        "notready": (taucluster(ready="False"), "TauCluster Ready is False"),
        "missing": (None, "TauCluster not observed"),
    }
    for name, (tc, needle) in cases.items():
        run = profile_run(tmp_path / name, tc)
        for c in ("scheduled", "running"):
            assert claim(run, c) == (True, "unknown", "unconfirmed"), (name, c)
            assert needle in run["claims"][c]["reason"], (name, run["claims"][c]["reason"])
        assert "1/1" not in run["claims"]["scheduled"]["reason"]


def test_a_taucluster_is_trusted_only_if_fresh_at_the_latest_the_dump_can_have_been_taken(tmp_path: Path) -> None:
    """A dump bounded only by heartbeats (no Leases) was taken up to 6 minutes after its newest stamp. A
    TauCluster resolved 28 minutes before that stamp is inside the 30-minute trust bound there, but may
    be 34 minutes old at the capture: its worker count is not trusted (it was, judged at the stamp)."""
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), profile="a100-8x8")
    del tr["spec"]["workers"]
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    for name, resolved, trusted in (("edge", NOW - timedelta(minutes=28), False),
                                    ("fresh", NOW - timedelta(minutes=20), True)):
        dump = write_dump(tmp_path / name, [tr, p, taucluster(resolved_at=resolved)], captured=NOW, leases=False)
        r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json"])
        run = only_run(json.loads(r.stdout), "llm")
        reason = run["claims"]["scheduled"]["reason"]
        assert ("older than the trust bound" in reason) is not trusted, (name, reason)
        if trusted:
            assert "1/8 pods bound" in reason, reason


# --- membership ----------------------------------------------------------------------------------------


def test_kuberay_submitter_pod_never_makes_a_pending_gpu_worker_look_scheduled(tmp_path: Path) -> None:
    rj = fixture_object("kuberay/rayjob_initializing_head_containercreating_karta_recorded.yaml")
    rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 1
    rj["status"]["jobDeploymentStatus"] = "Running"
    ns, cluster = rj["metadata"]["namespace"], rj["status"]["rayClusterName"]
    t = NOW - timedelta(minutes=10)
    head = pod(f"{cluster}-head-wcqw7", ns, t, node="w1",
               labels={"ray.io/cluster": cluster, "ray.io/node-type": "head"})
    worker = pod(f"{cluster}-worker-x1", ns, t, node=None, phase="Pending", gpus=8,
                 labels={"ray.io/cluster": cluster, "ray.io/node-type": "worker"})
    submitter_job = {"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": meta(rj["metadata"]["name"], ns, "uid-sub", t, owner=owner_of(rj)),
                     "spec": {"parallelism": 1, "template": {"spec": {"containers": []}}},
                     "status": {"active": 1, "ready": 1}}
    submitter = pod(f"{rj['metadata']['name']}-abcde", ns, t, node="w1", owner=owner_of(submitter_job),
                    labels={"batch.kubernetes.io/job-name": rj["metadata"]["name"]})
    out = explain(write_dump(tmp_path / "d", [rj, head, worker, submitter_job, submitter], captured=NOW),
                  "--at", ts(NOW))
    run = only_run(out, rj["metadata"]["name"])
    assert claim(run, "scheduled") == (True, "false", "contradicted")
    assert "1/2 pods bound" in run["claims"]["scheduled"]["reason"]  # head + 1 worker; submitter not counted
    assert claim(run, "running")[1] == "false"


def test_job_active_counts_pending_pods_and_helper_jobs_do_not_count(tmp_path: Path) -> None:
    tr = taurun("ft", "research", "Running", NOW - timedelta(hours=1), workers=1)
    tr["status"]["workloadName"] = "job-ft-main-1a2b3"
    main_job = kueue_job("ft-main", "research", NOW - timedelta(hours=1), queue="team-a")
    main_job["metadata"]["labels"]["taugrid.io/run"] = "ft"
    wl = workload_for(main_job, fixture_status("kueue/workload_admitted_kueue_docs.yaml"))
    wl["metadata"]["name"] = "job-ft-main-1a2b3"
    init_job = {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": meta("ft-init", "research", "uid-init", NOW - timedelta(hours=1),
                                 labels={"taugrid.io/run": "ft"}),
                "spec": {"parallelism": 1, "template": {"spec": {"containers": []}}}, "status": {"active": 1}}
    helper = pod("ft-init-x", "research", NOW - timedelta(hours=1), node="cpu-1", owner=owner_of(init_job),
                 labels={"taugrid.io/run": "ft"})
    worker = pod("ft-main-y", "research", NOW - timedelta(minutes=50), node=None, phase="Pending", gpus=8,
                 owner=owner_of(main_job), labels={"taugrid.io/run": "ft"})
    run = only_run(explain(write_dump(tmp_path / "d", [tr, main_job, wl, init_job, helper, worker], captured=NOW),
                           "--at", ts(NOW)), "ft")
    assert claim(run, "scheduled") == (True, "false", "contradicted")
    assert "0/1 pods bound" in run["claims"]["scheduled"]["reason"]
    # The Job itself: active=1 with its only pod Pending asserts nothing about scheduling.
    job_run = kueue_job("solo", "team-a", NOW - timedelta(minutes=5))
    p = pod("solo-1", "team-a", NOW - timedelta(minutes=5), node=None, phase="Pending", gpus=1,
            owner=owner_of(job_run))
    solo = only_run(explain(write_dump(tmp_path / "solo", [job_run, p], captured=NOW), "--at", ts(NOW)), "solo")
    assert claim(solo, "scheduled") == (None, "false", "unasserted")


# --- the owner of every wait ------------------------------------------------------------------------------


def pending(job: dict[str, Any], name: str, **kw: Any) -> dict[str, Any]:
    return pod(name, "team-a", NOW - timedelta(minutes=8), node=None, phase="Pending", gpus=8,
               owner=owner_of(job), **kw)


def blocked(objs: list[dict[str, Any]], tmp_path: Path, name: str = "train") -> dict[str, Any]:
    run = only_run(explain(write_dump(tmp_path / "d", objs, captured=NOW), "--at", ts(NOW)), name)
    assert run["claims"]["scheduled"]["observed"] == "false"
    b = run["blocked"]
    assert b is not None
    return b


def test_dra_claim_not_allocated_is_device_allocation(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending(job, "train-0")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "train-0-gpu-vppgv"}]
    rc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
          "metadata": {**meta("train-0-gpu-vppgv", "team-a", "rc1", NOW - timedelta(minutes=8),
                              owner={"apiVersion": "v1", "kind": "Pod", "name": "train-0", "uid": "uid-train-0"}),
                       "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
          "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
          "status": {}}
    # The scheduler's DynamicResources plugin, verbatim.
    fs = event("train-0.1", "team-a", p, "FailedScheduling",
               "0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match Pod's node "
               "affinity/selector. still not schedulable, preemption: 0/2 nodes are available: 2 Preemption is not "
               "helpful for scheduling.", NOW - timedelta(minutes=1), type_="Warning", component="default-scheduler")
    b = blocked([job, wl, p, rc, fs], tmp_path)
    assert b["stage"] == "device-allocation" and b["owner"] == "Device plugin or DRA"
    assert "cannot allocate all claims" in b["reason"] and "train-0-gpu-vppgv" in b["reason"]
    assert any(e["field"] == "status.allocation" for e in b["evidence"])


def test_device_plugin_advertising_fewer_gpus_than_installed_is_device_allocation(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending(job, "train-0")
    evs = describe_events("events/describe_pod_event_failedscheduling_insufficient_gpu_unschedulable_device_plugin_119"
                          ".txt", pod_name="train-0", ns="team-a", now=NOW)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": meta("gpu-1", "", "n1", NOW - timedelta(days=3)),
            "spec": {}, "status": {"capacity": {GPU: "8", "cpu": "96"}, "allocatable": {GPU: "6", "cpu": "95"},
                                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                   "lastTransitionTime": ts(NOW - timedelta(days=3))}]}}
    b = blocked([job, wl, p, node, *evs], tmp_path)
    assert b["stage"] == "device-allocation", b
    assert "gpu-1 6/8 allocatable" in b["reason"] and "Insufficient nvidia.com/gpu" in b["reason"]


def test_unhealthy_allocated_device_is_named(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=30))
    health = [{"name": GPU, "resources": [{"resourceID": "GPU-5d1e7c1a-58d6-4ef0-9e0a-0c1ac5d0e9b1",
                                             "health": "Unhealthy"}]}]
    p = pod("train-0", "team-a", NOW - timedelta(minutes=30), node="gpu-1", gpus=8, owner=owner_of(job),
            containers=[{"name": "main", "ready": True, "restartCount": 0, "allocatedResourcesStatus": health,
                         "state": {"running": {"startedAt": ts(NOW - timedelta(minutes=29))}}}])
    run = only_run(explain(write_dump(tmp_path / "run", [job, wl, p], captured=NOW), "--at", ts(NOW)), "train")
    assert run["claims"]["running"]["observed"] == "false"
    assert "Unhealthy" in run["claims"]["running"]["reason"] and "GPU-5d1e7c1a" in run["claims"]["running"]["reason"]
    # The same device health on a pod that never started: the device, not the scheduler, holds the run.
    q = pod("train-0", "team-a", NOW - timedelta(minutes=30), node="gpu-1", gpus=8, owner=owner_of(job),
            phase="Pending", ready=False,
            containers=[{"name": "main", "ready": False, "restartCount": 0, "allocatedResourcesStatus": health,
                         "state": {"waiting": {"reason": "ContainerCreating"}}}])
    b = blocked([job, wl, q], tmp_path / "pending")
    assert b["stage"] == "device-allocation" and "GPU-5d1e7c1a" in b["reason"]


def karpenter_events(pod_name: str) -> list[dict[str, Any]]:
    evs = describe_events("events/describe_pod_ray_gpu_worker_failedscheduling_karpenter_nominated_data_on_eks.txt",
                          pod_name=pod_name, ns="team-a", now=NOW)
    return [e for e in evs if e["reason"] in ("FailedScheduling", "Nominated")]  # before the node arrived


def test_karpenter_nodeclaim_that_failed_to_launch_is_node_scaling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=45))
    p = pending(job, "train-0")
    nodeclaim = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                 "metadata": meta("gpu-ljvhl", "", "nc1", NOW - timedelta(minutes=41),
                                  labels={"karpenter.sh/nodepool": "gpu"}),
                 "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}},
                 "status": {"conditions": [
                     {"type": "Launched", "status": "Unknown", "reason": "LaunchFailed",
                      "message": "creating instance, insufficient capacity, with fleet error(s), "
                                 "InsufficientInstanceCapacity: We currently do not have sufficient g5.12xlarge "
                                 "capacity in the Availability Zone you requested (us-west-2a).",
                      "lastTransitionTime": ts(NOW - timedelta(minutes=40))}]}}
    b = blocked([job, wl, p, nodeclaim, *karpenter_events("train-0")], tmp_path)
    assert b["stage"] == "node-scaling" and b["owner"] == "Cluster infrastructure"
    assert "NodeClaim gpu-ljvhl (NodePool gpu) Launched Unknown (LaunchFailed)" in b["reason"]
    assert "InsufficientInstanceCapacity" in b["reason"]


def test_karpenter_failed_scheduling_no_nodepool_fits_is_node_scaling(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending(job, "train-0")
    sched = event("train-0.1", "team-a", p, "FailedScheduling",
                  "0/7 nodes are available: 2 Insufficient cpu, 5 node(s) didn't match Pod's node affinity/selector. "
                  "preemption: 0/7 nodes are available: 2 No preemption victims found for incoming pod, 5 Preemption "
                  "is not helpful for scheduling.", NOW - timedelta(minutes=2), type_="Warning",
                  component="default-scheduler")
    karp = event("train-0.2", "team-a", p, "FailedScheduling",
                 'Failed to schedule pod, incompatible with nodepool "teama-spot", daemonset overhead={"cpu":"150m",'
                 '"pods":"2"}, incompatible requirements, key capacity_type, capacity_type In [on-demand] not in '
                 "capacity_type In [spot]", NOW - timedelta(minutes=1), type_="Warning", component="karpenter")
    b = blocked([job, wl, p, sched, karp], tmp_path)
    assert b["stage"] == "node-scaling" and "Karpenter cannot provision a node" in b["reason"]
    assert 'incompatible with nodepool "teama-spot"' in b["reason"]


def admission_check(name: str, controller: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
            "metadata": meta(name, "", f"ac-{name}", NOW - timedelta(days=1)), "spec": {"controllerName": controller}}


def test_admission_check_owner_comes_from_its_controller_not_its_name(tmp_path: Path) -> None:
    job = kueue_job("train", "team-a", NOW - timedelta(minutes=8), suspend=True)
    status = fixture_status("kueue/workload_pending_admissioncheck_provreq_kueue_docs.yaml")
    status["admissionChecks"][0]["name"] = "budget-approval"
    wl = workload_for(job, status)
    b = blocked([job, wl, admission_check("budget-approval", "example.com/budget-approval")], tmp_path / "budget")
    assert b["stage"] == "queue-admission" and "example.com/budget-approval" in b["reason"]
    # Named like a provisioning check, but nothing says it is one: Kueue's, with its controller unknown.
    status["admissionChecks"][0]["name"] = "capacity-prov"
    wl = workload_for(job, status)
    b = blocked([job, wl], tmp_path / "unknown")
    assert b["stage"] == "queue-admission" and "not observed" in b["reason"]
    b = blocked([job, wl, admission_check("capacity-prov", "kueue.x-k8s.io/provisioning-request")], tmp_path / "pr")
    assert b["stage"] == "node-scaling" and "ProvisioningRequest" in b["reason"]


def test_tiered_quota_reserved_reasons_stay_with_kueue(tmp_path: Path) -> None:
    job = kueue_job("train", "team-a", NOW - timedelta(minutes=8), suspend=True)
    cases = {
        "ExceedsMaxQuota": "couldn't assign flavors to pod set one: insufficient quota for cpu in flavor default, "
                           "previously considered podsets requests (0) + current podset request (10) > maximum "
                           "capacity (8)",
        "TopologyPlacementFailed": "couldn't assign flavors to pod set main: topology \"default\" doesn't allow to fit "
                                   "any of 4 pod(s)",
        "WaitingForQuota": "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
                           "flavor a100, 8 more needed",
    }
    for reason, message in cases.items():
        wl = workload_for(job, {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": reason,
                                                "message": message,
                                                "lastTransitionTime": ts(NOW - timedelta(minutes=7))}]})
        b = blocked([job, wl], tmp_path / reason)
        assert b["stage"] == "queue-admission", reason
        assert f"({reason}" in b["reason"] and message in b["reason"], b["reason"]


def test_node_not_ready_under_a_pod_is_why_running_is_false(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(hours=1))
    p = pod("train-0", "team-a", NOW - timedelta(hours=1), node="gpu-7", gpus=8, owner=owner_of(job))
    node = {"apiVersion": "v1", "kind": "Node", "metadata": meta("gpu-7", "", "n7", NOW - timedelta(days=3)),
            "spec": {}, "status": {"capacity": {GPU: "8"}, "allocatable": {GPU: "8"}, "conditions": [
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status.",
                 "lastTransitionTime": ts(NOW - timedelta(minutes=3))}]}}
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, p, node], captured=NOW), "--at", ts(NOW)), "train")
    r = run["claims"]["running"]
    assert r["observed"] == "false"
    assert "node gpu-7 under pod train-0 is Unknown (NodeStatusUnknown)" in r["reason"]
    assert any(e["ref"] == "Node/gpu-7" for e in r["evidence"])


def test_pod_scheduled_condition_is_the_evidence_without_events(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending(job, "train-0")
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": "0/9 nodes are available: 9 node(s) didn't match Pod's node "
                                             "affinity/selector. preemption: 0/9 nodes are available: 9 Preemption "
                                             "is not helpful for scheduling.",
                                  "lastTransitionTime": ts(NOW - timedelta(minutes=7))}]
    b = blocked([job, wl, p], tmp_path)
    assert b["stage"] == "pod-scheduling"
    assert "didn't match Pod's node affinity/selector" in b["reason"]
    assert any(e["field"] == "status.conditions[PodScheduled]" for e in b["evidence"])


def test_old_terminated_pods_error_does_not_explain_the_replacement(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=30))
    old = pod("train-old", "team-a", NOW - timedelta(minutes=30), node="gpu-node-1", gpus=8, owner=owner_of(job),
              status=fixture_status("pods/pod_status_unexpectedadmissionerror_no_healthy_devices_k8s_128854.yaml"))
    new = pending(job, "train-new")
    evs = describe_events("events/describe_pod_failedscheduling_nottriggerscaleup_kueue_docs.txt",
                          pod_name="train-new", ns="team-a", now=NOW)
    b = blocked([job, wl, old, new, *evs], tmp_path)
    assert b["stage"] == "pod-scheduling", b
    assert "UnexpectedAdmissionError" not in b["reason"] and "node affinity/selector" in b["reason"]


def test_multikueue_dispatched_run_is_not_contradicted(tmp_path: Path) -> None:
    job = kueue_job("train", "team-a", NOW - timedelta(minutes=20))
    job["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    job["status"] = {"active": 1, "ready": 1}  # mirrored back from the worker
    status = fixture_status("kueue/workload_admitted_kueue_docs.yaml")
    status["clusterName"] = "worker-eu-1"
    status["admissionChecks"] = [{"name": "sample-multikueue", "state": "Ready",
                                  "message": 'The workload got reservation on "worker-eu-1"',
                                  "lastTransitionTime": ts(NOW - timedelta(minutes=19))}]
    wl = workload_for(job, status)
    ac = admission_check("sample-multikueue", "kueue.x-k8s.io/multikueue")
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl, ac], captured=NOW), "--at", ts(NOW)), "train")
    for c in ("scheduled", "running"):
        assert claim(run, c) == (True, "unknown", "unconfirmed"), c
        assert "worker cluster worker-eu-1" in run["claims"][c]["reason"]
    assert run["blocked"] is None and run["context"]["worker_cluster"] == "worker-eu-1"


# --- a bare cluster-info dump ----------------------------------------------------------------------------------


def test_bare_cluster_info_dump_infers_runs_and_names_what_is_missing(tmp_path: Path) -> None:
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "llm-raycluster", "uid": "rc-uid"}
    t = NOW - timedelta(minutes=20)
    head = pod("llm-raycluster-head-x", "ml", t, node="cpu-1", owner=rc,
               labels={"ray.io/cluster": "llm-raycluster", "ray.io/node-type": "head"})
    worker = pod("llm-raycluster-gpu-worker-y", "ml", t, node=None, phase="Pending", gpus=8, owner=rc,
                 labels={"ray.io/cluster": "llm-raycluster", "ray.io/node-type": "worker"})
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "sft", "uid": "job-uid"}
    sft = pod("sft-abcde", "ml", t, node="gpu-2", gpus=8, owner=job,
              labels={"batch.kubernetes.io/job-name": "sft", "kueue.x-k8s.io/queue-name": "team-a"})
    cron = pod("backup-29h", "ml", t, node="cpu-1", owner={**job, "name": "backup"},
               labels={"batch.kubernetes.io/job-name": "backup"})
    dump = write_dump(tmp_path / "d", [head, worker, sft, cron], captured=NOW)
    out = explain(dump, "--at", ts(NOW))
    runs = {r["name"]: r for r in out["runs"]}
    assert set(runs) == {"llm-raycluster", "sft"}  # a CPU Job nobody queued is not a training run
    ray = runs["llm-raycluster"]
    assert ray["kind"] == "RayCluster" and ray["context"]["inferred_from"] == "pods"
    assert claim(ray, "scheduled") == (None, "false", "unasserted")  # a worker is Pending: no count needed
    sft_run = runs["sft"]
    assert sft_run["claims"]["scheduled"]["observed"] == "unknown"  # every pod bound, but how many are due?
    assert "not observed (run inferred from its pods)" in sft_run["claims"]["scheduled"]["reason"]
    assert {"RayCluster", "Job", "Workload", "TauRun"} <= set(out["missing"]["kinds"])
    assert out["missing"]["command"].startswith("kubectl get ") and f"> {dump}/crds.json" in out["missing"]["command"]
    text = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", ts(NOW)])
    assert text.exit_code == 0 and "missing from the dump:" in text.stdout and "kubectl get " in text.stdout


def test_karpenter_insufficient_capacity_event_outlives_its_nodeclaim(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=45))
    p = pending(job, "train-0")
    nodeclaim = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "gpu-ljvhl"}}
    # Karpenter deletes a NodeClaim that hit an insufficient-capacity error; its event stays (in "default").
    ice = event("gpu-ljvhl.ice", "default", nodeclaim, "InsufficientCapacityError",
                "NodeClaim gpu-ljvhl event: creating instance, insufficient capacity, with fleet error(s), "
                "InsufficientInstanceCapacity: We currently do not have sufficient g5.12xlarge capacity in the "
                "Availability Zone you requested (us-west-2a).", NOW - timedelta(minutes=40), type_="Warning",
                component="karpenter")
    b = blocked([job, wl, p, ice, *karpenter_events("train-0")], tmp_path)
    assert b["stage"] == "node-scaling" and "InsufficientCapacityError" in b["reason"]
    assert "g5.12xlarge" in b["reason"]


def test_topology_aware_scheduling_gate_is_kueues(tmp_path: Path) -> None:
    job, wl = admitted_job(NOW - timedelta(minutes=8))
    p = pending(job, "train-0")
    p["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                  "message": "Scheduling is blocked due to non-empty scheduling gates",
                                  "lastTransitionTime": ts(NOW - timedelta(minutes=8))}]
    b = blocked([job, wl, p], tmp_path)
    assert b["stage"] == "queue-admission" and "kueue.x-k8s.io/topology" in b["reason"]


def test_multikueue_cluster_name_alone_is_enough(tmp_path: Path) -> None:
    job = kueue_job("train", "team-a", NOW - timedelta(minutes=20))
    status = fixture_status("kueue/workload_admitted_kueue_docs.yaml")
    status["clusterName"] = "worker-eu-1"  # the AdmissionCheck and the Job's managedBy are not in this dump
    wl = workload_for(job, status)
    run = only_run(explain(write_dump(tmp_path / "d", [job, wl], captured=NOW), "--at", ts(NOW)), "train")
    assert run["claims"]["scheduled"]["observed"] == "unknown"
    assert run["claims"]["scheduled"]["verdict"] != "contradicted"
    assert "worker-eu-1" in run["claims"]["scheduled"]["reason"]
