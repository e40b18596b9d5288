"""One stream's part of the progress analysis (`claims.progress.analyze`), kept between evaluations.

The analysis once sorted every sample of every signal of a run into one walk, on every evaluation.
What it derives is per stream (the high-water mark, replays, a blind restart, the step intervals and
the window they give), but for a few run-wide streaks (the loss's, the skipped steps', the last
SKIP_RECENT step reports) that only the newest samples decide. So each stream is walked on its own
(`walk`), and the walk is kept (`walked`: weakly, on its first signal's scan) while its signals'
scans, sources and restarts and the settings are those it was walked with and nothing it holds lies
past the clock's horizon. An evaluation after one container's log poll walks that container's
stream again and takes every other stream's walk as it was. The run-wide parts are rebuilt from each
walk's tails (what follows its last advance, its last finite non-zero loss, its last reports), in
the order of the single walk: by time, then the signal's place, then the sample's.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from operator import itemgetter
from weakref import ref

from collector.claims.common import Clock
from collector.claims.lineage import Restart
from collector.claims.progress_view import (
    RECENT_INTERVALS,
    SKIP_RECENT,
    Advance,
    Blind,
    Replaying,
    StreamView,
    stall_window,
)
from collector.progress import LogScan, ProgressSample
from collector.settings import ClaimSettings

# A place in the walk: (at, signal's slot in its stream, sample's position in its signal). Across
# streams the slot becomes the signal's place among the run's signals.
Key = tuple[datetime, int, int]
_order = itemgetter(0, 1, 2, 3)


@dataclass(frozen=True, slots=True)
class Part:
    """One signal of a stream, in the run's order of signals."""

    scan: LogScan
    src: str  # pod/container: what its advances name
    label: str  # name/source: what its in-process restarts name
    restarts: tuple[Restart, ...]  # its lineage's (replacement, container restart)


def samples_of(scan: LogScan) -> list[ProgressSample]:
    """The scan's kept samples, led by its high-water sample when older ones were dropped."""
    samples = list(scan.samples)
    sm = scan.summary
    if sm is not None and sm.dropped and sm.high_water is not None and sm.high_water not in samples:
        samples.insert(0, sm.high_water)
    return samples


def restarts_in(scan: LogScan, label: str) -> list[Restart]:
    """`claims.progress.restarts_inside` of a scan read as `label` (name/source)."""
    first = min((x.line for x in scan.samples), default=None)
    if first is None:
        return []
    out = []
    for r in scan.resumes:
        if r.at is not None and r.line > first:
            what = ("torchelastic restarted its worker group" if r.format == "torchelastic" else
                    f"the trainer resumed from its checkpoint{f' at step {r.step:,}' if r.step is not None else ''}")
            out.append(Restart(r.at, f"{what} inside {label}"))
    return out


class Walk:
    """What one stream's samples and restarts say, walked in order (read-only once built)."""

    __slots__ = ("stream", "undated", "first", "complete", "max_at", "high", "advs", "first_adv",
                 "last_adv", "view", "replayed", "skipped", "replaying", "replay_key", "blind", "blind_key",
                 "latest_restart", "recent", "skip_tail", "loss_tail", "finite_key", "last_loss")

    def __init__(self, stream: str, parts: int) -> None:
        self.stream = stream
        self.undated = 0
        self.first: datetime | None = None  # the earliest stamp it holds (evidence starts there)
        self.complete = True  # nothing lay past the horizon: valid at any horizon from max_at on
        self.max_at: datetime | None = None
        self.high: int | None = None
        self.advs: list[list[Advance]] = [[] for _ in range(parts)]  # advances, per slot
        self.first_adv: Key | None = None
        self.last_adv: Key | None = None
        self.view: StreamView | None = None
        self.replayed = self.skipped = 0
        self.replaying: Replaying | None = None
        self.replay_key: Key | None = None  # when its current replay began to be recorded
        self.blind: Blind | None = None
        self.blind_key: Key | None = None
        self.latest_restart: Restart | None = None
        # the last SKIP_RECENT step reports: (key, skipped, at)
        self.recent: deque[tuple[Key, bool, datetime]] = deque(maxlen=SKIP_RECENT)
        # skipped samples since its last advance: (key, covers, at, step, src)
        self.skip_tail: list[tuple[Key, int, datetime, int | None, str]] = []
        # samples with a loss since its last finite non-zero one: (key, loss, covers, advance)
        self.loss_tail: list[tuple[Key, float, int, Advance]] = []
        self.finite_key: Key | None = None  # its last finite non-zero loss
        self.last_loss: tuple[Key, float] | None = None


def walk(stream: str, parts: Sequence[Part], s: ClaimSettings, horizon: datetime | None,
         clock: Clock | None) -> Walk:
    """One stream's walk (the single walk of `analyze` as it was, restricted to this stream)."""
    w = Walk(stream, len(parts))
    events: list[tuple[datetime, int, int, int, ProgressSample | Restart, str]] = []
    top: datetime | None = None
    for slot, p in enumerate(parts):
        first = p.scan.first_at
        i = 0
        for smp in samples_of(p.scan):
            at = smp.at
            if at is None:
                w.undated += 1
            elif horizon is None or at <= horizon:
                events.append((at, 0, slot, i, smp, p.src))
                i += 1
                if first is None or at < first:
                    first = at
                if top is None or at > top:
                    top = at
            else:
                w.complete = False
                if clock is not None:
                    clock.expires(at)  # stamped ahead of the clock (skew): it counts once reached
        if first is not None and (horizon is None or first <= horizon):
            w.first = first if w.first is None else min(w.first, first)
            top = first if top is None else max(top, first)
        elif first is not None:
            w.complete = False
            if clock is not None:
                clock.expires(first)
        for r in (*p.restarts, *restarts_in(p.scan, p.label)):
            if horizon is None or r.at <= horizon:
                events.append((r.at, 1, slot, i, r, p.src))
                i += 1
                top = r.at if top is None else max(top, r.at)
            else:
                w.complete = False
    w.max_at = top
    events.sort(key=_order)
    _run(w, events, s)
    return w


def _run(w: Walk, events: list[tuple[datetime, int, int, int, ProgressSample | Restart, str]],
         s: ClaimSettings) -> None:
    stream = w.stream
    high: int | None = None
    last_seen: datetime | None = None  # stepless signals: the last activity
    replay_from: datetime | None = None
    replay_last: Advance | None = None
    restart_of: Restart | None = None  # the restart its current replay follows
    blind: Restart | None = None  # started over with no mark in view
    blind_last: Advance | None = None
    intervals: list[tuple[datetime, float, int]] = []
    prev_adv: Advance | None = None
    recent, skip_tail, loss_tail = w.recent, w.skip_tail, w.loss_tail
    advs = w.advs
    for at, is_restart, slot, i, item, src in events:
        if is_restart:
            assert isinstance(item, Restart)
            w.latest_restart = item
            # Its own mark is the only one that counts: another rank's says nothing sure about where
            # this one was (ranks lag each other, and some runs' ranks are not in lockstep at all).
            if high is not None:
                blind = None
                restart_of = item
            else:
                blind = item
            continue
        assert isinstance(item, ProgressSample)
        smp = item
        key = (at, slot, i)
        n = smp.covers  # samples this one stands for (compacted history: all of its kind)
        step = smp.step
        if step is not None and (smp.skipped or high is None or step > high):
            if n == 1:
                recent.append((key, smp.skipped, at))
            else:
                recent.extend([(key, smp.skipped, at)] * min(n, SKIP_RECENT))
        if smp.skipped:
            w.skipped += n
            skip_tail.append((key, n, at, step, src))
            continue
        adv: Advance | None = None
        loss = smp.loss
        if loss is not None:
            w.last_loss = (key, loss)
            if math.isfinite(loss) and loss != 0.0:
                w.finite_key = key
                loss_tail.clear()
            else:
                adv = Advance(at, step, src, bridged=n > 1, stream=stream)
                loss_tail.append((key, loss, n, adv))
        if blind is not None or (step is None and restart_of is not None):
            # Started over with no mark in view, or activity without a step since it did: replay or
            # progress, nobody can tell (only a step past the mark can).
            blind_last = Advance(at, step, src, stream=stream)
            if w.blind_key is None:
                w.blind_key = key
            continue
        if step is None:
            if last_seen is not None and at <= last_seen:
                continue
            last_seen = at
            adv = adv or Advance(at, None, src, bridged=n > 1, stream=stream)
        else:
            if high is not None and step <= high:
                # The same step redrawn, or this stream went back: a restart replaying from an older
                # checkpoint. Not progress until it passes its own high-water mark.
                if step < high:
                    w.replayed += n
                    if replay_from is None:
                        replay_from = at
                    if replay_last is None:
                        w.replay_key = key
                    replay_last = Advance(at, step, src, stream=stream)
                continue
            high = step
            replay_last = restart_of = None
            adv = Advance(at, step, src, replay_from, n > 1, stream)
            replay_from = None
        if loss is not None and not math.isfinite(loss):
            continue
        if prev_adv is not None and adv.replay_from is None and not adv.bridged:
            # (a bridged gap spans a compacted stretch: not one step interval)
            steps = (adv.step - prev_adv.step) if adv.step is not None and prev_adv.step is not None else 0
            intervals.append((at, (at - prev_adv.at).total_seconds(), steps))
        prev_adv = adv
        advs[slot].append(adv)
        if w.first_adv is None:
            w.first_adv = key
        w.last_adv = key
        skip_tail.clear()
    w.high = high
    if prev_adv is not None:
        window, basis = stall_window(intervals, s)
        step_times = [secs / k for _, secs, k in intervals[-RECENT_INTERVALS:] if k > 0]
        median = statistics.median(step_times) if step_times else None
        mad = statistics.median(abs(x - median) for x in step_times) if median is not None else None
        w.view = StreamView(prev_adv, window, basis, median, mad)
    if replay_last is not None and replay_from is not None and high is not None:
        w.replaying = Replaying(replay_from, replay_last, high, restart_of)
    mark = blind or restart_of
    if blind_last is not None and mark is not None:
        w.blind = Blind(mark, blind_last)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A walk and what it was walked from (the scans after the first one held weakly)."""

    stream: str
    rest: tuple[LogScan, ...]
    parts: tuple[tuple[str, str, tuple[Restart, ...]], ...]
    settings: ClaimSettings
    walk: Walk


# id(first scan) -> (a weak reference to it, what was walked): by identity (a scan's hash would hash
# every sample), forgotten when the scan goes
_KEPT: dict[int, tuple[ref[LogScan], _Kept]] = {}


def _forget(i: int, gone: ref[LogScan]) -> None:
    e = _KEPT.get(i)
    if e is not None and e[0] is gone:
        del _KEPT[i]


def walked(stream: str, parts: Sequence[Part], s: ClaimSettings, horizon: datetime | None,
           clock: Clock | None) -> Walk:
    """`walk(...)`, taken from the last evaluation when nothing it depends on changed."""
    head = parts[0].scan
    ids = tuple((p.src, p.label, p.restarts) for p in parts)
    e = _KEPT.get(id(head))
    kept = e[1] if e is not None and e[0]() is head else None
    if kept is not None and kept.stream == stream and kept.parts == ids and len(kept.rest) == len(parts) - 1 \
            and all(a is b.scan for a, b in zip(kept.rest, parts[1:], strict=True)) \
            and (kept.settings is s or kept.settings == s):
        w = kept.walk
        if w.complete and (horizon is None or w.max_at is None or w.max_at <= horizon):
            return w
    w = walk(stream, parts, s, horizon, clock)
    if w.complete:
        # (a walk that left samples past the horizon out is walked again: they count once reached)
        _KEPT[id(head)] = (ref(head, partial(_forget, id(head))),
                           _Kept(stream, tuple(p.scan for p in parts[1:]), ids, s, w))
    return w
