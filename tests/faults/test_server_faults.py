"""Server-side faults of issue 9: missing bookmarks with watch timeouts, Events expiring (TTL)
during an outage, and faults scheduled on the scenario clock from a scenario file and the CLI.
Each drives the simulator through the official client or the collector's own reflectors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s

from collector.controller import Controller
from collector.model import RunClaims
from collector.settings import ClaimSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.rows import RowBuilder
from exporters.adx.schema import RUN_CLAIMS
from kubesim.clock import ManualClock
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
    start,
    wait_until,
)
from tests.dumpkit import event, pod
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


def _full_lists(sim: Simulator) -> int:
    """Lists that read a resource (the reflector's one-item store probe before resuming is not one)."""
    return sum(1 for verb, _, q in list(sim.request_log) if verb == "list" and q.get("limit") != "1")


# ---------------------------------------------------------------------------- missing bookmarks


def test_missing_bookmarks_and_watch_timeouts_resume_without_relisting() -> None:
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=5000, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        apply_run(s, "gone", ns="team-b")
        s.faults.no_bookmarks()
        ref = _reference(s, clock, watch_timeout_s=1)
        c = start(s, clock, watch_timeout_s=1)  # every watch ends after a second (timeoutSeconds)
        try:
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
            assert _full_lists(s) - lists0 == 0, "a reflector relisted"  # nor did the reference
            assert _relists(c) == relists0
            resumed = [q for verb, _, q in list(s.request_log) if verb == "watch"]
            assert all(q.get("resourceVersion", "") not in ("", "0") for q in resumed[-len(c.resources):])
        finally:
            c.close()
            ref.close()


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
                                       timeout_seconds=3, _preload_content=False)
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
            wait_until(lambda: all(r.resource_version == "" for r in c._reflectors), timeout=10, what="cut off")
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
