"""Claims against ground truth: a seeded mix of run classes played by the simulator, judged by its truth.

The live controller (official client, over HTTP) and `explain` (no `--at`) on a dump of the same
moment made by the README's fuller procedure, kubectl's output unrewritten, are compared with what
the simulator knows is true of each run (bench/accuracy.py). Per class:
no `verified`/observed-true where the truth is false, no stage other than the true one named as
the owner of a wait, and the two inputs agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.accuracy import Finding, Report, play
from kubesim.generate import CLASSES

SEED = 11
RUNS = 3 * len(CLASSES)  # three runs of each class

# Classes the claim engine gets wrong, each with its finding (docs/accuracy.md). strict: once a fix
# lands the test passes, the xfail turns into a failure, and the mark goes. None today.
FAIL_OPEN: dict[str, str] = {}
WRONG_OWNER: dict[str, str] = {}
DISAGREE: dict[str, str] = {}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return play(RUNS, SEED, Path(tmp_path_factory.mktemp("accuracy")), balanced=True)


def _params(known: dict[str, str]) -> list[object]:
    return [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=known[c])) if c in known else c
            for c in CLASSES]


def _show(found: list[Finding]) -> str:
    return "\n".join(f"{f.kind} {f.run} [{f.source}] {f.what}: expected {f.expected}, got {f.got}: {f.reason}"
                     for f in found)


def test_every_class_is_played_and_judged_on_both_sides(report: Report) -> None:
    assert set(report.classes) == set(CLASSES)
    assert sum(report.classes.values()) == RUNS
    assert report.missing == [] and report.count("missing-run") == 0
    # The matrix is not empty on either side: both inputs judged every run on every claim.
    for source in ("controller", "explain"):
        assert sum(v for (c, s, _, _), v in report.observed.items() if s == source and c == "scheduled") == RUNS


@pytest.mark.parametrize("cls", _params(FAIL_OPEN))
def test_no_true_claim_where_the_truth_is_false(report: Report, cls: str) -> None:
    found = [f for f in report.by_class(cls) if f.kind in ("false-verified", "false-true")]
    assert not found, _show(found)


@pytest.mark.parametrize("cls", _params(WRONG_OWNER))
def test_the_wait_is_owned_by_the_true_stage(report: Report, cls: str) -> None:
    found = [f for f in report.by_class(cls) if f.kind == "wrong-owner"]
    assert not found, _show(found)


@pytest.mark.parametrize("cls", _params(DISAGREE))
def test_controller_and_explain_agree(report: Report, cls: str) -> None:
    found = [f for f in report.by_class(cls) if f.kind == "disagree"]
    assert not found, _show(found)


@pytest.fixture(scope="module")
def stale_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return play(len(CLASSES), SEED, Path(tmp_path_factory.mktemp("stale")), balanced=True, stale_taucluster=True)


def test_a_stale_taucluster_never_makes_a_claim_true_that_is_false(stale_report: Report) -> None:
    """The 4-worker profile resolved as 2 workers in a stale status must not make half a run scheduled."""
    assert stale_report.classes["partially-scheduled"] == 1
    found = [f for f in stale_report.findings
             if (f.kind in ("false-verified", "false-true") and f.cls not in FAIL_OPEN)
             or (f.kind == "wrong-owner" and f.cls not in WRONG_OWNER)]
    assert not found, _show(found)


@pytest.fixture(scope="module")
def throughout_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return play(len(CLASSES), SEED + 1, Path(tmp_path_factory.mktemp("throughout")), balanced=True,
                watch_throughout=True)


def test_a_controller_watching_throughout_has_no_errors_beyond_the_known_classes(throughout_report: Report) -> None:
    """The watch path (events as they happen, the controller's own history) against the same truth."""
    assert sum(throughout_report.classes.values()) == len(CLASSES)
    found = [f for f in throughout_report.findings
             if (f.kind in ("false-verified", "false-true") and f.cls not in FAIL_OPEN)
             or (f.kind == "wrong-owner" and f.cls not in WRONG_OWNER)
             or (f.kind == "disagree" and f.cls not in DISAGREE)
             or f.kind == "missing-run"]
    assert not found, _show(found)
