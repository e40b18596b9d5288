"""Real-GPU check of the node agent (run only where a GPU is lent; CI never runs it).

Starts the agent with the real NVML, drives the GPU with a PyTorch matmul load for --load seconds,
then leaves it idle for --idle seconds, and records once a second what the agent reads (utilization,
SM activity, power and limit, clocks, hang hint) plus the agent's own CPU and RSS. Prints a JSON
summary, and writes the per-second series to --out (default $OUT/gpu_agent_check.json when set).
Without NVML it says so and exits 2. Usage:
  .venv/bin/python bench/gpu_agent_check.py [--load 60] [--idle 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.agent import Agent, AgentSettings, LogSettings  # noqa: E402


def _matmul(stop: threading.Event) -> str:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]  # only on a GPU machine
    except ImportError:
        return "torch not installed: no load generated"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    while not stop.is_set():
        for _ in range(20):
            a @ b  # noqa: B018 (the work is the point)
        torch.cuda.synchronize()
    return "ok"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu_agent_check.json")
                    if os.environ.get("OUT") else None)
    args = ap.parse_args()
    tmp = Path("/tmp/gpu-agent-check")
    (tmp / "pods").mkdir(parents=True, exist_ok=True)
    settings = AgentSettings(node="device", podresources_socket=tmp / "none.sock", kmsg_path=Path("/dev/kmsg"),
                             logs=LogSettings(root=tmp / "pods"))
    series: list[dict[str, object]] = []
    with Agent(settings) as agent:
        time.sleep(1.5)
        if not agent.sampler.ok:
            print(json.dumps({"nvml": agent.sampler.status.message}))
            return 2
        stop = threading.Event()
        load_result: list[str] = []
        worker = threading.Thread(target=lambda: load_result.append(_matmul(stop)), daemon=True)
        cpu0 = time.process_time()
        t0 = time.monotonic()
        worker.start()
        phase = "load"
        while time.monotonic() - t0 < args.load + args.idle:
            if phase == "load" and time.monotonic() - t0 >= args.load:
                stop.set()
                worker.join(30)
                phase = "idle"
            snap = agent.snapshot()
            for r in snap.gpus:
                series.append({"t": round(time.monotonic() - t0, 1), "phase": phase, "uuid": r.uuid,
                               "util": r.utilization, "sm_active": r.sm_active, "power_w": r.power_w,
                               "limit_w": r.power_limit_w, "sm_clock_hz": r.sm_clock_hz,
                               "temp_c": r.temperature_c, "lost": r.lost, "unsupported": sorted(r.unsupported),
                               "hang_since": snap.hang_since.get(r.uuid)})
            time.sleep(1.0)
        wall = time.monotonic() - t0
        # the load thread shares the process: its CPU is the matmul loop's launches, counted apart
        cpu = time.process_time() - cpu0
        metrics_t = time.perf_counter()
        from prometheus_client import generate_latest
        size = len(generate_latest(agent.registry))
        render_ms = (time.perf_counter() - metrics_t) * 1e3
        status = agent.status()
        sample_ms = agent.sample_seconds * 1e3

    def mean(phase: str, key: str) -> float | None:
        xs = [float(v) for s in series if s["phase"] == phase and isinstance(v := s[key], int | float)]
        return round(sum(xs) / len(xs), 3) if xs else None

    summary = {
        "load": load_result[0] if load_result else "not finished",
        "driver": status["nvml"],
        "gpus": len({s["uuid"] for s in series}),
        "load_util": mean("load", "util"), "idle_util": mean("idle", "util"),
        "load_sm_active": mean("load", "sm_active"), "idle_sm_active": mean("idle", "sm_active"),
        "load_power_w": mean("load", "power_w"), "idle_power_w": mean("idle", "power_w"),
        "process_cpu_share_incl_load_thread": round(cpu / wall, 4),
        "rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "nvml_sample_ms": round(sample_ms, 2), "metrics_render_ms": round(render_ms, 2), "metrics_bytes": size,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "series": series}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
