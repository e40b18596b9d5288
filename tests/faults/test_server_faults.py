"""Server-side faults of issue 9: missing bookmarks with watch timeouts, Events expiring (TTL)
during an outage, and faults scheduled on the scenario clock from a scenario file and the CLI.
Each drives the simulator through the official client or the collector's own reflectors."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from collector.controller import Controller
from collector.model import RunClaims
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.rows import RowBuilder
from exporters.adx.schema import RUN_CLAIMS
from kubesim.server import Simulator
from tests.controller.test_controller import (
    FAST,
    T0,
    Clock,
    apply_run,
    drive_changes,
    observed,
    settings,
    settle,
    start,
    wait_until,
)

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
