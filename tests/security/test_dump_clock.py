"""Forged timestamps must not move `explain`'s evaluation clock (issue 8; DESIGN.md §8)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from collector.cli import main
from tests.dumpkit import pod, ts, write_dump
from tests.test_explain_fixtures import NOW, megatron_log, taurun


def run_explain(dump: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json", *args])
    body = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r.exit_code, body, r.stderr + (str(r.exception) if r.exception and r.exit_code not in (0, 2, 3) else "")


def healthy(tmp_path: Path, name: str, extra: list[dict[str, Any]] | None = None,
            extra_logs: dict[tuple[str, str], str] | None = None) -> tuple[Path, datetime]:
    log, last = megatron_log(NOW - timedelta(minutes=10))
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    logs = {("research", "llm-w0"): log, **(extra_logs or {})}
    return write_dump(tmp_path / name, [tr, p, *(extra or [])], logs=logs), last


def claim_of(out: dict[str, Any], run: str, name: str) -> dict[str, Any]:
    c: dict[str, Any] = next(r for r in out["runs"] if r["name"] == run)["claims"][name]
    return c


def test_one_year_9999_creation_timestamp_does_not_move_the_clock(tmp_path: Path) -> None:
    clean, last = healthy(tmp_path, "clean")
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil["metadata"]["creationTimestamp"] = "9999-12-31T23:59:59Z"
    forged, _ = healthy(tmp_path, "forged", [evil])
    code0, base, _ = run_explain(clean)
    code, out, err = run_explain(forged)
    assert code0 == 0 and code == 0 and base is not None and out is not None, err
    assert out["evaluated_at"] == base["evaluated_at"]
    assert out["evaluated_at"].startswith(last.strftime("%Y-%m-%dT%H:%M:%S"))
    assert claim_of(out, "llm", "progressing")["verdict"] == "verified"
    assert "Pod research/evil" in err and "9999-12-31" in err and "ignored for the clock" in err
    text = CliRunner().invoke(main, ["explain", "--from-dump", str(forged)]).stdout
    assert "days" not in text  # not "STALLED 2,912,433 days"


def test_a_forged_log_line_cannot_make_its_run_verified_0s_ago(tmp_path: Path) -> None:
    # The forger's run has no real progress; one line claims a step hours after everything else.
    _, last = megatron_log(NOW - timedelta(minutes=10))
    forged_at = last + timedelta(hours=3)
    forger = taurun("forger", "research", "Running", NOW - timedelta(hours=1), workers=1)
    fpod = pod("forger-w0", "research", NOW - timedelta(hours=1), node="gpu-3", gpus=8,
               labels={"taugrid.io/run": "forger"})
    line = (f"{forged_at.strftime('%Y-%m-%dT%H:%M:%S')}.000000000Z  iteration    99999/  250000 | "
            "consumed samples: 1 | elapsed time per iteration (ms): 1.0 | learning rate: 1.0E-05 | "
            "global batch size:  1024 | lm loss: "
            "1.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    dump, _ = healthy(tmp_path, "d", [forger, fpod], {("research", "forger-w0"): line})
    clean, _ = healthy(tmp_path, "clean")
    code, out, err = run_explain(dump)
    _, base, _ = run_explain(clean)
    assert code == 0 and out is not None and base is not None, err
    assert out["evaluated_at"] == base["evaluated_at"]  # the clock did not follow the forged line
    assert claim_of(out, "forger", "progressing")["observed"] != "true"
    assert claim_of(out, "llm", "progressing")["verdict"] == "verified"  # the honest run is not made stale
    assert "research/forger-w0/logs.txt" in err and "stands alone" in err


def test_timestamps_past_the_capture_time_are_ignored(tmp_path: Path) -> None:
    """With file times that say when the dump was taken, anything later than that is ignored."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    # Two forged objects agree with each other: the outlier rule alone would not drop them.
    evil["metadata"]["creationTimestamp"] = ts(last + timedelta(hours=2))
    evil2 = pod("evil2", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil2["metadata"]["creationTimestamp"] = ts(last + timedelta(hours=2, seconds=5))
    dump, _ = healthy(tmp_path, "d", [evil, evil2])
    captured = (last + timedelta(seconds=30)).timestamp()
    for top, _, names in os.walk(dump):
        for n in names:
            os.utime(os.path.join(top, n), (captured, captured))
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"].startswith(last.strftime("%Y-%m-%dT%H:%M:%S"))
    assert "later than the capture time" in err and "Pod research/evil2" in err


@pytest.mark.parametrize("flag", ["--at", "--captured-at"])
@pytest.mark.parametrize("value", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01"])
def test_extreme_times_are_a_clear_error_not_an_overflow(tmp_path: Path, flag: str, value: str) -> None:
    dump, _ = healthy(tmp_path, "d")
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), flag, value])
    assert r.exit_code == 2, r.output
    assert "outside 1970..2199" in r.stderr or "not an RFC3339" in r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_clock_warnings_are_said_once(tmp_path: Path) -> None:
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil["metadata"]["creationTimestamp"] = "9999-12-31T23:59:59Z"
    dump, last = healthy(tmp_path, "d", [evil])
    _, _, err = run_explain(dump, "--captured-at", ts(last + timedelta(seconds=30)))
    assert err.count("9999-12-31") == 1
