"""The progress analysis as it was before it kept per-stream walks (one sorted walk over every sample
of every signal on each call), verbatim but for its imports: the oracle `test_incremental_analysis`
holds the incremental `claims.progress.analyze` equal to."""

# ruff: noqa

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import datetime
from operator import itemgetter

from collector.claims.common import Clock
from collector.claims.lineage import Lineage, Restart
from collector.claims.progress_view import (RECENT_INTERVALS, SKIP_RECENT, ZERO_LOSS_STREAK, Advance, Blind, Invalid,
                                            ProgressView, Replaying, StreamView)
from collector.claims.progress_view import stall_window as _window
from collector.correlate import Key, Signal
from collector.progress import ProgressSample
from collector.settings import ClaimSettings

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
        window, basis = _window([secs for _, secs, _ in ivs], s)
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
