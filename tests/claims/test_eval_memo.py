"""What an evaluation keeps for the next one (collector/claims/memo.py, the GPU spread's comparison):
served only for the same inputs, and then equal to computing afresh, across evidence changes and
clock moves; evidence that changed (or aged) is never judged on a kept value."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.claims import evaluate, gpuspread, memo
from collector.claims.gpu import apply_gpu
from collector.claims.gpuspread import forget as forget_spread
from collector.claims.gpuspread import gpu_spread, gpu_spread_uncached
from collector.claims.lineage import RunPods, lineages, replaced_pods
from collector.correlate import RunEvidence, Signal
from collector.gpu import PodGpuEvidence
from collector.kube import normalize
from collector.model import ObjectRecord, OwnerRef, PodFacts
from collector.progress import scan_text
from collector.progress.model import PackedSamples, new_sample, new_scan
from tests.claims.test_gpuspread import gpus, megatron_log
from tests.claims.test_recheck_at import NOW, S, evidence, pod, taucluster, taurun

MAX_AGE = S.evidence_max_age
SLOWED = megatron_log(slow_from=35, slower=0.3)  # a run slower than its own baseline: GPUs apart are named


def spread_ev() -> RunEvidence:
    return evidence([taurun(), taucluster(timedelta(minutes=1)), pod()], log=SLOWED)


def readings(odd: int | None, seed: int, age_s: int, n: int = 8) -> PodGpuEvidence:
    (g,) = gpus(n, odd=odd, seed=seed, reasons=("hw_thermal_slowdown",)).values()
    return replace(g, read_at=NOW - timedelta(seconds=age_s))


# --- the GPU spread ------------------------------------------------------------------------------------

spread_step = st.one_of(
    st.tuples(st.just("new"), st.sampled_from([None, 2, 5]), st.integers(0, 5), st.sampled_from([5, 200, 290])),
    st.tuples(st.just("same"), st.none(), st.none(), st.none()),
    st.tuples(st.just("clock"), st.none(), st.none(), st.sampled_from([1, 30, 120, 400])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spread_step, min_size=1, max_size=8))
def test_kept_spread_equals_a_fresh_one_across_evidence_and_clock(steps: list[tuple[Any, ...]]) -> None:
    ev = spread_ev()
    forget_spread(ev.root.ref.key)
    held = [readings(5, 0, 10)]
    now = NOW
    for kind, odd, seed, secs in steps:
        if kind == "new":
            held = [readings(odd, seed, secs)]
        elif kind == "clock":
            now += timedelta(seconds=secs)
        assert gpu_spread(None, ev, held, now, MAX_AGE) == gpu_spread_uncached(None, ev, held, now, MAX_AGE)
        # and the whole step, kept comparison or none: the same claims
        rc = evaluate(ev, now, S)
        warm = apply_gpu(rc, ev, {("ns", "r-0"): held[0]}, {"node-r-0": held[0].read_at}, now, S)
        forget_spread(ev.root.ref.key)
        cold = apply_gpu(rc, ev, {("ns", "r-0"): held[0]}, {"node-r-0": held[0].read_at}, now, S)
        assert warm == cold


def test_new_readings_are_compared_again_not_served_from_the_last() -> None:
    """Keyed wrongly (by the run, by the pods, by equality of the pods' names) this serves the
    thermally held GPU of the first pass after the agents' next readings cleared it."""
    ev = spread_ev()
    forget_spread(ev.root.ref.key)
    first = gpu_spread(None, ev, [readings(5, 0, 10)], NOW, MAX_AGE)
    assert first is not None and [s.gpu for s in first.suspects] == ["GPU-0005"]
    cleared = gpu_spread(None, ev, [readings(None, 0, 10)], NOW, MAX_AGE)
    assert cleared is None or cleared.suspects == ()
    other = gpu_spread(None, ev, [readings(2, 0, 10)], NOW, MAX_AGE)
    assert other is not None and [s.gpu for s in other.suspects] == ["GPU-0002"]


def test_readings_that_aged_out_are_not_served() -> None:
    ev = spread_ev()
    forget_spread(ev.root.ref.key)
    held = [readings(5, 0, 10)]
    named = gpu_spread(None, ev, held, NOW, MAX_AGE)
    assert named is not None and named.suspects
    # the same objects, past the evidence bound: nothing fresh to compare, nobody named
    assert gpu_spread(None, ev, held, NOW + MAX_AGE, MAX_AGE) is None


def test_equal_readings_in_a_new_object_are_compared_again() -> None:
    ev = spread_ev()
    key = ev.root.ref.key
    forget_spread(key)
    held = [readings(5, 0, 10)]
    gpu_spread(None, ev, held, NOW, MAX_AGE)
    misses = gpuspread._CORES.misses
    gpu_spread(None, ev, held, NOW + timedelta(seconds=1), MAX_AGE)
    assert gpuspread._CORES.misses == misses  # the same objects: served
    gpu_spread(None, ev, [replace(held[0])], NOW, MAX_AGE)
    assert gpuspread._CORES.misses == misses + 1  # an equal copy is another reading


# --- the run's pods and their replacement answers --------------------------------------------------------

T0 = NOW - timedelta(hours=3)
JOB = OwnerRef("Job", "train", "uid-train", True)


def _pod(name: str, *, created_min: int = 0, role: str = "worker", rank: str = "", phase: str = "Running",
         deleting: bool = False, attempt: int = 0, restarts: int = 0, owner: OwnerRef = JOB) -> ObjectRecord:
    rec = normalize(pod(name)).record
    assert rec is not None and isinstance(rec.facts, PodFacts)
    f = rec.facts
    containers = tuple(c._replace(restart_count=restarts) for c in f.containers)
    return rec._replace(created=T0 + timedelta(minutes=created_min), owners=(owner,),
                        facts=f._replace(role=role, rank=rank, phase=phase, deleting=deleting, attempt=attempt,
                                         containers=containers))


def _ev(root: ObjectRecord, pods: list[ObjectRecord], retired: list[ObjectRecord] | None = None,
        events: list[ObjectRecord] | None = None) -> RunEvidence:
    sigs = [Signal(p.ref, "main", scan_text(megatron_log(20), source="t"), NOW) for p in pods]
    return RunEvidence(root=root, pods=list(pods), retired_pods=list(retired or []), events=list(events or []),
                       signals=sigs)


def _answers(ev: RunEvidence, rp: RunPods) -> tuple[Any, ...]:
    return ([(p.ref.key, why) for p, why in replaced_pods(ev, rp)], lineages(ev, rp))


def _root() -> ObjectRecord:
    rec = normalize(taurun()).record
    assert rec is not None
    return rec


def _fields(rp: RunPods) -> tuple[Any, ...]:
    """Every field of a RunPods, records by identity (a kept one moved to new records must hold them)."""
    ids = [id(p) for p in rp.every]
    return ([id(p) for p in rp.pods], [id(p) for p in rp.retired], ids, rp.first,
            {role: [id(p) for p in pods] for role, pods in rp.by_role.items()}, rp.alive_in, rp.present,
            [id(x) for x in (rp.ev.root, *rp.ev.pods, *rp.ev.retired_pods, *rp.ev.events, *rp.ev.workloads)])


def _check(ev: RunEvidence) -> RunPods:
    rp = memo.run_pods(ev)
    # the records it holds are this evaluation's (lineages read restart counts off them)
    assert [id(p) for p in rp.pods] == [id(p) for p in ev.pods]
    assert [id(p) for p in rp.retired] == [id(p) for p in ev.retired_pods]
    fresh = RunPods(memo._lineage_view(ev))
    assert _fields(rp) == _fields(fresh)  # kept, moved to new records or built anew: the same fields
    assert len(rp._why) == len(rp.every)  # answers only for its own records, by place
    assert _answers(ev, rp) == _answers(ev, RunPods(ev))
    view = memo._lineage_view(ev)
    assert (view.retired_pods is memo._NO_RECORDS) == (not ev.retired_pods)  # (empty: the one shared list)
    assert not memo._NO_RECORDS  # ... which nothing changed
    return rp


pod_spec = st.fixed_dictionaries({
    "created_min": st.sampled_from([0, 1, 4, 30]), "role": st.sampled_from(["worker", "head", ""]),
    "rank": st.sampled_from(["", "0", "1"]), "phase": st.sampled_from(["Running", "Failed", "Pending"]),
    "deleting": st.booleans(), "attempt": st.sampled_from([0, 1]), "restarts": st.integers(0, 2)})
# each step: per pod, keep the very record, bump its restart count (a new record the answers do not
# read), or give it new fields; and sometimes retire the first pod
pod_move = st.one_of(st.just(("keep", None)), st.just(("bump", None)), st.tuples(st.just("new"), pod_spec))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pod_spec, min_size=1, max_size=4),
       st.lists(st.tuples(st.lists(pod_move, min_size=4, max_size=4), st.booleans()), min_size=1, max_size=5))
def test_kept_run_pods_answer_as_fresh_ones_across_pod_changes(first: list[dict[str, Any]],
                                                                moves: list[tuple[Any, bool]]) -> None:
    root = _root()
    memo.forget(root.ref.key)
    specs = {f"r-{i}": s for i, s in enumerate(first)}
    live = {name: _pod(name, **s) for name, s in specs.items()}
    retired: list[ObjectRecord] = []
    _check(_ev(root, list(live.values()), retired))
    for step, retire in moves:
        for (what, spec), name in zip(step, list(live), strict=False):
            if what == "bump":
                specs[name] = {**specs[name], "restarts": specs[name]["restarts"] + 1}
                live[name] = _pod(name, **specs[name])
            elif what == "new":
                specs[name] = spec
                live[name] = _pod(name, **spec)
        if retire and len(live) > 1:
            name = next(iter(live))
            retired.append(live.pop(name))
        ev = _ev(root, list(live.values()), retired)
        _check(ev)
        # and the claims, kept answers or none
        warm = evaluate(ev, NOW, S)
        memo.forget(root.ref.key)
        assert evaluate(ev, NOW, S) == warm


def test_an_answer_whose_inputs_changed_is_worked_out_again() -> None:
    """Keyed on the records' restart-free fields wrongly (a field an answer reads left out), the
    answer of the first evaluation would be carried after that field changed."""
    root = _root()
    memo.forget(root.ref.key)
    failed = _pod("r-0", phase="Failed")
    later = _pod("r-1", created_min=2)
    rp = _check(_ev(root, [failed, later]))
    assert "after pod r-0 of worker failed" in rp.replacement(later)
    running = _pod("r-0", phase="Running", restarts=1)  # the same pod, not failed after all
    rp = _check(_ev(root, [running, later]))
    assert rp.replacement(later) == ""
    # a rank shared, then not
    a, b = _pod("r-0", rank="3"), _pod("r-1", rank="3", created_min=2)
    rp = _check(_ev(root, [a, b]))
    assert "replaces pod r-0" in rp.replacement(b)
    rp = _check(_ev(root, [_pod("r-0", rank="4"), b]))
    assert rp.replacement(b) == ""
    # re-owned: another controller's pod is no predecessor of this role's
    rp = _check(_ev(root, [_pod("r-0", rank="3", owner=OwnerRef("Job", "other", "u2", True)), b]))
    assert rp.replacement(b) == ""


def test_evidence_lists_changed_in_place_are_read_again() -> None:
    """A caller that swaps a record into its evidence's list in place (bench_evaluate swaps signals
    that way) gets answers for what the list holds now, not for the list it passed before."""
    root = _root()
    memo.forget(root.ref.key)
    later = _pod("r-1", created_min=2)
    ev = _ev(root, [_pod("r-0", phase="Failed"), later])
    assert "failed" in _check(ev).replacement(later)
    ev.pods[0] = _pod("r-0", phase="Running")
    assert _check(ev).replacement(later) == ""


def test_a_pod_retired_is_another_key() -> None:
    root = _root()
    memo.forget(root.ref.key)
    a, b = _pod("r-0", rank="3"), _pod("r-0", rank="3", created_min=3)
    _check(_ev(root, [a]))
    rp = _check(_ev(root, [b], retired=[a]))
    assert "created again" in rp.replacement(b)


def test_a_new_event_is_read() -> None:
    """Events are keyed by identity: a controller's Event for a pod that is gone now names a replacement."""
    root = _root()
    memo.forget(root.ref.key)
    worker = _pod("train-x-abcde", created_min=2)
    rp = _check(_ev(root, [worker]))
    assert rp.replacement(worker) == ""
    raw = {"apiVersion": "v1", "kind": "Event",
           "metadata": {"name": "e1", "namespace": "ns", "uid": "e1", "creationTimestamp": "2026-01-10T09:00:00Z"},
           "involvedObject": {"kind": "Job", "name": "train", "namespace": "ns"}, "reason": "SuccessfulCreate",
           "message": "Created pod: train-x-zzzzz", "type": "Normal", "firstTimestamp": "2026-01-10T09:00:00Z",
           "lastTimestamp": "2026-01-10T09:00:00Z", "count": 1}
    ev_rec = normalize(raw).record
    assert ev_rec is not None
    rp = _check(_ev(root, [worker], events=[ev_rec]))
    assert "created pod train-x-zzzzz before pod train-x-abcde" in rp.replacement(worker)


def test_the_very_same_records_are_served_without_building_anew() -> None:
    root = _root()
    memo.forget(root.ref.key)
    pods = [_pod("r-0"), _pod("r-1", created_min=1)]
    ev = _ev(root, pods)
    first = memo.run_pods(ev)
    assert memo.run_pods(_ev(root, pods)) is first  # a log increment, a tick: the same records
    assert memo.run_pods(_ev(root, [pods[0], _pod("r-1", created_min=1, restarts=1)])) is not first


def test_a_restart_count_bumped_moves_the_answers_to_the_new_record() -> None:
    """A watch event that bumps a restart count: the kept grouping is moved to the new record, with the
    answers worked out for the old one (not worked out again), and every later answer is the new
    record's. Moved wrongly (the old record kept in a group, an answer left on the old record's id)
    lineages would read the old restart count or work the answer out again."""
    root = _root()
    memo.forget(root.ref.key)
    a, b = _pod("r-0", rank="3"), _pod("r-1", rank="3", created_min=2)
    first = _check(_ev(root, [a, b]))
    assert "replaces pod r-0" in first.replacement(b)
    why = first.replacement(b)
    b2 = _pod("r-1", rank="3", created_min=2, restarts=4)
    ev = _ev(root, [a, b2])
    moved = memo.run_pods(ev)
    assert moved._why == ["", why] and moved.every == [a, b2]  # carried, by place, before anything is asked
    assert _check(ev) is moved and moved is not first and moved.by_role[RunPods.role_of(b2)][-1] is b2
    lin = lineages(ev, moved)
    assert "4 restarts" in lin[(b2.ref.key, "main")].restarts[-1].why


# --- the newest stamp of a scan ---------------------------------------------------------------------------


@given(st.lists(st.integers(0, 3600), max_size=12))
def test_newest_stamp_is_the_latest_sample_stamp(ages: list[int]) -> None:
    scan = scan_text(megatron_log(0) + "".join(
        f"{(NOW - timedelta(seconds=a)).strftime('%Y-%m-%dT%H:%M:%SZ')} iteration {i + 1:8d}/ 100000 | lm loss: 2.5 |\n"
        for i, a in enumerate(sorted(ages, reverse=True))), source="t")
    want = max((x.at for x in scan.samples if x.at is not None), default=None)
    assert memo.newest_stamp(scan) == want
    assert memo.newest_stamp(scan) == want  # kept
    assert memo.newest_stamp(replace(scan, samples=scan.samples[:-1])) == max(
        (x.at for x in scan.samples[:-1] if x.at is not None), default=None)  # another scan: its own


@given(st.lists(st.integers(-3600, 3600), min_size=1, max_size=40))
def test_newest_stamp_of_a_plain_pack(offsets: list[int]) -> None:
    """A packed history's newest stamp read off its stamps alone, in whatever order they lie, its
    columns never asked for (a fold keeps them only for its last few packs): the latest sample's."""
    built = tuple(new_sample(100 + i, NOW + timedelta(seconds=o, microseconds=7 * i), 2.5, i + 1, "megatron",
                             False, 1000) for i, o in enumerate(offsets))
    packed = PackedSamples.pack(list(built))  # (a list: not held built)
    assert packed is not None and packed._cols is None
    scan = new_scan("t", "megatron", (), (), (), (), len(built))
    scan = replace(scan, samples=packed)
    assert memo.newest_stamp(scan) == max(x.at for x in built if x.at is not None)
    assert packed._cols is None  # (no column kept for it)


def test_kept_values_are_bounded() -> None:
    kept: memo.ByInputs[int, str] = memo.ByInputs(max_slots=3)
    objs = [object() for _ in range(5)]
    for i, o in enumerate(objs):
        kept.put(i, (o,), str(i))
    assert len(kept) == 3 and kept.get(0, (objs[0],)) is None and kept.get(4, (objs[4],)) == ("4",)
    assert kept.get(4, (object(),)) is None  # another object in the same place
    kept.forget(4)
    assert kept.get(4, (objs[4],)) is None


@given(pod_spec, pod_spec, st.sampled_from(["r-0", "r-1"]))
def test_same_pod_is_equal_pod_fields(a: dict[str, Any], b: dict[str, Any], name_b: str) -> None:
    """memo._same_pod compares field by field what _pod_fields would build and compare."""
    pa = _pod("r-0", **a)
    for pb in (_pod(name_b, **b), _pod("r-0", **a), *(_pod("r-0", **{**a, k: b[k]}) for k in b)):
        assert memo._same_pod(pa, pb) == (memo._pod_fields(pa) == memo._pod_fields(pb))
    assert memo._same_pod(pa, pa)
    other = pa._replace(facts=None)  # a record without pod facts: its fields alone
    assert memo._same_pod(other, pa) is False and memo._same_pod(other, pa._replace(facts=None))


SECOND = {"created_min": 7, "role": "other", "rank": "9", "phase": "Succeeded", "deleting": True, "attempt": 2,
          "restarts": 5, "ray_node_type": "head", "owner": OwnerRef("Job", "other", "uid-other", True)}


def test_same_pod_tells_each_field_it_reads() -> None:
    """A pod alike but for one field: not the same for each field the replacement answers read, the same
    for one they do not (restarts)."""
    base = _pod("r-0")
    assert isinstance(base.facts, PodFacts)
    for field, value in SECOND.items():
        if field == "ray_node_type":
            other = base._replace(facts=base.facts._replace(ray_node_type=value))
        else:
            other = _pod("r-0", **{field: value})
        assert memo._same_pod(base, other) is (field == "restarts"), field
        assert memo._same_pod(base, other) == (memo._pod_fields(base) == memo._pod_fields(other))
    assert not memo._same_pod(base, _pod("r-1"))
