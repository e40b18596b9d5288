"""Look-alikes, bad bytes, huge lines, ranks, bars, NaN, timestamps, tails: no crash, no false progress."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collector.progress import (
    XID_CATALOGUE,
    HangFinding,
    describe,
    scan_lines,
    scan_path,
    scan_report,
    scan_text,
)
from collector.progress.whole import _file_lines


def meg(step: int, loss: str = "2.5E+00", skipped: int = 0, nans: int = 0) -> str:
    loss_part = f" lm loss: {loss} |" if loss else ""
    return (
        f" iteration {step:>8}/  1000 | consumed samples: {step * 8} | elapsed time per iteration (ms): 900.0 |"
        f"{loss_part} loss scale: 1.0 | number of skipped iterations: {skipped:>3} | "
        f"number of nan iterations: {nans:>3} |"
    )


def steps(text: str | bytes, **kw: str) -> list[tuple[int, float | None]]:
    return [(s.step, s.loss) for s in scan_text(text, source="t", **kw).samples]


# -- bytes and sizes --------------------------------------------------------------------------------
def test_non_utf8_bytes_are_replaced_with_a_diagnostic() -> None:
    data = b"\xff\xfe garbage\n" + meg(7).encode() + b"\n" + b"caf\xe9 " + meg(8).encode() + b"\n"
    scan = scan_text(data, source="bad")
    assert [s.step for s in scan.samples] == [7, 8]
    assert scan.diagnostics == (
        "line 1: not UTF-8, decoded with replacement",
        "line 3: not UTF-8, decoded with replacement",
    )


def test_5mb_single_line_is_truncated_not_held(tmp_path: Path) -> None:
    huge = b"x" * (5 * 1024 * 1024)
    data = meg(1).encode() + b"\n" + huge + b"\n" + meg(2).encode() + b"\n"
    for scan in (scan_text(data, source="t"), scan_path(_write(tmp_path, data))):
        assert scan.lines == 3
        assert [(s.step, s.line) for s in scan.samples] == [(1, 1), (2, 3)]
        assert scan.diagnostics == (f"line 2: longer than {1 << 20} bytes, truncated",)


def test_file_reader_bounds_every_line(tmp_path: Path) -> None:
    data = b"a" * 10_000 + b"\nshort\n" + b"b" * 2_500 + b"\n" + b"tail-no-newline"
    with open(_write(tmp_path, data), "rb") as f:
        got = list(_file_lines(f, limit=100, chunk=64))
    assert [len(x) for x in got] == [101, 5, 101, 15]
    assert got[1] == b"short" and got[3] == b"tail-no-newline"


def test_huge_line_without_newline_at_end(tmp_path: Path) -> None:
    scan = scan_path(_write(tmp_path, meg(3).encode() + b"\n" + b"y" * (3 << 20)))
    assert scan.lines == 2 and [s.step for s in scan.samples] == [3]
    assert scan.diagnostics == (f"line 2: longer than {1 << 20} bytes, truncated",)


def test_str_lines_over_the_limit_are_truncated() -> None:
    scan = scan_lines([meg(1), "é" * 600, meg(2)], source="t", max_line_bytes=1000)
    assert scan.diagnostics == ("line 2: longer than 1000 bytes, truncated",)
    assert [s.step for s in scan.samples] == [1, 2]


def test_empty_input() -> None:
    for scan in (scan_text("", source="e"), scan_text(b"", source="e"), scan_lines([], source="e")):
        assert scan.lines == 0 and scan.samples == () and scan.format is None
        assert scan.diagnostics == ("empty input",)
        assert scan_report(scan) == {
            "file": "e",
            "progress": None,
            "hang": [],
            "xid": [],
            "resume": [],
            "lines": 0,
            "diagnostics": ["empty input"],
        }


def test_crlf_line_endings() -> None:
    assert steps((meg(1) + "\r\n" + meg(2) + "\r\n").encode()) == [(1, 2.5), (2, 2.5)]


# -- ranks ------------------------------------------------------------------------------------------
def test_interleaved_ranks_only_rank0_counts() -> None:
    lines = [
        f"[rank1]:{meg(5, '9.0E+00')}",
        f"[rank0]:{meg(5, '1.0E+00')}",
        f"[rank1]:{meg(6, '9.0E+00')}",
        f"[rank1]:{meg(7, '9.0E+00')}",  # rank 1 ahead of rank 0: not rank 0's progress
        f"[rank0]:{meg(6, '1.5E+00')}",
    ]
    scan = scan_lines(lines, source="t")
    assert [(s.step, s.loss, s.line) for s in scan.samples] == [(5, 1.0, 2), (6, 1.5, 5)]
    assert scan.diagnostics == ("progress lines from several ranks (1); only rank 0 counted",)


def test_rank_equals_tag_and_lowest_rank_when_no_rank0() -> None:
    lines = [f"rank=3 {meg(10)}", f"rank=2 {meg(9)}", f"rank=3 {meg(11)}", f"rank=2 {meg(10)}"]
    scan = scan_lines(lines, source="t")
    assert [s.step for s in scan.samples] == [9, 10]
    assert scan.diagnostics == ("progress lines from several ranks (3); only rank 2 counted",)


def test_untagged_step_repeated_by_another_process_is_one_sample() -> None:
    lines = [meg(5, "1.0E+00"), meg(5, "1.1E+00"), meg(6, "1.2E+00"), meg(6, "1.3E+00")]
    scan = scan_lines(lines, source="t")
    assert [(s.step, s.line) for s in scan.samples] == [(5, 1), (6, 3)]


# -- look-alikes ------------------------------------------------------------------------------------
def test_validation_and_checkpoint_lines_are_not_megatron_progress() -> None:
    text = "\n".join(
        [
            " validation loss at iteration 1000 | lm loss value: 2.301440E+00 | lm loss PPL: 9.98E+00 |",
            "saving checkpoint at iteration    1000 to /ckpt",
            "  successfully saved checkpoint at iteration    1000 to /ckpt",
        ]
    )
    assert scan_text(text, source="t").samples == ()


def test_lightning_validation_and_sanity_bars_are_not_progress() -> None:
    frames = [
        "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 10.1it/s]",
        "Epoch 0:  50%|█████     | 5/10 [00:05<00:05,  1.00it/s, loss=3.2, v_num=1]",
        "Validation DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 10.00it/s]",
        "Validating:  50%|█████     | 1/2 [00:00<00:00, 10.00it/s]",
        "Epoch 0: 100%|██████████| 10/10 [00:10<00:00,  1.00it/s, loss=3.0, v_num=1]",
    ]
    assert steps("\r".join(frames) + "\n") == [(5, 3.2), (10, 3.0)]


def test_redrawn_bar_frames_in_one_line_are_one_sample_each_step() -> None:
    line = "\r".join(
        [
            "Epoch 0:  10%|█         | 1/10 [00:01<00:09,  1.00it/s, loss=5.0, v_num=0]",
            "Epoch 0:  10%|█         | 1/10 [00:01<00:09,  1.00it/s, loss=4.0, v_num=0]",
            "Epoch 0:  20%|██        | 2/10 [00:02<00:08,  1.00it/s, loss=3.5, v_num=0]",
            "Epoch 0:  20%|██        | 2/10 [00:02<00:08,  1.00it/s, loss=3.4, v_num=0]",
        ]
    )
    scan = scan_text(line + "\n", source="t")
    assert [(s.step, s.loss, s.line) for s in scan.samples] == [(1, 4.0, 1), (2, 3.4, 1)]


def test_lightning_epochs_advance_the_global_step() -> None:
    text = "\n".join(
        [
            "Epoch 0: 100%|██████████| 10/10 [00:10<00:00,  1.00it/s, train_loss=2.0]",
            "Epoch 1:  30%|███       | 3/10 [00:03<00:07,  1.00it/s, train_loss=1.9, val_loss=2.2]",
            "Epoch 2:  10%|█         | 1/? [00:01<?,  1.00it/s, train_loss_step=1.8]",
        ]
    )
    # unknown total: counted from the epochs seen in this input
    assert steps(text) == [(10, 2.0), (13, 1.9), (1, 1.8)]


def test_hf_trainer_bar_and_loss_dicts_skip_eval() -> None:
    frames = [
        "  0%|          | 0/100 [00:00<?, ?it/s]",
        "  9%|▉         | 9/100 [00:09<01:30,  1.00it/s]",
        " 10%|█         | 10/100 [00:10<01:30,  1.00it/s]",
    ]
    text = "\n".join(
        [
            "\r".join(frames),
            "{'loss': 2.31, 'grad_norm': 1.5, 'learning_rate': 4.9e-05, 'epoch': 0.1}",
            "\r".join(["  0%|          | 0/8 [00:00<?, ?it/s]", " 50%|█████     | 4/8 [00:01<00:01,  4.0it/s]"]),
            "{'eval_loss': 2.5, 'eval_runtime': 1.2, 'epoch': 0.1}",
            " 20%|██        | 20/100 [00:20<01:20,  1.00it/s]",
            "{'loss': 2.1, 'grad_norm': 1.2, 'learning_rate': 4.8e-05, 'epoch': 0.2}",
            "{'train_runtime': 100.0, 'train_samples_per_second': 8.0, 'train_loss': 2.2, 'epoch': 1.0}",
        ]
    )
    scan = scan_text(text, source="t")
    assert scan.format == "hf-trainer"
    assert [(s.step, s.loss, s.total) for s in scan.samples] == [(10, 2.31, 100), (20, 2.1, 100)]


def test_hf_loss_dicts_without_bar_are_activity_with_an_unknown_step() -> None:
    text = "{'loss': 2.3, 'epoch': 0.1}\n{'eval_loss': 2.9}\n{'loss': 2.2, 'epoch': 0.2}\n"
    scan = scan_text(text, source="t")
    # never the count of dicts: the step is unknown
    assert [(s.step, s.loss) for s in scan.samples] == [(None, 2.3), (None, 2.2)]
    assert any("activity with an unknown step" in d for d in scan.diagnostics)
    p = scan_report(scan)["progress"]
    assert isinstance(p, dict) and p["last_step"] is None and p["samples"] == 2 and p["last_loss"] == 2.2


def test_deepspeed_step_lines_and_all_skipped_intervals() -> None:
    text = "\n".join(
        [
            "[2024-07-17 19:44:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[1e-4]",
            "[2024-07-17 19:44:10,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=10, lr=[1e-4]",
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512",
            "[2024-07-17 19:44:20,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=30, skipped=11, lr=[1e-4]",
        ]
    )
    scan = scan_text(text, source="t")
    assert [(s.step, s.skipped) for s in scan.samples] == [(10, False), (20, True), (21, True), (30, False)]
    assert scan.samples[0].at == datetime(2024, 7, 17, 19, 44, tzinfo=UTC)


def test_megatron_skipped_and_nan_intervals() -> None:
    scan = scan_lines([meg(1), meg(2, loss="", skipped=1), meg(3, loss="", skipped=1, nans=1)], source="t")
    got = [(s.step, s.skipped, s.loss) for s in scan.samples]
    assert got[:2] == [(1, False, 2.5), (2, True, None)]
    assert got[2][:2] == (3, True) and math.isnan(got[2][2] or 0.0)


# -- validity ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        meg(1) + "\n" + meg(2, "nan") + "\n",
        "{'loss': 2.0, 'step': 1}\n{'loss': nan, 'step': 2}\n",
        "Epoch 0:  10%|█  | 1/10 [00:01<00:09, 1.0it/s, loss=2.0]\r"
        "Epoch 0:  20%|██ | 2/10 [00:02<00:08, 1.0it/s, loss=inf]\n",
        " iteration 1/ 10 | lm loss: 2.0 |\n iteration 2/ 10 | number of nan iterations: 1 |\n",
    ],
)
def test_nonfinite_last_loss_is_null_and_flagged(text: str) -> None:
    scan = scan_text(text, source="t")
    assert [s.step for s in scan.samples] == [1, 2]
    last = scan.samples[-1].loss
    assert last is not None and not math.isfinite(last)
    progress = scan_report(scan)["progress"]
    assert isinstance(progress, dict)
    assert progress["last_loss"] is None and progress["nonfinite_loss"] is True
    assert progress["first_nonfinite_step"] == 2
    json.dumps(scan_report(scan), allow_nan=False)


# -- timestamps -------------------------------------------------------------------------------------
def test_kubelet_timestamp_prefix_with_nanoseconds() -> None:
    scan = scan_text(f"2026-01-10T12:08:00.123456789Z {meg(5)}\n", source="t")
    assert scan.samples[0].at == datetime(2026, 1, 10, 12, 8, 0, 123456, tzinfo=UTC)
    scan = scan_text(f"2026-01-10T14:08:00.5+02:00 [rank0]: {meg(6)}\n", source="t")
    assert scan.samples[0].at == datetime(2026, 1, 10, 12, 8, 0, 500000, tzinfo=UTC)
    assert scan.samples[0].step == 6


def test_timestamp_prefix_beats_trainer_timestamp_and_bad_prefix_is_none() -> None:
    line = "2026-01-10T12:00:00Z [2024-07-17 19:44:00,000] [INFO] [Rank 0] step=10, skipped=0, lr=[1]"
    assert scan_text(line, source="t").samples[0].at == datetime(2026, 1, 10, 12, tzinfo=UTC)
    bad = f"2026-13-10T12:00:00Z {meg(1)}"
    assert scan_text(bad, source="t").samples[0].at is None


@pytest.mark.parametrize(
    ("line", "at"),
    [
        (
            "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            datetime(2025, 2, 23, 16, 24, 18, tzinfo=UTC),
        ),
        (
            "kern  :err   : 2025-01-21T04:41:44,285060+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has "
            "fallen off the bus.",
            datetime(2025, 1, 21, 4, 41, 44, 285060, tzinfo=UTC),
        ),
        (
            "2025-02-23T16:24:18+0000 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, off the bus.",
            datetime(2025, 2, 23, 16, 24, 18, tzinfo=UTC),
        ),
        (
            "Feb 23 16:24:18 node-1 kernel: [12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, off the bus.",
            None,  # syslog carries no year
        ),
    ],
)
def test_xid_in_kernel_log_formats(line: str, at: datetime | None) -> None:
    (x,) = scan_text(line, source="dmesg").xids
    assert (x.code, x.pci, x.line, x.at) == (79, "0000:3b:00", 1, at)
    assert x.meaning.startswith("GPU has fallen off the bus")


def test_older_xid_format_and_unknown_code() -> None:
    (a, b) = scan_text(
        "NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x404490\nNVRM: Xid (PCI:0000:01:00): 999, x\n",
        source="t",
    ).xids
    assert (a.code, a.pci, a.meaning) == (13, "0000:01:00", XID_CATALOGUE[13][0])
    assert (b.code, b.meaning, b.action) == (999, "unknown XID 999", describe(999)[1])


def test_catalogue_covers_the_common_codes() -> None:
    for code in (13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 110, 119, 120, 121, 140, 143):
        meaning, action = describe(code)
        assert not meaning.startswith("unknown XID") and action


# -- hangs ------------------------------------------------------------------------------------------
def test_other_hang_kinds() -> None:
    text = "\n".join(
        [
            "[rank2]:[E ProcessGroupNCCL.cpp:1182] [Rank 2] NCCL watchdog thread terminated with exception: "
            "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800123 milliseconds before timing out.",
            "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous "
            "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            "NCCL communicator was aborted on rank 0.",
            "torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1275, unhandled system "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            "1800000ms for recv operation to complete",
            "node-1:22:33 [0] NCCL INFO comm 0x5 rank 0 nranks 8 cudaDev 0 busId 1000 - Init COMPLETE",
        ]
    )
    assert scan_text(text, source="t").hangs == (
        HangFinding("nccl-watchdog-timeout", 1, "BROADCAST", 1800000, 2, None, seq=9),
        HangFinding("nccl-async-error", 2, None, None, None, None),
        HangFinding("nccl-async-error", 3, None, None, 0, None),
        HangFinding("nccl-error", 4, None, None, None, None),
        HangFinding("collective-timeout", 5, "RECV", 1800000, None, None),
    )


# -- custom regex, tails ----------------------------------------------------------------------------
def test_custom_regex() -> None:
    text = "train step 10 loss 2.5 of 100\neval step 10 loss 9.9\ntrain step 11 loss nan of 100\n"
    rx = r"^train step (?P<step>\d+) loss (?P<loss>\S+) of (?P<total>\d+)"
    scan = scan_text(text, source="t", custom_regex=rx)
    assert scan.format == "regex"
    assert [(s.step, s.total) for s in scan.samples] == [(10, 100), (11, 100)]
    assert scan.samples[0].loss == 2.5 and math.isnan(scan.samples[1].loss or 0.0)
    with pytest.raises(ValueError, match="named group 'step'"):
        scan_text(text, source="t", custom_regex=r"step (\d+)")
    with pytest.raises(ValueError, match="does not compile"):
        scan_text(text, source="t", custom_regex=r"step (?P<step>\d+")


def test_custom_regex_with_non_integer_step_is_a_diagnostic() -> None:
    scan = scan_text("step x1\nstep 2\n", source="t", custom_regex=r"step (?P<step>\S+)")
    assert [s.step for s in scan.samples] == [2]
    assert scan.diagnostics == ("line 1: progress regex matched but step 'x1' is not an integer",)


def test_tail_only_read(tmp_path: Path) -> None:
    data = "".join(meg(i) + "\n" for i in range(1, 101)).encode()
    path = _write(tmp_path, data)
    last3 = sum(len(meg(i)) + 1 for i in (98, 99, 100))
    scan = scan_path(path, max_bytes=last3 + 5)  # 3 whole lines and the end of a fourth
    assert [s.step for s in scan.samples] == [98, 99, 100]
    assert [s.line for s in scan.samples] == [1, 2, 3]
    assert scan.diagnostics[0] == f"tail only: read from byte {len(data) - last3 - 5} of {len(data)}; " + (
        "line numbers count from there"
    )
    exact = scan_path(path, max_bytes=last3 - len(meg(98)) - 1)  # starts right on a line boundary
    assert [s.step for s in exact.samples] == [99, 100]
    assert [s.step for s in scan_path(path, max_bytes=len(data) * 2).samples] == list(range(1, 101))


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "log.txt"
    path.write_bytes(data)
    return path


def test_hang_precheck_matches_its_documented_triggers() -> None:
    from collector.progress.hangs import HANG_TRIGGERS, may_be_hang

    assert all(may_be_hang(f"x {t} y") for t in HANG_TRIGGERS)
    assert not may_be_hang("node-1:22:33 [0] NCCL INFO Channel 00/24 : 0 1 2 3")
