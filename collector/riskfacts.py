"""Work at risk records (`claims.workrisk`): what a failure now would throw away, and the nodes under a run
with their risk signals. Carried on `RunClaims.work_at_risk`; kept apart from `collector.model` for size."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from collector.model import rfc3339


@dataclass(frozen=True, slots=True)
class NodeRisk:
    """One node under a run, with the risk signals the evidence shows on it (`claims.workrisk`)."""

    node: str
    score: float  # 0-100: how urgently to drain it (0: no signal seen)
    signals: tuple[str, ...]  # fixed words: not-ready, gpu-lost, xid-79, cordoned, not-ready-recently, ...
    reasons: tuple[str, ...]  # the same, for a human, with the evidence
    gpus: int  # the run's GPUs on it
    gpu_hours: float | None  # the run's GPU-hours at risk on it; None: unknown

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "score": round(self.score, 1), "signals": list(self.signals),
                "reasons": list(self.reasons), "gpus": self.gpus,
                "gpu_hours_at_risk": None if self.gpu_hours is None else round(self.gpu_hours, 3)}


# An evaluation builds a NodeRisk per node under the run (8 for a run of 64 GPUs), on every watch event
# that touches it: the generated frozen __init__ (~0.5 us) was a twentieth of a run's evaluation.
# new_node_risk sets the slots themselves (~0.3 us), the same object field for field
# (tests/claims/test_workrisk.py checks NODE_RISK_FIELDS against the class).
NODE_RISK_FIELDS = ("node", "score", "signals", "reasons", "gpus", "gpu_hours")
_set_node, _set_score, _set_signals, _set_reasons, _set_gpus, _set_gpu_hours = (
    getattr(NodeRisk, name).__set__ for name in NODE_RISK_FIELDS
)


def new_node_risk(node: str, score: float, signals: tuple[str, ...], reasons: tuple[str, ...], gpus: int,
                  gpu_hours: float | None) -> NodeRisk:
    """NodeRisk(node, score, signals, reasons, gpus, gpu_hours), built faster."""
    x = object.__new__(NodeRisk)
    _set_node(x, node)
    _set_score(x, score)
    _set_signals(x, signals)
    _set_reasons(x, reasons)
    _set_gpus(x, gpus)
    _set_gpu_hours(x, gpu_hours)
    return x


def gpu_hours(since: datetime, now: datetime, gpus: int) -> float:
    """GPU-hours of `gpus` GPUs from `since` to `now` (0 before `since`)."""
    return max(0.0, (now - since).total_seconds()) / 3600 * gpus


def at_risk_reason(hours: float, why: str) -> str:
    """A known work at risk's reason: the figure, then why it counts from where it does."""
    return f"{hours:.1f} GPU-hours at risk: {why}"


@dataclass(frozen=True, slots=True)
class WorkAtRisk:
    """GPU-hours a failure now would throw away: the run's GPUs times the time since its last durable
    checkpoint (or since its pods started, when they started later), joined with its nodes' risk."""

    gpu_hours: float | None  # None: unknown (no checkpoint evidence, a stale listing, a stamp from the future)
    gpus: int
    since: datetime | None  # where the work at risk starts
    basis: str  # "checkpoint" | "run-start" (the listing is fresh and holds none yet) | "" (unknown)
    reason: str
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    nodes: tuple[NodeRisk, ...] = ()
    missing: tuple[str, ...] = ()  # node risk signals the evidence cannot show
    grows: bool = True  # with the clock from `since` (False: as last evaluated, e.g. claims turned unknown)

    def at(self, now: datetime) -> WorkAtRisk:
        """The figures at `now` (not before the evaluation, not past the claims' `recheck_at`): GPU-hours
        grow with the clock from `since` (an evaluation notes `since` as a deadline while it is ahead), the
        nodes' shares and order with them; what an evaluation then would give, to the bit."""
        if self.gpu_hours is None or self.since is None or not self.grows:
            return self
        hours = gpu_hours(self.since, now, self.gpus)
        head = at_risk_reason(self.gpu_hours, "")
        reason = at_risk_reason(hours, self.reason[len(head):]) if self.reason.startswith(head) else self.reason
        nodes = tuple(new_node_risk(n.node, n.score, n.signals, n.reasons, n.gpus, hours * n.gpus / self.gpus)
                      for n in self.nodes)
        return replace(self, gpu_hours=hours, reason=reason, nodes=nodes)

    def to_json(self) -> dict[str, Any]:
        return {"gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 3), "gpus": self.gpus,
                "since": rfc3339(self.since), "basis": self.basis or None, "reason": self.reason,
                "checkpoint": None if self.checkpoint_at is None else
                {"step": self.checkpoint_step, "at": rfc3339(self.checkpoint_at)},
                "nodes": [n.to_json() for n in self.nodes], "missing_signals": list(self.missing)}
