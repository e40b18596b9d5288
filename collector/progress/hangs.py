"""Collective hangs and NCCL failures in training and kernel logs (vocabulary: model.HANG_KINDS).

Each check is guarded by a plain substring test; the regexes only run on lines that pass it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_OPTYPE = re.compile(r"OpType=(\w+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
# `[Rank 0]`, `[PG 1 Rank 0]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`
_MSG_RANK = re.compile(r"\[[^\]]*?\bRank (\d+)\]")
_PREFIX_RANK = re.compile(r"\[rank(\d+)\]:")
_DESYNC = re.compile(r"\[(\d+)\] Timeout at collective: (\w+)")
_LAGGING = re.compile(r"\[(\d+)\] [^\n]*?didn't (?:join|finish) collective")
_ABORTED_ON = re.compile(r"aborted on rank (\d+)")
_GLOO = re.compile(r"Timed out waiting (\d+)ms for (send|recv) operation")


class Hang(NamedTuple):
    kind: str
    collective: str | None
    timeout_ms: int | None
    rank: int | None


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(1)) if m else None


def _rank(line: str) -> int | None:
    r = _MSG_RANK.search(line) or _PREFIX_RANK.search(line)
    return _int(r)


# Every hang kind's line contains one of these; NCCL INFO chatter contains none of them.
HANG_TRIGGERS: tuple[str, ...] = (
    "ollective",
    "atchdog",
    "NCCL e",  # NCCL error
    "NCCL c",  # NCCL communicator was aborted
    "NCCL o",  # Some NCCL operations have failed
    "nccl",  # libnccl segfaults, ncclSystemError & co
    "Timed out waiting",
)


def may_be_hang(line: str) -> bool:
    """Cheap precheck before match_hang: HANG_TRIGGERS, spelled out (any() is slower)."""
    return (
        "ollective" in line
        or "atchdog" in line
        or "NCCL e" in line
        or "NCCL c" in line
        or "NCCL o" in line
        or "nccl" in line
        or "Timed out waiting" in line
    )


def match_hang(line: str) -> Hang | None:
    """The hang/NCCL failure a line reports, if any (at most one per line)."""
    if "ollective" in line:
        if "Watchdog caught collective operation timeout" in line:
            # Also matches "watchdog thread terminated with exception: ... Watchdog caught ...",
            # which carries the same WorkNCCL details.
            op = _OPTYPE.search(line)
            return Hang(
                "nccl-watchdog-timeout",
                op.group(1) if op else None,
                _int(_TIMEOUT_MS.search(line)),
                _rank(line),
            )
        d = _DESYNC.search(line)
        if d:
            return Hang("nccl-desync-report", d.group(2), None, int(d.group(1)))
        lag = _LAGGING.search(line)
        if lag:
            return Hang("nccl-desync-lagging-rank", None, None, int(lag.group(1)))
    if "NCCL" in line:
        if "detected by watchdog" in line or "watchdog thread terminated" in line:
            op = _OPTYPE.search(line)
            return Hang(
                "nccl-watchdog-exception",
                op.group(1) if op else None,
                _int(_TIMEOUT_MS.search(line)),
                _rank(line),
            )
        if "NCCL communicator was aborted" in line or "Some NCCL operations have failed" in line:
            on = _ABORTED_ON.search(line)
            return Hang("nccl-async-error", None, None, int(on.group(1)) if on else _rank(line))
        if "NCCL error" in line:
            return Hang("nccl-error", None, None, _rank(line))
    if "nccl" in line:
        if "segfault at" in line and "libnccl" in line:
            return Hang("nccl-segfault", None, None, None)
        if (
            "ncclSystemError" in line
            or "ncclInternalError" in line
            or "ncclUnhandledCudaError" in line
            or "ncclRemoteError" in line
        ):
            return Hang("nccl-error", None, None, _rank(line))
    if "Timed out waiting" in line:
        g = _GLOO.search(line)
        if g:
            return Hang("collective-timeout", g.group(2).upper(), int(g.group(1)), _rank(line))
    return None
