"""Timestamps found in log lines, all returned tz-aware in UTC.

Naive timestamps (trainer `[2024-07-17 19:44:06,829]`, `dmesg -T`) carry no zone; they are taken
as UTC, which is what containers and most GPU nodes run in. Sub-microsecond digits are dropped.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|z|[+-]\d\d:?\d\d)?")
_DMESG_T = re.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} "
    r"\d\d:\d\d:\d\d \d{4})\]"
)

# Only the head of a line is searched, so dates inside a message body are not taken for its time.
HEAD = 96


def is_rfc3339_prefix(s: str) -> int:
    """Length of a `kubectl logs --timestamps` style prefix at the start of `s` (0 if none).

    Cheap positional checks first: this runs on every line.
    """
    if len(s) > 20 and s[10] == "T" and s[4] == "-" and s[7] == "-" and s[13] == ":":
        end = s.find(" ", 19, 48)
        if end > 0:
            return end
    return 0


def parse_iso(text: str) -> datetime | None:
    """An ISO 8601 / RFC 3339 timestamp (any fraction length, `,` or `.`, zone optional).

    Python 3.11's fromisoformat truncates fractions beyond microseconds (nanosecond kubelet stamps).
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value if value.tzinfo is UTC else value.astimezone(UTC)
    except OverflowError:  # a zone that takes it past year 1 or 9999
        return None


def find_time(text: str) -> datetime | None:
    """The first timestamp in the head of `text`: ISO/trainer style, else `dmesg -T` style."""
    head = text[:HEAD]
    m = _ISO.search(head)
    if m:
        return parse_iso(m.group(0))
    if "[" in head:
        d = _DMESG_T.search(head)
        if d:
            try:
                return datetime.strptime(" ".join(d.group(1).split()), "%b %d %H:%M:%S %Y").replace(tzinfo=UTC)
            except ValueError:
                return None
    return None
