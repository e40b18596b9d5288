"""More of the world the scenario engine plays: admission checks, MultiKueue dispatch, DRA claims,
Karpenter NodeClaims, and the progress-line styles of several trainers.

Shapes and message texts follow the upstream projects: Kueue `kueue.x-k8s.io/v1beta1` Workloads
(status.admissionChecks, status.clusterName) and AdmissionChecks (spec.controllerName); the
scheduler's DRA plugin ("cannot allocate all claims") with `resource.k8s.io/v1` ResourceClaims
that carry no status.allocation; Karpenter `karpenter.sh/v1` NodeClaims, its `Nominated` event
("Pod should schedule on: nodeclaim/NAME") and its own FailedScheduling on NodePool limits;
DeepSpeed's `step=N, skipped=M` and OVERFLOW lines; Lightning's tqdm bars.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kubesim.errors import ApiError
from kubesim.scenario import parse_duration

if TYPE_CHECKING:
    from kubesim.engine import PodState, RunState, ScenarioEngine
    from kubesim.engine.core import EngineCore

Obj = dict[str, Any]
KUEUE_GV = "kueue.x-k8s.io/v1beta1"
PROVREQ_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
DRA_GV = "resource.k8s.io/v1"
KARPENTER_GV = "karpenter.sh/v1"


def _ensure_admission_check(eng: ScenarioEngine, name: str, controller: str) -> None:
    try:
        eng.client.get(KUEUE_GV, "AdmissionCheck", "", name)
        return
    except ApiError as exc:
        if exc.code != 404:
            raise
    spec: Obj = {"controllerName": controller}
    if controller == PROVREQ_CONTROLLER:
        spec["parameters"] = {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                              "name": f"{name}-config"}
    eng._create(
        {"apiVersion": KUEUE_GV, "kind": "AdmissionCheck", "metadata": {"name": name}, "spec": spec},
        status={"conditions": [eng._cond("Active", True, "Active", "The admission check is active")]},
    )


def _reserve(eng: ScenarioEngine, r: RunState, checks: list[Obj], extra: Obj | None = None) -> str:
    """Quota reserved in the run's ClusterQueue, with the given admission check states."""
    cq = r.spec.cluster_queue
    flavor = next((c.flavor for c in eng.scenario.cluster_queues if c.name == cq), "default")
    eng._set_cond(
        r.wl_conditions, eng._cond("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq}")
    )
    gpus = r.spec.workers * r.spec.gpus_per_worker
    name = "gpu-workers" if r.spec.kind == "RayJob" else "main"
    admission = {
        "clusterQueue": cq,
        "podSetAssignments": [
            {
                "name": name,
                "count": r.spec.workers,
                "flavors": {"cpu": flavor, "memory": flavor, "nvidia.com/gpu": flavor},
                "resourceUsage": {"cpu": str(32 * r.spec.workers), "nvidia.com/gpu": str(gpus)},
            }
        ],
    }
    eng._wl_status(r, {"admission": admission, "admissionChecks": checks, **(extra or {})})
    if r.workload is not None:
        eng.event(r.workload, "Normal", "QuotaReserved", f"Quota reserved in ClusterQueue {cq}, wait time since "
                  "queued was 2s", "kueue-admission")
    return cq


def admission_check(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    name = str(args.get("name", "dws-prov"))
    controller = str(args.get("controllerName", PROVREQ_CONTROLLER))
    _ensure_admission_check(eng, name, controller)
    message = str(args.get("message", ""))
    check = {"name": name, "state": str(args.get("state", "Pending")), "message": message,
             "lastTransitionTime": eng._now()}
    _reserve(eng, r, [check])
    # A ProvisioningRequest check waits for nodes; any other controller's check is Kueue's own gate.
    r.wait_stage = "node-scaling" if controller == PROVREQ_CONTROLLER else "queue-admission"
    if r.taurun is not None:
        eng._set_cond(r.conditions, eng._cond("Admitted", False, "AdmissionCheckPending",
                                              f"admission check {name} is {check['state']}"))
        eng._tau_status(r, "Pending")


def dispatch(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    """MultiKueue: the manager's Workload got a reservation on a worker cluster and runs there."""
    worker = str(args.get("cluster", "worker-1"))
    _ensure_admission_check(eng, "multikueue", MULTIKUEUE_CONTROLLER)
    check = {"name": "multikueue", "state": "Ready", "message": f'The workload got reservation on "{worker}"',
             "lastTransitionTime": eng._now()}
    eng._set_cond(r.wl_conditions, eng._cond("Admitted", True, "Admitted", "The workload is admitted"))
    cq = _reserve(eng, r, [check], {"clusterName": worker})
    if r.workload is not None:
        eng.event(r.workload, "Normal", "Admitted", f"Admitted by ClusterQueue {cq}, wait time since reservation "
                  "was 0s", "kueue-admission")
    assert r.root is not None
    eng._patch(r.root, {"spec": {"suspend": False, "managedBy": MULTIKUEUE_CONTROLLER}})
    r.admitted = True
    r.dispatched = worker
    r.wait_stage = ""
    now = eng._now()
    if r.spec.kind == "RayJob":
        eng._status(r.root, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": now})
    else:
        eng._status(r.root, {"startTime": now, "active": r.spec.workers, "ready": r.spec.workers,
                             "conditions": [eng._cond("Suspended", False, "JobResumed", "Job resumed")]})
    if r.taurun is not None:
        for c in ("Admitted", "Scheduled", "Running"):
            eng._set_cond(r.conditions, eng._cond(c, True, "Dispatched", f"running on MultiKueue worker {worker}"))
        eng._tau_status(r, "Running")
    eng._sync_queues()


def _pending(r: RunState) -> list[PodState]:
    return [p for p in r.pods if not p.deleted and not p.node and p.gpus]


def _repeat_failed_scheduling(eng: ScenarioEngine, r: RunState, every: float, message: Callable[[], str]) -> None:
    gen = r.train_gen

    def tick() -> None:
        pending = _pending(r)
        if not pending or gen != r.train_gen or not r.admitted:
            return
        text = message()
        for pod in pending:
            eng._set_cond(pod.conditions, eng._cond("PodScheduled", False, "Unschedulable", text))
            eng._pod_status(pod)
            eng.event(pod.ref, "Warning", "FailedScheduling", text, "default-scheduler")
        eng._after(every, tick)

    tick()


def dra_wait(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    device_class = str(args.get("deviceClass", "gpu.nvidia.com"))
    for pod in _pending(r):
        claim = f"{pod.ref.name}-gpu-{eng._suffix()}"
        eng._create(
            {
                "apiVersion": DRA_GV,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": claim,
                    "namespace": pod.ref.namespace,
                    "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                    "ownerReferences": [pod.ref.owner()],
                },
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": device_class,
                                    "allocationMode": "ExactCount",
                                    "count": pod.gpus,
                                },
                            }
                        ]
                    }
                },
            }
        )  # no status.allocation: the allocator found no devices for it
        template = {"name": "gpu", "resourceClaimTemplateName": f"{r.spec.name}-gpu"}
        eng.client.patch("v1", "Pod", pod.ref.namespace, pod.ref.name, {"spec": {"resourceClaims": [template]}})
        eng.client.patch("v1", "Pod", pod.ref.namespace, pod.ref.name,
                         {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}, "status")
    r.wait_stage = "device-allocation"

    def message() -> str:
        nodes = eng._free_nodes()
        total, gpu = len(nodes), sum(1 for n in nodes if n.spec.gpus)
        parts = [f"{gpu} cannot allocate all claims"] if gpu else []
        if total - gpu:
            parts.append(f"{total - gpu} node(s) had untolerated taint {{node-role.kubernetes.io/system: }}")
        return (f"0/{total} nodes are available: {', '.join(parts)}. still not schedulable, preemption: "
                f"0/{total} nodes are available: {total} Preemption is not helpful for scheduling.")

    fixed = str(args.get("message", ""))
    every = parse_duration(args.get("repeatEvery", 60), "repeatEvery")
    _repeat_failed_scheduling(eng, r, every, (lambda: fixed) if fixed else message)


def karpenter_wait(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    pool = str(args.get("nodePool", "gpu"))
    pending = _pending(r)
    r.wait_stage = "node-scaling"
    every = parse_duration(args.get("repeatEvery", 60), "repeatEvery")
    _repeat_failed_scheduling(eng, r, every, eng._unschedulable_message)
    if args.get("limits"):
        for pod in pending:
            eng.event(pod.ref, "Warning", "FailedScheduling",
                      f'Failed to schedule pod, all available instance types exceed limits for nodepool "{pool}"',
                      "karpenter")
        return
    if not pending:
        return
    gpus = sum(p.gpus for p in pending)
    claim = eng._create(
        {
            "apiVersion": KARPENTER_GV,
            "kind": "NodeClaim",
            "metadata": {
                "name": f"{pool}-{eng._suffix()}",
                "labels": {"karpenter.sh/nodepool": pool, "nvidia.com/gpu.present": "true"},
            },
            "spec": {
                "nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass", "name": "default"},
                "requirements": [
                    {"key": "karpenter.sh/nodepool", "operator": "In", "values": [pool]},
                    {"key": "node.kubernetes.io/instance-type", "operator": "In",
                     "values": ["Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4"]},
                ],
                "resources": {"requests": {"nvidia.com/gpu": str(gpus), "pods": str(len(pending))}},
            },
        },
        status={
            "conditions": [
                {"type": t, "status": "Unknown", "reason": "AwaitingReconciliation",
                 "message": "object is awaiting reconciliation", "lastTransitionTime": eng._now()}
                for t in ("Launched", "Registered", "Initialized", "Ready")
            ]
        },
    )
    for pod in pending:
        eng.event(pod.ref, "Normal", "Nominated", f"Pod should schedule on: nodeclaim/{claim.name}", "karpenter")


def device_reject(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    """Bound GPU pods rejected at admission by the kubelet's device manager (no healthy devices)."""
    detail = str(args.get("message") or "Allocate failed due to no healthy devices present; cannot allocate "
                 "unhealthy devices nvidia.com/gpu, which is unexpected")
    for pod in r.pods:
        if pod.deleted or not pod.node or not pod.gpus:
            continue
        pod.phase, pod.reason, pod.message = "Failed", "UnexpectedAdmissionError", f"Pod was rejected: {detail}"
        pod.state, pod.ready = {}, False
        eng._pod_status(pod)
        eng.event(pod.ref, "Warning", "UnexpectedAdmissionError", detail, "kubelet", pod.node)
    r.wait_stage = "device-allocation"


def progress_lines(eng: EngineCore, style: str, template: str, f: Obj, skipped: bool, skipped_total: int,
                   eval_every: int) -> list[str]:
    """One step's log lines in the given trainer's format."""
    it = int(f["iteration"])
    if style == "deepspeed":
        t = f.get("now") or eng.clock.now()
        prefix = f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}]"
        lines = []
        if skipped:
            lines.append(f"{prefix} [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
                         "step. Attempted loss scale: 4096, reducing to 2048")
        lines.append(f"{prefix} [INFO] [logging.py:96:log_dist] [Rank 0] step={it}, skipped={skipped_total}, "
                     f"lr=[{f['lr']:.6e}], mom=[(0.9, 0.95)]")
        return lines
    if style == "lightning":
        per_epoch = 500
        n, epoch = (it - 1) % per_epoch + 1, (it - 1) // per_epoch
        pct = n * 100 // per_epoch
        sec = float(f["ms"]) / 1000
        done, left = int(n * sec), int((per_epoch - n) * sec)
        bar = "█" * (pct // 10) + " " * (10 - pct // 10)
        lines = [f"Epoch {epoch}:  {pct:3d}%|{bar}| {n}/{per_epoch} [{done // 60:02d}:{done % 60:02d}<"
                 f"{left // 60:02d}:{left % 60:02d}, {sec:.2f}s/it, loss={float(f['loss']):.3f}, v_num=193315]"]
        if eval_every and it % eval_every == 0:
            frames = [
                "Validation DataLoader 0:   0%|          | 0/20 [00:00<?, ?it/s]",
                "Validation DataLoader 0:  50%|█████     | 10/20 [00:02<00:02,  4.80it/s]",
                "Validation DataLoader 0: 100%|██████████| 20/20 [00:04<00:00,  4.80it/s]",
            ]
            lines.append("\r".join(frames))
        return lines
    if style == "hf":  # Hugging Face Trainer with disable_tqdm: loss dicts carry no step
        return [f"{{'loss': {float(f['loss']):.4f}, 'grad_norm': {float(f['grad_norm']):.4f}, "
                f"'learning_rate': {float(f['lr']):.4e}, 'epoch': {it / 5000:.2f}}}"]
    return [template.format(**f)]


def resume_lines(style: str, path: str, step: int, t: datetime) -> list[str]:
    """What each trainer prints when it resumes from a checkpoint (its step in its own words)."""
    if style == "deepspeed":
        prefix = f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}]"
        return [f"{prefix} [INFO] [torch_checkpoint_engine.py:27:load] [Torch] Loading checkpoint from "
                f"{path}/global_step{step}/mp_rank_00_model_states.pt..."]
    if style == "lightning":
        ckpt = f"{path}/epoch={(step - 1) // 500}-step={step}.ckpt"
        return [f"Restoring states from the checkpoint path at {ckpt}",
                f"Restored all states from the checkpoint at {ckpt}"]
    if style == "hf":
        return ["  Continuing training from checkpoint, will skip to saved global_step",
                f"  Continuing training from epoch {step // 5000}", f"  Continuing training from global step {step}"]
    return [f"loading checkpoint from {path} at iteration {step}",
            f"  successfully loaded checkpoint from {path} [ t 0/1, p 0/1 ] at iteration {step}"]


def submitter(eng: ScenarioEngine, r: RunState, args: Mapping[str, Any]) -> None:
    """KubeRay K8sJobMode: a batch Job named like the RayJob whose pod runs `ray job submit` on a CPU node."""
    if r.root is None or r.spec.kind != "RayJob" or r.raycluster is None:
        return
    ns, name = r.spec.namespace, r.spec.name
    labels = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": name,
              "app.kubernetes.io/created-by": "kuberay-operator"}
    container = {"name": "ray-job-submitter", "image": r.spec.image,
                 "command": ["ray", "job", "submit", "--address", f"http://{r.raycluster.name}-head-svc.{ns}.svc."
                             "cluster.local:8265", "--submission-id", r.job_id, "--", "python", "-m", "train"],
                 "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}}}
    job = eng._create(
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": [r.root.owner()]},
         "spec": {"backoffLimit": 2, "template": {"metadata": {"labels": labels},
                                                   "spec": {"restartPolicy": "Never", "containers": [container]}}}},
        status={"active": 1, "ready": 1, "startTime": eng._now()},
    )
    node = next((n.spec.name for n in eng.nodes.values() if not n.spec.gpus and n.ready), "")
    pod_name = f"{name}-{eng._suffix()}"
    pod_labels = {**labels, "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": job.uid, "controller-uid": job.uid}
    ref = eng._create(
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": pod_name, "namespace": ns, "labels": pod_labels, "ownerReferences": [job.owner()]},
         "spec": {"restartPolicy": "Never", "nodeName": node, "containers": [container]}},
    )
    now = eng._now()
    conds = [{"type": t, "status": "True", "lastTransitionTime": now}
             for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    eng._status(ref, {"phase": "Running", "conditions": conds, "startTime": now, "podIP": "10.244.0.9",
                      "containerStatuses": [{"name": "ray-job-submitter", "image": r.spec.image, "ready": True,
                                             "started": True, "restartCount": 0,
                                             "state": {"running": {"startedAt": now}}}]})
    eng.event(job, "Normal", "SuccessfulCreate", f"Created pod: {pod_name}", "job-controller")
    eng.client.append_log(ns, pod_name, "ray-job-submitter", [
        f"{eng.clock.now():%Y-%m-%d %H:%M:%S},000\tINFO cli.py:39 -- Job submission server address: "
        f"http://{r.raycluster.name}-head-svc.{ns}.svc.cluster.local:8265",
        f"{eng.clock.now():%Y-%m-%d %H:%M:%S},000\tSUCC cli.py:63 -- Job '{r.job_id}' submitted successfully",
        f"{eng.clock.now():%Y-%m-%d %H:%M:%S},000\tINFO cli.py:303 -- Tailing logs until the job exits "
        "(disable with --no-wait):",
    ], now)


ACTIONS: dict[str, Callable[[ScenarioEngine, RunState, Mapping[str, Any]], None]] = {
    "admissionCheck": admission_check,
    "deviceReject": device_reject,
    "dispatch": dispatch,
    "draWait": dra_wait,
    "karpenterWait": karpenter_wait,
    "submitter": submitter,
}
