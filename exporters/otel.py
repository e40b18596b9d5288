"""Each run's lifecycle as an OpenTelemetry trace, exported over OTLP/HTTP.

One trace per run (its id derived from the run's uid, so every replica and restart names the
same trace, and a bundle's manifest can point at it). Stages are child spans of one root span
`run <namespace>/<name>`: queued, admitted, scheduling, starting, running, progressing, stalled,
finished. A stage span ends when the run leaves the stage, with the claims and their evidence
at that moment as attributes (redacted); the root span ends when the run finishes.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from collector.model import Observed, Ref, RunClaims, Stage
from collector.redact import redact

STAGES = ("queued", "admitted", "scheduling", "starting", "running", "progressing", "stalled", "finished")
MAX_RUNS = 50_000
MAX_EVIDENCE = 8


def stage_of(rc: RunClaims) -> str:
    """The lifecycle stage a run is in, from its claims."""
    if rc.finished:
        return "finished"
    if rc.blocked is not None:
        if rc.blocked.stage in (Stage.TARGET_RESOLUTION, Stage.QUEUE_ADMISSION):
            return "queued"
        return "scheduling"
    if rc.scheduled.observed is not Observed.TRUE:
        return "admitted"
    if rc.running.observed is not Observed.TRUE:
        return "starting"
    return {Observed.TRUE: "progressing", Observed.FALSE: "stalled"}.get(rc.progressing.observed, "running")


def _ids(ref: Ref) -> tuple[int, int]:
    h = hashlib.sha256(f"{ref.uid or ''}|{ref.kind}|{ref.namespace}|{ref.name}".encode()).digest()
    return int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1


def _ns(t: datetime) -> int:
    return int(t.timestamp() * 1e9)


def attributes(rc: RunClaims) -> dict[str, Any]:
    out: dict[str, Any] = {"taugrid.run.namespace": rc.ref.namespace, "taugrid.run.name": rc.ref.name,
                           "taugrid.run.kind": rc.ref.kind, "taugrid.run.uid": rc.ref.uid}
    for name, c in rc.claims.items():
        out[f"taugrid.{name}.verdict"] = c.verdict.value
        out[f"taugrid.{name}.observed"] = c.observed.value
        out[f"taugrid.{name}.reason"] = redact(c.reason)[:512]
        ev = [redact(f"{e.plane.value}: {e.ref} {e.field} = {e.value}")[:256] for e in c.evidence[:MAX_EVIDENCE]]
        if ev:
            out[f"taugrid.{name}.evidence"] = ev
    if rc.blocked is not None:
        out["taugrid.blocked.stage"] = rc.blocked.stage.value
        out["taugrid.blocked.owner"] = rc.blocked.stage.owner
        out["taugrid.blocked.reason"] = redact(rc.blocked.reason)[:512]
    if rc.goodput is not None and rc.goodput.ratio is not None:
        out["taugrid.goodput.ratio"] = round(rc.goodput.ratio, 4)
    return out


class _Ids(IdGenerator):
    """Random ids, except the root span's, which are set per call (deterministic per run)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    def set(self, trace_id: int, span_id: int) -> None:
        self._local.next = (trace_id, span_id)

    def generate_trace_id(self) -> int:
        nxt = getattr(self._local, "next", None)
        return nxt[0] if nxt else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        nxt = getattr(self._local, "next", None)
        if nxt:
            self._local.next = None
            return int(nxt[1])
        return self._random.generate_span_id()


@dataclass(slots=True)
class _Run:
    ref: Ref
    start: datetime
    stage: str
    stage_start: datetime
    attrs: dict[str, Any] = field(default_factory=dict)


class RunTracer:
    """Turns successive RunClaims of each run into stage spans; thread-safe."""

    def __init__(self, exporter: SpanExporter, *, batch: bool = True, service: str = "taugrid-evidence") -> None:
        self._ids = _Ids()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=self._ids)
        self.provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("taugrid-evidence.lifecycle")
        self.runs: dict[tuple[str, str, str], _Run] = {}
        self._lock = threading.Lock()

    @classmethod
    def otlp(cls, endpoint: str, *, timeout_s: float = 10.0) -> RunTracer:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s))

    @staticmethod
    def trace_id(ref: Ref) -> str:
        return f"{_ids(ref)[0]:032x}"

    def _parent(self, ref: Ref) -> Any:
        tid, sid = _ids(ref)
        ctx = SpanContext(trace_id=tid, span_id=sid, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        return trace.set_span_in_context(NonRecordingSpan(ctx))

    def _stage_span(self, run: _Run, end: datetime) -> None:
        span = self.tracer.start_span(run.stage, context=self._parent(run.ref), kind=SpanKind.INTERNAL,
                                      start_time=_ns(run.stage_start), attributes=run.attrs)
        span.end(end_time=max(_ns(end), _ns(run.stage_start)))

    def update(self, rc: RunClaims, now: datetime) -> None:
        stage = stage_of(rc)
        attrs = attributes(rc)
        with self._lock:
            run = self.runs.get(rc.ref.key)
            if run is None:
                if stage == "finished":
                    return  # finished before we saw it: nothing observed to trace
                if len(self.runs) >= MAX_RUNS:
                    return
                run = self.runs[rc.ref.key] = _Run(rc.ref, now, stage, now, attrs)
                return
            if stage == run.stage:
                run.attrs = attrs  # the span carries the evidence as it stands when the stage ends
                return
            self._stage_span(run, now)
            run.stage, run.stage_start, run.attrs = stage, now, attrs
            if stage == "finished":
                self._stage_span(run, now)
                self._finish(run, now)
                del self.runs[rc.ref.key]

    def _finish(self, run: _Run, end: datetime) -> None:
        tid, sid = _ids(run.ref)
        self._ids.set(tid, sid)
        span = self.tracer.start_span(f"run {run.ref.namespace}/{run.ref.name}", context=trace.set_span_in_context(
            trace.INVALID_SPAN), kind=SpanKind.INTERNAL, start_time=_ns(run.start), attributes=run.attrs)
        span.end(end_time=_ns(end))

    def forget(self, key: tuple[str, str, str], now: datetime) -> None:
        """A run that disappeared: end what it was doing and its root span."""
        with self._lock:
            run = self.runs.pop(key, None)
            if run is not None:
                self._stage_span(run, now)
                self._finish(run, now)

    def flush(self, timeout_ms: int = 10_000) -> bool:
        return bool(self.provider.force_flush(timeout_ms))

    def close(self) -> None:
        self.provider.shutdown()
