"""Scan a log for progress samples, hangs and XID events; the `scan` report for one file.

Rules that keep look-alikes out of the progress signal:
- one stream counts: lines tagged `[rankN]:` / `[defaultN]:` (torchrun) or `rank=N` are split by
  rank, and rank 0 wins, then untagged lines, then the lowest rank with samples;
- consecutive frames of the same step (redrawn bars, a second rank echoing a step) are one sample,
  keeping where the step first appeared and the latest loss;
- eval/validation lines and bars, unconfirmed or foreign tqdm bars, and `0/N` bars are not samples;
- skipped steps (DeepSpeed overflow; DeepSpeed/Megatron reports whose interval was mostly skipped)
  are samples with skipped=True, never progress;
- Hugging Face loss dicts with no Trainer bar carry no step: their samples have step None;
- every `\r` frame of a line is read on its own (a bar, then an NCCL error or a loss dict);
- a number past what any trainer prints (`numbers`: steps < 2^53, ranks < 2^20, ...) voids its line,
  never the scan: the first such line is named in a diagnostic, the rest counted.
Bounded by design: each pattern sees at most MAX_PATTERN_TEXT characters of a frame, each stream
keeps its last MAX_SAMPLES samples (plus running aggregates: model.SampleSummary), and at most
MAX_STREAMS rank streams are tracked.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from collector.progress import hangs, trainers, xid
from collector.progress.model import (
    HangFinding,
    LogScan,
    ProgressSample,
    RankSteps,
    ResumeFinding,
    SampleSummary,
    TokenRate,
    XidFinding,
    new_sample,
)
from collector.progress.numbers import COUNT_MAX, RANK_MAX, OutOfRange, bounded, check
from collector.progress.streams import MAX_DIAGNOSTICS, Stream
from collector.progress.timestamps import find_time, is_rfc3339_prefix, parse_iso

MAX_FINDINGS = 1000  # per list (hangs, xids, resumes): a crash-looping job can log thousands
MAX_SAMPLES = 10_000  # per stream: the stall window needs the last 50 intervals, goodput a few hours
MAX_STREAMS = 64  # rank streams tracked before rank 0 speaks
# Ranks other than 0 are kept only until rank 0 speaks (and one is chosen only when it never
# does): a shorter history each keeps the worst case (64 ranks, no rank 0) to ~15 MB.
MAX_OTHER_RANK_SAMPLES = 1_000
# Every rank's recent step times are kept apart from the chosen stream (LogScan.ranks): this many
# steps per rank, for at most MAX_STREAMS ranks. Once rank 0 speaks, the other ranks' lines are
# parsed by a stream that keeps only its last samples (the parser's state), not their history.
RANK_STEPS = 128
SIDE_SAMPLES = 2
# The longest text any pattern sees: real progress/NCCL lines are under 2 KB; this bounds the work
# per frame whatever a tenant writes (the patterns are linear, this keeps the constant small).
MAX_PATTERN_TEXT = 16_384

_RANK_PREFIX = re.compile(r"\[(?:rank|default)(\d+)\]:\s?")
_RANK_EQ = re.compile(r"\brank=(\d+)\b")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class LineScanner:
    """Incremental scan state for one log source: feed lines, then read the summary.

    Public so the node agent can keep one per tailed container across reads.
    """

    def __init__(self, source: str, custom_regex: str | None, max_line_bytes: int, *, paces: bool = True) -> None:
        """`paces`: keep every rank's step times (LogScan.ranks); parsing the other ranks' lines costs up
        to twice the scan where every rank prints (a reader that does not send them passes False)."""
        self.source = source
        self.paces = paces
        self.custom = trainers.compile_custom(custom_regex) if custom_regex is not None else None
        self.max_line_bytes = max(1, max_line_bytes)
        self.lines = 0
        self.diagnostics: list[str] = []
        self.dropped_diagnostics = 0
        self.hangs: list[HangFinding] = []
        self.xids: list[XidFinding] = []
        self.dropped_hangs = 0
        self.dropped_xids = 0
        self.streams: dict[int | None, Stream] = {}
        self.rank0_locked = False
        self.ignored_ranks: set[int] = set()
        self.first_at: datetime | None = None
        self.capped = False
        self.resumes: list[ResumeFinding] = []
        self.dropped_resumes = 0
        self.out_of_range = 0  # lines voided by a number out of range
        # rank → its recent (step, first printed at): the pace of each rank (LogScan.ranks)
        self.rank_steps: dict[int, deque[tuple[int, datetime]]] = {}
        self.tokens: TokenRate | None = None  # the newest tokens/s per GPU printed (LogScan.tokens)
        self.side: dict[int, Stream] = {}  # parsers for ranks other than 0 once rank 0 speaks
        self.last_bar: tuple[str, trainers.Bar | None] | None = None  # _parse_bar's last frame (this line's)

    # -- diagnostics ------------------------------------------------------------------------------
    def diag(self, text: str) -> None:
        if len(self.diagnostics) < MAX_DIAGNOSTICS:
            self.diagnostics.append(text)
        else:
            self.dropped_diagnostics += 1

    # -- the per-line loop ------------------------------------------------------------------------
    def feed_all(self, lines: Iterable[str | bytes]) -> None:
        limit = self.max_line_bytes
        custom = self.custom is not None
        n = self.lines
        for raw in lines:
            n += 1
            if isinstance(raw, bytes):
                raw = raw.rstrip(b"\r\n")
                if len(raw) > limit:
                    raw = raw[:limit]
                    self.diag(f"line {n}: longer than {limit} bytes, truncated")
                try:
                    s = raw.decode()
                except UnicodeDecodeError:
                    s = raw.decode("utf-8", "replace")
                    self.diag(f"line {n}: not UTF-8, decoded with replacement")
            else:
                s = raw.rstrip("\r\n")
                # a str counts characters; only encode when it could be over the byte limit
                if len(s) * 4 > limit and len(s.encode("utf-8", "surrogatepass")) > limit:
                    s = s.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "replace")
                    self.diag(f"line {n}: longer than {limit} bytes, truncated")
            if self.first_at is None and n <= 1000:
                self.first_at = self._time(s[: is_rfc3339_prefix(s)], s)
            # The precheck: most lines are noise and stop here. Every parser below needs one of
            # these substrings (hangs.HANG_TRIGGERS are spelled out for speed); those holding "step"
            # or "loss" behind one test of it (noise seldom holds either).
            if (
                custom
                or "iteration" in s
                or "%|" in s
                or ("step" in s and ("step:" in s or "step=" in s or "kipping step" in s or "checkpoint at step" in s))
                or ("loss" in s and ("'loss'" in s or '"loss"' in s or "eval_loss" in s or "| loss " in s))
                or "Xid" in s
                or "ollective" in s
                or "atchdog" in s
                or "NCCL e" in s
                or "NCCL c" in s
                or "NCCL o" in s
                or "nccl" in s
                or "Timed out waiting" in s
                or "nqueued" in s
                or "loaded checkpoint" in s
                or "Continuing training" in s
                or "restart worker group" in s
                or "\x1b" in s
            ):
                self.feed(n, s)
        self.lines = n

    def feed(self, n: int, s: str) -> None:
        """One decoded line without its terminator: each `\r` frame is read on its own.

        A number out of range ends the line there: what it would have said is not kept (the frames
        before it on the same line are), and the scan goes on.
        """
        try:
            ts = ""
            cut = is_rfc3339_prefix(s)
            if cut:
                ts = s[:cut]
                s = s[cut + 1 :]
                # a trainer's logger that starts its lines with its own RFC 3339 time, after the kubelet's:
                # the kubelet's stamp is the one kept (it is the runtime's, not the tenant's); s[10] is
                # is_rfc3339_prefix's first test, here without the call most lines would fail
                if s[10:11] == "T":
                    again = is_rfc3339_prefix(s)
                    if again:
                        s = s[again + 1 :]
            if "\x1b" in s:
                s = _ANSI.sub("", s)
            st: Stream | None
            if s.startswith("[") or "rank=" in s:
                st, s, rank = self._stream_for(s)
            else:  # an untagged line (most): _stream_for's answer once the stream exists
                rank = None
                st = self.streams.get(None)
                if st is None:
                    st = self._stream_for(s)[0]
            before = len(st.samples) if st is not None else 0
            if "\r" in s:
                for frame in s.split("\r"):
                    if frame:
                        self._frame_any(st, rank, n, ts, frame)
            elif "%|" in s or len(s) > MAX_PATTERN_TEXT:
                self._frame_any(st, rank, n, ts, s)
            else:  # no bar to split, nothing to cut: _frame_any's answer without the call
                self._frame_one(st, n, ts, s, rank)
            if (
                st is not None
                and not self.rank0_locked
                and before == 0
                and st.samples
                and self.streams.get(0) is st
            ):
                # rank 0 speaks: other ranks' streams can never be chosen, stop keeping them
                self.rank0_locked = True
                for key in [k for k in self.streams if k is not None and k != 0]:
                    old = self.streams.pop(key)
                    if self.paces:
                        self.side[key] = old  # its parser state goes on (its samples are not kept)
                        old.samples = deque(list(old.samples)[-SIDE_SAMPLES:], maxlen=SIDE_SAMPLES)
        except OutOfRange as e:
            self.out_of_range += 1
            if self.out_of_range == 1:
                self.diag(f"line {n}: {e}; such a line yields nothing")
        self.last_bar = None  # a scanner kept between reads holds no frame of an old line

    def _frame_any(self, st: Stream | None, rank: int | None, n: int, ts: str, f: str) -> None:
        if len(f) > MAX_PATTERN_TEXT:
            if not self.capped:
                self.capped = True
                self.diag(f"line {n}: only the first {MAX_PATTERN_TEXT} characters of a line are parsed")
            f = f[:MAX_PATTERN_TEXT]
        # A bar followed by other text on one frame (a print or a C++ error without a newline): the
        # text after the bar is read as its own frame, with its own timestamp.
        while "%|" in f:
            bar = self._parse_bar(f)
            if bar is None or not 0 < bar.end < len(f) or not f[bar.end :].strip():
                break
            head = f[: bar.end]
            # the same bar parsed from its own text (what follows a bar never changes how it parses)
            self.last_bar = (head, bar)
            self._frame_one(st, n, ts, head, rank)
            f = f[bar.end :]
        self._frame_one(st, n, ts, f, rank)

    def _frame_one(self, st: Stream | None, n: int, ts: str, f: str, rank: int | None = None) -> None:
        if "Xid" in f:
            found = xid.match_xid(f)
            if found is not None:
                self._xid(n, ts, f, *found)
                return
        if hangs.may_be_hang(f):
            h = hangs.match_hang(f, rank)
            if h is not None:
                self._hang(n, ts, f, h)
        if (("checkpoint" in f and ("loaded checkpoint" in f or "checkpoint at step" in f))
                or "Continuing training" in f or "restart worker group" in f) and rank in (None, 0):
            # the other ranks echo rank 0's resume; their lines add nothing
            r = trainers.parse_resume(f)
            if r is not None:
                self._resume(n, ts, f, r)
        if st is not None:
            # _frame reads nothing from a frame without its substrings (feed_all's progress ones)
            self._frame(st, n, ts, f)

    def _parse_bar(self, f: str) -> trainers.Bar | None:
        """trainers.parse_bar(f), once a frame: _frame_any parses the bar to split the frame, _frame reads
        it. Keyed by the frame object, which the key holds alive: no other text can share its id."""
        last = self.last_bar
        if last is not None and last[0] is f:
            return last[1]
        bar = trainers.parse_bar(f)
        self.last_bar = (f, bar)
        return bar

    # -- findings ---------------------------------------------------------------------------------
    @staticmethod
    def _time(ts: str, text: str) -> datetime | None:
        return parse_iso(ts) if ts else find_time(text)

    def _xid(self, n: int, ts: str, s: str, code: int, pci: str) -> None:
        if len(self.xids) >= MAX_FINDINGS:
            self.dropped_xids += 1
            return
        meaning, action = xid.describe(code)
        self.xids.append(XidFinding(code, pci, n, meaning, action, self._time(ts, s)))

    def _hang(self, n: int, ts: str, s: str, h: hangs.Hang) -> None:
        if len(self.hangs) >= MAX_FINDINGS:
            self.dropped_hangs += 1
            return
        self.hangs.append(
            HangFinding(h.kind, n, h.collective, h.timeout_ms, h.rank, self._time(ts, s), h.seq, h.completed, h.pg)
        )

    def _resume(self, n: int, ts: str, s: str, r: trainers.Resume) -> None:
        if len(self.resumes) >= MAX_FINDINGS:
            self.dropped_resumes += 1
            return
        self.resumes.append(ResumeFinding(n, self._time(ts, s), r.step, r.format))

    # -- progress ---------------------------------------------------------------------------------
    def _stream_for(self, s: str) -> tuple[Stream | None, str, int | None]:
        """The stream this line belongs to (None: ignored rank), the line without a rank prefix, the rank."""
        rank: int | None = None
        if s.startswith("[rank") or s.startswith("[default"):
            m = _RANK_PREFIX.match(s)
            if m:
                rank = bounded(m.group(1), RANK_MAX, "rank")
                s = s[m.end() :]
        elif "rank=" in s:
            r = _RANK_EQ.search(s)
            if r:
                rank = bounded(r.group(1), RANK_MAX, "rank")
        if rank is not None and rank != 0 and self.rank0_locked:
            self.ignored_ranks.add(rank)
            # not a progress stream, only its pace is kept (a short parser state per rank, bounded)
            side = self.side.get(rank)
            if side is None and self.paces and len(self.side) < MAX_STREAMS:
                side = self.side[rank] = Stream(SIDE_SAMPLES, rank)
            return side, s, rank
        st = self.streams.get(rank)
        if st is None:
            if len(self.streams) >= MAX_STREAMS:
                if rank is not None and len(self.ignored_ranks) < MAX_STREAMS:
                    self.ignored_ranks.add(rank)
                return None, s, rank
            st = self.streams[rank] = Stream(MAX_SAMPLES if rank in (None, 0) else MAX_OTHER_RANK_SAMPLES, rank)
        return st, s, rank

    def _frame(self, st: Stream, n: int, ts: str, f: str) -> None:
        if self.custom is not None:
            got = trainers.parse_custom(self.custom, f)
            if isinstance(got, str):
                st.note_once("custom", f"line {n}: {got}")
            elif got is not None:
                self._emit(st, n, ts, f, got.step, got.loss, "regex", False, got.total)
            return
        if "Training epoch" in f:
            nemo = trainers.parse_nemo(f)
            if nemo is not None:
                if nemo.step is None:
                    st.note_once(
                        "nemo-nostep",
                        f"line {n}: NeMo progress lines without global_step past the first epoch carry no step; "
                        "they count as activity with an unknown step",
                    )
                self._emit(st, n, ts, f, nemo.step, nemo.loss, "nemo", False, nemo.total)
                return
        if "iteration" in f:
            meg = trainers.parse_megatron(f)
            if meg is not None:
                skipped = meg.skipped
                if st.meg_prev is not None and meg.step > st.meg_prev:
                    # most iterations of the interval were overflow skips: not progress
                    skipped = skipped or 2 * meg.skipped_count > meg.step - st.meg_prev
                st.meg_prev = meg.step
                self._emit(st, n, ts, f, meg.step, meg.loss, "megatron", skipped, meg.total)
                return
        if "kipping step" in f and trainers.is_deepspeed_overflow(f):
            prev_step = st.samples[-1].step if st.samples else None
            step = check((prev_step or 0) + 1, COUNT_MAX, "derived step")
            st.note_once(
                "ds-overflow",
                f"line {n}: DeepSpeed overflow lines carry no step; their step is the previous "
                "sample's + 1 (1 when none)",
            )
            self._emit(st, n, ts, f, step, None, "deepspeed", True, None)
            return
        if "step=" in f:
            ds = trainers.parse_deepspeed_step(f)
            if ds is not None:
                skipped = False
                if ds.skipped_total is not None:
                    # `skipped=` is cumulative: compare with the previous report (or with the start
                    # of training for the first one); most steps skipped since then is no progress
                    prev = st.ds_prev if st.ds_prev is not None and st.ds_prev[1] is not None else (0, 0)
                    advanced = ds.step - prev[0]
                    skipped = advanced > 0 and 2 * (ds.skipped_total - (prev[1] or 0)) > advanced
                st.ds_prev = (ds.step, ds.skipped_total)
                self._emit(st, n, ts, f, ds.step, ds.loss, "deepspeed", skipped, None)
                return
        if "step:" in f:
            titan = trainers.parse_torchtitan(f)
            if titan is not None:
                self._emit(st, n, ts, f, titan.step, titan.loss, "torchtitan", False, None)
                self._tokens(titan.tps, ts, f)
                return
        if "| loss " in f:
            auto = trainers.parse_automodel(f)
            if auto is not None:
                self._emit(st, n, ts, f, auto.step, auto.loss, "automodel", False, None)
                self._tokens(auto.tps, ts, f)
                return
        rest = f
        if "%|" in f:
            bar = self._parse_bar(f)
            if bar is not None:
                rest = f[bar.end :]  # text printed after the bar on the same frame (a loss dict)
                if not bar.lightning:
                    self._hf_bar(st, n, ts, f, bar)
                elif bar.n > 0:  # 0/N: nothing done yet
                    self._lightning(st, n, ts, f, bar)
        if "eval_loss" in rest:
            st.hf_eval = False  # the Trainer prints the evaluation metrics when the pass ends
        if "'loss'" in rest or '"loss"' in rest:
            hf = trainers.parse_hf_dict(rest)
            if hf is not None:
                self._hf_dict(st, n, ts, rest, hf)

    def _hf_dict(self, st: Stream, n: int, ts: str, f: str, hf: trainers.HfDict) -> None:
        st.hf_eval = False
        step: int | None
        if hf.step is not None:
            step = hf.step
        elif st.hf_total is not None and st.hf_last_n is not None:
            step = st.hf_last_n
        elif st.hf_pending is not None:
            # a training loss dict is written right after the training bar advanced: the bar
            # drawn just before it is the training bar, and its total is max_steps
            st.hf_total = st.hf_pending.total
            step = st.hf_last_n = st.hf_pending.n
        else:
            # No step in the dict and no Trainer bar: the dict says the trainer was active then,
            # not how far it got (counting dicts would report a step that never was).
            step = None
            st.note_once(
                "hf-nostep",
                f"line {n}: Hugging Face loss dicts carry no step and no Trainer bar was seen; "
                "they count as activity with an unknown step",
            )
        self._emit(st, n, ts, f, step, hf.loss, "hf-trainer", False, st.hf_total)

    def _hf_bar(self, st: Stream, n: int, ts: str, f: str, bar: trainers.Bar) -> None:
        if st.hf_total is None:
            if bar.n > 0:
                st.hf_pending = bar  # not yet known to be the training bar (could be eval)
        elif bar.total != st.hf_total or st.hf_eval:
            return
        elif st.hf_last_n is not None and bar.n < st.hf_last_n:
            # An evaluation bar of the training bar's length starts again from 0: ignore bars until
            # its metrics (eval_loss) or the next training loss dict.
            st.hf_eval = True
        elif bar.n > 0:
            st.hf_last_n = bar.n
            self._emit(st, n, ts, f, bar.n, None, "hf-trainer", False, bar.total)

    def _lightning(self, st: Stream, n: int, ts: str, f: str, bar: trainers.Bar) -> None:
        assert bar.epoch is not None
        if bar.total is not None:
            # stable whichever window of the log is read (tail-only reads)
            step = check(bar.epoch * bar.total + bar.n, COUNT_MAX, "epoch × total + position")
        else:
            if st.lt_epoch is not None and bar.epoch != st.lt_epoch:
                if bar.epoch > st.lt_epoch:
                    st.lt_offset += st.lt_maxn
                else:
                    st.lt_offset = 0
                st.lt_maxn = 0
            st.lt_epoch = bar.epoch
            st.lt_maxn = max(st.lt_maxn, bar.n)
            step = check(st.lt_offset + bar.n, COUNT_MAX, "derived step")
        self._emit(st, n, ts, f, step, bar.loss, "lightning", False, None)

    def _emit(
        self,
        st: Stream,
        n: int,
        ts: str,
        text: str,
        step: int | None,
        loss: float | None,
        fmt: str,
        skipped: bool,
        total: int | None,
    ) -> None:
        samples = st.samples
        if samples:
            last = samples[-1]
            if step is not None and last.step == step and last.format == fmt and last.skipped == skipped:
                if loss is not None or (total is not None and last.total is None):
                    samples[-1] = replace(
                        last,
                        loss=loss if loss is not None else last.loss,
                        total=last.total if last.total is not None else total,
                    )
                return
            if (
                step is not None
                and last.step is not None
                and step < last.step
                and not skipped
                and not last.skipped
            ):
                st.note(f"line {n}: step went back from {last.step} to {step} (restart, replay, or another counter)")
            if len(samples) == samples.maxlen:
                st.note_once("bounded", f"line {n}: more than {samples.maxlen} samples; the oldest are summarized only")
            st.commit(last)
            if total is not None and total == last.total:
                total = last.total  # one int object for the run's total, not one per sample kept
        at = parse_iso(ts) if ts else find_time(text)  # _time, without the call
        samples.append(new_sample(step, at, loss, n, fmt, skipped, total))
        if st.rank is not None and step is not None and at is not None and not skipped and self.paces:
            self._pace(st.rank, step, at)

    def _tokens(self, tps: float | None, ts: str, text: str) -> None:
        """The newest tokens/s per GPU a step line printed (the line's own stamp, when it has one)."""
        if tps is not None:
            self.tokens = TokenRate(tps, self._time(ts, text))

    def _pace(self, rank: int, step: int, at: datetime) -> None:
        """Record a rank's new step and when it printed it (its current run of rising steps)."""
        steps = self.rank_steps.get(rank)
        if steps is None:
            if len(self.rank_steps) >= MAX_STREAMS:
                return
            steps = self.rank_steps[rank] = deque(maxlen=RANK_STEPS)
        elif steps and step <= steps[-1][0]:
            if step == steps[-1][0]:
                return
            steps.clear()  # it went back (a restart, a replay): a new run of steps
        steps.append((step, at))

    # -- result -----------------------------------------------------------------------------------
    def finish(self) -> LogScan:
        with_samples = [k for k, v in self.streams.items() if v.samples]
        chosen_key: int | None = None
        if 0 in with_samples or None not in with_samples:
            chosen_key = min((k for k in with_samples if k is not None), default=None)
        chosen = self.streams.get(chosen_key)
        samples: tuple[ProgressSample, ...] = ()
        summary: SampleSummary | None = None
        fmt: str | None = None
        diagnostics = list(self.diagnostics)
        if chosen is not None and chosen.samples:
            samples = tuple(chosen.samples)
            summary = chosen.summary()
            counts = Counter(x.format for x in samples)
            fmt = max(counts, key=lambda k: counts[k])  # ties: first seen (Counter keeps order)
            diagnostics.extend(chosen.notes)
            if chosen.more_notes:
                diagnostics.append(f"... {chosen.more_notes} more progress notes")
            others = sorted(self.ignored_ranks | {k for k in with_samples if k is not None and k != chosen_key})
            if others or (chosen_key is not None and None in with_samples):
                label = "untagged lines" if chosen_key is None else f"rank {chosen_key}"
                diagnostics.append(
                    f"progress lines from several ranks ({', '.join(map(str, others)) or 'untagged'}); "
                    f"only {label} counted"
                )
        if self.dropped_diagnostics:
            diagnostics.append(f"... {self.dropped_diagnostics} more input problems")
        if self.dropped_hangs:
            diagnostics.append(f"{self.dropped_hangs} further hang findings not kept (limit {MAX_FINDINGS})")
        if self.dropped_xids:
            diagnostics.append(f"{self.dropped_xids} further XID findings not kept (limit {MAX_FINDINGS})")
        if self.dropped_resumes:
            diagnostics.append(f"{self.dropped_resumes} further resume findings not kept (limit {MAX_FINDINGS})")
        if self.out_of_range > 1:
            diagnostics.append(f"{self.out_of_range - 1} more lines with a number out of range yielded nothing")
        if self.lines == 0:
            diagnostics.append("empty input")
        paced = [RankSteps(r, tuple(x for x, _ in d), tuple(t for _, t in d))
                 for r, d in sorted(self.rank_steps.items()) if len(d) >= 2]
        return LogScan(
            source=self.source,
            format=fmt,
            samples=samples,
            hangs=tuple(self.hangs),
            xids=tuple(self.xids),
            diagnostics=tuple(diagnostics),
            lines=self.lines,
            summary=summary,
            first_at=self.first_at,
            resumes=tuple(self.resumes),
            ranks=tuple(paced) if len(paced) >= 2 else (),
            tokens=self.tokens,
        )
