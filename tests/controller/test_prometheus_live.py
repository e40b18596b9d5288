"""A real Prometheus scrapes the live controller while the cluster changes under it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, start, wait_until
from tests.promserver import PromServer


def test_prometheus_sees_the_claims_the_cluster_implies(tmp_path: Path) -> None:
    clock = Clock(datetime.now(UTC))  # Prometheus compares sample ages with its own wall clock
    with Simulator(settings=FAST) as sim:
        sim.start()
        apply_run(sim, "healthy", workers=2)
        apply_run(sim, "crashy", ns="team-b", crash=True)
        c = start(sim, clock)
        try:
            port = c.serve("127.0.0.1", 0)
            wait_until(lambda: c.ready.is_set())
            with PromServer.start([f"127.0.0.1:{port}"], tmp_path / "prom") as prom:
                verdicts = prom.wait_for(
                    'taugrid_run_claim_state{claim="running"}', lambda r: len(r) == 2, timeout=20)
                by_run = {s["metric"]["run"]: s["metric"]["verdict"] for s in verdicts}
                assert by_run == {"healthy": "verified", "crashy": "contradicted"}
                observed = prom.query('taugrid_run_claim_state{run="crashy",claim="progressing"}')
                assert [s["metric"]["observed"] for s in observed] == ["false"]
                # The crash loop ends: Prometheus follows within a scrape or two.
                apply_run(sim, "crashy", ns="team-b")
                prom.wait_for('taugrid_run_claim_state{run="crashy",claim="running",verdict="verified"}',
                              timeout=20)
                tracked = prom.query("taugrid_collector_runs_tracked")
                assert float(tracked[0]["value"][1]) == 2
                events = prom.query('sum(taugrid_collector_events_processed_total)')
                assert float(events[0]["value"][1]) >= 1
        finally:
            c.close()
    assert clock.now() > T0
