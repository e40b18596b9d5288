"""`PackedSamples`: a held history's samples packed (issue 30, fleet memory) read back as the very tuple
they were packed from, and the claims over packed histories equal those over the tuples, built again
from the packed bytes or not."""

from __future__ import annotations

import gc
import math
import pickle
import random
import tracemalloc
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.claims.common import Clock
from collector.claims.progress import COMPACT_SLACK, analyze, compacted, signal_window
from collector.correlate import Signal
from collector.model import Ref
from collector.progress import LogScan, ProgressSample
from collector.progress.history import RECENT, compact
from collector.progress.model import FORMATS, PackedSamples, new_sample
from collector.settings import ClaimSettings
from tests.claims.test_incremental_analysis import T0, Log

EAST = timezone(timedelta(hours=9))
NAN = float("nan")


def _cold(p: PackedSamples) -> PackedSamples:
    """`p` with nothing built: the next read builds its samples from the packed bytes."""
    p._built = None
    return p


def _same(a: ProgressSample, b: ProgressSample) -> bool:
    """Field for field the same value and type, a non-finite loss the same object."""
    for f in fields(ProgressSample):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if type(x) is not type(y) or not (x is y or x == y):
            return False
        if isinstance(x, datetime) and (x.tzinfo is not y.tzinfo or x.fold != y.fold):
            return False
        if isinstance(x, float) and (x is not y if not math.isfinite(x) else
                                     math.copysign(1.0, x) != math.copysign(1.0, y)):
            return False
    return True


_zone = st.sampled_from((UTC, EAST, None))
_sample = st.builds(
    new_sample,
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(0, 10**7)),
    st.one_of(st.none(), st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from((0.0, -0.0, NAN))),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(FORMATS),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    st.integers(1, 2**31 - 1),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(_sample, max_size=40), _zone)
def test_packed_reads_back_as_the_tuple(samples: list[ProgressSample], tz: object) -> None:
    smp = tuple(replace(x, at=None if x.at is None else x.at.replace(tzinfo=tz, fold=0)) for x in samples)  # type: ignore[arg-type]
    p = PackedSamples.pack(smp)
    assert p is not None
    for q in (p, _cold(PackedSamples.pack(smp) or p)):  # seeded with the objects, and built from the bytes
        back = tuple(q)
        assert len(q) == len(smp) == len(back) and bool(q) == bool(smp)
        assert all(map(_same, back, smp))
        assert q == smp and smp == q and (q != smp) is False and hash(q) == hash(smp) and repr(q) == repr(smp)
        assert all(x in q for x in smp)  # (a NaN loss: the very object, so == holds as it did)
        if smp:
            assert _same(q[-1], smp[-1]) and q[1:] == smp[1:] and q[::-1] == smp[::-1]
            assert q.index(smp[-1]) == smp.index(smp[-1]) and q.count(smp[0]) == smp.count(smp[0])
        assert list(reversed(q)) == list(reversed(smp))
        back = pickle.loads(pickle.dumps(q))  # (a tuple: a NaN comes back another object, as from the tuple)
        assert type(back) is tuple and repr(back) == repr(smp)


def test_what_would_not_come_back_the_same_is_not_packed() -> None:
    """Fail closed: a value packing would change leaves the history as it was (a tuple)."""
    at = datetime(2026, 1, 10, tzinfo=UTC)
    ok = new_sample(1, at, 2.0, 1, "megatron", False, 10)
    assert PackedSamples.pack((ok, ok)) is not None
    for bad in (
        replace(ok, at=at.astimezone(EAST)),  # another zone than the first stamp's
        replace(ok, at=at.replace(tzinfo=None)),  # naive beside aware
        replace(ok, at=at.replace(fold=1)),
        replace(ok, step=2**63), replace(ok, line=-(2**63) - 1), replace(ok, total=2**64),
        replace(ok, step=True), replace(ok, loss=2),  # an int where an int would come back as another type
        replace(ok, covers=2**31),
        replace(ok, format="".join(["mega", "tron"])),  # an equal format, another object
    ):
        assert PackedSamples.pack((ok, bad)) is None, bad


def test_built_samples_are_let_go() -> None:
    """Only the last HOT packs asked for keep their samples built."""
    from collector.progress import model
    at = datetime(2026, 1, 10, tzinfo=UTC)
    packs = [PackedSamples.pack(tuple(new_sample(i, at, 1.0, i, "megatron", False, None) for i in range(3)))
             for _ in range(model.HOT + 10)]
    assert all(p is not None for p in packs)
    built = [p._built is not None for p in packs if p is not None]
    assert built == [False] * 10 + [True] * model.HOT
    assert packs[0] is not None and packs[0][2].step == 2 and packs[0]._built is not None


def _held_bytes(n_signals: int, k: int, pack: bool) -> float:
    """Bytes a held sample costs: `n_signals` histories of `k` samples as a node agent's document
    decodes them (fresh numbers and stamps per sample), packed or not."""
    from collector.progress import model
    rng = random.Random(1)
    gc.collect()
    tracemalloc.start()
    try:
        b = tracemalloc.get_traced_memory()[0]
        held = []
        for j in range(n_signals):
            t0 = datetime(2026, 1, 10, tzinfo=UTC) + timedelta(hours=j)
            smp = tuple(new_sample(int(str(10**6 + i)), datetime.fromisoformat((t0 + timedelta(seconds=i)).isoformat()),
                                   rng.uniform(1.5, 3.0), int(str(5000 + i)), "megatron", False, int(str(500_000)))
                        for i in range(k))
            held.append(PackedSamples.pack(smp) if pack else smp)
        model._hot.clear()  # (what stays built is bounded apart: HOT packs)
        for p in held:
            if isinstance(p, PackedSamples):
                p._built = None
        gc.collect()
        a = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(held) == n_signals
    return (a - b) / (n_signals * k)


def test_a_packed_sample_costs_a_fifth() -> None:
    """The point of it: ~47 B a held sample packed, against ~260 as objects."""
    old, new = _held_bytes(300, 80, False), _held_bytes(300, 80, True)
    assert old > 200 and new < 60, (old, new)


def _old_compacted(sig: Signal, s: ClaimSettings) -> Signal:
    """`claims.progress.compacted` as it was before packing (15e9453)."""
    samples = sig.scan.samples
    if len(samples) <= RECENT + COMPACT_SLACK:
        return sig
    out = compact(sig.scan, bridge=signal_window(samples[-RECENT:], s))
    return sig if out is sig.scan else replace(sig, scan=out)


def _scenario(seed: int) -> None:
    """Random histories grown poll by poll: held as tuples (before) and packed (now), built or not, the
    same held history (values), the same `analyze` view and the same recheck instant."""
    rng = random.Random(seed)
    s = ClaimSettings()
    logs = [Log(rng, f"w{i}", T0 - timedelta(seconds=10 * rng.randrange(60))) for i in range(rng.randrange(1, 4))]
    held_old: dict[str, LogScan] = {}
    held_new: dict[str, LogScan] = {}
    now = T0
    for _ in range(rng.randrange(4, 20)):
        for log in rng.sample(logs, rng.randrange(1, len(logs) + 1)):
            log.grow(rng.randrange(1, 40))
            log.rescan(s)
            # rescan may have compacted (and so packed) it: the tuple history is the one read
            base = log.scan if not isinstance(log.scan.samples, PackedSamples) else \
                replace(log.scan, samples=tuple(log.scan.samples))
            sig = Signal(Ref("Pod", "ns", log.pod), "main", base, now)
            old = _old_compacted(sig, s).scan
            new = compacted(sig, s).scan
            assert isinstance(new.samples, PackedSamples) or not new.samples
            assert replace(new, samples=tuple(new.samples)) == old
            held_old[log.pod], held_new[log.pod] = old, new
        now += timedelta(seconds=rng.choice((0, 10, 30, 300)))
        if rng.random() < 0.5:
            for scan in held_new.values():
                if isinstance(scan.samples, PackedSamples):
                    _cold(scan.samples)
        c1, c2 = Clock(now, timedelta(seconds=5)), Clock(now, timedelta(seconds=5))
        got = analyze([Signal(Ref("Pod", "ns", p), "main", x, now) for p, x in held_new.items()], s, now, clock=c1)
        want = analyze([Signal(Ref("Pod", "ns", p), "main", x, now) for p, x in held_old.items()], s, now, clock=c2)
        assert got == want, seed
        assert c1.recheck_at == c2.recheck_at


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_claims_over_packed_histories_are_those_over_tuples(seed: int) -> None:
    _scenario(seed)


def test_a_kept_walk_holds_no_built_history() -> None:
    """The walk kept between evaluations names its advances by place: once the pack's built samples
    are let go, none of them stays (but the summary's few: first, last, high-water)."""
    from collector.progress import model
    s = ClaimSettings()
    t0 = datetime(2026, 1, 10, tzinfo=UTC)
    smp = tuple(new_sample(100 + i, t0 + timedelta(seconds=i), 2.0, 10 + i, "megatron", False, None) for i in range(90))
    sig = compacted(Signal(Ref("Pod", "ns", "p"), "main", LogScan("x", "megatron", smp, (), (), (), 100), t0), s)
    assert isinstance(sig.scan.samples, PackedSamples)
    del smp
    now = t0 + timedelta(seconds=100)
    view = analyze([sig], s, now)
    model._hot.clear()
    _cold(sig.scan.samples)
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is ProgressSample and o.format == "megatron"
                and o.at is not None and o.at.year == 2026 and o.at.month == 1 and o.step is not None and o.step >= 100
                and o.line >= 10)
    assert alive <= 2, alive  # (the summary's first, last, ... samples)
    assert analyze([sig], s, now) == view  # (its walk kept: the advances built from the pack again)
    assert len(view.advances) == len(sig.scan.samples)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 10**12),
                          st.floats(allow_nan=False, allow_infinity=False),
                          st.integers(-(2**62), 2**62), st.integers(0, 2**62), st.integers(1, 2**31 - 1)),
                min_size=1, max_size=30), _zone)
def test_a_steady_history_built_its_short_way_reads_back_the_same(rows: list[tuple[int, int, float, int, int, int]],
                                                                  tz: object) -> None:
    """A steady trainer's history (every field there, one format): built by the short way, the same."""
    base = datetime(1970, 1, 1, tzinfo=tz)  # type: ignore[arg-type]
    smp = tuple(new_sample(a, base + timedelta(microseconds=us), loss, line, "megatron", False, total, cov)
                for a, us, loss, line, total, cov in rows)
    p = PackedSamples.pack(smp)
    assert p is not None and p._plain
    assert all(map(_same, _cold(p), smp))
    mixed = PackedSamples.pack((*smp, replace(smp[0], loss=None)))
    assert mixed is not None and not mixed._plain and all(map(_same, _cold(mixed)[:-1], smp))
