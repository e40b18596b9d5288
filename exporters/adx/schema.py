"""The ADX tables, in one place: Kusto types, `.create-merge table` and JSON mapping commands,
the embedded DuckDB DDL, and the schema Microsoft's KQL parser checks queries against.

Every row carries `RowId` (a stable hash of what makes the row itself) so a replayed blob can be
recognised by queries too, and `Cluster` (the Kubernetes cluster the collector watches), so one
database serves a fleet.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Kusto scalar type → DuckDB column type (the embedded default stores the same tables).
_DUCK_TYPES: Mapping[str, str] = {
    "string": "VARCHAR",
    "datetime": "TIMESTAMP",
    "long": "BIGINT",
    "int": "INTEGER",
    "real": "DOUBLE",
    "bool": "BOOLEAN",
    "dynamic": "JSON",
}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # Kusto scalar type
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    doc: str
    critical: bool = False  # the spool's full policy evicts these last (claim transitions)

    @property
    def mapping_name(self) -> str:
        return f"{self.name}_json"

    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def create_merge(self) -> str:
        cols = ", ".join(f"['{c.name}']:{c.type}" for c in self.columns)
        return f".create-merge table ['{self.name}'] ({cols})"

    def mapping_json(self) -> list[dict[str, Any]]:
        return [{"column": c.name, "Properties": {"Path": f"$.{c.name}"}} for c in self.columns]

    def create_mapping(self) -> str:
        import json

        body = json.dumps(self.mapping_json(), separators=(",", ":"))
        return f".create-or-alter table ['{self.name}'] ingestion json mapping '{self.mapping_name}' '{body}'"

    def duckdb_ddl(self) -> str:
        cols = ", ".join(f'"{c.name}" {_DUCK_TYPES[c.type]}' for c in self.columns)
        return f'CREATE TABLE IF NOT EXISTS "{self.name}" ({cols})'


def _c(name: str, type_: str, doc: str = "") -> Column:
    return Column(name, type_, doc)


_RUN = (
    _c("Timestamp", "datetime", "evaluation time (the API server's clock)"),
    _c("RowId", "string", "stable id of this row: a replay carries the same id"),
    _c("Cluster", "string", "the Kubernetes cluster the collector watches"),
    _c("Namespace", "string"),
    _c("Run", "string", "the run root's name"),
    _c("Kind", "string", "the run root's kind: TauRun, RayJob, Job, ..."),
    _c("RunUid", "string"),
    _c("Queue", "string", "Kueue LocalQueue (or ClusterQueue) of the run, \"\" when not queued by Kueue"),
    _c("Team", "string", "the owning team: the run's namespace"),
)

RUN_CLAIMS = Table(
    "RunClaims",
    _RUN + (
        _c("Claim", "string", "scheduled | running | progressing"),
        _c("Asserted", "bool", "what the run's own status says; null when it says nothing"),
        _c("Observed", "string", "true | false | unknown, from independent evidence"),
        _c("Verdict", "string", "verified | contradicted | unconfirmed | ahead | pending | unasserted"),
        _c("PreviousVerdict", "string", "the verdict before this transition, \"\" for the first row"),
        _c("Since", "datetime", "when the observed value last changed"),
        _c("Reason", "string", "one line, redacted"),
        _c("Planes", "dynamic", "evidence planes behind the claim"),
        _c("Evidence", "dynamic", "evidence summary: up to 8 items {plane, ref, field, value, at}, redacted"),
    ),
    "one row per claim transition (verdict or observed value changed)",
    critical=True,
)

RUN_SNAPSHOTS = Table(
    "RunSnapshots",
    _RUN + (
        _c("Finished", "bool"),
        _c("ScheduledVerdict", "string"),
        _c("RunningVerdict", "string"),
        _c("ProgressingVerdict", "string"),
        _c("ScheduledObserved", "string"),
        _c("RunningObserved", "string"),
        _c("ProgressingObserved", "string"),
        _c("BlockedStage", "string", "stage that owns the wait, \"\" when not blocked"),
        _c("BlockedOwner", "string"),
        _c("BlockedSince", "datetime"),
        _c("StallCause", "string", "why progressing is false: nccl-*, crash-loop, gpus-busy, gpus-idle, "
                                    "invalid-loss, skipped-steps, not-running, no-progress; \"\" otherwise"),
        _c("LastStep", "long"),
        _c("ProgressRate", "real", "steps per second since the previous snapshot"),
        _c("QueuedSeconds", "real", "time from creation to allocation (so far, while queued)"),
        _c("AllocatedSeconds", "real"),
        _c("ProductiveSeconds", "real"),
        _c("GoodputRatio", "real", "productive over allocated time; null without a dated progress signal"),
        _c("Badput", "dynamic", "seconds by cause: queued, starting, stalled, restarting, replaying"),
        _c("EvidenceAgeSeconds", "real", "age of the run's oldest newest-evidence plane at evaluation"),
        _c("QueuePosition", "long", "0-based position in its ClusterQueue while waiting for quota (Kueue's "
                                    "visibility API); null otherwise"),
        _c("AdmissionEtaLowSeconds", "real", "the admission estimate's band, low bound: an estimate, never a "
                                             "promise; null when unknown (docs/queue-eta.md)"),
        _c("AdmissionEtaMidSeconds", "real", "its median"),
        _c("AdmissionEtaHighSeconds", "real", "its high bound"),
        _c("AdmissionEtaLevel", "real", "the band's stated coverage (0.8)"),
        _c("WorkAtRiskGpuHours", "real", "GPU-hours since the last complete checkpoint (or since the pods started, "
                                         "when later): what a failure now throws away; null when unknown (no fresh "
                                         "checkpoint listing, a checkpoint stamped in the future) and for runs "
                                         "without GPUs"),
        _c("LastCheckpoint", "datetime", "when the run's last complete checkpoint was saved; null without one"),
        _c("Nodes", "dynamic", "the run's nodes, riskiest first: [{Node, Gpus, GpuHoursAtRisk, Risk (0-100), "
                               "Signals}] (docs/explain.md, work at risk)"),
        _c("Stragglers", "dynamic", "suspects holding the run back: [{Kind (rank|gpu), Rank, Pod, Node, GpuUuid, "
                                    "Basis, LagRatio}]; [] when none is named"),
        _c("JoulesPerStep", "real", "energy per training step over the run's GPUs (NVML energy counters); null "
                                    "when unknown (docs/metrics.md, taugrid_run_energy_joules_per_step)"),
        _c("JoulesPerToken", "real", "energy per token trained (the run's watts over the tokens/s per GPU its "
                                     "trainer printed, times its GPUs); null where unknown or not printed"),
    ),
    "each run's state, periodically (every snapshot interval) and at each claim transition",
)

KUBE_EVENTS = Table(
    "KubeEvents",
    (
        _c("Timestamp", "datetime", "lastTimestamp (or series last observed)"),
        _c("RowId", "string", "uid/count: a repeated event is a new row only when its count moved"),
        _c("Cluster", "string"),
        _c("Namespace", "string"),
        _c("Uid", "string"),
        _c("Count", "long"),
        _c("Type", "string"),
        _c("Reason", "string"),
        _c("Message", "string", "redacted"),
        _c("RegardingKind", "string"),
        _c("RegardingName", "string"),
        _c("Component", "string"),
        _c("FirstSeen", "datetime"),
        _c("Run", "string", "run root the regarding object belongs to, \"\" when none"),
    ),
    "Kubernetes events, deduplicated by uid and count",
)

PROGRESS_SAMPLES = Table(
    "ProgressSamples",
    (
        _c("Timestamp", "datetime", "when the step was seen (log line time, counter read, checkpoint time)"),
        _c("RowId", "string"),
        _c("Cluster", "string"),
        _c("Namespace", "string"),
        _c("Run", "string"),
        _c("Source", "string", "pod/container, Ray cluster or checkpoint location"),
        _c("Plane", "string", "logs | ray | expstore"),
        _c("Step", "long"),
        _c("Loss", "real"),
        _c("Format", "string"),
        _c("Durable", "bool", "a checkpoint: progress that survives a restart"),
    ),
    "progress samples, each step once per source",
)

GPU_SAMPLES = Table(
    "GpuSamples",
    (
        _c("Timestamp", "datetime"),
        _c("RowId", "string"),
        _c("Cluster", "string"),
        _c("Node", "string"),
        _c("Gpu", "int", "device index on the node"),
        _c("GpuUuid", "string"),
        _c("Namespace", "string"),
        _c("Pod", "string"),
        _c("Run", "string"),
        _c("Utilization", "real", "percent"),
        _c("MemoryUsedBytes", "long"),
        _c("PowerWatts", "real"),
        _c("TemperatureC", "real"),
    ),
    "per-GPU samples from the node agents",
)

GPU_XIDS = Table(
    "GpuXids",
    (
        _c("Timestamp", "datetime"),
        _c("RowId", "string"),
        _c("Cluster", "string"),
        _c("Node", "string"),
        _c("Gpu", "int"),
        _c("GpuUuid", "string"),
        _c("Pci", "string"),
        _c("Code", "int", "the XID code"),
        _c("Meaning", "string"),
        _c("Action", "string", "what NVIDIA advises"),
        _c("Namespace", "string"),
        _c("Pod", "string"),
        _c("Run", "string"),
    ),
    "GPU XID errors from the node agents (kernel log or NVML events)",
)

TABLES: tuple[Table, ...] = (RUN_CLAIMS, RUN_SNAPSHOTS, KUBE_EVENTS, PROGRESS_SAMPLES, GPU_SAMPLES, GPU_XIDS)
BY_NAME: Mapping[str, Table] = {t.name: t for t in TABLES}

# adx-mon's shape: one table per scraped Prometheus metric, named by the metric in CamelCase.
ADX_MON_COLUMNS = (
    _c("Timestamp", "datetime"),
    _c("SeriesId", "long"),
    _c("Labels", "dynamic"),
    _c("Value", "real"),
)


def adx_mon_table_name(metric: str) -> str:
    """adx-mon's table for a metric: `taugrid_collector_last_sync_timestamp_seconds` →
    `TaugridCollectorLastSyncTimestampSeconds`."""
    return "".join(part[:1].upper() + part[1:] for part in metric.split("_") if part)


# The metrics the shipped queries read through adx-mon (see docs/adx.md).
ADX_MON_METRICS: tuple[str, ...] = (
    "taugrid_collector_last_sync_timestamp_seconds",
    "taugrid_run_progress_last_step",
)
ADX_MON_TABLES: tuple[Table, ...] = tuple(
    Table(adx_mon_table_name(m), ADX_MON_COLUMNS, f"adx-mon: Prometheus metric {m}") for m in ADX_MON_METRICS
)


ALL_TABLES: Mapping[str, Table] = {t.name: t for t in TABLES + ADX_MON_TABLES}

# The integer ranges of Kusto's `long` and `int` (DuckDB's BIGINT and INTEGER are the same).
_INT_RANGES: Mapping[str, tuple[int, int]] = {"long": (-(1 << 63), (1 << 63) - 1), "int": (-(1 << 31), (1 << 31) - 1)}
_INT_COLUMNS: dict[str, tuple[tuple[str, str, int, int], ...]] = {
    t.name: tuple((c.name, c.type, *_INT_RANGES[c.type]) for c in t.columns if c.type in _INT_RANGES)
    for t in ALL_TABLES.values()
}


def row_problem(table: str, row: Mapping[str, Any]) -> str | None:
    """Why `row` cannot be stored in `table` as typed, or None. Integer columns only: a value out of a
    `long`'s range (a step number of 2^64 in a tenant's log) fails the whole blob it is ingested in,
    in ADX as in DuckDB, so it is refused alone before it reaches the spool."""
    for name, kind, lo, hi in _INT_COLUMNS.get(table, ()):
        v = row.get(name)
        if v is None:
            continue
        if type(v) is not int:
            return f"{table}.{name}: expected a {kind}, got {type(v).__name__}"
        if not lo <= v <= hi:
            return f"{table}.{name}: a {v.bit_length()}-bit integer does not fit a Kusto {kind}"
    return None


@dataclass(frozen=True, slots=True)
class Function:
    """A stored function (no parameters) the exporter creates beside the tables."""

    name: str
    body: str  # a tabular expression over the tables
    doc: str

    def create(self) -> str:
        return (f'.create-or-alter function with (folder = "taugrid", docstring = "{self.doc}") '
                f"{self.name}() {{ {self.body} }}")


# ADX is append-only: a standby that takes over writes the transitions it saw again under the old
# leader's RowIds (docs/adx.md), so a transition can be in RunClaims twice. Each RowId once, as
# first written (the later copy carries the standby's evaluation time, not when it was first seen).
RUN_CLAIMS_DEDUPED = Function(
    "RunClaimsDeduped",
    "RunClaims | summarize arg_min(Timestamp, *) by RowId",
    "RunClaims with each RowId once (its first write): count and list claim transitions from here",
)
FUNCTIONS: tuple[Function, ...] = (RUN_CLAIMS_DEDUPED,)


def function_definitions() -> list[str]:
    """The stored functions as duckdb-kql takes them (`functions=`, `serve --functions`)."""
    return [f.create() for f in FUNCTIONS]


def management_commands() -> Iterator[str]:
    """What the exporter runs on a cluster before ingesting: tables, their JSON mappings, then the
    stored functions over them."""
    for t in TABLES:
        yield t.create_merge()
    for t in TABLES:
        yield t.create_mapping()
    for f in FUNCTIONS:
        yield f.create()


def parser_schema(*, adx_mon: bool = True) -> dict[str, Any]:
    """{table: {column: type}} for the KQL parser check (and anyone else who needs it)."""
    tables = TABLES + (ADX_MON_TABLES if adx_mon else ())
    return {t.name: {c.name: c.type for c in t.columns} for t in tables}


def parser_functions() -> dict[str, str]:
    """{function: body} of the stored functions, for the KQL parser check."""
    return {f.name: f.body for f in FUNCTIONS}
