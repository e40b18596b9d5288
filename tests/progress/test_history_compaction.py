"""Compacted history says what the whole history says (hypothesis over step sequences).

`progress.history.compact` drops the inside of each stretch of same-kind samples whose gaps stay
under the bridge. Whatever the sequence (steady steps, replays after restarts, skipped steps,
non-finite and 0.0 losses, gaps longer than any stall window), the analysis of the compacted
history must keep every count, the high-water mark, validity and the goodput accounting of the
whole one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.claims.goodput import goodput
from collector.claims.progress import analyze, signal_window
from collector.correlate import Signal
from collector.model import Ref
from collector.progress import LogScan, ProgressSample
from collector.progress.history import BRIDGE, compact
from collector.settings import ClaimSettings
from tests.test_progress_claims import NOW, run_with

POD = Ref("Pod", "ns", "r-0")
S = ClaimSettings()
START = NOW - timedelta(hours=2, minutes=50)

_loss = st.sampled_from([2.5, 1.25, 0.0, math.nan, math.inf, None])
_op = st.one_of(
    st.tuples(st.just("steps"), st.integers(1, 40), st.floats(0.5, 90.0), _loss),
    st.tuples(st.just("replay"), st.integers(1, 30), st.floats(0.5, 90.0), _loss),
    st.tuples(st.just("skipped"), st.integers(1, 6), st.floats(0.5, 30.0), _loss),
    st.tuples(st.just("gap"), st.integers(1, 1), st.floats(60.0, 3600.0), _loss),
    st.tuples(st.just("stepless"), st.integers(1, 10), st.floats(0.5, 30.0), _loss),
)


def _samples(ops: list[tuple[str, int, float, float | None]]) -> list[ProgressSample]:
    out: list[ProgressSample] = []
    t, step = START, 0
    for kind, n, dt, loss in ops:
        if kind == "gap":
            t += timedelta(seconds=dt)
            continue
        if kind == "replay":
            step = max(0, step - n)
            n = n + 3
        for _ in range(n):
            t += timedelta(seconds=dt)
            if t > NOW:
                return out
            if kind == "stepless":
                out.append(ProgressSample(None, t, loss, len(out) + 1, "hf-trainer"))
                continue
            if kind != "skipped":
                step += 1
            out.append(ProgressSample(step, t, loss, len(out) + 1, "megatron", skipped=kind == "skipped"))
    return out


def _scan(samples: list[ProgressSample]) -> LogScan:
    return LogScan(source="main", format="megatron", samples=tuple(samples), hangs=(), xids=(), diagnostics=(),
                   lines=len(samples), first_at=samples[0].at if samples else None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=30), recent=st.sampled_from([2, 8, 64]))
# two 0.0 losses with loss-less steps between are not a streak of three
@example(ops=[("steps", 1, 1.0, 0.0), ("steps", 2, 1.0, None), ("steps", 1, 1.0, 0.0), ("steps", 2, 1.0, None)],
         recent=2)
# the last loss shown is kept when the stretch ends on a step without one
@example(ops=[("steps", 1, 1.0, 2.5), ("steps", 1, 1.0, 1.25), ("steps", 3, 1.0, None)], recent=2)
def test_compacted_history_keeps_counts_marks_validity_and_goodput(ops: list, recent: int) -> None:
    samples = _samples(ops)
    if not samples:
        return
    whole = _scan(samples)
    kept = compact(whole, bridge=BRIDGE, recent=recent)
    assert len(kept.samples) <= len(samples)
    assert sum(s.covers for s in kept.samples) == len(samples)  # every sample is counted somewhere
    assert kept.samples[-recent:] == whole.samples[-recent:]
    full = analyze([Signal(POD, "main", whole, NOW)], S, NOW)
    comp = analyze([Signal(POD, "main", kept, NOW)], S, NOW)
    same = ("last_step", "replayed", "skipped", "undated", "observed_from", "high_water", "nonfinite_since",
            "skipped_since", "skipped_streak", "last_loss", "recent_skipped")
    assert {k: getattr(comp, k) for k in same} == {k: getattr(full, k) for k in same}
    assert (comp.invalid is None) == (full.invalid is None)
    if full.invalid is not None and comp.invalid is not None:
        assert (comp.invalid.why, comp.invalid.since.at) == (full.invalid.why, full.invalid.since.at)
    def ends(view: object) -> list[object]:
        advs = view.advances  # type: ignore[attr-defined]
        return [(a.at, a.step, a.replay_from) for a in (*advs[:1], *advs[-1:])]

    assert ends(comp) == ends(full)
    # goodput: the same accounting under the same stall window, the run's own and the narrowest the
    # engine can give (the window itself is built from the last 50 intervals, which a short `recent`
    # may have compacted: the controller keeps 64)
    _, ev = run_with(Signal(POD, "main", whole, NOW))
    scheduled = NOW - timedelta(hours=3) + timedelta(minutes=1)
    for window in (full.window, S.stall_floor + S.scrape_interval):
        g_full = goodput(ev, replace(full, window=window), scheduled, NOW)  # type: ignore[arg-type]
        g_comp = goodput(ev, replace(comp, window=window), scheduled, NOW)  # type: ignore[arg-type]
        assert math.isclose(g_comp.productive_s, g_full.productive_s, abs_tol=1e-6)
        for cause, secs in g_full.badput_s.items():
            assert math.isclose(g_comp.badput_s[cause], secs, abs_tol=1e-6), cause


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=30), recent=st.sampled_from([2, 8, 64]))
def test_the_controllers_bridge_is_the_window_analyze_gives(ops: list, recent: int) -> None:
    """`signal_window` (asked on every log poll) equals `analyze`'s window for that signal alone,
    compacted or not."""
    samples = _samples(ops)
    if not samples:
        return
    for scan in (_scan(samples), compact(_scan(samples), bridge=BRIDGE, recent=recent)):
        assert signal_window(scan.samples, S) == analyze([Signal(POD, "main", scan, NOW)], S).window
