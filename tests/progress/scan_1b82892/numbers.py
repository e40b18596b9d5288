"""Bounds on every integer the log parsers take from tenant text (issue 26).

A tenant's container prints whatever it likes: `iteration 99999999999999999999999/1 |` made one
sample whose step no JSON encoder (orjson: 64-bit), no Kusto `long` and no JSON double could carry,
and 5,000 digits made `int()` itself raise. So each number is bounded at the parser to what a
real trainer prints, and a line with a number past its bound yields nothing (the scanner names
the first such line in a diagnostic and counts the rest).
"""

from __future__ import annotations

# Steps, totals, epochs, skipped counts, collective sequence numbers, timeouts in ms: exact in a
# JSON double (2^53) and so also inside a Kusto long and a Prometheus float.
COUNT_MAX = (1 << 53) - 1
# Ranks: a million GPUs in one job is beyond any fleet.
RANK_MAX = (1 << 20) - 1
# NVIDIA XID codes are small catalogue numbers (154 is the highest published so far).
XID_MAX = (1 << 16) - 1
# More digits than any bound above has (2^53 has 16): cut before int() parses a tenant's 5,000.
_MAX_DIGITS = 20


class OutOfRange(ValueError):
    """A number on a log line beyond what any trainer prints: the line yields nothing."""

    def __init__(self, what: str, text: str) -> None:
        shown = text if len(text) <= 24 else text[:20] + "..."
        super().__init__(f"{what} {shown} is out of range")
        self.what = what


def bounded(text: str, hi: int, what: str, lo: int = 0) -> int:
    """The integer `text` (the digits a parser's group captured, maybe signed) if lo <= it <= hi.

    Raises OutOfRange otherwise, and for text that is not an integer at all. Runs on every parsed
    number: the length check keeps int() off long digit runs, the rest is int() itself.
    """
    if len(text) > _MAX_DIGITS:
        raise OutOfRange(what, text)
    try:
        value = int(text)
    except ValueError:
        raise OutOfRange(what, text) from None
    if lo <= value <= hi:
        return value
    raise OutOfRange(what, text)


def check(value: int, hi: int, what: str, lo: int = 0) -> int:
    """A derived integer (epoch × total + n, a running offset) held to the same bound."""
    if not lo <= value <= hi:
        raise OutOfRange(what, str(value))
    return value
