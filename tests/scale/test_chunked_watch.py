"""Watch lines read off the socket (collector.sources.chunked): the same lines as urllib3's chunk
reader, every event that has arrived per read, and hostile framing ending in a clear error."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.sources import kube_api
from collector.sources.chunked import FramingError, StreamEnded, chunked_lines
from collector.sources.kube_api import KubeApi, Resource, RetryableSourceError, api_client_for

POD = Resource("Pod", "", "v1", "pods")


def _reader(wire: bytes, cuts: list[int]) -> Callable[[int], bytes]:
    """read1 over `wire`, handing it out in pieces ending at `cuts` (then what is asked, at most)."""
    pos = 0
    ends = iter(sorted(set(cuts)))

    def read(n: int) -> bytes:
        nonlocal pos
        end = next((c for c in ends if c > pos), len(wire))
        piece = wire[pos:min(end, pos + n)]
        pos += len(piece)
        return piece

    return read


def _frame(pieces: list[bytes], ext: bool = False) -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";name=value" if ext else b"", p) for p in pieces if p) + b"0\r\n\r\n"


def _flat(gen: Iterator[list[bytes]]) -> list[bytes]:
    return [line for batch in gen for line in batch]


_line = st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"x"))


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_line, max_size=12), data=st.data(), ext=st.booleans())
def test_any_chunking_and_read_sizes_give_the_lines(lines: list[bytes], data: Any, ext: bool) -> None:
    body = b"".join(line + b"\n" for line in lines)
    # Chunk boundaries anywhere in the body, read boundaries anywhere on the wire (inside a size
    # line, between CR and LF...).
    splits = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    pieces = [body[a:b] for a, b in zip([0, *splits], [*splits, len(body)], strict=True)]
    wire = _frame(pieces, ext)
    cuts = data.draw(st.lists(st.integers(1, max(1, len(wire))), max_size=10))
    assert _flat(chunked_lines(_reader(wire, cuts))) == [line for line in lines if line.strip()]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_line, max_size=12), data=st.data(), ext=st.booleans())
def test_one_event_per_chunk_as_the_api_server_frames_gives_the_lines(lines: list[bytes], data: Any,
                                                                      ext: bool) -> None:
    """The framing the API server uses (each event its own chunk), with some chunks holding two
    events or half of one, and reads cut anywhere: the same lines, in order."""
    pieces: list[bytes] = []
    for line in lines:
        how = data.draw(st.sampled_from(["own", "own", "joined", "split"]))
        if how == "joined" and pieces:
            pieces[-1] += line + b"\n"
        elif how == "split" and len(line) > 1:
            pieces.extend([line[:len(line) // 2], line[len(line) // 2:] + b"\n"])
        else:
            pieces.append(line + b"\n")
    wire = _frame(pieces, ext)
    cuts = data.draw(st.lists(st.integers(1, max(1, len(wire))), max_size=10))
    batches = list(chunked_lines(_reader(wire, cuts)))
    assert [line for batch in batches for line in batch] == [line for line in lines if line.strip()]
    assert all(batches)


def test_every_event_that_arrived_comes_in_one_read() -> None:
    lines = [orjson.dumps({"type": "MODIFIED", "n": i}) for i in range(50)]
    batches = list(chunked_lines(_reader(_frame([line + b"\n" for line in lines]), [])))
    assert batches == [lines]  # one read held all fifty chunks: one hand-off, not fifty


def test_connection_closed_mid_event_is_a_partial_drop() -> None:
    wire = _frame([b'{"type":"ADDED"}\n', b'{"type":"MOD'])[:-5]  # no last chunk
    gen = chunked_lines(_reader(wire, []))
    with pytest.raises(StreamEnded) as e:
        _flat(gen)
    assert e.value.partial == len(b'{"type":"MOD')


def test_connection_closed_between_events_drops_nothing() -> None:
    got: list[bytes] = []
    with pytest.raises(StreamEnded) as e:
        for batch in chunked_lines(_reader(_frame([b"a\n", b"b\n"])[:-5], [])):
            got.extend(batch)
    assert got == [b"a", b"b"] and e.value.partial == 0


@pytest.mark.parametrize(("wire", "message"), [
    (b"zz\r\nabc\r\n", "not hexadecimal"),
    (b"-3\r\nabc\r\n", "negative chunk size"),
    (b"3\r\nabcXY", "not followed by CRLF"),
    (b"3" * 5000, "chunk-size line longer"),
])
def test_bad_framing_names_the_problem(wire: bytes, message: str) -> None:
    with pytest.raises(FramingError, match=message):
        _flat(chunked_lines(_reader(wire, [])))


def test_an_endless_line_is_refused_not_buffered() -> None:
    wire = b"".join(b"%x\r\n%s\r\n" % (1000, b"x" * 1000) for _ in range(20))
    with pytest.raises(FramingError, match="longer than 10000 bytes"):
        _flat(chunked_lines(_reader(wire, []), max_line=10_000))


# --- through the official client's transport, against a real socket ----------------------------------


def _serve_once(response: bytes) -> tuple[str, threading.Thread]:
    """A one-connection HTTP peer: reads a request, answers `response` in one write, closes."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def run() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                conn.sendall(response)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"http://127.0.0.1:{port}", t


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"


@pytest.mark.parametrize("through_urllib3", [False, True])
def test_watch_lines_over_http_are_the_same_either_way(monkeypatch: pytest.MonkeyPatch,
                                                      through_urllib3: bool) -> None:
    events = [orjson.dumps({"type": "MODIFIED", "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)}}})
              for i in range(40)]
    url, t = _serve_once(_HEAD + b"\r\n" + _frame([e + b"\n" for e in events]))
    if through_urllib3:
        monkeypatch.setattr(kube_api, "_chunked_reader", lambda raw: None)
    api = KubeApi(api_client_for(url))
    raw = api.open_watch(POD, "1", timeout_s=5)
    batches = list(api.watch_lines(POD, raw))
    t.join(5)
    assert [line for b in batches for line in b] == events
    # Off the socket, the forty events that arrived together are handed over together; urllib3
    # yields chunk by chunk.
    assert len(batches) == (40 if through_urllib3 else 1)


def test_a_gzipped_watch_is_read_through_urllib3() -> None:
    url, t = _serve_once(_HEAD + b"Content-Encoding: gzip\r\n\r\n0\r\n\r\n")
    api = KubeApi(api_client_for(url))
    raw = api.open_watch(POD, "1", timeout_s=5)
    assert kube_api._chunked_reader(raw) is None
    raw.close()
    t.join(5)


def test_a_cut_watch_is_a_retryable_error_naming_the_resource() -> None:
    url, t = _serve_once(_HEAD + b"\r\n" + b"20\r\n" + b'{"type":"MODIFIED","obj')
    api = KubeApi(api_client_for(url))
    raw = api.open_watch(POD, "1", timeout_s=5)
    with pytest.raises(RetryableSourceError, match="watch pods: stream cut .*partial event dropped"):
        list(api.watch_lines(POD, raw))
    t.join(5)
