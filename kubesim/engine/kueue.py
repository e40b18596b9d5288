"""Kueue: ClusterQueue and LocalQueue status, waiting for quota, and admission (which resumes the
suspended RayJob or Job). Admission checks, MultiKueue dispatch and the device waits are in
kubesim/waits.py.
"""

from __future__ import annotations

from kubesim.clock import rfc3339
from kubesim.engine.controllers import JobControllers
from kubesim.engine.state import KUEUE_GV, Obj, QueueCount, Ref, RunState

_NONE = QueueCount()  # a queue no run names yet (read, never written)


class Kueue(JobControllers):
    """Kueue's queues and admission."""

    def _sync_queues(self) -> None:
        sc = self.scenario
        for cq in sc.cluster_queues:
            count = self._queues.cluster.get(cq.name, _NONE)
            used = count.gpus
            status = {
                "pendingWorkloads": count.active - count.admitted,
                "reservingWorkloads": count.admitted,
                "admittedWorkloads": count.admitted,
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
            count = self._queues.local.get((lq.namespace, lq.name), _NONE)
            n_admitted = count.admitted
            status = {
                "pendingWorkloads": count.active - n_admitted,
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

    def _set_suspend(self, r: RunState, suspend: bool) -> None:
        """Kueue suspends and resumes a job through its kind's own field."""
        assert r.root is not None
        if r.spec.kind == "PyTorchJob":
            self._patch(r.root, {"spec": {"runPolicy": {"suspend": suspend}}})
        else:
            self._patch(r.root, {"spec": {"suspend": suspend}})

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
        sets = {"RayJob": [("gpu-workers", spec.workers)], "Job": [("main", spec.workers)],
                "JobSet": [("workers", spec.workers)],
                "PyTorchJob": [("master", 1), ("worker", spec.workers - 1)]}[spec.kind]
        for name, count in sets:
            if count:
                assignments.append(
                    {
                        "name": name,
                        "count": count,
                        "flavors": {"cpu": flavor, "memory": flavor, "nvidia.com/gpu": flavor},
                        "resourceUsage": {"cpu": str(32 * count), "nvidia.com/gpu": str(count * spec.gpus_per_worker)},
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
        self._set_suspend(r, False)
        if spec.kind == "RayJob":
            self._start_raycluster(r)
        else:
            self._start_job_pods(r)
        if r.taurun is not None:
            self._set_cond(r.conditions, self._cond("Admitted", True, "Admitted", f"admitted by ClusterQueue {cq}"))
            self._tau_status(r, "Admitted")
        self._sync_queues()
