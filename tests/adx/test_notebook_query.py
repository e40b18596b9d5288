"""`taugrid_evidence.query`: a queries/ KQL on the embedded store as a DataFrame, rounded for people."""

from __future__ import annotations

from pathlib import Path

import pytest

import taugrid_evidence as te
from tests.adx.test_queries import NOW, run


@pytest.mark.parametrize("name", ["goodput_by_queue_team", "time_to_schedule"])
def test_query_gives_the_rows_as_a_frame_with_floats_rounded(filled: tuple[Path, dict[str, int]], name: str) -> None:
    store, _ = filled
    rows = run(store, name)
    raw = te.query(name, store=store, now=NOW, raw=True)

    def same(v: object) -> object:  # a null cell is NaN in a float column of a frame, None in the rows
        return None if isinstance(v, float) and v != v else v
    assert [{k: same(v) for k, v in r.items()} for r in raw.to_dict("records")] == rows and rows
    shown = te.query(name, store=store, now=NOW)
    floats = [c for c in shown.columns if shown[c].dtype.kind == "f"]
    assert floats, shown.dtypes
    for c in floats:
        for value, exact in zip(shown[c], raw[c], strict=True):
            if value == value:  # not NaN
                assert abs(value - exact) <= 0.05 and len(repr(value).partition(".")[2]) <= 4, (c, value)


def test_query_errors_name_the_query(tmp_path: Path) -> None:
    with pytest.raises(te.ExplainError, match="no-such-query"):
        te.query("no-such-query", store=tmp_path / "x.duckdb")
    with pytest.raises(te.ExplainError, match="no embedded store"):
        te.query("goodput_by_queue_team", store=tmp_path / "x.duckdb")
