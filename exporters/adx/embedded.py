"""The embedded default: the same tables in a local DuckDB file, filled from the same spool.

Idempotent like ADX with ingest-by tags: a blob's tag is recorded in the same transaction as its
rows, so a replayed blob is skipped; and a row whose RowId is already stored is not stored again.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

from exporters.adx.exporter import PermanentIngestError
from exporters.adx.schema import _DUCK_TYPES, ADX_MON_TABLES, TABLES, Table

TAGS_TABLE = "_IngestTags"


def connect(path: Path, *, read_only: bool = False) -> Any:
    import duckdb  # imported here: only the embedded store and `query` need it

    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    return duckdb.connect(str(path), read_only=read_only)


def create_tables(con: Any, tables: tuple[Table, ...] = TABLES + ADX_MON_TABLES) -> None:
    """Like `.create-merge table`: create what is missing, add columns a newer schema has."""
    for t in tables:
        cols = ", ".join(f'"{c.name}" {_DUCK_TYPES[c.type]}' for c in t.columns)
        key = ', PRIMARY KEY ("RowId")' if "RowId" in t.column_names() else ""
        con.execute(f'CREATE TABLE IF NOT EXISTS "{t.name}" ({cols}{key})')
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [t.name]).fetchall()}
        for c in t.columns:
            if c.name not in have:
                con.execute(f'ALTER TABLE "{t.name}" ADD COLUMN "{c.name}" {_DUCK_TYPES[c.type]}')
    con.execute(f'CREATE TABLE IF NOT EXISTS "{TAGS_TABLE}" (tag VARCHAR PRIMARY KEY, rows BIGINT)')


class DuckDBTarget:
    """An IngestTarget writing blobs (JSON lines of one table) into a DuckDB file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._con: Any = None
        self._lock = threading.Lock()
        self._tmp: Path | None = None

    def open(self) -> None:
        self._con = connect(self.path)
        create_tables(self._con)
        self._tmp = Path(tempfile.mkdtemp(prefix="taugrid-duckdb-"))  # DuckDB reads blobs from files

    def latest_claims(self, cluster: str) -> list[dict[str, Any]]:
        """The latest `RunClaims` row of every run and claim of `cluster`: what was exported last."""
        assert self._con is not None, "open() first"
        cols = ("RowId", "Kind", "Namespace", "Run", "RunUid", "Claim", "Verdict", "Observed", "PreviousVerdict",
                "Since")
        with self._lock:
            con = self._con.cursor()
            try:
                got = con.execute(
                    f'SELECT {", ".join(cols)} FROM "RunClaims" WHERE "Cluster" = ? QUALIFY row_number() OVER '
                    '(PARTITION BY "Kind", "Namespace", "Run", "RunUid", "Claim" ORDER BY "Timestamp" DESC) = 1',
                    [cluster]).fetchall()
            finally:
                con.close()
        return [dict(zip(cols, row, strict=True)) for row in got]

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        if self._tmp is not None:
            for p in self._tmp.glob("*"):
                p.unlink()
            self._tmp.rmdir()
            self._tmp = None

    def ingest(self, table: Table, blob: bytes, tag: str) -> bool:
        """Store the blob's rows; False when this tag was already ingested (a replay)."""
        assert self._con is not None and self._tmp is not None, "open() first"
        with self._lock:
            con = self._con.cursor()
            try:
                con.execute("BEGIN TRANSACTION")
                if con.execute(f'SELECT 1 FROM "{TAGS_TABLE}" WHERE tag = ?', [tag]).fetchone():
                    con.execute("ROLLBACK")
                    return False
                src = self._tmp / "blob.jsonl"
                src.write_bytes(blob)
                cols = ", ".join(f"'{c.name}': '{_DUCK_TYPES[c.type]}'" for c in table.columns)
                names = ", ".join(f'"{c.name}"' for c in table.columns)
                ignore = "OR IGNORE " if "RowId" in table.column_names() else ""
                con.execute(
                    f'INSERT {ignore}INTO "{table.name}" ({names}) SELECT {names} FROM '
                    f"read_json(?, format='newline_delimited', columns={{{cols}}})",
                    [str(src)],
                )
                con.execute(f'INSERT INTO "{TAGS_TABLE}" VALUES (?, ?)', [tag, blob.count(b"\n")])
                con.execute("COMMIT")
                return True
            except Exception as e:
                con.execute("ROLLBACK")
                import duckdb

                if isinstance(e, duckdb.InvalidInputException | duckdb.ConversionException):
                    # a value its column cannot hold: sending the same blob again cannot help
                    raise PermanentIngestError(f"{table.name}: {str(e).splitlines()[0][:300]}") from e
                raise
            finally:
                con.close()


def embedded_exporter(store: Path, registry: Any = None, *, cluster: str = "local") -> Any:
    """The embedded default: an AdxExporter writing `store` through a spool next to it, mirroring
    `registry` into adx-mon's tables (no adx-mon runs on a laptop)."""
    from exporters.adx import AdxSettings, ExportSettings, build_sink

    settings = ExportSettings(cluster=cluster, spool_dir=store.with_name(store.stem + ".spool"))
    return build_sink(AdxSettings(), settings, store, registry)
