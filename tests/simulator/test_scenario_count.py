"""`count:` on runs, `templates:`, and `stagger:`: a fleet as one short scenario file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import ManualClock, ScenarioEngine, ScenarioError, Simulator, SimulatorSettings, load_scenario
from kubesim.scenario import scenario_from_dict
from tests.simulator.conftest import T0

_FLEET: dict[str, Any] = {
    "name": "fleet-small",
    "seed": 5,
    "cluster": {
        "namespaces": ["ml", "nlp"],
        "nodes": [
            {"name": "sys", "count": 1},
            {"name": "gpu", "count": 10, "pool": "gpu", "gpus": 8, "cpu": "96", "memory": "1800Gi"},
        ],
        "flavors": ["a100"],
        "clusterQueues": [{"name": "cq", "flavor": "a100", "gpus": 80}],
        "localQueues": [{"name": "lq", "namespace": ns, "clusterQueue": "cq"} for ns in ("ml", "nlp")],
        "profiles": [{"name": "p", "localQueue": "lq", "clusterQueue": "cq", "workers": 2, "gpusPerWorker": 1}],
    },
    "templates": {
        "healthy": {
            "namespace": "ml",
            "profile": "p",
            "timeline": [
                {"at": 1, "admit": {}},
                {"at": 2, "schedule": {}},
                {"at": 3, "start": {}},
                {"at": 4, "train": {"every": 10}},
            ],
        },
        "queued": {"namespace": "ml", "profile": "p", "timeline": [{"at": 1, "waitForQuota": {}}]},
    },
    "runs": [
        {"name": "train", "template": "healthy", "count": 12, "stagger": "1m"},
        {"name": "wait", "template": "queued", "count": 3, "namespace": "nlp"},
        {"name": "solo", "template": "healthy"},
    ],
}


def _load(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_scenario(path)


def test_count_expands_runs_with_padded_names_template_fields_and_stagger() -> None:
    sc = scenario_from_dict(copy.deepcopy(_FLEET))
    names = [r.name for r in sc.runs]
    assert names == [f"train-{k:02d}" for k in range(12)] + ["wait-0", "wait-1", "wait-2", "solo"]
    train = [r for r in sc.runs if r.name.startswith("train-")]
    assert [r.at for r in train[:3]] == [0.0, 5.0, 10.0]  # 12 runs spread over 60 s
    assert all(r.workers == 2 and r.gpus_per_worker == 1 and len(r.timeline) == 4 for r in train)
    waits = [r for r in sc.runs if r.name.startswith("wait-")]
    assert {r.namespace for r in waits} == {"nlp"}  # the entry's field overrides the template's
    assert waits[0].timeline[0].action == "waitForQuota"


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d["runs"][0].update(template="nope"), "runs[0].template: 'nope' is not a declared template"),
        (lambda d: d["runs"][0].update(count=0), "runs[0] (template healthy).count: expected at least 1, got 0"),
        (lambda d: d["runs"][0].update(count="many"), "runs[0] (template healthy).count: expected int"),
        (lambda d: d["runs"][2].update(stagger="5m"), "runs[2] (template healthy).stagger: stagger spreads"),
        (lambda d: d["runs"][0].update(stagger="soon"), "runs[0] (template healthy).stagger"),
        (lambda d: d["templates"]["healthy"].update(name="x"), "templates.healthy: unknown key(s) ['name']"),
        (lambda d: d["templates"]["healthy"].update(count=2), "templates.healthy: unknown key(s) ['count']"),
        (lambda d: d["templates"]["queued"].update(kind="Pod"), "runs[1] (template queued).kind: expected RayJob"),
        (lambda d: d["runs"].append({"name": "train-03", "template": "healthy"}), "duplicate run ml/train-03"),
        (
            lambda d: d["runs"][0].update(name="a" * 55, count=1000),
            "with count 1000 the runs are named up to 'aaaaaaaaaa",
        ),
        (lambda d: d["runs"][2].update(name="b" * 60), "longer than 57 characters (a RayJob name's limit)"),
        (lambda d: d.update(templates=[1]), "templates: expected a mapping"),
    ],
)
def test_bad_count_and_templates_name_file_and_place(tmp_path: Path, mutate: Any, problem: str) -> None:
    data = copy.deepcopy(_FLEET)
    mutate(data)
    with pytest.raises(ScenarioError) as err:
        _load(tmp_path, data)
    assert str(err.value).startswith(f"{tmp_path / 'fleet.yaml'}: ")
    assert problem in str(err.value)


def test_a_counted_fleet_plays_into_the_store() -> None:
    data = copy.deepcopy(_FLEET)
    data["runs"][0]["count"] = 20
    sc = scenario_from_dict(data)
    clock = ManualClock(T0)
    sim = Simulator(clock=clock, settings=SimulatorSettings(seed=sc.seed))
    sim.start("127.0.0.1:0")
    eng = ScenarioEngine(sc, sim.base_url, clock)
    try:
        eng.step_to(30)  # half the staggered runs are submitted (every 3 s) and started
        taurun = sim.resource("taugrid.io/v1alpha1", "TauRun")
        submitted = {o["metadata"]["name"] for o in sim.store.list_page(taurun, "ml").items}
        assert {f"train-{k:02d}" for k in range(10)} <= submitted
        assert f"train-{11:02d}" not in submitted
        eng.step_to(120)
        assert not eng.errors
        runs = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in sim.store.list_page(taurun, "").items}
        expected = {("ml", f"train-{k:02d}") for k in range(20)} | {("ml", "solo")}
        expected |= {("nlp", f"wait-{k}") for k in range(3)}
        assert runs == expected
        pods = sim.store.list_page(sim.resource("v1", "Pod"), "").items
        by_run: dict[str, int] = {}
        for p in pods:
            run = p["metadata"]["labels"]["taugrid.io/run"]
            by_run[run] = by_run.get(run, 0) + 1
            assert p["status"]["phase"] == "Running"
        assert by_run == {name: 3 for _, name in expected if not name.startswith("wait-")}  # head + 2 workers
        phases = {name: t.running for (_, name), t in eng.truth().items()}
        assert phases["train-19"] and not phases["wait-0"]
    finally:
        eng.stop()
        sim.close()


def test_the_shipped_fleet_is_5000_runs_of_10_pods() -> None:
    sc = load_scenario(Path(__file__).parents[2] / "kubesim" / "scenarios" / "fleet.yaml")
    assert len(sc.runs) == 5000 and len({(r.namespace, r.name) for r in sc.runs}) == 5000
    assert {r.workers + 1 for r in sc.runs} == {10}  # a head and 9 workers
    admitted = [r for r in sc.runs if any(step.action == "admit" for step in r.timeline)]
    assert sum(n.gpus for n in sc.nodes) >= sum(r.workers * r.gpus_per_worker for r in admitted)  # no overcommit
    actions = [step.action for r in sc.runs for step in r.timeline]
    assert actions.count("waitForQuota") == 100 and actions.count("stall") == 100
    assert max(r.at for r in sc.runs) < 600  # staggered over ten minutes
