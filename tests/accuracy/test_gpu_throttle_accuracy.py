"""A throttling GPU against the simulator's truth (issue 28), CI-sized: runs where one GPU of one rank
throttles (SM clock and power down, thermal or power-brake reasons set) and healthy runs with natural
jitter, played by the simulator, their GPUs read by the agent's own sampler through the fake NVML and
its evidence document, judged by the claim engine and GPU spread (bench/straggler_accuracy.py; the
full figures are in docs/straggler_accuracy.md and docs/accuracy.md)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.straggler_accuracy import play, report

SEED = 11
RUNS = 6  # three throttling, three healthy
MINUTES = 21.0


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    rep: dict[str, Any] = report(play(RUNS, SEED, MINUTES, ("gpu-throttle", "healthy")), SEED, MINUTES, 0.0)
    classes: dict[str, Any] = rep["classes"]
    return classes


def test_the_throttling_gpu_is_named_by_uuid_and_node_within_10_minutes(figures: dict[str, Any]) -> None:
    row = figures["gpu-throttle"]
    assert row["judged"] >= 2, row  # played long enough after the throttling began
    assert row["detection_rate"] == 1.0, row  # the goal's floor is 95 %: with a handful of runs, every one
    assert row["ttd_max_s"] <= 600, row


def test_no_wrong_suspect_and_energy_per_step_known_and_close(figures: dict[str, Any]) -> None:
    for cls, row in figures.items():
        assert row["evaluations"] > 0, cls
        assert row["wrong_suspect_evaluations"] == 0, (cls, row)  # floor: < 1 % false suspects
        assert row["energy_known_rate"] >= 0.9, (cls, row)
        assert row["energy_error_median"] <= 0.05, (cls, row)
