"""The live controller's own progress history: each poll's log tail joined to what it saw before.

A poll reads a bounded tail (the last 500 lines). Judged alone, everything before that tail is
`unobserved`, and after a container restart the pre-restart high-water mark is gone. The
controller keeps, per signal, what it has seen since it started watching: the new tail, led by
the dated samples and hang findings of earlier polls that are older than the tail's first line.
Bounded: the carried-over part is thinned to one sample per THIN (and every sample on either side
of a longer gap, so gaps that matter to goodput and stall windows stay exact; the stall floor is
60 s, above THIN), at most HISTORY_SAMPLES samples in all (about 34 h at one sample per 30 s), and
MAX_FINDINGS findings; the high-water mark is kept.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from collector.progress.model import LogScan, ProgressSample, SampleSummary, summarize
from collector.progress.scan import MAX_FINDINGS

THIN = timedelta(seconds=30)
HISTORY_SAMPLES = 4096


def merge_history(old: LogScan, new: LogScan, *, keep: int = HISTORY_SAMPLES) -> LogScan:
    """`new` led by what `old` saw before `new` begins. Items carried over get line numbers before
    the new tail's (negative), so "after the last step" by line keeps its meaning."""
    cut = new.first_at
    if cut is None or old.first_at is None or old.first_at >= cut:
        return new
    before = [s for s in old.samples if s.at is not None and s.at < cut]
    prefix = _thin(before)
    hangs = [h for h in old.hangs if h.at is not None and h.at < cut]
    xids = [x for x in old.xids if x.at is not None and x.at < cut]
    # every line of `old` (kept or not: its high-water sample may be one it no longer keeps) moves
    # before the new tail's first line
    shift = max([old.lines, *(s.line for s in prefix), *(h.line for h in hangs), *(x.line for x in xids)]) + 1
    samples = [replace(s, line=s.line - shift) for s in prefix] + list(new.samples)
    dropped = max(0, len(samples) - keep)
    samples = samples[dropped:]
    old_sum, new_sum = old.summary_of(), new.summary_of()
    high = _higher(old_sum.high_water, new_sum.high_water)
    if high is not None and high is not new_sum.high_water:
        high = replace(high, line=high.line - shift)
    kept = summarize(tuple(samples))
    summary = SampleSummary(
        seen=len(prefix) + new_sum.seen,
        skipped=sum(1 for x in prefix if x.skipped) + new_sum.skipped,
        dropped=dropped + len(before) - len(prefix) + old_sum.dropped + new_sum.dropped,
        first=kept.first,
        last=new_sum.last or kept.last,
        high_water=high,
        last_with_loss=new_sum.last_with_loss or kept.last_with_loss,
        first_nonfinite=kept.first_nonfinite,
        total=new_sum.total if new_sum.total is not None else old_sum.total,
    )
    return replace(
        new,
        samples=tuple(samples),
        hangs=tuple([replace(h, line=h.line - shift) for h in hangs] + list(new.hangs))[-MAX_FINDINGS:],
        xids=tuple([replace(x, line=x.line - shift) for x in xids] + list(new.xids))[-MAX_FINDINGS:],
        summary=summary,
        first_at=old.first_at,
    )


def _thin(samples: list[ProgressSample]) -> list[ProgressSample]:
    """At most one sample per THIN, but both ends of every longer gap (skipped samples kept: validity)."""
    out: list[ProgressSample] = []
    for i, smp in enumerate(samples):
        at = smp.at
        assert at is not None
        nxt = samples[i + 1].at if i + 1 < len(samples) else None
        if (not out or smp.skipped or at - (out[-1].at or at) >= THIN
                or (nxt is not None and nxt - at >= THIN) or nxt is None):
            out.append(smp)
    return out


def _higher(a: ProgressSample | None, b: ProgressSample | None) -> ProgressSample | None:
    if a is None or a.step is None:
        return b
    if b is None or b.step is None:
        return a
    return a if a.step >= b.step else b
