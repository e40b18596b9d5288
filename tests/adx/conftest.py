"""Fixtures: the embedded store filled once per session from the default simulator scenario, and
Microsoft's KQL parser (npm @kusto/language-service-next, installed under .cache/ by .ci/run)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.adx import schema
from tests.adx.scenario import play

REPO = Path(__file__).resolve().parents[2]
QUERIES = sorted((REPO / "queries").glob("*.kql"))
PARSER_VERSION = "12.4.1"
PARSER_DIR = REPO / ".cache" / "kusto-language" / "node_modules" / "@kusto" / "language-service-next"
PARSER_HINT = (f"npm install --prefix .cache/kusto-language --no-audit --no-fund "
               f"@kusto/language-service-next@{PARSER_VERSION}  (from the repository root; .ci/run does it)")


@pytest.fixture(scope="session")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, int]]]:
    """(store path, rows delivered per table) after the whole default scenario."""
    d = tmp_path_factory.mktemp("adx-scenario")
    delivered = play(d / "store.duckdb", d / "spool")
    yield d / "store.duckdb", delivered


def kql_diagnostics(texts: dict[str, str], tables: dict[str, Any] | None = None) -> dict[str, Any]:
    """Microsoft's parser over each text against the product's schema: name → {kind, diagnostics}."""
    node = shutil.which("node")
    if node is None or not (PARSER_DIR / "Kusto.Language.Bridge.min.js").is_file():
        pytest.fail(f"Microsoft's KQL parser is not installed: {PARSER_HINT}", pytrace=False)
    req = {"database": "taugrid", "tables": tables if tables is not None else schema.parser_schema(),
           "functions": schema.parser_functions() if tables is None else {}, "texts": texts}
    p = subprocess.run([node, str(Path(__file__).with_name("kql_check.js")), str(PARSER_DIR)],
                       input=json.dumps(req).encode(), capture_output=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    out: dict[str, Any] = json.loads(p.stdout)
    return out
