"""A digest of everything a scenario leaves in the simulator, played on a ManualClock with a fixed seed.

Two plays of the same scenario and seed must give the same digest (the engine is deterministic:
names, uids, IPs, log values all come from seeded generators, times from the manual clock). Run as
a script it prints the digests of the shipped default scenario and of a generated fleet, which is
how a refactoring of the engine shows it changed nothing: record them before, compare after.
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime

from kubesim import (
    ManualClock,
    Scenario,
    ScenarioEngine,
    Simulator,
    SimulatorSettings,
    default_scenario_path,
    load_scenario,
)
from kubesim.generate import generate

T0 = datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)


def play_digest(scenario: Scenario, until: float, step: float = 30.0) -> str:
    """Play `scenario` to `until` scenario seconds; sha256 of the store's objects, logs and the truth."""
    clock = ManualClock(T0)
    sim = Simulator(clock=clock, settings=SimulatorSettings(seed=scenario.seed))
    sim.start("127.0.0.1:0")
    eng = ScenarioEngine(scenario, sim.base_url, clock)
    try:
        t = 0.0
        while t < until:
            t = min(until, t + step)
            eng.step_to(t)
        if eng.errors:
            raise AssertionError(f"engine errors: {eng.errors[:3]}")
        store = sim.store
        with store.cond:
            objects = {k: sorted(v.items()) for k, v in sorted(store._objects.items())}
            logs = {
                "/".join(k): {
                    "current": [[when.isoformat(), line] for when, line in log.lines],
                    "previous": [[when.isoformat(), line] for when, line in log.previous or []],
                }
                for k, log in sorted(store.pod_logs.logs.items())
            }
            rv = store.resource_version
        truth = sorted((list(k), repr(v)) for k, v in eng.truth().items())
        doc = {"objects": objects, "logs": logs, "rv": rv, "truth": truth, "elapsed": eng.elapsed}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    finally:
        eng.stop()
        sim.close()


def main() -> int:
    default = load_scenario(default_scenario_path())
    print("default", play_digest(default, 3 * 3600.0))
    print("generated-7x60", play_digest(generate(7, runs=60).scenario, 20 * 60.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
