"""Goodput (ETTR): productive time over allocated time, and where the rest went.

Reconstructed from timestamps the evidence carries (creation, scheduling, progress advances,
container restarts), so a dump and the live controller compute the same numbers.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collector.claims.progress import ProgressView
from collector.correlate import RunEvidence
from collector.model import BADPUT_CAUSES, Goodput, PodFacts

ZERO = timedelta(0)


def goodput(ev: RunEvidence, view: ProgressView | None, scheduled_at: datetime | None, now: datetime,
            *, crash_looping: bool = False, stalled_now: bool = False) -> Goodput:
    created = ev.root.created
    bad = dict.fromkeys(BADPUT_CAUSES, 0.0)
    if created is not None:
        bad["queued"] = _secs((scheduled_at or now) - created)
    if scheduled_at is None or scheduled_at > now:
        return Goodput(0.0, 0.0, bad, None)
    allocated = _secs(now - scheduled_at)
    advances = [a for a in (view.advances if view else ()) if a.at >= scheduled_at]
    # Before the first evidence (the first timestamp of the logs read: a tail in the live controller)
    # nothing was seen: that time is unobserved, not "starting". A crash loop is seen in pod status.
    seen: datetime | None = view.observed_from if view is not None else None
    if advances:
        seen = min(seen or advances[0].at, advances[0].at)
    seen_from = now if seen is None else min(max(seen, scheduled_at), now)
    if not advances:
        if crash_looping:
            bad["restarting"] = allocated
        else:
            bad["unobserved"] = _secs(seen_from - scheduled_at)
            bad["starting"] = _secs(now - seen_from)
        return Goodput(allocated, 0.0, bad, None if view is None or not view.advances else 0.0)
    bad["unobserved"] = _secs(seen_from - scheduled_at)
    assert view is not None  # advances come from it
    restarts = sorted(
        c.last_finished
        for p in ev.pods if isinstance(p.facts, PodFacts)
        for c in p.facts.containers if c.last_finished is not None and c.last_finished >= scheduled_at
    )
    window = view.window
    bad["starting"] = _secs(advances[0].at - seen_from)
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
    productive = _secs(good)
    bad["restarting"] += _secs(restarting)
    bad["replaying"] += _secs(replaying)
    bad["stalled"] += _secs(stalled)
    last = advances[-1].at
    tail = now - last
    # Started over since the last advance and not past the mark yet: restarting until the replay
    # began, replaying since (a blind restart: restarting throughout, it proved nothing since).
    replay = view.replaying if view.replaying is not None and view.replaying.since > last else None
    blind = view.blind if view.blind is not None and view.blind.restart.at > last else None
    if replay is not None:
        bad["restarting"] += _secs(replay.since - last)
        bad["replaying"] += _secs(now - replay.since)
    elif blind is not None:
        bad["restarting"] += _secs(tail)
    # stalled_now: the claim says not progressing even inside the window (a hang after the last step)
    elif tail <= window and not stalled_now:
        productive += _secs(tail)
    elif crash_looping:
        bad["restarting"] += _secs(tail)
    else:
        bad["stalled"] += _secs(tail)
    return Goodput(allocated, productive, bad, productive / allocated if allocated > 0 else None)


def _secs(d: timedelta) -> float:
    return max(0.0, d.total_seconds())
