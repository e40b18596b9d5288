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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import chain, islice
from operator import attrgetter, le, lt
from typing import Any

from collector.claims.common import Clock
from collector.claims.lineage import Lineage, Restart
from collector.claims.memo import newest_stamp
from collector.claims.progress_view import (
    OUTLIER_MADS,
    RECENT_INTERVALS,
    SKIP_RECENT,
    SKIP_RECENT_MIN,
    SKIPPED_STREAK,
    ZERO_LOSS_STREAK,
    Advance,
    Blind,
    Invalid,
    ProgressView,
    Replaying,
    StreamView,
    stall_window,
    stall_window_of,
)
from collector.claims.progress_walk import POSITION, SLOT, Part, Walk, nothing_in, restarts_in, walked
from collector.correlate import Key, Signal
from collector.progress import ProgressSample
from collector.progress.history import RECENT, compact, compact_packed
from collector.progress.model import LogScan, PackedSamples
from collector.settings import ClaimSettings

__all__ = [
    "OUTLIER_MADS",
    "RECENT_INTERVALS",
    "SKIPPED_STREAK",
    "SKIP_RECENT",
    "SKIP_RECENT_MIN",
    "ZERO_LOSS_STREAK",
    "Advance",
    "Blind",
    "Invalid",
    "ProgressView",
    "Replaying",
    "StreamView",
    "analyze",
    "compacted",
    "restarts_inside",
    "signal_window",
    "window_of",
]

_window = stall_window
_by_at = attrgetter("at")


def restarts_inside(sig: Signal) -> list[Restart]:
    """The trainer's own word that it started over inside this log (torchelastic restarting its
    workers, a resume from a checkpoint) after lines of progress: an in-process restart. Its steps
    after it are replays until they pass the mark before it; a stepless log's activity after it
    proves nothing (no mark to pass)."""
    return restarts_in(sig.scan, f"{sig.ref.name}/{sig.source}")


def source_name(sig: Signal) -> str:
    """How a signal is named in advances and reasons: pod/container (the pod alone for a pod-wide signal)."""
    return f"{sig.ref.name}/{sig.source}" if sig.source else sig.ref.name


def analyze(signals: Iterable[Signal], s: ClaimSettings, now: datetime | None = None, *,
            clock: Clock | None = None, lineage: Mapping[tuple[Key, str], Lineage] | None = None) -> ProgressView:
    """Advances, replays, validity and the stall windows; samples stamped after `now` are not known yet
    (`clock`, when given, is the `now` and notes when the first of them will be). `lineage`: which
    stream each pod signal continues, and where it started over (`claims.lineage.lineages`).

    Each stream is walked on its own and its walk kept while its signals stay as they were
    (`claims.progress_walk`); the run-wide figures are joined from the walks here, as one walk over
    every sample by time (ties: the signals' order, then the samples') would give them."""
    # Samples stamped past the horizon are not known yet (skew) or forged; a dump's capture time may
    # trail its newest real stamps by the clock's slack, so the horizon is the latest capture instant.
    horizon = clock.horizon if clock is not None else now
    streams: dict[str, list[tuple[int, Signal, tuple[Restart, ...]]]] = {}  # its signals: (place, signal, restarts)
    for place, sig in enumerate(signals):
        lin = lineage.get((sig.ref.key, sig.source)) if lineage else None
        restarts = lin.restarts if lin is not None else ()
        streams.setdefault(lin.stream if lin is not None else source_name(sig), []).append((place, sig, restarts))
    walks = []
    quiet_first: datetime | None = None
    for stream, held in streams.items():
        if all(nothing_in(sig.scan, restarts) for _, sig, restarts in held):
            # Nothing to walk (a quiet container's stream: at fleet size most of a run's): all its walk
            # would give is its first line, where the run's evidence starts (one past the horizon is
            # not known yet, as a sample's).
            for _, sig, _ in held:
                first = sig.scan.first_at
                if first is None:
                    continue
                if horizon is None or first <= horizon:
                    quiet_first = first if quiet_first is None or first < quiet_first else quiet_first
                elif clock is not None:
                    clock.expires(first)
            continue
        parts = [Part(sig.scan, source_name(sig), f"{sig.ref.name}/{sig.source}", restarts)
                 for _, sig, restarts in held]
        walks.append((walked(stream, parts, s, horizon, clock), [place for place, _, _ in held]))
    return _joined(walks, s, quiet_first)


def _joined(walks: list[tuple[Walk, list[int]]], s: ClaimSettings, quiet_first: datetime | None = None) -> ProgressView:
    """The run's view from its streams' walks (each with its signals' places in the run's order), and the
    first line of the streams with nothing to walk (`quiet_first`: none walked)."""
    def key(k: tuple[datetime, int], places: list[int]) -> tuple[datetime, int, int]:
        return (k[0], places[k[1] >> SLOT], k[1] & POSITION)

    # advances by time, ties by the signal's place, then the sample's: each slot's list is in order,
    # so the lists in place order, sorted stably by time
    slots = sorted((place, slot, w) for w, places in walks for slot, place in enumerate(places))
    if len(slots) == 1:
        advances = tuple(slots[0][2].advances(slots[0][1]))
    else:
        advances = tuple(sorted(chain.from_iterable(w.advances(slot) for _, slot, w in slots), key=_by_at))
    undated = sum(w.undated for w, _ in walks)
    firsts = [w.first for w, _ in walks if w.first is not None]
    observed_from = min((*firsts, quiet_first) if quiet_first is not None else firsts, default=None)
    high = {w.stream: w.high for w, _ in walks if w.high is not None}
    # the run-wide streaks, from what follows the last place that ended them
    last_adv = max((key(w.last_adv, p) for w, p in walks if w.last_adv is not None), default=None)
    skips = sorted(((at, p[o >> SLOT], o & POSITION), n, at, step, src, w.stream)
                   for w, p in walks for at, o, n, step, src in w.skip_tail)
    skips = [x for x in skips if last_adv is None or x[0] > last_adv]
    skipped_since = Advance(skips[0][2], skips[0][3], skips[0][4], stream=skips[0][5]) if skips else None
    finite = max((key(w.finite_key, p) for w, p in walks if w.finite_key is not None), default=None)
    losses = sorted(((at, p[o >> SLOT], o & POSITION), loss, n, adv)
                    for w, p in walks for at, o, loss, n, adv in w.loss_tail)
    bad_since, invalid = _loss_streak([x for x in losses if finite is None or x[0] > finite])
    last_loss = max(((key(w.last_loss[0], p), w.last_loss[1]) for w, p in walks if w.last_loss is not None),
                    default=None)
    recent = _last_reports(walks)
    views = [w.view for w, p in sorted((x for x in walks if x[0].first_adv is not None),
                                       key=lambda x: key(_some(x[0].first_adv), x[1])) if w.view is not None]
    # The run's current stream: the one whose window closes last (ties: the newest advance).
    current = max(views, key=lambda v: (v.last.at + v.window, v.last.at), default=None)
    replaying = max((w.replaying for w, p in sorted((x for x in walks if x[0].replaying is not None),
                                                    key=lambda x: key(_some(x[0].replay_key), x[1]))
                     if w.replaying is not None), key=lambda r: r.last.at, default=None)
    blind = max((w.blind for w, p in sorted((x for x in walks if x[0].blind is not None),
                                            key=lambda x: key(_some(x[0].blind_key), x[1]))
                 if w.blind is not None), key=lambda b: b.last.at, default=None)
    floor_window, floor_basis = _window([], s) if current is None else (current.window, current.basis)
    restarted = None
    if current is not None:
        restarted = next(w.latest_restart for w, _ in walks if w.stream == current.last.stream)
        if restarted is not None and restarted.at < current.last.at:
            restarted = None
    return ProgressView(
        advances=advances,
        undated=undated,
        replayed=sum(w.replayed for w, _ in walks),
        skipped=sum(w.skipped for w, _ in walks),
        last_step=max(high.values()) if high else None,
        last_loss=last_loss[1] if last_loss is not None else None,
        nonfinite_since=bad_since,
        window=current.window if current else floor_window,
        median_step_s=current.median_step_s if current else None,
        mad_step_s=current.mad_step_s if current else None,
        window_basis=current.basis if current else floor_basis,
        invalid=invalid,
        observed_from=observed_from,
        high_water=high,
        skipped_since=skipped_since,
        skipped_streak=sum(x[1] for x in skips),
        recent_skipped=(sum(1 for x in recent if x.skipped), len(recent)),
        recent_skipped_since=recent[0].at if recent else None,
        last=current.last if current else None,
        replaying=replaying,
        blind=blind,
        streams=tuple(views),
        restarted=restarted,
    )


def _last_reports(walks: list[tuple[Walk, list[int]]]) -> Sequence[ProgressSample]:
    """The run's last SKIP_RECENT step reports, from each walk's last ones (in order within a walk): those
    stamped no earlier than a bound the SKIP_RECENT-th newest cannot be older than (the newest few of
    every walk, enough of them to make SKIP_RECENT), then ordered."""
    if len(walks) == 1:
        return walks[0][0].reports()  # (the order within it is the run's)
    each = -(-SKIP_RECENT // max(1, len(walks)))
    reports = [(w.reports(), w.recent_orders, places) for w, places in walks]
    ends = sorted((x.at for recent, _, _ in reports for x in recent[-each:] if x.at is not None), reverse=True)
    bound = None if len(ends) < SKIP_RECENT else ends[SKIP_RECENT - 1]
    out: list[tuple[datetime, int, int, int, ProgressSample]] = []
    for recent, orders, places in reports:
        for x, o in zip(reversed(recent), reversed(orders), strict=True):
            assert x.at is not None
            if bound is not None and x.at < bound:
                break
            out.append((x.at, places[o >> SLOT], o & POSITION, len(out), x))
    out.sort()
    return [x for *_, x in out[-SKIP_RECENT:]]


def _some(k: tuple[datetime, int] | None) -> tuple[datetime, int]:
    assert k is not None
    return k


def _loss_streak(tail: list[tuple[tuple[datetime, int, int], float, int, Advance]]) -> \
        tuple[Advance | None, Invalid | None]:
    """The non-finite streak and the invalid steps that the losses after the run's last finite non-zero
    one leave (that one ended every streak)."""
    bad_since: Advance | None = None
    invalid: Invalid | None = None
    zero_since: Advance | None = None  # the first of the current streak of 0.0 losses ...
    zero_count = 0  # ... and how many samples it holds
    for _, loss, n, adv in tail:
        if not math.isfinite(loss):
            bad_since = bad_since or adv
            invalid = invalid if invalid is not None and invalid.why.startswith("loss is") else \
                Invalid(adv, f"loss is {loss}")
            zero_since, zero_count = None, 0
        else:  # exactly 0.0 (a finite non-zero loss ends the tail's walk before it)
            bad_since = None
            if zero_since is None:
                zero_since = adv
            zero_count += n
            if zero_count >= ZERO_LOSS_STREAK and (invalid is None or invalid.since != zero_since):
                invalid = Invalid(zero_since, "loss stuck at exactly 0.0")
    return bad_since, invalid


def window_of(view: ProgressView, stream: str, s: ClaimSettings) -> timedelta:
    """The stall window of one stream (the floor when it has not advanced yet: no cadence of its own)."""
    return next((v.window for v in view.streams if v.last.stream == stream), None) or _window([], s)[0]


COMPACT_SLACK = 16  # samples past RECENT a history may hold before it is compacted again


def compacted(sig: Signal, s: ClaimSettings) -> Signal:
    """`sig` with its history compacted (`progress.history.compact`), bridging gaps inside the stall
    window its own recent samples give (at least the stall floor). The window in force when a
    stretch is compacted decides for good that its gaps were progress. The samples kept are packed
    (`PackedSamples`: the index holds every head's history between its polls)."""
    out = sig.scan
    samples = out.samples
    if len(samples) > RECENT + COMPACT_SLACK:  # (a poll adds a few samples: compact every few polls, not on each)
        got = _compacted_packed(out, s) if isinstance(samples, PackedSamples) else None
        out = got if got is not None else compact(out, bridge=signal_window(samples[-RECENT:], s))
    if out.samples and not isinstance(out.samples, PackedSamples):
        packed = PackedSamples.pack(out.samples)
        if packed is not None:
            out = replace(out, samples=packed)
            newest_stamp(out)  # (kept on the scan: every evaluation asks, the samples are at hand now)
    return sig if out is sig.scan else replace(sig, scan=out)


def _compacted_packed(scan: LogScan, s: ClaimSettings) -> LogScan | None:
    """`compact(scan, bridge=signal_window(its last RECENT samples))` on a plain pack's columns, none of
    its recent samples built (`progress.history.compact_packed`: a head's history at its pace, extended
    packed by an agent's increment, issue 30); None: the object path."""
    samples = scan.samples
    assert isinstance(samples, PackedSamples)
    cols = samples.columns()
    if cols is None:
        return None
    bridge = _signal_window_packed(cols, len(samples) - RECENT, s)
    return None if bridge is None else compact_packed(scan, cols, bridge=bridge)


def _signal_window_packed(cols: Sequence[Sequence[Any]], t: int, s: ClaimSettings) -> timedelta | None:
    """`signal_window` of a plain pack's samples from the `t`th on (`cols`: its columns): none skipped,
    every one stepped and stamped with a finite loss. None where the stamps go back (`signal_window`
    orders the samples by them)."""
    steps, us, _, _, _, covers = cols
    stamps = us[t:]
    if not all(map(le, stamps, islice(stamps, 1, None))):
        return None
    steps, covers = steps[t:], covers[t:]
    if all(map(lt, steps, islice(steps, 1, None))) and max(covers, default=0) <= 1:
        # (a trainer at its pace: every sample advances, each interval counts)
        last = stamps[-RECENT_INTERVALS - 1:]
        return stall_window_of([(b - a) / 1_000_000 for a, b in zip(last, islice(last, 1, None), strict=False)], s)
    secs: list[float] = []
    high: int | None = None
    replaying = False
    prev: int | None = None  # the previous advance's stamp
    for step, at, cov in zip(steps, stamps, covers, strict=True):
        if high is not None and step <= high:
            replaying = replaying or step < high
            continue
        high = step
        after_replay, replaying = replaying, False
        if prev is not None and not after_replay and cov <= 1:
            secs.append((at - prev) / 1_000_000)  # (timedelta.total_seconds: the same division of µs)
        prev = at
    return stall_window_of(secs[-RECENT_INTERVALS:], s)


def signal_window(samples: Sequence[ProgressSample], s: ClaimSettings) -> timedelta:
    """The stall window `analyze` gives one signal's samples, without the rest of its work (the
    controller asks on every log increment; tests hold the two equal)."""
    secs: list[float] = []
    high: int | None = None
    last_seen: datetime | None = None
    replaying = False
    prev_at: datetime | None = None  # the previous advance
    for smp in sorted([x for x in samples if x.at is not None and not x.skipped], key=_by_at):
        at = smp.at
        assert at is not None
        step = smp.step
        after_replay = False
        if step is None:
            if last_seen is not None and at <= last_seen:
                continue
            last_seen = at
        else:
            if high is not None and step <= high:
                replaying = replaying or step < high
                continue
            high = step
            after_replay, replaying = replaying, False
        loss = smp.loss
        if loss is not None and not math.isfinite(loss):
            continue
        if prev_at is not None and not after_replay and smp.covers <= 1:
            secs.append((at - prev_at).total_seconds())
        prev_at = at
    return stall_window_of(secs[-RECENT_INTERVALS:], s)
