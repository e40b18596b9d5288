"""The simulator's pure pieces: selectors, patches, the store's versions, snapshots and windows."""

from __future__ import annotations

import pytest

from kubesim import ApiError, ManualClock, Registry, Store, StoreSettings
from kubesim.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, apply_patch
from kubesim.scenario import ScenarioError, parse_duration
from kubesim.selectors import build_selector, parse_label_selector
from kubesim.store import Expired
from kubesim.tables import human_duration

REG = Registry()
PODS = REG.lookup("", "v1", "pods")
assert PODS is not None


def _pod(name: str, ns: str = "default", labels: dict[str, str] | None = None, node: str = "") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": node},
    }


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (x, y)", {"a": "y"}, True),
        ("a notin (x,y)", {"a": "x"}, False),
        ("a notin (x,y)", {}, True),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("a=b,c", {"a": "b"}, False),
        (
            "ray.io/node-type=worker,taugrid.io/run in (r1,r2)",
            {"ray.io/node-type": "worker", "taugrid.io/run": "r2"},
            True,
        ),
        ("n>3", {"n": "4"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    reqs = parse_label_selector(selector)
    assert all(r.matches(labels) for r in reqs) is expected


def test_bad_selectors_are_400() -> None:
    with pytest.raises(ApiError) as err:
        parse_label_selector("a in (b")
    assert err.value.code == 400
    with pytest.raises(ApiError) as err:
        build_selector("", "spec.unknown=x", PODS.field_path)
    assert err.value.code == 400 and "field label not supported" in err.value.message


def test_patches() -> None:
    obj = {
        "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
        "spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]},
    }
    merged = apply_patch(obj, {"metadata": {"labels": {"a": None, "c": "3"}}}, MERGE_PATCH)
    assert merged["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert obj["metadata"]["labels"] == {"a": "1", "b": "2"}  # input untouched
    smp = apply_patch(obj, {"spec": {"containers": [{"name": "c2", "image": "new"}]}}, STRATEGIC_MERGE_PATCH)
    assert [c["image"] for c in smp["spec"]["containers"]] == ["i1", "new"]
    smp = apply_patch(obj, {"spec": {"containers": [{"name": "c1", "$patch": "delete"}]}}, STRATEGIC_MERGE_PATCH)
    assert [c["name"] for c in smp["spec"]["containers"]] == ["c2"]
    jp = apply_patch(
        obj,
        [
            {"op": "replace", "path": "/spec/containers/0/image", "value": "j"},
            {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
            {"op": "remove", "path": "/metadata/labels/a"},
        ],
        JSON_PATCH,
    )
    assert jp["spec"]["containers"][0]["image"] == "j" and jp["metadata"]["labels"] == {"b": "2", "x/y": "z"}
    with pytest.raises(ApiError) as err:
        apply_patch(obj, [{"op": "test", "path": "/metadata/name", "value": "q"}], JSON_PATCH)
    assert err.value.code == 422


def test_durations_and_ages() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90 and parse_duration(5) == 5
    with pytest.raises(ScenarioError):
        parse_duration("soon")
    assert [human_duration(s) for s in (5, 150, 700, 4 * 3600 + 60, 30 * 3600, 3 * 86400 + 3600)] == [
        "5s",
        "2m30s",
        "11m",
        "4h1m",
        "30h",
        "3d1h",
    ]


def test_store_versions_generation_and_conflicts() -> None:
    store = Store(REG, ManualClock(), StoreSettings(watch_window=50))
    a = store.create(PODS, "default", _pod("a"))
    assert a["metadata"]["generation"] == 1 and a["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    rv1 = int(a["metadata"]["resourceVersion"])
    # status-only write: no generation bump; spec write: bump; stale rv: 409.
    b = store.replace(PODS, "default", "a", {**a, "status": {"phase": "Running"}}, subresource="status")
    assert b["metadata"]["generation"] == 1 and int(b["metadata"]["resourceVersion"]) == rv1 + 1
    c = store.replace(PODS, "default", "a", {**b, "spec": {**b["spec"], "nodeName": "n1"}, "status": {}})
    assert c["metadata"]["generation"] == 2 and c["status"] == {"phase": "Running"}  # status kept on main PUT
    with pytest.raises(ApiError) as err:
        store.replace(PODS, "default", "a", a)
    assert err.value.code == 409 and err.value.reason == "Conflict"
    # a no-op write keeps the version
    assert store.replace(PODS, "default", "a", c)["metadata"]["resourceVersion"] == c["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as err:
        store.create(PODS, "default", _pod("a"))
    assert err.value.reason == "AlreadyExists"
    with pytest.raises(ApiError) as err:
        store.create(PODS, "nowhere", _pod("x", "nowhere"))
    assert err.value.code == 404
    with pytest.raises(ApiError) as err:
        store.create(PODS, "default", _pod("Bad_Name"))
    assert err.value.code == 422


def test_snapshot_pages_and_expiry() -> None:
    store = Store(REG, ManualClock(), StoreSettings(watch_window=30))
    for i in range(10):
        store.create(PODS, "default", _pod(f"p{i:02d}"))
    page1 = store.list_page(PODS, "default", limit=4)
    assert [o["metadata"]["name"] for o in page1.items] == ["p00", "p01", "p02", "p03"] and page1.remaining == 6
    store.delete(PODS, "default", "p05")
    store.create(PODS, "default", _pod("p04a"))
    page2 = store.list_page(PODS, "default", limit=4, continue_token=page1.continue_token)
    # the snapshot of page 1 is kept: p04a does not exist there, p05 still does
    assert [o["metadata"]["name"] for o in page2.items] == ["p04", "p05", "p06", "p07"]
    assert page2.resource_version == page1.resource_version
    for i in range(40):
        store.create(PODS, "default", _pod(f"q{i:02d}"))
    with pytest.raises(ApiError) as err:
        store.list_page(PODS, "default", limit=4, continue_token=page2.continue_token)
    assert err.value.code == 410
    with pytest.raises(Expired):
        store.watch(PODS, "default", resource_version=str(page1.resource_version))


def test_cascading_delete_and_finalizers() -> None:
    store = Store(REG, ManualClock())
    jobs = REG.lookup("batch", "v1", "jobs")
    assert jobs is not None
    job = store.create(jobs, "default", {"metadata": {"name": "j"}, "spec": {}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": job["metadata"]["uid"]}
    store.create(PODS, "default", {**_pod("j-0"), "metadata": {"name": "j-0", "ownerReferences": [owner]}})
    store.create(PODS, "default", {**_pod("f"), "metadata": {"name": "f", "finalizers": ["x/y"]}})
    store.delete(jobs, "default", "j")
    assert [o["metadata"]["name"] for o in store.list_page(PODS, "default").items] == ["f"]
    terminating = store.delete(PODS, "default", "f")
    assert terminating["metadata"]["deletionTimestamp"]
    store.patch(PODS, "default", "f", lambda o: {**o, "metadata": {**o["metadata"], "finalizers": []}})
    assert store.list_page(PODS, "default").items == []
