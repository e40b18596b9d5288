"""The live controller's own history: polls of a bounded tail joined into what it has seen."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from collector.claims.progress import COMPACT_SLACK, analyze, compacted
from collector.correlate import Signal
from collector.model import Ref
from collector.progress import LogScan, scan_text
from collector.progress.history import HISTORY_SAMPLES, RECENT, merge_history
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


def _poll(history: LogScan | None, tail: LogScan) -> LogScan:
    """What the controller keeps after a poll: merged with the history, then compacted."""
    merged = tail if history is None else merge_history(history, tail)
    return compacted(Signal(POD, "main", merged, T0), ClaimSettings()).scan


def test_polls_of_a_short_tail_keep_the_history_and_its_high_water_mark() -> None:
    history = _tail(range(1, 101))  # the first poll: steps 51..100
    for end in range(131, 402, 30):  # later polls (every 300 s of steps) each see only the last 50 lines
        history = merge_history(history, _tail(range(1, end)))
    assert history.first_at == T0 + timedelta(seconds=510)  # the first poll's first line: evidence starts there
    steps = [s.step for s in history.samples]
    assert steps == list(range(51, 401))  # merged whole: compaction is a separate step
    assert all(a.line < b.line for a, b in zip(history.samples, history.samples[1:], strict=False))
    # goodput over the whole watched time, not only the last tail: nothing between polls is "unobserved"
    now = T0 + timedelta(seconds=4010)
    view = analyze([Signal(POD, "main", history, now)], ClaimSettings(), now)
    assert view.observed_from == T0 + timedelta(seconds=510)
    assert view.last_step == 400 and len(view.advances) == 350


def test_compacted_history_stays_small_for_a_run_training_for_days() -> None:
    """Steps every 30 s for three days, polled every 5 min with a 100-line tail: the history stays
    at RECENT samples and the two ends of the one stretch, and says what the whole log says."""
    every, per_poll = 30, 10
    history: LogScan | None = None
    sizes = []
    for k in range(1, 3 * 24 * 12 + 1):  # every 5 min for 3 days
        end = k * per_poll
        history = _poll(history, _tail(range(max(1, end - 99), end + 1), every=every, tail=100))
        sizes.append(len(history.samples))
    assert history is not None
    # compacted every few polls (a poll adds 10 samples): never more than that over the bound
    assert max(sizes) <= RECENT + COMPACT_SLACK + 2 + per_poll
    assert history.samples[1].covers > 500  # the stretch's last kept sample stands for the steps before it
    assert sum(s.covers for s in history.samples) == history.samples[-1].step  # every step counted once
    now = T0 + timedelta(days=3, seconds=30)
    n = 3 * 24 * 120
    whole = _tail(range(1, n + 1), every=every, tail=n)  # the whole log, read at once
    assert whole.summary_of().dropped == 0
    full = analyze([Signal(POD, "main", whole, now)], ClaimSettings(), now)
    kept = analyze([Signal(POD, "main", history, now)], ClaimSettings(), now)
    assert (kept.last_step, kept.window, kept.replayed, kept.skipped, kept.observed_from) == \
        (full.last_step, full.window, full.replayed, full.skipped, full.observed_from)
    assert kept.advances[-1] == full.advances[-1] and kept.advances[0] == full.advances[0]
    assert [a.bridged for a in kept.advances][:2] == [False, True] and sum(a.bridged for a in kept.advances) == 1


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


def test_samples_of_one_read_share_the_runs_total() -> None:
    """One int object for the total a read's samples repeat (tens of bytes a sample kept, at fleet
    size megabytes), the value unchanged."""
    scan = _tail(range(1, 40))
    totals = [s.total for s in scan.samples]
    assert totals[0] is not None and len(set(totals)) == 1
    assert len({id(t) for t in totals}) == 1


def test_a_restart_inside_the_container_survives_later_polls() -> None:
    """torchrun restarted its worker group (the only word of it is in the log) and the trainer prints
    no step numbers: once later polls read tails after those lines, the history must still hold them,
    or the replay after it reads as progress."""
    from collector.claims.progress import restarts_inside
    from collector.progress.history import extend_history

    loss = "{'loss': 1.8234, 'grad_norm': 0.5121, 'learning_rate': 4.9e-05, 'epoch': 0.12}"

    def stamped(i: int, line: str) -> str:
        return (T0 + timedelta(seconds=10 * i)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z " + line

    restart = [
        "W0110 10:05:00.117000 738248 torch/distributed/elastic/agent/server/api.py:704] [default] Worker group "
        "FAILED. 3/3 attempts left; will restart worker group",
        "  Continuing training from global step 1191",
    ]
    lines = [stamped(i, loss) for i in range(30)] + [stamped(30, x) for x in restart] + \
        [stamped(31 + i, loss) for i in range(40)]
    first = scan_text("\n".join(lines[:40]) + "\n", source="main")
    assert first.resumes, "the scanner must see the restart"
    history = first
    for end in range(45, len(lines) + 1, 5):  # later polls read only the lines since the last one
        history = merge_history(history, scan_text("\n".join(lines[end - 5:end]) + "\n", source="main"))
        history = compacted(Signal(POD, "main", history, T0), ClaimSettings()).scan
        assert [r.format for r in history.resumes] == [r.format for r in first.resumes]
    assert restarts_inside(Signal(POD, "main", history, T0 + timedelta(seconds=800)))
    # a node agent's increments (lines after a cursor) keep them the same way
    whole = scan_text("\n".join(lines[:60]) + "\n", source="main")
    increment = replace(whole, resumes=tuple(r for r in whole.resumes if r.line > 40))  # as the agent sends it
    agent = extend_history(first, increment, after=40)
    assert agent.resumes == first.resumes
