"""Nothing is exported before the loop holds every resource's first listing (the view is complete),
even when every reflector already says it synced: a reflector queues its listing and then sets its
flag, so the flag alone let the loop evaluate (and export) a RayJob as a root while its TauRun's
listing still waited in the queue. Those rows stayed in the exported streams, as a stream no other
replica had (tests/faults/test_failover.py, the uninterrupted controller)."""

from __future__ import annotations

import queue
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from collector.controller import Controller
from collector.model import ObjectRecord, Ref, RunClaims
from collector.progress.model import LogScan
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.watch import Reflector
from kubesim import ManualClock, ScenarioEngine, Simulator
from kubesim.scenario import default_scenario_path, load_scenario
from tests.controller.test_controller import settings


class Recorder:
    """An EvidenceSink that keeps the roots of the claims it was handed."""

    def __init__(self) -> None:
        self.roots: list[tuple[str, str]] = []

    def open(self) -> None: ...
    def claims(self, runs: Iterable[RunClaims]) -> None:
        self.roots += [(rc.ref.kind, rc.ref.name) for rc in runs]

    def track(self, runs: Iterable[RunClaims], *, led_until: datetime | None = None) -> None: ...
    def event(self, rec: ObjectRecord, run: str) -> None: ...
    def signal(self, run: Ref, source: str, plane: str, durable: bool, scan: LogScan) -> None: ...
    def gpu(self, *a: Any, **kw: Any) -> None: ...
    def close(self) -> None: ...


def _apply_queued(c: Controller) -> None:
    while True:
        try:
            change = c._changes.get_nowait()
        except queue.Empty:
            return
        for x in change.payload if change.op == "batch" else (change,):
            c._apply(x)


def test_no_export_while_a_synced_listing_waits_in_the_queue() -> None:
    clock = ManualClock()
    sim = Simulator(clock=clock)
    sim.start("127.0.0.1:0")
    engine = ScenarioEngine(load_scenario(default_scenario_path()), sim.base_url, clock)
    try:
        engine.step_to(3 * 60)
        sink = Recorder()
        c = Controller(KubeApi(api_client_for(sim.base_url)), settings(), clock.now, sink=sink)
        served = {(r.api_version, r.kind) for r in c.watch.wanted if _served(sim, r.api_version, r.kind)}
        resources = sorted((r for r in c.watch.wanted if (r.api_version, r.kind) in served),
                           key=lambda r: r.kind == "TauRun")
        assert any(r.kind == "TauRun" for r in resources) and any(r.kind == "RayJob" for r in resources)
        for r in resources:  # what each reflector does on its first listing (Reflector.relist)
            refl = Reflector(c.api, r, c.watch, clock.now)
            c.watch.reflectors.append(refl)
            c.watch.replace(r, list(sim.iter_objects(r.api_version, r.kind)))
            c.watch.mark_synced(r, clock.now())
            refl.synced_once.set()
            if r.kind != "TauRun":
                _apply_queued(c)  # the loop applied these; the TauRun listing is still queued
        c.evaluate(full=True)
        assert sink.roots == [], "exported before the loop held the TauRuns' listing"
        _apply_queued(c)
        c.evaluate(full=True)
        assert ("TauRun", "llm-pretrain") in sink.roots
        assert not [root for root in sink.roots if root[0] == "RayJob"], sink.roots
    finally:
        engine.stop()
        sim.close()


def _served(sim: Simulator, api_version: str, kind: str) -> bool:
    try:
        sim.resource(api_version, kind)
    except KeyError:
        return False
    return True
