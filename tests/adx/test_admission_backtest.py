"""queries/admission_eta_backtest.kql against ground truth: the RunSnapshots rows of a simulated week
(the exporter's own row builder) in the embedded store, and the coverage the week's player knows."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import duckdb_kql
import orjson

from exporters.adx import schema
from exporters.adx.embedded import DuckDBTarget

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from queue_eta_week import backtest, snapshot_rows  # noqa: E402

QUERY = (REPO / "queries" / "admission_eta_backtest.kql").read_text()


def _run(store: Path, now: Any) -> list[dict[str, Any]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        rel = duckdb_kql.query(con, QUERY, query_now=now, functions=schema.function_definitions())
        return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    finally:
        con.close()


def test_the_backtest_query_finds_what_the_week_was(tmp_path: Path) -> None:
    res = backtest(4, timedelta(hours=1))
    rows = snapshot_rows(res)
    target = DuckDBTarget(tmp_path / "store.duckdb")
    target.open()
    try:
        blob = b"".join(orjson.dumps(r) + b"\n" for r in rows)
        assert target.ingest(schema.RUN_SNAPSHOTS, blob, "week")
        # a second cluster with snapshots and no estimate: a row with nothing judged
        other = [{**r, "Cluster": "idle", "RowId": r["RowId"] + "-idle", "BlockedStage": "",
                  "AdmissionEtaLowSeconds": None} for r in rows[:3]]
        assert target.ingest(schema.RUN_SNAPSHOTS, b"".join(orjson.dumps(r) + b"\n" for r in other), "idle")
    finally:
        target.close()
    # the truth, for the estimates whose run was admitted (the query cannot judge the others)
    judged = [(p, (res.admitted_at[p.workload] - p.at).total_seconds()) for p in res.predictions
              if p.workload in res.admitted_at and res.admitted_at[p.workload] > p.at]
    inside = sum(1 for p, w in judged if p.low_s <= w <= p.high_s)
    sooner = sum(1 for p, w in judged if w < p.low_s)
    assert len(judged) > 100
    got = {r["Cluster"]: r for r in _run(tmp_path / "store.duckdb", res.end + timedelta(seconds=1))}
    assert set(got) == {"sim", "idle"}
    sim = got["sim"]
    assert (sim["Estimates"], sim["Inside"], sim["Sooner"]) == (len(judged), inside, sooner)
    assert sim["Later"] == len(judged) - inside - sooner and sim["Level"] == 0.8
    assert sim["Coverage"] == round(inside / len(judged), 3) and 0.7 <= sim["Coverage"] <= 0.9
    assert sim["Runs"] == len({p.workload for p, _ in judged})
    assert (got["idle"]["Estimates"], got["idle"]["Coverage"]) == (0, None)
    # estimates older than the window are not judged
    assert _run(tmp_path / "store.duckdb", res.end + timedelta(days=8)) == []
