"""Pods as the API sees them: creating a run's pods, writing their status, picking them by role,
and taking them down.
"""

from __future__ import annotations

from kubesim.engine.core import EngineCore
from kubesim.engine.state import RUN_LABEL, Obj, PodState, Ref, RunState

# Sidecars a training pod may carry: (container name, image). They need no GPU and print on their own.
SIDECAR_IMAGES = {
    "shipper": ("log-shipper", "cr.fluentbit.io/fluent/fluent-bit:3.2.2"),
    "exporter": ("metrics-exporter", "ghcr.io/example/train-metrics-exporter:1.4.0"),
}


class Pods(EngineCore):
    """Pods as the API sees them."""

    def _make_pod(
        self,
        r: RunState,
        role: str,
        index: int,
        name: str,
        container: str,
        gpus: int,
        owner: Ref | None = None,
        extra_labels: Obj | None = None,
    ) -> PodState:
        spec = r.spec
        assert r.root is not None
        labels: Obj = {RUN_LABEL: spec.name} if spec.tau_run else {}
        if extra_labels is not None:  # a JobSet's or PyTorchJob's pod: its controller's labels
            assert owner is not None
            labels.update(extra_labels)
        elif role in ("head", "worker"):
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
        owner_ref = owner if owner is not None else r.raycluster if role in ("head", "worker") else r.root
        assert owner_ref is not None
        res_gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        cpu, mem = ("4", "16Gi") if role == "head" else ("32", "256Gi")
        containers: list[Obj] = [
            {
                "name": container,
                "image": spec.image,
                "imagePullPolicy": "IfNotPresent",
                "resources": {
                    "requests": {"cpu": cpu, "memory": mem, **res_gpu},
                    "limits": {"cpu": cpu, "memory": mem, **res_gpu},
                },
            }
        ]
        sidecar = ""
        if spec.sidecar and gpus:
            sidecar, image = SIDECAR_IMAGES[spec.sidecar]
            containers.append(
                {
                    "name": sidecar,
                    "image": image,
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                }
            )
        policy = spec.restart_policy or ("Always" if role in ("head", "worker") else "Never")
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": spec.namespace,
                "labels": labels,
                "ownerReferences": [owner_ref.owner()],
            },
            "spec": {
                "containers": containers,
                "restartPolicy": policy,
                "terminationGracePeriodSeconds": spec.grace,
                "schedulerName": "default-scheduler",
                "serviceAccountName": f"{spec.namespace}-runner",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                if gpus
                else [],
            },
        }
        ref = self._create(body)
        pod = PodState(ref, role, index, container, spec.image, gpus, sidecar=sidecar, generation=r.generation)
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
            if pod.sidecar:
                up = bool(pod.sidecar_started) and pod.phase == "Running"
                ended = pod.phase in ("Failed", "Succeeded")
                status["containerStatuses"].append(
                    {
                        "name": pod.sidecar,
                        "image": SIDECAR_IMAGES[self._sidecar_kind(pod)][1],
                        "imageID": "",
                        "ready": up,
                        "started": up,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": pod.sidecar_started}}
                        if up
                        else {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": pod.sidecar_started}}
                        if ended and pod.sidecar_started
                        else {"waiting": {"reason": "ContainerCreating"}},
                        "lastState": {},
                    }
                )
        if pod.ip:
            status.update({"podIP": pod.ip, "podIPs": [{"ip": pod.ip}]})
        self._status(pod.ref, status)

    @staticmethod
    def _sidecar_kind(pod: PodState) -> str:
        return next(k for k, (name, _) in SIDECAR_IMAGES.items() if name == pod.sidecar)

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
