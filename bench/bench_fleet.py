"""Fleet-size benchmark: one controller against a simulated cluster of 50,000 pods (or more).

For each variant, a fresh controller process lists and watches the same simulated cluster (the
simulator runs in its own process, filled with bench_controller's ~6 KB KubeRay GPU pods through
its store API), and reports:

  sync_s     open() → ready (every initial list read, normalized, indexed and evaluated)
  peak MiB   the process's maximum RSS (ru_maxrss) over its life: initial list, ticks, idle
  steady MiB RSS once synced, after a collection
  idle core  CPU seconds per second while nothing changes (the evaluation tick included); with live
             evidence, the agent poller's decode of the agents' documents (bytes to records) counted,
             the agents' own work (building them) not
  tick s     the full re-evaluation period in effect at the end (stretched at fleet size)
  late s     ageing: the watches go quiet (as in an API outage) and the controller's clock jumps 1 s
             past the evidence bound (5 min) of every source; seconds from then until every run's
             scheduled claim says unknown (resolution 0.25 s)
  rechecked  runs re-evaluated because their claims were due to change by the clock (recheck_at),
             while idle / while ageing

Variants, all in the same run:
  baseline   the previous path: every page of a list decoded in full by orjson and kept until the
             list ends, then normalized (KubeApi.list_pages + Controller.replace on the whole list),
             and a full re-evaluation every `tick` whatever it costs
  paged      pages normalized as they arrive, pods decoded selectively (msgspec), the tick stretched
             so that full passes take at most FULL_PASS_SHARE of a core, and each run re-evaluated
             when its claims are due to change by the clock (RunClaims.recheck_at)
  tick-only  paged without those per-run re-evaluations: ageing evidence waits for the full pass
             (the path before them, to show what keeping the deadlines costs)
  logs       mmap with container logs polled every 30 s as deployed (the others poll none): what
             the log poller costs at fleet size, measured over 150 s (a rotation and more) after its first pass
  logs-all   the same, every container read every pass (log_quiet_every: 1, the path before rotation)
  logs-unbounded  logs without the log budget (README "Log budget"): no per-pass ceiling on GETs and
             bytes, and every printing container read every pass whatever its run's claims (the path
             before); `logs` is the chart's default without agents: the ceiling (2,000 GETs, 64 MiB a
             pass) and no GET for a run whose claims stand past the next pass. Both print the GETs
             and bytes of each pass (medians), what a ceiling left, and idle core per 1k pods
  logs-gpu   logs, and every 30 s the GPU evidence node agents would hand the loop: each running
             GPU pod's devices with new utilization and power readings (what re-evaluating runs on
             GPU readings costs; the feed's own CPU is the same in every variant that has it)
  logs-gpu-ungated  logs-gpu with every run re-evaluated on each GPU pass (`_same_devices` never true)
  agents     logs-gpu as deployed with the node agent: the GPU pods' logs are the agents' (the API
             poller skips them), so the API reads only the Ray heads (no GPU: outside the agents'
             default scope); the agents' own HTTP poll is bench_agent_poll.py's figure
  agents-all agents with `--log-scope all`: every pod's logs read by the agents and handed to the loop
             as increments (`_log_feed`, its own CPU not counted), no API log read at all
  live       agents-all with live evidence (issue 30's fleet memory goal): every pod's trainer
             prints a step a second (Megatron-style samples with a loss and a total), the agents hand
             the loop each container's 30 new samples every 30 s (`_live_feed`, synthesized: scanning
             50k logs a pass in this process would starve the controller; its CPU is not counted), and
             every GPU pod's readings come every 30 s. Measured once LIVE_WARMUP passes filled the
             histories (compacted as deployed): steady = RSS after the idle window, window max = the
             highest RSS sampled each second in it, MiB per 1k pods beside `paged` of the same run. The
             idle window runs from the loop having applied one live pass to its having applied the
             eighth after it: eight passes' work, whatever their phase (≈ 285 s at 50k pods, the feed's
             own work stretching its 30 s period; py-spy's profile covers the first 240 s of it)
  live-heads live as the goal states it: each run's Ray head prints a step a second (a RayJob's
             driver prints the run's progress), the workers' trainers are quiet after their first
             document (an increment with nothing new each pass, as agents send every container);
             every GPU pod's readings every 30 s, in each node's document as its agent renders it
             (every reading an H100 reports: `_node_body`)
  mmap       paged, glibc's mmap threshold fixed at 128 KiB before any thread starts, as the
             `controller` command does (collector/malloc.py)
  arena2     paged, glibc's malloc held to 2 arenas (M_ARENA_MAX; measured, not kept)

VARIANT+malloc (e.g. live-heads+malloc) starts that variant's controller with PYTHONMALLOC=malloc
(every object from glibc malloc instead of Python's arenas: what a deployment can set).
VARIANT+wholepass (e.g. live-heads+wholepass): the GPU feed as before (each pass's node documents all
built before the first is parsed, ~6 KB a GPU pod at once, and the UUID strings kept between passes:
the controller's process held them; now one node's document at a time, as the agent poller reads).

BENCH_LIST_PAGE=0 reads every list as one unpaginated answer (what the reflector falls back to
after a continue page expired, on a server without streaming lists): with `before`, that read's
peak beside a before tree's.

BENCH_DRAINED=1 starts the idle window of the log variants only once a pass left no urgent read
(every container read once since the start: with a ceiling below the fleet's first pass that takes
containers / log_pass_max_gets passes), for steady-state figures rather than the start's backlog.

BENCH_TRACEMALLOC=PREFIX writes tracemalloc's top allocation sites (lineno, traceback) retained at the
end of the idle window to PREFIX-VARIANT-PID.txt (and the snapshot to .snap): allocations from the
first log pass on, or with BENCH_TRACEMALLOC_FROM=open from before the controller opened (what the
synced object path keeps; BENCH_TRACEMALLOC_FRAMES frames a trace, 8).

BENCH_TRACE=1 prints, every 30 s from ready, what marked runs for evaluation (by change, the full
pass, the clock, deferrals, and why an agent's increment was not deferred), runs evaluated, the log
backlog and the runs' progressing claims: why a start does not catch up. BENCH_WARMUP_S (3600) bounds
the live feed's warm-up; a variant that does not finish it is measured all the same and says so.

The idle figure is the controller's: the process's CPU less the feeds' (stand-ins for agents and GPUs,
their decode of the documents added back as the poller's) and less the bench's own main thread, which
waits for the loop to apply the passes (polling every BENCH_APPLIED_POLL_S, 0.25 s; 0.02 until
2026-12-08), and its RSS sampler; both figures are printed.

BENCH_NO_LATE=1 skips the ageing figure (`late s` nan: minutes a variant, for memory-only runs);
BENCH_MALLOCSTATS=PREFIX writes sys._debugmallocstats (pymalloc's size classes: pools, blocks in use
and free, unused pools) at steady and after the idle window to PREFIX-LABEL-PID.txt.

With --scenario FILE (e.g. kubesim/scenarios/fleet.yaml) the cluster is instead played by the
scenario engine (TauRuns, RayJobs, Workloads, pods bound, pulled, started, Events, log lines) on a
manual clock stepped from time zero to the last submission plus a minute, ending at the present.
The engine writes straight into the simulator's store (StoreClient: the handlers' store calls, no
HTTP; ~20x faster, so the full fleet plays in minutes), or with --http through its HTTP API like
`taugrid-evidence simulator` (~27 min at full size). The controller then lists and watches that
store over HTTP as always. It reports how long the play takes (materialize_s, writes/s) beside the
store-API `populate` of the same number of pods in the same run (no lifecycle). --scale S
multiplies the scenario's run and node counts (a quick run: --scale 0.05).

--time-lists first times each resource's list alone (no controller): how much of a sync is the API
server's. Variant `before` (with --before-tree DIR, e.g. `git archive <commit> | tar -x -C DIR`) is
`paged` run with DIR's collector, against the same cluster in the same run: a change's before/after;
`before-logs` and `before-logs-gpu` are `logs` and `logs-gpu` run that way.

The populated fleet's every pod holds 8 GPUs by default, whatever its node holds: at 10 pods a node,
80 GPUs a node, 400,000 at 50k pods (the figures before 2026-12-07 were all taken so). --gpu-nodes
holds the nodes to their 8 GPUs: one 8-GPU pod a node (and a run), the run's other pods none, 40,000
GPUs at 50k pods on 5,000 nodes (Kubernetes' own limits: 5,000 nodes, 150,000 pods).

Usage: .venv/bin/python bench/bench_fleet.py [--pods 50000] [--per-run 10] [--gpu-nodes] [--variants baseline,paged]
       .venv/bin/python bench/bench_fleet.py --scenario kubesim/scenarios/fleet.yaml [--scale 1] [--variants paged]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
# The bench's own threads in the controller's process: the idle figure leaves their CPU out (the main
# thread waits for the loop to apply the agents' passes; it polled every 20 ms until 2026-12-08, ≈ 0.004
# core at 10k pods counted as the controller's) beside the feeds, which stand in for agents and GPUs.
APPLIED_POLL_S = float(os.environ.get("BENCH_APPLIED_POLL_S") or 0.25)  # (0.02: the wait as it was)
SAMPLER = "bench-sampler"
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_controller import SimProcess, cpu_s, rss_bytes  # noqa: E402


def _bucket(n: int) -> str:
    for top in (1, 4, 16, 64, 256, 512, 1024, 4096):
        if n < top:
            return f"<{top}"
    return ">=4096"


def _census(path: str) -> None:
    """BENCH_CENSUS=PREFIX: every object the collector reaches (tracked ones and what they hold), its
    shallow size summed by type, into PATH: where the heap's Python objects are, without tracemalloc's
    cost (run after the window: it holds a set of every object's id while it walks), and for the
    largest types who holds a spread of them (`_holders`); with BENCH_CENSUS_DUPS=1, also the short
    tuples held more than once by value (a key copied into several maps). It freezes every object it
    finds (the figures after it are not quoted)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(60.0)  # (the loop's thread waits while the census walks: what it picks stays held)
    gc.unfreeze()  # (what the start froze: neither `gc.get_objects` nor `gc.get_referrers` sees it)
    try:
        _census_walk(path)
    finally:
        gc.freeze()
        sys.setswitchinterval(switch)


def _census_walk(path: str) -> None:
    import random
    rng = random.Random(0)
    by: dict[str, list[int]] = {}
    picked: dict[str, list[object]] = {}
    seen: set[int] = set()
    todo = gc.get_objects()
    seen.update(map(id, todo))
    # BENCH_CENSUS_DUPS: short tuples counted by value (the same key held by several maps, each its own copy)
    dups: dict[object, list[int]] | None = {} if os.environ.get("BENCH_CENSUS_DUPS") else None
    own = {id(seen), id(todo), id(by), id(picked), id(dups)}  # (the census's own: neither counted nor walked)
    while todo:
        o = todo.pop()
        if id(o) in own:
            continue
        t = type(o)
        k = f"{t.__module__}.{t.__qualname__}"
        if t is bytes or t is str:  # by size: a record's packed columns, a log's samples, names
            k += f" {_bucket(len(o))}"
        elif t is tuple or t is list or t is dict:
            k += f" len {_bucket(len(o))}"
            if dups is not None and t is tuple and len(o) < 4:
                try:
                    d = dups.setdefault(o, [0, sys.getsizeof(o)])
                    d[0] += 1
                except (TypeError, ValueError):  # (unhashable: a list or a writable memoryview inside)
                    pass
        got = by.get(k)
        if got is None:
            got = by[k] = [0, 0]
        got[0] += sys.getsizeof(o)
        got[1] += 1
        mine = picked.setdefault(k, [])  # a spread of each type for `_holders` (reservoir sampling)
        if len(mine) < 24:
            mine.append(o)
        elif (j := rng.randrange(got[1])) < 24:
            mine[j] = o
        fields = getattr(t, "__struct_fields__", None)  # (a msgspec Struct with gc=False has no referents)
        if type(fields) is not tuple:  # (the Struct's metaclass: a descriptor)
            fields = None
        for r in gc.get_referents(o) if fields is None else [getattr(o, f, None) for f in fields]:
            if id(r) not in seen and not gc.is_tracked(r):
                seen.add(id(r))
                todo.append(r)
    total = sum(v[0] for v in by.values())
    with open(path, "w") as out:
        out.write(f"# {total / 2**20:.1f} MiB shallow in {sum(v[1] for v in by.values())} objects\n")
        for k, (size, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:80]:
            out.write(f"{size / 2**20:9.2f} MiB {n:10d}  {size / max(n, 1):8.0f} B  {k}\n")
        if dups is not None:  # by shape: a first string (a kind) shown, the rest by type
            shapes: dict[str, list[int]] = {}
            for v, (n, size) in dups.items():
                shape = ",".join(repr(x) if i == 0 and type(x) is str and len(x) <= 16 else type(x).__name__
                                 for i, x in enumerate(cast(tuple[object, ...], v)))
                e = shapes.setdefault(shape, [0, 0, 0])
                e[0], e[1], e[2] = e[0] + n, e[1] + 1, e[2] + (n - 1) * size
            out.write("\n# short tuples held more than once: MiB in copies past the first, objects, values, shape\n")
            for shape, (n, values, extra) in sorted(shapes.items(), key=lambda kv: -kv[1][2])[:40]:
                out.write(f"{extra / 2**20:9.2f} MiB {n:10d} {values:10d}  ({shape})\n")
        del todo, seen, dups
        top = sorted(by.items(), key=lambda kv: -kv[1][0])[:16]
        out.write("\n# who holds them: for a spread of each of the largest types, the chain of holders\n")
        for k, _ in top:
            chains: dict[str, int] = {}
            for o in picked.get(k, []):
                chain = _holders(o, {id(picked), id(chains)} | {id(v) for v in picked.values()})
                chains[chain] = chains.get(chain, 0) + 1
            ranked = sorted(chains.items(), key=lambda kv: -kv[1])
            out.write(f"{k}:\n" + "".join(f"    {n:3d}  {c}\n" for c, n in ranked))


def _holders(o: object, skip: set[int], depth: int = 4) -> str:
    """The types that hold `o`, up to `depth` steps out, each through its first holder that is not a
    frame, a cell or the census's own; an instance's attribute named where a __dict__ or slot holds it."""
    import types

    def attr(v: object, name: str) -> object:
        try:
            return getattr(v, name, None)
        except Exception:  # (a mock class's getattr raises)
            return None
    out = []
    for _ in range(depth):
        held = [r for r in gc.get_referrers(o)
                if id(r) not in skip and not isinstance(r, (types.FrameType, types.CellType))]
        if not held:
            break
        r = held[0]
        t = type(r)
        name = f"{t.__module__}.{t.__qualname__}"
        owner: list[object] = []
        if t is dict:
            name += f"[{_bucket(len(r))}]"
            owner = [v for v in held[1:] if attr(v, "__dict__") is r]
            if owner:  # a __dict__'s owner: say which attribute
                r = owner[0]
                name = f"{type(r).__qualname__}." + next((str(kk) for kk, vv in r.__dict__.items() if vv is o), "?")
            else:
                keys = [kk for kk, vv in r.items() if vv is o]
                name += f" value of {type(keys[0]).__qualname__}" if keys else " key"
        else:
            slots = [s for s in getattr(t, "__slots__", ()) if attr(r, s) is o]
            d = attr(r, "__dict__")
            if not slots and type(d) is dict:
                slots = [str(kk) for kk, vv in d.items() if vv is o]
            if slots:
                name += f".{slots[0]}"
        out.append(name)
        o = r
        held = owner = []  # (these lists hold `o` now: not a holder to climb to)
    return " <- ".join(out)


def heap_stats(label: str = "") -> dict[str, float]:
    """Where the RSS is, in MiB: Python's small-object allocator (blocks in use, free blocks in its
    arenas) and glibc malloc (in use, free but not returned: fragmentation), from
    sys._debugmallocstats and mallinfo2. BENCH_MALLOCSTATS=PREFIX: its whole text (the size classes'
    pools and blocks) in PREFIX-LABEL-PID.txt."""
    import ctypes
    import re

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    text = b"".join(chunks).decode()
    if os.environ.get("BENCH_MALLOCSTATS"):
        Path(f"{os.environ['BENCH_MALLOCSTATS']}-{label}-{os.getpid()}.txt").write_text(text)

    def total(label: str) -> float:
        found = re.search(r"# bytes in " + label + r"\D*=\s*([\d,]+)", text)
        return int(found.group(1).replace(",", "")) / 2**20 if found else float("nan")
    arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    return {"py_used": total("allocated blocks"), "py_free": total("available blocks"),
            # pymalloc's arenas (1 MiB each since 3.10: mapped whole, returned only once every pool is free)
            "py_arenas": int(arenas.group(1).replace(",", "")) if arenas else float("nan"),
            "malloc_used": m.uordblks / 2**20, "malloc_free": m.fordblks / 2**20, "mmapped": m.hblkhd / 2**20}


def tracemalloc_on() -> bool:
    import tracemalloc
    return tracemalloc.is_tracing()


def _trace(c: Any) -> None:
    """BENCH_TRACE: every 30 s, what marked runs for evaluation (new marks by change op, the full
    pass, clock rechecks, deferrals), runs evaluated, the log backlog and the runs' progressing claims
    (a diagnostic of a start that does not catch up; its own CPU is the controller's)."""
    from collections import Counter
    marks: Counter[str] = Counter()
    apply0, mark_all0 = c._apply, c._mark_all

    def counted(key: str, f: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            n = len(c._dirty)
            pre = c.index.signal_of(a[0].payload[0].ref, a[0].payload[0].source) \
                if not key and a[0].op == "agent-log" else None
            try:
                return f(*a, **kw)
            finally:
                k = key or f"{a[0].op}"
                if k == "agent-log":
                    sig, after = a[0].payload
                    k += (" first" if pre is None else " after-none" if after is None
                          else " steps" if sig.scan.samples else " quiet")
                marks[k] += max(0, len(c._dirty) - n)
        return run
    c._apply = counted("", apply0)
    c._mark_all = counted("full", mark_all0)
    r = c._rechecks
    for name in ("pop_due", "pop_deferred"):
        f0 = getattr(r, name)

        def popped(*a: Any, _f: Any = f0, _n: str = name, **kw: Any) -> Any:
            out = _f(*a, **kw)
            marks[_n] += len(out)
            return out
        setattr(r, name, popped)
    if hasattr(c, "_deferred"):  # why an increment was not deferred: the first test `_deferred` fails
        from collector.planes.signals import alone, confirms, uneventful
        deferred0 = c._deferred
        s = c.settings.claims

        def why(held: Any, inc: Any, after: int, sig: Any, root: Any) -> bool:
            out: bool = deferred0(held, inc, after, sig, root)
            key, now = root.key, c.now()
            rc = c.claims.get(key)
            if out:
                k = "deferred"
            elif key in c._dirty or key in c._dispatched:
                k = "no: marked"
            elif uneventful(held, inc, after, s.stall_floor + s.scrape_interval) is None:
                k = "no: eventful"
            elif rc is None or not confirms(rc, sig, now):
                late = rc is not None and rc.recheck_other is not None and now >= rc.recheck_other
                k = "no: claims other" if late else "no: claims"
            elif not alone(sig, c.index.run_signals(root)[0]):
                k = "no: not alone"
            elif any(d is not None and d <= now for d in (r.due_of(key), r.deferred_of(key))):
                k = "no: due passed"
            else:
                k = "no: closes"
            marks[k] += 1
            return out
        c._deferred = why
    ev0, t0 = c.runs_evaluated, time.monotonic()
    while True:
        time.sleep(30)
        try:
            verdicts = Counter(str(rc.progressing.asserted) for rc in list(c.claims.values()))
        except RuntimeError:
            verdicts = Counter()
        ev = c.runs_evaluated
        print(f"  trace {time.monotonic() - t0:6.0f} s: evaluated {ev - ev0:6d}, dirty {len(c._dirty):6d}, "
              f"backlog {c._log_backlog.held:6d}, deferred {len(list(r.deferred_items())):6d}, "
              f"coalesced {getattr(c, 'coalesced', 0):6d}, marks "
              f"{dict(sorted(marks.items()))}, progressing {dict(verdicts)}", flush=True)
        ev0 = ev
        marks.clear()


def _relists(c: Any) -> dict[str, float]:
    """The controller's relists so far, by resource (its own counter)."""
    import re

    from prometheus_client import generate_latest

    out: dict[str, float] = {}
    for line in generate_latest(c.registry).decode().splitlines():
        m = re.match(r'taugrid_collector_relists_total\{[^}]*resource="([^"]+)"[^}]*\} (\S+)$', line)
        if m is not None and float(m.group(2)) > 0:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _not_synced(c: Any) -> str:
    """Why a controller is not ready: the resources not listed yet, and its relists and errors so far."""
    from prometheus_client import generate_latest

    pending = sorted(r.resource.name for r in c.watch.reflectors if not r.synced_once.is_set())
    counts = [line for line in generate_latest(c.registry).decode().splitlines()
              if line.startswith(("taugrid_collector_relists_total", "taugrid_collector_errors_total",
                                  "taugrid_collector_watch_restarts_total")) and not line.endswith(" 0.0")]
    return f"not listed {pending}; " + "; ".join(counts)


def _threads_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by its Python name, from
    /proc (10 ms ticks): which thread the idle figure's CPU went to."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
        except (OSError, TypeError):
            continue  # (gone meanwhile)
        fields = stat.rsplit(")", 1)[1].split()
        out[t.name] = out.get(t.name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _measure(url: str, variant: str, idle_s: float, cpu: int | None, conn: Any) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    logging.disable(logging.WARNING)
    if variant in ("arena2", "mmap", "logs", "logs-all", "logs-unbounded", "logs-gpu", "logs-gpu-ungated", "agents",
                   "agents-all", "live", "live-heads"):
        if variant == "arena2":
            import ctypes
            ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX (measured, not kept)
        else:
            from collector.malloc import fix_mmap_threshold
            assert fix_mmap_threshold()  # what `taugrid-evidence controller` does
    from collector import controller as ctl
    from collector.settings import ControllerSettings, Settings
    from collector.sources import watch
    from collector.sources.decode import FULL
    from collector.sources.kube_api import KubeApi, api_client_for

    if os.environ.get("BENCH_LIST_PAGE"):  # 0: every list one unpaginated answer (the fallback after a
        watch.LIST_PAGE = int(os.environ["BENCH_LIST_PAGE"])  # continue page expired), in either tree
    if variant == "baseline":
        def relist(self: Any) -> None:  # the path before page-by-page normalizing
            items, rv = self.api.list_pages(self.resource)
            self.sink.replace(self.resource, items)
            self.resource_version = rv
            self.last_ok = time.monotonic()
            self._mark_synced(self.last_ok)
            self.synced_once.set()
        watch.Reflector.relist = relist  # type: ignore[method-assign]
        import importlib.util
        # (since the controller is composed of sources, its watch source decodes)
        watch_mod: Any = importlib.import_module("collector.planes.kube_watch") \
            if importlib.util.find_spec("collector.planes") is not None else ctl
        vars(watch_mod)["decoder_for"] = lambda *a, **k: FULL  # swapped where the controller looks it up
        ctl.FULL_PASS_SHARE = float("inf")  # the fixed tick: every full pass at `tick`, whatever it costs
    if variant in ("baseline", "tick-only"):
        from collector.recheck import Rechecks
        Rechecks.set = lambda *a, **k: None  # type: ignore[method-assign]  # no per-run deadlines

    # container logs polled as deployed (every 30 s)
    logs = variant in ("logs", "logs-all", "logs-unbounded", "logs-gpu", "logs-gpu-ungated", "agents", "agents-all",
                       "live", "live-heads")
    base = ControllerSettings()
    if variant == "logs-unbounded":  # the path before the log budget: no ceiling, no claims-based skip
        if hasattr(base, "log_pass_max_gets"):
            base = replace(base, log_pass_max_gets=0, log_pass_max_bytes=0)
        if hasattr(base, "log_skip_settled"):
            base = replace(base, log_skip_settled=False)
        elif hasattr(ctl, "quiet_until"):  # (a `before` tree)
            vars(ctl)["quiet_until"] = lambda rc: None
    fed = variant in ("logs-gpu", "logs-gpu-ungated", "agents", "agents-all", *LIVE)  # `_gpu_feed`: the agent poller
    if variant == "logs-gpu-ungated":  # every GPU pass re-evaluates every GPU run (the path before the gate)
        try:
            from collector.planes import node_agents
            node_agents.same_devices = lambda a, b: False
        except ImportError:  # (a `before` tree)
            vars(ctl)["_same_devices"] = lambda a, b: False
    settings = Settings(controller=replace(base, leader_election=False,
                                           log_poll_interval=timedelta(seconds=30 if logs else 0),
                                           log_quiet_every=1 if variant == "logs-all" else base.log_quiet_every,
                                           # (the poller finds no agent here, and would replace what the
                                           # feed handed the loop by nothing every 30 s)
                                           agents=replace(base.agents, poll_interval=timedelta(0)) if fed
                                           else base.agents))
    log_reads = [0, 0.0]  # GETs of a pod log, and seconds spent in them (summed over the reads in flight)
    counting = threading.Lock()  # reads complete on several threads

    def counted(get_text: Any) -> Any:
        def get(path: str, query: Any = ()) -> bytes:
            t = time.monotonic()
            try:
                out: bytes = get_text(path, query)
                return out
            finally:
                if path.endswith("/log"):
                    with counting:
                        log_reads[0] += 1
                        log_reads[1] += time.monotonic() - t
        return get
    shift = [timedelta(0)]  # the controller's clock: wall time, jumped forward for the ageing figure
    api = KubeApi(api_client_for(url))
    api.get_text = counted(api.get_text)  # type: ignore[method-assign]
    c = ctl.Controller(api, settings, lambda: datetime.now(UTC) + shift[0])
    passes: list[tuple[float, float, int]] = []  # (when it ended, monotonic; seconds; log GETs by then) a log pass
    reports: list[tuple[float, Any]] = []  # (when it ended, monotonic; its PassReport): what each pass asked
    # where a tree reports a log pass (the API log source's pass_done; an older tree: the controller's)
    hook = c.sources.get("logs") if hasattr(c, "sources") else c
    name = "pass_done" if hasattr(hook, "pass_done") else "_log_pass_done"
    if hook is not None and hasattr(hook, name):
        done = getattr(hook, name)

        def log_pass_done(p: Any, bitten: float) -> float:
            reports.append((time.monotonic(), p))
            out: float = done(p, bitten)
            return out
        setattr(hook, name, log_pass_done)
    if hasattr(c.health, "poll_pass"):  # (a `before` tree may not time its passes)
        timed = c.health.poll_pass

        def poll_pass(source: str, seconds: float) -> None:
            if source == "logs":
                passes.append((time.monotonic(), seconds, int(log_reads[0])))
            timed(source, seconds)
        c.health.poll_pass = poll_pass  # type: ignore[method-assign]
    rss0 = rss_bytes()
    traced = os.environ.get("BENCH_TRACEMALLOC")
    if traced and os.environ.get("BENCH_TRACEMALLOC_FROM") == "open":  # the steady state: what sync keeps
        import tracemalloc
        tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "8")))
    t0 = time.monotonic()
    c.open()
    if not c.ready.wait(float(os.environ.get("BENCH_SYNC_TIMEOUT_S", "1800"))):
        raise TimeoutError(f"controller never synced: {_not_synced(c)}")
    sync_s = time.monotonic() - t0
    if os.environ.get("BENCH_TRACE"):  # the loop's account every 30 s from ready (a start that lags: why)
        threading.Thread(target=_trace, args=(c,), daemon=True).start()
    # how each resource's first list was read ("pages", "whole" after a continue page expired, "stream")
    reflectors = getattr(getattr(c, "watch", None), "reflectors", ())  # (a `before` tree may not have them)
    list_modes = {r.resource.name: getattr(r, "list_mode", "") for r in reflectors}
    sync_cpu = cpu_s()  # the process's CPU from start to ready: the rest of sync_s is waiting on the lists
    peak_sync = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    time.sleep(2)  # let the first ticks pass
    gc.collect()
    steady = rss_bytes()
    heap = heap_stats("steady")
    if os.environ.get("BENCH_CENSUS"):  # (after the figures it would change)
        _census(f"{os.environ['BENCH_CENSUS']}-steady-{variant}-{os.getpid()}.txt")
        gc.collect()
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # how much of the rest malloc could hand back (a diagnostic)
    heap["trimmed"] = rss_bytes() / 2**20
    # what the log passes keep: allocations from the first log pass on (BENCH_TRACEMALLOC_FROM=open: from
    # before the controller opened, the object path's steady state included)
    if traced and not tracemalloc_on():
        import tracemalloc
        tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "8")))
    gpu_stop = threading.Event()
    warm: dict[str, float | bool] = {}  # `live`: how long the feed's warm-up took, and whether it finished
    live_passes: list[int] = []  # `live`: one entry per pass the live feed handed on
    # The feed threads' CPU, and of it the agent poller's decode of the documents (bytes to records: the
    # controller's own work, counted in the idle figure); the rest (building the agents' documents) is
    # the agents' work, taken out of it.
    feed_cpu = [0.0, 0.0]
    if fed:  # node agents' GPU evidence for every GPU pod, new readings every 30 s
        scope = {"agents": "gpu", "agents-all": "all", "live": "all", "live-heads": "all"}.get(variant, "")
        threading.Thread(target=_gpu_feed, args=(c, ctl, gpu_stop, scope, feed_cpu, variant in LIVE),
                         daemon=True).start()
        if scope == "all":
            time.sleep(2)  # the GPU pods known first: their logs are quiet (read once, then nothing new)
            fed_once = threading.Event()
            if variant in LIVE:
                threading.Thread(target=_live_feed, args=(c, ctl, gpu_stop, feed_cpu, live_passes,
                                                          variant == "live-heads"), daemon=True).start()
                w0, limit = time.monotonic(), float(os.environ.get("BENCH_WARMUP_S", "3600"))
                while len(live_passes) < LIVE_WARMUP and time.monotonic() - w0 < limit:
                    time.sleep(0.5)  # the histories full and compacted: the steady state of a long run
                # (a start that does not catch up is measured all the same, and said: a baseline beside it)
                warm = {"warmup_s": time.monotonic() - w0, "warmed": len(live_passes) >= LIVE_WARMUP}
            else:
                threading.Thread(target=_log_feed, args=(c, ctl, url, gpu_stop, feed_cpu, fed_once),
                                 daemon=True).start()
                fed_once.wait(1800)  # every container's whole log handed on once, as the agents' first documents
    if logs:  # the first pass reads every container: measure the passes after it, a whole rotation
        deadline = time.monotonic() + 600
        has_timing = hasattr(c.health, "poll_pass")  # else (a `before` tree) the first pass is as many reads as targets

        def first_pass_done() -> bool:
            if not has_timing:
                return log_reads[0] >= len(_log_targets(c)) - len(_agent_log_pods(c))
            # (passes before the first targets read nothing; with every log the agents', none reads)
            return any(p[2] > 0 for p in passes) or (variant in ("agents-all", *LIVE) and len(passes) >= 2)
        while time.monotonic() < deadline and not first_pass_done():
            time.sleep(0.5)
        drained_at = time.monotonic()
        if os.environ.get("BENCH_DRAINED"):  # steady state: a log pass ceiling has read every container once
            while time.monotonic() < deadline and not (reports and getattr(reports[-1][1], "urgent_deferred", 0) == 0):
                time.sleep(0.5)
        drain_s = time.monotonic() - drained_at
        # Five agent passes; with live evidence eight, two of the deferral's 120 s intervals
        # (`claims.confirm_refresh`): a 150 s window held one evaluation of every progressing run or two,
        # by the phase the runs were in when it opened (a 50k pair: 5,000 vs 9,755), and its CPU with them.
        idle_s = max(idle_s, (8 if variant in LIVE else 5) * 30.0)
    else:
        drain_s = 0.0
    # `live`: the window runs from the loop having applied one live pass to its having applied the eighth
    # after it, so it holds eight passes' work whatever their phase. A window of a fixed 240 s ended in the
    # middle of a pass or after it: one tree read 0.177-0.224 core (2026-12-06), by whether a pass was still
    # queued when it closed.
    def drained() -> bool:
        backlog = getattr(c, "_log_backlog", None)
        return c._changes.qsize() == 0 and (backlog is None or backlog.held == 0)

    def applied(n: int, limit_s: float) -> bool:
        """Whether `n` live passes were handed on and the loop applied every change of them (within limit_s)."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if len(live_passes) >= n and drained():
                return True
            time.sleep(APPLIED_POLL_S)
        return False
    aligned: list[bool] = []
    first_pass = len(live_passes) + 1
    if variant in LIVE and fed:
        aligned.append(applied(first_pass, 90.0))
    relists0 = _relists(c)  # a relist in the window (a watch that fell behind) is part of its CPU: named
    c0, w0, reads0, read_s0, feed0, decode0 = cpu_s(), time.monotonic(), *log_reads, *feed_cpu
    threads0 = _threads_cpu()
    evaluated0 = getattr(c, "runs_evaluated", float("nan"))
    rechecked0 = c.rechecked
    deferred0 = getattr(getattr(c, "_rechecks", None), "deferred_due", 0)
    full = [0]  # full passes begun in the window (the tick's backstop: every run)
    mark_all0 = c._mark_all

    def counted_mark_all(*a: Any, **kw: Any) -> Any:
        full[0] += 1
        return mark_all0(*a, **kw)
    c._mark_all = counted_mark_all  # type: ignore[method-assign]
    # what marked runs for re-evaluation in the window: (op, resource) -> [changes, new marks] (named at the
    # end: a name built for every change applied was the bench's own work on the loop's thread)
    marks: dict[tuple[str, Any], list[int]] = {}
    apply0 = c._apply

    def counted_apply(change: Any) -> None:
        n = len(c._dirty)
        try:
            apply0(change)
        finally:
            m = marks.get((change.op, change.resource))
            if m is None:
                m = marks[change.op, change.resource] = [0, 0]
            m[0] += 1
            m[1] += max(0, len(c._dirty) - n)
    c._apply = counted_apply  # type: ignore[method-assign,assignment]
    spy = None
    if os.environ.get("BENCH_PYSPY"):  # a profile of the idle window: py-spy's collapsed stacks
        import subprocess
        spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(os.getpid()),
                                "--duration", str(int(idle_s)), "--format", "raw", "--nonblocking", "--gil",
                                "-o", f"{os.environ['BENCH_PYSPY']}-{variant}-{os.getpid()}.txt"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gc_took: dict[tuple[str, int], list[float]] = {}  # (thread, generation) -> [collections, seconds, collected]
    gc_began = [0.0]

    def gc_timed(phase: str, info: dict[str, int]) -> None:  # the cycle collector's own time in the window
        if phase == "start":
            gc_began[0] = time.perf_counter()
            return
        got = gc_took.setdefault((threading.current_thread().name, info["generation"]), [0, 0.0, 0])
        got[0] += 1
        got[1] += time.perf_counter() - gc_began[0]
        got[2] += info["collected"]
    gc.callbacks.append(gc_timed)
    window_rss: list[int] = []
    sampling = threading.Event()

    evals_at: list[int] = []  # runs evaluated so far, each second: the most in any 10 s (a burst in step)

    def sample_rss() -> None:
        while not sampling.wait(1.0):
            window_rss.append(rss_bytes())
            evals_at.append(getattr(c, "runs_evaluated", 0))
    threading.Thread(target=sample_rss, daemon=True, name=SAMPLER).start()
    if aligned:
        aligned.append(applied(first_pass + int(idle_s // 30), idle_s + 120.0))
    else:
        time.sleep(idle_s)
    sampling.set()
    gc.callbacks.remove(gc_timed)
    # the window's figures as it ends: py-spy's wait below is not part of it (it ran up to 40 s past
    # the aligned end, a stretch of the loop no longer aligned to the agents' passes)
    took = time.monotonic() - w0
    by_thread = {name: (t - threads0.get(name, 0.0)) / took for name, t in _threads_cpu().items()}
    decode_core = (feed_cpu[1] - decode0) / took
    # the process less the feeds (the agents' and GPU's stand-ins) and the bench's own waiting and sampling
    # threads (none of them the controller's), plus the poller's decode the feeds did in its place
    process = (cpu_s() - c0 - (feed_cpu[0] - feed0)) / took + decode_core
    bench_own = sum(by_thread.get(name, 0.0) for name in ("MainThread", SAMPLER))
    idle = process - bench_own
    evaluated = getattr(c, "runs_evaluated", float("nan")) - evaluated0
    rechecked_idle = c.rechecked - rechecked0  # (`rechecked` counts from the start)
    by_deferral = getattr(getattr(c, "_rechecks", None), "deferred_due", 0) - deferred0
    if spy is not None:
        spy.wait(idle_s + 300)  # py-spy may take long past its duration to write under load
    c._apply = apply0  # type: ignore[method-assign]
    c._mark_all = mark_all0  # type: ignore[method-assign]
    relisted = {k: v - relists0.get(k, 0.0) for k, v in _relists(c).items() if v > relists0.get(k, 0.0)}
    progressing: dict[str, int] = {}
    for rc in list(c.claims.values()):
        progressing[rc.progressing.observed.value] = progressing.get(rc.progressing.observed.value, 0) + 1
    gpu_stop.set()
    gc.collect()
    if traced:
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        snap.dump(f"{traced}-{variant}-{os.getpid()}.snap")  # for other groupings (tracemalloc.Snapshot.load)
        with open(f"{traced}-{variant}-{os.getpid()}.txt", "w") as out:
            for key in ("lineno", "traceback"):
                stats = snap.statistics(key)
                out.write(f"# by {key}: {sum(s.size for s in stats) / 2**20:.1f} MiB in all\n")
                for st in stats[:40]:
                    out.write(f"{st.size / 2**20:8.2f} MiB {st.count:9d}\n")
                    out.write("".join(f"    {line}\n" for line in st.traceback.format()[-8:]))
        del snap, stats  # (its traces are Python objects: not in the heap figures below)
        gc.collect()
    if os.environ.get("BENCH_CENSUS"):
        _census(f"{os.environ['BENCH_CENSUS']}-{variant}-{os.getpid()}.txt")
    in_window = sorted(took for end, took, _ in passes if end >= w0)
    reads_by_pass = [b[2] - a[2] for a, b in zip(passes, passes[1:], strict=False) if b[0] >= w0]
    window = [p for end, p in reports if end >= w0]

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2] if xs else float("nan")
    budget = {"gets": median([p.gets for p in window]), "bytes": median([p.bytes for p in window]),
              "due": median([p.due for p in window]), "deferred": median([p.deferred for p in window]),
              "urgent_deferred": median([getattr(p, "urgent_deferred", 0) for p in window]),
              "claims": median([p.skipped.get("claims", 0) for p in window]),
              "rotation": median([p.skipped.get("rotation", 0) for p in window]),
              "agent": median([p.skipped.get("agent", 0) for p in window]), "passes": len(window),
              "ceiling": (getattr(c.cfg, "log_pass_max_gets", 0), getattr(c.cfg, "log_pass_max_bytes", 0)),
              "drain_s": drain_s}
    logs_out = {"log_targets": len(_log_targets(c)), "log_reads": log_reads[0] - reads0, "idle_s": idle_s,
                "budget": budget,
                "agent_log_pods": len(_agent_log_pods(c)), "reads_by_pass": reads_by_pass,
                "passes": (len(in_window), in_window[len(in_window) // 2], in_window[-1]) if in_window else None,
                "log_read_s": log_reads[1] - read_s0,
                # `steady` is taken before the first log pass: this is after it
                "after_idle": rss_bytes(), "evaluated": evaluated, "rechecked_idle": rechecked_idle,
                "by_deferral": by_deferral, "full_passes": full[0],
                "marks": dict(sorted(((f"{op} {res.name if res else ''}".strip(), m) for (op, res), m in marks.items()),
                                     key=lambda kv: -kv[1][1])[:8]),
                "progressing": progressing,
                "window_max": max(window_rss, default=0),
                "window_aligned": aligned, "window_s": took,
                "evals_10s": (max((b - a for a, b in zip(evals_at, evals_at[10:], strict=False)), default=0),
                              evaluated * 10 / took),
                "gc": {f"{name} gen{g}": (int(v[0]), round(v[1], 3), int(v[2]))
                       for (name, g), v in sorted(gc_took.items())},
                "threads": dict(sorted(((k, round(v, 4)) for k, v in by_thread.items() if v >= 0.0005),
                                       key=lambda kv: -kv[1]))}
    if logs:  # where that is: the log evidence held, or memory freed and not handed back
        index: Any = c.index  # (a `before` tree's: its signals by source, in a dict per object)
        held = list(index.all_signals()) if hasattr(index, "all_signals") else \
            [sig for by_source in list(index._signals.values()) for sig in list(by_source.values())]
        logs_out["signals_held"] = (len(held), sum(len(sig.scan.samples) for sig in held),
                                    sum(1 for sig in held if sig.scan.samples))  # (signals, samples, with samples)
        logs_out["queued"] = (c._changes.qsize(), getattr(getattr(c, "_log_backlog", None), "held", None))
        heap_after = heap_stats(f"{variant}-after")
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        heap_after["trimmed"] = rss_bytes() / 2**20
        logs_out["heap_after"] = heap_after
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the whole life so far
    tick_s = c.tick_s
    pods = len(c.index.keys_of_kind("Pod"))
    runs = len(c.claims)
    rechecked = c.rechecked
    # the watches go quiet: no list, event or bookmark marks a source fresh
    for r in (c.watch.reflectors if hasattr(c, "watch") else getattr(c, "_reflectors")):  # noqa: B009
        r.stop()
    time.sleep(2)  # a read in flight lands
    bound = max(c.index.synced.values()) + settings.claims.evidence_max_age
    shift[0] = bound + timedelta(seconds=1) - datetime.now(UTC)
    t1 = time.monotonic()
    late = float("nan")
    while time.monotonic() - t1 < (0 if os.environ.get("BENCH_NO_LATE") else 600):
        if all(rc.scheduled.observed.value == "unknown" for rc in list(c.claims.values())):
            late = time.monotonic() - t1 + 1.0
            break
        time.sleep(0.25)
    rechecked_late = c.rechecked - rechecked
    c.close()
    conn.send({"variant": variant, "sync_s": sync_s, "sync_cpu": sync_cpu, "peak": peak, "peak_at_sync": peak_sync,
               "steady": steady,
               "start": rss0, "idle_core": idle, "idle_process": process, "bench_own": bench_own,
               "decode_core": decode_core, "pods": pods, "runs": runs,
               "tick_s": tick_s,
               "rechecked": rechecked, "late_s": late, "rechecked_late": rechecked_late, **logs_out, "heap": heap,
               "list_modes": {k: v for k, v in list_modes.items() if v != "pages"}, "relisted_idle": relisted,
               **warm})


def _gpu_feed(c: Any, ctl: Any, stop: threading.Event, log_pods: str = "", used: list[float] | None = None,
              decoded: bool = False) -> None:
    """What the agent poller hands the loop each pass (each node's records as it is decoded, `"gpu-node"`,
    then the pass's end, `"gpu"`; a `before` tree: the whole pass in one `"gpu"`): every running GPU pod's devices,
    their utilization and power new each time, every node read now; with `log_pods` "gpu", also
    that the agents read those pods' logs (so the API poller reads only the others: the Ray heads,
    which hold no GPU and so are outside the agents' default scope); "all": every running pod's
    (`--log-scope all`; `_log_feed` hands their logs on). `used`: the feed's CPU seconds. `decoded`:
    the devices come through the agent poller's decode of each node's document (`parse_evidence`,
    after a JSON round trip: fresh strings and numbers, as off the wire)."""
    import random

    from collector.gpu import GpuDevice, PodGpuEvidence
    rng = random.Random(7)
    wait = 0.0
    while not stop.wait(wait):
        wait = 30.0
        t = time.thread_time()
        _gpu_pass(c, ctl, rng, log_pods, GpuDevice, PodGpuEvidence, decoded, used)
        if used is not None:
            used[0] += time.thread_time() - t


LIVE = ("live", "live-heads")  # the variants with live log evidence (`_live_feed`)
LIVE_MAX_STEPS = 500  # `live`: the most steps one head's document carries (the agent's read of a late pass)
LIVE_WARMUP = 5  # `live`: feed passes before the idle window (30 samples a pass: the histories fill and compact)


def _live_feed(c: Any, ctl: Any, stop: threading.Event, used: list[float], done: list[int],
               heads_only: bool = False) -> None:
    """What node agents reading every pod's logs hand the loop when every pod's trainer (its first
    container) prints a step a second: each pass (30 s), per trainer, the 30 samples printed since the
    pass before (`"agent-log"` after the last line sent), Megatron-style (a loss and the run's total
    steps); the first pass is each container's first document (a sidecar's: 3 lines, no step, then
    nothing new). The samples come through the agent poller's decode (`sources.agents`), not from
    scanning text. `used`: this thread's CPU, and of it the agent poller's decode (`used[1]`); `done`: one
    entry per pass handed on. `heads_only`: only the Ray heads' trainers print steps (a RayJob's driver
    prints the run's progress; its workers' trainers send their first document, as a sidecar, then
    nothing new)."""
    import random
    from dataclasses import replace as _replace

    import orjson

    from collector.correlate import Signal
    from collector.model import Ref
    from collector.sources import agents
    from collector.sources.agents import _scan as decode

    # the agent poller's decode of a container's entry: `log_entry` (a quiet increment a row, any other
    # its evidence), or in a tree before it `_scan`, every entry a scan
    log_entry = getattr(agents, "log_entry", None)

    def decoded(entries: list[dict[str, Any]], sources: list[str]) -> list[Any]:
        """A node's entries as the agent poller decodes its document: one body, parsed once, then each
        `logs` entry (`log_entry`: a quiet increment a row, any other its scan); timed as one (a timer
        call per container, 100,000 a pass, was part of the decode figure it measured)."""
        body = orjson.dumps({"logs": entries})
        t = time.thread_time()
        doc = orjson.loads(body)["logs"]
        out: list[Any]
        if log_entry is None:
            out = [decode(e, s) for e, s in zip(doc, sources, strict=True)]
        else:
            out = [got if type(got := log_entry(e, s)) is tuple else got.scan
                   for e, s in zip(doc, sources, strict=True)]
        used[1] += time.thread_time() - t
        return out

    try:  # a tree whose loop takes quiet rows: "agent-quiet" changes, each change queued with its weight
        from collector.planes.base import SCAN_WEIGHT, log_weight
        from collector.planes.node_agents import QUIET_CHUNK
    except ImportError:
        log_weight = None  # type: ignore[assignment]
    rng = random.Random(11)
    # The feed's own state lives in the controller's process (what it holds is counted there): by pod
    # name (the index's own string; the bench's pod names are unique across namespaces), the lines its
    # trainer printed so far. (By (namespace, pod, container) tuples it held ≈ 22 MiB at 50k pods.)
    sent: dict[str, int] = {}
    # A trainer's first step's time: it prints a step a second from then, so a document read late (a
    # loop behind, the feed held by the backlog) carries every step since the one before, stamped when
    # printed, as an agent's would; stamping a pass's documents at its start aged the last ones by the
    # pass's length (minutes under load: evidence stale when it came, no run ever deferred).
    began: dict[str, datetime] = {}
    _agent_source = _agent_sources()

    def pod_part(ref: Any, containers: tuple[str, ...], quiet_pod: bool, node: str, now: datetime,
                 entries: list[dict[str, Any]], sources: list[str], after: list[Any]) -> None:
        """One running pod's part of its node's document: each container's entry appended to `entries`
        (its scan's source to `sources`), and to `after` what is done with it once decoded
        (`handed`)."""
        n0 = sent.get(ref.name)
        first = n0 is None
        pod = Ref("Pod", ref.namespace, ref.name)  # (as off the wire: one per pod a document)
        for k, container in enumerate(containers):
            if k or quiet_pod:  # a sidecar (fluent-bit) or a worker: its first document, then quiet:
                # an increment with nothing new each pass (agents send every container each pass;
                # the loop only moves its read time: `planes.signals.adds_nothing`)
                entries.append(_entry(ref, container, now, 3, None if first else 3))
                sources.append(_agent_source(node, ref, container))
                after.append((pod, container, None if first else 3, now if first else None))
                continue
            start = began.setdefault(ref.name, now - timedelta(seconds=29))
            lines = n0 or 0
            n = max(1, min(LIVE_MAX_STEPS, int((now - start).total_seconds()) + 1 - lines))  # 30 a pass on time
            # the trainer's part of an agent's document, decoded as the agent poller decodes it
            # (JSON, then `sources.agents`: fresh numbers and stamps per sample, as off the wire)
            entries.append(_entry(ref, container, now, lines + n, n0, "megatron", [
                [1000 + lines + i, (start + timedelta(seconds=lines + i)).isoformat(), rng.uniform(1.5, 3.0),
                 False, 500_000, lines + i + 1] for i in range(n)]))
            sources.append(_agent_source(node, ref, container))
            after.append((pod, container, n0, start))
            sent[ref.name] = lines + n
        if quiet_pod or ref.name not in sent:
            sent[ref.name] = n0 or 0

    def handed(got: Any, pod: Any, container: str, n0: int | None, first_at: datetime | None, now: datetime,
               doc: list[tuple[Any, Any]], rows: list[Any]) -> None:
        """A decoded entry handed on: a quiet row to `rows`, any other as its change (and scan) to `doc`."""
        if type(got) is tuple:
            rows.append(got)
            return
        scan = got if first_at is None else _replace(got, first_at=first_at)
        doc.append((_change(ctl)("agent-log", None, (Signal(pod, container, scan, now), n0)), scan))

    wait = 0.0
    while not stop.wait(wait):
        wait = 30.0
        t = time.thread_time()
        # node by node, as agents' documents come: each document's containers handed on together
        # (`put_logs`: in batches, as the agent poller queues a document; a `before` tree one by one)
        put_logs = getattr(c, "put_logs", None)
        for node, pods in _pods_by_node(c, heads_only):
            # the document's read time: its node's (one object for all the node's containers, as the
            # poller stamps a document: `AgentReport.read_at`), not the pass's start
            now = c.now()
            entries: list[dict[str, Any]] = []
            sources: list[str] = []
            after: list[Any] = []
            for ref, containers, quiet_pod in pods:
                pod_part(ref, containers, quiet_pod, node, now, entries, sources, after)
            doc: list[tuple[Any, Any]] = []
            rows: list[Any] = []
            for got, (pod, container, n0, first_at) in zip(decoded(entries, sources), after, strict=True):
                handed(got, pod, container, n0, first_at, now, doc, rows)
            if log_weight is not None and put_logs is not None:  # (as `node_agents.log_changes` queues a document:
                source = _agent_source(node, None, "")  # its quiet rows first)
                put_logs([(_change(ctl)("agent-quiet", None, (now, source, rows[i:i + QUIET_CHUNK])),
                           SCAN_WEIGHT * len(rows[i:i + QUIET_CHUNK])) for i in range(0, len(rows), QUIET_CHUNK)] +
                         [(change, log_weight(scan)) for change, scan in doc])
            elif put_logs is not None:
                put_logs(doc)
            else:
                for change, scan in doc:
                    c.put_log(change, scan)
        used[0] += time.thread_time() - t
        done.append(len(sent))


def _entry(ref: Any, container: str, now: datetime, lines: int, after: int | None, fmt: str | None = None,
           samples: list[list[Any]] | None = None) -> dict[str, Any]:
    """A container's entry in its agent's document, every key as the agent renders it
    (`collector.agent.evidence._log`): a quiet container's with its lists empty (until 2026-12-06
    the bench decoded `{"lines": 3}` for those, which no agent sends)."""
    return {"namespace": ref.namespace, "pod": ref.name, "uid": f"uid-{ref.name}", "container": container,
            "read_at": now.timestamp(), "lines": lines, "format": fmt, "after": after, "samples": samples or [],
            "hangs": [], "xids": [], "resumes": [], "tokens": None, "diagnostics": []}


def _log_feed(c: Any, ctl: Any, url: str, stop: threading.Event, used: list[float],
              first_pass: threading.Event) -> None:
    """What node agents reading every pod's logs (`--log-scope all`) hand the loop each pass:
    per container, the lines read since the document before (`"agent-log"`, after the last line
    number sent), or the whole log the first time. The agent's own work (reading, parsing) is this
    thread's, counted in `used`; the loop's (extending histories, evaluating) is the controller's.
    Log reads go around the simulator's fault rules (the engine's user agent), so `--log-latency`
    slows only the controller's own reads."""
    from dataclasses import replace as _replace

    from collector.correlate import Signal
    from collector.logrotation import last_stamp
    from collector.model import Ref
    from collector.progress import scan_text
    from collector.sources.kube_api import KubeApi, SourceError, api_client_for
    from kubesim.faults import ENGINE_USER_AGENT
    client = api_client_for(url)
    client.user_agent = ENGINE_USER_AGENT
    api = KubeApi(client)
    seen: dict[tuple[str, str, str], tuple[int, str, str | None]] = {}  # container -> lines sent, last stamp, format
    _agent_source = _agent_sources()
    wait = 0.0
    while not stop.wait(wait):
        wait = 30.0
        t = time.thread_time()
        gpu_pods = set(c._gpus)
        for ref, containers, _, node in _running_pods(c):  # (every running pod: the agents read them all)
            for container in containers:
                key = (ref.namespace, ref.name, container)
                first = key not in seen
                sent, stamp, fmt = seen.get(key, (0, "", None))
                if not first and (ref.namespace, ref.name) in gpu_pods:
                    data = b""  # a quiet worker: read on the node, nothing new (not asked here)
                else:
                    query: list[tuple[str, Any]] = [("container", container), ("tailLines", 500),
                                                    ("timestamps", "true")]
                    if stamp:
                        query.append(("sinceTime", stamp[:19] + "Z"))
                    try:
                        data = api.get_text(f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/log", query)
                    except SourceError:
                        continue
                    if stamp:  # the agent's cursor: the lines after the last one sent (fixed-width stamps
                        # compare as text)
                        data = b"".join(line for line in data.splitlines(keepends=True)
                                        if line.split(b" ", 1)[0].decode("ascii", "replace") > stamp)
                scan = scan_text(data, source=_agent_source(node, ref, container))
                n = scan.lines
                fmt = scan.format or fmt  # the agent's document says the format found so far
                if not first:
                    scan = _replace(scan, samples=tuple(_replace(x, line=x.line + sent) for x in scan.samples),
                                    hangs=tuple(_replace(h, line=h.line + sent) for h in scan.hangs),
                                    xids=tuple(_replace(x, line=x.line + sent) for x in scan.xids),
                                    summary=None, lines=sent + n, format=fmt)
                seen[key] = (sent + n, (last_stamp(data) or stamp) if data else stamp, fmt)
                sig = Signal(Ref("Pod", ref.namespace, ref.name), container, scan, c.now())
                change = _change(ctl)("agent-log", None, (sig, None if first else sent))
                put_log = getattr(c, "put_log", None) or getattr(c, "_put_log", None)
                if put_log is not None:  # within the backlog of log evidence, as the agent poller queues
                    put_log(change, sig.scan)
                else:  # (a `before` tree)
                    c._put(change)
        used[0] += time.thread_time() - t
        first_pass.set()


def _gpu_pass(c: Any, ctl: Any, rng: Any, log_pods: str, GpuDevice: Any, PodGpuEvidence: Any,
              decoded: bool = False, used: list[float] | None = None) -> None:
    now = c.now()
    gpus, nodes = {}, {}
    try:
        keys = c.index.keys_of_kind("Pod")
    except RuntimeError:  # changed while read (the loop's thread): next pass
        return
    running: set[tuple[str, str]] = set()
    per_node = decoded and not os.environ.get("BENCH_GPU_WHOLE_PASS")
    held: dict[str, list[tuple[str, str, int]]] = {}  # per_node: each node's GPU pods (namespace, name, GPUs)
    for _, ns, name in keys:
        rec = c.index.get("Pod", ns, name)
        f = getattr(rec, "facts", None)
        if f is not None and getattr(f, "phase", "") == "Running":
            running.add((ns, name))
        if f is None or getattr(f, "gpus", 0) <= 0 or getattr(f, "phase", "") != "Running":
            continue
        if per_node:
            held.setdefault(f.node_name, []).append((ns, name, f.gpus))
            nodes[f.node_name] = now
            continue
        uuids = _UUIDS.get((ns, name))
        if uuids is None:  # canonical NVML UUIDs, as agents send them (one per device, the same each pass)
            uuids = _UUIDS[(ns, name)] = tuple(f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{ns}/{name}/{i}')}"
                                               for i in range(f.gpus))
        devs = tuple(GpuDevice(uuid=uuids[i], index=i, utilization=rng.uniform(0.85, 1.0),
                               sm_active=rng.uniform(0.6, 0.9), power_w=rng.uniform(500.0, 700.0),
                               power_limit_w=700.0 + 0.0 * i) for i in range(f.gpus))  # (fresh, as decoded)
        gpus[(ns, name)] = PodGpuEvidence(ns, name, f.node_name, "agent", now, devs, ("main",))
        nodes[f.node_name] = now
    put = getattr(c, "put", None) or c._put
    parts = _pass_parts()
    if per_node and parts is not None:  # as the agent poller hands a pass: each node's as it is decoded
        part, end, pid = parts
        named: set[tuple[str, str]] = set()
        for i, (node, pods) in enumerate(held.items()):
            recs = _node_records(node, pods, now, rng, used)
            put(_change(ctl)("gpu-node", None, part(pid, i, node, now, recs)))
            if log_pods == "gpu":
                named.update((g.namespace, g.pod) for g in recs)
        put(_change(ctl)("gpu", None, end(pid, {}, (), {"gpu": frozenset(named), "all": frozenset(running)}
                                          .get(log_pods, frozenset()))))
        return
    if per_node:
        gpus = _decoded_by_node(held, now, rng, used)
    elif decoded:
        gpus = _decoded(gpus, now, used)
    read = {"gpu": frozenset(gpus), "all": frozenset(running)}.get(log_pods, frozenset())
    if parts is None:  # (a `before` tree: the whole pass in one change)
        put(_change(ctl)("gpu", None, (gpus, nodes, read)))
        return
    from collector.planes.node_agents import pass_changes
    for ch in pass_changes(gpus, nodes, read):
        put(ch)


def _pass_parts() -> tuple[Any, Any, int] | None:
    """The tree's GPU pass parts (`planes.node_agents.NodePart`, `PassEnd`) and a new pass's number;
    None in a `before` tree that takes a pass in one change."""
    from collector.planes import node_agents
    if not hasattr(node_agents, "NodePart"):
        return None
    return node_agents.NodePart, node_agents.PassEnd, next(node_agents._PASSES)


_UUIDS: dict[tuple[str, str], tuple[str, ...]] = {}  # a pod's devices' UUIDs (`_gpu_pass`)


def _poller_decode() -> Any:
    """How the agent poller turns an `/evidence` body into a report (`sources.agents.decode_evidence`;
    a `before` tree without it: JSON, then `parse_evidence`)."""
    import orjson

    from collector.sources import agents
    got = getattr(agents, "decode_evidence", None)
    return got if got is not None else lambda body, ep, now: agents.parse_evidence(orjson.loads(body), ep, now)


def _timed(used: list[float] | None, f: Any, *args: Any) -> Any:
    """`f(*args)`, its CPU added to `used[1]` (the agent poller's decode: the controller's work)."""
    if used is None:
        return f(*args)
    t = time.thread_time()
    try:
        return f(*args)
    finally:
        used[1] += time.thread_time() - t


def _decoded(gpus: dict[tuple[str, str], Any], now: datetime,
             used: list[float] | None = None) -> dict[tuple[str, str], Any]:
    """`gpus` as the agent poller has them: each node's evidence document (its GPUs and the pods
    holding them) through the agent poller's decode (`_poller_decode`; its CPU in `used[1]`)."""
    import orjson

    from collector.sources.agents import EVIDENCE_VERSION, AgentEndpoint
    decode = _poller_decode()
    by_node: dict[str, list[dict[str, Any]]] = {}
    for ev in gpus.values():
        by_node.setdefault(ev.node, []).extend(
            {"uuid": d.uuid, "index": d.index, "utilization": d.utilization, "sm_active": d.sm_active,
             "power_w": d.power_w, "power_limit_w": d.power_limit_w,
             "pods": [{"namespace": ev.namespace, "pod": ev.pod, "container": c} for c in ev.containers]}
            for d in ev.devices)
    out = {}
    for node, devs in by_node.items():
        body = orjson.dumps({"version": EVIDENCE_VERSION, "node": node, "nvml": {"state": "ok"},
                             "podresources": {"up": True}, "gpus": devs})
        for ev in _timed(used, decode, body, AgentEndpoint(node, f"agent-{node}", "http://agent"), now).gpus:
            out[(ev.namespace, ev.pod)] = ev
    return out


# What an H100 reports every pass besides utilization, SM activity and power (`collector.agent.nvml`):
# the agent renders all of it (`_node_body`), and the poller decodes all of it.
_H100: dict[str, Any] = {"name": "NVIDIA H100 80GB HBM3", "power_limit_w": 700.0, "memory_used_bytes": 71 << 30,
         "memory_total_bytes": 80 << 30, "temperature_c": 61.0, "memory_clock_hz": 2.6e9,
         "remap_pending": False, "remap_failed": False,
         "ecc": (("uncorrected", "volatile", 0), ("uncorrected", "aggregate", 0), ("corrected", "volatile", 3))}


# An agent up five minutes or more: each GPU's energy window is the agent's longest
# (`collector.agent.nvml.ENERGY_WINDOW_S`), so energy per step walks the run's progress logs on every
# evaluation (with a 30 s window, as before 2026-12-06, it stopped at "under 60 s" and never did).
AGENT_ENERGY_WINDOW_S = 300.0


def _node_body(node: str, pods: list[tuple[str, str, int]], at: float, rng: Any) -> bytes:
    """A node's `/evidence` as its agent renders it (`collector.agent.evidence.evidence_document`, in
    the version the tree's poller asks for): each GPU with every reading an H100 reports (a power-cap
    throttle reason on ~30 %, an energy window, ECC counts), held by its pod (the kubelet's allocation);
    each device's canonical UUID derived from its pod's name (fresh strings, as off the wire; the energy
    window `AGENT_ENERGY_WINDOW_S`). A healthy
    fleet: a run's GPUs read alike within their spread (SM clocks a 15 MHz bin apart; a wider draw made
    half of them "apart" in the GPU comparison, as no healthy run reads)."""
    import hashlib

    import orjson

    from collector.agent.evidence import Snapshot, evidence_document
    from collector.agent.nvml import GpuReading, NvmlStatus
    from collector.agent.podresources import Allocation
    from collector.sources import agents
    version = getattr(agents, "EVIDENCE_VERSION", 1)
    gpus, allocs = [], []
    for ns, name, n in pods:
        base = int.from_bytes(hashlib.blake2b(f"{ns}/{name}".encode(), digest_size=16).digest(), "big")
        for i in range(n):
            h = f"{base ^ i:032x}"
            gpu = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            power = rng.uniform(500.0, 700.0)
            gpus.append(GpuReading(
                index=i, uuid=gpu, pci=f"0000:{0x18 + i:02x}:00.0", at=at, utilization=rng.uniform(0.85, 1.0),
                sm_active=rng.uniform(0.6, 0.9), power_w=power, sm_clock_hz=rng.choice((1.98e9, 1.965e9)),
                memory_util=rng.uniform(0.4, 0.6), pcie_tx_bps=rng.uniform(1e9, 4e9), pcie_rx_bps=rng.uniform(1e9, 4e9),
                nvlink_tx_bps=rng.uniform(4e10, 8e10), nvlink_rx_bps=rng.uniform(4e10, 8e10),
                energy_mj=10**9,
                energy_from=(at - AGENT_ENERGY_WINDOW_S, 10**9 - int(power * AGENT_ENERGY_WINDOW_S * 1000)),
                clocks_event_reasons=4 if rng.random() < 0.3 else 0, **_H100))
            allocs.append(Allocation(ns, name, "main", "nvidia.com/gpu", gpu))
    snap = Snapshot(node=node, at=at, nvml=NvmlStatus("ok", "", "550.54.15", len(gpus)), gpus=tuple(gpus),
                    hang_since={}, hang_sustain_s=300.0, allocations=tuple(allocs), podresources_up=True,
                    podresources_last_success=at, podresources_error="", xids=(), logs=())
    doc = evidence_document(snap, version=version) if version != 1 else evidence_document(snap)
    return orjson.dumps(doc)


def _decoded_by_node(held: dict[str, list[tuple[str, str, int]]], now: datetime,
                     rng: Any, used: list[float] | None = None) -> dict[tuple[str, str], Any]:
    """What the agent poller has after a pass: each node's evidence document as its agent renders it
    (`_node_body`), then the agent poller's decode (`_poller_decode`: its CPU in `used[1]`, the
    controller's own work), one node at a time, as the poller reads them (`AgentReader.read_each`: a
    document is parsed as it comes, never a whole pass's at once). BENCH_GPU_WHOLE_PASS=1 (a variant's
    `+wholepass`): the feed before (`_decoded`: every node's device entries built before the first is
    parsed, ~6 KB a GPU pod at once; the UUIDs' strings kept between passes, `_UUIDS`)."""
    out = {}
    for node, pods in held.items():
        for ev in _node_records(node, pods, now, rng, used):
            out[(ev.namespace, ev.pod)] = ev
    return out


def _node_records(node: str, pods: list[tuple[str, str, int]], now: datetime, rng: Any,
                  used: list[float] | None = None) -> tuple[Any, ...]:
    """A node's records as the agent poller has them: its agent's document (`_node_body`) through the
    poller's decode (its CPU in `used[1]`)."""
    from collector.sources.agents import AgentEndpoint
    body = _node_body(node, pods, now.timestamp(), rng)
    return tuple(_timed(used, _poller_decode(), body, AgentEndpoint(node, f"agent-{node}", "http://agent"),
                        now).gpus)


def _change(ctl: Any) -> Any:
    """The change type the loop takes (`collector.planes.base.Change`; the controller's own in a `before` tree)."""
    if hasattr(ctl, "_Change"):
        return ctl._Change
    from collector.planes.base import Change
    return Change


def _pods_by_node(c: Any, heads_only: bool = False) -> Iterator[tuple[str, list[tuple[Any, tuple[str, ...], bool]]]]:
    """`_running_pods` node by node (each node's agent sends one document): the pods' keys grouped by
    node first (references to the index's own keys), then each node's pods read as its document is made."""
    by_node: dict[str, list[tuple[str, str, str]]] = {}
    for key in _pod_keys(c):
        node = getattr(getattr(c.index.get(*key), "facts", None), "node_name", None)
        if node:
            by_node.setdefault(node, []).append(key)
    for node, held in by_node.items():
        yield node, [pod[:3] for _, ns, name in held if (pod := _running_pod(c, ns, name, heads_only)) is not None]


def _running_pods(c: Any, heads_only: bool = False) -> Iterator[tuple[Any, tuple[str, ...], bool, str]]:
    """Each running pod in the controller's index (its `Ref`, its running app containers, whether all
    of them are quiet: with `heads_only`, a pod not a Ray head; its node): what agents reading every
    pod's logs send, one pod at a time (the index read as the agents' documents come, nothing listed
    whole)."""
    for _, ns, name in _pod_keys(c):
        pod = _running_pod(c, ns, name, heads_only)
        if pod is not None:
            yield pod


def _pod_keys(c: Any) -> set[tuple[str, str, str]]:
    try:
        return cast(set[tuple[str, str, str]], c.index.keys_of_kind("Pod"))
    except RuntimeError:  # changed while read (the loop's thread): next pass
        return set()


def _running_pod(c: Any, ns: str, name: str, heads_only: bool) -> tuple[Any, tuple[str, ...], bool, str] | None:
    """`_running_pods`' entry for one pod; None: not running, or no app container running."""
    rec = c.index.get("Pod", ns, name)
    f = getattr(rec, "facts", None)
    if rec is None or f is None or getattr(f, "phase", "") != "Running":
        return None
    running = tuple(x.name for x in f.containers if not x.init and x.state == "running")
    if not running:
        return None
    return rec.ref, running, heads_only and getattr(f, "ray_node_type", "") != "head", f.node_name


def _agent_sources() -> Callable[[str, Any, str], str]:
    """The source the agent poller's decoding gives a container's scan in the tree measured, as a function
    of (node, pod ref, container): one string a node (`sources.agents.agent_source`), or in a tree before
    it one a container. Looked up once a feed, not per container."""
    from collector.sources import agents
    by_node = getattr(agents, "agent_source", None)
    if by_node is not None:
        return lambda node, ref, container: by_node(node)
    return lambda node, ref, container: f"agent:{node}:{ref.namespace}/{ref.name}/{container}"


def _log_targets(c: Any) -> list[Any]:
    """The containers the API log source reads now (`_log_targets` on the controller in a `before` tree)."""
    if hasattr(c, "sources"):
        src = c.sources.get("logs")
        return list(src.targets.current) if src is not None else []
    return list(c._log_targets)


def _agent_log_pods(c: Any) -> frozenset[Any]:
    return frozenset(getattr(c, "agent_log_pods", getattr(c, "_agent_log_pods", ())))


def _measure_tree(tree: str, url: str, idle_s: float, cpu: int | None, conn: Any, variant: str = "paged") -> None:
    """`variant` (paged or logs), with the collector of another source tree (`--before-tree`: the
    code before a change)."""
    root = Path(tree).resolve()
    stale = [name for name in sys.modules if name.split(".")[0] in ("collector", "exporters", "kubesim", "tests")
             and not Path(getattr(sys.modules[name], "__file__", None) or root).resolve().is_relative_to(root)]
    if stale:  # (`run_variant` starts the child with the tree first: nothing of this tree's is imported)
        raise RuntimeError(f"--before-tree {tree}: this tree's {stale[0]} imported before the swap")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import collector
    where = Path(collector.__file__ or "").resolve()
    if not where.is_relative_to(root):
        raise RuntimeError(f"--before-tree {tree}: collector imported from {where}")
    _measure(url, variant, idle_s, cpu, conn)


def time_lists(url: str) -> None:
    """Each resource's initial list alone, page by page as the controller reads it (no controller):
    how much of the sync is the API server's (here the simulator's) lists."""
    from collector.settings import Settings
    from collector.sources.decode import decoder_for
    from collector.sources.kube_api import KubeApi, api_client_for, resources_for

    api = KubeApi(api_client_for(url))
    resources, _ = api.discover(resources_for(Settings().taugrid))
    total = 0.0
    for r in resources:
        t = time.monotonic()
        listing = api.iter_list(r, decoder=decoder_for(r.api_version, r.kind, full=False))
        n = sum(1 for _ in listing)
        dt = time.monotonic() - t
        total += dt
        if n:
            print(f"  list {r.name:<28} {n:>8} objects {listing.pages:>5} pages {dt:8.2f} s "
                  f"({1000 * dt / max(1, listing.pages):.0f} ms/page)", flush=True)
    print(f"  all lists one after another: {total:.1f} s", flush=True)


class StoreClient:
    """The scenario engine's client, writing straight into a simulator's store: the handlers' store
    calls without HTTP (bodies and answers copied through JSON, as over the wire). Only the calls
    the engine makes; a full-size fleet plays in minutes instead of half an hour."""

    def __init__(self, sim: Any) -> None:
        import orjson

        from kubesim.clock import parse_time
        from kubesim.patch import MERGE_PATCH, apply_patch

        self.sim, self._json, self._time = sim, orjson, parse_time
        def merge(cur: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
            return apply_patch(cur, body, MERGE_PATCH)

        self._merge = merge

    def _copy(self, obj: Any) -> Any:
        return self._json.loads(self._json.dumps(obj))

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        rt = self.sim.resource(obj["apiVersion"], obj["kind"])
        ns = str((obj.get("metadata") or {}).get("namespace", ""))
        out: dict[str, Any] = self._copy(self.sim.store.create(rt, ns, self._copy(obj)))
        return out

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._copy(self.sim.store.get(self.sim.resource(api_version, kind), namespace, name))
        return out

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: dict[str, Any],
              sub: str = "") -> dict[str, Any]:
        body = self._copy(body)
        out: dict[str, Any] = self.sim.store.patch(self.sim.resource(api_version, kind), namespace, name,
                                                   lambda cur: self._merge(cur, body), subresource=sub)
        return out  # the engine does not read it

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.sim.store.delete(self.sim.resource(api_version, kind), namespace, name,
                                                    propagation="Background")
        return out

    def bind(self, namespace: str, pod: str, node: str) -> None:
        from kubesim.errors import ApiError

        def bind(obj: dict[str, Any]) -> dict[str, Any]:  # as the pods/binding handler does
            if (obj.get("spec") or {}).get("nodeName"):
                raise ApiError(409, f"pod {pod} is already assigned", reason="Conflict")
            return {**obj, "spec": {**(obj.get("spec") or {}), "nodeName": node}}
        self.sim.store.patch(self.sim.resource("v1", "Pod"), namespace, pod, bind)

    def append_log(self, namespace: str, pod: str, container: str, lines: list[str], when: str = "") -> None:
        self.sim.store.append_log(namespace, pod, container, [str(x) for x in lines],
                                  self._time(when) if when else None)

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        self.sim.store.rotate_log(namespace, pod, container)

    def close(self) -> None:
        pass


def _scenario_main(conn: Any, cpu: int | None, path: str, scale: float, window: int, http: bool,
                   train_every: str = "", live: bool = False) -> None:
    """The simulator with the scenario engine in one process (as `taugrid-evidence simulator` runs them)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    logging.disable(logging.CRITICAL)
    import yaml

    from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
    from kubesim.scenario import scenario_from_dict

    doc = yaml.safe_load(Path(path).read_text())
    if scale != 1.0:
        for entry in [*doc["cluster"].get("nodes", []), *doc.get("runs", [])]:
            if "count" in entry:
                entry["count"] = max(1, round(entry["count"] * scale))
    if train_every:  # every template trains at this cadence: longer logs (full 500-line tails at 1s)
        for tpl in (doc.get("templates") or {}).values():
            for step in tpl.get("timeline") or []:
                if isinstance(step.get("train"), dict):
                    step["train"]["every"] = train_every
    sc = scenario_from_dict(doc, path)
    horizon = max((r.at for r in sc.runs), default=0.0) + 60.0  # the last run started: admitted, bound, Running
    clock = ManualClock(datetime.now(UTC) - timedelta(seconds=horizon))
    sim = Simulator(clock=clock, settings=SimulatorSettings(seed=sc.seed, watch_window=window))
    url = sim.start("127.0.0.1:0")
    engine = ScenarioEngine(sc, url, clock)
    if not http:
        engine.client = StoreClient(sim)  # type: ignore[assignment]
    t0, c0 = time.monotonic(), cpu_s()
    engine.step_to(0.0)  # the cluster: nodes, queues, profiles
    setup_s = time.monotonic() - t0
    rv_setup = sim.store.resource_version
    t, last_print = 0.0, time.monotonic()
    while t < horizon:
        t = min(horizon, t + 30.0)
        engine.step_to(t)
        if time.monotonic() - last_print > 30:
            last_print = time.monotonic()
            print(f"    scenario t={t:.0f}/{horizon:.0f} s after {last_print - t0:.0f} s: "
                  f"{sim.store.resource_version} writes", flush=True)
    materialize_s = time.monotonic() - t0
    cpu_used = cpu_s() - c0
    clock.set(datetime.now(UTC))  # the fleet is current: its last writes were moments ago
    pods = sim.store.list_page(sim.resource("v1", "Pod"), "").items
    conn.send({"url": url, "nodes": len(sc.nodes), "runs": len(sc.runs), "pods": len(pods),
               "running": sum(1 for p in pods if p["status"].get("phase") == "Running"),
               "setup_s": setup_s, "materialize_s": materialize_s, "cpu_s": cpu_used, "rv_setup": rv_setup,
               "writes": sim.store.resource_version, "errors": engine.errors[:3], "horizon": horizon})
    if live:  # the fleet keeps training on wall time (heads print their steps) until the bench closes it
        engine._origin = datetime.now(UTC) - timedelta(seconds=horizon)  # scenario time `horizon` is now
        t_live = time.monotonic()
        while not conn.poll(0.5):
            engine.step_to(horizon + time.monotonic() - t_live)
    engine.stop()
    conn.recv()  # close
    sim.close()


class ScenarioSim:
    """A simulator process filled by playing a scenario file."""

    def __init__(self, cpu: int | None, path: Path, scale: float, window: int, http: bool = False,
                 train_every: str = "", live: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_scenario_main,
                                args=(child, cpu, str(path), scale, window, http, train_every, live),
                                daemon=True)
        self.proc.start()
        self.info: dict[str, Any] = self.conn.recv()
        self.url: str = self.info["url"]

    def close(self) -> None:
        self.conn.send("close")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


def fill_from_scenario(path: Path, scale: float, per_run: int, cpu: int | None, http: bool,
                       train_every: str = "", live: bool = False) -> ScenarioSim:
    """Play the scenario; print its figures beside the store-API populate of as many pods (same run)."""
    sim = ScenarioSim(cpu, path, scale, 10_000, http, train_every, live)
    i = sim.info
    print(f"scenario {path} (scale {scale:g}): {i['runs']} runs, {i['nodes']} nodes -> {i['pods']} pods "
          f"({i['running']} Running) in {i['materialize_s']:.0f} s wall, {i['cpu_s']:.0f} CPU-s "
          f"(nodes and queues {i['setup_s']:.1f} s); {i['writes']} writes {'over HTTP' if http else 'in-process'}, "
          f"{i['writes'] / i['materialize_s']:.0f} writes/s; errors {i['errors'] or 'none'}", flush=True)
    base = SimProcess(cpu, 10_000)
    try:
        t = time.monotonic()
        info = base.call("populate", 0, max(1, i["pods"] // per_run), per_run, i["nodes"])
        fill_s = time.monotonic() - t
    finally:
        base.close()
    print(f"baseline: store-API populate of {info['pods']} pods ({i['nodes']} nodes, no HTTP, no lifecycle) "
          f"in {fill_s:.0f} s; the scenario took {i['materialize_s'] / max(fill_s, 1e-9):.1f}x as long", flush=True)
    return sim


def run_variant(url: str, variant: str, idle_s: float, cpu: int | None, before_tree: str = "") -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    name, allocator = variant.split("+", 1) if "+" in variant else (variant, "")
    if name.startswith("before"):
        proc = ctx.Process(target=_measure_tree, args=(before_tree, url, idle_s, cpu, child,
                                                       name.removeprefix("before-") if "-" in name else "paged"),
                           daemon=True)
    else:
        proc = ctx.Process(target=_measure, args=(url, name, idle_s, cpu, child), daemon=True)
    # `VARIANT+malloc`: the controller's interpreter started with PYTHONMALLOC=malloc; `VARIANT+wholepass`:
    # the GPU feed before (`_decoded_by_node`)
    env = ("BENCH_GPU_WHOLE_PASS", "1") if allocator == "wholepass" else ("PYTHONMALLOC", allocator)
    was = os.environ.get(env[0])
    if allocator:
        os.environ[env[0]] = env[1]
    # A `before` variant's child starts with the other tree first on its path (spawn hands the child this
    # process's sys.path), so every import of the collector it makes is that tree's, the bench's own
    # top-level ones included. It used to import this tree's first, then swap (`_measure_tree`): the
    # modules the bench's imports kept alive stayed, ≈ 5 MiB of Python objects and 7 MiB of RSS counted
    # against every baseline until 2026-12-08.
    tree = str(Path(before_tree).resolve()) if name.startswith("before") else ""
    if tree:
        sys.path.insert(0, tree)
    try:
        proc.start()
    finally:
        if tree:
            sys.path.remove(tree)
        if allocator:
            os.environ.pop(env[0])
            if was is not None:
                os.environ[env[0]] = was
    try:
        if not parent.poll(2400):
            raise TimeoutError(f"{variant}: no result")
        out: dict[str, Any] = parent.recv()
        out["variant"] = variant
        return out
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--per-run", type=int, default=10, help="pods per run (runs = pods / per-run)")
    ap.add_argument("--nodes", type=int, default=0, help="nodes (default: pods / 10)")
    ap.add_argument("--gpu-nodes", action="store_true",
                    help="each node's 8 GPUs held by one of its pods, the others holding none (at the default "
                    "10 pods a node: one GPU pod a node and a run, 8 GPUs a node); default: every pod 8 GPUs "
                    "whatever its node holds (80 a node at 10 pods a node)")
    ap.add_argument("--idle-s", type=float, default=15.0)
    ap.add_argument("--variants", default="baseline,paged")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the controller and simulator to CPUs 0 and 1")
    ap.add_argument("--scenario", type=Path, help="fill the cluster by playing this scenario file (see above)")
    ap.add_argument("--scale", type=float, default=1.0, help="with --scenario: multiply its run and node counts")
    ap.add_argument("--http", action="store_true", help="with --scenario: play it through the simulator's HTTP API "
                    "(as `taugrid-evidence simulator` does; ~27 min at full size) instead of into its store directly")
    ap.add_argument("--before-tree", default="", help="variant `before`: paged, with the collector of this source "
                    "tree (e.g. `git archive HEAD~1 | tar -x -C DIR`), against the same cluster in the same run")
    ap.add_argument("--train-every", default="", help="with --scenario: every template's `train` at this cadence "
                    "(e.g. 1s: heads' logs fill the 500-line tail the poller reads, as long runs' do)")
    ap.add_argument("--live", action="store_true", help="with --scenario: after the play the fleet keeps training "
                    "on wall time (heads print a step at their cadence) while the variants run; otherwise logs "
                    "stop growing when the play ends, and every run is stalled by the end of a variant's idle window")
    ap.add_argument("--log-latency", type=float, default=0.0, help="seconds the simulator waits before answering "
                    "each log GET (a kubelet-proxied read's round trip; 0: the simulator's own speed)")
    ap.add_argument("--time-lists", action="store_true", help="first time each resource's list alone (no controller)")
    a = ap.parse_args()
    if any(v.startswith("before") for v in a.variants.split(",")) and not a.before_tree:
        ap.error("variants `before`, `before-logs` and `before-logs-gpu` need --before-tree")
    ncpu = len(os.sched_getaffinity(0))
    pin = not a.no_pin and ncpu >= 2
    runs = a.pods // a.per_run
    nodes = a.nodes or max(1, a.pods // 10)
    sim: SimProcess | ScenarioSim
    if a.scenario is not None:
        sim = fill_from_scenario(a.scenario, a.scale, a.per_run, 1 if pin else None, a.http, a.train_every, a.live)
    else:
        sim = SimProcess(1 if pin else None, 10_000)
    try:
        if isinstance(sim, SimProcess):
            t = time.monotonic()
            info = sim.call("populate", 0, runs, a.per_run, nodes, a.gpu_nodes)
            fill_s = time.monotonic() - t
            size = sum(info["sizes"]) / max(1, len(info["sizes"]))
            held = f"{info['gpus']:,} GPUs held, at most {info['gpus_node_max']} a node (nodes of 8)"
            print(f"cluster: {info['pods']} pods ({size / 1024:.1f} KB JSON each), {runs} runs, {nodes} nodes, "
                  f"{held}; filled in {fill_s:.0f} s", flush=True)
        if a.log_latency > 0:  # the simulator's fault rule: every log GET waits this long first
            import urllib.request
            urllib.request.urlopen(urllib.request.Request(
                f"{sim.url}/_sim/faults", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"action": "delay", "delay_s": a.log_latency, "verbs": ["logs"]}).encode()), timeout=10)
            print(f"log GETs answered after {1000 * a.log_latency:.0f} ms", flush=True)
        if a.time_lists:
            time_lists(sim.url)
        results = []
        for v in a.variants.split(","):
            r = run_variant(sim.url, v, a.idle_s, 0 if pin else None, a.before_tree)
            results.append(r)
            print(f"  {v}: {r}", flush=True)
    finally:
        sim.close()
    mib = 1024 * 1024
    print(f"\n{'variant':<10} {'pods':>7} {'runs':>6} {'sync s':>8} {'sync CPU':>9} {'peak MiB':>9} {'steady MiB':>11} "
          f"{'peak/steady':>12} {'idle core':>10} {'tick s':>7} {'late s':>7} {'rechecked':>15}")
    for r in results:
        print(f"{r['variant']:<10} {r['pods']:>7} {r['runs']:>6} {r['sync_s']:>8.1f} {r['sync_cpu']:>9.1f} "
              f"{r['peak'] / mib:>9.0f} {r['steady'] / mib:>11.0f} {r['peak'] / r['steady']:>12.2f} "
              f"{r['idle_core']:>10.3f} {r['tick_s']:>7.1f} {r['late_s']:>7.1f} "
              f"{str(r['rechecked']) + '/' + str(r['rechecked_late']):>15}")
    for r in results:
        if r.get("relisted_idle"):
            print(f"{r['variant']}: relisted in the idle window (a watch fell behind the server's retained "
                  f"versions; its CPU is in the idle figure): {r['relisted_idle']}")
    for r in results:
        h = r["heap"]
        print(f"{r['variant']}: steady heap (MiB): Python objects {h['py_used']:.0f} (+{h['py_free']:.0f} free in "
              f"its arenas; {h.get('py_arenas', float('nan')):.0f} arenas mapped), "
              f"malloc {h['malloc_used']:.0f} in use + {h['malloc_free']:.0f} free, "
              f"{h['mmapped']:.0f} mmapped; RSS after malloc_trim(0) {h['trimmed']:.0f}")
    for r in results:
        if "logs" in r["variant"]:
            per = r["log_read_s"] / max(1, r["log_reads"])
            print(f"{r['variant']}: {r['log_targets']} containers polled every 30 s; {r['log_reads']} log GETs in "
                  f"the idle {r['idle_s']:.0f} s after the first pass ({r['log_reads'] / r['idle_s']:.1f}/s, "
                  f"{1000 * per:.1f} ms each); idle {r['idle_core']:.3f} core; RSS after it "
                  f"{r['after_idle'] / mib:.0f} MiB; {r['evaluated']} runs evaluated in it "
                  f"({r.get('rechecked_idle')} by their clocks); progressing {r.get('progressing')}")
            print(f"{r['variant']}: changes applied in the idle window that marked runs (changes, new marks): "
                  f"{r.get('marks')}")
            if r.get("passes"):
                n, median, longest = r["passes"]
                print(f"{r['variant']}: {n} log passes ended in the idle window, median {median:.1f} s, "
                      f"longest {longest:.1f} s (interval 30 s)")
    print("goals at 50,000 pods: steady <= 300 MiB, peak <= 1.2x steady, idle <= 0.1 core")
    _print_log_budget(results)
    _print_live(results)


def _print_live(results: list[dict[str, Any]]) -> None:
    """Issue 30's fleet memory goal with live evidence (variant `live`), beside `paged` (no live
    evidence) of the same run: steady after the idle window, the window's highest RSS and the life's
    peak, idle core, MiB per 1k pods (all of it, and what the live evidence adds)."""
    live = [r for r in results if r["variant"].split("+")[0].removeprefix("before-") in LIVE]
    if not live:
        return
    base = next((r for r in results if r["variant"] == "paged"), None)
    mib = 2**20
    print("\nlive evidence (every container a step a second via agents, GPU readings every 30 s):")
    print(f"{'variant':<8} {'pods':>7} {'steady MiB':>11} {'window max':>11} {'peak MiB':>9} {'peak/steady':>12} "
          f"{'idle core':>10} {'MiB/1k pods':>12} {'samples held':>13}")
    for r in [*live, *([base] if base else [])]:
        steady = r["after_idle"] if r["variant"].split("+")[0].removeprefix("before-") in LIVE else r["steady"]
        held = r.get("signals_held", (0, 0, 0))
        print(f"{r['variant']:<8} {r['pods']:>7} {steady / mib:>11.0f} {r.get('window_max', 0) / mib:>11.0f} "
              f"{r['peak'] / mib:>9.0f} {r['peak'] / steady:>12.2f} {r['idle_core']:>10.3f} "
              f"{1000 * steady / mib / max(1, r['pods']):>12.2f} {f'{held[1]}/{held[0]}':>13}")
    for r in live:
        print(f"{r['variant']}: of its idle core, the agent poller's decode of the agents' documents (bytes to "
              f"records) {r.get('decode_core', 0.0):.3f}")
    for r in live:
        if r.get("window_aligned"):
            ok = all(r["window_aligned"])
            print(f"{r['variant']}: the window {r['window_s']:.0f} s, from the loop having applied a live pass to "
                  f"its having applied the {int(r['idle_s'] // 30)}th after it" + (
                      "" if ok else " (NOT aligned: a pass was still being applied when a limit ran out)"))
    for r in live:
        if r.get("evals_10s"):
            most, mean = r["evals_10s"]
            print(f"{r['variant']}: {r['evaluated']} runs evaluated in the window ({r['by_deferral']} as a deferral "
                  f"came due); the most in any 10 s of it {most} (mean {mean:.0f}): runs evaluated together")
    for r in live:
        if "warmed" in r:
            print(f"{r['variant']}: warm-up ({LIVE_WARMUP} feed passes) " + (
                f"took {r['warmup_s']:.0f} s" if r["warmed"] else
                f"NOT finished in {r['warmup_s']:.0f} s (BENCH_WARMUP_S): its figures are of a start that did "
                "not catch up, not of a steady state"))
    for r in live:
        if r.get("threads"):  # (the bench's own feed threads among them: the idle figure leaves them out)
            print(f"{r['variant']}: CPU by thread in the window (core; /proc, 10 ms ticks): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["threads"].items())
                  + (f"; idle {r['idle_core']:.3f} leaves out the bench's own threads ({r['bench_own']:.3f}: "
                     f"the process less the feeds read {r['idle_process']:.3f})" if "bench_own" in r else ""))
    for r in live:
        if r.get("gc"):  # (where each thread's collections ran: a collection runs in the thread allocating)
            print(f"{r['variant']}: the cycle collector in the window (thread generation: collections, seconds, "
                  "objects collected): " + "; ".join(f"{k} {v[0]}, {v[1]:.2f} s, {v[2]}" for k, v in r["gc"].items()))
    for r in live:
        h = r.get("heap_after") or {}
        if h:
            print(f"{r['variant']}: heap after the idle window (MiB): Python objects {h['py_used']:.0f} "
                  f"(+{h['py_free']:.0f} free in its pools; {h.get('py_arenas', float('nan')):.0f} arenas of 1 MiB "
                  f"mapped), malloc {h['malloc_used']:.0f} in use + {h['malloc_free']:.0f} free, "
                  f"{h['mmapped']:.0f} mmapped; RSS after malloc_trim(0) {h['trimmed']:.0f}")
    for r in live:
        steady = r["after_idle"]
        extra = f"; live evidence adds {(steady - base['steady']) / mib:.0f} MiB " \
                f"({1000 * (steady - base['steady']) / mib / max(1, r['pods']):.2f} MiB per 1k pods) over paged" \
            if base else ""
        print(f"goal at 50k pods: steady <= 300 MiB, peak <= 1.2x steady, idle <= 0.1 core: {steady / mib:.0f} MiB, "
              f"peak {r['peak'] / steady:.2f}x, {r['idle_core']:.3f} core at {r['pods']} pods{extra}")


def _print_log_budget(results: list[dict[str, Any]]) -> None:
    """Issue 30's goal for the default path without agents, each variant beside the baseline of
    the same run (`logs-unbounded`): idle core at this size and per 1k pods, GETs and bytes a pass."""
    rows = [r for r in results if r.get("budget") and r["budget"]["passes"]]
    if not rows:
        return
    print("\nwithout agents (controller alone), API log reads per pass (medians over the passes in the idle window):")
    print("(window after the start's backlog: " + ", ".join(f"{r['variant']} {r['budget'].get('drain_s', 0):.0f} s"
                                                           for r in rows) + ")")
    print(f"{'variant':<16} {'pods':>7} {'ceiling gets/MiB':>17} {'GETs/pass':>10} {'MiB/pass':>9} {'due':>7} "
          f"{'deferred':>9} {'urgent cut':>10} {'skip claims':>11} {'skip rot.':>10} {'idle core':>10} "
          f"{'core/1k pods':>13} {'RSS after MiB':>14}")
    for r in rows:
        b = r["budget"]
        gets, mib = b["ceiling"]
        print(f"{r['variant']:<16} {r['pods']:>7} {f'{gets}/{mib / 2**20:.0f}':>17} {b['gets']:>10.0f} "
              f"{b['bytes'] / 2**20:>9.2f} {b['due']:>7.0f} {b['deferred']:>9.0f} {b['urgent_deferred']:>10.0f} "
              f"{b['claims']:>11.0f} {b['rotation']:>10.0f} {r['idle_core']:>10.3f} "
              f"{1000 * r['idle_core'] / max(1, r['pods']):>13.4f} {r['after_idle'] / 2**20:>14.0f}")
    base = next((r for r in rows if r["variant"] == "logs-unbounded"), None)
    for r in rows:
        if r["variant"] == "logs":
            # (not extrapolated: the ceiling holds the GETs whatever the size; run two sizes for the slope)
            print(f"goal: without agents, idle <= 0.15 core at 50k pods: {r['idle_core']:.3f} core at {r['pods']} pods "
                  f"({'met' if r['idle_core'] <= 0.15 else 'missed'} at this size; "
                  f"{1000 * r['idle_core'] / max(1, r['pods']):.4f} core per 1k pods); "
                  f"{r['budget']['gets']:.0f} GETs and {r['budget']['bytes'] / 2**20:.1f} MiB a pass, "
                  f"{r['budget']['deferred']:.0f} left by the ceiling"
                  + (f"; baseline (logs-unbounded, same run) {base['idle_core']:.3f} core, "
                     f"{base['budget']['gets']:.0f} GETs and {base['budget']['bytes'] / 2**20:.1f} MiB a pass"
                     if base is not None else ""))


if __name__ == "__main__":
    main()
