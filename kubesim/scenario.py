"""Scenario files: the cluster, the runs, and each run's lifecycle timeline, as data (YAML).

A scenario is validated on load; every problem names the file and the place in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from kubesim.clock import parse_time
from kubesim.faults import ServerPlan, parse_server_plan

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

# Run timeline actions and the arguments each accepts (name → accepted Python types).
RUN_ACTIONS: dict[str, dict[str, tuple[type, ...]]] = {
    "waitForQuota": {"message": (str,), "reason": (str,)},
    # Kueue reserved quota but an AdmissionCheck (kueue.x-k8s.io/v1beta1, spec.controllerName) is Pending.
    "admissionCheck": {"name": (str,), "controllerName": (str,), "message": (str,), "state": (str,)},
    # MultiKueue: the manager's Workload is admitted and dispatched to a worker cluster; no local pods.
    "dispatch": {"cluster": (str,)},
    # DRA: pods wait on resource.k8s.io/v1 ResourceClaims that cannot be allocated.
    "draWait": {"message": (str,), "deviceClass": (str,), "repeatEvery": (str, int, float)},
    # Karpenter: a NodeClaim is launched for the pods (Nominated), or the NodePool limits refuse one.
    "karpenterWait": {"nodePool": (str,), "limits": (bool,), "repeatEvery": (str, int, float)},
    # The kubelet's device manager rejects the bound GPU pods (unhealthy devices): UnexpectedAdmissionError.
    "deviceReject": {"message": (str,)},
    # A restart of the workers: `mode` inplace (the kubelet restarts each container), replace (the
    # run's controller replaces the pods: Job, JobSet, PyTorchJob, KubeRay each its own way) or
    # inprocess (torchrun restarts its workers inside the container); training resumes `rewind`
    # steps back (replay) `resumeAfter` later; replacement pods run `startAfter` after the failure.
    "restart": {
        "pods": (str,),
        "rewind": (int,),
        "reason": (str,),
        "exitCode": (int,),
        "mode": (str,),
        "resumeAfter": (str, int, float),
        "startAfter": (str, int, float),
    },
    # The run is deleted and created again with the same name (new uids): its old pods terminate for
    # their grace period; the timeline's later steps (admit, schedule, start, train) play the new run.
    "resubmit": {},
    # Training stops printing steps for `for` (a checkpoint save, an evaluation), then goes on.
    "pause": {"for": (str, int, float)},
    "admit": {"clusterQueue": (str,)},
    "unschedulable": {"message": (str,), "repeatEvery": (str, int, float), "events": (bool,)},
    # KubeRay K8sJobMode: the submitter Job and its pod (on a CPU node), running `ray job submit`.
    "submitter": {},
    "scaleUp": {
        "triggered": (bool,),
        "nodeGroup": (str,),
        "from": (int,),
        "to": (int,),
        "max": (int,),
        "message": (str,),
    },
    "schedule": {"nodes": (list,), "pods": (str,)},
    "pull": {"image": (str,)},
    "pullFail": {"message": (str,)},
    "start": {"pullSeconds": (int, float)},
    "train": {
        "every": (str, int, float),
        "iterations": (int,),
        "startIteration": (int,),
        "loss": (int, float),
        "minLoss": (int, float),
        "batchSize": (int,),
        "pods": (str,),
        "checkpointEvery": (int,),
        "line": (str,),
        "style": (str,),
        "lagRanks": (int,),
        "skipRatio": (int, float),
        "evalEvery": (int,),
        "jitter": (int, float),
        "pauseEvery": (int,),
        "pauseFor": (str, int, float),
        "forgeTime": (str,),
        "stampPrefix": (bool,),
        "rankJitter": (int, float),
        "straggler": (int,),
        "slower": (int, float),
        "slowFrom": (str, int, float),
        "slowFor": (str, int, float),
        "slowEvery": (str, int, float),
        "hiccups": (int, float),
        "gpus": (bool,),
        "gpuJitter": (int, float),
        "smActivity": (int, float),
        "throttleGpu": (int,),
        "throttleReason": (str,),
    },
    "stall": {},
    "crashLoop": {
        "pods": (str,),
        "reason": (str,),
        "exitCode": (int,),
        "runFor": (str, int, float),
        "maxBackoff": (str, int, float),
        "lines": (list,),
    },
    "recover": {"pods": (str,)},
    "preempt": {"message": (str,)},
    "nodeLoss": {"node": (str,), "podPhase": (str,)},
    "succeed": {},
    "fail": {"message": (str,), "exitCode": (int,)},
    "log": {"pods": (str,), "lines": (list,)},
    "event": {"object": (str,), "type": (str,), "reason": (str,), "message": (str,), "component": (str,)},
    "patch": {"object": (str,), "body": (dict,), "subresource": (str,)},
}
# Cluster timeline actions (top-level `actions:`).
CLUSTER_ACTIONS: dict[str, dict[str, tuple[type, ...]]] = {
    "addNode": {
        "name": (str,),
        "pool": (str,),
        "gpus": (int,),
        "gpuProduct": (str,),
        "instanceType": (str,),
        "labels": (dict,),
    },
    "nodeLoss": {"node": (str,), "podPhase": (str,)},
    "nodeRecover": {"node": (str,)},
    "create": {"object": (dict,)},
    "patch": {
        "apiVersion": (str,),
        "kind": (str,),
        "namespace": (str,),
        "name": (str,),
        "body": (dict,),
        "subresource": (str,),
    },
    "delete": {"apiVersion": (str,), "kind": (str,), "namespace": (str,), "name": (str,)},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "nodeRecover": ("node",),
    "log": ("lines",),
    "event": ("reason", "message"),
    "patch": ("body",),
    "create": ("object",),
    "delete": ("apiVersion", "kind", "name"),
    "addNode": ("name",),
}


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the place."""


def parse_duration(value: Any, where: str = "duration") -> float:
    """Seconds from `90`, `90s`, `5m`, `1h30m`, `2.5s`."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: expected a duration like 90s, 5m or 1h30m, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ScenarioError(f"{where}: duration must not be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m and any(m.groups()):
            h, mi, s = (float(g) if g else 0.0 for g in m.groups())
            return h * 3600 + mi * 60 + s
    raise ScenarioError(f"{where}: expected a duration like 90s, 5m or 1h30m, got {value!r}")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    pool: str = "system"
    gpus: int = 0
    gpu_product: str = "NVIDIA-A100-SXM4-80GB"
    instance_type: str = "Standard_D16s_v5"
    cpu: str = "16"
    memory: str = "64Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    clock_skew: float = 0.0  # seconds this node's clock (kubelet, container runtime, its pods) runs ahead


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    local_queue: str
    cluster_queue: str
    workers: int
    gpus_per_worker: int
    flavors: tuple[str, ...] = ()
    priority_class: str = ""
    resolved: bool = True  # False: TauCluster status does not resolve it (target resolution never ends)
    resolved_workers: int = 0  # >0: status resolved an older spec with this many workers (see tauClusterStale)


@dataclass(frozen=True, slots=True)
class ClusterQueueSpec:
    name: str
    flavor: str
    gpus: int
    cohort: str = ""


@dataclass(frozen=True, slots=True)
class LocalQueueSpec:
    name: str
    namespace: str
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class Step:
    """One timeline entry: at `at` seconds (relative to its run's start, or the scenario's), do `action`."""

    at: float
    action: str
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RunSpec:
    name: str
    namespace: str
    kind: str  # "RayJob" or "Job"
    tau_run: bool
    profile: str
    workers: int
    gpus_per_worker: int
    image: str
    queue: str
    cluster_queue: str
    at: float
    timeline: tuple[Step, ...]
    sidecar: str = ""  # "" | shipper | exporter: a second container in the training pods that prints
    grace: int = 30  # terminationGracePeriodSeconds of its pods
    exit_after: float = 3.0  # seconds its containers take to exit on SIGTERM (at most `grace`)
    restart_policy: str = ""  # the pods' restartPolicy ("": Never for Job kinds, Always for Ray)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str = ""
    seed: int = 0
    start: datetime | None = None
    namespaces: tuple[str, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()
    flavors: tuple[str, ...] = ()
    cluster_queues: tuple[ClusterQueueSpec, ...] = ()
    local_queues: tuple[LocalQueueSpec, ...] = ()
    profiles: tuple[ProfileSpec, ...] = ()
    taucluster_refresh: float = 300.0
    # The TauGrid controller is stuck: the TauCluster spec moved on (generation 2) after its status
    # resolved generation 1 (profiles with resolvedWorkers show the old count), and nothing refreshes it.
    taucluster_stale: bool = False
    # TauCluster status.lastResolvedTime written this far in the future (a forged or skewed stamp).
    taucluster_future: float = 0.0
    # Kubelets renew their node Lease (kube-node-lease) every 10 s and report node status every
    # `node_status_report` (lastHeartbeatTime), as real ones do; off: written only on changes.
    kubelet_heartbeats: bool = True
    node_status_report: float = 300.0
    runs: tuple[RunSpec, ...] = ()
    actions: tuple[Step, ...] = ()
    source: str = "<memory>"
    server: ServerPlan = ServerPlan()  # `faults:` on the scenario clock and `eventTTL:` (kubesim.faults)


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {where}: {message}")

    def mapping(self, value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        unknown = sorted(set(map(str, value)) - set(allowed))
        if unknown:
            raise self.fail(where, f"unknown key(s) {unknown}; expected some of {sorted(allowed)}")
        return value

    def seq(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {type(value).__name__}")
        return value

    def name(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not _NAME.match(value):
            raise self.fail(where, f"expected a lowercase DNS name, got {value!r}")
        return value

    def typed(self, value: Any, types: tuple[type, ...], where: str) -> Any:
        if isinstance(value, bool) and bool not in types:
            raise self.fail(where, f"expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
        if not isinstance(value, types):
            raise self.fail(where, f"expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
        return value

    def duration(self, value: Any, where: str) -> float:
        try:
            return parse_duration(value, where)
        except ScenarioError as exc:
            raise ScenarioError(f"{self.source}: {exc}") from None

    def step(self, raw: Any, where: str, actions: dict[str, dict[str, tuple[type, ...]]]) -> Step:
        if not isinstance(raw, Mapping):
            raise self.fail(where, "expected a mapping like {at: 30s, admit: {}}")
        keys = [k for k in raw if k != "at"]
        if "at" not in raw:
            raise self.fail(where, "missing 'at'")
        if len(keys) != 1:
            raise self.fail(where, f"expected exactly one action besides 'at', got {keys or 'none'}")
        action = str(keys[0])
        if action not in actions:
            raise self.fail(where, f"unknown action {action!r}; expected one of {sorted(actions)}")
        args = raw[action]
        if args is None:
            args = {}
        spec = actions[action]
        args = self.mapping(args, f"{where}.{action}", tuple(spec))
        for key, value in args.items():
            self.typed(value, spec[key], f"{where}.{action}.{key}")
        for key in _REQUIRED.get(action, ()):
            if key not in args:
                raise self.fail(f"{where}.{action}", f"missing required {key!r}")
        return Step(self.duration(raw["at"], f"{where}.at"), action, dict(args))


_RUN_KEYS = (
    "name",
    "namespace",
    "kind",
    "tauRun",
    "profile",
    "workers",
    "gpusPerWorker",
    "image",
    "queue",
    "at",
    "timeline",
    "sidecar",
    "terminationGracePeriodSeconds",
    "exitAfter",
    "restartPolicy",
)
# A run's name is a label value (taugrid.io/run; job-name for a Job), at most 63 characters; a
# RayJob's RayCluster is named NAME-xxxxx and that name is the ray.io/cluster label value.
_MAX_RUN_NAME = {"Job": 63, "RayJob": 63 - 6, "JobSet": 63 - 10, "PyTorchJob": 63 - 10}
ROOT_KINDS = ("RayJob", "Job", "JobSet", "PyTorchJob")
SIDECARS = ("", "shipper", "exporter")


def _run(
    r: _Reader,
    x: Mapping[str, Any],
    where: str,
    namespaces: tuple[str, ...],
    by_profile: Mapping[str, ProfileSpec],
    lqs: list[LocalQueueSpec],
) -> RunSpec:
    """One run entry (with its template's fields merged in) as a RunSpec."""
    name = r.name(x.get("name"), f"{where}.name")
    ns = r.name(x.get("namespace"), f"{where}.namespace")
    if ns not in namespaces:
        raise r.fail(f"{where}.namespace", f"{ns!r} is not one of cluster.namespaces {list(namespaces)}")
    kind = str(x.get("kind", "RayJob"))
    if kind not in ROOT_KINDS:
        raise r.fail(f"{where}.kind", f"expected {', '.join(ROOT_KINDS[:-1])} or {ROOT_KINDS[-1]}, got {kind!r}")
    sidecar = str(x.get("sidecar", ""))
    if sidecar not in SIDECARS:
        raise r.fail(f"{where}.sidecar", f"expected one of {list(SIDECARS)}, got {sidecar!r}")
    policy = str(x.get("restartPolicy", ""))
    if policy not in ("", "Always", "OnFailure", "Never"):
        raise r.fail(f"{where}.restartPolicy", f"expected Always, OnFailure or Never, got {policy!r}")
    profile_name = str(x.get("profile", ""))
    profile = by_profile.get(profile_name)
    if profile_name and profile is None:
        raise r.fail(f"{where}.profile", f"{profile_name!r} is not a declared profile {sorted(by_profile)}")
    queue = str(x.get("queue") or (profile.local_queue if profile else ""))
    lq = next((q for q in lqs if q.name == queue and q.namespace == ns), None)
    if lq is None:
        raise r.fail(f"{where}.queue", f"no localQueue {queue!r} in namespace {ns!r}")
    steps = tuple(
        r.step(s, f"{where}.timeline[{j}]", RUN_ACTIONS)
        for j, s in enumerate(r.seq(x.get("timeline"), f"{where}.timeline"))
    )
    return RunSpec(
        name=name,
        namespace=ns,
        kind=kind,
        tau_run=bool(r.typed(x.get("tauRun", kind == "RayJob"), (bool,), f"{where}.tauRun")),
        profile=profile_name,
        workers=int(r.typed(x.get("workers", profile.workers if profile else 1), (int,), f"{where}.workers")),
        gpus_per_worker=int(
            r.typed(
                x.get("gpusPerWorker", profile.gpus_per_worker if profile else 0),
                (int,),
                f"{where}.gpusPerWorker",
            )
        ),
        image=str(x.get("image", "rayproject/ray-ml:2.40.0-py310-gpu")),
        queue=queue,
        cluster_queue=lq.cluster_queue,
        at=r.duration(x.get("at", 0), f"{where}.at"),
        timeline=tuple(sorted(steps, key=lambda s: s.at)),
        sidecar=sidecar,
        grace=int(
            r.typed(x.get("terminationGracePeriodSeconds", 30), (int,), f"{where}.terminationGracePeriodSeconds")
        ),
        exit_after=r.duration(x.get("exitAfter", 3), f"{where}.exitAfter"),
        restart_policy=policy,
    )


def _copies(r: _Reader, entry: Mapping[str, Any], spec: RunSpec, where: str) -> list[tuple[str, float]]:
    """The (name, submission time) of each run an entry stands for: itself, or with `count: N` the
    runs NAME-0..NAME-(N-1) (zero-padded to one width, so they sort), submitted `stagger` apart in all."""
    limit = _MAX_RUN_NAME[spec.kind]
    if "count" not in entry:
        if "stagger" in entry:
            raise r.fail(f"{where}.stagger", "stagger spreads the runs of a count; this entry has no count")
        if len(spec.name) > limit:
            raise r.fail(
                f"{where}.name", f"{spec.name!r} is longer than {limit} characters (a {spec.kind} name's limit)"
            )
        return [(spec.name, spec.at)]
    count = int(r.typed(entry["count"], (int,), f"{where}.count"))
    if count < 1:
        raise r.fail(f"{where}.count", f"expected at least 1, got {count}")
    stagger = r.duration(entry.get("stagger", 0), f"{where}.stagger")
    width = len(str(count - 1))
    longest = f"{spec.name}-{count - 1:0{width}d}"
    if len(longest) > limit:
        raise r.fail(
            f"{where}.name",
            f"with count {count} the runs are named up to {longest!r} ({len(longest)} characters), longer than "
            f"{limit} (a {spec.kind} name's limit); shorten the name",
        )
    return [(f"{spec.name}-{k:0{width}d}", spec.at + stagger * k / count) for k in range(count)]


def _signed_duration(r: _Reader, value: Any, where: str) -> float:
    """A duration that may be negative: `-90s`, `-2m`, -90."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -r.duration(value.strip()[1:], where)
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        return -r.duration(-value, where)
    return r.duration(value, where)


def scenario_from_dict(data: Any, source: str = "<memory>") -> Scenario:
    """Validate parsed YAML into a Scenario; raises ScenarioError naming `source` and the place."""
    r = _Reader(source)
    top = r.mapping(
        data, "top level",
        ("name", "description", "seed", "start", "cluster", "templates", "runs", "actions", "faults", "eventTTL"),
    )
    if "name" not in top:
        raise r.fail("top level", "missing 'name'")
    start = None
    if top.get("start") is not None:
        raw_start = top["start"]
        try:
            start = raw_start if isinstance(raw_start, datetime) else parse_time(str(raw_start))
        except ValueError:
            raise r.fail("start", f"expected an RFC 3339 time, got {raw_start!r}") from None
    cluster = r.mapping(
        top.get("cluster"),
        "cluster",
        (
            "namespaces",
            "nodes",
            "flavors",
            "clusterQueues",
            "localQueues",
            "profiles",
            "tauClusterRefresh",
            "tauClusterStale",
            "tauClusterFuture",
            "kubeletHeartbeats",
            "nodeStatusReportFrequency",
        ),
    )
    namespaces = tuple(
        r.name(n, f"cluster.namespaces[{i}]")
        for i, n in enumerate(r.seq(cluster.get("namespaces"), "cluster.namespaces"))
    )
    nodes = []
    for i, raw in enumerate(r.seq(cluster.get("nodes"), "cluster.nodes")):
        where = f"cluster.nodes[{i}]"
        n = r.mapping(
            raw,
            where,
            ("name", "pool", "gpus", "gpuProduct", "instanceType", "cpu", "memory", "labels", "count", "clockSkew"),
        )
        skew_s = _signed_duration(r, n.get("clockSkew", 0), f"{where}.clockSkew")
        count = int(r.typed(n.get("count", 1), (int,), f"{where}.count"))
        base = r.name(n.get("name"), f"{where}.name")
        for k in range(count):
            nodes.append(
                NodeSpec(
                    name=f"{base}-{k}" if count > 1 or "count" in n else base,
                    pool=str(n.get("pool", "system")),
                    gpus=int(r.typed(n.get("gpus", 0), (int,), f"{where}.gpus")),
                    gpu_product=str(n.get("gpuProduct", "NVIDIA-A100-SXM4-80GB")),
                    instance_type=str(n.get("instanceType", "Standard_D16s_v5")),
                    cpu=str(n.get("cpu", "16")),
                    memory=str(n.get("memory", "64Gi")),
                    labels={
                        str(k2): str(v)
                        for k2, v in r.mapping(
                            n.get("labels"), f"{where}.labels", tuple(map(str, n.get("labels") or {}))
                        ).items()
                    },
                    clock_skew=skew_s,
                )
            )
    flavors = tuple(
        r.name(f, f"cluster.flavors[{i}]") for i, f in enumerate(r.seq(cluster.get("flavors"), "cluster.flavors"))
    )
    cqs = []
    for i, raw in enumerate(r.seq(cluster.get("clusterQueues"), "cluster.clusterQueues")):
        where = f"cluster.clusterQueues[{i}]"
        c = r.mapping(raw, where, ("name", "flavor", "gpus", "cohort"))
        flavor = str(c.get("flavor", ""))
        if flavor not in flavors:
            raise r.fail(f"{where}.flavor", f"{flavor!r} is not one of cluster.flavors {list(flavors)}")
        cqs.append(
            ClusterQueueSpec(
                r.name(c.get("name"), f"{where}.name"),
                flavor,
                int(r.typed(c.get("gpus", 0), (int,), f"{where}.gpus")),
                str(c.get("cohort", "")),
            )
        )
    cq_names = {c.name for c in cqs}
    lqs = []
    for i, raw in enumerate(r.seq(cluster.get("localQueues"), "cluster.localQueues")):
        where = f"cluster.localQueues[{i}]"
        q = r.mapping(raw, where, ("name", "namespace", "clusterQueue"))
        ns = r.name(q.get("namespace"), f"{where}.namespace")
        if ns not in namespaces:
            raise r.fail(f"{where}.namespace", f"{ns!r} is not one of cluster.namespaces")
        cq = str(q.get("clusterQueue", ""))
        if cq not in cq_names:
            raise r.fail(f"{where}.clusterQueue", f"{cq!r} is not a declared clusterQueue")
        lqs.append(LocalQueueSpec(r.name(q.get("name"), f"{where}.name"), ns, cq))
    profiles = []
    for i, raw in enumerate(r.seq(cluster.get("profiles"), "cluster.profiles")):
        where = f"cluster.profiles[{i}]"
        p = r.mapping(
            raw,
            where,
            (
                "name",
                "localQueue",
                "clusterQueue",
                "workers",
                "gpusPerWorker",
                "flavors",
                "priorityClass",
                "resolved",
                "resolvedWorkers",
            ),
        )
        cq = str(p.get("clusterQueue", ""))
        if cq not in cq_names:
            raise r.fail(f"{where}.clusterQueue", f"{cq!r} is not a declared clusterQueue")
        profiles.append(
            ProfileSpec(
                name=r.name(p.get("name"), f"{where}.name"),
                local_queue=r.name(p.get("localQueue"), f"{where}.localQueue"),
                cluster_queue=cq,
                workers=int(r.typed(p.get("workers", 1), (int,), f"{where}.workers")),
                gpus_per_worker=int(r.typed(p.get("gpusPerWorker", 8), (int,), f"{where}.gpusPerWorker")),
                flavors=tuple(str(f) for f in r.seq(p.get("flavors"), f"{where}.flavors")),
                priority_class=str(p.get("priorityClass", "")),
                resolved=bool(r.typed(p.get("resolved", True), (bool,), f"{where}.resolved")),
                resolved_workers=int(r.typed(p.get("resolvedWorkers", 0), (int,), f"{where}.resolvedWorkers")),
            )
        )
    by_profile = {p.name: p for p in profiles}
    templates = {
        r.name(k, "templates"): r.mapping(v, f"templates.{k}", _RUN_KEYS[1:])
        for k, v in r.mapping(top.get("templates"), "templates", tuple(map(str, top.get("templates") or {}))).items()
    }
    runs = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(r.seq(top.get("runs"), "runs")):
        where = f"runs[{i}]"
        entry = r.mapping(raw, where, (*_RUN_KEYS, "template", "count", "stagger"))
        x = entry
        if "template" in entry:
            tname = entry["template"]
            if tname not in templates:
                raise r.fail(f"{where}.template", f"{tname!r} is not a declared template {sorted(templates)}")
            x = {**templates[tname], **entry}  # the entry's own fields override the template's
            where = f"{where} (template {tname})"
        spec = _run(r, x, where, namespaces, by_profile, lqs)
        for name, at in _copies(r, entry, spec, where):
            if (spec.namespace, name) in seen:
                raise r.fail(f"{where}.name", f"duplicate run {spec.namespace}/{name}")
            seen.add((spec.namespace, name))
            runs.append(spec if name == spec.name else replace(spec, name=name, at=at))
    actions = tuple(
        r.step(s, f"actions[{j}]", CLUSTER_ACTIONS) for j, s in enumerate(r.seq(top.get("actions"), "actions"))
    )
    return Scenario(
        name=str(top["name"]),
        description=str(top.get("description", "")),
        seed=int(r.typed(top.get("seed", 0), (int,), "seed")),
        start=start,
        namespaces=namespaces,
        nodes=tuple(nodes),
        flavors=flavors,
        cluster_queues=tuple(cqs),
        local_queues=tuple(lqs),
        profiles=tuple(profiles),
        taucluster_refresh=r.duration(cluster.get("tauClusterRefresh", 300), "cluster.tauClusterRefresh"),
        taucluster_stale=bool(r.typed(cluster.get("tauClusterStale", False), (bool,), "cluster.tauClusterStale")),
        taucluster_future=r.duration(cluster.get("tauClusterFuture", 0), "cluster.tauClusterFuture"),
        kubelet_heartbeats=bool(
            r.typed(cluster.get("kubeletHeartbeats", True), (bool,), "cluster.kubeletHeartbeats")
        ),
        node_status_report=r.duration(
            cluster.get("nodeStatusReportFrequency", 300), "cluster.nodeStatusReportFrequency"
        ),
        runs=tuple(runs),
        actions=tuple(sorted(actions, key=lambda s: s.at)),
        source=source,
        server=parse_server_plan(top, source),
    )


def load_scenario(path: Path | str) -> Scenario:
    """Read and validate a scenario YAML file; raises ScenarioError naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return scenario_from_dict(data, str(path))


def default_scenario_path() -> Path:
    """The scenario that ships with the product (`scenarios/default.yaml`)."""
    return Path(__file__).parent / "scenarios" / "default.yaml"
