"""The alert rules, checked and unit-tested by promtool (Debian `prometheus`), and each covered."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "charts" / "taugrid-evidence" / "rules").glob("*.rules.yaml"))
TESTS = sorted(Path(__file__).parent.glob("*.test.yaml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus", pytrace=False)
    return path


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120)


def alerts() -> list[dict[str, Any]]:
    return [r for f in RULES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_rule_files_pass_promtool_check() -> None:
    assert len(RULES) == 2
    result = run("check", "rules", *RULES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_rule_unit_tests_pass(test_file: Path) -> None:
    result = run("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The runner notices a failing promtool test (so a passing one means something)."""
    text = (Path(__file__).parent / "runs.test.yaml").read_text()
    wrong = text.replace("summary: \"Run ml/liar claims running", "summary: \"Run ml/liar claims scheduled")
    assert wrong != text
    copy = tmp_path / "wrong.test.yaml"
    copy.write_text(wrong.replace("../../charts/", f"{ROOT}/charts/"))
    result = run("test", "rules", copy)
    assert result.returncode == 1 and "TaugridRunContradicted" in result.stdout + result.stderr


def test_every_alert_is_seen_firing_and_quiet_in_a_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for f in TESTS:
        for t in yaml.safe_load(f.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


def test_every_alert_has_a_runbook_section() -> None:
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), re.MULTILINE)}
    for a in alerts():
        anchor = a["annotations"]["runbook_url"].rpartition("#")[2]
        assert anchor == a["alert"].lower()
        assert anchor in headings, f"docs/runbooks.md has no section for {a['alert']}"
        assert a["labels"]["severity"] in {"critical", "warning", "info"}
