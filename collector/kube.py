"""The one named point where raw Kubernetes JSON becomes `ObjectRecord`s.

Everything read from an API server, a dump or a fixture passes through `normalize`. It keeps
only the fields the claims need (memory stays lean for fleets), reports odd fields as problems
instead of failing, and raises `MalformedObject` only when an object cannot be identified.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from collector.model import (
    AdmissionCheck,
    AdmissionCheckFacts,
    Condition,
    ContainerFacts,
    EventFacts,
    Facts,
    JobFacts,
    NodeClaimFacts,
    NodeFacts,
    ObjectRecord,
    OwnerRef,
    Placement,
    PodFacts,
    QueueFacts,
    RayClusterFacts,
    RayJobFacts,
    Ref,
    ResolvedProfile,
    ResourceClaimFacts,
    TauClusterFacts,
    TauRunFacts,
    WorkloadFacts,
)
from collector.queuefacts import quantity
from collector.settings import TauGridContract

RawObject = Mapping[str, Any]

_EMPTY: dict[str, Any] = {}
_DEFAULT_CONTRACT = DEFAULT_CONTRACT = TauGridContract()
_NO_LABELS: Mapping[str, str] = MappingProxyType({})

RUN_LABEL = "taugrid.io/run"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"

# Labels that name a pod's job when the job object itself is not in view (a bare cluster-info dump).
JOB_NAME_LABELS: tuple[tuple[str, str], ...] = (
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
    ("training.kubeflow.org/job-name", "PyTorchJob"),  # kind refined by training.kubeflow.org/operator-name
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
)
KUBEFLOW_OPERATOR_LABEL = "training.kubeflow.org/operator-name"
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"

def shared_labels(kept: dict[str, str]) -> Mapping[str, str]:
    """One read-only mapping per distinct set of kept labels: the pods of a group (and a run's
    other objects) carry the same ones, and a mapping per record was ~0.5 KB each at fleet size.
    Bounded by clearing; a refill costs one mapping per distinct set. Keys and values are interned
    here, so callers need not intern what a hit throws away."""
    key = tuple(kept.items())
    shared = _SHARED_LABELS.get(key)
    if shared is None:
        if len(_SHARED_LABELS) >= 1 << 16:
            _SHARED_LABELS.clear()
        shared = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in key})
        _SHARED_LABELS[tuple(shared.items())] = shared
    return shared


_SHARED_LABELS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}

_JOB_NAME_KEYS = frozenset(k for k, _ in JOB_NAME_LABELS)
KEPT_LABELS = frozenset({RUN_LABEL, KUEUE_QUEUE_LABEL, RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL,
                         "ray.io/originated-from-crd", "ray.io/originated-from-cr-name",
                         KUBEFLOW_OPERATOR_LABEL, KARPENTER_NODEPOOL_LABEL, *(k for k, _ in JOB_NAME_LABELS),
                         "kueue.x-k8s.io/multikueue-origin"})  # MultiKueue worker copies (collector/multicluster.py)
# Labels that say which member of its run a pod is (`pod_identity`); read, not kept on the record (a
# rank is per pod, and kept labels are shared by the pods that carry the same ones).
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
RAY_GROUP_LABEL = "ray.io/group"
POD_IDENTITY_LABELS = frozenset({JOBSET_REPLICATED_JOB, JOBSET_JOB_INDEX, JOBSET_RESTART_ATTEMPT,
                                 JOB_COMPLETION_INDEX, KUBEFLOW_REPLICA_TYPE, KUBEFLOW_REPLICA_INDEX,
                                 RAY_GROUP_LABEL})


@functools.lru_cache(maxsize=1 << 14)
def pod_identity(role_labels: tuple[tuple[str, str], ...]) -> tuple[str, str, int]:
    """(role, rank, restart attempt) of a pod in its run, from the labels of `POD_IDENTITY_LABELS`,
    the job-name labels and `ray.io/node-type` (sorted (key, value) pairs). A role names the pods
    that do one part of the run (a JobSet's replicated job, a training operator's replica type, a
    Ray worker group, a Job); the rank, which one of them (a completion or replica index), when the
    controller numbers them. ("", "", 0): nothing says (the pod is its own signal)."""
    get = dict(role_labels).get
    attempt_s = get(JOBSET_RESTART_ATTEMPT, "")
    attempt = int(attempt_s) if attempt_s.isdigit() and len(attempt_s) < 7 else 0
    index = get(JOB_COMPLETION_INDEX, "")
    if (rj := get(JOBSET_REPLICATED_JOB)):
        return sys.intern(f"jobset/{rj}"), sys.intern(f"{get(JOBSET_JOB_INDEX, '')}/{index}"), attempt
    if (rt := get(KUBEFLOW_REPLICA_TYPE)):
        return sys.intern(f"replica/{rt.lower()}"), sys.intern(get(KUBEFLOW_REPLICA_INDEX, "")), attempt
    node_type = get(RAY_NODE_TYPE_LABEL, "")
    if node_type == "head":
        return "ray/head", "0", attempt  # one head per Ray cluster
    if node_type or get(RAY_GROUP_LABEL):
        return sys.intern(f"ray/{get(RAY_GROUP_LABEL, '')}"), "", attempt
    job = next((v for k, _ in JOB_NAME_LABELS if (v := get(k))), "")
    if job:
        return sys.intern(f"job/{job}"), sys.intern(index), attempt
    return "", "", attempt


def identity_of(labels: Mapping[str, Any]) -> tuple[str, str, int]:
    """`pod_identity` of a pod's labels as decoded (values that are not strings say nothing)."""
    return pod_identity(tuple(sorted((k, v) for k, v in labels.items() if type(v) is str and (
        k in POD_IDENTITY_LABELS or k == RAY_NODE_TYPE_LABEL or k in _JOB_NAME_KEYS))))


NO_UID_KINDS = frozenset({"Pod", "Event", "Node"})
# Pod conditions the claims read; the rest (Initialized, ContainersReady, ...) are not kept.
POD_CONDITIONS = frozenset({"PodScheduled", "Ready"})

# Training-operator kinds whose pods are declared as replica specs; all are runs' roots.
TRAINING_JOB_KINDS = frozenset(
    {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob", "JobSet"}
)
JOB_KINDS = TRAINING_JOB_KINDS | {"Job"}

# Kinds a cluster-info dump carries that say nothing about training runs: skipped quietly.
IRRELEVANT_KINDS = frozenset(
    {
        "Service",
        "Endpoints",
        "EndpointSlice",
        "Deployment",
        "DaemonSet",
        "ReplicaSet",
        "ReplicationController",
        "StatefulSet",
        "ConfigMap",
        "ServiceAccount",
        "Namespace",
        "PersistentVolumeClaim",
        "PersistentVolume",
        "ResourceFlavor",
        "Lease",
        "Secret",  # never read: recognized only so it is dropped without a trace
        # Kueue's configuration kinds: how queues and MultiKueue workers are set up, not a run's state
        # (a MultiKueue manager's dump holds them: they are no input error).
        "MultiKueueConfig",
        "MultiKueueCluster",
        "Cohort",
        "Topology",
        "WorkloadPriorityClass",
        "ProvisioningRequestConfig",
        "PriorityClass",
        "CronJob",
        # DRA and Karpenter kinds whose content the claims do not need (ResourceClaims and
        # NodeClaims are read; slices, classes, templates and pools describe supply, not a wait).
        "ResourceSlice",
        "DeviceClass",
        "ResourceClaimTemplate",
        "NodePool",
        "EC2NodeClass",
        "AKSNodeClass",
        "ProvisioningRequest",
    }
)

POD_PHASES = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})
RAYJOB_DEPLOYMENT_STATUSES = frozenset(
    {
        "",
        "New",
        "Initializing",
        "Waiting",
        "Running",
        "Complete",
        "Failed",
        "Suspending",
        "Suspended",
        "Retrying",
        "ValidationFailed",
    }
)
RAY_JOB_STATUSES = frozenset({"", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"})
CONDITION_STATUSES = frozenset({"True", "False", "Unknown"})


class MalformedObject(ValueError):
    """The object cannot be identified (no kind or name) or is not an object at all."""


@dataclass(slots=True)
class Normalized:
    record: ObjectRecord | None  # None: a kind the collector deliberately ignores
    problems: list[str]


def parse_time(value: Any) -> datetime | None:
    """RFC3339 (also MicroTime with 9 fractional digits, lowercase z) → aware UTC datetime."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {value!r}")
    return _parse_time(value)


@functools.lru_cache(maxsize=1 << 16)
def _parse_time(value: str) -> datetime:
    # Cached: a watch repeats the same timestamps (creation, transitions) in every update of an
    # object, and the cache shares one datetime among the records that hold it.
    s = value.strip()
    if s[-1:] in ("Z", "z"):
        s = s[:-1] + "+00:00"
    if "." in s:  # fromisoformat takes at most 6 fractional digits
        head, _, rest = s.partition(".")
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        s = f"{head}.{(digits + '000000')[:6]}{rest[i:]}"
    t = datetime.fromisoformat(s)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC)


# RFC3339 date-time (Kubernetes Time/MicroTime); fromisoformat also takes dates, week dates,
# missing seconds or offsets, which are read but warned about (docs/security.md).
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:[Zz]|[+-]\d\d:\d\d)$")


@functools.lru_cache(maxsize=1 << 16)
def _not_rfc3339(value: str) -> bool:
    return _RFC3339.match(value.strip()) is None


class _Reader:
    """Reads fields leniently, remembering what was odd and the newest timestamp seen."""

    def __init__(self, where: str, ref: Ref | None = None) -> None:
        self._where = where
        self._ref = ref
        self.problems: list[str] = []
        self.newest: datetime | None = None

    def problem(self, msg: str) -> None:
        where = self._where or str(self._ref)  # formatted only when there is something to say
        self.problems.append(f"{where}: {msg}")

    def time(self, value: Any, path: str) -> datetime | None:
        try:
            t = parse_time(value)
        except (ValueError, TypeError):
            self.problem(f"{path}: unreadable timestamp {value!r}")
            return None
        if t is not None and (self.newest is None or t > self.newest):
            self.newest = t
        if t is not None and _not_rfc3339(value):
            self.problem(f"{path}: {value!r} is not RFC3339; read as {t.isoformat()}")
        return t

    def int_(self, value: Any, path: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool):
            self.problem(f"{path}: expected an integer, got {value!r}")
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        self.problem(f"{path}: expected an integer, got {value!r}")
        return None

    def str_(self, value: Any, path: str) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        self.problem(f"{path}: expected a string, got {type(value).__name__}")
        return str(value)

    def enum(self, value: Any, path: str, known: frozenset[str]) -> str:
        s = self.str_(value, path)
        if s not in known:
            self.problem(f"{path}: value {s!r} never seen before; treated as unknown")
        return s

    def conditions(self, raw: Any, path: str, keep: frozenset[str] | None = None) -> tuple[Condition, ...]:
        if raw is None:
            return ()
        if type(raw) is not list:
            self.problem(f"{path}: expected a list")
            return ()
        out = []
        for i, c in enumerate(raw):
            if type(c) is not dict or not c.get("type"):
                self.problem(f"{path}[{i}]: condition without a type, skipped")
                continue
            ctype = c["type"]
            # `type(...) is str` first: a list or mapping here is not hashable (found by hypothesis)
            if keep is not None and (type(ctype) is not str or ctype not in keep):
                continue
            status = c.get("status")
            if type(status) is not str or status not in CONDITION_STATUSES:
                status = self.str_(status, f"{path}[{i}].status")
                self.problem(f"{path}[{i}].status: value {status!r} never seen before")
            reason, message = c.get("reason"), c.get("message")
            out.append(
                Condition(
                    type=sys.intern(str(ctype)),
                    status=sys.intern(status),
                    reason=sys.intern(reason) if type(reason) is str else
                    self.str_(reason, f"{path}[{i}].reason"),
                    message=message if type(message) is str else self.str_(message, f"{path}[{i}].message"),
                    last_transition=self.fast_time(c.get("lastTransitionTime") or c.get("lastUpdateTime"),
                                                   path, i),
                )
            )
        return tuple(out)

    def fast_time(self, value: Any, path: str, index: int | str = "") -> datetime | None:
        """`time` without building the field path unless something is wrong."""
        if value is None or value == "":
            return None
        if type(value) is str:
            try:
                t = _parse_time(value)
            except ValueError:
                return self.time(value, f"{path}[{index}]")
            if _not_rfc3339(value):
                return self.time(value, f"{path}[{index}]")
            if self.newest is None or t > self.newest:
                self.newest = t
            return t
        return self.time(value, f"{path}[{index}]")


def _get(obj: Any, path: str) -> Any:
    """Dotted lookup that tolerates missing or non-mapping intermediates."""
    cur = obj
    for part in _split(path):
        if type(cur) is not dict:  # JSON decodes to dicts; anything else is a malformed field
            return None
        cur = cur.get(part)
    return cur


@functools.cache
def _split(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _map(obj: Any, path: str) -> Mapping[str, Any]:
    v = _get(obj, path)
    return v if type(v) is dict else _EMPTY


def _list(obj: Any, path: str) -> list[Any]:
    v = _get(obj, path)
    return v if isinstance(v, list) else []


# Typed objects with a normalize of their own (collector/kube_pod.py registers pods' Structs).
TYPED_NORMALIZERS: dict[type, Callable[..., Normalized]] = {}


def normalize(raw: Any, contract: TauGridContract | None = None, *, where: str = "") -> Normalized:
    """Convert one raw object (a dict as the API serves it) into an `ObjectRecord`."""
    contract = contract or _DEFAULT_CONTRACT
    if not isinstance(raw, dict):
        typed = TYPED_NORMALIZERS.get(type(raw))
        if typed is not None:
            return typed(raw, contract, where=where)
        raise MalformedObject(f"{where or 'object'}: expected a mapping, got {type(raw).__name__}")
    kind = raw.get("kind")
    meta = raw.get("metadata")
    if not isinstance(kind, str) or not kind:
        raise MalformedObject(f"{where or 'object'}: no kind")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        raise MalformedObject(f"{where or kind}: {kind} without metadata.name")
    ns = meta.get("namespace") or ""
    # Only runs' roots are reported with their uid; for pods and events it is memory for nothing.
    ref = Ref(kind=sys.intern(kind), namespace=sys.intern(str(ns)), name=str(meta["name"]),
              uid=str(meta.get("uid") or "") if kind not in NO_UID_KINDS else "")
    if kind in IRRELEVANT_KINDS:
        return Normalized(None, [])
    r = _Reader(where, ref)
    if "/" in ref.name or ".." in ref.name or "/" in ref.namespace or ".." in ref.namespace:
        # The API server never accepts these; in a dump they could steer paths and URLs.
        r.problem(f"metadata: name {ref.namespace}/{ref.name!r} holds '/' or '..', which Kubernetes never allows")
    api_version = sys.intern(r.str_(raw.get("apiVersion"), "apiVersion"))
    role = _role(contract, kind, api_version)
    if role:
        ref = Ref(kind=role, namespace=ref.namespace, name=ref.name, uid=ref.uid)
    builder = _builder_for(ref.kind, raw, contract)
    if builder is None:
        raise MalformedObject(f"{where or ref}: unknown kind {kind!r} ({api_version or 'no apiVersion'})")
    created = r.fast_time(meta.get("creationTimestamp"), "metadata", "creationTimestamp")
    labels_raw = meta.get("labels") or _EMPTY
    labels: Mapping[str, str] = _NO_LABELS
    if isinstance(labels_raw, dict):
        # Only the labels correlation reads: a fleet's pods carry dozens it never looks at.
        kept = {k: sys.intern(str(v)) for k, v in labels_raw.items() if k in KEPT_LABELS}
        if kept:
            labels = shared_labels(kept)
    else:
        r.problem("metadata.labels: expected a mapping")
    owners: list[OwnerRef] = []
    owner_refs = meta.get("ownerReferences") or []
    if type(owner_refs) is not list:
        r.problem("metadata.ownerReferences: expected a list")
        owner_refs = []
    for i, o in enumerate(owner_refs):
        if not isinstance(o, dict) or not o.get("kind") or not o.get("name"):
            r.problem(f"metadata.ownerReferences[{i}]: incomplete, ignored")
            continue
        uid = o.get("uid")
        owners.append(
            OwnerRef(kind=sys.intern(str(o["kind"])), name=sys.intern(str(o["name"])),
                     uid=sys.intern(uid[:64]) if type(uid) is str else "", controller=bool(o.get("controller")))
        )
    if meta.get("deletionTimestamp"):
        r.time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp")
    conditions = r.conditions(_get(raw, "status.conditions"), "status.conditions",
                              keep=POD_CONDITIONS if kind == "Pod" else None)
    facts = builder(r, raw)
    return Normalized(
        ObjectRecord(
            ref=ref,
            api_version=api_version,
            resource_version=str(meta.get("resourceVersion") or ""),
            generation=r.int_(meta.get("generation"), "metadata.generation"),
            created=created,
            labels=labels,
            owners=tuple(owners),
            conditions=conditions,
            facts=facts,
            newest=r.newest,
        ),
        r.problems,
    )


# --- per-kind builders ------------------------------------------------------------------------

Builder = Callable[["_Reader", RawObject], Facts]


@functools.lru_cache(maxsize=256)
def _role(contract: TauGridContract, kind: str, api_version: str) -> str:
    return contract.role_of(kind, api_version)


def _builder_for(kind: str, raw: RawObject, contract: TauGridContract) -> Builder | None:
    if kind == "TauRun":
        return lambda r, rd: _taurun(r, rd, contract)
    if kind == "TauCluster":
        return lambda r, rd: _taucluster(r, rd, contract)
    if kind == "TauWorkspace":
        return _no_facts
    found = _BUILDERS.get(kind)
    if found is None and kind.endswith("Job") and isinstance(_get(raw, "spec"), dict):
        return _job  # an unfamiliar training-operator job still declares replica specs
    return found


def _no_facts(r: _Reader, raw: RawObject) -> Facts:
    return None


def _gpus(resources: Any) -> int:
    """GPU count of one container: any extended resource named */gpu, limits over requests."""
    if type(resources) is not dict:
        return 0
    return gpus_of(resources.get("limits"), resources.get("requests"))


def gpus_of(limits: Any, requests: Any) -> int:
    """`_gpus` of a container's limits and requests sections, as decoded."""
    best = 0
    for section in (limits, requests):
        if type(section) is dict:
            for k in section:
                if k.endswith("/gpu"):
                    try:  # not contextlib.suppress: this runs per container per pod event
                        n = int(str(section[k]))
                    except ValueError:
                        continue
                    if n > best:
                        best = n
    return best


def _sub(d: Any, key: str) -> dict[str, Any]:
    v = d.get(key) if type(d) is dict else None
    return v if type(v) is dict else _EMPTY


def _text(r: _Reader, v: Any, path: str, field: str, intern: bool = False) -> str:
    """A string field, with the path built only when the value is not a string."""
    if type(v) is str:
        return sys.intern(v) if intern else v
    return r.str_(v, f"{path}.{field}")


def _count(r: _Reader, v: Any, path: str, field: str) -> int | None:
    if type(v) is int:
        return v
    return r.int_(v, f"{path}.{field}")


def _container(r: _Reader, c: Any, init: bool, path: str) -> ContainerFacts:
    if type(c) is not dict:
        r.problem(f"{path}: expected an object")
        c = _EMPTY
    state = _sub(c, "state")
    which = next((k for k in ("waiting", "running", "terminated") if k in state), "")
    detail = _sub(state, which) if which else _EMPTY
    last = _sub(_sub(c, "lastState"), "terminated")
    since = detail.get("startedAt") or detail.get("finishedAt")
    return ContainerFacts(
        name=_text(r, c.get("name"), path, "name", intern=True),
        init=init,
        ready=bool(c.get("ready")),
        restart_count=_count(r, c.get("restartCount"), path, "restartCount") or 0,
        state=which,
        state_reason=_text(r, detail.get("reason"), path, "state.reason", intern=True),
        state_message=_text(r, detail.get("message"), path, "state.message")[:500],
        state_since=r.fast_time(since, path, "state"),
        exit_code=_count(r, detail.get("exitCode"), path, "state.exitCode"),
        last_reason=_text(r, last.get("reason"), path, "lastState.terminated.reason", intern=True),
        last_exit_code=_count(r, last.get("exitCode"), path, "lastState.terminated.exitCode"),
        last_finished=r.fast_time(last.get("finishedAt"), path, "lastState.terminated.finishedAt"),
    )


def _pod(r: _Reader, raw: RawObject) -> Facts:
    status = _sub(raw, "status")
    spec = _sub(raw, "spec")
    containers = []
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        statuses = status.get(key)
        if statuses is None:
            continue
        if type(statuses) is not list:
            r.problem(f"status.{key}: expected a list")
            continue
        for i, c in enumerate(statuses):
            containers.append(_container(r, c, init, f"status.{key}[{i}]"))
    phase = status.get("phase")
    claims = _pod_claims(r, spec, status)
    unhealthy = _unhealthy_devices(status)
    known = type(phase) is str and phase in POD_PHASES  # a list or mapping here is not hashable
    phase_s = str(phase) if known else (r.enum(phase, "status.phase", POD_PHASES) if phase is not None else "")
    specs = spec.get("containers")
    per = [(c.get("name"), _gpus(c.get("resources"))) for c in specs if type(c) is dict] if type(specs) is list else []
    gpus = sum(g for _, g in per)
    helpers = tuple(sys.intern(n) for n, g in per if not g and type(n) is str) if gpus else ()
    role, rank, attempt = identity_of(_sub(_sub(raw, "metadata"), "labels"))
    node_name = _text(r, spec.get("nodeName"), "spec", "nodeName", intern=True)
    return PodFacts(
        phase=sys.intern(phase_s),
        reason=_text(r, status.get("reason"), "status", "reason", intern=True),
        message=_text(r, status.get("message"), "status", "message")[:500],
        node_name=node_name,
        gpus=gpus,
        start_time=r.fast_time(status.get("startTime"), "status", "startTime"),
        containers=tuple(containers),
        deleting=bool(_sub(raw, "metadata").get("deletionTimestamp")),
        ray_node_type=sys.intern(str(_sub(_sub(raw, "metadata"), "labels").get(RAY_NODE_TYPE_LABEL, ""))),
        pod_ip=_text(r, status.get("podIP"), "status", "podIP"),
        claims=claims,
        unhealthy_devices=unhealthy,
        scheduling_gates=tuple(str(_get(g, "name")) for g in gates if type(g) is dict)
        if type(gates := spec.get("schedulingGates")) is list else (),
        role=role,
        rank=rank,
        attempt=attempt,
        helpers=helpers,
        placement=None if node_name else _placement(spec),
    )


_MAX_PLACEMENT = 64  # entries of each kind kept (a hostile spec is bounded)


def _placement(spec: Mapping[str, Any]) -> Placement | None:
    """An unbound pod's nodeSelector, required node affinity and tolerations (None: it names none)."""
    selector = tuple((str(k), str(v)) for k, v in list(_sub(spec, "nodeSelector").items())[:_MAX_PLACEMENT])
    terms = []
    required = _sub(_sub(_sub(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
    for term in _list(required, "nodeSelectorTerms")[:_MAX_PLACEMENT]:
        exprs = tuple((str(e.get("key") or ""), str(e.get("operator") or ""),
                       tuple(str(v) for v in e.get("values") or () if type(v) is str)[:_MAX_PLACEMENT])
                      for e in _list(term, "matchExpressions")[:_MAX_PLACEMENT] if type(e) is dict)
        terms.append(exprs)
    tolerations = tuple((str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                         str(t.get("effect") or ""))
                        for t in _list(spec, "tolerations")[:_MAX_PLACEMENT] if type(t) is dict)
    if not (selector or terms or tolerations):
        return None
    return Placement(selector, tuple(terms), tolerations)


def _pod_claims(r: _Reader, spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """ResourceClaim names a pod uses: generated names from status, direct names from spec."""
    declared = spec.get("resourceClaims")
    if type(declared) is not list or not declared:
        return ()
    generated = {str(_get(c, "name")): str(_get(c, "resourceClaimName") or "")
                 for c in _list(status, "resourceClaimStatuses") if type(c) is dict}
    out: list[str] = []
    for c in declared:
        if type(c) is not dict:
            continue
        name = str(c.get("name") or "")
        direct = c.get("resourceClaimName")
        claim = str(direct) if direct else generated.get(name, "")
        # A template claim not generated yet has no name: keep "" so the wait is still visible.
        out.append(claim)
    return tuple(out)


def _unhealthy_devices(status: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for key in ("containerStatuses", "initContainerStatuses"):
        statuses = status.get(key)
        if type(statuses) is not list:
            continue
        for c in statuses:
            allocated = c.get("allocatedResourcesStatus") if type(c) is dict else None
            if not allocated or type(allocated) is not list:
                continue  # the common case: no device health reported
            for res in allocated:
                for dev in _list(res, "resources"):
                    health = _get(dev, "health")
                    if health is not None and health != "Healthy":
                        out.append(f"{_get(res, 'name')}: {_get(dev, 'resourceID')} {health}")
    return tuple(dict.fromkeys(out))


def _workload(r: _Reader, raw: RawObject) -> Facts:
    checks = []
    for i, c in enumerate(_list(raw, "status.admissionChecks")):
        checks.append(
            AdmissionCheck(
                name=r.str_(_get(c, "name"), f"status.admissionChecks[{i}].name"),
                state=r.str_(_get(c, "state"), f"status.admissionChecks[{i}].state"),
                message=r.str_(_get(c, "message"), f"status.admissionChecks[{i}].message"),
                last_transition=r.time(_get(c, "lastTransitionTime"), f"status.admissionChecks[{i}]"),
            )
        )
    pod_sets = _list(raw, "spec.podSets")
    counts = [r.int_(_get(p, "count"), "spec.podSets[].count") for p in pod_sets]
    pod_count = sum(c for c in counts if c is not None) if pod_sets else None
    requests: dict[str, float] = {}
    for p, n in zip(pod_sets, counts, strict=True):
        for res, amount in _pod_requests(_get(p, "template.spec")).items():
            requests[res] = requests.get(res, 0.0) + amount * (n if n is not None else 1)
    return WorkloadFacts(
        queue_name=r.str_(_get(raw, "spec.queueName"), "spec.queueName"),
        cluster_queue=r.str_(_get(raw, "status.admission.clusterQueue"), "status.admission.clusterQueue"),
        admission_checks=tuple(checks),
        pod_count=pod_count,
        cluster_name=r.str_(_get(raw, "status.clusterName"), "status.clusterName"),
        active=_get(raw, "spec.active") is not False,
        gated_by=r.str_(_map(raw, "metadata.annotations").get("kueue.x-k8s.io/admission-gated-by"),
                        "metadata.annotations[kueue.x-k8s.io/admission-gated-by]"),
        priority=r.int_(_get(raw, "spec.priority"), "spec.priority"),
        requests=tuple(sorted(requests.items()))[:16],
    )


def _pod_requests(spec: Any) -> dict[str, float]:
    """A pod's requests as Kueue counts them: its containers' requests (limits where a request is not
    set) summed, each init container's taken where it is larger."""
    total: dict[str, float] = {}
    for c in _list(spec, "containers")[:64]:
        for res, v in _container_requests(c).items():
            total[res] = total.get(res, 0.0) + v
    for c in _list(spec, "initContainers")[:64]:
        for res, v in _container_requests(c).items():
            total[res] = max(total.get(res, 0.0), v)
    return total


def _container_requests(c: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("limits", "requests"):  # requests win over limits
        for res, raw in list(_map(c, f"resources.{key}").items())[:32]:
            v = quantity(raw)
            if v is not None and v >= 0 and isinstance(res, str) and len(res) <= 253:
                out[res] = v
    return out


def _flavor_amounts(r: _Reader, flavors: list[Any], field: str, path: str) -> tuple[tuple[str, str, float], ...]:
    out: list[tuple[str, str, float]] = []
    for f in flavors[:32]:
        flavor = r.str_(_get(f, "name"), f"{path}[].name")
        for res in _list(f, "resources")[:32]:
            v = quantity(_get(res, field))
            if v is not None:
                out.append((flavor, r.str_(_get(res, "name"), f"{path}[].resources[].name"), v))
    return tuple(out)


def _admission_check(r: _Reader, raw: RawObject) -> Facts:
    return AdmissionCheckFacts(controller_name=r.str_(_get(raw, "spec.controllerName"), "spec.controllerName"))


def _resource_claim(r: _Reader, raw: RawObject) -> Facts:
    return ResourceClaimFacts(allocated=type(_get(raw, "status.allocation")) is dict)


def _node_claim(r: _Reader, raw: RawObject) -> Facts:
    return NodeClaimFacts(
        node_name=r.str_(_get(raw, "status.nodeName"), "status.nodeName"),
        node_pool=str(_map(raw, "metadata.labels").get(KARPENTER_NODEPOOL_LABEL) or ""),
    )


def _queue(r: _Reader, raw: RawObject) -> Facts:
    return QueueFacts(
        cluster_queue=r.str_(_get(raw, "spec.clusterQueue"), "spec.clusterQueue"),
        pending=r.int_(_get(raw, "status.pendingWorkloads"), "status.pendingWorkloads"),
        admitted=r.int_(_get(raw, "status.admittedWorkloads"), "status.admittedWorkloads"),
        quota=_flavor_amounts(r, [f for g in _list(raw, "spec.resourceGroups")[:16] for f in _list(g, "flavors")],
                              "nominalQuota", "spec.resourceGroups[].flavors"),
        reserved=_flavor_amounts(r, _list(raw, "status.flavorsReservation"), "total", "status.flavorsReservation"),
    )


def _ray_cluster_pods(r: _Reader, spec: Any) -> tuple[int | None, int | None]:
    """(expected pods, desired workers) declared by a RayCluster spec: head + workers × hosts."""
    if not isinstance(spec, dict):
        return None, None
    workers = 0
    for i, g in enumerate(_list(spec, "workerGroupSpecs")):
        if _get(g, "suspend") is True:
            continue
        replicas = r.int_(_get(g, "replicas"), f"workerGroupSpecs[{i}].replicas")
        if replicas is None:
            replicas = r.int_(_get(g, "minReplicas"), f"workerGroupSpecs[{i}].minReplicas") or 0
        hosts = r.int_(_get(g, "numOfHosts"), f"workerGroupSpecs[{i}].numOfHosts") or 1
        workers += replicas * hosts
    return 1 + workers, workers


def _rayjob(r: _Reader, raw: RawObject) -> Facts:
    status = _map(raw, "status")
    expected, _ = _ray_cluster_pods(r, _get(raw, "spec.rayClusterSpec"))
    return RayJobFacts(
        deployment_status=r.enum(
            status.get("jobDeploymentStatus"), "status.jobDeploymentStatus", RAYJOB_DEPLOYMENT_STATUSES
        ),
        job_status=r.enum(status.get("jobStatus"), "status.jobStatus", RAY_JOB_STATUSES),
        message=r.str_(status.get("message"), "status.message")[:500],
        cluster_name=r.str_(status.get("rayClusterName"), "status.rayClusterName"),
        expected_pods=expected,
        start_time=r.time(status.get("startTime"), "status.startTime"),
        end_time=r.time(status.get("endTime"), "status.endTime"),
        job_id=r.str_(status.get("jobId"), "status.jobId"),
        dashboard_url=r.str_(status.get("dashboardURL"), "status.dashboardURL"),
        managed_by=r.str_(_get(raw, "spec.managedBy"), "spec.managedBy"),
    )


def _raycluster(r: _Reader, raw: RawObject) -> Facts:
    status = _map(raw, "status")
    expected, desired = _ray_cluster_pods(r, _get(raw, "spec"))
    return RayClusterFacts(
        state=r.str_(status.get("state"), "status.state"),
        expected_pods=expected,
        ready_workers=r.int_(status.get("readyWorkerReplicas"), "status.readyWorkerReplicas"),
        desired_workers=desired,
        head_service=r.str_(_get(status, "head.serviceName"), "status.head.serviceName"),
        dashboard_port=str(_get(status, "endpoints.dashboard") or ""),
        metrics_port=str(_get(status, "endpoints.metrics") or ""),
        autoscaling=_get(raw, "spec.enableInTreeAutoscaling") is True,
    )


def _job(r: _Reader, raw: RawObject) -> Facts:
    spec = _map(raw, "spec")
    status = _map(raw, "status")
    kind = str(raw.get("kind"))
    expected: int | None = None
    ready_expected: int | None = None
    active = r.int_(status.get("active"), "status.active")
    ready = r.int_(status.get("ready"), "status.ready")
    succeeded = r.int_(status.get("succeeded"), "status.succeeded")
    failed = r.int_(status.get("failed"), "status.failed")
    if kind == "Job":
        par = r.int_(spec.get("parallelism"), "spec.parallelism")
        comp = r.int_(spec.get("completions"), "spec.completions")
        expected = 1 if par is None else par
        if comp is not None:
            expected = min(expected, comp)
        ready_expected = expected
    elif kind == "JobSet":
        expected = 0
        ready_expected = 0
        a = rd = 0
        for i, rj in enumerate(_list(spec, "replicatedJobs")):
            n = r.int_(_get(rj, "replicas"), f"spec.replicatedJobs[{i}].replicas") or 1
            p = r.int_(_get(rj, "template.spec.parallelism"), f"spec.replicatedJobs[{i}].parallelism") or 1
            expected += n * p
            ready_expected += n  # replicatedJobsStatus counts child Jobs, not pods
        for s in _list(status, "replicatedJobsStatus"):
            a += int(_get(s, "active") or 0)
            rd += int(_get(s, "ready") or 0)
        active, ready = a, rd
    else:
        specs = next((v for k, v in spec.items() if k.endswith("ReplicaSpecs") and isinstance(v, dict)), None)
        if specs is not None:
            expected = 0
            for name, rs in specs.items():
                expected += r.int_(_get(rs, "replicas"), f"spec.*ReplicaSpecs.{name}.replicas") or 1
            a = 0
            for rs in _map(status, "replicaStatuses").values():
                a += int(_get(rs, "active") or 0)
            active = a
    suspended = bool(spec.get("suspend")) or bool(_get(spec, "runPolicy.suspend"))
    return JobFacts(
        suspended=suspended,
        active=active,
        ready=ready,
        succeeded=succeeded,
        failed=failed,
        expected_pods=expected,
        start_time=r.time(status.get("startTime"), "status.startTime"),
        managed_by=r.str_(spec.get("managedBy") or _get(spec, "runPolicy.managedBy"), "spec.managedBy"),
        ready_expected=ready_expected,
    )


def _node(r: _Reader, raw: RawObject) -> Facts:
    ready: Any = {}
    for c in _list(raw, "status.conditions"):
        if _get(c, "type") == "Ready" and type(c) is dict:
            ready = c
    capacity = _gpus({"limits": _map(raw, "status.capacity")})
    allocatable = _gpus({"limits": _map(raw, "status.allocatable")})
    labels: Mapping[str, str] = {}
    taints: tuple[tuple[str, str, str], ...] = ()
    if allocatable < capacity:  # a short node: whether a waiting pod could use it at all
        labels = {str(k): str(v) for k, v in _map(raw, "metadata.labels").items() if type(v) is str}
        taints = tuple((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
                       for t in _list(raw, "spec.taints")[:64] if type(t) is dict)
    return NodeFacts(
        ready=str(ready.get("status") or ""),
        gpu_capacity=capacity,
        gpu_allocatable=allocatable,
        ready_reason=r.str_(ready.get("reason"), "status.conditions[Ready].reason"),
        ready_message=r.str_(ready.get("message"), "status.conditions[Ready].message")[:300],
        ready_since=r.time(ready.get("lastTransitionTime"), "status.conditions[Ready].lastTransitionTime"),
        unschedulable=_get(raw, "spec.unschedulable") is True,
        heartbeat=max((t for i, c in enumerate(_list(raw, "status.conditions")) if type(c) is dict
                       and (t := r.fast_time(c.get("lastHeartbeatTime"), "status.conditions", i)) is not None),
                      default=None),
        labels=labels,
        taints=taints,
    )


NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_PERIOD = timedelta(seconds=40)  # leaseDurationSeconds where the Lease does not say


@dataclass(frozen=True, slots=True)
class NodeLease:
    """A kubelet's node Lease: renewed every leaseDurationSeconds / 4 (10 s) while the kubelet lives,
    stamped on the node's own clock, so it says how far that clock runs ahead of the API server's."""

    node: str
    renewed: datetime
    period: timedelta  # leaseDurationSeconds


def node_lease(raw: Any) -> NodeLease | None:
    """A node Lease (namespace kube-node-lease) from its raw object; None for any other Lease (leader
    election, a tenant's own), which says nothing about a node's clock. MalformedObject when its
    renewTime cannot be read."""
    if not isinstance(raw, dict):
        return None
    meta, spec = raw.get("metadata"), raw.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or meta.get("namespace") != NODE_LEASE_NAMESPACE:
        return None
    try:
        renewed = parse_time(spec.get("renewTime"))
    except ValueError as e:
        raise MalformedObject(f"Lease {NODE_LEASE_NAMESPACE}/{meta.get('name')}: spec.renewTime "
                              f"{str(spec.get('renewTime'))[:64]!r} is unreadable") from e
    holder = spec.get("holderIdentity") or meta.get("name")
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(holder, str) or not holder:
        return None
    period = timedelta(seconds=duration) if type(duration) is int and 0 < duration <= 3600 else NODE_LEASE_PERIOD
    return NodeLease(holder[:253], renewed, period)


def _intern(text: str) -> str:
    """One shared copy of a short string that many records repeat (bounded: long text is not kept)."""
    return sys.intern(text) if len(text) <= 253 else text


def _event(r: _Reader, raw: RawObject) -> Facts:
    """core/v1 Event and events.k8s.io/v1 Event: one shape for both."""
    new_api = str(raw.get("apiVersion", "")).startswith("events.k8s.io")
    obj = _map(raw, "regarding") if new_api or "regarding" in raw else _map(raw, "involvedObject")
    if not obj:
        r.problem("event without involvedObject/regarding")
    # A fleet has ~7 Events per pod, hundreds of thousands in all: their repeated strings (kinds,
    # names of the objects they regard, reasons, components) are shared, not one copy per Event,
    # and the regarded object's uid, which nothing reads, is not kept (as for pods' own refs).
    regarding = Ref(
        kind=_intern(str(obj.get("kind") or "")),
        namespace=_intern(str(obj.get("namespace") or "")),
        name=_intern(str(obj.get("name") or "")),
    )
    series = _map(raw, "series")
    first = r.time(
        raw.get("deprecatedFirstTimestamp") or raw.get("firstTimestamp") or raw.get("eventTime"), "firstTimestamp"
    )
    last = r.time(
        series.get("lastObservedTime")
        or raw.get("deprecatedLastTimestamp")
        or raw.get("lastTimestamp")
        or raw.get("eventTime")
        or _get(raw, "metadata.creationTimestamp"),
        "lastTimestamp",
    )
    count = r.int_(series.get("count") or raw.get("deprecatedCount") or raw.get("count"), "count") or 1
    component = (
        raw.get("reportingController")
        or raw.get("reportingComponent")
        or _get(raw, "deprecatedSource.component")
        or _get(raw, "source.component")
        or ""
    )
    if first is not None and first == last:
        last = first  # one datetime object for both (most Events happened once)
    return EventFacts(
        type=_intern(r.str_(raw.get("type"), "type")),
        reason=_intern(r.str_(raw.get("reason"), "reason")),
        message=r.str_(raw.get("note") if new_api else raw.get("message"), "message")[:1000],
        regarding=regarding,
        component=_intern(str(component)),
        first=first or last,
        last=last or first,
        count=count,
    )


def _taurun(r: _Reader, raw: RawObject, c: TauGridContract) -> Facts:
    return TauRunFacts(
        phase=r.enum(_get(raw, c.run_phase), c.run_phase, c.run_phases | {""}),
        profile=r.str_(_get(raw, c.run_profile), c.run_profile),
        workers=r.int_(_get(raw, c.run_workers), c.run_workers),
        gpus_per_worker=r.int_(_get(raw, c.run_gpus_per_worker), c.run_gpus_per_worker),
        ray_job=r.str_(_get(raw, c.run_rayjob_ref), c.run_rayjob_ref),
        workload=r.str_(_get(raw, c.run_workload_ref), c.run_workload_ref),
        cluster=r.str_(_get(raw, c.run_cluster), c.run_cluster),
        checkpoints=r.str_(_get(raw, c.run_checkpoints), c.run_checkpoints),
    )


def _taucluster(r: _Reader, raw: RawObject, c: TauGridContract) -> Facts:
    resolved = []
    for i, p in enumerate(_list(raw, "status.resolvedProfiles")):
        if not isinstance(p, dict) or not p.get("name"):
            r.problem(f"status.resolvedProfiles[{i}]: no name, skipped")
            continue
        resolved.append(
            ResolvedProfile(
                name=str(p["name"]),
                local_queue=r.str_(p.get("localQueue"), f"status.resolvedProfiles[{i}].localQueue"),
                cluster_queue=r.str_(p.get("clusterQueue"), f"status.resolvedProfiles[{i}].clusterQueue"),
                workers=r.int_(p.get("workers"), f"status.resolvedProfiles[{i}].workers"),
                gpus_per_worker=r.int_(p.get("gpusPerWorker"), f"status.resolvedProfiles[{i}].gpusPerWorker"),
            )
        )
    return TauClusterFacts(
        observed_generation=r.int_(_get(raw, "status.observedGeneration"), "status.observedGeneration"),
        last_resolved=r.time(_get(raw, "status.lastResolvedTime"), "status.lastResolvedTime"),
        profiles=tuple(str(p.get("name")) for p in _list(raw, "spec.workloadProfiles") if isinstance(p, dict)),
        resolved=tuple(resolved),
    )


_BUILDERS: dict[str, Builder] = {
    "Pod": _pod,
    "Node": _node,
    "Event": _event,
    "Workload": _workload,
    "LocalQueue": _queue,
    "ClusterQueue": _queue,
    "RayJob": _rayjob,
    "RayCluster": _raycluster,
    "AdmissionCheck": _admission_check,
    "ResourceClaim": _resource_claim,
    "NodeClaim": _node_claim,
    **{k: _job for k in JOB_KINDS},
}


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def dns1123_label(value: str) -> bool:
    """A namespace's name (and most objects'): what may go into an API path as one segment."""
    return len(value) <= 63 and _LABEL.fullmatch(value) is not None


def dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and _SUBDOMAIN.fullmatch(value) is not None
