"""Feed a container's new lines to its `LineScanner` as `feed_all` would, without the per-line work
for the lines `feed_all`'s own precheck drops (most lines: noise).

`feed_all` decodes each line and tests it for ~two dozen substrings before parsing the few that
hold one. Here the batch is joined once and each substring is searched for over the whole batch
(C-speed `bytes.find`), so a line none of them is in is only counted (`scanner.lines`). What is
fed keeps its line number: runs of skipped lines advance the count between the fed ones.

Exactly the lines `feed_all` could act on still reach it: a line holding any trigger, every line
while the scanner has no first timestamp yet (it takes one from its first 1,000 lines), a line
over the byte limit (feed_all names its truncation in a diagnostic) and a line that is not ASCII
(feed_all names a line that is not UTF-8). The triggers are ASCII, so a substring found in the
bytes is the one found in the decoded text and none is found in one but not the other.
Every substring of feed_all's precheck must hold one of `TRIGGERS`: tests/agent/test_gate.py reads
them from its source and fails when scan gains one that none of them is in.

Work stays linear in the batch: per trigger one `find` per line that holds it (the search resumes
after that line's end), whatever a tenant writes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import add

from collector.progress.scan import LineScanner

# Each substring of LineScanner.feed_all's precheck holds one of these (ASCII, as bytes), so a line
# that holds none of them is one the precheck drops. A few stand for several ("step" for "step=",
# "step:", "kipping step" and "checkpoint at step"; "loss" for the four loss spellings): fewer
# searches over each batch, for a few more lines handed to feed_all (which drops them itself).
TRIGGERS: tuple[bytes, ...] = (
    b"iteration", b"%|", b"step", b"loss", b"Xid", b"ollective", b"atchdog", b"NCCL e", b"NCCL c",
    b"NCCL o", b"nccl", b"Timed out waiting", b"nqueued", b"loaded checkpoint", b"Continuing training",
    b"restart worker group", b"\x1b",
)
FIRST_TIME_LINES = 1000  # feed_all looks for a first timestamp in this many lines


def feed(sc: LineScanner, lines: Sequence[bytes]) -> None:
    """`sc.feed_all(lines)`, the lines its precheck would drop counted instead of scanned."""
    if not lines:
        return
    if sc.custom is not None or (sc.first_at is None and sc.lines < FIRST_TIME_LINES):
        sc.feed_all(lines)  # a custom pattern sees every line; no first timestamp yet
        return
    n = len(lines)
    lens = list(map(len, lines))
    ends = list(map(add, accumulate(lens), range(n)))  # offset of the "\n" after each line in `blob`
    blob = b"\n".join(lines)
    keep: set[int] = set()
    for t in TRIGGERS:
        pos = blob.find(t)
        while pos >= 0:
            i = bisect_right(ends, pos)  # the line holding `pos` (a trigger never spans a "\n")
            keep.add(i)
            pos = blob.find(t, ends[i] + 1)
    if max(lens) > sc.max_line_bytes:
        keep.update(i for i, k in enumerate(lens) if k > sc.max_line_bytes)
    if not blob.isascii():
        keep.update(i for i, line in enumerate(lines) if not line.isascii())
    done = 0
    for i in sorted(keep):
        if i < done:
            continue
        j = i + 1
        while j in keep:
            j += 1
        sc.lines += i - done
        sc.feed_all(lines[i:j])
        done = j
    sc.lines += n - done
