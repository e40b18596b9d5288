"""The drain advisor and the fleet lemon score (issue 28) on rows the exporter wrote: a fleet's week and
its live runs (tests/adx/riskscenario.py) through the spool into the embedded store, queried with
duckdb-kql; Microsoft's parser checks both (tests/adx/test_queries.py checks every query)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import duckdb_kql
import orjson
import pytest

from collector.claims.workrisk import drain_advice
from collector.model import RunClaims
from exporters.adx import schema
from tests.adx.conftest import REPO, kql_diagnostics
from tests.adx.riskscenario import CLUSTER, NOW, play


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[RunClaims]]]:
    d = tmp_path_factory.mktemp("risk-fleet")
    live = play(d / "store.duckdb", d / "spool", d)
    yield d / "store.duckdb", live


def query(store: Path, name: str, text: str | None = None) -> list[dict[str, Any]]:
    kql = text if text is not None else (REPO / "queries" / f"{name}.kql").read_text()
    con = duckdb.connect(str(store), read_only=True)
    try:
        rel = duckdb_kql.query(con, kql, query_now=NOW + timedelta(seconds=1),
                               functions=schema.function_definitions())
        return [{k: (orjson.loads(v) if isinstance(v, str) and v[:1] == "[" else v)
                 for k, v in zip(rel.columns, r, strict=True)} for r in rel.fetchall()]
    finally:
        con.close()


def test_both_queries_parse() -> None:
    texts = {n: (REPO / "queries" / f"{n}.kql").read_text() for n in ("drain_advisor", "gpu_lemons")}
    assert {k: v["diagnostics"] for k, v in kql_diagnostics(texts).items()} == {"drain_advisor": [], "gpu_lemons": []}


def test_drain_advisor_ranks_nodes_then_the_runs_to_checkpoint_on_each(fleet: tuple[Path, list[RunClaims]]) -> None:
    rows = query(fleet[0], "drain_advisor")
    got = [(r["Node"], r["Risk"], sorted(r["Signals"]), r["NodeGpuHoursAtRisk"], r["Run"], r["GpuHoursAtRisk"])
           for r in rows]
    assert got == [
        ("gpu-3", 80.0, ["xid-79"], 4.0, "sft", 4.0),  # the agent's XID 79, live and in GpuXids
        ("gpu-6", 60.0, ["xid-48"], 0.0, "", None),  # XID 48 3 h ago on an idle node
        ("gpu-2", 30.0, ["cordoned"], 32.0, "finetune", 24.0),  # cordoned: checkpoint finetune (6 h) first
        ("gpu-2", 30.0, ["cordoned"], 32.0, "pretrain", 8.0),
        ("gpu-5", 25.0, ["not-ready-recently"], 0.0, "eval", None),  # eval's work at risk is unknown
    ]
    assert {r["Cluster"] for r in rows} == {CLUSTER}
    assert [r["RunsUnknown"] for r in rows if r["Node"] == "gpu-5"] == [1]
    # gpu-1 (XID 13: the application's) and gpu-4 (XID 94 8 h ago) carry no risk now
    assert not {"gpu-1", "gpu-4"} & {r["Node"] for r in rows}
    # a wider XID window brings gpu-4's old XID 94 in
    wide = query(fleet[0], "", (REPO / "queries" / "drain_advisor.kql").read_text()
                 .replace("xid_window:timespan = 6h", "xid_window:timespan = 12h"))
    assert ("gpu-4", 40.0) in {(r["Node"], r["Risk"]) for r in wide}


def test_drain_advisor_query_and_the_live_ranking_agree(fleet: tuple[Path, list[RunClaims]]) -> None:
    """What the gauges rank (claims.workrisk.drain_advice) is what the query ranks, for the nodes under
    runs (the query adds nodes whose agents logged hardware XIDs with no run on them)."""
    store, live = fleet
    advice = [(a.node, a.score, a.gpu_hours) for a in drain_advice(live)]
    rows = query(store, "drain_advisor")
    from_query = list(dict.fromkeys((r["Node"], r["Risk"], r["NodeGpuHoursAtRisk"]) for r in rows if r["Run"]))
    assert from_query == advice


def test_gpu_lemons_name_the_gpu_whose_trouble_recurs(fleet: tuple[Path, list[RunClaims]]) -> None:
    rows = query(fleet[0], "gpu_lemons")
    top = rows[0]
    assert (top["Node"], top["GpuUuid"], top["LemonScore"], top["TroubledRuns"]) == ("gpu-4", "GPU-gpu-4-5", 10, 3)
    assert (top["XidRuns"], top["StragglerRuns"], top["HangRuns"], sorted(top["Codes"])) == (2, 1, 1, [48, 94])
    assert sorted(top["Runs"]) == ["research/h01", "research/h02", "research/h03"]
    # h01's hang and sft's old XID 94 on the same GPU: two runs
    assert (rows[1]["GpuUuid"], rows[1]["LemonScore"]) == ("GPU-gpu-4-6", 5)
    # gpu-5's runs hung twice: every GPU of it alike (a node problem, not one device)
    five = [r for r in rows if r["Node"] == "gpu-5"]
    assert len(five) == 8 and {(r["LemonScore"], r["HangRuns"]) for r in five} == {(4, 2)}
    # one hang (gpu-1), a crash loop (gpu-3), application XIDs (gpu-6): no lemon
    assert {r["Node"] for r in rows} == {"gpu-4", "gpu-5"} and len(rows) == 10
    assert [r["LemonScore"] for r in rows] == sorted((r["LemonScore"] for r in rows), reverse=True)


def test_gpu_lemons_threshold_and_window(fleet: tuple[Path, list[RunClaims]]) -> None:
    text = (REPO / "queries" / "gpu_lemons.kql").read_text()
    once = query(fleet[0], "", text.replace("min_runs:long = 2", "min_runs:long = 1"))
    assert {"gpu-1", "gpu-3"} <= {r["Node"] for r in once}  # h06's one hang; sft's XID 79 now
    six = {r["GpuUuid"]: r for r in once if r["Node"] == "gpu-6"}
    assert list(six) == ["GPU-gpu-6-0"]  # XID 48 with no run on it; XID 13 (GPU 2) is the application's
    assert [r[:7] for r in six["GPU-gpu-6-0"]["Runs"]] == ["no run "]
    week = query(fleet[0], "", text.replace("window:timespan = 30d", "window:timespan = 3d"))
    # within 3 days GPU-gpu-4-5 keeps only h03's XID 48: no longer recurring
    assert "GPU-gpu-4-5" not in {r["GpuUuid"] for r in week}
