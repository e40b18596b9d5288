"""One bounded HTTP GET on a connection of its own: the node agents' `/evidence` and Ray heads.

Peers are tenant-run (a Ray head) or reachable by tenants, so the whole exchange has one deadline:
connecting, the TLS handshake, the request, the answer's header and its body. Each socket wait gets
only the time that is left, so a peer that trickles a byte every few seconds is cut at the deadline
(a per-read socket timeout, as urllib3 and http.client apply it, never fires on such a peer). The
answer is bounded in header and body size; `Content-Length`, read-to-close and, where the caller
allows it, `chunked` bodies are read. Nothing else is followed: no redirect, no keep-alive.

Errors are `HttpGetError` naming the URL, `retryable` for transport failures and timeouts.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

HEAD_MAX = 16 << 10  # an answer's status line and headers


class HttpGetError(Exception):
    """`str()`: "<url>: <detail>"; `detail` alone for callers that name the request their own way."""

    def __init__(self, url: str, detail: str, *, retryable: bool = True, connected: bool = True,
                 timed_out: bool = False) -> None:
        super().__init__(f"{url}: {detail}")
        self.detail = detail
        self.retryable = retryable
        self.connected = connected  # False: nothing reached the peer (refused, unreachable, no connection)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # lower-case names; a header given twice keeps the last
    body: bytes


class _Chunked:
    """Incremental `Transfer-Encoding: chunked` decoding of a body that grows in a buffer."""

    def __init__(self) -> None:
        self.pos = 0  # where the next chunk-size line starts, relative to the body
        self.out = bytearray()
        self.done = False

    def feed(self, body: memoryview, url: str) -> None:
        while not self.done:
            end = bytes(body[self.pos:self.pos + 64]).find(b"\r\n")
            if end == -1:
                if len(body) - self.pos >= 64:
                    raise HttpGetError(url, "bad chunk size line", retryable=False)
                return
            size_text = bytes(body[self.pos:self.pos + end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpGetError(url, f"bad chunk size {size_text[:20]!r}", retryable=False) from None
            if size < 0:
                raise HttpGetError(url, f"bad chunk size {size_text[:20]!r}", retryable=False)
            start = self.pos + end + 2
            if size == 0:  # the last chunk; trailers (rare) end at an empty line
                if b"\r\n\r\n" in bytes(body[start - 2:]):
                    self.done = True
                return
            if len(body) < start + size + 2:
                return
            self.out += body[start:start + size]
            self.pos = start + size + 2


def _target(url: str) -> tuple[urllib.parse.SplitResult, int, str]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError as e:
        raise HttpGetError(url, str(e), retryable=False, connected=False) from e
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise HttpGetError(url, "not an http:// or https:// URL", retryable=False, connected=False)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not (target + parts.netloc).isprintable() or " " in target + parts.netloc:
        raise HttpGetError(repr(url), "not a URL to request", retryable=False, connected=False)
    return parts, port or (443 if parts.scheme == "https" else 80), target


def get(url: str, *, connect_s: float, total_s: float, max_body: int, accept: str = "*/*",
        headers: Mapping[str, str] | None = None, deadline: float | None = None,
        context: ssl.SSLContext | None = None, server_hostname: str | None = None,
        chunked: bool = False) -> Answer:
    """`GET url` within `total_s` (and before the monotonic `deadline`, when given) in all.

    https:// needs `context` (the caller's CA and checks); the certificate is checked for
    `server_hostname`, by default the URL's host. `headers` are sent as given (an Authorization
    header only ever goes to the URL the caller built)."""
    parts, port, target = _target(url)
    if parts.scheme == "https" and context is None:
        raise HttpGetError(url, "an https:// URL without a TLS configuration", retryable=False, connected=False)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    if not extra.replace("\r\n", "").isprintable():
        raise HttpGetError(url, "a request header is not printable", retryable=False, connected=False)
    request = (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: {accept}\r\n{extra}"
               "Connection: close\r\n\r\n").encode("ascii", "replace")
    started = time.monotonic()
    end_at = started + total_s if deadline is None else min(started + total_s, deadline)
    budget = max(0.0, end_at - started)

    def left() -> float:
        rest = end_at - time.monotonic()
        if rest <= 0:
            raise HttpGetError(url, f"timed out: no whole answer within {budget:g} s", timed_out=True)
        return rest

    try:
        sock = socket.create_connection((parts.hostname or "", port), timeout=min(connect_s, left()))
    except TimeoutError as e:
        raise HttpGetError(url, f"timed out: not connected within {min(connect_s, budget):g} s",
                           connected=False, timed_out=True) from e
    except OSError as e:
        raise HttpGetError(url, f"{type(e).__name__}: {e}", connected=False) from e
    buf = bytearray()
    body_at = 0  # where the body starts, once the header is in
    length: int | None = None
    status = 0
    answer_headers: dict[str, str] = {}
    decoder: _Chunked | None = None
    try:
        with sock:
            if context is not None:
                sock.settimeout(left())
                sock = context.wrap_socket(sock, server_hostname=server_hostname or parts.hostname)
            sock.settimeout(left())
            sock.sendall(request)
            while True:
                if length is not None and len(buf) >= body_at + length:
                    break
                if decoder is not None and decoder.done:
                    break
                sock.settimeout(left())
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                if not body_at:
                    end = buf.find(b"\r\n\r\n", 0, HEAD_MAX)
                    if end == -1:
                        if len(buf) >= HEAD_MAX:
                            raise HttpGetError(url, f"answer header over {HEAD_MAX:,} bytes", retryable=False)
                        continue
                    body_at = end + 4
                    status, answer_headers = _head(url, bytes(buf[:end]))
                    length, is_chunked = _framing(url, answer_headers, max_body, chunked)
                    decoder = _Chunked() if is_chunked else None
                if decoder is not None:
                    with memoryview(buf) as view:
                        decoder.feed(view[body_at:], url)
                    del buf[body_at:body_at + decoder.pos]  # keep only what is not decoded yet
                    decoder.pos = 0
                    if len(decoder.out) + len(buf) - body_at > max_body + 64:
                        raise HttpGetError(url, f"body over the {max_body:,} byte limit", retryable=False)
                elif len(buf) - body_at > max_body:
                    raise HttpGetError(url, f"body over the {max_body:,} byte limit", retryable=False)
    except TimeoutError as e:
        raise HttpGetError(url, f"timed out: no whole answer within {budget:g} s", timed_out=True) from e
    except ssl.SSLCertVerificationError as e:
        raise HttpGetError(url, f"TLS certificate refused: {e.verify_message}", retryable=False) from e
    except (OSError, ssl.SSLError) as e:
        raise HttpGetError(url, f"{type(e).__name__}: {e}") from e
    if not body_at:
        raise HttpGetError(url, "connection closed before an answer")
    if decoder is not None:
        if not decoder.done:
            raise HttpGetError(url, f"chunked body cut after {len(decoder.out):,} bytes")
        return Answer(status, answer_headers, bytes(decoder.out))
    if length is not None and len(buf) < body_at + length:
        raise HttpGetError(url, f"body cut at {len(buf) - body_at:,} of {length:,} bytes")
    return Answer(status, answer_headers, bytes(buf[body_at:body_at + length] if length is not None else buf[body_at:]))


def _head(url: str, head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit() or len(status[1]) != 3:
        raise HttpGetError(url, f"not an HTTP answer ({lines[0][:40]!r})", retryable=False)
    out: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return int(status[1]), out


def _framing(url: str, headers: Mapping[str, str], max_body: int, chunked: bool) -> tuple[int | None, bool]:
    """(Content-Length or None, chunked?) from an answer's headers; refuses what is not read."""
    te = headers.get("transfer-encoding", "").lower()
    if te and te != "identity":
        if not (chunked and te == "chunked"):
            raise HttpGetError(url, f"Transfer-Encoding {te[:20]!r} is not read", retryable=False)
        return None, True
    value = headers.get("content-length")
    if value is None:
        return None, False
    if not value.isascii() or not value.isdigit():
        raise HttpGetError(url, f"Content-Length {value[:20]!r}", retryable=False)
    length = int(value)
    if length > max_body:
        raise HttpGetError(url, f"body over the {max_body:,} byte limit ({length:,} announced)", retryable=False)
    return length, False
