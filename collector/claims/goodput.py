"""Goodput (ETTR): productive time over allocated time, and where the rest went.

Reconstructed from timestamps the evidence carries (creation, scheduling, progress advances,
container restarts), so a dump and the live controller compute the same numbers.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collector.claims.common import Clock
from collector.claims.progress import ProgressView
from collector.correlate import RunEvidence
from collector.model import BADPUT_CAUSES, Goodput, PodFacts, elapsed_s

ZERO = timedelta(0)


def goodput(ev: RunEvidence, view: ProgressView | None, scheduled_at: datetime | None, now: datetime,
            *, crash_looping: bool = False, stalled_now: bool = False, clock: Clock | None = None) -> Goodput:
    """The run's time by bucket at `now`, and what of it grows with the clock: until `clock`'s
    `recheck_at` (the instants the figures stop being linear are noted on it), exactly one bucket
    and the allocation grow a second a second, so `Goodput.at(later)` equals an evaluation then."""
    clock = clock if clock is not None else Clock(now)  # (only its deadlines are used)
    created = ev.root.created
    bad = dict.fromkeys(BADPUT_CAUSES, 0.0)
    acc = _Accrual(clock)
    if scheduled_at is None or scheduled_at > now:
        if scheduled_at is not None:
            clock.expires(scheduled_at)  # the allocation starts then
        if created is not None:
            if scheduled_at is None:
                acc.set("queued", 0.0, created)
            bad["queued"] = elapsed_s((scheduled_at or now) - created)
        return acc.goodput(0.0, 0.0, bad, None)
    allocated = elapsed_s(now - scheduled_at)
    acc.allocated_from = scheduled_at
    if created is not None:
        bad["queued"] = elapsed_s(scheduled_at - created)
    advances = [a for a in (view.advances if view else ()) if a.at >= scheduled_at]
    # Before the first evidence (the first timestamp of the logs read: a tail in the live controller)
    # nothing was seen: that time is unobserved, not "starting". A crash loop is seen in pod status.
    seen: datetime | None = view.observed_from if view is not None else None
    if advances:
        seen = min(seen or advances[0].at, advances[0].at)
    seen_from = now if seen is None else min(max(seen, scheduled_at), now)
    if not advances:
        if crash_looping:
            acc.set("restarting", 0.0, scheduled_at)
            bad["restarting"] = allocated
        else:
            # Unobserved until the first evidence (all of it while none is seen), starting since.
            mark = None if seen is None else max(seen, scheduled_at)
            if mark is None or mark > now:
                acc.set("unobserved", 0.0, scheduled_at)
                if mark is not None:
                    clock.expires(mark)
            else:
                acc.set("starting", 0.0, mark)
            bad["unobserved"] = elapsed_s(seen_from - scheduled_at)
            bad["starting"] = elapsed_s(now - seen_from)
        return acc.goodput(allocated, 0.0, bad, None if view is None or not view.advances else 0.0)
    acc.rated = True
    bad["unobserved"] = elapsed_s(seen_from - scheduled_at)
    assert view is not None  # advances come from it
    restarts = sorted(
        c.last_finished
        for p in ev.pods if isinstance(p.facts, PodFacts)
        for c in p.facts.containers if c.last_finished is not None and c.last_finished >= scheduled_at
    )
    window = view.window
    bad["starting"] = elapsed_s(advances[0].at - seen_from)
    # advances are in time order: every gap is >= 0 (summed as timedeltas, converted once)
    good = restarting = replaying = stalled = ZERO
    for a, b in zip(advances, advances[1:], strict=False):
        gap = b.at - a.at
        if b.replay_from is not None and a.at <= b.replay_from <= b.at:
            restarting += b.replay_from - a.at
            replaying += b.at - b.replay_from
        elif gap <= window or b.bridged:  # bridged: continuous progress (compacted history)
            good += gap
        elif any(a.at <= r <= b.at for r in restarts):
            restarting += gap
        else:
            stalled += gap
    productive = elapsed_s(good)
    bad["restarting"] += elapsed_s(restarting)
    bad["replaying"] += elapsed_s(replaying)
    bad["stalled"] += elapsed_s(stalled)
    last = advances[-1].at
    tail = now - last
    # Started over since the last advance and not past the mark yet: restarting until the replay
    # began, replaying since (a blind restart: restarting throughout, it proved nothing since).
    replay = view.replaying if view.replaying is not None and view.replaying.since > last else None
    blind = view.blind if view.blind is not None and view.blind.restart.at > last else None
    if replay is not None:
        bad["restarting"] += elapsed_s(replay.since - last)
        acc.set("replaying", bad["replaying"], replay.since)
        bad["replaying"] += elapsed_s(now - replay.since)
    elif blind is not None:
        acc.set("restarting", bad["restarting"], last)
        bad["restarting"] += elapsed_s(tail)
    # stalled_now: the claim says not progressing even inside the window (a hang after the last step)
    elif tail <= window and not stalled_now:
        clock.expires(last + window, step=True)  # the whole tail is stalled time after it
        acc.set("productive", productive, last)
        productive += elapsed_s(tail)
    elif crash_looping:
        acc.set("restarting", bad["restarting"], last)
        bad["restarting"] += elapsed_s(tail)
    else:
        acc.set("stalled", bad["stalled"], last)
        bad["stalled"] += elapsed_s(tail)
    return acc.goodput(allocated, productive, bad, productive / allocated if allocated > 0 else None)


class _Accrual:
    """The bucket that grows with the clock from an instant (one ahead of the clock grows from then, as
    `elapsed_s` clamps it: no deadline), the allocation's start, whether the ratio is productive/allocated."""

    __slots__ = ("clock", "bucket", "base", "since", "allocated_from", "rated")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.bucket, self.base = "", 0.0
        self.since: datetime | None = None
        self.allocated_from: datetime | None = None
        self.rated = False

    def set(self, bucket: str, base: float, since: datetime) -> None:
        self.bucket, self.base, self.since = bucket, base, since

    def goodput(self, allocated: float, productive: float, bad: dict[str, float], ratio: float | None) -> Goodput:
        return Goodput(allocated, productive, bad, ratio, self.bucket, self.base, self.since,
                       self.allocated_from, self.rated)
