"""The controller reads Kueue's visibility API for the queues runs wait in, with a poller, and exports a
queued run's position (and its admission estimate once the queue has a history)."""

from __future__ import annotations

from collector.controller import Controller
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.clock import ManualClock
from kubesim.engine import ScenarioEngine
from kubesim.scenario import default_scenario_path, load_scenario
from kubesim.server import Simulator, SimulatorSettings
from tests.controller.test_controller import settings, wait_until


def test_a_queued_run_gets_its_position_from_the_visibility_api() -> None:
    spec = load_scenario(default_scenario_path())
    clock = ManualClock(spec.start)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=spec.seed, bookmark_interval_s=0.5)) as sim:
        url = sim.start()
        engine = ScenarioEngine(spec, url, clock=clock)
        engine.step_to(9 * 60)
        c = Controller(KubeApi(api_client_for(url)), settings(), clock.now)
        c.sources["kueue-visibility"].interval_s = 0.2  # (30 s in service)
        c.open()
        try:
            def queued() -> bool:
                rc = next((r for r in c.claims.values() if r.ref.name == "vision-finetune"), None)
                return rc is not None and rc.queue is not None and rc.queue.position_cq is not None

            wait_until(queued, timeout=30, what="vision-finetune's queue position")
            rc = next(r for r in c.claims.values() if r.ref.name == "vision-finetune")
            q = rc.queue
            assert q is not None
            assert (q.cluster_queue, q.local_queue, q.position_cq, q.position_lq) == ("gpu-a100", "a100", 0, 0)
            assert q.source == "Kueue visibility API (ClusterQueue/gpu-a100)"
            assert [(s.flavor, s.resource, s.needed, s.free) for s in q.short] == [("a100", "nvidia.com/gpu", 16, 8)]
            assert not q.eta.known and "admissions" in q.eta.basis  # nine minutes of history: too short
            assert sim.served("get", "clusterqueues/pendingworkloads") >= 1
            # data-prep, preempted at 8m, waits behind it (re-admitted at 10m); the others wait in no queue
            wait_until(lambda: any(r.queue is not None and r.queue.position_cq == 1 for r in c.claims.values()
                                   if r.ref.name == "data-prep"), timeout=30, what="data-prep's position")
            dp = next(r.queue for r in c.claims.values() if r.ref.name == "data-prep")
            assert dp is not None and [a.name for a in dp.ahead] == [q.workload.split("/")[1]]
            assert dict(dp.ahead[0].requests)["nvidia.com/gpu"] == 16  # what the workload ahead asks for
            assert {r.ref.name for r in c.claims.values() if r.queue is not None} == {"vision-finetune", "data-prep"}
            engine.step_to(11 * 60)  # data-prep admitted: its queue status goes, vision-finetune's stays
            wait_until(lambda: {r.ref.name for r in c.claims.values() if r.queue is not None} == {"vision-finetune"},
                       timeout=30, what="data-prep out of the queue")
            wait_until(lambda: b'taugrid_run_queue_position{kind="TauRun",namespace="research",queue="cluster",'
                               b'run="vision-finetune"} 0.0' in c.exporter.exposition(), what="the position exported")
        finally:
            c.close()


def test_queue_names_that_are_no_names_never_reach_an_api_path() -> None:
    """A tenant's Workload names its LocalQueue; the visibility reads refuse what is no object name."""
    from collector.sources.visibility import read_pending

    class Api:
        def __init__(self) -> None:
            self.paths: list[str] = []

        def get_json(self, path: str, params: object = None) -> object:
            self.paths.append(path)
            raise AssertionError("no request expected")

    api = Api()
    summary, why = read_pending(api, "../../api/v1/secrets", "research", "lq?x=1")  # type: ignore[arg-type]
    assert summary is None and api.paths == []
    assert "not a valid ClusterQueue name" in why and "not a valid LocalQueue name" in why
