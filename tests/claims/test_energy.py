"""Energy per step (issue 28): joules from the GPUs' energy counter windows over the steps the run
advanced in the same interval; unknown, with the reason, whenever a GPU cannot be counted."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest

from collector.claims.energy import energy_per_step, step_at
from collector.gpu import PodGpuEvidence
from exporters.prometheus import ClaimsExporter, render
from tests.claims.test_gpuspread import gpus, megatron_log, run
from tests.claims.test_recheck_at import NOW, S, evidence, pod, taurun


def metered(watts: float = 500.0, window_s: float = 300.0, to_s: float = 2.0, *, n: int = 8,
            read_ago: float = 10.0) -> dict[tuple[str, str], PodGpuEvidence]:
    """8 GPUs, each drawing `watts` over a window ending `to_s` before its read."""
    g = gpus(n)
    return {k: replace(e, read_at=NOW - timedelta(seconds=read_ago),
                       devices=tuple(replace(d, energy_j=watts * window_s, energy_from_s=window_s + to_s,
                                             energy_to_s=to_s) for d in e.devices))
            for k, e in g.items()}


def test_joules_per_step_is_the_gpus_energy_over_the_steps_in_the_same_window() -> None:
    # steps of 10 s; 8 GPUs at 500 W: 8 x 500 W x 10 s = 40 kJ per step
    _, out = run(megatron_log(n=60), metered())
    e = out.energy
    assert e is not None and e.joules_per_step is not None
    assert abs(e.joules_per_step - 40_000) < 40_000 * 0.01, e
    assert e.gpus == 8 and abs(e.watts - 4_000) < 1 and abs(e.steps - 30) < 0.5 and e.window_s == 300
    assert "J per step over 8 GPUs" in e.reason
    # slower steps at the same power: more joules per step
    _, out = run(megatron_log(n=60, step_s=20.0), metered())
    assert out.energy is not None and out.energy.joules_per_step is not None
    assert abs(out.energy.joules_per_step - 80_000) < 800
    # the claims themselves never change
    _, bare = run(megatron_log(n=60, step_s=20.0), gpus())
    assert (out.scheduled, out.running, out.progressing) == (bare.scheduled, bare.running, bare.progressing)
    assert out.to_json()["energy"]["joules_per_step"] is not None


def test_each_window_counts_its_own_steps() -> None:
    # steps of 10 s; half the GPUs over 300 s (30 steps), half over 200 s (20 steps): the steps are
    # counted once a window (a node's GPUs share theirs), never one window's count for another
    g = metered()
    ((k, e),) = g.items()
    mixed = {k: replace(e, devices=(*e.devices[:4], *(replace(d, energy_j=500.0 * 200, energy_from_s=202.0)
                                                       for d in e.devices[4:])))}
    _, out = run(megatron_log(n=60), mixed)
    got = out.energy
    assert got is not None and got.joules_per_step is not None, got
    assert abs(got.joules_per_step - 40_000) < 400 and abs(got.steps - 25) < 0.5 and got.window_s == 250, got


def test_unknown_when_a_gpu_has_no_counter_or_is_shared_or_a_pod_has_no_readings() -> None:
    log = megatron_log(n=60)
    _, out = run(log, gpus())  # no energy windows at all
    assert out.energy is not None and out.energy.joules_per_step is None and "no energy counter" in out.energy.reason
    g = metered()
    ((k, e),) = g.items()
    one_missing = {k: replace(e, devices=(replace(e.devices[0], energy_j=None), *e.devices[1:]))}
    _, out = run(log, one_missing)
    assert out.energy is not None and out.energy.joules_per_step is None and "GPU-0000" in out.energy.reason
    shared = {k: replace(e, devices=(replace(e.devices[0], shared=True), *e.devices[1:]))}
    _, out = run(log, shared)
    assert out.energy is not None and out.energy.joules_per_step is None and "shared" in out.energy.reason
    _, out = run(log, metered(n=6))  # the pod holds 8 GPUs, readings for 6
    assert out.energy is not None and out.energy.joules_per_step is None and "no fresh readings" in out.energy.reason


def test_unknown_when_the_windows_do_not_overlap_or_no_step_advanced() -> None:
    g = metered()
    ((k, e),) = g.items()
    apart = {k: replace(e, devices=(*e.devices[:4], *(replace(d, energy_from_s=1_000.0, energy_to_s=700.0)
                                                       for d in e.devices[4:])))}
    _, out = run(megatron_log(n=120), apart)
    assert out.energy is not None and out.energy.joules_per_step is None and "do not overlap" in out.energy.reason
    # the log's last step 10 minutes before the window: a stall, no joules per step
    stalled = megatron_log(n=60).splitlines(keepends=True)
    ev = evidence([taurun(), pod()], log="".join(stalled[:-40]))
    got = energy_per_step(ev, metered().values(), NOW, S.evidence_max_age)
    assert got is not None and got.joules_per_step is None
    assert "no step advanced" in got.reason or "covers" in got.reason
    # a short window (just after a reset): too few steps yet
    _, out = run(megatron_log(n=60), metered(window_s=30.0))
    assert out.energy is not None and out.energy.joules_per_step is None and "too few steps" in out.energy.reason


def test_no_gpu_readings_say_nothing_and_stale_ones_are_not_used() -> None:
    _, out = run(megatron_log(n=60), {})
    assert out.energy is None
    ev = evidence([taurun(), pod()], log=megatron_log(n=60))
    assert energy_per_step(ev, metered(read_ago=S.evidence_max_age.total_seconds() + 1).values(), NOW,
                           S.evidence_max_age) is None


def test_step_at_interpolates_and_adds_at_most_one_step_past_the_newest() -> None:
    ts, st = [0.0, 10.0, 20.0], [1, 2, 3]
    assert step_at(ts, st, 10.0, -1.0) is None
    assert step_at(ts, st, 10.0, 15.0) == 2.5
    assert step_at(ts, st, 10.0, 25.0) == 3.5
    assert step_at(ts, st, 10.0, 500.0) == 4.0  # a stall adds no steps past one in flight


def test_the_gauge_on_both_render_paths_and_its_absence_while_unknown() -> None:
    _, out = run(megatron_log(n=60), metered())
    reg = CollectorRegistry()
    exp = ClaimsExporter(reg)
    exp.update([out], NOW)
    for text in (render(reg).decode(), generate_latest(reg).decode()):  # prepared text, client_python's
        line = next(x for x in text.splitlines() if x.startswith("taugrid_run_energy_joules_per_step{"))
        assert 'run="r"' in line and 39_000 < float(line.rsplit(" ", 1)[1]) < 41_000, line
    _, unknown = run(megatron_log(n=60), gpus())
    exp.update([unknown], NOW)
    for text in (render(reg).decode(), generate_latest(reg).decode()):
        assert "taugrid_run_energy_joules_per_step{" not in text


def test_explain_says_it() -> None:
    from collector.render import render_text

    _, out = run(megatron_log(n=60), metered())
    line = next(x for x in render_text([out], NOW).splitlines() if x.strip().startswith("energy"))
    assert "J/step" in line and "over 8 GPUs" in line
    _, unknown = run(megatron_log(n=60), gpus())
    line = next(x for x in render_text([unknown], NOW).splitlines() if x.strip().startswith("energy"))
    assert "unknown" in line and "no energy counter window" in line


def titan_log(n: int = 60, step_s: float = 10.0, tps: str = "1,000") -> str:
    """torchtitan's step lines, n steps of `step_s` ending at NOW, each with its tokens/s per GPU."""
    from tests.claims.test_recheck_at import ts
    t = NOW - timedelta(seconds=n * step_s)
    lines = []
    for i in range(n):
        t += timedelta(seconds=step_s)
        lines.append(f"{ts(t)} [titan] step: {100 + i}  loss:  2.5000  memory: 40.00GiB(50.00%)  tps: {tps}  "
                     "tflops: 300.00  mfu: 30.00%\n")
    return "".join(lines)


def test_joules_per_token_from_the_tokens_per_second_the_trainer_prints() -> None:
    # 8 GPUs at 500 W = 4,000 W; 1,000 tokens/s per GPU = 8,000 tokens/s: 0.5 J per token
    _, out = run(titan_log(), metered())
    e = out.energy
    assert e is not None and e.joules_per_step is not None and e.joules_per_token is not None
    assert abs(e.joules_per_token - 0.5) < 0.005, e
    assert "J per token" in e.reason and out.to_json()["energy"]["joules_per_token"] == round(e.joules_per_token, 6)
    reg = CollectorRegistry()
    exp = ClaimsExporter(reg)
    exp.update([out], NOW)
    for text in (render(reg).decode(), generate_latest(reg).decode()):  # prepared text, client_python's
        line = next(x for x in text.splitlines() if x.startswith("taugrid_run_energy_joules_per_token{"))
        assert 'run="r"' in line and 0.49 < float(line.rsplit(" ", 1)[1]) < 0.51, line
    # a trainer that prints no tokens/s: joules per step only, and no per-token series
    _, bare = run(megatron_log(n=60), metered())
    assert bare.energy is not None and bare.energy.joules_per_step is not None and bare.energy.joules_per_token is None
    exp.update([bare], NOW)
    for text in (render(reg).decode(), generate_latest(reg).decode()):
        assert "taugrid_run_energy_joules_per_token{" not in text


def _uuid(pod: int, i: int) -> str:
    return f"GPU-{pod:08x}-0000-4000-8000-{i:012x}"


def test_a_reason_names_the_gpu_of_the_pod_it_is_on() -> None:
    """A run of two pods whose devices are read from their records' columns (`gpu.energy_columns`: no
    tuple a device): the GPU a reason names is the one whose window it is, on its own pod."""
    from collector.gpu import energy_columns

    def pod_gpus(p: int, short: int | None = None) -> PodGpuEvidence:
        (e,) = metered().values()
        return replace(e, pod=f"r-{p}", node=f"node-r-{p}", devices=tuple(
            replace(d, uuid=_uuid(p, i), power_limit_w=700.0,  # (as an agent's document gives them: floats)
                    **({"energy_j": 500.0 * 30, "energy_from_s": 32.0} if i == short else {}))
            for i, d in enumerate(e.devices)))
    ev = evidence([taurun(), pod("r-0"), pod("r-1")], log=megatron_log(n=60))
    whole = [pod_gpus(0), pod_gpus(1)]
    assert all(energy_columns(e) is not None for e in whole)
    got = energy_per_step(ev, whole, NOW, S.evidence_max_age)
    assert got is not None and got.joules_per_step is not None and got.gpus == 16, got
    assert abs(got.joules_per_step - 80_000) < 800, got  # 16 GPUs at 500 W, steps of 10 s
    for p, i in ((1, 3), (0, 0), (1, 7), (0, 6)):
        short = [pod_gpus(0, i if p == 0 else None), pod_gpus(1, i if p == 1 else None)]
        got = energy_per_step(ev, short, NOW, S.evidence_max_age)
        assert got is not None and got.joules_per_step is None
        assert f"GPU {_uuid(p, i)}'s energy window is 30 s" in got.reason, got.reason
    # a device with no window on the second pod: that pod's records read device by device
    odd = replace(pod_gpus(1), devices=tuple(replace(d, energy_j=None) if i == 5 else d
                                             for i, d in enumerate(pod_gpus(1).devices)))
    assert energy_columns(odd) is None
    got = energy_per_step(ev, [pod_gpus(0), odd], NOW, S.evidence_max_age)
    assert got is not None and got.joules_per_step is None and f"GPU {_uuid(1, 5)} (node node-r-1)" in got.reason
