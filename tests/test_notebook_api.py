"""The notebook API: `taugrid_evidence.explain` gives the `explain` command's answers as DataFrames."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import taugrid_evidence as te
from collector.cli import main

DUMP = Path(__file__).resolve().parents[1] / "samples" / "demo-dump"


def test_explain_from_a_dump_gives_the_commands_answers_as_frames() -> None:
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(DUMP), "-o", "json"])
    assert result.exit_code in (0, 3), result.stderr
    doc = json.loads(result.stdout)
    ex = te.explain(from_dump=DUMP)
    assert ex.source == f"dump:{DUMP}"
    assert pd.Timestamp(ex.evaluated_at) == pd.Timestamp(doc["evaluated_at"])
    want = {(r["namespace"], r["name"], k): (c["observed"], c["verdict"], c["reason"])
            for r in doc["runs"] for k, c in r["claims"].items()}
    got = {(row.namespace, row.name, row.claim): (row.observed, row.verdict, row.reason)
           for row in ex.claims.itertuples()}
    assert got == want and len(ex.claims) == 3 * len(doc["runs"])
    assert str(ex.claims["since"].dtype) == "datetime64[ns, UTC]"
    runs = ex.runs.set_index(["namespace", "name"])
    for r in doc["runs"]:
        row = runs.loc[(r["namespace"], r["name"])]
        assert row["blocked_stage"] == (r["blocked"]["stage"] if r["blocked"] else None)
        assert row["progressing"] == r["claims"]["progressing"]["verdict"]
        ratio = (r["goodput"] or {}).get("ratio")
        assert (pd.isna(row["goodput_ratio"]) if ratio is None else round(row["goodput_ratio"], 4) == ratio)
    n_evidence = sum(len(c["evidence"]) for r in doc["runs"] for c in r["claims"].values()) + sum(
        len(r["blocked"]["evidence"]) for r in doc["runs"] if r["blocked"])
    assert len(ex.evidence) == n_evidence
    assert ex.transitions.empty and ex.refused.empty and list(ex.refused.columns) == te.api.REFUSED_COLUMNS

    one = te.explain("research/llm-pretrain", from_dump=DUMP)
    assert list(one.runs["name"]) == ["llm-pretrain"]


def test_explain_errors_are_one_exception_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(te.ExplainError, match="no run matches nope"):
        te.explain("nope", from_dump=DUMP)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(te.ExplainError, match="no control-plane timestamps"):
        te.explain(from_dump=empty)
    with pytest.raises(te.ExplainError, match="http:// or https://"):
        te.explain(controller="ftp://x")
