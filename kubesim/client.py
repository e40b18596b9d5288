"""A small JSON client for the simulator's REST and admin API: the scenario engine's honest client."""

from __future__ import annotations

import http.client
import threading
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from kubesim.errors import ApiError
from kubesim.faults import ENGINE_USER_AGENT
from kubesim.patch import MERGE_PATCH
from kubesim.registry import Registry, ResourceType

Obj = dict[str, Any]


class KubeClient:
    """Speaks the Kubernetes REST protocol over one keep-alive HTTP/1.1 connection (thread-safe)."""

    def __init__(
        self,
        base_url: str,
        registry: Registry | None = None,
        user_agent: str = ENGINE_USER_AGENT,
        timeout: float = 30.0,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"expected an http:// base URL, got {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.registry = registry or Registry()
        self.user_agent = user_agent
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        # Log appends wait here and go in one request, before any other request (so every write
        # keeps its order) or at flush(): a run's steps are thousands of small appends.
        self._pending_logs: list[Obj] = []

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def flush(self) -> None:
        """Send the log appends that wait (in order, in batches)."""
        while self._pending_logs:
            batch, self._pending_logs = self._pending_logs[:2000], self._pending_logs[2000:]
            self._send("POST", "/_sim/logs", {"entries": batch})

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """Send one request; returns the decoded JSON, raises ApiError for a Status failure."""
        self.flush()
        return self._send(method, path, body, content_type)

    def _send(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = orjson.dumps(body) if body is not None else None
        headers = {"User-Agent": self.user_agent, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        with self._lock:
            for attempt in (0, 1):
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                try:
                    self._conn.request(method, path, body=data, headers=headers)
                    resp = self._conn.getresponse()
                    raw = resp.read()
                    break
                except (ConnectionError, http.client.HTTPException, OSError):
                    self._conn.close()
                    self._conn = None
                    if attempt:
                        raise
        decoded = orjson.loads(raw) if raw else None
        if resp.status >= 400:
            msg = decoded.get("message", "") if isinstance(decoded, dict) else raw.decode(errors="replace")
            reason = decoded.get("reason") if isinstance(decoded, dict) else None
            raise ApiError(resp.status, msg, reason=reason)
        return decoded

    def type_for(self, api_version: str, kind: str) -> ResourceType:
        rt = self.registry.for_kind(api_version, kind)
        if rt is None:
            raise KeyError(f"{api_version} {kind} is not a registered resource type")
        return rt

    def path(self, api_version: str, kind: str, namespace: str = "", name: str = "", sub: str = "") -> str:
        """The REST path for a kind (and object, and subresource)."""
        rt = self.type_for(api_version, kind)
        prefix = f"/apis/{rt.group}/{rt.version}" if rt.group else "/api/v1"
        parts = [prefix]
        if rt.namespaced:
            parts.append(f"namespaces/{quote(namespace)}")
        parts.append(rt.plural)
        if name:
            parts.append(quote(name))
        if sub:
            parts.append(sub)
        return "/".join(parts)

    def create(self, obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        path = self.path(obj["apiVersion"], obj["kind"], str(meta.get("namespace", "")))
        out: Obj = self.request("POST", path, obj)
        return out

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj:
        out: Obj = self.request("GET", self.path(api_version, kind, namespace, name))
        return out

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: Obj, sub: str = "") -> Obj:
        """JSON merge patch of an object (or its `status` subresource)."""
        out: Obj = self.request("PATCH", self.path(api_version, kind, namespace, name, sub), body, MERGE_PATCH)
        return out

    def delete(self, api_version: str, kind: str, namespace: str, name: str, grace: int | None = None) -> Obj:
        """DELETE with Background propagation; `grace` is DeleteOptions.gracePeriodSeconds."""
        opts: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace is not None:
            opts["gracePeriodSeconds"] = grace
        out: Obj = self.request("DELETE", self.path(api_version, kind, namespace, name), opts)
        return out

    def bind(self, namespace: str, pod: str, node: str) -> None:
        """Bind a pod to a node through the pods/binding subresource, like the scheduler."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request("POST", self.path("v1", "Pod", namespace, pod, "binding"), body)

    def append_log(self, namespace: str, pod: str, container: str, lines: list[str], when: str = "") -> None:
        """Append container log lines (admin API; sent with the next request or flush())."""
        entry: Obj = {"namespace": namespace, "pod": pod, "container": container, "lines": lines}
        if when:
            entry["time"] = when
        self._pending_logs.append(entry)

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        """The container restarted: its log becomes the `previous` one (admin API)."""
        self.request("POST", f"/_sim/logs/{quote(namespace)}/{quote(pod)}/{quote(container)}/rotate", {})
