"""How a run ends or is interrupted: preemption, success and failure, and the scenario's free-form
events and patches on a run's objects.
"""

from __future__ import annotations

from kubesim.engine.kubelet import Kubelet
from kubesim.engine.kueue import Kueue
from kubesim.engine.state import RAY_GV, Obj, Ref, RunState
from kubesim.errors import ApiError


class Lifecycle(Kubelet, Kueue):
    """Preemption, completion and free-form changes to a run's objects."""

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
        self._set_suspend(r, True)
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
