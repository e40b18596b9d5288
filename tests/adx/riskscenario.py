"""A fleet's week, for the drain advisor and lemon queries: runs' claims from the claim engine (a real
checkpoint directory listed by the local store, Node objects, node agents' GPU readings) written by
the ADX exporter through its spool into the embedded store, with the agents' GPU samples (which run
held which GPU) and XIDs.

Now (NOW, 2026-01-10 12:00): six nodes of 8 GPUs, `gpu-1` … `gpu-6`.
- pretrain on gpu-1 and gpu-2 (4 GPUs each), last checkpoint 2 h ago: 16 GPU-hours at risk; gpu-2 is
  cordoned, and finetune (4 GPUs) there saved 6 h ago: 24 GPU-hours.
- sft on gpu-3 and gpu-4, last checkpoint 30 min ago: 8 GPU-hours; the agent on gpu-3 reports XID 79.
- eval on gpu-5, no checkpoint listing: unknown; gpu-5 was NotReady until an hour ago.
- gpu-6 holds no run; its agent logged XID 48 3 h ago. XID 13 on gpu-1 (an application fault) and
  XID 94 on gpu-4 8 h ago (past the 6 h window) say nothing for the drain.
The week before: GPU-gpu-4-5 is a lemon (XID 94 and a hang in one run, a gpu-spread straggler in
another, XID 48 in a third); gpu-5's runs hung twice (every GPU of it shares that); one hang on
gpu-1, a crash loop on gpu-3 and five application XIDs on gpu-6 recur nowhere.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from collector.claims import evaluate
from collector.correlate import Signal
from collector.model import Observed, Ref, RunClaims, Straggler, Stragglers
from collector.progress import scan_text
from exporters.adx import AdxExporter, ExportSettings, GpuSample, GpuXid
from exporters.adx.embedded import DuckDBTarget
from tests.claims.test_recheck_at import NOW, S, steps, taucluster, taurun
from tests.claims.test_recheck_at import evidence as log_evidence
from tests.claims.test_recheck_at import pod as make_pod
from tests.claims.test_workrisk import gpu_report, listing, node, run_evidence, save, started, with_agents

CLUSTER = "aks-westeurope-1"
NS = "research"


def _pods(prefix: str, nodes: list[str], start_ago: timedelta, gpus: int) -> list[dict[str, Any]]:
    out = []
    for i, n in enumerate(nodes):
        p = started(make_pod(f"{prefix}-{i}", gpus=gpus), start_ago)
        p["spec"]["nodeName"] = n
        out.append(p)
    return out


def _named(rc: RunClaims, name: str) -> RunClaims:
    return replace(rc, ref=Ref("TauRun", NS, name, f"uid-{name}"))


def live_runs(tmp: Path) -> list[RunClaims]:
    nodes = [node("gpu-1"), node("gpu-2", cordoned=True), node("gpu-3"), node("gpu-4"),
             node("gpu-5", ready_since=timedelta(hours=1)), node("gpu-6")]
    out = []
    for name, where, gpus, ckpt, reports in (
            ("pretrain", ["gpu-1", "gpu-2"], 4, timedelta(hours=2), ()),
            ("finetune", ["gpu-2"], 4, timedelta(hours=6), ()),
            ("sft", ["gpu-3", "gpu-4"], 8, timedelta(minutes=30), (gpu_report("gpu-3", "sft-0", xids=(79,)),)),
            ("eval", ["gpu-5"], 8, None, ())):
        objs = [taurun(workers=len(where)), taucluster(timedelta(minutes=1), workers=len(where)),
                *_pods(name, where, timedelta(hours=8), gpus), *nodes]
        sigs = []
        if ckpt is not None:
            d = tmp / name
            save(d, 1000, ckpt)
            sigs.append(listing(d))
        # each run trains: its first pod prints a step every 10 s
        sigs.append(Signal(Ref("Pod", "ns", f"{name}-0", f"{name}-0"), "main",
                           scan_text(steps(*range(300, 0, -10)), source="t"), NOW))
        ev = run_evidence(objs, *sigs)
        rc = evaluate(ev, NOW, S)
        assert rc.progressing.observed is Observed.TRUE, rc.progressing.reason
        if reports:
            reports = tuple(replace(r, namespace="ns") for r in reports)
            rc = with_agents(rc, ev, *reports)
        out.append(_named(rc, name))
    return out


def _hung() -> RunClaims:
    """A run whose NCCL watchdog fired: the engine's own verdict."""
    ev = log_evidence([taurun(), taucluster(timedelta(minutes=1)), make_pod()],
                      log=steps(*range(900, 600, -10), hang_at=30))
    return evaluate(ev, NOW, S)


def _healthy() -> RunClaims:
    ev = log_evidence([taurun(), taucluster(timedelta(minutes=1)), make_pod()], log=steps(*range(300, 0, -10)))
    return evaluate(ev, NOW, S)


def _crashloop() -> RunClaims:
    p = make_pod()
    p["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    p["status"]["containerStatuses"][0]["ready"] = False
    return evaluate(log_evidence([taurun(), taucluster(timedelta(minutes=1)), p]), NOW, S)


# (run, days ago, node, what happened): "hang", "straggler:<gpu index>", "crash", "ok"
HISTORY: tuple[tuple[str, float, str, str], ...] = (
    ("h01", 6, "gpu-4", "hang"),
    ("h02", 4, "gpu-4", "straggler:5"),
    ("h03", 2, "gpu-4", "ok"),
    ("h04", 5, "gpu-5", "hang"),
    ("h05", 3, "gpu-5", "hang"),
    ("h06", 5, "gpu-1", "hang"),
    ("h07", 4, "gpu-6", "ok"),
    ("h08", 3, "gpu-3", "crash"),
    ("h09", 1, "gpu-2", "ok"),
)
HISTORY_XIDS: tuple[tuple[str, float, str, int, int], ...] = (  # (run, days ago, node, GPU index, code)
    ("h01", 6, "gpu-4", 5, 94),
    ("h03", 2, "gpu-4", 5, 48),
    ("h03", 2 - 1 / 86400, "gpu-4", 5, 48),  # the same episode a second later
    *(("h07", 4 - i / 24, "gpu-6", 2, 13) for i in range(5)),
)
NOW_XIDS: tuple[tuple[str, timedelta, str, int, int], ...] = (
    ("sft", timedelta(minutes=5), "gpu-3", 3, 79),
    ("", timedelta(hours=3), "gpu-6", 0, 48),
    ("pretrain", timedelta(minutes=20), "gpu-1", 1, 13),
    ("sft", timedelta(hours=8), "gpu-4", 6, 94),
)


def _uuid(node_name: str, i: int) -> str:
    return f"GPU-{node_name}-{i}"


def history() -> tuple[list[RunClaims], list[GpuSample], list[GpuXid]]:
    hung, healthy, crash = _hung(), _healthy(), _crashloop()
    runs: list[RunClaims] = []
    samples: list[GpuSample] = []
    for name, days, where, what in HISTORY:
        at = NOW - timedelta(days=days)
        base = {"hang": hung, "crash": crash}.get(what, healthy)
        rc = replace(_named(base, name), evaluated_at=at)
        w = rc.work_at_risk
        if w is not None:  # the template ran on node-r-0: this run ran on `where`
            rc = replace(rc, work_at_risk=replace(w, nodes=tuple(replace(n, node=where) for n in w.nodes)))
        if what.startswith("straggler:"):
            i = int(what.split(":")[1])
            rc = replace(rc, stragglers=Stragglers((Straggler("gpu", "", f"{name}-0", where, 0.18, at, "gpu-spread",
                                                              "SM clock apart", gpu=_uuid(where, i)),), 8, 40, "x"))
        runs.append(rc)
        samples += [GpuSample(at, where, i, _uuid(where, i), 97.0, 40 << 30, 600.0, 60.0, NS, f"{name}-0", name)
                    for i in range(8)]
    xids = [GpuXid(NOW - timedelta(days=days), where, code, i, _uuid(where, i), "0000:3b:00.0", "m", "a", NS,
                   f"{name}-0", name) for name, days, where, i, code in HISTORY_XIDS]
    xids += [GpuXid(NOW - ago, where, code, i, _uuid(where, i), "0000:3b:00.0", "m", "a", NS if name else "",
                    f"{name}-0" if name else "", name) for name, ago, where, i, code in NOW_XIDS]
    for name, where in (("pretrain", "gpu-1"), ("pretrain", "gpu-2"), ("sft", "gpu-3"), ("sft", "gpu-4"),
                        ("eval", "gpu-5")):
        samples += [GpuSample(NOW - timedelta(minutes=1), where, i, _uuid(where, i), 97.0, 40 << 30, 600.0, 60.0,
                              NS, f"{name}-{where}", name) for i in range(8)]
    return runs, samples, xids


def play(store: Path, spool_dir: Path, tmp: Path) -> list[RunClaims]:
    """Write the week, then the live runs, through the exporter; returns the live runs' claims."""
    exporter = AdxExporter(ExportSettings(cluster=CLUSTER, spool_dir=spool_dir, snapshot_interval=timedelta(minutes=1)),
                           DuckDBTarget(store))
    exporter.open()
    live = live_runs(tmp)
    try:
        past, samples, xids = history()
        for rc in sorted(past, key=lambda r: r.evaluated_at):
            exporter.claims([rc])
        exporter.claims(live)
        exporter.gpu(samples, xids)
    finally:
        exporter.close()
    return live
