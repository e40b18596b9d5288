"""`ByScan`: values kept on the scan object itself (`LogScan.memo`), one place per ByScan."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime

from collector.claims.progress_walk import ByScan
from collector.progress import LogScan
from collector.progress.model import new_sample

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _scan(n: int) -> LogScan:
    samples = tuple(new_sample(i, AT, 1.0, i, "megatron", False, None) for i in range(n))
    return LogScan("ns/p/main", "megatron", samples, (), (), (), n, first_at=AT)


def test_values_are_per_scan_object_and_per_byscan() -> None:
    a, b = ByScan[str](), ByScan[tuple[int]]()
    s, t = _scan(3), _scan(3)
    assert s == t and s is not t
    assert a.get(s) is None and b.get(s) is None
    a.put(s, "walk of s")
    assert a.get(s) == "walk of s" and a.get(t) is None and b.get(s) is None  # equal scans keep their own
    b.put(s, (7,))
    a.put(s, "again")
    assert (a.get(s), b.get(s)) == ("again", (7,))
    late = ByScan[int]()  # made after s got its memo: its place is past the memo's end until put
    assert late.get(s) is None
    late.put(s, 5)
    assert (a.get(s), b.get(s), late.get(s)) == ("again", (7,), 5)


def test_memo_is_not_part_of_the_record() -> None:
    a = ByScan[str]()
    s = _scan(2)
    a.put(s, "kept")
    r = replace(s)  # another scan object: nothing derived from s carried over
    assert r == s and a.get(r) is None and r.memo is None
    assert "memo" not in repr(s) and hash(r) == hash(s)
    assert "memo" in {f.name for f in fields(LogScan)}  # (a field, but not in __init__ / ==)
