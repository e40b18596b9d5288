"""Several simulated clusters in one process: a MultiKueue manager and its workers.

Each cluster is its own `Simulator` (own port, store, resourceVersions and `/version`), all on one
clock. A small scripted timeline (`scenarios/multikueue.yaml`) plays what MultiKueue does across
them: the manager's Job and Workload wait on the MultiKueue admission check while a copy of the
Workload (same name, `kueue.x-k8s.io/multikueue-origin` label, origin-uid annotation) and of the
Job (prebuilt-workload label) wait on every worker; the first worker to reserve wins, the manager
gets `status.clusterName` and the other copies go; the winner runs the pods. A worker can lose the
run, and a cluster's versions can change mid-scenario (skew). Every cluster also carries the
CRDs and controller Deployments the environment check reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from kubesim.client import KubeClient, Obj
from kubesim.clock import Clock, ManualClock
from kubesim.errors import ApiError
from kubesim.kubeconfig import write_kubeconfig
from kubesim.scenario import ScenarioError
from kubesim.server import Simulator, SimulatorSettings

__all__ = [
    "MULTIKUEUE_MANAGED_BY",
    "ORIGIN_LABEL",
    "ORIGIN_UID_ANNOTATION",
    "PREBUILT_LABEL",
    "ClusterSpec",
    "MultiClusterScenario",
    "MultiClusterSimulation",
    "load_multicluster",
    "multikueue_scenario_path",
]

MULTIKUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
ORIGIN_UID_ANNOTATION = "kueue.x-k8s.io/multikueue-origin-uid"
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
WL = "kueue.x-k8s.io/v1beta1"
_ACTIONS = ("submit", "admit", "reserve", "lose")


def multikueue_scenario_path() -> Path:
    return Path(__file__).parent / "scenarios" / "multikueue.yaml"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    kubernetes: str = "v1.31.4"
    kueue: str = "v0.18.2"
    kuberay: str = "v1.6.2"
    taugrid: str = "0.3.1"
    workload_versions: tuple[str, ...] = ("v1beta1",)


@dataclass(frozen=True, slots=True)
class Step:
    at: float
    run: str  # "" for a cluster change
    action: str  # submit | admit | reserve | lose | change
    worker: str = ""
    changes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunSpec:
    name: str
    namespace: str
    queue: str
    pods: int


@dataclass(frozen=True, slots=True)
class MultiClusterScenario:
    name: str
    start: datetime
    origin: str
    admission_check: str
    clusters: tuple[ClusterSpec, ...]
    runs: tuple[RunSpec, ...]
    steps: tuple[Step, ...]


def _req(d: Mapping[str, Any], key: str, where: str, typ: type) -> Any:
    v = d.get(key)
    if not isinstance(v, typ):
        raise ScenarioError(f"{where}.{key}: expected {typ.__name__}, got {v!r}")
    return v


def load_multicluster(path: Path) -> MultiClusterScenario:
    """Load and validate a multi-cluster scenario; errors name the file and the place."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{path}: {e}") from e
    if not isinstance(doc, dict):
        raise ScenarioError(f"{path}: expected a mapping")
    w = str(path)
    clusters = []
    for i, c in enumerate(_req(doc, "clusters", w, list)):
        cw = f"{w}: clusters[{i}]"
        if not isinstance(c, dict):
            raise ScenarioError(f"{cw}: expected a mapping")
        kw: dict[str, Any] = {k: str(c[k]) for k in ("kubernetes", "kueue", "kuberay", "taugrid") if k in c}
        clusters.append(ClusterSpec(_req(c, "name", cw, str), **kw))
    if len(clusters) < 2:
        raise ScenarioError(f"{w}: clusters: a manager and at least one worker")
    names = {c.name for c in clusters}
    runs, steps = [], []
    for i, r in enumerate(doc.get("runs") or []):
        rw = f"{w}: runs[{i}]"
        spec = RunSpec(_req(r, "name", rw, str), str(r.get("namespace", "default")), str(r.get("queue", "user-queue")),
                       int(r.get("pods", 1)))
        runs.append(spec)
        for j, s in enumerate(_req(r, "timeline", rw, list)):
            sw = f"{rw}.timeline[{j}]"
            action = _req(s, "do", sw, str)
            if action not in _ACTIONS:
                raise ScenarioError(f"{sw}.do: one of {', '.join(_ACTIONS)}, got {action!r}")
            worker = str(s.get("worker", ""))
            if action in ("admit", "reserve") and (worker not in names or worker == clusters[0].name):
                raise ScenarioError(f"{sw}.worker: a worker cluster ({', '.join(sorted(names - {clusters[0].name}))})")
            steps.append(Step(float(_req(s, "at", sw, (int, float))), spec.name, action, worker))  # type: ignore[arg-type]
    for i, ev in enumerate(doc.get("events") or []):
        ew = f"{w}: events[{i}]"
        cluster = _req(ev, "cluster", ew, str)
        if cluster not in names:
            raise ScenarioError(f"{ew}.cluster: unknown cluster {cluster!r}")
        changes = {k: str(ev[k]) for k in ("kubernetes", "kueue", "kuberay", "taugrid") if k in ev}
        steps.append(Step(float(_req(ev, "at", ew, (int, float))), "", "change", cluster, changes))  # type: ignore[arg-type]
    start = doc.get("start", "2026-01-10T10:00:00Z")
    when = start if isinstance(start, datetime) else datetime.fromisoformat(str(start).replace("Z", "+00:00"))
    return MultiClusterScenario(
        str(doc.get("name", path.stem)), when if when.tzinfo else when.replace(tzinfo=UTC),
        str(doc.get("origin", "multikueue")), str(doc.get("admission_check", "multikueue")),
        tuple(clusters), tuple(runs), tuple(sorted(steps, key=lambda s: s.at)),
    )


def _uid(*parts: str) -> str:
    h = hashlib.sha256("/".join(parts).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(kind: str, status: bool, reason: str, message: str, at: datetime) -> Obj:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": _ts(at)}


class MultiClusterSimulation:
    """The clusters of a scenario, served on loopback; `step_to(t)` plays the timeline to t seconds."""

    def __init__(self, scenario: MultiClusterScenario, clock: Clock | None = None) -> None:
        self.scenario = scenario
        self.clock: Clock = clock or ManualClock(scenario.start)
        self.sims: dict[str, Simulator] = {}
        self.clients: dict[str, KubeClient] = {}
        self.specs = {c.name: c for c in scenario.clusters}
        self.manager = scenario.clusters[0].name
        self.workers = [c.name for c in scenario.clusters[1:]]
        self._done = 0
        self._t0 = self.clock.now()
        self.placement: dict[str, str] = {}  # run → the worker running it

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> dict[str, str]:
        """Start every cluster on 127.0.0.1; returns name → base URL."""
        try:
            for spec in self.scenario.clusters:
                sim = Simulator(clock=self.clock, settings=SimulatorSettings(git_version=spec.kubernetes))
                url = sim.start("127.0.0.1:0")
                self.sims[spec.name] = sim
                self.clients[spec.name] = KubeClient(url)
                self._install(spec)
        except BaseException:
            self.close()
            raise
        return self.urls

    @property
    def urls(self) -> dict[str, str]:
        return {n: s.base_url for n, s in self.sims.items()}

    def write_kubeconfigs(self, directory: Path) -> dict[str, Path]:
        """One kubeconfig file per cluster, its context named after the cluster."""
        return {n: write_kubeconfig(directory / f"{n}.kubeconfig", url, name=n) for n, url in self.urls.items()}

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        for s in self.sims.values():
            s.close()

    def __enter__(self) -> MultiClusterSimulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the timeline ------------------------------------------------------------------------

    def step_to(self, t: float) -> None:
        """Apply every step due by scenario second `t` (a manual clock is moved there first)."""
        if isinstance(self.clock, ManualClock):
            self.clock.set(self._t0 + timedelta(seconds=t))
        runs = {r.name: r for r in self.scenario.runs}
        steps = self.scenario.steps
        for w in self.workers:
            if w in self.sims:
                self._heartbeat(w)
        while self._done < len(steps) and steps[self._done].at <= t:
            s = steps[self._done]
            self._done += 1
            if s.action == "change":
                self._change(s.worker, s.changes)
            else:
                getattr(self, f"_{s.action}")(runs[s.run], s.worker)

    def _now(self) -> datetime:
        return self.clock.now()

    def _install(self, spec: ClusterSpec) -> None:
        c = self.clients[spec.name]
        c.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        for plural, group, versions in (("workloads", "kueue.x-k8s.io", spec.workload_versions),
                                        ("rayjobs", "ray.io", ("v1",)), ("tauruns", "taugrid.io", ("v1alpha1",))):
            c.create({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                      "metadata": {"name": f"{plural}.{group}"},
                      "spec": {"group": group, "scope": "Namespaced",
                               "names": {"plural": plural, "kind": plural[:-1].capitalize()},
                               "versions": [{"name": v, "served": True, "storage": v == versions[-1]}
                                            for v in versions]}})
        for name, image, chart in self._deployments(spec):
            labels = {"app.kubernetes.io/name": name, **({"helm.sh/chart": chart} if chart else {})}
            c.create({"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": name, "namespace": "kueue-system", "labels": labels},
                      "spec": {"selector": {"matchLabels": {"app": name}},
                               "template": {"metadata": {"labels": {"app": name}},
                                            "spec": {"containers": [{"name": "manager", "image": image}]}}}})
        if spec.name == self.manager:
            c.create({"apiVersion": WL, "kind": "AdmissionCheck", "metadata": {"name": self.scenario.admission_check},
                      "spec": {"controllerName": MULTIKUEUE_MANAGED_BY}})
        else:
            c.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{spec.name}-gpu-0"}})
            self._heartbeat(spec.name)

    def _heartbeat(self, worker: str) -> None:
        """The kubelet's Ready heartbeat on the worker's node, stamped now."""
        now = _ts(self._now())
        self.clients[worker].patch("v1", "Node", "", f"{worker}-gpu-0", {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": now, "lastTransitionTime": _ts(self._t0)}]}}, "status")

    @staticmethod
    def _deployments(spec: ClusterSpec) -> list[tuple[str, str, str]]:
        return [("kueue-controller-manager", f"registry.k8s.io/kueue/kueue:{spec.kueue}", ""),
                ("kuberay-operator", f"quay.io/kuberay/operator:{spec.kuberay}", ""),
                ("taugrid-controller", f"example.azurecr.io/taugrid/controller:{spec.taugrid}",
                 f"taugrid-{spec.taugrid.lstrip('v')}")]

    def _change(self, cluster: str, changes: Mapping[str, Any]) -> None:
        spec = replace(self.specs[cluster], **changes)
        self.specs[cluster] = spec
        sim = self.sims[cluster]
        sim.settings = replace(sim.settings, git_version=spec.kubernetes)
        c = self.clients[cluster]
        for name, image, _ in self._deployments(spec):
            c.patch("apps/v1", "Deployment", "kueue-system", name,
                    {"spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}}})

    @staticmethod
    def workload_name(run: RunSpec) -> str:
        return f"job-{run.name}-{hashlib.sha256(run.name.encode()).hexdigest()[:5]}"

    def _job(self, run: RunSpec, extra_labels: Mapping[str, str]) -> Obj:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": run.name, "namespace": run.namespace,
                             "labels": {"kueue.x-k8s.io/queue-name": run.queue, **extra_labels}},
                "spec": {"managedBy": MULTIKUEUE_MANAGED_BY, "suspend": True, "parallelism": run.pods,
                         "completions": run.pods,
                         "template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "trainer", "image": "trainer:1"}]}}}}

    def _workload(self, run: RunSpec, job: Obj, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Obj:
        return {"apiVersion": WL, "kind": "Workload",
                "metadata": {"name": self.workload_name(run), "namespace": run.namespace,
                             "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"], **labels},
                             "annotations": dict(annotations),
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": run.name,
                                                  "uid": job["metadata"]["uid"], "controller": True}]},
                "spec": {"queueName": run.queue,
                         "podSets": [{"name": "main", "count": run.pods,
                                      "template": job["spec"]["template"]}]}}

    def _ensure_namespace(self, cluster: str, ns: str) -> None:
        c = self.clients[cluster]
        try:
            c.get("v1", "Namespace", "", ns)
        except ApiError:
            c.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def _submit(self, run: RunSpec, _: str) -> None:
        now = self._now()
        m = self.clients[self.manager]
        self._ensure_namespace(self.manager, run.namespace)
        job = m.create(self._job(run, {}))
        wl = m.create(self._workload(run, job, {}, {}))
        m.patch(WL, "Workload", run.namespace, wl["metadata"]["name"], {"status": {
            "conditions": [_cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue cq", now)],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": run.pods}]},
            "admissionChecks": [{"name": self.scenario.admission_check, "state": "Pending", "message": "",
                                 "lastTransitionTime": _ts(now)}],
            "nominatedClusterNames": list(self.workers)}}, "status")
        for w in self.workers:
            self._copy(run, w, wl["metadata"]["uid"])

    def _copy(self, run: RunSpec, worker: str, origin_uid: str) -> None:
        c = self.clients[worker]
        self._ensure_namespace(worker, run.namespace)
        labels = {ORIGIN_LABEL: self.scenario.origin}
        job = c.create(self._job(run, {**labels, PREBUILT_LABEL: self.workload_name(run)}))
        c.create(self._workload(run, job, labels, {ORIGIN_UID_ANNOTATION: origin_uid}))

    def _manager_check(self, run: RunSpec, state: str, message: str, cluster: str | None, admitted: bool) -> None:
        now = self._now()
        m = self.clients[self.manager]
        wl = m.get(WL, "Workload", run.namespace, self.workload_name(run))
        conds = [x for x in wl.get("status", {}).get("conditions", []) if x.get("type") != "Admitted"]
        conds.append(_cond("Admitted", admitted, "Admitted" if admitted else "NoReservation",
                           "The workload is admitted" if admitted else message, now))
        m.patch(WL, "Workload", run.namespace, wl["metadata"]["name"], {"status": {
            "clusterName": cluster, "conditions": conds,
            "admissionChecks": [{"name": self.scenario.admission_check, "state": state, "message": message,
                                 "lastTransitionTime": _ts(now)}]}}, "status")

    def _reserve(self, run: RunSpec, worker: str, admit: bool = False) -> None:
        """`worker` reserves quota for its copy: the dispatch goes there, other copies go."""
        now = self._now()
        c = self.clients[worker]
        name = self.workload_name(run)
        conds = [_cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue cq", now),
                 _cond("Admitted", admit, "Admitted" if admit else "AdmissionCheckPending",
                       "The workload is admitted" if admit else "waiting for admission checks on the worker", now)]
        c.patch(WL, "Workload", run.namespace, name, {"status": {
            "conditions": conds,
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": run.pods}]}}},
            "status")
        for other in self.workers:
            if other != worker:
                self._drop_copy(run, other)
        self._manager_check(run, "Ready", f'The workload got reservation on "{worker}"', worker, admit)
        self.placement[run.name] = worker
        if admit:
            c.patch("batch/v1", "Job", run.namespace, run.name, {"spec": {"suspend": False}})
            job = c.get("batch/v1", "Job", run.namespace, run.name)
            for i in range(run.pods):
                pod = c.create({"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": f"{run.name}-{i}", "namespace": run.namespace,
                                             "labels": {"job-name": run.name, "batch.kubernetes.io/job-name": run.name},
                                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                                  "name": run.name, "uid": job["metadata"]["uid"],
                                                                  "controller": True}]},
                                "spec": {"nodeName": f"{worker}-gpu-0", "restartPolicy": "Never",
                                         "containers": [{"name": "trainer", "image": "trainer:1"}]}})
                c.patch("v1", "Pod", run.namespace, pod["metadata"]["name"], {"status": {
                    "phase": "Running", "startTime": _ts(now),
                    "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _ts(now)},
                                   {"type": "Ready", "status": "True", "lastTransitionTime": _ts(now)}],
                    "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                           "image": "trainer:1", "imageID": "",
                                           "state": {"running": {"startedAt": _ts(now)}}}]}}, "status")
            c.patch("batch/v1", "Job", run.namespace, run.name, {"status": {"active": run.pods,
                                                                           "startTime": _ts(now)}}, "status")

    def _admit(self, run: RunSpec, worker: str) -> None:
        self._reserve(run, worker, admit=True)

    def _drop_copy(self, run: RunSpec, worker: str) -> None:
        c = self.clients[worker]
        for i in range(run.pods):
            with suppress(ApiError):  # not created on this worker
                c.delete("v1", "Pod", run.namespace, f"{run.name}-{i}")
        for api, kind, name in ((WL, "Workload", self.workload_name(run)), ("batch/v1", "Job", run.name)):
            with suppress(ApiError):
                c.delete(api, kind, run.namespace, name)

    def _lose(self, run: RunSpec, _: str) -> None:
        """The worker running `run` loses it (evicted there, its pods gone): back to waiting."""
        worker = self.placement.pop(run.name, None)
        if worker is None:
            return
        self._drop_copy(run, worker)
        self._manager_check(run, "Retry", f'The workload was lost by "{worker}"', None, False)
