"""The simulator's HTTP front: Kubernetes REST paths, discovery, watch streaming, faults, admin API."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
import yaml

from kubesim.clock import Clock, SystemClock, parse_time
from kubesim.errors import ApiError
from kubesim.faults import Fault, Faults
from kubesim.patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, apply_patch
from kubesim.registry import Registry, ResourceType
from kubesim.selectors import build_selector
from kubesim.store import Entry, Expired, Obj, Store, StoreSettings, TooLarge
from kubesim.tables import table_row, to_table

log = logging.getLogger(__name__)

BUILTIN_GROUPS = frozenset(
    {
        "",
        "apps",
        "batch",
        "coordination.k8s.io",
        "scheduling.k8s.io",
        "events.k8s.io",
        "policy",
        "networking.k8s.io",
    }
)
_DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass(frozen=True, slots=True)
class SimulatorSettings:
    """How the simulated API server behaves."""

    # Writes retained for watch resumption / continue tokens; older versions answer 410 Gone.
    watch_window: int = 10_000
    # Period of BOOKMARK events on watches that ask for them (real API servers: about a minute).
    bookmark_interval_s: float = 5.0
    # Watch length when the client sends no timeoutSeconds.
    default_watch_timeout_s: float = 1800.0
    # Per-container log bytes kept.
    log_max_bytes: int = 1 << 20
    # Seed for uids, generated names and fault ratios.
    seed: int = 0
    # Serve aggregated discovery (apidiscovery.k8s.io/v2) to clients that ask for it.
    aggregated_discovery: bool = True
    # Reported by /version.
    git_version: str = "v1.32.0"
    # A list or watch from a resourceVersion the store has not reached waits this long for it (the
    # watch cache's blockTimeout, 3 s) before it answers 504 "Too large resource version".
    too_large_wait_s: float = 3.0
    # retryAfterSeconds of that answer (the watch cache's resourceVersionTooHighRetrySeconds).
    too_large_retry_after_s: int = 1
    # The ResourceVersionTooLarge cause of that answer, as API servers of each age send it: "reason"
    # (1.18.6 on: reason and message), "message" (1.17.0-1.18.5: the message only), "none" (older).
    too_large_cause: Literal["reason", "message", "none"] = "reason"
    # Events are deleted this many scenario seconds after their last write (kube-apiserver
    # --event-ttl, 1 h by default there); None keeps them for ever.
    event_ttl_s: float | None = None


def too_large_error(exc: TooLarge, retry_after_s: int, cause: str = "reason") -> ApiError:
    """What Kubernetes answers for a resourceVersion ahead of its store (storage.NewTooLargeResourceVersionError
    wrapped in a Timeout StatusError): 504, reason Timeout, a ResourceVersionTooLarge cause. client-go's
    reflector recognizes it (reason Timeout + that cause) and relists from resourceVersion "".
    `cause` is SimulatorSettings.too_large_cause: older servers sent less of the cause.
    """
    details: dict[str, Any] = {"retryAfterSeconds": retry_after_s}
    if cause == "reason":
        details["causes"] = [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
    elif cause == "message":
        details["causes"] = [{"message": "Too large resource version"}]
    return ApiError(504, f"Timeout: {exc}", reason="Timeout", details=details, retry_after=retry_after_s)


ETCD_FUTURE_REVISION = "etcdserver: mvcc: required revision is a future revision"


def _exact_lists_from_cache(git_version: str) -> bool:
    """Whether the reported Kubernetes version serves resourceVersionMatch=Exact lists from its watch
    cache (1.34 on: ListFromCacheSnapshot, beta and on by default, with an etcd that supports
    consistent reads): a version ahead of the cache then waits and is answered like NotOlderThan.
    Older versions send Exact lists to etcd. An unparsable version counts as new."""
    m = re.match(r"v?(\d+)\.(\d+)", git_version)
    return m is None or (int(m[1]), int(m[2])) >= (1, 34)


@dataclass(slots=True)
class _Route:
    rt: ResourceType
    namespace: str
    name: str
    subresource: str
    verb: str


def _qs_bool(q: dict[str, list[str]], key: str) -> bool:
    return q.get(key, [""])[0].lower() in ("true", "1")


def _qs(q: dict[str, list[str]], key: str) -> str:
    return q.get(key, [""])[0]


def _qs_int(q: dict[str, list[str]], key: str) -> int | None:
    raw = _qs(q, key)
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError.bad_request(f"invalid {key}: {raw!r}") from None


def _accept_table(accept: str) -> str | None:
    """ "v1"/"v1beta1" when the client prefers a meta.k8s.io Table, else None."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        media = part.split(";")[0].strip()
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return params.get("v", "v1")
        if media in ("application/json", "*/*", "application/*") and "as" not in params:
            return None
    return None


class _Dropped(Exception):
    """An injected fault: close the connection without answering."""


def _accepts_discovery_v2(accept: str) -> bool:
    """Whether the client asks for aggregated discovery (apidiscovery.k8s.io/v2) before plain JSON."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        if params.get("as") == "APIGroupDiscoveryList" and params.get("g") == "apidiscovery.k8s.io":
            if params.get("v") == "v2":
                return True
            continue
        return False
    return False


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sim: Simulator) -> None:
        self.sim = sim
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def drop_all(self) -> None:
        with self.conn_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: SimulatorServer

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)

    @property
    def sim(self) -> Simulator:
        return self.server.sim

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The `Date` header (RFC 7231 HTTP-date) on every answer, watch streams included: the scenario
        clock, not the host's, so a client that evaluates on the server's clock plays on scenario time."""
        when = self.sim.clock.now().timestamp() if timestamp is None else timestamp
        return formatdate(when, usegmt=True)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: Any, content_type: str = "application/json") -> None:
        self._send(code, orjson.dumps(obj), content_type)

    def _error(self, err: ApiError) -> None:
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
        self._send(err.code, orjson.dumps(err.status()), headers=headers)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self, yaml_ok: bool = False) -> Any:
        raw = self._body()
        if not raw:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            if yaml_ok:
                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as exc:
                    raise ApiError.bad_request(f"invalid YAML body: {exc}") from None
            raise ApiError.bad_request("the request body is not valid JSON") from None

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path).rstrip("/") or "/"
        query = parse_qs(url.query, keep_blank_values=True)
        try:
            if path.startswith("/_sim/"):
                self._admin(path, query)
                return
            if self.command in ("GET", "HEAD") and self._discovery(path):
                return
            route = self._route(path, query)
            if route is None:
                self._body()
                raise ApiError(
                    404,
                    "the server could not find the requested resource",
                    reason="NotFound",
                    details={"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
                )
            self._serve(route, query)
        except ApiError as err:
            self._error(err)
        except _Dropped:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # an unexpected bug answers 500 like an API server would
            log.exception("simulator: %s %s failed", self.command, self.path)
            self._error(ApiError(500, f"simulator internal error: {exc!r}"))

    # ------------------------------------------------------------------ discovery
    def _discovery(self, path: str) -> bool:
        reg = self.sim.registry
        accept = self.headers.get("Accept", "")
        v2 = self.sim.settings.aggregated_discovery and _accepts_discovery_v2(accept)
        if path in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return True
        if path == "/version":
            major, minor = self.sim.settings.git_version.lstrip("v").split(".")[:2]
            self._json(
                200,
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": self.sim.settings.git_version,
                    "gitCommit": "taugrid-simulator",
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.23",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
            return True
        if path == "/api":
            self._maybe_fault("discovery", "", "")
            if v2:
                self._json(200, self._aggregated(core=True), _DISCOVERY_V2)
            else:
                self._json(
                    200,
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": self.headers.get("Host", "")}
                        ],
                    },
                )
            return True
        if path == "/apis":
            self._maybe_fault("discovery", "", "")
            if v2:
                self._json(200, self._aggregated(core=False), _DISCOVERY_V2)
            else:
                self._json(
                    200,
                    {
                        "kind": "APIGroupList",
                        "apiVersion": "v1",
                        "groups": [self._api_group(g, vs) for g, vs in reg.groups().items() if g],
                    },
                )
            return True
        if path == "/api/v1":
            self._maybe_fault("discovery", "", "")
            self._json(200, self._resource_list("", "v1"))
            return True
        if path == "/openapi/v3":
            index = {
                (f"apis/{g}/{v}" if g else "api/v1"): {
                    "serverRelativeURL": f"/openapi/v3/{'apis/' + g + '/' + v if g else 'api/v1'}?hash=sim"
                }
                for g, vs in reg.groups().items()
                for v in vs
            }
            self._json(200, {"paths": index})
            return True
        if path.startswith("/openapi/v3/"):
            gv = path[len("/openapi/v3/") :]
            group, version = ("", "v1") if gv == "api/v1" else (gv.split("/")[1:3] + [""])[:2]
            types = reg.in_group_version(group, version) if gv.count("/") in (1, 2) else []
            if not types:
                return False
            self._json(200, self._openapi_v3(group, version, types))
            return True
        parts = path.split("/")
        if len(parts) == 3 and parts[1] == "apis":
            versions = reg.groups().get(parts[2])
            if not versions:
                return False
            self._json(200, self._api_group(parts[2], versions))
            return True
        if len(parts) == 4 and parts[1] == "apis":
            if not reg.in_group_version(parts[2], parts[3]):
                return False
            self._maybe_fault("discovery", "", "")
            self._json(200, self._resource_list(parts[2], parts[3]))
            return True
        return False

    @staticmethod
    def _api_group(group: str, versions: list[str]) -> Obj:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": gvs,
            "preferredVersion": gvs[0],
        }

    @staticmethod
    def _subresources(rt: ResourceType) -> list[tuple[str, list[str]]]:
        subs: list[tuple[str, list[str]]] = []
        if rt.status_subresource:
            subs.append(("status", ["get", "patch", "update"]))
        if rt.key == "/v1/pods":
            subs += [("log", ["get"]), ("binding", ["create"])]
        return subs

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for rt in self.sim.registry.in_group_version(group, version):
            entry: Obj = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(rt.verbs),
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub, verbs in self._subresources(rt):
                kind = "Binding" if sub == "binding" else rt.kind
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": kind,
                        "verbs": verbs,
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    @staticmethod
    def _openapi_v3(group: str, version: str, types: list[ResourceType]) -> Obj:
        """A minimal OpenAPI v3 document: write operations per kind, tagged with group/version/kind and
        declaring the `fieldValidation` parameter, plus one open schema per kind.

        kubectl reads it to learn that the server validates fields itself and needs no client schema.
        """
        params = [
            {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for n in ("dryRun", "fieldManager", "fieldValidation")
        ]
        schemas: Obj = {}
        paths: Obj = {}
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        for rt in types:
            gvk = [{"group": group, "version": version, "kind": rt.kind}]
            name = f"{'.'.join(reversed(group.split('.'))) if group else 'io.k8s.api.core'}.{version}.{rt.kind}"
            ref = {"$ref": f"#/components/schemas/{name}"}
            schemas[name] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "x-kubernetes-group-version-kind": gvk,
            }

            def op(action: str, rt: ResourceType = rt, gvk: list[Obj] = gvk, ref: Obj = ref) -> Obj:
                return {
                    "operationId": f"{action}{rt.kind}",
                    "parameters": params,
                    "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk[0],
                }

            base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
            paths[base] = {"post": op("post"), "get": op("list")}
            paths[base + "/{name}"] = {
                "get": op("get"),
                "put": op("put"),
                "patch": op("patch"),
                "delete": op("delete"),
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (taugrid simulator)", "version": "v1"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    def _aggregated(self, core: bool) -> Obj:
        items: list[Obj] = []
        for group, versions in self.sim.registry.groups().items():
            if (group == "") != core:
                continue
            vers: list[Obj] = []
            for version in versions:
                res: list[Obj] = []
                for rt in self.sim.registry.in_group_version(group, version):
                    kind = {"group": group, "version": version, "kind": rt.kind}
                    entry: Obj = {
                        "resource": rt.plural,
                        "responseKind": kind,
                        "scope": "Namespaced" if rt.namespaced else "Cluster",
                        "singularResource": rt.singular,
                        "verbs": list(rt.verbs),
                    }
                    if rt.short_names:
                        entry["shortNames"] = list(rt.short_names)
                    if rt.categories:
                        entry["categories"] = list(rt.categories)
                    subs = self._subresources(rt)
                    if subs:
                        entry["subresources"] = [
                            {
                                "subresource": s,
                                "verbs": v,
                                "responseKind": {**kind, "kind": "Binding" if s == "binding" else rt.kind},
                            }
                            for s, v in subs
                        ]
                    res.append(entry)
                vers.append({"version": version, "resources": res, "freshness": "Current"})
            items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": vers})
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }

    # ------------------------------------------------------------------ routing
    def _route(self, path: str, query: dict[str, list[str]]) -> _Route | None:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        watch_path = bool(rest) and rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        reg = self.sim.registry
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = reg.lookup(group, version, rest[2])
            if rt is not None and rt.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        rt = reg.lookup(group, version, rest[0])
        if rt is None or len(rest) > 3:
            return None
        name = rest[1] if len(rest) >= 2 else ""
        sub = rest[2] if len(rest) == 3 else ""
        if sub and sub not in [s for s, _ in self._subresources(rt)]:
            return None
        method = self.command
        if name:
            verb = {
                "GET": "get",
                "HEAD": "get",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
                "POST": "create",
            }[method]
            if sub == "log":
                verb = "logs"
            if watch_path or (verb == "get" and _qs_bool(query, "watch")):
                verb = "watch"
        else:
            verb = {"GET": "list", "HEAD": "list", "POST": "create", "DELETE": "deletecollection"}.get(method, "")
            if not verb:
                raise ApiError(405, f"the server does not allow this method on the requested resource ({method})")
            if verb == "list" and (watch_path or _qs_bool(query, "watch")):
                verb = "watch"
        return _Route(rt, namespace, name, sub, verb)

    # ------------------------------------------------------------------ faults
    def _maybe_fault(self, verb: str, resource: str, namespace: str) -> list[Fault]:
        fired = self.sim.faults.pick(verb, resource, namespace, self.headers.get("User-Agent", ""))
        for f in fired:
            if f.action == "delay":
                time.sleep(f.delay_s)
        for f in fired:
            if f.action == "status":
                retry = f.retry_after_s if f.status in (429, 503) else None
                message = {
                    429: "Too many requests, please try again later.",
                    503: "the server is currently unable to handle the request",
                }.get(f.status, "Internal error occurred: injected fault")
                err = ApiError(
                    f.status,
                    message,
                    retry_after=retry,
                    details={"retryAfterSeconds": retry} if retry else None,
                )
                raise err
        if verb != "watch" and any(f.action == "drop" for f in fired):
            raise _Dropped()
        return [f for f in fired if f.action in ("gone", "drop", "nobookmarks")]

    # ------------------------------------------------------------------ resources
    def _serve(self, r: _Route, query: dict[str, list[str]]) -> None:
        self.sim.count(r.verb, r.rt.plural, query)
        store = self.sim.store
        pending = self._maybe_fault(r.verb, r.rt.plural, r.namespace)
        gone = any(f.action == "gone" for f in pending)
        if r.verb == "watch":
            drop = next((f for f in pending if f.action == "drop"), None)
            no_marks = any(f.action == "nobookmarks" for f in pending)
            self._watch(r, query, gone, drop, no_marks)
            return
        if gone and r.verb == "list":
            self._body()
            raise ApiError.expired("The resourceVersion for the provided list is too old.")
        dry_run = bool(query.get("dryRun"))
        table = _accept_table(self.headers.get("Accept", ""))
        include = _qs(query, "includeObject") or "Metadata"
        now = self.sim.clock.now()
        rt = r.rt
        if r.verb == "get":
            obj = store.get(rt, r.namespace, r.name)
            if table:
                out = to_table(rt, [obj], now, {"resourceVersion": obj["metadata"]["resourceVersion"]}, include, table)
                self._json(200, out)
            else:
                self._json(200, obj)
        elif r.verb == "logs":
            self._logs(r, query)
        elif r.verb == "list":
            sel = build_selector(_qs(query, "labelSelector"), _qs(query, "fieldSelector"), rt.field_path)
            args = (
                rt,
                r.namespace,
                sel,
                _qs_int(query, "limit") or 0,
                _qs(query, "continue"),
                _qs(query, "resourceVersion"),
                _qs(query, "resourceVersionMatch"),
            )
            try:
                res = store.list_page(*args)
            except TooLarge as exc:
                if args[6] == "Exact" and not _exact_lists_from_cache(self.sim.settings.git_version):
                    # Before 1.34 an Exact list goes to etcd, which refuses a future revision at once,
                    # and the apiserver passes that error on unconverted: 500 without a reason.
                    raise ApiError(500, ETCD_FUTURE_REVISION, reason="") from None
                if not store.wait_for(exc.rv, self.sim.settings.too_large_wait_s):
                    self.sim.count("too-large", rt.plural)
                    raise too_large_error(exc, self.sim.settings.too_large_retry_after_s,
                                          self.sim.settings.too_large_cause) from None
                res = store.list_page(*args)
            meta: Obj = {"resourceVersion": str(res.resource_version)}
            if res.continue_token:
                meta["continue"] = res.continue_token
                if res.remaining is not None and sel.empty:
                    meta["remainingItemCount"] = res.remaining
            if table:
                self._json(200, to_table(rt, res.items, now, meta, include, table))
                return
            items: Any = res.items
            if rt.group in BUILTIN_GROUPS:
                items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
            self._json(
                200,
                {"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta, "items": items},
            )
        elif r.verb == "create":
            body = self._json_body()
            if r.subresource == "binding":
                self._bind(r, body)
                return
            if r.name:
                raise ApiError(405, "the server does not allow this method on the requested resource")
            self._json(201, store.create(rt, r.namespace, body, dry_run=dry_run))
        elif r.verb == "update":
            body = self._json_body()
            self._json(200, store.replace(rt, r.namespace, r.name, body, subresource=r.subresource, dry_run=dry_run))
        elif r.verb == "patch":
            ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
            body = self._json_body(yaml_ok=ctype == APPLY_PATCH)
            if ctype == APPLY_PATCH:
                kind = MERGE_PATCH
                create_missing = True
            elif ctype in (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH):
                kind, create_missing = ctype, False
            else:
                raise ApiError(
                    415,
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}, {STRATEGIC_MERGE_PATCH}",
                )
            out = store.patch(
                rt,
                r.namespace,
                r.name,
                lambda cur: apply_patch(cur, body, kind),
                subresource=r.subresource,
                dry_run=dry_run,
                create_missing=create_missing,
            )
            self._json(200, out)
        elif r.verb == "delete":
            opts = self._json_body() or {}
            pre = opts.get("preconditions") or {}
            policy = _qs(query, "propagationPolicy") or opts.get("propagationPolicy") or "Background"
            obj = store.delete(
                rt,
                r.namespace,
                r.name,
                uid=pre.get("uid") or "",
                resource_version=pre.get("resourceVersion") or "",
                propagation=policy,
                dry_run=dry_run or bool(opts.get("dryRun")),
            )
            self._json(200, obj)
        elif r.verb == "deletecollection":
            self._body()
            sel = build_selector(_qs(query, "labelSelector"), _qs(query, "fieldSelector"), rt.field_path)
            gone_items = store.delete_collection(rt, r.namespace, sel)
            self._json(
                200,
                {
                    "kind": f"{rt.kind}List",
                    "apiVersion": rt.group_version,
                    "metadata": {"resourceVersion": str(store.resource_version)},
                    "items": gone_items,
                },
            )
        else:  # pragma: no cover - routing only produces the verbs above
            raise ApiError(405, f"verb {r.verb} is not supported")

    def _bind(self, r: _Route, body: Any) -> None:
        target = (body or {}).get("target") or {}
        node = target.get("name")
        if not node:
            raise ApiError.invalid("Binding", r.name, [("target.name", "Required value")])
        store = self.sim.store

        def bind(pod: Obj) -> Obj:
            if (pod.get("spec") or {}).get("nodeName"):
                raise ApiError(
                    409,
                    f'pod {r.name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                    reason="Conflict",
                )
            return {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}

        store.patch(r.rt, r.namespace, r.name, bind)
        self._json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    # ------------------------------------------------------------------ logs
    def _logs(self, r: _Route, query: dict[str, list[str]]) -> None:
        store = self.sim.store
        pod = store.get(r.rt, r.namespace, r.name)
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
        regular = [c.get("name") for c in spec.get("containers") or []]
        container = _qs(query, "container")
        if not container:
            default = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                "kubectl.kubernetes.io/default-container"
            )
            if len(regular) == 1:
                container = str(regular[0])
            elif default in names:
                container = str(default)
            else:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {r.name}, "
                    f"choose one of: [{' '.join(map(str, regular))}]"
                )
        if container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {r.name}")
        previous = _qs_bool(query, "previous")
        if not spec.get("nodeName"):
            self._send(200, b"", "text/plain")  # not bound: no kubelet to ask, an empty stream
            return
        if not previous and not store.log_lines(r.namespace, r.name, container):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = next((c.get("state") or {} for c in statuses if c.get("name") == container), {})
            if not state.get("running") and not state.get("terminated"):
                reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
                raise ApiError.bad_request(f'container "{container}" in pod "{r.name}" is waiting to start: {reason}')
        since = None
        if _qs(query, "sinceTime"):
            since = parse_time(_qs(query, "sinceTime"))
        elif _qs_int(query, "sinceSeconds") is not None:
            from datetime import timedelta

            since = self.sim.clock.now() - timedelta(seconds=_qs_int(query, "sinceSeconds") or 0)
        kw: dict[str, Any] = {
            "previous": previous,
            "tail_lines": _qs_int(query, "tailLines"),
            "limit_bytes": _qs_int(query, "limitBytes"),
            "timestamps": _qs_bool(query, "timestamps"),
            "since": since,
        }
        data, total = store.read_log(r.namespace, r.name, container, **kw)
        if not _qs_bool(query, "follow") or previous:
            self._send(200, data, "text/plain")
            return
        self._start_stream("text/plain")
        self._chunk(data)
        sent = total
        seen_version = store.log_version
        deadline = time.monotonic() + self.sim.settings.default_watch_timeout_s
        while not store.closed and time.monotonic() < deadline:
            with store.cond:
                if store.log_version == seen_version and not store.closed:
                    store.cond.wait(timeout=1.0)
                seen_version = store.log_version
            try:
                store.get(r.rt, r.namespace, r.name)
            except ApiError:
                break
            data, total = store.read_log(r.namespace, r.name, container, timestamps=kw["timestamps"])
            if total > sent:
                lines = data.splitlines(keepends=True)
                self._chunk(b"".join(lines[-(total - sent) :]))
                sent = total
            elif total < sent:
                sent = total
        self._end_stream()

    # ------------------------------------------------------------------ watch
    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _watch(
        self, r: _Route, query: dict[str, list[str]], gone: bool, drop: Fault | None, no_marks: bool = False
    ) -> None:
        store = self.sim.store
        settings = self.sim.settings
        rt = r.rt
        sel = build_selector(_qs(query, "labelSelector"), _qs(query, "fieldSelector"), rt.field_path)
        if r.name:
            sel = build_selector(
                _qs(query, "labelSelector"),
                ",".join(filter(None, [_qs(query, "fieldSelector"), f"metadata.name={r.name}"])),
                rt.field_path,
            )
        rv = _qs(query, "resourceVersion")
        send_initial_raw = _qs(query, "sendInitialEvents").lower()
        initial = send_initial_raw == "true" or (rv in ("", "0") and send_initial_raw != "false")
        bookmarks = _qs_bool(query, "allowWatchBookmarks")
        timeout = _qs_int(query, "timeoutSeconds")
        deadline = time.monotonic() + (
            timeout if timeout is not None and timeout > 0 else settings.default_watch_timeout_s
        )
        table = _accept_table(self.headers.get("Accept", ""))
        include = _qs(query, "includeObject") or "Metadata"
        sent = 0

        def encode(type_: str, item: Entry | Obj) -> bytes:
            if table:
                obj = store.to_view(rt, item.obj) if isinstance(item, Entry) else item
                tbl = to_table(
                    rt,
                    [],
                    self.sim.clock.now(),
                    {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    include,
                    table,
                )
                tbl["rows"] = [table_row(rt, obj, self.sim.clock.now(), include)]
                return orjson.dumps({"type": type_, "object": tbl}) + b"\n"
            enc = orjson.dumps(store.to_view(rt, item.obj) if isinstance(item, Entry) else item)
            return b'{"type":"' + type_.encode() + b'","object":' + enc + b"}\n"

        def expired_line(message: str) -> bytes:
            return orjson.dumps({"type": "ERROR", "object": ApiError.expired(message).status()}) + b"\n"

        def bookmark(pos: int, initial_end: bool = False) -> bytes:
            meta: Obj = {"resourceVersion": str(pos), "creationTimestamp": None}
            if initial_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return (
                orjson.dumps(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta},
                    }
                )
                + b"\n"
            )

        self._start_stream("application/json")
        try:
            if gone:
                self._chunk(expired_line(f"too old resource version: {rv or 0} ({store.resource_version})"))
                self._end_stream()
                return
            try:
                try:
                    watch = store.watch(rt, r.namespace, sel, rv, initial_events=initial)
                except TooLarge as exc:
                    if not store.wait_for(exc.rv, settings.too_large_wait_s):
                        # Like the watch cache: the watch is accepted, then one ERROR event says why.
                        status = too_large_error(exc, settings.too_large_retry_after_s,
                                                 settings.too_large_cause).status()
                        self.sim.count("too-large", rt.plural)
                        self._chunk(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
                        self._end_stream()
                        return
                    watch = store.watch(rt, r.namespace, sel, rv, initial_events=initial)
            except Expired as exc:
                self._chunk(expired_line(str(exc)))
                self._end_stream()
                return
            pending = watch.initial or []
            watch.initial = None
            lines = [encode("ADDED", o) for o in pending]
            if send_initial_raw == "true" and bookmarks:
                lines.append(bookmark(watch.pos, initial_end=True))
            last_mark = time.monotonic()
            while not store.closed:
                if lines:
                    if drop is not None and sent + len(lines) > drop.after_events:
                        keep = drop.after_events - sent
                        cut = lines[keep]
                        self._chunk(b"".join(lines[:keep]) + cut[: max(1, len(cut) // 2)])
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    sent += len(lines)
                    self._chunk(b"".join(lines))
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 1.0)
                if bookmarks and not no_marks:
                    wait = max(0.0, min(wait, settings.bookmark_interval_s - (now - last_mark)))
                try:
                    batch = watch.poll(wait)
                except Expired as exc:
                    self._chunk(expired_line(str(exc)))
                    break
                lines = [encode(t, item) for t, item in batch]
                if bookmarks and not no_marks and time.monotonic() - last_mark >= settings.bookmark_interval_s:
                    lines.append(bookmark(watch.pos))
                    last_mark = time.monotonic()
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    # ------------------------------------------------------------------ admin API
    def _admin(self, path: str, query: dict[str, list[str]]) -> None:
        store = self.sim.store
        parts = [p for p in path.split("/") if p][1:]
        if parts == ["faults"]:
            if self.command == "GET":
                self._json(200, {"faults": [f.to_json() for f in self.sim.faults.rules()]})
            elif self.command == "POST":
                body = self._json_body()
                try:
                    fault = self.sim.faults.add(Fault.from_json(body or {}))
                except (ValueError, TypeError) as exc:
                    raise ApiError.bad_request(str(exc)) from None
                self._json(201, fault.to_json())
            elif self.command == "DELETE":
                self._body()
                self.sim.faults.clear()
                self._json(200, {"faults": []})
            else:
                raise ApiError(405, "use GET, POST or DELETE")
            return
        if len(parts) == 2 and parts[0] == "faults" and self.command == "DELETE":
            ok = self.sim.faults.remove(int(parts[1]))
            if not ok:
                raise ApiError(404, f"no fault {parts[1]}")
            self._json(200, {"removed": int(parts[1])})
            return
        if parts and parts[0] == "logs" and len(parts) in (4, 5) and self.command == "POST":
            ns, pod, container = parts[1:4]
            body = self._json_body() or {}
            if len(parts) == 5:
                if parts[4] != "rotate":
                    raise ApiError(404, f"unknown log action {parts[4]}")
                store.rotate_log(ns, pod, container)
                self._json(200, {"rotated": True})
                return
            lines = body.get("lines")
            if not isinstance(lines, list):
                raise ApiError.bad_request('body must be {"lines": [...], "time": RFC3339?}')
            when = parse_time(body["time"]) if body.get("time") else None
            kept = store.append_log(ns, pod, container, [str(x) for x in lines], when)
            self._json(200, {"lines": kept})
            return
        if parts == ["state"] and self.command == "GET":
            self._json(
                200,
                {
                    "resourceVersion": store.resource_version,
                    "oldestRetained": store.oldest_retained,
                    "time": self.sim.clock.now().isoformat(),
                },
            )
            return
        raise ApiError(404, f"unknown admin path {path}")


class Simulator:
    """A protocol-faithful Kubernetes API server in one process, for demos, tests and benchmarks.

    >>> with Simulator() as sim:
    ...     url = sim.start()
    """

    def __init__(
        self,
        resources: Sequence[ResourceType] | Registry | None = None,
        clock: Clock | None = None,
        settings: SimulatorSettings | None = None,
        *,
        watch_window: int | None = None,
    ) -> None:
        self.settings = settings or SimulatorSettings()
        if watch_window is not None:
            from dataclasses import replace

            self.settings = replace(self.settings, watch_window=watch_window)
        if isinstance(resources, Registry):
            self.registry = resources
        else:
            self.registry = Registry(types=tuple(resources)) if resources is not None else Registry()
        self.clock: Clock = clock or SystemClock()
        self.store = Store(
            self.registry,
            self.clock,
            StoreSettings(
                watch_window=self.settings.watch_window,
                log_max_bytes=self.settings.log_max_bytes,
                seed=self.settings.seed,
                event_ttl_s=self.settings.event_ttl_s,
            ),
        )
        self.faults = Faults(seed=self.settings.seed)
        # Requests served, by (verb, resource plural): tests count lists, watches and relists here.
        # "too-large" counts 504 Too large resource version answers.
        self.requests: Counter[tuple[str, str]] = Counter()
        # The latest requests with their query parameters (verb, resource, {param: value}).
        self.request_log: deque[tuple[str, str, dict[str, str]]] = deque(maxlen=10_000)
        self._count_lock = threading.Lock()
        self._server: SimulatorServer | None = None
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None
        self._stopping = threading.Event()

    def count(self, verb: str, resource: str, query: dict[str, list[str]] | None = None) -> None:
        with self._count_lock:
            self.requests[(verb, resource)] += 1
            if query is not None:
                self.request_log.append((verb, resource, {k: v[0] for k, v in query.items() if v}))

    def served(self, verb: str, resource: str | None = None) -> int:
        """Requests of `verb` served so far (for one resource plural, or all)."""
        with self._count_lock:
            return sum(n for (v, r), n in self.requests.items() if v == verb and (resource is None or r == resource))

    def start(self, address: str = "127.0.0.1:0") -> str:
        """Serve on `host:port` (port 0 picks a free one) in a background thread; returns the base URL."""
        if self._server is not None:
            return self.base_url
        host, _, port = address.rpartition(":")
        self._server = SimulatorServer((host or "127.0.0.1", int(port or 0)), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="k8s-simulator",
            daemon=True,
        )
        self._thread.start()
        if self.settings.event_ttl_s is not None:
            self._sweeper = threading.Thread(target=self._sweep, name="k8s-simulator-ttl", daemon=True)
            self._sweeper.start()
        return self.base_url

    def _sweep(self) -> None:
        """Expire Events as the (scenario) clock passes their TTL; a manual clock is read each turn."""
        while not self._stopping.wait(0.05):
            self.store.expire_events()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("simulator not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def restore_store(self) -> Store:
        """The API server's etcd is restored from an older backup (or swapped for another): a fresh,
        empty store behind the same address. Open watches on the old store end; requests from a
        resourceVersion the new store has not reached get "Too large resource version". Returns it."""
        old = self.store
        # New objects get new uids (the API server draws them at random): continuing the old store's
        # uid sequence would give a new object the uid of another, older one.
        fresh_uids = dataclasses.replace(old.settings, seed=old.settings.seed + 1_000_003)
        self.store = Store(self.registry, self.clock, fresh_uids)
        old.close()
        return self.store

    def close(self) -> None:
        """End every watch, stop serving and close the listening socket."""
        self._stopping.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
            self._sweeper = None
        self.store.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.drop_all()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Convenience for in-process callers (tests, benchmarks): same code path as the HTTP handlers.
    def resource(self, api_version: str, kind: str) -> ResourceType:
        """The registered type for apiVersion/kind (KeyError when unknown)."""
        rt = self.registry.for_kind(api_version, kind)
        if rt is None:
            raise KeyError(f"{api_version} {kind} is not served")
        return rt

    def apply(self, obj: Obj) -> Obj:
        """Create `obj`, or replace its spec/metadata and then status when it exists (store path)."""
        rt = self.resource(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            current = self.store.get(rt, ns, name)
        except ApiError:
            current = self.store.create(rt, ns, obj)
        else:
            body = {**obj, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
            current = self.store.replace(rt, ns, name, body)
        if rt.status_subresource and "status" in obj:
            current = self.store.replace(rt, ns, name, {**current, "status": obj["status"]}, subresource="status")
        return current

    def iter_objects(self, api_version: str, kind: str, namespace: str = "") -> Iterator[Obj]:
        """Current objects of a kind (read-only)."""
        yield from self.store.list_page(self.resource(api_version, kind), namespace).items
