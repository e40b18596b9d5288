"""The tail reads in chunks and the agent parses each chunk's lines before the next read (memory: a
catch-up on megabytes of log is never held as lines at once). Same answers as one read per poll:
the same lines, counts, problems and cursors from the tail, the same /evidence documents from the
agent, whatever the chunk size; and the memory of a catch-up does not grow with the backlog."""

from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import collector.agent.logs as logs
from collector.agent.cri import ContainerTail, Cursor, OffsetStore
from collector.agent.logs import LogEvidence
from tests.agent.test_cri_fast import TS, binary, record
from tests.agent.test_increments import WATCHDOG, _doc
from tests.agent.test_logs import POD, Node, evidence, megatron

ONE_READ = 1 << 30  # a chunk past any read limit: one read per file and poll, as before chunks
long_record = st.integers(20, 300).map(lambda n: TS + b" stdout F " + b"y" * n)


def _tail(d: Path, read_bytes: int, chunk: int, max_line: int) -> tuple[ContainerTail, list[tuple[str, str]]]:
    problems: list[tuple[str, str]] = []
    tail = ContainerTail(d, None, from_start=True, first_read_bytes=1 << 20, read_bytes=read_bytes,
                         max_line_bytes=max_line, problem=lambda k, m: problems.append((k, m)), chunk_bytes=chunk)
    return tail, problems


def _cursors(t: ContainerTail) -> dict[str, tuple[int, int]]:
    return {n: (c.offset, c.committed) for n, c in t.cursors.items()}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(record, binary, long_record), max_size=25), max_size=5),
       st.integers(1, 120), st.sampled_from([64, 150, 400, 1 << 20]), st.sampled_from([32, 1 << 16]),
       st.booleans())
def test_chunked_reads_give_what_one_read_gives(polls: list[list[bytes]], chunk: int, read_bytes: int,
                                                max_line: int, sink: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        chunked, chunked_problems = _tail(d, read_bytes, chunk, max_line)
        whole, whole_problems = _tail(d, read_bytes, ONE_READ, max_line)
        batches: list[list[bytes]] = []
        for batch in polls:
            with open(d / "0.log", "ab") as f:
                f.write(b"".join(r + b"\n" for r in batch))
            for _ in range(2):  # a read limit can leave lines for the next poll
                want = whole.poll()
                if sink:
                    got: list[bytes] = []

                    def take(b: list[bytes], got: list[bytes] = got) -> None:
                        batches.append(list(b))
                        got.extend(b)

                    assert chunked.poll(take) == []
                else:
                    got = chunked.poll()
                assert got == want
                assert _cursors(chunked) == _cursors(whole)
        assert (chunked.lines, chunked.binary) == (whole.lines, whole.binary)
        assert chunked_problems == whole_problems
        assert all(batches), "no empty batch is handed on"


def test_a_sink_gets_the_lines_chunk_by_chunk(tmp_path: Path) -> None:
    lines = [TS + b" stdout F line %05d" % i for i in range(2000)]
    (tmp_path / "0.log").write_bytes(b"".join(r + b"\n" for r in lines))
    tail, problems = _tail(tmp_path, 1 << 20, 4096, 1 << 16)
    batches: list[list[bytes]] = []
    assert tail.poll(lambda b: batches.append(list(b))) == []
    assert [x for b in batches for x in b] == [TS + b" line %05d" % i for i in range(2000)]
    assert len(batches) > 10 and max(sum(len(x) + 10 for x in b) for b in batches) <= 4096
    assert not problems and tail.cursors["0.log"].offset == (tmp_path / "0.log").stat().st_size


def test_a_record_longer_than_a_chunk_is_read_whole(tmp_path: Path) -> None:
    long = TS + b" stdout F " + b"z" * 10_000
    (tmp_path / "0.log").write_bytes(TS + b" stdout F a\n" + long + b"\n" + TS + b" stdout F b\n")
    tail, problems = _tail(tmp_path, 1 << 20, 100, 1 << 16)
    assert tail.poll() == [TS + b" a", TS + b" " + b"z" * 10_000, TS + b" b"] and not problems


def test_a_record_longer_than_the_read_limit_is_skipped_as_before(tmp_path: Path) -> None:
    (tmp_path / "0.log").write_bytes(TS + b" stdout F " + b"z" * 5000 + b"\n" + TS + b" stdout F b\n")
    tail, problems = _tail(tmp_path, 1000, 100, 1 << 16)
    assert tail.poll() == []
    assert [k for k, _ in problems] == ["oversized"] and tail.cursors["0.log"].offset == 1000
    got = [x for _ in range(6) for x in tail.poll()]
    assert got == [TS + b" b"]  # the rest of the long record after the skipped reads is no record
    assert [k for k, _ in problems] == ["oversized"] * 5 + ["malformed"]


def _write_log(node: Node, ops: list[tuple[str, int]]) -> None:
    for op, n in ops:
        if op == "steps":
            node.write(*node.steps(n, n + 3))
        elif op == "noise":
            node.write(*[node.line(f"noise {i} " + "x" * (n * 7)) for i in range(n)])
        elif op == "hang":
            node.write(node.line(WATCHDOG))
        elif op == "partial":
            text = megatron(n, 1.5)
            node.write(node.line(text[:40], tag="P"), node.line(text[40:]))
        elif op == "rotate":
            d = node.dir()
            if (d / "0.log").exists():
                (d / "0.log").rename(d / f"0.log.2026011010{n:04d}")
        elif op == "restart":
            node.write(*node.steps(n, n + 1), name="1.log")


def _served(ev: LogEvidence, since: int | None) -> dict[str, object]:
    """The document, less each container's `read_at` (the clock of the poll that read it)."""
    doc = _doc(ev, since)
    for c in doc["logs"]:  # type: ignore[attr-defined]
        c.pop("read_at")
    return doc


ops = st.lists(st.tuples(st.sampled_from(["steps", "steps", "noise", "hang", "partial", "rotate", "restart"]),
                         st.integers(1, 60)), max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, min_size=1, max_size=5), st.sampled_from([97, 512, 4096]), st.sampled_from([4, 512]))
def test_documents_are_those_of_one_read_per_poll(polls: list[list[tuple[str, int]]], chunk: int,
                                                  kept: int) -> None:
    """The agent reading in small chunks serves, after every poll, the /evidence documents (whole and
    increments from each earlier poll) of the agent reading each file at once and feeding it whole."""
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp))
        node.dir()
        small = evidence(Path(tmp), read_chunk_bytes=chunk, samples_kept=kept, findings_kept=2)
        whole = evidence(Path(tmp), read_chunk_bytes=ONE_READ, samples_kept=kept, findings_kept=2)
        small.epoch = whole.epoch
        for k, step in enumerate(polls):
            _write_log(node, step)
            small.poll()
            whole.poll()
            for since in (None, *range(k + 1)):
                assert _served(small, since) == _served(whole, since)
            assert (small.lines_total, small.problems) == (whole.lines_total, whole.problems)


def test_a_long_backlog_is_caught_up_in_memory_that_does_not_grow_with_it(tmp_path: Path) -> None:
    """Catching up on 4 MiB of log (the read limit per poll): what the poll allocates at its peak is
    bounded by the chunk, not the backlog (one read per poll held ~3.5× the backlog at once)."""
    node = Node(tmp_path)
    with open(node.dir() / "0.log", "wb") as f:
        for i in range(20_000):
            text = megatron(i // 20) if i % 20 == 0 else f"noise line {i} " + "n" * 120
            f.write(f"2026-01-10T10:00:00.123456789Z stdout F {text}\n".encode())
    size = (node.dir() / "0.log").stat().st_size
    assert 3 << 20 < size < 4 << 20  # read in one poll
    state = tmp_path / "log-offsets.json"  # followed from byte 0, as an agent that followed it all along
    OffsetStore(state).save({f"{POD}/trainer": {"0.log": Cursor((node.dir() / "0.log").stat().st_ino, 0, 0)}})
    ev = evidence(tmp_path, state)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        ev.poll()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (c,) = ev.containers()
    assert c.scan.lines == 20_000 and c.scan.samples[-1].step == 999
    # the chunk (64 KiB) as bytes, records and lines, its batch joined, plus the samples parsed
    assert peak - before < 1 << 20, (peak - before, size)
    assert after - before < 1 << 20


def test_readers_see_a_container_only_between_polls(tmp_path: Path) -> None:
    """A reader taking a snapshot while a poll feeds chunk after chunk waits for the poll's end."""
    node = Node(tmp_path)
    node.write(*node.steps(1, 200))
    ev: LogEvidence = evidence(tmp_path, read_chunk_bytes=1024)
    seen: list[bool] = []
    real = logs.feed

    def feed(sc: object, lines: list[bytes]) -> None:
        real(sc, lines)  # type: ignore[arg-type]
        f = next(iter(ev._followed.values()))
        seen.append(f.lock.locked())

    logs.feed = feed  # type: ignore[assignment]
    try:
        ev.poll()
    finally:
        logs.feed = real
    assert len(seen) > 10 and all(seen), "every batch fed under the container's lock"
    (c,) = ev.containers()
    assert [s.step for s in c.scan.samples][-1] == 200
