"""Today's scanner gives the answer the scanner of commit 1b82892 gave (tests/progress/scan_1b82892),
on lines drawn from the formats real trainers print, mixed, prefixed, framed and broken.

The scanner's hot path was made cheaper (issue 30) with no change of result: same samples,
findings, diagnostics and counters (`LogScan`, compared as repr: a NaN loss is never == itself).
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.progress import trainers
from collector.progress.model import (
    SAMPLE_FIELDS,
    SCAN_FIELDS,
    HangFinding,
    LogScan,
    ProgressSample,
    ResumeFinding,
    TokenRate,
    new_sample,
    new_scan,
)
from collector.progress.numbers import OutOfRange
from collector.progress.scan import LineScanner
from collector.progress.whole import scan_lines
from tests.progress.scan_1b82892 import scan as reference
from tests.progress.scan_1b82892 import trainers as reference_trainers

# Numbers as trainers print them, and as a tenant could: small (steps repeat, go back), the bounds'
# edges, too long for int(), non-ASCII digits, signs.
SMALL = st.integers(0, 12).map(str)
ODD = st.sampled_from(["0", "9007199254740991", "9007199254740992", "123456789012345", "1234567890123456",
                       "99999999999999999999999", "1048575", "1048576", "\u0663", "\u0661\u0662", "-1", "+3"])
NUM = st.one_of(SMALL, SMALL, SMALL, SMALL, ODD)
RANK = st.one_of(st.sampled_from(["0", "0", "1", "2", "3"]), ODD)
LOSS = st.sampled_from(["2.504220E+00", "1.0", "nan", "inf", "-1.0000", "6.1384", "abc", "", "0"])
PAD = st.sampled_from(["", " ", "  ", "        "])


def _megatron(d: st.DrawFn) -> str:
    head = d(st.sampled_from(["", " ", "validation loss at ", "Evaluating ", "Testing: ", "x" * 70, "[E] "]))
    s = f"{head}iteration{d(PAD) or ' '}{d(NUM)}/{d(PAD)}{d(NUM)}{d(PAD)}|"
    fields = d(st.lists(st.sampled_from([
        f" consumed samples: {d(NUM)} |", f" lm loss: {d(LOSS)} |", f" loss: {d(LOSS)} |", f" moe_loss: {d(LOSS)} |",
        " loss scale: 1.0 |", f" number of skipped iterations: {d(PAD)}{d(NUM)} |",
        f" number of nan iterations: {d(PAD)}{d(NUM)} |", " grad norm: 0.3 |", f" lm loss: {d(LOSS)}",
        " elapsed time per iteration (ms): 1000.0 |", f" |lm loss:{d(LOSS)}|", " lm  loss: 1.5 |"]), max_size=5))
    return s + "".join(fields)


def _bar(d: st.DrawFn) -> str:
    desc = d(st.sampled_from(["", "Epoch 0: ", "Epoch 3: : ", "Epoch 1:  ", "Validation DataLoader 0: ", "Map: ",
                              "(RayTrainWorker pid=12, ip=10.0.0.3) ", "worker-0: ", "INFO:root: Epoch 2: ",
                              "Sanity Checking: "]))
    tail = d(st.sampled_from(["", ", loss=10.072, v_num=1", ", train_loss=2.5", ", reduced_train_loss=1.2",
                              ", 2.3it/s"]))
    cut = d(st.sampled_from(["]", "", " trailing print", "]{'loss': 1.5, 'epoch': 0.1}", "] NCCL error: oops"]))
    if d(st.integers(0, 5)) == 0:  # Lightning without a percentage
        return f"{desc}{d(NUM)}/{d(st.one_of(NUM, st.just('?')))} [00:17<01:02{tail}{cut}"
    return f"{desc}{d(st.sampled_from(['22', '0', '100', '5']))}%|██▏       | {d(NUM)}/" \
           f"{d(st.one_of(NUM, st.just('?')))} [00:17<01:02{tail}{cut}"


def _other(d: st.DrawFn) -> str:
    n, loss = d(NUM), d(LOSS)
    return d(st.sampled_from([
        f"[Rank 0] step={n}, skipped={d(NUM)}, lr=[0.0001], loss={loss}",
        f"epoch=0/micro_step=200/global_step={n}, RunningAvgSamplesPerSec=12.5",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "Overflow detected. Skipping step",
        f"{{'loss': {loss}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}}",
        f"{{\"loss\": {loss}, \"step\": {n}}}", f"{{'loss': {loss}, 'global_step': {n}}}",
        f"{{'eval_loss': {loss}, 'epoch': 1.0}}",
        f"[titan] 2025-06-16 22:30:50,322 - root - INFO - step: {n}  loss:  {loss}  memory: 49.66GiB(52.28%)  "
        f"tps: {d(st.sampled_from(['5,856', '12', '0', '1,000,000,000,000', '3.5']))}  tflops: 339.16  mfu: 34.29%",
        f"\x1b[31mstep: {n}\x1b[39m  \x1b[32mloss:  {loss}\x1b[39m  \x1b[33mmemory: 49.66GiB(52.28%)\x1b[39m",
        f"validate step: {n}  loss: {loss}  memory: 1GiB",
        f"Training epoch {d(NUM)}, iteration {n}/{d(NUM)} | lr: 3e-05 | global_step: {d(NUM)} | "
        f"reduced_train_loss: {loss} | val_loss: 4.1",
        f"Training epoch {d(NUM)}, iteration {n}/{d(NUM)} | lr: 3e-05 | reduced_train_loss: {loss}",
        f"2026-08-10 15:55:20 | INFO | root | step {n} | epoch {d(NUM)} | loss {loss} | grad_norm 1.5 | "
        f"tps 11278.56({d(st.sampled_from(['1409.82', '0', '5']))}/gpu) | num_label_tokens 21541",
        f"[val] step {n} | epoch 0 | loss {loss} | tps 1.0(1.0/gpu)",
        f"NVRM: Xid (PCI:0000:9b:00): {d(st.sampled_from(['79', '119', '13', '65536', '48']))}, pid=1234, name=python",
        f"[Rank {d(RANK)}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, "
        f"NumelIn=4, Timeout(ms)={d(NUM)}) ran for 600060 milliseconds before timing out.",
        f"[PG ID 0 PG GUID 0(default_pg) Rank 1] Received a dump signal due to a collective timeout from rank 13. "
        f"Last enqueued NCCL work: {n}, last completed NCCL work: {d(NUM)}.",
        f"[{d(RANK)}] Timeout at collective: ALLREDUCE, #3", f"[{d(RANK)}] rank didn't join collective",
        "NCCL error in: ProcessGroupNCCL.cpp:1", "NCCL communicator was aborted on rank 3.",
        "Some NCCL operations have failed or timed out.", "segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2[7f+d]",
        "ncclSystemError: System call failed", f"Timed out waiting {n}ms for recv operation to complete",
        f"[PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: {n}, last completed "
        f"NCCL work: {d(NUM)}.",
        f"  successfully loaded checkpoint from /ckpt at iteration 7 [ t 0 ] at iteration {n}",
        f"Loading the checkpoint at step {n}.", f"  Continuing training from global step {n}",
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
        "saving checkpoint at iteration    1000 to /checkpoints/gpt", "node-3:2211:2890 [5] NCCL INFO Channel 07/24",
        "/usr/lib/torch/utils/checkpoint.py:429: UserWarning: torch.utils.checkpoint: use_reentrant",
        "INFO:megatron.core.datasets:Building dataset splits", "    forward-backward ....: (8541.20, 8560.77)",
        f"step {n} | epoch 0 | loss {loss}", f"rank={d(RANK)} step: {n} loss: {loss} memory:",
    ]))


@st.composite
def _frame(d: st.DrawFn) -> str:
    kind = d(st.integers(0, 9))
    if kind <= 3:
        return _megatron(d)
    if kind <= 5:
        return _bar(d)
    if kind <= 8:
        return _other(d)
    return d(st.text(max_size=20))


@st.composite
def _line(d: st.DrawFn) -> str:
    stamp = d(st.sampled_from(["", "", "2026-01-10T12:08:00.123456789Z ", "2026-01-10T12:08:0%d.5+01:00 ",
                               "2026-01-10T12:08:00Z  ", "2026-13-10T12:08:00Z ", "2026-01-10T12:08:00.1Z",
                               "[2024-07-17 19:44:06,829] ", "[Sun Feb 23 16:24:18 2025] "]))
    again = d(st.sampled_from(["", "", "2025-06-16T22:30:50.322Z "]))
    rank = d(st.sampled_from(["", "", "", "[rank{}]:", "[default{}]:", "[rank{}]: ", "rank={} ", "x rank={} y "]))
    frames = d(st.lists(_frame(), min_size=1, max_size=3))
    sep = d(st.sampled_from(["\r", "", " "]))
    return stamp + again + rank.format(d(RANK)) + sep.join(frames) + d(st.sampled_from(["", "\r", "\r\n", "\x1b[A"]))


_LINES = st.lists(st.one_of(_line(), _line(), _line(), st.binary(max_size=16)), max_size=40)


def _same(lines: list[str | bytes], custom: str | None, max_line_bytes: int, paces: bool) -> None:
    new = LineScanner("s", custom, max_line_bytes, paces=paces)
    old = reference.LineScanner("s", custom, max_line_bytes, paces=paces)
    half = len(lines) // 2  # fed in two reads, as the agent and the controller do
    for part in (lines[:half], lines[half:]):
        new.feed_all(part)
        old.feed_all(part)
    assert repr(new.finish()) == repr(old.finish())


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_LINES, st.sampled_from([1 << 20, 1 << 20, 120]), st.booleans())
def test_scan_matches_1b82892(lines: list[str | bytes], max_line_bytes: int, paces: bool) -> None:
    _same(lines, None, max_line_bytes, paces)
    as_bytes = [x.encode("utf-8", "surrogatepass") if isinstance(x, str) else x for x in lines]
    _same(as_bytes, None, max_line_bytes, paces)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_LINES)
def test_scan_with_a_custom_regex_matches_1b82892(lines: list[str | bytes]) -> None:
    _same(lines, r"step[:= ]\s*(?P<step>[^\s,|]+)(?:.*?loss[:=]?\s*(?P<loss>[\d.eE+-]+))?", 1 << 20, True)


def test_long_run_of_one_format_matches_1b82892() -> None:
    """Many samples of each format in one stream: the bounded deques, dedup and commit over a long run."""
    lines: list[str | bytes] = []
    for i in range(3000):
        ts = f"2026-01-10T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i:09d}Z "
        lines.append(ts + f" iteration {i // 2:>8}/  250000 | lm loss: {2.5 - i * 1e-4:.6E} | "
                          f"number of skipped iterations: {int(i % 97 == 0)} |")
        lines.append(ts + f"[rank{i % 4}]:[titan] 2025 - root - INFO - step: {i}  loss:  6.1  memory: 1GiB  tps: 5,856")
        lines.append(ts + f" 22%|██▏       | {i}/100000 [00:17<01:02,  2.3it/s]" + ("{'loss': 1.5}" if i % 7 else ""))
    # past MAX_PATTERN_TEXT (16,384 characters a frame): cut, with its diagnostic
    lines += [" iteration 7000/9000 | lm loss: 1.0E+00 |" + "x" * 20_000,
              "x" * 16_380 + " 22%|██▏       | 9/10 [00:17<01:02,  2.3it/s]", " 5%|█ | 1/10 [00:01" + " " * 17_000]
    assert scan_lines(lines, source="s").samples  # the run has samples to compare
    for paces in (True, False):
        _same(lines, None, 1 << 20, paces)


def test_new_sample_is_the_dataclass_sample() -> None:
    """new_sample sets the slots SAMPLE_FIELDS names: every field the class has, in its order."""
    assert tuple(f.name for f in fields(ProgressSample)) == SAMPLE_FIELDS
    at = datetime(2026, 1, 10, tzinfo=UTC)
    fast, slow = new_sample(3, at, 2.5, 7, "megatron", True, 100), ProgressSample(3, at, 2.5, 7, "megatron", True, 100)
    assert (fast == slow, hash(fast) == hash(slow), repr(fast)) == (True, True, repr(slow))
    bare = new_sample(None, None, None, 0, "hf-trainer", False, None)
    assert bare == ProgressSample(None, None, None, 0, "hf-trainer")
    assert new_sample(4, at, None, -3, "nemo", False, 9, 12) == ProgressSample(4, at, None, -3, "nemo", False, 9, 12)


def test_new_scan_is_the_dataclass_scan() -> None:
    """new_scan sets the slots SCAN_FIELDS names: every field the class has (the memo too), in its order;
    what it does not take is the dataclass's default."""
    assert tuple(f.name for f in fields(LogScan)) == SCAN_FIELDS
    at = datetime(2026, 1, 10, tzinfo=UTC)
    x = ProgressSample(3, at, 2.5, 7, "megatron", False, 100)
    h = (HangFinding("nccl-watchdog-timeout", 9, "ALLREDUCE", 600_000, 0, at),)
    r = (ResumeFinding(4, at, 3, "megatron"),)
    for args, kw in ((("s", None, (), (), (), (), 0), {}),
                     (("node/a", "megatron", (x,), h, (), ("cut",), 12), {"resumes": r, "tokens": TokenRate(9.5, at)})):
        fast, slow = new_scan(*args, **kw), LogScan(*args, **kw)  # type: ignore[arg-type]
        assert (fast == slow, repr(fast)) == (True, repr(slow))
        assert [getattr(fast, f) for f in SCAN_FIELDS] == [getattr(slow, f) for f in SCAN_FIELDS]
        assert fast.memo is None and fast.summary is None and fast.ranks == () and fast.first_at is None


# Pieces of the parsers' keys and values, so that a drawn text holds several candidates, the first
# of them not matching (a search that starts at a key's first occurrence must still find a later one).
PIECES = st.sampled_from(["step:", "step=", "tps:", "loss=", "loss:", "lm loss:", " loss: ", "memory:", "validate ",
                          ", skipped=", "| ", "|", " ", "  ", "5", "12", "1,000", "5,856", ".5", "9" * 20, "\u0663",
                          "x", "_", "/", "-1.0000", "nan", "iteration ", "/ ", "%|", " 22", "Epoch 1: ", "[", "]",
                          "number of skipped iterations: ", "number of nan iterations: ", "Validation ", "global_",
                          "reduced_", "train_", "_step", "_", "INFO ", "I0614 22:33:06.424 12 x.py:8] ", "W"])
RECORD = st.one_of(
    PIECES,
    st.builds("step: {}  loss:  {}  memory: 1GiB  tps: {}".format, NUM, LOSS, st.sampled_from(["5,856", "12", "0"])),
    st.builds("step={}, skipped={}, lr=[0.1], loss={}".format, NUM, NUM, LOSS),
    st.builds(" iteration {}/ {} | lm loss: {} | number of skipped iterations: {} |".format, NUM, NUM, LOSS, NUM),
    st.builds("{}{}%|██▏  | {}/{} [00:17<01:02, {}loss{}={}]".format,
              st.sampled_from(["", "Epoch 2: ", "INFO:root: Epoch 1: ", "(RayTrainWorker pid=1) Epoch 0: "]),
              st.sampled_from(["22", "5"]), NUM, NUM, st.sampled_from(["", "train_", "reduced_train_", "x", "_", "."]),
              st.sampled_from(["", "_step"]), LOSS),
    st.builds("Epoch {}: {}/{} [00:01<00:02, {}loss={}".format, NUM, NUM, NUM, st.sampled_from(["", "train_", "v"]),
              LOSS),
    st.builds("step {} | epoch {} | loss {} | tps 1.5({}/gpu)".format, NUM, NUM, LOSS, NUM),
)
TEXT = st.lists(RECORD, max_size=12).map("".join)


def _outcome(parse: object, text: str) -> object:
    try:
        return repr(parse(text))  # type: ignore[operator]
    except OutOfRange as e:  # (the reference raises the same class: numbers did not change)
        return ("out of range", str(e))


@settings(max_examples=3000, deadline=None)
@given(TEXT)
def test_parsers_match_1b82892(text: str) -> None:
    for name in ("parse_megatron", "parse_torchtitan", "parse_deepspeed_step", "parse_bar", "parse_automodel"):
        assert _outcome(getattr(trainers, name), text) == _outcome(getattr(reference_trainers, name), text), name


_SAMPLE = st.builds(ProgressSample, st.sampled_from([None, 1, 2]),
                    st.sampled_from([None, datetime(2026, 1, 1, tzinfo=UTC)]),
                    st.sampled_from([None, 1.0, float("nan")]), st.integers(0, 2),
                    st.sampled_from(["megatron", "nemo"]), st.booleans(), st.sampled_from([None, 5]), st.integers(1, 2))


@settings(max_examples=500, deadline=None)
@given(st.lists(_SAMPLE, max_size=8), _SAMPLE, st.booleans())
def test_history_holds_is_in(samples: list[ProgressSample], x: ProgressSample, put: bool) -> None:
    """compact's membership test answers as `in` does (identity first, then the dataclass ==)."""
    from collector.progress.history import _holds

    seq = tuple([*samples, x] if put else samples)
    assert _holds(seq, x) == (x in seq)
