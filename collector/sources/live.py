"""Live source for `explain RUN`: one read of a run's namespace with the caller's own credentials.

What a researcher's kubeconfig may read is RBAC's call: each kind is listed once (in the run's
namespace where it is namespaced; node Leases in kube-node-lease), then the run's pods' logs
(current, and `previous=true` for a container that restarted). Every object goes through the same
normalization as a dump's (`dump.add_object`), every log through the same scan (`dump.scan_log`),
into a `Dump`, so `explain` evaluates both alike. A kind whose list is refused is not synced (the
claims that need it are unknown); the refusal names the verb, the resource and what it would have
shown. Times are the API server's (`KubeApi.clock`, from its `Date` headers).

Bounded: at most `max_pods` pods' logs are read, each container's current and previous log at most
`max_log_bytes`, and at most `max_objects` objects of one kind (a longer list is not used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from collector.correlate import Signal, build_index
from collector.model import PodFacts, Ref
from collector.settings import TauGridContract
from collector.sources.dump import Dump, Problem, add_object, regex_by_pod, scan_log
from collector.sources.kube_api import KubeApi, PermanentSourceError, Resource, SourceError, pod_log_path

LOG_RESOURCE = "pods/log"
MAX_PODS = 64  # pods whose logs are read (the run's, by name)
MAX_LOG_BYTES = 1 << 20  # per container and log (current, previous)
MAX_OBJECTS = 50_000  # objects of one kind; a longer list is not used


@dataclass(frozen=True, slots=True)
class LiveLimits:
    max_pods: int = MAX_PODS
    max_log_bytes: int = MAX_LOG_BYTES
    max_objects: int = MAX_OBJECTS


@dataclass(frozen=True, slots=True)
class Refusal:
    """A read the API server refused (403): who asked is not allowed `verb` on `resource`."""

    verb: str
    resource: str  # "pods", "workloads.kueue.x-k8s.io", "pods/log"
    namespace: str  # "" at the cluster scope
    message: str  # the Status message the server sent
    would_show: str  # what that evidence would have shown
    claims: tuple[str, ...]  # the claims it would have supported (unknown without it)

    def to_json(self) -> dict[str, Any]:
        return {"verb": self.verb, "resource": self.resource, "namespace": self.namespace or None,
                "message": self.message, "would_show": self.would_show, "claims": list(self.claims)}

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else " at the cluster scope"
        claims = f"; {', '.join(self.claims)} cannot be true without it" if self.claims else ""
        return f"refused: {self.verb} {self.resource}{where}: it would have shown {self.would_show}{claims}"


# What each kind's evidence shows, and the claims that cannot be true without it (DESIGN.md §2).
# The others only explain: a run can be seen scheduled from its bound pods without its Workload.
WOULD_SHOW: dict[str, tuple[str, tuple[str, ...]]] = {
    "Pod": ("the run's pods: where each is bound, its containers' states and restarts",
            ("scheduled", "running", "progressing")),
    "Node": ("the readiness and conditions of the nodes under the run's pods", ("running",)),
    "Event": ("scheduling failures, preemptions, evictions and OOM kills", ()),
    "Job": ("the run's Jobs: suspension and completion", ()),
    "Workload": ("Kueue's admission of the run and why it waits in the queue", ()),
    "LocalQueue": ("the run's LocalQueue and the ClusterQueue behind it", ()),
    "ClusterQueue": ("the queue's quota, and whether it is active", ()),
    "AdmissionCheck": ("the admission checks the run's Workload waits on", ()),
    "RayJob": ("the RayJob's own status", ()),
    "RayCluster": ("the Ray cluster's head and workers", ()),
    "PyTorchJob": ("the PyTorchJob's own status", ()),
    "JobSet": ("the JobSet's replicated jobs and restarts", ()),
    "ResourceClaim": ("the DRA device claims the run's pods wait on", ()),
    "NodeClaim": ("Karpenter's node launches for the run", ()),
    "Lease": ("how far each node's clock runs ahead (kubelet node Lease renewals)", ()),
    LOG_RESOURCE: ("training progress (steps, loss), NCCL hangs and GPU XID errors in the containers' logs",
                   ("progressing",)),
}
_RUN_KIND = ("the run's own status: what TauGrid asserts (runs are inferred from pods without it)", ())


def would_show(kind: str, contract: TauGridContract) -> tuple[str, tuple[str, ...]]:
    if kind == contract.run_kind:
        return _RUN_KIND
    if kind in (contract.cluster_kind, contract.workspace_kind):
        return (f"the {kind} the run resolves its target through", ())
    return WOULD_SHOW.get(kind, (f"{kind} objects", ()))


@dataclass(slots=True)
class LiveRead:
    dump: Dump
    synced: dict[str, datetime] = field(default_factory=dict)  # kind → the server's time its list began
    signals: list[Signal] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # APIs not served, caps reached
    pods_read: int = 0
    log_bytes: int = 0


def _refusal(e: SourceError, verb: str, resource: str, namespace: str, what: tuple[str, tuple[str, ...]]) -> Refusal:
    message = str((e.status or {}).get("message") or e)
    return Refusal(verb, resource, namespace, message[:300], what[0], what[1])


def _scoped(r: Resource, namespace: str) -> Resource:
    if not r.namespaced or r.namespace:
        return r  # cluster-scoped, or fixed to its own namespace (node Leases)
    return Resource(r.kind, r.group, r.version, r.plural, r.namespaced, r.optional, namespace)


def read_live(api: KubeApi, namespace: str, resources: Sequence[Resource], contract: TauGridContract,
              runs: Sequence[str], *, limits: LiveLimits = LiveLimits(),
              log_regex_by_profile: dict[str, str] | None = None) -> LiveRead:
    """List each served kind once (namespaced ones in `namespace`), then read the logs of the pods of
    `runs` (NAME or NAMESPACE/NAME; every run in the namespace when none)."""
    out = LiveRead(dump=Dump(root=Path(f"live/{namespace}")))
    dump = out.dump
    try:
        dump.version = api.get_json("/version")
    except SourceError as e:
        out.notes.append(f"/version: {e}")
    served, notes = api.discover(resources)
    out.notes += notes
    for r in served:
        res = _scoped(r, namespace)
        started = api.clock.now()
        try:
            items = []
            for n, item in enumerate(api.iter_list(res), 1):
                if n > limits.max_objects:
                    raise _TooMany(n)
                items.append(item)
        except _TooMany:
            out.notes.append(f"{res.name}: more than {limits.max_objects} objects; not used ({r.kind} unknown)")
            continue
        except PermanentSourceError as e:
            if e.code in (401, 403):
                out.refused.append(_refusal(e, "list", res.name, res.namespace, would_show(r.kind, contract)))
                continue
            raise
        for i, obj in enumerate(items):
            add_object(dump, obj, res.path, f"{res.path}[{i}]", contract)
        dump.listed.add(r.kind)
        out.synced[r.kind] = started
    _read_logs(api, out, namespace, contract, runs, limits, log_regex_by_profile or {})
    return out


class _TooMany(Exception):
    pass


def _run_pods(dump: Dump, contract: TauGridContract, runs: Sequence[str]) -> list[Ref]:
    """The pods of `runs` (all runs when none), by name; pods of no run count when no run is named."""
    index = build_index(dump.records, contract)
    index.infer_missing_roots()
    names = set(runs)
    pods: set[Ref] = set()
    for root in index.roots():
        if names and not names & {root.name, f"{root.namespace}/{root.name}",
                                  f"{root.kind}/{root.namespace}/{root.name}"}:
            continue
        pods.update(rec.ref for rec in index.members(root) if rec.ref.kind == "Pod")
    return sorted(pods, key=lambda p: (p.namespace, p.name))


def _read_logs(api: KubeApi, out: LiveRead, namespace: str, contract: TauGridContract, runs: Sequence[str],
               limits: LiveLimits, by_profile: dict[str, str]) -> None:
    dump = out.dump
    if "Pod" not in dump.listed:
        return  # no pods read: no logs to ask for (the pods refusal says what is missing)
    pods = _run_pods(dump, contract, runs)
    if len(pods) > limits.max_pods:
        out.notes.append(f"{len(pods)} pods; logs read for the first {limits.max_pods} by name (--max-pods)")
        pods = pods[: limits.max_pods]
    facts = {(r.ref.namespace, r.ref.name): r.facts for r in dump.records if isinstance(r.facts, PodFacts)}
    regex_of = regex_by_pod(dump.records, by_profile) if by_profile else {}
    for pod in pods:
        f = facts.get((pod.namespace, pod.name))
        if f is None:
            continue
        out.pods_read += 1
        for c in f.containers:
            if c.init or (c.state in ("", "waiting") and c.restart_count == 0):
                continue  # never started: nothing logged yet
            try:
                chunk, read_at = _container_log(api, out, pod, c.name, previous=c.restart_count > 0,
                                                current=c.state != "waiting", limits=limits)
            except _Refused as e:
                out.refused.append(_refusal(e.error, "get", LOG_RESOURCE, pod.namespace,
                                            would_show(LOG_RESOURCE, contract)))
                return  # the same rule answers every pod of the namespace alike
            if chunk is None:
                continue
            scan_log(dump, f"{pod.namespace}/{pod.name}/{c.name}", pod, c.name, chunk,
                     regex_of.get((pod.namespace, pod.name)))
            ref, container, scan = dump.logs[-1]
            out.signals.append(Signal(ref=ref, source=container, scan=scan, read_at=read_at))


class _Refused(Exception):
    def __init__(self, error: SourceError) -> None:
        super().__init__(str(error))
        self.error = error


def _container_log(api: KubeApi, out: LiveRead, pod: Ref, container: str, *, previous: bool, current: bool,
                   limits: LiveLimits) -> tuple[bytes | None, datetime]:
    """The container's previous log (when it restarted) followed by its current one (unless it waits
    to restart: it has none), kubelet-stamped, as one signal like a dump's C-previous.txt + C-current.txt."""
    path = pod_log_path(pod.namespace, pod.name)
    query: list[tuple[str, Any]] = [("container", container), ("limitBytes", limits.max_log_bytes),
                                    ("timestamps", "true")]
    read_at = api.clock.now()
    parts: list[bytes] = []
    for prev in [p for p, wanted in ((True, previous), (False, current)) if wanted]:
        try:
            text = api.get_text(path, [*query, ("previous", "true")] if prev else query)
        except PermanentSourceError as e:
            if e.code in (401, 403):
                raise _Refused(e) from e
            # 400/404: the kubelet kept no such log (not started, rotated away, pod recreated)
            out.dump.problems.append(Problem(f"{pod.namespace}/{pod.name}/{container}",
                                             f"{'previous ' if prev else ''}log not read: {e}", False))
            continue
        out.log_bytes += len(text)
        if text:
            parts.append(text if text.endswith(b"\n") else text + b"\n")
    return (b"".join(parts) if parts else None), read_at
