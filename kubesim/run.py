"""Running the simulator with a scenario: in-process (`SimulationSession`) or serving until interrupted."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kubesim.clock import ScaledClock
from kubesim.engine import ScenarioEngine
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

    def close(self) -> None:
        """Stop the engine, then the server."""
        self.engine.stop()
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
) -> SimulationSession:
    """Start a simulator on `address`, write a kubeconfig for it and play `scenario` (default: the
    shipped one) at `speed` times real time. Raises ScenarioError for a bad scenario file."""
    spec = load_scenario(scenario or default_scenario_path())
    clock = ScaledClock(speed)
    sim = Simulator(clock=clock, settings=settings or SimulatorSettings(seed=spec.seed))
    base_url = sim.start(address)
    try:
        port = base_url.rsplit(":", 1)[1]
        path = kubeconfig or Path(tempfile.gettempdir()) / f"taugrid-simulator-{port}.kubeconfig"
        write_kubeconfig(path, base_url)
        engine = ScenarioEngine(spec, base_url, clock=clock)
        engine.step_to(0.0)
        engine.start()
    except BaseException:
        sim.close()
        raise
    return SimulationSession(sim, engine, base_url, path)


def run_simulator(scenario: Path | None, address: str, speed: float, kubeconfig: Path | None = None) -> None:
    """Serve the simulator with `scenario` until interrupted (Ctrl-C or SIGTERM).

    Prints the base URL and the path of a kubeconfig that points any client at it.
    """
    session = start_simulation(scenario, address, speed, kubeconfig)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_signal)
    print(
        f"Kubernetes API simulator serving {session.engine.scenario.name!r} at {session.base_url} (speed {speed:g}x)",
        flush=True,
    )
    print(f"kubeconfig: {session.kubeconfig}", flush=True)
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
