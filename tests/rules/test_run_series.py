"""`run_series: unhealthy` on real scrapes: the chart's alerts fire on the same runs as with `all`.

A fleet of eight runs (two healthy, one slowing down, one stalled, contradicted, blocked, never
progressing, not re-evaluated, finished) is exported minute by minute for 110 minutes through the
exporter's HTTP server, in each mode. Each mode's scrapes become promtool input series, and promtool
evaluates the chart's rules over them: the firing alerts by run must be the same in both modes.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.config import RUN_SERIES, ConfigError, load_settings
from collector.controller import Controller
from collector.model import Blocked, Claim, Evidence, Observed, Plane, Ref, RunClaims, Stage, verdict_for
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.prometheus import ClaimsExporter, new_registry, render, serve, shutdown
from exporters.prometheus_fleet import RunSeries, RunState, run_state
from exporters.prometheus_health import HealthMetrics
from kubesim.run import start_simulation
from tests.exporters.test_promtool_metrics import check_metrics
from tests.rules.test_rules import RULES, run

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # promtool's clock starts at 0
MINUTES = 110


def _claim(asserted: bool | None, observed: Observed, evidence: tuple[Evidence, ...] = (),
           cause: str = "") -> Claim:
    return Claim(asserted, observed, verdict_for(asserted, observed), EPOCH, "r", evidence, cause=cause)


def _step(value: int, at: datetime) -> Evidence:
    return Evidence(Plane.LOGS, "Pod/ml/p-0", "last_step", value, at)


def _run(name: str, now: datetime, *, running: Observed = Observed.TRUE, progressing: Observed = Observed.TRUE,
         step: tuple[int, datetime] | None = None, cause: str = "", blocked: bool = False,
         finished: bool = False, evaluated: datetime | None = None) -> RunClaims:
    pod = Evidence(Plane.KUBERNETES, "Pod/ml/p-0", "status.phase", "Running", now)
    prog = (_step(*step),) if step else ()
    return RunClaims(
        ref=Ref("TauRun", "ml", name, f"uid-{name}"),
        scheduled=_claim(not blocked, Observed.FALSE if blocked else Observed.TRUE, (pod,)),
        running=_claim(not blocked, Observed.FALSE if blocked else running, (pod,)),
        progressing=_claim(True if not blocked else None, progressing, prog, cause),
        blocked=Blocked(Stage.DEVICE_ALLOCATION, "no device", EPOCH, ()) if blocked else None,
        evaluated_at=evaluated or now,
        finished=finished,
        extra={"queue": "gpu-lq"},
    )


def fleet(m: int) -> list[RunClaims]:
    now = EPOCH + timedelta(minutes=m)
    slow = 100 * m if m <= 80 else 8000 + 80 * (m - 80)  # 1.67 steps/s, then 1.33 (−20%)
    return [
        _run("steady", now, step=(100 * m, now)),
        _run("slowing", now, step=(slow, now)),
        _run("stalled", now, progressing=Observed.FALSE, cause="stalled", step=(100, EPOCH)),
        _run("liar", now, running=Observed.FALSE, progressing=Observed.UNKNOWN),
        _run("waiting", now, blocked=True, progressing=Observed.UNKNOWN),
        _run("silent", now, progressing=Observed.UNKNOWN),
        _run("frozen", now, progressing=Observed.UNKNOWN, step=(5, EPOCH), evaluated=EPOCH),
        _run("done", now, progressing=Observed.FALSE, cause="finished", step=(700, EPOCH), finished=True),
    ]


def scrapes(mode: RunSeries) -> list[bytes]:
    """The exporter's /metrics over HTTP, once a minute of the fleet's clock."""
    registry = new_registry()
    exporter = ClaimsExporter(registry, run_series=mode)
    HealthMetrics(registry, resources=["pods"], version="t")
    server, thread = serve(registry)
    out = []
    try:
        for m in range(MINUTES + 1):
            exporter.update(fleet(m), EPOCH + timedelta(minutes=m), replace=True)
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as r:
                out.append(bytes(r.read()))
    finally:
        shutdown(server, thread)
    return out


def input_series(texts: list[bytes]) -> list[dict[str, str]]:
    """promtool input series: one per series seen, `_` for the minutes it was absent."""
    values: dict[str, dict[int, float]] = {}
    for m, text in enumerate(texts):
        for fam in text_string_to_metric_families(text.decode()):
            for s in fam.samples:
                labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                values.setdefault(f"{s.name}{{{labels}}}", {})[m] = s.value
    return [{"series": key, "values": " ".join(repr(by_m[m]) if m in by_m else "_" for m in range(len(texts)))}
            for key, by_m in values.items()]


FIRING = 'count by (alertname, run) (ALERTS{alertstate="firing", alertname=~"TaugridRun.*|TaugridClaims.*"})'
# A stalled run whose status asserts progress is also contradicted on `progressing`.
_EARLY = {("TaugridRunStalled", "stalled"), ("TaugridRunContradicted", "stalled"), ("TaugridRunContradicted", "liar"),
          ("TaugridRunBlockedTooLong", "waiting"), ("TaugridClaimsNotEvaluated", "frozen")}
EXPECTED = {
    20: _EARLY,
    40: _EARLY | {("TaugridRunNeverProgressed", "silent")},
    105: _EARLY | {("TaugridRunNeverProgressed", "silent"), ("TaugridRunSlowedDown", "slowing")},
}


def promtool_test(tmp_path: Path, texts: list[bytes], expected: dict[int, set[tuple[str, str]]]) -> str:
    """promtool's output on the chart's rules over these scrapes; empty when the firing sets match."""
    doc = {
        "rule_files": [str(f) for f in RULES],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input_series(texts),
            "promql_expr_test": [
                {"expr": FIRING, "eval_time": f"{t}m",
                 "exp_samples": [{"labels": f'{{alertname="{a}", run="{r}"}}', "value": 1} for a, r in sorted(firing)]}
                for t, firing in expected.items()
            ],
        }],
    }
    path = tmp_path / "run_series.test.yaml"
    path.write_text(yaml.safe_dump(doc, width=1 << 20))
    result = run("test", "rules", path)
    return "" if result.returncode == 0 else result.stdout + result.stderr


@pytest.fixture(scope="module")
def exported() -> dict[RunSeries, list[bytes]]:
    return {mode: scrapes(mode) for mode in RunSeries}


@pytest.mark.parametrize("mode", list(RunSeries), ids=str)
def test_the_chart_alerts_fire_on_the_same_runs_in_both_modes(
        mode: RunSeries, exported: dict[RunSeries, list[bytes]], tmp_path: Path) -> None:
    problems = promtool_test(tmp_path, exported[mode], EXPECTED)
    assert problems == "", problems


def test_a_missed_alert_fails_the_check(exported: dict[RunSeries, list[bytes]], tmp_path: Path) -> None:
    """The check can fail: without the healthy runs' step series, the slowdown goes unseen."""
    cut = [b"\n".join(line for line in text.split(b"\n") if b'run="slowing"' not in line)
           for text in exported[RunSeries.UNHEALTHY]]
    problems = promtool_test(tmp_path, cut, EXPECTED)
    assert "TaugridRunSlowedDown" in problems


def test_healthy_runs_keep_only_their_step_and_are_counted(exported: dict[RunSeries, list[bytes]]) -> None:
    last = exported[RunSeries.UNHEALTHY][-1]
    full = exported[RunSeries.ALL][-1]
    healthy = {f"{s.name}" for fam in text_string_to_metric_families(last.decode()) for s in fam.samples
               if s.labels.get("run") in ("steady", "slowing")}
    assert healthy == {"taugrid_run_progress_last_step"}
    for text in (last, full):
        fleet_runs = {(s.labels["queue"], s.labels["state"]): s.value
                      for fam in text_string_to_metric_families(text.decode()) if fam.name == "taugrid_fleet_runs"
                      for s in fam.samples}
        # `done` went with retention (15 minutes after it finished); the rest, one state each
        assert fleet_runs == {("gpu-lq", "healthy"): 2.0, ("gpu-lq", "stalled"): 1.0,
                              ("gpu-lq", "contradicted"): 1.0, ("gpu-lq", "blocked"): 1.0,
                              ("gpu-lq", "unverified"): 2.0}
    assert b'run="liar"' in last and b'run="frozen"' in last
    assert last.count(b'run="steady"') == 1 and full.count(b'run="steady"') >= 12


def test_healthy_state_needs_every_claim_observed_true() -> None:
    now = EPOCH + timedelta(minutes=1)
    ok = _run("ok", now, step=(1, now))
    assert run_state(ok) is RunState.HEALTHY
    assert run_state(replace(ok, scheduled=_claim(None, Observed.TRUE))) is RunState.HEALTHY  # not asserted: ahead
    assert run_state(replace(ok, scheduled=_claim(True, Observed.UNKNOWN))) is RunState.UNVERIFIED
    assert run_state(replace(ok, progressing=_claim(None, Observed.FALSE, cause="replaying"))) is RunState.UNVERIFIED
    assert run_state(_run("h", now, progressing=Observed.FALSE, cause="hung")) is RunState.STALLED
    assert run_state(replace(ok, finished=True)) is RunState.FINISHED


@pytest.mark.parametrize("mode", list(RunSeries), ids=str)
def test_prepared_text_equals_client_python_in_each_mode(mode: RunSeries) -> None:
    registry = new_registry()
    exporter = ClaimsExporter(registry, run_series=mode)
    for m in (0, 30, 90):
        exporter.update(fleet(m), EPOCH + timedelta(minutes=m))
        assert render(registry) == generate_latest(registry)


def test_the_setting_is_checked_and_names_the_same_modes(tmp_path: Path) -> None:
    assert tuple(RunSeries) == RUN_SERIES
    cfg = tmp_path / "c.yaml"
    cfg.write_text("controller:\n  run_series: unhealthy\n")
    assert load_settings(cfg).controller.run_series == "unhealthy"
    cfg.write_text("controller:\n  run_series: sick\n")
    with pytest.raises(ConfigError, match=r"run_series: expected one of all, unhealthy, got 'sick'"):
        load_settings(cfg)


def test_a_controller_scrape_with_unhealthy_run_series(tmp_path: Path) -> None:
    """The live controller against the simulator, `run_series: unhealthy` from a settings file: every
    run is counted in taugrid_fleet_runs, the healthy ones export their step alone, and promtool's
    linter passes the scrape."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("controller:\n  run_series: unhealthy\n  leader_election: false\n  tick: 1s\n")
    session = start_simulation(None, "127.0.0.1:0", 20.0)
    ctl = Controller(KubeApi(api_client_for(session.base_url)), load_settings(cfg), session.engine.clock.now)

    def counts(text: bytes) -> dict[str, float]:
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text.decode()):
            if fam.name == "taugrid_fleet_runs":
                for s in fam.samples:
                    out[s.labels["state"]] = out.get(s.labels["state"], 0.0) + s.value
        return out

    try:
        port = ctl.serve("127.0.0.1", 0)
        ctl.open()
        deadline = time.monotonic() + 40
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = bytes(r.read())
            by_state = counts(text)
            if by_state.get("healthy") and len(by_state) > 1:
                break
            assert time.monotonic() < deadline, f"no healthy and unhealthy runs together: {by_state}"
            time.sleep(0.5)
    finally:
        ctl.close()
        session.close()
    full = {s.labels["run"] for fam in text_string_to_metric_families(text.decode())
            if fam.name == "taugrid_run_evaluated_timestamp_seconds" for s in fam.samples}
    stepping = {s.labels["run"] for fam in text_string_to_metric_families(text.decode())
                if fam.name == "taugrid_run_progress_last_step" for s in fam.samples}
    assert len(full) == sum(by_state.values()) - by_state["healthy"]
    assert stepping - full, "no healthy run exports its step"
    assert check_metrics(text) == ""


@settings(max_examples=500, deadline=None)
@given(st.floats(min_value=0.0, max_value=1e6, exclude_min=True, exclude_max=True)
       | st.sampled_from([1e-05, 5e-324, 999999.9999999999, 123456.789]))
def test_ages_are_formatted_as_client_python_formats_them(v: float) -> None:
    """The exposition writes an age in (0, 1e6) with `%a` (its repr) rather than client_python's call."""
    from exporters.prometheus import _fmt
    assert b"%a" % v == _fmt(v).encode()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["move", "add", "forget", "finish", "clock"]),
                          st.lists(st.integers(0, 299), min_size=1, max_size=12)), min_size=1, max_size=8),
       st.sampled_from(list(RunSeries)))
def test_blocks_of_prepared_text_follow_every_change(ops: list[tuple[str, list[int]]], mode: RunSeries) -> None:
    """Past one block (64 runs): runs moved, added, forgotten, finished and expired, the clock moved;
    after each, the prepared text is what client_python renders from `collect()`."""
    registry = new_registry()
    exporter = ClaimsExporter(registry, run_series=mode, retention=timedelta(minutes=1))
    names = [f"r{i:03d}" for i in range(300)]
    m = 1
    exporter.update([_run(n, EPOCH, step=(1, EPOCH)) for n in names[::2]], EPOCH)
    assert render(registry) == generate_latest(registry)
    for op, picks in ops:
        m += 1
        now = EPOCH + timedelta(minutes=m)
        chosen = [names[i] for i in picks]
        if op == "move":  # healthy ↔ unverified, a new step
            batch = [_run(n, now, step=(m, now), progressing=Observed.UNKNOWN if m % 2 else Observed.TRUE)
                     for n in chosen]
        elif op == "add":
            batch = [_run(n + "-new", now, step=(m, now)) for n in chosen]
        elif op == "finish":
            batch = [_run(n, now, finished=True, progressing=Observed.FALSE, cause="finished") for n in chosen]
        else:
            batch = []
        if op == "forget":
            for n in chosen:
                exporter.forget(Ref("TauRun", "ml", n, f"uid-{n}"))
        exporter.update(batch, now)
        assert render(registry) == generate_latest(registry), op


def test_a_healthy_run_keeps_its_straggler_suspects_with_unhealthy_run_series() -> None:
    """A run can progress and still wait on one slow rank: its suspects stay exported (at most three)."""
    from collector.model import Straggler, Stragglers

    now = EPOCH + timedelta(minutes=5)
    slow = Straggler("rank", "5", "p-5", "gpu-3", 0.15, now, "arrival", "rank 5 printed last", lag_s=1.5)
    rc = replace(_run("steady", now, step=(500, now)), stragglers=Stragglers((slow,), 8, 40, "rank 5 printed last"))
    assert run_state(rc) is RunState.HEALTHY
    registry = new_registry()
    exporter = ClaimsExporter(registry, run_series=RunSeries.UNHEALTHY)
    exporter.update([rc], now)
    text = render(registry)
    assert text == generate_latest(registry)
    names = {s.name for fam in text_string_to_metric_families(text.decode()) for s in fam.samples
             if s.labels.get("run") == "steady"}
    assert names == {"taugrid_run_progress_last_step", "taugrid_run_straggler"}
