"""A real Prometheus scrapes the exporter over HTTP; PromQL sees the verdicts we exported."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from exporter_samples import blocked_run, crashlooping_run
from promserver import PromServer, StartPrometheus

from collector.model import Observed, Verdict
from exporters.prometheus import ClaimsExporter, new_registry, serve, shutdown
from exporters.prometheus_health import HealthMetrics


def test_prometheus_sees_running_contradicted(prometheus_server: StartPrometheus) -> None:
    registry = new_registry()
    exporter = ClaimsExporter(registry)
    health = HealthMetrics(registry, resources=["pods"], sources=["kubernetes"])
    now = datetime.now(UTC)
    exporter.update([crashlooping_run(at=now), blocked_run(at=now)], now)
    health.set_runs_tracked(2)
    server, thread = serve(registry, "127.0.0.1", 0)
    try:
        prom = prometheus_server([f"127.0.0.1:{server.server_port}"])
        result = prom.wait_for(
            'taugrid_run_claim_state{namespace="research", run="llm-pretrain", claim="running"} == 1',
            lambda r: len(r) == 1,
            timeout=12,
        )
        assert result[0]["metric"]["verdict"] == "contradicted"
        assert result[0]["metric"]["kind"] == "TauRun"

        # An alert-style query: runs blocked on Kueue, and the collector's own health.
        assert [r["metric"]["run"] for r in prom.query('taugrid_run_blocked{owner="Kueue"}')] == ["queued"]
        assert prom.query("taugrid_collector_runs_tracked")[0]["value"][1] == "2"
        # honor_labels keeps the run's namespace, not a target-derived one.
        assert {r["metric"]["namespace"] for r in prom.query("taugrid_run_finished")} == {
            "research",
            "team-b",
        }

        # The crash loop ends: the contradicted series goes stale and the verified one replaces it.
        later = now + timedelta(seconds=5)
        healed = crashlooping_run(at=later)
        healed = replace(
            healed, running=replace(healed.running, observed=Observed.TRUE, verdict=Verdict.VERIFIED)
        )
        exporter.update([healed], later)
        prom.wait_for(
            'taugrid_run_claim_state{run="llm-pretrain", claim="running"} == 1',
            lambda r: [x["metric"]["verdict"] for x in r] == ["verified"],
            timeout=5,
        )
    finally:
        shutdown(server, thread)


def test_a_missing_prometheus_binary_fails_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="apt-get install"):
        PromServer.start(["127.0.0.1:1"], tmp_path, binary="prometheus-not-installed-here")


def test_a_bad_query_raises_with_prometheus_error_text(prometheus_server: StartPrometheus) -> None:
    prom = prometheus_server([])
    with pytest.raises(RuntimeError, match="bad_data"):
        prom.query("taugrid_run_finished{")
    assert prom.query("vector(1)")[0]["value"][1] == "1"
