"""Raw-JSON access to a Kubernetes API through the official client's transport.

The client's model deserialization costs ~10× the decode itself (TOOLS.md), so lists, watches
and logs go through `ApiClient.param_serialize`/`call_api` (auth, TLS, proxies as configured) and
the bytes are decoded with orjson. Errors are split into retryable and permanent ones.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import orjson
import urllib3

from collector.kube import NODE_LEASE_NAMESPACE
from collector.settings import TauGridContract
from collector.sources.chunked import FramingError, StreamEnded, chunked_lines
from collector.sources.decode import FULL, Decoder, listed
from collector.sources.kube_client import (
    ApiClient,
    ApiException,
    Configuration,
    load_incluster_config,
    load_kube_config,
)
from collector.sources.listbody import READ_SIZE, ItemTooLarge, ListBody, ListSyntaxError, ListTruncated, NotAList

JSON = dict[str, Any]


class SourceError(Exception):
    """An I/O failure at the Kubernetes boundary."""

    retryable = True
    retry_after: float | None = None  # seconds the server asked us to wait (429/503 Retry-After)
    code = 0  # the HTTP status the server answered (0: no answer)
    status: JSON | None = None  # the Status object it answered with, when it sent one


class RetryableSourceError(SourceError):
    """Connection refused or cut, timeouts, 429, 5xx: try again after a backoff."""


class PermanentSourceError(SourceError):
    """401/403/404/422: retrying soon will not help (missing RBAC, API absent)."""

    retryable = False


class Expired(RetryableSourceError):
    """410 Gone: the resourceVersion is older than the server keeps; relist. Also "Too large
    resource version" (504): the server's store is behind ours, as after a restore; relist."""


class Unreachable(RetryableSourceError):
    """No answer at all (refused, reset, timed out): when it answers again it may be another
    server or another store, so the reflector relists instead of resuming its watch."""


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header's seconds (the delta form Kubernetes sends); None when absent or odd."""
    if not value:
        return None
    try:
        secs = float(value.strip())
    except ValueError:
        return None
    return min(secs, 300.0) if secs >= 0 else None  # bounded: a hostile value cannot park us for ever


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True
    optional: bool = True  # absent APIs (no Kueue, no KubeRay) are skipped, not errors
    namespace: str = ""  # watched in this namespace only ("": all of them)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{self.namespace}/{self.plural}" if self.namespace else f"{base}/{self.plural}"

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


# What the collector watches. Kueue, KubeRay, training operators, DRA, Karpenter and TauGrid may be
# absent: optional resources are discovered, and an absent one is a note, not an error.
DEFAULT_RESOURCES: tuple[Resource, ...] = (
    Resource("Pod", "", "v1", "pods", optional=False),
    Resource("Node", "", "v1", "nodes", namespaced=False, optional=False),
    Resource("Event", "events.k8s.io", "v1", "events", optional=False),
    Resource("Job", "batch", "v1", "jobs", optional=False),
    Resource("Workload", "kueue.x-k8s.io", "v1beta1", "workloads"),
    Resource("LocalQueue", "kueue.x-k8s.io", "v1beta1", "localqueues"),
    Resource("ClusterQueue", "kueue.x-k8s.io", "v1beta1", "clusterqueues", namespaced=False),
    Resource("RayJob", "ray.io", "v1", "rayjobs"),
    Resource("RayCluster", "ray.io", "v1", "rayclusters"),
    Resource("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
    Resource("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
    Resource("TauRun", "taugrid.io", "v1alpha1", "tauruns"),
    Resource("TauCluster", "taugrid.io", "v1alpha1", "tauclusters", namespaced=False),
    Resource("TauWorkspace", "taugrid.io", "v1alpha1", "tauworkspaces"),
    Resource("AdmissionCheck", "kueue.x-k8s.io", "v1beta1", "admissionchecks", namespaced=False),
    Resource("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims"),
    Resource("NodeClaim", "karpenter.sh", "v1", "nodeclaims", namespaced=False),
    # Kubelets' node Leases: renewed every 10 s on each node's own clock, they say how far it runs
    # ahead (collector/nodeclock.py). Only kube-node-lease: other Leases are tenants' own.
    Resource("Lease", "coordination.k8s.io", "v1", "leases", namespace=NODE_LEASE_NAMESPACE),
)


def resources_for(contract: TauGridContract) -> tuple[Resource, ...]:
    """DEFAULT_RESOURCES with TauGrid's kinds at the group/version and names the contract says."""
    names = {"TauRun": contract.run_kind, "TauCluster": contract.cluster_kind,
             "TauWorkspace": contract.workspace_kind}
    out = []
    for r in DEFAULT_RESOURCES:
        if r.group == "taugrid.io":
            kind = names[r.kind]
            r = Resource(kind, contract.group, contract.version, kind.lower() + "s", r.namespaced, r.optional)
        out.append(r)
    return tuple(out)


# Kinds whose absence from a cluster dump leaves a plane unseen, with the plural `kubectl get` takes.
DUMP_KINDS: tuple[tuple[str, str], ...] = tuple((r.kind, r.plural) for r in DEFAULT_RESOURCES
                                                if r.kind not in ("Pod", "Node", "Event") and not r.namespace)


def missing_kinds(present: set[str], directory: str) -> dict[str, Any]:
    """Which run-relevant kinds a dump lacks, and the one command that adds them."""
    kinds = [(k, p) for k, p in DUMP_KINDS if k not in present]
    return {"kinds": [k for k, _ in kinds],
            "command": f"kubectl get {','.join(p for _, p in kinds)} -A -o json > {directory}/crds.json"
                       " (leave out kinds the cluster does not serve)"}


# One connection per watch plus log reads and the lease: urllib3's default pool of 10 is too small.
POOL_SIZE = 64


def _configuration() -> Configuration:
    configuration = Configuration()
    configuration.connection_pool_maxsize = POOL_SIZE
    # No retries inside urllib3: it would sleep out a 429's Retry-After (any length, not
    # interruptible at shutdown, never counted) and hide a dead server behind three silent tries.
    # The reflectors retry with backoff, bounded Retry-After, error counts and a stop check.
    configuration.retries = False
    return configuration


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """A client from a kubeconfig file, or the in-cluster service account when none is given."""
    configuration = _configuration()
    if kubeconfig:
        load_kube_config(kubeconfig, context, configuration)
    else:
        load_incluster_config(client_configuration=configuration)
    return ApiClient(configuration)


def api_client_for(host: str) -> ApiClient:
    configuration = _configuration()
    configuration.host = host
    return ApiClient(configuration)


TOO_LARGE_CAUSE = "ResourceVersionTooLarge"  # metav1.CauseTypeResourceVersionTooLarge
_TOO_LARGE_TEXT = "too large resource version"


def is_too_large_rv(code: Any, status: Any) -> bool:
    """Whether an error Status (`code`, and the decoded Status object or None) says our resourceVersion
    is ahead of the server's store. Read as client-go's reflector reads it: a `ResourceVersionTooLarge`
    cause (API servers 1.18.6 on); else, on a 504 Timeout only, a cause or message with the words
    "Too large resource version" (1.17.0 to 1.18.5 sent the cause without its reason; older ones
    only the message)."""
    if not isinstance(status, dict):
        return False
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    causes = [c for c in causes if isinstance(c, dict)] if isinstance(causes, list) else []
    if any(c.get("reason") == TOO_LARGE_CAUSE for c in causes):
        return True
    if code != 504 and status.get("reason") != "Timeout":
        return False
    return any(_TOO_LARGE_TEXT in str(c.get("message") or "").lower() for c in causes) or (
        _TOO_LARGE_TEXT in str(status.get("message") or "").lower())


def classify(status: int, body: bytes, what: str, *, retry_after: str | None = None) -> SourceError:
    message = ""
    doc: Any = None
    try:
        doc = orjson.loads(body) if body else {}
        message = str(doc.get("message") or "") if isinstance(doc, dict) else ""
    except orjson.JSONDecodeError:
        message = body[:200].decode("utf-8", "replace")
    text = f"{what}: HTTP {status}" + (f": {message}" if message else "")
    err: SourceError
    if status == 410 or is_too_large_rv(status, doc if isinstance(doc, dict) else {"message": message}):
        err = Expired(text)
    elif status in (429,) or status >= 500:
        err = RetryableSourceError(text)
        err.retry_after = retry_after_s(retry_after)
    else:
        err = PermanentSourceError(text)
    err.code = status
    err.status = doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None
    return err


class LogApi(Protocol):
    """What reads a pod's log (`GET pod_log_path(...)`): `KubeApi`, or a test's double."""

    def get_text(self, path: str, query: Sequence[tuple[str, Any]] = ()) -> bytes: ...


def pod_log_path(namespace: str, pod: str) -> str:
    """The API path of a pod's log (the kubelet's, proxied by the API server)."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/log"


class KubeApi:
    """GET-only access (plus Lease writes for leader election) returning raw JSON."""

    def __init__(self, api: ApiClient, *, request_timeout: float = 30.0) -> None:
        self.api = api
        self.request_timeout = request_timeout
        self._lock = threading.Lock()
        self.clock = ServerClock()

    def _saw_date(self, value: str | None) -> None:
        if value:
            self.clock.observe(value)

    def _call(self, method: str, path: str, query: Sequence[tuple[str, Any]] = (), *, body: Any = None,
              read_timeout: float | None = None, stream: bool = False) -> Any:
        m, url, headers, body_, post = self.api.param_serialize(
            method, path, query_params=list(query), header_params={"Accept": "application/json",
                                                                   **({"Content-Type": "application/json"}
                                                                      if body is not None else {})},
            body=body, auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(m, url, header_params=headers, body=body_, post_params=post,
                                     _request_timeout=(5.0, read_timeout or self.request_timeout))
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unreachable(f"{method} {path}: {type(e).__name__}: {e}") from e
        except ApiException as e:
            raise classify(e.status or 0, (e.body or "").encode() if isinstance(e.body, str) else e.body or b"",
                           f"{method} {path}", retry_after=(e.headers or {}).get("Retry-After")) from e
        raw: urllib3.BaseHTTPResponse = resp.response
        self._saw_date(raw.headers.get("Date"))
        if resp.status >= 400:
            try:
                data = raw.read()
            finally:
                raw.release_conn()
            raise classify(resp.status, data, f"{method} {path}", retry_after=raw.headers.get("Retry-After"))
        if stream:
            return raw
        try:
            return raw.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise RetryableSourceError(f"{method} {path}: body cut: {e}") from e
        finally:
            raw.release_conn()

    def get_json(self, path: str, query: Sequence[tuple[str, Any]] = ()) -> JSON:
        data = self._call("GET", path, query)
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise RetryableSourceError(f"GET {path}: not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise PermanentSourceError(f"GET {path}: expected an object")
        return doc

    def write_json(self, method: str, path: str, body: JSON) -> JSON:
        data = self._call(method, path, body=body)
        doc = orjson.loads(data)
        assert isinstance(doc, dict)
        return doc

    def get_text(self, path: str, query: Sequence[tuple[str, Any]] = ()) -> bytes:
        data = self._call("GET", path, query)
        assert isinstance(data, bytes)
        return data

    def get_stream(self, path: str, query: Sequence[tuple[str, Any]] = ()) -> Iterator[bytes]:
        """A GET's body in pieces as they arrive, READ_SIZE bytes at most; HTTP errors raise here,
        a connection cut while reading raises RetryableSourceError from the iterator."""
        return _pieces(path, self._call("GET", path, query, stream=True))

    def list_pages(self, resource: Resource, *, limit: int = 500) -> tuple[list[JSON], str]:
        """Every object of a resource at once; returns (items, list resourceVersion)."""
        listing = self.iter_list(resource, limit=limit)
        items = list(listing)
        return items, listing.resource_version

    def current_version(self, resource: Resource) -> str:
        """The store's current resourceVersion, from a one-item list."""
        meta = self.get_json(resource.path, [("limit", 1)]).get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""

    def iter_list(self, resource: Resource, *, limit: int = 500, decoder: Decoder = FULL) -> Listing:
        """Every object of a resource, one page in memory at a time (see `Listing`)."""
        return Listing(self, resource, limit, decoder)

    def open_watch(self, resource: Resource, resource_version: str, *, timeout_s: int,
                   initial_events: bool = False, read_timeout: float | None = None) -> Any:
        """Start a watch from `resource_version`; the server has accepted it when this returns.

        `initial_events`: a streaming list (WatchList): the current state as ADDED events first, then
        a BOOKMARK annotated `k8s.io/initial-events-end` (`collector.sources.watch`). A server
        without the feature refuses it (422 Invalid). `read_timeout`: the longest wait for data."""
        query: list[tuple[str, Any]] = [("watch", "true"), ("resourceVersion", resource_version),
                                        ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_s)]
        if initial_events:
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        return self._call("GET", resource.path, query, read_timeout=read_timeout or timeout_s + 15, stream=True)

    def watch_lines(self, resource: Resource, raw: Any) -> Iterator[list[bytes]]:
        """Raw watch event lines of an opened watch, a read's worth at a time, until the stream ends."""
        read1 = _chunked_reader(raw)
        if read1 is not None:
            yield from self._framed_lines(resource, raw, read1)
            return
        buf = b""
        try:
            for chunk in raw.stream(65536, decode_content=True):
                lines = (buf + chunk if buf else chunk).split(b"\n")
                buf = lines.pop()  # the last piece is a line still being received
                complete = [line for line in lines if line.strip()]
                if complete:
                    yield complete
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise RetryableSourceError(f"watch {resource.name}: stream cut ({type(e).__name__})"
                                       + (", partial event dropped" if buf else "")) from e
        finally:
            raw.release_conn()
        if buf.strip():
            raise RetryableSourceError(f"watch {resource.name}: stream ended mid-event ({len(buf)} bytes dropped)")

    def _framed_lines(self, resource: Resource, raw: Any, read1: Callable[[int], bytes]) -> Iterator[list[bytes]]:
        """`watch_lines` off the socket: every event that has arrived per read (collector.sources.chunked)."""
        try:
            yield from chunked_lines(read1)
        except StreamEnded as e:
            raise RetryableSourceError(f"watch {resource.name}: stream cut (connection closed"
                                       + (", partial event dropped)" if e.partial else ")")) from e
        except FramingError as e:
            raise RetryableSourceError(f"watch {resource.name}: bad chunked framing: {e}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise RetryableSourceError(f"watch {resource.name}: stream cut ({type(e).__name__})") from e
        finally:
            raw.close()  # the body was read past urllib3: never hand this connection back for reuse
            raw.release_conn()

    def discover(self, resources: Sequence[Resource]) -> tuple[list[Resource], list[str]]:
        """Which of `resources` this server serves; optional absent ones are reported, not fatal."""
        served: dict[str, set[str]] = {}
        notes: list[str] = []
        core = self.get_json("/api/v1")
        served["v1"] = {str(r.get("name")) for r in core.get("resources") or [] if isinstance(r, dict)}
        groups = self.get_json("/apis")
        for g in groups.get("groups") or []:
            for v in g.get("versions") or []:
                gv = str(v.get("groupVersion"))
                if any(r.api_version == gv for r in resources):
                    try:
                        doc = self.get_json(f"/apis/{gv}")
                    except PermanentSourceError:
                        continue
                    served[gv] = {str(r.get("name")) for r in doc.get("resources") or [] if isinstance(r, dict)}
        found: list[Resource] = []
        for r in resources:
            if r.plural in served.get(r.api_version, set()):
                found.append(r)
            elif r.optional:
                notes.append(f"{r.name}/{r.version} not served: {r.kind} evidence absent")
            else:
                raise PermanentSourceError(f"required API {r.api_version} {r.plural} is not served")
        return found, notes


class ServerClock:
    """The API server's clock, from the `Date` header of its answers.

    API timestamps (lastTransitionTime, Lease renewTime, event times) are the server's; a node
    whose clock is off by minutes would otherwise see fresh evidence as stale or the reverse.
    `now()` is the local clock moved by the last offset seen; `Date` has one-second resolution,
    so offsets within a second and a half are taken as no skew.

    A server whose clock runs at another rate (the simulator playing a scenario sped up) is
    followed too: once `Date`s spanning RATE_SPAN_S of local time show a rate off 1 by more than
    RATE_TOLERANCE (far beyond what truncation to the second can make over that span), `now()`
    advances at that rate from the last `Date` instead of lagging until the next answer (and never
    steps back on a truncated one). A real server's rate is 1; nothing changes for it.
    """

    TOLERANCE_S = 1.5
    RATE_SPAN_S = 10.0
    RATE_TOLERANCE = 0.25

    def __init__(self, local: Callable[[], datetime] | None = None) -> None:
        self._local = local or (lambda: datetime.now(UTC))
        self.offset = timedelta(0)
        self.seen = False
        self.rate = 1.0
        self._first: tuple[datetime, datetime] | None = None  # (local, server) at the first Date
        self._last: tuple[datetime, datetime] | None = None  # (local, server) at the latest Date
        self._high: datetime | None = None
        self._lock = threading.Lock()

    def observe(self, date_header: str) -> None:
        try:
            server = parsedate_to_datetime(date_header)
        except (TypeError, ValueError, IndexError):
            return
        if server.tzinfo is None:
            server = server.replace(tzinfo=UTC)
        local = self._local()
        # The header is truncated to the second: the true time lies within [server, server + 1 s).
        server += timedelta(seconds=0.5)
        with self._lock:
            self.seen = True
            offset = server - local
            self.offset = offset if abs(offset.total_seconds()) > self.TOLERANCE_S else timedelta(0)
            if self._first is None or server < self._first[1]:
                self._first = (local, server)  # first sight, or the server's clock was set back
            span = (local - self._first[0]).total_seconds()
            if span >= self.RATE_SPAN_S:
                rate = (server - self._first[1]).total_seconds() / span
                self.rate = rate if abs(rate - 1.0) > self.RATE_TOLERANCE and rate > 0 else 1.0
            self._last = (local, server)

    def now(self) -> datetime:
        local = self._local()
        with self._lock:
            if self.rate == 1.0 or self._last is None:
                self._high = None
                return local + self.offset
            # Each Date is truncated to the second: at a fast rate, never step back on a new one.
            t = self._last[1] + (local - self._last[0]) * self.rate
            if self._high is not None and t < self._high:
                return self._high
            self._high = t
            return t


class Listing:
    """A paginated list, read as it is iterated: only the current page's objects are held, so a
    consumer that keeps small records keeps the process's peak near its steady size. After the
    iteration `resource_version` is the list's (where a watch resumes).

    Unpaginated (`limit` 0: one answer of every object), the answer is read off the socket and
    split item by item (collector.sources.listbody): one item decoded at a time, never the list.
    Objects are dicts, except where the pod decoder reads a pod typed (`decode.listed`: a
    `PodObject`, as a watch frame's; only the reflector's sinks are given that decoder)."""

    def __init__(self, api: KubeApi, resource: Resource, limit: int, decoder: Decoder) -> None:
        self.api, self.resource, self.limit, self.decoder = api, resource, limit, decoder
        self.resource_version = ""
        self.pages = 0

    def __iter__(self) -> Iterator[JSON]:
        token = ""
        while True:
            query: list[tuple[str, Any]] = [("limit", self.limit)] if self.limit else []
            if token:
                query.append(("continue", token))
            meta = yield from (self._page(query) if self.limit else self._streamed(query))
            token = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
            if not token:  # (a server that pages an unpaginated list anyway is followed the same way)
                self.resource_version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
                return

    def _page(self, query: list[tuple[str, Any]]) -> Generator[JSON, None, Any]:
        """One page's objects; returns its metadata."""
        resource = self.resource
        data = self.api.get_text(resource.path, query)
        try:
            doc = self.decoder.page(data)
        except orjson.JSONDecodeError as e:
            raise RetryableSourceError(f"GET {resource.path}: not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise PermanentSourceError(f"GET {resource.path}: expected an object")
        del data
        self.pages += 1
        meta = doc.get("metadata") or {}
        items = doc.get("items") or []
        del doc
        for item in items:
            if (item := listed(item, resource.kind, resource.api_version)) is not None:  # (a pod may come typed)
                yield item
        return meta

    def _streamed(self, query: list[tuple[str, Any]]) -> Generator[JSON, None, Any]:
        """One answer's objects, each decoded as its bytes arrive; returns its metadata. Errors as a
        page's: not JSON (cut short included) is retryable, not a List is not."""
        resource, decode = self.resource, self.decoder.item
        path = resource.path
        pieces = self.api.get_stream(path, query)
        body = ListBody(pieces)
        self.pages += 1
        try:
            for data in body.items():
                try:
                    item = decode(data)
                except orjson.JSONDecodeError as e:
                    raise RetryableSourceError(f"GET {path}: not JSON: {e}") from e
                del data
                if (item := listed(item, resource.kind, resource.api_version)) is not None:
                    yield item
                del item
        except ListSyntaxError as e:
            raise RetryableSourceError(f"GET {path}: not JSON: {e}") from e
        except ListTruncated as e:
            raise RetryableSourceError(f"GET {path}: body cut: {e}") from e
        except NotAList as e:
            raise PermanentSourceError(f"GET {path}: {e}") from e
        except ItemTooLarge as e:
            raise PermanentSourceError(f"GET {path}: {e}: the list fails rather than miss an object") from e
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()  # a generator's: closes the connection if the body was not read to its end
        return body.members.get("metadata") or {}


class Backoff:
    """Capped exponential backoff with full jitter; reset after a success."""

    def __init__(self, base: float = 0.2, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base, self.cap, self.attempt = base, cap, 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        delay = min(self.cap, self.base * (2 ** self.attempt))
        self.attempt = min(self.attempt + 1, 30)
        return self._rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


def _pieces(path: str, raw: Any) -> Iterator[bytes]:
    """An opened answer's body in pieces (`KubeApi.get_stream`)."""
    done = False
    try:
        yield from raw.stream(READ_SIZE, decode_content=True)
        done = True
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise RetryableSourceError(f"GET {path}: body cut: {type(e).__name__}: {e}") from e
    finally:
        if not done:
            raw.close()  # bytes left unread: never hand this connection back for reuse
        raw.release_conn()


def _chunked_reader(raw: Any) -> Callable[[int], bytes] | None:
    """The socket's `read1` under an urllib3 response whose body is plain chunked JSON, read by
    nobody yet; None (read through urllib3's `stream`) for anything else: another transfer or
    content coding, or a urllib3 without the attributes relied on."""
    headers = getattr(raw, "headers", None)
    if headers is None or headers.get("Transfer-Encoding", "").lower() != "chunked":
        return None
    if headers.get("Content-Encoding", "identity").lower() != "identity":
        return None
    fp = getattr(raw, "_fp", None)  # http.client.HTTPResponse, headers parsed, body untouched
    sock_file = getattr(fp, "fp", None)
    if getattr(fp, "chunk_left", None) is not None or not callable(getattr(sock_file, "read1", None)):
        return None
    read1: Callable[[int], bytes] = getattr(sock_file, "read1")  # noqa: B009 (checked callable above)
    return read1
