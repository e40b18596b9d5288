"""The real logs in tests/fixtures (provenance in its SOURCES.tsv): exact steps, losses, hangs and XIDs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collector.progress import HangFinding, scan_path, scan_report

TRAINING = "training_logs"
KERNEL = "xid_nvsmi"


def test_megatron_iterations(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "megatron_iteration_log_lines_epfllm_megatron_llm_11_truncated.txt")
    assert scan.format == "megatron"
    assert [(s.step, s.loss, s.line, s.total, s.skipped) for s in scan.samples] == [
        (122, 2.504220, 1, 250000, False),
        (123, 2.493043, 2, 250000, False),
        (124, 2.559583, 3, 250000, False),
        (125, 2.477393, 4, 250000, False),
    ]
    assert scan.diagnostics == ()
    progress = scan_report(scan)["progress"]
    assert isinstance(progress, dict)
    assert (progress["first_step"], progress["last_step"], progress["last_loss"]) == (122, 125, 2.477393)
    assert progress["samples"] == 4 and progress["nonfinite_loss"] is False


def test_lightning_bars(fixtures: Path) -> None:
    # The file holds a cut-off first run (4, 4, 5, 5, truncated 6) and then a restart from the
    # first batch: "Training: 0it", 0/18 bars (nothing done), then steps 1..5, two frames each.
    scan = scan_path(fixtures / TRAINING / "lightning_progress_bar_loss_v_num_lightning_4225.txt")
    assert scan.format == "lightning"
    assert scan.lines == 18
    assert [(s.step, s.loss, s.line) for s in scan.samples] == [
        (4, 9.947, 1),  # frames on lines 1-2: latest loss wins, first line kept
        (5, 9.850, 3),
        (6, None, 5),  # the frame is cut before its postfix: step seen, no loss
        (1, 10.473, 9),  # line 9 has no loss yet, line 10 redraws it with 10.473
        (2, 10.224, 11),
        (3, 10.047, 13),
        (4, 9.926, 15),
        (5, 9.847, 17),
    ]
    assert "line 9: step went back from 6 to 1 (restart, replay, or another counter)" in scan.diagnostics
    progress = scan_report(scan)["progress"]
    assert isinstance(progress, dict)
    assert progress["samples"] == 8
    assert (progress["first_step"], progress["last_step"], progress["max_step"]) == (4, 5, 6)
    assert progress["last_loss"] == 9.847


def test_deepspeed_overflow_steps_are_skipped(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "deepspeed_overflow_loss_scale_skipping_steps_deepspeed_5779.txt")
    assert scan.format == "deepspeed"
    assert len(scan.samples) == 8
    assert all(s.skipped for s in scan.samples)
    assert [s.line for s in scan.samples] == list(range(1, 9))
    assert scan.samples[0].at == datetime(2024, 7, 17, 19, 44, 6, 829000, tzinfo=UTC)
    assert scan.samples[-1].at == datetime(2024, 7, 17, 19, 44, 19, 48000, tzinfo=UTC)
    progress = scan_report(scan)["progress"]
    assert isinstance(progress, dict)
    assert progress["samples"] == 0 and progress["skipped"] == 8
    assert progress["first_step"] is None and progress["last_step"] is None


def test_nccl_watchdog_older_format_with_desync_report(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "nccl_watchdog_timeout_desync_report_ml_engineering.txt")
    assert scan.samples == ()
    assert scan.hangs == (
        HangFinding("nccl-watchdog-timeout", 1, "ALLREDUCE", 8000, 0, None, seq=2),
        HangFinding("nccl-desync-report", 2, "ALLREDUCE", None, 0, None),
        HangFinding("nccl-desync-lagging-rank", 4, None, None, 1, None),
    )


def test_nccl_watchdog_torch2x_format(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt")
    assert scan.hangs == (
        HangFinding("nccl-watchdog-timeout", 1, "ALLREDUCE", 600000, 0, None, seq=1580),
        HangFinding("nccl-watchdog-timeout", 2, "ALLREDUCE", 600000, 4, None, seq=1580),
        # "[PG 1 Rank 0] Exception ... at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579."
        HangFinding("nccl-watchdog-exception", 3, None, None, 0, None, seq=1580, completed=1579, pg="1"),
        HangFinding("nccl-watchdog-exception", 4, None, None, 3, None, seq=1580, completed=1579, pg="1"),
    )
    report = scan_report(scan)
    assert report["hang"][0] == {  # type: ignore[index]
        "kind": "nccl-watchdog-timeout",
        "line": 1,
        "collective": "ALLREDUCE",
        "timeout_ms": 600000,
        "rank": 0,
        "at": None,
        "seq": 1580,
        "completed": None,  # the watchdog line says neither; the PG-status line after it does
        "pg": None,
    }


def test_libnccl_segfault_in_dmesg(fixtures: Path) -> None:
    scan = scan_path(fixtures / KERNEL / "dmesg_nccl_segfault_libnccl_gpud.log")
    assert scan.hangs == (
        HangFinding("nccl-segfault", 1, None, None, None, datetime(2025, 1, 21, 4, 41, 44, 285060, tzinfo=UTC)),
        HangFinding("nccl-segfault", 2, None, None, None, datetime(2025, 1, 21, 4, 42, 44, 285060, tzinfo=UTC)),
    )
    assert scan.lines == 2  # the last line has no newline


def test_xid119_gsp_timeouts(fixtures: Path) -> None:
    scan = scan_path(fixtures / KERNEL / "dmesg_xid119_gsp_rpc_timeout_h100_gpud.log")
    assert [(x.code, x.pci, x.line) for x in scan.xids] == [
        (119, "0000:9b:00", 3),
        (119, "0000:9b:00", 38),
        (119, "0000:9b:00", 40),
        (119, "0000:9b:00", 42),
        (119, "0000:9b:00", 43),
    ]
    assert [x.at for x in scan.xids] == [
        datetime(2025, 2, 23, 16, 24, 18, tzinfo=UTC),
        datetime(2025, 2, 23, 16, 24, 24, tzinfo=UTC),
        datetime(2025, 2, 23, 16, 24, 30, tzinfo=UTC),
        datetime(2025, 2, 23, 16, 27, 12, tzinfo=UTC),
        datetime(2025, 2, 23, 16, 30, 13, tzinfo=UTC),
    ]
    assert "GSP" in scan.xids[0].meaning
    assert scan.samples == () and scan.hangs == ()


def test_xid63_row_remapper(fixtures: Path) -> None:
    scan = scan_path(fixtures / KERNEL / "xid63_row_remapper_line_ml_engineering.txt")
    assert [(x.code, x.pci, x.line) for x in scan.xids] == [(63, "0000:10:1c", 1)]
    assert "remap" in scan.xids[0].meaning
    report = scan_report(scan)
    assert report["xid"] == [  # exactly the keys plus "at"
        {
            "code": 63,
            "pci": "0000:10:1c",
            "line": 1,
            "meaning": scan.xids[0].meaning,
            "action": scan.xids[0].action,
            "at": None,
        }
    ]


def _all_fixture_files() -> list[Path]:
    from tests.progress.conftest import FIXTURES

    return sorted(p for p in FIXTURES.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", _all_fixture_files(), ids=lambda p: p.name)
def test_every_fixture_scans_and_only_training_logs_progress(path: Path) -> None:
    """No crash on any shared fixture, JSON-safe reports, and no progress outside training logs."""
    scan = scan_path(path)
    report = scan_report(scan)
    json.dumps(report, allow_nan=False)
    if path.parent.name != TRAINING:
        assert report["progress"] is None, path
    if path.parent.name != KERNEL:
        assert scan.xids == ()
