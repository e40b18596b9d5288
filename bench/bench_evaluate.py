"""One run's claim evaluation, as the live controller repeats it, beside a baseline tree in the same run.

A TauRun whose workers are an Indexed Job's pods on Ready nodes, 32 Events, and each pod's log (64
Megatron lines stamped as `kubectl logs --timestamps` writes them, read as the controller reads a
tail): `evaluate` is timed on it many times at 1, 8 and 64 workers: on the same evidence ("same"),
and with one pod's log a step apart before each call ("1 new"), the way the live controller evaluates
a run after each log poll (a new scan for that container, the others' as they were); the median
of 5 repeats, in CPU time of the process (a shared machine's load stretches wall time, not this).
`--baseline REF` checks out REF (a commit) into a temporary worktree and runs this
same script against that tree's `collector` as its own process, so both figures come from one
invocation on one machine.

Usage: .venv/bin/python bench/bench_evaluate.py [--calls 400] [--baseline 5832e10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from baseline import baseline_tree

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 5


def _objects(workers: int, now: datetime) -> list[dict[str, Any]]:
    t0 = now - timedelta(hours=2)

    def ts(t: datetime) -> str:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")

    def meta(name: str, uid: str, **kw: Any) -> dict[str, Any]:
        return {"name": name, "namespace": "research", "uid": uid, "creationTimestamp": ts(t0), **kw}

    run = {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun", "metadata": meta("llm", "uid-llm"),
           "spec": {"profile": "p", "workers": workers, "gpusPerWorker": 8}, "status": {"phase": "Running"}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": meta("llm-job", "uid-job", labels={"taugrid.io/run": "llm"}),
           "spec": {"parallelism": workers, "completions": workers, "completionMode": "Indexed"},
           "status": {"active": workers, "ready": workers}}
    out: list[dict[str, Any]] = [run, job]
    for i in range(workers):
        labels = {"taugrid.io/run": "llm", "batch.kubernetes.io/job-name": "llm-job",
                  "batch.kubernetes.io/job-completion-index": str(i)}
        owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "llm-job", "uid": "uid-job", "controller": True}]
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": meta(f"llm-job-{i}-abcde", f"uid-p{i}", labels=labels, ownerReferences=owner),
                    "spec": {"nodeName": f"gpu-{i}", "containers": [
                        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
                    "status": {"phase": "Running", "startTime": ts(t0),
                               "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(t0)},
                                              {"type": "Ready", "status": "True", "lastTransitionTime": ts(t0)}],
                               "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                                      "state": {"running": {"startedAt": ts(t0)}}}]}})
        out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i}"},
                    "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": ts(now)}],
                               "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}})
    for k in range(32):
        out.append({"apiVersion": "v1", "kind": "Event",
                    "metadata": meta(f"llm-job-{k % workers}-abcde.{k:x}", f"ev{k}"),
                    "involvedObject": {"kind": "Pod", "name": f"llm-job-{k % workers}-abcde", "namespace": "research"},
                    "reason": "Unhealthy", "message": "Readiness probe failed", "type": "Warning",
                    "firstTimestamp": ts(now - timedelta(minutes=k)), "lastTimestamp": ts(now - timedelta(minutes=k)),
                    "count": 1})
    return out


def _log(now: datetime, first: int) -> str:
    lines = []
    for j in range(64):
        t = now - timedelta(seconds=10 * (64 - j))
        lines.append(f"{t.strftime('%Y-%m-%dT%H:%M:%S.%f')}123Z  iteration {first + j:>8}/  250000 | consumed "
                     f"samples: {(first + j) * 1024:>12} | elapsed time per iteration (ms): 10012.2 | learning rate: "
                     "9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 |")
    return "\n".join(lines) + "\n"


def measure(calls: int) -> dict[str, float]:
    from collector.claims import evaluate
    from collector.correlate import Signal, build_index
    from collector.kube import normalize
    from collector.model import Ref
    from collector.progress import scan_text
    from collector.settings import ClaimSettings

    now = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    s = ClaimSettings()
    out: dict[str, float] = {}
    for workers in (1, 8, 64):
        records = [n.record for n in map(normalize, _objects(workers, now)) if n.record is not None]
        index = build_index(records)
        index.synced.update(dict.fromkeys(("Pod", "Node", "Event", "TauRun", "Job"), now))
        for i in range(workers):
            index.set_signal(Signal(Ref("Pod", "research", f"llm-job-{i}-abcde"), "main",
                                    scan_text(_log(now, 1000), source="b"), now))
        ev = index.evidence(Ref("TauRun", "research", "llm"))
        rc = evaluate(ev, now, s)
        assert rc.progressing.observed.value == "true", rc.progressing.reason
        took = []
        for _ in range(REPEATS):
            t = time.process_time()
            for _ in range(calls):
                evaluate(ev, now, s)
            took.append((time.process_time() - t) / calls)
        out[f"{workers} workers, same"] = statistics.median(took) * 1e6
        # per pod, its log and the same log a step later (the last step at `now`), swapped in one pod at
        # a time: each evaluation follows one container's poll that brought a step (or took it back)
        newer = scan_text(_log(now + timedelta(seconds=10), 1001), source="b")
        copies = [(sig, replace(sig, scan=replace(newer))) for sig in ev.signals]
        took = []
        for r in range(REPEATS):
            t = time.process_time()
            for k in range(r * calls, (r + 1) * calls):  # (k runs on across repeats: each call swaps)
                i = k % len(copies)
                ev.signals[i] = copies[i][(k // len(copies)) % 2 ^ 1]
                evaluate(ev, now, s)
            took.append((time.process_time() - t) / calls)
        out[f"{workers} workers, 1 new"] = statistics.median(took) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--baseline", default="", help="a commit to measure beside this tree (a temporary worktree)")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree))
    here = measure(args.calls)
    if args.json:
        print(json.dumps(here))
        return
    base: dict[str, float] = {}
    if args.baseline:
        with baseline_tree(args.baseline, "bench-evaluate-") as tree:
            done = subprocess.run([sys.executable, __file__, "--tree", str(tree), "--calls", str(args.calls),
                                   "--json"], capture_output=True, text=True, check=True)
            base = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"evaluate() of one running run, median of {REPEATS} × {args.calls} calls (CPU µs per evaluation)")
    print(f"{'run':<20} {'this tree':>10} {'baseline ' + args.baseline if args.baseline else '':>20}")
    for k, v in here.items():
        b = base.get(k)
        print(f"{k:<20} {v:>10.0f} {f'{b:.0f} ({v / b:.2f}×)' if b else '':>20}")


if __name__ == "__main__":
    main()
