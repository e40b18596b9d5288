"""A scanner read again and again (the node agent snapshots it on every reader's poll) counts each
sample once: `finish()` must not commit the last sample, which the next sample commits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.progress.scan import LineScanner
from collector.progress.whole import scan_text

LINE = ("2026-01-10T12:00:{s:02d}.000000000Z  iteration {step:>8}/ 1000 | consumed samples: {cs:>8} | "
        "elapsed time per iteration (ms): 1000.0 | lm loss: 2.5E+00 | number of skipped iterations: {sk:>3} |")


def lines(first: int, n: int, skipped: frozenset[int] = frozenset()) -> list[str]:
    return [LINE.format(s=(first + i) % 60, step=first + i, cs=8 * (first + i), sk=int(first + i in skipped))
            for i in range(n)]


def test_finish_twice_counts_the_last_sample_once() -> None:
    sc = LineScanner("ns/pod/main", None, 16_384)
    sc.feed_all(lines(1, 3))
    first = sc.finish().summary_of()
    again = sc.finish().summary_of()
    assert (first.seen, first.dropped) == (again.seen, again.dropped) == (3, 0)
    sc.feed_all(lines(4, 2))
    after = sc.finish().summary_of()
    assert (after.seen, after.dropped, after.high_water and after.high_water.step) == (5, 0, 5)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6),
       skipped=st.frozensets(st.integers(min_value=2, max_value=40), max_size=6),
       reads=st.integers(min_value=1, max_value=3))
def test_snapshots_do_not_change_what_a_whole_scan_says(cuts: list[int], skipped: frozenset[int],
                                                        reads: int) -> None:
    text = lines(1, 40, skipped)
    whole = scan_text("\n".join(text).encode() + b"\n", source="ns/pod/main")
    sc = LineScanner("ns/pod/main", None, 16_384)
    at = 0
    for cut in sorted(cuts):
        sc.feed_all(text[at:cut])
        at = max(at, cut)
        for _ in range(reads):
            sc.finish()
    sc.feed_all(text[at:])
    assert sc.finish().summary_of() == whole.summary_of()
