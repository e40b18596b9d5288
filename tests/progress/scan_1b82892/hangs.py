"""Collective hangs and NCCL failures in training and kernel logs (vocabulary: model.HANG_KINDS).

Each check is guarded by a plain substring test; the regexes only run on lines that pass it.
Every pattern here runs in linear time on any input (tenants write these lines): each one starts
with a literal and has no two unbounded repeats that can match the same characters, and the
bracket search of the rank tags is done with str.rfind instead of a lazy scan.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from collector.progress.numbers import COUNT_MAX, RANK_MAX, bounded

_OPTYPE = re.compile(r"OpType=(\w+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
# the collective's sequence number: `WorkNCCL(SeqNum=1580, ...)`, `detected by watchdog at work: 1580`
# (torch 2.4/2.5), `failure detected by watchdog at work sequence id: 1116` (torch >= 2.6),
# `Timeout at NCCL work: 7753` (torch 2.4/2.5, the rank that timed out)
_SEQNUM = re.compile(r"SeqNum=(\d+)|watchdog at work: (\d+)|work sequence id: (\d+)|Timeout at NCCL work: (\d+)")
# `last completed NCCL work: 1579` / `PG status: last enqueued work: 1118, last completed work: 1115`
# (-1: none completed yet)
_COMPLETED = re.compile(r"last completed (?:\w{1,16} )?work: (-?\d+)")
# The heartbeat monitor's dump on a collective timeout (torch >= 2.2), on every rank, the one behind
# included: "[PG ID 0 PG GUID 0(default_pg) Rank 1] Received a dump signal due to a collective
# timeout from rank 13 and we will try our best to dump the debug info. Last enqueued NCCL work:
# 1261, last completed NCCL work: 1259." (the older wording, as vendor forks of ProcessGroupNCCL still
# print it: "Received a timeout signal from this local rank and will start to dump the debug info.
# Last enqueued NCCL work: ...")
_DUMP = re.compile(r"Last enqueued (?:\w{1,16} )?work: (-?\d+), last completed (?:\w{1,16} )?work: (-?\d+)")
# The process group a message is about: `[PG ID 3 PG GUID d03b...fbfb Rank 1]` (torch >= 2.5: the GUID
# is the same on every rank), `[PG 1 Rank 0]` / `[PG 0 (default_pg) Rank 3]` (2.3/2.4: the uid)
_PG = re.compile(r"\[PG (?:ID \d{1,9} PG GUID ([\w.:-]{1,64})|(\d{1,9})\b)")
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
    seq: int | None = None  # the collective's sequence number on this rank (the last enqueued for dumps)
    completed: int | None = None  # the last collective this rank completed, where the line says
    pg: str | None = None  # the process group the numbers count in, where the line names it


def _rank_of(m: re.Match[str] | None) -> int | None:
    return bounded(m.group(1), RANK_MAX, "rank") if m else None


def _seq(line: str) -> int | None:
    m = _SEQNUM.search(line)
    if m is None:
        return None
    return bounded(next(g for g in m.groups() if g is not None), COUNT_MAX, "collective sequence number")


def _completed(line: str) -> int | None:
    m = _COMPLETED.search(line)
    return bounded(m.group(1), COUNT_MAX, "completed collective", lo=-1) if m else None


def _timeout(line: str) -> int | None:
    m = _TIMEOUT_MS.search(line)
    return bounded(m.group(1), COUNT_MAX, "timeout ms") if m else None


def _pg(line: str) -> str | None:
    m = _PG.search(line)
    return (m.group(1) or m.group(2)) if m else None


def _msg_rank(line: str) -> int | None:
    """`Rank N]` closing a bracket that opened before it (no `]` in between)."""
    for m in _MSG_RANK.finditer(line):
        if line.rfind("[", 0, m.start()) > line.rfind("]", 0, m.start()):
            return _rank_of(m)
        # rfind is O(n) per hit; a line of many bare `Rank N]` tags stops after a few tries
        if m.start() > 4096:
            break
    return None


def _rank(line: str) -> int | None:
    """The rank that printed the line. torchrun's `[rankN]:` tag is the global rank; the message's own
    `[Rank N]`/`[PG ... Rank N]` is the rank inside the message's process group, the same number
    only in the default group, so it is the fallback."""
    r = _rank_of(_PREFIX_RANK.search(line))
    return r if r is not None else _msg_rank(line)


def _lagging_rank(line: str) -> int | None:
    for phrase in _LAGGING_PHRASES:
        pos = line.find(phrase)
        if pos != -1:
            m = _BRACKET_NUM.search(line, 0, pos)
            if m:
                return _rank_of(m)
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
    "nqueued",  # the heartbeat monitor's dump lines (the older wording says "timeout", not "collective")
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
        or "nqueued" in line
    )


def match_hang(line: str, rank: int | None = None) -> Hang | None:
    """The hang/NCCL failure a line reports, if any (at most one per line).

    `rank`: the rank tag the scanner already took off the line (torchrun's `[rankN]:`), the
    printing rank's global number. Raises numbers.OutOfRange for a number no trainer prints.
    """

    def me() -> int | None:
        return rank if rank is not None else _rank(line)

    if "Last enqueued" in line:
        d = _DUMP.search(line)
        if d:
            return Hang(
                "nccl-timeout-dump",
                None,
                None,
                me(),
                bounded(d.group(1), COUNT_MAX, "enqueued collective", lo=-1),
                bounded(d.group(2), COUNT_MAX, "completed collective", lo=-1),
                _pg(line),
            )
    if "ollective" in line:
        if "Watchdog caught collective operation timeout" in line:
            # Also matches "watchdog thread terminated with exception: ... Watchdog caught ...",
            # which carries the same WorkNCCL details.
            op = _OPTYPE.search(line)
            return Hang("nccl-watchdog-timeout", op.group(1) if op else None, _timeout(line), me(), _seq(line),
                        None, _pg(line))
        d = _DESYNC.search(line)
        if d:
            return Hang("nccl-desync-report", d.group(2), None, _rank_of(d))
        lag = _lagging_rank(line)
        if lag is not None:
            return Hang("nccl-desync-lagging-rank", None, None, lag)
    if "NCCL" in line:
        if "detected by watchdog" in line or "watchdog thread terminated" in line or "Timeout at NCCL work" in line:
            op = _OPTYPE.search(line)
            return Hang("nccl-watchdog-exception", op.group(1) if op else None, _timeout(line), me(), _seq(line),
                        _completed(line), _pg(line))
        if "NCCL communicator was aborted" in line or "Some NCCL operations have failed" in line:
            on = _rank_of(_ABORTED_ON.search(line))
            return Hang("nccl-async-error", None, None, on if on is not None else me())
        if "NCCL error" in line:
            return Hang("nccl-error", None, None, me())
    if "nccl" in line:
        if "segfault at" in line and "libnccl" in line:
            return Hang("nccl-segfault", None, None, None)
        if (
            "ncclSystemError" in line
            or "ncclInternalError" in line
            or "ncclUnhandledCudaError" in line
            or "ncclRemoteError" in line
        ):
            return Hang("nccl-error", None, None, me())
    if "Timed out waiting" in line:
        g = _GLOO.search(line)
        if g:
            return Hang("collective-timeout", g.group(2).upper(), bounded(g.group(1), COUNT_MAX, "timeout ms"), me())
    return None
