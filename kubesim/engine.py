"""The scenario engine: plays TauGrid, Kueue, KubeRay, the scheduler, the kubelet and the cluster
autoscaler against the simulator, through its HTTP API, on a (real, accelerated or manual) clock.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubesim import waits
from kubesim.client import KubeClient
from kubesim.clock import Clock, ManualClock, ScaledClock, rfc3339, rfc3339_micro
from kubesim.errors import ApiError
from kubesim.registry import Registry
from kubesim.scenario import NodeSpec, RunSpec, Scenario, Step, parse_duration
from kubesim.truth import RunTruth, run_truth

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RUN_LABEL = "taugrid.io/run"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAU_GV = "taugrid.io/v1alpha1"
KUEUE_GV = "kueue.x-k8s.io/v1beta1"
RAY_GV = "ray.io/v1"
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
# Megatron-LM's training log line, with the wall-clock prefix recent Megatron versions print;
# fields: time, iteration, iterations, samples, ms, lr, batch, loss, grad_norm, rate, run.
MEGATRON_LINE = (
    " [{time}] iteration {iteration:>8}/{iterations:>8} | consumed samples: {samples:>12} | "
    "elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.3E} | global batch size: {batch:>5} | "
    "lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |"
)


@dataclass(frozen=True, slots=True)
class Ref:
    """An object the engine wrote: enough to address it and to reference it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def owner(self, controller: bool = True) -> Obj:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
            "blockOwnerDeletion": True,
        }

    def involved(self, field_path: str = "") -> Obj:
        out: Obj = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}
        if self.namespace:
            out["namespace"] = self.namespace
        if field_path:
            out["fieldPath"] = field_path
        return out


@dataclass(slots=True)
class PodState:
    """What the kubelet knows about one pod of a run."""

    ref: Ref
    role: str  # head | worker | job
    index: int
    container: str
    image: str
    gpus: int
    node: str = ""
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    ip: str = ""
    restarts: int = 0
    state: Obj = field(default_factory=dict)
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    conditions: dict[str, Obj] = field(default_factory=dict)
    start_time: str = ""
    container_id: str = ""
    backoff: float = 10.0
    deleted: bool = False


@dataclass(slots=True)
class RunState:
    spec: RunSpec
    taurun: Ref | None = None
    root: Ref | None = None  # RayJob or Job
    workload: Ref | None = None
    raycluster: Ref | None = None
    pods: list[PodState] = field(default_factory=list)
    phase: str = "Pending"
    conditions: dict[str, Obj] = field(default_factory=dict)
    wl_conditions: dict[str, Obj] = field(default_factory=dict)
    admitted: bool = False
    finished: bool = False
    submitted: bool = False
    train_gen: int = 0
    crash_gen: int = 0
    iteration: int = 0
    job_id: str = ""
    started: str = ""
    # Ground truth the collector never sees (read by `truth()`): the stage the run waits in, the
    # highest step a valid update reached, when it was reached, and the cadence of steps.
    wait_stage: str = ""
    hwm: int = 0
    last_advance: float | None = None
    every: float = 0.0
    skipped: int = 0
    skip_ratio: float = 0.0
    dispatched: str = ""
    crash_looping: bool = False  # between crashes a container is briefly up: the run is still not running


@dataclass(slots=True)
class NodeState:
    spec: NodeSpec
    ref: Ref
    ready: bool = True
    gpus_used: int = 0
    ip: str = ""


class ScenarioEngine:
    """Moves a scenario's runs through their lifecycle by writing to the simulator over HTTP.

    Tests call `step_to(seconds)` with a ManualClock (no sleeping); demos call `start()` (a thread)
    or `run()` with a real or accelerated clock. Writes are exempt from injected faults.
    """

    def __init__(
        self,
        scenario: Scenario,
        client_base_url: str,
        clock: Clock | None = None,
        speed: float = 1.0,
        registry: Registry | None = None,
    ) -> None:
        if clock is None:
            clock = ScaledClock(speed)
        elif speed != 1.0 and not (isinstance(clock, ScaledClock) and clock.speed == speed):
            raise ValueError("speed applies to the engine's own clock; pass ScaledClock(speed) instead")
        self.scenario = scenario
        self.clock: Clock = clock
        self.client = KubeClient(client_base_url, registry)
        self._rng = random.Random(scenario.seed)
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._origin: datetime | None = None
        self.elapsed = 0.0
        self.nodes: dict[str, NodeState] = {}
        self.runs: dict[tuple[str, str], RunState] = {}
        self._events: dict[tuple[str, str, str], tuple[str, int, str]] = {}
        self._queue_status: dict[str, Obj] = {}
        self._taucluster: Ref | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []

    # ------------------------------------------------------------------ timeline
    @property
    def origin(self) -> datetime:
        """Scenario time zero."""
        if self._origin is None:
            if isinstance(self.clock, ManualClock) and self.scenario.start is not None:
                self.clock.set(self.scenario.start)
            self._origin = self.clock.now()
            self._setup()
        return self._origin

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), fn))

    def _after(self, delay: float, fn: Callable[[], None]) -> None:
        self._at(self.elapsed + delay, fn)

    def _start_container(self, r: RunState, pod: PodState, fp: str, pulled: str) -> None:
        """kubelet's Pulled/Created/Started for one container, then it runs and logs its start-up."""
        self.event(pod.ref, "Normal", "Pulled", pulled, "kubelet", pod.node, fp)
        self.event(pod.ref, "Normal", "Created", f"Created container: {pod.container}", "kubelet", pod.node, fp)
        self.event(pod.ref, "Normal", "Started", f"Started container {pod.container}", "kubelet", pod.node, fp)
        self._container_running(pod)
        self._logs(pod, self._startup_lines(r, pod))

    def next_due(self) -> float | None:
        """Scenario seconds of the next pending action (None when nothing is left)."""
        _ = self.origin
        return self._queue[0][0] if self._queue else None

    def step_to(self, t: float) -> int:
        """Run every action due at or before `t` scenario seconds; returns how many ran.

        With a ManualClock the clock is moved to each action's time first, so timestamps are exact.
        """
        with self._lock:
            origin = self.origin
            done = 0
            while self._queue and self._queue[0][0] <= t:
                due, _, fn = heapq.heappop(self._queue)
                self.elapsed = max(self.elapsed, due)
                if isinstance(self.clock, ManualClock):
                    self.clock.set(origin + timedelta(seconds=due))
                try:
                    fn()
                except Exception as exc:  # a failed action must not end a demo; tests assert `errors` is empty
                    if len(self.errors) < 100:
                        self.errors.append(f"t={due:.0f}s: {type(exc).__name__}: {exc}")
                    log.warning("scenario action at %.0fs failed: %s", due, exc, exc_info=not isinstance(exc, ApiError))
                done += 1
            self.elapsed = max(self.elapsed, t)
            if isinstance(self.clock, ManualClock):
                self.clock.set(origin + timedelta(seconds=t))
            return done

    def advance(self, seconds: float) -> int:
        """Step the scenario forward by `seconds` from where it is."""
        return self.step_to(self.elapsed + seconds)

    def run(self) -> None:
        """Play the scenario in real (or accelerated) time until `stop()`; holds the final state."""
        origin = self.origin
        while not self._stop.is_set():
            now = (self.clock.now() - origin).total_seconds()
            self.step_to(now)
            nxt = self.next_due()
            wait = 1.0 if nxt is None else max(0.0, nxt - (self.clock.now() - origin).total_seconds())
            if isinstance(self.clock, ScaledClock):
                wait /= self.clock.speed
            self._stop.wait(min(max(wait, 0.005), 1.0))

    def start(self) -> threading.Thread:
        """Run the scenario in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="scenario-engine", daemon=True)
            self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.client.close()

    # ------------------------------------------------------------------ helpers
    def _now(self) -> str:
        return rfc3339(self.clock.now())

    def _suffix(self, n: int = 5) -> str:
        return "".join(self._rng.choice(_SUFFIX) for _ in range(n))

    def _hex(self, n: int) -> str:
        return f"{self._rng.getrandbits(4 * n):0{n}x}"

    def _create(self, obj: Obj, status: Obj | None = None) -> Ref:
        out = self.client.create(obj)
        meta = out["metadata"]
        ref = Ref(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"], meta["uid"])
        if status:
            self._status(ref, status)
        return ref

    def _patch(self, ref: Ref, body: Obj) -> None:
        self.client.patch(ref.api_version, ref.kind, ref.namespace, ref.name, body)

    def _status(self, ref: Ref, status: Obj) -> None:
        self.client.patch(ref.api_version, ref.kind, ref.namespace, ref.name, {"status": status}, "status")

    def _cond(self, type_: str, status: bool | str, reason: str, message: str = "") -> Obj:
        value = status if isinstance(status, str) else ("True" if status else "False")
        return {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": self._now()}

    @staticmethod
    def _set_cond(conds: dict[str, Obj], cond: Obj) -> None:
        old = conds.get(cond["type"])
        if old is not None and old["status"] == cond["status"]:
            cond = {**cond, "lastTransitionTime": old["lastTransitionTime"]}
        conds[cond["type"]] = cond

    def event(
        self, ref: Ref, type_: str, reason: str, message: str, component: str, host: str = "", field_path: str = ""
    ) -> None:
        """Record a core/v1 Event, aggregating repeats (count, lastTimestamp) like client-go's recorder."""
        key = (ref.uid or ref.name, reason, message)
        now = self._now()
        seen = self._events.get(key)
        if seen is not None:
            name, count, first = seen
            self._events[key] = (name, count + 1, first)
            try:
                self.client.patch(
                    "v1",
                    "Event",
                    ref.namespace or "default",
                    name,
                    {
                        "count": count + 1,
                        "lastTimestamp": now,
                        "series": {"count": count + 1, "lastObservedTime": rfc3339_micro(self.clock.now())},
                    },
                )
                return
            except ApiError:
                pass
        name = f"{ref.name}.{self._hex(16)}"
        source: Obj = {"component": component}
        if host:
            source["host"] = host
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace or "default"},
            "involvedObject": ref.involved(field_path),
            "reason": reason,
            "message": message,
            "type": type_,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "eventTime": rfc3339_micro(self.clock.now()),
            "reportingComponent": component,
            "reportingInstance": host or f"{component}-aks-system-0",
            "action": reason,
        }
        self.client.create(body)
        self._events[key] = (name, 1, now)

    def _logs(self, pod: PodState, lines: Iterable[str]) -> None:
        if pod.deleted:
            return
        self.client.append_log(pod.ref.namespace, pod.ref.name, pod.container, list(lines), self._now())

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        sc = self.scenario
        self._at(0.0, self._setup_cluster)
        for run in sc.runs:
            state = RunState(run)
            self.runs[(run.namespace, run.name)] = state
            self._at(run.at, functools.partial(self._submit, state))
            for step in run.timeline:
                self._at(run.at + step.at, functools.partial(self._run_action, state, step))
        for step in sc.actions:
            self._at(step.at, functools.partial(self._cluster_action, step))

    def _setup_cluster(self) -> None:
        sc = self.scenario
        for ns in sc.namespaces:
            try:
                self._create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            except ApiError as exc:
                if exc.code != 409:
                    raise
        for node in sc.nodes:
            self._add_node(node)
        pcs = sorted({p.priority_class for p in sc.profiles if p.priority_class})
        for i, pc in enumerate(pcs):
            self._create(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": pc},
                    "value": 1000 * (i + 1),
                    "globalDefault": False,
                    "preemptionPolicy": "PreemptLowerPriority",
                    "description": f"TauGrid training priority {pc}",
                }
            )
        pools = {n.gpu_product: n.pool for n in sc.nodes if n.gpus}
        for flavor in sc.flavors:
            labels = {"agentpool": next((p for g, p in pools.items() if flavor in g.lower()), flavor)}
            self._create(
                {
                    "apiVersion": KUEUE_GV,
                    "kind": "ResourceFlavor",
                    "metadata": {"name": flavor},
                    "spec": {"nodeLabels": labels},
                }
            )
        for cq in sc.cluster_queues:
            spec: Obj = {
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": cq.flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 1000},
                                    {"name": "memory", "nominalQuota": "8Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": cq.gpus},
                                ],
                            }
                        ],
                    }
                ],
            }
            if cq.cohort:
                spec["cohort"] = cq.cohort
            self._create({"apiVersion": KUEUE_GV, "kind": "ClusterQueue", "metadata": {"name": cq.name}, "spec": spec})
        for lq in sc.local_queues:
            self._create(
                {
                    "apiVersion": KUEUE_GV,
                    "kind": "LocalQueue",
                    "metadata": {"name": lq.name, "namespace": lq.namespace},
                    "spec": {"clusterQueue": lq.cluster_queue},
                }
            )
        self._sync_queues()
        for ns in sc.namespaces:
            sa = f"{ns}-runner"
            self._create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}})
            ws = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauWorkspace",
                    "metadata": {"name": ns, "namespace": ns},
                    "spec": {"serviceAccounts": [sa]},
                }
            )
            self._status(
                ws,
                {
                    "observedGeneration": 1,
                    "serviceAccounts": [sa],
                    "conditions": [self._cond("Ready", True, "Reconciled", "workspace reconciled")],
                },
            )
        if sc.profiles:
            stale = sc.taucluster_stale

            def profiles(current: bool) -> list[Obj]:
                return [
                    {
                        "name": p.name,
                        "workers": p.workers if current or not p.resolved_workers else p.resolved_workers,
                        "gpusPerWorker": p.gpus_per_worker,
                        "queue": p.local_queue,
                        "priorityClassName": p.priority_class,
                    }
                    for p in sc.profiles
                ]

            tc = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauCluster",
                    "metadata": {"name": "cluster"},
                    "spec": {"workloadProfiles": profiles(not stale)},
                }
            )
            self._taucluster = tc
            self._status(
                tc,
                {
                    "observedGeneration": 1,
                    "conditions": [self._cond("Ready", True, "Resolved", "all workload profiles resolved")],
                    "resolvedProfiles": [
                        {
                            "name": p.name,
                            "localQueue": p.local_queue,
                            "clusterQueue": p.cluster_queue,
                            "resourceFlavors": list(p.flavors),
                            "priorityClassName": p.priority_class,
                            "workers": p.resolved_workers or p.workers,
                            "gpusPerWorker": p.gpus_per_worker,
                        }
                        for p in sc.profiles
                        if p.resolved
                    ],
                    "lastResolvedTime": self._now(),
                },
            )
            if stale:  # the spec moves on (generation 2); the stuck controller never resolves it
                self._patch(tc, {"spec": {"workloadProfiles": profiles(True)}})
            else:
                self._after(sc.taucluster_refresh, self._refresh_taucluster)

    def _refresh_taucluster(self) -> None:
        if self._taucluster is not None:
            self._status(self._taucluster, {"lastResolvedTime": self._now()})
            self._after(self.scenario.taucluster_refresh, self._refresh_taucluster)

    def _add_node(self, spec: NodeSpec) -> None:
        if spec.name in self.nodes:
            return
        labels = {
            "kubernetes.io/hostname": spec.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": spec.instance_type,
            "agentpool": spec.pool,
            **spec.labels,
        }
        capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110", "ephemeral-storage": "1Ti"}
        taints: list[Obj] = []
        if spec.gpus:
            labels.update(
                {
                    "nvidia.com/gpu.product": spec.gpu_product,
                    "nvidia.com/gpu.count": str(spec.gpus),
                    "nvidia.com/gpu.present": "true",
                }
            )
            capacity["nvidia.com/gpu"] = str(spec.gpus)
            taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
        else:
            labels["node-role.kubernetes.io/system"] = ""
        ref = self._create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": spec.name, "labels": labels},
                "spec": {"providerID": f"azure:///subscriptions/sim/virtualMachines/{spec.name}", "taints": taints},
            }
        )
        ip = f"10.224.0.{len(self.nodes) + 4}"
        node = NodeState(spec, ref, ip=ip)
        self.nodes[spec.name] = node
        self._status(ref, self._node_status(node, capacity))
        self.event(
            ref,
            "Normal",
            "RegisteredNode",
            f"Node {spec.name} event: Registered Node {spec.name} in Controller",
            "node-controller",
        )
        self.event(ref, "Normal", "NodeReady", f"Node {spec.name} status is now: NodeReady", "kubelet", spec.name)

    def _node_status(self, node: NodeState, capacity: Obj | None = None) -> Obj:
        ready = node.ready
        now = self._now()
        conds = []
        for type_, reason, msg in (
            ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ):
            conds.append(
                {
                    "type": type_,
                    "status": "False" if ready else "Unknown",
                    "reason": reason if ready else "NodeStatusUnknown",
                    "message": msg if ready else "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            )
        conds.append(
            {
                "type": "Ready",
                "status": "True" if ready else "Unknown",
                "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        )
        status: Obj = {
            "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": node.ip}, {"type": "Hostname", "address": node.spec.name}],
            "nodeInfo": {
                "kubeletVersion": "v1.32.4",
                "kubeProxyVersion": "v1.32.4",
                "containerRuntimeVersion": "containerd://1.7.27",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "Ubuntu 22.04.5 LTS",
                "kernelVersion": "5.15.0-1079-azure",
                "machineID": self._hex(32),
                "systemUUID": self._hex(32),
                "bootID": self._hex(32),
            },
        }
        if capacity is not None:
            status["capacity"] = capacity
            status["allocatable"] = capacity
        return status

    # ------------------------------------------------------------------ Kueue bookkeeping
    def _sync_queues(self) -> None:
        sc = self.scenario
        for cq in sc.cluster_queues:
            runs = [r for r in self.runs.values() if r.spec.cluster_queue == cq.name and r.submitted and not r.finished]
            admitted = [r for r in runs if r.admitted]
            used = sum(r.spec.workers * r.spec.gpus_per_worker for r in admitted)
            status = {
                "pendingWorkloads": len(runs) - len(admitted),
                "reservingWorkloads": len(admitted),
                "admittedWorkloads": len(admitted),
                "flavorsReservation": [
                    {"name": cq.flavor, "resources": [{"name": "nvidia.com/gpu", "total": str(used), "borrowed": "0"}]}
                ],
                "flavorsUsage": [
                    {"name": cq.flavor, "resources": [{"name": "nvidia.com/gpu", "total": str(used), "borrowed": "0"}]}
                ],
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Ready",
                        "message": "Can admit new workloads",
                        "lastTransitionTime": rfc3339(self.origin),
                    }
                ],
            }
            self._put_queue_status(Ref(KUEUE_GV, "ClusterQueue", "", cq.name), status)
        for lq in sc.local_queues:
            runs = [
                r
                for r in self.runs.values()
                if r.spec.queue == lq.name and r.spec.namespace == lq.namespace and r.submitted and not r.finished
            ]
            n_admitted = sum(1 for r in runs if r.admitted)
            status = {
                "pendingWorkloads": len(runs) - n_admitted,
                "reservingWorkloads": n_admitted,
                "admittedWorkloads": n_admitted,
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Ready",
                        "message": "Can submit new workloads to localQueue",
                        "lastTransitionTime": rfc3339(self.origin),
                    }
                ],
            }
            self._put_queue_status(Ref(KUEUE_GV, "LocalQueue", lq.namespace, lq.name), status)

    def _put_queue_status(self, ref: Ref, status: Obj) -> None:
        key = f"{ref.kind}/{ref.namespace}/{ref.name}"
        if self._queue_status.get(key) != status:
            self._queue_status[key] = status
            self._status(ref, status)

    # ------------------------------------------------------------------ run lifecycle
    def _profile(self, run: RunSpec) -> Any:
        return next((p for p in self.scenario.profiles if p.name == run.profile), None)

    def _submit(self, r: RunState) -> None:
        spec = r.spec
        ns = spec.namespace
        profile = self._profile(spec)
        priority = profile.priority_class if profile else ""
        labels = {RUN_LABEL: spec.name} if spec.tau_run else {}
        if spec.tau_run:
            r.taurun = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauRun",
                    "metadata": {"name": spec.name, "namespace": ns, "labels": {RUN_LABEL: spec.name}},
                    "spec": {
                        "profile": spec.profile,
                        "workers": spec.workers,
                        "gpusPerWorker": spec.gpus_per_worker,
                        "image": spec.image,
                        "entrypoint": "python -m train --config /config/run.yaml",
                        "workspace": ns,
                    },
                }
            )
        if profile is not None and not profile.resolved and r.taurun is not None:
            # TauGrid cannot resolve the profile: it creates nothing below the TauRun.
            r.wait_stage = "target-resolution"
            r.submitted = True
            self._set_cond(
                r.conditions,
                self._cond("Admitted", False, "ProfileNotResolved", f"workload profile {spec.profile} is not resolved"),
            )
            self._tau_status(r, "Pending")
            return
        owner = [r.taurun.owner()] if r.taurun else []
        gpu_limits = {"nvidia.com/gpu": str(spec.gpus_per_worker)} if spec.gpus_per_worker else {}
        worker_resources = {
            "requests": {"cpu": "32", "memory": "256Gi", **gpu_limits},
            "limits": {"cpu": "32", "memory": "256Gi", **gpu_limits},
        }
        tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if spec.kind == "RayJob":
            head_res = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}
            r.root = self._create(
                {
                    "apiVersion": RAY_GV,
                    "kind": "RayJob",
                    "metadata": {
                        "name": spec.name,
                        "namespace": ns,
                        "labels": {**labels, QUEUE_LABEL: spec.queue},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "entrypoint": "python -m train --config /config/run.yaml",
                        "suspend": True,
                        "submissionMode": "K8sJobMode",
                        "shutdownAfterJobFinishes": True,
                        "backoffLimit": 0,
                        "rayClusterSpec": {
                            "rayVersion": "2.40.0",
                            "headGroupSpec": {
                                "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                                "template": {
                                    "metadata": {"labels": labels},
                                    "spec": {
                                        "containers": [{"name": "ray-head", "image": spec.image, "resources": head_res}]
                                    },
                                },
                            },
                            "workerGroupSpecs": [
                                {
                                    "groupName": "gpu-workers",
                                    "replicas": spec.workers,
                                    "minReplicas": spec.workers,
                                    "maxReplicas": spec.workers,
                                    "numOfHosts": 1,
                                    "rayStartParams": {},
                                    "template": {
                                        "metadata": {"labels": labels},
                                        "spec": {
                                            "tolerations": tolerations,
                                            "priorityClassName": priority,
                                            "containers": [
                                                {
                                                    "name": "ray-worker",
                                                    "image": spec.image,
                                                    "resources": worker_resources,
                                                }
                                            ],
                                        },
                                    },
                                }
                            ],
                        },
                    },
                },
                status={"jobDeploymentStatus": "Suspended", "jobStatus": ""},
            )
            podsets = [
                {
                    "name": "head",
                    "count": 1,
                    "template": {
                        "spec": {"containers": [{"name": "ray-head", "image": spec.image, "resources": head_res}]}
                    },
                },
                {
                    "name": "gpu-workers",
                    "count": spec.workers,
                    "template": {
                        "spec": {
                            "containers": [{"name": "ray-worker", "image": spec.image, "resources": worker_resources}]
                        }
                    },
                },
            ]
            wl_prefix = "rayjob"
        else:
            r.root = self._create(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": spec.name,
                        "namespace": ns,
                        "labels": {**labels, QUEUE_LABEL: spec.queue},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "suspend": True,
                        "parallelism": spec.workers,
                        "completions": spec.workers,
                        "completionMode": "Indexed",
                        "backoffLimit": 0,
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "restartPolicy": "Never",
                                "tolerations": tolerations,
                                "priorityClassName": priority,
                                "containers": [{"name": "main", "image": spec.image, "resources": worker_resources}],
                            },
                        },
                    },
                },
                status={"conditions": [self._cond("Suspended", True, "JobSuspended", "Job suspended")]},
            )
            podsets = [
                {
                    "name": "main",
                    "count": spec.workers,
                    "template": {
                        "spec": {"containers": [{"name": "main", "image": spec.image, "resources": worker_resources}]}
                    },
                }
            ]
            wl_prefix = "job"
        r.workload = self._create(
            {
                "apiVersion": KUEUE_GV,
                "kind": "Workload",
                "metadata": {
                    "name": f"{wl_prefix}-{spec.name}-{self._hex(5)}",
                    "namespace": ns,
                    "labels": {**labels, "kueue.x-k8s.io/job-uid": r.root.uid},
                    "ownerReferences": [r.root.owner()],
                },
                "spec": {
                    "queueName": spec.queue,
                    "priorityClassName": priority,
                    "priority": 0,
                    "active": True,
                    "podSets": podsets,
                },
            }
        )
        self.event(
            r.root, "Normal", "CreatedWorkload", f"Created Workload: {ns}/{r.workload.name}", "kueue-job-controller"
        )
        r.submitted = True
        if r.taurun is not None:
            self._set_cond(
                r.conditions,
                self._cond("Admitted", False, "Queued", f"waiting for admission in LocalQueue {spec.queue}"),
            )
            self._tau_status(
                r,
                "Pending",
                extra={"rayJobName": r.root.name if spec.kind == "RayJob" else "", "workloadName": r.workload.name},
            )
        self._sync_queues()

    def _tau_status(self, r: RunState, phase: str, extra: Obj | None = None) -> None:
        changed = phase != r.phase
        r.phase = phase
        if r.taurun is None:
            return
        status: Obj = {"phase": phase, "observedGeneration": 1, "conditions": list(r.conditions.values())}
        if extra:
            status.update({k: v for k, v in extra.items() if v})
        self._status(r.taurun, status)
        if changed or extra:
            latest = max(r.conditions.values(), key=lambda c: str(c["lastTransitionTime"]), default=None)
            detail = f": {latest['message']}" if latest and latest.get("message") else ""
            self.event(r.taurun, "Normal", phase, f"TauRun is {phase}{detail}", "taugrid-controller")

    def _wl_status(self, r: RunState, extra: Obj | None = None) -> None:
        if r.workload is None:
            return
        status: Obj = {"conditions": list(r.wl_conditions.values())}
        if extra is not None:
            status.update(extra)
        self._status(r.workload, status)

    def _run_action(self, r: RunState, step: Step) -> None:
        handler = getattr(self, f"_do_{step.action}", None)
        if handler is None:
            waits.ACTIONS[step.action](self, r, step.args)
        else:
            handler(r, step.args)

    def truth(self) -> dict[tuple[str, str], RunTruth]:
        """What is really true of every submitted run now (the harness's ground truth)."""
        _ = self.origin
        return {key: run_truth(self, r) for key, r in self.runs.items() if r.submitted}

    # --- Kueue
    def _do_waitForQuota(self, r: RunState, args: Obj) -> None:  # noqa: N802
        flavor = next((c.flavor for c in self.scenario.cluster_queues if c.name == r.spec.cluster_queue), "default")
        need = r.spec.workers * r.spec.gpus_per_worker
        message = args.get("message") or (
            f"couldn't assign flavors to pod set gpu-workers: insufficient unused quota for nvidia.com/gpu in "
            f"flavor {flavor}, {need} more needed"
        )
        self._set_cond(r.wl_conditions, self._cond("QuotaReserved", False, args.get("reason") or "Pending", message))
        self._wl_status(r, {"admission": None})
        r.wait_stage = "queue-admission"
        if r.workload is not None:
            self.event(r.workload, "Warning", "Pending", message, "kueue-admission")
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Admitted", False, "QuotaPending", message))
            self._tau_status(r, "Pending")

    def _do_admit(self, r: RunState, args: Obj) -> None:
        spec = r.spec
        cq = args.get("clusterQueue") or spec.cluster_queue
        flavor = next((c.flavor for c in self.scenario.cluster_queues if c.name == cq), "default")
        waited = int((self.clock.now() - self.origin).total_seconds() - spec.at)
        for key in ("Evicted", "Preempted", "Requeued"):
            if key in r.wl_conditions:
                self._set_cond(
                    r.wl_conditions,
                    self._cond(key, False, "QuotaReserved", "Previously: " + r.wl_conditions[key]["message"]),
                )
        self._set_cond(
            r.wl_conditions, self._cond("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq}")
        )
        self._set_cond(r.wl_conditions, self._cond("Admitted", True, "Admitted", "The workload is admitted"))
        gpus = spec.workers * spec.gpus_per_worker
        assignments = []
        if spec.kind == "RayJob":
            assignments.append(
                {
                    "name": "head",
                    "count": 1,
                    "flavors": {"cpu": flavor, "memory": flavor},
                    "resourceUsage": {"cpu": "4", "memory": "16Gi"},
                }
            )
        assignments.append(
            {
                "name": "gpu-workers" if spec.kind == "RayJob" else "main",
                "count": spec.workers,
                "flavors": {"cpu": flavor, "memory": flavor, "nvidia.com/gpu": flavor},
                "resourceUsage": {"cpu": str(32 * spec.workers), "nvidia.com/gpu": str(gpus)},
            }
        )
        self._wl_status(r, {"admission": {"clusterQueue": cq, "podSetAssignments": assignments}})
        if r.workload is not None:
            self.event(
                r.workload,
                "Normal",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cq}, wait time since queued was {max(waited, 0)}s",
                "kueue-admission",
            )
            self.event(
                r.workload,
                "Normal",
                "Admitted",
                f"Admitted by ClusterQueue {cq}, wait time since reservation was 0s",
                "kueue-admission",
            )
        r.admitted = True
        r.wait_stage = ""
        assert r.root is not None
        self._patch(r.root, {"spec": {"suspend": False}})
        if spec.kind == "RayJob":
            self._start_raycluster(r)
        else:
            self._start_job_pods(r)
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Admitted", True, "Admitted", f"admitted by ClusterQueue {cq}"))
            self._tau_status(r, "Admitted")
        self._sync_queues()

    def _start_raycluster(self, r: RunState) -> None:
        spec, root = r.spec, r.root
        assert root is not None
        name = f"{spec.name}-{self._suffix()}"
        labels = {RUN_LABEL: spec.name} if spec.tau_run else {}
        rayjob = self.client.get(RAY_GV, "RayJob", spec.namespace, spec.name)
        r.raycluster = self._create(
            {
                "apiVersion": RAY_GV,
                "kind": "RayCluster",
                "metadata": {
                    "name": name,
                    "namespace": spec.namespace,
                    "labels": {
                        **labels,
                        "ray.io/originated-from-crd": "RayJob",
                        "ray.io/originated-from-cr-name": spec.name,
                    },
                    "ownerReferences": [root.owner()],
                },
                "spec": rayjob["spec"]["rayClusterSpec"],
            }
        )
        r.job_id = f"{spec.name}-{self._suffix()}"
        self._status(
            root,
            {
                "jobDeploymentStatus": "Initializing",
                "rayClusterName": name,
                "jobId": r.job_id,
                "startTime": self._now(),
            },
        )
        self.event(
            root, "Normal", "CreatedRayCluster", f"Created RayCluster {spec.namespace}/{name}", "rayjob-controller"
        )
        r.pods = []
        head = self._make_pod(r, "head", 0, f"{name}-head-{self._suffix()}", "ray-head", 0)
        self.event(
            r.raycluster,
            "Normal",
            "CreatedHeadPod",
            f"Created head Pod {spec.namespace}/{head.ref.name}",
            "raycluster-controller",
        )
        for i in range(spec.workers):
            pod = self._make_pod(
                r, "worker", i, f"{name}-gpu-workers-worker-{self._suffix()}", "ray-worker", spec.gpus_per_worker
            )
            self.event(
                r.raycluster,
                "Normal",
                "CreatedWorkerPod",
                f"Created worker Pod {spec.namespace}/{pod.ref.name}",
                "raycluster-controller",
            )
        self._sync_raycluster(r)

    def _start_job_pods(self, r: RunState) -> None:
        spec, root = r.spec, r.root
        assert root is not None
        self._status(
            root,
            {
                "startTime": self._now(),
                "active": spec.workers,
                "ready": 0,
                "conditions": [self._cond("Suspended", False, "JobResumed", "Job resumed")],
            },
        )
        self.event(root, "Normal", "Resumed", "Job resumed", "job-controller")
        r.pods = []
        for i in range(spec.workers):
            pod = self._make_pod(r, "job", i, f"{spec.name}-{i}-{self._suffix()}", "main", spec.gpus_per_worker)
            self.event(root, "Normal", "SuccessfulCreate", f"Created pod: {pod.ref.name}", "job-controller")

    def _make_pod(self, r: RunState, role: str, index: int, name: str, container: str, gpus: int) -> PodState:
        spec = r.spec
        assert r.root is not None
        labels: Obj = {RUN_LABEL: spec.name} if spec.tau_run else {}
        if role in ("head", "worker"):
            assert r.raycluster is not None
            labels.update(
                {
                    "ray.io/cluster": r.raycluster.name,
                    "ray.io/node-type": role,
                    "ray.io/group": "headgroup" if role == "head" else "gpu-workers",
                    "ray.io/is-ray-node": "yes",
                    "app.kubernetes.io/created-by": "kuberay-operator",
                }
            )
            owner = r.raycluster
        else:
            labels.update(
                {
                    "batch.kubernetes.io/job-name": spec.name,
                    "job-name": spec.name,
                    "batch.kubernetes.io/controller-uid": r.root.uid,
                    "controller-uid": r.root.uid,
                    "batch.kubernetes.io/job-completion-index": str(index),
                }
            )
            owner = r.root
        res_gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        cpu, mem = ("4", "16Gi") if role == "head" else ("32", "256Gi")
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": spec.namespace,
                "labels": labels,
                "ownerReferences": [owner.owner()],
            },
            "spec": {
                "containers": [
                    {
                        "name": container,
                        "image": spec.image,
                        "imagePullPolicy": "IfNotPresent",
                        "resources": {
                            "requests": {"cpu": cpu, "memory": mem, **res_gpu},
                            "limits": {"cpu": cpu, "memory": mem, **res_gpu},
                        },
                    }
                ],
                "restartPolicy": "Never" if role == "job" else "Always",
                "schedulerName": "default-scheduler",
                "serviceAccountName": f"{spec.namespace}-runner",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                if gpus
                else [],
            },
        }
        ref = self._create(body)
        pod = PodState(ref, role, index, container, spec.image, gpus)
        r.pods.append(pod)
        self._pod_status(pod)
        return pod

    def _pod_status(self, pod: PodState) -> None:
        if pod.deleted:
            return
        status: Obj = {"phase": pod.phase, "qosClass": "Guaranteed", "conditions": list(pod.conditions.values())}
        if pod.reason:
            status["reason"] = pod.reason
            status["message"] = pod.message
        if pod.node:
            node = self.nodes.get(pod.node)
            host_ip = node.ip if node else ""
            status.update({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": pod.start_time})
            cs: Obj = {
                "name": pod.container,
                "image": pod.image,
                "imageID": "",
                "ready": pod.ready,
                "started": "running" in pod.state,
                "restartCount": pod.restarts,
                "state": pod.state or {"waiting": {"reason": "ContainerCreating"}},
                "lastState": pod.last_state,
            }
            if pod.container_id:
                cs["containerID"] = pod.container_id
                cs["imageID"] = f"{pod.image.split(':')[0]}@sha256:{'5e' * 32}"
            status["containerStatuses"] = [cs]
        if pod.ip:
            status.update({"podIP": pod.ip, "podIPs": [{"ip": pod.ip}]})
        self._status(pod.ref, status)

    def _pods(self, r: RunState, which: str) -> list[PodState]:
        alive = [p for p in r.pods if not p.deleted]
        if which in ("", "all"):
            return alive
        if which == "head":
            return [p for p in alive if p.role == "head"] or alive[:1]
        if which == "workers":
            return [p for p in alive if p.role in ("worker", "job")]
        if "-" in which:
            role, _, idx = which.rpartition("-")
            return [p for p in alive if p.role == role and str(p.index) == idx]
        return [p for p in alive if p.ref.name == which]

    def _free_nodes(self) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.ready]

    def _unschedulable_message(self) -> str:
        nodes = self._free_nodes()
        total = len(nodes)
        gpu = sum(1 for n in nodes if n.spec.gpus)
        other = total - gpu
        head = f"0/{total} nodes are available: "
        parts, pre = [], []
        if other:
            parts.append(f"{other} node(s) had untolerated taint {{node-role.kubernetes.io/system: }}")
            pre.append(f"{other} Preemption is not helpful for scheduling")
        if gpu:
            parts.append(f"{gpu} Insufficient nvidia.com/gpu")
            pre.append(f"{gpu} No preemption victims found for incoming pod")
        return f"{head}{', '.join(parts)}. preemption: 0/{total} nodes are available: {', '.join(pre)}."

    def _do_unschedulable(self, r: RunState, args: Obj) -> None:
        every = parse_duration(args.get("repeatEvery", 60), "repeatEvery")
        gen = r.train_gen
        r.wait_stage = r.wait_stage or "pod-scheduling"

        def tick() -> None:
            pending = [p for p in r.pods if not p.deleted and not p.node and p.gpus]
            if not pending or gen != r.train_gen or not r.admitted:
                return
            message = args.get("message") or self._unschedulable_message()
            for pod in pending:
                self._set_cond(pod.conditions, self._cond("PodScheduled", False, "Unschedulable", message))
                self._pod_status(pod)
                if args.get("events", True):  # False: the events aged out, the pod condition remains
                    self.event(pod.ref, "Warning", "FailedScheduling", message, "default-scheduler")
            self._after(every, tick)

        tick()

    def _do_scaleUp(self, r: RunState, args: Obj) -> None:  # noqa: N802
        pending = [p for p in r.pods if not p.deleted and not p.node and p.gpus]
        group = args.get("nodeGroup", "aks-gpu-vmss")
        if args.get("triggered", True):
            message = args.get("message") or (
                f"pod triggered scale-up: [{{{group} {args.get('from', 4)}->{args.get('to', 5)} "
                f"(max: {args.get('max', 8)})}}]"
            )
            reason = "TriggeredScaleUp"
            r.wait_stage = "node-scaling"
        else:
            message = args.get("message") or "pod didn't trigger scale-up: 1 max node group size reached"
            reason = "NotTriggerScaleUp"
            r.wait_stage = "node-scaling"
        for pod in pending:
            self.event(pod.ref, "Normal", reason, message, "cluster-autoscaler")

    def _pick_node(self, r: RunState, pod: PodState, preferred: list[str]) -> str:
        ready = self._free_nodes()
        if preferred:
            return preferred[(pod.index + (1 if pod.role == "worker" else 0)) % len(preferred)]
        if not pod.gpus:
            cpu = [n for n in ready if not n.spec.gpus]
            if cpu:
                return cpu[0].spec.name
        flavor = next((c.flavor for c in self.scenario.cluster_queues if c.name == r.spec.cluster_queue), "")
        gpu = [n for n in ready if n.spec.gpus]
        matching = [n for n in gpu if flavor and flavor.lower() in n.spec.gpu_product.lower()]
        gpu = sorted(matching or gpu, key=lambda n: n.gpus_used)
        fits = [n for n in gpu if n.spec.gpus - n.gpus_used >= pod.gpus]
        chosen = (fits or gpu or ready)[0]
        return chosen.spec.name

    def _do_schedule(self, r: RunState, args: Obj) -> None:
        preferred = [str(n) for n in args.get("nodes") or []]
        for pod in [p for p in self._pods(r, str(args.get("pods", "all"))) if not p.node]:
            node = self._pick_node(r, pod, preferred)
            self.client.bind(pod.ref.namespace, pod.ref.name, node)
            pod.node = node
            if node in self.nodes:
                self.nodes[node].gpus_used += pod.gpus
            pod.start_time = self._now()
            self._set_cond(pod.conditions, self._cond("PodScheduled", True, "", ""))
            self._set_cond(pod.conditions, self._cond("PodReadyToStartContainers", False, "", ""))
            self._set_cond(pod.conditions, self._cond("Initialized", True, "", ""))
            self._set_cond(
                pod.conditions,
                self._cond("Ready", False, "ContainersNotReady", f"containers with unready status: [{pod.container}]"),
            )
            self._set_cond(
                pod.conditions,
                self._cond(
                    "ContainersReady", False, "ContainersNotReady", f"containers with unready status: [{pod.container}]"
                ),
            )
            pod.state = {"waiting": {"reason": "ContainerCreating"}}
            self._pod_status(pod)
            self.event(
                pod.ref,
                "Normal",
                "Scheduled",
                f"Successfully assigned {pod.ref.namespace}/{pod.ref.name} to {node}",
                "default-scheduler",
            )
        if r.taurun is not None and all(p.node for p in r.pods if not p.deleted):
            self._set_cond(
                r.conditions,
                self._cond("Scheduled", True, "PodsScheduled", f"{len(r.pods)}/{len(r.pods)} pods bound to nodes"),
            )
            self._tau_status(r, "Scheduled")

    def _do_pull(self, r: RunState, args: Obj) -> None:
        for pod in self._pods(r, "all"):
            if not pod.node:
                continue
            self._set_cond(pod.conditions, self._cond("PodReadyToStartContainers", True, "", ""))
            self._pod_status(pod)
            self.event(
                pod.ref,
                "Normal",
                "Pulling",
                f'Pulling image "{args.get("image") or pod.image}"',
                "kubelet",
                pod.node,
                f"spec.containers{{{pod.container}}}",
            )

    def _do_pullFail(self, r: RunState, args: Obj) -> None:  # noqa: N802
        message = args.get("message") or "rpc error: code = NotFound desc = failed to pull and unpack image: not found"
        gen = r.train_gen
        for pod in self._pods(r, "all"):
            if not pod.node:
                continue
            fp = f"spec.containers{{{pod.container}}}"
            self.event(
                pod.ref, "Warning", "Failed", f'Failed to pull image "{pod.image}": {message}', "kubelet", pod.node, fp
            )
            self.event(pod.ref, "Warning", "Failed", "Error: ErrImagePull", "kubelet", pod.node, fp)
            pod.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
            self._pod_status(pod)

            def backoff(pod: PodState = pod, fp: str = fp) -> None:
                if gen != r.train_gen or pod.deleted or "running" in pod.state:
                    return
                pod.state = {
                    "waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{pod.image}"'}
                }
                self._pod_status(pod)
                self.event(
                    pod.ref, "Normal", "BackOff", f'Back-off pulling image "{pod.image}"', "kubelet", pod.node, fp
                )
                self.event(pod.ref, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", pod.node, fp)
                self._after(60.0, backoff)

            self._after(10.0, backoff)

    def _container_running(self, pod: PodState) -> None:
        pod.container_id = f"containerd://{self._hex(64)}"
        pod.state = {"running": {"startedAt": self._now()}}
        pod.ready = True
        pod.phase = "Running"
        for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
            self._set_cond(pod.conditions, self._cond(c, True, "", ""))
        if not pod.ip:
            pod.ip = f"10.244.{1 + len(self.nodes)}.{self._rng.randrange(2, 250)}"
        self._pod_status(pod)

    def _do_start(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1  # ends pull back-off loops
        pull = float(args.get("pullSeconds", 31.4))
        for pod in self._pods(r, "all"):
            if not pod.node:
                continue
            fp = f"spec.containers{{{pod.container}}}"
            self._start_container(
                r,
                pod,
                fp,
                f'Successfully pulled image "{pod.image}" in {pull:.3f}s ({pull:.3f}s including waiting). '
                "Image size: 9182736455 bytes.",
            )
        self._sync_raycluster(r)
        if r.root is not None and r.spec.kind == "RayJob":
            r.started = self._now()
            head = next((p for p in r.pods if p.role == "head"), None)
            self._status(
                r.root,
                {
                    "jobDeploymentStatus": "Running",
                    "jobStatus": "RUNNING",
                    "dashboardURL": f"{r.raycluster.name if r.raycluster else ''}-head-svc."
                    f"{r.spec.namespace}.svc.cluster.local:8265",
                    "rayClusterStatus": {"state": "ready", "head": {"podIP": head.ip if head else ""}},
                },
            )
            self.event(
                r.root,
                "Normal",
                "Created",
                f"Created Kubernetes Job {r.spec.namespace}/{r.spec.name}",
                "rayjob-controller",
            )
        elif r.root is not None:
            self._status(r.root, {"active": r.spec.workers, "ready": r.spec.workers})
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Running", True, "PodsRunning", "all pods running and ready"))
            self._tau_status(r, "Running")

    def _startup_lines(self, r: RunState, pod: PodState) -> list[str]:
        if pod.role == "head":
            return [
                "Usage stats collection is disabled.",
                f"Local node IP: {pod.ip}",
                "--------------------",
                "Ray runtime started.",
                "--------------------",
                f"Job '{r.job_id}' submitted: python -m train --config /config/run.yaml",
            ]
        if pod.role == "worker":
            return [
                f"Local node IP: {pod.ip}",
                "--------------------",
                "Ray runtime started.",
                "--------------------",
                "To terminate the Ray runtime, run\n  ray stop",
            ]
        return [f"[rank{pod.index}] starting {r.spec.name} on {pod.node}"]

    def _sync_raycluster(self, r: RunState) -> None:
        if r.raycluster is None:
            return
        workers = [p for p in r.pods if p.role == "worker" and not p.deleted]
        ready = sum(1 for p in workers if p.ready)
        head = next((p for p in r.pods if p.role == "head" and not p.deleted), None)
        all_ready = head is not None and head.ready and ready == r.spec.workers
        status: Obj = {
            "state": "ready" if all_ready or (head is not None and head.ready) else "",
            "desiredWorkerReplicas": r.spec.workers,
            "minWorkerReplicas": r.spec.workers,
            "maxWorkerReplicas": r.spec.workers,
            "readyWorkerReplicas": ready,
            "availableWorkerReplicas": ready,
            "desiredGPU": str(r.spec.workers * r.spec.gpus_per_worker),
            "desiredCPU": str(4 + 32 * r.spec.workers),
            "desiredMemory": f"{16 + 256 * r.spec.workers}Gi",
            "head": {
                "podName": head.ref.name if head else "",
                "podIP": head.ip if head else "",
                "serviceName": f"{r.raycluster.name}-head-svc",
            },
            "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
            "lastUpdateTime": self._now(),
            "observedGeneration": 1,
        }
        self._status(r.raycluster, status)

    def _do_train(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1
        gen = r.train_gen
        every = parse_duration(args.get("every", 10), "train.every")
        total = int(args.get("iterations", 250_000))
        loss0, floor = float(args.get("loss", 3.2)), float(args.get("minLoss", 1.8))
        batch = int(args.get("batchSize", 1024))
        ckpt = int(args.get("checkpointEvery", 500))
        lag = int(args.get("lagRanks", 0))
        which = str(args.get("pods", "workers" if lag else "head"))
        style = str(args.get("style", "megatron"))
        skip_ratio = float(args.get("skipRatio", 0.0))
        eval_every = int(args.get("evalEvery", 0))
        template = str(args.get("line", MEGATRON_LINE))
        if "startIteration" in args:
            r.iteration = int(args["startIteration"])
        r.every = every
        r.skip_ratio = skip_ratio

        def tick() -> None:
            if gen != r.train_gen or r.finished:
                return
            targets = [p for p in self._pods(r, which) if p.ready]
            if targets:
                r.iteration += 1
                it = r.iteration
                loss = floor + (loss0 - floor) * math.exp(-it / 4000.0) + self._rng.uniform(-0.02, 0.02)
                ms = every * 1000 * self._rng.uniform(0.97, 1.03)
                lr = min(3e-4, 3e-4 * it / 2000)
                grad_norm = self._rng.uniform(0.2, 0.4)
                skipped = skip_ratio > 0 and math.floor(it * skip_ratio) > math.floor((it - 1) * skip_ratio)
                r.skipped += int(skipped)
                if not skipped and it > r.hwm:  # the truth: a valid update past the high-water mark
                    r.hwm = it
                    r.last_advance = self.elapsed
                for pod in targets:
                    rank_it = it - lag * pod.index if lag else it
                    if rank_it < 1:
                        continue
                    fields = {
                        "time": self.clock.now().strftime("%Y-%m-%d %H:%M:%S"),
                        "iteration": rank_it,
                        "iterations": total,
                        "samples": rank_it * batch,
                        "ms": ms,
                        "lr": lr,
                        "batch": batch,
                        "loss": loss,
                        "grad_norm": grad_norm,
                        "rate": batch * 1000 / ms,
                        "run": r.spec.name,
                    }
                    lines = waits.progress_lines(self, style, template, fields, skipped, r.skipped, eval_every)
                    if ckpt and rank_it % ckpt == 0 and style == "megatron":
                        lines += [
                            f"saving checkpoint at iteration {rank_it:>8} to /mnt/checkpoints/{r.spec.name}",
                            f"  successfully saved checkpoint at iteration {rank_it:>8} to "
                            f"/mnt/checkpoints/{r.spec.name}",
                        ]
                    if lag:
                        lines = [f"[rank{pod.index}]:{line}" for line in lines]
                    self._logs(pod, lines)
            if r.iteration < total:
                self._after(every, tick)

        tick()

    def _do_stall(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1

    def _do_crashLoop(self, r: RunState, args: Obj) -> None:  # noqa: N802
        r.crash_gen += 1
        r.crash_looping = True
        gen = r.crash_gen
        reason = str(args.get("reason", "OOMKilled"))
        exit_code = int(args.get("exitCode", 137 if reason == "OOMKilled" else 1))
        run_for = parse_duration(args.get("runFor", 60), "crashLoop.runFor")
        max_backoff = parse_duration(args.get("maxBackoff", 300), "crashLoop.maxBackoff")
        lines = [str(x) for x in args.get("lines") or []]

        def crash(pod: PodState) -> None:
            if gen != r.crash_gen or pod.deleted or not pod.node or "running" not in pod.state:
                return
            if lines:
                self._logs(pod, lines)
            started = pod.state["running"].get("startedAt", self._now())
            pod.last_state = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "startedAt": started,
                    "finishedAt": self._now(),
                    "containerID": pod.container_id,
                }
            }
            delay = pod.backoff
            pod.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": (
                        f"back-off {int(delay)}s restarting failed container={pod.container} "
                        f"pod={pod.ref.name}_{pod.ref.namespace}({pod.ref.uid})"
                    ),
                }
            }
            pod.ready = False
            for c in ("Ready", "ContainersReady"):
                self._set_cond(
                    pod.conditions,
                    self._cond(c, False, "ContainersNotReady", f"containers with unready status: [{pod.container}]"),
                )
            self._pod_status(pod)
            self.client.rotate_log(pod.ref.namespace, pod.ref.name, pod.container)
            if reason == "OOMKilled" and pod.node in self.nodes:
                self.event(
                    self.nodes[pod.node].ref,
                    "Warning",
                    "SystemOOM",
                    f"System OOM encountered, victim process: python, pid: {self._rng.randrange(900, 99999)}",
                    "kubelet",
                    pod.node,
                )
            self.event(
                pod.ref,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {pod.container} in pod "
                f"{pod.ref.name}_{pod.ref.namespace}({pod.ref.uid})",
                "kubelet",
                pod.node,
                f"spec.containers{{{pod.container}}}",
            )
            self._sync_raycluster(r)
            pod.backoff = min(pod.backoff * 2, max_backoff)
            self._after(delay, lambda: restart(pod))

        def restart(pod: PodState) -> None:
            if gen != r.crash_gen or pod.deleted or not self._node_ready(pod):
                return
            fp = f"spec.containers{{{pod.container}}}"
            pod.restarts += 1
            self._start_container(r, pod, fp, f'Container image "{pod.image}" already present on machine')
            self._sync_raycluster(r)
            self._after(run_for, lambda: crash(pod))

        for pod in self._pods(r, str(args.get("pods", "workers"))):
            crash(pod)

    def _do_recover(self, r: RunState, args: Obj) -> None:
        """End a crash loop: the containers come back and stay up."""
        r.crash_gen += 1
        r.crash_looping = False
        for pod in self._pods(r, str(args.get("pods", "all"))):
            if pod.node and "running" not in pod.state and self._node_ready(pod):
                pod.restarts += 1
                self._container_running(pod)
        self._sync_raycluster(r)

    def _node_ready(self, pod: PodState) -> bool:
        node = self.nodes.get(pod.node)
        return node is None or node.ready

    def _stop_pods(self, r: RunState) -> None:
        for pod in r.pods:
            if pod.deleted:
                continue
            if pod.node and "running" in pod.state:
                self.event(
                    pod.ref,
                    "Normal",
                    "Killing",
                    f"Stopping container {pod.container}",
                    "kubelet",
                    pod.node,
                    f"spec.containers{{{pod.container}}}",
                )
            if pod.node in self.nodes:
                self.nodes[pod.node].gpus_used -= pod.gpus
            pod.deleted = True

    def _do_preempt(self, r: RunState, args: Obj) -> None:
        message = args.get("message") or (
            f"Preempted to accommodate a workload (UID: {self._uuidish()}) due to prioritization in the ClusterQueue"
        )
        r.train_gen += 1
        r.crash_gen += 1
        self._set_cond(r.wl_conditions, self._cond("Evicted", True, "Preempted", message))
        self._set_cond(r.wl_conditions, self._cond("Preempted", True, "InClusterQueue", message))
        self._set_cond(r.wl_conditions, self._cond("QuotaReserved", False, "Preempted", message))
        self._set_cond(
            r.wl_conditions, self._cond("Admitted", False, "NoReservation", "The workload has no reservation")
        )
        self._wl_status(r, {"admission": None})
        r.admitted = False
        r.wait_stage = "queue-admission"
        assert r.root is not None and r.workload is not None
        self.event(r.workload, "Normal", "Preempted", message, "kueue-admission")
        self.event(r.root, "Normal", "Stopped", message, "kueue-job-controller")
        self._patch(r.root, {"spec": {"suspend": True}})
        self._stop_pods(r)
        if r.spec.kind == "RayJob":
            self._status(
                r.root,
                {"jobDeploymentStatus": "Suspended", "jobStatus": "", "rayClusterName": "", "rayClusterStatus": {}},
            )
            if r.raycluster is not None:
                self.client.delete(RAY_GV, "RayCluster", r.spec.namespace, r.raycluster.name)
                r.raycluster = None
        else:
            self._status(
                r.root,
                {
                    "active": 0,
                    "ready": 0,
                    "conditions": [self._cond("Suspended", True, "JobSuspended", "Job suspended")],
                },
            )
            for pod in r.pods:
                self.client.delete("v1", "Pod", pod.ref.namespace, pod.ref.name)
        r.pods = []
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Admitted", False, "Preempted", message))
            for c in ("Scheduled", "Running"):
                if c in r.conditions:
                    self._set_cond(r.conditions, self._cond(c, False, "Preempted", message))
            self._tau_status(r, "Pending")
        self._sync_queues()

    def _uuidish(self) -> str:
        h = self._hex(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"

    def _lose_node(self, name: str, pod_phase: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, f"scenario: node {name!r} does not exist")
        node.ready = False
        self._patch(
            node.ref,
            {
                "spec": {
                    "taints": [
                        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": self._now()},
                        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": self._now()},
                    ]
                }
            },
        )
        self._status(node.ref, self._node_status(node))
        self.event(node.ref, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady", "node-controller")
        for r in self.runs.values():
            hit = False
            for pod in r.pods:
                if pod.deleted or pod.node != name or pod.phase in ("Succeeded", "Failed"):
                    continue
                hit = True
                pod.ready = False
                for c in ("Ready", "ContainersReady"):
                    self._set_cond(
                        pod.conditions,
                        self._cond(c, False, "NodeLost" if c == "Ready" else "", f"Node {name} is unreachable"),
                    )
                if pod_phase:
                    pod.phase = pod_phase
                    pod.reason = "NodeLost"
                    pod.message = f"Node {name} which was running pod {pod.ref.name} is unresponsive"
                self._pod_status(pod)
                self.event(pod.ref, "Warning", "NodeNotReady", "Node is not ready", "node-controller")
            if hit:
                r.train_gen += 1
                r.crash_gen += 1
                self._sync_raycluster(r)

    def _do_nodeLoss(self, r: RunState, args: Obj) -> None:  # noqa: N802
        node = args.get("node") or next((p.node for p in r.pods if p.role in ("worker", "job") and p.node), "")
        if not node:
            raise ApiError(422, f"scenario: run {r.spec.name} has no bound pod whose node could be lost")
        self._lose_node(str(node), str(args.get("podPhase", "Unknown")))

    def _finish(self, r: RunState, ok: bool, message: str, exit_code: int) -> None:
        r.train_gen += 1
        r.crash_gen += 1
        r.finished = True
        now = self._now()
        assert r.root is not None
        for pod in self._pods(r, "all"):
            if pod.node and ("running" in pod.state or pod.role == "job"):
                pod.last_state = {}
                pod.state = {
                    "terminated": {
                        "exitCode": 0 if ok else exit_code,
                        "reason": "Completed" if ok else "Error",
                        "startedAt": (pod.state.get("running") or {}).get("startedAt", now),
                        "finishedAt": now,
                        "containerID": pod.container_id,
                    }
                }
                pod.ready = False
                pod.phase = "Succeeded" if ok else "Failed"
                for c in ("Ready", "ContainersReady"):
                    self._set_cond(pod.conditions, self._cond(c, False, "PodCompleted", ""))
                self._pod_status(pod)
        head = next((p for p in r.pods if p.role in ("head", "job") and not p.deleted), None)
        if head is not None and head.node:
            self._logs(
                head,
                [f"Job '{r.job_id or r.spec.name}' {'succeeded' if ok else 'failed'}" + ("" if ok else f": {message}")],
            )
        if r.spec.kind == "RayJob":
            self._status(
                r.root,
                {
                    "jobDeploymentStatus": "Complete" if ok else "Failed",
                    "jobStatus": "SUCCEEDED" if ok else "FAILED",
                    "endTime": now,
                    "message": message,
                    "succeeded": 1 if ok else 0,
                    "failed": 0 if ok else 1,
                },
            )
            self.event(
                r.root,
                "Normal" if ok else "Warning",
                "Completed" if ok else "Failed",
                message or "RayJob completed",
                "rayjob-controller",
            )
        else:
            done = self._cond(
                "Complete" if ok else "Failed",
                True,
                "CompletionsReached" if ok else "BackoffLimitExceeded",
                message
                or (
                    "Reached expected number of succeeded pods" if ok else "Job has reached the specified backoff limit"
                ),
            )
            crit = self._cond("SuccessCriteriaMet" if ok else "FailureTarget", True, done["reason"], done["message"])
            self._status(
                r.root,
                {
                    "active": 0,
                    "ready": 0,
                    "succeeded": r.spec.workers if ok else 0,
                    "failed": 0 if ok else 1,
                    "completionTime": now if ok else None,
                    "conditions": [crit, done],
                },
            )
            self.event(
                r.root,
                "Normal" if ok else "Warning",
                "Completed" if ok else "BackoffLimitExceeded",
                "Job completed" if ok else "Job has reached the specified backoff limit",
                "job-controller",
            )
        self._set_cond(
            r.wl_conditions,
            self._cond(
                "Finished",
                True,
                "Succeeded" if ok else "Failed",
                message or ("Job finished successfully" if ok else "Job failed"),
            ),
        )
        self._wl_status(r)
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Running", False, "Finished", "run finished"))
            self._set_cond(
                r.conditions,
                self._cond("Succeeded" if ok else "Failed", True, "Succeeded" if ok else "Failed", message),
            )
            self._tau_status(r, "Succeeded" if ok else "Failed")
        if r.spec.kind == "RayJob" and r.raycluster is not None:
            self._stop_pods(r)
            self.client.delete(RAY_GV, "RayCluster", r.spec.namespace, r.raycluster.name)
            r.raycluster = None
        self._sync_queues()

    def _do_succeed(self, r: RunState, args: Obj) -> None:
        self._finish(r, True, "", 0)

    def _do_fail(self, r: RunState, args: Obj) -> None:
        self._finish(
            r, False, str(args.get("message", "training process exited with code 1")), int(args.get("exitCode", 1))
        )

    def _do_log(self, r: RunState, args: Obj) -> None:
        for pod in self._pods(r, str(args.get("pods", "head"))):
            self._logs(pod, [str(x) for x in args["lines"]])

    def _target(self, r: RunState, which: str) -> Ref:
        kind, _, rest = which.partition(":")
        refs = {
            "taurun": r.taurun,
            "rayjob": r.root if r.spec.kind == "RayJob" else None,
            "job": r.root if r.spec.kind == "Job" else None,
            "root": r.root,
            "workload": r.workload,
            "raycluster": r.raycluster,
        }
        if kind in refs:
            ref = refs[kind]
        elif kind == "pod":
            pods = self._pods(r, rest or "head")
            ref = pods[0].ref if pods else None
        elif kind == "node":
            node = self.nodes.get(rest)
            ref = node.ref if node else None
        else:
            ref = None
        if ref is None:
            raise ApiError(422, f"scenario: run {r.spec.name} has no object {which!r} now")
        return ref

    def _do_event(self, r: RunState, args: Obj) -> None:
        ref = self._target(r, str(args.get("object", "root")))
        self.event(
            ref,
            str(args.get("type", "Normal")),
            str(args["reason"]),
            str(args["message"]),
            str(args.get("component", "taugrid-controller")),
        )

    def _do_patch(self, r: RunState, args: Obj) -> None:
        ref = self._target(r, str(args.get("object", "root")))
        self.client.patch(
            ref.api_version, ref.kind, ref.namespace, ref.name, dict(args["body"]), str(args.get("subresource", ""))
        )

    # ------------------------------------------------------------------ cluster actions
    def _cluster_action(self, step: Step) -> None:
        a = step.args
        if step.action == "addNode":
            self._add_node(
                NodeSpec(
                    name=str(a["name"]),
                    pool=str(a.get("pool", "gpu")),
                    gpus=int(a.get("gpus", 8)),
                    gpu_product=str(a.get("gpuProduct", "NVIDIA-A100-SXM4-80GB")),
                    instance_type=str(a.get("instanceType", "Standard_ND96amsr_A100_v4")),
                    labels=dict(a.get("labels") or {}),
                )
            )
        elif step.action == "nodeLoss":
            self._lose_node(str(a["node"]), str(a.get("podPhase", "Unknown")))
        elif step.action == "nodeRecover":
            node = self.nodes[str(a["node"])]
            node.ready = True
            self._patch(
                node.ref,
                {
                    "spec": {
                        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
                        if node.spec.gpus
                        else []
                    }
                },
            )
            self._status(node.ref, self._node_status(node))
            self.event(
                node.ref,
                "Normal",
                "NodeReady",
                f"Node {node.spec.name} status is now: NodeReady",
                "kubelet",
                node.spec.name,
            )
        elif step.action == "create":
            obj = dict(a["object"])
            status = obj.pop("status", None)
            self._create(obj, status=status)
        elif step.action == "patch":
            self.client.patch(
                str(a.get("apiVersion", "v1")),
                str(a.get("kind", "")),
                str(a.get("namespace", "")),
                str(a.get("name", "")),
                dict(a["body"]),
                str(a.get("subresource", "")),
            )
        elif step.action == "delete":
            self.client.delete(str(a["apiVersion"]), str(a["kind"]), str(a.get("namespace", "")), str(a["name"]))
