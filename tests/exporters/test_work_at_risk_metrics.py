"""The drain advisor's gauges (issue 28): runs' GPU-hours at risk, their exposure on risky nodes, and
per node the drain score, its signals and the work a drain throws away; prepared text byte for byte
what client_python renders; healthy runs keep their exposure under `run_series: unhealthy`; a real
Prometheus-format parse sees the ranking."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.model import Observed, Ref, RunClaims
from collector.riskfacts import NodeRisk, WorkAtRisk
from exporters.prometheus import ClaimsExporter, new_registry, render
from exporters.prometheus_fleet import RunSeries
from tests.exporters.exporter_samples import T0, crashlooping_run


def at_risk(name: str, hours: float | None, nodes: list[tuple[str, float, tuple[str, ...]]], *,
            healthy: bool = False) -> RunClaims:
    rc = crashlooping_run(name=name)
    gpus = 8 * len(nodes)
    since = T0 - timedelta(hours=(hours or gpus) / gpus)  # `hours` at T0, growing with the clock as they do
    w = WorkAtRisk(hours, gpus, since, "checkpoint" if hours is not None else "", "x", 10, since,
                   tuple(NodeRisk(n, score, sigs, tuple(f"why {s}" for s in sigs), 8,
                                  None if hours is None else hours / len(nodes)) for n, score, sigs in nodes))
    rc = replace(rc, ref=Ref("TauRun", "research", name, f"uid-{name}"), work_at_risk=w)
    if healthy:
        ok = replace(rc.scheduled, observed=Observed.TRUE)
        rc = replace(rc, running=ok, progressing=ok)
    return rc


def runs() -> list[RunClaims]:
    return [
        at_risk("big", 64.0, [("gpu-a", 30.0, ("cordoned",)), ("gpu-b", 0.0, ())]),
        at_risk("small", 8.0, [("gpu-a", 30.0, ("cordoned",)), ("gpu-c", 80.0, ("xid-79",))]),
        at_risk("blind", None, [("gpu-c", 80.0, ("xid-79",))]),
    ]


def scrape(exp: ClaimsExporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(exp.exposition().decode())}


def test_families_rank_nodes_and_runs_and_render_as_client_python_does() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry)
    exp.update(runs(), T0)
    assert render(registry) == generate_latest(registry)
    got = scrape(exp)
    assert {s[0]["run"]: s[1] for s in got["taugrid_run_work_at_risk_gpu_hours"]} == {"big": 64.0, "small": 8.0}
    risk = sorted(((v, s["node"]) for s, v in got["taugrid_node_drain_risk"]), reverse=True)
    assert risk == [(80.0, "gpu-c"), (30.0, "gpu-a")]  # gpu-b has no signal: no series
    hours = {s["node"]: v for s, v in got["taugrid_node_work_at_risk_gpu_hours"]}
    assert hours == {"gpu-a": 36.0, "gpu-c": 4.0}  # big's 32 + small's 4; blind's is unknown
    assert {(s["node"], s["signal"]) for s, _ in got["taugrid_node_drain_signal"]} == {
        ("gpu-a", "cordoned"), ("gpu-c", "xid-79")}
    exposure = sorted((v, s["run"], s["node"]) for s, v in got["taugrid_run_drain_exposure_gpu_hours"])
    assert exposure == [(4.0, "small", "gpu-a"), (4.0, "small", "gpu-c"), (32.0, "big", "gpu-a")]


def test_moving_values_and_a_cleared_signal_follow_each_update() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry)
    exp.update(runs(), T0)
    later = [replace(rc, evaluated_at=T0 + timedelta(minutes=1)) for rc in runs()]
    later[1] = at_risk("small", 9.0, [("gpu-a", 30.0, ("cordoned",)), ("gpu-c", 0.0, ())])
    later[2] = replace(later[2], work_at_risk=None)
    exp.update(later, T0 + timedelta(minutes=1))
    assert render(registry) == generate_latest(registry)
    got = scrape(exp)
    assert [s["node"] for s, _ in got["taugrid_node_drain_risk"]] == ["gpu-a"]
    # small's record is of T0: a minute later its 16 GPUs have put 16/60 GPU-hours more at risk
    assert {s[0]["run"]: s[1] for s in got["taugrid_run_work_at_risk_gpu_hours"]} == {"big": 64.0, "small": 9.2667}


def test_healthy_runs_keep_their_exposure_under_run_series_unhealthy() -> None:
    registry = new_registry()
    exp = ClaimsExporter(registry, run_series=RunSeries.UNHEALTHY)
    exp.update([at_risk("calm", 16.0, [("gpu-a", 30.0, ("cordoned",)), ("gpu-b", 0.0, ())], healthy=True)], T0)
    assert render(registry) == generate_latest(registry)
    got = scrape(exp)
    assert got["taugrid_run_work_at_risk_gpu_hours"] == []  # the healthy run's full series are left out
    assert [(s["node"], v) for s, v in got["taugrid_run_drain_exposure_gpu_hours"]] == [("gpu-a", 8.0)]
    assert [(s["node"], v) for s, v in got["taugrid_node_drain_risk"]] == [("gpu-a", 30.0)]
