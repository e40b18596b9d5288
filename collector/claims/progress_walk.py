"""One stream's part of the progress analysis (`claims.progress.analyze`), kept between evaluations.

The analysis once sorted every sample of every signal of a run into one walk, on every evaluation.
What it derives is per stream (the high-water mark, replays, a blind restart, the step intervals and
the window they give), but for a few run-wide streaks (the loss's, the skipped steps', the last
SKIP_RECENT step reports) that only the newest samples decide. So each stream is walked on its own
(`walk`), and the walk is kept (`walked`: on its first signal's scan, `ByScan`) while its signals'
scans, sources and restarts and the settings are those it was walked with and nothing it holds lies
past the clock's horizon. An evaluation after one container's log poll walks that container's
stream again and takes every other stream's walk as it was. The run-wide parts are rebuilt from each
walk's tails (what follows its last advance, its last finite non-zero loss, its last reports), in
the order of the single walk: by time, then the signal's place, then the sample's.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, Generic, TypeVar, cast

from collector.claims.common import Clock
from collector.claims.lineage import Restart
from collector.claims.progress_view import (
    RECENT_INTERVALS,
    SKIP_RECENT,
    Advance,
    Blind,
    Replaying,
    StreamView,
    new_advance,
    stall_window,
)
from collector.progress import LogScan, ProgressSample
from collector.progress.model import PackedSamples, at_pace
from collector.settings import ClaimSettings
from collector.timeunits import US

# A sample's place in the walk: (at, order), order = its signal's slot in the stream << SLOT | its
# position in its signal (a restart's order has AFTER set: after every sample of its instant). Across
# streams the slot becomes the signal's place among the run's signals (`claims.progress.analyze`).
Key = tuple[datetime, int]
SLOT = 24
POSITION = (1 << SLOT) - 1
AFTER = 1 << 40
T = TypeVar("T")
_order = itemgetter(0, 1)
_NONE: Mapping[int, datetime] = {}  # (read-only by its type: every walk with no replayed advance shares it)


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


def nothing_in(scan: LogScan, restarts: Sequence[Restart]) -> bool:
    """`walk` finds nothing in a part of this scan and these restarts: no sample, no high-water sample
    kept apart from them, no restart (`restarts_in` finds none where there is no sample)."""
    if scan.samples or restarts:
        return False
    sm = scan.summary
    return sm is None or sm.high_water is None


def restarts_in(scan: LogScan, label: str) -> list[Restart]:
    """`claims.progress.restarts_inside` of a scan read as `label` (name/source)."""
    if not scan.resumes:  # (most scans: no sample walked for their first line; a packed history's unbuilt)
        return []
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

    __slots__ = ("stream", "srcs", "undated", "first", "complete", "max_at", "high", "advs", "froms", "replayed_to",
                 "first_adv", "last_adv", "view", "replayed", "skipped", "replaying", "replay_key", "blind",
                 "blind_key", "latest_restart", "recent_places", "recent_orders", "skip_tail", "loss_tail",
                 "finite_key", "last_loss")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.undated = 0
        self.first: datetime | None = None  # the earliest stamp it holds (evidence starts there)
        self.complete = True  # nothing lay past the horizon: valid at any horizon from max_at on
        self.max_at: datetime | None = None
        self.high: int | None = None
        self.srcs: tuple[str, ...] = ()  # each slot's src
        # The containers below stay the shared empty ones for a stream with nothing to walk (a quiet
        # container's: at fleet size most of them) and are the walk's own once `_run` fills them.
        # The samples that advanced, per slot: their places in what the slot's scan holds (`froms`), so
        # a kept walk costs 8 B an advance between evaluations, not a record or a built sample (a held
        # history is packed: `progress.model.PackedSamples`); `advances` makes the records. () none.
        self.advs: Sequence[Sequence[int]] = ()
        # per slot: its scan's samples and the high-water sample `samples_of` led them with (or None)
        self.froms: Sequence[tuple[Sequence[ProgressSample], ProgressSample | None]] = ()
        self.replayed_to: Mapping[int, datetime] = _NONE  # slot << 32 | index → replay_from of that advance
        self.first_adv: Key | None = None
        self.last_adv: Key | None = None
        self.view: StreamView | None = None
        self.replayed = self.skipped = 0
        self.replaying: Replaying | None = None
        self.replay_key: Key | None = None  # when its current replay began to be recorded
        self.blind: Blind | None = None
        self.blind_key: Key | None = None
        self.latest_restart: Restart | None = None
        # the last SKIP_RECENT step reports (a sample standing for several repeats): their places, as
        # `advs`'s (`reports` gives the samples), and their orders
        self.recent_places: Sequence[int] = ()
        self.recent_orders: Sequence[int] = ()
        # skipped samples since its last advance: (at, order, covers, step, src)
        self.skip_tail: Sequence[tuple[datetime, int, int, int | None, str]] = ()
        # samples with a loss since its last finite non-zero one: (at, order, loss, covers, advance)
        self.loss_tail: Sequence[tuple[datetime, int, float, int, Advance]] = ()
        self.finite_key: Key | None = None  # its last finite non-zero loss
        self.last_loss: tuple[Key, float] | None = None

    def advances(self, slot: int) -> list[Advance]:
        """The advances of one slot, in order."""
        if not self.advs:
            return []
        src, stream, rf = self.srcs[slot], self.stream, self.replayed_to
        base = slot << 32
        held, lead = self.froms[slot]
        if lead is None and isinstance(held, PackedSamples) and (cols := held.columns()) is not None:
            # (a plain pack: its advances read from its columns, no sample built)
            steps, us, _, _, _, covers = cols
            b = held.stamp(0)  # (the pack's base: a stamp is the base + its µs, as `stamp` gives it)
            return [new_advance(b + us[k] * US, steps[k], src, rf.get(base | i) if rf else None, covers[k] > 1, stream)
                    for i, k in enumerate(self.advs[slot])]
        got = self._held(slot)
        xs = [got[k] for k in self.advs[slot]]
        if not rf:
            return [new_advance(x.at, x.step, src, None, x.covers > 1, stream) for x in xs]  # type: ignore[arg-type]
        return [new_advance(x.at, x.step, src, rf.get(base | i), x.covers > 1, stream)  # type: ignore[arg-type]
                for i, x in enumerate(xs)]

    def reports(self) -> list[ProgressSample]:
        """The last SKIP_RECENT step reports, in order (a sample standing for several, repeated)."""
        if not self.recent_places:
            return []
        held: dict[int, Sequence[ProgressSample]] = {}
        out = []
        for o, k in zip(self.recent_orders, self.recent_places, strict=True):
            slot = o >> SLOT
            got = held.get(slot)
            if got is None:
                pack, lead = self.froms[slot]
                # (a pack's few reports built alone, not all its samples: `sample` reads one)
                got = held[slot] = pack if lead is None and isinstance(pack, PackedSamples) else self._held(slot)
            out.append(got.sample(k) if isinstance(got, PackedSamples) else got[k])
        return out

    def _held(self, slot: int) -> Sequence[ProgressSample]:
        """The samples of a slot as `samples_of` gave them to the walk (the places index them)."""
        held, lead = self.froms[slot]
        got = held.built() if isinstance(held, PackedSamples) else held
        return got if lead is None else (lead, *got)


def walk(stream: str, parts: Sequence[Part], s: ClaimSettings, horizon: datetime | None,
         clock: Clock | None) -> Walk:
    """One stream's walk (the single walk of `analyze` as it was, restricted to this stream)."""
    if len(parts) == 1:
        got = _walk_plain(stream, parts[0], s, horizon)
        if got is not None:
            return got
    w = Walk(stream)
    w.srcs = tuple(p.src for p in parts)
    events: list[tuple[datetime, int, Any, str]] = []  # (at, order, sample or restart, src)
    # per slot, per position: the sample's place in `samples_of` its scan (None: the same, none left out)
    places: list[list[int] | None] = []
    froms: list[tuple[Sequence[ProgressSample], ProgressSample | None]] = []
    top: datetime | None = None
    for slot, p in enumerate(parts):
        first = p.scan.first_at
        i = slot << SLOT
        smps = samples_of(p.scan)
        froms.append((p.scan.samples, smps[0] if len(smps) > len(p.scan.samples) else None))
        at_place: list[int] | None = None  # (made at the first sample left out: those before it are in place)
        for k, smp in enumerate(smps):
            at = smp.at
            if at is None:
                w.undated += 1
                if at_place is None:
                    at_place = list(range(k))
            elif horizon is None or at <= horizon:
                events.append((at, i, smp, p.src))
                if at_place is not None:
                    at_place.append(k)
                i += 1
                if first is None or at < first:
                    first = at
                if top is None or at > top:
                    top = at
            else:
                if at_place is None:
                    at_place = list(range(k))
                w.complete = False
                if clock is not None:
                    clock.expires(at)  # stamped ahead of the clock (skew): it counts once reached
        places.append(at_place)
        if first is not None and (horizon is None or first <= horizon):
            w.first = first if w.first is None else min(w.first, first)
            top = first if top is None else max(top, first)
        elif first is not None:
            w.complete = False
            if clock is not None:
                clock.expires(first)
        for r in (*p.restarts, *restarts_in(p.scan, p.label)):
            if horizon is None or r.at <= horizon:
                events.append((r.at, AFTER | i, r, p.src))
                i += 1
                top = r.at if top is None else max(top, r.at)
            else:
                w.complete = False
    w.max_at = top
    if events:
        events.sort(key=_order)
        _run(w, events, s, places)
        if w.advs or w.recent_places:
            w.froms = froms
    return w


def _walk_plain(stream: str, p: Part, s: ClaimSettings, horizon: datetime | None) -> Walk | None:
    """`walk` of a stream of one signal that holds a plain pack at its pace (a trainer's history as the
    index holds it: every sample a new step, in time, with a finite non-zero loss), with no restart
    and nothing past the horizon, read from the pack's columns: no sample built, no event sorted (a
    head's history is walked again on each evaluation of a progressing run: each agent pass extended
    it). The same walk as `_run`'s over those samples: every sample advances, nothing is replayed,
    skipped or blind. None: the general path."""
    scan = p.scan
    held = scan.samples
    if p.restarts or scan.resumes or not isinstance(held, PackedSamples) or not held:
        return None
    cols = held.columns()
    if cols is None:
        return None
    steps, us, losses, _, _, covers = cols
    if not at_pace(steps, us) or 0.0 in losses:
        return None
    n = len(steps)
    last_at = held.stamp(us[-1])
    if horizon is not None and last_at > horizon:
        return None
    sm = scan.summary
    if sm is not None and sm.dropped and sm.high_water is not None and sm.high_water != held.sample(-1):
        return None  # (`samples_of` may lead with it)
    w = Walk(stream)
    w.srcs = (p.src,)
    first_at = held.stamp(us[0])
    w.first = first_at if scan.first_at is None or first_at < scan.first_at else scan.first_at
    w.max_at = last_at
    w.high = steps[-1]
    w.advs = [array("q", range(n))]
    w.froms = [(held, None)]
    # the last SKIP_RECENT step reports, newest first: a sample standing for several repeated
    recent: list[int] = []
    k = n - 1
    while k >= 0 and len(recent) < SKIP_RECENT:
        c = covers[k]
        recent.extend([k] * min(1 if c == 1 else c, SKIP_RECENT - len(recent)))
        k -= 1
    recent.reverse()
    w.recent_places = w.recent_orders = array("q", recent)
    w.first_adv = (first_at, 0)
    w.last_adv = w.finite_key = (last_at, n - 1)
    w.last_loss = ((last_at, n - 1), losses[-1])
    # the last RECENT_INTERVALS step intervals (a bridged gap spans a compacted stretch: none)
    # (seconds as `timedelta.total_seconds` gives them: the same division of µs)
    secs: list[float] = []
    step_times: list[float] = []
    k = n - 1
    while k >= 1 and len(secs) < RECENT_INTERVALS:
        if covers[k] <= 1:
            x = (us[k] - us[k - 1]) / 1_000_000
            secs.append(x)
            step_times.append(x / (steps[k] - steps[k - 1]))
        k -= 1
    secs.reverse()
    step_times.reverse()
    w.view = _view(new_advance(last_at, steps[-1], p.src, None, covers[-1] > 1, stream), secs, step_times, s)
    return w


def _view(last: Advance, secs: list[float], step_times: list[float], s: ClaimSettings) -> StreamView:
    """A stream's view from its last advance and its recent intervals' seconds and seconds a step."""
    window, basis = stall_window(secs, s)
    median = statistics.median(step_times) if step_times else None
    mad = statistics.median(abs(x - median) for x in step_times) if median is not None else None
    return StreamView(last, window, basis, median, mad)


def _run(w: Walk, events: list[tuple[datetime, int, Any, str]], s: ClaimSettings,
         places: list[list[int] | None]) -> None:
    """The walk proper, over `events` in order: (at, order, sample or restart, src); `places`: per slot,
    each sample position's place in its scan's samples (`walk`)."""
    stream = w.stream
    high: int | None = None
    last_seen: datetime | None = None  # stepless signals: the last activity
    replay_from: datetime | None = None
    replay_last: Advance | None = None
    restart_of: Restart | None = None  # the restart its current replay follows
    blind: Restart | None = None  # started over with no mark in view
    blind_last: Advance | None = None
    intervals: list[tuple[float, int]] = []  # (seconds, steps)
    prev_at: datetime | None = None  # the last advance's
    prev_step: int | None = None
    last_smp: ProgressSample | None = None
    last_rf: datetime | None = None
    recent: deque[int] = deque(maxlen=SKIP_RECENT)  # their orders
    skip_tail: list[tuple[datetime, int, int, int | None, str]] = []
    loss_tail: list[tuple[datetime, int, float, int, Advance]] = []
    advs: list[array[int]] = [array("q") for _ in w.srcs]
    replayed_to: dict[int, datetime] = {}
    isfinite = math.isfinite
    last_loss: tuple[datetime, int, float] | None = None
    finite: tuple[datetime, int] | None = None
    first_adv: tuple[datetime, int] | None = None
    last_at, last_order = None, 0  # the last advance's place
    item: Any
    for at, order, item, src in events:
        if order & AFTER:
            w.latest_restart = item
            # Its own mark is the only one that counts: another rank's says nothing sure about where
            # this one was (ranks lag each other, and some runs' ranks are not in lockstep at all).
            if high is not None:
                blind = None
                restart_of = item
            else:
                blind = item
            continue
        smp: ProgressSample = item
        n = smp.covers  # samples this one stands for (compacted history: all of its kind)
        step = smp.step
        if step is not None and (smp.skipped or high is None or step > high):
            if n == 1:
                recent.append(order)
            else:
                recent.extend([order] * min(n, SKIP_RECENT))
        if smp.skipped:
            w.skipped += n
            skip_tail.append((at, order, n, step, src))
            continue
        adv: Advance | None = None
        loss = smp.loss
        if loss is not None:
            last_loss = (at, order, loss)
            if loss != 0.0 and isfinite(loss):
                finite = (at, order)
                if loss_tail:
                    loss_tail.clear()
            else:
                adv = Advance(at, step, src, bridged=n > 1, stream=stream)
                loss_tail.append((at, order, loss, n, adv))
        if blind is not None or (step is None and restart_of is not None):
            # Started over with no mark in view, or activity without a step since it did: replay or
            # progress, nobody can tell (only a step past the mark can).
            blind_last = Advance(at, step, src, stream=stream)
            if w.blind_key is None:
                w.blind_key = (at, order)
            continue
        rf: datetime | None = None  # the advance's replay_from
        if step is None:
            if last_seen is not None and at <= last_seen:
                continue
            last_seen = at
        else:
            if high is not None and step <= high:
                # The same step redrawn, or this stream went back: a restart replaying from an older
                # checkpoint. Not progress until it passes its own high-water mark.
                if step < high:
                    w.replayed += n
                    if replay_from is None:
                        replay_from = at
                    if replay_last is None:
                        w.replay_key = (at, order)
                    replay_last = Advance(at, step, src, stream=stream)
                continue
            high = step
            replay_last = restart_of = None
            rf, replay_from = replay_from, None
        if loss is not None and not isfinite(loss):
            continue
        if prev_at is not None and rf is None and n <= 1:
            # (a bridged gap spans a compacted stretch: not one step interval)
            steps = (step - prev_step) if step is not None and prev_step is not None else 0
            intervals.append(((at - prev_at).total_seconds(), steps))
        prev_at, prev_step = at, step
        slot = order >> SLOT
        got = advs[slot]
        if rf is not None:
            replayed_to[slot << 32 | len(got)] = rf
        got.append(order & POSITION)  # (its position: made its place below)
        last_smp, last_rf = smp, rf
        if first_adv is None:
            first_adv = (at, order)
        last_at, last_order = at, order
        if skip_tail:
            skip_tail.clear()
    w.high = high
    if any(advs):
        for slot, pl in enumerate(places):
            if pl is not None and advs[slot]:
                advs[slot] = array("q", [pl[k] for k in advs[slot]])
        w.advs = advs
    if replayed_to:
        w.replayed_to = replayed_to
    if skip_tail:
        w.skip_tail = skip_tail
    if loss_tail:
        w.loss_tail = loss_tail
    if recent:
        w.recent_places = array("q", [o & POSITION if (pl := places[o >> SLOT]) is None else pl[o & POSITION]
                                      for o in recent])
        w.recent_orders = array("q", recent)
    w.first_adv = first_adv
    w.last_adv = (last_at, last_order) if last_at is not None else None
    w.finite_key = finite
    w.last_loss = ((last_loss[0], last_loss[1]), last_loss[2]) if last_loss is not None else None
    if last_smp is not None:
        assert last_smp.at is not None
        prev_adv = Advance(last_smp.at, last_smp.step, w.srcs[last_order >> SLOT], last_rf, last_smp.covers > 1,
                           stream)
        recent_intervals = intervals[-RECENT_INTERVALS:]
        w.view = _view(prev_adv, [secs for secs, _ in recent_intervals],
                       [secs / k for secs, k in recent_intervals if k > 0], s)
    if replay_last is not None and replay_from is not None and high is not None:
        w.replaying = Replaying(replay_from, replay_last, high, restart_of)
    mark = blind or restart_of
    if blind_last is not None and mark is not None:
        w.blind = Blind(mark, blind_last)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A walk and what it was walked from (kept on the first scan: the others named here)."""

    stream: str
    rest: tuple[LogScan, ...]
    parts: tuple[tuple[str, str, tuple[Restart, ...]], ...]
    settings: ClaimSettings
    walk: Walk


class ByScan(Generic[T]):
    """Values kept per scan object, on the scan (`LogScan.memo`, one place per ByScan): forgotten
    with the scan, found without hashing it (a scan's hash would hash every sample). A value must
    not be None (None reads as nothing kept)."""

    __slots__ = ("_at",)
    _places = 0  # ByScans made so far: each its own place in every scan's memo

    def __init__(self) -> None:
        self._at = ByScan._places
        ByScan._places += 1

    def get(self, scan: LogScan) -> T | None:
        m = scan.memo
        return None if m is None or self._at >= len(m) else cast(T | None, m[self._at])

    def put(self, scan: LogScan, value: T) -> None:
        m = scan.memo
        if m is None or self._at >= len(m):
            m = [*(m or ()), *([None] * (ByScan._places - len(m or ())))]
            object.__setattr__(scan, "memo", m)  # (frozen: the record's fields stay as they were)
        m[self._at] = value


_KEPT: ByScan[_Kept] = ByScan()  # by the stream's first scan


def walked(stream: str, parts: Sequence[Part], s: ClaimSettings, horizon: datetime | None,
           clock: Clock | None) -> Walk:
    """`walk(...)`, taken from the last evaluation when nothing it depends on changed. For a stream with
    something to walk (`analyze` walks no other: a quiet container's stream, at fleet size most of them,
    gives its first line alone, and keeping its walk cost ~0.8 KB a stream)."""
    head = parts[0].scan
    ids = tuple((p.src, p.label, p.restarts) for p in parts)
    kept = _KEPT.get(head)
    if kept is not None and kept.stream == stream and kept.parts == ids and len(kept.rest) == len(parts) - 1 \
            and all(a is b.scan for a, b in zip(kept.rest, parts[1:], strict=True)) \
            and (kept.settings is s or kept.settings == s):
        w = kept.walk
        if w.complete and (horizon is None or w.max_at is None or w.max_at <= horizon):
            return w
    w = walk(stream, parts, s, horizon, clock)
    if w.complete:
        # (a walk that left samples past the horizon out is walked again: they count once reached)
        _KEPT.put(head, _Kept(stream, tuple(p.scan for p in parts[1:]), ids, s, w))
    return w
