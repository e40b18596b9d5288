"""The loop finds each changed object's run through `Controller._root_of`, which remembers roots
while the index's links stay as they were (`RunIndex.shape`): a burst of pod updates walks the
links once per pod. Any write that can move a link or a root forgets what it remembered."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collector.controller import Controller
from collector.kube import normalize
from collector.model import Ref
from collector.sources.kube_api import KubeApi, api_client_for
from tests.controller.test_controller import settings
from tests.dumpkit import meta, pod

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def _taurun(name: str) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun", "metadata": meta(name, "ns", f"uid-{name}", T0),
            "spec": {"profile": "p", "workers": 1}, "status": {"phase": "Running"}}


def _pod(run: str, restarts: int = 0) -> dict[str, Any]:
    return pod("w-0", "ns", T0, node="gpu-1", labels={"taugrid.io/run": run},
               containers=[{"name": "main", "ready": True, "restartCount": restarts,
                            "state": {"running": {"startedAt": "2026-03-01T08:00:20Z"}}}])


def test_roots_are_remembered_while_links_stay_and_recomputed_after() -> None:
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(), lambda: T0)  # never opened
    idx = c.index

    def upsert(obj: dict[str, Any]) -> None:
        rec = normalize(obj).record
        assert rec is not None
        idx.upsert(rec)

    w0 = Ref("Pod", "ns", "w-0")
    upsert(_taurun("r1"))
    upsert(_taurun("r2"))
    upsert(_pod("r1"))
    assert c._root_of(w0) == idx.root_of(w0) and c._root_of(w0) is not None and c._root_of(w0).name == "r1"

    shape = idx.shape
    upsert(_pod("r1", restarts=3))  # same labels and owners: no link moved
    assert idx.shape == shape and c._roots_memo  # still remembered
    assert c._root_of(w0).name == "r1"  # type: ignore[union-attr]

    upsert(_pod("r2", restarts=3))  # relabelled to another run: links moved
    assert idx.shape > shape
    assert c._root_of(w0) == idx.root_of(w0) and c._root_of(w0).name == "r2"  # type: ignore[union-attr]

    idx.delete(Ref("TauRun", "ns", "r2"))  # its run gone: no root (until it is inferred)
    assert c._root_of(w0) == idx.root_of(w0) is None
    upsert(_taurun("r2"))
    assert c._root_of(w0) == idx.root_of(w0) and c._root_of(w0).name == "r2"  # type: ignore[union-attr]


def test_run_members_are_remembered_while_links_stay_and_walked_again_after() -> None:
    from collector.correlate import RunIndex
    idx = RunIndex()

    def upsert(obj: dict[str, Any]) -> None:
        rec = normalize(obj).record
        assert rec is not None
        idx.upsert(rec)

    r1, r2 = Ref("TauRun", "ns", "r1"), Ref("TauRun", "ns", "r2")
    upsert(_taurun("r1"))
    upsert(_taurun("r2"))
    upsert(_pod("r1"))
    assert [p.ref.name for p in idx.evidence(r1).pods] == ["w-0"] and not idx.evidence(r2).pods
    upsert(_pod("r1", restarts=2))  # remembered walk, fresh record
    ev = idx.evidence(r1)
    assert ev.pods[0].facts.containers[0].restart_count == 2  # type: ignore[union-attr]
    upsert(_pod("r2", restarts=2))  # moved to r2: both walks are redone
    assert not idx.evidence(r1).pods and [p.ref.name for p in idx.evidence(r2).pods] == ["w-0"]
    idx.delete(Ref("Pod", "ns", "w-0"))
    assert not idx.evidence(r2).pods
