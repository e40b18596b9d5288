"""Where a RayCluster's head and workers answer: URLs built from validated parts only.

Tenants write the RayJob's `status.dashboardURL`, the RayCluster's `status.endpoints` and pods
with any labels. A URL the collector asks is built here from parts that are checked, never from
tenant text as a whole: a DNS-label service name in the run's own namespace, an IP literal that
can be a pod's, an integer port, a fixed path (docs/security.md, rounds 1 and 2).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from collector.model import OwnerRef

DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_METRICS_PORT = 8080  # KubeRay exposes the head's metrics export port as "metrics"


def normalize_url(url: str) -> str:
    """`host:port` (as KubeRay's RayJob `status.dashboardURL` gives it) → `http://host:port`."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


_PORT = re.compile(r"^[0-9]{1,5}$")  # ASCII digits only (str.isdigit also takes "²" and "０")


def _port(value: int | str | None, default: int) -> int | None:
    """A port from tenant-written status (`status.endpoints.*`): a whole number in 1..65535 or None."""
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not _PORT.match(value.strip()):
            return None
        value = int(value.strip())
    return value if 0 < value < 65536 else None


def pod_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A pod's IP as an address literal, or None. Never loopback, link-local (cloud metadata lives
    at 169.254.169.254), unspecified or multicast: no pod network hands those to a pod."""
    try:
        addr = ipaddress.ip_address(value.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            return None
        addr = addr.ipv4_mapped or addr
    if addr.is_loopback or addr.is_link_local or addr.is_unspecified or addr.is_multicast:
        return None
    return addr


def _metrics_url(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    return f"http://{host}:{port}/metrics"


def worker_metrics_url(ip: str, port: int | str | None) -> str | None:
    """A Ray worker pod's metrics endpoint from validated parts only: `http://<pod IP>:<port>/metrics`
    (the port from the RayCluster's `status.endpoints.metrics`, default 8080). None when either
    part is not what it must be: a tenant's status never chooses the host or the path."""
    addr, number = pod_ip(ip), _port(port, DEFAULT_METRICS_PORT)
    return _metrics_url(addr, number) if addr is not None and number is not None else None


def is_worker_metrics_url(url: str) -> bool:
    """`url` has the form `worker_metrics_url` builds (an IP literal, a port, /metrics and nothing
    else), checked again before each scrape."""
    parts = urlsplit(url)
    try:
        port = parts.port
        addr = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return False
    return port is not None and 0 < port < 65536 and url == _metrics_url(addr, port)


def service_url(service: str, namespace: str, port: int, *, cluster_domain: str = "cluster.local",
                path: str = "") -> str | None:
    """`http://<svc>.<ns>.svc.<domain>:<port><path>`, or None for names that are not DNS labels."""
    if not (_DNS_LABEL.match(service) and _DNS_LABEL.match(namespace)):
        return None
    return f"http://{service}.{namespace}.svc.{cluster_domain}:{port}{path}"


def is_service_host(host: str, service: str, namespace: str, cluster_domain: str = "cluster.local") -> bool:
    """`host` names this Service of this namespace, in one of the forms cluster DNS answers."""
    host = host.lower().rstrip(".")
    forms = {f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.{cluster_domain}"}
    return host in forms


def owned_by(owners: Iterable[OwnerRef], kind: str, name: str, uid: str = "") -> bool:
    """An ownerReference names this object (and its uid, when both are known): labels are
    tenant-writable, a controller's ownerReference is how KubeRay marks the pods it made."""
    return any(o.kind == kind and o.name == name and (not uid or not o.uid or o.uid == uid) for o in owners)


def _override(overrides: Mapping[str, str] | None, namespace: str, name: str) -> str | None:
    url = (overrides or {}).get(f"{namespace}/{name}")
    return normalize_url(url) if url else None


def dashboard_url_for(
    namespace: str,
    cluster: str,
    *,
    overrides: Mapping[str, str] | None = None,
    rayjob_dashboard_url: str | None = None,
    head_service: str | None = None,
    dashboard_port: int | str | None = None,
    cluster_domain: str = "cluster.local",
) -> str | None:
    """A RayCluster's dashboard URL, first match of: `overrides["<namespace>/<cluster>"]` (tests,
    port-forwards); the RayJob's `status.dashboardURL` (host:port); the RayCluster's
    `status.head.serviceName` with `status.endpoints.dashboard` (default 8265). None if unknown."""
    url = _override(overrides, namespace, cluster)
    if url:
        return url
    if rayjob_dashboard_url and rayjob_dashboard_url.strip():
        # Tenant-written status: it may name any host (cloud metadata, the API server). Only the
        # cluster's own head service in its own namespace is used (docs/security.md).
        candidate = normalize_url(rayjob_dashboard_url)
        parts = urlsplit(candidate)
        service = head_service or f"{cluster}-head-svc"  # KubeRay's name for the head service
        try:
            url_port = parts.port
        except ValueError:
            url_port = None
        if (parts.scheme == "http" and not parts.username and not parts.password and parts.hostname
                and is_service_host(parts.hostname, service, namespace, cluster_domain)):
            got = service_url(service, namespace, url_port or DEFAULT_DASHBOARD_PORT, cluster_domain=cluster_domain)
            if got is not None:
                return got
    port = _port(dashboard_port, DEFAULT_DASHBOARD_PORT)
    if head_service and port is not None:
        return service_url(head_service, namespace, port, cluster_domain=cluster_domain)
    return None


def metrics_url_for(
    namespace: str,
    cluster: str,
    *,
    overrides: Mapping[str, str] | None = None,
    head_service: str | None = None,
    metrics_port: int | str | None = None,
    cluster_domain: str = "cluster.local",
) -> str | None:
    """The head's metrics endpoint: `overrides["<namespace>/<cluster>"]` (a full URL), else
    `status.head.serviceName` with `status.endpoints.metrics` (default 8080) and path /metrics."""
    url = _override(overrides, namespace, cluster)
    if url:
        return url
    port = _port(metrics_port, DEFAULT_METRICS_PORT)
    if head_service and port is not None:
        return service_url(head_service, namespace, port, cluster_domain=cluster_domain, path="/metrics")
    return None
