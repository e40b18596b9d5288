"""Figures that grow with the clock (goodput, work at risk), carried forward between evaluations.

Claims change by the clock only at `recheck_at`; goodput and work at risk grow all the time. So that
the controller need not re-evaluate every run to keep them current, an evaluation says what grows and
from when (`Goodput.at`, `WorkAtRisk.at`, `RunClaims.at`) and exporters render the figures at their own
clock. Over generated runs (tests/claims/test_recheck_at.py's, with checkpoint listings of any age and
pods started or not): carried to any instant before `recheck_at`, the figures equal an evaluation then,
to the bit; and so does the whole Prometheus exposition (tests/exporters/test_accrual_exposition.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from collector.correlate import RunEvidence
from collector.model import Goodput, PodFacts, Ref, RunClaims
from collector.riskfacts import WorkAtRisk
from collector.sources.checkpoints import CheckpointEntry, checkpoint_signal
from tests.claims.test_recheck_at import EPS, NOW, claims_at, evidence, pod, runs, steps, taucluster, taurun, ts

LATER = NOW + timedelta(days=2)  # nothing ages: the same much later


@st.composite
def accruing_runs(draw: st.DrawFn) -> tuple[RunEvidence, dict[str, Any]]:
    ev, gpu = draw(runs())
    if ev.pods and draw(st.booleans()):
        for i, p in enumerate(ev.pods):  # pods with a start time: work at risk counts from the last of them
            if draw(st.booleans()) and isinstance(p.facts, PodFacts):
                start = NOW - timedelta(seconds=draw(st.integers(-120, 9000)))
                ev.pods[i] = p._replace(facts=p.facts._replace(start_time=start))
    if draw(st.booleans()):
        entries = [CheckpointEntry(f"checkpoint-{step}", NOW - timedelta(seconds=ago), 64)
                   for step, ago in draw(st.lists(st.tuples(st.integers(1, 5000), st.integers(-200, 9000)),
                                                  max_size=3, unique_by=lambda x: x[0]))]
        read = NOW - timedelta(seconds=draw(st.integers(-30, 400)))
        ev.signals.append(checkpoint_signal(Ref("TauRun", "ns", "r"), entries, read))
    return ev, gpu


@st.composite
def training_runs(draw: st.DrawFn) -> tuple[RunEvidence, dict[str, Any]]:
    """Scheduled runs whose trainer printed: steady, stalled, hung, restarted and replaying below
    their mark, with steps up to 90 s ahead of the clock (most generated runs above are not scheduled)."""
    n = draw(st.integers(1, 3))
    objs = [taurun(workers=n), taucluster(timedelta(minutes=1), workers=n)]
    objs += [pod(f"r-{i}", restarted_ago=draw(st.one_of(st.none(), st.integers(0, 1200).map(
        lambda s: timedelta(seconds=s))))) for i in range(n)]
    stamped: list[tuple[int, int]] = []  # (age s, step), oldest first
    step, age = draw(st.integers(0, 500)), 0
    for _ in range(draw(st.integers(1, 4))):  # segments: steps at a cadence, a gap, maybe a restart below
        cadence = draw(st.integers(1, 90))
        for _ in range(draw(st.integers(1, 8))):
            stamped.append((age, step))
            step, age = step + 1, age - cadence
        age -= draw(st.integers(0, 900))
        step -= draw(st.sampled_from([0, 0, 5, 50]))  # back below the mark: a replay
    shift = draw(st.integers(-90, 900)) - stamped[-1][0]  # the newest step that long ago (ahead: negative)
    lines = [f"{ts(NOW - timedelta(seconds=a + shift))} iteration {k:8d}/ 100000 | lm loss: 2.5 |\n"
             for a, k in stamped]
    if draw(st.booleans()):
        lines.append(steps(0, hang_at=draw(st.integers(-90, 600))).splitlines(keepends=True)[-1])  # a hang
    ev = evidence(objs, log="".join(lines), read_at=NOW - timedelta(seconds=draw(st.integers(-30, 400))))
    return ev, {}


def instants(rc: RunClaims, frac: float) -> set[datetime]:
    end = rc.recheck_at if rc.recheck_at is not None else LATER
    return {t for t in (NOW + (end - NOW) * frac, end - EPS, NOW + EPS) if NOW < t < end}


def _risk(w: WorkAtRisk | None) -> object:
    # Reasons say ages ("the listing is 5m01s old", "NotReady (3m ago)"): words, not figures (as before).
    return None if w is None else (w.gpu_hours, w.gpus, w.since, w.basis, w.checkpoint_step,
                                   w.checkpoint_at, tuple((n.node, n.score, n.signals, n.gpus, n.gpu_hours)
                                                          for n in w.nodes), w.missing)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=st.one_of(accruing_runs(), training_runs()), frac=st.floats(0.0, 1.0, exclude_max=True))
def test_carried_forward_equals_an_evaluation_then(run: tuple[RunEvidence, dict[str, Any]], frac: float) -> None:
    ev, gpu = run
    rc = claims_at(ev, gpu, NOW)
    event(f"accrues {rc.goodput.accrues or 'nothing' if rc.goodput else 'no goodput'}")
    event("work at risk known" if rc.work_at_risk is not None and rc.work_at_risk.gpu_hours is not None else "unknown")
    for t in instants(rc, frac):
        fresh, carried = claims_at(ev, gpu, t), rc.at(t)
        assert carried.goodput == fresh.goodput, f"goodput at {t}, evaluated at {NOW}"
        assert _risk(carried.work_at_risk) == _risk(fresh.work_at_risk), f"work at risk at {t}"


def test_each_bucket_grows_and_the_ratio_follows() -> None:
    g = Goodput(100.0, 60.0, {"stalled": 40.0}, 0.6, "productive", 50.0, NOW - timedelta(seconds=10),
                NOW - timedelta(seconds=100), True)
    later = g.at(NOW + timedelta(seconds=20))
    assert (later.allocated_s, later.productive_s, later.badput_s, later.ratio) == (120.0, 80.0, {"stalled": 40.0},
                                                                                  80.0 / 120.0)
    stalled = replace(g, accrues="stalled", accrues_base=30.0).at(NOW + timedelta(seconds=20))
    assert (stalled.productive_s, stalled.badput_s["stalled"], stalled.ratio) == (60.0, 60.0, 60.0 / 120.0)
    fixed = replace(g, rated=False, ratio=0.0).at(NOW + timedelta(seconds=20))
    assert fixed.ratio == 0.0 and fixed.allocated_s == 120.0
    still = Goodput(0.0, 0.0, {"queued": 5.0}, None)
    assert still.at(NOW + timedelta(hours=1)) is still


def test_claims_carried_backwards_or_with_nothing_growing_are_the_same_object() -> None:
    ev, gpu = run_with_steps()
    rc = claims_at(ev, gpu, NOW)
    assert rc.goodput is not None and rc.goodput.accrues == "productive"
    assert rc.at(NOW) is rc and rc.at(NOW - timedelta(seconds=5)) is rc
    assert rc.at(NOW + timedelta(seconds=5)).goodput != rc.goodput


def run_with_steps() -> tuple[RunEvidence, dict[str, Any]]:
    ev = evidence([taurun(), taucluster(timedelta(minutes=1)), pod("r-0")], log=steps(20, 10, 0))
    return ev, {}
