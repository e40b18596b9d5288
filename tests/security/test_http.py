"""Attacks on the /metrics server: exposure, half-open floods, disconnects, no auth (issue 8)."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.cli import _address, controller
from collector.endpoints import BoundedHTTPServer, HttpOptions, serve

BIG = b"x" * (4 << 20)  # a /metrics answer big enough that a client can leave in the middle of it


def endpoints() -> dict[str, object]:
    return {
        "/metrics": lambda: (200, "text/plain; version=0.0.4", BIG),
        "/healthz": lambda: (200, "text/plain", b"ok\n"),
    }


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[BoundedHTTPServer]:
    options = getattr(request, "param", HttpOptions(header_timeout_s=2.0))
    srv = serve("127.0.0.1", 0, endpoints(), options)  # type: ignore[arg-type]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def get(url: str, *, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None,
        timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_cli_serves_on_loopback_by_default() -> None:
    option = next(p for p in controller.params if p.name == "metrics_address")
    assert option.default == "127.0.0.1:9464"
    assert _address(":9464") == ("127.0.0.1", 9464)  # a bare port stays on loopback too


def test_500_half_open_connections_create_no_threads_and_health_still_answers(server: BoundedHTTPServer) -> None:
    port = server.server_address[1]
    threads_before = threading.active_count()
    clients = []
    try:
        for _ in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
            clients.append(s)
        time.sleep(0.3)
        assert threading.active_count() <= threads_before, "half-open connections made threads"
        assert len(server._pending) <= server.options.max_pending
        started = time.monotonic()
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert (code, body) == (200, b"ok\n")
        assert time.monotonic() - started < 2.0, "a complete request waited behind the half-open ones"
        deadline = time.monotonic() + server.options.header_timeout_s + 3
        while server._pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server._pending, "half-open connections outlived the header timeout"
    finally:
        for s in clients:
            s.close()


def test_client_disconnects_leave_no_traceback(server: BoundedHTTPServer, caplog: pytest.LogCaptureFixture,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    port = server.server_address[1]
    caplog.set_level(logging.DEBUG, logger="taugrid.http")
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.recv(100)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, mid-answer
        s.close()
    time.sleep(0.5)
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp / "tls.crt", tmp / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_tls_and_bearer_token_guard_metrics(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-scrape-token\n")
    srv = serve("127.0.0.1", 0, endpoints(),  # type: ignore[arg-type]
                HttpOptions(tls_cert_file=cert, tls_key_file=key, token_file=token, header_timeout_s=2.0))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        base = f"https://localhost:{srv.server_address[1]}"
        ctx = ssl.create_default_context(cafile=str(cert))
        assert get(f"{base}/metrics", context=ctx)[0] == 401
        assert get(f"{base}/metrics", context=ctx, headers={"Authorization": "Bearer wrong"})[0] == 401
        code, body = get(f"{base}/metrics", context=ctx, headers={"Authorization": "Bearer s3cret-scrape-token"})
        assert code == 200 and body == BIG
        assert get(f"{base}/healthz", context=ctx) == (200, b"ok\n")  # probes need no token
        token.write_text("rotated-token-2\n")  # a rotated token file is read again
        assert get(f"{base}/metrics", context=ctx, headers={"Authorization": "Bearer s3cret-scrape-token"})[0] == 401
        assert get(f"{base}/metrics", context=ctx, headers={"Authorization": "Bearer rotated-token-2"})[0] == 200
        with pytest.raises(OSError):  # plain HTTP to the TLS port gets nothing
            urllib.request.urlopen(f"http://localhost:{srv.server_address[1]}/healthz", timeout=3).read()
        # A half-open TLS client (TCP connect, no handshake) holds no worker either.
        idle = [socket.create_connection(("127.0.0.1", srv.server_address[1])) for _ in range(50)]
        try:
            assert get(f"{base}/healthz", context=ctx, timeout=2) == (200, b"ok\n")
        finally:
            for s in idle:
                s.close()
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_tls_needs_both_files(tmp_path: Path) -> None:
    cert, _ = _self_signed(tmp_path)
    with pytest.raises(ValueError, match="both"):
        serve("127.0.0.1", 0, {}, HttpOptions(tls_cert_file=cert))


def test_a_client_that_never_reads_frees_its_worker() -> None:
    srv = serve("127.0.0.1", 0, endpoints(), HttpOptions(workers=1, timeout_s=1.0))  # type: ignore[arg-type]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        port = srv.server_address[1]
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", port))
        stuck.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # 4 MB answer, never read
        time.sleep(0.2)
        started = time.monotonic()
        assert get(f"http://127.0.0.1:{port}/healthz", timeout=10) == (200, b"ok\n")
        assert time.monotonic() - started < 5, "the only worker stayed with a client that never reads"
        stuck.close()
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_shutdown_wakes_the_selector_loop() -> None:
    """shutdown() ends the accept loop at once instead of on its next 0.2 s poll: a controller's
    close (and its SIGTERM exit) does not wait out the poll. Ten servers, each stopped while its
    loop waits in select: well under the 10 x 0.1-0.2 s that waiting out the poll costs."""
    took = []
    for _ in range(10):
        srv = serve("127.0.0.1", 0, endpoints())  # type: ignore[arg-type]
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        assert get(f"http://127.0.0.1:{srv.server_address[1]}/healthz")[0] == 200  # the loop is up
        t0 = time.monotonic()
        srv.shutdown()
        took.append(time.monotonic() - t0)
        srv.server_close()
        t.join(5)
        assert not t.is_alive()
    assert sum(took) < 0.5, took


FLEET = b"x" * (24 << 20)  # a fleet-size /metrics (5,000 runs at ~4.9 KB each)


def _never_reading_client(port: int, path: str = "/metrics") -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    return s


def test_clients_that_never_read_a_fleet_size_metrics_do_not_starve_the_probes() -> None:
    """Issue 26: six clients ask for /metrics and never read it. Every /metrics worker is held (for
    its write deadline); the kubelet's probes, answered by workers of their own, still answer within
    the kubelet's default 1 s probe timeout, every time."""
    srv = serve("127.0.0.1", 0, {"/metrics": lambda: (200, "text/plain; version=0.0.4", FLEET),
                                 "/healthz": lambda: (200, "text/plain", b"ok\n"),
                                 "/readyz": lambda: (200, "text/plain", b"ok\n")},
                HttpOptions(header_timeout_s=2.0))  # the controller's defaults otherwise: 4 workers, 10 s
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    port = srv.server_address[1]
    stuck = [_never_reading_client(port) for _ in range(6)]
    try:
        time.sleep(0.5)  # every /metrics worker is now blocked in its write
        took = []
        for path in ("/healthz", "/readyz") * 3:
            started = time.monotonic()
            assert get(f"http://127.0.0.1:{port}{path}", timeout=1.0) == (200, b"ok\n"), path
            took.append(time.monotonic() - started)
        assert max(took) < 1.0, took
    finally:
        for s in stuck:
            s.close()
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_an_answer_has_one_write_deadline_however_slowly_the_client_reads(tmp_path: Path) -> None:
    """A TLS client that reads 16 KiB every 50 ms keeps every single send short of the socket
    timeout; the answer as a whole is still cut at `timeout_s`, and the only worker serves the
    next request (the kernel may go on delivering what it had buffered: that costs no thread)."""
    cert, key = _self_signed(tmp_path)
    big = b"y" * (32 << 20)
    srv = serve("127.0.0.1", 0, {"/metrics": lambda: (200, "text/plain", big),
                                 "/small": lambda: (200, "text/plain", b"small\n")},
                HttpOptions(workers=1, timeout_s=1.0, tls_cert_file=cert, tls_key_file=key))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    ctx = ssl.create_default_context(cafile=str(cert))
    stop = threading.Event()

    def slow_reader() -> None:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        raw.connect(("127.0.0.1", srv.server_address[1]))
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            s.settimeout(2)
            while not stop.is_set():
                try:
                    if not s.recv(16384):
                        return
                except (OSError, ssl.SSLError):
                    return
                stop.wait(0.05)

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)  # the worker is writing to the slow reader now
        started = time.monotonic()
        code, body = get(f"https://localhost:{srv.server_address[1]}/small", context=ctx, timeout=8)
        took = time.monotonic() - started
        assert (code, body) == (200, b"small\n")
        assert took < 3, f"the only worker stayed {took:.1f} s with a slow reader (write deadline 1 s)"
    finally:
        stop.set()
        reader.join(5)
        srv.shutdown()
        srv.server_close()
        t.join(5)
