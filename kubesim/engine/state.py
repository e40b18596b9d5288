"""The engine's state: constants, references to written objects, and what it knows of runs, pods
and nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubesim.gpus import GpuPlay
from kubesim.scenario import NodeSpec, RunSpec

Obj = dict[str, Any]
RUN_LABEL = "taugrid.io/run"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAU_GV = "taugrid.io/v1alpha1"
KUEUE_GV = "kueue.x-k8s.io/v1beta1"
RAY_GV = "ray.io/v1"
JOBSET_GV = "jobset.x-k8s.io/v1alpha2"
PYTORCH_GV = "kubeflow.org/v1"
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True, slots=True)
class Ref:
    """An object the engine wrote: enough to address it and to reference it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def owner(self, controller: bool = True) -> Obj:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
            "blockOwnerDeletion": True,
        }

    def involved(self, field_path: str = "") -> Obj:
        out: Obj = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}
        if self.namespace:
            out["namespace"] = self.namespace
        if field_path:
            out["fieldPath"] = field_path
        return out


@dataclass(slots=True)
class PodState:
    """What the kubelet knows about one pod of a run."""

    ref: Ref
    role: str  # head | worker | job
    index: int
    container: str
    image: str
    gpus: int
    node: str = ""
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    ip: str = ""
    restarts: int = 0
    state: Obj = field(default_factory=dict)
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    conditions: dict[str, Obj] = field(default_factory=dict)
    start_time: str = ""
    container_id: str = ""
    backoff: float = 10.0
    deleted: bool = False  # deletion requested: terminating (graceful) or gone; no longer the run's pod
    sidecar: str = ""  # the sidecar container's name ("" without one)
    sidecar_gen: int = 0  # bumped when the sidecar stops (ends its printing loop)
    sidecar_count: int = 0  # the sidecar's own counter
    sidecar_started: str = ""
    generation: int = 0  # the run's generation (resubmits) that created the pod
    gone: bool = False  # removed from the API
    log_max: int = 0  # the highest step its current log holds (the truth's view of where a mark is kept)


@dataclass(frozen=True, slots=True)
class Restart:
    """One restart of a run, for the truth: when, how, the high-water mark it had reached, and the
    logs (pod, container, "current" | "previous") that held that mark right after it."""

    at: float
    mode: str
    mark: int
    holders: tuple[tuple[str, str, str, str], ...]


@dataclass(slots=True)
class RunState:
    spec: RunSpec
    taurun: Ref | None = None
    root: Ref | None = None  # RayJob or Job
    workload: Ref | None = None
    raycluster: Ref | None = None
    pods: list[PodState] = field(default_factory=list)
    phase: str = "Pending"
    conditions: dict[str, Obj] = field(default_factory=dict)
    wl_conditions: dict[str, Obj] = field(default_factory=dict)
    admitted: bool = False
    finished: bool = False
    submitted: bool = False
    train_gen: int = 0
    crash_gen: int = 0
    iteration: int = 0
    job_id: str = ""
    started: str = ""
    # Ground truth the collector never sees (read by `truth()`): the stage the run waits in, the
    # highest step a valid update reached, when it was reached, and the cadence of steps.
    wait_stage: str = ""
    hwm: int = 0
    last_advance: float | None = None
    every: float = 0.0
    skipped: int = 0
    skip_ratio: float = 0.0
    dispatched: str = ""
    crash_looping: bool = False  # between crashes a container is briefly up: the run is still not running
    # Restarts and resubmits (kubesim/engine/restarts.py): the run's generation (a resubmit is a new
    # run: new uids, its own high-water mark), the pods of earlier generations, when training may print
    # again (a restart's checkpoint load, a pause), and each restart as the truth reports it.
    generation: int = 0
    old_pods: list[PodState] = field(default_factory=list)
    blocked_until: float = 0.0
    restarts: list[Restart] = field(default_factory=list)
    resubmitted_at: float | None = None
    job_failed: int = 0  # batch Job status.failed (replaced pods)
    restart_attempt: int = 0  # JobSet status.restarts
    child_job: Ref | None = None  # a JobSet's child Job
    root_conditions: dict[str, Obj] = field(default_factory=dict)  # a training-operator job's conditions
    print_which: str = ""  # the pods that print the run's steps (a `pods` selector)
    style: str = ""  # the trainer's line style
    forge: str = ""  # the trainer prints forged times ("+6h", "9999")
    resume_note: int = 0  # the checkpoint step the next printed step resumes from (after a restart)
    # A straggler (train `straggler`): its pod's name and each stretch (scenario seconds, end None while
    # it lasts) during which that rank was slower than the others (truth only).
    straggler_pod: str = ""
    straggling: list[list[float | None]] = field(default_factory=list)
    # Its pods' GPUs as NVML would read them (train `gpus`; kubesim/gpus.py): readings and truth.
    gpu_play: GpuPlay | None = None
    # Called after `submitted`, `admitted` or `finished` changes (QueueTally.track sets it), so the
    # queues' counts follow every write of those flags, wherever it happens.
    on_queue_change: Callable[[RunState], None] | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _QUEUE_FLAGS:
            hook = getattr(self, "on_queue_change", None)  # not yet set while __init__ runs
            if hook is not None:
                hook(self)


_QUEUE_FLAGS = frozenset({"submitted", "admitted", "finished"})


@dataclass(slots=True)
class QueueCount:
    """One Kueue queue's runs that are submitted and not finished, how many are admitted, and the
    GPUs the admitted ones hold."""

    active: int = 0
    admitted: int = 0
    gpus: int = 0


class QueueTally:
    """Every ClusterQueue's and LocalQueue's QueueCount, kept current as runs change, so that a
    queue status sync (on each submission, admission, preemption and finish) reads counts instead
    of recounting every run: O(queues) per sync, not O(queues x runs)."""

    def __init__(self) -> None:
        self.cluster: dict[str, QueueCount] = {}  # by ClusterQueue name
        self.local: dict[tuple[str, str], QueueCount] = {}  # by (namespace, LocalQueue name)
        self._counted: dict[tuple[str, str], tuple[bool, bool]] = {}  # run -> (active, admitted) folded in

    def track(self, r: RunState) -> None:
        """Count `r` as it is now, and from now on as it changes."""
        r.on_queue_change = self.update
        self.update(r)

    def update(self, r: RunState) -> None:
        """Fold a change of `r`'s flags into its queues' counts (nothing when its standing is the same)."""
        spec = r.spec
        active = r.submitted and not r.finished
        admitted = active and r.admitted
        key = (spec.namespace, spec.name)
        was_active, was_admitted = self._counted.get(key, (False, False))
        if active == was_active and admitted == was_admitted:
            return
        self._counted[key] = (active, admitted)
        d_active, d_admitted = int(active) - int(was_active), int(admitted) - int(was_admitted)
        gpus = spec.workers * spec.gpus_per_worker
        for count in (
            self.cluster.setdefault(spec.cluster_queue, QueueCount()),
            self.local.setdefault((spec.namespace, spec.queue), QueueCount()),
        ):
            count.active += d_active
            count.admitted += d_admitted
            count.gpus += d_admitted * gpus


@dataclass(slots=True)
class NodeState:
    spec: NodeSpec
    ref: Ref
    ready: bool = True  # what the API says (the node controller's view)
    gpus_used: int = 0
    ip: str = ""
    alive: bool = True  # the truth: the machine and its kubelet are up
    dead_at: float | None = None
    registered: float = 0.0  # scenario seconds
    lease: Ref | None = None
    lease_phase: float = 0.0  # the kubelet's renew ticks fall at registered + phase + 10 s * k
    lease_at: float = -1.0  # the tick last written
    status_phase: float = 0.0  # status reports at registered + phase + report * k
    status_at: float = -1.0
    heartbeat: str = ""  # lastHeartbeatTime last posted (the node's clock)
    transition: str = ""  # lastTransitionTime of Ready
    capacity: Obj | None = None
