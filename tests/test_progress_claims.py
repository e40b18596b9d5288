"""Progressing from several signals: rate, replay after restart, durability, validity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from collector.claims import evaluate
from collector.correlate import Signal, build_index
from collector.kube import normalize
from collector.model import Observed, Plane, Ref
from collector.progress import LogScan, ProgressSample
from collector.settings import ClaimSettings

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
S = ClaimSettings()


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def scan(samples: list[tuple[int, datetime]], fmt: str = "megatron", loss: float | None = 2.0) -> LogScan:
    return LogScan(source="t", format=fmt, lines=len(samples), hangs=(), xids=(), diagnostics=(),
                   samples=tuple(ProgressSample(step, at, loss, i + 1, fmt) for i, (step, at) in enumerate(samples)))


def run_with(*signals: Signal, restarted_at: datetime | None = None,
             sidecars: tuple[str, ...] = ()) -> tuple[object, object]:
    """One running TauRun whose one pod runs `main` (8 GPUs) and `sidecars` (none) on a Ready node."""
    created = NOW - timedelta(hours=3)
    objs = [
        {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
         "metadata": {"name": "r", "namespace": "ns", "uid": "r", "creationTimestamp": ts(created)},
         "spec": {"profile": "p", "workers": 1}, "status": {"phase": "Running"}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "r-0", "namespace": "ns", "uid": "p", "labels": {"taugrid.io/run": "r"},
                      "creationTimestamp": ts(created)},
         "spec": {"nodeName": "n", "containers": [
             {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}},
             *({"name": c} for c in sidecars)]},
         "status": {"phase": "Running", "conditions": [
             {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(created + timedelta(minutes=1))},
             {"type": "Ready", "status": "True", "lastTransitionTime": ts(created + timedelta(minutes=2))}],
             "containerStatuses": [{"name": "main", "ready": True, "restartCount": 1 if restarted_at else 0,
                                    "state": {"running": {}},
                                    "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                                                 "finishedAt": ts(restarted_at)}}
                                    if restarted_at else {}},
                                   *({"name": c, "ready": True, "restartCount": 0, "state": {"running": {}}}
                                     for c in sidecars)]}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "creationTimestamp": ts(created)},
         "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": ts(NOW)}]}},
    ]
    index = build_index(n.record for n in map(normalize, objs) if n.record is not None)
    index.synced.update(dict.fromkeys(("Pod", "TauRun", "Node"), NOW))
    for sig in signals:
        index.set_signal(sig)
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    return evaluate(ev, NOW, S), ev


POD = Ref("Pod", "ns", "r-0")
ROOT = Ref("TauRun", "ns", "r")


def every(start: datetime, first: int, n: int, seconds: float) -> list[tuple[int, datetime]]:
    return [(first + i, start + timedelta(seconds=seconds * i)) for i in range(n)]


def test_checkpoints_add_durability_to_a_progressing_run() -> None:
    logs = Signal(POD, "main", scan(every(NOW - timedelta(minutes=10), 100, 20, 30)), NOW)
    ckpt = Signal(ROOT, "checkpoints", scan([(50, NOW - timedelta(hours=1)), (100, NOW - timedelta(minutes=10))],
                                            fmt="checkpoint", loss=None), NOW, Plane.EXPSTORE, durable=True)
    rc, _ = run_with(logs, ckpt)
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.TRUE
    assert "step 119" in p.reason and "last checkpoint step 100 10m ago" in p.reason
    ck = [e for e in p.evidence if e.field == "last_checkpoint_step"]
    assert ck and ck[0].value == 100 and ck[0].plane is Plane.EXPSTORE


def test_replayed_steps_after_a_restart_are_not_progress() -> None:
    before = every(NOW - timedelta(minutes=40), 100, 60, 20)  # up to step 159, 20 s apart
    restart = NOW - timedelta(minutes=20)
    after = every(restart + timedelta(minutes=2), 120, 30, 20)  # replays 120..149: below the high-water mark
    logs = Signal(POD, "main", scan(before + after), NOW)
    rc, _ = run_with(logs, restarted_at=restart)
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.FALSE and p.reason.startswith("STALLED") and p.cause == "stalled"
    assert "last step 159" in p.reason
    replayed = [e for e in p.evidence if e.field == "replayed_steps"]
    assert replayed and replayed[0].value == 30
    # Once the replay passes the old high-water mark, progress resumes.
    resumed = every(restart + timedelta(minutes=2), 120, 57, 20)  # 120..176, last one 20 s ago... and fresh
    resumed = [(s, t) for s, t in resumed if t <= NOW]
    rc, _ = run_with(Signal(POD, "main", scan(before + resumed), NOW), restarted_at=restart)
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.TRUE, p.reason
    g = rc.goodput  # type: ignore[attr-defined]
    assert g.badput_s["replaying"] > 0 and g.badput_s["restarting"] > 0


def test_checkpoints_alone_use_their_own_cadence() -> None:
    cadence = [(1000 * (i + 1), NOW - timedelta(minutes=30 * (6 - i))) for i in range(6)]  # every 30 min
    ckpt = Signal(ROOT, "checkpoints", scan(cadence, fmt="checkpoint", loss=None), NOW, Plane.EXPSTORE, durable=True)
    rc, _ = run_with(ckpt)
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.TRUE, p.reason  # last checkpoint 30 min ago, window 90 min + scrape
    late = [(s, t - timedelta(hours=2)) for s, t in cadence]
    rc, _ = run_with(Signal(ROOT, "checkpoints", scan(late, fmt="checkpoint", loss=None), NOW, Plane.EXPSTORE,
                            durable=True))
    assert rc.progressing.observed is Observed.FALSE  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_is_not_progress(bad: float) -> None:
    good = every(NOW - timedelta(minutes=5), 1, 9, 30)
    samples = scan(good)
    tail = ProgressSample(10, NOW - timedelta(seconds=10), bad, 10, "megatron")
    logs = Signal(POD, "main", LogScan("t", "megatron", (*samples.samples, tail), (), (), (), 10), NOW)
    rc, _ = run_with(logs)
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.FALSE and "since step 10" in p.reason


@pytest.mark.parametrize(("util", "power", "needle"), [
    (99.0, 71_000.0, "GPUs 99% busy at 71 W → suspected collective hang"),
    (3.0, 60_000.0, "GPUs idle (3% at 60 W)"),
])
def test_gpu_activity_names_the_kind_of_stall(util: float, power: float, needle: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from collector.correlate import RayRuntime
    from collector.sources.ray import gpu_activity

    # As Ray's metrics agent exports NVML readings on a GPU node: per node IP and GPU index.
    text = "".join(
        f'ray_node_gpus_utilization{{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="{i}",ip="10.0.0.7"}} {util}\n'
        f'ray_node_gpu_power_milliwatts{{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="{i}",ip="10.0.0.7"}} '
        f"{power}\n" for i in range(8))
    gpu = gpu_activity(list(text_string_to_metric_families(text)))
    assert gpu == {"gpus": 8, "gpu_utilization": util, "gpu_power_w": power / 1000}
    logs = Signal(POD, "main", scan(every(NOW - timedelta(minutes=30), 100, 20, 30)), NOW)
    created = NOW - timedelta(hours=3)
    objs = [
        {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
         "metadata": {"name": "r", "namespace": "ns", "uid": "r", "creationTimestamp": ts(created)},
         "spec": {"profile": "p", "workers": 0}, "status": {"phase": "Running"}},
        {"apiVersion": "ray.io/v1", "kind": "RayCluster",
         "metadata": {"name": "rc", "namespace": "ns", "labels": {"taugrid.io/run": "r"},
                      "creationTimestamp": ts(created)}, "spec": {}, "status": {"state": "ready"}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "r-0", "namespace": "ns", "labels": {"taugrid.io/run": "r", "ray.io/cluster": "rc"},
                      "creationTimestamp": ts(created)},
         "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
         "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                           "state": {"running": {}}}]}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
    ]
    index = build_index(n.record for n in map(normalize, objs) if n.record is not None)
    index.synced.update(dict.fromkeys(("Pod", "TauRun", "RayCluster", "Node"), NOW))
    index.set_signal(logs)
    index.set_ray(Ref("RayCluster", "ns", "rc"), RayRuntime(1, "RUNNING", "", NOW, **gpu))
    rc = evaluate(index.evidence(ROOT), NOW, S)
    assert rc.progressing.observed is Observed.FALSE and rc.progressing.reason.startswith("STALLED")
    assert rc.progressing.cause == "stalled"
    assert needle in rc.progressing.reason
    assert [e.plane for e in rc.progressing.evidence if e.field == "gpu_utilization"] == [Plane.GPU]
