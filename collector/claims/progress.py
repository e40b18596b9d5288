"""Progress analysis over parsed log samples: rate, replay and validity (DESIGN.md §3).

High-water marks are kept per stream: one rank's container log across its pod incarnations
(`claims.lineage`), one Ray counter, one checkpoint listing. A rank whose log lags another's is not
a replay, and a counter on another scale is not a restart. A replay is a stream going back below
its own high-water mark (the process started over from an older checkpoint: in place, in a new
pod, or inside one process); it is not progress until it passes that mark again. A stream that
started over where its own mark cannot be seen (no pre-restart log) is *blind*: its steps may be
replays, so they prove nothing (another rank's mark does not stand for it: ranks lag each other,
and not every run's ranks move in lockstep). Each stream is judged on its own step intervals (a
helper's cadence never widens the trainer's window).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from operator import itemgetter

from collector.claims.common import Clock, human_age
from collector.claims.lineage import Lineage, Restart
from collector.correlate import Key, Signal
from collector.progress import ProgressSample
from collector.progress.history import RECENT, compact
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


def _samples(sig: Signal) -> list[ProgressSample]:
    """The signal's kept samples, led by its high-water sample when older ones were dropped."""
    samples = list(sig.scan.samples)
    sm = sig.scan.summary
    if sm is not None and sm.dropped and sm.high_water is not None and sm.high_water not in samples:
        samples.insert(0, sm.high_water)
    return samples


_AFTER = 1 << 40  # orders of restarts: after every sample's (samples count from 0)
_at_order = itemgetter(0, 1)


def restarts_inside(sig: Signal) -> list[Restart]:
    """The trainer's own word that it started over inside this log (torchelastic restarting its
    workers, a resume from a checkpoint) after lines of progress: an in-process restart. Its steps
    after it are replays until they pass the mark before it; a stepless log's activity after it
    proves nothing (no mark to pass)."""
    first = min((x.line for x in sig.scan.samples), default=None)
    if first is None:
        return []
    out = []
    for r in sig.scan.resumes:
        if r.at is not None and r.line > first:
            what = ("torchelastic restarted its worker group" if r.format == "torchelastic" else
                    f"the trainer resumed from its checkpoint{f' at step {r.step:,}' if r.step is not None else ''}")
            out.append(Restart(r.at, f"{what} inside {sig.ref.name}/{sig.source}"))
    return out


def analyze(signals: Iterable[Signal], s: ClaimSettings, now: datetime | None = None, *,
            clock: Clock | None = None, lineage: Mapping[tuple[Key, str], Lineage] | None = None) -> ProgressView:
    """Advances, replays, validity and the stall windows; samples stamped after `now` are not known yet
    (`clock`, when given, is the `now` and notes when the first of them will be). `lineage`: which
    stream each pod signal continues, and where it started over (`claims.lineage.lineages`)."""
    # Samples stamped past the horizon are not known yet (skew) or forged; a dump's capture time may
    # trail its newest real stamps by the clock's slack, so the horizon is the latest capture instant.
    horizon = clock.horizon if clock is not None else now
    # (at, order, sample or restart, source, stream): a restart's order is past every sample's, so it
    # sorts after the samples of its instant
    events: list[tuple[datetime, int, ProgressSample | Restart, str, str]] = []
    undated = 0
    observed_from: datetime | None = None
    n = 0
    for sig in signals:
        src = f"{sig.ref.name}/{sig.source}" if sig.source else sig.ref.name
        lin = lineage.get((sig.ref.key, sig.source)) if lineage else None
        stream = lin.stream if lin is not None else src
        first = sig.scan.first_at
        for smp in _samples(sig):
            if smp.at is None:
                undated += 1
            elif horizon is None or smp.at <= horizon:
                events.append((smp.at, n, smp, src, stream))
                n += 1
                if first is None or smp.at < first:
                    first = smp.at
            elif clock is not None:
                clock.expires(smp.at)  # stamped ahead of the clock (skew): it counts once reached
        if first is not None and (horizon is None or first <= horizon):
            observed_from = first if observed_from is None else min(observed_from, first)
        elif first is not None and clock is not None:
            clock.expires(first)
        for r in (*(lin.restarts if lin is not None else ()), *restarts_inside(sig)):
            if horizon is None or r.at <= horizon:
                events.append((r.at, _AFTER + n, r, src, stream))
                n += 1
    events.sort(key=_at_order)
    advances: list[Advance] = []
    high: dict[str, int] = {}
    last_seen: dict[str, datetime] = {}  # stepless signals: the last activity
    replay_from: dict[str, datetime] = {}
    replay_last: dict[str, Advance] = {}
    restart_of: dict[str, Restart] = {}  # the restart a stream's current replay follows
    blind: dict[str, Restart] = {}  # streams that started over with no mark in view
    blind_last: dict[str, Advance] = {}
    intervals: dict[str, list[tuple[datetime, float, int]]] = {}  # (end, seconds, steps) per stream
    prev_adv: dict[str, Advance] = {}
    replayed = skipped = 0
    last_loss: float | None = None
    bad_since: Advance | None = None
    invalid: Invalid | None = None
    zero_since: Advance | None = None  # the first of the current streak of 0.0 losses ...
    zero_count = 0  # ... and how many samples it holds
    skipped_since: Advance | None = None
    skipped_streak = 0
    recent: deque[tuple[bool, datetime]] = deque(maxlen=SKIP_RECENT)
    latest_restart: dict[str, Restart] = {}
    for at, _, item, src, stream in events:
        if isinstance(item, Restart):
            latest_restart[stream] = item
            # Its own mark is the only one that counts: another rank's says nothing sure about where
            # this one was (ranks lag each other, and some runs' ranks are not in lockstep at all).
            if stream in high:
                blind.pop(stream, None)
                restart_of[stream] = item
            else:
                blind[stream] = item
            continue
        smp = item
        n = smp.covers  # samples this one stands for (compacted history: all of its kind)
        if smp.step is not None and (smp.skipped or stream not in high or smp.step > high[stream]):
            if n == 1:
                recent.append((smp.skipped, at))
            else:
                recent.extend([(smp.skipped, at)] * min(n, SKIP_RECENT))
        if smp.skipped:
            skipped += n
            skipped_since = skipped_since or Advance(at, smp.step, src, stream=stream)
            skipped_streak += n
            continue
        adv: Advance | None = None  # built when first needed (most samples need one, not two)
        if smp.loss is not None:
            last_loss = smp.loss
            if not math.isfinite(smp.loss):
                adv = Advance(at, smp.step, src, bridged=n > 1, stream=stream)
                bad_since = bad_since or adv
                invalid = invalid if invalid is not None and invalid.why.startswith("loss is") else \
                    Invalid(adv, f"loss is {smp.loss}")
                zero_since, zero_count = None, 0
            elif smp.loss == 0.0:
                bad_since = None
                if zero_since is None:
                    zero_since = adv = Advance(at, smp.step, src, bridged=n > 1, stream=stream)
                zero_count += n
                if zero_count >= ZERO_LOSS_STREAK and (invalid is None or invalid.since != zero_since):
                    invalid = Invalid(zero_since, "loss stuck at exactly 0.0")
            else:
                bad_since = None
                invalid = None
                zero_since, zero_count = None, 0
        if stream in blind or (smp.step is None and stream in restart_of):
            # Started over with no mark in view, or activity without a step since it did: replay or
            # progress, nobody can tell (only a step past the mark can).
            blind_last[stream] = Advance(at, smp.step, src, stream=stream)
            continue
        if smp.step is None:
            if stream in last_seen and at <= last_seen[stream]:
                continue
            last_seen[stream] = at
            adv = adv or Advance(at, None, src, bridged=n > 1, stream=stream)
        else:
            h = high.get(stream)
            if h is not None and smp.step <= h:
                # The same step redrawn, or this stream went back: a restart replaying from an older
                # checkpoint. Not progress until it passes its own high-water mark.
                if smp.step < h:
                    replayed += n
                    replay_from.setdefault(stream, at)
                    replay_last[stream] = Advance(at, smp.step, src, stream=stream)
                continue
            high[stream] = smp.step
            if stream in replay_last:
                del replay_last[stream]
            if stream in restart_of:
                del restart_of[stream]
            adv = Advance(at, smp.step, src, replay_from.pop(stream, None), n > 1, stream)
        if smp.loss is not None and not math.isfinite(smp.loss):
            continue
        before = prev_adv.get(stream)
        if before is not None and adv.replay_from is None and not adv.bridged:
            # (a bridged gap spans a compacted stretch: not one step interval)
            steps = (adv.step - before.step) if adv.step is not None and before.step is not None else 0
            intervals.setdefault(stream, []).append((at, (at - before.at).total_seconds(), steps))
        prev_adv[stream] = adv
        advances.append(adv)
        skipped_since, skipped_streak = None, 0
    streams = []
    for stream, last in prev_adv.items():
        ivs = intervals.get(stream, [])
        window, basis = _window(ivs, s)
        step_times = [secs / k for _, secs, k in ivs[-RECENT_INTERVALS:] if k > 0]
        median = statistics.median(step_times) if step_times else None
        mad = statistics.median(abs(x - median) for x in step_times) if median is not None else None
        streams.append(StreamView(last, window, basis, median, mad))
    # The run's current stream: the one whose window closes last (ties: the newest advance).
    current = max(streams, key=lambda v: (v.last.at + v.window, v.last.at), default=None)
    replaying = max((Replaying(replay_from[k], a, high[k], restart_of.get(k)) for k, a in replay_last.items()
                     if k in replay_from), key=lambda r: r.last.at, default=None)
    blind_view = max((Blind(blind.get(k) or restart_of[k], a) for k, a in blind_last.items()
                      if k in blind or k in restart_of), key=lambda b: b.last.at, default=None)
    floor_window, floor_basis = _window([], s)
    restarted = latest_restart.get(current.last.stream) if current is not None else None
    if restarted is not None and current is not None and restarted.at < current.last.at:
        restarted = None
    return ProgressView(
        advances=tuple(advances),
        undated=undated,
        replayed=replayed,
        skipped=skipped,
        last_step=max(high.values()) if high else None,
        last_loss=last_loss,
        nonfinite_since=bad_since,
        window=current.window if current else floor_window,
        median_step_s=current.median_step_s if current else None,
        mad_step_s=current.mad_step_s if current else None,
        window_basis=current.basis if current else floor_basis,
        invalid=invalid,
        observed_from=observed_from,
        high_water=high,
        skipped_since=skipped_since,
        skipped_streak=skipped_streak,
        recent_skipped=(sum(1 for sk, _ in recent if sk), len(recent)),
        recent_skipped_since=recent[0][1] if recent else None,
        last=current.last if current else None,
        replaying=replaying,
        blind=blind_view,
        streams=tuple(streams),
        restarted=restarted,
    )


def window_of(view: ProgressView, stream: str, s: ClaimSettings) -> timedelta:
    """The stall window of one stream (the floor when it has not advanced yet: no cadence of its own)."""
    return next((v.window for v in view.streams if v.last.stream == stream), None) or _window([], s)[0]


COMPACT_SLACK = 16  # samples past RECENT a history may hold before it is compacted again


def compacted(sig: Signal, s: ClaimSettings) -> Signal:
    """`sig` with its history compacted (`progress.history.compact`), bridging gaps inside the stall
    window its own recent samples give (at least the stall floor). The window in force when a
    stretch is compacted decides for good that its gaps were progress."""
    samples = sig.scan.samples
    if len(samples) <= RECENT + COMPACT_SLACK:
        return sig  # (a poll adds a few samples: compact every few polls, not on each)
    out = compact(sig.scan, bridge=signal_window(samples[-RECENT:], s))
    return sig if out is sig.scan else replace(sig, scan=out)


def signal_window(samples: Sequence[ProgressSample], s: ClaimSettings) -> timedelta:
    """The stall window `analyze` gives one signal's samples, without the rest of its work (the
    controller asks on every log poll; tests hold the two equal)."""
    intervals: list[tuple[datetime, float, int]] = []
    high: int | None = None
    last_seen: datetime | None = None
    replaying = False
    prev: tuple[datetime, int | None] | None = None  # the previous advance
    for smp in sorted((x for x in samples if x.at is not None and not x.skipped), key=_at):
        at = _at(smp)
        after_replay = False
        if smp.step is None:
            if last_seen is not None and at <= last_seen:
                continue
            last_seen = at
        else:
            if high is not None and smp.step <= high:
                replaying = replaying or smp.step < high
                continue
            high = smp.step
            after_replay, replaying = replaying, False
        if smp.loss is not None and not math.isfinite(smp.loss):
            continue
        if prev is not None and not after_replay and smp.covers <= 1:
            steps = smp.step - prev[1] if smp.step is not None and prev[1] is not None else 0
            intervals.append((at, (at - prev[0]).total_seconds(), steps))
        prev = (at, smp.step)
    return _window(intervals, s)[0]


def _at(smp: ProgressSample) -> datetime:
    assert smp.at is not None
    return smp.at


def _window(intervals: list[tuple[datetime, float, int]], s: ClaimSettings) -> tuple[timedelta, str]:
    """max(stall_multiplier × robust high quantile of the recent intervals, stall_floor) + scrape.

    The quantile is p99 of the last RECENT_INTERVALS intervals, clipped at median + OUTLIER_MADS ×
    MAD: one past pause (an hour-long checkpoint save) cannot stretch the window for hours. Pauses
    that recur (two or more in the recent intervals) are the run's cadence and are kept, up to the
    second longest.
    """
    xs = [secs for _, secs, _ in intervals[-RECENT_INTERVALS:]]
    floor = f"floor {human_age(s.stall_floor)}"
    if not xs:
        return s.stall_floor + s.scrape_interval, f"{floor}: no step interval yet"
    p99 = _quantile(xs, 0.99)
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    cap = med + OUTLIER_MADS * max(mad, 0.1 * med)
    ys = sorted(xs)
    second = ys[-2] if len(ys) >= 2 else ys[-1]
    est = min(p99, max(cap, second))
    what = f"p99 of last {len(xs)} step interval{'s' if len(xs) != 1 else ''}"
    if est < p99:
        what += f", one {human_age(timedelta(seconds=ys[-1]))} outlier clipped"
    scaled = timedelta(seconds=s.stall_multiplier * est)
    if scaled < s.stall_floor:
        return s.stall_floor + s.scrape_interval, f"{floor} ({what} is {human_age(timedelta(seconds=est))})"
    # Recurring pauses widen the window, never past the ceiling: a few times the usual step, capped
    # absolutely (a signal whose usual step is itself long, an hourly checkpoint, keeps 3 of them).
    by_cadence = s.stall_ceiling_multiplier * med  # seconds; infinite where a profile sets the ceiling itself
    ceiling = max(s.stall_floor, timedelta(seconds=s.stall_multiplier * med),
                  s.stall_window_max if by_cadence >= s.stall_window_max.total_seconds()
                  else timedelta(seconds=by_cadence))
    if scaled > ceiling:
        return ceiling + s.scrape_interval, (f"ceiling {human_age(ceiling)} ({s.stall_multiplier:g} × "
                                             f"{human_age(timedelta(seconds=est))} from {what} is wider)")
    return scaled + s.scrape_interval, f"{s.stall_multiplier:g} × {human_age(timedelta(seconds=est))} from {what}"


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    if len(ys) == 1:
        return ys[0]
    pos = q * (len(ys) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)
