"""The spool under faults: killed mid-segment, disk full, a corrupt segment, a replay after a crash
between ingest and acknowledgement, a long outage against a bound. Nothing acknowledged is lost,
nothing is ingested twice, the spool stays within its bound, and the metrics say what happened."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from exporters.adx.embedded import DuckDBTarget
from exporters.adx.exporter import AdxExporter, ExportMetrics, ExportSettings, Shipper
from exporters.adx.schema import BY_NAME, KUBE_EVENTS, RUN_CLAIMS, Table
from exporters.adx.spool import HEADER, Spool, SpoolSettings, frame, read_records

REPO = Path(__file__).resolve().parents[2]
SMALL = SpoolSettings(max_bytes=64 * 1024, segment_bytes=8 * 1024)


def event(i: int, pad: int = 100) -> dict[str, Any]:
    return {"Timestamp": "2026-01-10T10:00:00Z", "RowId": f"e{i}", "Cluster": "c", "Uid": f"u{i}", "Count": 1,
            "Message": "m" * pad}


def claim(i: int) -> dict[str, Any]:
    return {"Timestamp": "2026-01-10T10:00:00Z", "RowId": f"c{i}", "Cluster": "c", "Run": f"run{i}",
            "Claim": "running", "Verdict": "contradicted", "Planes": ["kubernetes"]}


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def stored_ids(store: Path, table: str) -> list[str]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return [r[0] for r in con.execute(f'SELECT "RowId" FROM "{table}"').fetchall()]
    finally:
        con.close()


def spooled_ids(spool: Spool) -> list[str]:
    import orjson

    return [orjson.loads(r)["RowId"] for seg in spool.sealed() for rows in spool.read(seg).rows.values()
            for r in rows]


def drain(spool: Spool, store: Path, registry: CollectorRegistry | None = None) -> ExportMetrics:
    metrics = ExportMetrics(registry)
    target = DuckDBTarget(store)
    target.open()
    try:
        Shipper(spool, target, metrics).drain()
    finally:
        target.close()
    return metrics


def test_acknowledged_rows_survive_a_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SMALL, critical_tables=(RUN_CLAIMS.name,))
    spool.open()
    first_id = spool.id
    spool.append(RUN_CLAIMS.name, [claim(i) for i in range(5)])
    spool.append(KUBE_EVENTS.name, [event(i) for i in range(5)])
    spool.seal()
    spool.close()
    again = Spool(tmp_path / "s", SMALL)
    again.open()
    assert again.id == first_id  # the identity in ingest-by tags survives restarts
    assert sorted(spooled_ids(again)) == sorted([f"c{i}" for i in range(5)] + [f"e{i}" for i in range(5)])
    assert {s.cls for s in again.sealed()} == {"critical", "bulk"}


def _kill_mid_segment(tmp_path: Path) -> tuple[Path, Path, int]:
    """Run the writer child and SIGKILL it after 2000 acknowledged rows; (spool, ack file, open
    segments left behind). The check for an open segment and the kill race the child (it may seal
    in between), so the caller retries until the kill really left one open."""
    d = tmp_path / "spool"
    ack_file = tmp_path / "acked"
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("spool_child.py")), str(d), str(ack_file)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not (
                ack_file.exists() and len(ack_file.read_text().split()) >= 40 and list(d.glob("*.open"))):
            time.sleep(0.005)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    return d, ack_file, len(list(d.glob("*.open")))


def test_killed_mid_segment_loses_nothing_acknowledged(tmp_path: Path) -> None:
    for attempt in range(5):
        d, ack_file, left_open = _kill_mid_segment(tmp_path / f"try{attempt}")
        if left_open:
            break
    assert left_open, "five kills never caught the child with a segment open"
    acked = int(ack_file.read_text().split()[-1])
    assert acked >= 2000
    registry = CollectorRegistry()
    metrics = ExportMetrics(registry)
    spool = Spool(d, events=metrics, critical_tables=(RUN_CLAIMS.name,))
    spool.open()
    assert not list(d.glob("*.open"))  # recovered: sealed (valid prefix) or removed
    assert sum(metric(registry, "taugrid_adx_spool_segments_recovered_total", state=s)
               for s in ("reopened", "empty")) >= 1  # the segment open at the kill was found
    ids = spooled_ids(spool)
    assert len(ids) == len(set(ids))
    assert {f"r{n}" for n in range(1, acked + 1)} <= set(ids)  # every acknowledged row is there
    drain(spool, tmp_path / "store.duckdb")
    stored = stored_ids(tmp_path / "store.duckdb", RUN_CLAIMS.name) + stored_ids(tmp_path / "store.duckdb",
                                                                                   KUBE_EVENTS.name)
    assert sorted(stored) == sorted(ids)  # each exactly once
    assert spool.sealed() == []


class FullDisk:
    """A file whose writes fail with ENOSPC once `budget` bytes are written (the disk is full)."""

    budget = 0

    def __init__(self, path: Path) -> None:
        self.f: BinaryIO = open(path, "ab", buffering=0)  # noqa: SIM115

    def write(self, data: bytes) -> int:
        if len(data) > FullDisk.budget:
            # Like a real full disk, part of the buffer may have landed before the error.
            part = self.f.write(data[:FullDisk.budget // 2])
            FullDisk.budget -= part
            raise OSError(errno.ENOSPC, "No space left on device")
        FullDisk.budget -= len(data)
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def test_disk_full_refuses_rows_and_keeps_segments_readable(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = ExportMetrics(registry)
    FullDisk.budget = 10_000
    spool = Spool(tmp_path / "s", SMALL, events=metrics, critical_tables=(RUN_CLAIMS.name,),
                  open_file=FullDisk)  # type: ignore[arg-type]
    spool.open()
    taken = 0
    for i in range(100):
        taken += spool.append(KUBE_EVENTS.name, [event(i)])
    assert 0 < taken < 100
    assert metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="disk_full") == 100 - taken
    FullDisk.budget = 10**9  # space again
    assert spool.append(RUN_CLAIMS.name, [claim(1)]) == 1
    spool.seal()
    for seg in spool.sealed():
        _, end, corrupt = read_records(seg.path.read_bytes())
        assert corrupt == 0 and end == seg.path.stat().st_size  # no torn record left behind
    # To make room on the full disk the oldest bulk segments went first: counted, never silent.
    evicted = metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted")
    assert evicted > 0
    assert len(spooled_ids(spool)) == taken - evicted + 1


def test_corrupt_segment_delivers_good_records_and_is_quarantined(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SMALL)
    spool.open()
    spool.append(KUBE_EVENTS.name, [event(i) for i in range(10)])
    spool.seal()
    [seg] = spool.sealed()
    data = bytearray(seg.path.read_bytes())
    rec = len(frame(KUBE_EVENTS.name, event(0)))
    data[HEADER + 3 * rec + 40] ^= 0xFF  # a bit flip inside the 4th record's payload
    seg.path.write_bytes(bytes(data))
    registry = CollectorRegistry()
    drain(spool, tmp_path / "store.duckdb", registry)
    assert sorted(stored_ids(tmp_path / "store.duckdb", KUBE_EVENTS.name)) == sorted(
        f"e{i}" for i in range(10) if i != 3)
    assert metric(registry, "taugrid_adx_rows_dropped_total", table="?", reason="corrupt") == 1
    assert metric(registry, "taugrid_adx_spool_segments_recovered_total", state="corrupt") == 1
    assert list((tmp_path / "s" / "quarantine").iterdir())  # kept for a human
    assert spool.sealed() == []


def test_replay_after_a_crash_between_ingest_and_ack_is_not_ingested_twice(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SMALL, critical_tables=(RUN_CLAIMS.name,))
    spool.open()
    spool.append(RUN_CLAIMS.name, [claim(i) for i in range(3)])
    spool.seal()
    [seg] = spool.sealed()
    # The ingest client accepted the blob, and the process died before the spool noted it.
    target = DuckDBTarget(tmp_path / "store.duckdb")
    target.open()
    rows = spool.read(seg).rows[RUN_CLAIMS.name]
    assert target.ingest(RUN_CLAIMS, b"\n".join(rows) + b"\n", seg.tag(RUN_CLAIMS.name))
    target.close()
    registry = CollectorRegistry()
    drain(spool, tmp_path / "store.duckdb", registry)  # the restart sends it again, same tag
    assert sorted(stored_ids(tmp_path / "store.duckdb", RUN_CLAIMS.name)) == ["c0", "c1", "c2"]
    assert metric(registry, "taugrid_adx_blobs_total", result="duplicate") == 1
    assert spool.sealed() == []


def test_full_spool_evicts_bulk_before_claim_transitions(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = ExportMetrics(registry)
    spool = Spool(tmp_path / "s", SMALL, events=metrics, critical_tables=(RUN_CLAIMS.name,))
    spool.open()
    for i in range(0, 1000, 5):  # far past the bound, bulk and claims interleaved
        spool.append(KUBE_EVENTS.name, [event(j) for j in range(i, i + 5)])
        if i % 10 == 0:
            spool.append(RUN_CLAIMS.name, [claim(i)])
            spool.seal()
        assert spool.total_bytes <= SMALL.max_bytes
    spool.seal()
    ids = spooled_ids(spool)
    claims = [i for i in ids if i.startswith("c")]
    assert len(claims) == 100  # every claim transition kept: bulk went first
    assert metric(registry, "taugrid_adx_rows_dropped_total", table=RUN_CLAIMS.name, reason="evicted") == 0
    evicted = metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted")
    assert evicted > 0 and evicted + len(ids) - len(claims) == 1000  # each event either kept or counted
    # With nothing but claims left, the oldest claims go (counted), and the bound still holds.
    for i in range(1000, 1600, 4):
        spool.append(RUN_CLAIMS.name, [claim(j) for j in range(i, i + 4)])
        spool.seal()
        assert spool.total_bytes <= SMALL.max_bytes
    assert metric(registry, "taugrid_adx_rows_dropped_total", table=RUN_CLAIMS.name, reason="evicted") > 0
    assert "c1599" in spooled_ids(spool)


class Outage:
    """The real DuckDB target behind a link that can be cut (ADX unreachable)."""

    def __init__(self, target: DuckDBTarget) -> None:
        self.target = target
        self.down = True
        self.calls = 0

    def open(self) -> None:
        self.target.open()

    def close(self) -> None:
        self.target.close()

    def ingest(self, table: Table, blob: bytes, tag: str) -> bool:
        self.calls += 1
        if self.down:
            raise ConnectionError("ingest endpoint unreachable")
        return self.target.ingest(table, blob, tag)


def test_long_outage_then_recovery(tmp_path: Path) -> None:
    from datetime import timedelta

    registry = CollectorRegistry()
    link = Outage(DuckDBTarget(tmp_path / "store.duckdb"))
    settings = ExportSettings(cluster="c", spool_dir=tmp_path / "s", spool=SMALL,
                              seal_interval=timedelta(milliseconds=50), retry_min=timedelta(milliseconds=20),
                              retry_max=timedelta(milliseconds=100))
    exp = AdxExporter(settings, link, registry=registry)  # type: ignore[arg-type]
    exp.open()
    try:
        for i in range(3000):
            exp._write({KUBE_EVENTS.name: [event(i)]})
            if i % 30 == 0:
                exp._write({RUN_CLAIMS.name: [claim(i)]})
            assert exp.spool.total_bytes <= SMALL.max_bytes
        exp.flush()
        deadline = time.monotonic() + 10
        while link.calls < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(registry, "taugrid_adx_blobs_total", result="failed") >= 3
        assert metric(registry, "taugrid_adx_spool_bytes") > 0
        assert metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted") > 0
        link.down = False
        deadline = time.monotonic() + 30
        while exp.spool.sealed() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        exp.close()
    claims = stored_ids(tmp_path / "store.duckdb", RUN_CLAIMS.name)
    assert sorted(claims) == sorted(f"c{i}" for i in range(0, 3000, 30))  # all claims, once
    events = stored_ids(tmp_path / "store.duckdb", KUBE_EVENTS.name)
    evicted = metric(registry, "taugrid_adx_rows_dropped_total", table=KUBE_EVENTS.name, reason="evicted")
    assert len(events) == len(set(events)) and len(events) + evicted == 3000
    assert metric(registry, "taugrid_adx_rows_delivered_total", table=RUN_CLAIMS.name) == 100
    assert metric(registry, "taugrid_adx_last_delivery_timestamp_seconds") > 0


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path, SpoolSettings(max_bytes=10_000, segment_bytes=8192))
    assert set(BY_NAME) >= {RUN_CLAIMS.name, KUBE_EVENTS.name}


def test_tags_are_never_reused_after_restart(tmp_path: Path) -> None:
    """Every segment gets a fresh ingest-by tag: after everything was delivered and the process
    restarted, new rows must not be taken for a replay of old ones (ADX would drop them)."""
    tags = set()
    store = tmp_path / "store.duckdb"
    for round_ in range(3):
        spool = Spool(tmp_path / "s", SMALL, critical_tables=(RUN_CLAIMS.name,))
        spool.open()
        spool.append(RUN_CLAIMS.name, [claim(round_)])
        spool.seal()
        [seg] = spool.sealed()
        assert seg.tag(RUN_CLAIMS.name) == seg.tag(RUN_CLAIMS.name)  # stable for replays
        tags.add(seg.tag(RUN_CLAIMS.name))
        drain(spool, store)
        spool.close()
    assert len(tags) == 3
    assert sorted(stored_ids(store, RUN_CLAIMS.name)) == ["c0", "c1", "c2"]
