"""A protocol-faithful Kubernetes API simulator with a TauGrid scenario engine.

Public API:
    Simulator, SimulatorSettings          the API server (HTTP, discovery, list/watch, faults)
    Store, StoreSettings                  its object store (one lock, one resourceVersion sequence)
    Faults, Fault                         runtime fault injection (also at /_sim/faults)
    ResourceType, Registry, DEFAULT_RESOURCES
    ScenarioEngine, load_scenario, default_scenario_path, Scenario, ScenarioError
    ManualClock, ScaledClock, SystemClock
    start_simulation, SimulationSession, run_simulator, write_kubeconfig
"""

from kubesim.clock import Clock, ManualClock, ScaledClock, SystemClock
from kubesim.engine import ScenarioEngine
from kubesim.errors import ApiError
from kubesim.faults import Fault, Faults
from kubesim.kubeconfig import write_kubeconfig
from kubesim.registry import DEFAULT_RESOURCES, Column, Registry, ResourceType
from kubesim.run import SimulationSession, run_simulator, start_simulation
from kubesim.scenario import Scenario, ScenarioError, default_scenario_path, load_scenario
from kubesim.server import Simulator, SimulatorSettings
from kubesim.store import Store, StoreSettings

__all__ = [
    "DEFAULT_RESOURCES",
    "ApiError",
    "Clock",
    "Column",
    "Fault",
    "Faults",
    "ManualClock",
    "Registry",
    "ResourceType",
    "ScaledClock",
    "Scenario",
    "ScenarioEngine",
    "ScenarioError",
    "SimulationSession",
    "Simulator",
    "SimulatorSettings",
    "Store",
    "StoreSettings",
    "SystemClock",
    "default_scenario_path",
    "load_scenario",
    "run_simulator",
    "start_simulation",
    "write_kubeconfig",
]
