"""The default simulator scenario played on a manual clock, watched by the live controller, with the
ADX exporter writing the embedded DuckDB store through its spool. Node-agent records (GPU samples
and XIDs) are fed to the exporter directly: no agent runs here."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.controller import Controller
from collector.settings import ControllerSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx import AdxExporter, ExportSettings, GpuSample, GpuXid
from exporters.adx.embedded import DuckDBTarget
from exporters.prometheus import new_registry
from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
from kubesim.scenario import default_scenario_path, load_scenario

T0 = datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)
END_S = 17 * 60  # past every scenario event (llm-sft's NCCL watchdog at 16m)
STEP_S = 30
CLUSTER = "aks-westeurope-1"


def wait_until(pred: object, timeout: float = 20.0, what: str = "condition") -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def agent_records() -> tuple[list[GpuSample], list[GpuXid]]:
    """What two node agents would have sent: readings of 8 GPUs each, and a few XIDs."""
    samples = [GpuSample(T0 + timedelta(minutes=m), f"aks-a100-{n}", g, f"GPU-{n}{g}", 97.0 if n == 0 else 3.0,
                         40 << 30, 350.0, 60.0, "research", f"llm-sft-w{n}", "llm-sft")
               for m in range(0, 15, 5) for n in range(2) for g in range(8)]
    xids = [
        GpuXid(T0 + timedelta(minutes=9), "aks-a100-0", 79, 3, "GPU-03", "0000:3b:00.0", "GPU has fallen off the bus",
               "reset the node", "research", "llm-sft-w0", "llm-sft"),
        GpuXid(T0 + timedelta(minutes=9, seconds=5), "aks-a100-0", 79, 3, "GPU-03", "0000:3b:00.0",
               "GPU has fallen off the bus", "reset the node", "research", "llm-sft-w0", "llm-sft"),
        GpuXid(T0 + timedelta(minutes=4), "aks-a100-2", 13, 0, "GPU-20", "0000:1b:00.0", "Graphics Engine Exception",
               "check the application", "team-b", "bert-large-w0", "bert-large"),
        GpuXid(T0 + timedelta(minutes=12), "aks-a100-3", 48, 5, "GPU-35", "0000:5e:00.0", "Double-bit ECC error",
               "drain and reset", "", "", ""),
    ]
    return samples, xids


def play(store: Path, spool_dir: Path) -> dict[str, int]:
    """Play the scenario to END_S; returns what the exporter's metrics counted per table."""
    clock = ManualClock(T0)
    sim = Simulator(clock=clock, settings=SimulatorSettings(watch_window=500, bookmark_interval_s=0.2))
    sim.start("127.0.0.1:0")
    engine = ScenarioEngine(load_scenario(default_scenario_path()), sim.base_url, clock)
    cs = replace(ControllerSettings(), tick=timedelta(seconds=0.1), leader_election=False,
                 log_poll_interval=timedelta(seconds=0.1), ray_poll_interval=timedelta(0),
                 checkpoint_poll_interval=timedelta(0), watch_timeout_s=30, min_eval_interval=timedelta(0))
    registry = new_registry()
    # The controller's own registry is mirrored into adx-mon's tables, as adx-mon would scrape it.
    exporter = AdxExporter(ExportSettings(cluster=CLUSTER, spool_dir=spool_dir,
                                          snapshot_interval=timedelta(minutes=1)), DuckDBTarget(store),
                           registry=registry, mirror=registry)
    exporter.open()
    ctl = Controller(KubeApi(api_client_for(sim.base_url)), Settings(controller=cs), clock.now, sink=exporter,
                     registry=registry)
    try:
        ctl.open()
        wait_until(ctl.ready.is_set, what="controller ready")
        for t in range(0, END_S + 1, STEP_S):
            engine.step_to(t)
            # Let the watches deliver, logs be read, and two full evaluations run at this instant.
            seen = ctl.evaluations
            time.sleep(0.25)
            wait_until(lambda s=seen: ctl.evaluations >= s + 3, what=f"evaluations at {t}s")
        # The scenario's last event is llm-sft's NCCL watchdog (16m): on a busy machine the log
        # poller may not have read it yet. Wait for it, then one more step records it.
        wait_until(lambda: any(r.ref.name == "llm-sft" and "nccl" in r.progressing.reason.lower()
                               for r in list(ctl.claims.values())), timeout=30, what="the NCCL hang read")
        engine.step_to(END_S + 1)
        seen = ctl.evaluations
        wait_until(lambda: ctl.evaluations >= seen + 3, what="final evaluations")
        samples, xids = agent_records()
        exporter.gpu(samples, xids)
    finally:
        ctl.close()
        engine.stop()
        exporter.close()
        sim.close()
    assert not engine.errors, engine.errors
    return {s.labels["table"]: int(s.value) for m in exporter.metrics.rows_delivered.collect() for s in m.samples
            if s.name.endswith("_total")}
