"""Quiet containers (a scan with no sample: a sidecar's, a Ray worker's trainer after its first document)
keep nothing on their scans between evaluations (issue 30: most of a fleet's signals are quiet, and a
kept walk, its key and memo list cost ~0.8 KB each), and the answers stay those of the single walk.

The differential: runs of trainers that grow (`test_incremental_analysis.Log`) beside quiet containers
of every kind a scan with no sample can be (no stamp, a first stamp, a first stamp past the clock, a
resume line, a summary that still names a high-water sample whose samples were all dropped), each
evaluation's `analyze` and `evaluate` against the single walk (`tests.claims.analyze_reference`).
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.claims import progress_walk
from collector.claims.common import Clock
from collector.claims.memo import newest_stamp
from collector.claims.progress import analyze
from collector.correlate import Signal, build_index
from collector.kube import normalize
from collector.model import Ref
from collector.progress import LogScan, ProgressSample
from collector.progress.model import ResumeFinding, summarize
from collector.settings import ClaimSettings
from tests.claims.analyze_reference import analyze as reference
from tests.claims.test_incremental_analysis import T0, Log, assert_same_as_single_walk, counted_walks
from tests.claims.test_recheck_at import NOW, pod, taurun


def quiet_scan(rng: random.Random, at: datetime) -> LogScan:
    """A scan with no sample, of one of the kinds a quiet container's can be."""
    kind = rng.randrange(5)
    first = None if kind == 0 else at + timedelta(minutes=10) if kind == 2 else at
    resumes = (ResumeFinding(2, at, 7, "megatron"),) if kind == 3 else ()
    summary = None
    if kind == 4:  # every sample dropped but the summary's high-water mark (the walk leads with it)
        high = ProgressSample(40, at - timedelta(minutes=3), 2.0, 1, "megatron")
        summary = replace(summarize((high,)), dropped=1)
    return LogScan("q", None, (), (), (), (), 3, summary=summary, first_at=first, resumes=resumes)


def _analyze_scenario(seed: int) -> None:
    rng = random.Random(seed)
    s = ClaimSettings()
    now = T0
    logs = [Log(rng, f"w{i}", now - timedelta(seconds=10 * rng.randrange(60))) for i in range(rng.randrange(0, 3))]
    quiet = {f"q{i}": quiet_scan(rng, now - timedelta(seconds=rng.randrange(600))) for i in range(rng.randrange(1, 6))}
    for _ in range(rng.randrange(3, 12)):
        for g in logs:
            if rng.random() < 0.6:
                g.grow(rng.randrange(1, 8))
                g.rescan(s)
        if rng.random() < 0.2:  # a quiet container's new document: another scan object, still no sample
            name = rng.choice(sorted(quiet))
            quiet[name] = quiet_scan(rng, now)
        now += timedelta(seconds=rng.choice((0, 10, 30, 300)))
        signals = [Signal(Ref("Pod", "ns", g.pod), "main", g.scan, now) for g in logs]
        signals += [Signal(Ref("Pod", "ns", name), "main", scan, now) for name, scan in quiet.items()]
        rng.shuffle(signals)
        c1 = Clock(now, timedelta(seconds=rng.choice((0, 5)))) if rng.random() < 0.5 else None
        c2 = Clock(now, c1.slack) if c1 is not None else None
        got = analyze(signals, s, now, clock=c1)
        want = reference(signals, s, now, clock=c2)
        assert got == want, seed
        assert (c1.recheck_at if c1 else None) == (c2.recheck_at if c2 else None)
        for name, scan in quiet.items():  # nothing kept on a quiet scan (one naming a high-water sample has one)
            assert (scan.memo is None) == (scan.summary is None), name


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_quiet_streams_answer_as_the_single_walk(seed: int) -> None:
    _analyze_scenario(seed)


def _claims_scenario(seed: int) -> None:
    """`evaluate` with kept walks against the single walk, a run whose pods each have a trainer that prints
    steps (or not) and a sidecar that never does."""
    rng = random.Random(seed)
    s = ClaimSettings()
    n = rng.randrange(2, 5)
    objs = [taurun(workers=n)]
    for i in range(n):
        p = pod(f"r-{i}")
        p["spec"]["containers"].append({"name": "shipper"})
        p["status"]["containerStatuses"].append({"name": "shipper", "ready": True, "restartCount": 0,
                                                 "state": {"running": {}}})
        objs.append(p)
    index = build_index([x.record for x in map(normalize, objs) if x.record is not None])
    index.synced.update(dict.fromkeys(("Pod", "TauRun", "Node", "Event"), NOW))
    now = NOW
    printing = {f"r-{i}" for i in range(n) if rng.random() < 0.6}
    logs = {f"r-{i}": Log(rng, f"r-{i}", now - timedelta(minutes=rng.randrange(1, 30))) for i in sorted(printing)}
    for log in logs.values():
        log.stepless = False
    for i in range(n):
        index.set_signal(Signal(Ref("Pod", "ns", f"r-{i}"), "shipper", quiet_scan(rng, now), now))
        if f"r-{i}" not in printing:
            index.set_signal(Signal(Ref("Pod", "ns", f"r-{i}"), "main", quiet_scan(rng, now), now))
    for _ in range(rng.randrange(3, 10)):
        for name, log in logs.items():
            if rng.random() < 0.7:
                log.grow(rng.randrange(1, 10))
                log.rescan(s)
                index.set_signal(Signal(Ref("Pod", "ns", name), "main", log.scan, now))
        now += timedelta(seconds=rng.choice((5, 30, 120)))
        ev = index.evidence(Ref("TauRun", "ns", "r"))
        assert_same_as_single_walk(ev, now, s, seed)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_claims_with_quiet_sidecars_equal_the_single_walks(seed: int) -> None:
    _claims_scenario(seed)


def test_a_quiet_scan_keeps_nothing_and_a_printing_one_keeps_its_walk() -> None:
    s = ClaimSettings()
    rng = random.Random(5)
    trainer = Log(rng, "w0", T0)
    trainer.stepless = False
    trainer.grow(30)
    trainer.rescan(s)
    quiet = LogScan("q", None, (), (), (), (), 3, first_at=T0)
    now = T0 + timedelta(hours=1)
    signals = [Signal(Ref("Pod", "ns", "w0"), "main", trainer.scan, now),
               Signal(Ref("Pod", "ns", "q0"), "fluent", quiet, now)]
    with counted_walks() as calls:
        first = analyze(signals, s, now)
        assert calls == ["w0/main"]  # the quiet one not walked at all: its first line is all it gives
        calls.clear()
        again = analyze(signals, s, now + timedelta(seconds=30))
        assert calls == []  # the trainer's walk kept
    assert first == reference(signals, s, now) and again == reference(signals, s, now + timedelta(seconds=30))
    assert quiet.memo is None
    assert progress_walk._KEPT.get(trainer.scan) is not None
    assert newest_stamp(quiet) is None and quiet.memo is None
    assert newest_stamp(trainer.scan) == max(x.at for x in trainer.scan.samples if x.at is not None)
