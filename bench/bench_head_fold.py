"""A head's log increment in the live controller (issue 30): the fold into its held history and the
deferral's reads of it, beside a baseline tree in the same run.

Each of `--heads` Ray heads prints a step a second (a Megatron line: step, loss, total); a node agent
sends what each printed since its last pass every 30 s (30 samples, led by the last one before its
cursor), as bench_fleet's `live-heads` does. After `--warm` passes (the histories compacted, as at
fleet size), `--passes` more are timed (thread CPU), per increment:

  fold   `planes.signals.folded` (extend the held history, compact it, keep it packed)
  reads  the deferral's reads of the held and folded histories (`uneventful`, `slowdown_of`: what
         `ChangeApplier._deferred` asks of every head increment before it defers the evaluation)

Heads are folded in turn, so a history is no longer among the packs kept built (HOT) when its next
increment comes, as at fleet size (5,000 heads). The share of a core is at 5,000 heads every 30 s.
`--baseline REF` measures REF's tree (a temporary worktree) in a child process after each repeat of
this tree's; medians of `--repeats`.

Usage: .venv/bin/python bench/bench_head_fold.py [--heads 400] [--warm 6] [--passes 6] [--repeats 5]
                                                [--baseline 43c5dd7]
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from baseline import answer, interleaved, median_cell, tree_args, trees

FLEET_HEADS = 5000
PASS_S = 30
STEPS = 30  # a step a second, a pass every 30 s


def measure(heads: int, warm: int, passes: int) -> dict[str, float]:
    from collector.claims.gpuspread import slowdown_of
    from collector.correlate import Signal
    from collector.model import Ref
    from collector.planes.signals import folded, uneventful
    from collector.progress.model import LogScan, ProgressSample
    from collector.settings import ClaimSettings

    s = ClaimSettings()
    gap = s.stall_floor + s.scrape_interval
    t0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    held: list[Signal | None] = [None] * heads
    lines = [0] * heads
    last: list[ProgressSample | None] = [None] * heads
    fold_s = reads_s = 0.0
    timed = 0
    for p in range(warm + passes):
        for h in range(heads):
            ref = Ref("Pod", "ml", f"run-{h}-head")
            after = lines[h]
            base = p * STEPS
            new = [ProgressSample(base + i + 1, t0 + timedelta(seconds=base + i + 1, microseconds=h),
                                  2.0 + 1 / (base + i + 2), after + 2 * i + 1, "megatron", False, 500_000)
                   for i in range(STEPS)]
            lead: list[ProgressSample] = [x] if (x := last[h]) is not None else []
            scan = LogScan("ray-head", "megatron", tuple(lead + new), (), (), (), after + 2 * STEPS,
                           None, (lead + new)[0].at)
            inc = Signal(ref, "ray-head", scan, t0 + timedelta(seconds=base + STEPS, milliseconds=500))
            prev = held[h]
            c0 = time.thread_time()
            got = folded(prev, inc, "agent-log", after if prev is not None else None, s)
            c1 = time.thread_time()
            assert got is not None
            sig = got[0]
            if prev is not None:
                newest = uneventful(prev, inc, after, gap)
                slowdown_of([sig])
                assert newest is not None
            c2 = time.thread_time()
            if p >= warm:
                fold_s += c1 - c0
                reads_s += c2 - c1
                timed += 1
            held[h], lines[h], last[h] = sig, after + 2 * STEPS, new[-1]
    n = max(1, timed)
    return {"fold_us": fold_s / n * 1e6, "reads_us": reads_s / n * 1e6,
            "kept": float(len(held[0].scan.samples)) if held[0] is not None else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--heads", type=int, default=400)
    ap.add_argument("--warm", type=int, default=6, help="passes before the timed ones (histories compacted)")
    ap.add_argument("--passes", type=int, default=6, help="passes timed")
    tree_args(ap, repeats=5)
    a = ap.parse_args()
    if a.json:
        answer(a.tree, lambda: measure(a.heads, a.warm, a.passes))
        return
    with ExitStack() as stack:
        measured = trees(stack, a.baseline, "bench-head-fold-")
        got: dict[str, list[dict[str, Any]]] = interleaved(
            __file__, measured,
            lambda tree: ["--tree", str(tree), "--heads", str(a.heads), "--warm", str(a.warm),
                          "--passes", str(a.passes)],
            lambda tree: {"PYTHONPATH": str(tree)}, a.repeats)
    rate = FLEET_HEADS / PASS_S
    print(f"\na head's increment ({STEPS} steps) in the controller, CPU µs each ({a.heads} heads, {a.warm} passes "
          f"warm, {a.passes} timed; median of {a.repeats} repeats, each in brackets); core at {FLEET_HEADS:,} heads "
          f"every {PASS_S} s")
    print(f"{'':<8}" + "".join(f"{name:>40}" for name, _ in measured) + ("   now/base" if a.baseline else ""))
    for key, label in (("fold_us", "fold"), ("reads_us", "reads")):
        meds, cells = [], []
        for name, _ in measured:
            med, cell = median_cell([g[key] for g in got[name]], 7, 1)
            meds.append(med)
            cells.append(f"{cell} = {med * rate / 1e6:.4f} core")
        ratio = f"   x{meds[0] / meds[1]:.2f}" if a.baseline else ""
        print(f"{label:<8}" + "".join(f"{x:>40}" for x in cells) + ratio)
    held = ", ".join(f"{name} {got[name][0]['kept']:.0f}" for name, _ in measured)
    print(f"samples held per head after the passes: {held}")


if __name__ == "__main__":
    main()
