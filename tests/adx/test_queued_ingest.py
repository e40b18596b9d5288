"""The queued ingestion path end to end on loopback: the exporter's spool → azure-kusto-ingest's
QueuedIngestClient → a local DM endpoint's Azurite SAS URLs → blob in Azurite + queue message with
ingest-by tags → the test drains the queue like ADX's DM and loads the blobs into DuckDB. Every
row arrives exactly once, through an Azurite outage and a replay."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from exporters.adx.exporter import AdxExporter, ExportSettings
from exporters.adx.kusto import AdxSettings, KustoQueuedTarget
from exporters.adx.rows import GpuXid
from exporters.adx.schema import GPU_XIDS, KUBE_EVENTS, RUN_CLAIMS, management_commands
from exporters.adx.spool import SpoolSettings
from tests.adx.dm import AzuriteBlobQueue, Dm

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[AzuriteBlobQueue, Dm]]:
    az = AzuriteBlobQueue(tmp_path / "azurite")
    az.start()
    az.create()
    dm = Dm(az)
    dm.start()
    try:
        yield az, dm
    finally:
        dm.stop()
        az.stop()


def exporter(tmp_path: Path, dm: Dm, registry: CollectorRegistry) -> AdxExporter:
    target = KustoQueuedTarget(AdxSettings(query_uri=dm.url, ingest_uri=dm.url, database="taugrid", auth="none"))
    settings = ExportSettings(cluster="c1", spool_dir=tmp_path / "spool",
                              spool=SpoolSettings(max_bytes=4 << 20, segment_bytes=64 << 10),
                              seal_interval=timedelta(milliseconds=100), retry_min=timedelta(milliseconds=50),
                              retry_max=timedelta(milliseconds=200))
    return AdxExporter(settings, target, registry=registry)


def rows(n0: int, n: int) -> dict[str, list[dict[str, object]]]:
    ts = T0.isoformat().replace("+00:00", "Z")
    return {
        RUN_CLAIMS.name: [{"Timestamp": ts, "RowId": f"c{i}", "Cluster": "c1", "Run": f"r{i}", "Claim": "running",
                           "Verdict": "contradicted", "Planes": ["kubernetes"]} for i in range(n0, n0 + n)],
        KUBE_EVENTS.name: [{"Timestamp": ts, "RowId": f"e{i}", "Cluster": "c1", "Uid": f"u{i}", "Count": 1,
                            "Message": "Back-off restarting failed container"} for i in range(n0, n0 + n)],
    }


def ids(store: Path, table: str) -> list[str]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return sorted(r[0] for r in con.execute(f'SELECT "RowId" FROM "{table}"').fetchall())
    finally:
        con.close()


def wait_empty(exp: AdxExporter, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while exp.spool.sealed() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not exp.spool.sealed(), "the spool did not drain"


def test_every_row_arrives_exactly_once(stack: tuple[AzuriteBlobQueue, Dm], tmp_path: Path) -> None:
    az, dm = stack
    registry = CollectorRegistry()
    exp = exporter(tmp_path, dm, registry)
    exp.open()
    try:
        for k in range(5):
            exp._write(rows(k * 20, 20))
        exp.gpu(xids=[GpuXid(T0, "node-1", 79, 0, "GPU-1", "0000:3b:00.0", "fallen off the bus", "reset")])
        exp.flush()
        wait_empty(exp)
        # Azurite goes away for a while: rows keep coming, nothing is lost, the metrics say so.
        az.stop()
        for k in range(5, 10):
            exp._write(rows(k * 20, 20))
        exp.flush()
        time.sleep(3)
        # Kept while ADX's storage is unreachable (the SDK retries inside, then the spool backs off),
        # and the metrics show the backlog.
        assert exp.spool.sealed()
        assert (registry.get_sample_value("taugrid_adx_spool_bytes") or 0) > 0
        assert (registry.get_sample_value("taugrid_adx_spool_oldest_age_seconds") or 0) > 0
        az.start()
        wait_empty(exp, 120)
    finally:
        exp.close()
    assert ".get ingestion resources" in dm.commands and ".get kusto identity token" in dm.commands
    assert [c for c in dm.commands if c.startswith(".create")] == list(management_commands())
    store = tmp_path / "adx.duckdb"
    messages = dm.drain(store)
    for m in messages:
        props = m["AdditionalProperties"]
        tag = json.loads(props["ingestIfNotExists"])[0]
        assert f"ingest-by:{tag}" in json.loads(props["tags"])
        assert props["ingestionMappingReference"] == f"{m['TableName']}_json" and props["format"] == "multijson"
    assert ids(store, RUN_CLAIMS.name) == sorted(f"c{i}" for i in range(200))
    assert ids(store, KUBE_EVENTS.name) == sorted(f"e{i}" for i in range(200))
    assert ids(store, GPU_XIDS.name) and len(ids(store, GPU_XIDS.name)) == 1
    assert registry.get_sample_value("taugrid_adx_rows_delivered_total", {"table": RUN_CLAIMS.name}) == 200


def test_replay_after_restart_is_dropped_by_its_tag(stack: tuple[AzuriteBlobQueue, Dm], tmp_path: Path) -> None:
    """The process dies after the ingest client accepted a blob and before the spool noted it: the
    next start sends the same blob with the same ingest-by tag, and ingestIfNotExists drops it."""
    az, dm = stack
    registry = CollectorRegistry()
    exp = exporter(tmp_path, dm, registry)
    exp.spool.open()
    exp.spool.append(RUN_CLAIMS.name, rows(0, 10)[RUN_CLAIMS.name])
    exp.spool.seal()
    [seg] = exp.spool.sealed()
    exp.target.open()
    blob = b"\n".join(exp.spool.read(seg).rows[RUN_CLAIMS.name]) + b"\n"
    exp.target.ingest(RUN_CLAIMS, blob, seg.tag(RUN_CLAIMS.name))  # accepted, then "crash"
    exp.target.close()
    exp.open()  # the restart: the segment is still there and goes again
    try:
        wait_empty(exp)
    finally:
        exp.close()
    messages = dm.drain(tmp_path / "adx.duckdb")
    assert len(messages) == 2  # two uploads, one ingestion
    assert ids(tmp_path / "adx.duckdb", RUN_CLAIMS.name) == sorted(f"c{i}" for i in range(10))


def test_a_transition_written_again_on_failover_counts_once(stack: tuple[AzuriteBlobQueue, Dm],
                                                            tmp_path: Path) -> None:
    """Two leaders in turn: the standby that takes over writes the old leader's last transitions
    again under the same RowIds (and its own, later, Timestamp), through its own spool, so other
    ingest-by tags: ADX keeps both copies. Queried with the official client, RunClaims counts the
    copies; RunClaimsDeduped() (the stored function the exporter creates) and the shipped queries
    built on it count each transition once, at its first write."""
    import subprocess
    import sys

    from azure.kusto.data import KustoClient, KustoConnectionStringBuilder

    from exporters.adx.schema import function_definitions
    from tests.adx.test_queries import _wide
    from tests.netutil import free_port, stop_process

    def claim(i: int, at: datetime) -> dict[str, object]:
        return {"Timestamp": at.isoformat().replace("+00:00", "Z"), "RowId": f"t{i}", "Cluster": "c1",
                "Namespace": "research", "Run": f"run-{i % 3}", "Kind": "TauRun", "Claim": "running",
                "Verdict": "contradicted" if i % 2 else "verified", "Planes": ["kubernetes"]}

    _, dm = stack
    old_leader = [claim(i, T0 + timedelta(minutes=i)) for i in range(6)]  # t0..t5
    standby = [claim(i, T0 + timedelta(minutes=10)) for i in range(3, 6)] + [claim(6, T0 + timedelta(minutes=11))]
    for name, batch in (("old-leader", old_leader), ("standby", standby)):
        exp = exporter(tmp_path / name, dm, CollectorRegistry())
        exp.open()
        try:
            exp._write({RUN_CLAIMS.name: batch})
            exp.flush()
            wait_empty(exp)
        finally:
            exp.close()
    assert [c for c in dm.commands if c.startswith(".create")] == 2 * list(management_commands())
    store = tmp_path / "adx.duckdb"
    dm.drain(store)
    assert sorted(ids(store, RUN_CLAIMS.name)) == sorted([f"t{i}" for i in range(7)] + ["t3", "t4", "t5"])

    port = free_port()
    functions = tmp_path / "functions.kql"
    functions.write_text("\n".join(function_definitions()) + "\n")
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "duckdb_kql", "serve", "-p", str(port), "--functions",
                             str(functions), str(store)], stdout=log, stderr=subprocess.STDOUT)
    try:
        with KustoClient(KustoConnectionStringBuilder.with_no_authentication(f"http://127.0.0.1:{port}")) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.execute_mgmt("adx", ".show tables")
                    break
                except Exception:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.2)

            def query(kql: str) -> list[tuple[object, ...]]:
                return [tuple(r) for r in client.execute_query("adx", kql).primary_results[0]]

            assert query("RunClaims | count") == [(10,)]  # the copies are there
            assert query("RunClaimsDeduped() | count") == [(7,)]
            first = query("RunClaimsDeduped() | where RowId == 't4' | project Timestamp")
            assert [t.replace(tzinfo=None) for (t,) in first] == [(T0 + timedelta(minutes=4)).replace(tzinfo=None)]
            repo = Path(__file__).resolve().parents[2]
            rows = query(_wide((repo / "queries" / "claim_transitions.kql").read_text()))
            # t0, t2, t4, t6 verified; t1, t3, t5 contradicted; over run-0, run-1, run-2.
            assert rows == [("c1", "running", "contradicted", 3, 3), ("c1", "running", "verified", 4, 3)]
            rows = query(_wide((repo / "queries" / "contradictions_by_plane.kql").read_text()))
            assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("c1", "kubernetes", "running", 1)]
    finally:
        stop_process(proc, 10)
        log.close()
