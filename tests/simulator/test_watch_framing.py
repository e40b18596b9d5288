"""Watch framing on the wire, read off a raw socket: the simulator frames a watch as kube-apiserver
does over HTTP/1.1 (each event one Write into Go's chunked response writer, a Flush whenever the
backlog is drained; kubesim.streaming.GoChunks). A client's per-chunk costs are then what a real
server makes them: the official client re-slices its buffer per line, so one chunk holding a whole
backlog (what the simulator sent before) made it quadratic."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from kubesim import Simulator


def _pod(name: str, pad: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if pad:
        meta["annotations"] = {"pad": "x" * pad}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


class RawWatch:
    """A watch read off a plain socket: the chunks exactly as they came, undecoded."""

    def __init__(self, sim: Simulator, query: str) -> None:
        host, port = sim.base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(f"GET /api/v1/namespaces/default/pods?watch=true&{query} HTTP/1.1\r\n"
                          f"Host: {host}\r\nAccept: application/json\r\n\r\n".encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n").decode()
        assert head.startswith("HTTP/1.1 200"), head
        assert "transfer-encoding: chunked" in head.lower(), head

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.buf += data
        out, _, self.buf = self.buf.partition(sep)
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def chunk(self) -> bytes:
        size = int(self._until(b"\r\n"), 16)
        data = self._exactly(size)
        assert self._exactly(2) == b"\r\n"
        return data

    def chunks_until(self, lines: int) -> list[bytes]:
        """Chunks until `lines` complete JSON lines arrived (bookmarks not counted)."""
        out: list[bytes] = []
        while sum(1 for x in b"".join(out).split(b"\n")[:-1] if b'"BOOKMARK"' not in x) < lines:
            out.append(self.chunk())
        return out

    def close(self) -> None:
        self.sock.close()


def test_a_backlog_of_large_events_is_one_chunk_per_event(sim: Simulator) -> None:
    rv0 = sim.store.resource_version
    for i in range(40):  # ~3 KB each (a fleet's pods are 5-6 KB): above Go's 2 KiB chunking buffer
        sim.apply(_pod(f"big-{i}", pad=3000))
    w = RawWatch(sim, f"resourceVersion={rv0}&timeoutSeconds=5")  # all 40 queued: one backlog
    try:
        chunks = w.chunks_until(40)
    finally:
        w.close()
    assert len(chunks) == 40
    for i, c in enumerate(chunks):
        assert c.endswith(b"\n") and c.count(b"\n") == 1, f"chunk {i} is not one whole line"
        event = json.loads(c)
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", f"big-{i}")


def test_live_events_are_flushed_one_chunk_each(sim: Simulator) -> None:
    w = RawWatch(sim, f"resourceVersion={sim.store.resource_version}&timeoutSeconds=5")
    got: list[bytes] = []

    def read() -> None:
        got.extend(w.chunks_until(5))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(5):  # small events, each written while the watch waits: flushed at once
            sim.apply(_pod(f"small-{i}"))
            time.sleep(0.05)
        reader.join(10)
    finally:
        w.close()
    assert [json.loads(c)["object"]["metadata"]["name"] for c in got] == [f"small-{i}" for i in range(5)]
    assert all(c.count(b"\n") == 1 and c.endswith(b"\n") for c in got)


def test_a_backlog_of_small_events_shares_2k_chunks_as_go_writes_them(sim: Simulator) -> None:
    rv0 = sim.store.resource_version
    for i in range(30):  # ~500 B each: Go's bufio.Writer packs them, cutting lines at 2 KiB
        sim.apply(_pod(f"s-{i}"))
    w = RawWatch(sim, f"resourceVersion={rv0}&timeoutSeconds=5")
    try:
        chunks = w.chunks_until(30)
    finally:
        w.close()
    body = b"".join(chunks)
    names = [json.loads(line)["object"]["metadata"]["name"] for line in body.split(b"\n")[:-1]]
    assert names == [f"s-{i}" for i in range(30)]
    assert len(chunks) < 30
    assert all(len(c) == 2048 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 2048
    assert any(not c.endswith(b"\n") for c in chunks), "a 2 KiB chunk boundary falls inside a line"


def _chunks(wire: bytes) -> list[bytes]:
    out = []
    while wire:
        size, _, rest = wire.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out.append(rest[:n])
        assert rest[n:n + 2] == b"\r\n"
        wire = rest[n + 2:]
    return out


def test_go_chunks_cuts_as_bufio_writer_does() -> None:
    """Go's bufio.Writer (2 KiB) in front of the chunk encoder, write by write."""
    from kubesim.streaming import GoChunks

    sent: list[bytes] = []
    w = GoChunks(sent.append)
    w.write(b"a" * 5000)  # nothing buffered: the write is a chunk of its own
    w.write(b"b" * 100)  # buffered
    w.write(b"c" * 5000)  # fills the buffer (1,948 bytes of it), then the rest goes out whole
    w.write(b"d" * 2048)  # exactly the buffer's size: buffered, not sent
    w.write(b"e")  # the full buffer goes out first
    w.end()
    assert [(len(c), c[:1], c[-1:]) for c in _chunks(b"".join(sent))] == [
        (5000, b"a", b"a"), (2048, b"b", b"c"), (3052, b"c", b"c"), (2048, b"d", b"d"), (1, b"e", b"e")]
    assert b"".join(sent).endswith(b"0\r\n\r\n") and w.chunks == 5
