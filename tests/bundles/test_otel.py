"""Run lifecycle traces over OTLP/HTTP, received by a real HTTP server that decodes the protobuf requests."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collector.model import Blocked, Claim, Evidence, Observed, Plane, Ref, RunClaims, Stage, Verdict
from exporters.otel import RunTracer, stage_of

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
REF = Ref("TauRun", "research", "llm", "uid-llm")


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback: decodes every ExportTraceServiceRequest it gets."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                receiver.requests.append(req)
                receiver.content_types.append(self.headers.get("Content-Type", ""))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Any]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def claim(observed: Observed, asserted: bool | None = True, reason: str = "", ev: tuple[Evidence, ...] = ()) -> Claim:
    verdict = Verdict.VERIFIED if observed is Observed.TRUE else (
        Verdict.CONTRADICTED if asserted and observed is Observed.FALSE else Verdict.PENDING)
    return Claim(asserted, observed, verdict, T0, reason or observed.value, ev)


def rc(sched: Observed, run: Observed, prog: Observed, *, blocked: Stage | None = None,
       finished: bool = False, reason: str = "") -> RunClaims:
    ev = (Evidence(Plane.LOGS, "Pod/research/llm-w0", "last_step", 1200, T0),)
    b = Blocked(blocked, f"waiting in {blocked.value}", T0) if blocked else None
    return RunClaims(REF, claim(sched), claim(run), claim(prog, reason=reason, ev=ev), b, T0, finished=finished)


def test_stage_mapping() -> None:
    U, T, F = Observed.UNKNOWN, Observed.TRUE, Observed.FALSE
    assert stage_of(rc(F, F, U, blocked=Stage.QUEUE_ADMISSION)) == "queued"
    assert stage_of(rc(F, F, U, blocked=Stage.NODE_SCALING)) == "scheduling"
    assert stage_of(rc(F, F, U)) == "admitted"
    assert stage_of(rc(T, F, U)) == "starting"
    assert stage_of(rc(T, T, U)) == "running"
    assert stage_of(rc(T, T, T)) == "progressing"
    assert stage_of(rc(T, T, F)) == "stalled"
    assert stage_of(rc(T, T, F, finished=True)) == "finished"


def test_lifecycle_trace_arrives_over_otlp_http(receiver: Receiver) -> None:
    U, T, F = Observed.UNKNOWN, Observed.TRUE, Observed.FALSE
    tracer = RunTracer.otlp(receiver.endpoint)
    steps = [
        (0, rc(F, F, U, blocked=Stage.QUEUE_ADMISSION)),
        (3, rc(F, F, U)),
        (4, rc(F, F, U, blocked=Stage.POD_SCHEDULING)),
        (6, rc(T, F, U)),
        (8, rc(T, T, U)),
        (9, rc(T, T, T)),
        (60, rc(T, T, T)),  # same stage: no span, evidence refreshed
        (90, rc(T, T, F, reason="STALLED 30m: token=abcdefgh12345 leaked in a log")),
        (120, rc(T, T, F, finished=True)),
    ]
    try:
        for minutes, claims in steps:
            tracer.update(claims, T0 + timedelta(minutes=minutes))
        assert tracer.flush()
    finally:
        tracer.close()
    assert receiver.content_types and all(c == "application/x-protobuf" for c in receiver.content_types)
    spans = receiver.spans()
    by_name = {s.name: s for s in spans}
    assert [s.name for s in sorted(spans, key=lambda s: (s.start_time_unix_nano, s.name != "run research/llm"))] == [
        "run research/llm", "queued", "admitted", "scheduling", "starting", "running", "progressing", "stalled",
        "finished"]
    root = by_name["run research/llm"]
    trace_ids = {s.trace_id.hex() for s in spans}
    assert trace_ids == {RunTracer.trace_id(REF)}  # one trace per run, id derived from the run
    assert all(s.parent_span_id == root.span_id for s in spans if s is not root)
    assert root.parent_span_id == b""
    t0 = int(T0.timestamp() * 1e9)
    minute = 60 * 10**9
    assert (by_name["queued"].start_time_unix_nano, by_name["queued"].end_time_unix_nano) == (t0, t0 + 3 * minute)
    assert by_name["progressing"].end_time_unix_nano == t0 + 90 * minute
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (t0, t0 + 120 * minute)

    def attrs(span: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kv in span.attributes:
            v = kv.value
            out[kv.key] = list(x.string_value for x in v.array_value.values) if v.HasField("array_value") else (
                v.string_value or v.int_value or v.double_value or v.bool_value)
        return out

    q = attrs(by_name["queued"])
    assert q["taugrid.blocked.stage"] == "queue-admission" and q["taugrid.blocked.owner"] == "Kueue"
    stalled = attrs(by_name["stalled"])
    assert stalled["taugrid.progressing.observed"] == "false"
    assert stalled["taugrid.progressing.reason"].startswith("STALLED 30m: token=[REDACTED]")
    assert stalled["taugrid.progressing.evidence"] == ["logs: Pod/research/llm-w0 last_step = 1200"]
    assert "abcdefgh12345" not in str(receiver.requests)
    service = {kv.key: kv.value.string_value for r in receiver.requests for rs in r.resource_spans
               for kv in rs.resource.attributes}
    assert service["service.name"] == "taugrid-evidence"
