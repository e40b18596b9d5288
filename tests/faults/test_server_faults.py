"""Server-side faults of issue 9: missing bookmarks with watch timeouts, Events expiring (TTL)
during an outage, and faults scheduled on the scenario clock from a scenario file and the CLI.
Each drives the simulator through the official client or the collector's own reflectors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client as k8s

from collector.cli import main
from collector.controller import Controller
from collector.model import RunClaims
from collector.settings import ClaimSettings, Settings
from collector.sources.inventory import CRDS, DEPLOYMENTS
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.rows import RowBuilder
from exporters.adx.schema import RUN_CLAIMS
from kubesim.clock import ManualClock
from kubesim.faults import Fault, Faults, FaultScheduler, parse_fault_spec
from kubesim.run import start_simulation
from kubesim.scenario import ScenarioError, scenario_from_dict
from kubesim.server import Simulator
from tests.controller.test_controller import (
    FAST,
    T0,
    Clock,
    apply_run,
    drive_changes,
    ensure_namespaces,
    observed,
    server_side,
    settings,
    settle,
    wait_until,
)
from tests.dumpkit import event, pod
from tests.faults.streams import stream_problems
from tests.faults.test_process_faults import _free_port
from tests.test_explain_fixtures import taurun

REFERENCE_AGENT = "taugrid-reference"


class TransitionLog:
    """An evidence sink that keeps the claim transitions the ADX exporter would write (its own
    RowBuilder decides what a transition is), in order, per run and claim."""

    def __init__(self) -> None:
        self.rows = RowBuilder("test", timedelta(minutes=5))
        self.transitions: list[dict[str, Any]] = []

    def open(self) -> None: ...

    def claims(self, runs: Iterable[RunClaims]) -> None:
        self.transitions += self.rows.claims(list(runs))[RUN_CLAIMS.name]

    def event(self, rec: Any, run: str) -> None: ...

    def signal(self, run: Any, source: str, plane: str, durable: bool, scan: Any) -> None: ...
    def gpu(self, *a: Any, **kw: Any) -> None: ...

    def close(self) -> None: ...

    def of(self, run: str) -> list[tuple[str, str, str]]:
        return [(r["Claim"], r["Observed"], r["Verdict"]) for r in self.transitions if r["Run"] == run]


def _reference(sim: Simulator, clock: Clock, sink: Any = None, cfg: Settings | None = None, **kw: Any) -> Controller:
    """A controller the faults never touch (its user agent is exempt): the uninterrupted run."""
    sim.faults.exempt_user_agents = (*sim.faults.exempt_user_agents, REFERENCE_AGENT)
    api = api_client_for(sim.base_url)
    api.user_agent = REFERENCE_AGENT
    c = Controller(KubeApi(api), cfg or settings(**kw), clock.now, sink=sink)
    c.open()
    wait_until(c.ready.is_set, what="reference ready")
    return c


def _snapshot(c: Controller) -> dict[str, Any]:
    return {f"{r.ref.namespace}/{r.ref.name}": r.to_json() for r in c.claims.values()}


ENVIRONMENT_RESOURCES = {CRDS.plural, DEPLOYMENTS.plural}


def _reflector_lists(sim: Simulator) -> list[tuple[str, dict[str, str]]]:
    """Lists that read a watched resource: not the reflector's one-item store probe before resuming,
    nor the supported-environment check's reads (its own thread and interval: its first pass may
    come after the controller is ready), nor the agent poller's discovery of node agents by label
    (its first pass runs at open; a reflector lists its whole resource, never by label)."""
    return [(res, q) for verb, res, q in list(sim.request_log)
            if verb == "list" and q.get("limit") != "1" and res not in ENVIRONMENT_RESOURCES
            and "labelSelector" not in q]


def _full_lists(sim: Simulator) -> int:
    return len(_reflector_lists(sim))


# ---------------------------------------------------------------------------- missing bookmarks


def test_missing_bookmarks_and_watch_timeouts_resume_without_relisting() -> None:
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=5000, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        apply_run(s, "gone", ns="team-b")
        s.faults.no_bookmarks()
        ref_log, log = TransitionLog(), TransitionLog()
        ref = _reference(s, clock, sink=ref_log, watch_timeout_s=1)
        # every watch ends after a second (timeoutSeconds)
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(watch_timeout_s=1), clock.now, sink=log)
        c.open()
        try:
            wait_until(c.ready.is_set, what="controller ready")
            wait_until(lambda: observed(c, "gone").get("running") == "true", what="synced")
            lists0, relists0 = _full_lists(s), _relists(c)
            bookmarks0 = s.faults.rules()[0].hits
            drive_changes(s)
            time.sleep(3.0)  # several watch timeouts, each resumed without a bookmark
            clean = settle(ref, since=time.monotonic())
            faulted = settle(c, since=time.monotonic())
            assert faulted == clean
            assert set(faulted) == {"research/llm", "team-b/fresh", "team-b/gone"}
            assert s.faults.rules()[0].hits > bookmarks0 + len(c.resources)  # the fault held every new watch
            # Nor did the reference.
            assert _full_lists(s) - lists0 == 0, f"a reflector relisted: {_reflector_lists(s)[lists0:]}"
            assert _relists(c) == relists0
            resumed = [q for verb, _, q in list(s.request_log) if verb == "watch"]
            assert all(q.get("resourceVersion", "") not in ("", "0") for q in resumed[-len(c.resources):])
            # no transition lost or repeated ("fresh" is created in several writes: whether a controller
            # evaluated it between them is timing, so only where it ends is compared)
            problems = stream_problems(_dated(log.transitions), _dated(ref_log.transitions),
                                       final_only=frozenset({"fresh"}))
            assert problems == [], "\n".join(problems)
            assert ("running", "false", "contradicted") in log.of("llm")
        finally:
            c.close()
            ref.close()


def _dated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with their Timestamp as a time (as the store keeps it): RFC 3339 text does not sort by
    time when one has a fraction and the other not (a stopped clock's rows are a microsecond apart)."""
    return [{**r, "Timestamp": datetime.fromisoformat(r["Timestamp"])} for r in rows]


def _relists(c: Controller) -> float:
    return sum(c.registry.get_sample_value("taugrid_collector_relists_total", {"resource": r.name}) or 0
               for r in c.resources)


# ---------------------------------------------------------------------------- event TTL


def _blocked_run(sim: Simulator, name: str, message: str) -> None:
    ensure_namespaces(sim, "research")
    sim.apply(server_side(taurun(name, "research", "Pending", T0 - timedelta(minutes=30), workers=1)))
    p = pod(f"{name}-w0", "research", T0 - timedelta(minutes=30), node=None, phase="Pending", gpus=8,
            labels={"taugrid.io/run": name})
    stored = sim.apply(server_side(p))
    sim.apply(server_side(event(f"{name}-w0.sched", "research", stored, "FailedScheduling", message,
                                T0 - timedelta(minutes=1), type_="Warning", component="default-scheduler")))


def test_store_expires_events_after_their_ttl() -> None:
    clock = ManualClock(T0)
    with Simulator(settings=replace(FAST, event_ttl_s=600), clock=clock) as s:
        s.start()
        _blocked_run(s, "waiting", "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        core = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=s.base_url)))
        listing = core.list_namespaced_event("research")
        assert [e.metadata.name for e in listing.items] == ["waiting-w0.sched"]
        w = core.list_namespaced_event("research", watch=True, resource_version=listing.metadata.resource_version,
                                       timeout_seconds=2, _preload_content=False)
        clock.advance(599)
        time.sleep(0.2)
        assert len(core.list_namespaced_event("research").items) == 1  # not yet
        clock.advance(2)
        wait_until(lambda: not core.list_namespaced_event("research").items, timeout=5, what="event expired")
        lines = [json.loads(x) for x in w.read().splitlines() if x.strip()]
        assert [(x["type"], x["object"]["metadata"]["name"]) for x in lines] == [("DELETED", "waiting-w0.sched")]
        # events.k8s.io/v1 is the same store: gone there too; other kinds never expire.
        ev = k8s.EventsV1Api(core.api_client)
        assert ev.list_namespaced_event("research").items == []
        assert len(core.list_namespaced_pod("research").items) == 1


def test_events_expiring_during_an_outage_recover_to_an_uninterrupted_run() -> None:
    clock = Clock(T0)
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    claims = replace(ClaimSettings(), evidence_max_age=timedelta(hours=1))
    with Simulator(settings=replace(FAST, event_ttl_s=120), watch_window=5000, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        _blocked_run(s, "waiting", msg)
        ref_log, log = TransitionLog(), TransitionLog()
        cfg = replace(settings(), claims=claims)
        ref = _reference(s, clock, sink=ref_log, cfg=cfg)
        # Its watches end every second, so the outage below reaches them too (open streams outlive a new fault).
        cfg_c = replace(cfg, controller=replace(cfg.controller, watch_timeout_s=1))
        c = Controller(KubeApi(api_client_for(s.base_url)), cfg_c, clock.now, sink=log)
        c.open()
        try:
            wait_until(c.ready.is_set, what="ready")
            wait_until(lambda: observed(c, "waiting").get("scheduled") == "false", what="blocked run seen")
            before = settle(c)
            assert msg in json.dumps(before["research/waiting"])  # the Event is part of the evidence
            # The API stops answering this controller: connections close, watches are cut.
            s.faults.drop(count=None)
            s.faults.drop_watch(count=None)
            # Every reflector has lost the server (and will list again once it answers).
            wait_until(lambda: all(r.resource_version == "" for r in c.watch.reflectors), timeout=10, what="cut off")
            clock.advance(150)  # past the Events' TTL: the server deletes them while it is cut off
            wait_until(lambda: not list(s.iter_objects("v1", "Event", "research")), timeout=5, what="expired")
            apply_run(s, "llm", crash=True)  # and the cluster moves on
            time.sleep(1.0)
            s.faults.clear()
            clean = settle(ref, since=time.monotonic())
            faulted = settle(c, since=time.monotonic())
            assert faulted == clean
            assert msg not in json.dumps(faulted["research/waiting"])  # the expired Event is no evidence now
            assert observed(c, "llm")["running"] == "false"
            assert _relists(c) >= 1
            for run in ("llm", "waiting"):
                assert log.of(run) == ref_log.of(run), run  # no transition lost or duplicated
            assert ("running", "false", "contradicted") in log.of("llm")
        finally:
            c.close()
            ref.close()


# ---------------------------------------------------------------------------- scheduled faults


SCENARIO: dict[str, Any] = {
    "name": "faulty",
    "cluster": {"namespaces": ["research"]},
    "faults": [
        {"at": "20s", "for": "20s", "action": "status", "status": 503, "verbs": ["list"],
         "resources": ["namespaces"]},
    ],
    "eventTTL": "1h",
}


def test_scenario_faults_parse_with_errors_naming_file_and_place() -> None:
    spec = scenario_from_dict(SCENARIO, "faulty.yaml")
    (f,) = spec.server.faults
    assert (f.at_s, f.for_s, f.build().status, f.build().verbs) == (20.0, 20.0, 503, ("list",))
    assert spec.server.event_ttl_s == 3600.0
    bad = [
        ([{"action": "status"}], "faults[0]: missing 'at'"),
        ([{"at": "1m", "action": "explode"}], "faults[0]: fault action must be one of"),
        ([{"at": "1m", "for": "soon", "action": "gone"}], "faults[0].for: expected a duration"),
        ([{"at": "1m", "for": 0, "action": "gone"}], "faults[0].for: must be a positive"),
        ([{"at": "1m", "action": "status", "stauts": 503}], "faults[0]: unknown fault fields"),
        ([{"at": "1m", "action": "status", "status": "x"}], "faults[0]: fault status: expected int"),
        ([{"at": "1m", "action": "delay", "ratio": 2}], "faults[0]: fault ratio"),
        ({"at": "1m"}, "faults: expected a list"),
    ]
    for faults, message in bad:
        with pytest.raises(ScenarioError) as err:
            scenario_from_dict({**SCENARIO, "faults": faults}, "faulty.yaml")
        assert str(err.value).startswith(f"faulty.yaml: {message}"), str(err.value)
    with pytest.raises(ScenarioError, match=r"^faulty.yaml: eventTTL: expected a duration"):
        scenario_from_dict({**SCENARIO, "eventTTL": "-5m"}, "faulty.yaml")


def test_fault_spec_compact_and_json() -> None:
    a = parse_fault_spec("at=30s,for=1m,action=status,status=503,verbs=list+watch,resources=pods,retry_after_s=2")
    assert (a.at_s, a.for_s) == (30.0, 60.0)
    rule = a.build()
    assert (rule.action, rule.status, rule.verbs, rule.resources, rule.retry_after_s) == \
        ("status", 503, ("list", "watch"), ("pods",), 2)
    b = parse_fault_spec('{"at": "5m", "action": "gone", "count": 6}')
    assert (b.at_s, b.for_s, b.build().count) == (300.0, None, 6)
    assert parse_fault_spec("action=nobookmarks").at_s == 0.0
    for spec, message in [("action=status,status", "expected key=value"), ("{nope", "not valid JSON"),
                          ("at=1m,action=teleport", "fault action must be one of"), ("at=xx,action=gone", "at:")]:
        with pytest.raises(ValueError, match=message):
            parse_fault_spec(spec)


def test_scheduler_adds_and_removes_faults_on_the_scenario_clock() -> None:
    clock = ManualClock(T0)
    faults = Faults()
    spec = scenario_from_dict(SCENARIO, "faulty.yaml")
    sched = FaultScheduler(faults, [*spec.server.faults, parse_fault_spec("at=30s,action=gone,count=2")], clock, T0)
    seen = []
    for t in (0, 19, 20, 30, 39, 40, 100):
        clock.set(T0 + timedelta(seconds=t))
        sched.apply_due()
        seen.append(sorted(r.action for r in faults.rules()))
    assert seen == [[], [], ["status"], ["gone", "status"], ["gone", "status"], ["gone"], ["gone"]]
    assert isinstance(sched.applied[0], Fault)


def _client(port: int) -> k8s.CoreV1Api:
    cfg = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    cfg.retries = False  # urllib3 would otherwise sleep out a 503's Retry-After and retry, hiding it
    return k8s.CoreV1Api(k8s.ApiClient(cfg))


def _probe(core: k8s.CoreV1Api) -> int:
    try:
        core.list_namespace(_request_timeout=5)
        return 200
    except k8s.ApiException as e:
        return int(e.status)


def _window(probe: Any, now_s: Any, until_s: float) -> list[tuple[float, float, int]]:
    """(scenario seconds before, after, HTTP status) of each probe until `until_s`."""
    seen = []
    while (t := now_s()) < until_s:
        code = probe()
        seen.append((t, now_s(), code))
        time.sleep(0.05)
    return seen


def _check_window(seen: list[tuple[float, float, int]], start: float, end: float, slack: float,
                  before: bool = True) -> None:
    """503 only while the fault is on (within `slack` scenario seconds: the scheduler's poll and the
    clock's resolution), 200 before and after, and no 200 well inside the window."""
    failing = [(a, b) for a, b, code in seen if code == 503]
    assert failing, seen
    assert all(b >= start - slack and a <= end + slack for a, b in failing), (start, end, failing)
    assert not before or any(code == 200 and b < start for a, b, code in seen), f"no answer before the fault: {seen}"
    assert any(code == 200 and a > end + slack for a, b, code in seen), f"no answer after it ended: {seen}"
    assert not [(a, b) for a, b, code in seen if code == 200 and start + slack < a and b < end - slack], seen


def test_scenario_file_fault_takes_effect_at_its_time_and_ends(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "faulty.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    port = _free_port()
    core = _client(port)
    with start_simulation(path, f"127.0.0.1:{port}", speed=10, kubeconfig=tmp_path / "kc") as session:
        origin, clock = session.engine.origin, session.engine.clock
        seen = _window(lambda: _probe(core), lambda: (clock.now() - origin).total_seconds(), 50)
        assert session.simulator.settings.event_ttl_s == 3600.0  # eventTTL reached the server
    _check_window(seen, 20, 40, slack=2.5, before=seen[0][1] < 15)


def test_cli_fault_and_event_ttl(tmp_path: Path) -> None:
    port = _free_port()
    code = "from collector.entry import main; main()"
    base = [sys.executable, "-c", code, "simulator", "--speed", "20", "--kubeconfig", str(tmp_path / "kc")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cwd = Path(__file__).resolve().parents[2]
    for args, words in ((["--fault", "at=1m,action=teleport"], ("--fault", "teleport")),
                        (["--fault", "at=1m,action=status,status"], ("--fault", "key=value")),
                        (["--event-ttl", "0s"], ("--event-ttl", "positive")),
                        (["--event-ttl", "soon"], ("--event-ttl", "duration"))):
        bad = CliRunner().invoke(main, ["simulator", *args])
        assert bad.exit_code == 2 and all(w in bad.output for w in words), bad.output
        assert bad.exception is None or isinstance(bad.exception, SystemExit)
    import yaml

    scenario = tmp_path / "plain.yaml"
    scenario.write_text(yaml.safe_dump({k: v for k, v in SCENARIO.items() if k not in ("faults", "eventTTL")}))
    proc = subprocess.Popen([*base, "--scenario", str(scenario), "--address", f"127.0.0.1:{port}", "--event-ttl", "30s",
                             "--fault", "at=60s,for=30s,action=status,status=503,verbs=list,resources=namespaces"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    try:
        assert proc.stdout is not None
        banner = ""
        while "kubeconfig:" not in banner:
            line = proc.stdout.readline()
            assert line, banner
            banner += line
        core = _client(port)
        # The server's own clock, from its Date header: the scenario clock, sped up 20×.
        from email.utils import parsedate_to_datetime

        def server_now() -> float:
            _, _, headers = k8s.CoreApi(core.api_client).get_api_versions_with_http_info()
            return parsedate_to_datetime(headers["Date"]).timestamp()

        # Scenario time zero: the scenario's namespaces are the first objects it creates.
        t0 = core.read_namespace("research").metadata.creation_timestamp.timestamp()
        core.create_namespaced_event("default", {"metadata": {"name": "probe"}, "reason": "Probe", "message": "m",
                                                 "involvedObject": {"kind": "Namespace", "name": "default"}})
        created = server_now()
        assert [e.metadata.name for e in core.list_namespaced_event("default").items] == ["probe"]
        seen = _window(lambda: _probe(core), lambda: server_now() - t0, 110)
        # --event-ttl 30s reached the server: the Event goes 30 scenario seconds after it was written.
        wait_until(lambda: not core.list_namespaced_event("default").items, timeout=10, what="event expired")
        assert server_now() - created >= 29
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # Starting a process and its scenario takes a few real seconds (tens of scenario seconds at 20×):
    # answers before the fault are checked when there were any (the scenario-file test always does).
    _check_window(seen, 60, 90, slack=5, before=seen[0][1] < 55)
