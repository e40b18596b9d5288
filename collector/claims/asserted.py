"""What a run's own status asserts, per root kind (DESIGN.md §3 `asserted`)."""

from __future__ import annotations

from dataclasses import dataclass

from collector.model import JobFacts, ObjectRecord, RayClusterFacts, RayJobFacts, TauRunFacts
from collector.timeunits import EPOCH


@dataclass(frozen=True, slots=True)
class Assertion:
    scheduled: bool | None
    running: bool | None
    progressing: bool | None
    finished: bool  # the root says the run is over (succeeded or failed)
    source: str  # the status field that asserted it, for evidence
    value: str

    @classmethod
    def silent(cls, source: str, value: str) -> Assertion:
        return cls(None, None, None, False, source, value)


_NOT_YET = (False, False, False)
_TAURUN_PHASES: dict[str, tuple[bool, bool, bool]] = {
    "Pending": _NOT_YET,
    "Admitted": _NOT_YET,
    "Scheduled": (True, False, False),
    "Running": (True, True, True),
    "Succeeded": _NOT_YET,
    "Failed": _NOT_YET,
}
_RAYJOB_DEPLOYMENT: dict[str, tuple[bool, bool, bool]] = {
    "": _NOT_YET,
    "New": _NOT_YET,
    "Initializing": _NOT_YET,
    "Waiting": _NOT_YET,
    "Retrying": _NOT_YET,
    "Suspending": _NOT_YET,
    "Suspended": _NOT_YET,
    "Running": (True, True, True),
    "Complete": _NOT_YET,
    "Failed": _NOT_YET,
    "ValidationFailed": _NOT_YET,
}
_TERMINAL_RAYJOB = frozenset({"Complete", "Failed", "ValidationFailed"})
# Training-operator job conditions, newest true one wins.
_OPERATOR_CONDITIONS: dict[str, tuple[bool, bool, bool]] = {
    "Created": _NOT_YET,
    "Suspended": _NOT_YET,
    "Running": (True, True, True),
    "Restarting": (True, False, False),
    "Succeeded": _NOT_YET,
    "Failed": _NOT_YET,
    "Completed": _NOT_YET,
    "Complete": _NOT_YET,
}
_TERMINAL_CONDITIONS = frozenset({"Succeeded", "Failed", "Completed", "Complete"})


def assertion_of(root: ObjectRecord) -> Assertion:
    f = root.facts
    if isinstance(f, TauRunFacts):
        return _taurun(root, f)
    if isinstance(f, RayJobFacts):
        triple = _RAYJOB_DEPLOYMENT.get(f.deployment_status)
        if triple is None:
            return Assertion.silent("status.jobDeploymentStatus", f.deployment_status)
        return Assertion(*triple, f.deployment_status in _TERMINAL_RAYJOB, "status.jobDeploymentStatus",
                         f.deployment_status or "(unset)")
    if isinstance(f, RayClusterFacts):
        up = f.state == "ready"
        if not f.state:
            return Assertion.silent("status.state", "")
        return Assertion(up, up, None, f.state == "failed", "status.state", f.state)
    if isinstance(f, JobFacts):
        return _job(root, f)
    return Assertion.silent("status", "")


def _taurun(root: ObjectRecord, f: TauRunFacts) -> Assertion:
    triple = _TAURUN_PHASES.get(f.phase)
    if triple is None:
        return Assertion.silent("status.phase", f.phase)
    scheduled, running, progressing = triple
    # A TauRun that reports progress explicitly asserts it; otherwise Running implies it.
    cond = root.condition("Progressing")
    if cond is not None and cond.status in ("True", "False"):
        progressing = cond.is_true
    return Assertion(scheduled, running, progressing, f.phase in ("Succeeded", "Failed"), "status.phase", f.phase)


def _job(root: ObjectRecord, f: JobFacts) -> Assertion:
    true_conditions = [c for c in root.conditions if c.is_true and c.type in _OPERATOR_CONDITIONS]
    # On equal times the condition listed later wins: operators append newer conditions.
    ranked = max(enumerate(true_conditions), key=lambda ic: (ic[1].last_transition or EPOCH, ic[0]), default=None)
    newest = ranked[1] if ranked else None
    if newest is not None and newest.type in _TERMINAL_CONDITIONS:
        return Assertion(*_NOT_YET, True, "status.conditions", newest.type)
    if f.suspended:
        return Assertion(*_NOT_YET, False, "spec.suspend", "true")
    if root.ref.kind not in ("Job", "JobSet") and newest is not None:
        return Assertion(*_OPERATOR_CONDITIONS[newest.type], False, "status.conditions", newest.type)
    # status.active counts Pending pods too: it asserts nothing about scheduling. status.ready
    # (pods, or child Jobs for a JobSet) is the only part of a Job's status that speaks of its pods.
    target = f.ready_expected if f.ready_expected is not None else f.expected_pods
    if f.ready is None or target is None:
        return Assertion.silent("status.active" if f.ready is None else "status.ready",
                                "" if f.active is None else f"{f.active} active")
    if target > 0 and f.ready >= target:
        return Assertion(True, True, True, False, "status.ready", f"{f.ready}/{target}")
    return Assertion(None, False, False, False, "status.ready", f"{f.ready}/{target}")
