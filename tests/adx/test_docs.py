"""docs/adx.md agrees with the schema and the exporter's metrics."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from exporters.adx.exporter import ExportMetrics
from exporters.adx.schema import TABLES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "adx.md").read_text()


def test_every_table_and_column_is_documented() -> None:
    for t in TABLES:
        section = DOC.split(f"### `{t.name}`", 1)
        assert len(section) == 2, f"{t.name} has no section"
        body = re.split(r"\n##+ ", section[1], maxsplit=1)[0]
        documented = re.findall(r"^\| `(\w+)` \| (\w+) \|", body, flags=re.M)
        assert documented == [(c.name, c.type) for c in t.columns], t.name


def test_every_metric_family_is_documented() -> None:
    registry = CollectorRegistry()
    ExportMetrics(registry)
    names = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    documented = set(re.findall(r"^\| `(taugrid_adx_\w+)` \|", DOC, flags=re.M))
    assert names == documented
