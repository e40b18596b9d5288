"""ADX export (DESIGN.md §5): typed tables, a durable spool, queued ingestion, and the embedded
DuckDB default that the same KQL in `queries/` runs on. See docs/adx.md."""

from pathlib import Path

from prometheus_client import CollectorRegistry

from exporters.adx.exporter import AdxExporter, EvidenceSink, ExportSettings, IngestTarget
from exporters.adx.kusto import AdxSettings
from exporters.adx.rows import GpuSample, GpuXid
from exporters.adx.schema import TABLES, management_commands

__all__ = ["TABLES", "AdxExporter", "AdxSettings", "EvidenceSink", "ExportSettings", "GpuSample", "GpuXid",
           "IngestTarget", "build_sink", "management_commands"]


def build_sink(adx: AdxSettings, export: ExportSettings, store: Path, registry: CollectorRegistry) -> AdxExporter:
    """The exporter the controller should get: ADX when `adx.query_uri` is set (queued ingestion,
    workload identity), else the embedded DuckDB `store`. Open it before the controller, close it
    after."""
    if adx.configured:
        from exporters.adx.kusto import KustoQueuedTarget

        return AdxExporter(export, KustoQueuedTarget(adx), registry=registry)
    from exporters.adx.embedded import DuckDBTarget

    return AdxExporter(export, DuckDBTarget(store), registry=registry, mirror=registry)
