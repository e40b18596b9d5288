"""The live controller against the shipped API simulator, through the official client over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from collector.controller import Controller
from collector.model import Ref, RunClaims
from collector.planes.ray_heads import RaySource, ray_targets_of
from collector.settings import ControllerSettings, Settings, StorageSettings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.clock import ManualClock
from kubesim.server import Simulator, SimulatorSettings
from tests.dumpkit import event, pod, ts
from tests.test_explain_fixtures import taurun

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
# Bookmarks twice a second: a quiet watch still proves itself alive quickly, so tests settle fast.
FAST = SimulatorSettings(bookmark_interval_s=0.5)


Clock = ManualClock  # one clock for simulator and controller, moved only by the test


def wait_until(pred: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def settings(*, storage: StorageSettings | None = None, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(tick=timedelta(seconds=0.2), leader_election=False, log_poll_interval=timedelta(0),
                                ray_poll_interval=timedelta(0),
                                watch_timeout_s=5)
    base.update(kw)
    return Settings(controller=replace(ControllerSettings(), **base), storage=storage or StorageSettings())


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(settings=FAST, watch_window=50)
    s.start()
    try:
        yield s
    finally:
        s.close()


def start(sim: Simulator, clock: Clock, **kw: Any) -> Controller:
    c = Controller(KubeApi(api_client_for(sim.base_url)), settings(**kw), clock.now)
    c.open()
    wait_until(c.ready.is_set, what="controller ready")
    return c


def observed(c: Controller, run: str) -> dict[str, str]:
    rc = next((r for r in c.claims.values() if r.ref.name == run), None)
    return {k: v.observed.value for k, v in rc.claims.items()} if rc else {}


def server_side(obj: dict[str, Any]) -> dict[str, Any]:
    """Like a client sends it: the server assigns uid and resourceVersion. Owner references lose the
    uid the fixture made up (the server gives the owner another; a reference naming a uid no object
    has would be a deleted owner's, and its object no member of the new one's run)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion")}
    if meta.get("ownerReferences"):
        meta["ownerReferences"] = [{k: v for k, v in o.items() if k != "uid"} for o in meta["ownerReferences"]]
    return {**obj, "metadata": meta}


def ensure_namespaces(sim: Simulator, *names: str) -> None:
    for ns in names:
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})


def apply_nodes(sim: Simulator, *names: str) -> None:
    """Ready GPU nodes (a pod on a node nobody sees runs on a node of unknown health)."""
    for n in names:
        sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}, "spec": {},
                   "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                              "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}})


def apply_run(sim: Simulator, name: str, ns: str = "research", *, crash: bool = False, workers: int = 1,
              at: datetime = T0) -> None:
    """`at`: the objects' times are an hour (the crash a minute) before it."""
    ensure_namespaces(sim, ns)
    apply_nodes(sim, *(f"gpu-{i}" for i in range(workers)))
    sim.apply(server_side(taurun(name, ns, "Running", at - timedelta(hours=1), workers=workers)))
    for i in range(workers):
        containers = None
        if crash:
            containers = [{"name": "main", "ready": False, "restartCount": 4,
                           "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                           "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                        "finishedAt": ts(at - timedelta(minutes=1))}}}]
        sim.apply(server_side(pod(f"{name}-w{i}", ns, at - timedelta(hours=1), node=f"gpu-{i}", gpus=8,
                                  ready=not crash, labels={"taugrid.io/run": name}, containers=containers)))


def test_claims_follow_the_cluster(sim: Simulator) -> None:
    clock = Clock(T0)
    apply_run(sim, "llm", workers=2)
    c = start(sim, clock)
    try:
        wait_until(lambda: observed(c, "llm").get("running") == "true", what="running true")
        assert observed(c, "llm")["scheduled"] == "true"
        # The pod starts crash-looping: running turns contradicted without any poll.
        apply_run(sim, "llm", crash=True, workers=1)
        wait_until(lambda: observed(c, "llm").get("running") == "false", what="running false")
        rc = next(r for r in c.claims.values() if r.ref.name == "llm")
        assert rc.running.verdict.value == "contradicted"
        assert "CrashLoopBackOff, last exit OOMKilled (137), 4 restarts" in rc.running.reason
        # A run that appears later is picked up; a deleted root disappears from the export.
        apply_run(sim, "late", ns="team-b")
        wait_until(lambda: observed(c, "late").get("running") == "true", what="late run")
        rt = sim.resource("taugrid.io/v1alpha1", "TauRun")
        sim.store.delete(rt, "team-b", "late")
        wait_until(lambda: not observed(c, "late"), what="late run forgotten")
        assert all(r.name != "late" for r in c.exporter.runs())
    finally:
        c.close()


def test_unreachable_api_fails_closed_on_the_tick(sim: Simulator) -> None:
    clock = Clock(T0)
    apply_run(sim, "llm")
    c = start(sim, clock)
    try:
        wait_until(lambda: observed(c, "llm").get("running") == "true")
        sim.close()  # the API is gone; no event will ever arrive again
        clock.advance(6 * 60)
        wait_until(lambda: observed(c, "llm").get("running") == "unknown", what="unknown after staleness")
        rc = next(r for r in c.claims.values() if r.ref.name == "llm")
        assert rc.scheduled.observed.value == "unknown" and "old" in rc.scheduled.reason
        assert c.health is not None and c.evaluations > 0
    finally:
        c.close()


def drive_changes(sim: Simulator) -> None:
    """The same cluster history for the faulted and the clean controller."""
    ensure_namespaces(sim, "research")
    for i in range(30):
        sim.apply(server_side(event(f"noise-{i}", "research", {"apiVersion": "v1", "kind": "Pod",
                                                   "metadata": {"name": "llm-w0", "uid": "uid-llm-w0"}},
                        "Pulled", f"pulled {i}", T0 - timedelta(seconds=60 - i))))
    apply_run(sim, "llm", crash=True)
    apply_run(sim, "fresh", ns="team-b", workers=2)
    sim.store.delete(sim.resource("v1", "Pod"), "team-b", "gone-w0")


def snapshot(c: Controller) -> dict[str, Any]:
    return {f"{r.ref.namespace}/{r.ref.name}": r.to_json() for r in c.claims.values()}


def settle(c: Controller, since: float | None = None) -> dict[str, Any]:
    """Claims once every reflector has heard from the server after `since` and nothing changes."""
    since = time.monotonic() if since is None else since

    def steady() -> bool:
        if not all(r.last_ok > since for r in c.watch.reflectors):
            return False
        a = snapshot(c)
        time.sleep(0.5)
        return a == snapshot(c) and c._changes.empty()
    wait_until(steady, timeout=45, what="claims settle")
    return snapshot(c)


def test_faults_recover_to_the_claims_of_an_uninterrupted_run(tmp_path: Path) -> None:
    """Claims and exported claim transitions (tests/faults/streams.py) after dropped watches, 500s
    and a 410 storm equal those of a run without faults on the same history."""
    from tests.faults.streams import claim_rows, sink, stream_problems

    results: list[dict[str, Any]] = []
    exported: list[list[dict[str, Any]]] = []
    for faulty in (False, True):
        clock = Clock(T0)
        # One clock for server and controller: server-set timestamps repeat exactly across runs.
        with Simulator(settings=FAST, watch_window=20, clock=clock) as s:
            s.start()
            apply_run(s, "llm")
            apply_run(s, "gone", ns="team-b")
            exporter = sink(tmp_path / str(faulty))
            c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now, sink=exporter)
            c.open()
            wait_until(c.ready.is_set, what="controller ready")
            try:
                def gone_running(c: Controller = c) -> bool:
                    return observed(c, "gone").get("running") == "true"

                wait_until(gone_running)
                if faulty:
                    # Watches cut mid-object, then the API refuses lists and watches while the
                    # history moves on past the retained window (so resuming must relist and diff).
                    s.faults.drop_watch(after_events=0, count=20)
                    s.faults.fail(500, verbs=("list", "watch"), count=None)
                drive_changes(s)
                if faulty:
                    time.sleep(1.0)
                    s.faults.clear()
                    s.faults.gone(6)  # and a 410 storm on the way back, relists included
                    s.faults.gone(1, verbs=("watch",), resources=("pods",))  # one certainly on pods
                results.append(settle(c, since=time.monotonic()))
                if faulty:
                    assert c.skipped == []
                    reg = c.registry
                    relists = reg.get_sample_value("taugrid_collector_relists_total", {"resource": "pods"})
                    errors = sum(reg.get_sample_value("taugrid_collector_errors_total",
                                                      {"source": r.name, "class": "retryable"}) or 0
                                 for r in c.resources)
                    assert relists and relists >= 1, "the pod watch must have relisted"
                    assert errors >= 10, errors
            finally:
                c.close()
                exporter.close()
                exported.append(claim_rows(tmp_path / str(faulty) / "store.duckdb"))
    # The uids are the same in both runs (the simulator derives them from its seed): the same runs.
    # "fresh" was created in three writes while the API refused lists and watches: either controller
    # may or may not have seen it half made.
    assert stream_problems(exported[1], exported[0], final_only=frozenset({"fresh"})) == []
    clean, faulted = results
    assert set(clean) == {"research/llm", "team-b/fresh", "team-b/gone"}
    assert clean["team-b/gone"]["claims"]["scheduled"]["observed"] == "false"  # its pod was deleted
    assert clean["research/llm"]["claims"]["running"]["verdict"] == "contradicted"
    assert _diff(faulted, clean) == []


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_leader_election_exports_from_one_replica(sim: Simulator) -> None:
    clock = Clock(T0)
    apply_run(sim, "llm")
    # A Lease of 4 s, not 1 s: expiry is measured on each replica's own clock, and a leader starved of
    # CPU for a second on a loaded machine lost it mid-test (a standby that exports). Failover below
    # does not wait for it: close() releases the Lease.
    kw = dict(leader_election=True, lease_renew=timedelta(seconds=0.2), lease_duration=timedelta(seconds=4),
              lease_namespace="default")
    a = start(sim, clock, **kw)
    b = start(sim, clock, **kw)
    try:
        wait_until(lambda: a.leader != b.leader, what="one leader")
        wait_until(lambda: any(x.exporter.runs() for x in (a, b)), what="leader exports")
        leader, standby = (a, b) if a.leader else (b, a)
        assert [r.name for r in leader.exporter.runs()] == ["llm"]
        assert standby.exporter.runs() == [] and standby.claims  # warm, but silent
        lease = sim.store.get(sim.resource("coordination.k8s.io/v1", "Lease"), "default",
                              "taugrid-evidence-controller")
        assert lease["spec"]["holderIdentity"] == leader.elector.identity  # type: ignore[union-attr]
        leader.close()
        clock.advance(2)  # the old lease expires by the clock both replicas read
        wait_until(lambda: standby.leader and bool(standby.exporter.runs()), what="failover")
    finally:
        a.close()
        b.close()


def test_odd_objects_are_skipped_and_the_loop_survives(sim: Simulator) -> None:
    clock = Clock(T0)
    apply_run(sim, "llm")
    c = start(sim, clock)
    try:
        weird = pod("odd", "research", T0, node="n", labels={"taugrid.io/run": "llm"})
        weird["status"] = {"phase": "Exploded", "containerStatuses": "not-a-list", "conditions": [{"status": 3}]}
        sim.apply(server_side(weird))
        sim.apply(server_side(event("orphan", "research", {"apiVersion": "v1", "kind": "Pod",
                                                           "metadata": {"name": "never-seen", "uid": "x"}},
                                    "FailedMount", "volume missing", T0)))
        wait_until(lambda: observed(c, "llm").get("running") == "false", what="odd pod counted, not running")
        rc: RunClaims = next(r for r in c.claims.values() if r.ref.name == "llm")
        assert "pod odd Exploded" in rc.running.reason
        assert all(t.is_alive() for t in c._threads)
    finally:
        c.close()


def test_checkpoints_in_expstore_are_durable_progress(sim: Simulator, tmp_path: Any) -> None:
    import os

    clock = Clock(T0)
    ckpt = tmp_path / "ckpt"
    for i, step in enumerate((1000, 2000, 3000)):
        d = ckpt / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 16)
        t = (T0 - timedelta(minutes=30 * (3 - i))).timestamp()
        os.utime(d / "model.safetensors", (t, t))
        os.utime(d, (t, t))
    (ckpt / "checkpoint-4000.tmp").mkdir()  # an unfinished save is not durable
    ensure_namespaces(sim, "research")
    tr = taurun("ft", "research", "Running", T0 - timedelta(hours=2), workers=1)
    tr["spec"]["checkpointUri"] = ckpt.as_uri()
    sim.apply(server_side(tr))
    apply_nodes(sim, "gpu-0")
    sim.apply(server_side(pod("ft-w0", "research", T0 - timedelta(hours=2), node="gpu-0", gpus=8,
                              labels={"taugrid.io/run": "ft"})))
    c = start(sim, clock, checkpoint_poll_interval=timedelta(seconds=0.2),
              storage=StorageSettings(local_roots=frozenset({str(tmp_path)})))  # where checkpoints may be read
    try:
        wait_until(lambda: observed(c, "ft").get("progressing") == "true", what="checkpoint progress")
        rc = next(r for r in c.claims.values() if r.ref.name == "ft")
        assert rc.progressing.reason.startswith("step 3,000 at 11:30:00 (30m")
        assert rc.goodput is not None and rc.goodput.ratio is not None
    finally:
        c.close()


def test_profile_regex_reads_a_custom_trainer(sim: Simulator) -> None:
    clock = Clock(T0)
    apply_run(sim, "custom")  # profile a100-2x8
    for i in range(5):
        at = T0 - timedelta(seconds=50 - 10 * i)
        sim.store.append_log("research", "custom-w0", "main", [f"[{at:%H:%M:%S}] my-trainer step={i + 1} "
                                                                f"objective=0.{9 - i}"], at)
    c = start(sim, clock, log_poll_interval=timedelta(seconds=0.1),
              log_regex_by_profile={"a100-2x8": r"step=(?P<step>\d+) objective=(?P<loss>[\d.]+)"})
    try:
        wait_until(lambda: observed(c, "custom").get("progressing") == "true", what="custom regex progress")
        rc = next(r for r in c.claims.values() if r.ref.name == "custom")
        assert rc.progressing.reason.startswith("step 5 at 11:59:50")
    finally:
        c.close()


def test_ray_targets_come_from_kuberay_status_and_worker_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.kube import normalize
    from collector.planes import ray_heads

    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(ray_poll_interval=timedelta(seconds=15)),
                   lambda: T0)
    rj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "namespace": "ns"},
          "spec": {}, "status": {"rayClusterName": "rc", "jobId": "rj-abc",
                                 "dashboardURL": "rc-head-svc.ns.svc.cluster.local:8265"}}
    rcl = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
           "metadata": {"name": "rc", "namespace": "ns", "ownerReferences": [{"kind": "RayJob", "name": "rj"}]},
           "spec": {}, "status": {"head": {"serviceName": "rc-head-svc"}, "endpoints": {"metrics": "8080"}}}
    workers = [{"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"rc-worker-{i}", "namespace": "ns",
                             "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker"},
                             "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
                                                  "uid": "", "controller": True}]},
                "spec": {"nodeName": "n"}, "status": {"phase": phase, "podIP": f"10.1.0.{i}"}}
               for i, phase in enumerate(("Running", "Running", "Pending"))]
    for obj in (rj, rcl, *workers):
        rec = normalize(obj).record
        assert rec is not None
        c.index.upsert(rec)
    [(root, target)] = ray_targets_of(c.index.evidence(Ref("RayJob", "ns", "rj")), c.cfg)
    assert root.name == "rj" and target.job_id == "rj-abc"
    assert target.dashboard_url == "http://rc-head-svc.ns.svc.cluster.local:8265"
    assert target.metrics_url == "http://rc-head-svc.ns.svc.cluster.local:8080/metrics"
    assert target.worker_metrics_urls == ("http://10.1.0.0:8080/metrics", "http://10.1.0.1:8080/metrics")
    # the ray source tracks a run on each evaluation: its targets are built again only when a record
    # they read was replaced (here a worker's new IP), and dropped when the run finishes
    src = c.sources["ray"]
    assert isinstance(src, RaySource)
    key = Ref("RayJob", "ns", "rj").key
    running = SimpleNamespace(finished=False)
    built: list[int] = []

    def counted(ev: Any, cfg: Any) -> Any:
        built.append(1)
        return ray_targets_of(ev, cfg)
    monkeypatch.setattr(ray_heads, "ray_targets_of", counted)
    src.track(key, c.index.evidence(Ref("RayJob", "ns", "rj")), running)  # type: ignore[arg-type]
    src.track(key, c.index.evidence(Ref("RayJob", "ns", "rj")), running)  # type: ignore[arg-type]
    assert len(built) == 1
    moved = {**workers[1], "status": {"phase": "Running", "podIP": "10.1.0.9"}}
    rec = normalize(moved).record
    assert rec is not None
    c.index.upsert(rec)
    src.track(key, c.index.evidence(Ref("RayJob", "ns", "rj")), running)  # type: ignore[arg-type]
    assert len(built) == 2 and src.targets._by_run[key][0][1].worker_metrics_urls == (
        "http://10.1.0.0:8080/metrics", "http://10.1.0.9:8080/metrics")
    src.track(key, c.index.evidence(Ref("RayJob", "ns", "rj")), SimpleNamespace(finished=True))  # type: ignore[arg-type]
    assert key not in src.targets._by_run and len(src._built) == 0
