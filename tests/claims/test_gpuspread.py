"""Fail-slow GPUs (issue 28): a GPU apart from its run's others (robust z over the run) while the run is
slower than its own baseline is named with node and UUID; readings of SM activity 0 at ~100 %
utilization are untrusted, not idle; the claims themselves never change."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.claims.gpu import apply_gpu
from collector.claims.gpuspread import (
    BUSY_UTIL,
    MAD_FLOOR,
    MAD_FLOOR_CLOCK,
    MAD_SCALE,
    MIN_APART_HELD,
    MIN_Z,
    _compared,
    _screened,
    against_others,
    none_apart,
    slowdown,
)
from collector.gpu import GpuDevice, PodGpuEvidence
from tests.claims.test_recheck_at import NOW, S, evidence, pod, taucluster, taurun, ts


def megatron_log(n: int = 60, step_s: float = 10.0, slow_from: int | None = None, slower: float = 0.0) -> str:
    """n steps ending at NOW; from step `slow_from` on each step takes `slower` longer."""
    per = [step_s * (1 + slower if slow_from is not None and i >= slow_from else 1.0) for i in range(n)]
    t = NOW - timedelta(seconds=sum(per))
    lines = []
    for i, p in enumerate(per):
        t += timedelta(seconds=p)
        lines.append(f"{ts(t)} iteration {100 + i:8d}/ 100000 | lm loss: 2.5 |\n")
    return "".join(lines)


def gpus(n: int = 8, *, odd: int | None = None, clock_mhz: float = 1980.0, odd_clock_mhz: float = 1410.0,
         reasons: tuple[str, ...] = (), seed: int = 1, sm: float = 0.92, odd_sm: float | None = None,
         util: float = 0.99) -> dict[tuple[str, str], PodGpuEvidence]:
    rng = random.Random(seed)
    devs = []
    for i in range(n):
        jit = 1 + rng.uniform(-0.02, 0.02)
        devs.append(GpuDevice(
            uuid=f"GPU-{i:04d}", index=i, utilization=util, sm_active=(odd_sm if i == odd and odd_sm is not None
                                                                           else sm * jit),
            power_w=600 * jit, power_limit_w=700,
            sm_clock_hz=(odd_clock_mhz if i == odd else clock_mhz * jit) * 1e6,
            clock_reasons=reasons if i == odd else ()))
    return {("ns", "r-0"): PodGpuEvidence("ns", "r-0", "node-r-0", "agent", NOW - timedelta(seconds=10), tuple(devs))}


def run(log: str, g: dict[tuple[str, str], PodGpuEvidence]):  # type: ignore[no-untyped-def]
    ev = evidence([taurun(), taucluster(timedelta(minutes=1)), pod()], log=log)
    rc = evaluate(ev, NOW, S)
    return rc, apply_gpu(rc, ev, g, {"node-r-0": NOW - timedelta(seconds=10)}, NOW, S)


def test_a_throttled_gpu_on_a_slowed_run_is_named_with_node_and_uuid() -> None:
    rc, out = run(megatron_log(slow_from=35, slower=0.3), gpus(odd=5, reasons=("hw_thermal_slowdown",)))
    assert out.stragglers is not None
    (s,) = out.stragglers.suspects
    assert (s.kind, s.gpu, s.node, s.pod, s.basis) == ("gpu", "GPU-0005", "node-r-0", "r-0", "gpu-spread")
    assert 0.2 < s.lag_ratio < 0.4  # the run's slowdown against its own baseline
    assert "SM clock 1410 MHz" in s.evidence and "hw_thermal_slowdown" in s.evidence
    _, same = run(megatron_log(slow_from=35, slower=0.3), gpus())  # the same GPUs, none apart
    assert (out.scheduled, out.running, out.progressing, out.blocked) == \
        (same.scheduled, same.running, same.progressing, same.blocked)
    assert rc.stragglers is None  # one log without rank prefixes: nothing to compare from logs


def test_a_gpu_apart_on_a_run_that_keeps_its_pace_is_not_named() -> None:
    _, out = run(megatron_log(), gpus(odd=5))
    assert out.stragglers is not None and out.stragglers.suspects == ()
    assert "keeps its own pace" in out.stragglers.reason and "GPU-0005" in out.stragglers.reason


def test_natural_spread_on_a_slowed_run_names_no_gpu() -> None:
    for seed in range(50):
        _, out = run(megatron_log(slow_from=35, slower=0.3), gpus(seed=seed))
        assert out.stragglers is None or out.stragglers.suspects == (), seed


def test_sm_activity_zero_at_full_utilization_is_untrusted_not_idle_nor_a_suspect() -> None:
    _, out = run(megatron_log(slow_from=35, slower=0.3), gpus(odd=2, odd_clock_mhz=1980.0, odd_sm=0.0))
    assert out.stragglers is not None and out.stragglers.suspects == ()
    (u,) = out.stragglers.untrusted
    assert u.startswith("GPU-0002:") and "not trusted" in u and "not idle" in u
    # idle for real (utilization low too): an SM reading of 0 is believed
    _, out = run(megatron_log(slow_from=35, slower=0.3), gpus(odd=2, odd_clock_mhz=1980.0, odd_sm=0.0, util=0.05))
    assert out.stragglers is None or out.stragglers.untrusted == ()


def test_too_few_gpus_or_no_baseline_name_nobody() -> None:
    _, out = run(megatron_log(slow_from=35, slower=0.3), gpus(n=3, odd=1))
    assert out.stragglers is None or out.stragglers.suspects == ()
    _, out = run(megatron_log(n=20), gpus(odd=5))  # too few steps for a baseline
    assert out.stragglers is not None and out.stragglers.suspects == ()
    assert "own pace is not known" in out.stragglers.reason


def test_stale_readings_are_not_compared() -> None:
    g = gpus(odd=5)
    old = {k: replace(v, read_at=NOW - S.evidence_max_age - timedelta(seconds=1)) for k, v in g.items()}
    _, out = run(megatron_log(slow_from=35, slower=0.3), old)
    assert out.stragglers is None or out.stragglers.suspects == ()


def test_slowdown_is_the_recent_step_time_against_the_runs_own_earlier_one() -> None:
    ev = evidence([taurun(), pod()], log=megatron_log(slow_from=40, slower=0.5))
    got = slowdown(ev)
    assert got is not None and abs(got - 0.5) < 0.01
    assert slowdown(evidence([taurun(), pod()], log=megatron_log(n=20))) is None


def test_the_controller_reads_the_agents_clock_and_throttle_reasons_bounded() -> None:
    from datetime import UTC, datetime

    from collector.agent.evidence import as_columns
    from collector.sources.agents import AgentEndpoint, parse_evidence

    doc = {"version": 1, "gpus": [
        {"uuid": "GPU-1", "sm_clock_hz": 1.41e9, "clocks_event_reasons": ["hw_thermal_slowdown", 5, "x" * 100],
         "pods": [{"namespace": "ns", "pod": "p"}]},
        {"uuid": "GPU-2", "sm_clock_hz": "fast", "clocks_event_reasons": "sw_power_cap",
         "pods": [{"namespace": "ns", "pod": "p"}]}]}
    for version in (doc, as_columns(doc)):
        report = parse_evidence(version, AgentEndpoint("n", "agent-0", "http://agent"), datetime.now(UTC))
        d1, d2 = report.gpus[0].devices
        assert d1.sm_clock_hz == 1.41e9 and d1.clock_reasons == ("hw_thermal_slowdown", "x" * 40)
        assert d2.sm_clock_hz is None and d2.clock_reasons == ()


def _with(g: dict[tuple[str, str], PodGpuEvidence], seed: int = 1,
          **odd: Any) -> dict[tuple[str, str], PodGpuEvidence]:
    """Bandwidth readings with 5 % jitter on every GPU; `odd` sets GPU 5's."""
    rng = random.Random(seed)
    out = {}
    for k, e in g.items():
        devs = tuple(replace(d, **{**{"memory_util": 0.55 * (1 + rng.uniform(-0.05, 0.05)),
                                      "pcie_bps": 4e9 * (1 + rng.uniform(-0.05, 0.05)),
                                      "nvlink_bps": 120e9 * (1 + rng.uniform(-0.05, 0.05))},
                                   **(odd if d.index == 5 else {})})
                     for d in e.devices)
        out[k] = replace(e, devices=devs)
    return out


def test_low_memory_bandwidth_or_link_throughput_names_the_gpu_higher_does_not() -> None:
    slowed = megatron_log(slow_from=35, slower=0.3)
    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({"memory_util": 0.30}, "memory bandwidth 30%"), ({"pcie_bps": 1e9}, "PCIe throughput 1.00 GB/s"),
                      ({"nvlink_bps": 40e9}, "NVLink throughput 40.00 GB/s"))
    for odd, said in cases:
        _, out = run(slowed, _with(gpus(), **odd))
        assert out.stragglers is not None, odd
        (s,) = out.stragglers.suspects
        assert s.gpu == "GPU-0005" and said in s.evidence, (odd, s.evidence)
    more: tuple[dict[str, Any], ...] = ({"memory_util": 0.95}, {"pcie_bps": 16e9}, {"nvlink_bps": 300e9})
    for odd in more:  # more traffic: no fault
        _, out = run(slowed, _with(gpus(), **odd))
        assert out.stragglers is None or out.stragglers.suspects == (), odd
    # a link the run barely uses is not compared: 0 against a few KB/s is no starved GPU
    quiet = {k: replace(e, devices=tuple(replace(d, pcie_bps=0.0 if d.index == 5 else 5e3) for d in e.devices))
             for k, e in _with(gpus()).items()}
    _, out = run(slowed, quiet)
    assert out.stragglers is None or out.stragglers.suspects == ()


def test_natural_bandwidth_spread_on_a_slowed_run_names_no_gpu() -> None:
    for seed in range(30):
        _, out = run(megatron_log(slow_from=35, slower=0.3), _with(gpus(seed=seed), seed=seed))
        assert out.stragglers is None or out.stragglers.suspects == (), seed


def test_the_controller_reads_bandwidth_and_the_energy_window_bounded() -> None:
    from datetime import UTC, datetime

    from collector.agent.evidence import as_columns
    from collector.sources.agents import AgentEndpoint, parse_evidence

    p = [{"namespace": "ns", "pod": "p"}]
    doc = {"version": 1, "at": 10_000.0, "gpus": [
        {"uuid": "GPU-1", "memory_util": 0.5, "pcie_bps": 3e9, "nvlink_bps": 1e11,
         "energy": [9_700.0, 9_998.0, 120_000.0], "pods": p},
        {"uuid": "GPU-2", "memory_util": 7, "pcie_bps": -1, "nvlink_bps": "x", "energy": [9_990.0, 9_980.0, 5.0],
         "pods": p},
        {"uuid": "GPU-3", "energy": [9_000.0, 9_990.0, 1e12], "pods": p},  # 1 GW: no GPU
        {"uuid": "GPU-4", "energy": [9_990.0, 10_100.0, 5.0], "pods": p},  # ends after the document
        {"uuid": "GPU-5", "energy": [1.0, 9_999.0, 5.0], "pods": p},  # hours long
        {"uuid": "GPU-6", "energy": [9_990.0, True, 5.0], "pods": p}]}
    for version in (doc, as_columns(doc)):
        report = parse_evidence(version, AgentEndpoint("n", "agent-0", "http://agent"), datetime.now(UTC))
        d1, *rest = report.gpus[0].devices
        assert (d1.memory_util, d1.pcie_bps, d1.nvlink_bps) == (0.5, 3e9, 1e11)
        assert (d1.energy_j, d1.energy_from_s, d1.energy_to_s) == (120_000.0, 300.0, 2.0)
        assert all(d.energy_j is None and d.energy_from_s is None for d in rest)
        assert (rest[0].memory_util, rest[0].pcie_bps, rest[0].nvlink_bps) == (None, None, None)


def test_a_clock_held_down_by_a_hard_slowdown_reason_counts_from_5_percent() -> None:
    slowed = megatron_log(slow_from=35, slower=0.3)
    # 6 % lower: apart with a thermal reason the GPU reports; not without one, nor with a power cap
    _, out = run(slowed, gpus(odd=5, odd_clock_mhz=1980 * 0.94, reasons=("hw_thermal_slowdown",), seed=3))
    assert out.stragglers is not None and [s.gpu for s in out.stragglers.suspects] == ["GPU-0005"]
    for reasons in ((), ("sw_power_cap",)):
        _, out = run(slowed, gpus(odd=5, odd_clock_mhz=1980 * 0.94, reasons=reasons, seed=3))
        assert out.stragglers is None or out.stragglers.suspects == (), reasons


def test_power_is_the_energy_windows_mean_where_there_is_one() -> None:
    slowed = megatron_log(slow_from=35, slower=0.3)

    def metered(inst_w: float, mean_w: float) -> dict[tuple[str, str], PodGpuEvidence]:
        return {k: replace(e, devices=tuple(
            replace(d, power_w=inst_w if d.index == 5 else d.power_w, energy_from_s=302.0, energy_to_s=2.0,
                    energy_j=300 * (mean_w if d.index == 5 else d.power_w or 0.0)) for d in e.devices))
            for k, e in gpus().items()}

    # a momentary dip (one collective wait) while its minutes of joules match the others': not apart
    _, out = run(slowed, metered(inst_w=300.0, mean_w=600.0))
    assert out.stragglers is None or out.stragglers.suspects == ()
    # minutes at 300 W against the others' 600 W: apart, whatever the instant says
    _, out = run(slowed, metered(inst_w=600.0, mean_w=300.0))
    assert out.stragglers is not None and [s.gpu for s in out.stragglers.suspects] == ["GPU-0005"]
    assert "power (of its limit) 43%" in out.stragglers.suspects[0].evidence


def test_most_of_one_nodes_gpus_apart_together_is_the_rank_not_a_gpu() -> None:
    """A rank whose whole node computed longer this step (a hiccup): its GPUs are all busier than the
    others waiting for it; no GPU of it is a suspect (the logs name ranks)."""
    log = megatron_log(slow_from=35, slower=0.3)
    ev = evidence([taurun(workers=4), taucluster(timedelta(minutes=1), workers=4),
                   *(pod(f"r-{i}") for i in range(4))], log=log)
    rc = evaluate(ev, NOW, S)

    def four(**odd: Any) -> dict[tuple[str, str], PodGpuEvidence]:
        out = {}
        for i in range(4):
            ((_, e),) = gpus(seed=i, sm=0.45).items()
            devs = tuple(replace(d, uuid=f"GPU-{i}{d.index}", **(odd if i == 0 and d.index in
                                                                   (range(8) if "sm_active" in odd else (7,)) else {}))
                         for d in e.devices)
            out[("ns", f"r-{i}")] = replace(e, pod=f"r-{i}", node=f"node-r-{i}", devices=devs)
        return out

    nodes = {f"node-r-{i}": NOW - timedelta(seconds=10) for i in range(4)}
    out = apply_gpu(rc, ev, four(sm_active=0.85), nodes, NOW, S)
    assert out.stragglers is not None and out.stragglers.suspects == ()
    assert "most GPUs of node node-r-0 read apart together" in out.stragglers.reason
    # one GPU of that node apart on its own is still named
    out = apply_gpu(rc, ev, four(sm_clock_hz=1.41e9), nodes, NOW, S)
    assert out.stragglers is not None and [s.gpu for s in out.stragglers.suspects] == ["GPU-07"]


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.one_of(
    st.floats(min_value=0, max_value=2e9, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 0.5, 0.97, 1.0, 1.41e9])), min_size=2, max_size=40))
@settings(max_examples=400, deadline=None)
def test_each_gpus_others_median_and_deviation_are_statistics_medians(vals: dict[str, float]) -> None:
    """The O(n log n) reading of each GPU's others is exactly what `statistics.median` gives over them."""
    got = against_others(vals)
    for u, v in vals.items():
        others = [x for w, x in vals.items() if w != u]
        center = statistics.median(others)
        assert got[u] == (center, statistics.median(abs(x - center) for x in others)), (u, v)


def _could_be_apart(vals: list[float], clock: bool) -> list[int]:
    """The GPUs `_core`'s per-value test could name for these readings, at the least floor and either
    direction (its exact arithmetic over `against_others`, which the test above holds to `statistics`)."""
    got = against_others(dict(enumerate(vals)))
    out = []
    for u, v in enumerate(vals):
        center, mad = got[u]
        spread = max(MAD_SCALE * mad, (MAD_FLOOR_CLOCK if clock else MAD_FLOOR) * abs(center))
        if spread > 0 and abs((v - center) / spread) >= MIN_Z and abs(v - center) >= MIN_APART_HELD * abs(center):
            out.append(u)
    return out


def _readings_as_runs_read() -> st.SearchStrategy[list[float]]:
    """A run's readings as GPUs give them: around one level (a share, watts, hertz or bytes/s) with a
    spread from none (ties, one clock bin) to wide, a few GPUs off by any amount, values a unit in the
    last place apart, zeros and signs mixed (what the agents' parser never sends, the screen must still
    hold for)."""
    level = st.sampled_from([0.0, 1e-12, 0.5, 0.97, 1.0, 650.0, 1.98e9, 6e10, -3.0, 1e300])
    spread = st.sampled_from([0.0, 1e-16, 1e-9, 0.001, 0.01, 0.03, 0.1, 0.5, 2.0])

    @st.composite
    def draw(d: st.DrawFn) -> list[float]:
        base, width = d(level), d(spread)
        n = d(st.integers(3, 96))
        vals = [base * (1 + width * d(st.floats(-1, 1))) for _ in range(n)]
        for _ in range(d(st.integers(0, 3))):  # a few GPUs off: a little, a lot, to zero, a unit apart
            i = d(st.integers(0, n - 1))
            vals[i] = d(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=64),
                                  st.sampled_from([0.0, -0.0, math.nextafter(vals[i], math.inf), vals[i] * 0.9,
                                                   vals[i] * 0.95, vals[i] * 1.06, vals[i] * 0.5]),
                                  st.just(vals[(i + 1) % n])))
        return vals
    return draw()


@given(_readings_as_runs_read(), st.booleans())
@settings(max_examples=3000, deadline=None)
def test_a_run_said_to_have_no_gpu_apart_has_none(vals: list[float], clock: bool) -> None:
    """`none_apart` skips the per-GPU test only where it could name nobody: searched for a reading it
    screens out that the exact test would have named."""
    if none_apart(vals, clock):
        assert _could_be_apart(vals, clock) == []
    event(f"screened: {none_apart(vals, clock)}")


def test_healthy_runs_are_screened_and_a_gpu_apart_is_not() -> None:
    """The screen does its job on what runs read (or the per-GPU loop runs every pass for nothing):
    80 GPUs' SM activity 60–90 %, power 500–700 W, clocks within a bin, links 1–4 GB/s; one GPU's
    clock held down, or a reading twenty times the others', is left to the exact test."""
    rng = random.Random(3)
    for lo, hi, clock in ((0.6, 0.9, False), (500.0, 700.0, False), (1.965e9, 1.98e9, True), (1e9, 4e9, False)):
        vals = [rng.uniform(lo, hi) for _ in range(80)]
        assert none_apart(vals, clock), (lo, hi)
        odd = [*vals[:-1], lo * 0.2 if clock else hi * 20]
        assert _could_be_apart(odd, clock) == [79] and not none_apart(odd, clock), (lo, hi)
    assert not none_apart([1.98e9] * 79 + [1.41e9], True)
    assert not none_apart([1.0, 1.0], False)  # (too few to tell)
    assert not none_apart([1.0, float("nan"), 1.0, 1.0], False)


@st.composite
def _runs_records(d: st.DrawFn) -> list[PodGpuEvidence]:
    """A run's GPU records as agents send them: pods on a few nodes, each GPU's readings around the run's
    level, a few GPUs off, readings absent on a pod's every GPU or on one GPU only, energy windows
    (inverted too), power limits of 0, GPUs lost, shared, MIG instances, UUIDs not canonical or in two
    records, SM activity 0 at full utilization."""
    level = {k: d(st.sampled_from([v[0]] * 6 + v[1:])) for k, v in {
        "util": [0.99, 0.5, 1.0], "sm": [0.92, 0.005, 0.0, 0.6], "power": [600.0, 0.0, 350.0],
        "limit": [700.0, 0.0, 350.0], "clock": [1.98e9, 1.41e9], "mem": [0.5, 0.0, 1.0], "pcie": [2e9, 0.0],
        "nvlink": [4e10, 0.0], "joules": [18000.0, 0.0], "from": [32.0, 2.0], "to": [2.0, 32.0]}.items()}
    width = d(st.sampled_from([0.0, 0.0, 1e-9, 0.005, 0.02, 0.3]))
    names = list(level)
    pods: list[list[dict[str, Any]]] = []
    for _ in range(d(st.integers(1, 4))):
        absent = set(d(st.lists(st.sampled_from(names), max_size=3)))
        pods.append([{k: None if k in absent else level[k] * (1 + width * d(st.floats(-1, 1))) for k in names}
                     for _ in range(d(st.integers(1, 8)))])
    for _ in range(d(st.sampled_from([0, 0, 0, 1, 2, 3]))):  # a GPU off: a reading anything, or absent on it alone
        v = d(st.sampled_from(d(st.sampled_from(pods))))
        k = d(st.sampled_from(names))
        v[k] = d(st.one_of(st.none(), st.floats(), st.sampled_from([0.0, -0.0, 1.0]),
                           st.just(level[k] * 0.5), st.just(level[k] * 1.2), st.just(level[k] * 1.06)))
    out = []
    uid = 0
    rarely = st.sampled_from([False] * 60 + [True])
    for p, devices in enumerate(pods):
        devs = []
        for i, v in enumerate(devices):
            uid += 1
            u = d(st.sampled_from([f"GPU-{uid:08x}-0000-0000-0000-000000000000"] * 60 + [
                f"GPU-{max(1, uid - 1):08x}-0000-0000-0000-000000000000", f"gpu-{uid}",
                f"MIG-{uid:08x}-0000-0000-0000-000000000000"]))
            devs.append(GpuDevice(
                uuid=u, index=i, utilization=v["util"], sm_active=v["sm"], power_w=v["power"],
                power_limit_w=v["limit"], sm_clock_hz=v["clock"], memory_util=v["mem"], pcie_bps=v["pcie"],
                nvlink_bps=v["nvlink"], energy_j=v["joules"], energy_from_s=v["from"], energy_to_s=v["to"],
                lost=d(rarely), shared=d(rarely), mig_profile="1g.10gb" if d(rarely) else ""))
        out.append(PodGpuEvidence("ns", f"r-{p}", f"node-{d(st.integers(0, 2))}", "agent", NOW, tuple(devs), ("main",)))
    return out


@given(_runs_records())
@settings(max_examples=2500, deadline=None)
def test_a_run_screened_by_its_columns_is_what_each_gpu_compared_says(recs: list[PodGpuEvidence]) -> None:
    """`_screened` (a healthy run's records read column by column) answers only where it gives what
    comparing GPU by GPU gives (`_compared`): searched over records as agents send them and worse."""
    got = _screened(recs)
    if got is not None:
        assert got == _compared(recs)
        assert not got.apart and not got.bad
    event(f"screened: {got is not None}")


def test_the_agents_records_of_a_healthy_run_are_screened() -> None:
    """What the screen is for: 10 pods of 8 H100s at their everyday spread, every reading and an
    energy window each, are told apart from none without a GPU's own comparison; one GPU's clock held
    down, or SM activity 0 at full utilization, is left to it."""
    rng = random.Random(5)

    def pod(p: int, clock: float | None = None, sm: float | None = None, nvlink: bool = True) -> PodGpuEvidence:
        return PodGpuEvidence("ns", f"r-{p}", f"node-{p}", "agent", NOW, tuple(GpuDevice(
            uuid=f"GPU-{p:04x}{i:04x}-0000-0000-0000-000000000000", index=i, utilization=0.99,
            sm_active=sm if sm is not None and i == 3 else rng.uniform(0.6, 0.9), power_w=rng.uniform(500, 700),
            power_limit_w=700.0, sm_clock_hz=clock if clock is not None and i == 3 else rng.uniform(1.965e9, 1.98e9),
            memory_util=rng.uniform(0.3, 0.6), pcie_bps=rng.uniform(1e9, 4e9),
            nvlink_bps=rng.uniform(3e10, 5e10) if nvlink else None,
            energy_j=rng.uniform(15000, 21000), energy_from_s=32.0, energy_to_s=2.0) for i in range(8)), ("main",))

    healthy = [pod(p) for p in range(10)]
    got = _screened(healthy)
    assert got is not None and got == _compared(healthy) and got.devices == 80 and got.per_node == {
        f"node-{p}": 8 for p in range(10)}
    pcie_only = [*healthy[:-2], pod(8, nvlink=False), pod(9, nvlink=False)]  # (NVLink on no GPU of two pods)
    got = _screened(pcie_only)
    assert got is not None and got == _compared(pcie_only)
    assert _screened([*healthy[:-1], pod(9, clock=1.41e9)]) is None
    assert _screened([*healthy[:-1], pod(9, sm=0.0)]) is None and BUSY_UTIL <= 0.99


def test_what_the_column_screen_must_not_hide() -> None:
    """A GPU apart in its power against its limit (the same watts as the others), or in a reading another
    pod has on none of its GPUs (their columns hold zeros, not readings), is left to `_compared`."""
    def gpu(p: int, i: int, **kw: Any) -> GpuDevice:
        base: dict[str, Any] = {"utilization": 0.99, "sm_active": 0.9, "power_w": 600.0, "power_limit_w": 700.0,
                                "sm_clock_hz": 1.98e9, "memory_util": 0.5, "pcie_bps": 2e9, "nvlink_bps": 4e10,
                                "energy_j": 18000.0 + i, "energy_from_s": 32.0, "energy_to_s": 2.0}
        return GpuDevice(uuid=f"GPU-{p:04x}{i:04x}-0000-0000-0000-000000000000", index=i, **{**base, **kw})

    def rec(p: int, devs: list[GpuDevice]) -> PodGpuEvidence:
        return PodGpuEvidence("ns", f"r-{p}", f"node-{p}", "agent", NOW, tuple(devs), ("main",))

    limit = [rec(0, [gpu(0, i, power_limit_w=1000.0 if i == 0 else 700.0) for i in range(8)]),
             rec(1, [gpu(1, i) for i in range(8)])]
    no_clock = [rec(0, [gpu(0, i, sm_clock_hz=None) for i in range(8)]),
                rec(1, [gpu(1, i, sm_clock_hz=1.41e9 if i == 0 else 1.98e9) for i in range(8)])]
    for recs in (limit, no_clock):
        assert _compared(recs).apart, recs
        assert _screened(recs) is None
