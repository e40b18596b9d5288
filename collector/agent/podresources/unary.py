"""One unary gRPC call over HTTP/2 on a unix socket (the `h2` protocol library; no gRPC runtime).

The agent asks the kubelet one question every few seconds. grpcio's runtime (its C core, threads
and asyncio glue) held ~20 MiB of the agent's resident memory for it; a unary call is one HTTP/2
request (`content-type: application/grpc`, the message behind a 5-byte length prefix) and one
answer whose trailers carry `grpc-status`. A connection per call: a unix socket costs microseconds
to open, and a kubelet restart (a re-created socket) needs no reconnect logic.

The answer is bounded (`max_bytes`) and the whole call has one deadline: a kubelet that stalls or
floods costs one failed call.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable

import h2.config
import h2.connection
import h2.events
import h2.exceptions

# gRPC status codes by number (grpc/status.h): the names operators know them by
STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
          "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
          "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
MAX_MESSAGE = 16 << 20  # a kubelet's List for 250 pods of 8 GPUs is tens of KB
_READ = 65536


class UnaryError(Exception):
    """The call failed: `code` is a gRPC status name ("UNAVAILABLE": could not connect or the
    connection broke; "DEADLINE_EXCEEDED": no answer in time; "INTERNAL": a malformed answer)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def call(path: str, method: str, request: bytes, *, timeout_s: float, max_bytes: int = MAX_MESSAGE) -> bytes:
    """The serialized answer of `method` ("/package.Service/Method") to `request` (serialized)."""
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError as e:
            raise UnaryError("UNAVAILABLE", f"connect {path}: {e}") from e
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", method),
                                (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
                                ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m")])
        conn.send_data(sid, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
        return _answer(sock, conn, sid, deadline, max_bytes)
    except TimeoutError as e:
        raise UnaryError("DEADLINE_EXCEEDED", f"{method} on {path}: no answer in {timeout_s:g} s") from e
    except OSError as e:
        raise UnaryError("UNAVAILABLE", f"{method} on {path}: {e}") from e
    except h2.exceptions.ProtocolError as e:
        raise UnaryError("INTERNAL", f"{method} on {path}: HTTP/2 protocol error: {e}") from e
    finally:
        sock.close()


def _answer(sock: socket.socket, conn: h2.connection.H2Connection, sid: int, deadline: float,
            max_bytes: int) -> bytes:
    body = bytearray()
    status: str | None = None
    detail = ""
    while True:
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        data = sock.recv(_READ)
        if not data:
            raise UnaryError("UNAVAILABLE", "the server closed the connection before answering")
        for ev in conn.receive_data(data):
            if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and ev.stream_id == sid:
                headers = dict(_text(ev.headers))
                if ":status" in headers and headers[":status"] != "200":
                    raise UnaryError("UNAVAILABLE", f"HTTP status {headers[':status']}")
                if "grpc-status" in headers:
                    status, detail = headers["grpc-status"], headers.get("grpc-message", "")
            elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                body += ev.data
                if len(body) > max_bytes + 5:
                    raise UnaryError("RESOURCE_EXHAUSTED", f"answer larger than {max_bytes} bytes")
                conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                raise UnaryError("UNAVAILABLE", f"stream reset by the server (HTTP/2 error {ev.error_code})")
            elif isinstance(ev, h2.events.ConnectionTerminated):
                raise UnaryError("UNAVAILABLE", f"connection closed by the server (HTTP/2 error {ev.error_code})")
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                return _message(status, detail, bytes(body))


def _message(status: str | None, detail: str, body: bytes) -> bytes:
    if status is None:
        raise UnaryError("INTERNAL", "the answer ended without a grpc-status")
    if status != "0":
        code = STATUS[int(status)] if status.isdigit() and int(status) < len(STATUS) else f"status {status[:8]}"
        raise UnaryError(code, detail[:500] or "(no message)")
    if len(body) < 5 or body[0] != 0:
        raise UnaryError("INTERNAL", "the answer is not one uncompressed message")
    size = int.from_bytes(body[1:5], "big")
    if size != len(body) - 5:
        raise UnaryError("INTERNAL", f"the answer's length prefix says {size} bytes, {len(body) - 5} came")
    return body[5:]


def _text(headers: Iterable[tuple[bytes | str, bytes | str]]) -> Iterable[tuple[str, str]]:
    for k, v in headers:
        yield (k.decode() if isinstance(k, bytes) else k), (v.decode() if isinstance(v, bytes) else v)
