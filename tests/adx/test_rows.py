"""Rows from records: transitions only when a verdict moves, one snapshot per interval or state
change, events once per uid and count, progress once per step, free text redacted."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.model import (
    Blocked,
    Claim,
    EventFacts,
    Evidence,
    Goodput,
    ObjectRecord,
    Observed,
    Plane,
    Ref,
    RunClaims,
    Stage,
    verdict_for,
)
from collector.progress.model import LogScan, ProgressSample
from exporters.adx.rows import RowBuilder
from exporters.adx.schema import BY_NAME, KUBE_EVENTS, PROGRESS_SAMPLES, RUN_CLAIMS, RUN_SNAPSHOTS

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
REF = Ref("TauRun", "research", "llm", "uid-1")
SECRET = "password=hunter2hunter2"


def claim(asserted: bool | None, observed: Observed, reason: str = "ok", evidence: tuple[Evidence, ...] = ()) -> Claim:
    return Claim(asserted, observed, verdict_for(asserted, observed), T0, reason, evidence)


def run(at: datetime, running: Observed = Observed.TRUE, reason: str = "ok") -> RunClaims:
    ev = (Evidence(Plane.KUBERNETES, "Pod/research/llm-0", "phase", f"Running {SECRET}", at),)
    return RunClaims(REF, claim(True, Observed.TRUE), claim(True, running, reason, ev),
                     claim(True, Observed.TRUE), None, at, extra={"queue": "a100"},
                     goodput=Goodput(600.0, 500.0, {"queued": 30.0, "stalled": 100.0}, 500 / 600))


def test_transitions_and_snapshots() -> None:
    b = RowBuilder("c1", timedelta(minutes=1))
    out = b.claims([run(T0)])
    assert len(out[RUN_CLAIMS.name]) == 3 and len(out[RUN_SNAPSHOTS.name]) == 1  # first sight: every claim
    assert b.claims([run(T0 + timedelta(seconds=10))]) == {RUN_CLAIMS.name: [], RUN_SNAPSHOTS.name: []}
    out = b.claims([run(T0 + timedelta(seconds=20), Observed.FALSE, f"CrashLoopBackOff {SECRET}")])
    [row] = out[RUN_CLAIMS.name]
    assert (row["Claim"], row["PreviousVerdict"], row["Verdict"], row["Queue"], row["Cluster"]) == (
        "running", "verified", "contradicted", "a100", "c1")
    assert "hunter2" not in row["Reason"] and "hunter2" not in str(row["Evidence"])  # redacted
    assert row["Planes"] == ["kubernetes"]
    [snap] = out[RUN_SNAPSHOTS.name]  # a transition also snapshots
    assert snap["RunningObserved"] == "false" and snap["GoodputRatio"] == 500 / 600
    assert snap["Badput"]["stalled"] == 100.0 and snap["QueuedSeconds"] == 30.0
    assert len(b.claims([run(T0 + timedelta(seconds=81), Observed.FALSE)])[RUN_SNAPSHOTS.name]) == 1  # interval
    for table, rows in out.items():
        assert set(rows[0]) == set(BY_NAME[table].column_names())  # rows carry exactly the schema's columns


def test_one_snapshot_per_instant() -> None:
    b = RowBuilder("c1", timedelta(minutes=1))
    b.claims([run(T0)])
    blocked = replace(run(T0), blocked=Blocked(Stage.QUEUE_ADMISSION, "quota", T0))
    assert b.claims([blocked])[RUN_SNAPSHOTS.name] == []  # same instant: deferred
    later = replace(blocked, evaluated_at=T0 + timedelta(seconds=1))
    [snap] = b.claims([later])[RUN_SNAPSHOTS.name]
    assert snap["BlockedStage"] == "queue-admission" and snap["BlockedOwner"] == "Kueue"


def test_a_claims_rows_never_tie_on_timestamp() -> None:
    """Queries take each claim's latest row by Timestamp: two rows of one claim at one instant (the
    scenario's manual clock, two evaluations between events) would leave the latest to chance. Each
    move is still written at once: a stopped clock or a shutdown must not hold the last one back."""
    b = RowBuilder("c1", timedelta(minutes=1))
    [first] = [r for r in b.claims([run(T0)])[RUN_CLAIMS.name] if r["Claim"] == "running"]
    [second] = b.claims([run(T0, Observed.FALSE)])[RUN_CLAIMS.name]
    [third] = b.claims([run(T0, Observed.UNKNOWN)])[RUN_CLAIMS.name]
    assert [r["Timestamp"] for r in (first, second, third)] == [
        "2026-01-10T12:00:00Z", "2026-01-10T12:00:00.000001Z", "2026-01-10T12:00:00.000002Z"]
    assert (third["PreviousVerdict"], third["Observed"]) == (second["Verdict"], "unknown")
    [later] = b.claims([run(T0 + timedelta(seconds=1), Observed.TRUE)])[RUN_CLAIMS.name]
    assert later["Timestamp"] == "2026-01-10T12:00:01Z"  # a clock that moves on is written as it is


def event(count: int) -> ObjectRecord:
    facts = EventFacts("Warning", "BackOff", f"Back-off restarting failed container; {SECRET}",
                       Ref("Pod", "research", "llm-0"), "kubelet", T0, T0 + timedelta(minutes=count), count)
    return ObjectRecord(Ref("Event", "research", "llm-0.1", "ev-uid"), "v1", "1", None, T0, {}, (), (), facts, T0)


def test_events_once_per_uid_and_count() -> None:
    b = RowBuilder("c1", timedelta(minutes=1))
    [row] = b.event(event(1), "llm")[KUBE_EVENTS.name]
    assert row["Run"] == "llm" and row["Count"] == 1 and "hunter2" not in row["Message"]
    assert b.event(event(1), "llm") == {}  # a relist repeats it: not a new row
    assert b.event(event(2), "llm")[KUBE_EVENTS.name][0]["Count"] == 2  # the count moved


def test_progress_samples_once_per_step() -> None:
    b = RowBuilder("c1", timedelta(minutes=1))

    def scan(steps: range) -> LogScan:
        samples = tuple(ProgressSample(s, T0 + timedelta(seconds=s), 1.5, s, "megatron") for s in steps)
        return LogScan("x", "megatron", samples + (ProgressSample(99, None, None, 0, "megatron"),), (), (), (), 0)

    rows = b.signal(REF, "llm-0/main", "logs", False, scan(range(1, 6)))[PROGRESS_SAMPLES.name]
    assert [r["Step"] for r in rows] == [1, 2, 3, 4, 5]  # the undated sample is not a row
    rows = b.signal(REF, "llm-0/main", "logs", False, scan(range(3, 9)))[PROGRESS_SAMPLES.name]
    assert [r["Step"] for r in rows] == [6, 7, 8]  # the tail read again: only the new steps


def test_embedded_store_merges_a_newer_schema(tmp_path: Path) -> None:
    """An older store missing a column gets it (like `.create-merge table`), so ingestion goes on."""
    import duckdb

    from exporters.adx.embedded import DuckDBTarget

    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    con.execute('CREATE TABLE "KubeEvents" ("Timestamp" TIMESTAMP, "RowId" VARCHAR PRIMARY KEY)')
    con.close()
    target = DuckDBTarget(tmp_path / "s.duckdb")
    target.open()
    try:
        assert target.ingest(KUBE_EVENTS, b'{"RowId": "a", "Run": "llm", "Count": 2}\n', "t1")
    finally:
        target.close()
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    assert con.execute('SELECT "Run", "Count" FROM "KubeEvents"').fetchall() == [("llm", 2)]
    con.close()


def test_a_standby_takes_over_without_repeating_or_losing_transitions() -> None:
    """A new leader writes the transitions it saw as a standby under the RowIds the old leader used:
    what the old leader wrote comes again as the same rows (a replay), what it died before writing
    is written, and no claim starts again with an empty PreviousVerdict."""
    leader, standby = RowBuilder("c1", timedelta(minutes=1)), RowBuilder("c1", timedelta(minutes=1))
    history = [run(T0), run(T0 + timedelta(seconds=10), Observed.FALSE, "CrashLoopBackOff")]
    written: list[dict[str, object]] = []
    for rc in history:
        written += leader.claims([rc])[RUN_CLAIMS.name]
        standby.track([rc])
    assert [r["PreviousVerdict"] for r in written] == ["", "", "", "verified"]
    # The leader dies; before the standby takes over, running recovers (nobody writes it yet).
    recovered = run(T0 + timedelta(seconds=20))
    standby.track([recovered])
    later = run(T0 + timedelta(seconds=21))
    out = standby.claims([later])[RUN_CLAIMS.name]
    ids = {r["RowId"] for r in written}
    new = [r for r in out if r["RowId"] not in ids]
    assert [(r["Claim"], r["PreviousVerdict"], r["Verdict"]) for r in new] == [("running", "contradicted", "verified")]
    assert {r["RowId"] for r in out} - {r["RowId"] for r in new} == ids  # the rest: same rows again
    assert standby.claims([run(T0 + timedelta(seconds=30))])[RUN_CLAIMS.name] == []  # then transitions only
    # Transitions older than the resume window are not written again; unchanged claims still are.
    old = RowBuilder("c1", timedelta(minutes=1), resume_window=timedelta(seconds=5))
    old.track([run(T0)])
    old.track([run(T0 + timedelta(seconds=60))])
    assert len(old.claims([run(T0 + timedelta(seconds=61))])[RUN_CLAIMS.name]) == 3
    # A standby that first saw the run while another replica's Lease was live (renewed after that)
    # leaves those first sights to the rows that replica wrote; what it saw change, it writes.
    late = RowBuilder("c1", timedelta(minutes=1))
    late.track([run(T0 + timedelta(seconds=10), Observed.FALSE)], led_until=T0 + timedelta(seconds=12))
    late.track([run(T0 + timedelta(seconds=20))], led_until=T0 + timedelta(seconds=20))
    [row] = late.claims([run(T0 + timedelta(seconds=30))])[RUN_CLAIMS.name]
    assert (row["Claim"], row["PreviousVerdict"], row["Verdict"]) == ("running", "contradicted", "verified")


def test_a_restarted_exporter_carries_on_from_its_store(tmp_path: Path) -> None:
    """After a restart the embedded store's latest rows are where the transitions carry on from:
    an unchanged claim is not written again as a first row, a changed one names its previous verdict."""
    from exporters.adx import AdxExporter, ExportSettings
    from exporters.adx.embedded import DuckDBTarget, connect

    def exporter() -> AdxExporter:
        return AdxExporter(ExportSettings(cluster="c1", spool_dir=tmp_path / "spool"), DuckDBTarget(tmp_path / "s.db"))

    first = exporter()
    first.open()
    first.claims([run(T0)])
    first.claims([run(T0 + timedelta(seconds=10), Observed.FALSE)])
    first.close()
    again = exporter()
    again.open()
    again.claims([run(T0 + timedelta(seconds=20), Observed.FALSE)])  # as it was: nothing new
    again.claims([run(T0 + timedelta(seconds=30))])  # recovered while nobody watched, or since
    again.close()
    con = connect(tmp_path / "s.db", read_only=True)
    rows = con.execute('SELECT "Claim", "PreviousVerdict", "Verdict" FROM "RunClaims" ORDER BY "Timestamp", "Claim"'
                       ).fetchall()
    con.close()
    assert rows == [("progressing", "", "verified"), ("running", "", "verified"), ("scheduled", "", "verified"),
                    ("running", "verified", "contradicted"), ("running", "contradicted", "verified")]


def test_stall_cause_reads_the_structured_cause() -> None:
    """Progressing false says why in `Claim.cause`; the running claim is not consulted for it (the
    engine makes progressing false with cause not-running or finished whenever running is false:
    tests/test_claims_properties.py)."""
    from exporters.adx.rows import stall_cause

    base = run(T0)
    for cause, want in (("not-running", "not-running"), ("finished", "not-running"), ("stalled", "no-progress"),
                        ("skipped-steps", "skipped-steps"), ("invalid-steps", "invalid-loss")):
        p = replace(claim(True, Observed.FALSE, "STALLED 20m: last step 40 at 11:40"), cause=cause)
        assert stall_cause(replace(base, progressing=p)) == want, cause
    assert stall_cause(base) == ""
