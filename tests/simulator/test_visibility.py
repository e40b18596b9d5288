"""Kueue's visibility API on the simulator: pending Workloads in admission order, per ClusterQueue and
LocalQueue, paged, behind RBAC."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s

from kubesim import ManualClock, Simulator
from kubesim.rbac import Rule

G, V = "kueue.x-k8s.io", "v1beta1"
VIS = "/apis/visibility.kueue.x-k8s.io/v1beta1"


def _setup(api: k8s.ApiClient, clock: ManualClock) -> None:
    co = k8s.CustomObjectsApi(api)
    for ns in ("r1", "r2"):
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    co.create_cluster_custom_object(G, V, "clusterqueues", {"apiVersion": f"{G}/{V}", "kind": "ClusterQueue",
                                                            "metadata": {"name": "gpu"}, "spec": {}})
    co.create_cluster_custom_object(G, V, "clusterqueues", {"apiVersion": f"{G}/{V}", "kind": "ClusterQueue",
                                                            "metadata": {"name": "other"}, "spec": {}})
    for ns, lq, cq in (("r1", "a", "gpu"), ("r2", "b", "gpu"), ("r2", "c", "other")):
        co.create_namespaced_custom_object(G, V, ns, "localqueues", {
            "apiVersion": f"{G}/{V}", "kind": "LocalQueue", "metadata": {"name": lq, "namespace": ns},
            "spec": {"clusterQueue": cq}})
    # (name, namespace, queue, priority, conditions, active)
    wls: list[tuple[str, str, str, int, list[tuple[str, str]], bool]] = [
        ("w1", "r1", "a", 0, [], True),
        ("w2", "r1", "a", 10, [], True),
        ("w3", "r2", "b", 0, [("QuotaReserved", "False")], True),
        ("w4", "r1", "a", 100, [("QuotaReserved", "True")], True),  # admitted: not pending
        ("w5", "r1", "a", 100, [], False),  # deactivated: out of the queue
        ("w6", "r2", "b", 100, [("Finished", "True")], True),
        ("w7", "r2", "c", 0, [], True),  # another ClusterQueue
        ("w8", "r2", "b", 10, [], True),
    ]
    for name, ns, lq, prio, conds, active in wls:
        clock.advance(60)
        co.create_namespaced_custom_object(G, V, ns, "workloads", {
            "apiVersion": f"{G}/{V}", "kind": "Workload", "metadata": {"name": name, "namespace": ns},
            "spec": {"queueName": lq, "priority": prio, "active": active, "podSets": []}})
        if conds:
            co.patch_namespaced_custom_object_status(G, V, ns, "workloads", name, {"status": {"conditions": [
                {"type": t, "status": s, "reason": "x", "message": "", "lastTransitionTime": "2026-01-10T10:00:00Z"}
                for t, s in conds]}})


def _get(sim: Simulator, path: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(sim.base_url + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _rows(doc: Any) -> list[tuple[str, int, int, int, str]]:
    return [(i["metadata"]["name"], i["positionInClusterQueue"], i["positionInLocalQueue"], i["priority"],
             i["localQueueName"]) for i in doc["items"]]


def test_pending_workloads_in_admission_order(sim: Simulator, api: k8s.ApiClient, clock: ManualClock) -> None:
    _setup(api, clock)
    code, doc = _get(sim, f"{VIS}/clusterqueues/gpu/pendingworkloads")
    assert code == 200 and doc["kind"] == "PendingWorkloadsSummary"
    assert doc["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
    # priority first, then age; admitted, deactivated, finished and other queues' Workloads left out
    assert _rows(doc) == [("w2", 0, 0, 10, "a"), ("w8", 1, 0, 10, "b"), ("w1", 2, 1, 0, "a"), ("w3", 3, 1, 0, "b")]
    assert doc["items"][0]["metadata"]["namespace"] == "r1"
    code, doc = _get(sim, f"{VIS}/namespaces/r2/localqueues/b/pendingworkloads")
    assert code == 200 and _rows(doc) == [("w8", 1, 0, 10, "b"), ("w3", 3, 1, 0, "b")]
    code, doc = _get(sim, f"{VIS}/clusterqueues/gpu/pendingworkloads?offset=1&limit=2")
    assert [r[0] for r in _rows(doc)] == ["w8", "w1"]
    code, doc = _get(sim, f"{VIS}/clusterqueues/other/pendingworkloads")
    assert [i["metadata"]["name"] for i in doc["items"]] == ["w7"]


def test_unknown_queue_bad_paging_and_rbac(sim: Simulator, api: k8s.ApiClient, clock: ManualClock) -> None:
    _setup(api, clock)
    assert _get(sim, f"{VIS}/clusterqueues/nope/pendingworkloads")[0] == 404
    assert _get(sim, f"{VIS}/namespaces/r1/localqueues/b/pendingworkloads")[0] == 404  # b lives in r2
    assert _get(sim, f"{VIS}/clusterqueues/gpu/pendingworkloads?limit=x")[0] == 400
    sim.rbac.add_user("alice", "t-alice", [Rule(("get",), ("localqueues/pendingworkloads",),
                                                ("visibility.kueue.x-k8s.io",), ("r2",))])
    code, doc = _get(sim, f"{VIS}/namespaces/r2/localqueues/b/pendingworkloads", "t-alice")
    assert code == 200 and len(doc["items"]) == 2
    code, doc = _get(sim, f"{VIS}/clusterqueues/gpu/pendingworkloads", "t-alice")
    assert code == 403 and doc["reason"] == "Forbidden"
    assert 'cannot get resource "clusterqueues/pendingworkloads" in API group "visibility.kueue.x-k8s.io"' \
        in doc["message"]
    assert _get(sim, f"{VIS}/namespaces/r1/localqueues/a/pendingworkloads", "t-alice")[0] == 403


@pytest.mark.parametrize("method", ["POST", "DELETE"])
def test_read_only(sim: Simulator, api: k8s.ApiClient, clock: ManualClock, method: str) -> None:
    _setup(api, clock)
    req = urllib.request.Request(sim.base_url + f"{VIS}/clusterqueues/gpu/pendingworkloads", method=method,
                                 data=b"{}" if method == "POST" else None)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405
