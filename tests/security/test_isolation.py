"""One hostile number costs only its own run (issue 26): a step past 2^63 or 2^64 in a tenant's log
must not fail `explain -o json` for the whole dump, the agent's `/evidence` for the whole node, the
controller loop's batch (other tenants' changes) or the ADX spool (every later row).

Numbers out of range are the progress parsers' to refuse; these tests inject such samples into the
records directly, so they hold whatever the parsers do, and go through the full path once more
asserting isolation only (they pass whether the parser keeps the line or drops it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from collector.agent.evidence import Snapshot, evidence_document
from collector.agent.nvml import NvmlStatus
from collector.cli import main
from collector.controller import Controller
from collector.correlate import Signal
from collector.model import Evidence, Plane, Ref, RunClaims
from collector.planes.base import Change
from collector.progress.model import LogScan, ProgressSample
from collector.render import to_json
from collector.sources.agents import AgentEndpoint, parse_evidence
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.embedded import DuckDBTarget
from exporters.adx.exporter import AdxExporter, ExportSettings, Shipper
from exporters.adx.schema import PROGRESS_SAMPLES
from kubesim.server import Simulator
from tests.agent.test_logs import Node, evidence, megatron
from tests.controller.test_controller import FAST, T0, Clock, apply_run, observed, settings, wait_until
from tests.dumpkit import pod, write_dump
from tests.dumpkit import ts as stamp
from tests.security.test_output import claims_of
from tests.test_explain_fixtures import NOW, taurun

HUGE = 2**64  # past what JSON encoders write (orjson: 64 bits)
PAST_LONG = 2**63  # written by JSON encoders, but no Kusto long (DuckDB BIGINT) holds it


def _scan(*steps: int, at: datetime = T0) -> LogScan:
    samples = tuple(ProgressSample(step=s, at=at + timedelta(seconds=i), loss=1.0, line=i + 1, format="megatron")
                    for i, s in enumerate(steps))
    return LogScan(source="main", format="megatron", samples=samples, hangs=(), xids=(), diagnostics=(),
                   lines=len(steps))


def _stored_steps(store: Path) -> dict[str, list[int]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute(f'SELECT "Namespace", "Step" FROM "{PROGRESS_SAMPLES.name}" ORDER BY "Step"').fetchall()
    finally:
        con.close()
    out: dict[str, list[int]] = {}
    for ns, step in rows:
        out.setdefault(ns, []).append(step)
    return out


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


# --- the controller loop --------------------------------------------------------------------------


def test_a_change_that_raises_costs_only_itself_not_the_batch(tmp_path: Path) -> None:
    """One batch: a change whose application raises, tenant A's log evidence with a step of 2^64, and
    tenant B's. B's evidence is applied and exported; the failure is counted and A's row refused."""
    clock = Clock(T0)
    registry = CollectorRegistry()
    exporter = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool"), DuckDBTarget(tmp_path / "store.duckdb"),
                           registry=registry)
    exporter.open()
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm", ns="team-a")
        apply_run(s, "other", ns="team-b")
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now, sink=exporter)
        c.open()
        try:
            wait_until(lambda: observed(c, "other").get("running") == "true" and bool(observed(c, "llm")),
                       what="both runs")
            errors_before = _metric(c.registry, "taugrid_collector_errors_total", source="controller",
                                    **{"class": "permanent"})
            a = Signal(Ref("Pod", "team-a", "llm-w0"), "main", _scan(1, 2, HUGE), T0)
            b = Signal(Ref("Pod", "team-b", "other-w0"), "main", _scan(10, 11, 12), T0)
            c.put(Change("batch", None, [Change("ray", None, ("a payload", "that cannot be applied")),
                                         Change("log", None, a), Change("log", None, b)]))
            wait_until(lambda: c.index.signal_of(b.ref, "main") is not None, what="B's evidence applied")
            wait_until(lambda: _metric(c.registry, "taugrid_collector_errors_total", source="controller",
                                       **{"class": "permanent"}) > errors_before, what="the failure counted")
        finally:
            c.close()
            exporter.close()
    steps = _stored_steps(tmp_path / "store.duckdb")
    assert steps.get("team-b") == [10, 11, 12]
    assert steps.get("team-a") == [1, 2]  # A's own good samples too: only the bad row is refused
    assert _metric(registry, "taugrid_adx_rows_dropped_total", table=PROGRESS_SAMPLES.name, reason="invalid") == 1


def test_a_huge_step_in_one_tenants_log_costs_the_controller_nothing_else(tmp_path: Path) -> None:
    """The full path (API log read → parser → index → claims → ADX rows and /metrics): whether the
    parser keeps team-a's 2^64 line or refuses it, team-b's run is evaluated, progressing and
    exported, its progress rows stored, and the controller ready."""
    clock = Clock(T0)
    exporter = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool"), DuckDBTarget(tmp_path / "store.duckdb"))
    exporter.open()
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        for ns, name, last in (("team-a", "llm", HUGE), ("team-b", "other", 40)):
            apply_run(s, name, ns=ns)
            for i, step in enumerate((37, 38, 39, last)):
                at = T0 - timedelta(seconds=40 - 10 * i)
                s.store.append_log(ns, f"{name}-w0", "main", [megatron(step)], at)
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(log_poll_interval=timedelta(seconds=0.2)),
                       clock.now, sink=exporter)
        c.open()
        try:
            wait_until(lambda: observed(c, "other").get("progressing") == "true", what="team-b progressing")
            wait_until(c.ready.is_set, what="ready")
            wait_until(lambda: {r.name for r in c.exporter.runs()} == {"llm", "other"}, what="both exported")
            # Nothing raised on the way: the bad value was refused where it stood (or by the parser).
            assert _metric(c.registry, "taugrid_collector_errors_total", source="controller",
                           **{"class": "permanent"}) == 0
        finally:
            c.close()
            exporter.close()
    assert _stored_steps(tmp_path / "store.duckdb").get("team-b") == [37, 38, 39, 40]
    con = duckdb.connect(str(tmp_path / "store.duckdb"), read_only=True)
    try:
        runs = {r[0] for r in con.execute('SELECT "Run" FROM "RunClaims"').fetchall()}
    finally:
        con.close()
    assert runs == {"llm", "other"}  # both runs' claim transitions written


def test_a_run_whose_evaluation_raises_is_unknown_and_the_others_evaluated(monkeypatch: Any) -> None:
    """The evaluation pass goes on past one run that trips it: that run fails closed (unknown, the
    reason says why) and stays exported; the other tenants' runs are evaluated and exported."""
    import collector.evaluation as evaluation_module

    real = evaluation_module.evaluate_multicluster

    def tripping(ev: Any, *args: Any, **kw: Any) -> RunClaims:
        if ev.root.ref.name == "llm":
            raise OverflowError("int too large to convert to float")
        return real(ev, *args, **kw)

    monkeypatch.setattr(evaluation_module, "evaluate_multicluster", tripping)
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm", ns="team-a")
        apply_run(s, "other", ns="team-b")
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now)
        c.open()
        try:
            wait_until(lambda: observed(c, "other").get("running") == "true", what="the other run evaluated")
            # (the two runs' passes need not be one: the tripping run's may come a slice or a pass later)
            wait_until(lambda: observed(c, "llm") == dict.fromkeys(("scheduled", "running", "progressing"), "unknown"),
                       what="the tripping run unknown")
            rc = next(r for r in c.claims.values() if r.ref.name == "llm")
            assert "could not be evaluated" in rc.running.reason
            wait_until(lambda: {r.name for r in c.exporter.runs()} == {"llm", "other"}, what="both exported")
            assert _metric(c.registry, "taugrid_collector_errors_total", source="controller",
                           **{"class": "permanent"}) >= 1
        finally:
            c.close()


def test_a_step_past_a_long_never_blocks_the_spool(tmp_path: Path) -> None:
    """2^63 serializes, but no `long` holds it: spooled, its blob fails ingestion for good and, being
    delivered oldest first, holds back every row after it. Refused alone before the spool; and a
    segment that holds one already (spooled by an older version) is delivered without it."""
    run_a, run_b = Ref("TauRun", "team-a", "llm"), Ref("TauRun", "team-b", "other")
    registry = CollectorRegistry()
    store = tmp_path / "store.duckdb"
    exporter = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool"), DuckDBTarget(store), registry=registry)
    exporter.open()
    try:
        exporter.signal(run_a, "llm-w0/main", "logs", False, _scan(1, PAST_LONG))
        exporter.signal(run_b, "other-w0/main", "logs", False, _scan(5, 6))
        # What an older version left in the spool: the same bad row, written past the checks.
        exporter.spool.append(PROGRESS_SAMPLES.name, [
            {"Timestamp": "2026-01-10T12:00:00Z", "RowId": "old-bad", "Namespace": "team-a", "Step": PAST_LONG},
            {"Timestamp": "2026-01-10T12:00:00Z", "RowId": "old-good", "Namespace": "team-a", "Step": 3}])
        exporter.flush()
        exporter.signal(run_b, "other-w0/main", "logs", False, _scan(5, 6, 7))
        exporter.flush()
    finally:
        exporter.close(drain_timeout=20)
    steps = _stored_steps(store)
    assert steps.get("team-b") == [5, 6, 7]
    assert steps.get("team-a") == [1, 3]
    assert _metric(registry, "taugrid_adx_rows_dropped_total", table=PROGRESS_SAMPLES.name, reason="invalid") == 2
    assert not list((tmp_path / "spool").glob("*.seg"))  # everything delivered, nothing stuck


def test_a_blob_refused_for_its_content_is_quarantined_and_the_rest_delivered(tmp_path: Path) -> None:
    """A target that refuses a blob for good (even without its bad rows): that segment goes to
    quarantine/ and the segments after it are delivered."""
    from exporters.adx.exporter import ExportMetrics, PermanentIngestError
    from exporters.adx.schema import Table

    class Picky(DuckDBTarget):
        def ingest(self, table: Table, blob: bytes, tag: str) -> bool:
            if b"poison" in blob:
                raise PermanentIngestError("refused")
            return super().ingest(table, blob, tag)

    exporter = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool"), Picky(tmp_path / "store.duckdb"))
    exporter.spool.open()
    row = {"Timestamp": "2026-01-10T12:00:00Z", "Namespace": "team-a", "Step": 1}
    exporter.spool.append(PROGRESS_SAMPLES.name, [{**row, "RowId": "poison"}])
    exporter.spool.seal()
    exporter.spool.append(PROGRESS_SAMPLES.name, [{**row, "RowId": "later", "Namespace": "team-b"}])
    exporter.spool.seal()
    exporter.target.open()
    try:
        Shipper(exporter.spool, exporter.target, ExportMetrics(None)).drain()
    finally:
        exporter.target.close()
        exporter.spool.close()
    assert _stored_steps(tmp_path / "store.duckdb") == {"team-b": [1]}
    assert len(list((tmp_path / "spool" / "quarantine").iterdir())) == 1


# --- explain -o json -----------------------------------------------------------------------------


def _with_step(rc: RunClaims, step: int) -> RunClaims:
    ev = Evidence(Plane.LOGS, "Pod research/llm-w0", "last_step", step, NOW)
    return replace(rc, progressing=replace(rc.progressing, evidence=(*rc.progressing.evidence, ev)))


def test_explain_json_writes_a_bad_run_as_an_error_entry(tmp_path: Path) -> None:
    tr = taurun("other", "team-b", "Running", NOW - timedelta(hours=1), workers=1)
    good = claims_of(write_dump(tmp_path / "d", [tr]))
    bad = replace(good[0], ref=Ref("TauRun", "team-a", "llm", "uid-llm"))
    doc = to_json([_with_step(bad, HUGE), good[0]], NOW)
    parsed = json.loads(orjson.dumps(doc))  # the document serializes
    by_name = {r["name"]: r for r in parsed["runs"]}
    assert "could not be written as JSON" in by_name["llm"]["error"] and by_name["llm"]["namespace"] == "team-a"
    assert by_name["other"]["claims"]["running"]["observed"] == good[0].running.observed.value


def test_explain_json_on_a_dump_with_a_huge_step_line_answers_for_every_run(tmp_path: Path) -> None:
    """The full path (dump log → parser → claims → JSON): whether the parser keeps the line (an error
    entry) or refuses it, the other tenant's run is answered and the document parses."""
    objs: list[dict[str, Any]] = []
    logs = {}
    for ns, name, last in (("team-a", "llm", HUGE), ("team-b", "other", 40)):
        objs.append(taurun(name, ns, "Running", NOW - timedelta(hours=1), workers=1))
        objs.append(pod(f"{name}-w0", ns, NOW - timedelta(hours=1), node="gpu-1", gpus=8,
                        labels={"taugrid.io/run": name}))
        lines = [f"{stamp(NOW - timedelta(seconds=60 - 10 * i))} {megatron(step)}"
                 for i, step in enumerate((37, 38, 39, last))]
        logs[(ns, f"{name}-w0")] = "\n".join(lines) + "\n"
    dump = write_dump(tmp_path / "d", objs, logs=logs)
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", stamp(NOW), "-o", "json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    runs = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert set(runs) == {"llm", "other"}
    assert runs["other"]["claims"]["progressing"]["observed"] == "true"
    progress = {e["field"]: e["value"] for e in runs["other"]["claims"]["progressing"]["evidence"]}
    assert progress["last_step"] == 40


# --- the node agent's /evidence -------------------------------------------------------------------

POD_A = "team-a_llm-w0_5f1c1d0e-9a0b-4c3d-8e7f-00000000000a"
POD_B = "team-b_other-w0_5f1c1d0e-9a0b-4c3d-8e7f-00000000000b"


def _snapshot(logs: tuple[Any, ...]) -> Snapshot:
    return Snapshot(node="gpu-0", at=0.0, nvml=NvmlStatus("ok", "ok"), gpus=(), hang_since={}, hang_sustain_s=60.0,
                    allocations=(), podresources_up=True, podresources_last_success=0.0, podresources_error="",
                    xids=(), logs=logs)


def test_agent_evidence_leaves_out_only_the_container_it_cannot_write(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 3), pod=POD_A)
    node.write(*node.steps(1, 5), pod=POD_B)
    ev = evidence(tmp_path)
    ev.poll()
    containers = {c.pod: c for c in ev.containers()}
    a = containers["llm-w0"]
    bad = replace(a, scan=replace(a.scan, samples=(*a.scan.samples, replace(a.scan.samples[-1], step=HUGE,
                                                                            line=99))))
    doc = evidence_document(_snapshot((bad, containers["other-w0"])))
    body = orjson.dumps(doc)  # the node's document serializes
    assert [e["pod"] for e in doc["errors"]] == ["llm-w0"]  # type: ignore[index]
    report = parse_evidence(orjson.loads(body), AgentEndpoint("gpu-0", "agent-x", "http://127.0.0.1:9402"),
                            datetime(2026, 1, 10, 11, tzinfo=UTC))
    assert [(c.pod, [s.step for s in c.scan.samples]) for c in report.logs] == [("other-w0", [1, 2, 3, 4, 5])]


def test_agent_evidence_through_the_log_tailer_with_a_huge_step(tmp_path: Path) -> None:
    """Full path (CRI file → tailer → parser → document): the document serializes whatever the parser
    does with the line, and the other tenant's container is in it whole."""
    node = Node(tmp_path)
    node.write(*node.steps(1, 3), node.line(megatron(HUGE)), pod=POD_A)
    node.write(*node.steps(1, 5), pod=POD_B)
    ev = evidence(tmp_path)
    ev.poll()
    doc = orjson.loads(orjson.dumps(evidence_document(_snapshot(tuple(ev.containers())))))
    logs = {c["pod"]: c for c in doc["logs"]}
    assert [s[0] for s in logs["other-w0"]["samples"]] == [1, 2, 3, 4, 5]
    assert "llm-w0" in logs or [e["pod"] for e in doc["errors"]] == ["llm-w0"]


# --- the Prometheus exposition ---------------------------------------------------------------------


def test_metrics_leave_out_a_step_no_float_holds_and_keep_the_other_runs(tmp_path: Path) -> None:
    from exporters.prometheus import ClaimsExporter, new_registry, render

    tr = taurun("other", "team-b", "Running", NOW - timedelta(hours=1), workers=1)
    good = claims_of(write_dump(tmp_path / "d", [tr]))[0]
    bad = _with_step(replace(good, ref=Ref("TauRun", "team-a", "llm", "uid-llm")), 10**400)
    registry = new_registry()
    ClaimsExporter(registry).update([bad, good], NOW)
    text = render(registry).decode()
    assert 'namespace="team-b",run="other"' in text and 'namespace="team-a",run="llm"' in text
    assert "taugrid_run_progress_last_step{" not in text  # no sample that is not a number
