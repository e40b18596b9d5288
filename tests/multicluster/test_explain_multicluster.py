"""`explain --worker-dump`: a manager's dump joined with its workers' dumps, each written from the
multi-cluster simulator through the official client's transport."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.sources.inventory import CRDS, DEPLOYMENTS
from collector.sources.kube_api import DEFAULT_RESOURCES, KubeApi, api_client_for
from kubesim.multicluster import MultiClusterSimulation, load_multicluster, multikueue_scenario_path


@pytest.fixture
def mc() -> Iterator[MultiClusterSimulation]:
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path())) as sim:
        yield sim


def _dump(url: str, root: Path) -> Path:
    api = KubeApi(api_client_for(url))
    present, _ = api.discover(DEFAULT_RESOURCES)
    root.mkdir()
    for res in (*present, CRDS, DEPLOYMENTS):
        items, _ = api.list_pages(res)
        (root / f"{res.name}.json").write_text(json.dumps({"kind": "List", "apiVersion": "v1", "items": items}))
    (root / "version.json").write_text(json.dumps({"serverVersion": api.get_json("/version")}))
    return root


def _explain(mc: MultiClusterSimulation, tmp_path: Path, output: str, *extra: str) -> Any:
    dirs = {n: _dump(url, tmp_path / n) for n, url in mc.urls.items()}
    args = ["explain", "--from-dump", str(dirs["manager"]), "--at", mc.clock.now().isoformat(), "-o", output,
            "--worker-dump", f"worker-1={dirs['worker-1']}", "--worker-dump", f"worker-2={dirs['worker-2']}", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout) if output == "json" else result.stdout


def test_explain_joins_worker_evidence_and_says_where_it_came_from(mc: MultiClusterSimulation, tmp_path: Path) -> None:
    mc.step_to(100)  # dispatched runs on worker-1; worker-2 upgraded at 90
    out = _explain(mc, tmp_path, "json")
    runs = {r["name"]: r for r in out["runs"]}
    run = runs["dispatched"]
    assert run["claims"]["running"]["observed"] == "true"
    clusters = {e.get("cluster") for e in run["claims"]["running"]["evidence"]}
    assert clusters == {"manager", "worker-1"}
    assert runs["waiting"]["blocked"]["stage"] == "multicluster-dispatch"
    assert runs["waiting"]["blocked"]["owner"] == "MultiKueue"
    assert "not admitted there" in runs["not-admitted-there"]["blocked"]["reason"]
    env = out["environment"]
    assert [c["cluster"] for c in env["clusters"]] == ["manager", "worker-1", "worker-2"]
    assert [(v["cluster"], v["check"], v["reason"]) for v in env["violations"]] == [
        ("worker-2", "kubernetes", "skew")]


def test_explain_text_marks_the_cluster(mc: MultiClusterSimulation, tmp_path: Path) -> None:
    mc.step_to(60)
    text = _explain(mc, tmp_path, "text", "dispatched")
    assert "[worker-1] Pod/ml/" in text
    assert "environment: supported (manager, worker-1, worker-2)" in text


def test_a_bad_worker_option_is_named(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(tmp_path / "d"), "--at", "2026-01-10T10:00:00Z",
                                       "--worker-dump", "no-equals-sign"])
    assert result.exit_code != 0 and "NAME=DIR" in result.output
