"""GPU evidence applied to claims (collector/claims/gpu.py): allocation for scheduled, device-allocation
blocking, lost GPUs, and GPU activity on a stall, fail-closed on stale evidence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from collector.claims import evaluate
from collector.claims.gpu import apply_gpu
from collector.correlate import RunEvidence, Signal, build_index
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.kube import normalize
from collector.model import Observed, Ref, RunClaims, Stage
from collector.progress import LogScan, ProgressSample
from collector.settings import ClaimSettings

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
S = ClaimSettings()
CREATED = NOW - timedelta(hours=3)


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, phase: str = "Running", gpus: int = 8, bound_at: datetime = CREATED) -> dict[str, Any]:
    running = phase == "Running"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"taugrid.io/run": "r"},
                         "creationTimestamp": ts(CREATED)},
            "spec": {"nodeName": f"node-{name}", "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase, "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(bound_at)},
                {"type": "Ready", "status": "True" if running else "False", "lastTransitionTime": ts(bound_at)}],
                "containerStatuses": [{"name": "main", "ready": running, "restartCount": 0,
                                       "state": {"running": {}} if running else
                                       {"waiting": {"reason": "ContainerCreating"}}}]}}


def run(pods: list[dict[str, Any]], *signals: Signal) -> tuple[RunClaims, RunEvidence]:
    objs = [{"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
             "metadata": {"name": "r", "namespace": "ns", "uid": "r", "creationTimestamp": ts(CREATED)},
             "spec": {"profile": "p", "workers": len(pods), "gpusPerWorker": 8}, "status": {"phase": "Running"}},
            *pods]
    index = build_index(n.record for n in map(normalize, objs) if n.record is not None)
    index.synced.update(dict.fromkeys(("Pod", "TauRun"), NOW))
    for sig in signals:
        index.set_signal(sig)
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    return evaluate(ev, NOW, S), ev


def gpus(name: str, n: int = 8, *, at: datetime = NOW, **kw: Any) -> PodGpuEvidence:
    return PodGpuEvidence("ns", name, f"node-{name}", "agent", at,
                          tuple(GpuDevice(f"GPU-{name}-{i}", i, **kw) for i in range(n)), ("main",))


def stalled_signal() -> Signal:
    samples = tuple(ProgressSample(i, NOW - timedelta(hours=1) + timedelta(seconds=10 * i), 2.0, i, "megatron")
                    for i in range(1, 30))
    return Signal(Ref("Pod", "ns", "w0"), "main", LogScan("t", "megatron", samples, (), (), (), 29), NOW)


def test_allocated_gpus_join_the_scheduled_reason() -> None:
    rc, ev = run([pod("w0"), pod("w1")])
    assert rc.scheduled.observed is Observed.TRUE
    out = apply_gpu(rc, ev, {("ns", "w0"): gpus("w0"), ("ns", "w1"): gpus("w1")},
                    {"node-w0": NOW, "node-w1": NOW}, NOW, S)
    assert out.scheduled.observed is Observed.TRUE and "16/16 GPUs allocated" in out.scheduled.reason
    assert any(e.field == "pod-resources devices" for e in out.scheduled.evidence)


def test_bound_pod_without_devices_is_blocked_in_device_allocation() -> None:
    rc, ev = run([pod("w0"), pod("w1", phase="Pending", bound_at=NOW - timedelta(minutes=5))])
    out = apply_gpu(rc, ev, {("ns", "w0"): gpus("w0")}, {"node-w0": NOW, "node-w1": NOW}, NOW, S)
    assert out.scheduled.observed is Observed.FALSE
    assert "w1 bound to node-w1 but holds 0/8 GPUs" in out.scheduled.reason
    assert out.blocked is not None and out.blocked.stage is Stage.DEVICE_ALLOCATION
    assert out.blocked.since == out.scheduled.since == NOW - timedelta(minutes=5), "waiting since the bind"
    assert out.blocked.stage.owner == "Device plugin or DRA"


def test_no_verdict_from_a_node_without_a_fresh_agent_or_within_the_grace() -> None:
    rc, ev = run([pod("w0"), pod("w1", phase="Pending", bound_at=NOW - timedelta(seconds=20))])
    # just bound: the kubelet may not have admitted it yet
    out = apply_gpu(rc, ev, {("ns", "w0"): gpus("w0")}, {"node-w0": NOW, "node-w1": NOW}, NOW, S)
    assert out.scheduled.observed is rc.scheduled.observed
    # the agent on node-w1 was last read too long ago: its silence proves nothing
    rc, ev = run([pod("w0"), pod("w1", phase="Pending", bound_at=NOW - timedelta(minutes=30))])
    out = apply_gpu(rc, ev, {("ns", "w0"): gpus("w0")}, {"node-w0": NOW, "node-w1": NOW - timedelta(hours=1)},
                    NOW, S)
    assert out.scheduled.observed is rc.scheduled.observed and out.blocked == rc.blocked


def test_stall_gets_gpu_activity_and_hang_hint() -> None:
    rc, ev = run([pod("w0")], stalled_signal())
    assert rc.progressing.observed is Observed.FALSE and rc.progressing.reason.startswith("STALLED")
    hung = gpus("w0", utilization=1.0, power_w=71.0, power_limit_w=400.0, hang_hint=True)
    out = apply_gpu(rc, ev, {("ns", "w0"): hung}, {"node-w0": NOW}, NOW, S)
    assert "GPUs 100% busy at 71 W of 400 W" in out.progressing.reason
    assert "suspected collective hang" in out.progressing.reason
    idle = gpus("w0", utilization=0.0, power_w=60.0)
    out = apply_gpu(rc, ev, {("ns", "w0"): idle}, {"node-w0": NOW}, NOW, S)
    assert "GPUs idle (0% at 60 W)" in out.progressing.reason


def test_lost_gpu_is_named_and_stale_evidence_ignored() -> None:
    rc, ev = run([pod("w0")], stalled_signal())
    lost = PodGpuEvidence("ns", "w0", "node-w0", "agent", NOW,
                          (GpuDevice("GPU-a", 0, lost=True, xids=(79,)), GpuDevice("GPU-b", 1, utilization=0.0)))
    out = apply_gpu(rc, ev, {("ns", "w0"): lost}, {"node-w0": NOW}, NOW, S)
    assert "1 GPU(s) lost under the run's pods (XID 79)" in out.running.reason
    assert "lost" in out.progressing.reason
    old = replace_at(lost, NOW - timedelta(hours=1))
    assert apply_gpu(rc, ev, {("ns", "w0"): old}, {"node-w0": NOW - timedelta(hours=1)}, NOW, S) is rc


def replace_at(e: PodGpuEvidence, at: datetime) -> PodGpuEvidence:
    return PodGpuEvidence(e.namespace, e.pod, e.node, e.source, at, e.devices, e.containers)


class _NoWalk(dict[str, datetime]):
    """Every agent's node, as the controller holds them, refusing to be walked."""

    def values(self) -> Any:
        raise AssertionError("every node walked for one run")


def test_a_run_with_no_gpu_evidence_reads_the_newest_agent_read_not_every_node() -> None:
    """A run whose pods have no GPU evidence asks whether any agent was read recently: the controller
    passes the pass's latest read (`ChangeApplier`) rather than each evaluation walking every node (at
    150k pods, 15,000 nodes for each run not yet on GPUs). Same claims either way, fresh or stale."""
    rc, ev = run([pod("w0"), pod("w1", phase="Pending", bound_at=NOW - timedelta(minutes=5))])
    for newest in (NOW, NOW - timedelta(hours=1)):
        nodes = {"node-w0": newest, "node-x": newest - timedelta(minutes=3)}
        assert apply_gpu(rc, ev, {}, _NoWalk(nodes), NOW, S, newest=newest) == apply_gpu(rc, ev, {}, nodes, NOW, S)
    stale = {"node-w0": NOW - timedelta(hours=1)}
    assert apply_gpu(rc, ev, {}, _NoWalk(stale), NOW, S, newest=NOW - timedelta(hours=1)) is rc
