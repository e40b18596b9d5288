"""How the loop folds a progress signal a source read (an API log read, a node agent's increment, a
checkpoint listing) into the one the index holds for the same container or source; and which of a
node agent's increments only confirm a progressing run's claims (`uneventful`, `confirms`), whose
re-evaluation the loop may defer (collector/changes.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import islice

from collector.claims.gpuspread import MIN_SLOWDOWN, slowdown_of
from collector.claims.progress import compacted, source_name
from collector.correlate import Signal
from collector.model import Claim, Evidence, Observed, Plane, RunClaims
from collector.progress.history import extend_history, extend_packed, merge_history
from collector.progress.model import Columns, LogScan, PackedSamples, ProgressSample
from collector.settings import ClaimSettings
from collector.timeunits import US

__all__ = ["adds_nothing", "alone", "carried", "confirms", "folded", "quiet_adds_nothing", "uneventful"]


def folded(prev: Signal | None, sig: Signal, op: str, after: int | None,
           claims: ClaimSettings) -> tuple[Signal, LogScan] | None:
    """What the index should hold after `sig` (from a change `op`: "log", "agent-log" with the line
    `after` which the agent's increment starts, or "signal"), and every sample read (for the sink).
    None: nothing new, only `prev`'s read time moves (see `Controller._refresh`)."""
    if prev is not None and after is not None and adds_nothing(prev.scan, sig.scan, after):
        return None  # an agent's increment with nothing new: read now, as it was
    if prev is not None and after is not None:
        # a node agent's increment: what it read after the document before (a plain history's packed, unbuilt)
        ext = extend_packed(prev.scan, sig.scan, after)
        sig = replace(sig, scan=ext if ext is not None else extend_history(prev.scan, sig.scan, after))
    elif prev is not None and not sig.scan.lines and op == "log":
        sig = replace(prev, read_at=sig.read_at)  # no line since the last read: what it saw stands
    elif prev is not None:
        # a poll reads a bounded tail: keep what earlier polls saw (goodput, pre-restart mark)
        sig = replace(sig, scan=merge_history(prev.scan, sig.scan))
    read = sig.scan  # every sample read, for the sink; the index keeps the compacted history
    if op != "signal":
        sig = compacted(sig, claims)
    return sig, read


def adds_nothing(held: LogScan, inc: LogScan, after: int) -> bool:
    """A node agent's increment (what it read after line `after`) that `extend_history` would add
    nothing to `held` with: no finding, no sample but the lead one the history already holds as it
    is, and the same line count and notes."""
    return (not inc.hangs and not inc.xids and not inc.resumes and inc.lines == held.lines and inc.format == held.format
            and inc.diagnostics == held.diagnostics and len(inc.samples) <= 1
            and (not inc.samples or (inc.samples[0].line <= after and bool(held.samples)
                                     and inc.samples[0] == held.samples[-1])))


def quiet_adds_nothing(held: LogScan, lines: int, fmt: str | None) -> bool:
    """`adds_nothing(held, inc, after)` of a quiet container's increment (`inc` holding nothing but its
    line count and format: `sources.agents.QuietLog`), without the scan: the same line count, format
    and (no) notes."""
    return lines == held.lines and fmt == held.format and not held.diagnostics


def uneventful(held: Signal, inc: Signal, after: int, gap: timedelta | None = None) -> ProgressSample | None:
    """A node agent's increment (`inc`, read after line `after` of `held`'s log) that can only carry
    `held`'s progress on: newer steps of the same kind, in order, each past every step `held`
    holds, dated no later than the read, with a finite non-zero loss and short of the run's total;
    no finding (hang, Xid, resume), no new rank track, tokens, format or diagnostics; with `gap`, each
    step at most `gap` after the one before (`held`'s newest first: no stall between). Its newest
    sample (the step the run's progress will stand at); None: anything else, which the loop
    evaluates at once (fail closed: a reason to doubt is a reason to look now)."""
    h, s = held.scan, inc.scan
    if (held.retired or held.durable or held.unseen or inc.unseen or inc.durable or inc.retired
            or held.ref.kind != "Pod" or inc.plane is not held.plane or inc.read_at < held.read_at
            or s.hangs or s.xids or s.resumes or s.ranks or h.ranks or s.tokens is not None
            or s.format != h.format or s.diagnostics != h.diagnostics or s.lines < h.lines
            or not s.samples or len(h.samples) < 2):
        return None
    last = h.samples.sample(-1) if isinstance(h.samples, PackedSamples) else h.samples[-1]  # (one built, not all)
    if last.step is None or last.at is None or last.skipped:
        return None
    # (a plain pack's steps read from its column: the held history is not built on each increment)
    cols = h.samples.columns() if isinstance(h.samples, PackedSamples) else None
    top = max(cols[0]) if cols is not None else max((x.step for x in h.samples if x.step is not None), default=None)
    samples = s.samples
    got = samples.columns() if isinstance(samples, PackedSamples) else None
    if got is not None:  # (decoded straight to a pack: `sources.agents`; read from its columns, not built)
        assert isinstance(samples, PackedSamples)
        return _uneventful_packed(samples, got, last, top, after, gap, inc.read_at)
    if samples[0].line <= after:
        # the agent leads with the last sample before `after`: only as held (a redrawn loss is news)
        if samples[0] != last or any(x.line <= after for x in samples[1:]):
            return None
        samples = samples[1:]
        if not samples:
            return None
    prev_step, prev_at, prev_line = last.step, last.at, max(last.line, after)
    for x in samples:
        if (x.step is None or x.at is None or x.skipped or x.covers != 1 or x.format != last.format
                or x.loss is None or not math.isfinite(x.loss) or x.loss == 0.0
                or (x.total is not None and x.step >= x.total) or x.line <= prev_line
                or x.step <= prev_step or (top is not None and x.step <= top) or x.at < prev_at
                or (gap is not None and x.at - prev_at > gap)):
            return None
        prev_step, prev_at, prev_line = x.step, x.at, x.line
    newest = samples[-1]
    assert newest.at is not None
    if newest.at > inc.read_at:
        return None  # stamped after it was read: a clock ahead (or forged), which the claims refuse
    return newest


def _uneventful_packed(p: PackedSamples, cols: Columns, last: ProgressSample, top: int | None, after: int,
                       gap: timedelta | None, read_at: datetime) -> ProgressSample | None:
    """`uneventful`'s walk of the increment's samples where they are a plain pack (`cols`: its columns;
    every sample stepped, stamped, with a finite loss and a total, not skipped, of one format): the same
    tests on the columns, stamps in µs. `last`: the held history's newest sample, `top` its highest step."""
    steps, us, losses, lines, totals, covers = cols
    first = p.sample(0)
    if first.format != last.format or last.at is None or last.step is None or first.at is None:
        return None
    i = 0
    if lines[0] <= after:
        # the agent leads with the last sample before `after`: only as held (a redrawn loss is news)
        if first != last or any(x <= after for x in islice(lines, 1, None)):
            return None
        i = 1
        if len(p) == 1:
            return None
    prev_step, prev_line = last.step, max(last.line, after)
    prev_us = (last.at - first.at) // US + us[0]  # (`last`'s stamp on the pack's clock)
    gap_us = gap // US if gap is not None else None
    for k in range(i, len(p)):
        step, at, line = steps[k], us[k], lines[k]
        if (covers[k] != 1 or losses[k] == 0.0 or step >= totals[k] or line <= prev_line or step <= prev_step
                or (top is not None and step <= top) or at < prev_us or (gap_us is not None and at - prev_us > gap_us)):
            return None
        prev_step, prev_us, prev_line = step, at, line
    newest = p.sample(-1)
    assert newest.at is not None
    return None if newest.at > read_at else newest  # (stamped after it was read: a clock ahead, or forged)


def confirms(rc: RunClaims | None, sig: Signal, now: datetime) -> bool:
    """Whether the run's current claims `rc` (its last evaluation, before `now`) already say what an
    evaluation with `sig` (a held signal extended by an `uneventful` increment) would say: progressing
    observed true on `sig`'s own steps, still before any instant they could change by the clock but
    the stall windows of its newest step (`RunClaims.recheck_other`: `sig`'s newer step moved them;
    the loop checks that they had not passed before it came, `ChangeApplier._deferred`), goodput
    accruing as productive time, no straggler or GPU suspect named. See also `alone`."""
    if (rc is None or rc.finished or rc.blocked is not None or rc.recheck_at is None or rc.queue is not None
            or not rc.evaluated_at <= now or (rc.recheck_other is not None and now >= rc.recheck_other)
            or rc.scheduled.observed is not Observed.TRUE or rc.running.observed is not Observed.TRUE
            or rc.progressing.observed is not Observed.TRUE or rc.progressing.cause
            or (rc.stragglers is not None and rc.stragglers.suspects)
            or rc.goodput is None or rc.goodput.accrues != "productive"):
        return False  # (goodput accruing as anything else, a replay say, is what a newer step may end)
    name = source_name(sig)
    if any(e.plane in _PROGRESS_PLANES and e.field not in _PLAIN for e in rc.progressing.evidence):
        return False  # replayed or skipped steps, a hang suspect, an Xid...: what a newer step may move
    # the run's progress stands on another log (or none): an increment of this one may move it
    return any(e.field == "last_step" and e.ref == name for e in rc.progressing.evidence)


def carried(rc: RunClaims, newest: ProgressSample) -> RunClaims:
    """`rc` with its progress standing at `newest`: its last step and loss as that sample's, all else
    as evaluated (reasons, ages, `evaluated_at`). What the exporter shows between a deferred run's
    evaluations (`ChangeApplier._deferred`), where `confirms` held `rc` for an increment whose newest
    sample `uneventful` found, on a node whose clock runs with ours: the step and loss an evaluation
    would give then. Its other evidence keeps its times, so no age reads younger than an evaluation's."""
    # Each record built directly, every field named (`replace` cost ~5x as much, on every agent pass of every
    # deferred run; tests/controller/test_confirm_defer.py holds these classes' fields to the lists here).
    step, loss, at = newest.step, newest.loss, newest.at
    p = rc.progressing
    evidence = tuple(Evidence(e.plane, e.ref, e.field, step, at, e.cluster) if e.field == "last_step" else
                     Evidence(e.plane, e.ref, e.field, loss, at, e.cluster) if e.field == "last_loss" else e
                     for e in p.evidence)
    return RunClaims(rc.ref, rc.scheduled, rc.running,
                     Claim(p.asserted, p.observed, p.verdict, p.since, p.reason, evidence, p.cause),
                     rc.blocked, rc.evaluated_at, rc.finished, rc.goodput, rc.extra, rc.recheck_at, rc.recheck_other,
                     rc.queue, rc.stragglers, rc.work_at_risk, rc.energy)


# The evidence of a progressing claim that says no more than how far the run got.
_PLAIN = frozenset({"last_step", "last_loss", "last_checkpoint_step"})
_PROGRESS_PLANES = frozenset({Plane.LOGS, Plane.GPU, Plane.RAY, Plane.EXPSTORE})  # (the others: the run's status)


def alone(sig: Signal, signals: Sequence[Signal]) -> bool:
    """`sig` the run's only progress log (`signals`: the run's, `sig` among them) but checkpoint listings:
    no other log (a rank, a replaced pod's) or Ray counter judged with it, no rank tracks to compare;
    and its pace not slower than its own baseline. The run's GPUs are not compared here: a GPU apart
    is a suspect only while the run is slower (`claims.gpuspread`), which this refuses, so what the
    comparison could add meanwhile is a note (readings apart while the run keeps its pace, readings not
    trusted), said at the deferred evaluation. Comparing every deferred run's GPUs on each of the
    agents' passes was a quarter of the loop at 50k pods (issue 30); devices lost or reporting an XID
    re-evaluate the run at the pass itself (`planes.node_agents.runs_changed`)."""
    key, source = sig.ref.key, sig.source
    for other in signals:  # (most of a run's signals are quiet containers': no samples, no key built)
        if other is sig or other.durable or not other.scan.samples or (other.source == source and other.ref.key == key):
            continue
        return False
    slow = slowdown_of(signals)  # (`sig`'s own: the only live log with steps)
    return slow is None or slow < MIN_SLOWDOWN
