"""Cross-cluster correlation: the manager's and each worker's objects read from the multi-cluster
simulator through the official client's transport, indexed per cluster, then joined."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime

import pytest

from collector.correlate import RunEvidence, build_index
from collector.kube import normalize
from collector.model import ObjectRecord, Observed, RunClaims, Stage
from collector.multicluster import ORIGIN_LABEL, dispatch_target, evaluate_multicluster, find_copy
from collector.settings import ClaimSettings
from collector.sources.kube_api import DEFAULT_RESOURCES, KubeApi, api_client_for
from kubesim.multicluster import MultiClusterSimulation, load_multicluster, multikueue_scenario_path

S = ClaimSettings()


@pytest.fixture
def mc() -> Iterator[MultiClusterSimulation]:
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path())) as sim:
        yield sim


def _runs(url: str, now: datetime) -> list[RunEvidence]:
    api = KubeApi(api_client_for(url))
    present, _ = api.discover(DEFAULT_RESOURCES)
    records: list[ObjectRecord] = []
    for res in present:
        for obj in api.list_pages(res)[0]:
            rec = normalize(obj).record
            if rec is not None:
                records.append(rec)
    index = build_index(records)
    index.synced.update(dict.fromkeys({r.kind for r in present}, now))
    return index.all_evidence()


def _claims(mc: MultiClusterSimulation, workers: tuple[str, ...] = ("worker-1", "worker-2")) -> dict[str, RunClaims]:
    now = mc.clock.now()
    manager = _runs(mc.urls["manager"], now)
    worker_runs = {w: _runs(mc.urls[w], now) for w in workers}
    return {ev.root.ref.name: evaluate_multicluster(ev, worker_runs, now, S) for ev in manager}


def test_a_dispatched_run_is_judged_on_the_worker(mc: MultiClusterSimulation) -> None:
    mc.step_to(60)
    claims = _claims(mc)
    rc = claims["dispatched"]
    assert rc.scheduled.observed is Observed.TRUE, rc.scheduled.reason
    assert rc.running.observed is Observed.TRUE, rc.running.reason
    assert rc.blocked is None
    assert rc.extra["clusters"] == {"manager": "manager", "worker": "worker-1", "worker_copy_seen": True,
                                    "worker_configured": True}
    by_cluster = {e.cluster for e in rc.running.evidence}
    assert by_cluster == {"manager", "worker-1"}, rc.running.evidence
    pods = [e for e in rc.running.evidence if e.ref.startswith("Pod/")]
    assert pods and all(e.cluster == "worker-1" for e in pods)
    assert all(e.cluster == "manager" for e in rc.running.evidence if e.ref.startswith("Workload/"))
    assert rc.running.to_json()["evidence"][0]["cluster"] in {"manager", "worker-1"}


def test_dispatch_stages(mc: MultiClusterSimulation) -> None:
    mc.step_to(0)
    waiting = _claims(mc)["waiting"]
    assert waiting.blocked is not None and waiting.blocked.stage is Stage.MULTICLUSTER_DISPATCH
    assert "waiting for a MultiKueue worker" in waiting.blocked.reason
    assert waiting.blocked.stage.owner == "MultiKueue"
    mc.step_to(60)
    there = _claims(mc)["not-admitted-there"]
    assert there.blocked is not None and there.blocked.stage is Stage.MULTICLUSTER_DISPATCH
    assert "dispatched to worker cluster worker-2 but not admitted there" in there.blocked.reason
    assert {e.cluster for e in there.blocked.evidence} == {"manager", "worker-2"}
    assert there.scheduled.observed is not Observed.TRUE


def test_a_lost_run_waits_again(mc: MultiClusterSimulation) -> None:
    mc.step_to(130)
    rc = _claims(mc)["dispatched"]
    assert rc.running.observed is not Observed.TRUE
    assert rc.blocked is not None and rc.blocked.stage is Stage.MULTICLUSTER_DISPATCH


def test_without_workers_the_single_cluster_path_is_unchanged(mc: MultiClusterSimulation) -> None:
    mc.step_to(60)
    rc = _claims(mc, workers=())["dispatched"]
    assert rc.running.observed is Observed.UNKNOWN
    assert "worker cluster worker-1" in rc.running.reason
    assert all(e.cluster == "" for e in rc.running.evidence)
    now = mc.clock.now()
    [ev] = [e for e in _runs(mc.urls["manager"], now) if e.root.ref.name == "dispatched"]
    assert dispatch_target(ev) == "worker-1"



def test_a_same_named_workload_without_the_origin_label_is_not_the_copy(mc: MultiClusterSimulation) -> None:
    mc.step_to(60)
    now = mc.clock.now()
    worker = _runs(mc.urls["worker-1"], now)
    wl = mc.workload_name(next(r for r in mc.scenario.runs if r.name == "dispatched"))
    assert find_copy(worker, "ml", wl) is not None
    assert find_copy(worker, "other-namespace", wl) is None
    stripped = [replace(ev, workloads=[w._replace(labels={}) for w in ev.workloads]) for ev in worker]
    assert find_copy(stripped, "ml", wl) is None
    [ev] = [e for e in _runs(mc.urls["manager"], now) if e.root.ref.name == "dispatched"]
    rc = evaluate_multicluster(ev, {"worker-1": stripped}, now, S)
    assert rc.running.observed is not Observed.TRUE
    assert rc.extra["clusters"]["worker_copy_seen"] is False


def test_another_managers_copy_on_a_shared_worker_is_not_ours(mc: MultiClusterSimulation) -> None:
    """A worker serving two managers holds both managers' Workload copies; one with the same namespace
    and name but another origin label value is the other manager's run."""
    mc.step_to(60)
    now = mc.clock.now()
    worker = _runs(mc.urls["worker-1"], now)
    wl = mc.workload_name(next(r for r in mc.scenario.runs if r.name == "dispatched"))
    theirs = [replace(ev, workloads=[w._replace(labels={**w.labels, ORIGIN_LABEL: "manager-b"})
                                     for w in ev.workloads]) for ev in worker]
    assert find_copy(theirs, "ml", wl) is None
    assert find_copy(theirs, "ml", wl, origin="manager-b") is not None  # that manager's own view
    [ev] = [e for e in _runs(mc.urls["manager"], now) if e.root.ref.name == "dispatched"]
    rc = evaluate_multicluster(ev, {"worker-1": theirs}, now, S)
    assert rc.running.observed is not Observed.TRUE
    assert rc.extra["clusters"]["worker_copy_seen"] is False
