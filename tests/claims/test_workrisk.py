"""Work at risk (issue 28): GPU-hours since the last durable checkpoint, read from a real checkpoint
directory through the local store; unknown, never 0, without a fresh listing or with a stamp from the
future; node risk signals from the Node objects and the node agents; the fleet's drain advice."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.claims.gpu import apply_gpu
from collector.claims.workrisk import drain_advice
from collector.correlate import RunEvidence, Signal, build_index
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.kube import normalize
from collector.model import Ref, RunClaims
from collector.sources.checkpoints import LocalCheckpointStore, checkpoint_signal
from tests.claims.test_recheck_at import KINDS, NOW, S, pod, taucluster, taurun, ts


def save(root: Path, step: int, ago: timedelta) -> None:
    """A complete Hugging Face checkpoint directory written `ago` before NOW."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    f = d / "model.safetensors"
    f.write_bytes(b"x" * 64)
    t = (NOW - ago).timestamp()
    os.utime(f, (t, t))
    os.utime(d, (t, t))


def listing(root: Path, read_at: datetime = NOW) -> Signal:
    store = LocalCheckpointStore(root)
    return checkpoint_signal(Ref("TauRun", "ns", "r"), store.list(""), read_at)


def node(name: str, *, ready: str = "True", ready_since: timedelta | None = None, cordoned: bool = False,
         created: timedelta = timedelta(days=30)) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "Ready", "status": ready, "reason": "KubeletReady" if ready == "True" else
                            "NodeStatusUnknown", "lastHeartbeatTime": ts(NOW)}
    if ready_since is not None:
        cond["lastTransitionTime"] = ts(NOW - ready_since)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": name, "creationTimestamp": ts(NOW - created)},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [cond], "capacity": {"nvidia.com/gpu": "8"}}}


def started(p: dict[str, Any], ago: timedelta) -> dict[str, Any]:
    p["status"]["startTime"] = ts(NOW - ago)
    return p


def run_evidence(objs: list[dict[str, Any]], *signals: Signal) -> RunEvidence:
    nodes = {o["spec"]["nodeName"] for o in objs if o["kind"] == "Pod" and o["spec"].get("nodeName")}
    have = {o["metadata"]["name"] for o in objs if o["kind"] == "Node"}
    objs = objs + [node(n) for n in sorted(nodes - have)]
    index = build_index([n.record for n in map(normalize, objs) if n.record is not None])
    index.synced.update(dict.fromkeys(KINDS, NOW))
    for sig in signals:
        index.set_signal(sig)
    return index.evidence(Ref("TauRun", "ns", "r"))


def two_pods(start_ago: timedelta = timedelta(hours=2)) -> list[dict[str, Any]]:
    return [taurun(workers=2), taucluster(timedelta(minutes=1), workers=2),
            started(pod("r-0"), start_ago), started(pod("r-1"), start_ago)]


def test_gpu_hours_since_the_last_complete_checkpoint(tmp_path: Path) -> None:
    save(tmp_path, 1000, timedelta(minutes=90))
    save(tmp_path, 2000, timedelta(minutes=30))
    (tmp_path / "checkpoint-3000.tmp").mkdir()  # a save in progress is not durable
    (tmp_path / "checkpoint-3000.tmp" / "x").write_bytes(b"x")
    rc = evaluate(run_evidence(two_pods(), listing(tmp_path)), NOW, S)
    w = rc.work_at_risk
    assert w is not None and w.basis == "checkpoint" and w.checkpoint_step == 2000
    assert w.gpus == 16 and w.gpu_hours == pytest.approx(16 * 0.5)
    assert w.since == NOW - timedelta(minutes=30)
    assert [(n.node, n.gpus, n.score) for n in w.nodes] == [("node-r-0", 8, 0.0), ("node-r-1", 8, 0.0)]
    assert w.nodes[0].gpu_hours == pytest.approx(4.0)
    assert set(w.missing) == {"ecc-trend"}
    doc = rc.to_json()["work_at_risk"]
    assert doc["gpu_hours"] == 8.0 and doc["checkpoint"]["step"] == 2000
    # the clock moves on: more at risk (a pure function of the evidence and the clock)
    later = evaluate(run_evidence(two_pods(), listing(tmp_path, NOW + timedelta(minutes=30))),
                     NOW + timedelta(minutes=30), S).work_at_risk
    assert later is not None and later.gpu_hours == pytest.approx(16.0)


def test_pods_started_after_the_checkpoint_put_only_their_own_time_at_risk(tmp_path: Path) -> None:
    save(tmp_path, 2000, timedelta(hours=3))
    w = evaluate(run_evidence(two_pods(timedelta(minutes=15)), listing(tmp_path)), NOW, S).work_at_risk
    assert w is not None and w.since == NOW - timedelta(minutes=15) and w.gpu_hours == pytest.approx(4.0)
    assert "started" in w.reason


def test_unknown_not_zero_without_fresh_trustworthy_checkpoint_evidence(tmp_path: Path) -> None:
    # no listing read at all
    w = evaluate(run_evidence(two_pods()), NOW, S).work_at_risk
    assert w is not None and w.gpu_hours is None and "no checkpoint evidence" in w.reason
    # a listing older than the evidence bound
    save(tmp_path, 2000, timedelta(minutes=30))
    rc = evaluate(run_evidence(two_pods(), listing(tmp_path, NOW - timedelta(minutes=6))), NOW, S)
    assert rc.work_at_risk is not None and rc.work_at_risk.gpu_hours is None
    assert "old" in rc.work_at_risk.reason and rc.to_json()["work_at_risk"]["gpu_hours"] is None
    # a listing 4 min old is trusted until it ages past the bound: the controller re-evaluates by then
    rc = evaluate(run_evidence(two_pods(), listing(tmp_path, NOW - timedelta(minutes=4))), NOW, S)
    assert rc.work_at_risk is not None and rc.work_at_risk.gpu_hours == pytest.approx(8.0)
    assert rc.recheck_at is not None and rc.recheck_at <= NOW + timedelta(minutes=1)
    # a checkpoint stamped in the future (a storage clock wrong, or a forged time)
    future = tmp_path / "future"
    save(future, 5000, -timedelta(hours=2))
    w = evaluate(run_evidence(two_pods(), listing(future)), NOW, S).work_at_risk
    assert w is not None and w.gpu_hours is None and "future" in w.reason


def test_a_fresh_listing_with_no_checkpoint_puts_everything_since_the_start_at_risk(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-1.tmp").mkdir()
    (tmp_path / "checkpoint-1.tmp" / "x").write_bytes(b"x")
    w = evaluate(run_evidence(two_pods(), listing(tmp_path)), NOW, S).work_at_risk
    assert w is not None and w.basis == "run-start" and w.gpu_hours == pytest.approx(32.0)
    # no pod start time: unknown
    objs = two_pods()
    del objs[2]["status"]["startTime"]
    w = evaluate(run_evidence(objs, listing(tmp_path)), NOW, S).work_at_risk
    assert w is not None and w.gpu_hours is None


def test_finished_runs_and_runs_without_gpus_carry_none(tmp_path: Path) -> None:
    save(tmp_path, 10, timedelta(minutes=5))
    done = evaluate(run_evidence([taurun(phase="Succeeded"), started(pod("r-0"), timedelta(hours=1))],
                                 listing(tmp_path)), NOW, S)
    assert done.finished and done.work_at_risk is None
    cpu = evaluate(run_evidence([taurun(), started(pod("r-0", gpus=0), timedelta(hours=1))], listing(tmp_path)),
                   NOW, S)
    assert cpu.work_at_risk is None and cpu.to_json()["work_at_risk"] is None


def test_node_signals_from_node_objects(tmp_path: Path) -> None:
    save(tmp_path, 2000, timedelta(minutes=30))
    objs = [*two_pods(), node("node-r-0", cordoned=True, ready_since=timedelta(hours=1)),
            node("node-r-1", ready="Unknown", ready_since=timedelta(minutes=3))]
    w = evaluate(run_evidence(objs, listing(tmp_path)), NOW, S).work_at_risk
    assert w is not None
    by = {n.node: n for n in w.nodes}
    assert by["node-r-1"].signals == ("not-ready",) and by["node-r-1"].score == 100.0
    assert set(by["node-r-0"].signals) == {"cordoned", "not-ready-recently"} and by["node-r-0"].score == 55.0
    assert [n.node for n in w.nodes] == ["node-r-1", "node-r-0"]  # the riskiest first
    # a node that joined Ready (not a spell) and a spell older than the lookback are no signal
    objs = [*two_pods(), node("node-r-0", ready_since=timedelta(days=29, hours=23, minutes=55)),
            node("node-r-1", ready_since=timedelta(hours=7))]
    w = evaluate(run_evidence(objs, listing(tmp_path)), NOW, S).work_at_risk
    assert w is not None and all(n.signals == () and n.score == 0 for n in w.nodes)


def gpu_report(node_name: str, pod_name: str, *, xids: tuple[int, ...] = (), lost: bool = False,
               age: timedelta = timedelta(seconds=10)) -> PodGpuEvidence:
    devs = tuple(GpuDevice(uuid=f"GPU-{node_name}-{i}", index=i, utilization=0.99, lost=lost and i == 3,
                           xids=xids if i == 3 else ()) for i in range(8))
    return PodGpuEvidence("ns", pod_name, node_name, "agent", NOW - age, devs)


def with_agents(rc: RunClaims, ev: RunEvidence, *reports: PodGpuEvidence) -> RunClaims:
    gpus = {(r.namespace, r.pod): r for r in reports}
    return apply_gpu(rc, ev, gpus, {r.node: r.read_at for r in reports}, NOW, S)


def test_agent_xids_and_lost_gpus_join_the_node_risk(tmp_path: Path) -> None:
    save(tmp_path, 2000, timedelta(minutes=30))
    ev = run_evidence(two_pods(), listing(tmp_path))
    rc = evaluate(ev, NOW, S)
    out = with_agents(rc, ev, gpu_report("node-r-0", "r-0", xids=(13, 79), lost=True), gpu_report("node-r-1", "r-1",
                                                                                                   xids=(63,)))
    w = out.work_at_risk
    assert w is not None
    by = {n.node: n for n in w.nodes}
    assert set(by["node-r-0"].signals) == {"gpu-lost", "xid-79"} and by["node-r-0"].score == 100.0  # 13: the app's
    assert by["node-r-1"].signals == ("xid-63",) and by["node-r-1"].score == 20.0
    assert any("GPU-node-r-0-3" in r for r in by["node-r-0"].reasons)
    assert (out.scheduled, out.running) != (None, None) and out.work_at_risk != rc.work_at_risk
    # stale readings add nothing
    stale = with_agents(rc, ev, gpu_report("node-r-0", "r-0", xids=(79,), age=timedelta(minutes=6)))
    assert stale.work_at_risk == rc.work_at_risk


def test_uncorrected_ecc_errors_join_the_node_risk_and_xids_say_their_age(tmp_path: Path) -> None:
    save(tmp_path, 2000, timedelta(minutes=30))
    ev = run_evidence(two_pods(), listing(tmp_path))
    rc = evaluate(ev, NOW, S)
    r0 = gpu_report("node-r-0", "r-0")
    r0 = replace(r0, devices=tuple(replace(d, ecc_uncorrected=2) if d.index == 2 else d for d in r0.devices))
    r1 = gpu_report("node-r-1", "r-1", xids=(79,))
    r1 = replace(r1, devices=tuple(replace(d, xid_ages=((79, 3590.0),)) if d.index == 3 else d for d in r1.devices))
    w = with_agents(rc, ev, r0, r1).work_at_risk
    assert w is not None and w.missing == ("ecc-trend",)
    by = {n.node: n for n in w.nodes}
    assert by["node-r-0"].signals == ("ecc-uncorrected",) and by["node-r-0"].score == 50.0
    assert "GPU GPU-node-r-0-2: 2 uncorrected ECC error(s) since its last reset" in by["node-r-0"].reasons
    # first seen 3,590 s before a reading taken 10 s ago: an hour
    assert by["node-r-1"].reasons == ("XID 79 on GPU GPU-node-r-1-3 (node agent, first seen 1h00m ago)",), \
        by["node-r-1"].reasons
    # a count of 0 is no signal
    clean = replace(r0, devices=tuple(replace(d, ecc_uncorrected=0) for d in r0.devices))
    assert with_agents(rc, ev, clean).work_at_risk == rc.work_at_risk


def test_xids_printed_in_the_runs_own_logs_raise_no_node_risk(tmp_path: Path) -> None:
    """A tenant prints what it likes: an XID line in a container's log must not make its node (shared
    with other tenants) look worth draining. Only the node agents' kernel-log and NVML XIDs count."""
    save(tmp_path, 2000, timedelta(minutes=30))
    from collector.progress import scan_text

    log = f"{ts(NOW - timedelta(minutes=20))} NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus\n"
    scan = scan_text(log, source="t")
    assert {x.code for x in scan.xids} == {79}
    ev = run_evidence(two_pods(), listing(tmp_path), Signal(Ref("Pod", "ns", "r-1", "r-1"), "main", scan, NOW))
    w = evaluate(ev, NOW, S).work_at_risk
    assert w is not None and all(n.score == 0 and n.signals == () for n in w.nodes)


def test_stale_node_objects_give_no_signal_and_say_so(tmp_path: Path) -> None:
    save(tmp_path, 2000, timedelta(minutes=30))
    ev = run_evidence([*two_pods(), node("node-r-0", cordoned=True)], listing(tmp_path))
    ev.synced = {**ev.synced, "Node": NOW - timedelta(minutes=6)}
    w = evaluate(ev, NOW, S).work_at_risk
    assert w is not None and w.gpu_hours == pytest.approx(8.0)
    assert all(n.signals == () for n in w.nodes) and "node-objects" in w.missing


def test_drain_advice_ranks_nodes_and_the_runs_to_checkpoint_first(tmp_path: Path) -> None:
    def one(name: str, ckpt_ago: timedelta, nodes: list[dict[str, Any]], reports: tuple[PodGpuEvidence, ...] = (),
            checkpoints: bool = True) -> RunClaims:
        d = tmp_path / name
        d.mkdir()
        save(d, 100, ckpt_ago)
        objs = [*two_pods(), *nodes]
        sigs = (listing(d),) if checkpoints else ()
        ev = run_evidence(objs, *sigs)
        rc = evaluate(ev, NOW, S)
        rc = with_agents(rc, ev, *reports) if reports else rc
        return rc

    a = one("a", timedelta(hours=2), [node("node-r-0", cordoned=True)])
    b = one("b", timedelta(minutes=30), [node("node-r-0", cordoned=True)], (gpu_report("node-r-1", "r-1", xids=(79,)),))
    c = one("c", timedelta(minutes=30), [node("node-r-0", cordoned=True)], checkpoints=False)
    advice = drain_advice([a, b, c])
    assert [(x.node, x.score) for x in advice] == [("node-r-1", 80.0), ("node-r-0", 30.0)]
    cordoned = advice[1]
    # every run has 8 GPUs on node-r-0: a (2 h since its checkpoint) before b (30 min); c unknown, last
    assert [(r.namespace, h) for r, h in cordoned.runs] == [("ns", pytest.approx(16.0)), ("ns", pytest.approx(4.0)),
                                                           ("ns", None)]
    assert cordoned.unknown == 1 and cordoned.gpu_hours == pytest.approx(20.0)
    assert advice[0].signals == ("xid-79",) and advice[0].to_json()["runs"][0]["gpu_hours_at_risk"] == 4.0
    assert drain_advice([replace(a, finished=True)]) == []


def test_explain_text_says_the_work_at_risk_and_the_risky_nodes(tmp_path: Path) -> None:
    from collector.render import render_text

    save(tmp_path, 2000, timedelta(minutes=30))
    objs = [*two_pods(), node("node-r-1", ready="Unknown", ready_since=timedelta(minutes=3))]
    text = render_text([evaluate(run_evidence(objs, listing(tmp_path)), NOW, S)], NOW)
    line = next(x for x in text.splitlines() if x.strip().startswith("work at risk"))
    assert "8.0 GPU-h" in line and "checkpoint step 2000" in line
    assert "node node-r-1 drain risk 100 (8 GPUs, 4.0 GPU-h at risk there): Ready is Unknown" in text
    assert "node-r-0" not in text.split("work at risk")[1]  # no signal: not listed
    unknown = render_text([evaluate(run_evidence(two_pods()), NOW, S)], NOW)
    assert "work at risk  unknown       no checkpoint evidence" in unknown


def test_the_controllers_runs_document_carries_it_back_to_explain(tmp_path: Path) -> None:
    """`explain --controller` decodes the controller's /runs document: work at risk survives the trip."""
    from collector.render import render_text, to_json
    from collector.runsapi import decode_runs

    save(tmp_path, 2000, timedelta(minutes=30))
    objs = [*two_pods(), node("node-r-1", ready="Unknown", ready_since=timedelta(minutes=3))]
    rc = evaluate(run_evidence(objs, listing(tmp_path)), NOW, S)
    import orjson

    _, [(back, _)] = decode_runs(orjson.dumps(to_json([rc], NOW)))
    assert back.work_at_risk == rc.work_at_risk
    assert render_text([back], NOW) == render_text([rc], NOW)


# --- new_node_risk: the same NodeRisk as the dataclass's own __init__ ----------------------------------


def test_node_risk_fields_are_the_class_fields_in_order() -> None:
    from dataclasses import fields

    from collector.riskfacts import NODE_RISK_FIELDS, NodeRisk

    assert tuple(f.name for f in fields(NodeRisk)) == NODE_RISK_FIELDS


@given(node=st.text(max_size=12), score=st.floats(allow_nan=False), signals=st.lists(st.text(max_size=8), max_size=3),
       gpus=st.integers(0, 64), gpu_hours=st.none() | st.floats(allow_nan=False))
def test_new_node_risk_is_the_dataclass_node_risk(node: str, score: float, signals: list[str], gpus: int,
                                                  gpu_hours: float | None) -> None:
    from collector.riskfacts import NodeRisk, new_node_risk

    reasons = tuple(f"why {s}" for s in signals)
    fast = new_node_risk(node, score, tuple(signals), reasons, gpus, gpu_hours)
    slow = NodeRisk(node, score, tuple(signals), reasons, gpus, gpu_hours)
    assert type(fast) is NodeRisk
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow) and fast.to_json() == slow.to_json()
    with pytest.raises(AttributeError):
        fast.score = 1.0  # type: ignore[misc]  # frozen, as the dataclass's
