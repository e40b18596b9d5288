"""The JSON object `taugrid-evidence scan` prints for one scanned file."""

from __future__ import annotations

import math
from datetime import datetime

from collector.progress.model import LogScan


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def scan_report(scan: LogScan) -> dict[str, object]:
    """The JSON object `taugrid-evidence scan` prints for one file (JSON-safe: no NaN/inf).

    progress is null when no step was seen. `samples`, `first_step`, `last_step` and `last_loss` count
    real steps only (skipped ones are in `skipped`); `last_step` is null when the last sample shows
    activity without a step (Hugging Face loss dicts with no Trainer bar); `last_loss` is the loss of
    the last step that showed one, null when that loss is NaN/inf; `nonfinite_loss` is true when any
    real step's loss was NaN/inf (`first_nonfinite_step` says where). Every figure covers the whole
    input although only the last MAX_SAMPLES samples are kept (`kept_samples`). Added fields:
    skipped, max_step, total, last_line, last_at, first_nonfinite_step, kept_samples; hang/xid
    entries add rank/at (hangs also seq, the NCCL SeqNum or last enqueued collective, completed, the
    last completed one, and pg, the process group they count in); resume (checkpoint-resume lines:
    line, at, step, format); lines, diagnostics.
    """
    progress: dict[str, object] | None = None
    if scan.samples:
        sm = scan.summary_of()
        last, loss = sm.last, sm.last_with_loss
        last_loss = loss.loss if loss is not None else None
        high = sm.high_water
        progress = {
            "format": scan.format,
            "samples": sm.seen - sm.skipped,
            "first_step": sm.first.step if sm.first else None,
            # null when the last sample carries no step (activity only, e.g. HF loss dicts)
            "last_step": last.step if last else None,
            "last_loss": last_loss if last_loss is not None and math.isfinite(last_loss) else None,
            "nonfinite_loss": sm.first_nonfinite is not None,
            # additions
            "skipped": sm.skipped,
            "max_step": high.step if high else None,
            "total": sm.total,
            "last_line": last.line if last else None,
            "last_at": _iso(last.at) if last else None,
            "first_nonfinite_step": sm.first_nonfinite.step if sm.first_nonfinite else None,
            "kept_samples": len(scan.samples),
        }
    return {
        "file": scan.source,
        "progress": progress,
        "hang": [
            {
                "kind": h.kind,
                "line": h.line,
                "collective": h.collective,
                "timeout_ms": h.timeout_ms,
                "rank": h.rank,
                "at": _iso(h.at),
                "seq": h.seq,
                "completed": h.completed,
                "pg": h.pg,
            }
            for h in scan.hangs
        ],
        "resume": [{"line": r.line, "at": _iso(r.at), "step": r.step, "format": r.format} for r in scan.resumes],
        "xid": [
            {
                "code": x.code,
                "pci": x.pci,
                "line": x.line,
                "meaning": x.meaning,
                "action": x.action,
                "at": _iso(x.at),
            }
            for x in scan.xids
        ],
        "lines": scan.lines,
        "diagnostics": list(scan.diagnostics),
    }
