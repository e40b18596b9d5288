"""Same output from GPU evidence as another tree (issue 30: a pod's devices packed together): every
`RunClaims` (repr and to_json), the Prometheus exposition, the GPU readers' answers, the records'
repr and the ADX rows, byte for byte, over seeded runs with GPU evidence of every shape: lost GPUs,
hang hints, XIDs and their ages, shared GPUs, MIG and non-canonical UUIDs, NaN/±inf/-0.0 readings,
readings absent, values of odd types kept aside, ECC counts, row remaps, energy windows.

Each tree computes the same seeded cases in a child process (PYTHONPATH = the tree) and prints one
digest per case; a case that differs is printed from both trees.

Usage: .venv/bin/python bench/gpu_differential.py --before-tree DIR [--cases 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import random
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ODD_FLOATS = [math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1e308]
REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "gpu_idle", "sw_thermal_slowdown")
XIDS = (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95)


def a_uuid(rng: random.Random, p: int, i: int) -> object:
    canon = str(uuid.UUID(int=p << 64 | (i * 0x9E3779B97F4A7C15) % (1 << 64)))
    return rng.choice([f"GPU-{canon}", f"GPU-{canon}", f"GPU-{canon}", f"MIG-{canon}", f"GPU-{canon.upper()}",
                       f"GPU-{p}-{i}", "GPU-shared", f"MIG-GPU-{canon}/1/0", f"GPU-{canon}"[:-1] + "g",
                       f"GPU-{str(uuid.UUID(int=7))}", f" GPU-{canon}"[:40], ""])


def reading(rng: random.Random, lo: float, hi: float, odd: bool) -> object:
    r = rng.random()
    if r < 0.7:
        return rng.uniform(lo, hi)
    if r < 0.82:
        return None
    if r < 0.97 or not odd:
        return rng.choice(ODD_FLOATS)
    return rng.choice([int(hi), 0, True, "1.0"])  # (odd types, in some cases: kept aside as given)


def device(rng: random.Random, p: int, i: int, clean: bool, slow: bool, odd: bool) -> dict[str, Any]:
    u = a_uuid(rng, p, i)
    if clean:
        jit = rng.uniform(-0.02, 0.02)
        return {"uuid": u if rng.random() < 0.3 else f"GPU-{uuid.UUID(int=p << 64 | i)}", "index": i,
                "utilization": rng.uniform(0.95, 1.0), "sm_active": 0.9 * (1 + jit), "power_w": 600.0 * (1 + jit),
                "power_limit_w": 700.0, "sm_clock_hz": 1.41e9 if slow else 1.98e9 * (1 + jit),
                "clock_reasons": ("hw_thermal_slowdown",) if slow else rng.choice([(), (), ("sw_power_cap",)]),
                "memory_util": 0.5 * (1 + jit), "pcie_bps": 1e9 * (1 + jit), "nvlink_bps": 1e11 * (1 + jit),
                "energy_j": 600.0 * 300.0 * (1 + jit), "energy_from_s": 302.0, "energy_to_s": 2.0,
                "ecc_uncorrected": 0}
    xids = tuple(sorted(rng.sample(XIDS, rng.choice([0, 0, 0, 1, 2]))))
    energy = None if rng.random() < 0.3 else (rng.uniform(100, 400), rng.uniform(0, 30), rng.uniform(100, 700))

    def flag() -> object:
        return rng.random() < 0.1 if not odd or rng.random() < 0.95 else rng.choice([0, 1, None])
    return {
        "uuid": u, "index": rng.choice([i, i, i, None, 70_000, -1] + ([2.0] if odd else [])),
        "utilization": reading(rng, 0.0, 1.0, odd), "sm_active": reading(rng, 0.0, 1.0, odd),
        "power_w": reading(rng, 50.0, 700.0, odd),
        "power_limit_w": rng.choice([None, 700.0, 0.0, -0.0] + ([700] if odd else [])),
        "lost": flag(), "hang_hint": flag(), "xids": xids,
        "mig_profile": rng.choice(["", "", "", "1g.10gb"]), "shared": flag(),
        "sm_clock_hz": reading(rng, 1e9, 2e9, odd),
        "clock_reasons": tuple(sorted(rng.sample(REASONS, rng.choice([0, 0, 1, 2])))),
        "memory_util": reading(rng, 0.0, 1.0, odd), "pcie_bps": reading(rng, 0.0, 2e10, odd),
        "nvlink_bps": reading(rng, 0.0, 9e11, odd),
        "energy_j": None if energy is None else energy[2] * (energy[0] - energy[1]),
        "energy_from_s": None if energy is None else rng.choice([energy[0], energy[0], math.nan]),
        "energy_to_s": None if energy is None else energy[1],
        "remap_pending": flag(), "remap_failed": flag(),
        "xid_ages": tuple((x, rng.uniform(0, 600)) for x in xids if rng.random() < 0.5),
        "ecc_uncorrected": rng.choice([None, 0, 0, 0, 2, 70_000, -1, 1 << 40]),
    }


def case(seed: int) -> list[str]:
    """Everything the controller says from one seeded run's GPU evidence, as text."""
    from collector.claims import evaluate
    from collector.claims.energy import energy_per_step
    from collector.claims.gpu import apply_gpu
    from collector.claims.gpuspread import gpu_spread_uncached
    from collector.claims.workrisk import with_gpu_signals
    from collector.gpu import GpuDevice, PodGpuEvidence, gpu_summary
    from collector.model import Ref
    from collector.planes.node_agents import gpu_records, same_devices
    from collector.riskfacts import NodeRisk, WorkAtRisk
    from exporters.prometheus import ClaimsExporter, new_registry
    from tests.claims.test_gpuspread import megatron_log
    from tests.claims.test_recheck_at import NOW, S, evidence, pod, taucluster, taurun

    rng = random.Random(seed)
    workers = rng.randint(1, 4)
    clean = rng.random() < 0.35
    odd = rng.random() < 0.15
    pods: list[tuple[int, list[dict[str, Any]], float]] = []
    for p in range(workers + 1):
        n = 8 if clean else rng.choice([0, 1, 6, 8, 8, 8])
        slow = rng.randint(-1, n - 1) if n else -1
        pods.append((p, [device(rng, p, i, clean, i == slow and (p == 0 or not clean), odd) for i in range(n)],
                     10.0 if clean else rng.choice([10.0, 10.0, 30.0, 400.0])))
    log = rng.choice([megatron_log(slow_from=35, slower=0.3), megatron_log(n=60), ""])
    out: list[str] = []

    def build() -> dict[tuple[str, str], Any]:
        return {("ns", f"r-{p}"): PodGpuEvidence("ns", f"r-{p}", f"node-r-{p}", "agent", NOW - timedelta(seconds=ago),
                                                 tuple(GpuDevice(**kw) for kw in devs), ("main",))
                for p, devs, ago in pods}

    def said(name: str, f: Any) -> None:
        try:
            out.append(f"{name}: {f()!r}")
        except Exception as e:  # (the same failure in both trees is the same answer)
            out.append(f"{name}: raised {type(e).__name__}: {e}")

    recs, again = build(), build()
    ev = evidence([taurun(workers=workers), taucluster(timedelta(minutes=1), workers=workers),
                   *(pod(f"r-{p}") for p, _, _ in pods)], log=log)
    keys = list(recs)
    age = S.evidence_max_age
    said("records", lambda: list(recs.values()))
    said("equal", lambda: [(a == b, a != b, hash(a) == hash(b))
                           for a, b in zip(recs.values(), again.values(), strict=True)])
    said("pickled", lambda: [pickle.loads(pickle.dumps(e)) == e for e in recs.values()])
    said("summary", lambda: gpu_summary(recs.values(), keys, NOW, age))
    said("summary of some", lambda: gpu_summary(recs.values(), keys[:2], NOW, age))
    said("spread", lambda: gpu_spread_uncached(None, ev, recs.values(), NOW, age))
    said("energy", lambda: energy_per_step(ev, recs.values(), NOW, age))
    w = WorkAtRisk(1.0, 8, None, "run-start", "", nodes=tuple(NodeRisk(f"node-r-{p}", 0.0, (), (), 8, 1.0)
                                                              for p, _, _ in pods))
    said("signals", lambda: with_gpu_signals(w, recs.values(), NOW, age))
    # the next pass: one pod's devices changed in one field (or not), as node_agents compares them
    p0 = rng.choice(list(recs))
    devs = list(recs[p0].devices)
    if devs:
        i = rng.randrange(len(devs))
        field = rng.choice(["utilization", "lost", "hang_hint", "xids", "uuid", "index", "mig_profile",
                            "remap_pending", "ecc_uncorrected", "shared", "power_w"])
        other = device(rng, 0, i, False, False, odd)[field]
        try:
            import dataclasses
            devs[i] = dataclasses.replace(devs[i], **{field: other})
        except Exception as e:
            out.append(f"replace raised {type(e).__name__}")
    nxt = dict(recs)
    nxt[p0] = PodGpuEvidence(recs[p0].namespace, recs[p0].pod, recs[p0].node, "agent", NOW, tuple(devs),
                             recs[p0].containers)
    said("same devices", lambda: [same_devices(recs[k], nxt[k]) for k in recs])
    said("adx rows", lambda: gpu_records(recs, nxt, lambda r: Ref("TauRun", "ns", "run")))
    rc = evaluate(ev, NOW, S)
    nodes = {f"node-r-{p}": NOW - timedelta(seconds=10) for p, _, _ in pods}
    try:
        got = apply_gpu(rc, ev, recs, nodes, NOW, S)
    except Exception as e:
        out.append(f"apply_gpu raised {type(e).__name__}: {e}")
        return out
    out.append(repr(got))
    out.append(json.dumps(got.to_json(), sort_keys=True, default=repr))
    registry = new_registry()
    exp = ClaimsExporter(registry)
    exp.update([got], NOW)
    out.append(exp.exposition().decode())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before-tree", type=Path, help="the tree to compare with")
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--show", type=int, default=-1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        sys.path.insert(0, os.environ["PYTHONPATH"])
        if a.show >= 0:
            print("\n".join(case(a.show)))
            return
        for seed in range(a.first, a.first + a.cases):
            print(seed, hashlib.sha256("\n".join(case(seed)).encode()).hexdigest(), flush=True)
        return
    if a.before_tree is None:
        ap.error("--before-tree is required")

    def run(tree: Path, *extra: str) -> str:
        return subprocess.run([sys.executable, __file__, "--child", "--cases", str(a.cases), "--first", str(a.first),
                               *extra], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(tree)}).stdout

    now, before = run(ROOT).splitlines(), run(a.before_tree).splitlines()
    assert len(now) == len(before) == a.cases, (len(now), len(before))
    differ = [x.split()[0] for x, y in zip(now, before, strict=True) if x != y]
    print(f"{a.cases} cases, {len(differ)} differ")
    for shown in differ[:3]:
        x, y = run(ROOT, "--show", shown).splitlines(), run(a.before_tree, "--show", shown).splitlines()
        for lx, ly in zip(x, y, strict=False):
            if lx != ly:
                print(f"seed {shown}:\n  now:    {lx[:2000]}\n  before: {ly[:2000]}")
                break
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
