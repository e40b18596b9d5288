"""How the loop folds a progress signal a source read (an API log read, a node agent's increment, a
checkpoint listing) into the one the index holds for the same container or source."""

from __future__ import annotations

from dataclasses import replace

from collector.claims.progress import compacted
from collector.correlate import Signal
from collector.progress.history import extend_history, merge_history
from collector.progress.model import LogScan
from collector.settings import ClaimSettings

__all__ = ["adds_nothing", "folded"]


def folded(prev: Signal | None, sig: Signal, op: str, after: int | None,
           claims: ClaimSettings) -> tuple[Signal, LogScan] | None:
    """What the index should hold after `sig` (from a change `op`: "log", "agent-log" with the line
    `after` which the agent's increment starts, or "signal"), and every sample read (for the sink).
    None: nothing new, only `prev`'s read time moves (see `Controller._refresh`)."""
    if prev is not None and after is not None and adds_nothing(prev.scan, sig.scan, after):
        return None  # an agent's increment with nothing new: read now, as it was
    if prev is not None and after is not None:
        # a node agent's increment: what it read after the document before
        sig = replace(sig, scan=extend_history(prev.scan, sig.scan, after))
    elif prev is not None and not sig.scan.lines and op == "log":
        sig = replace(prev, read_at=sig.read_at)  # no line since the last read: what it saw stands
    elif prev is not None:
        # a poll reads a bounded tail: keep what earlier polls saw (goodput, pre-restart mark)
        sig = replace(sig, scan=merge_history(prev.scan, sig.scan))
    read = sig.scan  # every sample read, for the sink; the index keeps the compacted history
    if op != "signal":
        sig = compacted(sig, claims)
    return sig, read


def adds_nothing(held: LogScan, inc: LogScan, after: int) -> bool:
    """A node agent's increment (what it read after line `after`) that `extend_history` would add
    nothing to `held` with: no finding, no sample but the lead one the history already holds as it
    is, and the same line count and notes."""
    return (not inc.hangs and not inc.xids and not inc.resumes and inc.lines == held.lines and inc.format == held.format
            and inc.diagnostics == held.diagnostics and len(inc.samples) <= 1
            and (not inc.samples or (inc.samples[0].line <= after and bool(held.samples)
                                     and inc.samples[0] == held.samples[-1])))
