"""Kueue's on-demand visibility API (`visibility.kueue.x-k8s.io/v1beta1`), served from the store.

Kueue serves it as an aggregated API: `GET .../clusterqueues/NAME/pendingworkloads` and
`GET .../namespaces/NS/localqueues/NAME/pendingworkloads` answer a `PendingWorkloadsSummary` whose
items are the queue's pending Workloads in admission order, each with its priority, LocalQueue and
0-based positions in its ClusterQueue and LocalQueue (`offset`, default 0, and `limit`, default
1000, page the items). Here the queue state is the store's: a Workload is pending while it is active,
not finished and holds no quota reservation; it queues in the ClusterQueue its LocalQueue names; the
order is Kueue's (StrictFIFO and BestEffortFIFO alike): higher priority first, then older first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubesim.errors import ApiError
from kubesim.registry import Registry
from kubesim.store import Obj, Store

GROUP = "visibility.kueue.x-k8s.io"
VERSION = "v1beta1"
SUBRESOURCE = "pendingworkloads"
DEFAULT_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class VisibilityRoute:
    plural: str  # "clusterqueues" | "localqueues"
    namespace: str
    name: str


def route(path: str) -> VisibilityRoute | None:
    """The visibility request a path names, if it names one."""
    parts = [p for p in path.split("/") if p]
    if len(parts) < 3 or parts[:3] != ["apis", GROUP, VERSION]:
        return None
    rest = parts[3:]
    if len(rest) == 3 and rest[0] == "clusterqueues" and rest[2] == SUBRESOURCE:
        return VisibilityRoute("clusterqueues", "", rest[1])
    if len(rest) == 5 and rest[0] == "namespaces" and rest[2] == "localqueues" and rest[4] == SUBRESOURCE:
        return VisibilityRoute("localqueues", rest[1], rest[3])
    return None


def _conditions_true(obj: Obj, kind: str) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True" for c in conds)


def _priority(obj: Obj) -> int:
    p = (obj.get("spec") or {}).get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 0


def _all(store: Store, registry: Registry, plural: str) -> list[Obj]:
    rt = registry.lookup("kueue.x-k8s.io", "v1beta1", plural)
    if rt is None:
        return []
    return store.list_page(rt).items


def pending_order(store: Store, registry: Registry) -> dict[str, list[Obj]]:
    """ClusterQueue name → its pending Workloads in admission order."""
    cq_of = {((o.get("metadata") or {}).get("namespace", ""), (o.get("metadata") or {}).get("name", "")):
             str((o.get("spec") or {}).get("clusterQueue") or "") for o in _all(store, registry, "localqueues")}
    queues: dict[str, list[Obj]] = {}
    for wl in _all(store, registry, "workloads"):
        meta, spec = wl.get("metadata") or {}, wl.get("spec") or {}
        if spec.get("active") is False or _conditions_true(wl, "QuotaReserved") or _conditions_true(wl, "Finished"):
            continue
        cq = cq_of.get((meta.get("namespace", ""), str(spec.get("queueName") or "")))
        if cq:
            queues.setdefault(cq, []).append(wl)
    for items in queues.values():
        items.sort(key=lambda o: (-_priority(o), o["metadata"].get("creationTimestamp") or "", o["metadata"]["name"]))
    return queues


def summary(store: Store, registry: Registry, r: VisibilityRoute, query: dict[str, list[str]]) -> Obj:
    """The PendingWorkloadsSummary for one queue; 404 when the queue does not exist."""
    queue_rt = registry.lookup("kueue.x-k8s.io", "v1beta1", r.plural)
    if queue_rt is None:
        raise ApiError.not_found(r.plural, r.name, GROUP)
    try:
        queue = store.get(queue_rt, r.namespace, r.name)
    except ApiError:
        raise ApiError.not_found(r.plural, r.name, GROUP) from None
    offset, limit = _int(query, "offset", 0), _int(query, "limit", DEFAULT_LIMIT) or DEFAULT_LIMIT
    cq = r.name if r.plural == "clusterqueues" else str((queue.get("spec") or {}).get("clusterQueue") or "")
    ordered = pending_order(store, registry).get(cq, [])
    items: list[Obj] = []
    per_lq: dict[tuple[str, str], int] = {}
    for pos, wl in enumerate(ordered):
        meta = wl["metadata"]
        lq = str((wl.get("spec") or {}).get("queueName") or "")
        key = (meta.get("namespace", ""), lq)
        in_lq = per_lq.get(key, 0)
        per_lq[key] = in_lq + 1
        if r.plural == "localqueues" and key != (r.namespace, r.name):
            continue
        item_meta: dict[str, Any] = {"name": meta["name"], "namespace": meta.get("namespace", ""),
                                     "creationTimestamp": meta.get("creationTimestamp")}
        if meta.get("ownerReferences"):
            item_meta["ownerReferences"] = meta["ownerReferences"]
        items.append({"metadata": item_meta, "priority": _priority(wl), "localQueueName": lq,
                      "positionInClusterQueue": pos, "positionInLocalQueue": in_lq})
    return {"kind": "PendingWorkloadsSummary", "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {"creationTimestamp": None}, "items": items[offset: offset + limit]}


def _int(query: dict[str, list[str]], key: str, default: int) -> int:
    raw = (query.get(key) or [""])[0]
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError.bad_request(f"{key}: not an integer: {raw!r}") from None
    if value < 0:
        raise ApiError.bad_request(f"{key}: must be non-negative")
    return value
