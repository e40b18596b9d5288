"""Ground truth: what is really so of each run the scenario engine plays, at the engine's now.

The engine knows the cluster it plays (which pods are bound, which containers run, whether a step
was a valid update past the high-water mark), so it can say what the collector has to infer. This
is a Python side channel for the accuracy harness; nothing of it is written to the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubesim.engine import RunState, ScenarioEngine

STAGES = ("target-resolution", "queue-admission", "pod-scheduling", "device-allocation", "node-scaling")


@dataclass(frozen=True, slots=True)
class RunTruth:
    """The truth of one run. `stage` is the stage a run that is not scheduled waits in (None when scheduled)."""

    namespace: str
    name: str
    scheduled: bool
    running: bool
    progressing: bool
    stage: str | None
    worker_cluster: str = ""  # MultiKueue: the worker the run was dispatched to (it executes there)
    last_step: int = 0
    note: str = ""


def run_truth(engine: ScenarioEngine, r: RunState) -> RunTruth:
    spec = r.spec
    if r.dispatched:
        # Executes on the MultiKueue worker: scheduled, running and training there.
        return RunTruth(spec.namespace, spec.name, True, True, True, None, r.dispatched, r.hwm, "dispatched")
    expected = spec.workers + (1 if spec.kind == "RayJob" else 0)
    pods = [p for p in r.pods if not p.deleted] if r.admitted else []
    bound = [p for p in pods if p.node and p.phase not in ("Failed", "Succeeded")]  # rejected pods do not count
    scheduled = not r.finished and len(pods) == expected and len(bound) == expected
    nodes_ready = all(engine.nodes[p.node].ready for p in bound if p.node in engine.nodes)
    running = (
        scheduled
        and nodes_ready
        and not r.crash_looping
        and all(p.phase == "Running" and p.ready and "running" in p.state for p in pods)
    )
    # Progressing: a valid step past the high-water mark within one and a half step intervals, and
    # most steps are real updates (fp16 overflow skipping most steps is not progress).
    progressing = (
        r.last_advance is not None
        and r.every > 0
        and engine.elapsed - r.last_advance <= 1.5 * r.every + 1.0
        and r.skip_ratio <= 0.5
    )
    stage: str | None = None
    if not scheduled and not r.finished:
        stage = r.wait_stage or ("queue-admission" if not r.admitted else "pod-scheduling")
    notes = []
    if not nodes_ready:
        notes.append("node not ready")
    if r.crash_looping:
        notes.append("crash loop")
    if any(p.restarts for p in pods):
        notes.append(f"restarts {max(p.restarts for p in pods)}")
    if r.skipped:
        notes.append(f"skipped {r.skipped}")
    return RunTruth(
        spec.namespace, spec.name, scheduled, running, progressing, stage, "", r.hwm, ", ".join(notes)
    )
