"""Kueue's on-demand visibility API (visibility.kueue.x-k8s.io/v1beta1, Kueue 0.9 on): a queue's
pending Workloads in admission order, with each one's position in its ClusterQueue and LocalQueue.

Read-only: `get` on `clusterqueues/pendingworkloads` (cluster-scoped: a queue admin's or the
controller's) and, as a fallback a researcher is more often allowed, `localqueues/pendingworkloads`
in the run's namespace. The answer is hostile input like any other: decoded into typed structs,
bounded (at most `limit` items, names of Kubernetes length).
"""

from __future__ import annotations

from typing import Any

import msgspec

from collector.kube import dns1123_label, dns1123_subdomain
from collector.queuefacts import PendingItem, PendingSummary
from collector.sources.kube_api import KubeApi, PermanentSourceError, SourceError

GROUP = "visibility.kueue.x-k8s.io"
VERSION = "v1beta1"
BASE = f"/apis/{GROUP}/{VERSION}"
LIMIT = 1000  # Kueue's own default page
CQ_RESOURCE = f"clusterqueues/pendingworkloads.{GROUP}"
LQ_RESOURCE = f"localqueues/pendingworkloads.{GROUP}"


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""


class _Item(msgspec.Struct, rename="camel"):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    priority: int = 0
    local_queue_name: str = ""
    position_in_cluster_queue: int = -1
    position_in_local_queue: int = -1


class _Summary(msgspec.Struct):
    items: list[_Item] | None = None


def _decode(doc: Any, queue: str, read_at: Any) -> PendingSummary:
    try:
        s = msgspec.convert(doc, _Summary)
    except msgspec.ValidationError as e:
        raise ValueError(f"{queue}: malformed PendingWorkloadsSummary: {e}") from None
    items = []
    for i in (s.items or [])[:LIMIT]:
        if not i.metadata.name or len(i.metadata.name) > 253 or len(i.metadata.namespace) > 63 \
                or i.position_in_cluster_queue < 0:
            continue
        items.append(PendingItem(i.metadata.namespace, i.metadata.name, i.local_queue_name[:253], i.priority,
                                 i.position_in_cluster_queue, max(i.position_in_local_queue, 0)))
    return PendingSummary(queue, tuple(items), read_at)


def read_cluster_queue(api: KubeApi, name: str) -> PendingSummary:
    """The ClusterQueue's pending Workloads (raises SourceError: 403 without RBAC, 404 without Kueue's API)."""
    if not dns1123_subdomain(name):  # a tenant's Workload names its queue: never a path of its own making
        raise ValueError("not a valid ClusterQueue name")
    read_at = api.clock.now()
    doc = api.get_json(f"{BASE}/clusterqueues/{name}/pendingworkloads", [("limit", LIMIT)])
    return _decode(doc, f"ClusterQueue/{name}", read_at)


def read_local_queue(api: KubeApi, namespace: str, name: str) -> PendingSummary:
    if not (dns1123_label(namespace) and dns1123_subdomain(name)):
        raise ValueError("not a valid LocalQueue name")
    read_at = api.clock.now()
    doc = api.get_json(f"{BASE}/namespaces/{namespace}/localqueues/{name}/pendingworkloads", [("limit", LIMIT)])
    return _decode(doc, f"LocalQueue/{namespace}/{name}", read_at)


def read_pending(api: KubeApi, cluster_queue: str, namespace: str, local_queue: str
                 ) -> tuple[PendingSummary | None, str]:
    """The ClusterQueue's summary, else the LocalQueue's; with what was refused or missing, in words."""
    notes: list[str] = []
    if cluster_queue:
        try:
            return read_cluster_queue(api, cluster_queue), ""
        except (SourceError, ValueError) as e:
            notes.append(f"get {CQ_RESOURCE} {cluster_queue}: {_why(e)}")
    if local_queue:
        try:
            return read_local_queue(api, namespace, local_queue), "; ".join(notes)
        except (SourceError, ValueError) as e:
            notes.append(f"get {LQ_RESOURCE} {namespace}/{local_queue}: {_why(e)}")
    return None, "; ".join(notes) or "no queue to ask about"


def _why(e: Exception) -> str:
    if isinstance(e, PermanentSourceError):
        return {401: "unauthorized", 403: "refused", 404: "not served or not found"}.get(e.code, f"failed ({e.code})")
    return str(e)[:200]
