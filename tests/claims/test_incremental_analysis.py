"""The kept per-stream walks (`claims.progress_walk`) give exactly what one walk over every sample gave.

Random runs grow in random increments, the way the live controller's history grows: a signal's
scan replaced by a longer one (a poll's samples appended, now and then compacted as the controller
compacts), a pod replaced (a new signal continuing a stream, with its restart), an in-process resume,
a signal going stale, the clock moving with nothing new, quiet logs (lines, never a sample) beside
them, first lines stamped ahead of the clock. Samples restart and replay, pause, repeat
steps and stamps, arrive out of order or stamped past the clock, skip steps, lose their loss to NaN or
0.0, carry no step or no stamp. After every increment the incremental `analyze` (its walks kept from
the increments before) must equal the old single walk (`analyze_reference`) field for field, and both
must leave the clock the same recheck instant.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.claims import engine, evaluate, progress_walk
from collector.claims.common import Clock
from collector.claims.lineage import Lineage, Restart
from collector.claims.progress import analyze, compacted
from collector.correlate import RunEvidence, Signal, build_index
from collector.kube import normalize
from collector.model import Ref
from collector.progress import LogScan, ProgressSample
from collector.progress.model import ResumeFinding, summarize
from collector.settings import ClaimSettings
from tests.claims.analyze_reference import analyze as reference
from tests.claims.test_recheck_at import NOW, pod, taurun

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
LOSSES = (2.5, 2.4, 1.0, 0.0, float("nan"), float("inf"), None)


class Log:
    """One container's growing log: every sample it printed, as a scan the controller would hold."""

    def __init__(self, rng: random.Random, pod: str, start: datetime, lockstep: int | None = None,
                 quiet: bool = False) -> None:
        self.rng = rng
        # ranks in lockstep print the same steps at the same instants (ties across streams)
        self.trng = random.Random(lockstep) if lockstep is not None else rng
        self.pod = pod
        self.t = start
        self.step = self.trng.choice((0, 10, 1000))
        self.line = 0
        self.samples: list[ProgressSample] = []
        self.resumes: list[ResumeFinding] = []
        u = rng.random()
        # its first line's stamp: none, the start, or ahead of the clock (a node's clock ahead)
        self.first_at: datetime | None = start if u < 0.45 else start + timedelta(minutes=10) if u < 0.55 else None
        self.scan = LogScan("x", "megatron", (), (), (), (), 0, first_at=self.first_at)
        self.stepless = rng.random() < 0.15
        self.quiet = quiet  # a sidecar's: lines, never a sample (at fleet size most logs)

    def grow(self, k: int) -> None:
        if self.quiet:
            self.line += k
            return
        r, tr = self.rng, self.trng
        for _ in range(k):
            self.line += 1 + r.randrange(3)
            # a pause, a repeat, a line out of order; whole tens, so streams tie
            gap = tr.choice((0, 1, 10, 10, 10, 10, 30, 90, 400, -20))
            self.t += timedelta(seconds=gap)
            at: datetime | None = self.t
            if tr.random() < 0.04:
                at = None  # no stamp
            elif tr.random() < 0.03:
                at = self.t + timedelta(minutes=tr.choice((1, 10)))  # stamped ahead of the clock
            u = tr.random()
            if u < 0.06:
                self.step = max(0, self.step - tr.randrange(1, 30))  # started over from an older checkpoint
            elif u < 0.12:
                pass  # the same step again (a redraw)
            else:
                self.step += tr.choice((1, 1, 1, 2, 5))
            loss = r.choice(LOSSES) if r.random() < 0.3 else 2.0 + r.random()
            skipped = tr.random() < 0.07
            step = None if self.stepless or r.random() < 0.03 else self.step
            covers = 1 if r.random() < 0.9 else r.randrange(2, 40)
            self.samples.append(ProgressSample(step, at, loss, self.line, "megatron", skipped, None, covers))
            if r.random() < 0.02:
                self.line += 1
                self.resumes.append(ResumeFinding(self.line, self.t, r.choice((None, self.step)),
                                                  r.choice(("torchelastic", "megatron"))))

    def rescan(self, s: ClaimSettings) -> None:
        """A new scan object for what it holds now (a poll), bounded as the controller bounds it."""
        r = self.rng
        samples = tuple(self.samples)
        summary = None
        if len(samples) > 60 and r.random() < 0.3:  # the oldest dropped, the high-water kept in the summary
            keep = r.randrange(20, 60)
            full = summarize(samples)
            summary = replace(full, dropped=len(samples) - keep, first=summarize(samples[-keep:]).first)
            samples = samples[-keep:]
        scan = LogScan("x", "megatron", samples, (), (), (), self.line, summary=summary, first_at=self.first_at,
                       resumes=tuple(self.resumes))
        if r.random() < 0.3:
            scan = compacted(Signal(Ref("Pod", "ns", self.pod), "main", scan, T0), s).scan
        self.scan = scan


def _scenario(seed: int) -> None:
    rng = random.Random(seed)
    s = ClaimSettings()
    now = T0
    logs: list[Log] = []
    lineage: dict[tuple[tuple[str, str, str], str], Lineage] = {}
    stale: set[str] = set()
    lockstep = rng.randrange(1 << 30) if rng.random() < 0.5 else None
    start = now - timedelta(seconds=10 * rng.randrange(0, 60))

    def add(pod: str, stream: str | None) -> None:
        log = Log(rng, pod, start if lockstep is not None else now - timedelta(seconds=10 * rng.randrange(0, 60)),
                  lockstep, quiet=rng.random() < 0.25)
        log.grow(rng.randrange(0, 12) if lockstep is None else 6)
        log.rescan(s)
        logs.append(log)
        if stream is not None:
            restarts = (Restart(now - timedelta(seconds=rng.randrange(0, 900)), f"{pod} replaced"),) \
                if rng.random() < 0.7 else ()
            lineage[(("Pod", "ns", pod), "main")] = Lineage(stream, restarts)

    for i in range(rng.randrange(1, 4)):
        add(f"w{i}", f"rank{i}" if rng.random() < 0.5 else None)
    for _ in range(rng.randrange(8, 40)):
        u = rng.random()
        if u < 0.6:
            k = rng.randrange(1, 8)
            for log in rng.sample(logs, len(logs) if lockstep is not None else 1):  # lockstep: every rank's poll
                log.grow(k)
                log.rescan(s)
        elif u < 0.68 and len(logs) < 7:  # a pod replaced: its successor continues the stream
            rank = rng.randrange(3)
            add(f"w{rank}-r{len(logs)}", f"rank{rank}")
        elif u < 0.72:
            stale.symmetric_difference_update({rng.choice(logs).pod})
        elif u < 0.76:  # a container restart noticed: the lineage gains a restart
            key = rng.choice(list(lineage)) if lineage else None
            if key is not None:
                lin = lineage[key]
                lineage[key] = Lineage(lin.stream, (*lin.restarts, Restart(now - timedelta(seconds=5), "restarted")))
        now += timedelta(seconds=rng.choice((0, 1, 10, 30, 30, 300)))
        signals = [Signal(Ref("Pod", "ns", g.pod), "main", g.scan, now) for g in logs if g.pod not in stale]
        # mode 0: a plain `now`; 1, 2: the engine's clock (a dump's slack); 3: no horizon at all
        mode = rng.randrange(4)
        lin = lineage if rng.random() < 0.8 else None
        when = now if rng.random() < 0.85 else now - timedelta(minutes=rng.choice((1, 15)))  # explain, earlier
        c1 = Clock(when, timedelta(seconds=rng.choice((0, 0, 5)))) if mode in (1, 2) else None
        c2 = Clock(when, c1.slack) if c1 is not None else None
        at = when if mode != 3 else None
        got = analyze(signals, s, at, clock=c1, lineage=lin)
        want = reference(signals, s, at, clock=c2, lineage=lin)
        assert got == want, (seed, got, want)
        assert (c1.recheck_at if c1 else None) == (c2.recheck_at if c2 else None)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_incremental_analysis_equals_the_single_walk(seed: int) -> None:
    _scenario(seed)



@contextmanager
def counted_walks() -> Iterator[list[str]]:
    """The streams `progress_walk.walk` is called for (a walk not kept), while the block runs."""
    calls: list[str] = []
    real = progress_walk.walk

    def counted(stream: str, *a: object, **kw: object) -> progress_walk.Walk:
        calls.append(stream)
        return real(stream, *a, **kw)  # type: ignore[arg-type]

    progress_walk.walk = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        progress_walk.walk = real  # type: ignore[assignment]


def test_walks_are_kept_between_evaluations_and_dropped_with_their_scans() -> None:
    """The point of it: an evaluation after one signal changed walks that signal's stream only, and a
    scan no longer held takes its walk with it."""
    s = ClaimSettings()
    rng = random.Random(7)
    logs = [Log(rng, f"w{i}", T0) for i in range(4)]
    for g in logs:
        g.stepless = False
        g.grow(30)
        g.rescan(s)
    now = T0 + timedelta(hours=1)
    with counted_walks() as calls:
        def signals() -> list[Signal]:
            return [Signal(Ref("Pod", "ns", g.pod), "main", g.scan, now) for g in logs]
        analyze(signals(), s, now)
        assert sorted(calls) == ["w0/main", "w1/main", "w2/main", "w3/main"]
        calls.clear()
        analyze(signals(), s, now + timedelta(seconds=30))
        assert calls == []
        logs[2].grow(3)
        logs[2].rescan(s)
        view = analyze(signals(), s, now)
        assert calls == ["w2/main"]
        assert view == reference(signals(), s, now)
    # what was kept goes with its scan (kept on it): the replaced scans and their walks are freed
    import gc
    import weakref
    old = [weakref.ref(g.scan) for g in logs]
    assert all(progress_walk._KEPT.get(g.scan) is not None for g in logs)
    for g in logs:
        g.scan = replace(g.scan)
    gc.collect()
    assert [r() for r in old] == [None] * len(logs)
    assert all(progress_walk._KEPT.get(g.scan) is None for g in logs)  # (a replaced scan is another)


def assert_same_as_single_walk(ev: RunEvidence, now: datetime, s: ClaimSettings, seed: int) -> None:
    """The run's claims with the kept walks equal those of the single walk (`analyze_reference`)."""
    got = evaluate(ev, now, s)
    engine.analyze = reference  # type: ignore[assignment]
    try:
        want = evaluate(ev, now, s)
    finally:
        engine.analyze = analyze
    assert got == want, seed


def _claims_scenario(seed: int) -> None:
    """`evaluate` with the kept walks against `evaluate` with the single walk: the same claims (verdict,
    reason, evidence, goodput, stragglers) after every increment of a run of 2-4 pods, each with a
    trainer and a sidecar container (a helper's log is no progress), some restarted, some on a node
    whose clock runs ahead, some with lines stamped after they were read (no place in time)."""

    rng = random.Random(seed)
    s = ClaimSettings()
    n = rng.randrange(2, 5)
    objs = [taurun(workers=n)]
    for i in range(n):
        p = pod(f"r-{i}", restarted_ago=timedelta(minutes=rng.choice((5, 40))) if rng.random() < 0.3 else None)
        p["spec"]["containers"].append({"name": "shipper"})  # no GPU beside one that has them: a helper
        p["status"]["containerStatuses"].append({"name": "shipper", "ready": True, "restartCount": 0,
                                                 "state": {"running": {}}})
        objs.append(p)
    index = build_index([x.record for x in map(normalize, objs) if x.record is not None])
    index.synced.update(dict.fromkeys(("Pod", "TauRun", "Node", "Event"), NOW))
    if rng.random() < 0.3:
        index.node_skew[f"node-r-{rng.randrange(n)}"] = timedelta(seconds=rng.choice((2, 20)))
    now = NOW
    logs = {(f"r-{i}", c): Log(rng, f"r-{i}", now - timedelta(minutes=rng.randrange(1, 30)))
            for i in range(n) for c in ("main", "shipper")}
    for log in logs.values():
        log.stepless = False
    for _ in range(rng.randrange(4, 14)):
        for (name, c), log in rng.sample(sorted(logs.items()), rng.randrange(1, len(logs) + 1)):
            log.grow(rng.randrange(1, 10))
            log.rescan(s)
            index.set_signal(Signal(Ref("Pod", "ns", name), c, log.scan, now))
        now += timedelta(seconds=rng.choice((5, 30, 30, 120)))
        ev = index.evidence(Ref("TauRun", "ns", "r"))
        assert_same_as_single_walk(ev, now, s, seed)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_claims_with_kept_walks_equal_the_single_walks(seed: int) -> None:
    _claims_scenario(seed)


def test_a_node_clock_ahead_keeps_its_streams_walks() -> None:
    """A signal from a node whose clock runs ahead is shifted onto our clock before it is analysed: the
    same scan and skew give the same shifted scan on the next evaluation, so its walk is kept too."""
    rng = random.Random(3)
    s = ClaimSettings()
    objs = [taurun(workers=2), pod("r-0"), pod("r-1")]
    index = build_index([x.record for x in map(normalize, objs) if x.record is not None])
    index.synced.update(dict.fromkeys(("Pod", "TauRun", "Node", "Event"), NOW))
    index.node_skew["node-r-0"] = timedelta(seconds=20)
    for name in ("r-0", "r-1"):
        log = Log(rng, name, NOW - timedelta(hours=2))
        log.stepless = False
        log.grow(20)
        log.rescan(s)
        index.set_signal(Signal(Ref("Pod", "ns", name), "main", log.scan, NOW))
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    with counted_walks() as calls:
        first = evaluate(ev, NOW, s)
        assert sorted(calls) == ["r-0/main", "r-1/main"]
        calls.clear()
        again = evaluate(ev, NOW + timedelta(seconds=5), s)
        assert calls == [], "a skewed node's stream was walked again with nothing new"
        index.node_skew["node-r-0"] = timedelta(seconds=40)  # the skew measured anew: shifted again
        evaluate(index.evidence(Ref("TauRun", "ns", "r")), NOW + timedelta(seconds=10), s)
        assert calls == ["r-0/main"]
    assert first.progressing.observed == again.progressing.observed
