"""Shared by the test servers (Prometheus, Azurite, Ray, raw HTTP): loopback ports, request heads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Container


def free_port(avoid: Container[int] = ()) -> int:
    """A port free on 127.0.0.1 right now (the caller retries if another process takes it)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
    raise RuntimeError("no free loopback port outside the avoided range")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a test server by its process id, SIGKILL if it lingers (never by name)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


def read_head(conn: socket.socket, size: int = 4096) -> bytes:
    """A raw HTTP request's bytes up to its blank line (and whatever came with it); fewer when the
    client closed first: the caller checks for b"\r\n\r\n"."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(size)
        if not chunk:
            break
        data += chunk
    return data
