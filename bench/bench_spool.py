"""ADX spool throughput on one core, beside a baseline measured in the same run.

Rows are realistic KubeEvents rows (~400 bytes of JSON each). Timed:
  - baseline:  the same rows as plain JSON lines into a buffered file, no checksums, no fsync;
  - spool:     Spool.append in exporter-sized batches, sealed (fsync + rename) at each 4 MiB segment;
  - spool, acknowledged per batch: sealed after every batch (how claim transitions are written);
  - to blob:   Shipper reading sealed segments (checksums checked) into per-table JSON-lines blobs
               handed to a target that keeps them in memory, against reading the baseline file back
               as lines; and into the embedded DuckDB store.
Usage: .venv/bin/python bench/bench_spool.py [--rows 200000] [--batch 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from exporters.adx.embedded import DuckDBTarget
from exporters.adx.exporter import ExportMetrics, Shipper
from exporters.adx.schema import KUBE_EVENTS, Table
from exporters.adx.spool import Spool, SpoolSettings


def rows(n: int) -> list[dict[str, Any]]:
    return [{"Timestamp": f"2026-01-10T10:{i // 60 % 60:02d}:{i % 60:02d}Z", "RowId": f"{i:024x}",
             "Cluster": "aks-westeurope-1", "Namespace": "team-b", "Uid": f"9b2c{i:032x}", "Count": i % 17 + 1,
             "Type": "Warning", "Reason": "BackOff",
             "Message": f"Back-off restarting failed container ray-worker in pod bert-large-w{i % 8}_team-b({i:x})",
             "RegardingKind": "Pod", "RegardingName": f"bert-large-w{i % 8}", "Component": "kubelet",
             "FirstSeen": "2026-01-10T10:00:00Z", "Run": "bert-large"} for i in range(n)]


class MemoryTarget:
    def __init__(self) -> None:
        self.bytes = 0

    def open(self) -> None:
        return

    def close(self) -> None:
        return

    def ingest(self, table: Table, blob: bytes, tag: str) -> bool:
        self.bytes += len(blob)
        return True


def baseline_write(path: Path, data: list[dict[str, Any]]) -> float:
    t = time.perf_counter()
    with open(path, "wb") as f:
        for r in data:
            f.write(orjson.dumps(r) + b"\n")
    return time.perf_counter() - t


def spool_write(d: Path, data: list[dict[str, Any]], batch: int, seal_each: bool) -> float:
    spool = Spool(d, SpoolSettings(max_bytes=1 << 34, segment_bytes=4 << 20))
    spool.open()
    t = time.perf_counter()
    for i in range(0, len(data), batch):
        spool.append(KUBE_EVENTS.name, data[i:i + batch])
        if seal_each:
            spool.seal()
    spool.seal()
    elapsed = time.perf_counter() - t
    spool.close()
    return elapsed


def baseline_read(path: Path) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    with open(path, "rb") as f:
        for line in f:
            n += len(line)
    return time.perf_counter() - t, n


def ship(d: Path, target: Any) -> float:
    spool = Spool(d, SpoolSettings(max_bytes=1 << 34, segment_bytes=4 << 20))
    spool.open()
    target.open()
    t = time.perf_counter()
    Shipper(spool, target, ExportMetrics(None)).drain()
    elapsed = time.perf_counter() - t
    target.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--acked-rows", type=int, default=5_000, help="rows for the seal-every-batch case")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    data = rows(args.rows)
    size = sum(len(orjson.dumps(r)) + 1 for r in data)
    work = Path(tempfile.mkdtemp(prefix="bench-spool-"))
    try:
        base = baseline_write(work / "plain.jsonl", data)
        spooled = spool_write(work / "spool", data, args.batch, seal_each=False)
        acked = spool_write(work / "acked", data[:args.acked_rows], 1, seal_each=True)
        read_base, _ = baseline_read(work / "plain.jsonl")
        mem = MemoryTarget()
        to_blob = ship(work / "spool", mem)
        spool_write(work / "spool2", data, args.batch, seal_each=False)
        to_duck = ship(work / "spool2", DuckDBTarget(work / "store.duckdb"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = args.rows
    mb = size / 1e6
    print(f"{n:,} KubeEvents rows, {mb:.1f} MB as JSON lines, one core, batch {args.batch}")
    print(f"{'case':58} {'rows/s':>12} {'MB/s':>8} {'vs baseline':>12}")

    def line(name: str, rows_n: int, secs: float, ref: float | None) -> None:
        rate = rows_n / secs
        ratio = "" if ref is None else f"{rate / ref:.2f}×"
        print(f"{name:58} {rate:12,.0f} {rows_n / n * mb / secs:8.1f} {ratio:>12}")

    base_rate = n / base
    line("baseline: plain JSON lines, buffered, no fsync", n, base, None)
    line("spool append (checksummed, fsync + rename per 4 MiB)", n, spooled, base_rate)
    line("spool append, fsync + rename after every row", args.acked_rows, acked, base_rate)
    read_rate = n / read_base
    line("baseline: read the JSON lines file back", n, read_base, None)
    line("spool → blobs (read, checksums, group by table, join)", n, to_blob, read_rate)
    line("spool → embedded DuckDB store (read_json, dedup by RowId)", n, to_duck, read_rate)


if __name__ == "__main__":
    main()
