"""`explain --config FILE` reads the controller's settings file: same schema, same result (issues 7, 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from collector.cli import main
from collector.config import load_settings
from tests.dumpkit import pod, ts, write_dump
from tests.test_explain_fixtures import NOW, taurun

EXE = str(Path(sys.executable).with_name("taugrid-evidence"))
CONFIG = """\
claims:
  stall_floor: 10m
controller:
  log_regex_by_profile:
    custom: 'step=(?P<step>\\d+) objective=(?P<loss>[\\d.]+)'
"""


def custom_trainer_dump(tmp_path: Path, captured: Any = None) -> tuple[Path, Any]:
    tr = taurun("cx", "research", "Running", NOW - timedelta(hours=1), workers=1, profile="custom")
    p = pod("cx-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "cx"})
    start = NOW - timedelta(minutes=5)
    lines = [f"{ts(start + timedelta(seconds=10 * i))} [my-trainer] step={i + 1} objective=0.{90 - i}"
             for i in range(10)]
    last = start + timedelta(seconds=90)
    return write_dump(tmp_path / "d", [tr, p], logs={("research", "cx-w0"): "\n".join(lines) + "\n"},
                      captured=captured), last


def progressing(dump: Path, at: Any, *args: str) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json", "--at", ts(at), *args])
    assert r.exit_code == 0, r.output
    c: dict[str, Any] = json.loads(r.stdout)["runs"][0]["claims"]["progressing"]
    return c


def test_profile_regex_from_the_settings_file_reads_a_custom_trainer(tmp_path: Path) -> None:
    dump, last = custom_trainer_dump(tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    without = progressing(dump, last + timedelta(seconds=20))
    assert without["observed"] == "unknown"  # the built-in parsers do not know this trainer
    with_cfg = progressing(dump, last + timedelta(seconds=20), "--config", str(cfg))
    assert (with_cfg["observed"], with_cfg["verdict"]) == ("true", "verified")
    assert with_cfg["reason"].startswith("step 10 at")


def test_windows_from_the_settings_file_change_the_verdict(tmp_path: Path) -> None:
    at = NOW - timedelta(minutes=5) + timedelta(seconds=90 + 180)  # 3 min after the last step
    dump, last = custom_trainer_dump(tmp_path, captured=at)  # (a stall needs the logs read after the window)
    regex_only = tmp_path / "regex.yaml"
    regex_only.write_text(CONFIG.replace("claims:\n  stall_floor: 10m\n", ""))
    wide = tmp_path / "wide.yaml"
    wide.write_text(CONFIG)
    assert at == last + timedelta(minutes=3)  # past max(3 × 10 s, 60 s) + 15 s, inside 10 minutes
    assert progressing(dump, at, "--config", str(regex_only))["reason"].startswith("STALLED")
    assert progressing(dump, at, "--config", str(wide))["observed"] == "true"


def test_the_same_file_and_errors_as_the_controller(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    assert load_settings(cfg).claims.stall_floor == timedelta(minutes=10)
    bad = tmp_path / "bad.yaml"
    bad.write_text("claims:\n  stall_flor: 10m\n")
    dump, _ = custom_trainer_dump(tmp_path)
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--config", str(bad)])
    proc = subprocess.run([EXE, "controller", "--kubeconfig", str(bad), "--config", str(bad)],
                          capture_output=True, text=True, timeout=30)
    for code, err in ((r.exit_code, r.stderr), (proc.returncode, proc.stderr)):
        assert code == 1
        assert f"{bad}: config.claims.stall_flor: unknown setting" in err
    dup = tmp_path / "dup.yaml"
    dup.write_text("claims:\n  stall_floor: 10m\n  stall_floor: 1m\n")
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--config", str(dup)])
    assert r.exit_code == 1 and "duplicate key 'stall_floor'" in r.stderr
