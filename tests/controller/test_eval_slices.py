"""A pass over many runs is evaluated in slices, oldest mark first (issue 30, burst latency).

A burst marks every run; one pass over them all takes ~0.15 s on one core. Evaluated whole, a change
that arrived as the pass began waited for it, the pause and the whole next pass. In slices of
`EVAL_SLICE_S` the queue is applied between them and each slice is exported as it ends, so a run
waits about one pass and pause between its evaluations; passes come as often as before.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import collector.controller as controller_mod
import collector.evaluation as evaluation_mod
from collector.recheck import DirtyRuns
from kubesim.server import Simulator
from tests.controller.test_controller import T0, Clock, apply_run, sim, start, wait_until

__all__ = ["sim"]  # the simulator fixture, shared with test_controller


def test_dirty_runs_keep_the_first_mark_in_order() -> None:
    d: DirtyRuns[str] = DirtyRuns()
    d.stamp = 1.0
    d.add("a")
    d.stamp = 2.0
    d.update(["b", "a"])  # "a" keeps its first mark
    d |= {"c"}
    assert d == {"a", "b", "c"} and d.since == {"a": 1.0, "b": 2.0, "c": 2.0}
    assert list(d.since) == ["a", "b", "c"] and d.oldest() == 1.0
    assert d.first(1.5, 10) == ["a"] and d.first(2.0, 2) == ["a", "b"] and d.first(0.5, 10) == []
    assert d == {"a", "b", "c"}  # left marked: a slice unmarks each run as its turn comes
    d.discard("b")
    d.discard("zz")
    assert d.pop() == "a" and d == {"c"} and set(d.since) == {"c"}
    d.clear()
    assert not d and not d.since and d.oldest() == math.inf
    with pytest.raises(TypeError):
        d -= {"c"}


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 3)), max_size=40), st.integers(0, 12))
def test_dirty_runs_stay_a_set(ops: list[tuple[str, int]], cut: int) -> None:
    """Whatever marks and looks come, the set and the stamps say the same runs."""
    d: DirtyRuns[str] = DirtyRuns()
    plain: set[str] = set()
    for i, (key, op) in enumerate(ops):
        d.stamp = float(i)
        if op == 0:
            d.discard(key)
            plain.discard(key)
        elif op == 3 and i == cut:
            first = d.first(float(i) / 2, cut % 4 + 1)
            # the oldest marks at or before the bound, in order, and no more than asked
            assert first == [k for k, t in d.since.items() if t <= i / 2][:cut % 4 + 1]
        else:
            d.add(key)
            plain.add(key)
        assert d == plain and set(d.since) == plain
        assert list(d.since.values()) == sorted(d.since.values())  # oldest mark first


def test_a_pass_over_many_runs_is_evaluated_in_slices(sim: Simulator, monkeypatch: Any) -> None:
    runs = 12
    for i in range(runs):
        apply_run(sim, f"run{i:02d}")
    c = start(sim, Clock(T0), tick=timedelta(seconds=0.3))
    try:
        wait_until(lambda: len(c.claims) == runs, what="every run evaluated")
        slow = evaluation_mod.evaluate_multicluster

        def evaluate_slowly(*args: Any, **kw: Any) -> Any:
            time.sleep(0.004)  # 12 runs: ~50 ms a pass, several slices of EVAL_SLICE_S (10 ms)
            return slow(*args, **kw)

        calls: list[tuple[int, float, float]] = []  # (runs evaluated, start, end) per evaluation
        whole = c.evaluate

        def counted(**kw: Any) -> Any:
            n0, t0 = c.runs_evaluated, time.monotonic()
            try:
                return whole(**kw)
            finally:
                calls.append((c.runs_evaluated - n0, t0, time.monotonic()))

        def observed() -> float:
            return c.registry.get_sample_value("taugrid_collector_evaluation_duration_seconds_count") or 0.0

        monkeypatch.setattr(evaluation_mod, "evaluate_multicluster", evaluate_slowly)
        c.evaluate = counted  # type: ignore[method-assign]
        passes0 = observed()
        wait_until(lambda: sum(n for n, _, _ in calls) >= 2 * runs, what="two full passes (the tick)")
        assert max(n for n, _, _ in calls) <= 4  # a slice: ~10 ms of 4 ms runs; whole, it was all 12
        slices = sum(1 for n, _, _ in calls if n)
        assert slices >= 6  # each exported as it ends (evaluate's exports)
        # the evaluation histogram still observes a pass: its slices' time, once
        assert 1 <= observed() - passes0 < slices
    finally:
        c.close()


def test_the_slices_of_a_pass_share_one_workloads_index() -> None:
    """Queued runs' status reads an index of the Workloads built once per pass (as when a pass was one
    call); a pass's slices keep it, the next pass and any whole evaluation build it again. (A
    controller never opened: no loop thread evaluates beside the test.)"""
    from collector.settings import Settings
    from collector.sources.kube_api import KubeApi, api_client_for

    c = controller_mod.Controller(KubeApi(api_client_for("http://127.0.0.1:9")), Settings(), lambda: T0)
    kept = object()
    c._workloads = kept  # type: ignore[assignment]  # (stands for the index a first slice built)
    c._workloads_pass = 5.0
    c.evaluate(until=time.monotonic() + 1, upto=5.0)  # a later slice of that pass
    assert c._workloads is kept
    c.evaluate(until=time.monotonic() + 1, upto=6.0)  # the next pass
    assert c._workloads is not kept and c._workloads_pass == 6.0
    c._workloads = kept  # type: ignore[assignment]
    c.evaluate()  # a whole evaluation
    assert c._workloads is not kept and c._workloads_pass is None


def test_a_slice_takes_the_oldest_marks_and_leaves_the_rest_in_place(monkeypatch: Any) -> None:
    """Slices take the runs marked at or before the pass's start in mark order, each unmarked as its
    turn comes; the rest stay marked in their places with their stamps (marks after the start are
    the next pass's), a key that names no run is unmarked as it comes up, and the claims are those
    of one whole evaluation. (A controller never opened: no loop thread beside the test.)"""
    from collector.kube import normalize
    from collector.settings import Settings
    from collector.sources.kube_api import KubeApi, api_client_for, resources_for
    from tests.test_explain_fixtures import taurun

    settings = Settings()
    c = controller_mod.Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings, lambda: T0)
    res = {r.kind: r for r in resources_for(settings.taugrid)}
    names = [f"run{i:02d}" for i in range(14)]
    for name in names:
        rec = normalize(taurun(name, "research", "Running", T0 - timedelta(hours=1))).record
        assert rec is not None
        c._upsert(res["TauRun"], rec)
    c.index.synced["TauRun"] = T0
    c.evaluate(full=True)
    whole = dict(c.claims)
    keys = [("TauRun", "research", n) for n in names]
    assert set(whole) == set(keys)
    # marks: most before the pass (at 1.0), a few after it began (at 9.0), one key that is no run
    order = [keys[5], keys[2], ("TauRun", "research", "gone"), *keys[6:11], keys[0], keys[13]]
    later = [keys[1], keys[12]]
    for i, k in enumerate(order):
        c._dirty.stamp = 1.0 + i / 100
        c._dirty.add(k)
    c._dirty.stamp = 9.0
    c._dirty.update(later)
    stamps = dict(c._dirty.since)
    seen: list[Any] = []
    slow = evaluation_mod.evaluate_multicluster

    def evaluate_slowly(ev: Any, *args: Any, **kw: Any) -> Any:
        seen.append(ev.root.ref.key)
        time.sleep(0.003)
        return slow(ev, *args, **kw)

    monkeypatch.setattr(evaluation_mod, "evaluate_multicluster", evaluate_slowly)
    c.claims.clear()
    slices = []
    while c._dirty.oldest() <= 5.0:
        n0 = len(seen)
        c.evaluate(until=time.monotonic() + 0.005, upto=5.0)
        slices.append(seen[n0:])
        # what is left: the same marks, in the same order, with the same stamps
        assert list(c._dirty.since.items()) == [(k, t) for k, t in stamps.items()
                                                if k in c._dirty.since]
        assert len(slices) < 20
    runs = [k for k in order if k in whole]
    assert seen == runs  # oldest mark first, each once
    assert len(slices) >= 3 and all(s for s in slices)  # ~2 runs a slice, one at least
    assert list(c._dirty.since.items()) == [(k, 9.0) for k in later]  # the next pass's, untouched
    assert c.runs_evaluated >= len(runs)
    assert {k: c.claims[k] for k in runs} == {k: whole[k] for k in runs}
