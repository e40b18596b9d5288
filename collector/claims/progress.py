"""Progress analysis over parsed log samples: rate, replay and validity (DESIGN.md §3)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from collector.correlate import Signal
from collector.settings import ClaimSettings


@dataclass(frozen=True, slots=True)
class Advance:
    at: datetime
    step: int
    source: str
    replay_from: datetime | None = None  # steps were being replayed from then until this advance


@dataclass(frozen=True, slots=True)
class ProgressView:
    """What a run's progress signals say, before it becomes a claim."""

    advances: tuple[Advance, ...]  # samples that moved the high-water step forward, by time
    undated: int  # samples with no timestamp (cannot be placed in time)
    replayed: int  # samples at or below a step already reached (after a restart)
    skipped: int  # steps the trainer itself skipped (fp16 overflow)
    last_step: int | None
    last_loss: float | None
    nonfinite_since: Advance | None  # first sample of the current non-finite-loss streak
    window: timedelta  # stall window adapted to this run's cadence
    median_step_s: float | None
    mad_step_s: float | None


def analyze(signals: Iterable[Signal], s: ClaimSettings, now: datetime | None = None) -> ProgressView:
    """Advances, replays and the stall window; samples stamped after `now` are not known yet."""
    dated: list[tuple[datetime, int, float | None, bool, str]] = []
    undated = 0
    for sig in signals:
        src = f"{sig.ref.name}/{sig.source}" if sig.source else sig.ref.name
        for smp in sig.scan.samples:
            if smp.at is None:
                undated += 1
            elif now is None or smp.at <= now:
                dated.append((smp.at, smp.step, smp.loss, smp.skipped, src))
    dated.sort(key=lambda x: (x[0], x[1]))
    advances: list[Advance] = []
    high: int | None = None
    replayed = skipped = 0
    last_loss: float | None = None
    bad_since: Advance | None = None
    replay_from: datetime | None = None
    for at, step, loss, was_skipped, src in dated:
        if was_skipped:
            skipped += 1
            continue
        if loss is not None:
            last_loss = loss
            if math.isfinite(loss):
                bad_since = None
            elif bad_since is None:
                bad_since = Advance(at, step, src)
        if high is not None and step <= high:
            # The same step from another rank, or a replay after restoring an older checkpoint.
            if step < high:
                replayed += 1
                replay_from = replay_from or at
            continue
        high = step
        if loss is None or math.isfinite(loss):
            advances.append(Advance(at, step, src, replay_from))
            replay_from = None
    intervals = [(b.at - a.at).total_seconds() for a, b in zip(advances, advances[1:], strict=False)]
    step_times = [
        (b.at - a.at).total_seconds() / (b.step - a.step)
        for a, b in zip(advances, advances[1:], strict=False)
        if b.step > a.step
    ]
    window = s.stall_floor
    if intervals:
        p99 = _quantile(intervals, 0.99)
        window = max(timedelta(seconds=s.stall_multiplier * p99), s.stall_floor)
    window += s.scrape_interval
    median = statistics.median(step_times) if step_times else None
    mad = statistics.median(abs(x - median) for x in step_times) if median is not None else None
    return ProgressView(
        advances=tuple(advances),
        undated=undated,
        replayed=replayed,
        skipped=skipped,
        last_step=high,
        last_loss=last_loss,
        nonfinite_since=bad_since,
        window=window,
        median_step_s=median,
        mad_step_s=mad,
    )


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    if len(ys) == 1:
        return ys[0]
    pos = q * (len(ys) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)
