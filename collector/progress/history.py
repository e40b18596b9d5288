"""The live controller's own progress history: each poll's log tail joined to what it saw before.

A poll reads a bounded tail (the last 500 lines). Judged alone, everything before that tail is
`unobserved`, and after a container restart the pre-restart high-water mark is gone. The
controller keeps, per signal, what it has seen since it started watching: the new tail, led by
the dated samples and hang findings of earlier polls that are older than the tail's first line
(`merge_history`): the resume findings (a restart inside the container) included.

Bounded by what it means, not by age (`compact`): the last RECENT samples stay as read (the stall
window is built from the last 50 intervals, the skipped-step share from the last 20 reports);
before them, each stretch of samples of one kind (advancing, replaying below the high-water mark,
skipped, non-finite loss, ...) whose gaps all stay under the bridge (the stall window in force)
keeps its first and last sample (and the last one that showed a loss), each counting the dropped
ones before it (`ProgressSample.covers`) and standing for continuous progress since the one kept
before it. A run training steadily for days keeps RECENT samples and a handful more; every gap
that could be a stall keeps both its ends, so goodput and replay accounting stay what they were.
At most HISTORY_SAMPLES samples in all (the oldest go first) and MAX_FINDINGS findings; the
high-water mark is kept.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import islice
from operator import lt
from typing import Any

from collector.progress.model import (
    LogScan,
    PackedSamples,
    ProgressSample,
    RankSteps,
    SampleSummary,
    new_sample,
    summarize,
)
from collector.progress.scan import MAX_FINDINGS, RANK_STEPS
from collector.timeunits import US

RECENT = 64  # kept as read: 50 stall-window intervals and 20 step reports, with room to spare
BRIDGE = timedelta(seconds=60)  # the default stall floor: a gap under it is inside any stall window
HISTORY_SAMPLES = 4096


def merge_history(old: LogScan, new: LogScan, *, keep: int = HISTORY_SAMPLES) -> LogScan:
    """`new` led by what `old` saw before `new` begins. Items carried over get line numbers before
    the new tail's (negative), so "after the last step" by line keeps its meaning."""
    cut = new.first_at
    if cut is None or old.first_at is None or old.first_at >= cut:
        return new
    before = [s for s in old.samples if s.at is not None and s.at < cut]
    hangs = [h for h in old.hangs if h.at is not None and h.at < cut]
    xids = [x for x in old.xids if x.at is not None and x.at < cut]
    # a resume before the tail is the only word of a restart inside the container (torchrun's
    # worker group, a trainer's "resumed from"): losing it would make replayed steps look new
    resumes = [r for r in old.resumes if r.at is not None and r.at < cut]
    # every line of `old` (kept or not: its high-water sample may be one it no longer keeps) moves
    # before the new tail's first line
    shift = max([old.lines, *(s.line for s in before), *(h.line for h in hangs), *(x.line for x in xids),
                 *(r.line for r in resumes)]) + 1
    head = list(new.samples)
    bridged = _bridged_into(old.samples, head, cut) if before else 0
    if bridged:
        head[0] = replace(head[0], covers=head[0].covers + bridged)
    samples = [_moved(s, shift) for s in before] + head
    dropped = max(0, len(samples) - keep)
    lost, samples = samples[:dropped], samples[dropped:]
    old_sum, new_sum = old.summary_of(), new.summary_of()
    high = _higher(old_sum.high_water, new_sum.high_water)
    if high is not None and high is not new_sum.high_water:
        high = replace(high, line=high.line - shift)
    kept = summarize(tuple(samples))
    summary = SampleSummary(
        seen=old_sum.dropped + sum(s.covers for s in before) + bridged + new_sum.seen,
        skipped=sum(s.covers for s in before if s.skipped) + new_sum.skipped,
        dropped=sum(s.covers for s in lost) + old_sum.dropped + new_sum.dropped,
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
        resumes=tuple([replace(r, line=r.line - shift) for r in resumes] + list(new.resumes))[-MAX_FINDINGS:],
        summary=summary,
        first_at=old.first_at,
        ranks=_joined_ranks(old, new),
        tokens=new.tokens or old.tokens,
    )


def _joined_ranks(old: LogScan, new: LogScan) -> tuple[RankSteps, ...]:
    """Each rank of the new tail led by its steps of earlier polls from before the tail's (a 500-line
    tail of a 64-rank log holds a few steps per rank); a rank absent from the tail is not carried."""
    if not old.ranks or not new.ranks:
        return new.ranks
    before = {r.rank: r for r in old.ranks}
    out = []
    for r in new.ranks:
        o = before.get(r.rank)
        if o is None or not r.steps:
            out.append(r)
            continue
        keep = [(s, a) for s, a in zip(o.steps, o.at, strict=True) if s < r.steps[0] and a <= r.at[0]]
        steps = (*(s for s, _ in keep), *r.steps)[-RANK_STEPS:]
        at = (*(a for _, a in keep), *r.at)[-RANK_STEPS:]
        out.append(RankSteps(r.rank, steps, at))
    return tuple(out)


def extend_history(old: LogScan, new: LogScan, after: int, *, keep: int = HISTORY_SAMPLES) -> LogScan:
    """`old` (what a node agent sent before, on the agent's own line numbers) extended by `new`,
    what it read after line `after`: `new`'s samples replace `old`'s from the first of them (the
    agent leads with the last one before `after`, whose loss a redraw may have changed), and the
    findings after `after` are `new`'s. Summaries are recomputed from the samples kept."""
    cut = min(new.samples[0].line, after + 1) if new.samples else after + 1
    samples = [s for s in old.samples if s.line < cut] + list(new.samples)
    return _extended(old, new, after, tuple(samples[-keep:]))


def extend_packed(old: LogScan, new: LogScan, after: int, *, keep: int = HISTORY_SAMPLES) -> LogScan | None:
    """`extend_history(old, new, after)` where `old`'s samples are a plain pack and `new`'s pack alike:
    the same samples, packed, without building `old`'s (a head's history at its pace, extended by each
    agent pass: issue 30). None where that does not hold, or `old`'s lines do not rise (what is kept of
    it before the cut is then not a prefix): `extend_history` does it."""
    held = old.samples
    if not isinstance(held, PackedSamples) or not new.samples:
        return None
    cols = held.columns()
    got = new.samples  # (packed where the agent's document was decoded straight to a pack: `sources.agents`)
    inc = got if isinstance(got, PackedSamples) else PackedSamples.pack(list(got))  # (a list: not held built)
    inc_cols = inc.columns() if inc is not None else None
    if cols is None or inc is None or inc_cols is None:  # (the extension keeps both parts' columns)
        return None
    lines = cols[3]
    if not all(map(lt, lines, islice(lines, 1, None))):
        return None
    k = bisect_left(lines, min(inc_cols[3][0], after + 1))  # (the first sample's line, not built)
    if k + len(inc) > keep:
        return None
    samples = PackedSamples.joined(((held, 0, k), (inc, 0, len(inc))))
    return None if samples is None else _extended(old, new, after, samples)


def _extended(old: LogScan, new: LogScan, after: int, samples: tuple[ProgressSample, ...] | PackedSamples) -> LogScan:
    """`extend_history`'s scan, its samples given."""
    return replace(
        new,
        samples=samples,
        hangs=tuple([h for h in old.hangs if h.line <= after] + list(new.hangs))[-MAX_FINDINGS:],
        xids=tuple([x for x in old.xids if x.line <= after] + list(new.xids))[-MAX_FINDINGS:],
        resumes=tuple([r for r in old.resumes if r.line <= after] + list(new.resumes))[-MAX_FINDINGS:],
        summary=None,
        first_at=old.first_at or new.first_at,
        tokens=new.tokens or old.tokens,
    )


def _moved(s: ProgressSample, shift: int) -> ProgressSample:
    """`s` with its line `shift` lines earlier (`replace` costs three times as much, per sample per poll)."""
    return new_sample(s.step, s.at, s.loss, s.line - shift, s.format, s.skipped, s.total, s.covers)


def _bridged_into(old: Sequence[ProgressSample], new: Sequence[ProgressSample], cut: datetime) -> int:
    """How many samples a compacted stretch of `old` dropped before `cut`, when the stretch runs on
    into the new tail: the new tail's first sample then stands for them (0: none, or not bridged)."""
    q = next((s for s in old if s.at is not None and s.at >= cut), None)
    if q is None or q.covers <= 1 or not new or new[0].at is None or q.at is None:
        return 0
    again = sum(1 for s in new if s.at is not None and s.at < q.at)  # dropped, but read again now
    return max(0, q.covers - 1 - again)


def compact(scan: LogScan, *, bridge: timedelta = BRIDGE, recent: int = RECENT) -> LogScan:
    """`scan` with its samples before the last `recent` reduced to the two ends of each stretch.

    A stretch: consecutive dated samples of one kind (`_stretches`), each within `bridge` of the one
    before it (or itself standing for such a stretch). Its last sample gets `covers` = the samples
    it stands for; counts (seen, skipped, replayed) and every gap of `bridge` or more are kept.
    `bridge` must not exceed the stall window the claims will judge with (the controller passes
    the window in force, at least the stall floor), or a stall inside a stretch would count as
    progress."""
    samples = scan.samples
    if len(samples) <= recent + 2:
        return scan
    head = samples[:-recent]
    summary = scan.summary_of()
    high = summary.high_water
    kept = _stretches(head, bridge, _seed(head, high))
    if len(kept) == len(head):
        return scan
    if high is not None and not _holds(kept, high) and not _holds(samples[-recent:], high):
        # the high-water sample may now stand for dropped ones: point the summary at what is kept
        high = next((k for k in kept if k.line == high.line and k.step == high.step and k.at == high.at), high)
    return replace(scan, samples=(*kept, *samples[-recent:]), summary=replace(summary, high_water=high))


def compact_packed(scan: LogScan, cols: Sequence[Sequence[Any]], *, bridge: timedelta,
                   recent: int = RECENT) -> LogScan | None:
    """`compact(scan, bridge=bridge)`, packed, where `scan`'s samples are a plain pack whose lines rise
    (`cols`: its `PackedSamples.columns`): the stretches and the summary are read from the columns, only
    the samples kept of those compacted (and the summary's) are built, the recent samples' records are
    kept as they are. None where the lines do not rise, or the scan carries a summary of its own:
    `compact` does it."""
    samples = scan.samples
    assert isinstance(samples, PackedSamples)
    n = len(samples)
    if n <= recent + 2:
        return scan
    steps, us, losses, lines, totals, covers = cols
    if scan.summary is not None or not all(map(lt, lines, islice(lines, 1, None))):
        return None
    t = n - recent
    summary, hi = _plain_summary(samples, steps, totals, covers)
    high = summary.high_water
    # `_stretches` of the samples before the last `recent`, seeded as `_seed` would (the high-water mark
    # before them, where it is older than the first)
    kept = _stretches_plain(steps, us, losses, covers, t, bridge // US, steps[hi] if us[hi] < us[0] else None)
    if len(kept) == t:
        return scan
    # (`_holds` of the recent samples: the high-water sample is the hi-th, no other has its line; where it
    # is among those compacted, the one kept on its line, its covers as kept)
    if hi < t:
        high = next((_covering(samples.sample(i), c) for i, c in kept if i == hi), high)
    # the samples kept, packed from the columns (none built)
    front = samples.alike([(steps[i], us[i], losses[i], lines[i], totals[i], c) for i, c in kept])
    if front is None:
        return None
    packed = PackedSamples.joined(((front, 0, len(front)), (samples, t, n)))
    if packed is None:
        return None
    return replace(scan, samples=packed, summary=replace(summary, high_water=high))


def _covering(x: ProgressSample, covers: int) -> ProgressSample:
    return x if x.covers == covers else replace(x, covers=covers)


def _stretches_plain(steps: Sequence[int], us: Sequence[int], losses: Sequence[float], covers: Sequence[int],
                     t: int, bridge_us: int, high: int | None) -> list[tuple[int, int]]:
    """`_stretches` of a plain pack's first `t` samples (every one stepped and stamped with a finite loss,
    none skipped), from its columns: (place, covers) of each sample kept. A plain sample's kind is its
    place against the high-water mark and whether its loss is 0; each carries a loss, so a stretch
    keeps its first sample and its last, which counts those dropped between."""
    out: list[tuple[int, int]] = []
    prev_kind: tuple[int, bool] | None = None
    prev_at = 0
    last = -1  # the stretch's last sample after its first (-1: none yet)
    last_cov = 0  # what it stands for, with the samples dropped before it
    for i in range(t):
        step, at, cov = steps[i], us[i], covers[i]
        kind = (0 if high is None or step > high else 1 if step == high else 2, losses[i] == 0.0)
        if high is None or step > high:
            high = step
        if prev_kind is not None and kind == prev_kind and (cov > 1 or at - prev_at < bridge_us):
            if last >= 0:
                cov += last_cov
            last, last_cov = i, cov
        else:
            if last >= 0:
                out.append((last, last_cov))
            out.append((i, cov))
            last, last_cov = -1, 0
        prev_kind, prev_at = kind, at
    if last >= 0:
        out.append((last, last_cov))
    return out


def _plain_summary(samples: PackedSamples, steps: Sequence[int], totals: Sequence[int],
                   covers: Sequence[int]) -> tuple[SampleSummary, int]:
    """(`summarize(samples)` of a plain pack, the high-water sample's place): none skipped, every one
    stepped with a finite loss and a total, read from its columns; the first, the last (also the last
    with a loss) and the first at the highest step built alone."""
    last = samples.sample(-1)
    hi = steps.index(max(steps))
    return SampleSummary(seen=sum(covers), skipped=0, dropped=0, first=samples.sample(0), last=last,
                         high_water=last if hi == len(steps) - 1 else samples.sample(hi), last_with_loss=last,
                         first_nonfinite=None, total=totals[-1]), hi


def _holds(samples: Sequence[ProgressSample], x: ProgressSample) -> bool:
    """`x in samples`, the dataclass's == (a tuple of every field) only where the line is x's: == needs
    it, and a poll asks this of its 64 recent samples."""
    line = x.line
    return any(s is x or (s.line == line and s == x) for s in samples)


def _seed(head: Sequence[ProgressSample], high: ProgressSample | None) -> int | None:
    """The high-water step before `head` begins (a mark whose sample history no longer keeps)."""
    if high is None or high.step is None or high.at is None or not head or head[0].at is None:
        return None
    return high.step if high.at < head[0].at else None


def _stretches(samples: Sequence[ProgressSample], bridge: timedelta, high: int | None) -> list[ProgressSample]:
    """Each stretch's first and last sample, and the last one that showed a loss (the run's last
    loss may be it); each kept sample after the first counts the ones dropped before it."""
    out: list[ProgressSample] = []
    prev: ProgressSample | None = None  # the sample before this one
    prev_kind: tuple[object, ...] | None = None
    with_loss: ProgressSample | None = None  # the stretch's last sample with a loss, after its first
    loss_cov = 0  # samples dropped between the stretch's first and `with_loss`
    pending: ProgressSample | None = None  # the stretch's latest sample after those
    pend_cov = 0  # samples dropped between `with_loss` (or the first) and `pending`
    loss_state = 0
    for smp in samples:
        if smp.loss is not None:
            loss_state = _loss_kind(smp.loss)
        # a 0.0 loss is counted (a streak of them is not learning): samples without a loss differ there
        kind = (smp.skipped, smp.step is None, _replay(smp, high), smp.loss is not None and not math.isfinite(smp.loss),
                loss_state, loss_state == 2 and smp.loss is None)
        if not smp.skipped and smp.step is not None and (high is None or smp.step > high):
            high = smp.step
        joined = (prev is not None and kind == prev_kind and smp.at is not None and prev.at is not None
                  and (smp.covers > 1 or smp.at - prev.at < bridge))
        if not joined:
            _flush(out, with_loss, loss_cov, pending, pend_cov)
            out.append(smp)
            with_loss, loss_cov, pending, pend_cov = None, 0, None, 0
        elif smp.loss is not None:
            loss_cov += (with_loss.covers if with_loss else 0) + pend_cov + (pending.covers if pending else 0)
            with_loss, pending, pend_cov = smp, None, 0
        else:
            pend_cov += pending.covers if pending else 0
            pending = smp
        prev, prev_kind = smp, kind
    _flush(out, with_loss, loss_cov, pending, pend_cov)
    return out


def _flush(out: list[ProgressSample], with_loss: ProgressSample | None, loss_cov: int,
           pending: ProgressSample | None, pend_cov: int) -> None:
    for smp, cov in ((with_loss, loss_cov), (pending, pend_cov)):
        if smp is not None:
            out.append(replace(smp, covers=smp.covers + cov) if cov else smp)


def _replay(smp: ProgressSample, high: int | None) -> int:
    """0: past the high-water mark (or no step); 1: at it (a redraw); 2: below it (a replay)."""
    if smp.skipped or smp.step is None or high is None or smp.step > high:
        return 0
    return 1 if smp.step == high else 2


def _loss_kind(loss: float) -> int:
    """The loss state a sample leaves (a sample without a loss keeps the one before it)."""
    if not math.isfinite(loss):
        return 1
    return 2 if loss == 0.0 else 3


def _higher(a: ProgressSample | None, b: ProgressSample | None) -> ProgressSample | None:
    if a is None or a.step is None:
        return b
    if b is None or b.step is None:
        return a
    return a if a.step >= b.step else b
