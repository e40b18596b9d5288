"""The agents' new GPU pass forgets the kept comparisons read from the records it replaced
(`claims.gpuspread.forget_replaced`, issue 30): a progressing run is not re-evaluated on a GPU pass
(`runs_to_recheck`), so without it the pass before's records stayed held until the run's next log
increment. Same output: every run's claims (repr, JSON) and the exposition are those of a loop that
keeps them, over seeded sequences of GPU passes (new records, the same objects handed again, pods
missing, a GPU apart), log increments, evaluations and clock moves."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from bench.bench_controller import fleet_controller, node_name
from collector import changes
from collector.claims import gpuspread
from collector.claims.memo import ByInputs
from collector.correlate import Signal
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.kube import NodeLease
from collector.model import Observed, Ref
from collector.planes.base import Change
from collector.planes.node_agents import pass_changes, runs_changed, runs_not_progressing, same_devices
from collector.render import to_json
from collector.sources.agents import _scan as decode

RUNS, PODS = 3, 4
NOW0 = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)


class _Fleet:
    """A controller (never opened) holding RUNS runs of PODS GPU pods, fed as bench_fleet's `live-heads`."""

    def __init__(self) -> None:
        self.clock = [NOW0]
        self.c, self.pods = fleet_controller(RUNS, PODS, RUNS * PODS, lambda: self.clock[0])
        for n in range(RUNS * PODS):  # every node's clock measured (its kubelet's Lease): stamps placed
            self.c.clocks.lease(NodeLease(node_name(n), NOW0, timedelta(seconds=40)), timedelta(0), listed=False)
        self.sent: dict[tuple[str, str], int] = {}
        self.held: dict[tuple[str, str], PodGpuEvidence] = {}

    def gpu_pass(self, seed: int, apart: int | None, missing: int | None, again: bool) -> None:
        """Every pod's readings (seeded), `apart`: one pod's first GPU's SM clock far below the others';
        `missing`: a pod the pass leaves out; `again`: records of the pass before handed again."""
        rng = random.Random(seed)
        now = self.clock[0]
        gpus: dict[tuple[str, str], PodGpuEvidence] = {}
        for k, p in enumerate(self.pods):
            ns, name, node = p["metadata"]["namespace"], p["metadata"]["name"], p["spec"]["nodeName"]
            if k == missing:
                continue
            if again and (ns, name) in self.held:
                gpus[(ns, name)] = self.held[(ns, name)]
                continue
            devs = tuple(GpuDevice(uuid=f"GPU-{k:04d}{i:04d}-0000-4000-8000-000000000000", index=i,
                                   utilization=rng.uniform(0.85, 1.0),
                                   sm_active=rng.uniform(0.6, 0.9), power_w=rng.uniform(500.0, 700.0),
                                   power_limit_w=700.0,
                                   sm_clock_hz=(1.2e9 if k == apart and i == 0 else 1.98e9) * rng.uniform(0.99, 1.01))
                         for i in range(8))
            gpus[(ns, name)] = PodGpuEvidence(ns, name, node, "agent", now, devs, ("main",))
        self.held = gpus
        nodes = {g.node: now for g in gpus.values()}
        _apply_pass(self.c, gpus, nodes, frozenset())

    def log(self, run: int) -> None:
        """The run's head prints its next 30 steps (an agent's increment, as bench_fleet's feed)."""
        p = self.pods[run * PODS]
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        container = p["spec"]["containers"][0]["name"]
        n0 = self.sent.get((ns, name), 0)
        start = self.clock[0] - timedelta(seconds=29)
        rng = random.Random(n0 * 31 + run)
        doc = orjson.loads(orjson.dumps({"format": "megatron", "lines": n0 + 30, "samples": [
            [1000 + n0 + i, (start + timedelta(seconds=i)).isoformat(), rng.uniform(1.5, 3.0), False, 500_000,
             n0 + i + 1] for i in range(30)]}))
        scan = replace(decode(doc, f"{ns}/{name}/{container}"), first_at=start)
        self.sent[(ns, name)] = n0 + 30
        self.c._apply(Change("agent-log", None, (Signal(Ref("Pod", ns, name), container, scan, self.clock[0]),
                                                 None if n0 == 0 else n0)))

    def evaluate(self) -> list[str]:
        out = self.c.evaluate()
        now = self.clock[0]
        exposition = [line for line in generate_latest(self.c.registry).decode().splitlines()
                      if not line.startswith(("#", "taugrid_collector_evaluation_duration"))]  # (timings)
        return [*(repr(rc) for rc in out), orjson.dumps(to_json(out, now)).decode(), *exposition]


Step = tuple[str, int, int | None, int | None, bool]
STEPS = st.one_of(
    st.tuples(st.just("gpu"), st.integers(0, 1 << 16), st.none() | st.integers(0, RUNS * PODS - 1),
              st.none() | st.integers(0, RUNS * PODS - 1), st.booleans()),
    st.tuples(st.just("log"), st.integers(0, RUNS - 1), st.none(), st.none(), st.just(False)),
    st.tuples(st.just("eval"), st.just(0), st.none(), st.none(), st.just(False)),
    st.tuples(st.just("tick"), st.integers(1, 400), st.none(), st.none(), st.just(False)),
)


def runs_to_recheck(old: Any, new: Any, root_of: Any, member_pods: Any, claims: Any, dirty: set[Any], *,
                    now: datetime | None = None, every: timedelta = timedelta(0)) -> set[Any]:
    """What a whole pass (`old` → `new`) marks, as the loop marks it part by part and at its end: runs
    whose pods' devices changed or came (`runs_changed`), runs of pods gone, and runs not progressing
    (`runs_not_progressing`)."""
    out = runs_changed(old, new, root_of, claims, dirty)
    out |= runs_changed({}, {k: g for k, g in old.items() if k not in new}, root_of, claims, dirty | out)
    return out | runs_not_progressing(lambda p: p in new or p in old, member_pods, claims, dirty | out,
                                      now=now, every=every)


def _apply_pass(c: Any, gpus: Any, nodes: Any, log_pods: frozenset[tuple[str, str]]) -> None:
    """A whole pass, as the agent poller hands it: agent by agent, then its end."""
    for ch in pass_changes(gpus, nodes, log_pods):
        c._apply(ch)


def _forget_all() -> None:
    gpuspread._CORES = ByInputs()  # (another test's kept comparisons: none of this fleet's)


def _play(steps: list[Step], *, forgetting: bool, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    _forget_all()
    with monkeypatch.context() as m:
        if not forgetting:
            m.setattr(changes, "forget_replaced", lambda current: None)  # the loop before: kept until a miss
            m.setattr(changes, "forget_spread", lambda run: None)
        f = _Fleet()
        f.gpu_pass(0, None, None, False)
        for run in range(RUNS):
            f.log(run)
        seen = [f.evaluate()]
        for op, a, b, c, again in steps:
            if op == "gpu":
                f.gpu_pass(a, b, c, again)
                if forgetting:  # nothing kept reads a record the pass replaced
                    current = {id(g) for g in f.c._gpus.values()}
                    for inputs, _, _ in gpuspread._CORES._kept.values():
                        assert all(id(e) in current for e in inputs)
            elif op == "log":
                f.log(a)
            elif op == "tick":
                f.clock[0] += timedelta(seconds=a)
            else:
                seen.append(f.evaluate())
        seen.append(f.evaluate())
        f.c._dirty.update(f.c.claims)
        seen.append(f.evaluate())  # every run, whatever was marked
        return seen


# A GPU apart, then a pass without it: a comparison served for the wrong records (the pass before's)
# names it still (the test fails with `ByInputs.get` serving a run's kept value whatever its inputs).
APART_THEN_CLEARED: list[Step] = [("gpu", 1, 2, None, False), ("log", 0, None, None, False),
                                  ("eval", 0, None, None, False), ("gpu", 2, None, None, False),
                                  ("log", 0, None, None, False), ("eval", 0, None, None, False)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEPS, min_size=1, max_size=14))
@example(steps=APART_THEN_CLEARED)
def test_forgetting_replaced_records_leaves_every_claim_and_the_exposition(steps: list[Step],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert _play(steps, forgetting=True, monkeypatch=monkeypatch) == \
        _play(steps, forgetting=False, monkeypatch=monkeypatch)


def test_a_progressing_run_holds_no_record_of_the_pass_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's order (and the agent poller's: logs handed on first, the GPUs at the pass's end):
    each run re-evaluated on its log increment, then the GPU pass, which re-evaluates no progressing
    run. Kept, the comparison held the replaced records until the next increment."""
    for forgetting in (True, False):
        _forget_all()
        with monkeypatch.context() as m:
            if not forgetting:
                m.setattr(changes, "forget_replaced", lambda current: None)
                m.setattr(changes, "forget_spread", lambda run: None)
            f = _Fleet()
            f.gpu_pass(0, None, None, False)
            for k in range(3):
                f.clock[0] += timedelta(seconds=30)
                for run in range(RUNS):
                    f.log(run)
                f.evaluate()
                f.gpu_pass(k + 1, 1, None, False)
                assert not f.c._dirty  # (progressing runs, the same devices: nothing to re-evaluate)
            current = {id(g) for g in f.c._gpus.values()}
            kept = [e for inputs, _, _ in gpuspread._CORES._kept.values() for e in inputs]
            if forgetting:
                assert kept == []
            else:  # every run's pods' records of the pass before
                assert len(gpuspread._CORES) == RUNS and len(kept) == RUNS * PODS
                assert not any(id(e) in current for e in kept)


def test_forget_unless_keeps_slots_whose_inputs_are_all_current() -> None:
    memo: ByInputs[str, int] = ByInputs()
    a, b, c = object(), object(), object()
    memo.put("ab", [a, b], 1)
    memo.put("bc", [b, c], 2)
    memo.put("none", [], 3)
    memo.forget_unless(lambda x: x is not c)
    assert memo.get("ab", [a, b]) == (1,) and memo.get("none", []) == (3,)
    assert memo.get("bc", [b, c]) is None and len(memo) == 2


def _by_pod(f: _Fleet, old: dict[tuple[str, str], PodGpuEvidence], new: dict[tuple[str, str], PodGpuEvidence],
            every: timedelta = timedelta(0)) -> set[tuple[str, str, str]]:
    """What a GPU pass re-evaluates, pod by pod (the definition `runs_to_recheck` kept before it went by
    run): each pod's evaluated run, unless it is already marked, or the pod's devices stayed and the run
    progresses or was evaluated less than `every` ago."""
    out = set()
    for ns, pod in set(old) | set(new):
        root = f.c.index.root_of(Ref("Pod", ns, pod))
        if root is None or root.key in f.c._dirty or root.key not in f.c.claims:
            continue
        was, now, rc = old.get((ns, pod)), new.get((ns, pod)), f.c.claims.get(root.key)
        if was is None or now is None or not same_devices(was, now) or rc is None \
                or (rc.progressing.observed is not Observed.TRUE and f.clock[0] - rc.evaluated_at >= every):
            out.add(root.key)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEPS, min_size=1, max_size=16), st.lists(st.integers(0, RUNS * PODS - 1), max_size=3))
@example([("tick", 30, None, None, False), *[("log", r, None, None, False) for r in range(RUNS)],
          ("eval", 0, None, None, False), ("gpu", 5, None, None, False), ("gpu", 6, None, 2, False)], [5])
def test_a_gpu_pass_marks_the_runs_it_marked_pod_by_pod(steps: list[Step], lost: list[int]) -> None:
    """`runs_to_recheck` goes by run (its member pods) instead of by pod (each pod's root): the same runs
    over seeded passes, pods missing, devices lost (`lost`: pods whose first GPU the next pass says is
    lost), runs progressing or not, some already marked."""
    _forget_all()
    f = _Fleet()
    f.gpu_pass(0, None, None, False)
    for run in range(RUNS):
        f.log(run)
    f.evaluate()
    for op, a, b, c, again in steps:
        if op == "gpu":
            old = dict(f.c._gpus)
            f.gpu_pass(a, b, c, again)  # (applied: what it marked is in `_dirty`, among what was there)
            new = f.c._gpus
            for k in lost:
                p = f.pods[k]
                key = (p["metadata"]["namespace"], p["metadata"]["name"])
                if key in new:
                    g = new[key]
                    new[key] = PodGpuEvidence(g.namespace, g.pod, g.node, g.source, g.read_at,
                                              (replace(g.devices[0], lost=True), *g.devices[1:]), g.containers)
            for dirty in (set(), set(list(f.c.claims)[:1])):
                f.c._dirty = dirty
                got = runs_to_recheck(old, new, f.c.index.root_of, f.c.index.member_pods, f.c.claims, set(dirty))
                assert got == _by_pod(f, old, new)
                every = f.c.settings.claims.confirm_refresh
                got = runs_to_recheck(old, new, f.c.index.root_of, f.c.index.member_pods, f.c.claims, set(dirty),
                                      now=f.clock[0], every=every)
                assert got == _by_pod(f, old, new, every)
        elif op == "log":
            f.log(a)
        elif op == "tick":
            f.clock[0] += timedelta(seconds=a)
        else:
            f.evaluate()


def _progressing() -> _Fleet:
    """The fleet after three rounds of its heads' increments, each run evaluated: every run progressing."""
    _forget_all()
    f = _Fleet()
    f.gpu_pass(0, None, None, False)
    for _ in range(3):
        f.clock[0] += timedelta(seconds=30)
        for run in range(RUNS):
            f.log(run)
        f.evaluate()
    return f


def test_a_gpu_pass_marks_a_progressing_run_only_when_its_pods_devices_change() -> None:
    f = _progressing()
    runs = sorted(f.c.claims)
    assert all(f.c.claims[r].progressing.observed is Observed.TRUE for r in runs)
    old = dict(f.c._gpus)
    new = {k: PodGpuEvidence(g.namespace, g.pod, g.node, g.source, g.read_at + timedelta(seconds=30),
                             tuple(replace(d, utilization=0.5) for d in g.devices), g.containers)
           for k, g in old.items()}

    def marked(new: dict[tuple[str, str], PodGpuEvidence]) -> set[tuple[str, str, str]]:
        got = runs_to_recheck(old, new, f.c.index.root_of, f.c.index.member_pods, f.c.claims, set())
        assert got == _by_pod(f, old, new)
        return got

    assert marked(new) == set()  # readings only
    pod = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in f.pods]
    run_of = {pod[k]: f.c.index.root_of(Ref("Pod", *pod[k])) for k in range(RUNS * PODS)}
    lost = dict(new)
    g = lost[pod[PODS + 1]]
    lost[pod[PODS + 1]] = PodGpuEvidence(g.namespace, g.pod, g.node, g.source, g.read_at,
                                         (replace(g.devices[0], lost=True), *g.devices[1:]), g.containers)
    r1 = run_of[pod[PODS + 1]]
    assert r1 is not None and marked(lost) == {r1.key}
    gone = {k: v for k, v in new.items() if k != pod[2]}
    r0 = run_of[pod[2]]
    assert r0 is not None and r0 != r1 and marked(gone) == {r0.key}


def test_a_pod_no_agent_reads_any_more_marks_its_run() -> None:
    """The API log source holds no target for a pod a node agent reads (`ApiLogSource.track`): an agent's
    pass that no longer names the pod among those it reads marks the pod's run (its evaluation gives the
    API log source the pod's containers again), though its GPUs stayed as they were."""
    f = _progressing()
    gpus = dict(f.c._gpus)
    pods = frozenset(gpus)
    nodes = {g.node: f.clock[0] for g in gpus.values()}
    _apply_pass(f.c, gpus, nodes, pods)
    assert not f.c._dirty
    gone = sorted(pods)[PODS + 1]
    _apply_pass(f.c, gpus, nodes, pods - {gone})
    root = f.c.index.root_of(Ref("Pod", *gone))
    assert root is not None and f.c._dirty == {root.key}


def test_a_gpu_pass_keeps_its_newest_agent_read() -> None:
    """What `apply_gpu` reads for a run with no GPU evidence (whether any agent was read recently), kept
    once a pass: the latest of the pass's node reads, none without nodes."""
    f = _Fleet()
    f.gpu_pass(1, None, None, False)
    assert f.c._agents_newest == f.clock[0]
    f.clock[0] += timedelta(seconds=30)
    nodes = {"node-a": f.clock[0] - timedelta(minutes=5), "node-b": f.clock[0] - timedelta(minutes=1)}
    _apply_pass(f.c, {}, nodes, frozenset())
    assert f.c._agents_newest == f.clock[0] - timedelta(minutes=1)
    _apply_pass(f.c, {}, {}, frozenset())
    assert f.c._agents_newest is None


def test_a_pass_of_readings_alone_re_evaluates_a_run_not_progressing_once_a_refresh() -> None:
    """A run not progressing reads the GPUs' readings for its wording (busy but cold, idle): a pass whose
    devices stayed re-evaluates it once `claims.confirm_refresh` passed since its last evaluation, not on
    every pass (a start of 10,000 such runs evaluated them all every 30 s on top of their increments);
    a device that changed (here lost) re-evaluates its run at once."""
    _forget_all()
    f = _Fleet()
    f.gpu_pass(0, None, None, False)
    f.evaluate()
    assert f.c.claims and not any(rc.progressing.observed is Observed.TRUE for rc in f.c.claims.values())
    f.clock[0] += timedelta(seconds=30)
    f.gpu_pass(1, None, None, False)
    assert not f.c._dirty
    f.clock[0] += f.c.settings.claims.confirm_refresh
    f.gpu_pass(2, None, None, False)
    assert f.c._dirty == set(f.c.claims)
    f.evaluate()
    f.clock[0] += timedelta(seconds=30)
    f.gpu_pass(3, None, None, True)
    lost = f.c._gpus[next(iter(f.c._gpus))]
    old = dict(f.c._gpus)
    new = {**old, (lost.namespace, lost.pod): PodGpuEvidence(
        lost.namespace, lost.pod, lost.node, lost.source, f.clock[0],
        (replace(lost.devices[0], lost=True), *lost.devices[1:]), lost.containers)}
    _apply_pass(f.c, new, {g.node: f.clock[0] for g in new.values()}, frozenset())
    root = f.c.index.root_of(Ref("Pod", lost.namespace, lost.pod))
    assert root is not None and f.c._dirty == {root.key}
