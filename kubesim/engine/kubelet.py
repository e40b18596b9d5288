"""The kubelet: image pulls and pull back-off, container start, crash loops with restart back-off,
recovery, and the start-up lines each container logs.
"""

from __future__ import annotations

from kubesim.clock import rfc3339
from kubesim.engine.controllers import JobControllers
from kubesim.engine.state import Obj, PodState, RunState
from kubesim.scenario import parse_duration

SIDECAR_PERIOD = {"shipper": 15.0, "exporter": 30.0}


class Kubelet(JobControllers):
    """The kubelet of every node."""

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
        pod.state = {"running": {"startedAt": rfc3339(self._node_time(pod.node))}}
        pod.ready = True
        pod.phase = "Running"
        for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
            self._set_cond(pod.conditions, self._cond(c, True, "", ""))
        if not pod.ip:
            pod.ip = f"10.244.{1 + len(self.nodes)}.{self._rng.randrange(2, 250)}"
        if pod.sidecar and not pod.sidecar_started:
            self._start_sidecar(pod)
        self._pod_status(pod)

    def _start_sidecar(self, pod: PodState) -> None:
        """The sidecar starts with the pod and prints on its own cadence until the pod goes: a log
        shipper's flush lines, or a metrics exporter's pushes numbered by its own `step` counter (which
        keeps counting whatever training does)."""
        pod.sidecar_started = rfc3339(self._node_time(pod.node))
        pod.sidecar_gen += 1
        gen = pod.sidecar_gen
        kind = self._sidecar_kind(pod)
        period = SIDECAR_PERIOD[kind]

        def tick() -> None:
            if gen != pod.sidecar_gen or pod.deleted:
                return
            node = self.nodes.get(pod.node)
            if node is not None and not node.alive:
                return
            pod.sidecar_count += 1
            t = self._node_time(pod.node)
            if kind == "shipper":
                line = (f"[{t:%Y/%m/%d %H:%M:%S}] [ info] [output:forward:forward.0] flushed "
                        f"{self._rng.randrange(20, 400)} records to 10.0.3.7:24224")
            else:
                line = (f'time="{rfc3339(t)}" level=info msg="pushed training metrics" step={pod.sidecar_count} '
                        f"series={self._rng.randrange(40, 60)} duration_ms={self._rng.randrange(3, 40)}")
            self._logs(pod, [line], pod.sidecar)
            self._after(period, tick)

        self._after(self._rng.uniform(1.0, period), tick)

    def _start_container(self, r: RunState, pod: PodState, fp: str, pulled: str) -> None:
        """kubelet's Pulled/Created/Started for one container, then it runs and logs its start-up."""
        self.event(pod.ref, "Normal", "Pulled", pulled, "kubelet", pod.node, fp)
        self.event(pod.ref, "Normal", "Created", f"Created container: {pod.container}", "kubelet", pod.node, fp)
        self.event(pod.ref, "Normal", "Started", f"Started container {pod.container}", "kubelet", pod.node, fp)
        self._container_running(pod)
        self._logs(pod, self._startup_lines(r, pod))

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
            if r.spec.kind == "PyTorchJob":
                self._set_cond(r.root_conditions, {**self._cond("Running", True, "PyTorchJobRunning",
                                                                f"PyTorchJob {r.spec.name} is running."),
                                                   "lastUpdateTime": self._now()})
            self._sync_job_status(r)
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
