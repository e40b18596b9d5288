"""`RunIndex.shape` moves only with writes that can move a link or a root; what readers remember while
it holds (a pod's run in `Controller._root_of`, a run's members in `RunIndex._member_keys`, the list of
runs the loop keeps until `_roots_changed`, the runs `RunIndex.roots` lists) must always be what a
fresh walk finds. A seeded random search writes objects the way a cluster does (status updates,
relabels, owners re-created under new uids, a RayJob naming another cluster, deletions, heartbeats,
Events counted again) and compares."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.controller import Controller
from collector.kube import normalize
from collector.model import Ref
from collector.sources.kube_api import KubeApi, Resource, api_client_for
from tests.controller.test_controller import settings
from tests.dumpkit import event, meta, node, pod

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
NS = "ns"


def _taurun(rng: random.Random, name: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": rng.choice(["Running", "Pending"])}
    spec: dict[str, Any] = {"profile": "p", "workers": 1}
    if rng.random() < 0.5:
        status["rayJobName"] = rng.choice(["j1", "j2"])
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
            "metadata": meta(name, NS, f"uid-{name}-{rng.randrange(2)}", T0), "spec": spec, "status": status}


def _rayjob(rng: random.Random, name: str) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "q"} if rng.random() < 0.3 else None
    if rng.random() < 0.3:
        labels = {**(labels or {}), "taugrid.io/run": rng.choice(["r1", "r2"])}
    status: dict[str, Any] = {"jobStatus": rng.choice(["RUNNING", "PENDING"]),
                              "message": f"step {rng.randrange(1000)}"}
    if rng.random() < 0.7:
        status["rayClusterName"] = rng.choice(["c1", "c2"])
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": meta(name, NS, f"uid-{name}-{rng.randrange(2)}", T0, labels=labels),
            "spec": {"entrypoint": "python train.py"}, "status": status}


def _raycluster(rng: random.Random, name: str) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if rng.random() < 0.5:
        labels = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": rng.choice(["j1", "j2"])}
    if rng.random() < 0.3:
        labels["kueue.x-k8s.io/queue-name"] = "q"
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": rng.choice(["j1", "j2"]),
             "uid": f"uid-{rng.choice(['j1', 'j2'])}-{rng.randrange(2)}"} if rng.random() < 0.5 else None
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": meta(name, NS, f"uid-{name}-{rng.randrange(2)}", T0, labels=labels or None, owner=owner),
            "spec": {},
            "status": {"state": rng.choice(["ready", "suspended"]), "readyWorkerReplicas": rng.randrange(3)}}


def _workload(rng: random.Random, name: str) -> dict[str, Any]:
    kind, parent = rng.choice([("RayJob", "j1"), ("RayJob", "j2"), ("RayCluster", "c1")])
    owner = {"apiVersion": "ray.io/v1", "kind": kind, "name": parent, "uid": f"uid-{parent}-{rng.randrange(2)}"}
    conds = [{"type": "Admitted", "status": rng.choice(["True", "False"]), "reason": "Admitted", "message": "",
              "lastTransitionTime": "2026-03-01T08:00:05Z"}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": meta(name, NS, f"uid-{name}-{rng.randrange(2)}", T0, owner=owner),
            "spec": {"queueName": "q"}, "status": {"conditions": conds}}


def _pod(rng: random.Random, name: str) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if rng.random() < 0.5:
        labels["taugrid.io/run"] = rng.choice(["r1", "r2"])
    if rng.random() < 0.5:
        labels["ray.io/cluster"] = rng.choice(["c1", "c2"])
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": rng.choice(["c1", "c2"]),
             "uid": f"uid-{rng.choice(['c1', 'c2'])}-{rng.randrange(2)}"} if rng.random() < 0.5 else None
    if rng.random() < 0.05:  # hostile: a pod that names an Event as its owner (the Event is no leaf then)
        owner = {"apiVersion": "v1", "kind": "Event", "name": "e0", "uid": f"ev-e{rng.randrange(2)}"}
    return pod(name, NS, T0, node="gpu-1", labels=labels or None, owner=owner,
               containers=[{"name": "main", "ready": True, "restartCount": rng.randrange(3),
                            "state": {"running": {"startedAt": "2026-03-01T08:00:20Z"}}}])


MAKERS = {"TauRun": (_taurun, ["r1", "r2"]), "RayJob": (_rayjob, ["j1", "j2"]),
          "RayCluster": (_raycluster, ["c1", "c2"]), "Workload": (_workload, ["w1", "w2"]),
          "Pod": (_pod, ["p0", "p1", "p2", "p3"])}
RESOURCES = {"TauRun": Resource("TauRun", "taugrid.io", "v1alpha1", "tauruns"),
             "RayJob": Resource("RayJob", "ray.io", "v1", "rayjobs"),
             "RayCluster": Resource("RayCluster", "ray.io", "v1", "rayclusters"),
             "Workload": Resource("Workload", "kueue.x-k8s.io", "v1beta1", "workloads"),
             "Pod": Resource("Pod", "", "v1", "pods"), "Node": Resource("Node", "", "v1", "nodes", namespaced=False),
             "Event": Resource("Event", "", "v1", "events")}


def _object(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.1:
        return node("gpu-1", T0, heartbeat=T0 + timedelta(seconds=rng.randrange(600)))
    if r < 0.3:  # Events come and go (a Warning is kept: a claim reads it) regarding any object
        kind = rng.choice(["Pod", "Pod", "RayJob", "RayCluster", "Workload", "TauRun"])
        make, names = MAKERS[kind]
        target = make(rng, rng.choice(names))
        return event(f"e{rng.randrange(4)}", NS, target, "Pulled", "pulled", T0, count=rng.randrange(1, 5),
                     type_=rng.choice(["Normal", "Warning", "Warning"]))
    kind = rng.choice(list(MAKERS))
    make, names = MAKERS[kind]
    return make(rng, rng.choice(names))


def _fresh_members(c: Controller, root: Ref) -> tuple[tuple[str, str, str], ...]:
    return tuple(m.ref.key for m in c.index.members(root))


def _fresh_roots(c: Controller) -> list[Ref]:
    idx = c.index
    return sorted((idx._objects[k].ref for k in idx._root_candidates if idx._is_root(k)),
                  key=lambda r: (r.namespace, r.name, r.kind))


def test_what_readers_remember_from_the_links_is_what_a_fresh_walk_finds() -> None:
    checked = moved = kept = 0
    for seed in range(150):
        rng = random.Random(seed)
        c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(), lambda: T0)  # never opened
        idx = c.index
        listed: list[Ref] = []
        for _ in range(60):
            if rng.random() < 0.1:  # roots made up from pods (a worker cluster's index, a dump)
                idx.infer_missing_roots()
                listed = idx.roots()
            obj = _object(rng)
            rec = normalize(obj).record
            assert rec is not None
            res = RESOURCES[rec.ref.kind]
            shape = idx.shape
            if rng.random() < 0.12 and idx.get(*rec.ref.key) is not None:
                c._delete_ref(res, rec.ref)
            else:
                c._upsert(res, rec)
            moved += idx.shape != shape
            kept += idx.shape == shape
            if c._roots_changed:  # the loop lists the runs again before its next evaluation
                listed = idx.roots()
                c._roots_changed = False
            roots = idx.roots()
            assert roots == listed, (seed, obj)  # not told to list again: the runs did not change
            assert roots == _fresh_roots(c), (seed, obj)  # remembered while the shape holds
            for root in roots:
                assert idx._member_keys(root) == _fresh_members(c, root), (seed, root, obj)
            for key in list(idx._objects):
                ref = idx._objects[key].ref
                assert c._root_of(ref) == idx.root_of(ref), (seed, ref, obj)
                checked += 1
    assert checked > 10_000 and moved > 1_000 and kept > 1_000, (checked, moved, kept)


def test_a_status_update_keeps_the_shape_and_a_relink_moves_it() -> None:
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(), lambda: T0)
    idx = c.index
    rng = random.Random(1)

    def up(obj: dict[str, Any]) -> int:
        rec = normalize(obj).record
        assert rec is not None
        shape = idx.shape
        c._upsert(RESOURCES[rec.ref.kind], rec)
        return idx.shape - shape

    job = _rayjob(rng, "j1")
    job["metadata"].pop("labels", None)
    job["status"]["rayClusterName"] = "c1"
    assert up(job) == 1  # new
    job["status"]["message"] = "step 2"
    assert up(job) == 0  # progress only
    job["status"]["rayClusterName"] = "c2"
    assert up(job) == 1  # names another cluster: a link moved
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    assert up(job) == 1  # a label a root reads
    job["metadata"]["uid"] = "uid-j1-new"
    assert up(job) == 1  # re-created under the name: children owned by the old one are orphans now
    assert up(node("gpu-1", T0)) == 1 and up(node("gpu-1", T0, heartbeat=T0 + timedelta(seconds=40))) == 0
