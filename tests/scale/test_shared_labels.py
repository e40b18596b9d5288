"""Records of objects with the same kept labels share one read-only mapping (memory at fleet size),
on both pod paths, and a different set never gets another's mapping."""

from __future__ import annotations

import copy

import msgspec
import orjson

from collector import kube
from collector.kube_pod import PodEvent, normalize_pod

POD = {"kind": "Pod", "apiVersion": "v1",
       "metadata": {"name": "w-0", "namespace": "ml", "creationTimestamp": "2026-01-10T00:00:00Z",
                    "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "taugrid.io/run": "r1",
                               "pod-template-hash": "abc", "ray.io/identifier": "rc-worker"}},
       "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def _pod(name: str, run: str) -> dict[str, object]:
    p = copy.deepcopy(POD)
    p["metadata"]["name"] = name  # type: ignore[index]
    p["metadata"]["labels"]["taugrid.io/run"] = run  # type: ignore[index]
    return p


def _typed(p: dict[str, object]) -> kube.ObjectRecord:
    e = msgspec.json.decode(orjson.dumps({"type": "ADDED", "object": p}), type=PodEvent)
    rec = normalize_pod(e.object).record  # type: ignore[arg-type]
    assert rec is not None
    return rec


def test_same_kept_labels_share_one_mapping_on_both_paths() -> None:
    a = kube.normalize(_pod("w-0", "r1")).record
    b = kube.normalize(_pod("w-1", "r1")).record
    c = _typed(_pod("w-2", "r1"))
    assert a is not None and b is not None
    assert a.labels is b.labels is c.labels
    assert dict(a.labels) == {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "taugrid.io/run": "r1"}


def test_other_labels_get_their_own_mapping() -> None:
    a = kube.normalize(_pod("w-0", "r1")).record
    b = _typed(_pod("w-1", "r2"))
    assert a is not None
    assert a.labels is not b.labels
    assert a.labels["taugrid.io/run"] == "r1" and b.labels["taugrid.io/run"] == "r2"


def test_the_shared_mapping_is_read_only() -> None:
    rec = kube.normalize(_pod("w-0", "r1")).record
    assert rec is not None
    try:
        rec.labels["taugrid.io/run"] = "other"  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("a shared label mapping must not be writable")
    assert kube.normalize(_pod("w-1", "r1")).record.labels["taugrid.io/run"] == "r1"  # type: ignore[union-attr]
