"""Resource types the simulator serves: data, so adding a type is one line in `DEFAULT_RESOURCES`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

ALL_VERBS: tuple[str, ...] = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the server-side `Table` view (`kubectl get` prints these).

    `path` is a dotted JSON path into the object (`status.phase`, `spec.queueName`) or, when it starts
    with `@`, the name of a computed column in `kubesim.tables`.
    """

    name: str
    path: str
    type: str = "string"
    priority: int = 0  # 1: only shown with `-o wide`


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One REST resource: where it lives, what it is called and how it is stored."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # Spec/status split: writes to the main resource keep the stored status; `/status` changes only it.
    status_subresource: bool = True
    # Field selector labels accepted besides metadata.name and metadata.namespace, each mapped to
    # the dotted path it reads in the *stored* object.
    field_labels: tuple[tuple[str, str], ...] = ()
    columns: tuple[Column, ...] = ()
    # Another type (group/version/plural) whose storage this one shares as a second view.
    storage_of: str = ""

    @property
    def group_version(self) -> str:
        """`v1` for core, `group/version` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Identity of the type: `group/version/plural` (core: `/v1/pods`)."""
        return f"{self.group}/{self.version}/{self.plural}"

    @property
    def storage_key(self) -> str:
        """Identity of the storage that holds this type's objects."""
        return self.storage_of or self.key

    def field_path(self, label: str) -> str | None:
        """The stored-object path a field selector label reads, or None when unsupported."""
        if label in ("metadata.name", "metadata.namespace"):
            return label
        for name, path in self.field_labels:
            if name == label:
                return path
        return None


def _rt(gv: str, plural: str, kind: str, **kw: object) -> ResourceType:
    group, _, version = gv.rpartition("/")
    return ResourceType(group=group, version=version, plural=plural, kind=kind, **kw)  # type: ignore[arg-type]


_C = Column
_AGE = _C("Age", "@age", "date")
_EVENT_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (f"involvedObject.{f}", f"involvedObject.{f}")
    for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
) + (
    ("reason", "reason"),
    ("reportingComponent", "reportingComponent"),
    ("source", "source.component"),
    ("type", "type"),
)
_EVENTS_V1_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (f"regarding.{f}", f"involvedObject.{f}")
    for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
) + (
    ("reason", "reason"),
    ("reportingController", "reportingComponent"),
    ("type", "type"),
)
_CORE_EVENTS = "/v1/events"

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    # --- core/v1
    _rt(
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        field_labels=(("status.phase", "status.phase"),),
        columns=(_C("Status", "status.phase"), _AGE),
    ),
    _rt(
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        short_names=("no",),
        field_labels=(("spec.unschedulable", "spec.unschedulable"),),
        columns=(
            _C("Status", "@node_status"),
            _C("Roles", "@node_roles"),
            _AGE,
            _C("Version", "status.nodeInfo.kubeletVersion"),
            _C("Internal-IP", "@node_ip", priority=1),
        ),
    ),
    _rt(
        "v1",
        "pods",
        "Pod",
        short_names=("po",),
        categories=("all",),
        field_labels=(
            ("spec.nodeName", "spec.nodeName"),
            ("status.phase", "status.phase"),
            ("spec.restartPolicy", "spec.restartPolicy"),
            ("spec.schedulerName", "spec.schedulerName"),
            ("spec.serviceAccountName", "spec.serviceAccountName"),
            ("status.podIP", "status.podIP"),
            ("status.nominatedNodeName", "status.nominatedNodeName"),
        ),
        columns=(
            _C("Ready", "@pod_ready"),
            _C("Status", "@pod_status"),
            _C("Restarts", "@pod_restarts"),
            _AGE,
            _C("IP", "status.podIP", priority=1),
            _C("Node", "spec.nodeName", priority=1),
        ),
    ),
    _rt(
        "v1",
        "events",
        "Event",
        short_names=("ev",),
        status_subresource=False,
        field_labels=_EVENT_FIELDS,
        columns=(
            _C("Last Seen", "@event_last_seen", "date"),
            _C("Type", "type"),
            _C("Reason", "reason"),
            _C("Object", "@event_object"),
            _C("Message", "message"),
        ),
    ),
    _rt(
        "v1",
        "services",
        "Service",
        short_names=("svc",),
        categories=("all",),
        columns=(_C("Type", "spec.type"), _C("Cluster-IP", "spec.clusterIP"), _AGE),
    ),
    _rt("v1", "endpoints", "Endpoints", short_names=("ep",), status_subresource=False),
    _rt("v1", "configmaps", "ConfigMap", short_names=("cm",), status_subresource=False),
    _rt("v1", "secrets", "Secret", status_subresource=False, field_labels=(("type", "type"),)),
    _rt("v1", "serviceaccounts", "ServiceAccount", short_names=("sa",), status_subresource=False),
    _rt("v1", "replicationcontrollers", "ReplicationController", short_names=("rc",), categories=("all",)),
    _rt("v1", "persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",)),
    _rt("v1", "persistentvolumes", "PersistentVolume", namespaced=False, short_names=("pv",)),
    _rt("v1", "resourcequotas", "ResourceQuota", short_names=("quota",)),
    _rt("v1", "limitranges", "LimitRange", short_names=("limits",), status_subresource=False),
    # --- apps, batch, coordination, scheduling, events.k8s.io
    _rt("apps/v1", "deployments", "Deployment", short_names=("deploy",), categories=("all",)),
    # Read by the supported-environment check (served and stored versions per workload CRD).
    _rt("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
        short_names=("crd", "crds")),
    _rt("apps/v1", "daemonsets", "DaemonSet", short_names=("ds",), categories=("all",)),
    _rt("apps/v1", "replicasets", "ReplicaSet", short_names=("rs",), categories=("all",)),
    _rt("apps/v1", "statefulsets", "StatefulSet", short_names=("sts",), categories=("all",)),
    _rt(
        "batch/v1",
        "jobs",
        "Job",
        categories=("all",),
        columns=(_C("Status", "@job_status"), _C("Completions", "@job_completions"), _AGE),
    ),
    _rt("batch/v1", "cronjobs", "CronJob", short_names=("cj",), categories=("all",)),
    _rt(
        "coordination.k8s.io/v1",
        "leases",
        "Lease",
        status_subresource=False,
        columns=(_C("Holder", "spec.holderIdentity"), _AGE),
    ),
    _rt(
        "scheduling.k8s.io/v1",
        "priorityclasses",
        "PriorityClass",
        namespaced=False,
        short_names=("pc",),
        status_subresource=False,
        columns=(_C("Value", "value", "integer"), _AGE),
    ),
    _rt(
        "events.k8s.io/v1",
        "events",
        "Event",
        status_subresource=False,
        field_labels=_EVENTS_V1_FIELDS,
        storage_of=_CORE_EVENTS,
        columns=(
            _C("Type", "type"),
            _C("Reason", "reason"),
            _C("Object", "@event_object"),
            _C("Message", "@event_note"),
        ),
    ),
    # --- Kueue
    _rt(
        "kueue.x-k8s.io/v1beta1",
        "workloads",
        "Workload",
        short_names=("wl",),
        categories=("kueue",),
        columns=(
            _C("Queue", "spec.queueName"),
            _C("Reserved in", "status.admission.clusterQueue"),
            _C("Admitted", "@cond:Admitted"),
            _C("Finished", "@cond:Finished"),
            _AGE,
        ),
    ),
    _rt(
        "kueue.x-k8s.io/v1beta1",
        "localqueues",
        "LocalQueue",
        short_names=("lq", "queue", "queues"),
        categories=("kueue",),
        columns=(
            _C("ClusterQueue", "spec.clusterQueue"),
            _C("Pending Workloads", "status.pendingWorkloads", "integer"),
            _C("Admitted Workloads", "status.admittedWorkloads", "integer"),
            _AGE,
        ),
    ),
    _rt(
        "kueue.x-k8s.io/v1beta1",
        "clusterqueues",
        "ClusterQueue",
        namespaced=False,
        short_names=("cq",),
        categories=("kueue",),
        columns=(
            _C("Cohort", "spec.cohort"),
            _C("Pending Workloads", "status.pendingWorkloads", "integer"),
            _C("Admitted Workloads", "status.admittedWorkloads", "integer"),
            _AGE,
        ),
    ),
    _rt(
        "kueue.x-k8s.io/v1beta1",
        "resourceflavors",
        "ResourceFlavor",
        namespaced=False,
        short_names=("flavor", "flavors", "rf"),
        categories=("kueue",),
        status_subresource=False,
        columns=(_AGE,),
    ),
    _rt(
        "kueue.x-k8s.io/v1beta1",
        "admissionchecks",
        "AdmissionCheck",
        namespaced=False,
        categories=("kueue",),
        columns=(_C("Controller", "spec.controllerName"), _C("Active", "@cond:Active"), _AGE),
    ),
    # --- Dynamic Resource Allocation (GA in Kubernetes 1.34)
    _rt(
        "resource.k8s.io/v1",
        "resourceclaims",
        "ResourceClaim",
        columns=(_AGE,),
    ),
    # what each node's DRA drivers publish (the node agent reads its own node's, by spec.nodeName)
    _rt(
        "resource.k8s.io/v1",
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        status_subresource=False,
        field_labels=(("spec.nodeName", "spec.nodeName"), ("spec.driver", "spec.driver")),
        columns=(_C("Node", "spec.nodeName"), _C("Driver", "spec.driver"), _C("Pool", "spec.pool.name"), _AGE),
    ),
    # --- Karpenter
    _rt(
        "karpenter.sh/v1",
        "nodeclaims",
        "NodeClaim",
        namespaced=False,
        categories=("karpenter",),
        columns=(
            _C("Node", "status.nodeName"),
            _C("Ready", "@cond:Ready"),
            _AGE,
        ),
    ),
    _rt(
        "karpenter.sh/v1",
        "nodepools",
        "NodePool",
        namespaced=False,
        categories=("karpenter",),
        columns=(_C("Ready", "@cond:Ready"), _AGE),
    ),
    # --- KubeRay
    _rt(
        "ray.io/v1",
        "rayjobs",
        "RayJob",
        categories=("all",),
        columns=(
            _C("Job Status", "status.jobStatus"),
            _C("Deployment Status", "status.jobDeploymentStatus"),
            _C("Ray Cluster Name", "status.rayClusterName"),
            _C("Start Time", "status.startTime"),
            _C("End Time", "status.endTime"),
            _AGE,
        ),
    ),
    _rt(
        "ray.io/v1",
        "rayclusters",
        "RayCluster",
        categories=("all",),
        columns=(
            _C("Desired Workers", "status.desiredWorkerReplicas", "integer"),
            _C("Available Workers", "status.availableWorkerReplicas", "integer"),
            _C("GPUs", "status.desiredGPU"),
            _C("Status", "status.state"),
            _AGE,
        ),
    ),
    # --- TauGrid
    _rt(
        "taugrid.io/v1alpha1",
        "tauruns",
        "TauRun",
        short_names=("tr",),
        categories=("taugrid",),
        columns=(
            _C("Phase", "status.phase"),
            _C("Profile", "spec.profile"),
            _C("Workers", "spec.workers", "integer"),
            _C("GPUs/Worker", "spec.gpusPerWorker", "integer"),
            _AGE,
        ),
    ),
    _rt(
        "taugrid.io/v1alpha1",
        "tauworkspaces",
        "TauWorkspace",
        short_names=("tw",),
        categories=("taugrid",),
        columns=(_C("Ready", "@cond:Ready"), _AGE),
    ),
    _rt(
        "taugrid.io/v1alpha1",
        "tauclusters",
        "TauCluster",
        namespaced=False,
        categories=("taugrid",),
        columns=(_C("Ready", "@cond:Ready"), _C("Last Resolved", "status.lastResolvedTime"), _AGE),
    ),
    # --- other training operators
    _rt(
        "kubeflow.org/v1",
        "pytorchjobs",
        "PyTorchJob",
        categories=("all", "kubeflow"),
        columns=(_C("State", "@last_condition"), _AGE),
    ),
    _rt(
        "jobset.x-k8s.io/v1alpha2",
        "jobsets",
        "JobSet",
        categories=("all",),
        columns=(_C("Restarts", "status.restarts", "integer"), _C("Completed", "@cond:Completed"), _AGE),
    ),
)


@dataclass(slots=True)
class Registry:
    """Resource types indexed for request routing and discovery."""

    types: Sequence[ResourceType] = DEFAULT_RESOURCES
    _by_path: dict[tuple[str, str, str], ResourceType] = field(init=False, default_factory=dict)
    _by_key: dict[str, ResourceType] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for rt in self.types:
            self._by_path[(rt.group, rt.version, rt.plural)] = rt
            self._by_key[rt.key] = rt
        for rt in self.types:
            if rt.storage_of and rt.storage_of not in self._by_key:
                raise ValueError(f"{rt.key}: storage_of {rt.storage_of!r} is not a registered type")

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The type served at `/api[s]/<group>/<version>/<plural>`, if any."""
        return self._by_path.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType:
        return self._by_key[key]

    def for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """The type for an object's apiVersion and kind (used by the scenario engine and clients)."""
        group, _, version = api_version.rpartition("/")
        for rt in self.types:
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None

    def groups(self) -> dict[str, list[str]]:
        """Group name → its versions in registration order (core group under "")."""
        out: dict[str, list[str]] = {}
        for rt in self.types:
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.types if rt.group == group and rt.version == version]

    def with_types(self, extra: Iterable[ResourceType]) -> Registry:
        """A new registry with `extra` types appended."""
        return Registry(types=(*self.types, *extra))
