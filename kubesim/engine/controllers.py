"""The controllers below Kueue: KubeRay's RayJob/RayCluster controllers (a RayCluster, its head and
worker pods, the RayCluster status) and the batch Job controller (the indexed Job's pods).
"""

from __future__ import annotations

from kubesim.engine.pods import Pods
from kubesim.engine.state import RAY_GV, RUN_LABEL, Obj, RunState


class JobControllers(Pods):
    """The RayJob/RayCluster and Job controllers."""

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
