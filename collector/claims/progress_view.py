"""The records of the progress analysis (`claims.progress.analyze`) and the stall window rule.

Kept apart from the analysis so that its per-stream walk (`claims.progress_walk`) and the run-wide
combination share them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from collector.claims.common import human_age
from collector.claims.lineage import Restart
from collector.settings import ClaimSettings

RECENT_INTERVALS = 50  # the stall window is built from this many most recent intervals
OUTLIER_MADS = 10.0  # an interval past median + this many MADs is an outlier (clipped unless it recurs)
SKIPPED_STREAK = 8  # this many skipped samples in a row (fp16 overflow) and no real step: not progress now
SKIP_RECENT = 20  # the last this many step reports judge the share of skipped steps ...
SKIP_RECENT_MIN = 10  # ... once there are at least this many
ZERO_LOSS_STREAK = 3  # this many consecutive losses of exactly 0.0: the loss is stuck, not learning


@dataclass(frozen=True, slots=True)
class Advance:
    at: datetime
    step: int | None  # None: activity with no step number (Hugging Face loss dicts)
    source: str  # pod/container (or the signal) the sample was read from
    replay_from: datetime | None = None  # steps were being replayed from then until this advance
    # the log advanced continuously since its signal's sample before this one (a compacted stretch
    # of history, `ProgressSample.covers`): the gap to the advance before is progress, however long
    bridged: bool = False
    stream: str = ""  # the high-water mark it passed is this stream's ("": its source's)


# A run's evaluation builds an Advance per advancing sample of its signals (`Walk.advances`: the
# walks keep samples, not records, between evaluations): the generated frozen __init__ (~0.56 µs)
# was a tenth of a live controller's CPU. new_advance sets the slots themselves (~0.35 µs), the same
# object field for field (tests/claims/test_progress_view.py checks ADVANCE_FIELDS against the class).
ADVANCE_FIELDS = ("at", "step", "source", "replay_from", "bridged", "stream")
_set_at, _set_step, _set_source, _set_replay_from, _set_bridged, _set_stream = (
    getattr(Advance, name).__set__ for name in ADVANCE_FIELDS
)


def new_advance(at: datetime, step: int | None, source: str, replay_from: datetime | None, bridged: bool,
                stream: str) -> Advance:
    """Advance(at, step, source, replay_from, bridged, stream), built faster."""
    x = object.__new__(Advance)
    _set_at(x, at)
    _set_step(x, step)
    _set_source(x, source)
    _set_replay_from(x, replay_from)
    _set_bridged(x, bridged)
    _set_stream(x, stream)
    return x


@dataclass(frozen=True, slots=True)
class Invalid:
    """Steps that advance but are not progress (validity), since when."""

    since: Advance
    why: str  # "loss is nan", "loss stuck at 0.0", ...


@dataclass(frozen=True, slots=True)
class Replaying:
    """A stream below its own high-water mark since a restart, not past it yet."""

    since: datetime  # its first replayed step
    last: Advance  # its newest replayed step
    mark: int  # the high-water mark it must pass
    restart: Restart | None  # the restart it follows, when one is known (else: inside one log)


@dataclass(frozen=True, slots=True)
class Blind:
    """Steps of a stream that started over where its pre-restart mark cannot be seen."""

    restart: Restart
    last: Advance  # its newest step since


@dataclass(frozen=True, slots=True)
class StreamView:
    """One stream's last advance and its own stall window."""

    last: Advance
    window: timedelta
    basis: str
    median_step_s: float | None
    mad_step_s: float | None


@dataclass(frozen=True, slots=True)
class ProgressView:
    """What a run's progress signals say, before it becomes a claim."""

    advances: tuple[Advance, ...]  # samples that moved their stream's high-water mark forward, by time
    undated: int  # samples with no timestamp (cannot be placed in time)
    replayed: int  # samples below their stream's high-water mark (after a restart)
    skipped: int  # steps the trainer itself skipped (fp16 overflow)
    last_step: int | None
    last_loss: float | None
    nonfinite_since: Advance | None  # first sample of the current non-finite-loss streak
    window: timedelta  # stall window of the current stream (`last`): its own cadence
    median_step_s: float | None
    mad_step_s: float | None
    window_basis: str = ""  # what the window was built from, for the reason
    invalid: Invalid | None = None  # the current streak of steps that are not progress (any cause)
    observed_from: datetime | None = None  # the first timestamp any signal holds: evidence starts there
    skipped_since: Advance | None = None  # the first skipped step after the last real one (fp16 overflow)
    skipped_streak: int = 0  # skipped samples since the last real step
    high_water: dict[str, int] | None = None  # per stream
    # (skipped, of) over the last SKIP_RECENT step reports: most skipped is overflow, not training
    recent_skipped: tuple[int, int] = (0, 0)
    recent_skipped_since: datetime | None = None  # the oldest report of those
    # The advance whose stream's window closes last (the run progresses while any stream's is open).
    last: Advance | None = None
    replaying: Replaying | None = None  # the newest stream replaying below its mark now
    blind: Blind | None = None  # the newest stream whose steps since a restart prove nothing
    streams: tuple[StreamView, ...] = ()
    # The current stream started over after its last advance (and shows nothing since): that advance
    # was the process before the restart, no evidence the run goes on.
    restarted: Restart | None = None


def stall_window(secs: Sequence[float], s: ClaimSettings) -> tuple[timedelta, str]:
    """max(stall_multiplier × robust high quantile of the recent intervals, stall_floor) + scrape, and
    what it was built from; `secs`: the step intervals' seconds, oldest first.

    The quantile is p99 of the last RECENT_INTERVALS intervals, clipped at median + OUTLIER_MADS ×
    MAD: one past pause (an hour-long checkpoint save) cannot stretch the window for hours. Pauses
    that recur (two or more in the recent intervals) are the run's cadence and are kept, up to the
    second longest.
    """
    return _stall(list(secs[-RECENT_INTERVALS:]), s, True)


def stall_window_of(xs: list[float], s: ClaimSettings) -> timedelta:
    """`stall_window`'s window alone, from the seconds of the last RECENT_INTERVALS intervals (each log
    increment asks it, for its compaction's bridge: no words built)."""
    return _stall(xs, s, False)[0]


def _stall(xs: list[float], s: ClaimSettings, text: bool) -> tuple[timedelta, str]:
    """The window and, with `text`, what it was built from. One sort serves the quantile, the median
    and the second longest (`statistics.median`'s arithmetic: the same floats)."""
    if not xs:
        return s.stall_floor + s.scrape_interval, \
            f"floor {human_age(s.stall_floor)}: no step interval yet" if text else ""
    ys = sorted(xs)
    n = len(ys)
    p99 = _quantile_sorted(ys, 0.99)
    med = _median_sorted(ys)
    mad = _median_sorted(sorted([abs(x - med) for x in xs]))
    cap = med + OUTLIER_MADS * max(mad, 0.1 * med)
    second = ys[-2] if n >= 2 else ys[-1]
    est = min(p99, max(cap, second))
    scaled = timedelta(seconds=s.stall_multiplier * est)
    what = ""
    if text:
        what = f"p99 of last {n} step interval{'s' if n != 1 else ''}"
        if est < p99:
            what += f", one {human_age(timedelta(seconds=ys[-1]))} outlier clipped"
    if scaled < s.stall_floor:
        return s.stall_floor + s.scrape_interval, \
            f"floor {human_age(s.stall_floor)} ({what} is {human_age(timedelta(seconds=est))})" if text else ""
    # Recurring pauses widen the window, never past the ceiling: a few times the usual step, capped
    # absolutely (a signal whose usual step is itself long, an hourly checkpoint, keeps 3 of them).
    # seconds; infinite where a profile sets the ceiling itself (inf × a median of 0 s, steps stamped in
    # the same second, is NaN: no ceiling at all, and `timedelta` raised)
    by_cadence = math.inf if math.isinf(s.stall_ceiling_multiplier) else s.stall_ceiling_multiplier * med
    ceiling = max(s.stall_floor, timedelta(seconds=s.stall_multiplier * med),
                  s.stall_window_max if by_cadence >= s.stall_window_max.total_seconds()
                  else timedelta(seconds=by_cadence))
    if scaled > ceiling:
        return ceiling + s.scrape_interval, (f"ceiling {human_age(ceiling)} ({s.stall_multiplier:g} × "
                                             f"{human_age(timedelta(seconds=est))} from {what} is wider)"
                                             if text else "")
    return scaled + s.scrape_interval, \
        f"{s.stall_multiplier:g} × {human_age(timedelta(seconds=est))} from {what}" if text else ""


def _median_sorted(ys: list[float]) -> float:
    """`statistics.median` of a sorted list."""
    n = len(ys)
    return ys[n // 2] if n % 2 == 1 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def _quantile_sorted(ys: list[float], q: float) -> float:
    if len(ys) == 1:
        return ys[0]
    pos = q * (len(ys) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)
