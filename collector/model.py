"""The records every layer shares: normalized objects, evidence, claims.

Raw Kubernetes JSON never travels past `collector.kube.normalize`; everything after it sees
these frozen dataclasses, holding only the fields the claims need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from collector.queuefacts import QueueStatus

if TYPE_CHECKING:
    from collector.riskfacts import WorkAtRisk


class Plane(StrEnum):
    """Evidence planes (DESIGN.md §2); each is trusted only for its own scope."""

    TAUGRID = "taugrid"
    KUBERNETES = "kubernetes"
    KUEUE = "kueue"
    KUBERAY = "kuberay"
    RAY = "ray"
    GPU = "gpu"
    LOGS = "logs"
    EXPSTORE = "expstore"


class Observed(StrEnum):
    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


class Verdict(StrEnum):
    VERIFIED = "verified"
    CONTRADICTED = "contradicted"
    UNCONFIRMED = "unconfirmed"
    AHEAD = "ahead"
    PENDING = "pending"
    UNASSERTED = "unasserted"


def verdict_for(asserted: bool | None, observed: Observed) -> Verdict:
    """The verdict table of DESIGN.md §3: status claim against independent evidence."""
    if asserted is None:
        return Verdict.UNASSERTED
    if asserted:
        return _ASSERTED_VERDICTS[observed]
    return Verdict.AHEAD if observed is Observed.TRUE else Verdict.PENDING


_ASSERTED_VERDICTS = {
    Observed.TRUE: Verdict.VERIFIED,
    Observed.FALSE: Verdict.CONTRADICTED,
    Observed.UNKNOWN: Verdict.UNCONFIRMED,
}


class Stage(StrEnum):
    """The seed's five stages a not-yet-scheduled run can wait in, in pipeline order."""

    TARGET_RESOLUTION = "target-resolution"
    QUEUE_ADMISSION = "queue-admission"
    POD_SCHEDULING = "pod-scheduling"
    DEVICE_ALLOCATION = "device-allocation"
    NODE_SCALING = "node-scaling"
    # MultiKueue (issue 14): waiting for a worker to take the run, or dispatched but not admitted there.
    MULTICLUSTER_DISPATCH = "multicluster-dispatch"

    @property
    def owner(self) -> str:
        return _STAGE_OWNERS[self]


_STAGE_OWNERS = {
    Stage.TARGET_RESOLUTION: "TauGrid",
    Stage.QUEUE_ADMISSION: "Kueue",
    Stage.POD_SCHEDULING: "Kubernetes",
    Stage.DEVICE_ALLOCATION: "Device plugin or DRA",
    Stage.NODE_SCALING: "Cluster infrastructure",
    Stage.MULTICLUSTER_DISPATCH: "MultiKueue",
}


# --- object identity -------------------------------------------------------------------------


class Ref(NamedTuple):
    """Identity of one Kubernetes object; namespace is "" for cluster-scoped kinds."""

    kind: str
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else f"{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    controller: bool


class Condition(NamedTuple):
    """A status condition. A NamedTuple, not a frozen dataclass: built per condition per watch event."""

    type: str
    status: str  # "True" | "False" | "Unknown" (kept verbatim: odd values are evidence too)
    reason: str = ""
    message: str = ""
    last_transition: datetime | None = None

    @property
    def is_true(self) -> bool:
        return self.status == "True"


# --- per-kind facts: only what the claims read ------------------------------------------------


class ContainerFacts(NamedTuple):
    """One container's status. A NamedTuple: built per container per watch event, 2.5× cheaper."""

    name: str
    init: bool
    ready: bool
    restart_count: int
    state: str  # "waiting" | "running" | "terminated" | "" (no status yet)
    state_reason: str = ""
    state_message: str = ""
    state_since: datetime | None = None
    exit_code: int | None = None
    last_reason: str = ""  # lastState.terminated.reason, e.g. OOMKilled
    last_exit_code: int | None = None
    last_finished: datetime | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an unbound pod may run: its nodeSelector, required node affinity and tolerations (kept
    for unbound pods only: whose wait a short node explains depends on it)."""

    selector: tuple[tuple[str, str], ...] = ()
    # requiredDuringScheduling nodeSelectorTerms: any term, all of its (key, operator, values)
    terms: tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...] = ()
    tolerations: tuple[tuple[str, str, str, str], ...] = ()  # (key, operator, value, effect)


class PodFacts(NamedTuple):
    phase: str
    reason: str
    message: str
    node_name: str
    gpus: int  # nvidia.com/gpu (and other */gpu) requested by app containers
    start_time: datetime | None
    containers: tuple[ContainerFacts, ...]
    deleting: bool = False
    ray_node_type: str = ""  # "head" | "worker" | "" from ray.io/node-type
    pod_ip: str = ""
    # DRA: the ResourceClaims this pod uses (status.resourceClaimStatuses names, else spec names).
    claims: tuple[str, ...] = ()
    # Devices the kubelet reports unhealthy (containerStatuses[].allocatedResourcesStatus, k8s >= 1.36):
    # "resource name: device id".
    unhealthy_devices: tuple[str, ...] = ()
    scheduling_gates: tuple[str, ...] = ()  # spec.schedulingGates names (e.g. kueue.x-k8s.io/topology)
    # Its place in the run, from the labels its controller sets (`kube.pod_identity`): a replacement pod
    # (Job restartPolicy Never, JobSet, PyTorchJob, Ray worker recreation) takes its predecessor's role
    # and rank, so its progress continues that rank's signal. rank "": the role's members are alike.
    role: str = ""
    rank: str = ""
    attempt: int = 0  # JobSet's restart attempt (jobset.sigs.k8s.io/restart-attempt)
    # App containers that request no GPU in a pod where another does (log shippers, metrics sidecars):
    # whatever they print is not the trainer's progress.
    helpers: tuple[str, ...] = ()
    placement: Placement | None = None  # unbound pods only

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class AdmissionCheck:
    name: str
    state: str
    message: str = ""
    last_transition: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    queue_name: str
    cluster_queue: str  # from status.admission; "" while not admitted
    admission_checks: tuple[AdmissionCheck, ...] = ()
    pod_count: int | None = None  # sum of spec.podSets[].count
    cluster_name: str = ""  # MultiKueue: the worker cluster it was dispatched to (status.clusterName)
    active: bool = True  # spec.active (false: deactivated by its user, or by Kueue past its requeuing limit)
    gated_by: str = ""  # metadata.annotations[kueue.x-k8s.io/admission-gated-by]: controllers holding admission
    priority: int | None = None  # spec.priority (Kueue orders a queue by it, then by age)
    requests: tuple[tuple[str, float], ...] = ()  # resource → total over spec.podSets (count × pod requests)


@dataclass(frozen=True, slots=True)
class AdmissionCheckFacts:
    """kueue.x-k8s.io AdmissionCheck: which controller decides it (what the check is, not its name)."""

    controller_name: str


@dataclass(frozen=True, slots=True)
class ResourceClaimFacts:
    """resource.k8s.io ResourceClaim: allocated or not, and for whom."""

    allocated: bool  # status.allocation present


@dataclass(frozen=True, slots=True)
class NodeClaimFacts:
    """karpenter.sh NodeClaim: the node Karpenter is launching (conditions hold Launched/Registered/...)."""

    node_name: str  # status.nodeName once registered
    node_pool: str  # karpenter.sh/nodepool label


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """LocalQueue or ClusterQueue."""

    cluster_queue: str = ""  # LocalQueue spec.clusterQueue
    pending: int | None = None
    admitted: int | None = None
    # ClusterQueue: (flavor, resource, amount) from spec.resourceGroups' nominalQuota and status.flavorsReservation
    quota: tuple[tuple[str, str, float], ...] = ()
    reserved: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class RayJobFacts:
    deployment_status: str
    job_status: str
    message: str
    cluster_name: str
    expected_pods: int | None
    start_time: datetime | None
    end_time: datetime | None
    job_id: str = ""  # the Ray job's submission id
    managed_by: str = ""  # spec.managedBy (kueue.x-k8s.io/multikueue: runs on a worker cluster)
    dashboard_url: str = ""  # host:port of the head's dashboard (KubeRay status)


@dataclass(frozen=True, slots=True)
class RayClusterFacts:
    state: str
    expected_pods: int | None
    ready_workers: int | None
    desired_workers: int | None
    head_service: str = ""
    dashboard_port: str = ""
    metrics_port: str = ""
    autoscaling: bool = False  # spec.enableInTreeAutoscaling: workers may be added at any time


@dataclass(frozen=True, slots=True)
class JobFacts:
    """batch Job, JobSet, PyTorchJob and other training-operator jobs."""

    suspended: bool
    active: int | None
    ready: int | None
    succeeded: int | None
    failed: int | None
    expected_pods: int | None
    start_time: datetime | None
    managed_by: str = ""  # spec.managedBy (kueue.x-k8s.io/multikueue: runs on a worker cluster)
    ready_expected: int | None = None  # what `ready` counts up to (pods; child Jobs for a JobSet)


@dataclass(frozen=True, slots=True)
class TauRunFacts:
    phase: str
    profile: str
    workers: int | None
    gpus_per_worker: int | None
    ray_job: str
    workload: str
    cluster: str  # MultiKueue worker it was dispatched to, if any
    checkpoints: str = ""  # Expstore URI of its checkpoints (local path or Azure Blob prefix)


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    name: str
    local_queue: str
    cluster_queue: str
    workers: int | None
    gpus_per_worker: int | None


@dataclass(frozen=True, slots=True)
class TauClusterFacts:
    observed_generation: int | None
    last_resolved: datetime | None
    profiles: tuple[str, ...]  # declared in spec.workloadProfiles
    resolved: tuple[ResolvedProfile, ...]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    ready: str  # Ready condition status, verbatim
    gpu_capacity: int
    gpu_allocatable: int
    ready_reason: str = ""  # e.g. NodeStatusUnknown (the kubelet stopped posting status)
    ready_message: str = ""
    ready_since: datetime | None = None
    unschedulable: bool = False  # cordoned (spec.unschedulable): bundles capture before a drain
    # The newest lastHeartbeatTime of its conditions: the kubelet posts status at least every
    # nodeStatusReportFrequency (5 min) while it lives, so it bounds a dump's capture time.
    heartbeat: datetime | None = None
    # Kept only for a node advertising fewer GPUs than installed (the one question they answer: could
    # the pod waiting for GPUs run here at all?).
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)


@dataclass(frozen=True, slots=True)
class EventFacts:
    type: str
    reason: str
    message: str
    regarding: Ref  # involvedObject (core/v1) or regarding (events.k8s.io/v1)
    component: str
    first: datetime | None
    last: datetime | None
    count: int


Facts = (
    PodFacts
    | WorkloadFacts
    | QueueFacts
    | RayJobFacts
    | RayClusterFacts
    | JobFacts
    | TauRunFacts
    | TauClusterFacts
    | NodeFacts
    | EventFacts
    | AdmissionCheckFacts
    | ResourceClaimFacts
    | NodeClaimFacts
    | None
)


class ObjectRecord(NamedTuple):
    """One Kubernetes object, normalized at `collector.kube.normalize`.

    A NamedTuple rather than a frozen dataclass: one is built per watch event, and a tuple is
    built in C (frozen dataclasses set each field through object.__setattr__).
    """

    ref: Ref
    api_version: str
    resource_version: str
    generation: int | None
    created: datetime | None
    labels: Mapping[str, str]
    owners: tuple[OwnerRef, ...]
    conditions: tuple[Condition, ...]
    facts: Facts
    newest: datetime | None  # the latest timestamp anywhere in the object (dump clock default)

    def condition(self, type_: str) -> Condition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def controller(self) -> OwnerRef | None:
        for o in self.owners:
            if o.controller:
                return o
        return self.owners[0] if self.owners else None


# --- claims ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evidence:
    plane: Plane
    ref: str
    field: str
    value: Any  # JSON-safe scalar or short list
    at: datetime | None
    cluster: str = ""  # multi-cluster runs: the cluster it was read from; "" in single-cluster use

    def to_json(self) -> dict[str, Any]:
        out = {
            "plane": self.plane.value,
            "ref": self.ref,
            "field": self.field,
            "value": self.value,
            "at": rfc3339(self.at),
        }
        if self.cluster:
            out["cluster"] = self.cluster
        return out


@dataclass(frozen=True, slots=True)
class Claim:
    asserted: bool | None
    observed: Observed
    verdict: Verdict
    since: datetime | None
    reason: str
    evidence: tuple[Evidence, ...] = ()
    # Why, as a fixed word for programs (alerts, ADX, the GPU notes): the reason is for people and
    # its wording may change. Progressing false: stalled | hung | replaying | skipped-steps |
    # invalid-steps | not-running | finished; "" otherwise.
    cause: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "asserted": self.asserted,
            "observed": self.observed.value,
            "verdict": self.verdict.value,
            "since": rfc3339(self.since),
            "reason": self.reason,
            "cause": self.cause,
            "evidence": [e.to_json() for e in self.evidence],
        }


@dataclass(frozen=True, slots=True)
class Blocked:
    stage: Stage
    reason: str
    since: datetime | None
    evidence: tuple[Evidence, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "owner": self.stage.owner,
            "reason": self.reason,
            "since": rfc3339(self.since),
            "evidence": [e.to_json() for e in self.evidence],
        }


CLAIM_NAMES = ("scheduled", "running", "progressing")
# "unobserved": allocated time before the first evidence read (a log tail starts after it)
BADPUT_CAUSES = ("queued", "unobserved", "starting", "stalled", "restarting", "replaying")


@dataclass(frozen=True, slots=True)
class Goodput:
    allocated_s: float  # since every expected pod was bound (the run holds its GPUs)
    productive_s: float
    badput_s: dict[str, float]  # by cause; "queued" lies before allocation, the rest inside it
    ratio: float | None  # productive / allocated; None without a dated progress signal
    # What moves with the clock until the run's claims next change (`RunClaims.recheck_at`): the bucket
    # ("productive" or a badput cause; "" for none) that gains a second a second since `accrues_from`,
    # from `accrues_base` seconds; when the allocation began; whether `ratio` is productive over
    # allocated (else it stays as it is). `at(later)` is what an evaluation then would give, to the
    # bit: exporters render the figures at their own clock instead of re-evaluating every run for it.
    accrues: str = ""
    accrues_base: float = 0.0
    accrues_from: datetime | None = None
    allocated_from: datetime | None = None
    rated: bool = False

    def at(self, now: datetime) -> Goodput:
        """The figures at `now` (not before the evaluation, not past the claims' `recheck_at`)."""
        if not self.accrues and self.allocated_from is None:
            return self
        allocated = self.allocated_s if self.allocated_from is None else elapsed_s(now - self.allocated_from)
        productive, bad = self.productive_s, self.badput_s
        if self.accrues and self.accrues_from is not None:
            value = self.accrues_base + elapsed_s(now - self.accrues_from)
            if self.accrues == "productive":
                productive = value
            else:
                bad = {**bad, self.accrues: value}
        ratio = (productive / allocated if allocated > 0 else None) if self.rated else self.ratio
        return replace(self, allocated_s=allocated, productive_s=productive, badput_s=bad, ratio=ratio)

    def frozen(self) -> Goodput:
        """The figures as they are, growing no more (claims that turned unknown: no time is counted
        that nobody saw)."""
        if not self.accrues and self.allocated_from is None:
            return self
        return replace(self, accrues="", accrues_base=0.0, accrues_from=None, allocated_from=None, rated=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "allocated_seconds": round(self.allocated_s, 1),
            "productive_seconds": round(self.productive_s, 1),
            "badput_seconds": {k: round(v, 1) for k, v in self.badput_s.items()},
        }


def elapsed_s(d: timedelta) -> float:
    """`d` in seconds, 0 for a negative one (a stamp ahead of the clock: no time has passed yet)."""
    return max(0.0, d.total_seconds())


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank (or pod) that is consistently behind its run's others, or a GPU whose readings sit
    apart from its run's other GPUs while the run is slower than its own baseline."""

    kind: str  # "rank" | "gpu"
    rank: str  # the rank ("3"), or the pod's rank/stream where ranks are pods; "" for a GPU
    pod: str
    node: str
    lag_ratio: float  # how much slower per step than its peers (0.12: 12 %); a GPU: the run's slowdown
    since: datetime | None  # the first step (reading) of the stretch it has been behind (apart) for
    basis: str  # "arrival" (last to print each step), "pace" (its own steps take longer), "gpu-spread"
    evidence: str  # what shows it, for a human
    lag_s: float | None = None  # seconds behind per step
    gpu: str = ""  # GPU UUID (kind "gpu")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "rank": self.rank, "pod": self.pod, "node": self.node, "gpu": self.gpu or None,
            "lag_ratio": round(self.lag_ratio, 4), "lag_seconds": None if self.lag_s is None else round(self.lag_s, 3),
            "since": rfc3339(self.since), "basis": self.basis, "evidence": self.evidence,
        }


@dataclass(frozen=True, slots=True)
class Stragglers:
    """Who holds a run back, from outside the trainer: suspects (empty: none named) and why."""

    suspects: tuple[Straggler, ...]
    compared: int  # ranks (or GPUs) compared
    steps: int  # steps compared
    reason: str  # the suspects in words, or why none is named
    untrusted: tuple[str, ...] = ()  # GPU readings not to be believed ("<uuid>: why")

    def to_json(self) -> dict[str, Any]:
        return {"suspects": [x.to_json() for x in self.suspects], "compared": self.compared, "steps": self.steps,
                "reason": self.reason, "untrusted_readings": list(self.untrusted)}


@dataclass(frozen=True, slots=True)
class Energy:
    """Energy per step from NVML's total energy counters over the run's GPUs (`claims.energy`):
    `joules_per_step` None when unknown, and `reason` says why."""

    joules_per_step: float | None
    watts: float | None  # the run's GPUs together, mean over their windows
    gpus: int  # GPUs counted (or seen, when unknown)
    steps: float | None  # steps advanced over the windows (median over the GPUs')
    window_s: float | None  # the windows' median length
    reason: str
    # the run's watts over the tokens/s its trainer printed (per GPU × GPUs): None where it prints none
    joules_per_token: float | None = None

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, n: int) -> float | None:
            return None if x is None else round(x, n)

        return {"joules_per_step": r(self.joules_per_step, 1), "watts": r(self.watts, 1), "gpus": self.gpus,
                "steps": r(self.steps, 2), "window_seconds": r(self.window_s, 1),
                "joules_per_token": r(self.joules_per_token, 6), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class RunClaims:
    """The verdicts for one run at one instant: what exporters receive."""

    ref: Ref
    scheduled: Claim
    running: Claim
    progressing: Claim
    blocked: Blocked | None
    evaluated_at: datetime
    finished: bool = False  # the root reached a terminal state
    goodput: Goodput | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. queue, workers: context for humans
    # The earliest later instant at which these claims could change with no new evidence (a freshness
    # bound, stall or restart window passing): the live controller re-evaluates the run then. None: never.
    recheck_at: datetime | None = None
    # The earliest of those that is not a stall window of a progress stream's newest step (`Clock.other`),
    # which a newer step moves later: until then a node agent's increment that only carries the run's
    # one progress log on may wait for the run's next evaluation (collector/changes.py `_deferred`).
    recheck_other: datetime | None = None
    queue: QueueStatus | None = None  # blocked in queue admission: its place in the queue, an admission estimate
    # Stragglers and fail-slow GPUs (`claims.stragglers`): None where there was nothing to compare.
    stragglers: Stragglers | None = None
    # GPU-hours since the last durable checkpoint and the risk of the nodes under it (`claims.workrisk`);
    # None for a finished run or one that holds no GPUs.
    work_at_risk: WorkAtRisk | None = None
    # Energy per step from the GPUs' energy counters (`claims.energy`): None without GPU evidence.
    energy: Energy | None = None

    @property
    def claims(self) -> dict[str, Claim]:
        return {"scheduled": self.scheduled, "running": self.running, "progressing": self.progressing}

    def at(self, now: datetime) -> RunClaims:
        """These claims with the figures that grow with the clock (goodput, work at risk) carried to
        `now`: what an evaluation at `now` would give while `now` is before `recheck_at` (after it, the
        claims themselves may have changed: the controller re-evaluates the run then)."""
        if now <= self.evaluated_at:
            return self
        g = self.goodput.at(now) if self.goodput is not None else None
        w = self.work_at_risk.at(now) if self.work_at_risk is not None else None
        if g is self.goodput and w is self.work_at_risk:
            return self
        return replace(self, goodput=g, work_at_risk=w)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "kind": self.ref.kind,
            "uid": self.ref.uid,
            "finished": self.finished,
            "claims": {k: c.to_json() for k, c in self.claims.items()},
            "blocked": self.blocked.to_json() if self.blocked else None,
            "goodput": self.goodput.to_json() if self.goodput else None,
            "stragglers": self.stragglers.to_json() if self.stragglers else None,
            "work_at_risk": self.work_at_risk.to_json() if self.work_at_risk else None,
        }
        if self.energy is not None:
            out["energy"] = self.energy.to_json()
        if self.extra:
            out["context"] = dict(self.extra)
        if self.queue is not None:
            out["queue"] = self.queue.to_json()
        return out


def rfc3339(t: datetime | None) -> str | None:
    if t is None:
        return None
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t.microsecond == 0 else t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
