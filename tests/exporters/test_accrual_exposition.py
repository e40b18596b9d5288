"""The families that grow with the clock, rendered at the exporter's clock (exporters/prometheus_accrual.py).

Over generated runs (tests/claims/test_accrual.py's): an exporter given a run's claims of NOW and then only
a later clock writes, at any instant before the run's `recheck_at`, the exposition an exporter given the
claims evaluated at that instant writes — byte for byte, but for the evaluation's own timestamp — and
client_python's rendering of its `collect` (the registry path) agrees with its prepared text.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from collector.correlate import RunEvidence
from collector.riskfacts import WorkAtRisk
from exporters.prometheus import ClaimsExporter, new_registry
from exporters.prometheus_families import EVALUATED
from tests.claims.test_accrual import accruing_runs, instants, training_runs
from tests.claims.test_recheck_at import NOW, claims_at


def _without_evaluated(text: bytes) -> list[bytes]:
    # Not compared: the evaluation's own instant, and evidence ages (already rendered at the exporter's
    # clock before this change; a GPU reading stamped ahead of the clock is dated at the evaluation, so
    # its age differs by less than the skew allowance between two evaluations).
    skip = (EVALUATED.encode() + b"{", b"taugrid_run_evidence_age_seconds{")
    return [line for line in text.splitlines() if not line.startswith(skip)]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=st.one_of(accruing_runs(), training_runs()), frac=st.floats(0.0, 1.0, exclude_max=True))
def test_the_exposition_at_a_later_clock_is_an_evaluation_then(run: tuple[RunEvidence, dict[str, Any]],
                                                               frac: float) -> None:
    ev, gpu = run
    rc = claims_at(ev, gpu, NOW)
    for t in instants(rc, frac):
        registry = new_registry()
        carried = ClaimsExporter(registry)
        carried.update([rc], NOW)
        carried.update([], t)
        fresh = ClaimsExporter()
        fresh.update([claims_at(ev, gpu, t)], t)
        assert _without_evaluated(carried.exposition()) == _without_evaluated(fresh.exposition()), f"at {t}"
        assert generate_latest(registry) == carried.exposition()


def test_a_growing_run_moves_with_the_clock_and_nothing_else_does() -> None:
    from tests.claims.test_accrual import run_with_steps
    ev, gpu = run_with_steps()
    rc = claims_at(ev, gpu, NOW)
    exp = ClaimsExporter()
    exp.update([rc], NOW)
    before = exp.exposition()
    exp.update([], NOW + timedelta(seconds=7))
    moved = [(a, b) for a, b in zip(before.splitlines(), exp.exposition().splitlines(), strict=True) if a != b]
    names = sorted({a.split(b"{")[0].decode() for a, _ in moved})
    assert names == ["taugrid_run_evidence_age_seconds", "taugrid_run_goodput_ratio", "taugrid_run_time_seconds"]
    productive = [b for a, b in moved if b'bucket="productive"' in a]
    assert len(productive) == 1 and float(productive[0].split()[-1]) == rc.goodput.productive_s + 7  # type: ignore[union-attr]


def test_claims_turned_unknown_stop_growing() -> None:
    """An outage or an evaluation that failed leaves a run's claims unknown with its last figures:
    goodput and work at risk as last evaluated, counting no time nobody saw."""
    from collector.evaluation import unknown_claims
    from tests.claims.test_accrual import run_with_steps

    ev, gpu = run_with_steps()
    rc = claims_at(ev, gpu, NOW)
    assert rc.goodput is not None and rc.goodput.accrues == "productive"
    since = NOW - timedelta(hours=1)
    rc = replace(rc, work_at_risk=WorkAtRisk(8.0, 8, since, "checkpoint", "x", 10, since))
    unknown = unknown_claims(rc.ref, rc, NOW + timedelta(seconds=1), "the API server cannot be reached")
    assert unknown.at(NOW + timedelta(hours=1)).goodput == rc.goodput.frozen()
    exp = ClaimsExporter()
    exp.update([unknown], NOW + timedelta(seconds=1))
    before = _without_evaluated(exp.exposition())
    exp.update([], NOW + timedelta(minutes=10))
    assert _without_evaluated(exp.exposition()) == before
    grown = ClaimsExporter()  # the same figures of a run still evaluated do grow
    grown.update([rc], NOW)
    grown.update([], NOW + timedelta(minutes=10))
    assert b"taugrid_run_work_at_risk_gpu_hours" in grown.exposition()
    assert [x for x in _without_evaluated(grown.exposition()) if b"work_at_risk" in x] != \
        [x for x in before if b"work_at_risk" in x]
