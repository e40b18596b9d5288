"""ContainerTail's inline path for common full records (in `_read`) gives what the record-by-record
path (`_record`, parse_cri) gives: the same lines, counts, problems and partial-line assembly,
whatever the mix of records and line limits."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.agent.cri import ContainerTail

TS = b"2026-01-10T10:00:00.123456789Z"
record = st.tuples(
    st.sampled_from([TS, TS, TS, b"2026-01-10", b""]),
    st.sampled_from([b"stdout", b"stdout", b"stderr", b"stdin"]),
    st.sampled_from([b"F", b"F", b"F", b"P", b"F:x", b"X"]),
    st.one_of(st.sampled_from([b"text", b"", b"x" * 50, b"two words", b"a stdout F b"]),
              st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"").replace(b"\x00", b""))),
    st.booleans(),  # the content field present at all
).map(lambda r: b" ".join([r[0], r[1], r[2], *([r[3]] if r[4] else [])]))
binary = st.sampled_from([b"a\x00b", b"\x00"]).map(lambda c: TS + b" stdout F " + c)


def _tail(d: Path, max_line: int) -> tuple[ContainerTail, list[tuple[str, str]]]:
    problems: list[tuple[str, str]] = []
    tail = ContainerTail(d, None, from_start=True, first_read_bytes=1 << 20, read_bytes=1 << 20,
                         max_line_bytes=max_line, problem=lambda k, m: problems.append((k, m)))
    return tail, problems


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.lists(record, max_size=20), st.lists(st.one_of(record, binary), max_size=20)), max_size=4),
       st.sampled_from([32, 1 << 16]))
def test_the_inline_path_matches_record_by_record(polls: list[list[bytes]], max_line: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        fast, fast_problems = _tail(d, max_line)
        slow, slow_problems = _tail(d, max_line)
        got: list[bytes] = []
        want: list[bytes] = []
        pos = 0
        for batch in polls:
            with open(d / "0.log", "ab") as f:
                f.write(b"".join(r + b"\n" for r in batch))
            got += fast.poll()
            for raw in batch:
                slow._record(raw, pos, "0.log", want)
                pos += len(raw) + 1
        assert got == want
        assert (fast.lines, fast.binary) == (slow.lines, slow.binary)
        assert fast_problems == slow_problems


def test_full_records_take_the_inline_path(tmp_path: Path) -> None:
    tail, problems = _tail(tmp_path, 1 << 16)
    (tmp_path / "0.log").write_bytes(b"".join(TS + b" stdout F line %d\n" % i for i in range(3)))
    seen: list[bytes] = []
    tail._record = lambda raw, pos, name, out: seen.append(raw)  # type: ignore[method-assign]
    assert tail.poll() == [TS + b" line 0", TS + b" line 1", TS + b" line 2"]
    assert seen == [] and tail.lines == 3 and not problems
