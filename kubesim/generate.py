"""A seeded random scenario of many runs, each of one class the collector must tell apart.

`generate(seed, runs)` returns a `Scenario` the engine plays, the class of each run (the harness
groups its results by class; the collector never sees it), and the instant to judge at. Run names
are neutral (`run-0042`), so nothing but the cluster's own objects tells a class apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubesim.scenario import Scenario, scenario_from_dict

# Class → relative weight in the mix.
CLASSES: dict[str, int] = {
    "healthy": 6,
    "stall": 3,
    "hang-with-steps": 2,
    "hang-no-steps": 2,
    "hang-steps-out-of-tail": 1,
    "crash-loop": 2,
    "quota-wait": 2,
    "quota-wait-tiered": 2,
    "preempted-requeued": 1,
    "admission-check-kueue": 2,
    "admission-check-provisioning": 2,
    "dra-wait": 2,
    "karpenter-nominated": 2,
    "karpenter-limits": 1,
    "autoscaler-scale-up": 2,
    "autoscaler-no-scale-up": 1,
    "unschedulable-affinity": 1,
    "partially-scheduled": 2,
    "submitter-worker-pending": 1,
    "unschedulable-no-events": 1,
    "topology-placement-failed": 1,
    "device-unhealthy": 1,
    "hf-loss-dicts": 1,
    "profile-unresolved": 1,
    "replay-recent-restart": 1,
    "replay-old-restart": 1,
    "restart-recovered": 2,
    "lagging-ranks": 2,
    "eval-bars": 2,
    "deepspeed-skipped-all": 1,
    "deepspeed-skipped-most": 1,
    "deepspeed-healthy": 1,
    "multikueue-dispatched": 2,
    "node-loss": 2,
}
# What each class plays (for the report).
DESCRIPTIONS: dict[str, str] = {
    "healthy": "admitted, bound, running, steps advance (Megatron, Lightning or DeepSpeed lines); RayJobs have "
               "their K8sJobMode submitter pod",
    "stall": "steps stop; pods stay Running and Ready",
    "hang-with-steps": "steps stop, then NCCL watchdog timeouts (torch 2.x format, SeqNum; last rank one behind)",
    "hang-no-steps": "no step line ever, then NCCL watchdog timeouts",
    "hang-steps-out-of-tail": "steps stop, 520 NCCL INFO lines push them out of a 500-line tail, then watchdog",
    "crash-loop": "steps stop; workers OOMKilled/Error, CrashLoopBackOff",
    "quota-wait": "Workload QuotaReserved=False (Pending), insufficient unused quota",
    "quota-wait-tiered": "QuotaReserved=False with reason WaitingForQuota or ExceedsMaxQuota",
    "preempted-requeued": "ran, preempted by Kueue, pods deleted, waiting for quota again",
    "admission-check-kueue": "quota reserved; a custom AdmissionCheck (controllerName example.com/budget-approval, "
                             "names like capacity-review) Pending",
    "admission-check-provisioning": "quota reserved; a ProvisioningRequest AdmissionCheck (controllerName "
                                    "kueue.x-k8s.io/provisioning-request, names dws/gpu-reserve/flex-start) Pending",
    "dra-wait": "GPU pods with ResourceClaims (resource.k8s.io/v1) never allocated; 'cannot allocate all claims'",
    "karpenter-nominated": "scheduler FailedScheduling, Karpenter NodeClaim launching, 'Pod should schedule on'",
    "karpenter-limits": "Karpenter FailedScheduling: instance types exceed the NodePool limits",
    "autoscaler-scale-up": "FailedScheduling (Insufficient nvidia.com/gpu) and cluster-autoscaler TriggeredScaleUp",
    "autoscaler-no-scale-up": "FailedScheduling and cluster-autoscaler NotTriggerScaleUp",
    "unschedulable-affinity": "FailedScheduling: node affinity/selector mismatch, no autoscaler",
    "unschedulable-no-events": "as above, the events aged out: only PodScheduled=False says why",
    "partially-scheduled": "half the workers bound, the rest Unschedulable",
    "submitter-worker-pending": "head and K8sJobMode submitter running, the one GPU worker Pending",
    "profile-unresolved": "TauRun whose profile TauCluster status does not resolve; nothing created below it",
    "replay-recent-restart": "all containers restart 5-9 min before judging; steps resume far below the "
                             "pre-restart high-water mark (still replaying)",
    "replay-old-restart": "the same, restart 11-13 min before judging (outside a 10 min restart window)",
    "restart-recovered": "restart 4-9 min before; steps resume a few below the mark and pass it",
    "lagging-ranks": "workers log with [rankN]: prefixes, each rank some steps behind the previous",
    "eval-bars": "Lightning tqdm training bars with validation bars (\\r-joined frames) interleaved",
    "deepspeed-skipped-all": "DeepSpeed step=/skipped= with every step skipped (fp16 overflow) after a while",
    "deepspeed-skipped-most": "the same with 80% of steps skipped",
    "deepspeed-healthy": "DeepSpeed step= lines, nothing skipped",
    "multikueue-dispatched": "Workload admitted and dispatched to a MultiKueue worker; no local pods",
    "node-loss": "a worker's node goes NotReady (Unknown); its pods NotReady; steps stop",
    "topology-placement-failed": "QuotaReserved=False, reason TopologyPlacementFailed (topology-aware scheduling)",
    "device-unhealthy": "GPU pods bound, then rejected by the kubelet: UnexpectedAdmissionError, no healthy devices",
    "hf-loss-dicts": "Hugging Face Trainer loss dicts without step or progress bar, advancing",
}
EVAL_AT = 16 * 60.0  # scenario seconds at which the harness compares claims with the truth
START = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
NAMESPACES = ("research", "team-b", "team-c")
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
AFFINITY_MESSAGE = (
    "0/{n} nodes are available: {n} node(s) didn't match Pod's node affinity/selector. preemption: 0/{n} nodes "
    "are available: {n} Preemption is not helpful for scheduling."
)


@dataclass(frozen=True, slots=True)
class Generated:
    scenario: Scenario
    classes: dict[tuple[str, str], str]  # (namespace, run) → class
    eval_at: float


def _watchdog(at: datetime, rank: int, seq: int, completed: int, timeout_ms: int = 600_000) -> list[str]:
    """PyTorch ≥ 2.2 NCCL watchdog lines (format of tests/fixtures/training_logs, torch2x)."""
    stamp = f"E{at.month}{at.day:02d} {at:%H:%M:%S}.{at.microsecond:06d}123"
    return [
        f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
        f"Timeout(ms)={timeout_ms}) ran for {timeout_ms + 60} milliseconds before timing out.",
        f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:1664] [PG 1 Rank {rank}] Exception (either an error or "
        f"timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq + 2}, last completed NCCL "
        f"work: {completed}.",
    ]


def _dur(seconds: float) -> str:
    return f"{seconds:.0f}s"


class _Builder:
    def __init__(self, rng: random.Random, start: datetime, eval_at: float) -> None:
        self.rng = rng
        self.start = start
        self.eval_at = eval_at
        self.gpu_pods = 0

    def run(self, i: int, cls: str) -> dict[str, Any]:
        rng = self.rng
        kind = "Job" if rng.random() < 0.3 and cls not in ("profile-unresolved", "submitter-worker-pending") \
            else "RayJob"
        profile = rng.choice(["a100-1x8", "a100-2x8", "a100-2x8", "a100-4x8"])
        if cls == "profile-unresolved":
            profile = "h200-8x8"
        ns = rng.choice(NAMESPACES)
        at = rng.uniform(0, 60)
        run: dict[str, Any] = {"name": f"run-{i:04d}", "namespace": ns, "kind": kind, "profile": profile,
                               "image": IMAGE, "at": _dur(at)}
        if kind == "Job":
            run["queue"] = "a100"
        workers = int(profile.split("-")[1].split("x")[0])
        every = rng.choice([10, 15, 20, 30])
        start = rng.uniform(25, 50)
        ev = rng.uniform(180, 420)  # when the class's event happens, relative to submission
        steps: list[dict[str, Any]] = [{"at": "2s", "admit": {}}]
        up = [{"at": "4s", "schedule": {}}, {"at": "5s", "pull": {}},
              {"at": _dur(start), "start": {"pullSeconds": round(start - 6, 1)}}]
        train: dict[str, Any] = {"every": f"{every}s", "iterations": 250_000,
                                 "startIteration": rng.randrange(0, 5000)}
        t0 = start + 5

        def do(t: float, action: str, args: dict[str, Any] | None = None) -> None:
            steps.append({"at": _dur(t), action: args or {}})

        def when(t: float) -> datetime:
            return self.start + timedelta(seconds=at + t)

        def wait_pods(head_only: bool = True) -> None:
            if kind == "RayJob" and head_only:
                steps.append({"at": "4s", "schedule": {"pods": "head"}})

        worker_sel = "workers"
        scheduled = True
        if cls == "healthy":
            steps += up
            do(t0, "train", {**train, "style": rng.choice(["megatron", "megatron", "lightning", "deepspeed"])})
            if kind == "RayJob":
                do(start + 1, "submitter")
        elif cls == "submitter-worker-pending":
            # K8sJobMode submitter running, head up, the one GPU worker pending: not scheduled
            # (head and submitter make two bound pods, as many as head and worker would).
            profile, workers = "a100-1x8", 1
            run["profile"] = profile
            wait_pods()
            steps += [{"at": "5s", "pull": {}}, {"at": _dur(start), "start": {"pullSeconds": 20.0}}]
            do(start + 1, "submitter")
            do(start + 2, "unschedulable", {})
            scheduled = False
        elif cls == "stall":
            steps += up
            do(t0, "train", train)
            do(ev, "stall")
        elif cls in ("hang-with-steps", "hang-steps-out-of-tail", "hang-no-steps"):
            steps += up
            ev = rng.uniform(120, 240)
            if cls != "hang-no-steps":
                do(t0, "train", {**train, "pods": "all"})
                do(ev, "stall")
            if cls == "hang-steps-out-of-tail":
                noise = [f"NCCL INFO Channel {k % 32:02d}/0 : {k % 8}[{k % 8}] -> {(k + 1) % 8}[{(k + 1) % 8}] "
                         "via P2P/CUMEM/read" for k in range(520)]
                do(ev + 30, "log", {"pods": "all", "lines": noise})
            seq = rng.randrange(1000, 60000)
            for w in range(workers):
                pod = f"{'worker' if kind == 'RayJob' else 'job'}-{w}"
                behind = 1 if w == workers - 1 and workers > 1 else 0
                lines = _watchdog(when(ev + 600), w, seq - behind, seq - 1 - behind)
                do(ev + 600, "log", {"pods": pod, "lines": lines})
        elif cls == "crash-loop":
            steps += up
            do(t0, "train", train)
            do(ev, "stall")
            do(ev, "crashLoop", {"pods": "workers", "reason": rng.choice(["OOMKilled", "Error"]), "runFor": "40s"})
        elif cls == "quota-wait":
            steps = [{"at": "1s", "waitForQuota": {}}]
            scheduled = False
        elif cls == "quota-wait-tiered":
            reason = rng.choice(["WaitingForQuota", "ExceedsMaxQuota"])
            need = workers * 8
            message = (f"couldn't assign flavors to pod set {'gpu-workers' if kind == 'RayJob' else 'main'}: "
                       + (f"insufficient unused quota for nvidia.com/gpu in flavor a100, {need} more needed"
                          if reason == "WaitingForQuota" else
                          f"insufficient quota for nvidia.com/gpu in flavor a100, request > maximum capacity "
                          f"({need} > 40)"))
            steps = [{"at": "1s", "waitForQuota": {"reason": reason, "message": message}}]
            scheduled = False
        elif cls == "topology-placement-failed":
            message = (f"couldn't assign flavors to pod set {'gpu-workers' if kind == 'RayJob' else 'main'}: "
                       f'topology "gpu-block" doesn\'t allow to fit any of {workers} pod(s)')
            steps = [{"at": "1s", "waitForQuota": {"reason": "TopologyPlacementFailed", "message": message}}]
            scheduled = False
        elif cls == "device-unhealthy":
            steps += up[:2]
            do(8, "deviceReject", {})
            scheduled = False
        elif cls == "hf-loss-dicts":
            steps += up
            do(t0, "train", {**train, "style": "hf"})
        elif cls == "preempted-requeued":
            steps += up
            do(t0, "train", train)
            do(ev, "preempt")
            do(ev + 1, "waitForQuota", {})
            scheduled = False
        elif cls == "admission-check-kueue":
            # A custom controller's check whose name looks like capacity: Kueue's gate all the same.
            name = rng.choice(["budget-approval", "capacity-review", "provision-approval"])
            steps = [{"at": "2s", "admissionCheck": {"name": name, "controllerName": "example.com/budget-approval",
                                                     "message": "waiting for approval from the budget owner"}}]
            scheduled = False
        elif cls == "admission-check-provisioning":
            name = rng.choice(["dws", "gpu-reserve", "flex-start"])
            steps = [{"at": "2s", "admissionCheck": {"name": name, "message": ""}}]
            scheduled = False
        elif cls in ("dra-wait", "karpenter-nominated", "karpenter-limits", "autoscaler-scale-up",
                     "autoscaler-no-scale-up", "unschedulable-affinity"):
            wait_pods()
            scheduled = False
            if cls == "dra-wait":
                do(3, "draWait", {})
            elif cls.startswith("karpenter"):
                do(3, "karpenterWait", {"nodePool": "gpu", "limits": cls == "karpenter-limits"})
            elif cls.startswith("autoscaler"):
                do(3, "unschedulable", {})
                do(20, "scaleUp", {"triggered": cls == "autoscaler-scale-up", "nodeGroup": "aks-gpua100-vmss",
                                   "from": 5, "to": 5 + workers, "max": 64})
            else:
                do(3, "unschedulable", {"message": AFFINITY_MESSAGE.format(n=7)})
        elif cls == "unschedulable-no-events":
            # The FailedScheduling events aged out; PodScheduled=False still says why.
            wait_pods()
            do(3, "unschedulable", {"message": AFFINITY_MESSAGE.format(n=7), "events": False})
            scheduled = False
        elif cls == "partially-scheduled":
            # Some workers bound (the head too), the rest unschedulable: membership, not pod count.
            if workers == 1:
                profile, workers = "a100-4x8", 4
                run["profile"] = profile
            wait_pods()
            for w in range(workers // 2):
                steps.append({"at": "4s", "schedule": {"pods": f"{'worker' if kind == 'RayJob' else 'job'}-{w}"}})
            do(5, "pull")
            do(6, "unschedulable", {})
            scheduled = False
            self.gpu_pods += workers // 2
        elif cls == "profile-unresolved":
            steps = []
            scheduled = False
        elif cls in ("replay-recent-restart", "replay-old-restart", "restart-recovered"):
            steps += up
            do(t0, "train", {**train, "pods": "all"})
            # How long before the judging instant the restart happens (the collector's restart
            # window is 10 minutes): replays outlast it or not; a short rewind is passed quickly.
            ago = {"replay-recent-restart": rng.uniform(300, 540), "replay-old-restart": rng.uniform(660, 780),
                   "restart-recovered": rng.uniform(240, 540)}[cls]
            ev = self.eval_at - at - ago
            replay_steps = int(ago / every)
            rewind = rng.randrange(2, 6) if cls == "restart-recovered" else replay_steps + rng.randrange(20, 200)
            do(ev, "restart", {"pods": "all", "rewind": rewind})
        elif cls == "lagging-ranks":
            if workers == 1:
                profile, workers = "a100-2x8", 2
                run["profile"] = profile
            steps += up
            do(t0, "train", {**train, "pods": worker_sel, "lagRanks": rng.randrange(2, 8)})
        elif cls == "eval-bars":
            steps += up
            do(t0, "train", {**train, "style": "lightning", "evalEvery": rng.choice([3, 5])})
        elif cls in ("deepspeed-skipped-all", "deepspeed-skipped-most"):
            steps += up
            do(t0, "train", {**train, "style": "deepspeed"})
            resumed = {k: v for k, v in train.items() if k != "startIteration"}
            ratio = 1.0 if cls == "deepspeed-skipped-all" else 0.8
            do(ev, "train", {**resumed, "style": "deepspeed", "skipRatio": ratio})
        elif cls == "deepspeed-healthy":
            steps += up
            do(t0, "train", {**train, "style": "deepspeed"})
        elif cls == "multikueue-dispatched":
            steps = [{"at": "2s", "dispatch": {"cluster": rng.choice(["worker-eu", "worker-us"])}}]
        elif cls == "node-loss":
            steps += up
            do(t0, "train", train)
            do(ev, "nodeLoss", {})
        else:
            raise ValueError(f"unknown class {cls!r}")
        if scheduled:
            self.gpu_pods += workers
        run["timeline"] = steps
        return run


def generate(seed: int, runs: int = 500, eval_at: float = EVAL_AT, balanced: bool = False,
             stale_taucluster: bool = False) -> Generated:
    """A scenario of `runs` runs drawn from CLASSES (every class at least once when runs allow).

    `balanced`: every class equally often (round robin) instead of by weight. `stale_taucluster`:
    the TauCluster's status resolved an older spec (the 4-worker profile resolved as 2 workers,
    observedGeneration behind) and is never refreshed.
    """
    rng = random.Random(seed)
    names = list(CLASSES)
    weights = [CLASSES[c] for c in names]
    if balanced:
        picks = [names[i % len(names)] for i in range(runs)]
    else:
        picks = names[: min(runs, len(names))] + rng.choices(names, weights, k=max(0, runs - len(names)))
    rng.shuffle(picks)
    b = _Builder(rng, START, eval_at)
    run_docs = [b.run(i, cls) for i, cls in enumerate(picks)]
    nodes = b.gpu_pods + 8
    doc = {
        "name": f"generated-{seed}{'-stale' if stale_taucluster else ''}",
        "description": f"{runs} generated runs (seed {seed})",
        "seed": seed,
        "start": START.isoformat().replace("+00:00", "Z"),
        "cluster": {
            "namespaces": list(NAMESPACES),
            "nodes": [
                {"name": "aks-system-0", "pool": "system", "cpu": "16", "memory": "64Gi"},
                {"name": "aks-a100", "count": nodes, "pool": "gpua100", "gpus": 8,
                 "gpuProduct": "NVIDIA-A100-SXM4-80GB", "instanceType": "Standard_ND96amsr_A100_v4",
                 "cpu": "96", "memory": "1800Gi"},
            ],
            "flavors": ["a100"],
            "clusterQueues": [{"name": "gpu-a100", "flavor": "a100", "gpus": 8 * nodes, "cohort": "taugrid"}],
            "localQueues": [{"name": "a100", "namespace": ns, "clusterQueue": "gpu-a100"} for ns in NAMESPACES],
            "profiles": [
                {"name": f"a100-{w}x8", "localQueue": "a100", "clusterQueue": "gpu-a100", "flavors": ["a100"],
                 "priorityClass": "training-normal", "workers": w, "gpusPerWorker": 8,
                 **({"resolvedWorkers": w // 2} if stale_taucluster and w == 4 else {})}
                for w in (1, 2, 4)
            ] + [
                {"name": "h200-8x8", "localQueue": "a100", "clusterQueue": "gpu-a100", "flavors": ["a100"],
                 "priorityClass": "training-normal", "workers": 8, "gpusPerWorker": 8, "resolved": False}
            ],
            "tauClusterRefresh": "5m",
            "tauClusterStale": stale_taucluster,
            "kubeletHeartbeats": True,
        },
        "runs": run_docs,
    }
    scenario = scenario_from_dict(doc, f"<generated seed={seed}>")
    classes = {(r["namespace"], r["name"]): cls for r, cls in zip(run_docs, picks, strict=True)}
    return Generated(scenario, classes, eval_at)
