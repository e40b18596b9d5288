"""Memory bounded by design (issue 8): a scan keeps the last MAX_SAMPLES samples and running
aggregates, so its peak memory does not grow with the length of the log."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from collector.progress import scan, scan_lines, scan_report

LINE = (" iteration {step:>8}/  250000 | consumed samples: {cs:>12} | elapsed time per iteration (ms): 86545.2 | "
        "learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 | grad norm: "
        "0.231 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def lines(n: int) -> Iterator[str]:
    for i in range(1, n + 1):
        yield f"2026-01-10T12:{(i // 60) % 60:02d}:{i % 60:02d}.000000000Z " + LINE.format(step=i, cs=i * 1024)
        if i % 3 == 0:
            yield "node-3:2211:2890 [5] NCCL INFO Channel 07/24 : 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"


def peak(n: int) -> tuple[int, scan.LogScan]:
    tracemalloc.start()
    try:
        result = scan_lines(lines(n), source="t")
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "MAX_SAMPLES", 300)
    small, _ = peak(3_000)
    big, result = peak(12_000)
    # four times the log, the same memory (give or take allocator noise)
    assert big < small * 1.3, (small, big)
    assert len(result.samples) == 300
    # the aggregates still cover every sample
    sm = result.summary_of()
    assert (sm.seen, sm.dropped, sm.skipped) == (12_000, 11_700, 0)
    assert sm.first is not None and sm.first.step == 1 and sm.high_water is not None and sm.high_water.step == 12_000
    report = scan_report(result)["progress"]
    assert isinstance(report, dict)
    assert (report["samples"], report["first_step"], report["last_step"], report["kept_samples"]) == \
        (12_000, 1, 12_000, 300)
    assert any("summarized only" in d for d in result.diagnostics)


def test_high_water_mark_survives_dropped_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay after a restart stays a replay even when the old high-water sample was dropped."""
    from datetime import UTC, datetime, timedelta

    from collector.claims.progress import analyze
    from collector.correlate import Signal
    from collector.model import Ref
    from collector.settings import ClaimSettings

    monkeypatch.setattr(scan, "MAX_SAMPLES", 50)
    t0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)

    def at(i: int) -> str:
        return (t0 + timedelta(seconds=10 * i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    text = [f"{at(i)} " + LINE.format(step=i, cs=i) for i in range(1, 201)]  # up to step 200
    text += [f"{at(200 + i)} " + LINE.format(step=100 + i, cs=i) for i in range(1, 81)]  # restart: 101..180
    result = scan_lines(text, source="t")
    assert all(x.step is not None and x.step <= 180 for x in result.samples)
    view = analyze([Signal(Ref("Pod", "ns", "p"), "main", result, t0)], ClaimSettings(), t0 + timedelta(hours=2))
    assert view.last_step == 200 and view.advances[-1].step == 200 and view.replayed == 50


def test_many_ranks_without_rank_0_keep_a_short_history_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "MAX_OTHER_RANK_SAMPLES", 40)
    text = [f"[rank{r}]: " + LINE.format(step=i, cs=i) for i in range(1, 201) for r in range(1, 9)]
    text += [f"[rank{r}]: " + LINE.format(step=1, cs=1) for r in range(9, 200)]  # ranks past MAX_STREAMS
    sc = scan.LineScanner("t", None, 1 << 20)
    sc.feed_all(text)
    assert len(sc.streams) == scan.MAX_STREAMS
    assert all(len(st.samples) <= 40 for st in sc.streams.values())
    result = sc.finish()
    assert len(result.samples) == 40 and result.summary_of().seen == 200  # rank 1, the lowest, chosen
    assert any("only rank 1 counted" in d for d in result.diagnostics)
