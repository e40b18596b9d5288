"""Nodes and placement: node registration and status, the scheduler (binding, Unschedulable),
the cluster autoscaler's scale-up events, node loss and recovery, and the scenario's cluster actions.
"""

from __future__ import annotations

import math
from datetime import timedelta

from kubesim.clock import rfc3339, rfc3339_micro
from kubesim.engine.controllers import JobControllers
from kubesim.engine.state import NodeState, Obj, PodState, RunState
from kubesim.errors import ApiError
from kubesim.scenario import NodeSpec, Step, parse_duration

LEASE_GV = "coordination.k8s.io/v1"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_RENEW_S = 10.0  # the kubelet renews its Lease every leaseDurationSeconds / 4
LEASE_DURATION_S = 40
# kube-controller-manager --node-monitor-grace-period (50 s since Kubernetes 1.32, 40 s before): how long
# a node may stay silent before the node lifecycle controller marks it Ready=Unknown.
NODE_MONITOR_GRACE_S = 50.0


class Nodes(JobControllers):
    """Nodes, the scheduler and the cluster autoscaler."""

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
        node = NodeState(spec, ref, ip=ip, registered=self.elapsed, capacity=capacity)
        node.heartbeat = node.transition = rfc3339(self._node_time(spec.name))
        node.status_at = self.elapsed
        self.nodes[spec.name] = node
        self._status(ref, self._node_status(node, capacity))
        if self.scenario.kubelet_heartbeats:
            node.lease_phase = self._rng.uniform(0.0, LEASE_RENEW_S)
            node.status_phase = self._rng.uniform(0.0, self.scenario.node_status_report)
            node.lease_at = self.elapsed
            node.lease = self._create(
                {
                    "apiVersion": LEASE_GV,
                    "kind": "Lease",
                    "metadata": {
                        "name": spec.name,
                        "namespace": LEASE_NAMESPACE,
                        "ownerReferences": [ref.owner(False)],
                    },
                    "spec": {
                        "holderIdentity": spec.name,
                        "leaseDurationSeconds": LEASE_DURATION_S,
                        "renewTime": rfc3339_micro(self._node_time(spec.name)),
                    },
                }
            )
        self.event(
            ref,
            "Normal",
            "RegisteredNode",
            f"Node {spec.name} event: Registered Node {spec.name} in Controller",
            "node-controller",
        )
        self.event(ref, "Normal", "NodeReady", f"Node {spec.name} status is now: NodeReady", "kubelet", spec.name)

    def _node_status(self, node: NodeState, capacity: Obj | None = None) -> Obj:
        """The node's status conditions: lastHeartbeatTime is the kubelet's last post (its clock),
        lastTransitionTime when Ready last changed."""
        ready = node.ready
        heartbeat, transition = node.heartbeat or self._now(), node.transition or self._now()
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
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": transition,
                }
            )
        conds.append(
            {
                "type": "Ready",
                "status": "True" if ready else "Unknown",
                "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
                "lastHeartbeatTime": heartbeat,
                "lastTransitionTime": transition,
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
        """The scheduler's choice: a ready CPU node for a pod without GPUs; else the least used ready GPU
        node of the run's flavor (any GPU node when none of that flavor is ready) that fits, else the
        least used; ties go to the first registered. One scan, no sort: fleets have thousands of nodes."""
        if preferred:
            return preferred[(pod.index + (1 if pod.role == "worker" else 0)) % len(preferred)]
        if not pod.gpus:
            cpu = next((n for n in self.nodes.values() if n.ready and not n.spec.gpus), None)
            if cpu is not None:
                return cpu.spec.name
        flavor = next((c.flavor for c in self.scenario.cluster_queues if c.name == r.spec.cluster_queue), "")
        matching, gpu = self._gpu_nodes(flavor)
        chosen = _least_used(matching, pod.gpus) or _least_used(gpu, pod.gpus) or self._free_nodes()[0]
        return chosen.spec.name

    def _gpu_nodes(self, flavor: str) -> tuple[list[NodeState], list[NodeState]]:
        """GPU nodes whose product names the flavor, and all GPU nodes, in registration order (cached
        until a node is added)."""
        cached = self._gpu_node_cache.get(flavor)
        if cached is None or cached[0] != len(self.nodes):
            gpu = [n for n in self.nodes.values() if n.spec.gpus]
            matching = [n for n in gpu if flavor and flavor.lower() in n.spec.gpu_product.lower()]
            cached = self._gpu_node_cache[flavor] = (len(self.nodes), matching, gpu)
        return cached[1], cached[2]

    def _do_schedule(self, r: RunState, args: Obj) -> None:
        preferred = [str(n) for n in args.get("nodes") or []]
        for pod in [p for p in self._pods(r, str(args.get("pods", "all"))) if not p.node]:
            self._bind_pod(r, pod, self._pick_node(r, pod, preferred))
        self._scheduled_status(r)

    def _bind_pod(self, r: RunState, pod: PodState, node: str) -> None:
        """The scheduler binds one pod (pods/binding) and says so."""
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

    def _scheduled_status(self, r: RunState) -> None:
        if r.taurun is not None and all(p.node for p in r.pods if not p.deleted):
            self._set_cond(
                r.conditions,
                self._cond("Scheduled", True, "PodsScheduled", f"{len(r.pods)}/{len(r.pods)} pods bound to nodes"),
            )
            self._tau_status(r, "Scheduled")

    def _kubelet_sync(self) -> None:
        """Each live kubelet's periodic writes up to now: its Lease renewed every 10 s and its node
        status reported every nodeStatusReportFrequency (lastHeartbeatTime can be minutes old on a
        healthy node). Written lazily, one write per node per step: nobody sees the ticks in between."""
        if not self.scenario.kubelet_heartbeats:
            return
        for node in self.nodes.values():
            if node.alive:
                self._kubelet_post(node, self.elapsed)

    def _kubelet_post(self, node: NodeState, t: float) -> None:
        """The node's last Lease renewal and status report at or before `t` (scenario seconds)."""
        base = node.registered
        tick = _last_tick(t, base + node.lease_phase, LEASE_RENEW_S, base)
        if node.lease is not None and tick > node.lease_at:
            node.lease_at = tick
            stamp = self.origin + timedelta(seconds=tick + node.spec.clock_skew)
            self.client.patch(LEASE_GV, "Lease", LEASE_NAMESPACE, node.spec.name,
                              {"spec": {"renewTime": rfc3339_micro(stamp)}})
        report = self.scenario.node_status_report
        tick = _last_tick(t, base + node.status_phase, report, base)
        if tick > node.status_at:
            node.status_at = tick
            node.heartbeat = rfc3339(self.origin + timedelta(seconds=tick + node.spec.clock_skew))
            self._status(node.ref, {"conditions": self._node_status(node)["conditions"]})

    def _lose_node(self, name: str, pod_phase: str) -> None:
        """The node goes away (power, network, kernel): its kubelet stops renewing its Lease and posting
        status, its containers stop. The node lifecycle controller notices only after the monitor grace
        period: then Ready=Unknown, the unreachable taints, and its pods NotReady."""
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, f"scenario: node {name!r} does not exist")
        if not node.alive:
            return
        if self.scenario.kubelet_heartbeats:
            self._kubelet_post(node, self.elapsed)  # its last renewal before it went
        node.alive = False
        node.dead_at = self.elapsed
        for r in self.runs.values():
            if any(not p.deleted and p.node == name and p.phase not in ("Succeeded", "Failed") for p in r.pods):
                r.train_gen += 1  # the ranks there are gone: collectives stop, so does every step
                r.crash_gen += 1
            for p in r.pods:
                if p.node == name:
                    p.sidecar_gen += 1
        delay = NODE_MONITOR_GRACE_S if self.scenario.kubelet_heartbeats else 0.0
        self._after(delay, lambda: self._mark_node_lost(node, pod_phase))

    def _mark_node_lost(self, node: NodeState, pod_phase: str) -> None:
        """The node lifecycle controller's view of a silent node."""
        if node.alive:
            return  # it came back within the grace period
        name = node.spec.name
        node.ready = False
        node.transition = self._now()
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
            node.ready = node.alive = True
            node.dead_at = None
            node.transition = node.heartbeat = rfc3339(self._node_time(node.spec.name))
            node.status_at = node.lease_at = self.elapsed
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


def _least_used(nodes: list[NodeState], need: int) -> NodeState | None:
    """The first ready node with the fewest GPUs in use among those with `need` free, else among all."""
    best: NodeState | None = None
    best_fit: NodeState | None = None
    for n in nodes:
        if not n.ready:
            continue
        used = n.gpus_used
        if best is None or used < best.gpus_used:
            best = n
        if n.spec.gpus - used >= need and (best_fit is None or used < best_fit.gpus_used):
            best_fit = n
    return best_fit or best


def _last_tick(t: float, first: float, every: float, floor: float) -> float:
    """The latest of first + every·k (k ≥ 0) at or before t; `floor` before the first."""
    if t < first:
        return floor
    return first + every * math.floor((t - first) / every)
