"""Progress, hang and XID evidence from logs (pure parsing; `scan_path` is the only I/O).

The progressing claim consumes `LogScan.samples`; `taugrid-evidence scan` prints `scan_report`.
"""

from collector.progress.model import (
    FORMATS,
    HANG_KINDS,
    HangFinding,
    LogScan,
    ProgressSample,
    XidFinding,
    shift_scan,
)
from collector.progress.report import scan_report
from collector.progress.whole import scan_lines, scan_path, scan_text
from collector.progress.xid import XID_CATALOGUE, describe

__all__ = [
    "FORMATS",
    "HANG_KINDS",
    "XID_CATALOGUE",
    "HangFinding",
    "LogScan",
    "ProgressSample",
    "XidFinding",
    "describe",
    "scan_lines",
    "scan_path",
    "scan_report",
    "scan_text",
    "shift_scan",
]
