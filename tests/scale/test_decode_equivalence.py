"""The selective (msgspec) decode feeds `normalize` exactly what the full decode does, and the
typed pod path (Structs → `collector.kube_pod.normalize_pod`) builds exactly what `normalize` does.

Same records, same warnings, same errors, on recorded pods, fleet-shaped pods, and pods that
hypothesis breaks field by field (wrong JSON types, missing parts, odd numbers): through list
pages and through watch frames, through the dict path and the typed path.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from collector import kube_pod
from collector.kube import MalformedObject, normalize
from collector.kube_pod import PodEvent, PodObject
from collector.sources.decode import FULL, POD_DICTS, decoder_for
from tests.dumpkit import pod as kit_pod
from tests.scale.mutate import set_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
POD = decoder_for("v1", "Pod")


def _recorded_pods() -> list[dict[str, Any]]:
    out = []
    for path in sorted((FIXTURES / "pods").glob("*.yaml")) + sorted((FIXTURES / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            stack = [doc]
            while stack:  # pods anywhere in a recording (lists, watch events)
                d = stack.pop()
                if isinstance(d, dict):
                    if set(d) == {"status"}:  # a recorded pod status alone
                        d = {"kind": "Pod", "metadata": {"name": "rec", "namespace": "ns"}, **d}
                    if d.get("kind") == "Pod" and isinstance(d.get("metadata"), dict):
                        out.append(orjson.loads(orjson.dumps(d, default=str)))
                    stack.extend(d.values())
                elif isinstance(d, list):
                    stack.extend(d)
    return out


def _fleet_pod() -> dict[str, Any]:
    created = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    p = kit_pod("w-1", "team-a", created, node="gpu-0001", gpus=8, labels={"taugrid.io/run": "r1",
                "ray.io/node-type": "worker", "app": "x"},
                owner={"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": "u1"})
    p["metadata"]["annotations"] = {"a": "b" * 300}
    p["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:x": {}}}}] * 5
    p["spec"]["containers"][0].update(env=[{"name": f"E{i}", "value": "v" * 40} for i in range(20)],
                                      command=["bash", "-c", "train"])
    p["spec"]["schedulingGates"] = [{"name": "gate"}]
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "w-1-gpu-x"}]
    p["status"]["initContainerStatuses"] = [{"name": "init", "ready": False, "restartCount": 0, "state": {
        "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-01-05T08:00:10Z"}}}]
    p["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                                       "finishedAt": "2026-01-05T08:00:15Z"}}
    p["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Unhealthy"}]}]
    p["status"].update(podIP="10.0.0.1", startTime="2026-01-05T08:00:01Z", reason="", message="m")
    return p


def _clean_pod() -> dict[str, Any]:
    """The fleet pod without the rare parts (DRA claims, device health) that the typed path hands
    to normalize: what the fast builder itself reads."""
    p = _fleet_pod()
    del p["spec"]["resourceClaims"], p["status"]["resourceClaimStatuses"]
    del p["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
    p["metadata"]["deletionTimestamp"] = "2026-01-05T09:00:00.123456789Z"
    p["status"]["conditions"].append({"type": "Initialized", "status": "True"})
    return p


def _object(event: Any) -> tuple[Any, Any]:
    """(type, object) of a decoded frame, typed or dicts."""
    if type(event) is PodEvent:
        return event.type, event.object
    return event["type"], event["object"]


def _outcome(obj: Any) -> tuple[Any, ...]:
    if isinstance(obj, dict):
        obj.setdefault("kind", "Pod")  # as the reflector does for both paths
        obj.setdefault("apiVersion", "v1")
    elif type(obj) is PodObject:
        if obj.kind is UNSET:
            obj.kind = "Pod"
        if obj.apiVersion is UNSET:
            obj.apiVersion = "v1"
    try:
        n = normalize(obj, where="Pod team-a/w-1")
    except MalformedObject as e:
        return ("error", str(e))
    return ("ok", n.record, tuple(n.problems))


def _both(obj: Any) -> None:
    page = orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": [obj]})
    full, sel = FULL.page(page), POD.page(page)
    assert sel["metadata"] == full["metadata"]
    assert [_outcome(i) for i in sel["items"]] == [_outcome(i) for i in full["items"]]
    frame = orjson.dumps({"type": "MODIFIED", "object": obj})
    e_full = FULL.event(frame)
    want = _outcome(e_full["object"])
    for dec in (POD, POD_DICTS):
        t, o = _object(dec.event(frame))
        assert t == e_full["type"]
        assert _outcome(o) == want


def test_clean_pods_take_the_typed_path_without_falling_back() -> None:
    for p in (_clean_pod(), RECORDED[0]):
        e = POD.event(orjson.dumps({"type": "ADDED", "object": p}))
        assert type(e) is PodEvent and type(e.object) is PodObject
        e.object.kind = e.object.kind or "Pod"
        e.object.apiVersion = e.object.apiVersion or "v1"
        rec = kube_pod._build(e.object, kube_pod.kube.DEFAULT_CONTRACT)  # raises if it would fall back
        assert _outcome(copy.deepcopy(p)) == ("ok", rec, ())
    rec = _outcome(_clean_pod())[1]
    assert rec.facts.deleting and rec.newest == datetime(2026, 1, 5, 9, 0, 0, 123456, tzinfo=UTC)


RECORDED = _recorded_pods()


def test_recorded_pods_are_there() -> None:
    assert len(RECORDED) >= 2


@pytest.mark.parametrize("i", range(len(RECORDED)))
def test_recorded_pod_same_record(i: int) -> None:
    _both(RECORDED[i])


def test_fleet_pod_same_record_and_smaller() -> None:
    p = _fleet_pod()
    _both(p)
    line = orjson.dumps({"type": "ADDED", "object": p})
    kept = POD_DICTS.event(line)["object"]
    assert "managedFields" not in kept["metadata"] and "env" not in kept["spec"]["containers"][0]
    assert _outcome(kept)[0] == "ok" and _outcome(kept)[2] == ()


def test_other_frames_and_kinds_come_as_dicts() -> None:
    for line in (b'{"type":"DELETED","object":{"kind":"Pod","metadata":{"name":"a"}}}',
                 b'{"type":"ADDED","object":{"kind":"Status","metadata":{"name":"a"}}}',
                 b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","labels":{"taugrid.io/run":1}}}}'):
        assert isinstance(POD.event(line), dict)
    assert type(POD.event(b'{"type":"MODIFIED","object":{"metadata":{"name":"a"}}}')) is PodEvent


def test_labels_no_record_keeps_are_skipped_whatever_their_type() -> None:
    """The typed decode reads only the kept labels: another label of an odd JSON type no longer
    sends the pod down the dict path, and the record is the one normalize builds."""
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a", "namespace": "n", "labels": {
        "x": 1, "y": [None], "taugrid.io/run": "r1", "ray.io/node-type": "worker", "ray.io/cluster": "c"}}}
    e = POD.event(orjson.dumps({"type": "ADDED", "object": pod}))
    assert type(e) is PodEvent
    rec = kube_pod._build(e.object, kube_pod.kube.DEFAULT_CONTRACT)
    assert _outcome(copy.deepcopy(pod)) == ("ok", rec, ())
    assert dict(rec.labels) == {"taugrid.io/run": "r1", "ray.io/node-type": "worker", "ray.io/cluster": "c"}
    assert rec.facts.ray_node_type == "worker"
    _both(pod)


def test_gpus_read_from_resources_text_match_normalize() -> None:
    """Resources are looked up by their JSON text: a repeat hits, odd quantities still go to normalize."""
    def pod(resources: Any) -> dict[str, Any]:
        return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a"},
                "spec": {"containers": [{"name": "m", "resources": resources}, {"name": "s"}]}}
    for res in ({"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "4"}},
                {"limits": {"amd.com/gpu": "2", "cpu": "1"}}, {"requests": {"x/gpu": "3"}}, {"limits": {"cpu": "1"}},
                None, {}, {"limits": {"nvidia.com/gpu": 8}}, {"limits": {"nvidia.com/gpu": "eight"}}, "odd", [1]):
        for _ in range(2):  # the second read of the same text comes from the lookup
            _both(pod(res))
    e = POD.event(orjson.dumps({"type": "ADDED", "object": pod({"limits": {"nvidia.com/gpu": "8"}})}))
    assert kube_pod._build(e.object, kube_pod.kube.DEFAULT_CONTRACT).facts.gpus == 8


def test_error_and_bookmark_frames_keep_what_the_reflector_reads() -> None:
    err = POD.event(b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}')
    assert err["object"]["code"] == 410 and err["object"]["message"] == "too old"
    bm = POD.event(b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12"}}}')
    assert bm["object"]["metadata"]["resourceVersion"] == "12"


def test_undecodable_input_fails_as_before() -> None:
    for bad in (b'{"type":"ADDED","object":{', b"\xff", b'{"type": "ADDED", "object": {"status": {"phase": 1e400}}}'):
        with pytest.raises(orjson.JSONDecodeError):
            FULL.event(bad)
        with pytest.raises(orjson.JSONDecodeError):
            POD.event(bad)


def test_integer_past_64_bits_stays_exact() -> None:
    """Documented difference: orjson makes such an integer a float, msgspec keeps it exact."""
    line = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","generation":123456789012345678901234}}}'
    assert isinstance(FULL.event(line)["object"]["metadata"]["generation"], float)
    assert POD_DICTS.event(line)["object"]["metadata"]["generation"] == 123456789012345678901234
    assert _object(POD.event(line))[1].metadata.generation == 123456789012345678901234


def test_out_of_range_number_in_an_unread_field_is_skipped() -> None:
    """The one difference, on purpose: a field no record reads is skipped, not converted, so a
    number beyond double range there no longer costs the whole event (orjson refuses it)."""
    line = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a"},"spec":{"x":1e400}}}'
    with pytest.raises(orjson.JSONDecodeError):
        FULL.event(line)
    assert POD_DICTS.event(line)["object"]["metadata"] == {"name": "a"}
    assert _outcome(_object(POD.event(line))[1])[0] == "ok"


# --- hypothesis: realistic pods with parts broken --------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalar = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | _text
           | st.sampled_from(["2026-01-05T08:00:01Z", "Running", "nvidia.com/gpu", "8", "Healthy", "x/gpu"]))
_json = st.recursive(_scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_text, kids, max_size=3),
                     max_leaves=8)

PATHS = [
    (), ("kind",), ("apiVersion",), ("metadata",), ("metadata", "name"), ("metadata", "namespace"),
    ("metadata", "labels"), ("metadata", "ownerReferences"), ("metadata", "ownerReferences", 0),
    ("metadata", "deletionTimestamp"), ("metadata", "generation"), ("metadata", "creationTimestamp"),
    ("metadata", "uid"), ("spec",), ("spec", "containers"), ("spec", "containers", 0),
    ("spec", "containers", 0, "resources"), ("spec", "containers", 0, "resources", "limits"), ("spec", "nodeName"),
    ("spec", "schedulingGates"), ("spec", "resourceClaims"), ("status",), ("status", "phase"),
    ("status", "conditions"), ("status", "conditions", 0), ("status", "containerStatuses"),
    ("status", "containerStatuses", 0), ("status", "containerStatuses", 0, "state"),
    ("status", "containerStatuses", 0, "restartCount"), ("status", "containerStatuses", 0, "lastState"),
    ("status", "containerStatuses", 0, "allocatedResourcesStatus"), ("status", "initContainerStatuses"),
    ("status", "resourceClaimStatuses"), ("status", "startTime"), ("status", "podIP"),
    # what the typed path reads, part by part
    ("metadata", "labels", "taugrid.io/run"), ("metadata", "labels", "ray.io/node-type"),
    ("metadata", "labels", "app"), ("spec", "containers", 0, "resources", "requests"),
    ("spec", "containers", 1, "resources", "limits", "amd.com/gpu"),
    ("metadata", "ownerReferences", 0, "kind"), ("metadata", "ownerReferences", 0, "controller"),
    ("metadata", "resourceVersion"), ("status", "conditions", 0, "type"), ("status", "conditions", 0, "status"),
    ("status", "conditions", 0, "lastTransitionTime"), ("status", "conditions", 0, "reason"),
    ("status", "containerStatuses", 0, "name"), ("status", "containerStatuses", 0, "ready"),
    ("status", "containerStatuses", 0, "state", "running"), ("status", "containerStatuses", 0, "state", "waiting"),
    ("status", "containerStatuses", 0, "state", "running", "startedAt"),
    ("status", "containerStatuses", 0, "lastState", "terminated"),
    ("status", "containerStatuses", 0, "lastState", "terminated", "exitCode"),
    ("status", "initContainerStatuses", 0, "state", "terminated", "exitCode"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), ("status", "message"), ("status", "reason"),
]


BASES = [_fleet_pod(), _clean_pod(), *RECORDED]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(range(len(BASES))),
       edits=st.lists(st.tuples(st.sampled_from(PATHS), _json, st.booleans()), min_size=1, max_size=4))
def test_broken_pods_same_outcome(base: int, edits: list[tuple[tuple[Any, ...], Any, bool]]) -> None:
    obj: Any = copy.deepcopy(BASES[base])
    for path, value, delete in edits:
        obj = set_path(obj, path, value, delete)
    _both(obj)


@settings(max_examples=150, deadline=None)
@given(frame=_json)
def test_arbitrary_frames_same_decode_or_same_error(frame: Any) -> None:
    data = orjson.dumps(frame)
    for decode in ("page", "event"):
        try:
            want: Any = getattr(FULL, decode)(data)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                getattr(POD, decode)(data)
            continue
        got = getattr(POD, decode)(data)
        if decode == "event" and isinstance(want, dict) and isinstance(want.get("object"), dict):
            assert _outcome(_object(got)[1]) == _outcome(want["object"])
        elif decode == "page" and isinstance(want, dict) and isinstance(want.get("items"), list):
            assert [_outcome(i) for i in got["items"]] == [_outcome(i) for i in want["items"]]
