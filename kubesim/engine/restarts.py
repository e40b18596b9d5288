"""Restarts as real clusters play them, and a whole run resubmitted.

- in place: the kubelet restarts each container of the pod (restartCount, lastState.terminated, the
  old log kept as `previous`), after its back-off;
- replace: the run's controller replaces its pods, each its own way: a batch Job with
  `restartPolicy: Never` leaves the failed pod Failed and creates a new one (a new random suffix, the
  same completion index, `status.failed` counts it); a JobSet deletes its child Job and, once the old
  pods are gone, creates it again with `jobset.sigs.k8s.io/restart-attempt` one higher; the
  training-operator deletes a PyTorchJob's failed pods and creates them again under the same names
  (new uids); KubeRay deletes a Ray worker and creates a new one (a new suffix) while the old one
  terminates;
- in process: torchrun's elastic agent restarts its worker processes inside the container: no
  container restart, the step goes back inside the same log;
- resubmit: the run's root (its TauRun when it has one) is deleted and created again under the same
  name: a new run with new uids, whose old pods terminate for their grace period.

After a restart training loads a checkpoint some steps back (the rewind) and replays up to its old
high-water mark before it makes progress again. Deleted pods go gracefully: `deletionTimestamp` is
in the future until their containers exit (`exitAfter`, at most the grace period).
"""

from __future__ import annotations

from collections.abc import Callable

from kubesim.clock import rfc3339
from kubesim.engine.lifecycle import Lifecycle
from kubesim.engine.nodes import Nodes
from kubesim.engine.state import RAY_GV, TAU_GV, Obj, PodState, Restart, RunState
from kubesim.errors import ApiError
from kubesim.scenario import parse_duration

MODES = ("inplace", "replace", "inprocess")


class Restarts(Nodes, Lifecycle):
    """Restarts of every kind, graceful pod deletion, and resubmitted runs."""

    # ------------------------------------------------------------------ graceful deletion
    def _terminate(self, r: RunState, pod: PodState, then: Callable[[], None] | None = None) -> None:
        """Delete a pod gracefully: Terminating (deletionTimestamp = now + grace) until its containers
        exit, then gone (its kubelet confirms with grace 0). `then` runs once it is gone."""
        if pod.deleted:
            return
        grace = r.spec.grace
        bound = bool(pod.node) and "terminated" not in pod.state and pod.phase not in ("Failed", "Succeeded")
        pod.deleted = True
        pod.sidecar_gen += 1
        r.old_pods.append(pod)
        if not bound:  # nothing runs there: the pod goes at once
            self._gone(pod, then)
            return
        self.client.delete("v1", "Pod", pod.ref.namespace, pod.ref.name, grace=grace)
        self.event(pod.ref, "Normal", "Killing", f"Stopping container {pod.container}", "kubelet", pod.node,
                   f"spec.containers{{{pod.container}}}")
        self._after(min(r.spec.exit_after, float(grace)), lambda: self._gone(pod, then))

    def _gone(self, pod: PodState, then: Callable[[], None] | None) -> None:
        try:
            self.client.delete("v1", "Pod", pod.ref.namespace, pod.ref.name, grace=0)
        except ApiError as exc:
            if exc.code != 404:
                raise
        if pod.node in self.nodes and pod.gpus:
            self.nodes[pod.node].gpus_used -= pod.gpus
            pod.gpus = 0
        pod.gone = True
        if then is not None:
            then()

    # ------------------------------------------------------------------ restarts
    def _do_restart(self, r: RunState, args: Obj) -> None:
        mode = str(args.get("mode", "inplace"))
        if mode not in MODES:
            raise ApiError(422, f"scenario: restart mode {mode!r} is not one of {list(MODES)}")
        rewind = int(args.get("rewind", 0))
        resume = parse_duration(args.get("resumeAfter", 0), "restart.resumeAfter")
        start_after = parse_duration(args.get("startAfter", 0 if mode == "inplace" else 20), "restart.startAfter")
        mark = r.hwm
        printers = {p.ref.uid for p in self._pods(r, r.print_which or "head")}
        holders = tuple(
            (p.ref.name, p.ref.uid, p.container, "previous" if mode == "inplace" else "current")
            for p in r.pods
            if not p.deleted and p.ref.uid in printers and p.log_max >= mark > 0
        )
        r.restarts.append(Restart(self.elapsed, mode if mode != "replace" else f"replace-{r.spec.kind}", mark, holders))
        r.iteration = max(0, mark - rewind)
        r.resume_note = r.iteration
        r.blocked_until = self.elapsed + resume + (start_after if mode != "inprocess" else 0.0)
        pods = self._pods(r, str(args.get("pods", "all")))
        if mode == "inprocess":
            self._restart_inprocess(r, pods, int(args.get("exitCode", 1)))
        elif mode == "inplace":
            self._restart_inplace(r, pods, str(args.get("reason", "Error")), int(args.get("exitCode", 1)),
                                  start_after, resume)
        else:
            self._restart_replace(r, str(args.get("reason", "Error")), int(args.get("exitCode", 1)),
                                  start_after, resume)

    def _restart_inprocess(self, r: RunState, pods: list[PodState], code: int) -> None:
        """torchrun's agent sees a worker process fail and restarts the worker group in the container."""
        for pod in pods:
            if pod.deleted or "running" not in pod.state:
                continue
            t = self._node_time(pod.node)
            stamp = f"{t:%m%d %H:%M:%S}.{t.microsecond:06d} {self._rng.randrange(100000, 999999)}"
            self._logs(pod, [
                f"E{stamp} torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: {code}) "
                f"local_rank: 0 (pid: {self._rng.randrange(200, 9000)}) of binary: /usr/bin/python",
                f"W{stamp} torch/distributed/elastic/agent/server/api.py:704] [default] Worker group FAILED. "
                f"3/3 attempts left; will restart worker group",
                f"I{stamp} torch/distributed/elastic/agent/server/api.py:525] [default] Rendezvous'ing worker group",
            ])

    def _restart_inplace(self, r: RunState, pods: list[PodState], reason: str, code: int, back_off: float,
                         resume: float) -> None:
        """Each container exits; the kubelet keeps its log as `previous` and starts it again after back-off."""
        for pod in pods:
            if not pod.node or "running" not in pod.state:
                continue
            pod.last_state = {"terminated": {"exitCode": code, "reason": reason,
                                             "startedAt": pod.state["running"].get("startedAt", self._now()),
                                             "finishedAt": self._kubelet_now(pod), "containerID": pod.container_id}}
            self.client.rotate_log(pod.ref.namespace, pod.ref.name, pod.container)
            pod.log_max = 0
            pod.restarts += 1
            fp = f"spec.containers{{{pod.container}}}"
            if back_off <= 0:
                self._start_container(r, pod, fp, f'Container image "{pod.image}" already present on machine')
                continue
            pod.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off {int(back_off)}s restarting failed container={pod.container} "
                f"pod={pod.ref.name}_{pod.ref.namespace}({pod.ref.uid})")}}
            pod.ready = False
            for c in ("Ready", "ContainersReady"):
                self._set_cond(pod.conditions, self._cond(c, False, "ContainersNotReady",
                                                          f"containers with unready status: [{pod.container}]"))
            self._pod_status(pod)
            self.event(pod.ref, "Warning", "BackOff", f"Back-off restarting failed container {pod.container} in pod "
                       f"{pod.ref.name}_{pod.ref.namespace}({pod.ref.uid})", "kubelet", pod.node, fp)

            def again(pod: PodState = pod, fp: str = fp) -> None:
                if pod.deleted or not self._node_ready(pod):
                    return
                self._start_container(r, pod, fp, f'Container image "{pod.image}" already present on machine')
                self._sync_raycluster(r)
                self._sync_job_status(r)
                r.blocked_until = max(r.blocked_until, self.elapsed + resume)

            self._after(back_off, again)
        self._sync_raycluster(r)
        self._sync_job_status(r)

    def _fail_pod(self, pod: PodState, reason: str, code: int) -> None:
        """The container exits and, with restartPolicy Never, the pod is Failed for good."""
        started = (pod.state.get("running") or {}).get("startedAt", self._now())
        pod.state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                                    "finishedAt": self._kubelet_now(pod), "containerID": pod.container_id}}
        pod.phase, pod.ready = "Failed", False
        for c in ("Ready", "ContainersReady"):
            self._set_cond(pod.conditions, self._cond(c, False, "PodFailed", ""))
        self._pod_status(pod)

    def _restart_replace(self, r: RunState, reason: str, code: int, start_after: float, resume: float) -> None:
        kind = r.spec.kind
        workers = [p for p in r.pods if not p.deleted and p.role in ("worker", "job")]
        nodes = {p.index: p.node for p in workers}

        def up(pods: list[PodState]) -> None:
            self._bring_up(r, pods, nodes, start_after, resume)

        if kind == "Job":
            for pod in workers:
                self._fail_pod(pod, reason, code)
                r.job_failed += 1
                pod.deleted = True  # Failed, kept by the Job controller; no longer one of the run's pods
                pod.sidecar_gen += 1
                r.old_pods.append(pod)
                if pod.node in self.nodes:
                    self.nodes[pod.node].gpus_used -= pod.gpus
                pod.gpus = 0
            r.pods = [p for p in r.pods if not p.deleted]
            up([self._new_job_pod(r, p.index) for p in workers])
        elif kind == "PyTorchJob":
            if r.root is not None:  # training-operator's Warning beside its Restarting condition (JobRestartingReason)
                self.event(r.root, "Warning", "PyTorchJobRestarting",
                           f"PyTorchJob {r.spec.name} is restarting because {len(workers)} Worker replica(s) failed.",
                           "pytorchjob-controller")
            r.root_conditions.pop("Running", None)
            self._set_cond(r.root_conditions, {**self._cond(
                "Restarting", True, "PyTorchJobRestarting",
                f"PyTorchJob {r.spec.name} is restarting because {len(workers)} replica(s) failed."),
                "lastUpdateTime": self._now()})
            for pod in workers:
                self._fail_pod(pod, reason, 137 if code == 1 else code)
            for pod in workers:
                self._terminate(r, pod)  # its containers are gone: deleted at once
            r.pods = [p for p in r.pods if not p.deleted]
            up([self._new_job_pod(r, p.index) for p in workers])
        elif kind == "JobSet":
            left = [len(workers)]

            def recreate() -> None:
                left[0] -= 1
                if left[0] > 0:
                    return
                if r.child_job is not None:
                    try:
                        self.client.delete("batch/v1", "Job", r.child_job.namespace, r.child_job.name)
                    except ApiError as exc:
                        if exc.code != 404:
                            raise
                r.restart_attempt += 1
                self._create_child_job(r)
                up([self._new_job_pod(r, i) for i in range(r.spec.workers)])

            r.pods = [p for p in r.pods if p not in workers]
            for pod in workers:
                self._terminate(r, pod, recreate)
            self._sync_job_status(r)
        else:  # RayJob: KubeRay replaces each worker; the new one waits for its node to be free
            fresh: list[PodState] = []
            for pod in workers:
                assert r.raycluster is not None
                new = self._make_pod(r, "worker", pod.index, f"{r.raycluster.name}-gpu-workers-worker-{self._suffix()}",
                                     "ray-worker", r.spec.gpus_per_worker)
                self.event(r.raycluster, "Normal", "CreatedWorkerPod",
                           f"Created worker Pod {r.spec.namespace}/{new.ref.name}", "raycluster-controller")
                fresh.append(new)
            gone = [len(workers)]

            def all_gone() -> None:
                gone[0] -= 1
                if gone[0] == 0:
                    up(fresh)

            for pod in workers:
                self._terminate(r, pod, all_gone)
            r.pods = [p for p in r.pods if not p.deleted]
            self._sync_raycluster(r)

    def _bring_up(self, r: RunState, pods: list[PodState], nodes: dict[int, str], start_after: float,
                  resume: float) -> None:
        """New pods bound to their predecessors' nodes at once, running `start_after` later."""
        gen = r.generation

        def bind() -> None:
            if r.generation != gen:
                return
            for pod in pods:
                if not pod.deleted and not pod.node and nodes.get(pod.index):
                    self._bind_pod(r, pod, nodes[pod.index])
            self._sync_job_status(r)

        def start() -> None:
            if r.generation != gen:
                return
            for pod in pods:
                if pod.deleted or not pod.node or not self._node_ready(pod):
                    continue
                self._start_container(r, pod, f"spec.containers{{{pod.container}}}",
                                      f'Container image "{pod.image}" already present on machine')
            if r.spec.kind == "PyTorchJob":
                r.root_conditions.pop("Restarting", None)
                self._set_cond(r.root_conditions, {**self._cond("Running", True, "PyTorchJobRunning",
                                                                f"PyTorchJob {r.spec.name} is running."),
                                                   "lastUpdateTime": self._now()})
            self._sync_raycluster(r)
            self._sync_job_status(r)
            r.blocked_until = max(r.blocked_until, self.elapsed + resume)

        self._after(1.0, bind)
        self._after(max(start_after, 2.0), start)

    def _kubelet_now(self, pod: PodState) -> str:
        return rfc3339(self._node_time(pod.node))

    # ------------------------------------------------------------------ resubmit
    def _do_resubmit(self, r: RunState, args: Obj) -> None:
        """`kubectl delete` of the run and `kubectl create` of the same manifest: a new run (new uids)
        under the same name, while the old one's pods terminate."""
        for pod in list(r.pods):
            self._terminate(r, pod)
        top = r.taurun or r.root
        if top is not None:
            try:
                self.client.delete(TAU_GV if r.taurun else top.api_version, top.kind, top.namespace, top.name)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        if r.raycluster is not None:  # cascaded with its RayJob; its terminating pods stay until they exit
            try:
                self.client.delete(RAY_GV, "RayCluster", r.raycluster.namespace, r.raycluster.name)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        old = r.old_pods
        r.train_gen += 1
        r.crash_gen += 1
        r.generation += 1
        r.resubmitted_at = self.elapsed
        r.admitted = False
        r.finished = False
        r.submitted = False
        for name in ("taurun", "root", "workload", "raycluster", "child_job"):
            setattr(r, name, None)
        r.pods, r.old_pods = [], old
        r.conditions, r.wl_conditions, r.root_conditions = {}, {}, {}
        r.phase, r.job_id, r.started, r.wait_stage, r.dispatched = "Pending", "", "", "", ""
        r.iteration = r.hwm = 0
        r.last_advance = None
        r.restarts = []
        r.blocked_until = 0.0
        r.job_failed = r.restart_attempt = 0
        r.crash_looping = False
        r.skipped = 0
        r.resume_note = 0
        self._submit(r)
