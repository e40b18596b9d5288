"""Assemble cluster dumps from the real fixtures in tests/fixtures (provenance in its SOURCES.tsv).

Fixtures that are doc snippets carry only `status:`; these helpers graft that real status onto
metadata written here, and turn `kubectl describe` Events tables into core/v1 Event objects
with times counted back from a reference instant, as the describe output's Age column says.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # provenance of each file: SOURCES.tsv there


def fixture_path(rel: str) -> Path:
    p = FIXTURES / rel
    if not p.exists():
        raise FileNotFoundError(f"fixture {rel} not found under {FIXTURES}")
    return p


def fixture_docs(rel: str) -> list[Any]:
    """All YAML documents of a fixture; the docs' `...` elision lines are dropped, not parsed."""
    text = fixture_path(rel).read_text()
    if rel.endswith(".json"):
        return [json.loads(text)]
    text = "\n".join(line for line in text.splitlines() if line.strip() != "...")
    return [d for d in yaml.safe_load_all(text) if d is not None]


def fixture_status(rel: str) -> dict[str, Any]:
    """The `status:` block of a fixture (the last document that has one)."""
    for d in reversed(fixture_docs(rel)):
        if isinstance(d, dict) and "status" in d:
            return copy.deepcopy(d["status"])
    raise ValueError(f"{rel}: no status block")


def fixture_object(rel: str) -> dict[str, Any]:
    d = fixture_docs(rel)[0]
    assert isinstance(d, dict)
    return copy.deepcopy(d)


def ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(name: str, ns: str, uid: str, created: datetime, *, labels: dict[str, str] | None = None,
         owner: dict[str, Any] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": ts(created),
                         "resourceVersion": "1"}
    if labels:
        m["labels"] = labels
    if owner:
        m["ownerReferences"] = [{"apiVersion": owner.get("apiVersion", "v1"), "kind": owner["kind"],
                                 "name": owner["name"], "uid": owner.get("uid", ""), "controller": True}]
    return m


def owner_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"].get("uid", "")}


def pod(name: str, ns: str, created: datetime, *, node: str | None, phase: str = "Running", ready: bool = True,
        gpus: int = 0, labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None,
        containers: list[dict[str, Any]] | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    if status is None:
        conds = [{"type": "PodScheduled", "status": "True" if node else "False",
                  "lastTransitionTime": ts(created + timedelta(seconds=1))}]
        if node:
            conds.append({"type": "Ready", "status": "True" if ready else "False",
                          "lastTransitionTime": ts(created + timedelta(seconds=30))})
        status = {"phase": phase, "conditions": conds}
        if containers is not None:
            status["containerStatuses"] = containers
        elif node and phase == "Running":
            status["containerStatuses"] = [{"name": "main", "ready": ready, "restartCount": 0,
                                            "state": {"running": {"startedAt": ts(created + timedelta(seconds=20))}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": meta(name, ns, f"uid-{name}", created, labels=labels, owner=owner),
            "spec": spec, "status": status}


_AGE = re.compile(r"(\d+)([dhms])")


def _age(text: str) -> timedelta:
    total = timedelta()
    for n, unit in _AGE.findall(text):
        total += {"d": timedelta(days=int(n)), "h": timedelta(hours=int(n)), "m": timedelta(minutes=int(n)),
                  "s": timedelta(seconds=int(n))}[unit]
    return total


def describe_events(rel: str, *, pod_name: str, ns: str, now: datetime) -> list[dict[str, Any]]:
    """core/v1 Events from the Events table of a real `kubectl describe pod` fixture."""
    events = []
    in_table = False
    for i, line in enumerate(fixture_path(rel).read_text().splitlines()):
        if line.startswith("Events:"):
            in_table = True
            continue
        if not in_table:
            continue
        m = re.match(r"\s*(Normal|Warning)\s+(\S+)\s+(.+?)\s{2,}(\S+)\s{2,}(.*)$", line)
        if not m:
            continue
        typ, reason, age, source, message = m.groups()
        count = 1
        cm = re.match(r"(\S+) \(x(\d+) over (\S+)\)", age)
        if cm:
            last, count, first = _age(cm.group(1)), int(cm.group(2)), _age(cm.group(3))
        else:
            last = first = _age(age)
        events.append({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod_name}.{i:04x}", "namespace": ns, "uid": f"ev-{pod_name}-{i}",
                         "creationTimestamp": ts(now - first)},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "namespace": ns,
                               "uid": f"uid-{pod_name}"},
            "reason": reason, "message": message.strip(), "type": typ, "source": {"component": source},
            "reportingComponent": source, "firstTimestamp": ts(now - first), "lastTimestamp": ts(now - last),
            "count": count,
        })
    if not events:
        raise ValueError(f"{rel}: no events parsed")
    return events


def event(name: str, ns: str, regarding: dict[str, Any], reason: str, message: str, at: datetime,
          *, type_: str = "Normal", component: str = "kubelet", count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns, "uid": f"ev-{name}", "creationTimestamp": ts(at)},
        "involvedObject": {"apiVersion": regarding["apiVersion"], "kind": regarding["kind"],
                           "name": regarding["metadata"]["name"], "namespace": ns,
                           "uid": regarding["metadata"].get("uid", "")},
        "reason": reason, "message": message, "type": type_, "source": {"component": component},
        "firstTimestamp": ts(at), "lastTimestamp": ts(at), "count": count,
    }


_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")


def _stamps(value: Any, key: str = "") -> list[datetime]:
    """RFC3339 stamps anywhere in an object, deadlines (deletionTimestamp) aside."""
    if isinstance(value, dict):
        return [t for k, v in value.items() if k != "deletionTimestamp" for t in _stamps(v, k)]
    if isinstance(value, list):
        return [t for v in value for t in _stamps(v)]
    if isinstance(value, str) and _STAMP.fullmatch(value):
        return [datetime.fromisoformat(value[:19]).replace(tzinfo=UTC)]
    return []


def captured_at(objects: list[dict[str, Any]], logs: dict[tuple[str, str], str] | None = None) -> datetime:
    """When a test's dump is taken unless it says: right after the newest thing in it (a year past 2100
    is a forgery some tests plant, not a capture time)."""
    found = [t for o in objects for t in _stamps(o)]
    for text in (logs or {}).values():
        found += [datetime.fromisoformat(m.group(0)[:19]).replace(tzinfo=UTC) for m in _STAMP.finditer(text)]
    real = [t for t in found if t.year <= 2100]
    if not real:
        raise ValueError("no timestamp to take the dump at; pass captured=")
    return max(real)


def node(name: str, at: datetime, *, ready: str = "True", gpus: int = 8, heartbeat: datetime | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as the kubelet reports it, its Ready condition's heartbeat at `heartbeat` (default `at`)."""
    cond = {"type": "Ready", "status": ready, "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": ts(heartbeat or at),
            "lastTransitionTime": ts(at - timedelta(days=3))}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": ts(at - timedelta(days=30)),
                         "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {},
            "status": {"conditions": [cond], "capacity": {"nvidia.com/gpu": str(gpus)},
                       "allocatable": {"nvidia.com/gpu": str(gpus)}}}


def node_lease(name: str, renewed: datetime) -> dict[str, Any]:
    """A kubelet's node Lease (`kubectl get leases -n kube-node-lease -o json`)."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "uid": f"lease-{name}"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": renewed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def write_dump(root: Path, objects: list[dict[str, Any]], *, logs: dict[tuple[str, str], str] | None = None,
               extra_files: dict[str, str] | None = None, captured: datetime | None = None,
               nodes: bool = True, leases: bool = True) -> Path:
    """Write objects as kubectl cluster-info dump lays them out (+ CRDs in crds.json).

    Like a real cluster's dump, it holds a Ready Node (heartbeat at the capture time) for each node a
    pod names (`nodes`), and the nodes' Leases renewed then (`leases`: the README's procedure adds
    them). `captured`: default, right after the newest stamp of the objects and logs."""
    root.mkdir(parents=True, exist_ok=True)
    objects = list(objects)
    have = {o["metadata"]["name"] for o in objects if o["kind"] == "Node"}
    named = sorted({o["spec"]["nodeName"] for o in objects if o["kind"] == "Pod" and o.get("spec", {}).get("nodeName")})
    if (nodes or leases) and (have or named):
        at = captured or captured_at(objects, logs)
        if nodes:
            objects += [node(n, at) for n in named if n not in have]
        if leases:
            objects += [node_lease(n, at) for n in sorted(set(named) | have)]
    # kubectl writes nodes.json and each namespace's pods.json and events.json, empty or not.
    by_file: dict[Path, list[dict[str, Any]]] = {root / "nodes.json": []}
    for ns in sorted({o["metadata"].get("namespace") for o in objects} - {None, "", "kube-node-lease"}):
        by_file[root / ns / "pods.json"] = []
        by_file[root / ns / "events.json"] = []
    for obj in objects:
        kind = obj["kind"]
        ns = obj["metadata"].get("namespace", "")
        if kind == "Node":
            path = root / "nodes.json"
        elif kind == "Lease":
            path = root / "leases.json"
        elif kind in ("Pod", "Event") and ns:
            path = root / ns / f"{kind.lower()}s.json"
        else:
            path = root / "crds.json"
        by_file.setdefault(path, []).append(obj)
    for path, items in by_file.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name in ("pods.json", "events.json", "nodes.json", "leases.json"):
            kind = {"pods.json": "Pod", "events.json": "Event", "nodes.json": "Node", "leases.json": "Lease"}[path.name]
            stripped = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
            doc: dict[str, Any] = {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": stripped}
        else:
            doc = {"kind": "List", "apiVersion": "v1", "items": items}
        path.write_text(json.dumps(doc, indent=1))
    for (ns, pod_name), text in (logs or {}).items():
        d = root / ns / pod_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "logs.txt").write_text(text)
    for rel, text in (extra_files or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
