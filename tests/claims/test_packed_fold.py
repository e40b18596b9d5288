"""A node agent's increment folded into a head's packed history without building it (issue 30):
`progress.history.extend_packed`, `compact_packed`, `claims.progress._compacted_packed`, and the
deferral's reads of the held pack (`planes.signals.uneventful`, `claims.gpuspread.slowdown_of`,
`claims.memo.newest_stamp`), and an evaluation's walk of it for energy per step
(`claims.energy.timeline`). The oracle is the object path each replaces: `extend_history`, then
`compacted` of those samples as a tuple (which never takes the packed path), `signal_window`, and the
same reads of the samples built. A seeded search feeds trainers' logs as a node agent sends them,
pass after pass (a lead sample, sometimes redrawn; steps that advance, repeat, skip and go back;
stalls; stamps that go back; a loss of 0, NaN or inf; undated, unstepped, skipped or total-less
samples; another format, or the same name as another string object; another zone object; lines
that do not rise; findings), and holds every fold, packed or not, to the oracle's."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from collector.claims import energy, progress_walk
from collector.claims import progress as claims_progress
from collector.claims.energy import timeline
from collector.claims.gpuspread import slowdown_of
from collector.claims.memo import newest_stamp
from collector.claims.progress import COMPACT_SLACK, compacted, signal_window
from collector.claims.stragglers import rising_run
from collector.correlate import Signal
from collector.model import Ref
from collector.planes import signals as planes_signals
from collector.planes.signals import folded, uneventful
from collector.progress import history
from collector.progress.history import RECENT, compact, extend_history
from collector.progress.model import HangFinding, LogScan, PackedSamples, ProgressSample, summarize
from collector.settings import ClaimSettings

S = ClaimSettings()
# a window that follows every interval (no floor): the columns' intervals are held to signal_window's closely
S_FINE = replace(S, stall_floor=timedelta(0), stall_ceiling_multiplier=1e9, stall_window_max=timedelta(days=9999))
GAP = S.stall_floor + S.scrape_interval
REF = Ref("Pod", "ml", "head")
T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
FMT = "megatron"
OTHER_UTC = timezone(timedelta(0), "UTC+00:00")  # (an equal zone, another object: a pack keeps one zone object)


class _Trainer:
    """A trainer's log as a node agent reads it: each pass the samples printed since, led (mostly) by
    the last one before the cursor; odd samples at the rates `odd` sets."""

    def __init__(self, rng: random.Random, odd: float) -> None:
        self.rng, self.odd = rng, odd
        # seconds a step: a trainer's cadence (a slow one's stall window is past the floor)
        self.every = rng.choice([1.0, 1.0, 1.0, 0.25, 7.5, 45.0, 130.0])
        self.zone: Any = UTC
        self.fmt = FMT
        self.step = rng.choice([0, 1, 1000, 2**40])
        self.at = T0 + timedelta(microseconds=rng.randrange(10**6))
        self.line = rng.randrange(1, 50)
        self.total = rng.choice([500_000, 10**9])
        self.sent: list[ProgressSample] = []

    def _sample(self) -> ProgressSample:
        r, odd = self.rng, self.odd
        x = r.random()
        if x < odd:
            self.step -= r.randint(1, 80)  # a restart: steps go back
        elif x < 2 * odd:
            pass  # the same step again (a redraw, or a replay)
        elif x < 3 * odd:
            self.step += r.randint(2, 9)
        else:
            self.step += 1
        y = r.random()
        if y < odd:
            self.at += timedelta(seconds=r.uniform(30, 900))  # a stall (or a checkpoint) between steps
        elif y < 2 * odd:
            self.at -= timedelta(microseconds=r.randrange(1, 3 * 10**6))  # a clock that goes back
        else:
            us = int(self.every * 10**6)
            self.at += timedelta(microseconds=r.choice([us, us, us - 1, us + 1, r.randrange(1, 3 * us)]))
        self.line += r.choice([1, 1, 1, 2, 7])
        if r.random() < odd / 4:
            self.line -= r.randint(1, 20)  # lines that do not rise (a hostile or confused log)
        loss: float | None = r.uniform(0.5, 9.0)
        z = r.random()
        if z < odd / 4:
            loss = r.choice([0.0, math.nan, math.inf, None])
        fmt = self.fmt
        if r.random() < odd / 8:
            fmt = r.choice(["deepspeed", "".join(["mega", "tron"])])
        at: datetime | None = self.at.replace(tzinfo=self.zone)
        if r.random() < odd / 8:
            at = at.replace(tzinfo=OTHER_UTC) if at is not None else None
        elif r.random() < odd / 8:
            at = None
        step: int | None = self.step
        if r.random() < odd / 8:
            step = None
        total: int | None = self.total if r.random() >= odd / 8 else None
        skipped = r.random() < odd / 8
        return ProgressSample(step, at, loss, self.line, fmt, skipped, total)

    def increment(self) -> tuple[LogScan, int]:
        """(what the agent sends this pass, the line it read up to the pass before)."""
        r = self.rng
        after = self.line
        if r.random() < self.odd / 2:  # a whole pass's stamps in an equal zone of another object, or its
            self.zone = r.choice([UTC, OTHER_UTC])  # format an equal name of another object: not alike
        if r.random() < self.odd / 2:
            self.fmt = r.choice([FMT, "".join(["mega", "tron"])])
        new = [self._sample() for _ in range(r.choice([0, 1, 2, 5, 30, 30, 30, 30, 45, 90]))]
        lead: list[ProgressSample] = []
        if self.sent and r.random() < 0.85:
            last = self.sent[-1]
            if r.random() < self.odd:
                last = replace(last, loss=r.uniform(0.5, 9.0))  # redrawn since
            lead = [last]
        hangs: tuple[HangFinding, ...] = ()
        if r.random() < self.odd / 4:
            hangs = (HangFinding("nccl-watchdog-timeout", self.line, "ALLREDUCE", 600_000, 0, self.at),)
        self.sent += new
        samples = tuple(lead + new)
        first_at = next((x.at for x in samples if x.at is not None), None)
        return LogScan("trainer", FMT, samples, hangs, (), (), self.line, None, first_at), after


def _increments(rng: random.Random, trainers: int) -> Iterator[tuple[bool, datetime, LogScan, int]]:
    """`trainers` trainers' increments as a node agent sends them every 30 s: (the trainer's first, the
    read time, the increment, the line it starts after), made as they are asked for."""
    for _ in range(trainers):
        trainer = _Trainer(rng, odd=rng.choice([0.0, 0.0, 0.002, 0.01, 0.04, 0.12]))
        now = T0
        for i in range(rng.randint(2, 14)):
            now += timedelta(seconds=30)
            scan, after = trainer.increment()
            yield i == 0, now, scan, after


def _oracle(prev: Signal | None, inc: Signal, after: int) -> tuple[Signal, LogScan]:
    """What the object path makes of it: `extend_history` (the held samples built), then `compacted` of
    a tuple (its packed branch never taken)."""
    if prev is None:
        return compacted(inc, S), inc.scan
    ext = extend_history(prev.scan, inc.scan, after)
    assert type(ext.samples) is tuple
    return compacted(replace(inc, scan=ext), S), ext


def _built(sig: Signal) -> Signal:
    """`sig` with its samples a tuple (what the reads did before: every sample an object)."""
    return replace(sig, scan=replace(sig.scan, samples=tuple(sig.scan.samples)))


def _same(a: LogScan, b: LogScan) -> None:
    assert type(a.samples) is type(b.samples)
    assert list(a.samples) == list(b.samples)
    # field for field (== of a sample is its fields'; a NaN loss compares by identity: its repr)
    assert [repr(x) for x in a.samples] == [repr(x) for x in b.samples]
    assert repr(a.summary_of()) == repr(b.summary_of())
    assert a == b


@pytest.mark.parametrize("seed", range(4))
def test_a_fold_on_the_packed_columns_is_the_object_paths_fold(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = {"extend": 0, "compact": 0, "folds": 0, "windows": 0, "timelines": 0, "packed": 0, "uneventful": 0}
    extend0, compact0 = history.extend_packed, history.compact_packed

    def extend_counted(*a: Any, **kw: Any) -> LogScan | None:
        got = extend0(*a, **kw)
        taken["extend"] += got is not None
        return got

    def compact_counted(*a: Any, **kw: Any) -> LogScan | None:
        got = compact0(*a, **kw)
        taken["compact"] += got is not None and got is not a[0]
        return got
    monkeypatch.setattr(planes_signals, "extend_packed", extend_counted)
    monkeypatch.setattr(claims_progress, "compact_packed", compact_counted)

    rng = random.Random(seed)
    prev: Signal | None = None
    for new_trainer, now, scan, after in _increments(rng, 400):
        if new_trainer:
            prev = None
        if not scan.samples and prev is None:
            continue
        inc = Signal(REF, "trainer", scan, now)
        want, want_read = _oracle(prev, inc, after)
        if prev is not None:
            # the deferral's reads of the held pack, before the fold, beside the same reads built
            assert uneventful(prev, inc, after, GAP) == uneventful(_built(prev), inc, after, GAP)
            assert slowdown_of([prev]) == slowdown_of([_built(prev)])
        got = folded(prev, inc, "agent-log", after if prev is not None else None, S)
        # the increment as the agent poller decodes a plain one (`sources.agents._plain`): a pack, its
        # samples never built; the deferral's walk of it and the fold are the samples'
        pack = PackedSamples.pack(list(scan.samples))
        if pack is not None and pack.columns() is not None:
            taken["packed"] += 1
            inc_packed = Signal(REF, "trainer", replace(scan, samples=pack), now)
            if prev is not None:
                newest = uneventful(prev, inc_packed, after, GAP)
                assert newest == uneventful(prev, inc, after, GAP)
                taken["uneventful"] += newest is not None
            got_packed = folded(prev, inc_packed, "agent-log", after if prev is not None else None, S)
            assert (got_packed is None) == (got is None)
            if got is not None and got_packed is not None:
                _same(got_packed[0].scan, got[0].scan)
                assert list(got_packed[1].samples) == list(got[1].samples)
        if got is None:  # nothing new: only the read time moves (both paths: `adds_nothing` first)
            assert prev is not None
            continue
        sig, read = got
        taken["folds"] += 1
        _same(sig.scan, want.scan)
        assert [repr(x) for x in read.samples] == [repr(x) for x in want_read.samples]
        assert repr(read.summary_of()) == repr(want_read.summary_of())
        built = tuple(sig.scan.samples)
        assert newest_stamp(sig.scan) == max((x.at for x in built if x.at is not None), default=None)
        assert slowdown_of([sig]) == slowdown_of([_built(sig)])
        assert timeline(sig) == timeline(_built(sig))  # (the same floats: == on lists of them)
        if isinstance(sig.scan.samples, PackedSamples):
            taken["timelines"] += energy._packed_line(sig.scan.samples) is not None
        for scan in (sig.scan, read):  # the stall window on the columns, from any sample on
            if isinstance(scan.samples, PackedSamples) and (cols := scan.samples.columns()) is not None:
                whole = tuple(scan.samples)
                for t in {max(0, len(whole) - RECENT), rng.randrange(len(whole))}:
                    packed_window = claims_progress._signal_window_packed(cols, t, S)
                    if packed_window is not None:
                        taken["windows"] += 1
                        assert packed_window == signal_window(whole[t:], S)
                        fine = claims_progress._signal_window_packed(cols, t, S_FINE)
                        assert fine == signal_window(whole[t:], S_FINE)
                    else:
                        assert any(_at(b) < _at(a) for a, b in zip(whole[t:], whole[t + 1:], strict=False))
        prev = sig
    # the packed path is what most folds of a trainer at its pace take (not a search of the fallback)
    assert taken["extend"] > taken["folds"] // 3, taken
    assert taken["compact"] > taken["folds"] // 8, taken
    assert taken["windows"] > taken["folds"], taken
    assert taken["timelines"] > taken["folds"] // 3, taken
    assert taken["packed"] > taken["folds"] // 3, taken
    assert taken["uneventful"] > taken["folds"] // 16, taken


def _at(x: ProgressSample) -> datetime:
    assert x.at is not None
    return x.at


def _plain(n: int, *, every: float = 1.0, tz: Any = UTC) -> tuple[ProgressSample, ...]:
    return tuple(ProgressSample(1000 + i, T0.replace(tzinfo=tz) + timedelta(seconds=every * i), 2.0 + i / 1000,
                                10 + i, FMT, False, 500_000) for i in range(n))


def _held(samples: tuple[ProgressSample, ...]) -> LogScan:
    packed = PackedSamples.pack(list(samples))
    assert packed is not None and packed.columns() is not None
    return LogScan("trainer", FMT, packed, (), (), (), samples[-1].line, None, samples[0].at)


def test_a_plain_history_is_extended_and_compacted_packed_and_its_window_is_signal_windows() -> None:
    old = _plain(66)
    held = _held(old)
    new = tuple(ProgressSample(1066 + i, T0 + timedelta(seconds=66 + i), 3.0, 76 + i, FMT, False, 500_000)
                for i in range(30))
    inc = LogScan("trainer", FMT, (old[-1], *new), (), (), (), 105, None, old[-1].at)
    ext = history.extend_packed(held, inc, 75)
    assert ext is not None and isinstance(ext.samples, PackedSamples) and len(ext.samples) == 96
    assert ext == extend_history(held, inc, 75)
    cols = ext.samples.columns()
    assert cols is not None
    n = len(ext.samples)
    # the stall window from the columns is signal_window's, to the float
    assert claims_progress._signal_window_packed(cols, n - RECENT, S) == signal_window(tuple(ext.samples)[-RECENT:], S)
    assert n > RECENT + COMPACT_SLACK
    bridge = signal_window(tuple(ext.samples)[-RECENT:], S)
    got = history.compact_packed(ext, cols, bridge=bridge)
    want = compact(replace(ext, samples=tuple(ext.samples)), bridge=bridge)
    assert got is not None and isinstance(got.samples, PackedSamples) and len(got.samples) < n
    assert got == want and got.summary == want.summary


@pytest.mark.parametrize("odd", ["stamps back", "lines back", "nan", "zone", "format", "no total"])
def test_what_a_plain_pack_cannot_say_takes_the_object_path(odd: str) -> None:
    samples = list(_plain(96))
    i = 70
    if odd == "stamps back":
        samples[i] = replace(samples[i], at=_at(samples[i - 1]) - timedelta(seconds=1))
    elif odd == "lines back":
        samples[i] = replace(samples[i], line=samples[i - 1].line - 1)
    elif odd == "nan":
        samples[i] = replace(samples[i], loss=math.nan)
    elif odd == "zone":
        samples[i] = replace(samples[i], at=samples[i].at.replace(tzinfo=OTHER_UTC))  # type: ignore[union-attr]
    elif odd == "format":
        samples[i] = replace(samples[i], format="".join(["mega", "tron"]))
    else:
        samples[i] = replace(samples[i], total=None)
    held = _held(tuple(samples[:66])) if odd in ("stamps back", "lines back") else None
    inc_samples = tuple(samples[65:])
    base = held if held is not None else _held(tuple(samples[:66]))
    inc = LogScan("trainer", FMT, inc_samples, (), (), (), inc_samples[-1].line, None, inc_samples[0].at)
    ext = history.extend_packed(base, inc, samples[65].line)
    want = extend_history(base, inc, samples[65].line)
    if odd in ("nan", "zone", "format", "no total"):
        assert ext is None  # (the increment does not pack plain, or not alike)
    else:
        assert ext == want  # (the held part is plain: the extension still packs; the columns refuse later)
    sig = Signal(REF, "trainer", want, T0)
    got = compacted(replace(sig, scan=ext if ext is not None else want), S)
    assert got.scan == compacted(replace(sig, scan=replace(want, samples=tuple(want.samples))), S).scan


def test_the_deferrals_reads_of_a_held_pack_build_nothing() -> None:
    held = Signal(REF, "trainer", _held(_plain(66)), T0 + timedelta(seconds=70))
    packed = held.scan.samples
    assert isinstance(packed, PackedSamples)
    new = tuple(ProgressSample(1066 + i, T0 + timedelta(seconds=66 + i), 3.0, 76 + i, FMT, False, 500_000)
                for i in range(30))
    inc = Signal(REF, "trainer", LogScan("trainer", FMT, new, (), (), (), 105, None, new[0].at),
                 T0 + timedelta(seconds=100))
    packed._built = None  # (as the evaluation left it: no longer among the packs kept built)
    got = folded(held, inc, "agent-log", 75, S)
    assert got is not None
    newest = uneventful(held, inc, 75, GAP)
    assert newest == new[-1]
    slowdown_of([held, got[0]])
    kept = got[0].scan.samples
    assert isinstance(kept, PackedSamples)
    assert packed._built is None and kept._built is None  # neither history was built
    assert newest_stamp(got[0].scan) == new[-1].at


def test_a_high_water_sample_read_twice_on_its_line_takes_the_object_path() -> None:
    """The recent samples hold the high-water sample again, the same line and all (lines that do not
    rise): `compact` keeps it as the summary's mark; the columns cannot say which is which."""
    old = list(_plain(96))
    top = replace(old[5], step=10**6)
    old[5] = top
    old[90] = top  # (the same sample again, among the recent)
    ext = replace(_held(tuple(old)), summary=None)
    cols = ext.samples.columns()  # type: ignore[union-attr]
    assert cols is not None
    bridge = signal_window(tuple(ext.samples)[-RECENT:], S)
    assert history.compact_packed(ext, cols, bridge=bridge) is None
    sig = Signal(REF, "trainer", ext, T0)
    want = compacted(replace(sig, scan=replace(ext, samples=tuple(ext.samples))), S).scan
    assert compacted(sig, S).scan == want and want.summary is not None and want.summary.high_water == top


def _fold_both(samples: list[ProgressSample], bridge: timedelta | None = None) -> None:
    """`samples` held (as a plain pack) and compacted both ways: packed, and as objects."""
    ext = _held(tuple(samples))
    cols = ext.samples.columns()  # type: ignore[union-attr]
    assert cols is not None
    whole = tuple(ext.samples)
    bridge = bridge if bridge is not None else signal_window(whole[-RECENT:], S)
    got = history.compact_packed(ext, cols, bridge=bridge)
    want = compact(replace(ext, samples=whole), bridge=bridge)
    assert got is not None
    assert [repr(x) for x in got.samples] == [repr(x) for x in want.samples]
    assert repr(got.summary_of()) == repr(want.summary_of())
    assert (got is ext) == (len(want.samples) == len(whole))


def test_a_gap_of_exactly_the_window_ends_a_stretch_packed_as_it_does_built() -> None:
    samples = list(_plain(96))
    bridge = signal_window(samples[-RECENT:], S)
    for i in range(10, 20):  # (samples before the recent ones: compacted)
        samples[i] = replace(samples[i], at=_at(samples[i - 1]) + (bridge if i == 14 else timedelta(seconds=1)))
    for i in range(20, 96):
        samples[i] = replace(samples[i], at=_at(samples[i - 1]) + timedelta(seconds=1))
    _fold_both(samples, bridge)
    samples[14] = replace(samples[14], at=_at(samples[13]) + bridge - timedelta(microseconds=1))
    _fold_both(samples, bridge)


def test_a_first_sample_at_the_high_water_mark_seeds_the_stretches_as_built() -> None:
    """The first sample held is the highest step (the run went back after it), the next two show that
    step again: `_seed` finds no mark older than the first, so the first advances and the two after it
    are a stretch of their own."""
    samples = list(_plain(96))
    top = samples[0].step
    assert top is not None
    samples[1] = replace(samples[1], step=top)
    samples[2] = replace(samples[2], step=top)
    for i in range(3, 96):
        samples[i] = replace(samples[i], step=top - 200 + i)
    _fold_both(samples)


def test_the_columns_window_skips_a_compacted_stretch_as_signal_window_does() -> None:
    """A sample standing for a compacted stretch (covers > 1) among those the window is read from:
    its gap is not one step interval."""
    samples = list(_plain(96))
    for i in range(10, 96):
        gap = timedelta(seconds=30 if i == 80 else 1 + (i % 3) / 10)
        samples[i] = replace(samples[i], at=_at(samples[i - 1]) + gap, covers=30 if i == 80 else 1)
    packed = PackedSamples.pack(list(samples))
    assert packed is not None
    cols = packed.columns()
    assert cols is not None
    for t in (0, 40, 79, 80, 81):
        want = signal_window(samples[t:], S_FINE)
        assert claims_progress._signal_window_packed(cols, t, S_FINE) == want


def test_a_restart_starts_the_step_intervals_over() -> None:
    """`slowdown_of` paces a log on its current incarnation only: 100 steps a second apart, then a
    restart from step 50 and 101 steps two seconds apart is a steady pace (0), not a slowdown (1)."""
    # (the step that went back ends the run before it and is not a point itself, as both readers had it)
    assert rising_run([(1, "a"), (2, "b"), (2, "c"), (5, "d"), (3, "e"), (4, "f")]) == ([4], ["f"])
    before = [ProgressSample(i, T0 + timedelta(seconds=i), 2.0, 10 + i, FMT, False, 500_000) for i in range(100)]
    after = [ProgressSample(50 + i, T0 + timedelta(seconds=100 + 2 * i), 2.0, 110 + i, FMT, False, 500_000)
             for i in range(101)]
    held = _held(tuple(before + after))
    sig = Signal(REF, "trainer", held, T0 + timedelta(seconds=400))
    assert slowdown_of([sig]) == slowdown_of([_built(sig)]) == 0.0


@pytest.mark.parametrize("zone", [UTC, OTHER_UTC, timezone(timedelta(hours=5, minutes=30)),
                                  timezone(-timedelta(hours=8)), ZoneInfo("America/New_York"), None])
def test_an_energy_timeline_read_from_the_columns_is_the_built_samples(zone: Any) -> None:
    """`claims.energy.timeline` of a plain pack: from its columns in a fixed-offset zone (the same
    floats as `datetime.timestamp` of each sample, sub-second stamps included), else built (a zone
    whose offset moves, here across a DST change; naive stamps, which `timestamp` reads as local)."""
    t0 = datetime(2026, 3, 8, 6, 59, 30, 123_457)  # (America/New_York moves its clocks at 07:00 UTC)
    steady = tuple(ProgressSample(1000 + i, t0.replace(tzinfo=zone) + timedelta(microseconds=1_000_003 * i),
                                  2.0, 10 + i, FMT, False, 500_000) for i in range(90))
    # a repeat, an earlier stamp and a restart (steps back: the incarnation after it only)
    odd = list(steady)
    odd[40] = replace(odd[40], step=odd[39].step)
    odd[50] = replace(odd[50], at=_at(odd[49]) - timedelta(microseconds=7))
    odd[60:] = [replace(x, step=x.step - 45) for x in odd[60:] if x.step is not None]
    for samples in (steady, tuple(odd)):
        packed = PackedSamples.pack(list(samples))
        assert packed is not None
        alone = packed.steps_stamps()  # (unpacked alone: no columns kept yet)
        cols = packed.columns()
        assert cols is not None and alone == (cols[0], cols[1]) == packed.steps_stamps()  # (plain: one zone object)
        sig = Signal(REF, "trainer", LogScan("trainer", FMT, packed, (), (), (), samples[-1].line, None,
                                             samples[0].at), T0)
        got, want = timeline(sig), timeline(_built(sig))
        assert got is not None and got == want
        assert (energy._packed_line(packed) is not None) is (type(zone) is timezone)
    assert len(want[1]) == 30 and want[1][0] == 1015  # (the restart's incarnation)


def test_an_energy_timeline_is_a_logs_current_incarnation_of_rising_steps() -> None:
    """What both of `timeline`'s paths keep (`claims.energy._line`): a repeated step and an earlier stamp
    left out, a step that goes back starting it over."""
    assert energy._line([(1, 1.0), (2, 2.0), (2, 3.0), (3, 1.5), (4, 4.0)]) == ([1.0, 2.0, 4.0], [1, 2, 4])
    assert energy._line([(1, 1.0), (5, 2.0), (4, 3.0), (6, 4.0)]) == ([3.0, 4.0], [4, 6])  # (one step back)


def _walk_fields(w: progress_walk.Walk) -> str:
    """Every field of a walk but the samples it read (`froms`: a pack or a tuple), as text (a NaN loss
    compares by its repr)."""
    out: dict[str, object] = {}
    for name in progress_walk.Walk.__slots__:
        if name == "froms":
            continue
        v: object = getattr(w, name)
        if name == "advs":
            v = [list(a) for a in w.advs]
        elif name in ("recent_places", "recent_orders", "skip_tail", "loss_tail"):
            v = list(v)  # type: ignore[call-overload]
        elif name == "replayed_to":
            v = dict(w.replayed_to)
        out[name] = v
    return repr(out)


@pytest.mark.parametrize("seed", range(3))
def test_a_walk_of_the_packed_columns_is_the_object_walk(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`progress_walk.walk` of a held history (`_walk_plain` on a plain pack's columns; the general path
    otherwise), its advances and reports, against the general walk of the same samples as a tuple,
    at horizons before, inside and past the samples and first lines before and after them."""
    taken = {"plain": 0, "walks": 0}
    plain0 = progress_walk._walk_plain

    def plain_counted(*a: Any) -> progress_walk.Walk | None:
        got = plain0(*a)
        taken["plain"] += got is not None
        return got
    monkeypatch.setattr(progress_walk, "_walk_plain", plain_counted)
    rng = random.Random(100 + seed)
    prev: Signal | None = None
    for new_trainer, now, scan, after in _increments(rng, 300):
        if new_trainer:
            prev = None
        if not scan.samples and prev is None:
            continue
        got = folded(prev, Signal(REF, "trainer", scan, now), "agent-log", after if prev is not None else None, S)
        if got is None:
            continue
        prev = sig = got[0]
        held = sig.scan
        stamps = [x.at for x in held.samples if x.at is not None]
        firsts = [held.first_at, None] + ([min(stamps) - timedelta(seconds=5), max(stamps)] if stamps else [])
        horizons = [None, now] + ([rng.choice(stamps), max(stamps) - timedelta(microseconds=1)] if stamps else [])
        for first in {rng.choice(firsts)}:
            for horizon in horizons:
                packed = replace(held, first_at=first)
                built = replace(packed, samples=tuple(held.samples))
                w = progress_walk.walk("trainer", [progress_walk.Part(packed, "head/trainer", "head/trainer", ())],
                                       S, horizon, None)
                want = progress_walk.walk("trainer",
                                          [progress_walk.Part(built, "head/trainer", "head/trainer", ())],
                                          S, horizon, None)
                taken["walks"] += 1
                assert _walk_fields(w) == _walk_fields(want)
                assert [repr(x) for x in w.advances(0)] == [repr(x) for x in want.advances(0)]
                assert [repr(x) for x in w.reports()] == [repr(x) for x in want.reports()]
    # the columns' walk is taken often (half the horizons leave a sample past them: the general path)
    assert taken["plain"] > taken["walks"] // 10, taken
    # packs no fold makes: samples standing for others (`covers`) among the newest, equal stamps, a
    # loss of 0, steps that do not rise, a summary whose high-water sample is or is not the last one
    taken = {"plain": 0, "walks": 0}
    for _ in range(3000):
        n = rng.choice([1, 2, 3, 5, 20, 21, 25, 60, 66])
        step, at = rng.choice([0, 1000]), T0 + timedelta(microseconds=rng.randrange(10**6))
        samples = []
        for i in range(n):
            step += rng.choice([1, 1, 1, 2, 40] + ([0] if rng.random() < 0.02 else []))
            at += timedelta(microseconds=rng.choice([0, 1, 10**6, 10**6, 10**6 + 1, 7 * 10**6, 900 * 10**6]))
            loss = 0.0 if rng.random() < 0.01 else rng.uniform(0.5, 9.0)
            samples.append(ProgressSample(step, at, loss, 10 + i, FMT, False, 500_000,
                                          rng.choice([1, 1, 1, 1, 0, 2, 5, 40])))
        pack = PackedSamples.pack(samples)
        assert pack is not None
        last = samples[-1]
        high = rng.choice([last, replace(last, step=step + 5), replace(last, loss=1.0), samples[0]])
        summary = rng.choice([None, summarize(samples), replace(summarize(samples), dropped=7, high_water=high)])
        first_at = rng.choice([None, samples[0].at, T0 - timedelta(seconds=1), last.at])
        held = LogScan("trainer", FMT, pack, (), (), (), 10 + n, summary, first_at)
        built = replace(held, samples=tuple(samples))
        for horizon in (None, at, at - timedelta(microseconds=1)):
            w = progress_walk.walk("trainer", [progress_walk.Part(held, "h/t", "h/t", ())], S, horizon, None)
            want = progress_walk.walk("trainer", [progress_walk.Part(built, "h/t", "h/t", ())], S, horizon, None)
            taken["walks"] += 1
            assert _walk_fields(w) == _walk_fields(want)
            assert [repr(x) for x in w.advances(0)] == [repr(x) for x in want.advances(0)]
            assert [repr(x) for x in w.reports()] == [repr(x) for x in want.reports()]
    assert taken["plain"] > taken["walks"] // 4, taken
