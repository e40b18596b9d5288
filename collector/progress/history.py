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
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from collector.progress.model import LogScan, ProgressSample, RankSteps, SampleSummary, new_sample, summarize
from collector.progress.scan import MAX_FINDINGS, RANK_STEPS

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
    return replace(
        new,
        samples=tuple(samples[-keep:]),
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
