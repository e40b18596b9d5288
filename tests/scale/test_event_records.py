"""Events at fleet size (~7 per pod): each record shares the strings that Events repeat, and the
smaller records correlate and read exactly as before."""

from __future__ import annotations

import orjson

from collector.correlate import RunIndex
from collector.kube import normalize
from collector.model import EventFacts, Ref


def _event(name: str, pod: str, reason: str, at: str, last: str | None = None,
           type_: str = "Normal") -> dict[str, object]:
    # Decoded from bytes, as a list page is: every string a fresh object.
    raw: dict[str, object] = orjson.loads(orjson.dumps({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "resourceVersion": "7",
                     "creationTimestamp": at},
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": pod, "uid": f"uid-{pod}"},
        "note": f"Started container {reason}", "reason": reason, "type": type_,
        "reportingController": "kubelet", "deprecatedFirstTimestamp": at, "deprecatedLastTimestamp": last or at,
        "eventTime": at,
    }))
    return raw


def _facts(raw: dict[str, object]) -> EventFacts:
    n = normalize(raw)
    assert n.record is not None and not n.problems, n.problems
    assert isinstance(n.record.facts, EventFacts)
    return n.record.facts


def test_events_share_repeated_strings() -> None:
    a = _facts(_event("w0.1", "run-1-w0", "Pulled", "2026-12-01T06:00:00Z"))
    b = _facts(_event("w0.2", "run-1-w0", "Pulled", "2026-12-01T06:00:05Z"))
    for field in ("kind", "namespace", "name"):
        assert getattr(a.regarding, field) is getattr(b.regarding, field), field
    assert a.reason is b.reason and a.type is b.type and a.component is b.component
    # nothing reads the regarded object's uid: it is not kept (the key is kind, namespace, name)
    assert a.regarding == Ref("Pod", "team-a", "run-1-w0")
    assert a.first is a.last  # happened once: one datetime
    c = _facts(_event("w0.3", "run-1-w0", "BackOff", "2026-12-01T06:00:00Z", "2026-12-01T06:09:00Z"))
    assert c.first is not None and c.last is not None and (c.last - c.first).total_seconds() == 540


def test_events_still_link_to_their_pod_and_run() -> None:
    pod = orjson.loads(orjson.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "run-1-w0", "namespace": "team-a", "uid": "uid-run-1-w0",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "run-1",
                                          "uid": "u", "controller": True}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Running"},
    }))
    job = orjson.loads(orjson.dumps({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "run-1", "namespace": "team-a", "uid": "u",
                     "labels": {"kueue.x-k8s.io/queue-name": "q"}},
        "spec": {}, "status": {},
    }))
    idx = RunIndex()
    # Warnings: a live index does not keep Normal kubelet Events (tests/scale/test_event_keep.py)
    for raw in (job, pod, *(_event(f"w0.{i}", "run-1-w0", "BackOff", f"2026-12-01T06:00:0{i}Z", type_="Warning")
                            for i in range(5))):
        n = normalize(raw)
        assert n.record is not None
        idx.upsert(n.record)
    (root,) = idx.roots()
    ev = idx.evidence(root)
    assert [e.ref.name for e in ev.events] == [f"w0.{i}" for i in range(5)]
    assert idx.root_of(Ref("Event", "team-a", "w0.3")) == root
    # the links are replaced, not duplicated, when an Event is updated
    n = normalize(_event("w0.4", "run-1-w0", "BackOff", "2026-12-01T06:00:09Z", type_="Warning"))
    assert n.record is not None
    idx.upsert(n.record)
    assert len(idx.evidence(root).events) == 5
