"""The live path: the controller watches a manager and two configured workers (three simulators,
read through the official client's transport) and a real Prometheus scrapes what it concludes."""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collector.controller import Controller
from collector.model import Observed, RunClaims, Stage
from collector.sources.kube_api import KubeApi, api_client_for, resources_for
from collector.workerwatch import WorkerCluster, parse_worker_spec, workers_from_specs
from kubesim.clock import ManualClock
from kubesim.errors import ApiError
from kubesim.multicluster import MultiClusterSimulation, load_multicluster, multikueue_scenario_path
from tests.controller.test_controller import settings, wait_until
from tests.promserver import PromServer


def test_controller_joins_workers_and_prometheus_sees_it(tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    s = settings()
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path()), clock) as mc:
        mc.step_to(0)
        workers = tuple(WorkerCluster(n, KubeApi(api_client_for(mc.urls[n])), clock.now, resources_for(s.taugrid),
                                      watch_timeout_s=5) for n in ("worker-1", "worker-2"))
        c = Controller(KubeApi(api_client_for(mc.urls["manager"])), s, clock.now, workers=workers)
        try:
            c.open()
            wait_until(c.ready.is_set, what="controller ready")
            wait_until(lambda: all(w.synced for w in workers), what="workers synced")
            mc.step_to(60)

            def claims(run: str) -> RunClaims | None:
                return next((r for r in c.claims.values() if r.ref.name == run), None)

            def running_on_worker() -> bool:
                rc = claims("dispatched")
                return rc is not None and rc.running.observed is Observed.TRUE

            def waiting_again() -> bool:
                rc = claims("dispatched")
                return rc is not None and rc.blocked is not None and rc.blocked.stage is Stage.MULTICLUSTER_DISPATCH

            wait_until(running_on_worker, what="dispatched run judged on worker-1")
            rc = claims("dispatched")
            assert rc is not None
            assert {e.cluster for e in rc.running.evidence} == {"manager", "worker-1"}
            port = c.serve("127.0.0.1", 0)
            with PromServer.start([f"127.0.0.1:{port}"], tmp_path / "prom") as prom:
                prom.wait_for('taugrid_run_claim_state{run="dispatched",claim="running",observed="true"}',
                              timeout=20)
                blocked = prom.wait_for('taugrid_run_blocked{stage="multicluster-dispatch"}',
                                        lambda r: len(r) == 2, timeout=20)
                assert {b["metric"]["run"] for b in blocked} == {"waiting", "not-admitted-there"}
                assert {b["metric"]["owner"] for b in blocked} == {"MultiKueue"}
                prom.wait_for("taugrid_environment_supported == 1", timeout=20)

                mc.step_to(130)  # worker-2 upgraded to another minor; worker-1 lost the run
                c.sources["environment"].poller.check_once()
                skew = prom.wait_for("taugrid_environment_violation == 1", timeout=20)
                assert [(v["metric"]["checked_cluster"], v["metric"]["check"], v["metric"]["reason"])
                        for v in skew] == [("worker-2", "kubernetes", "skew")]
                prom.wait_for("taugrid_environment_supported == 0", timeout=20)
                wait_until(waiting_again, what="the lost run waits for a worker again")
        finally:
            c.close()


def test_workers_from_kubeconfig_specs(tmp_path: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    s = settings()
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path()), clock) as mc:
        configs = mc.write_kubeconfigs(tmp_path)
        workers = workers_from_specs([f"worker-1={configs['worker-1']}", f"worker-2={configs['worker-2']}#worker-2"],
                                     clock.now, resources_for(s.taugrid))
        assert [w.name for w in workers] == ["worker-1", "worker-2"]
        assert workers[1].api.get_json("/version")["gitVersion"] == "v1.31.4"
        with pytest.raises(ValueError, match="given twice"):
            workers_from_specs([f"w={configs['worker-1']}", f"w={configs['worker-2']}"], clock.now, ())
    for bad in ("worker-1", "=x", "w="):
        with pytest.raises(ValueError, match="NAME=KUBECONFIG"):
            parse_worker_spec(bad)


def test_worker_changes_reach_claims_without_a_tick_and_worker_errors_are_counted() -> None:
    """A change seen only on a worker re-evaluates the run dispatched there at once (the full tick is
    an hour here), and a worker that cannot be read counts in taugrid_collector_errors_total."""
    clock = ManualClock(datetime.now(UTC))
    s = settings(tick=timedelta(hours=1))
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path()), clock) as mc:
        mc.step_to(0)
        workers = tuple(WorkerCluster(n, KubeApi(api_client_for(mc.urls[n])), clock.now, resources_for(s.taugrid),
                                      watch_timeout_s=5) for n in ("worker-1", "worker-2"))
        dead = WorkerCluster("worker-gone", KubeApi(api_client_for("http://127.0.0.1:9")), clock.now,
                             resources_for(s.taugrid), watch_timeout_s=5)
        c = Controller(KubeApi(api_client_for(mc.urls["manager"])), s, clock.now, workers=(*workers, dead))
        try:
            c.open()
            wait_until(c.ready.is_set, what="controller ready")
            wait_until(lambda: all(w.synced for w in workers), what="workers synced")
            mc.step_to(60)

            def running() -> Observed | None:
                rc = next((r for r in c.claims.values() if r.ref.name == "dispatched"), None)
                return rc.running.observed if rc is not None else None

            wait_until(lambda: running() is Observed.TRUE, what="dispatched run judged running on worker-1")
            evaluations = c.evaluations
            for i in range(8):  # only the worker changes: the run's pods there are deleted
                with suppress(ApiError):
                    mc.clients["worker-1"].delete("v1", "Pod", "ml", f"dispatched-{i}")
            wait_until(lambda: running() is not Observed.TRUE, what="the worker's pods gone reach the claim")
            assert c.evaluations > evaluations
            errors = c.registry.get_sample_value(
                "taugrid_collector_errors_total", {"source": "worker:worker-gone", "class": "retryable"})
            wait_until(lambda: (c.registry.get_sample_value(
                "taugrid_collector_errors_total", {"source": "worker:worker-gone", "class": "retryable"}) or 0) > 0,
                what="the unreadable worker's errors counted")
            assert errors is not None  # the series exists from the start
        finally:
            c.close()
