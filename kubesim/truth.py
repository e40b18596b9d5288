"""Ground truth: what is really so of each run the scenario engine plays, at the engine's now.

The engine knows the cluster it plays (which pods are bound, which containers run, whether a step
was a valid update past the high-water mark), so it can say what the collector has to infer. This
is a Python side channel for the accuracy harness; nothing of it is written to the API.

The rule the collector is held to:

- scheduled: every pod doing the run's work (RayJob: head and workers; the other kinds: their
  workers) exists, is not being deleted, and is bound; the stage a run that is not scheduled waits in.
- running: all of them Running and Ready, no crash loop in effect, and their machines up (a node
  whose kubelet went silent is down from that instant, whatever the API still says).
- progressing: a valid update (not a skipped step) past the run's high-water mark within 1.5 step
  intervals, with at most half the steps skipped. The mark is the run's, across every restart of any
  kind (ranks step together: collectives tie them), so steps replayed after a restart are never
  progress; a resubmitted run (deleted and created again: new uids) is a new run whose mark starts
  afresh. A pause, a stall, a replay, skipped steps: all false.

A claim observed `true` where the truth is false is an error, except within the detection latency a
collector cannot avoid (`Tolerance`): right after the last valid advance, up to its largest stall
window plus a scrape; right after a node goes silent, until its Lease has expired and been seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubesim.engine import RunState, ScenarioEngine

STAGES = ("target-resolution", "queue-admission", "pod-scheduling", "device-allocation", "node-scaling")


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How late a collector may be to see a claim turn false (seconds). The harness fills these from
    the collector's ClaimSettings; the defaults are those settings' defaults."""

    stall_floor: float = 60.0
    stall_ceiling_multiplier: float = 10.0
    stall_window_max: float = 1800.0
    scrape_interval: float = 15.0
    slack: float = 2.0
    lease_duration: float = 40.0  # a node Lease's leaseDurationSeconds
    lease_renew: float = 10.0  # how often a kubelet renews it

    def progress_edge(self, every: float) -> float:
        """Past this long after the last valid advance, `progressing` observed true is an error."""
        window = max(self.stall_floor, min(self.stall_ceiling_multiplier * every, self.stall_window_max))
        return window + self.scrape_interval + self.slack

    def node_edge(self) -> float:
        """Past this long after a node went silent, `running` observed true is an error: its last renewal
        may be a renew interval before it went, the newest stamp a renew interval before capture."""
        return self.lease_duration + self.lease_renew + self.scrape_interval + self.slack


@dataclass(frozen=True, slots=True)
class RestartFact:
    """One restart of the run: how long ago, how, the mark it had reached, and the logs that held the
    mark right after it ((pod, pod uid, container, "current" | "previous"))."""

    ago: float
    mode: str
    mark: int
    holders: tuple[tuple[str, str, str, str], ...]


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
    # The facts behind the verdicts, for the harness's tolerance and its report.
    since_advance: float | None = None  # seconds since the last valid advance (None: never)
    every: float = 0.0  # the nominal step interval
    skip_ratio: float = 0.0
    down_for: float | None = None  # seconds since the first of its nodes went silent (None: all up)
    running_blockers: tuple[str, ...] = ()  # why running is false: unscheduled, not-ready, crash-loop, node-down
    restarts: tuple[RestartFact, ...] = ()
    generation: int = 0  # resubmits so far
    pods: tuple[tuple[str, str, str], ...] = ()  # (pod, uid, node) doing the run's work
    old_pods: tuple[tuple[str, str], ...] = ()  # (pod, uid) of earlier pods (replaced, terminating, failed)
    printers: tuple[str, ...] = ()  # uids of the pods whose logs carry the run's steps
    style: str = ""  # the trainer's line style

    def true_is_error(self, claim: str, tol: Tolerance) -> bool:
        """Whether `claim` observed true is an error, with the detection latency a collector is allowed."""
        if claim == "scheduled":
            return not self.scheduled
        if claim == "running":
            if self.running:
                return False
            latent = self.running_blockers == ("node-down",) and self.down_for is not None
            return not (latent and self.down_for is not None and self.down_for <= tol.node_edge())
        if self.progressing:
            return False
        if self.skip_ratio > 0.5 or self.since_advance is None or self.every <= 0:
            return True
        return self.since_advance > tol.progress_edge(self.every)

    def in_tolerance(self, claim: str, tol: Tolerance) -> bool:
        """False, but still inside the detection latency (an observed true is not an error yet)."""
        return not getattr(self, claim) and not self.true_is_error(claim, tol)


def run_truth(engine: ScenarioEngine, r: RunState) -> RunTruth:
    spec = r.spec
    if r.dispatched:
        # Executes on the MultiKueue worker: scheduled, running and training there.
        return RunTruth(spec.namespace, spec.name, True, True, True, None, r.dispatched, r.hwm, "dispatched")
    now = engine.elapsed
    expected = spec.workers + (1 if spec.kind == "RayJob" else 0)
    pods = [p for p in r.pods if not p.deleted] if r.admitted else []
    bound = [p for p in pods if p.node and p.phase not in ("Failed", "Succeeded")]  # rejected pods do not count
    scheduled = not r.finished and len(pods) == expected and len(bound) == expected
    down = [engine.nodes[p.node].dead_at for p in bound if p.node in engine.nodes and not engine.nodes[p.node].alive]
    down_for = now - min(t for t in down if t is not None) if any(t is not None for t in down) else None
    blockers = []
    if not scheduled:
        blockers.append("unscheduled")
    if down:
        blockers.append("node-down")
    if r.crash_looping:
        blockers.append("crash-loop")
    on_dead = {p.ref.uid for p in pods if p.node in engine.nodes and not engine.nodes[p.node].alive}
    # Pods on a lost node are down with it ("node-down"); the others must all be up.
    if not all(p.ref.uid in on_dead or (p.phase == "Running" and p.ready and "running" in p.state) for p in pods):
        blockers.append("not-ready")
    running = not blockers
    # Progressing: a valid step past the high-water mark within one and a half step intervals, and
    # most steps are real updates (fp16 overflow skipping most steps is not progress).
    since = None if r.last_advance is None else now - r.last_advance
    progressing = since is not None and r.every > 0 and since <= 1.5 * r.every + 1.0 and r.skip_ratio <= 0.5
    stage: str | None = None
    if not scheduled and not r.finished:
        stage = r.wait_stage or ("queue-admission" if not r.admitted else "pod-scheduling")
    notes = []
    if down:
        notes.append("node down")
    if r.crash_looping:
        notes.append("crash loop")
    if any(p.restarts for p in pods):
        notes.append(f"restarts {max(p.restarts for p in pods)}")
    if r.skipped:
        notes.append(f"skipped {r.skipped}")
    printers = tuple(p.ref.uid for p in engine._pods(r, r.print_which or "head")) if r.print_which else ()
    return RunTruth(
        spec.namespace,
        spec.name,
        scheduled,
        running,
        progressing,
        stage,
        "",
        r.hwm,
        ", ".join(notes),
        since_advance=since,
        every=r.every,
        skip_ratio=r.skip_ratio,
        down_for=down_for,
        running_blockers=tuple(blockers),
        restarts=tuple(RestartFact(now - x.at, x.mode, x.mark, x.holders) for x in r.restarts),
        generation=r.generation,
        pods=tuple((p.ref.name, p.ref.uid, p.node) for p in pods),
        old_pods=tuple((p.ref.name, p.ref.uid) for p in r.old_pods),
        printers=printers,
        style=r.style,
    )
