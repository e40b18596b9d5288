"""Kueue queue status reads counts the engine keeps as runs change (QueueTally), instead of
recounting every run per sync. At every sync of a generated fleet (submissions, quota waits,
admissions, preemptions, MultiKueue dispatch, finishes) the counts equal a full recount."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
from kubesim.engine import RunState
from kubesim.engine.state import QueueTally
from kubesim.generate import generate

T0 = datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)


def recount(eng: ScenarioEngine) -> list[tuple[int, ...]]:
    """The counts as the engine computed them before the tally: one pass over every run per queue."""
    out: list[tuple[int, ...]] = []
    for cq in eng.scenario.cluster_queues:
        runs = [r for r in eng.runs.values() if r.spec.cluster_queue == cq.name and r.submitted and not r.finished]
        admitted = [r for r in runs if r.admitted]
        out.append((len(runs), len(admitted), sum(r.spec.workers * r.spec.gpus_per_worker for r in admitted)))
    for lq in eng.scenario.local_queues:
        runs = [
            r
            for r in eng.runs.values()
            if r.spec.queue == lq.name and r.spec.namespace == lq.namespace and r.submitted and not r.finished
        ]
        out.append((len(runs), sum(1 for r in runs if r.admitted)))
    return out


def tallied(eng: ScenarioEngine) -> list[tuple[int, ...]]:
    tally = eng._queues
    out: list[tuple[int, ...]] = []
    for cq in eng.scenario.cluster_queues:
        c = tally.cluster.get(cq.name)
        out.append((c.active, c.admitted, c.gpus) if c else (0, 0, 0))
    for lq in eng.scenario.local_queues:
        c = tally.local.get((lq.namespace, lq.name))
        out.append((c.active, c.admitted) if c else (0, 0))
    return out


def test_tally_equals_a_full_recount_at_every_sync() -> None:
    clock = ManualClock(T0)
    sim = Simulator(clock=clock, settings=SimulatorSettings(seed=7))
    sim.start("127.0.0.1:0")
    eng = ScenarioEngine(generate(7, runs=60).scenario, sim.base_url, clock)
    syncs: list[list[tuple[int, ...]]] = []
    sync = eng._sync_queues

    def checked() -> None:
        expected = recount(eng)
        assert tallied(eng) == expected
        syncs.append(expected)
        sync()

    eng._sync_queues = checked  # type: ignore[method-assign]
    try:
        t = 0.0
        while t < 20 * 60.0:
            t += 30.0
            eng.step_to(t)
        assert not eng.errors, eng.errors[:3]
    finally:
        eng.stop()
        sim.close()
    assert len(syncs) > 60  # a sync per submission at least
    # The play went through the transitions the tally folds: runs admitted, then preempted or finished.
    assert max(s[0][1] for s in syncs) > 0
    assert any(later[0][1] < earlier[0][1] for earlier, later in pairwise(syncs))
    assert tallied(eng) == recount(eng)


def test_tally_follows_flag_writes_and_ignores_repeats() -> None:
    eng_spec = generate(3, runs=4).scenario.runs
    tally = QueueTally()
    a, b = RunState(eng_spec[0]), RunState(eng_spec[1], submitted=True)
    tally.track(a)
    tally.track(b)
    cq = eng_spec[0].cluster_queue
    gpus_a = eng_spec[0].workers * eng_spec[0].gpus_per_worker

    def counts() -> tuple[int, int, int]:
        c = tally.cluster[cq]
        return c.active, c.admitted, c.gpus

    base = counts()
    a.admitted = True  # not submitted yet: not counted
    assert counts() == base
    a.submitted = True
    assert counts() == (base[0] + 1, base[1] + 1, base[2] + gpus_a)
    a.admitted = True  # a repeated write changes nothing
    assert counts() == (base[0] + 1, base[1] + 1, base[2] + gpus_a)
    a.admitted = False  # preempted
    assert counts() == (base[0] + 1, base[1], base[2])
    a.admitted = True
    a.finished = True
    assert counts() == base
