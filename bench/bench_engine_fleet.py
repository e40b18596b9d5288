"""The scenario engine's per-pod placement and per-submission queue status at fleet size, without HTTP.

At 5,000 runs on 5,600 nodes the engine places each of ~45,000 GPU pods and recounts every Kueue
queue on each of ~10,000 submissions and admissions. Placement: the baseline (the code before the
fix, kept here, measured in the same run) filtered and sorted every node per pod; the engine now
scans a cached candidate list once, without sorting, and picks the same node (checked here). Queue
status: the baseline (kept here) recounted every run per queue on each call; the engine now keeps
the counts as runs' flags change (QueueTally) and a sync reads them (the same counts: checked here).
Times are wall clock per call, with the thread's CPU time beside them.

Usage: .venv/bin/python bench/bench_engine_fleet.py [--scenario kubesim/scenarios/fleet.yaml] [--calls 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubesim import ScenarioEngine, load_scenario  # noqa: E402
from kubesim.engine import NodeState, PodState, Ref, RunState  # noqa: E402


def pick_before(eng: ScenarioEngine, r: RunState, pod: PodState) -> str:
    ready = [n for n in eng.nodes.values() if n.ready]
    flavor = next((c.flavor for c in eng.scenario.cluster_queues if c.name == r.spec.cluster_queue), "")
    gpu = [n for n in ready if n.spec.gpus]
    matching = [n for n in gpu if flavor and flavor.lower() in n.spec.gpu_product.lower()]
    gpu = sorted(matching or gpu, key=lambda n: n.gpus_used)
    fits = [n for n in gpu if n.spec.gpus - n.gpus_used >= pod.gpus]
    return (fits or gpu or ready)[0].spec.name


def queue_counts(eng: ScenarioEngine) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for cq in eng.scenario.cluster_queues:
        runs = [r for r in eng.runs.values() if r.spec.cluster_queue == cq.name and r.submitted and not r.finished]
        admitted = [r for r in runs if r.admitted]
        out.append((len(runs), len(admitted), sum(r.spec.workers * r.spec.gpus_per_worker for r in admitted)))
    for lq in eng.scenario.local_queues:
        runs = [r for r in eng.runs.values()
                if r.spec.queue == lq.name and r.spec.namespace == lq.namespace and r.submitted and not r.finished]
        out.append((len(runs), sum(1 for r in runs if r.admitted)))
    return out


def tally_counts(eng: ScenarioEngine) -> list[tuple[int, ...]]:
    """What a queue status sync reads now: the engine's kept counts, in queue_counts' shape."""
    out: list[tuple[int, ...]] = []
    for cq in eng.scenario.cluster_queues:
        c = eng._queues.cluster.get(cq.name)
        out.append((c.active, c.admitted, c.gpus) if c else (0, 0, 0))
    for lq in eng.scenario.local_queues:
        c = eng._queues.local.get((lq.namespace, lq.name))
        out.append((c.active, c.admitted) if c else (0, 0))
    return out


def timed(fn: Any, calls: int) -> tuple[float, Any]:
    t = time.perf_counter()
    for _ in range(calls):
        out = fn()
    return (time.perf_counter() - t) / calls, out


def cpu_timed(fn: Any, calls: int) -> float:
    """The thread's CPU time per call (the machine is shared: wall time alone can mislead)."""
    t = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=ROOT / "kubesim" / "scenarios" / "fleet.yaml")
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    sc = load_scenario(a.scenario)
    eng = ScenarioEngine(sc, "http://127.0.0.1:1")  # no request is made: the state is filled in directly
    for spec in sc.nodes:
        eng.nodes[spec.name] = NodeState(spec, Ref("v1", "Node", "", spec.name))
    for k, run_spec in enumerate(sc.runs):  # mid-fleet: every run submitted, most admitted, nodes half used
        state = eng.runs[(run_spec.namespace, run_spec.name)] = RunState(run_spec, submitted=True,
                                                                         admitted=k % 50 != 0)
        eng._queues.track(state)
    for k, node in enumerate(eng.nodes.values()):
        node.gpus_used = (k * 7) % 5 if node.spec.gpus else 0
    r = next(iter(eng.runs.values()))
    pod = PodState(Ref("v1", "Pod", r.spec.namespace, "p"), "worker", 0, "ray-worker", r.spec.image, 1)
    pick0, node0 = timed(lambda: pick_before(eng, r, pod), a.calls)
    pick1, node1 = timed(lambda: eng._pick_node(r, pod, []), a.calls)
    cnt0, c0 = timed(lambda: queue_counts(eng), a.calls)
    cnt1, c1 = timed(lambda: tally_counts(eng), a.calls * 100)
    cpu0 = cpu_timed(lambda: queue_counts(eng), a.calls)
    cpu1 = cpu_timed(lambda: tally_counts(eng), a.calls * 100)

    def flip() -> None:  # a preemption and a re-admission: two flag writes, each folded into the counts
        r.admitted = not r.admitted

    upd, _ = timed(flip, a.calls * 100)
    assert node0 == node1, (node0, node1)
    assert c0 == c1, (c0, c1)
    gpu_pods = sum(s.workers for s in sc.runs)
    queue_calls = 2 * len(sc.runs)  # each submission and each admission recounts the queues
    print(f"{a.scenario.name}: {len(sc.runs)} runs, {len(sc.nodes)} nodes, {gpu_pods} GPU pods")
    print(f"{'':<28} {'before ms':>10} {'after ms':>9} {'before s/fleet':>15} {'after s/fleet':>14}")
    print(f"{'placement, per pod':<28} {pick0 * 1e3:>10.2f} {pick1 * 1e3:>9.2f} {pick0 * gpu_pods:>15.0f} "
          f"{pick1 * gpu_pods:>14.0f}")
    print(f"{'queue status, per call':<28} {cnt0 * 1e3:>10.2f} {cnt1 * 1e3:>9.4f} {cnt0 * queue_calls:>15.0f} "
          f"{cnt1 * queue_calls:>14.3f}")
    print(f"{'  (thread CPU)':<28} {cpu0 * 1e3:>10.2f} {cpu1 * 1e3:>9.4f} {cpu0 * queue_calls:>15.0f} "
          f"{cpu1 * queue_calls:>14.3f}")
    print(f"{'queue flag write (tally)':<28} {'-':>10} {upd * 1e3:>9.4f} {'-':>15} {upd * 3 * len(sc.runs):>14.3f}"
          "  (3 writes per run)")
    print(f"same node chosen ({node1}); same queue counts {c0}")


if __name__ == "__main__":
    main()
