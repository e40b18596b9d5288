"""Collective hangs and NCCL failures in training and kernel logs (vocabulary: model.HANG_KINDS).

Each check is guarded by a plain substring test; the regexes only run on lines that pass it.
Every pattern here runs in linear time on any input (tenants write these lines): each one starts
with a literal and has no two unbounded repeats that can match the same characters, and the
bracket search of the rank tags is done with str.rfind instead of a lazy scan.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_OPTYPE = re.compile(r"OpType=(\w+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
# the collective's sequence number: `WorkNCCL(SeqNum=1580, ...)`, or `detected by watchdog at work: 1580`
_SEQNUM = re.compile(r"SeqNum=(\d+)|watchdog at work: (\d+)")
# `[Rank 0]`, `[PG 1 Rank 0]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`: the tag is `Rank N]` inside
# a bracket (checked with rfind, see _msg_rank)
_MSG_RANK = re.compile(r"\bRank (\d+)\]")
_PREFIX_RANK = re.compile(r"\[rank(\d+)\]:")
_DESYNC = re.compile(r"\[(\d+)\] Timeout at collective: (\w+)")
# desync culprit: "[1] ... didn't join collective" — the bracket rank is searched before the phrase
_LAGGING_PHRASES = ("didn't join collective", "didn't finish collective")
_BRACKET_NUM = re.compile(r"\[(\d+)\] ")
_ABORTED_ON = re.compile(r"aborted on rank (\d+)")
_GLOO = re.compile(r"Timed out waiting (\d+)ms for (send|recv) operation")


class Hang(NamedTuple):
    kind: str
    collective: str | None
    timeout_ms: int | None
    rank: int | None
    seq: int | None = None  # WorkNCCL SeqNum: the collective's sequence number on this rank


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(1)) if m else None


def _seq(line: str) -> int | None:
    m = _SEQNUM.search(line)
    return int(m.group(1) or m.group(2)) if m else None


def _msg_rank(line: str) -> int | None:
    """`Rank N]` closing a bracket that opened before it (no `]` in between)."""
    for m in _MSG_RANK.finditer(line):
        if line.rfind("[", 0, m.start()) > line.rfind("]", 0, m.start()):
            return int(m.group(1))
        # rfind is O(n) per hit; a line of many bare `Rank N]` tags stops after a few tries
        if m.start() > 4096:
            break
    return None


def _rank(line: str) -> int | None:
    r = _msg_rank(line)
    return r if r is not None else _int(_PREFIX_RANK.search(line))


def _lagging_rank(line: str) -> int | None:
    for phrase in _LAGGING_PHRASES:
        pos = line.find(phrase)
        if pos != -1:
            m = _BRACKET_NUM.search(line, 0, pos)
            if m:
                return int(m.group(1))
    return None


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
                _seq(line),
            )
        d = _DESYNC.search(line)
        if d:
            return Hang("nccl-desync-report", d.group(2), None, int(d.group(1)))
        lag = _lagging_rank(line)
        if lag is not None:
            return Hang("nccl-desync-lagging-rank", None, None, lag)
    if "NCCL" in line:
        if "detected by watchdog" in line or "watchdog thread terminated" in line:
            op = _OPTYPE.search(line)
            return Hang(
                "nccl-watchdog-exception",
                op.group(1) if op else None,
                _int(_TIMEOUT_MS.search(line)),
                _rank(line),
                _seq(line),
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
