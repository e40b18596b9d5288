"""Records produced by the log scanner: progress samples, hang findings, XID findings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# Progress formats a sample can carry.
FORMATS: tuple[str, ...] = ("megatron", "deepspeed", "hf-trainer", "lightning", "regex", "ray-metric", "checkpoint")

# Hang vocabulary (HangFinding.kind):
#   nccl-watchdog-timeout     ProcessGroupNCCL watchdog caught a collective past its timeout
#   nccl-watchdog-exception   the watchdog reports an error/timeout on a work item, or its thread died
#   nccl-desync-report        desync debug: the collective this rank timed out in
#   nccl-desync-lagging-rank  desync debug: a rank that never joined/finished that collective (the culprit)
#   nccl-async-error          NCCL async error handling aborted the communicator / took the process down
#   nccl-error                an NCCL call failed (ncclSystemError, "NCCL error in: ...", ...)
#   nccl-segfault             a process segfaulted inside libnccl (kernel log)
#   collective-timeout        a non-NCCL collective (gloo) timed out
HANG_KINDS: tuple[str, ...] = (
    "nccl-watchdog-timeout",
    "nccl-watchdog-exception",
    "nccl-desync-report",
    "nccl-desync-lagging-rank",
    "nccl-async-error",
    "nccl-error",
    "nccl-segfault",
    "collective-timeout",
)


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """One training step seen in a log.

    `line`/`at` are where the step first appeared; `loss` is the latest value shown for that step
    (a redrawn progress bar updates the loss of the same step).
    """

    step: int
    at: datetime | None
    loss: float | None
    line: int
    format: str
    skipped: bool = False
    total: int | None = None


@dataclass(frozen=True, slots=True)
class HangFinding:
    kind: str
    line: int
    collective: str | None
    timeout_ms: int | None
    rank: int | None
    at: datetime | None


@dataclass(frozen=True, slots=True)
class XidFinding:
    code: int
    pci: str
    line: int
    meaning: str
    action: str
    at: datetime | None


@dataclass(frozen=True, slots=True)
class LogScan:
    source: str
    format: str | None
    samples: tuple[ProgressSample, ...]
    hangs: tuple[HangFinding, ...]
    xids: tuple[XidFinding, ...]
    diagnostics: tuple[str, ...]
    lines: int
