"""`/metrics` from prepared text: byte for byte what client_python renders from `collect()`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.model import Ref
from exporters.prometheus import ClaimsExporter, new_registry, render
from exporters.prometheus_health import HealthMetrics
from tests.exporters.exporter_samples import T0, blocked_run, crashlooping_run


def _runs(names: list[tuple[str, str]]) -> list:  # type: ignore[type-arg]
    out = []
    for i, (ns, name) in enumerate(names):
        make = crashlooping_run if i % 2 == 0 else blocked_run
        rc = make(name=name, namespace=ns)
        out.append(replace(rc, ref=Ref(rc.ref.kind, ns, name, f"u{i}"), finished=i % 5 == 4))
    return out


def test_prepared_text_equals_client_python_render() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry)
    exp.update(_runs([(f"team-{i % 3}", f"run-{i:03d}") for i in range(40)]), T0)
    assert render(registry) == generate_latest(registry)
    families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    for name in ("taugrid_run_claim_state", "taugrid_run_blocked_age_seconds", "taugrid_run_evidence_age_seconds",
                 "taugrid_run_goodput_ratio", "taugrid_run_time_seconds", "taugrid_run_progress_last_step"):
        assert families[name].samples, name


def test_ages_follow_the_clock_and_snapshot_is_reused_until_a_change() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry)
    exp.update(_runs([("a", "r1"), ("a", "r2")]), T0)
    first = exp.exposition()
    assert exp.exposition() is first  # no per-scrape work
    exp.update([], T0 + timedelta(seconds=30))  # only the clock moves: ages grow
    later = exp.exposition()
    assert later is not first and later == generate_latest(registry)
    exp.forget(Ref("TauRun", "a", "r1"))
    assert b'run="r1"' not in exp.exposition() and exp.exposition() == generate_latest(registry)


def test_health_metrics_render_beside_the_claims() -> None:
    registry = new_registry()
    ClaimsExporter(registry).update(_runs([("a", "r1")]), T0)
    HealthMetrics(registry, resources=["pods"], version="t").events_processed("pods", 3)
    text = render(registry)
    assert text == generate_latest(registry)
    assert b"taugrid_collector_events_processed_total{resource=\"pods\"} 3.0" in text


_label = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.tuples(_label, _label), min_size=1, max_size=6, unique=True),
       age=st.floats(min_value=-1e6, max_value=1e9, allow_nan=False))
def test_any_label_text_and_clock_render_the_same(names: list[tuple[str, str]], age: float) -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry, retention=timedelta(days=365))
    exp.update(_runs(names), T0 + timedelta(seconds=age))
    assert render(registry) == generate_latest(registry)


def test_reevaluated_runs_reuse_lines_and_still_render_the_same() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry)
    runs = _runs([("a", "r1"), ("a", "r2"), ("b", "r3")])
    exp.update(runs, T0)
    later = T0 + timedelta(seconds=5)
    # Re-evaluated: same claims, a new evaluation time and goodput; then one claim changes.
    again = [replace(rc, evaluated_at=later, goodput=None) for rc in runs]
    exp.update(again, later)
    assert render(registry) == generate_latest(registry)
    assert b"taugrid_run_goodput_ratio{" not in render(registry)
    changed = replace(again[0], running=replace(again[0].running, since=later))
    exp.update([changed], later)
    assert render(registry) == generate_latest(registry)


_MOVES = ["same", "since", "evidence", "unblock", "no_goodput", "other_claims", "observed"]


@settings(max_examples=60, deadline=None)
@given(moves=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(_MOVES)), min_size=1, max_size=8))
def test_any_sequence_of_partial_changes_renders_the_same(moves: list[tuple[int, str]]) -> None:
    """Each update reuses the groups of lines whose inputs stayed and formats the rest: after any
    sequence of partial changes the text is still what client_python renders."""
    from collector.model import Evidence, Observed, Plane
    registry = new_registry()
    exp = ClaimsExporter(registry)
    runs = _runs([("a", "r1"), ("a", "r2"), ("b", "r3")])
    exp.update(runs, T0)
    for step, (i, move) in enumerate(moves, 1):
        t = T0 + timedelta(seconds=7 * step)
        rc = replace(runs[i], evaluated_at=t)
        if move == "since":
            rc = replace(rc, running=replace(rc.running, since=t))
        elif move == "evidence":
            extra = Evidence(Plane.GPU, "Node/n1", "gpu.util", step, t)
            rc = replace(rc, running=replace(rc.running, evidence=(*rc.running.evidence, extra)))
        elif move == "unblock":
            rc = replace(rc, blocked=None)
        elif move == "no_goodput":
            rc = replace(rc, goodput=None)
        elif move == "other_claims":
            other = _runs([("x", "y"), ("x", "z")])[(i + 1) % 2]
            rc = replace(other, ref=rc.ref, evaluated_at=t)
        elif move == "observed":
            flipped = Observed.FALSE if rc.scheduled.observed is not Observed.FALSE else Observed.TRUE
            rc = replace(rc, scheduled=replace(rc.scheduled, observed=flipped))
        runs[i] = rc
        exp.update([rc], t)
        assert render(registry) == generate_latest(registry), (step, move)
