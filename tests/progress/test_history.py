"""The live controller's own history: polls of a bounded tail joined into what it has seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from collector.claims.progress import analyze
from collector.correlate import Signal
from collector.model import Ref
from collector.progress import scan_text
from collector.progress.history import HISTORY_SAMPLES, merge_history
from collector.settings import ClaimSettings

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
POD = Ref("Pod", "ns", "r-0")


def _line(t: datetime, step: int) -> str:
    stamp = t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    return (f"{stamp}  iteration {step:>8}/  250000 | consumed samples: {step * 8:>12} | elapsed time per "
            "iteration (ms): 10000.0 | lm loss: 2.504220E+00 | number of skipped iterations:   0 |")


def _tail(steps: range, every: float = 10.0, tail: int = 50):
    lines = [_line(T0 + timedelta(seconds=every * i), i) for i in steps]
    return scan_text("\n".join(lines[-tail:]) + "\n", source="main")


def test_polls_of_a_short_tail_keep_the_history_and_its_high_water_mark() -> None:
    history = _tail(range(1, 101))  # the first poll: steps 51..100
    for end in range(131, 402, 30):  # later polls (every 300 s of steps) each see only the last 50 lines
        history = merge_history(history, _tail(range(1, end)))
    assert history.first_at == T0 + timedelta(seconds=510)  # the first poll's first line: evidence starts there
    steps = [s.step for s in history.samples]
    assert steps == sorted(steps) and steps[-1] == 400 and steps[0] == 51
    assert len(steps) < 350  # the carried-over part is thinned (one per 30 s), the tail kept whole
    assert all(a.line < b.line for a, b in zip(history.samples, history.samples[1:], strict=False))
    # goodput over the whole watched time, not only the last tail: nothing between polls is "unobserved"
    now = T0 + timedelta(seconds=4010)
    sig = Signal(POD, "main", history, now)
    view = analyze([sig], ClaimSettings(), now)
    assert view.observed_from == T0 + timedelta(seconds=510)
    gaps = [(b.at - a.at).total_seconds() for a, b in zip(view.advances, view.advances[1:], strict=False)]
    assert max(gaps) <= 30 + 10  # thinning never opens a gap the stall window could mistake for a stall


def test_a_restart_seen_by_the_controller_keeps_the_pre_restart_mark() -> None:
    before = _tail(range(1, 101))  # up to step 100
    # the container restarted: its new log starts again at step 60 (replay) and reaches 90
    after = scan_text("\n".join(_line(T0 + timedelta(seconds=1200 + 10 * i), 60 + i) for i in range(31)) + "\n",
                      source="main")
    merged = merge_history(before, after)
    now = T0 + timedelta(seconds=1510)
    view = analyze([Signal(POD, "main", merged, now)], ClaimSettings(), now)
    assert view.replayed == 31 and view.last_step == 100  # 60..90 all replay, below the mark of 100


def test_history_is_bounded() -> None:
    history = _tail(range(1, 2))
    for k in range(1, 60):
        start = 1 + 500 * k
        history = merge_history(history, _tail(range(start, start + 500), every=100.0, tail=500))
    assert len(history.samples) <= HISTORY_SAMPLES


def test_a_tail_that_starts_earlier_replaces_the_history() -> None:
    old = _tail(range(50, 60))
    new = _tail(range(1, 60), tail=59)
    assert merge_history(old, new) is new


def test_goodput_counts_the_watched_history_not_only_the_last_tail() -> None:
    from tests.test_progress_claims import NOW, run_with

    start = NOW - timedelta(seconds=4000)

    def tail(end: int) -> object:
        lines = [_line(start + timedelta(seconds=10 * i), i) for i in range(1, end)]
        return scan_text("\n".join(lines[-50:]) + "\n", source="main")

    history = tail(101)
    for end in range(131, 402, 30):
        history = merge_history(history, tail(end))  # type: ignore[arg-type]
    only_tail = tail(401)
    rc_tail, _ = run_with(Signal(POD, "main", only_tail, NOW))  # type: ignore[arg-type]
    rc_hist, _ = run_with(Signal(POD, "main", history, NOW))  # type: ignore[arg-type]
    g_tail, g_hist = rc_tail.goodput, rc_hist.goodput  # type: ignore[attr-defined]
    assert g_hist.productive_s > g_tail.productive_s + 2500  # ~3,000 s of watched steps, not ~500
    assert g_hist.badput_s["unobserved"] < g_tail.badput_s["unobserved"] - 2500
    assert abs(g_hist.productive_s + sum(g_hist.badput_s.values()) - g_hist.badput_s["queued"]
               - g_hist.allocated_s) < 1e-6
