"""The controller's per-run evaluation cost (issue 30), beside a baseline tree in the same run.

A `Controller` (never opened: no API server, no threads) holds bench_controller's fleet: TauRuns of
8 KubeRay GPU pods (~6 KB each as served) on Ready nodes. Its `evaluate` pass is timed, in CPU
time of the thread, per run re-evaluated, in three cases:

  watch   before each pass one pod of every run gets a new status (its restart count bumped, as
          bench_controller's burst writes), applied as the loop applies a watch event
  tick    every run marked dirty with nothing changed (the full pass, a recheck)
  live    with node agents: every pod's GPU readings (8 devices each, an energy window of 2 min: energy
          per step is worked out on each evaluation, as at an agent up 2 min or more) and every trainer's progress
          history (5 passes of 30 Megatron samples, as bench_fleet's `live` hands them on); before
          each pass one trainer of every run gets its next 30 samples (`"agent-log"`)

Only `evaluate` is timed, not the change's application. `--baseline REF` checks REF out into a
temporary worktree and runs this script against that tree's code in a child process after each
repeat of this tree's: both figures come from one invocation, interleaved. Medians of `--repeats`.

Usage: .venv/bin/python bench/bench_run_eval.py [--runs 200] [--passes 5] [--repeats 3] [--baseline 8a3f507]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from baseline import answer, interleaved, median_cell, tree_args, trees

ROOT = Path(__file__).resolve().parents[1]
PODS_PER_RUN = 8
NODES = 256
ENERGY_WINDOW_S = 120.0  # `live`: the devices' energy counter window (seconds before their read)


def measure(runs: int, passes: int, case: str) -> dict[str, float]:
    import orjson
    from bench_controller import bumped, fleet_controller

    from collector.kube import normalize
    from collector.planes.base import Change
    from collector.sources.kube_api import resources_for

    now0 = datetime.now(UTC)
    clock = [now0]
    c, pods = fleet_controller(runs, PODS_PER_RUN, NODES, lambda: clock[0])
    res = {r.kind: r for r in resources_for(c.settings.taugrid)}
    rng = random.Random(7)
    sent: dict[tuple[str, str], int] = {}

    def feed(p: dict[str, Any], t: datetime) -> None:
        from collector.correlate import Signal
        from collector.model import Ref
        from collector.sources.agents import _scan as decode

        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        container = p["spec"]["containers"][0]["name"]
        n0 = sent.get((ns, name), 0)
        start = t - timedelta(seconds=29)
        doc = orjson.loads(orjson.dumps({"format": "megatron", "lines": n0 + 30, "samples": [
            [1000 + n0 + i, (start + timedelta(seconds=i)).isoformat(), rng.uniform(1.5, 3.0), False, 500_000,
             n0 + i + 1] for i in range(30)]}))
        scan = replace(decode(doc, f"{ns}/{name}/{container}"), first_at=start)
        sent[(ns, name)] = n0 + 30
        c._apply(Change("agent-log", None, (Signal(Ref("Pod", ns, name), container, scan, t),
                                            None if n0 == 0 else n0)))

    if case == "live":
        from collector.gpu import GpuDevice, PodGpuEvidence

        for r in range(5):
            clock[0] = now0 + timedelta(seconds=30 * r)
            for p in pods:
                feed(p, clock[0])
        read = clock[0]  # (the agents' pass after the trainers' 150 s of steps)
        gpus, nodes = {}, {}
        for p in pods:
            ns, name, node = p["metadata"]["namespace"], p["metadata"]["name"], p["spec"]["nodeName"]
            # each with an energy counter window, as an agent up a while reads one (its 2 min inside the
            # trainers' steps: energy per step walks their logs on every evaluation)
            devs = tuple(GpuDevice(uuid=f"GPU-{ns}-{name}-{i}", index=i, utilization=rng.uniform(0.85, 1.0),
                                   sm_active=rng.uniform(0.6, 0.9), power_w=(w := rng.uniform(500.0, 700.0)),
                                   power_limit_w=700.0, energy_j=w * ENERGY_WINDOW_S, energy_from_s=ENERGY_WINDOW_S,
                                   energy_to_s=0.0) for i in range(8))
            gpus[(ns, name)] = PodGpuEvidence(ns, name, node, "agent", read, devs, ("main",))
            nodes[node] = read
        try:
            from collector.planes.node_agents import pass_changes
        except ImportError:  # (a baseline tree that takes a pass in one change)
            c._apply(Change("gpu", None, (gpus, nodes, frozenset(gpus))))
        else:
            for ch in pass_changes(gpus, nodes, frozenset(gpus)):
                c._apply(ch)
    c._roots_changed = True
    c.evaluate(full=True)
    assert len(c.claims) == runs, len(c.claims)
    if case == "live":  # (energy per step worked out: its logs walked, not left at a window too short)
        energy = next(iter(c.claims.values())).energy
        assert energy is not None and energy.joules_per_step is not None, energy
    keys = list(c.claims)

    def one(k: int) -> float:
        clock[0] += timedelta(milliseconds=100)
        if case == "tick":
            c._dirty.update(keys)
        for i in range(runs if case != "tick" else 0):
            p = pods[i * PODS_PER_RUN + k % PODS_PER_RUN]
            if case == "live":
                feed(p, clock[0])
            else:
                b = bumped(p, k + 1)
                b["metadata"]["resourceVersion"] = str(k + 2)
                pods[i * PODS_PER_RUN + k % PODS_PER_RUN] = b
                rec = normalize(b).record
                assert rec is not None
                c._upsert(res["Pod"], rec)
        assert len(c._dirty) == runs
        t = time.thread_time()
        c.evaluate()
        return time.thread_time() - t

    one(0)
    took = [one(k + 1) for k in range(passes)]
    return {"us_per_run": statistics.median(took) / runs * 1e6, "best_us_per_run": min(took) / runs * 1e6}


CASES = ("watch", "tick", "live")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--passes", type=int, default=5, help="evaluation passes timed per case and repeat")
    tree_args(ap)
    a = ap.parse_args()
    if a.json:
        answer(a.tree, lambda: {case: measure(a.runs, a.passes, case) for case in CASES})
        return
    with ExitStack() as stack:
        measured = trees(stack, a.baseline, "bench-run-eval-")
        got: dict[str, list[dict[str, dict[str, float]]]] = interleaved(
            __file__, measured, lambda tree: ["--tree", str(tree), "--runs", str(a.runs), "--passes", str(a.passes)],
            lambda tree: {"TAUGRID_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}, a.repeats)
    print(f"\nper-run evaluation, CPU µs per run re-evaluated ({a.runs} runs x {PODS_PER_RUN} pods, "
          f"{a.passes} passes, median of {a.repeats} repeats; per repeat in brackets)")
    print(f"{'case':<8}" + "".join(f"{name:>34}" for name, _ in measured) + ("   now/base" if a.baseline else ""))
    for case in CASES:
        cells = []
        meds = []
        for name, _ in measured:
            med, cell = median_cell([g[case]["us_per_run"] for g in got[name]], 8, 0)
            meds.append(med)
            cells.append(cell)
        ratio = f"   x{meds[0] / meds[1]:.2f}" if a.baseline else ""
        print(f"{case:<8}" + "".join(f"{x:>34}" for x in cells) + ratio)

if __name__ == "__main__":
    main()
