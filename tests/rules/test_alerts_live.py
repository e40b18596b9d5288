"""The chart's alerts, as an on-call engineer meets them: a scenario played on the API simulator,
the controller watching it and serving /metrics, a real Prometheus scraping it with the chart's
rules loaded. Every half second the test reads `/api/v1/alerts` and the scenario's ground truth
(`kubesim.truth`) and holds each run's alerts to what is really so of it (in the last few seconds:
a scrape and an evaluation behind):

- no critical alert on a run that is waiting (queued, unschedulable, waiting for nodes) or healthy
  (scheduled, running, a valid step within its interval), nor on one replaying after a restart;
- every run that really stalled (running, its steps stopped past the collector's detection
  latency) gets `TaugridRunStalled`, pending or firing.

The loaded copy of the rules differs from the chart's only in `for:`, divided by the scenario's
speed (the scenario clock runs that much faster than Prometheus's); expressions are identical.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from collector.controller import Controller
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.run import start_simulation
from kubesim.scenario import default_scenario_path
from kubesim.truth import RunTruth, Tolerance
from tests.promserver import PromServer

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "charts" / "taugrid-evidence" / "rules").glob("*.rules.yaml"))
FLEET = ROOT / "kubesim" / "scenarios" / "fleet.yaml"
UNITS = {"s": 1, "m": 60, "h": 3600}
# A truth this recent (wall seconds) may still be behind an alert: a scrape, an evaluation, a poll.
LAG_S = 4.0


def _seconds(duration: str) -> float:
    parts = re.findall(r"(\d+)([smh])", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * UNITS[u] for n, u in parts)


def scaled_rules(speed: float, out: Path, sources: list[Path] = RULES) -> list[Path]:
    """The rule files with every `for:` divided by `speed` (at least 1 s); nothing else changes."""
    copies = []
    for path in sources:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = f"{max(1, math.ceil(_seconds(rule['for']) / speed))}s"
        copy = out / path.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        original = yaml.safe_load(path.read_text())
        assert [[{k: v for k, v in r.items() if k != "for"} for r in g["rules"]] for g in doc["groups"]] == \
            [[{k: v for k, v in r.items() if k != "for"} for r in g["rules"]] for g in original["groups"]]
        copies.append(copy)
    return copies


def state_of(t: RunTruth, tol: Tolerance) -> str:
    """The run's truth as an on-call engineer would name it."""
    if t.stage is not None:
        return "waiting"
    if t.scheduled and t.running and t.progressing:
        return "healthy"
    if t.running and t.since_advance is not None and t.every > 0 and t.skip_ratio <= 0.5:
        restarted = [r.ago for r in t.restarts]
        if restarted and min(restarted) < t.since_advance:
            return "replaying"  # started over after its last valid step: it has not passed its mark yet
        if t.since_advance > tol.progress_edge(t.every) + 30:
            return "stalled"
    return "other"  # crash-looping, failed, finished, starting, inside the detection latency


@dataclass
class Watch:
    """What the test saw: per run, its truth over time and the alerts Prometheus held for it."""

    history: dict[tuple[str, str], list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    alerts: dict[tuple[str, str], set[tuple[str, str, str]]] = field(default_factory=lambda: defaultdict(set))
    wrong: list[str] = field(default_factory=list)
    lag_s: float = 0.0  # how far the scenario engine fell behind its clock (scenario seconds), at most
    lags: list[tuple[float, float]] = field(default_factory=list)
    judged: int = 0
    skipped: int = 0

    def states_within(self, key: tuple[str, str], now: float) -> set[str]:
        return {s for at, s in self.history[key] if now - at <= LAG_S}

    def observe(self, now: float, truth: dict[tuple[str, str], RunTruth], active: list[dict[str, Any]],
                tol: Tolerance, behind_s: float, speed: float) -> None:
        self.lag_s = max(self.lag_s, behind_s)
        self.lags.append((now, behind_s))
        for key, t in truth.items():
            self.history[key].append((now, state_of(t, tol)))
        runs = [(a, (a["labels"]["namespace"], a["labels"]["run"])) for a in active if "run" in a["labels"]]
        for a, key in runs:
            self.alerts[key].add((a["labels"]["alertname"], a["labels"]["severity"], a["state"]))
        # An engine starved of CPU writes the steps late: the controller, on the scenario clock, may then
        # rightly see them stop. Such moments (and those just after) are not judged.
        if any(b > 2 * speed for at, b in self.lags if now - at <= 2 * LAG_S):
            self.skipped += 1
            return
        self.judged += 1
        for a, key in runs:
            recent = self.states_within(key, now)
            if a["labels"]["severity"] == "critical" and recent and recent <= {"waiting", "healthy", "replaying"}:
                self.wrong.append(f"{key[0]}/{key[1]} ({'/'.join(sorted(recent))}): {a['labels']['alertname']} "
                                  f"{a['state']} since {a.get('activeAt')}")

    def ever(self, state: str) -> set[tuple[str, str]]:
        return {k for k, h in self.history.items() if any(s == state for _, s in h)}


def play(scenario: Path, speed: float, scenario_seconds: float, tmp_path: Path,
         rules: list[Path] = RULES) -> Watch:
    """Play `scenario` for `scenario_seconds` at `speed` through the controller and Prometheus."""
    session = start_simulation(scenario, "127.0.0.1:0", speed, kubeconfig=tmp_path / "kubeconfig")
    engine = session.engine
    base = Settings()
    settings = replace(base, controller=replace(base.controller, leader_election=False, tick=timedelta(seconds=1),
                                                log_poll_interval=timedelta(seconds=max(1.0, 10 / speed))))
    s = settings.claims
    # Stalled: past the collector's window for a steady cadence (max(floor, multiplier x interval) and
    # its scrape), two of Prometheus's scrapes and the margin `state_of` adds.
    tol = Tolerance(stall_floor=s.stall_floor.total_seconds(), stall_ceiling_multiplier=s.stall_multiplier,
                    stall_window_max=s.stall_window_max.total_seconds(),
                    scrape_interval=s.scrape_interval.total_seconds() + 2 * speed)
    ctl = Controller(KubeApi(api_client_for(session.base_url)), settings, engine.clock.now)
    watch = Watch()
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    try:
        port = ctl.serve("127.0.0.1", 0)
        ctl.open()
        with PromServer.start([f"127.0.0.1:{port}"], tmp_path / "prom",
                              rule_files=scaled_rules(speed, rules_dir, rules)) as prom:
            deadline = time.monotonic() + 2 * scenario_seconds / speed
            while engine.elapsed < scenario_seconds and time.monotonic() < deadline:
                active = prom.alerts()
                with engine._lock:  # the engine's thread moves the runs; read them between its steps
                    truth = engine.truth()
                    behind = (engine.clock.now() - engine.origin).total_seconds() - engine.elapsed
                watch.observe(time.monotonic(), truth, active, tol, behind, speed)
                time.sleep(0.5)
            groups = prom._get("/api/v1/rules")["groups"]
            broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
            assert broken == [], broken
    finally:
        ctl.close()
        session.close()
    assert engine.errors == []
    # (the submissions' burst at the start lags the engine by a few wall seconds on a busy machine)
    assert watch.judged >= max(10, watch.skipped), f"the simulator could not keep up: {report(watch)}"
    return watch


def report(watch: Watch) -> str:
    # A simulator that fell far behind its clock writes steps late: the truth then lags the evidence.
    head = (f"(the scenario engine lagged its clock by up to {watch.lag_s:.0f} scenario s; {watch.judged} samples"
            f" judged, {watch.skipped} not)")
    rows = [f"  {ns}/{run}: {sorted({s for _, s in watch.history[(ns, run)]})} "
            f"alerts {sorted(watch.alerts.get((ns, run), set()))}" for ns, run in sorted(watch.history)]
    return "\n".join([head, *rows])


def test_default_scenario_pages_for_the_stall_only(tmp_path: Path) -> None:
    """Six runs: healthy, a stall at 6 min, one queued on quota, a crash loop, one waiting for nodes
    (scale-up) and a preempted batch Job waiting for quota again. 10 scenario minutes at 30x."""
    watch = play(default_scenario_path(), 30.0, 600.0, tmp_path)
    assert watch.wrong == [], "critical alerts on runs that are not stalled:\n" + "\n".join(watch.wrong) + \
        "\n" + report(watch)
    stalled = watch.ever("stalled")
    assert stalled == {("research", "llm-sft")}, report(watch)
    assert {("research", "vision-finetune"), ("team-b", "rl-sweep")} <= watch.ever("waiting"), report(watch)
    assert ("research", "llm-pretrain") in watch.ever("healthy"), report(watch)
    for key in stalled:
        assert {a for a, _, _ in watch.alerts[key]} >= {"TaugridRunStalled"}, report(watch)
    # The truth covered every run the scenario submits; the alerts named no run it does not have.
    assert set(watch.alerts) <= set(watch.history), report(watch)


def test_a_fleet_pages_for_its_stalls_only(tmp_path: Path) -> None:
    """The shipped fleet's templates (healthy, stalls, fails, crash-loops, queued), 1/200 of its runs
    (31, of 4 pods) submitted over a minute, nodes to match, and two runs replaying after an in-place restart.
    9.5 scenario minutes at 15x."""
    doc = yaml.safe_load(FLEET.read_text())
    for entry in doc["runs"]:
        entry["count"] = max(2, entry["count"] // 200)
        entry["stagger"] = "1m"
    doc["cluster"]["nodes"][1]["count"] = 40
    doc["cluster"]["profiles"][0]["workers"] = 3  # a head and 3 workers a run: the controller keeps up on 2 cores
    # and runs that restart in place at 2 min and replay 50 steps (8 minutes of replay) from their checkpoint
    doc["templates"]["replays"] = {**doc["templates"]["healthy"], "timeline": [
        *doc["templates"]["healthy"]["timeline"][:-1], {"at": "55s", "train": {"every": "10s"}},
        {"at": "2m", "restart": {"mode": "inplace", "rewind": 50, "resumeAfter": "20s"}}]}
    doc["runs"].append({"name": "replaying", "template": "replays", "count": 2, "stagger": "30s"})
    path = tmp_path / "fleet-small.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    watch = play(path, 15.0, 570.0, tmp_path)
    assert watch.wrong == [], "critical alerts on runs that are not stalled:\n" + "\n".join(watch.wrong) + \
        "\n" + report(watch)
    stalled = watch.ever("stalled")
    assert {run for _, run in stalled} == {"stalled-0", "stalled-1"}, report(watch)
    for key in stalled:
        assert "TaugridRunStalled" in {a for a, _, _ in watch.alerts[key]}, report(watch)
    assert len(watch.ever("waiting")) >= 2 and len(watch.ever("healthy")) >= 23, report(watch)
    assert {run for _, run in watch.ever("replaying")} == {"replaying-0", "replaying-1"}, report(watch)
