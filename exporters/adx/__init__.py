"""ADX export (DESIGN.md §5): typed tables, a durable spool, queued ingestion, and the embedded
DuckDB default that the same KQL in `queries/` runs on. See docs/adx.md."""

from exporters.adx.exporter import AdxExporter, EvidenceSink, ExportSettings, IngestTarget
from exporters.adx.rows import GpuSample, GpuXid
from exporters.adx.schema import TABLES, management_commands

__all__ = ["TABLES", "AdxExporter", "EvidenceSink", "ExportSettings", "GpuSample", "GpuXid", "IngestTarget",
           "management_commands"]
