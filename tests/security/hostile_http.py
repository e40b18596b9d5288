"""Real loopback HTTP peers for the attack tests: a Ray head that answers the documented APIs, one
that records who called it (a stand-in for cloud metadata), and one that trickles its answer."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from tests.netutil import read_head

JOBS = orjson.dumps([{"submission_id": "raysubmit_1", "job_id": "01000000", "type": "SUBMISSION",
                      "status": "RUNNING", "message": "", "entrypoint": "python train.py",
                      "start_time": 1767225600000}])
NODES = orjson.dumps({"result": True, "msg": "", "data": {"result": {
    "total": 1, "num_after_truncation": 1, "num_filtered": 1, "result": [{"node_id": "n1", "state": "ALIVE"}]}}})


@contextlib.contextmanager
def http_server(answer: Callable[[str], tuple[int, str, bytes]],
                seen: list[str] | None = None) -> Iterator[str]:
    """A threaded HTTP server; `answer(path)` gives (status, content type, body). Yields its base URL."""
    calls = seen if seen is not None else []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def do_GET(self) -> None:  # noqa: N802
            calls.append(self.path)
            status, ctype, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def ray_head(step: int = 5) -> Callable[[str], tuple[int, str, bytes]]:
    """A well-behaved Ray head: Jobs API, state API and a metrics endpoint with a step counter."""

    def answer(path: str) -> tuple[int, str, bytes]:
        if path.startswith("/api/jobs/raysubmit_1/logs"):
            return 200, "application/json", b'{"logs": "step 1\\n"}'
        if path.startswith("/api/jobs/"):
            return 200, "application/json", JOBS
        if path.startswith("/api/v0/nodes"):
            return 200, "application/json", NODES
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", f"ray_train_steps_total {step}\n".encode()
        return 404, "text/plain", b"not found\n"

    return answer


@contextlib.contextmanager
def trickler(*, every_s: float, lasting_s: float, in_header: bool = False) -> Iterator[str]:
    """A peer that answers one byte every `every_s` seconds for `lasting_s` at most: in its body
    (after a whole header announcing more) or, with `in_header`, in its status line. No single read
    of a per-read socket timeout longer than `every_s` ever fires on it."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.1)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                if b"\r\n\r\n" not in read_head(conn):
                    return
                if not in_header:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                payload = b"HTTP/1.1 200 OK\r\n" if in_header else b"[" + b" " * 100000
                end = time.monotonic() + lasting_s
                for byte in payload:
                    if stop.is_set() or time.monotonic() > end:
                        return
                    conn.sendall(bytes([byte]))
                    stop.wait(every_s)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=drip, args=(conn,), daemon=True)
            threads.append(t)
            t.start()

    acceptor = threading.Thread(target=loop, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(2)
        lsock.close()
        for t in threads:
            t.join(3)
