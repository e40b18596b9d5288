"""Running the simulator with a scenario: in-process (`SimulationSession`) or serving until interrupted."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from kubesim.clock import ScaledClock
from kubesim.engine import ScenarioEngine
from kubesim.faults import FaultScheduler, ScheduledFault
from kubesim.kubeconfig import write_kubeconfig
from kubesim.scenario import default_scenario_path, load_scenario
from kubesim.server import Simulator, SimulatorSettings


@dataclass(slots=True)
class SimulationSession:
    """A started simulator with its scenario engine playing in a background thread."""

    simulator: Simulator
    engine: ScenarioEngine
    base_url: str
    kubeconfig: Path
    faults: FaultScheduler | None = None

    def close(self) -> None:
        """Stop the engine and the fault schedule, then the server."""
        self.engine.stop()
        if self.faults is not None:
            self.faults.stop()
        self.simulator.close()

    def __enter__(self) -> SimulationSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_simulation(
    scenario: Path | None = None,
    address: str = "127.0.0.1:0",
    speed: float = 1.0,
    kubeconfig: Path | None = None,
    settings: SimulatorSettings | None = None,
    faults: Sequence[ScheduledFault] = (),
    event_ttl_s: float | None = None,
) -> SimulationSession:
    """Start a simulator on `address`, write a kubeconfig for it and play `scenario` (default: the
    shipped one) at `speed` times real time. `faults` (the CLI's `--fault`) join the scenario's own
    `faults:`, both on the scenario clock; `event_ttl_s` overrides its `eventTTL:`. Raises
    ScenarioError for a bad scenario file."""
    spec = load_scenario(scenario or default_scenario_path())
    clock = ScaledClock(speed)
    settings = settings or SimulatorSettings(seed=spec.seed)
    ttl = event_ttl_s if event_ttl_s is not None else spec.server.event_ttl_s
    if ttl is not None:
        settings = replace(settings, event_ttl_s=ttl)
    sim = Simulator(clock=clock, settings=settings)
    base_url = sim.start(address)
    try:
        port = base_url.rsplit(":", 1)[1]
        path = kubeconfig or Path(tempfile.gettempdir()) / f"taugrid-simulator-{port}.kubeconfig"
        write_kubeconfig(path, base_url)
        engine = ScenarioEngine(spec, base_url, clock=clock)
        engine.step_to(0.0)
        plan = (*spec.server.faults, *faults)
        scheduler = FaultScheduler(sim.faults, plan, clock, engine.origin) if plan else None
        if scheduler is not None:
            scheduler.start()
        engine.start()
    except BaseException:
        sim.close()
        raise
    return SimulationSession(sim, engine, base_url, path, scheduler)


def run_simulator(
    scenario: Path | None,
    address: str,
    speed: float,
    kubeconfig: Path | None = None,
    faults: Sequence[ScheduledFault] = (),
    event_ttl_s: float | None = None,
) -> None:
    """Serve the simulator with `scenario` until interrupted (Ctrl-C or SIGTERM).

    Prints the base URL and the path of a kubeconfig that points any client at it.
    """
    session = start_simulation(scenario, address, speed, kubeconfig, faults=faults, event_ttl_s=event_ttl_s)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_signal)
    print(
        f"Kubernetes API simulator serving {session.engine.scenario.name!r} at {session.base_url} (speed {speed:g}x)",
        flush=True,
    )
    print(f"kubeconfig: {session.kubeconfig}", flush=True)
    if session.faults is not None:
        for item in session.faults.plan:
            span = f" for {item.for_s:g}s" if item.for_s is not None else ""
            print(f"fault at {item.at_s:g}s{span}: {dict(item.fields)}", flush=True)
    print(f"try: kubectl --kubeconfig {session.kubeconfig} get tauruns,pods -A", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        session.close()
        print("simulator stopped", file=sys.stderr, flush=True)
