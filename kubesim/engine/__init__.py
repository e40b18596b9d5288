"""The scenario engine: plays TauGrid, Kueue, KubeRay, the scheduler, the kubelet and the cluster
autoscaler against the simulator, through its HTTP API, on a (real, accelerated or manual) clock.

`ScenarioEngine` is assembled from one mixin per concern, each in its own module:

    core         the clock, the due-queue and step loop, the write helpers, Events, the truth
    setup        the cluster at time zero and each run's submission (TauRun, RayJob/Job, Workload)
    kueue        queue status, waiting for quota, admission
    controllers  KubeRay's RayJob/RayCluster controllers and the batch Job controller
    pods         pod objects and their status
    nodes        nodes, the scheduler, the cluster autoscaler, node loss, cluster actions
    kubelet      pulls, container start, crash loops and restarts
    training     progress lines, stalls, free-form logs
    lifecycle    preemption, success, failure, free-form events and patches
    restarts     restarts in place, by pod replacement and in process; resubmitted runs

More of the world (admission checks, MultiKueue, DRA, Karpenter, other trainers' lines) is in
kubesim/waits.py; a run's timeline step `do: X` calls the mixins' `_do_X`, else `waits.ACTIONS[X]`.
"""

from kubesim import waits
from kubesim.engine.restarts import Restarts
from kubesim.engine.setup import Submission
from kubesim.engine.state import (
    KUEUE_GV,
    QUEUE_LABEL,
    RAY_GV,
    RUN_LABEL,
    TAU_GV,
    NodeState,
    Obj,
    PodState,
    Ref,
    RunState,
)
from kubesim.engine.training import MEGATRON_LINE, Training
from kubesim.scenario import Step
from kubesim.truth import RunTruth, run_truth

__all__ = [
    "KUEUE_GV",
    "MEGATRON_LINE",
    "QUEUE_LABEL",
    "RAY_GV",
    "RUN_LABEL",
    "TAU_GV",
    "NodeState",
    "Obj",
    "PodState",
    "Ref",
    "RunState",
    "ScenarioEngine",
]


class ScenarioEngine(Submission, Training, Restarts):
    """Moves a scenario's runs through their lifecycle by writing to the simulator over HTTP.

    Tests call `step_to(seconds)` with a ManualClock (no sleeping); demos call `start()` (a thread)
    or `run()` with a real or accelerated clock. Writes are exempt from injected faults.
    """

    def _run_action(self, r: RunState, step: Step) -> None:
        handler = getattr(self, f"_do_{step.action}", None)
        if handler is None:
            waits.ACTIONS[step.action](self, r, step.args)
        else:
            handler(r, step.args)

    def truth(self) -> dict[tuple[str, str], RunTruth]:
        """What is really true of every submitted run now (the harness's ground truth)."""
        _ = self.origin
        return {key: run_truth(self, r) for key, r in self.runs.items() if r.submitted}
