"""The controllers below Kueue: KubeRay's RayJob/RayCluster controllers (a RayCluster, its head and
worker pods, the RayCluster status) and the batch Job controller (the indexed Job's pods).
"""

from __future__ import annotations

from kubesim.engine.pods import Pods
from kubesim.engine.state import RAY_GV, RUN_LABEL, Obj, PodState, RunState


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
        if spec.kind == "JobSet":
            self._create_child_job(r)
        elif spec.kind == "Job":
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
        elif spec.kind == "PyTorchJob":
            # training-operator sets startTime as the job starts (again when it resumes from suspension)
            self._status(root, {"startTime": self._now()})
        r.pods = []
        if spec.kind == "PyTorchJob" and any(not p.gone for p in r.old_pods):
            # The names are fixed: the operator retries until the earlier run's pods are gone.
            gen = r.generation
            self._after(1.0, lambda: self._start_job_pods(r) if gen == r.generation and not r.pods else None)
            return
        for i in range(spec.workers):
            self._new_job_pod(r, i)
        self._sync_job_status(r)

    def _new_job_pod(self, r: RunState, i: int) -> PodState:
        """Rank i's pod as the run's controller creates it: an Indexed Job's (a new random suffix each
        time), a JobSet child Job's (restart-attempt label), or training-operator's (a fixed name:
        `NAME-master-0`, `NAME-worker-K`, recreated under the same name)."""
        spec = r.spec
        assert r.root is not None
        if spec.kind == "JobSet":
            child = r.child_job
            assert child is not None
            labels = {
                **_jobset_labels(r),
                "batch.kubernetes.io/job-name": child.name,
                "job-name": child.name,
                "batch.kubernetes.io/controller-uid": child.uid,
                "controller-uid": child.uid,
                "batch.kubernetes.io/job-completion-index": str(i),
            }
            pod = self._make_pod(r, "job", i, f"{child.name}-{i}-{self._suffix()}", "trainer", spec.gpus_per_worker,
                                 owner=child, extra_labels=labels)
            self.event(child, "Normal", "SuccessfulCreate", f"Created pod: {pod.ref.name}", "job-controller")
            return pod
        if spec.kind == "PyTorchJob":
            rtype, k = ("master", 0) if i == 0 else ("worker", i - 1)
            labels = {
                "training.kubeflow.org/job-name": spec.name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": str(k),
            }
            if rtype == "master":
                labels["training.kubeflow.org/job-role"] = "master"
            pod = self._make_pod(r, "job", i, f"{spec.name}-{rtype}-{k}", "pytorch", spec.gpus_per_worker,
                                 owner=r.root, extra_labels=labels)
            self.event(r.root, "Normal", "SuccessfulCreatePod", f"Created pod: {pod.ref.name}", "pytorchjob-controller")
            return pod
        pod = self._make_pod(r, "job", i, f"{spec.name}-{i}-{self._suffix()}", "main", spec.gpus_per_worker)
        self.event(r.root, "Normal", "SuccessfulCreate", f"Created pod: {pod.ref.name}", "job-controller")
        return pod

    def _create_child_job(self, r: RunState) -> None:
        """A JobSet's child Job (one replicated job, `workers`, one replica): named NAME-workers-0 again
        on every restart, with the restart attempt in its labels."""
        spec, root = r.spec, r.root
        assert root is not None
        labels = _jobset_labels(r)
        r.child_job = self._create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{spec.name}-workers-0", "namespace": spec.namespace, "labels": labels,
                             "ownerReferences": [root.owner()]},
                "spec": {
                    "parallelism": spec.workers,
                    "completions": spec.workers,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": {"metadata": {"labels": labels},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "trainer", "image": spec.image}]}},
                },
            },
            status={"startTime": self._now(), "active": spec.workers, "ready": 0},
        )
        self.event(root, "Normal", "SuccessfulCreate", f"Created job: {r.child_job.name}", "jobset-controller")

    def _sync_job_status(self, r: RunState) -> None:
        """The root's status (and a JobSet child Job's) as its controller keeps it from the pods."""
        spec, root = r.spec, r.root
        if root is None or spec.kind == "RayJob" or r.dispatched:
            return
        pods = [p for p in r.pods if not p.deleted]
        active = sum(1 for p in pods if p.phase in ("Pending", "Running"))
        ready = sum(1 for p in pods if p.ready)
        if spec.kind == "Job":
            self._status(root, {"active": active, "ready": ready, "failed": r.job_failed})
        elif spec.kind == "JobSet":
            if r.child_job is not None:
                self._status(r.child_job, {"active": active, "ready": ready})
            up = int(ready == spec.workers)
            self._status(root, {"restarts": r.restart_attempt,
                                "replicatedJobsStatus": [{"name": "workers", "ready": up, "active": int(active > 0),
                                                          "succeeded": 0, "failed": 0, "suspended": 0}]})
        elif spec.kind == "PyTorchJob":
            masters = [p for p in pods if p.index == 0]
            workers = [p for p in pods if p.index > 0]
            selector = (f"training.kubeflow.org/job-name={spec.name},training.kubeflow.org/operator-name="
                        "pytorchjob-controller,training.kubeflow.org/replica-type=")
            statuses: Obj = {"Master": {"active": sum(1 for p in masters if p.phase == "Running"),
                                        "selector": selector + "master"}}
            if spec.workers > 1:
                statuses["Worker"] = {"active": sum(1 for p in workers if p.phase == "Running"),
                                      "selector": selector + "worker"}
            self._status(root, {"replicaStatuses": statuses, "conditions": list(r.root_conditions.values())})


def _jobset_labels(r: RunState) -> Obj:
    name = r.spec.name
    return {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-key": f"{r.spec.namespace}-{name}-workers-0",
        "jobset.sigs.k8s.io/restart-attempt": str(r.restart_attempt),
    }
