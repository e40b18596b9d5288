"""The idle window's steady costs at fleet size (issue 30: the controller alone, idle ≤ 0.15 core at
50k pods), beside a baseline tree in the same run. Each figure is CPU time of the calling thread,
median over passes, then over repeats:

  plan      one API log pass of the poller (ApiLogPoller.run_pass) over 38,754 containers at the
            default ceiling (2,000 GETs), the backlog drained as in bench_fleet's idle window (most
            containers due and waiting): planning, the 2,000 asks and their (empty) answers, the
            settling. The reads answer at once with nothing (no scan): what is timed is the polling
            thread's own work. `gc0` is the generation-0 collections a pass triggers at the
            controller's thresholds (Controller.open: tune_gc)
  roots     a full pass's listing of the runs: `Controller._mark_all` and the first slice's
            `RunIndex.roots` (nothing moved a link between them)
  evidence  `RunIndex.evidence` of every run, a full pass after 25 new Events (Warnings about pods)
            and as many old ones gone since the last, as the loop applies them

`--baseline REF` measures REF's tree (a temporary worktree), `--before-tree DIR` a tree already
unpacked (e.g. `git archive <commit> | tar -x -C DIR`); each in a child process after each repeat
of this tree's.

Usage: .venv/bin/python bench/bench_idle_loop.py [--runs 4000] [--passes 6] [--repeats 3] [--before-tree DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import threading
import time
import zlib
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from baseline import answer, interleaved, median_cell, tree_args, trees

ROOT = Path(__file__).resolve().parents[1]
PODS_PER_RUN = 12
TARGETS = 38_754  # bench_fleet's log containers at 48,500 pods
NODES = 512


def plan(passes: int) -> dict[str, float]:
    from collector.logrotation import slot_of
    from collector.model import Ref
    from collector.sources.logs import ApiLogPoller, ApiLogSettings

    class Api:
        def get_text(self, path: str, query: Any) -> bytes:
            return b""

    rng = random.Random(3)
    targets: list[tuple[Ref, str, str, int, int]] = []
    run = 0
    while len(targets) < TARGETS:
        ns = f"team-{run % 60}"
        slot = slot_of(f"TauRun\x1f{ns}\x1frun-{run}")
        for p in range(PODS_PER_RUN):
            ref = Ref("Pod", ns, f"run-{run:05d}-w{p:02d}", f"uid-{run}-{p}")
            for c in ("main", "sidecar")[: 2 if p % 4 == 0 else 1]:
                targets.append((ref, c, "", 0, slot))
        run += 1
    del targets[TARGETS:]
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    poller = ApiLogPoller(Api(), ApiLogSettings(max_gets=2000, concurrency=4), lambda: now[0])  # type: ignore[arg-type]
    poller.open()
    held_keys = {(ref.namespace, ref.name, c) for ref, c, *_ in targets if rng.random() < 0.97}
    stop = threading.Event()
    # A third of the runs' claims stand past the next pass (`quiet_until`)
    quiet = {(ref.namespace, ref.name): now[0] + timedelta(minutes=5) for ref, *_ in targets
             if zlib.crc32(ref.name.encode()) % 3 == 0}
    collections = [0]

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            collections[0] += 1

    gc.set_threshold(100_000, 50, 100)  # as Controller.open (tune_gc)
    gc.callbacks.append(counted)
    took, gc0 = [], []
    try:
        for n in range(passes + 4):  # the first passes read every container once (the backlog drains)
            now[0] += timedelta(seconds=30)
            collections[0] = 0
            t = time.thread_time()
            for _ in poller.run_pass(targets, agent_pods=frozenset(), stop=stop, quiet=quiet,
                                     held=lambda ref, c: (ref.namespace, ref.name, c) in held_keys):
                pass
            if n >= 4:
                took.append(time.thread_time() - t)
                gc0.append(collections[0])
    finally:
        gc.callbacks.remove(counted)
        poller.close()
    return {"ms": statistics.median(took) * 1e3, "gc0": statistics.median(gc0), "due": poller.last_pass.due}


def index_cases(runs: int, passes: int) -> dict[str, dict[str, float]]:
    from bench_controller import fleet_controller, run_name

    from collector.kube import normalize
    from collector.sources.kube_api import resources_for
    from tests.dumpkit import event

    now0 = datetime(2026, 1, 1, tzinfo=UTC)
    c, _ = fleet_controller(runs, PODS_PER_RUN, NODES, lambda: now0, ready=False)
    res = {r.kind: r for r in resources_for(c.settings.taugrid)}
    created = now0 - timedelta(hours=3)
    idx = c.index
    roots = idx.roots()
    assert len(roots) == runs, len(roots)
    for r in roots:
        idx.evidence(r)  # as after the first full pass
    listing, evidence = [], []
    rng = random.Random(5)
    events: list[Any] = []
    for n in range(passes):
        # a fleet's Events meanwhile (bench_fleet's idle window: ~100 in 150 s, a full pass every ~40 s):
        # 25 new Warnings about pods, the oldest gone (each applied as the loop applies a watch event)
        for e in range(25):
            i = rng.randrange(runs)
            ns, run = run_name(i)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{run}-raycluster-worker-01", "uid": ""}}
            events.append(normalize(event(f"ev-{n}-{e}", ns, pod, "BackOff", "Back-off restarting failed container",
                                          created, type_="Warning")).record)
            c._upsert(res["Event"], events[-1])
        while len(events) > 50:
            c._delete_ref(res["Event"], events.pop(0).ref)
        t = time.thread_time()
        c._mark_all()
        listed = {ref.key: ref for ref in idx.roots()}
        listing.append(time.thread_time() - t)
        c._dirty.clear()
        t = time.thread_time()
        for r in listed.values():
            idx.evidence(r)
        evidence.append(time.thread_time() - t)
    return {"roots": {"ms": statistics.median(listing) * 1e3},
            "evidence": {"ms": statistics.median(evidence) * 1e3,
                         "us_per_run": statistics.median(evidence) / runs * 1e6}}


CASES = ("plan", "roots", "evidence")


def measure(runs: int, passes: int) -> dict[str, dict[str, float]]:
    out = {"plan": plan(passes)}
    out.update(index_cases(runs, passes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--passes", type=int, default=6, help="passes timed per case and repeat")
    tree_args(ap, before_tree=True)
    a = ap.parse_args()
    if a.json:
        answer(a.tree, lambda: measure(a.runs, a.passes))
        return
    with ExitStack() as stack:
        measured = trees(stack, a.baseline, "bench-idle-", a.before_tree)
        got: dict[str, list[dict[str, dict[str, float]]]] = interleaved(
            __file__, measured, lambda tree: ["--tree", str(tree), "--runs", str(a.runs), "--passes", str(a.passes)],
            lambda tree: {"PYTHONPATH": f"{tree}{os.pathsep}{ROOT / 'bench'}"}, a.repeats)
    print(f"\nidle-window costs, CPU ms of the calling thread ({TARGETS} log containers; {a.runs} runs x "
          f"{PODS_PER_RUN} pods; median of {a.passes} passes, then of {a.repeats} repeats, per repeat in brackets)")
    head = "".join(f"{name[-30:]:>34}" for name, _ in measured)
    print(f"{'case':<10}{head}" + ("   now/base" if len(measured) > 1 else ""))
    for case in CASES:
        meds = []
        cells = []
        for name, _ in measured:
            med, cell = median_cell([g[case]["ms"] for g in got[name]], 8, 1)
            meds.append(med)
            cells.append(cell)
        ratio = f"   x{meds[0] / meds[1]:.2f}" if len(measured) > 1 else ""
        print(f"{case:<10}" + "".join(f"{x:>34}" for x in cells) + ratio)
    for name, _ in measured:
        g = got[name]
        print(f"  {name[-30:]}: plan gen-0 collections a pass {statistics.median(x['plan']['gc0'] for x in g):.1f}, "
              f"due {statistics.median(x['plan']['due'] for x in g):.0f}; evidence "
              f"{statistics.median(x['evidence']['us_per_run'] for x in g):.1f} µs a run")


if __name__ == "__main__":
    main()
