"""Property tests over every kind the collector reads (issue 9), not only pods: objects the
simulator's engine writes while it plays the default scenario (TauRuns, RayJobs, RayClusters,
Kueue Workloads and queues, Jobs, Events, Nodes, ...), broken field by field with any JSON value.

Tenants write these objects. Whatever a field holds, `normalize` returns a record or raises
`MalformedObject` (which the controller names and skips), and a run's claims are still evaluated
from the rest: a wrong type must never be an exception that loses the batch it came in.
"""

from __future__ import annotations

import copy
import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.correlate import RunIndex
from collector.kube import MalformedObject, normalize
from collector.multicluster import evaluate_multicluster
from collector.settings import ClaimSettings
from kubesim.clock import ManualClock
from kubesim.engine import ScenarioEngine
from kubesim.scenario import load_scenario
from kubesim.server import Simulator, SimulatorSettings
from tests.scale.mutate import set_path

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
PLAYED_S = 900  # the default scenario's runs submitted, admitted, started, some failed or stalled


@functools.lru_cache(maxsize=1)
def _played() -> tuple[tuple[dict[str, Any], ...], datetime]:
    """Every object in the store after the default scenario played for PLAYED_S seconds."""
    sc = load_scenario(Path(__file__).resolve().parents[2] / "kubesim" / "scenarios" / "default.yaml")
    clock = ManualClock(T0)
    sim = Simulator(clock=clock, settings=SimulatorSettings(seed=sc.seed))
    sim.start("127.0.0.1:0")
    eng = ScenarioEngine(sc, sim.base_url, clock)
    try:
        eng.step_to(PLAYED_S)
        assert not eng.errors
        objs = tuple(o for rt in sim.registry.types for o in sim.store.list_page(rt, "").items)
        return objs, clock.now()
    finally:
        eng.stop()
        sim.close()


def _paths(obj: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if depth >= 8:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k), depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            out += _paths(v, (*prefix, i), depth + 1)
    return out


_scalar = (st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["", "True", "Running", "2026-01-10T12:00:00Z", "1e999", "-1"]))
_json = st.recursive(_scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                                                         max_size=3), max_leaves=8)


@st.composite
def _broken(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """One played object, with 1-4 of its fields replaced by any JSON value or deleted."""
    objs, _ = _played()
    i = draw(st.integers(0, len(objs) - 1))
    obj = copy.deepcopy(objs[i])
    paths = _paths(obj)
    for _ in range(draw(st.integers(1, 4))):
        obj = set_path(obj, draw(st.sampled_from(paths)), draw(_json), draw(st.booleans()))
    return obj, i


def test_the_played_cluster_holds_every_kind_the_runs_are_made_of() -> None:
    kinds = {o["kind"] for o in _played()[0]}
    assert {"TauRun", "RayJob", "RayCluster", "Workload", "ClusterQueue", "LocalQueue", "Pod", "Event",
            "Node", "Job"} <= kinds, kinds


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_broken())
def test_any_field_of_any_kind_is_a_record_or_one_named_error(case: tuple[dict[str, Any], int]) -> None:
    obj, _ = case
    try:
        n = normalize(obj, where="the object")
    except MalformedObject as e:
        assert str(e)  # named (the controller logs and skips it)
        return
    assert all(isinstance(p, str) for p in n.problems)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(_broken(), min_size=1, max_size=3))
def test_runs_are_evaluated_whatever_their_objects_hold(cases: list[tuple[dict[str, Any], int]]) -> None:
    """The played cluster with a few objects broken in place: every run still gets claims."""
    objs, now = _played()
    replaced = {i: obj for obj, i in cases}
    index = RunIndex()
    for i, raw in enumerate(objs):
        try:
            rec = normalize(replaced.get(i, raw)).record
        except MalformedObject:
            continue  # skipped, as the controller does
        if rec is not None:
            index.upsert(rec)
    roots = index.roots()
    assert roots
    for ref in roots:
        rc = evaluate_multicluster(index.evidence(ref), {}, now, ClaimSettings())
        for claim in (rc.scheduled, rc.running, rc.progressing):
            assert isinstance(claim.reason, str) and claim.reason
