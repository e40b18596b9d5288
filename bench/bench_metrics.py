"""`/metrics` at fleet size, beside a baseline tree measured in the same run.

Builds N runs' claims (half running with progress and goodput, half blocked in a queue: the two
shapes with the most series), then measures, medians over --repeat:
  bytes          the claims' exposition per run, and the series per run
  client_python  generate_latest(registry): every series formatted per scrape (the old path), CPU ms
  rebuild        render(registry) on the first scrape after the clock changed, and after 1% of the
                 runs were re-evaluated (what the loop's tick does between two scrapes), CPU ms
  cached         render(registry) on a scrape with nothing changed, CPU ms
  http           a GET of /metrics from the controller's HTTP server (collector/endpoints.py), wall ms:
                 after the clock moved (ages change), after 1% of the runs were re-evaluated (what the
                 loop's tick does between two scrapes), and unchanged
  update         ClaimsExporter.update of all N runs (the loop's share), CPU ms
and, where the tree has it, `run_series=unhealthy` on a fleet with --unhealthy-share of its runs not
healthy (the rest running with every claim verified): bytes per run in both modes.

`--baseline REF` checks REF out in a temporary git worktree and measures it the same way in a
child process, in the same run (the machine's load applies to both).

Usage: .venv/bin/python bench/bench_metrics.py [--runs 5000] [--repeat 5] [--baseline b2b8340~1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from baseline import baseline_tree

ROOT = Path(__file__).resolve().parents[1]


def timed(fn: Callable[[], Any], n: int, clock: Callable[[], float] = time.thread_time) -> float:
    """Median seconds of `n` calls."""
    out = []
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)
    return statistics.median(out)


def fleet(n: int, unhealthy_share: float | None = None) -> list[Any]:
    """N runs: alternately crash-looping (running, with goodput) and blocked; with `unhealthy_share`,
    that share of them so and the rest healthy (every claim verified, steps advancing)."""
    from collector.model import Observed, Ref, Verdict
    from tests.exporters.exporter_samples import blocked_run, crashlooping_run

    every = round(1 / unhealthy_share) if unhealthy_share else 0
    runs, made = [], 0
    for i in range(n):
        name, ns = f"llm-run-{i:05d}", f"team-{i % 8}"
        if unhealthy_share is None or (every and i % every == 0):
            rc = (crashlooping_run if made % 2 == 0 else blocked_run)(name=name, namespace=ns)
            made += 1
        else:
            rc = crashlooping_run(name=name, namespace=ns)
            rc = replace(rc, running=replace(rc.running, observed=Observed.TRUE, verdict=Verdict.VERIFIED),
                         progressing=replace(rc.progressing, observed=Observed.TRUE, verdict=Verdict.VERIFIED))
        runs.append(replace(growing(rc), ref=Ref(rc.ref.kind, rc.ref.namespace, rc.ref.name, f"uid-{i}")))
    return runs


def growing(rc: Any) -> Any:
    """A running run's goodput as an evaluation gives it: growing with the clock (a tree whose exporter
    renders it at its clock renders these rows on every scrape after the clock moved; an older one
    writes them once per evaluation)."""
    from collector.model import Goodput

    g = rc.goodput
    if g is None or "accrues" not in Goodput.__dataclass_fields__:
        return rc
    at = rc.evaluated_at
    return replace(rc, goodput=replace(g, accrues="restarting", accrues_base=0.0,
                                       accrues_from=at - timedelta(seconds=300),
                                       allocated_from=at - timedelta(seconds=1800), rated=True))


def claims_bytes(text: bytes) -> int:
    return sum(len(line) + 1 for line in text.split(b"\n") if line.startswith(b"taugrid_run_")
               or line.startswith(b"taugrid_fleet_"))


def measure(runs_n: int, repeat: int, unhealthy_share: float) -> dict[str, float]:
    from prometheus_client import generate_latest

    from collector.endpoints import serve
    from exporters.prometheus import ClaimsExporter, new_registry, render
    from exporters.prometheus_health import HealthMetrics
    from tests.exporters.exporter_samples import T0

    out: dict[str, float] = {}
    runs = fleet(runs_n)
    registry = new_registry()
    exp = ClaimsExporter(registry)
    HealthMetrics(registry, resources=["pods", "nodes", "events", "jobs"], sources=["pods", "logs"], version="b")
    t = time.thread_time()
    exp.update(runs, T0)
    out["update first (ms CPU)"] = (time.thread_time() - t) * 1000
    again = [replace(rc, evaluated_at=T0 + timedelta(seconds=1)) for rc in runs]
    out["update tick (ms CPU)"] = timed(lambda: exp.update(again, T0 + timedelta(seconds=1)), repeat) * 1000

    clock = [1]

    def tick() -> None:
        clock[0] += 1
        exp.update([], T0 + timedelta(seconds=clock[0]))  # the clock moved: ages change

    out["client_python (ms CPU)"] = timed(lambda: generate_latest(registry), max(1, repeat // 2)) * 1000

    def rebuild() -> None:
        tick()
        render(registry)
    out["rebuild (ms CPU)"] = timed(rebuild, repeat) * 1000
    out["cached (ms CPU)"] = timed(lambda: render(registry), repeat * 10) * 1000
    some = again[:: 100]  # 1% of the runs re-evaluated since the last scrape (the loop's update, untimed)

    def reevaluate() -> None:
        tick()
        exp.update([replace(rc, evaluated_at=T0 + timedelta(seconds=clock[0])) for rc in some],
                   T0 + timedelta(seconds=clock[0]))
    cpu = []
    for _ in range(repeat):
        reevaluate()
        t = time.thread_time()
        render(registry)
        cpu.append(time.thread_time() - t)
    out["rebuild, 1% re-evaluated (ms CPU)"] = statistics.median(cpu) * 1000
    # The controller's own server, as `Controller.serve` wires it (no token: the bench's own loopback).
    server = serve("127.0.0.1", 0, {"/metrics": lambda: (200, "text/plain; version=0.0.4", render(registry))})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        def get() -> None:
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()

        def get_after_tick() -> None:
            tick()
            get()
        out["http GET, clock moved (ms wall)"] = timed(get_after_tick, repeat, time.perf_counter) * 1000
        times = []
        for _ in range(repeat):
            reevaluate()
            t = time.perf_counter()
            get()
            times.append(time.perf_counter() - t)
        out["http GET, 1% re-evaluated (ms wall)"] = statistics.median(times) * 1000
        out["http GET, unchanged (ms wall)"] = timed(get, repeat, time.perf_counter) * 1000
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    text = render(registry)
    assert text == generate_latest(registry), "prepared text differs from client_python's"
    run_lines = [line for line in text.split(b"\n") if line.startswith(b"taugrid_run_")]
    out["/metrics (MB)"] = len(text) / 1e6
    out["run series per run"] = len(run_lines) / runs_n
    out["B per run (all)"] = claims_bytes(text) / runs_n

    mixed = fleet(runs_n, unhealthy_share)
    for mode in ("all", "unhealthy"):
        registry = new_registry()
        try:
            exp = ClaimsExporter(registry, run_series=mode)  # type: ignore[call-arg,arg-type,unused-ignore]
        except TypeError:  # a tree without run_series
            if mode == "unhealthy":
                break
            exp = ClaimsExporter(registry)
        exp.update(mixed, T0)
        out[f"B per run, {unhealthy_share:.0%} unhealthy, {mode}"] = claims_bytes(render(registry)) / runs_n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--unhealthy-share", type=float, default=0.05)
    ap.add_argument("--baseline", default="", help="a commit to measure beside this tree (a temporary worktree)")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(a.tree))
    here = measure(a.runs, a.repeat, a.unhealthy_share)
    if a.json:
        print(json.dumps(here))
        return
    base: dict[str, float] = {}
    if a.baseline:
        with baseline_tree(a.baseline, "bench-metrics-") as tree:
            done = subprocess.run([sys.executable, __file__, "--tree", str(tree), "--runs", str(a.runs),
                                   "--repeat", str(a.repeat), "--unhealthy-share", str(a.unhealthy_share),
                                   "--json"], capture_output=True, text=True, check=True)
            base = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"/metrics at {a.runs} runs (half running with goodput, half blocked), medians of {a.repeat}")
    print(f"{'figure':<40} {'this tree':>10} {'baseline ' + a.baseline if a.baseline else '':>22}")
    for k, v in here.items():
        b = base.get(k)
        print(f"{k:<40} {v:>10.1f} {f'{b:.1f} ({v / b:.2f}×)' if b else '':>22}")
    ok_ms = here["http GET, 1% re-evaluated (ms wall)"] <= 150
    ok_b = here["B per run (all)"] <= 2000
    print(f"goal: /metrics at 5,000 runs <= 150 ms ({'met' if ok_ms else 'missed'}: "
          f"{here['http GET, 1% re-evaluated (ms wall)']:.0f} ms, a GET after 1% of the runs were re-evaluated) "
          "and <= 2 KB per run "
          f"({'met' if ok_b else 'missed'}: {here['B per run (all)']:.0f} B)")


if __name__ == "__main__":
    main()
