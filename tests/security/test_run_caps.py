"""Caps on tracked runs (issue 26): every run costs ~16 series (~4.9 KB of /metrics) and its
evaluations, and tenants create runs at will. Past a cap per namespace, or in all, runs are not
tracked: counted by namespace and logged once per namespace, while the runs already tracked (and
other tenants' runs) stay."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from collector.controller import Controller
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.prometheus import render
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, settings, wait_until


def _tracked(c: Controller) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rc in list(c.claims.values()):
        out.setdefault(rc.ref.namespace, set()).add(rc.ref.name)
    return out


def _untracked(c: Controller, ns: str) -> float:
    return c.registry.get_sample_value("taugrid_collector_runs_untracked", {"namespace": ns}) or 0.0


def test_a_tenant_past_its_cap_is_not_tracked_and_others_are(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        for i in range(6):  # team-a: six runs, oldest first
            apply_run(s, f"a{i}", ns="team-a", at=T0 - timedelta(minutes=60 - i))
        for i in range(2):
            apply_run(s, f"b{i}", ns="team-b", at=T0 - timedelta(minutes=30 - i))
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(max_runs=6, max_runs_per_namespace=3),
                       clock.now)
        with caplog.at_level(logging.INFO, logger="taugrid.controller"):
            c.open()
            try:
                wait_until(c.ready.is_set, what="ready")
                wait_until(lambda: _tracked(c) == {"team-a": {"a0", "a1", "a2"}, "team-b": {"b0", "b1"}},
                           what="the three oldest of team-a and all of team-b tracked")
                assert _untracked(c, "team-a") == 3 and _untracked(c, "team-b") == 0
                text = render(c.registry).decode()
                assert 'run="a3"' not in text and 'run="b1"' in text  # no series for a run not tracked
                # The total cap: team-c's run fits (6), the next one does not.
                apply_run(s, "c0", ns="team-c", at=T0 - timedelta(minutes=10))
                apply_run(s, "c1", ns="team-c", at=T0 - timedelta(minutes=9))
                wait_until(lambda: _untracked(c, "team-c") == 1, what="team-c's second run over the total cap")
                assert _tracked(c)["team-c"] == {"c0"} and len(c.claims) == 6
                # A tracked run of team-a goes: its slot goes to team-a's oldest run kept out.
                s.store.delete(s.resource("taugrid.io/v1alpha1", "TauRun"), "team-a", "a0")
                wait_until(lambda: _tracked(c).get("team-a") == {"a1", "a2", "a3"}, what="a3 tracked in a0's place")
                assert _untracked(c, "team-a") == 2
            finally:
                c.close()
    warnings = [r for r in caplog.records if r.getMessage() == "runs over a cap are not tracked"]
    assert sorted(getattr(r, "namespace", "") for r in warnings) == ["team-a", "team-c"]  # once per namespace


def test_the_full_pass_leaves_the_runs_a_cap_keeps_out_until_a_place_frees() -> None:
    """At 150k pods the periodic pass marked the 5,000 runs `max_runs` keeps out on every pass, sorted
    them by age and refused them again. It leaves them now; a tracked run gone names them again
    (`RunCaps.release`), and the oldest takes its place."""
    from datetime import UTC, datetime

    from bench.bench_controller import fleet_controller
    from collector.runcaps import RunCaps

    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    c, _ = fleet_controller(5, 2, 10, lambda: now)
    c.caps = RunCaps(3, 0)
    c.evaluate(full=True)
    tracked, out = set(c.claims), set(c.caps.kept_out())
    assert len(tracked) == 3 and len(out) == 2 and not tracked & out
    c._dirty.clear()
    c._mark_all()
    assert c._dirty == tracked  # (none deferred here: every tracked run marked)
    c.evaluate()
    assert set(c.claims) == tracked
    gone = min(tracked)
    c.index.delete(c.index.get(*gone).ref)
    c._roots_changed = True
    c.evaluate()  # the run gone: a place frees, the runs kept out are marked and the oldest admitted
    assert len(c.claims) == 3 and gone not in c.claims and len(set(c.claims) & out) == 1
    assert len(set(c.caps.kept_out())) == 1


def test_a_log_increment_does_not_retry_a_run_a_cap_keeps_out() -> None:
    """A run kept out by a cap is not marked by its pods' log increments (at 150k pods its head's, every
    30 s, marked 5,000 runs kept out, each refused again); a tracked run's are. `release` retries it."""
    from datetime import UTC, datetime

    from bench.bench_controller import fleet_controller
    from collector.correlate import Signal
    from collector.model import Ref
    from collector.planes.base import Change
    from collector.progress.model import LogScan
    from collector.runcaps import RunCaps

    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    c, pods = fleet_controller(5, 2, 10, lambda: now)
    c.caps = RunCaps(3, 0)
    c.evaluate(full=True)
    c._dirty.clear()
    marked = {}
    for p in pods:
        ref = Ref("Pod", p["metadata"]["namespace"], p["metadata"]["name"])
        root = c.index.root_of(ref)
        assert root is not None
        scan = LogScan("main", None, (), (), (), ("a line",), 1)
        c._apply(Change("agent-log", None, (Signal(ref, "main", scan, now), None)))
        marked[root.key] = root.key in c._dirty
    out = set(c.caps.kept_out())
    assert len(out) == 2 and not any(marked[k] for k in out)
    assert all(marked[k] for k in c.claims)
