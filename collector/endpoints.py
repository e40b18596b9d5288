"""The HTTP endpoints of the controller (/metrics, /healthz, /readyz) and of the node agent
(/metrics, /evidence and the same probes): one bounded server (docs/security.md).

Anyone who can reach the port can talk to it, so the server is bounded in threads, memory and
time. One thread accepts connections and reads requests without blocking (a selector): a TLS
handshake and the request head must complete within `header_timeout_s`, the head is capped in
size, and at most `max_pending` connections wait at once (the oldest is dropped past that), so
half-open or slow clients cost a file descriptor each, never a thread. Only a complete request
reaches a worker. The probes (`probes`, the kubelet's) have workers of their own: clients that ask
for a fleet-size /metrics and never read it hold the main pool, never the liveness probe. Every
answer is written within one deadline (`timeout_s`, `probe_timeout_s`) for all its bytes, however
slowly the client reads. A client that goes away mid-answer is logged at debug level, never as a
traceback.

Optional TLS (certificate and key files) and bearer-token authentication for the `protected`
paths (a token file, as kube-rbac-proxy and the Prometheus Operator's `bearerTokenFile` use); the
probes stay open, as the kubelet calls them without a token.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import io
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

log = logging.getLogger("taugrid.http")

# (status, content type, body) for a path; the controller and the agent supply one per endpoint.
Answer = tuple[int, str, bytes]
Endpoint = Callable[[], Answer]


@dataclass(frozen=True, slots=True)
class WithQuery:
    """An endpoint that reads the request's query string (the agent's `/evidence?epoch=E&poll=P`)."""

    answer: Callable[[str], Answer]


@dataclass(frozen=True, slots=True)
class WithPath:
    """An endpoint for a path and everything under it (`/runs` and `/runs/NS/NAME`), given the path."""

    answer: Callable[[str], Answer]


MAX_HEAD_BYTES = 16 * 1024  # request line and headers of a GET


@dataclass(frozen=True, slots=True)
class HttpOptions:
    workers: int = 4  # threads answering complete requests
    queue_max: int = 64  # complete requests waiting for a worker; more are answered 503
    max_pending: int = 256  # connections still handshaking or sending their request head
    header_timeout_s: float = 5.0  # to finish the TLS handshake and the request head
    timeout_s: float = 10.0  # to write a whole answer, however slowly the client reads
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    token_file: Path | None = None  # a bearer token the protected paths require (re-read when it changes)
    protected: frozenset[str] = frozenset({"/metrics"})
    # The kubelet's probes: answered by workers of their own, never queued behind /metrics.
    probes: frozenset[str] = frozenset({"/healthz", "/readyz"})
    probe_workers: int = 2
    probe_timeout_s: float = 2.0  # to write a probe's answer (a few bytes)


class _Token:
    """The expected bearer token, re-read from its file when the file changes (rotation)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._value = b""
        self._lock = threading.Lock()
        self.read()  # fail at start, not at the first scrape

    def read(self) -> bytes:
        with self._lock:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                value = self.path.read_bytes().strip()
                if not value:
                    raise ValueError(f"{self.path}: empty token file")
                self._value, self._stamp = value, stamp
            return self._value

    def allows(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        try:
            expected = self.read()
        except (OSError, ValueError):
            return False  # fail closed when the token file is gone
        return hmac.compare_digest(header[len("Bearer "):].strip().encode(), expected)


@dataclass(slots=True)
class _Pending:
    sock: socket.socket
    address: Any
    deadline: float
    handshaking: bool
    buf: bytearray


@dataclass(frozen=True, slots=True)
class _Request:
    sock: socket.socket
    head: bytes
    deadline_s: float  # to write the whole answer


class _Writer(io.BufferedIOBase):
    """Writes an answer within one deadline for all its bytes (header and body alike). A socket
    timeout bounds each send, not the answer: a client reading a little at a time (or TLS, whose
    sendall applies the timeout to each record) would otherwise hold the worker without end."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._seconds = seconds
        self._deadline: float | None = None  # from the first byte written: rendering is not writing

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self._deadline is None:
            self._deadline = time.monotonic() + self._seconds
        with memoryview(b) as view, view.cast("B") as data:
            sent = 0
            while sent < len(data):
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("answer not written within its deadline")
                self._sock.settimeout(left)
                sent += self._sock.send(data[sent:sent + (1 << 18)])
            return len(data)


class BoundedHTTPServer:
    """A small HTTP/1.0 server: non-blocking accept and request reading, a fixed worker pool."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], options: HttpOptions,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.options = options
        self.handler = handler
        self.ssl_context = ssl_context
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(128)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        # shutdown() writes a byte here so the selector loop sees the stop at once, not on its next turn.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._queue: queue.Queue[_Request | None] = queue.Queue(maxsize=options.queue_max)
        self._probe_queue: queue.Queue[_Request | None] = queue.Queue(maxsize=options.queue_max)
        self._pending: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.dropped = 0  # connections closed unanswered: too slow, too many, too big, queue full
        self._workers = [threading.Thread(target=self._work, args=(self._queue,), name=f"http-{i}", daemon=True)
                         for i in range(options.workers)]
        self._workers += [threading.Thread(target=self._work, args=(self._probe_queue,), name=f"http-probe-{i}",
                                           daemon=True) for i in range(max(1, options.probe_workers))]
        for t in self._workers:
            t.start()

    # --- the selector loop ---------------------------------------------------------------------

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.fileobj is self.socket:
                        self._accept(sel)
                    elif key.fileobj is self._wake_r:
                        continue  # shutdown: the loop's condition ends it
                    else:
                        self._readable(sel, key.fd)
                self._expire(sel)
        finally:
            for p in list(self._pending.values()):
                self._drop(sel, p, count=False)
            sel.close()
            self._stopped.set()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(64):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: try again on the next turn
                log.warning("accept failed", extra={"error": str(e)})
                return
            sock.setblocking(False)
            handshaking = False
            if self.ssl_context is not None:
                try:
                    sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ssl.SSLError):
                    sock.close()
                    continue
                handshaking = True
            p = _Pending(sock, address, time.monotonic() + self.options.header_timeout_s, handshaking, bytearray())
            self._pending[sock.fileno()] = p
            sel.register(sock, selectors.EVENT_READ)
            while len(self._pending) > self.options.max_pending:
                self._drop(sel, next(iter(self._pending.values())))

    def _readable(self, sel: selectors.BaseSelector, fd: int) -> None:
        p = self._pending.get(fd)
        if p is None:
            return
        try:
            if p.handshaking:
                assert isinstance(p.sock, ssl.SSLSocket)
                p.sock.do_handshake()
                p.handshaking = False
            while True:
                chunk = p.sock.recv(4096)
                if not chunk:
                    self._drop(sel, p, count=False)
                    return
                p.buf += chunk
                if b"\r\n\r\n" in p.buf or b"\n\n" in p.buf:
                    break
                if len(p.buf) > MAX_HEAD_BYTES:
                    self._drop(sel, p)
                    return
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            return  # more to come
        except (OSError, ssl.SSLError) as e:
            log.debug("connection ended", extra={"error": str(e)})
            self._drop(sel, p, count=False)
            return
        sel.unregister(p.sock)
        del self._pending[fd]
        head = bytes(p.buf)
        if _path(head) in self.options.probes:
            q, deadline_s = self._probe_queue, self.options.probe_timeout_s
        else:
            q, deadline_s = self._queue, self.options.timeout_s
        try:
            q.put_nowait(_Request(p.sock, head, deadline_s))
        except queue.Full:
            self.dropped += 1
            _close(p.sock)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            self._drop(sel, oldest)

    def _drop(self, sel: selectors.BaseSelector, p: _Pending, *, count: bool = True) -> None:
        self._pending.pop(p.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(p.sock)
        if count:
            self.dropped += 1
        _close(p.sock)

    # --- workers ---------------------------------------------------------------------------------

    def _work(self, requests: queue.Queue[_Request | None]) -> None:
        while True:
            req = requests.get()
            if req is None:
                return
            try:
                req.sock.setblocking(True)
                req.sock.settimeout(req.deadline_s)
                self.handler(req, _peer(req.sock), self)  # type: ignore[arg-type]
            except (OSError, ssl.SSLError) as e:  # the client went away: nothing to report
                log.debug("connection ended", extra={"error": str(e)})
            except Exception:
                log.exception("request failed")
            finally:
                _close(req.sock)

    def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # full or closed: the loop wakes anyway within 0.2 s
            self._wake_w.send(b"\0")
        self._stopped.wait(5)

    def server_close(self) -> None:
        self._stop.set()
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()
        for t in self._workers:
            q = self._probe_queue if t.name.startswith("http-probe-") else self._queue
            try:
                q.put_nowait(None)
            except queue.Full:
                continue


def _path(head: bytes) -> str:
    """The path of a request head's first line (`GET /healthz?x HTTP/1.1` → `/healthz`)."""
    line = head.split(b"\n", 1)[0].split(b" ")
    return line[1].split(b"?", 1)[0].decode("latin-1") if len(line) >= 2 else ""


def _peer(sock: socket.socket) -> Any:
    try:
        return sock.getpeername()
    except OSError:
        return ("?", 0)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _lookup(endpoints: Mapping[str, Endpoint | WithQuery | WithPath], path: str,
            ) -> Endpoint | WithQuery | WithPath | None:
    found = endpoints.get(path)
    if found is not None:
        return found
    parent = path
    while "/" in parent.rstrip("/"):  # /runs/a/b → /runs/a → /runs
        parent = parent.rstrip("/").rpartition("/")[0]
        found = endpoints.get(parent)
        if isinstance(found, WithPath):
            return found
    return None


def _protected(protected: frozenset[str], path: str) -> bool:
    return path in protected or any(path.startswith(p + "/") for p in protected)


def serve(host: str, port: int, endpoints: Mapping[str, Endpoint | WithQuery | WithPath],
          options: HttpOptions | None = None) -> BoundedHTTPServer:
    """A bound server; call `serve_forever` in a thread, `shutdown` then `server_close` to stop."""
    opts = options or HttpOptions()
    token = _Token(opts.token_file) if opts.token_file is not None else None
    context: ssl.SSLContext | None = None
    if opts.tls_cert_file is not None or opts.tls_key_file is not None:
        if opts.tls_cert_file is None or opts.tls_key_file is None:
            raise ValueError("TLS needs both a certificate file and a private key file")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a worker is never held idle
        server_version = "taugrid-evidence"
        sys_version = ""

        def setup(self) -> None:
            req: _Request = self.request
            self.connection = req.sock
            self.rfile = io.BytesIO(req.head)  # the whole request: a GET has no body
            self.wfile = _Writer(req.sock, req.deadline_s)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def do_GET(self) -> None:  # noqa: N802
            path, _, query = self.path.partition("?")
            endpoint = _lookup(endpoints, path)
            if endpoint is None:
                code, ctype, body = 404, "text/plain", b"not found\n"
            elif token is not None and _protected(opts.protected, path) and not token.allows(
                    self.headers.get("Authorization")):
                code, ctype, body = 401, "text/plain", b"unauthorized\n"
            elif isinstance(endpoint, WithQuery):
                code, ctype, body = endpoint.answer(query)
            elif isinstance(endpoint, WithPath):
                code, ctype, body = endpoint.answer(path)
            else:
                code, ctype, body = endpoint()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="taugrid-evidence"')
            self.end_headers()
            self.wfile.write(body)

    return BoundedHTTPServer((host, port), Handler, opts, context)
