"""The controller's HTTP endpoints: /metrics, /healthz, /readyz (docs/security.md).

Anyone who can reach the port can talk to it, so the server is bounded: a fixed pool of worker
threads serves connections (a queue of at most `backlog` waits for them; past that, new
connections are closed at once), every socket has a read/write timeout, a request line and its
headers are capped, and a client that goes away mid-answer is not an error worth a traceback.
Optional TLS (certificate and key files) and bearer-token authentication for /metrics (a token
file, as kube-rbac-proxy and the Prometheus Operator's `bearerTokenFile` use); the probes stay
open, as the kubelet calls them without a token.
"""

from __future__ import annotations

import hmac
import logging
import queue
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("taugrid.http")

# (status, content type, body) for a path; the controller supplies one per endpoint.
Endpoint = Callable[[], tuple[int, str, bytes]]


@dataclass(frozen=True, slots=True)
class HttpOptions:
    workers: int = 4  # threads serving connections
    backlog: int = 32  # accepted connections waiting for a worker; more are closed at once
    timeout_s: float = 10.0  # per socket read/write: a half-open client frees its worker after this
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    token_file: Path | None = None  # a bearer token /metrics requires (re-read when it changes)
    protected: frozenset[str] = frozenset({"/metrics"})


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


class BoundedHTTPServer(HTTPServer):
    """HTTPServer whose connections are served by a fixed pool of threads."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], options: HttpOptions,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.options = options
        self.ssl_context = ssl_context
        self._queue: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(maxsize=options.backlog)
        self._workers: list[threading.Thread] = []
        self.refused = 0  # connections closed because every worker and queue slot was taken
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, handler)
        for i in range(options.workers):
            t = threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self._queue.put_nowait((request, client_address))
        except queue.Full:
            self.refused += 1
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, client_address = item
            try:
                request.settimeout(self.options.timeout_s)
                if self.ssl_context is not None:
                    # The handshake runs here, in a worker with a timeout, not in the accept loop.
                    request = self.ssl_context.wrap_socket(request, server_side=True)
                self.finish_request(request, client_address)
            except (OSError, ssl.SSLError) as e:
                log.debug("connection ended", extra={"client": str(client_address[0]), "error": str(e)})
            except Exception:
                log.exception("request failed", extra={"client": str(client_address[0])})
            finally:
                self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error", extra={"client": str(client_address[0])})

    def server_close(self) -> None:
        super().server_close()
        for _ in self._workers:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break


def serve(host: str, port: int, endpoints: dict[str, Endpoint], options: HttpOptions | None = None,
          ) -> BoundedHTTPServer:
    """A bound server (not yet serving: call `serve_forever` in a thread)."""
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
        timeout = opts.timeout_s
        protocol_version = "HTTP/1.0"  # one request per connection: a worker is never held idle

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            endpoint = endpoints.get(path)
            if endpoint is None:
                code, ctype, body = 404, "text/plain", b"not found\n"
            elif token is not None and path in opts.protected and not token.allows(
                    self.headers.get("Authorization")):
                code, ctype, body = 401, "text/plain", b"unauthorized\n"
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
