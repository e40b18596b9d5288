"""Queued runs' status at fleet size (issue 30): one evaluation pass over every run waiting in a
ClusterQueue, beside a baseline tree in the same run.

The controller attaches each queued run's queue status (`claims.queue_status.queue_status`: its
place, the workloads ahead, the admission estimate from the queue's own history) with one
`Workloads` index shared by every run of the evaluation, as `Controller._with_queue` does. Timed:
CPU per queued run over one pass of all of them, for a ClusterQueue with `--waiting` pending
Workloads (the visibility API's summary) and `--admitted` admitted in the last day. Every tree gets
the same inputs (seeded); each repeat runs each tree in its own process, interleaved.

Usage: .venv/bin/python bench/bench_queue_status.py [--waiting 1000] [--admitted 2000] [--repeats 3]
       [--baseline ef6b4dc]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from baseline import interleaved, median_cell, trees

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _workload(name: str, created: datetime, admitted: datetime | None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if admitted is not None:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": []}
        status["conditions"].append({"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                                     "message": "", "lastTransitionTime": _stamp(admitted)})
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "creationTimestamp": _stamp(created)},
            "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": 1}]}, "status": status}


def measure(waiting: int, admitted: int) -> dict[str, float]:
    from collector.claims.queue_status import Workloads, queue_status
    from collector.correlate import RunEvidence
    from collector.kube import normalize
    from collector.queuefacts import PendingItem, PendingSummary

    rng = random.Random(5)
    records = []
    for i in range(admitted):
        created = NOW - timedelta(minutes=rng.uniform(1, 23 * 60))
        records.append(_workload(f"done-{i}", created,
                                 min(created + timedelta(seconds=rng.choice([5, 90, 600, 3600])),
                                     NOW - timedelta(seconds=1))))
    items = []
    for i in range(waiting):
        records.append(_workload(f"wait-{i}", NOW - timedelta(minutes=rng.uniform(1, 600)), None))
        items.append(PendingItem("team", f"wait-{i}", "lq", rng.randrange(3), i, i))
    recs = [r for o in records if (r := normalize(o).record) is not None]
    summary = PendingSummary("ClusterQueue/cq", tuple(items), NOW)
    lq = normalize({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                    "metadata": {"name": "lq", "namespace": "team", "uid": "uid-lq"},
                    "spec": {"clusterQueue": "cq"}}).record
    evs = [RunEvidence(root=r, workloads=[r], local_queue=lq) for r in recs if r.ref.name.startswith("wait-")]
    took = []
    for _ in range(3):
        shared = Workloads(recs)  # one per evaluation pass, as the controller builds it
        t = time.process_time()
        out = [queue_status(ev, summary, shared, NOW) for ev in evs]
        took.append((time.process_time() - t) / len(evs))
        assert all(q is not None and q.eta.known for q in out)
    return {"us_per_run": statistics.median(took) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waiting", type=int, default=1000)
    ap.add_argument("--admitted", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", default="", help="a commit to measure beside this tree (a temporary worktree)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.json:
        print(json.dumps(measure(a.waiting, a.admitted)))
        return
    with ExitStack() as stack:
        measured = trees(stack, a.baseline, "bench-queue-")
        got: dict[str, list[dict[str, float]]] = interleaved(
            __file__, measured, lambda tree: ["--waiting", str(a.waiting), "--admitted", str(a.admitted)],
            lambda tree: {"PYTHONPATH": str(tree)}, a.repeats, cwd=True)
    print(f"\nqueue status per queued run, CPU µs ({a.waiting} waiting in one ClusterQueue, {a.admitted} admitted in "
          f"the last day; one pass over every waiting run with a shared index; median of {a.repeats} repeats)")
    meds = []
    for name, _ in measured:
        med, cell = median_cell([g["us_per_run"] for g in got[name]], 10, 0)
        meds.append(med)
        print(f"  {name:<12} {cell}")
    if a.baseline:
        print(f"  now/base     x{meds[0] / meds[1]:.3f}")

if __name__ == "__main__":
    main()
