"""Stall detection latency on the simulator, across step cadences from 1 s to 10 min.

For each cadence a run logs Megatron iteration lines every `cadence` seconds of a manual clock,
then goes silent with its pods still Running and Ready (a hung collective). The clock then
advances in small steps; after each step the live controller reads the log tail through the API
(as in a cluster) and re-evaluates. Detection latency is the scenario time from the last
progress line to the first evaluation that says progressing=false (STALLED).

Baseline, in the same run: PyTorch's NCCL watchdog, which turns a hung collective into an error
only after its timeout (600 s by default, and 10–60 min as commonly configured), i.e. at best
600 s after the last step. Usage: .venv/bin/python bench/bench_stall.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.controller import Controller  # noqa: E402
from collector.model import Observed  # noqa: E402
from collector.settings import ControllerSettings, Settings  # noqa: E402
from collector.sources.kube_api import KubeApi, api_client_for  # noqa: E402
from kubesim.clock import ManualClock  # noqa: E402
from kubesim.server import Simulator  # noqa: E402

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
NCCL_WATCHDOG_DEFAULT_S = 600.0


def line(it: int, t: datetime) -> str:
    return (f" [{t:%Y-%m-%d %H:%M:%S}] iteration {it:>8}/  100000 | consumed samples: {it * 1024:>12} | "
            f"elapsed time per iteration (ms): 1000.0 | lm loss: {3.0 - it * 1e-4:.6E} | loss scale: 1.0 |")


def wait(pred: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


WATCHDOG = ("[rank0]:[E110 10:00:00.000000000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation"
            " timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for"
            " 600012 milliseconds before timing out.")


def measure(cadence: float, steps: int, watchdog: bool = False) -> tuple[float, float, int]:
    """(detection latency s, stall window s, evaluations) for one cadence."""
    clock = ManualClock(T0)
    with Simulator(clock=clock) as sim:
        url = sim.start()
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        sim.apply({"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
                   "metadata": {"name": "r", "namespace": "bench"},
                   "spec": {"profile": "p", "workers": 1, "gpusPerWorker": 8}, "status": {"phase": "Running"}})
        started = T0.strftime("%Y-%m-%dT%H:%M:%SZ")
        sim.apply({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "r-0", "namespace": "bench", "labels": {"taugrid.io/run": "r"}},
                   "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "trainer"}]},
                   "status": {"phase": "Running",
                              "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                                             {"type": "Ready", "status": "True", "lastTransitionTime": started}],
                              "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                                     "state": {"running": {"startedAt": started}}}]}})
        base = Settings()
        settings = replace(base, controller=replace(ControllerSettings(), leader_election=False,
                                                    tick=timedelta(seconds=0.05),
                                                    log_poll_interval=timedelta(seconds=0.02),
                                                    checkpoint_poll_interval=timedelta(0)))
        ctl = Controller(KubeApi(api_client_for(url)), settings, clock.now)
        ctl.open()
        try:
            wait(ctl.ready.is_set)
            for i in range(steps):
                sim.store.append_log("bench", "r-0", "main", [line(i + 1, clock.now())])
                clock.advance(cadence)
            last_line = clock.now() - timedelta(seconds=cadence)

            def evaluated_now() -> bool:
                rc = next(iter(ctl.claims.values()), None)
                sigs = ctl.index.evidence(rc.ref).signals if rc else []
                return bool(rc and sigs and sigs[0].read_at >= clock.now() and rc.evaluated_at >= clock.now())

            wait(evaluated_now)
            delta = max(1.0, cadence / 20)
            watchdog_at = last_line + timedelta(seconds=NCCL_WATCHDOG_DEFAULT_S) if watchdog else None
            while True:
                if watchdog_at is not None and clock.now() >= watchdog_at:
                    sim.store.append_log("bench", "r-0", "main", [WATCHDOG], watchdog_at)
                    watchdog_at = None
                rc = next(iter(ctl.claims.values()))
                if rc.progressing.observed is Observed.FALSE:
                    latency = (rc.evaluated_at - last_line).total_seconds()
                    break
                clock.advance(delta)
                if not wait(evaluated_now):
                    raise RuntimeError("controller did not evaluate after a clock step")
            window_s = _window_of(rc.progressing.reason)
            return latency, window_s, ctl.evaluations
        finally:
            ctl.close()


def _window_of(reason: str) -> float:
    # "STALLED 4m50s: last step ... (window 4m36s: 3 × 1m27s from p99 of last 19 step intervals)"
    inside = reason.split("(window ", 1)[1].split(")", 1)[0].split(":", 1)[0]
    total = 0.0
    num = ""
    for ch in inside:
        if ch.isdigit():
            num += ch
        else:
            total += int(num or 0) * {"h": 3600, "m": 60, "s": 1, "d": 86400}[ch]
            num = ""
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="cadences 1 s, 60 s and 600 s only")
    ap.add_argument("--steps", type=int, default=20, help="progress lines before the stall")
    args = ap.parse_args()
    cadences = [1.0, 60.0, 600.0] if args.quick else [1.0, 10.0, 60.0, 300.0, 600.0]
    print(f"{'cadence':>8} {'window':>8} {'detected after':>15} {'+ watchdog line':>16} {'NCCL watchdog':>14}"
          f" {'ratio':>7}")
    for cadence in cadences:
        latency, window, _ = measure(cadence, args.steps)
        with_line, _, _ = measure(cadence, args.steps, watchdog=True)
        baseline = NCCL_WATCHDOG_DEFAULT_S  # the hung collective starts right after the last step
        print(f"{cadence:>7.0f}s {window:>7.0f}s {latency:>14.0f}s {with_line:>15.0f}s {baseline:>13.0f}s"
              f" {min(latency, with_line) / baseline:>7.2f}")
    print("window = max(3 × p99 of the last 50 step intervals (one outlier clipped at median + 10 MAD), 60 s)"
          " + one 15 s scrape; detection granularity max(1 s, cadence/20);")
    print("'+ watchdog line': the trainer also logs PyTorch's watchdog timeout 600 s after the last step;")
    print("ratio = best detection / the 600 s NCCL watchdog default")


if __name__ == "__main__":
    main()
