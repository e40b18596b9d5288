"""Which runs get per-run series, and the fleet summary that counts every run.

`ClaimsExporter(run_series=RunSeries.UNHEALTHY)` (controller setting `run_series`, chart value
`controller.runSeries`) keeps a large fleet's `/metrics` small: a run whose claims all hold exports
only `taugrid_run_progress_last_step` (the step-rate rules behind `TaugridRunSlowedDown` read it),
every other run its full series. `taugrid_fleet_runs` counts every run by namespace, queue and
state in both modes, so the healthy rest stays visible as counts (docs/metrics.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from prometheus_client.core import GaugeMetricFamily

from collector.claims.workrisk import DrainAdvice
from collector.model import Observed, RunClaims, Verdict

__all__ = ["HEALTHY_RUN_FAMILIES", "STALLED_CAUSES", "RunSeries", "RunState", "fleet_family", "fleet_family_of",
           "fleet_key", "node_families", "run_state"]


class RunSeries(StrEnum):
    """Which runs the exporter writes per-run series for."""

    ALL = "all"
    UNHEALTHY = "unhealthy"  # healthy runs: only the families in HEALTHY_RUN_FAMILIES


class RunState(StrEnum):
    """A run's state in the fleet summary: the first that holds, in this order."""

    FINISHED = "finished"  # the root is terminal (its final verdicts stay exported in full)
    BLOCKED = "blocked"  # waiting to be scheduled, in a stage with an owner
    STALLED = "stalled"  # progressing false for a cause TaugridRunStalled fires on
    CONTRADICTED = "contradicted"  # a claim's status asserts what the evidence contradicts
    UNVERIFIED = "unverified"  # a claim the evidence does not show true (unknown, or false and not asserted)
    HEALTHY = "healthy"  # every claim observed true: scheduled, running and progressing


# The progressing causes TaugridRunStalled fires on (charts/taugrid-evidence/rules).
STALLED_CAUSES = frozenset({"stalled", "hung", "skipped-steps", "invalid-steps"})

# What a healthy run keeps under RunSeries.UNHEALTHY (`ClaimsExporter` family keys): its newest
# step, so that `taugrid:run_step_rate:deriv5m` and TaugridRunSlowedDown still see a healthy run
# that slows down. Alerts exclude finished runs through `taugrid_run_finished == 1`; finished runs
# are never healthy here, so they keep that series. A healthy run's straggler suspects too (at most
# three series, only while one is named): a run can progress and still wait on one slow rank.
# Its GPU-hours at risk on nodes with a risk signal too (the drain advisor's "checkpoint these first"
# is about healthy runs above all).
HEALTHY_RUN_FAMILIES = frozenset({"last_step", "straggler", "drain_exposure"})

_FLEET = "taugrid_fleet_runs"
_FLEET_HELP = ("Runs the collector evaluates, by namespace, Kueue queue (empty: none) and state: healthy, finished, "
               "blocked, stalled, contradicted or unverified.")


def run_state(rc: RunClaims) -> RunState:
    if rc.finished:
        return RunState.FINISHED
    if rc.blocked is not None:
        return RunState.BLOCKED
    if rc.progressing.observed is Observed.FALSE and rc.progressing.cause in STALLED_CAUSES:
        return RunState.STALLED
    claims = (rc.scheduled, rc.running, rc.progressing)
    if any(c.verdict is Verdict.CONTRADICTED for c in claims):
        return RunState.CONTRADICTED
    if any(c.observed is not Observed.TRUE for c in claims):
        return RunState.UNVERIFIED
    return RunState.HEALTHY


def _queue(rc: RunClaims) -> str:
    q = rc.extra.get("queue") if rc.extra else None
    return q if isinstance(q, str) else ""


def fleet_key(rc: RunClaims) -> tuple[str, str, str]:
    """The run's labels in `taugrid_fleet_runs`: namespace, queue, state."""
    return rc.ref.namespace, _queue(rc), run_state(rc).value


def fleet_family_of(counts: Mapping[tuple[str, str, str], int]) -> GaugeMetricFamily:
    """`taugrid_fleet_runs` from runs counted by `fleet_key`: one series per key, sorted."""
    fam = GaugeMetricFamily(_FLEET, _FLEET_HELP, labels=["namespace", "queue", "state"])
    for labels in sorted(counts):
        fam.add_metric(list(labels), float(counts[labels]))
    return fam


def fleet_family(runs: Iterable[RunClaims]) -> GaugeMetricFamily:
    """`taugrid_fleet_runs` of these runs."""
    return fleet_family_of(Counter(map(fleet_key, runs)))


def node_families(advice: Sequence[DrainAdvice]) -> list[GaugeMetricFamily]:
    """The drain advisor as three node families: only nodes with a risk signal are series."""
    risk = GaugeMetricFamily(
        "taugrid_node_drain_risk",
        "How urgently to drain a node, 0-100, from the risk signals on it seen by the runs it holds (NotReady, "
        "a lost GPU, hardware XIDs, a cordon, a recent NotReady spell); only nodes with a signal are series.",
        labels=["node"])
    signal = GaugeMetricFamily(
        "taugrid_node_drain_signal",
        "1 for each risk signal seen on a node: not-ready, gpu-lost, xid-48/63/64/74/79/94/95, cordoned, "
        "not-ready-recently.",
        labels=["node", "signal"])
    hours = GaugeMetricFamily(
        "taugrid_node_work_at_risk_gpu_hours",
        "GPU-hours since their last checkpoint of the runs on a risky node (runs whose work at risk is known): "
        "what draining it now would throw away.",
        labels=["node"])
    for a in advice:
        risk.add_metric([a.node], a.score)
        for sig in a.signals:
            signal.add_metric([a.node, sig], 1.0)
        hours.add_metric([a.node], round(a.gpu_hours, 4))
    return [risk, signal, hours]
