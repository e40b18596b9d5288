"""The randomized search for fail-open claims (bench/accuracy_search.py), a few hundred draws.

Each draw is one run with its dimensions combined at random (restart mode, evidence removed, clock
perturbations, cadence, sidecars, the judging instant around the window's edge); it is judged by
the live controller and by `explain` without `--at` on three dumps (bare, the fuller procedure, a
user's partial and degraded one). What must be zero: a false `true`/`verified`, a `true` where the
source lacks the evidence the claim needs, a wrong owner of a wait. The coverage floor: at least 90%
of healthy runs verified by the controller and in full-procedure dumps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.accuracy_draws import DEGRADES, FATES, Draw, draw
from bench.accuracy_search import (
    CLAIMS,
    FLOOR,
    SOURCES,
    Failure,
    SearchReport,
    kept_sections,
    search,
    shrink_draw,
    tolerance,
)

SEED = 7
DRAWS = 300
PER_SCENARIO = 150


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> SearchReport:
    return search(DRAWS, SEED, PER_SCENARIO, Path(tmp_path_factory.mktemp("search")), shrink=0, progress=False)


def _show(rep: SearchReport, kinds: tuple[str, ...]) -> str:
    found = [f for f in rep.failures if f.kind in kinds]
    return "\n".join(f"{f.kind} [{f.source}] {f.claim} draw {f.draw}: got {f.got}: {f.reason} | {f.facts}"
                     for f in found[:20]) + (f"\n... {len(found)} in all" if len(found) > 20 else "")


def test_every_draw_is_judged_by_every_source_and_every_dimension_is_drawn(report: SearchReport) -> None:
    for source in SOURCES:
        for claim in CLAIMS:
            judged = sum(v for (s, c, _, _), v in report.observed.items() if s == source and c == claim)
            assert judged == DRAWS, (source, claim)
    assert report.missing["controller"] == 0 and report.missing["full"] == 0
    for dim in (*(f"fate {f}" for f in FATES), *(f"restart {m}" for m in ("inplace", "replace", "inprocess",
                                                                              "resubmit")),
                *DEGRADES, "skew", "forge", "sidecar", "ckpt_every", "jitter", "then_stall", "stamp_prefix"):
        assert report.dims[dim] > 0, dim
    for kind in ("RayJob", "Job", "JobSet", "PyTorchJob"):
        assert report.dims[f"kind {kind}"] > 0
    # The judging instants fall on both sides of the tolerance's edge.
    for claim in ("running", "progressing"):
        assert sum(v for (s, c, t, _), v in report.observed.items()
                   if s == "controller" and c == claim and t == "false-in-tolerance") > 0
        assert sum(v for (s, c, t, _), v in report.observed.items()
                   if s == "controller" and c == claim and t == "false") > 0


def test_no_claim_is_true_where_the_truth_is_false(report: SearchReport) -> None:
    assert not any(k in ("false-verified", "false-true") for k, _, _ in report.errors), \
        _show(report, ("false-verified", "false-true"))


def test_no_claim_is_true_without_the_evidence_it_needs(report: SearchReport) -> None:
    assert not any(k == "true-without-evidence" for k, _, _ in report.errors), \
        _show(report, ("true-without-evidence",))


def test_no_wait_is_blamed_on_the_wrong_owner(report: SearchReport) -> None:
    assert not any(k == "wrong-owner" for k, _, _ in report.errors), _show(report, ("wrong-owner",))


def test_the_controller_verifies_healthy_runs(report: SearchReport) -> None:
    assert report.floor["controller"]["healthy"] >= 50
    assert report.floor_rate("controller") >= FLOOR, dict(report.floor["controller"])


def test_full_procedure_dumps_verify_healthy_runs(report: SearchReport) -> None:
    assert report.floor["full"]["healthy"] >= 50
    assert report.floor_rate("full") >= FLOOR, dict(report.floor["full"])


def test_no_run_that_advances_is_judged_stalled(report: SearchReport) -> None:
    """Not an error of the fail-closed kind, but a false page: a running, advancing run judged STALLED
    by any source (a dump's capture instant set late by a node clock ahead, a clock behind, a read
    before the window closed)."""
    assert not +report.false_stalls, "\n".join(f"{f.source} draw {f.draw}: {f.reason}" for f in report.stall_examples)


def test_regenerated_accuracy_doc_keeps_the_sections_kept_by_hand() -> None:
    """`make accuracy` rewrites docs/accuracy.md; a section whose figures come from another bench (the
    stragglers') says it is kept by hand and is carried over whole."""
    doc = ("# Accuracy\n\nGenerated.\n\n## Current figures\n\n| a |\n\n## Stragglers\n\nThis section is kept by "
           "hand from docs/straggler_accuracy.md.\n\n| class | runs |\n| x | 1 |\n\n## Randomized search\n\nfigures\n")
    assert kept_sections(doc) == ["## Stragglers\n\nThis section is kept by hand from docs/straggler_accuracy.md."
                                  "\n\n| class | runs |\n| x | 1 |"]
    here = Path(__file__).resolve().parents[2] / "docs" / "accuracy.md"
    kept = [k.splitlines()[0] for k in kept_sections(here.read_text())]
    assert kept == ["## Stragglers and fail-slow GPUs (issue 28)"]


def test_a_draw_is_the_same_from_its_seed_and_index_alone() -> None:
    tol = tolerance()
    a, b = draw(SEED, 123, PER_SCENARIO, tol), draw(SEED, 123, PER_SCENARIO, tol)
    assert a == b and a != draw(SEED, 124, PER_SCENARIO, tol)
    assert a.scenario == 123 // PER_SCENARIO
    bare = a.keep_only(set())
    assert bare.dims() == {} and bare.fate in FATES and bare.offset == a.offset and bare.every == a.every


def test_shrinking_keeps_exactly_the_dimensions_the_failure_needs(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """With a failure that needs a sidecar and a removed Node, every other dimension goes."""
    tol = tolerance()
    d = next(x for x in (draw(SEED, i, PER_SCENARIO, tol) for i in range(2000))
             if x.sidecar and "no-node" in x.degrade and len(x.dims()) >= 4)
    failure = Failure("true-without-evidence", "user", "running", d.index, "", "", "", "")

    def fails(x: Draw, f: Failure, workdir: Path) -> bool:
        return bool(x.sidecar) and "no-node" in x.degrade

    import bench.accuracy_search as mod
    monkeypatch.setattr(mod, "fails", fails)
    small, dims, reproduced = shrink_draw(d, failure, tmp_path)
    assert reproduced and set(dims) == {"sidecar", "no-node"} and small.fate == d.fate


def test_the_tolerance_follows_the_claim_settings() -> None:
    from dataclasses import replace
    from datetime import timedelta

    from collector.settings import ClaimSettings

    tol: Any = tolerance(replace(ClaimSettings(), stall_floor=timedelta(seconds=90)))
    assert tol.progress_edge(5) == 90 + 15 + 2
    assert tolerance().progress_edge(30) == 300 + 15 + 2
    assert tolerance().progress_edge(600) == 1800 + 15 + 2
