"""Records produced by the log scanner: progress samples, hang findings, XID findings."""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import islice
from operator import le, lt
from typing import Any, overload

from collector.timeunits import US

# Progress formats a sample can carry.
FORMATS: tuple[str, ...] = (
    "megatron",
    "deepspeed",
    "hf-trainer",
    "lightning",
    "regex",
    "ray-metric",
    "checkpoint",
    "torchtitan",
    "nemo",
    "automodel",
)

# Hang vocabulary (HangFinding.kind):
#   nccl-watchdog-timeout     ProcessGroupNCCL watchdog caught a collective past its timeout
#   nccl-watchdog-exception   the watchdog reports an error/timeout on a work item, or its thread died
#   nccl-desync-report        desync debug: the collective this rank timed out in
#   nccl-desync-lagging-rank  desync debug: a rank that never joined/finished that collective (the culprit)
#   nccl-async-error          NCCL async error handling aborted the communicator / took the process down
#   nccl-error                an NCCL call failed (ncclSystemError, "NCCL error in: ...", ...)
#   nccl-segfault             a process segfaulted inside libnccl (kernel log)
#   collective-timeout        a non-NCCL collective (gloo) timed out
#   nccl-timeout-dump         a rank's collective counters as the dump on a collective timeout runs (torch >=
#                             2.2 heartbeat monitor: "Received a dump signal ... Last enqueued NCCL work: N, last
#                             completed NCCL work: M"); every rank prints it, the one behind often nothing else
HANG_KINDS: tuple[str, ...] = (
    "nccl-watchdog-timeout",
    "nccl-watchdog-exception",
    "nccl-desync-report",
    "nccl-desync-lagging-rank",
    "nccl-async-error",
    "nccl-error",
    "nccl-segfault",
    "collective-timeout",
    "nccl-timeout-dump",
)


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """One training step seen in a log.

    `line`/`at` are where the step first appeared; `loss` is the latest value shown for that step
    (a redrawn progress bar updates the loss of the same step). `step` is None when the line shows
    activity without a step number (Hugging Face loss dicts with no Trainer bar): such samples say
    "the trainer did something then", never how far it got.

    `covers` > 1: the controller's history compacted a stretch (`progress.history.compact`); this
    sample stands for itself and the `covers - 1` samples of the same kind dropped before it, and
    the log advanced continuously (no gap past the compaction's bridge) since the sample kept
    before it.
    """

    step: int | None
    at: datetime | None
    loss: float | None
    line: int
    format: str
    skipped: bool = False
    total: int | None = None
    covers: int = 1


# A frozen dataclass's generated __init__ sets each field through object.__setattr__ (~0.55 µs for a
# sample) and the scanner makes one per progress line: new_sample sets the slots themselves (~0.3 µs),
# the same object field for field (tests/progress/test_scan_reference.py; SAMPLE_FIELDS is checked
# against the class there).
SAMPLE_FIELDS = ("step", "at", "loss", "line", "format", "skipped", "total", "covers")
_set_step, _set_at, _set_loss, _set_line, _set_format, _set_skipped, _set_total, _set_covers = (
    getattr(ProgressSample, name).__set__ for name in SAMPLE_FIELDS
)


def new_sample(step: int | None, at: datetime | None, loss: float | None, line: int, format: str,
               skipped: bool, total: int | None, covers: int = 1) -> ProgressSample:
    """ProgressSample(step, at, loss, line, format, skipped, total, covers), built faster."""
    x = object.__new__(ProgressSample)
    _set_step(x, step)
    _set_at(x, at)
    _set_loss(x, loss)
    _set_line(x, line)
    _set_format(x, format)
    _set_skipped(x, skipped)
    _set_total(x, total)
    _set_covers(x, covers)
    return x


# PackedSamples: one record a sample, in one bytes object: step, stamp (µs after the pack's base), loss,
# line, total, covers, flags, format (its place in the pack's formats).
_REC = struct.Struct("<qqdqqiBB")
_STEP_AT = struct.Struct(f"<qq{_REC.size - 16}x")  # a record's step and stamp alone
_NO_STEP, _NO_AT, _NO_LOSS, _NO_TOTAL, _SKIPPED, _LOSS_KEPT = 1, 2, 4, 8, 16, 32
_I64 = 1 << 63
_EPOCH_NAIVE = datetime(1970, 1, 1)  # (a pack's base, in its stamps' zone)
HOT = 64  # packs whose samples stay built (the latest asked for): a poll reads a history several times
_hot: deque[PackedSamples] = deque()
HOT_COLUMNS = 8  # packs whose columns stay read (a fold's held, extended and kept history, the next fold's)
_hot_cols: deque[PackedSamples] = deque()
# a plain pack's (steps, stamps in µs after its base, losses, lines, totals, covers)
Columns = tuple[Sequence[int], Sequence[int], Sequence[float], Sequence[int], Sequence[int], Sequence[int]]


def at_pace(steps: Sequence[int], us: Sequence[int]) -> bool:
    """A plain pack's steps and stamps (`PackedSamples.columns`) as a trainer at its pace prints them:
    every sample a new step, none stamped before the one before."""
    return all(map(lt, steps, islice(steps, 1, None))) and all(map(le, us, islice(us, 1, None)))


class PackedSamples(Sequence[ProgressSample]):
    """A history's samples at ~47 B each instead of ~230-260 (the sample, its stamp, loss, line and
    step objects): the controller holds every head's history between its polls (issue 30). Reads as
    the tuple of samples it was packed from: the same values field for field, a non-finite loss the
    very float object (its == holds only by identity), the same formats. Built again on access (the
    last HOT packs asked for stay built: one build a poll, not one a read)."""

    __slots__ = ("_data", "_n", "_base", "_formats", "_kept", "_built", "_plain", "_cols")

    _data: bytes
    _n: int
    _base: datetime | None
    _formats: tuple[str, ...]
    _kept: dict[int, float] | None  # place -> a non-finite loss, the object itself
    _built: tuple[ProgressSample, ...] | None
    _plain: bool  # every sample has a step, stamp, finite loss and total, is not skipped, of one format
    _cols: Columns | None  # (kept while among the last HOT_COLUMNS: `columns`)

    @staticmethod
    def pack(samples: Sequence[ProgressSample]) -> PackedSamples | None:
        """`samples` packed; None where a value would not come back the same (a stamp of another
        zone or type or with a fold, a number past 64 bits, a loss that is not a float, ...)."""
        tz: Any = None
        base: datetime | None = None
        formats: list[str] = []
        fmt_last: object = None  # (most samples show the format of the one before)
        f = 0
        every = 0  # the flags of any sample
        kept: dict[int, float] | None = None
        lo, hi = -_I64, _I64
        size, pack_into = _REC.size, _REC.pack_into
        out = bytearray(size * len(samples))
        for i, x in enumerate(samples):
            if type(x) is not ProgressSample:
                return None
            step, at, loss, line, total, covers, fmt, skipped = \
                x.step, x.at, x.loss, x.line, x.total, x.covers, x.format, x.skipped
            flags = _SKIPPED if skipped is True else 0
            if step is None:
                flags |= _NO_STEP
                step = 0
            elif type(step) is not int or not lo <= step < hi:
                return None
            us = 0
            if at is None:
                flags |= _NO_AT
            else:
                if type(at) is not datetime or at.fold:
                    return None
                if base is None:
                    tz = at.tzinfo
                    base = datetime(1970, 1, 1, tzinfo=tz)
                elif at.tzinfo is not tz:
                    return None
                us = (at - base) // US
            if loss is None:
                flags |= _NO_LOSS
                loss = 0.0
            elif type(loss) is not float:
                return None
            elif loss - loss != 0.0:  # (inf or NaN: the object itself is kept)
                flags |= _LOSS_KEPT
                kept = kept or {}
                kept[i] = loss
                loss = 0.0
            if total is None:
                flags |= _NO_TOTAL
                total = 0
            elif type(total) is not int or not lo <= total < hi:
                return None
            if (skipped is not True and skipped is not False) or type(line) is not int or not lo <= line < hi \
                    or type(covers) is not int or not 0 <= covers < 1 << 31:
                return None
            if fmt is not fmt_last:
                if type(fmt) is not str:
                    return None
                f = next((j for j, g in enumerate(formats) if g is fmt), -1)
                if f < 0:
                    if fmt in formats or len(formats) == 255:
                        return None  # (an equal string, another object: kept as it was)
                    formats.append(fmt)
                    f = len(formats) - 1
                fmt_last = fmt
            every |= flags
            pack_into(out, i * size, step, us, loss, line, total, covers, flags, f)
        p = PackedSamples()
        p._data, p._n, p._base, p._formats = bytes(out), len(samples), base, tuple(formats)
        p._kept, p._built, p._plain, p._cols = kept, None, not every and len(formats) == 1, None
        if type(samples) is tuple:  # (the evaluation after the poll that packed it reads them)
            p._hold(samples)
        return p

    @staticmethod
    def plain(rows: Sequence[tuple[int, int, float, int, int, int]], base: datetime, fmt: str) -> PackedSamples | None:
        """`pack` of plain samples given as (step, stamp in µs after `base`, loss, line, total, covers) rows,
        each of format `fmt`, not skipped: the same pack, without the samples (a node agent's increment of
        a head, decoded straight from its document: issue 30). `base`: 1970-01-01 in the stamps' zone, as
        `pack` takes it. None where `pack` would not make a plain pack of them (no row, a number past 64
        bits, a loss not finite, covers negative or past 31 bits)."""
        if not rows or base.fold or base.replace(tzinfo=None) != _EPOCH_NAIVE:
            return None
        size, pack_into = _REC.size, _REC.pack_into
        out = bytearray(size * len(rows))
        try:
            for i, (step, us, loss, line, total, covers) in enumerate(rows):
                if loss - loss != 0.0 or covers < 0:  # (inf or NaN: `pack` keeps the object, not a plain pack)
                    return None
                pack_into(out, i * size, step, us, loss, line, total, covers, 0, 0)
        except struct.error:  # (a number past 64 bits, covers past 31: as `pack`'s bounds)
            return None
        p = PackedSamples()
        p._data, p._n, p._base, p._formats = bytes(out), len(rows), base, (fmt,)
        p._kept, p._built, p._plain, p._cols = None, None, True, None
        return p

    def alike(self, rows: Sequence[tuple[int, int, float, int, int, int]]) -> PackedSamples | None:
        """`plain(rows, ...)` with this plain pack's base and format (the very objects: `joined` takes
        them together), its columns kept (the rows are at hand): a compacted history's front, from its
        columns (`progress.history.compact_packed`)."""
        if not self._plain or self._base is None:
            return None
        got = PackedSamples.plain(rows, self._base, self._formats[0])
        if got is not None:
            steps, us, losses, lines, totals, covers = zip(*rows, strict=True)
            got._keep_columns((steps, us, losses, lines, totals, covers))
        return got

    def built(self) -> tuple[ProgressSample, ...]:
        """The samples, built (kept built while this pack is among the last HOT asked for)."""
        got = self._built
        if got is None:
            got = self._build()
            self._hold(got)
        return got

    def _hold(self, built: tuple[ProgressSample, ...]) -> None:
        self._built = built
        _hot.append(self)
        if len(_hot) > HOT:
            _hot.popleft()._built = None

    def _build(self) -> tuple[ProgressSample, ...]:
        base, formats, kept = self._base, self._formats, self._kept
        data = self._data
        if self._plain and base is not None:  # (a trainer's steady history: ~15% faster)
            fmt = formats[0]
            return tuple([new_sample(step, base + us * US, loss, line, fmt, False, total, covers)
                          for step, us, loss, line, total, covers, _, _ in _REC.iter_unpack(data)])
        out = []
        for i, (step, us, loss, line, total, covers, flags, f) in enumerate(_REC.iter_unpack(data)):
            out.append(new_sample(
                None if flags & _NO_STEP else step,
                None if flags & _NO_AT or base is None else base + us * US,
                None if flags & _NO_LOSS else (kept[i] if flags & _LOSS_KEPT and kept is not None else loss),
                line, formats[f], bool(flags & _SKIPPED), None if flags & _NO_TOTAL else total, covers))
        return tuple(out)

    # --- reads of a plain pack without building it (the live controller's fold of an agent's increment
    # into a head's history, and the deferral's reads of it: issue 30) ---

    def columns(self) -> Columns | None:
        """(steps, stamps in µs after the base, losses, lines, totals, covers) of a plain pack (every
        sample stepped, stamped, with a finite loss and a total, not skipped, of one format); None for
        any other, whose readers build the samples. The last few packs asked keep theirs (a fold reads
        the held history's, then the deferral)."""
        got = self._cols
        if got is not None or not self._plain or self._base is None:
            return got
        steps, us, loss, lines, totals, covers, _, _ = zip(*_REC.iter_unpack(self._data), strict=True)
        got = (steps, us, loss, lines, totals, covers)
        self._keep_columns(got)
        return got

    def steps_stamps(self) -> tuple[Sequence[int], Sequence[int]] | None:
        """`columns`' steps and stamps alone (the others not unpacked, none kept): an evaluation's walk
        of a log (`claims.energy`)."""
        got = self._cols
        if got is not None:
            return got[0], got[1]
        if not self._plain or self._base is None:
            return None
        steps, us = zip(*_STEP_AT.iter_unpack(self._data), strict=True)
        return steps, us

    def _keep_columns(self, cols: Columns) -> None:
        """Keep `cols` as this plain pack's columns (one who made the pack from columns at hand), while
        it is among the last HOT_COLUMNS packs given or asked theirs."""
        self._cols = cols
        _hot_cols.append(self)
        if len(_hot_cols) > HOT_COLUMNS:
            _hot_cols.popleft()._cols = None

    def stamp(self, us: int) -> datetime:
        """The stamp `us` µs after this pack's base (a plain pack's)."""
        assert self._base is not None
        return self._base + us * US

    def sample(self, i: int) -> ProgressSample:
        """The `i`th sample (negative from the end), built alone when the pack is not built."""
        got = self._built
        if got is not None:
            return got[i]
        i = range(self._n)[i]  # (IndexError as a tuple's)
        base, kept = self._base, self._kept
        step, us, loss, line, total, covers, flags, f = _REC.unpack_from(self._data, i * _REC.size)
        return new_sample(
            None if flags & _NO_STEP else step,
            None if flags & _NO_AT or base is None else base + us * US,
            None if flags & _NO_LOSS else (kept[i] if flags & _LOSS_KEPT and kept is not None else loss),
            line, self._formats[f], bool(flags & _SKIPPED), None if flags & _NO_TOTAL else total, covers)

    @staticmethod
    def joined(parts: Sequence[tuple[PackedSamples, int, int]]) -> PackedSamples | None:
        """The samples `parts[i][1]:parts[i][2]` of each plain pack, in order, as one pack (their columns
        kept where every part's are); None unless every part is plain and alike (one zone object, one
        format object), as `pack` would have made them."""
        if not parts:
            return None
        first = parts[0][0]
        if not first._plain or first._base is None:
            return None
        tz, fmt = first._base.tzinfo, first._formats[0]
        size = _REC.size
        chunks = []
        n = 0
        for p, a, b in parts:
            if not p._plain or p._base is None or p._base.tzinfo is not tz or p._formats[0] is not fmt \
                    or not 0 <= a <= b <= p._n:
                return None
            chunks.append(p._data[a * size:b * size])
            n += b - a
        if not n:
            return None
        out = PackedSamples()
        out._data, out._n, out._base, out._formats = b"".join(chunks), n, first._base, first._formats
        out._kept, out._built, out._plain, out._cols = None, None, True, None
        have = [(c, a, b) for p, a, b in parts if (c := p._cols) is not None]
        if len(have) == len(parts):
            cols: list[list[Any]] = [[], [], [], [], [], []]
            for c, a, b in have:
                for col, part in zip(cols, c, strict=True):
                    col += part[a:b]
            out._keep_columns((cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]))
        return out

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> ProgressSample: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[ProgressSample, ...]: ...
    def __getitem__(self, i: int | slice) -> ProgressSample | tuple[ProgressSample, ...]:
        return self.built()[i]

    def __iter__(self) -> Iterator[ProgressSample]:
        return iter(self.built())

    def __reversed__(self) -> Iterator[ProgressSample]:
        return reversed(self.built())

    def __contains__(self, x: object) -> bool:
        return x in self.built()

    def index(self, x: Any, start: int = 0, stop: int = 2**63 - 1) -> int:
        return self.built().index(x, start, stop)

    def count(self, x: Any) -> int:
        return self.built().count(x)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedSamples):
            other = other.built()
        return isinstance(other, tuple) and self.built() == other

    def __hash__(self) -> int:
        return hash(self.built())

    def __repr__(self) -> str:
        return repr(self.built())

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self.built(),))


@dataclass(frozen=True, slots=True)
class HangFinding:
    kind: str
    line: int
    collective: str | None
    timeout_ms: int | None
    rank: int | None
    at: datetime | None
    seq: int | None = None  # WorkNCCL SeqNum on that rank (watchdog lines): the lowest rank is behind
    # The last collective this rank completed, where the line says (dump and PG-status lines).
    completed: int | None = None
    # The process group the counters belong to (its GUID, else its ID; "0" is the default group), where
    # the line names it. Sequence numbers count per group: only numbers of one group compare.
    pg: str | None = None


@dataclass(frozen=True, slots=True)
class XidFinding:
    code: int
    pci: str
    line: int
    meaning: str
    action: str
    at: datetime | None


@dataclass(frozen=True, slots=True)
class ResumeFinding:
    """A trainer's own word that it resumed from a checkpoint: `step` is where it says it resumed
    (None when the line names none). Evidence of a restart; the claims decide what it means."""

    line: int
    at: datetime | None
    step: int | None
    format: str


@dataclass(frozen=True, slots=True)
class RankSteps:
    """One rank's recent steps in a log whose lines carry rank prefixes (`[rank3]:`): each step the
    rank printed, with when it first printed it (its current run of rising steps only: a step that
    went back started the record over). Kept for every rank, the chosen stream's and the others',
    so the pace of ranks can be compared (`claims.stragglers`)."""

    rank: int
    steps: tuple[int, ...]
    at: tuple[datetime, ...]


@dataclass(frozen=True, slots=True)
class SampleSummary:
    """Running aggregates over every sample a scan saw, kept or not (history is bounded)."""

    seen: int  # samples seen, skipped ones included
    skipped: int
    dropped: int  # oldest samples not kept in LogScan.samples
    first: ProgressSample | None  # first real (not skipped) sample
    last: ProgressSample | None  # last real sample
    high_water: ProgressSample | None  # first real sample at the highest known step
    last_with_loss: ProgressSample | None
    first_nonfinite: ProgressSample | None  # first real sample whose loss was NaN/inf
    total: int | None  # the last total (max steps) a sample showed


def summarize(samples: Sequence[ProgressSample]) -> SampleSummary:
    """The summary of a complete sample list (sources that build LogScan themselves)."""
    real = [x for x in samples if not x.skipped]
    known = [x for x in real if x.step is not None]
    with_loss = [x for x in real if x.loss is not None]
    nonfinite = [x for x in with_loss if x.loss is not None and not math.isfinite(x.loss)]
    totals = [x.total for x in samples if x.total is not None]
    high = None
    for x in known:
        if high is None or (x.step or 0) > (high.step or 0):
            high = x
    return SampleSummary(
        seen=sum(x.covers for x in samples),
        skipped=sum(x.covers for x in samples if x.skipped),
        dropped=0,
        first=real[0] if real else None,
        last=real[-1] if real else None,
        high_water=high,
        last_with_loss=with_loss[-1] if with_loss else None,
        first_nonfinite=nonfinite[0] if nonfinite else None,
        total=totals[-1] if totals else None,
    )


@dataclass(frozen=True, slots=True)
class TokenRate:
    """Tokens per second per GPU as the trainer printed it last (torchtitan, NeMo Automodel), and when."""

    per_gpu: float
    at: datetime | None


@dataclass(frozen=True, slots=True, weakref_slot=True)  # (tests hold it weakly: what claims keep goes with it)
class LogScan:
    source: str
    format: str | None
    # the most recent samples (bounded, see scan.MAX_SAMPLES); a held history's packed (`PackedSamples`)
    samples: tuple[ProgressSample, ...] | PackedSamples
    hangs: tuple[HangFinding, ...]
    xids: tuple[XidFinding, ...]
    diagnostics: tuple[str, ...]
    lines: int
    summary: SampleSummary | None = None  # None: summarize(samples) (nothing was dropped)
    first_at: datetime | None = None  # the first timestamp in the input: evidence starts there
    resumes: tuple[ResumeFinding, ...] = ()  # checkpoint-resume lines (bounded like hangs)
    # Per-rank step times where lines carry rank prefixes and at least two ranks print steps (bounded:
    # scan.MAX_STREAMS ranks, scan.RANK_STEPS steps each). Not progress: the pace of ranks.
    ranks: tuple[RankSteps, ...] = ()
    tokens: TokenRate | None = None  # the newest tokens/s per GPU the trainer printed (energy per token)
    # What the claims derived from this scan object, kept on it (`claims.progress_walk.ByScan`): the
    # values go with the scan, with no table entry, weak reference and callback per scan and memo
    # (those took ~0.85 KB a signal, 85 MiB for 100k containers). Not a field of the record: not
    # compared, shown, passed to `__init__` or carried over by `replace` (a replaced scan is another).
    memo: list[object] | None = field(default=None, init=False, compare=False, repr=False)

    def summary_of(self) -> SampleSummary:
        return self.summary if self.summary is not None else summarize(self.samples)


# As `new_sample`: the node agents' poller makes one scan a container each pass (100,000 at 50k pods,
# most of them quiet), and the generated __init__ took ~1.8 µs of its ~4 µs (issue 30).
SCAN_FIELDS = ("source", "format", "samples", "hangs", "xids", "diagnostics", "lines", "summary", "first_at",
               "resumes", "ranks", "tokens", "memo")
(_set_source, _set_sformat, _set_samples, _set_hangs, _set_xids, _set_diagnostics, _set_lines, _set_summary,
 _set_first_at, _set_resumes, _set_ranks, _set_tokens, _set_memo) = (getattr(LogScan, name).__set__
                                                                     for name in SCAN_FIELDS)


def new_scan(source: str, format: str | None, samples: tuple[ProgressSample, ...] | PackedSamples,
             hangs: tuple[HangFinding, ...], xids: tuple[XidFinding, ...], diagnostics: tuple[str, ...], lines: int,
             resumes: tuple[ResumeFinding, ...] = (), tokens: TokenRate | None = None) -> LogScan:
    """LogScan(source, format, samples, hangs, xids, diagnostics, lines, resumes=..., tokens=...), built
    faster (no summary, first stamp or rank tracks: a node agent's document says none)."""
    x = object.__new__(LogScan)
    _set_source(x, source)
    _set_sformat(x, format)
    _set_samples(x, samples)
    _set_hangs(x, hangs)
    _set_xids(x, xids)
    _set_diagnostics(x, diagnostics)
    _set_lines(x, lines)
    _set_summary(x, None)
    _set_first_at(x, None)
    _set_resumes(x, resumes)
    _set_ranks(x, ())
    _set_tokens(x, tokens)
    _set_memo(x, None)
    return x


def shift_scan(scan: LogScan, by: timedelta) -> LogScan:
    """`scan` with every stamp moved by `by` (a node clock's skew, taken out)."""
    def at(t: datetime | None) -> datetime | None:
        return None if t is None else t + by

    sm = scan.summary

    def moved(x: ProgressSample | None) -> ProgressSample | None:
        return None if x is None else replace(x, at=at(x.at))

    return replace(
        scan,
        samples=tuple(replace(x, at=at(x.at)) for x in scan.samples),
        hangs=tuple(replace(h, at=at(h.at)) for h in scan.hangs),
        xids=tuple(replace(x, at=at(x.at)) for x in scan.xids),
        resumes=tuple(replace(r, at=at(r.at)) for r in scan.resumes),
        first_at=at(scan.first_at),
        ranks=tuple(replace(r, at=tuple(t + by for t in r.at)) for r in scan.ranks),
        tokens=None if scan.tokens is None else replace(scan.tokens, at=at(scan.tokens.at)),
        summary=None if sm is None else replace(sm, first=moved(sm.first), last=moved(sm.last),
                                                 high_water=moved(sm.high_water),
                                                 last_with_loss=moved(sm.last_with_loss),
                                                 first_nonfinite=moved(sm.first_nonfinite)),
    )
