"""Fixtures: a simulator on 127.0.0.1:0 per test, a manual clock, kubectl and the official client."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client as k8s

from kubesim import (
    ManualClock,
    ScenarioEngine,
    Simulator,
    SimulatorSettings,
    default_scenario_path,
    load_scenario,
    write_kubeconfig,
)

T0 = datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def sim(clock: ManualClock) -> Iterator[Simulator]:
    simulator = Simulator(clock=clock, settings=SimulatorSettings(watch_window=200, bookmark_interval_s=0.2))
    simulator.start("127.0.0.1:0")
    yield simulator
    simulator.close()


@pytest.fixture
def api(sim: Simulator) -> Iterator[k8s.ApiClient]:
    """The official Python client pointed at the simulator."""
    cfg = k8s.Configuration()
    cfg.host = sim.base_url
    with k8s.ApiClient(cfg) as api_client:
        yield api_client


@pytest.fixture
def engine(sim: Simulator, clock: ManualClock) -> Iterator[ScenarioEngine]:
    """The default scenario, stepped by hand."""
    eng = ScenarioEngine(load_scenario(default_scenario_path()), sim.base_url, clock)
    yield eng
    eng.stop()


@pytest.fixture
def kubeconfig(sim: Simulator, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", sim.base_url)


KubectlRun = Callable[..., str]


@pytest.fixture
def kubectl(kubeconfig: Path) -> KubectlRun:
    """Run kubectl against the simulator; returns stdout, fails the test with stderr on error."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")

    def run(*args: str, ok: bool = True, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=30,
            input=stdin,
        )
        if ok and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        if not ok:
            return proc.stdout + proc.stderr
        return proc.stdout

    return run
