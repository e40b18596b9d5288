"""Each object's key is one tuple (`RunIndex.key_of`): the maps that live as long as a run or a pod
(the index's, the loop's, the claims kept between evaluations, the exporter's, the /runs history) key
it by the index's own tuple instead of a copy each (`Ref.key` builds a new one on every read: at
fleet size ~15 copies a run and 3 a pod, issue 30). Sharing must change no answer: a deleted and
recreated object gets a key of its own, and a map keyed by an equal tuple still finds it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from collector.claims import memo, stragglers
from collector.controller import Controller
from collector.correlate import Signal
from collector.kube import normalize
from collector.model import Ref
from collector.progress.model import LogScan, ProgressSample
from collector.sources.kube_api import KubeApi, api_client_for
from tests.controller.test_controller import settings
from tests.dumpkit import meta, pod

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def _taurun(name: str) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun", "metadata": meta(name, "ns", f"uid-{name}", T0),
            "spec": {"profile": "p", "workers": 2}, "status": {"phase": "Running"}}


def _pod(name: str, run: str) -> dict[str, Any]:
    return pod(name, "ns", T0, node="gpu-1", labels={"taugrid.io/run": run},
               containers=[{"name": "main", "ready": True, "restartCount": 0,
                            "state": {"running": {"startedAt": "2026-03-01T08:00:20Z"}}}])


def _scan(at: datetime) -> LogScan:
    samples = tuple(ProgressSample(step=100 + i, at=at - timedelta(seconds=9 - i), loss=2.0, line=i + 1,
                                   format="megatron", total=500_000)
                    for i in range(10))
    return LogScan("agent:gpu-1", "megatron", samples, (), (), (), 10)


def _held(d: Any, key: object) -> object:
    """The key object `d` (a dict or set) holds equal to `key`."""
    return next(k for k in d if k == key)


def _fleet() -> Controller:
    now = [T0 + timedelta(minutes=5)]
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(), lambda: now[0])  # never opened
    for obj in (_taurun("r1"), _pod("w-0", "r1"), _pod("w-1", "r1")):
        rec = normalize(obj).record
        assert rec is not None
        c.index.upsert(rec)
    for kind in ("Pod", "Node", "TauRun", "Event", "Workload", "Job", "RayCluster", "RayJob"):
        c.index.synced[kind] = T0
    for name in ("w-0", "w-1"):
        c.index.set_signal(Signal(Ref("Pod", "ns", name), "main", _scan(now[0]), now[0]))
    c.evaluate(full=True)
    return c


def test_a_runs_maps_hold_the_index_s_own_key() -> None:
    c = _fleet()
    idx = c.index
    run = _held(idx._objects, ("TauRun", "ns", "r1"))
    assert idx.key_of(Ref("TauRun", "ns", "r1", "uid-r1")) is run  # (an equal Ref, uid or not)
    assert c.claims and _held(c.claims, run) is run
    assert _held(c.history._last, run) is run and _held(c.exporter._runs, run) is run
    assert _held(c.exporter._fleet_keys, run) is run
    assert _held(memo._RUN_PODS._kept, run) is run  # (kept between evaluations: claims/memo.py)
    assert _held(stragglers._VERDICTS, run) is run
    assert _held(idx._members_memo, run) is run
    c.evaluate(full=True)  # evaluated again: still the one tuple everywhere
    assert _held(c.claims, run) is run and _held(c.exporter._moved, run) is run
    ev = idx.evidence(Ref("TauRun", "ns", "r1"))
    assert ev.key is run
    pod_key = _held(idx._objects, ("Pod", "ns", "w-0"))
    assert _held(idx._signals, pod_key) is pod_key
    c._root_of(Ref("Pod", "ns", "w-1"))
    assert _held(c._roots_memo, ("Pod", "ns", "w-1")) is _held(idx._objects, ("Pod", "ns", "w-1"))


def test_a_recreated_object_has_a_key_of_its_own_and_nothing_is_lost() -> None:
    c = _fleet()
    idx = c.index
    before = _held(idx._objects, ("Pod", "ns", "w-0"))
    claims_before = c.claims[("TauRun", "ns", "r1")]
    idx.delete(Ref("Pod", "ns", "w-0"))
    assert ("Pod", "ns", "w-0") not in idx._keys and ("Pod", "ns", "w-0") not in idx._signals
    gone = idx.key_of(Ref("Pod", "ns", "w-0"))
    assert gone == before and gone is not before  # (not held: an equal tuple, nothing kept for it)
    rec = normalize(_pod("w-0", "r1")).record
    assert rec is not None
    idx.upsert(rec)
    again = _held(idx._objects, ("Pod", "ns", "w-0"))
    assert idx.key_of(Ref("Pod", "ns", "w-0")) is again
    idx.set_signal(Signal(Ref("Pod", "ns", "w-0"), "main", _scan(T0 + timedelta(minutes=5)), T0 + timedelta(minutes=5)))
    assert _held(idx._signals, again) is again
    assert idx.signal_at(("Pod", "ns", "w-0"), "main") is not None  # found by an equal tuple
    out = c.evaluate(full=True)
    assert [rc.ref.name for rc in out] == ["r1"]
    after = c.claims[("TauRun", "ns", "r1")]
    assert [(x.verdict, x.reason) for x in after.claims.values()] == \
        [(x.verdict, x.reason) for x in claims_before.claims.values()]
    c.index.delete(Ref("TauRun", "ns", "r1"))
    c.evaluate(full=True)
    assert not c.claims and ("TauRun", "ns", "r1") not in idx._keys
