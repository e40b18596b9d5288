"""The simulator's HTTP front: the Simulator, its server, and the request handler's routing and
resource verbs (get, list, create, update, patch, delete).

The handler's other parts live beside it: plumbing (handlerbase.py), discovery and OpenAPI
(discovery.py), watch and log streams (streaming.py) and the /_sim/ admin API (admin.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import threading
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from kubesim import visibility
from kubesim.admin import AdminHandler
from kubesim.clock import Clock, SystemClock
from kubesim.discovery import DiscoveryHandler
from kubesim.errors import ApiError
from kubesim.faults import Faults
from kubesim.handlerbase import Dropped, Route, accept_table, log, qs, qs_bool, qs_int, too_large_error
from kubesim.patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, apply_patch
from kubesim.rbac import Rbac
from kubesim.registry import Registry, ResourceType
from kubesim.selectors import build_selector
from kubesim.store import Obj, Store, StoreSettings, TooLarge
from kubesim.streaming import StreamHandler, list_options_error
from kubesim.tables import to_table

__all__ = ["BUILTIN_GROUPS", "Simulator", "SimulatorServer", "SimulatorSettings", "too_large_error"]

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
    # The WatchList feature gate (streaming lists: sendInitialEvents=true on a watch): None follows
    # git_version (on by default from 1.32, where it went beta; 1.27-1.31 servers answer such a
    # watch 422 Invalid unless it was turned on).
    watch_list: bool | None = None
    # Events are deleted this many scenario seconds after their last write (kube-apiserver
    # --event-ttl, 1 h by default there); None keeps them for ever.
    event_ttl_s: float | None = None


ETCD_FUTURE_REVISION = "etcdserver: mvcc: required revision is a future revision"


def _minor_at_least(git_version: str, minor: int) -> bool:
    """Whether a reported `v1.N...` version is 1.`minor` or later (an unparsable one counts as new)."""
    m = re.match(r"v?(\d+)\.(\d+)", git_version)
    return m is None or (int(m[1]), int(m[2])) >= (1, minor)


def _exact_lists_from_cache(git_version: str) -> bool:
    """Whether the reported Kubernetes version serves resourceVersionMatch=Exact lists from its watch
    cache (1.34 on: ListFromCacheSnapshot, beta and on by default, with an etcd that supports
    consistent reads): a version ahead of the cache then waits and is answered like NotOlderThan.
    Older versions send Exact lists to etcd. An unparsable version counts as new."""
    m = re.match(r"v?(\d+)\.(\d+)", git_version)
    return m is None or (int(m[1]), int(m[2])) >= (1, 34)


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


class _Handler(DiscoveryHandler, StreamHandler, AdminHandler):
    """One request: routed to discovery, the admin API, or a resource verb."""

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
            user = self.sim.rbac.authenticate(self.headers.get("Authorization"))
            if self.command in ("GET", "HEAD") and self._discovery(path):
                return  # every authenticated user may read discovery (system:discovery)
            vis = visibility.route(path)
            if vis is not None:  # Kueue's aggregated visibility API: a read computed from the queues
                self.sim.rbac.authorize(user, "get", visibility.GROUP, vis.plural, visibility.SUBRESOURCE,
                                        vis.namespace, vis.name)
                if self.command not in ("GET", "HEAD"):
                    raise ApiError(405, "the server does not allow this method on the requested resource")
                self.sim.count("get", f"{vis.plural}/{visibility.SUBRESOURCE}", query)
                self._json(200, visibility.summary(self.sim.store, self.sim.registry, vis, query))
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
            logs = route.verb == "logs"  # RBAC's name for it: get pods/log
            try:
                self.sim.rbac.authorize(user, "get" if logs else route.verb, route.rt.group, route.rt.plural,
                                        "log" if logs else route.subresource, route.namespace, route.name)
            except ApiError:
                self._body()  # a refused write's body is read: the connection stays usable
                raise
            self._serve(route, query)
        except ApiError as err:
            self._error(err)
        except Dropped:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # an unexpected bug answers 500 like an API server would
            log.exception("simulator: %s %s failed", self.command, self.path)
            self._error(ApiError(500, f"simulator internal error: {exc!r}"))

    # ------------------------------------------------------------------ routing
    def _route(self, path: str, query: dict[str, list[str]]) -> Route | None:
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
            if watch_path or (verb == "get" and qs_bool(query, "watch")):
                verb = "watch"
        else:
            verb = {"GET": "list", "HEAD": "list", "POST": "create", "DELETE": "deletecollection"}.get(method, "")
            if not verb:
                raise ApiError(405, f"the server does not allow this method on the requested resource ({method})")
            if verb == "list" and (watch_path or qs_bool(query, "watch")):
                verb = "watch"
        return Route(rt, namespace, name, sub, verb)

    # ------------------------------------------------------------------ resources
    def _serve(self, r: Route, query: dict[str, list[str]]) -> None:
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
        table = accept_table(self.headers.get("Accept", ""))
        include = qs(query, "includeObject") or "Metadata"
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
            invalid = list_options_error(query)
            if invalid is not None:
                raise invalid
            sel = build_selector(qs(query, "labelSelector"), qs(query, "fieldSelector"), rt.field_path)
            args = (
                rt,
                r.namespace,
                sel,
                qs_int(query, "limit") or 0,
                qs(query, "continue"),
                qs(query, "resourceVersion"),
                qs(query, "resourceVersionMatch"),
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
            policy = qs(query, "propagationPolicy") or opts.get("propagationPolicy") or "Background"
            grace_raw = qs(query, "gracePeriodSeconds") or opts.get("gracePeriodSeconds")
            try:
                grace = int(grace_raw) if grace_raw not in (None, "") else None
            except (TypeError, ValueError):
                raise ApiError.bad_request(f"gracePeriodSeconds: not an integer: {grace_raw!r}") from None
            obj = store.delete(
                rt,
                r.namespace,
                r.name,
                uid=pre.get("uid") or "",
                resource_version=pre.get("resourceVersion") or "",
                propagation=policy,
                dry_run=dry_run or bool(opts.get("dryRun")),
                grace_seconds=grace,
            )
            self._json(200, obj)
        elif r.verb == "deletecollection":
            self._body()
            sel = build_selector(qs(query, "labelSelector"), qs(query, "fieldSelector"), rt.field_path)
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

    def _bind(self, r: Route, body: Any) -> None:
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
        self.rbac = Rbac()  # off until a user is added (kubesim/rbac.py)
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
        self._tls_servers: list[tuple[SimulatorServer, threading.Thread]] = []

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
    def watch_list(self) -> bool:
        """Whether streaming lists (a watch with sendInitialEvents) are served (SimulatorSettings.watch_list)."""
        gate = self.settings.watch_list
        return _minor_at_least(self.settings.git_version, 32) if gate is None else gate

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("simulator not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start_tls(self, cert_file: str, key_file: str, address: str = "127.0.0.1:0") -> str:
        """Also serve the same API over HTTPS (PEM certificate and key) on another port; returns its
        base URL. Clients send bearer tokens only over TLS, as to a real API server (kubectl drops
        them on plain HTTP): the users of `rbac` are reached here; `start`'s URL stays the admin's."""
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        host, _, port = address.rpartition(":")
        server = SimulatorServer((host or "127.0.0.1", int(port or 0)), self)
        # The handshake happens in the request's own thread, not in the accepting one.
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name="k8s-simulator-tls", daemon=True)
        thread.start()
        self._tls_servers.append((server, thread))
        bound_host, bound_port = server.server_address[:2]
        return f"https://{bound_host!s}:{bound_port}"

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
        for server, thread in self._tls_servers:
            server.shutdown()
            server.drop_all()
            server.server_close()
            thread.join(timeout=5)
        self._tls_servers.clear()

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
