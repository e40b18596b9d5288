"""Every query in queries/ and every management command: Microsoft's parser finds nothing to say,
duckdb-kql answers them on tables the exporter filled from the simulator scenario, and the
official azure-kusto-data client gets the same answers from duckdb-kql's Kusto REST endpoint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import duckdb_kql
import orjson
import pytest
from click.testing import CliRunner

from collector.cli import main
from exporters.adx import schema
from tests.adx.conftest import QUERIES, kql_diagnostics
from tests.adx.scenario import CLUSTER, END_S, T0
from tests.netutil import free_port, stop_process

NOW = T0 + timedelta(seconds=END_S + 1)


def run(store: Path, name: str) -> list[dict[str, Any]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        rel = duckdb_kql.query(con, next(q for q in QUERIES if q.stem == name).read_text(), query_now=NOW,
                               functions=schema.function_definitions())
        return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    finally:
        con.close()


def _json(v: Any) -> Any:
    return orjson.loads(v) if isinstance(v, str) else v


BROKEN = {
    "column": "RunSnapshots | where Stage == 'x'",
    "type": "RunSnapshots | where GoodputRatio > 'high'",
    "command": ".create-merge table ['X'] (['a']:strin)",
    "keyword": "let latest = RunClaims; latest",
    "function-column": "RunClaimsDeduped() | where Stage == 'x'",
    "function": "RunClaimsDedup() | count",
}


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    """One run of Microsoft's parser over every query, every management command, and BROKEN."""
    texts = {q.stem: q.read_text() for q in QUERIES}
    commands = {f"cmd{i}": c for i, c in enumerate(schema.management_commands())}
    return kql_diagnostics({**texts, **commands, **{f"broken-{k}": v for k, v in BROKEN.items()}})


def test_parser_accepts_every_query_and_management_command(parsed: dict[str, Any]) -> None:
    mine = {k: v for k, v in parsed.items() if not k.startswith("broken-")}
    assert len(mine) == len(QUERIES) + 2 * len(schema.TABLES) + len(schema.FUNCTIONS)
    assert {k: v["diagnostics"] for k, v in mine.items() if v["diagnostics"]} == {}
    assert {v["kind"] for k, v in mine.items() if k.startswith("cmd")} == {"Command"}
    assert {v["kind"] for k, v in mine.items() if not k.startswith("cmd")} == {"Query"}


def test_parser_check_catches_what_it_should(parsed: dict[str, Any]) -> None:
    """The check can fail: an unknown column, a type error, a broken command, a reserved name."""
    for k in BROKEN:
        assert parsed[f"broken-{k}"]["diagnostics"], k


def test_every_query_file_says_what_it_answers() -> None:
    assert len(QUERIES) >= 9
    for q in QUERIES:
        head = q.read_text().splitlines()
        assert head[0].startswith("// ") and any(line.startswith("// Parameters:") for line in head[:6]), q.name
        assert ("Needs adx-mon" in q.read_text()) == q.stem.endswith("_adxmon"), q.name


def test_tables_filled_from_the_scenario(filled: tuple[Path, dict[str, int]]) -> None:
    store, delivered = filled
    con = duckdb.connect(str(store), read_only=True)
    try:
        for t in schema.TABLES + schema.ADX_MON_TABLES:
            n = con.execute(f'SELECT count(*), count(DISTINCT "{t.columns[1].name}") FROM "{t.name}"').fetchone()
            assert n is not None and n[0] > 0, t.name
        # Exactly once: every RowId once, and no blob tag twice.
        for t in schema.TABLES:
            rows, ids = con.execute(f'SELECT count(*), count(DISTINCT "RowId") FROM "{t.name}"').fetchone() or (0, 0)
            assert rows == ids, t.name
        claims = con.execute('SELECT DISTINCT "Cluster" FROM "RunClaims"').fetchall()
        assert claims == [(CLUSTER,)]
        # Events are tied to their run; a repeating event is one row per count it reached.
        backoff = con.execute('SELECT "Uid", "Count" FROM "KubeEvents" WHERE "Run" = \'bert-large\' '
                              'AND "Reason" = \'BackOff\' ORDER BY "Count"').fetchall()
        assert backoff and len(backoff) == len(set(backoff))
    finally:
        con.close()


def test_running_not_progressing(filled: tuple[Path, dict[str, int]]) -> None:
    rows = run(filled[0], "running_not_progressing")
    assert [(r["Cluster"], r["Queue"], r["Runs"]) for r in rows] == [(CLUSTER, "a100", 1)]
    assert _json(rows[0]["RunNames"]) == ["research/llm-sft"]
    assert _json(rows[0]["Causes"]) == ["nccl-watchdog-timeout"]  # stalled at 6m; the watchdog fired at 16m


def test_contradictions_by_plane(filled: tuple[Path, dict[str, int]]) -> None:
    rows = run(filled[0], "contradictions_by_plane")
    by = {(r["Plane"], r["Claim"]): set(_json(r["RunNames"])) for r in rows}
    assert "team-b/bert-large" in by[("kubernetes", "running")]  # the crash loop, seen on the pods
    assert "research/llm-sft" in by[("logs", "progressing")]  # the stall, seen in the logs
    assert all(r["Contradictions"] == len(_json(r["RunNames"])) for r in rows)


def test_time_to_schedule(filled: tuple[Path, dict[str, int]]) -> None:
    rows = {(r["Dimension"], r["Value"]): r for r in run(filled[0], "time_to_schedule")}
    h100 = rows[("queue", "h100")]  # rl-sweep waited for the node scale-up (H100 nodes at 4m35s)
    assert h100["Runs"] == 1 and 240 <= h100["P50Seconds"] <= 280 and h100["P95Seconds"] == h100["P50Seconds"]
    assert rows[("queue", "a100")]["P50Seconds"] < 30  # admitted and bound within seconds
    assert rows[("blocked-stage", "node-scaling")]["P95Seconds"] >= 240
    for r in rows.values():
        assert r["P50Seconds"] <= r["P95Seconds"]


def test_goodput_by_queue_and_team(filled: tuple[Path, dict[str, int]]) -> None:
    rows = {(r["Queue"], r["Team"]): r for r in run(filled[0], "goodput_by_queue_team")}
    assert rows[("h100", "team-b")]["Goodput"] > 0.8  # rl-sweep trains steadily once it runs
    assert rows[("a100", "team-b")]["Goodput"] < 0.3  # bert-large crash-loops
    assert rows[("a100", "team-b")]["RestartingSeconds"] > 600
    assert rows[("a100", "research")]["StalledSeconds"] > 300  # llm-sft stalled at 6m
    for r in rows.values():
        assert r["ProductiveSeconds"] <= r["AllocatedSeconds"]


def test_gpu_xids(filled: tuple[Path, dict[str, int]]) -> None:
    rows = run(filled[0], "gpu_xids")
    assert [(r["Node"], r["Gpu"], r["Code"], r["Xids"]) for r in rows] == [
        ("aks-a100-0", 3, 79, 2), ("aks-a100-2", 0, 13, 1), ("aks-a100-3", 5, 48, 1)]


def test_stalls_by_cause(filled: tuple[Path, dict[str, int]]) -> None:
    rows = {r["StallCause"]: r for r in run(filled[0], "stalls_by_cause")}
    assert set(rows) == {"crash-loop", "nccl-watchdog-timeout"}
    assert _json(rows["crash-loop"]["RunNames"]) == ["team-b/bert-large"]
    assert _json(rows["nccl-watchdog-timeout"]["RunNames"]) == ["research/llm-sft"]
    assert rows["nccl-watchdog-timeout"]["StalledSeconds"] > 300


def test_evidence_freshness(filled: tuple[Path, dict[str, int]]) -> None:
    rows = {r["Evidence"]: r for r in run(filled[0], "evidence_freshness")}
    assert set(rows) == {"run snapshots", "claim transitions", "kubernetes events", "progress samples", "gpu samples"}
    assert rows["run snapshots"]["AgeSeconds"] <= 60 and not rows["run snapshots"]["Stale"]
    assert rows["gpu samples"]["AgeSeconds"] == 7 * 60 + 1  # the last agent sample was at 10m
    assert all(r["Stale"] == (r["AgeSeconds"] > 600) for r in rows.values())


def test_adx_mon_shape_queries(filled: tuple[Path, dict[str, int]]) -> None:
    sync = {r["Resource"]: r for r in run(filled[0], "source_sync_adxmon")}
    assert {"pods", "nodes", "events.events.k8s.io"} <= set(sync)
    assert all(not r["Stale"] and 0 <= r["AgeSeconds"] <= 60 for r in sync.values())
    rate = {r["Run"]: r for r in run(filled[0], "progress_rate_adxmon")}
    assert rate["llm-pretrain"]["StepsPerMinute"] == pytest.approx(6.0, abs=0.5)  # a step every 10 s
    assert rate["rl-sweep"]["StepsPerMinute"] == pytest.approx(6.0, abs=0.5)
    assert rate["llm-sft"]["StepsPerMinute"] < 6  # 12/min until it stalled at 6m


def test_query_command(filled: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    runner = CliRunner()
    for q in QUERIES:
        res = runner.invoke(main, ["query", q.stem, "--store", str(filled[0]), "--now", NOW.isoformat(),
                                   "-o", "json"])
        assert res.exit_code == 0, (q.stem, res.output)
        assert isinstance(orjson.loads(res.output), list)
    res = runner.invoke(main, ["query", "gpu_xids", "--store", str(filled[0]), "--now", NOW.isoformat(), "-o", "csv"])
    assert res.output.splitlines()[0].startswith("Cluster,Node,Gpu,GpuUuid,Code,Xids")
    res = runner.invoke(main, ["query", "no_such_query", "--store", str(filled[0])])
    assert res.exit_code != 0 and "no such query" in res.output and "gpu_xids" in res.output
    bad = tmp_path / "bad.kql"
    bad.write_text("RunClaims | where NoSuchColumn == 1")
    res = runner.invoke(main, ["query", str(bad), "--store", str(filled[0])])
    assert res.exit_code != 0 and str(bad) in res.output and "NoSuchColumn" in res.output


def _wide(kql: str) -> str:
    """Widen the time windows: the REST endpoint evaluates now() on the wall clock. The lemon score's
    recurrence threshold goes to 1: the scenario's runs each meet their trouble once."""
    kql = kql.replace("min_runs:long = 2", "min_runs:long = 1")
    return re.sub(r"(\w+:timespan = )\d+[dhm]", lambda m: m.group(1) + "36500d" if "max_age" not in m.group(1)
                  else m.group(0), kql)


def test_official_client_against_the_rest_endpoint(filled: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    from azure.kusto.data import KustoClient, KustoConnectionStringBuilder

    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    served = tmp_path / "store.duckdb"  # a copy: the server holds its file's lock
    shutil.copyfile(filled[0], served)
    functions = tmp_path / "functions.kql"  # what the exporter creates on ADX, for the endpoint
    functions.write_text("\n".join(schema.function_definitions()) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "duckdb_kql", "serve", "-p", str(port), "--functions",
                             str(functions), str(served)], stdout=log, stderr=subprocess.STDOUT)
    try:
        kcsb = KustoConnectionStringBuilder.with_no_authentication(f"http://127.0.0.1:{port}")
        with KustoClient(kcsb) as client:
            import time

            deadline = time.monotonic() + 30
            while True:
                try:
                    client.execute_mgmt("store", ".show tables")
                    break
                except Exception:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.2)
            con = duckdb.connect(str(filled[0]), read_only=True)
            try:
                for q in QUERIES:
                    kql = _wide(q.read_text())
                    rel = duckdb_kql.query(con, kql, functions=schema.function_definitions())
                    local = [tuple(_norm(v) for v in r) for r in rel.fetchall()]
                    table = client.execute_query("store", kql).primary_results[0]
                    remote = [tuple(_norm(v) for v in r) for r in table]
                    cols = [c.column_name for c in table.columns]
                    assert cols == list(rel.columns), q.stem
                    if q.stem == "evidence_freshness":  # ages move with the wall clock between the two calls
                        keep = [i for i, c in enumerate(cols) if c not in ("AgeSeconds", "Stale")]
                        local = [tuple(r[i] for i in keep) for r in local]
                        remote = [tuple(r[i] for i in keep) for r in remote]
                    assert remote == local, q.stem
                    assert remote, f"{q.stem}: no rows to compare"
            finally:
                con.close()
        # The query command's ADX path (azure-kusto-data) against the same endpoint.
        count = tmp_path / "count.kql"
        count.write_text("RunClaims | summarize Rows = count() by Claim | order by Claim asc")
        via_adx = CliRunner().invoke(main, ["query", str(count), "--adx", f"http://127.0.0.1:{port}",
                                            "--database", "store", "--auth", "none", "-o", "json"])
        local = CliRunner().invoke(main, ["query", str(count), "--store", str(filled[0]), "-o", "json"])
        assert via_adx.exit_code == 0 and local.exit_code == 0, via_adx.output
        assert orjson.loads(via_adx.output) == orjson.loads(local.output) and orjson.loads(local.output)
    finally:
        stop_process(proc, 10)
        log.close()


def _norm(v: Any) -> Any:
    """One representation per value across the two clients (datetimes, JSON text, floats)."""
    if hasattr(v, "isoformat"):
        return v.replace(tzinfo=None).isoformat() if hasattr(v, "tzinfo") else v.isoformat()
    if isinstance(v, str) and v[:1] in ("[", "{"):  # not "": an empty string is in every string
        v = orjson.loads(v)
    if isinstance(v, list) and all(isinstance(x, str | int | float) for x in v):
        v = sorted(v, key=str)  # make_set has no order, on either engine
    if isinstance(v, list | dict):
        return orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
    if isinstance(v, float):
        return round(v, 6)
    return v


def test_claim_transitions(filled: tuple[Path, dict[str, int]]) -> None:
    """Every transition the exporter wrote, once (one replica here: no copies to drop)."""
    rows = run(filled[0], "claim_transitions")
    con = duckdb.connect(str(filled[0]), read_only=True)
    try:
        want = con.execute('SELECT "Cluster", "Claim", "Verdict", count(*), count(DISTINCT ("Namespace", "Run")) '
                           'FROM "RunClaims" GROUP BY ALL ORDER BY ALL').fetchall()
    finally:
        con.close()
    assert [(r["Cluster"], r["Claim"], r["Verdict"], r["Transitions"], r["Runs"]) for r in rows] == want
    by = {(r["Claim"], r["Verdict"]): r for r in rows}
    assert by[("running", "contradicted")]["Runs"] >= 1  # bert-large's crash loop
    assert by[("progressing", "contradicted")]["Runs"] >= 1  # llm-sft's stall
