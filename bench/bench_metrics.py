"""`/metrics` at fleet size: client_python rendering every scrape (baseline) vs the prepared text.

Builds N runs' claims (half running with progress and goodput, half blocked in a queue: the two
shapes with the most series), then times, in thread CPU seconds:
  baseline      generate_latest(registry): every series formatted per scrape (the previous path)
  rebuild       render(registry) on the first scrape after the claims or the clock changed
  cached        render(registry) on a scrape with nothing changed
  update        ClaimsExporter.update of all N runs (the loop's share: lines prepared per run)
and counts the series, per run and in all.

Usage: .venv/bin/python bench/bench_metrics.py [--runs 5000]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from collector.model import Ref  # noqa: E402
from exporters.prometheus import ClaimsExporter, HealthMetrics, new_registry, render  # noqa: E402
from tests.exporters.exporter_samples import T0, blocked_run, crashlooping_run  # noqa: E402


def timed(fn: object, n: int) -> tuple[float, bytes]:
    out = b""
    t = time.thread_time()
    for _ in range(n):
        out = fn()  # type: ignore[operator]
    return (time.thread_time() - t) / n, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    runs = []
    for i in range(a.runs):
        make = crashlooping_run if i % 2 == 0 else blocked_run
        rc = make(name=f"llm-run-{i:05d}", namespace=f"team-{i % 8}")
        runs.append(replace(rc, ref=Ref(rc.ref.kind, rc.ref.namespace, rc.ref.name, f"uid-{i}")))
    registry = new_registry()
    exp = ClaimsExporter(registry)
    HealthMetrics(registry, resources=["pods", "nodes", "events", "jobs"], sources=["pods", "logs"], version="b")
    t = time.thread_time()
    exp.update(runs, T0)
    update_s = time.thread_time() - t

    again = [replace(rc, evaluated_at=T0 + timedelta(seconds=1)) for rc in runs]
    t = time.thread_time()
    exp.update(again, T0 + timedelta(seconds=1))
    tick_s = time.thread_time() - t

    base_s, base = timed(lambda: generate_latest(registry), a.repeat)
    clock = [0]

    def rebuild() -> bytes:
        clock[0] += 1
        exp.update([], T0 + timedelta(seconds=clock[0]))  # the clock moved: ages change
        return render(registry)
    rebuild_s, _ = timed(rebuild, a.repeat)
    cached_s, fast = timed(lambda: render(registry), a.repeat * 20)
    assert fast == generate_latest(registry), "prepared text differs from client_python's"
    series = sum(1 for line in fast.splitlines() if line and not line.startswith(b"#"))
    claim_series = sum(1 for line in fast.splitlines() if line.startswith(b"taugrid_run_"))
    print(f"runs: {a.runs}; /metrics {len(fast) / 1e6:.1f} MB, {series} series "
          f"({claim_series} run series, {claim_series / a.runs:.1f} per run; running/blocked mix)")
    print(f"{'path':<34} {'CPU ms / scrape':>16}")
    print(f"{'baseline generate_latest':<34} {base_s * 1000:>16.1f}")
    print(f"{'prepared, rebuilt (clock moved)':<34} {rebuild_s * 1000:>16.1f}")
    print(f"{'prepared, unchanged':<34} {cached_s * 1000:>16.3f}")
    print(f"update of all {a.runs} runs: {update_s * 1000:.0f} ms CPU first, {tick_s * 1000:.0f} ms re-evaluated "
          "with the same claims (an evaluation tick); once per evaluation, not per scrape")
    print(f"goal: <= 150 ms per scrape at 5,000 runs; baseline {base_s * 1000:.0f} ms")
    del base


if __name__ == "__main__":
    main()
