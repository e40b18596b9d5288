"""The simulator through the official `kubernetes` Python client: list, watch, errors, faults."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

from kubesim import Simulator


def _pod(name: str, labels: dict[str, str] | None = None, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _raw(resp: Any) -> Any:
    return json.loads(resp.data)


def test_discovery(api: k8s.ApiClient) -> None:
    assert k8s.VersionApi(api).get_code().git_version.startswith("v1.")
    groups = {g.name: g for g in k8s.ApisApi(api).get_api_versions().groups}
    for group in (
        "kueue.x-k8s.io",
        "ray.io",
        "taugrid.io",
        "events.k8s.io",
        "coordination.k8s.io",
        "kubeflow.org",
        "jobset.x-k8s.io",
        "batch",
        "apps",
    ):
        assert group in groups
    core = k8s.CoreV1Api(api).get_api_resources()
    pods = next(r for r in core.resources if r.name == "pods")
    assert pods.namespaced and pods.kind == "Pod" and "watch" in pods.verbs and pods.short_names == ["po"]
    assert any(r.name == "pods/log" for r in core.resources)
    ray = k8s.CustomObjectsApi(api).get_api_resources("ray.io", "v1")
    assert {r.name for r in ray.resources} >= {"rayjobs", "rayclusters"}
    tau = {r.name: r for r in k8s.CustomObjectsApi(api).get_api_resources("taugrid.io", "v1alpha1").resources}
    assert tau["tauclusters"].namespaced is False and tau["tauruns"].namespaced is True


def test_list_pagination_snapshot_and_expired_continue(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    for i in range(7):
        core.create_namespaced_pod("default", _pod(f"p{i}"))
    first = _raw(core.list_namespaced_pod("default", limit=3, _preload_content=False))
    assert [p["metadata"]["name"] for p in first["items"]] == ["p0", "p1", "p2"]
    assert first["metadata"]["remainingItemCount"] == 4
    core.create_namespaced_pod("default", _pod("p3a"))  # after the snapshot: not in later pages
    core.delete_namespaced_pod("p5", "default")  # nor is a deletion after it: p5 is still listed
    names, token = [], first["metadata"]["continue"]
    while token:
        page = _raw(core.list_namespaced_pod("default", limit=3, _continue=token, _preload_content=False))
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["p3", "p4", "p5", "p6"]
    # the same through the model path
    listed = core.list_namespaced_pod("default", limit=100)
    assert len(listed.items) == 7 and listed.metadata._continue is None
    # outlive the retained window (200 writes): the continue token expires with 410
    for i in range(210):
        core.patch_namespaced_pod("p0", "default", {"metadata": {"labels": {"n": str(i)}}})
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", limit=3, _continue=first["metadata"]["continue"])
    assert err.value.status == 410 and json.loads(err.value.body)["reason"] == "Expired"


def test_watch_from_version_is_ordered_and_monotonic(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("before"))
    rv = _raw(core.list_namespaced_pod("default", _preload_content=False))["metadata"]["resourceVersion"]

    def writer() -> None:
        time.sleep(0.1)
        core.create_namespaced_pod("default", _pod("w1"))
        core.patch_namespaced_pod("w1", "default", {"metadata": {"labels": {"x": "y"}}})
        core.delete_namespaced_pod("w1", "default")

    t = threading.Thread(target=writer)
    t.start()
    seen: list[tuple[str, str, int]] = []
    w = k8s_watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5, deserialize=False
    ):
        obj = event["object"]
        seen.append((event["type"], obj["metadata"]["name"], int(obj["metadata"]["resourceVersion"])))
        if event["type"] == "DELETED":
            w.stop()
    t.join()
    assert [(s[0], s[1]) for s in seen] == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    versions = [s[2] for s in seen]
    assert versions == sorted(versions) and len(set(versions)) == 3 and versions[0] > int(rv)


def test_watch_initial_state_timeout_and_bookmarks(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("a"))
    start = time.monotonic()
    events = list(
        k8s_watch.Watch().stream(
            core.list_namespaced_pod, "default", timeout_seconds=1, allow_watch_bookmarks=True, deserialize=False
        )
    )
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 3.0  # the server ends the stream cleanly at timeoutSeconds
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a"
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 2  # one every 0.2 s in this fixture
    assert bookmarks[-1]["object"]["metadata"]["resourceVersion"] == str(sim.store.resource_version)
    assert bookmarks[-1]["object"]["kind"] == "Pod"


def test_watch_initial_events_end_bookmark(sim: Simulator) -> None:
    url = (
        f"{sim.base_url}/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true"
        "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    with urllib.request.urlopen(url, timeout=5) as resp:
        first = json.loads(resp.readline())  # no pods yet: the end-of-initial-events bookmark comes first
    assert first["type"] == "BOOKMARK"
    assert first["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watch_too_old_version_is_410(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("a"))
    for i in range(205):
        core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"n": str(i)}}})
    with pytest.raises(ApiException) as err:
        for _ in k8s_watch.Watch().stream(core.list_namespaced_pod, "default", resource_version="3", timeout_seconds=2):
            pass
    assert err.value.status == 410 and "Expired" in str(err.value.reason)


def test_selectors(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("h", {"ray.io/node-type": "head", "taugrid.io/run": "r1"}, "n1"))
    core.create_namespaced_pod("default", _pod("w", {"ray.io/node-type": "worker", "taugrid.io/run": "r1"}, "n2"))
    core.create_namespaced_pod("default", _pod("o", {"taugrid.io/run": "r2"}))

    def names(**kw: Any) -> list[str]:
        return sorted(p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items)

    assert names(label_selector="taugrid.io/run=r1") == ["h", "w"]
    assert names(label_selector="taugrid.io/run=r1,ray.io/node-type!=head") == ["w"]
    assert names(label_selector="ray.io/node-type in (head,worker)") == ["h", "w"]
    assert names(label_selector="!ray.io/node-type") == ["o"]
    assert names(label_selector="ray.io/node-type") == ["h", "w"]
    assert names(field_selector="spec.nodeName=n2") == ["w"]
    assert names(field_selector="spec.nodeName=") == ["o"]
    assert names(field_selector="metadata.name!=h,metadata.namespace=default") == ["o", "w"]
    assert names(field_selector="status.phase=Pending") == ["h", "o", "w"]
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert err.value.status == 400


def test_events_two_views_one_store(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    pod = core.create_namespaced_pod("default", _pod("p"))
    core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "p.1"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "uid": pod.metadata.uid},
            "reason": "FailedScheduling",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            "type": "Warning",
            "source": {"component": "default-scheduler"},
            "count": 2,
            "firstTimestamp": "2026-01-10T10:00:00Z",
            "lastTimestamp": "2026-01-10T10:01:00Z",
            "reportingComponent": "default-scheduler",
        },
    )
    ev = k8s.EventsV1Api(api)
    listed = _raw(ev.list_namespaced_event("default", field_selector="regarding.name=p", _preload_content=False))
    (item,) = listed["items"]
    assert item["regarding"]["uid"] == pod.metadata.uid and item["note"].startswith("0/3 nodes")
    assert item["deprecatedCount"] == 2 and item["deprecatedFirstTimestamp"] == "2026-01-10T10:00:00Z"
    assert item["reportingController"] == "default-scheduler"
    core_list = core.list_namespaced_event("default", field_selector="involvedObject.kind=Pod,reason=FailedScheduling")
    assert core_list.items[0].metadata.resource_version == item["metadata"]["resourceVersion"]
    assert not ev.list_namespaced_event("default", field_selector="regarding.name=other").items
    # written through events.k8s.io, read through core
    ev.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "p.2"},
            "eventTime": "2026-01-10T10:02:00.000000Z",
            "action": "Binding",
            "reportingController": "default-scheduler",
            "reportingInstance": "sched-1",
            "reason": "Scheduled",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
            "note": "assigned",
            "type": "Normal",
        },
    )
    assert core.read_namespaced_event("p.2", "default").message == "assigned"


def test_errors_are_status_objects(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("missing", "default")
    body = json.loads(err.value.body)
    assert err.value.status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    core.create_namespaced_pod("default", _pod("p"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", _pod("p"))
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    current = core.read_namespaced_pod("p", "default")
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", "default", current)  # stale resourceVersion
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", _pod("Not_Valid"))
    assert err.value.status == 422 and json.loads(err.value.body)["details"]["causes"][0]["field"] == "metadata.name"


def test_lease_leader_election_conflicts(sim: Simulator, api: k8s.ApiClient) -> None:
    coord = k8s.CoordinationV1Api(api)
    lease = {
        "metadata": {"name": "taugrid-collector"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-10T10:00:00.000000Z",
            "renewTime": "2026-01-10T10:00:00.000000Z",
            "leaseTransitions": 0,
        },
    }
    created = coord.create_namespaced_lease("default", lease)
    with pytest.raises(ApiException) as err:
        coord.create_namespaced_lease("default", lease)
    assert err.value.status == 409
    # two candidates read the same version; only the first update wins
    mine = coord.read_namespaced_lease("taugrid-collector", "default")
    theirs = coord.read_namespaced_lease("taugrid-collector", "default")
    mine.spec.holder_identity = "b"
    mine.spec.lease_transitions = 1
    won = coord.replace_namespaced_lease("taugrid-collector", "default", mine)
    assert int(won.metadata.resource_version) > int(created.metadata.resource_version)
    theirs.spec.holder_identity = "c"
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("taugrid-collector", "default", theirs)
    assert err.value.status == 409
    assert coord.read_namespaced_lease("taugrid-collector", "default").spec.holder_identity == "b"


def test_custom_resources_crud_and_status_subresource(sim: Simulator, api: k8s.ApiClient) -> None:
    co = k8s.CustomObjectsApi(api)
    run = {
        "apiVersion": "taugrid.io/v1alpha1",
        "kind": "TauRun",
        "metadata": {"name": "r"},
        "spec": {"profile": "a100-2x8", "workers": 2, "gpusPerWorker": 8},
        "status": {"phase": "Running"},
    }
    created = co.create_namespaced_custom_object("taugrid.io", "v1alpha1", "default", "tauruns", run)
    assert "status" not in created and created["metadata"]["generation"] == 1  # status ignored on create
    co.patch_namespaced_custom_object_status(
        "taugrid.io", "v1alpha1", "default", "tauruns", "r", {"status": {"phase": "Admitted"}}
    )
    got = co.patch_namespaced_custom_object(
        "taugrid.io", "v1alpha1", "default", "tauruns", "r", {"spec": {"workers": 4}, "status": {"phase": "Failed"}}
    )
    assert got["status"] == {"phase": "Admitted"} and got["metadata"]["generation"] == 2
    co.create_cluster_custom_object(
        "taugrid.io",
        "v1alpha1",
        "tauclusters",
        {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauCluster", "metadata": {"name": "cluster"}, "spec": {}},
    )
    assert (
        co.list_cluster_custom_object("taugrid.io", "v1alpha1", "tauclusters")["items"][0]["metadata"]["name"]
        == "cluster"
    )
    co.delete_namespaced_custom_object("taugrid.io", "v1alpha1", "default", "tauruns", "r")
    assert co.list_namespaced_custom_object("taugrid.io", "v1alpha1", "default", "tauruns")["items"] == []


def test_pod_log_parameters(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod("default", _pod("unbound"))
    assert core.read_namespaced_pod_log("unbound", "default") == ""  # no node, no kubelet: empty
    pod = _pod("p", node="n1")
    pod["spec"]["containers"].append({"name": "side", "image": "x"})
    core.create_namespaced_pod("default", pod)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", "default", container="side")
    assert "is waiting to start: ContainerCreating" in json.loads(err.value.body)["message"]
    sim.store.append_log("default", "p", "main", [f"line {i}" for i in range(5)])
    read = core.read_namespaced_pod_log
    assert read("p", "default", container="main") == "".join(f"line {i}\n" for i in range(5))
    assert read("p", "default", container="main", tail_lines=2) == "line 3\nline 4\n"
    assert read("p", "default", container="main", limit_bytes=8) == "line 0\nl"
    stamped = read("p", "default", container="main", timestamps=True, tail_lines=1)
    assert stamped.startswith("2026-01-10T10:00:00.") and stamped.endswith("Z line 4\n")
    with pytest.raises(ApiException) as err:
        read("p", "default")  # two containers: one must be named
    assert err.value.status == 400 and "choose one of: [main side]" in json.loads(err.value.body)["message"]
    with pytest.raises(ApiException) as err:
        read("p", "default", container="main", previous=True)
    assert err.value.status == 400
    sim.store.rotate_log("default", "p", "main")
    sim.store.append_log("default", "p", "main", ["after restart"])
    assert read("p", "default", container="main", previous=True).endswith("line 4\n")
    assert read("p", "default", container="main") == "after restart\n"


def test_fault_429_and_500(sim: Simulator, api: k8s.ApiClient) -> None:
    # the default client (urllib3) honours Retry-After on 429 and succeeds on its own
    sim.faults.fail(429, count=1, verbs=("list",), retry_after_s=1)
    start = time.monotonic()
    k8s.CoreV1Api(api).list_namespaced_pod("default")
    assert time.monotonic() - start >= 0.9
    cfg = k8s.Configuration()
    cfg.host = sim.base_url
    cfg.retries = False
    with k8s.ApiClient(cfg) as no_retry:
        core = k8s.CoreV1Api(no_retry)
        sim.faults.fail(429, count=2, verbs=("list",), retry_after_s=3)
        for _ in range(2):
            with pytest.raises(ApiException) as err:
                core.list_namespaced_pod("default")
            assert err.value.status == 429 and err.value.headers["Retry-After"] == "3"
            assert json.loads(err.value.body)["reason"] == "TooManyRequests"
        core.list_namespaced_pod("default")  # count used up
        _fault_500(sim, core)


def _fault_500(sim: Simulator, core: k8s.CoreV1Api) -> None:
    sim.faults.fail(500, ratio=0.5, resources=("pods",))
    codes = []
    for _ in range(40):
        try:
            core.list_namespaced_pod("default")
            codes.append(200)
        except ApiException as exc:
            codes.append(exc.status)
    assert 5 <= codes.count(500) <= 35 and codes.count(200) >= 5
    core.list_namespace()  # other resources are untouched
    sim.faults.clear()
    core.list_namespaced_pod("default")


def test_fault_gone_storm_delay_and_admin_endpoint(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    req = urllib.request.Request(
        f"{sim.base_url}/_sim/faults",
        method="POST",
        data=json.dumps({"action": "gone", "count": 2, "verbs": ["list", "watch"]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as resp:
        assert json.loads(resp.read())["action"] == "gone"
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == 410
    with pytest.raises(ApiException) as err:
        for _ in k8s_watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1):
            pass
    assert err.value.status == 410
    core.list_namespaced_pod("default")  # the storm is over
    sim.faults.delay(0.3, count=1, verbs=("get",))
    core.create_namespaced_pod("default", _pod("p"))
    start = time.monotonic()
    core.read_namespaced_pod("p", "default")
    assert time.monotonic() - start >= 0.3
    bad = urllib.request.Request(f"{sim.base_url}/_sim/faults", method="POST", data=b'{"action": "explode"}')
    with pytest.raises(urllib.error.HTTPError) as herr:
        urllib.request.urlopen(bad)
    assert herr.value.code == 400


def test_fault_drop_watch_mid_object(sim: Simulator) -> None:
    sim.store.create(sim.resource("v1", "Namespace"), "", {"metadata": {"name": "x"}})
    sim.faults.drop_watch(after_events=2)
    url = f"{sim.base_url}/api/v1/namespaces?watch=true&timeoutSeconds=5"
    with urllib.request.urlopen(url, timeout=5) as resp:
        data = b""
        try:
            while chunk := resp.read1(65536):
                data += chunk
        except Exception:  # noqa: BLE001 - the connection is cut mid-chunk on purpose
            pass
    lines = data.split(b"\n")
    assert len(lines) == 3 and all(json.loads(x)["type"] == "ADDED" for x in lines[:2])
    with pytest.raises(ValueError):
        json.loads(lines[2])  # half an object
    assert lines[2].startswith(b'{"type":"ADDED"')


def test_fault_drop_connection_without_answer(sim: Simulator) -> None:
    cfg = k8s.Configuration()
    cfg.host = sim.base_url
    cfg.retries = False
    with k8s.ApiClient(cfg) as api:
        core = k8s.CoreV1Api(api)
        sim.faults.drop(count=1, verbs=("get",), resources=("namespaces",))
        with pytest.raises(Exception) as err:  # urllib3 ProtocolError: remote end closed the connection
            core.read_namespace("default")
        assert "closed" in str(err.value).lower() or "aborted" in str(err.value).lower()
        assert core.read_namespace("default").metadata.name == "default"


def test_delete_collection_and_namespace_cascade(sim: Simulator, api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "scratch"}})
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        core.create_namespaced_pod("scratch", {**_pod(name, {"team": team})})
    core.delete_collection_namespaced_pod("scratch", label_selector="team=x")
    assert [p.metadata.name for p in core.list_namespaced_pod("scratch").items] == ["c"]
    core.delete_namespace("scratch")
    assert core.list_pod_for_all_namespaces(field_selector="metadata.namespace=scratch").items == []
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("scratch", _pod("d"))
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        core.delete_namespace("default")
    assert err.value.status == 403
