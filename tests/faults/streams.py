"""The exported stream of claim transitions (`RunClaims` rows), read back and checked (issue 9).

The rule, for one replica or several (their stores taken together, as one ADX database would hold
them), and the same for a controller restarted or failed over:

- A row is named by its `RowId` (docs/adx.md: a replay carries the same id). Rows with the same id
  are one row written again (a replay, or a new leader repeating what the old one wrote); the
  embedded store keeps one of them, and so does this check.
- Per run and claim, ordered by `Timestamp`, the rows are the claim's transitions: the first row
  has `PreviousVerdict` "" and every later row names the verdict of the row before it and moves the
  verdict or the observed value.
- **Duplicated transition**: a row that repeats the (verdict, observed) of the row before it, for
  example a new leader republishing the current state of a claim as a fresh first row
  (`PreviousVerdict` "", another `RowId`) in the middle of the stream.
- **Lost transition**: a row whose `PreviousVerdict` is not the verdict of the row before it (a
  transition in between was never written), or a claim whose sequence of (verdict, observed, since)
  differs from that of an uninterrupted controller's stream (the reference).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from exporters.adx import AdxExporter, ExportSettings
from exporters.adx.embedded import DuckDBTarget, connect

COLUMNS = ("Timestamp", "RowId", "Kind", "RunUid", "Namespace", "Run", "Claim", "Verdict", "Observed",
           "PreviousVerdict", "Since", "Reason")
Row = dict[str, Any]


def claim_rows(store: Path) -> list[Row]:
    """The `RunClaims` rows of an embedded store (read-only)."""
    con = connect(store, read_only=True)
    try:
        cols = ", ".join(f'"{c}"' for c in COLUMNS)
        return [dict(zip(COLUMNS, r, strict=True)) for r in con.execute(f'SELECT {cols} FROM "RunClaims"').fetchall()]
    finally:
        con.close()


def sink(directory: Path, cluster: str = "") -> AdxExporter:
    """An opened exporter writing the embedded store `directory/store.duckdb` (spool beside it)."""
    exporter = AdxExporter(ExportSettings(cluster=cluster, spool_dir=directory / "spool"),
                           DuckDBTarget(directory / "store.duckdb"))
    exporter.open()
    return exporter


def deliver_leftovers(store: Path, spool_dir: Path) -> None:
    """Deliver what a killed process left in its spool (sealed, or open and cut at its last whole
    record), as its next start would."""
    exporter = AdxExporter(ExportSettings(spool_dir=spool_dir), DuckDBTarget(store))
    exporter.open()
    exporter.close(drain_timeout=30)


def streams(rows: list[Row]) -> dict[tuple[str, ...], list[Row]]:
    """Per run (its root's kind, namespace, name and uid) and claim: one row per RowId, in Timestamp order."""
    seen: set[str] = set()
    out: dict[tuple[str, ...], list[Row]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["Timestamp"]):
        if r["RowId"] in seen:
            continue
        seen.add(r["RowId"])
        out[(r["Kind"], r["Namespace"], r["Run"], r["RunUid"], r["Claim"])].append(r)
    return dict(out)


def _state(r: Row) -> tuple[str, str, Any]:
    return r["Verdict"], r["Observed"], r["Since"]


def stream_problems(rows: list[Row], reference: list[Row] | None = None, *, excursion: bool = False,
                    final_only: frozenset[str] = frozenset()) -> list[str]:
    """Lost or duplicated transitions in `rows` (see the module's rule); [] when there are none.

    `excursion`: a fault the reference did not live through took claims to states the reference
    never had for them, and back (an API outage: observed unknown, the run's own status too old to
    trust): for the comparison, rows in such states are left out, and so is the row coming back to
    where it was; every state of the reference must still be there, in order.
    `final_only`: runs created in several writes while the API failed: each controller may or may
    not have seen their passing first states, so only the state they end in is compared."""
    problems = []
    got = streams(rows)
    for key, seq in sorted(got.items()):
        for i, r in enumerate(seq):
            before = seq[i - 1] if i else None
            if r["PreviousVerdict"] != (before["Verdict"] if before else ""):
                problems.append(f"{'/'.join(key)}: row {i} says previous {r['PreviousVerdict']!r}, the row before "
                                f"is {before['Verdict'] if before else None!r} (lost or repeated): {_brief(seq)}")
            if before is not None and (r["Verdict"], r["Observed"]) == (before["Verdict"], before["Observed"]):
                problems.append(f"{'/'.join(key)}: row {i} repeats {r['Verdict']}/{r['Observed']}: {_brief(seq)}")
    if reference is not None:
        want = streams(reference)
        for key in sorted(set(got) | set(want)):
            b = [_state(r) for r in want.get(key, [])]
            seen = {x[:2] for x in b}
            a = [_state(r) for r in got.get(key, []) if not excursion or (r["Verdict"], r["Observed"]) in seen]
            a = [x for i, x in enumerate(a) if not i or x != a[i - 1]]
            if key[2] in final_only:
                a, b = a[-1:], b[-1:]
            if a != b:
                problems.append(f"{'/'.join(key)}: transitions {a} != the uninterrupted controller's {b}")
    return problems


def _brief(seq: list[Row]) -> str:
    return " → ".join(f"{r['PreviousVerdict'] or '∅'}>{r['Verdict']}/{r['Observed']}" for r in seq)
