"""`taugrid-evidence query NAME|FILE`: run a KQL file on the embedded DuckDB store (duckdb-kql) or
on ADX (azure-kusto-data), and print a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import orjson

from exporters.adx.kusto import AdxSettings, connection
from exporters.adx.schema import function_definitions

QUERIES_DIR = Path(__file__).resolve().parents[2] / "queries"


class QueryError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def default_store() -> Path:
    """The embedded store: $XDG_DATA_HOME/taugrid-evidence/evidence.duckdb (read when called)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "taugrid-evidence" / "evidence.duckdb"


def available() -> list[str]:
    return sorted(p.stem for p in QUERIES_DIR.glob("*.kql"))


def resolve(name_or_file: str) -> Path:
    p = Path(name_or_file)
    if p.suffix == ".kql" or p.exists():
        if not p.is_file():
            raise QueryError(f"{name_or_file}: no such query file")
        return p
    q = QUERIES_DIR / f"{name_or_file}.kql"
    if not q.is_file():
        raise QueryError(f"{name_or_file}: no such query (known: {', '.join(available()) or 'none'})")
    return q


def run_embedded(kql: str, store: Path, *, now: datetime | None = None) -> Result:
    import duckdb
    import duckdb_kql

    if not store.is_file():
        raise QueryError(f"{store}: no embedded store here (run the collector or `make demo` first)")
    try:
        con = duckdb.connect(str(store), read_only=True)
    except duckdb.Error as e:
        raise QueryError(f"{store}: cannot open the embedded store: {e}") from e
    try:
        rel = duckdb_kql.query(con, kql, query_now=now, functions=function_definitions())
        return Result(list(rel.columns), [tuple(r) for r in rel.fetchall()])
    except (duckdb_kql.KqlError, duckdb.Error) as e:
        raise QueryError(f"query failed: {e}") from e
    finally:
        con.close()


def run_adx(kql: str, settings: AdxSettings) -> Result:
    from azure.kusto.data import KustoClient
    from azure.kusto.data.exceptions import KustoError

    try:
        with KustoClient(connection(settings.query_uri, settings)) as client:
            table = client.execute_query(settings.database, kql).primary_results[0]
            columns = [c.column_name for c in table.columns]
            return Result(columns, [tuple(r) for r in table])
    except KustoError as e:
        raise QueryError(f"query failed on {settings.query_uri}: {e}") from e


def _cell(v: Any) -> Any:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return orjson.loads(v)  # dynamic values come back from DuckDB as JSON text
        except orjson.JSONDecodeError:
            return v
    return v


def render(result: Result, output: str) -> str:
    if output == "json":
        rows = [{c: _cell(v) for c, v in zip(result.columns, r, strict=True)} for r in result.rows]
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    if output == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(result.columns)
        for r in result.rows:
            w.writerow(["" if v is None else orjson.dumps(_cell(v)).decode() if isinstance(_cell(v), list | dict)
                        else _cell(v) for v in r])
        return buf.getvalue().rstrip("\n")
    from rich.console import Console
    from rich.table import Table

    t = Table(show_lines=False)
    for c in result.columns:
        t.add_column(c, overflow="fold")
    for r in result.rows:
        t.add_row(*("" if v is None else str(_cell(v)) for v in r))
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(t)
    return console.export_text().rstrip("\n") + f"\n({len(result.rows)} rows)"
