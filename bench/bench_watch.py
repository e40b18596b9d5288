"""Watch path figures that need a baseline of their own: the official client's watch throughput
through the simulator (whose framing changed), and the controller's initial-sync peak memory with
paginated lists and with streaming lists (WatchList).

  client  a burst of pod MODIFIED events written at once server side (`bench_controller`'s simulator
          process, realistic ~5 KB KubeRay pods), read by the official client's
          `Watch().stream(list_pod_for_all_namespaces, resource_version=...)` (models deserialized,
          its default): events/s, medians of --repeats. `--baseline REF` measures REF's simulator the
          same way in a child process (a temporary git worktree), in the same run.
  sync    the controller (`collector.controller.Controller`, every default resource) started as its
          own process against a simulator holding --sync-pods pods, until every pod is indexed: peak
          RSS (ru_maxrss) and RSS after the sync, each less the process's RSS before the controller
          was built, and the time to sync; paginated lists, then streaming lists (the reflector's
          `STREAM_LISTS` switch), alternating, --sync-repeats each, medians.

Usage: .venv/bin/python bench/bench_watch.py [--baseline fc24a24] [--sync-pods 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _tree_bench() -> Any:
    """The tree's own bench_controller (the tree first on sys.path), imported by its package path at
    run time: the benchmarks import each other by name for mypy, which a `bench.` import would clash with."""
    import importlib
    return importlib.import_module("bench.bench_controller")


def _client_rate(url: str, rv0: str, events: int) -> float:
    from kubernetes import client as k8s
    from kubernetes import watch as k8s_watch

    cfg = k8s.Configuration()
    cfg.host = url
    with k8s.ApiClient(cfg) as api:
        core = k8s.CoreV1Api(api)
        w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        n = 0
        t = time.monotonic()
        for _ in w.stream(core.list_pod_for_all_namespaces, resource_version=str(rv0), timeout_seconds=300):  # type: ignore[no-untyped-call]
            n += 1
            if n >= events:
                break
        took = time.monotonic() - t
        w.stop()  # type: ignore[no-untyped-call]
    return n / took


def measure_client(pods: int, events: int, repeats: int) -> dict[str, Any]:
    """The official client through this tree's simulator (the tree is first on sys.path)."""
    SimProcess = _tree_bench().SimProcess

    sim = SimProcess(None, window=repeats * events + pods + 10_000)
    try:
        sim.call("populate", 0, pods // 8, 8, 64)
        rates = []
        for _ in range(repeats):
            b = sim.call("burst", events)
            rates.append(_client_rate(sim.url, b["rv0"], events))
        return {"client_eps": statistics.median(rates), "client_eps_all": rates}
    finally:
        sim.close()


def _sync_main(conn: Any, root: str, url: str, stream: bool, pods: int) -> None:
    sys.path.insert(0, root)
    import logging

    logging.disable(logging.WARNING)
    b = _tree_bench()
    open_controller, rss_bytes, wait_until = b.open_controller, b.rss_bytes, b.wait_until
    from collector.sources import watch as watch_mod

    gc.collect()
    rss0 = rss_bytes()
    watch_mod.STREAM_LISTS = stream
    t = time.monotonic()
    c = open_controller(url, 5.0, keep_all=False)
    try:
        wait_until(lambda: c.synced and len(c.index.keys_of_kind("Pod")) >= pods, 600, "synced", step=0.02)
        took = time.monotonic() - t
        gc.collect()
        # (the reflectors moved from the controller to its watch source; a baseline tree may predate that)
        reflectors = c.watch.reflectors if hasattr(c, "watch") else c._reflectors
        modes = sorted({r.list_mode for r in reflectors})
        conn.send({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0,
                   "steady": rss_bytes() - rss0, "sync_s": took, "modes": modes})
    finally:
        c.close()


def measure_sync(pods: int, repeats: int) -> dict[str, Any]:
    SimProcess = _tree_bench().SimProcess

    sim = SimProcess(None, window=pods + 10_000)
    ctx = mp.get_context("spawn")
    out: dict[str, list[dict[str, Any]]] = {"pages": [], "stream": []}
    try:
        t = time.monotonic()
        sim.call("populate", 0, pods // 8, 8, 256)
        print(f"  simulator holds {pods:,} pods ({time.monotonic() - t:.0f} s)", flush=True)
        for i in range(repeats):
            for mode in ("pages", "stream"):
                conn, child = ctx.Pipe()
                p = ctx.Process(target=_sync_main, args=(child, str(ROOT), sim.url, mode == "stream", pods))
                p.start()
                r = conn.recv()
                p.join(60)
                out[mode].append(r)
                print(f"  sync {i + 1}/{repeats} {mode}: peak +{r['peak'] / 2**20:.0f} MiB, after "
                      f"+{r['steady'] / 2**20:.0f} MiB, {r['sync_s']:.1f} s ({','.join(r['modes'])})", flush=True)
    finally:
        sim.close()
    return {mode: {k: statistics.median(r[k] for r in rs) for k in ("peak", "steady", "sync_s")}
            for mode, rs in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client-pods", type=int, default=2000, help="pods in the simulator for the client figure")
    ap.add_argument("--client-events", type=int, default=5000, help="events in each client burst")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", default="", help="a commit whose simulator is measured beside this tree's")
    ap.add_argument("--sync-pods", type=int, default=20_000)
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--skip-client", action="store_true")
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(a.tree))
    if a.json:  # a baseline tree's client figure, for the parent
        print(json.dumps(measure_client(a.client_pods, a.client_events, a.repeats)))
        return
    if not a.skip_client:
        base: dict[str, Any] = {}
        here: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
            tree = Path(tmp) / "tree"
            if a.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), a.baseline],
                               check=True)
            try:
                # Alternated, so that the machine's load falls on both alike.
                for _ in range(a.repeats):
                    r = measure_client(a.client_pods, a.client_events, 1)
                    here.setdefault("all", []).extend(r["client_eps_all"])
                    if a.baseline:
                        done = subprocess.run([sys.executable, __file__, "--tree", str(tree), "--json",
                                               "--repeats", "1", "--client-pods", str(a.client_pods),
                                               "--client-events", str(a.client_events)],
                                              capture_output=True, text=True, check=True)
                        base.setdefault("all", []).extend(json.loads(done.stdout.strip().splitlines()[-1])
                                                          ["client_eps_all"])
            finally:
                if a.baseline:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        med = statistics.median(here["all"])
        line = (f"official client watch (V1Pod models), {a.client_events:,}-event burst: {med:,.0f} events/s "
                f"(runs {', '.join(f'{x:,.0f}' for x in here['all'])})")
        if base:
            bmed = statistics.median(base["all"])
            runs = ", ".join(f"{x:,.0f}" for x in base["all"])
            line += f"; baseline {a.baseline}: {bmed:,.0f} events/s (runs {runs}); x{med / bmed:.1f}"
        print(line, flush=True)
    if not a.skip_sync:
        s = measure_sync(a.sync_pods, a.sync_repeats)
        p, st = s["pages"], s["stream"]
        print(f"initial sync of {a.sync_pods:,} pods, controller as its own process, medians of {a.sync_repeats}:")
        for name, m in (("paginated lists (baseline)", p), ("streaming lists", st)):
            print(f"  {name:<28} peak +{m['peak'] / 2**20:6.0f} MiB  after sync +{m['steady'] / 2**20:6.0f} MiB  "
                  f"peak/after {m['peak'] / max(1, m['steady']):.2f}  sync {m['sync_s']:.1f} s")


if __name__ == "__main__":
    main()
