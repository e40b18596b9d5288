"""The engine's state: constants, references to written objects, and what it knows of runs, pods
and nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubesim.scenario import NodeSpec, RunSpec

Obj = dict[str, Any]
RUN_LABEL = "taugrid.io/run"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAU_GV = "taugrid.io/v1alpha1"
KUEUE_GV = "kueue.x-k8s.io/v1beta1"
RAY_GV = "ray.io/v1"
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
    deleted: bool = False


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


@dataclass(slots=True)
class NodeState:
    spec: NodeSpec
    ref: Ref
    ready: bool = True
    gpus_used: int = 0
    ip: str = ""
