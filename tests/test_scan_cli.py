"""`taugrid-evidence scan` on the real fixtures, through the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from collector.cli import main
from tests.dumpkit import fixture_path


def test_scan_json_reports_progress_hangs_and_xids() -> None:
    files = [
        fixture_path("training_logs/megatron_iteration_log_lines_epfllm_megatron_llm_11_truncated.txt"),
        fixture_path("training_logs/nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt"),
        fixture_path("xid_nvsmi/dmesg_xid119_gsp_rpc_timeout_h100_gpud.log"),
    ]
    result = CliRunner().invoke(main, ["scan", "-o", "json", *map(str, files)])
    assert result.exit_code == 0, result.output
    megatron, nccl, xid = json.loads(result.stdout)
    assert megatron["progress"]["format"] == "megatron"
    assert (megatron["progress"]["first_step"], megatron["progress"]["last_step"]) == (122, 125)
    assert megatron["progress"]["last_loss"] == 2.477393 and megatron["progress"]["nonfinite_loss"] is False
    assert nccl["progress"] is None
    assert [(h["kind"], h["collective"], h["timeout_ms"]) for h in nccl["hang"][:2]] == [
        ("nccl-watchdog-timeout", "ALLREDUCE", 600000)] * 2
    assert {x["code"] for x in xid["xid"]} == {119} and xid["xid"][0]["pci"] == "0000:9b:00"
    assert xid["xid"][0]["action"]


def test_scan_text_and_bad_regex() -> None:
    f = str(fixture_path("xid_nvsmi/xid63_row_remapper_line_ml_engineering.txt"))
    result = CliRunner().invoke(main, ["scan", f])
    assert result.exit_code == 0 and "xid 63" in result.stdout
    bad = CliRunner().invoke(main, ["scan", "--regex", "no-step-group", f])
    assert bad.exit_code == 2 and "step" in bad.output
