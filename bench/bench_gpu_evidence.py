"""The controller's GPU evidence per pod (issue 30): bytes held, and what reading it costs, beside
another tree's in the same run.

Per node one agent evidence document as `collector/agent/evidence.py` writes it (8 GPUs held by one
pod, every reading an H100 reports: utilization, SM activity, power and its limit, SM clock, memory
bandwidth, PCIe and NVLink throughput, an energy window, a power-cap clocks reason on 30 % of them,
ECC counts), or (`--shape bench`) as bench_fleet.py's `live` variant forms it (four readings a GPU),
through JSON and `sources.agents.parse_evidence`, as the agent poller decodes it. Figures:

  steady     bytes per pod the evidence of one pass holds (tracemalloc; its strings, the interned
             names' table share and the dict holding it by pod included)
  two passes both passes held (the next decoded while the last is held, as the controller swaps)
  read       one attribute of a device (ns; a slot read of the dataclass before)
  summary    `gpu_summary` over 64 pods (512 GPUs), what every run's evaluation does
  signals    `claims.workrisk.with_gpu_signals` over the same, also every evaluation
  spread     `claims.gpuspread._core` over the same, on each new pass of the run's evidence
  energy     each device's energy window over the same, as `claims.energy` reads them on every
             evaluation (`gpu.energy_windows` where the tree has it, else `energy_window` a device)
  same       `planes.node_agents.same_devices` of the 64 pods against the next pass's (every pass)
  devices    `PodGpuEvidence.devices` of the 64 pods (built on access where packed; ADX rows read it)
  parse      `parse_evidence` of 64 node documents (one agents' pass over 64 nodes)

`--before-tree DIR` (e.g. `git archive 1b82892 | tar -x -C DIR`) runs the same in a child process
with DIR's collector, interleaved with this tree's (`--repeats` times; medians, CPU time of the thread).

Usage: .venv/bin/python bench/bench_gpu_evidence.py [--pods 5000] [--shape full] [--before-tree DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AT = 1_780_000_000.0


def documents(nodes: int, shape: str, seed: int = 7) -> list[bytes]:
    import orjson

    from collector.sources.agents import EVIDENCE_VERSION
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        pod = [{"namespace": "team-a", "pod": f"job-{n}-worker-0", "container": "main", "resource": "nvidia.com/gpu"}]
        gpus: list[dict[str, Any]] = []
        for i in range(8):
            if shape == "bench":
                gpus.append({"uuid": f"GPU-team-a-job-{n}-worker-0-{i}", "index": i,
                             "utilization": rng.uniform(0.85, 1.0), "sm_active": rng.uniform(0.6, 0.9),
                             "power_w": rng.uniform(500.0, 700.0), "power_limit_w": 700.0, "pods": pod})
                continue
            gpus.append({
                "index": i, "uuid": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", "name": "NVIDIA H100 80GB HBM3",
                "pci": f"0000:{i:02x}:00.0", "parent_uuid": None, "lost": False, "error": None, "at": AT,
                "utilization": rng.uniform(0.85, 1.0), "sm_active": rng.uniform(0.6, 0.9),
                "power_w": rng.uniform(500.0, 700.0), "power_limit_w": 700.0,
                "sm_clock_hz": 1.98e9 - 1.5e7 * rng.randrange(3), "memory_util": rng.uniform(0.3, 0.6),
                "pcie_bps": rng.uniform(1e8, 1e9), "nvlink_bps": rng.uniform(1e10, 1e11),
                "energy": [AT - 600.0, AT, rng.uniform(3e5, 4e5)],
                "clocks_event_reasons": ["sw_power_cap"] if rng.random() < 0.3 else [],
                "memory_used_bytes": 7e10, "memory_total_bytes": 8e10, "temperature_c": 60,
                "remap_pending": False, "remap_failed": False, "hang_since": None, "hang_hint": False,
                "pods": pod, "sharers": 1, "shared": False, "unsupported": [], "xid_first_seen": {},
                "ecc_uncorrected": {"volatile": 0, "aggregate": 0}, "ecc_corrected": {"volatile": 0, "aggregate": 3}})
        doc = {"version": 1, "node": f"node-{n}", "at": AT, "nvml": {"state": "ok"}, "podresources": {"up": True},
               "gpus": gpus}
        out.append(orjson.dumps(_as_agent_sends(doc, EVIDENCE_VERSION)))
    return out


def _as_agent_sends(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """A version 1 document in the version the tree's reader asks for, as its agent renders it."""
    from collector.agent import evidence
    if version >= 4:
        return evidence.packed(evidence.for_controller(doc))
    if version == 3:
        return evidence.for_controller(doc)
    return evidence.as_columns(doc) if version == 2 else doc


def measure(pods: int, shape: str) -> dict[str, float]:
    import orjson

    import collector.gpu as gpu
    from collector.claims import gpuspread
    from collector.claims.workrisk import with_gpu_signals
    from collector.riskfacts import NodeRisk, WorkAtRisk
    from collector.sources.agents import AgentEndpoint, parse_evidence

    if not Path(gpu.__file__).resolve().is_relative_to(Path(os.environ["TAUGRID_BENCH_TREE"]).resolve()):
        raise RuntimeError(f"collector imported from {gpu.__file__}")
    docs = documents(pods, shape)
    ends = [AgentEndpoint(f"node-{n}", f"agent-{n}", "http://agent") for n in range(pods)]
    read_at = datetime.now(UTC)

    def one_pass() -> dict[tuple[str, str], Any]:
        held = {}
        for doc, end in zip(docs, ends, strict=True):
            for ev in parse_evidence(orjson.loads(doc), end, read_at).gpus:
                held[(ev.namespace, ev.pod)] = ev
        return held

    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    held = one_pass()
    gc.collect()
    steady = tracemalloc.get_traced_memory()[0] - start
    held2 = one_pass()
    gc.collect()
    both = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    out = {"steady B/pod": steady / len(held), "two passes B/pod": both / len(held)}

    def cost(stmt: str, number: int, names: dict[str, Any]) -> float:
        t = timeit.Timer(stmt, timer=time.thread_time, globals=names)
        return min(t.repeat(repeat=7, number=number)) / number

    some = list(held.values())[:64]
    d = some[0].devices[0]
    for name in ("uuid", "utilization", "lost", "xids", "index"):
        out[f"read {name} ns"] = cost(f"d.{name}", 100_000, {"d": d}) * 1e9
    keys = [(e.namespace, e.pod) for e in some]
    risk = WorkAtRisk(1.0, 512, None, "run-start", "",
                      nodes=tuple(NodeRisk(e.node, 0.0, (), (), 8, 1.0) for e in some))
    names = {"gpu": gpu, "gpuspread": gpuspread, "signals": with_gpu_signals, "some": some, "keys": keys,
             "risk": risk, "at": read_at, "age": timedelta(minutes=5), "parse": parse_evidence, "orjson": orjson,
             "docs": docs[:64], "ends": ends[:64]}
    out["summary us"] = cost("gpu.gpu_summary(some, keys, at, age)", 200, names) * 1e6
    out["signals us"] = cost("signals(risk, some, at, age)", 200, names) * 1e6
    out["spread us"] = cost("gpuspread._core(some)", 10, names) * 1e6
    energy = "[gpu.energy_windows(e) for e in some]" if hasattr(gpu, "energy_windows") else \
        "[[gpu.energy_window(d) for d in e.devices] for e in some]"
    out["energy us"] = cost(energy, 200, names) * 1e6
    from collector.planes.node_agents import same_devices
    names["same"], names["nxt"] = same_devices, list(held2.values())[:64]
    out["same us"] = cost("[same(a, b) for a, b in zip(some, nxt)]", 200, names) * 1e6
    out["devices us"] = cost("[e.devices for e in some]", 200, names) * 1e6
    out["parse us"] = cost("[parse(orjson.loads(x), e, at) for x, e in zip(docs, ends)]", 5, names) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--shape", choices=("full", "bench"), default="full")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before-tree", default="", help="another tree's collector, measured beside this one")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.json:
        sys.path.insert(0, str(a.tree))
        print(json.dumps(measure(a.pods, a.shape)))
        return
    trees = [("now", ROOT)] + ([("before", Path(a.before_tree))] if a.before_tree else [])
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(a.repeats):
        for name, tree in trees:
            out = subprocess.run([sys.executable, __file__, "--json", "--tree", str(tree), "--pods", str(a.pods),
                                  "--shape", a.shape], capture_output=True, text=True, check=True,
                                 env={**os.environ, "TAUGRID_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)})
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"GPU evidence, {a.pods} pods of 8 GPUs, shape {a.shape}, median of {a.repeats} "
          f"(load {os.getloadavg()[0]:.1f})")
    print(f"{'':<20}" + "".join(f"{name:>12}" for name, _ in trees) + ("   now/before" if a.before_tree else ""))
    for k in got["now"][0]:
        meds = [statistics.median(g[k] for g in got[name]) for name, _ in trees]
        ratio = f"   x{meds[0] / meds[1]:.2f}" if a.before_tree else ""
        print(f"{k:<20}" + "".join(f"{m:12.1f}" for m in meds) + ratio)


if __name__ == "__main__":
    main()
