"""The agent's bulk line gate (collector.agent.gate): the scanner ends in exactly the state
`feed_all` leaves it in, whatever the lines, and the gate's triggers cover scan's precheck."""

from __future__ import annotations

import ast
import inspect
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.agent.gate import TRIGGERS, feed
from collector.progress.scan import LineScanner

TS = b"2026-01-10T12:08:00.123456789Z "
FRAGMENTS = [
    b" iteration       7/  100 | lm loss: 2.5E+00 | number of skipped iterations:   0 |",
    b"[rank1]: iteration       9/  100 | lm loss: nan |",
    b"[rank0]: iteration       8/  100 | lm loss: 1.0E+00 |",
    b"Epoch 1:  20%|\xe2\x96\x88\xe2\x96\x88        | 2/10 [00:02<00:08,  1.00it/s, loss=3.1]",
    b"{'loss': 2.31, 'grad_norm': 1.5, 'epoch': 0.1}",
    b"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512",
    b"[Rank 0] step=10, skipped=2, lr=[0.1]",
    b"NVRM: Xid (PCI:0000:9b:00): 119, pid=1, GSP",
    b"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=8000)",
    b"loaded checkpoint from iteration 40",
    b"node-3:2211:2890 [5] NCCL INFO Channel 07/24 : 0 1 2 3",
    b"INFO:megatron.core.datasets:Building dataset splits",
    b"    forward-backward ...............................: (8541.20, 8560.77)",
    b"\r", b"\x1b[A", b"\xff\xfe\xc3", b"\xe2\x96\x88", b"rank=2 ", b"x" * 90,
]
line = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=12).map(lambda b: b.replace(b"\n", b""))),
                max_size=6).map(b"".join)
stamped = st.tuples(st.booleans(), line).map(lambda t: (TS if t[0] else b"") + t[1])


def _precheck_literals() -> set[str]:
    """The substrings `feed_all` tests each line for before parsing it (read from its source), those
    tested behind another one (`"step" in s and ("step:" in s or ...)`) included."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(LineScanner.feed_all)))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.Or):
            for v in ast.walk(node.test):
                if (isinstance(v, ast.Compare) and isinstance(v.ops[0], ast.In)
                        and isinstance(v.left, ast.Constant) and isinstance(v.left.value, str)):
                    found.add(v.left.value)
    return found


def test_every_substring_of_scans_precheck_holds_a_trigger() -> None:
    literals = _precheck_literals()
    assert len(literals) >= 20  # the precheck was found (it names ~two dozen)
    assert all(s.isascii() for s in literals)
    missing = {s for s in literals if not any(t in s.encode() for t in TRIGGERS)}
    assert not missing, f"scan's precheck substrings {missing} hold none of collector.agent.gate.TRIGGERS"


def _scanners(batches: list[list[bytes]], max_line: int) -> tuple[LineScanner, LineScanner]:
    a = LineScanner("c", None, max_line, paces=False)
    b = LineScanner("c", None, max_line, paces=False)
    for batch in batches:
        a.feed_all(batch)
        feed(b, batch)
    return a, b


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(stamped, max_size=30), max_size=6), st.sampled_from([40, 200, 1 << 16]))
def test_gated_feed_leaves_the_scanner_as_feed_all_does(batches: list[list[bytes]], max_line: int) -> None:
    a, b = _scanners(batches, max_line)
    assert b.lines == a.lines
    # compared as repr: a NaN loss is never == itself
    assert repr(b.finish()) == repr(a.finish())


def test_noise_is_counted_not_scanned_and_line_numbers_hold() -> None:
    seen: list[int] = []

    class Counting(LineScanner):
        def feed(self, n: int, s: str) -> None:
            seen.append(n)
            super().feed(n, s)

    sc = Counting("c", None, 1 << 16, paces=False)
    noise = TS + b"INFO:megatron.core.datasets:Building dataset splits with cls=GPTDataset"
    step = TS + b" iteration       7/  100 | lm loss: 2.5E+00 |"
    feed(sc, [noise] * 3)  # the first batch: no first timestamp yet, fed whole (none passes the precheck)
    feed(sc, [noise] * 5 + [step] + [noise] * 4 + [TS + b"NVRM: Xid (PCI:0000:9b:00): 79, pid=1"])
    assert sc.lines == 14
    assert seen == [9, 14]
    scan = sc.finish()
    assert [(x.step, x.line) for x in scan.samples] == [(7, 9)]
    assert [(x.code, x.line) for x in scan.xids] == [(79, 14)]

