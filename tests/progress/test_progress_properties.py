"""Invariants over arbitrary input: never raise, ordered samples, JSON-safe reports, one answer
whichever entry point reads the bytes."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.progress import LogScan, scan_lines, scan_path, scan_report, scan_text

FRAGMENTS = [
    b" iteration       7/  100 | lm loss: 2.5E+00 | number of skipped iterations:   0 |",
    b" iteration       3/  100 | number of skipped iterations:   1 | number of nan iterations:   1 |",
    b"[rank1]: iteration       9/  100 | lm loss: nan |",
    b"[rank0]: iteration       8/  100 | lm loss: 1.0E+00 |",
    b"Epoch 1:  20%|\xe2\x96\x88\xe2\x96\x88        | 2/10 [00:02<00:08,  1.00it/s, loss=3.1]",
    b"Epoch 1:  30%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88",
    b"Validation DataLoader 0:  50%|     | 1/2 [00:00<00:00, 10.00it/s]",
    b" 10%|\xe2\x96\x88         | 10/100 [00:10<01:30,  1.00it/s]",
    b"{'loss': 2.31, 'grad_norm': 1.5, 'epoch': 0.1}",
    b"{'eval_loss': 2.5}",
    b"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512",
    b"[Rank 0] step=10, skipped=2, lr=[0.1]",
    b"2026-01-10T12:08:00.123456789Z ",
    b"[Sun Feb 23 16:24:18 2025] ",
    b"NVRM: Xid (PCI:0000:9b:00): 119, pid=1, GSP",
    b"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=8000)",
    b" - [0] Timeout at collective: ALLREDUCE, #3",
    b"segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2[7f+d]",
    b"\r",
    b"\n",
    b"\x1b[A",
    b"\xff\xfe\xc3",
    b"rank=2 ",
]

logs = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=40)), max_size=40).map(b"".join)


def _check(scan: LogScan) -> None:
    lines = [s.line for s in scan.samples]
    # non-decreasing, not strictly: several bar frames of one physical line are separate steps
    assert lines == sorted(lines)
    assert all(1 <= n <= scan.lines for n in lines)
    assert all(1 <= h.line <= scan.lines for h in scan.hangs)
    assert all(1 <= x.line <= scan.lines for x in scan.xids)
    json.dumps(scan_report(scan), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(logs)
def test_arbitrary_bytes_never_raise_and_entry_points_agree(data: bytes) -> None:
    from_text = scan_text(data, source="x")
    _check(from_text)
    parts = data.split(b"\n")
    if parts and not parts[-1]:
        parts.pop()
    # compared as repr: a NaN loss is never == itself
    assert repr(scan_lines(parts, source="x")) == repr(from_text)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        path.write_bytes(data)
        assert repr(replace(scan_path(path), source="x")) == repr(from_text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=30))
def test_arbitrary_line_lists_never_raise(lines: list[bytes]) -> None:
    _check(scan_lines(lines, source="x", max_line_bytes=64))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30, unique=True).map(sorted),
    st.lists(st.sampled_from(FRAGMENTS[6:7] + FRAGMENTS[9:10] + [b"INFO noise", b"NCCL INFO x"]), max_size=30),
)
def test_every_advancing_step_is_one_sample(step_list: list[int], noise: list[bytes]) -> None:
    out: list[bytes] = []
    for i, step in enumerate(step_list):
        out.append(f" iteration {step:>7}/  100 | lm loss: 1.5E+00 |".encode())
        if i < len(noise):
            out.append(noise[i])
    scan = scan_lines(out, source="x")
    assert [s.step for s in scan.samples] == step_list
    assert scan.format == "megatron"
