"""`collector.sources.agents.fetch`: the controller's plain GET of an agent's /evidence.

Against the agent's own HTTP server (`collector.endpoints.serve`) and against a raw socket server
that answers the odd ways a broken or hostile peer might: each ends in one AgentReadError naming
the URL, within the time bound, never a hang or an unbounded read.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest

from collector.endpoints import serve
from collector.sources.agents import HEAD_MAX, AgentEndpoint, AgentReader, AgentReadError, fetch
from tests.netutil import read_head


@contextmanager
def agent_server(body: bytes) -> Iterator[int]:
    server = serve("127.0.0.1", 0, {"/evidence": lambda: (200, "application/json", body)})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def raw_server(answer: Callable[[socket.socket], None], requests: list[bytes] | None = None) -> Iterator[int]:
    """Accepts connections and hands each, once its request is read (into `requests`), to `answer`."""
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    requests = [] if requests is None else requests

    def loop() -> None:
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                requests.append(read_head(conn))
                answer(conn)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield int(lsock.getsockname()[1])
    finally:
        stop.set()
        t.join(2)
        lsock.close()


def get(port: int, path: str = "/evidence", *, read_s: float = 2.0, max_body: int = 1 << 20) -> bytes:
    return fetch(f"http://127.0.0.1:{port}{path}", connect_s=1.0, read_s=read_s, max_body=max_body)


def test_reads_the_agent_servers_answer_whole() -> None:
    body = b'{"version": 1, "pad": "' + b"x" * 300_000 + b'"}'  # several reads' worth
    with agent_server(body) as port:
        assert get(port) == body
        assert get(port, "/evidence?epoch=e-1&poll=7") == body  # the query travels (the server ignores it)
        with pytest.raises(AgentReadError, match=rf"127\.0\.0\.1:{port}/nothing: HTTP 404"):
            get(port, "/nothing")
        with pytest.raises(AgentReadError, match="byte limit"):
            get(port, max_body=1000)  # announced longer than allowed: refused before the body is read


def test_sends_one_plain_request() -> None:
    seen: list[bytes] = []
    with raw_server(lambda conn: conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"), seen) as port:
        assert get(port, "/evidence?epoch=a&poll=1") == b"{}"
        with pytest.raises(AgentReadError, match="not a URL to request"):
            get(port, "/evidence?x=1\r\nX-Injected: 1")  # never written onto the wire
    (request,) = seen  # one request: the refused URL sent nothing
    assert request == (f"GET /evidence?epoch=a&poll=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       "Accept: application/json\r\nConnection: close\r\n\r\n").encode()


@pytest.mark.parametrize(("answer", "message"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"version\"", "body cut at 10 of 100 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}{}{\r\n0\r\n\r\n", "Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "Content-Length"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP answer"),
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "HTTP 503"),
    (b"", "closed before an answer"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"y" * HEAD_MAX + b"\r\n\r\n{}", "header over"),
])
def test_odd_answers_are_one_clear_error(answer: bytes, message: str) -> None:
    with raw_server(lambda conn: conn.sendall(answer)) as port, pytest.raises(AgentReadError, match=message) as err:
        get(port)
    assert f"127.0.0.1:{port}/evidence" in str(err.value)


def test_without_a_length_the_body_runs_to_the_close_and_is_bounded() -> None:
    with raw_server(lambda conn: conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + b"z" * 5000)) as port:
        assert get(port) == b"z" * 5000
        with pytest.raises(AgentReadError, match="byte limit"):
            get(port, max_body=4096)


def test_a_peer_that_never_finishes_is_cut_at_the_time_bound() -> None:
    def drip(conn: socket.socket) -> None:  # a byte every 0.1 s: no single read ever times out
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(40):
            try:
                conn.sendall(b"x")
            except OSError:
                return
            time.sleep(0.1)

    with raw_server(drip) as port:
        t0 = time.monotonic()
        with pytest.raises(AgentReadError, match="no whole answer within"):
            get(port, read_s=0.5)
        assert time.monotonic() - t0 < 2.5  # connect_s + read_s, not 40 drips


def test_refused_and_bad_urls_name_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
    with pytest.raises(AgentReadError, match=rf"http://127\.0\.0\.1:{port}/evidence: ConnectionRefusedError"):
        get(port)
    for url in ("https://10.0.0.1:9402/evidence", "http://10.0.0.1:99999/evidence", "http:///evidence"):
        with pytest.raises(AgentReadError, match="URL|[Pp]ort"):
            fetch(url, connect_s=0.2, read_s=0.2, max_body=100)


def test_read_all_reads_every_agent_in_order_through_a_bounded_window() -> None:
    doc = b'{"version": 1, "node": "n", "epoch": "e1", "poll": 3, "gpus": [], "logs": []}'
    with agent_server(doc) as port, socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        eps = [AgentEndpoint(f"node-{i}", f"agent-{i}",
                             f"http://127.0.0.1:{port if i % 7 else closed.getsockname()[1]}") for i in range(60)]
        reader = AgentReader(lambda: datetime(2026, 1, 1, tzinfo=UTC))
        reports, errors = reader.read_all(eps, workers=2)  # 8 fetches ahead of the parse, 60 agents
        assert [r.endpoint.node for r in reports] == [e.node for e in eps if int(e.node[5:]) % 7]
        assert len(errors) == 9 and all("ConnectionRefusedError" in e for e in errors)
        assert all(r.cursor == ("e1", 3) for r in reports)


def test_a_slow_agent_holds_one_thread_not_the_pass() -> None:
    """The first agent answers only once 50 others have been read: a reader that parsed in the
    order it asked would wait on it with its window full, and those 50 would never come."""
    doc = b'{"version": 1, "node": "n", "gpus": [], "logs": []}'
    served = [0]
    server = serve("127.0.0.1", 0, {"/evidence": lambda: (served.__setitem__(0, served[0] + 1)
                                                         or (200, "application/json", doc))})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen_when_answered: list[int] = []

    def slow(conn: socket.socket) -> None:
        deadline = time.monotonic() + 5
        while served[0] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_when_answered.append(served[0])
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(doc) + doc)

    try:
        with raw_server(slow) as slow_port:
            port = server.server_address[1]
            eps = [AgentEndpoint(f"node-{i}", f"agent-{i}", f"http://127.0.0.1:{slow_port if i == 0 else port}")
                   for i in range(60)]
            reports, errors = AgentReader(lambda: datetime(2026, 1, 1, tzinfo=UTC), timeout_s=10).read_all(
                eps, workers=2)
    finally:
        server.shutdown()
        server.server_close()
    assert not errors and [r.endpoint.node for r in reports] == [e.node for e in eps]
    assert seen_when_answered and seen_when_answered[0] >= 50


def test_read_each_hands_each_report_on_while_a_slow_agent_is_still_out() -> None:
    """The controller queues each agent's logs as its document is read: the reports of 59 agents
    come out before the first agent has answered (it answers only once the caller holds them)."""
    doc = b'{"version": 1, "node": "n", "gpus": [], "logs": []}'
    handed_on: list[int] = []
    release = threading.Event()

    def slow(conn: socket.socket) -> None:
        release.wait(5)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(doc) + doc)

    try:
        with agent_server(doc) as port, raw_server(slow) as slow_port:
            eps = [AgentEndpoint(f"node-{i}", f"agent-{i}", f"http://127.0.0.1:{slow_port if i == 0 else port}")
                   for i in range(60)]
            reader = AgentReader(lambda: datetime(2026, 1, 1, tzinfo=UTC), timeout_s=10)
            for i, rep in reader.read_each(eps, workers=2):
                assert not isinstance(rep, str) and rep.endpoint == eps[i]
                handed_on.append(i)
                if len(handed_on) == 59:
                    release.set()
    finally:
        release.set()
    assert sorted(handed_on[:59]) == list(range(1, 60)) and handed_on[59] == 0


def test_a_document_the_parser_trips_on_is_that_agents_error_not_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever one agent's document does to the parser, the others are read and the pass goes on
    (the agent poller's thread used to end on a TypeError)."""
    from collector.sources import agents

    doc = b'{"version": 1, "node": "n", "gpus": [], "logs": []}'
    parse = agents.parse_evidence

    def tripping(d: object, endpoint: AgentEndpoint, read_at: datetime) -> agents.AgentReport:
        if endpoint.node == "node-1":
            raise TypeError("'int' object is not iterable")
        return parse(d, endpoint, read_at)
    monkeypatch.setattr(agents, "parse_evidence", tripping)
    with agent_server(doc) as port:
        eps = [AgentEndpoint(f"node-{i}", f"agent-{i}", f"http://127.0.0.1:{port}") for i in range(3)]
        reports, errors = AgentReader(lambda: datetime(2026, 1, 1, tzinfo=UTC)).read_all(eps)
    assert [r.endpoint.node for r in reports] == ["node-0", "node-2"]
    assert errors == [f"http://127.0.0.1:{port}/evidence?version={agents.EVIDENCE_VERSION}: unreadable document "
                      "(TypeError: 'int' object is not iterable)"]


def test_a_caller_that_stops_early_does_not_wait_for_the_reads_still_out() -> None:
    """A controller shutting down mid-pass leaves read_each at once: the agents that have not
    answered end on their own threads, within their time bounds."""
    doc = b'{"version": 1, "node": "n", "gpus": [], "logs": []}'
    release = threading.Event()

    def slow(conn: socket.socket) -> None:
        release.wait(5)

    try:
        with agent_server(doc) as port, raw_server(slow) as slow_port:
            eps = [AgentEndpoint("fast", "agent-0", f"http://127.0.0.1:{port}"),
                   AgentEndpoint("slow", "agent-1", f"http://127.0.0.1:{slow_port}")]
            reader = AgentReader(lambda: datetime(2026, 1, 1, tzinfo=UTC), timeout_s=10)
            each = reader.read_each(eps, workers=2)
            first = next(each)
            t = time.monotonic()
            each.close()  # what a `break` out of the loop does
            closed_in = time.monotonic() - t
    finally:
        release.set()
    assert first[0] == 0 and not isinstance(first[1], str)
    assert closed_in < 0.5, closed_in
