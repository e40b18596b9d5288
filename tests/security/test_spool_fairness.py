"""The ADX spool under a hostile tenant (issue 26): one tenant's Event flood while ADX is away must not
evict the other tenants' rows; a broken record or an unreadable segment must not hold back what
follows it; the spool's files are not readable by other users of the node."""

from __future__ import annotations

import os
import stat
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
from prometheus_client import CollectorRegistry

from collector.controller import Controller
from collector.model import EventFacts, ObjectRecord, Ref
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.embedded import DuckDBTarget
from exporters.adx.exporter import AdxExporter, ExportMetrics, ExportSettings, Shipper
from exporters.adx.schema import KUBE_EVENTS, PROGRESS_SAMPLES, RUN_CLAIMS
from exporters.adx.spool import HEADER, Spool, SpoolSettings, frame
from kubesim.server import Simulator
from tests.adx.test_spool import Outage
from tests.controller.test_controller import FAST, T0, Clock, apply_run, observed, server_side, settings, wait_until
from tests.dumpkit import event, pod
from tests.security.test_isolation import _scan

SMALL = SpoolSettings(max_bytes=64 * 1024, segment_bytes=8 * 1024)


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _rows(store: Path, table: str, column: str) -> list[tuple[str, Any]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return [(r[0], r[1]) for r in con.execute(f'SELECT "Namespace", "{column}" FROM "{table}"').fetchall()]
    finally:
        con.close()


def _event(i: int, ns: str) -> ObjectRecord:
    regarding = Ref("Pod", ns, "llm-w0")
    facts = EventFacts(regarding=regarding, reason="Pulled", message="x" * 200, type="Normal",
                       component="kubelet", first=T0, last=T0, count=1)
    return ObjectRecord(ref=Ref("Event", ns, f"flood-{i}", f"uid-{ns}-{i}"), api_version="v1", resource_version="1",
                        generation=None, created=T0, labels={}, owners=(), conditions=(), facts=facts, newest=T0)


def test_an_event_flood_while_adx_is_away_evicts_the_flooders_rows_not_the_others(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    link = Outage(DuckDBTarget(tmp_path / "store.duckdb"))
    settings_ = ExportSettings(spool_dir=tmp_path / "spool", spool=SMALL, seal_interval=timedelta(milliseconds=50),
                               retry_min=timedelta(milliseconds=20), retry_max=timedelta(milliseconds=100),
                               event_rows_per_namespace=0)  # no budget: the eviction order alone
    exp = AdxExporter(settings_, link, registry=registry)  # type: ignore[arg-type]
    exp.open()
    flood = 3000
    try:
        for i in range(flood):
            if i % 50 == 0:  # tenant B's run progresses, a step every 50 of A's events
                exp.signal(Ref("TauRun", "team-b", "other"), "other-w0/main", "logs", False,
                           _scan(*range(1, i // 50 + 2)))
            exp.event(_event(i, "team-a"), "llm")
            assert exp.spool.total_bytes <= SMALL.max_bytes
        exp.flush()
        assert _metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted") > 0
        link.down = False
        deadline = time.monotonic() + 30
        while exp.spool.sealed() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        exp.close()
    steps = sorted(s for ns, s in _rows(tmp_path / "store.duckdb", PROGRESS_SAMPLES.name, "Step") if ns == "team-b")
    assert steps == list(range(1, flood // 50 + 1))  # every step of B: none evicted for A's flood
    assert _metric(registry, "taugrid_adx_rows_dropped_total", table=PROGRESS_SAMPLES.name, reason="evicted") == 0
    events = _rows(tmp_path / "store.duckdb", KUBE_EVENTS.name, "RowId")
    evicted = _metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted")
    assert 0 < len(events) < flood and len(events) + evicted == flood  # A's rows kept or counted, never silent


def test_events_are_budgeted_per_namespace(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    exp = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool", event_rows_per_namespace=500),
                      DuckDBTarget(tmp_path / "store.duckdb"), registry=registry)
    exp.open()
    try:
        for i in range(2000):
            exp.event(_event(i, "team-a"), "llm")
        for i in range(100):
            exp.event(_event(i, "team-b"), "other")
    finally:
        exp.close()
    by_ns: dict[str, int] = {}
    for ns, _ in _rows(tmp_path / "store.duckdb", KUBE_EVENTS.name, "RowId"):
        by_ns[ns] = by_ns.get(ns, 0) + 1
    # A's bucket (500 a minute) held a few refills at most while the test ran; B's came whole.
    assert 500 <= by_ns["team-a"] < 600 and by_ns["team-b"] == 100
    assert _metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name,
                   reason="namespace_budget") == 2000 - by_ns["team-a"]


def _events_applied(c: Controller) -> float:
    return sum(s.value for fam in c.registry.collect() for s in fam.samples
               if s.name == "taugrid_collector_events_processed_total" and "event" in s.labels.get("resource", ""))


def test_only_events_about_runs_are_exported(tmp_path: Path) -> None:
    """Tenants create Events at will; only those regarding a run's objects reach the tables."""
    clock = Clock(T0)
    exporter = AdxExporter(ExportSettings(spool_dir=tmp_path / "spool"), DuckDBTarget(tmp_path / "store.duckdb"))
    exporter.open()
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        stray = server_side(pod("stray", "research", T0, node="gpu-9", gpus=0))
        s.apply(stray)
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now, sink=exporter)
        c.open()
        try:
            wait_until(lambda: observed(c, "llm").get("running") == "true" and c.synced, what="the run")
            before = _events_applied(c)
            for i in range(20):
                s.apply(server_side(event(f"noise-{i}", "research", stray, "Spam", "look at me", T0)))
            run_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm-w0", "namespace": "research"}}
            s.apply(server_side(event("about-run", "research", run_pod, "Pulled", "image present", T0)))
            wait_until(lambda: _events_applied(c) >= before + 21, what="the events applied")
        finally:
            c.close()
            exporter.close()
    names = {r for _, r in _rows(tmp_path / "store.duckdb", KUBE_EVENTS.name, "RegardingName")}
    assert names == {"llm-w0"}


def test_a_broken_length_costs_only_its_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SMALL)
    spool.open()
    rows = [{"Timestamp": "2026-01-10T10:00:00Z", "RowId": f"e{i}", "Namespace": "n", "Count": 1} for i in range(10)]
    spool.append(KUBE_EVENTS.name, rows)
    spool.seal()
    [seg] = spool.sealed()
    data = bytearray(seg.path.read_bytes())
    rec = len(frame(KUBE_EVENTS.name, rows[0]))
    data[HEADER + 3 * rec: HEADER + 3 * rec + 4] = (1 << 30).to_bytes(4, "little")  # the 4th record's length
    seg.path.write_bytes(bytes(data))
    contents = spool.read(seg)
    ids = [r.split(b'"RowId":"')[1].split(b'"')[0].decode() for r in contents.rows[KUBE_EVENTS.name]]
    assert ids == [f"e{i}" for i in range(10) if i != 3] and contents.corrupt == 1


def test_an_unreadable_segment_is_quarantined_and_the_rest_delivered(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    spool = Spool(tmp_path / "s", SMALL, critical_tables=(RUN_CLAIMS.name,))
    spool.open()
    for i in range(3):
        spool.append(KUBE_EVENTS.name, [{"Timestamp": "2026-01-10T10:00:00Z", "RowId": f"e{i}", "Namespace": "n"}])
        spool.seal()
    first = spool.sealed()[0]
    first.path.unlink()
    first.path.mkdir()  # unreadable as a file (EISDIR): as an I/O error on a failing disk would be
    target = DuckDBTarget(tmp_path / "store.duckdb")
    target.open()
    try:
        Shipper(spool, target, ExportMetrics(registry)).drain()
    finally:
        target.close()
    assert sorted(r for _, r in _rows(tmp_path / "store.duckdb", KUBE_EVENTS.name, "RowId")) == ["e1", "e2"]
    assert _metric(registry, "taugrid_adx_spool_segments_recovered_total", state="unreadable") == 1
    assert spool.sealed() == []


def test_spool_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        spool = Spool(tmp_path / "s", SMALL, critical_tables=(RUN_CLAIMS.name,))
        spool.open()
        spool.append(KUBE_EVENTS.name, [{"RowId": "e", "Namespace": "n"}])
        spool.append(RUN_CLAIMS.name, [{"RowId": "c"}])
        spool.seal()
        spool.ack(spool.sealed()[0], RUN_CLAIMS.name)
        spool.append(KUBE_EVENTS.name, [{"RowId": "f", "Namespace": "n"}])  # an open segment too
    finally:
        os.umask(old)
    for p in [tmp_path / "s", tmp_path / "s" / "quarantine"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    files = [p for p in (tmp_path / "s").iterdir() if p.is_file()]
    assert {p.suffix for p in files} >= {".seg", ".acks", ".open", ""}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    spool.close()


def test_many_equal_namespaces_share_the_evictions(tmp_path: Path) -> None:
    """Fifty tenants writing alike into a full spool: each keeps about the same share (no rewrite
    storm: with no dominant producer, whole oldest segments go)."""
    registry = CollectorRegistry()
    spool = Spool(tmp_path / "s", SMALL, events=ExportMetrics(registry))
    spool.open()
    for i in range(3000):
        spool.append(KUBE_EVENTS.name, [{"Timestamp": "2026-01-10T10:00:00Z", "RowId": f"e{i}",
                                         "Namespace": f"team-{i % 50}", "Message": "m" * 100}])
        assert spool.total_bytes <= SMALL.max_bytes
    spool.seal()
    kept: dict[str, int] = {}
    for seg in spool.sealed():
        for row in spool.read(seg).rows[KUBE_EVENTS.name]:
            ns = row.split(b'"Namespace":"')[1].split(b'"')[0].decode()
            kept[ns] = kept.get(ns, 0) + 1
    assert len(kept) == 50 and max(kept.values()) - min(kept.values()) <= 2
    evicted = _metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted")
    assert evicted + sum(kept.values()) == 3000
