"""Energy per step: joules from NVML's total energy counters over a run's GPUs, divided by the steps
the run advanced over the same interval (issue 28).

Each GPU's node agent sends its counter's window (`collector.gpu.GpuDevice.energy_j` over
`energy_from_s`..`energy_to_s` before the record was read, on the reader's clock). The steps the
run advanced over a window are read off its progress logs' step timeline (step against time,
linear between the steps seen; past the newest step by at most one step's share of its usual
interval, so a stall adds no steps), the median over the run's live logs that cover the window.
The run's joules per step is the sum over its GPUs of each GPU's joules over its window divided by
the steps over that same window: each GPU's own interval, never another's.

Fail closed: unknown (with the reason) when any GPU of the run has no counter window (NOT_SUPPORTED,
a MIG instance, the first reading, just after a counter reset), is shared with other pods (its
energy is theirs too), a pod that holds GPUs has no fresh readings, the windows do not overlap
(a node read long before the others), no log covers a window, or no step advanced in one (a stall
has no joules per step). Joules per token where the trainer prints its tokens/s per GPU (torchtitan,
NeMo Automodel) inside the windows: the run's watts over that rate times its GPUs. Pure: readings,
signals and a clock.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from operator import itemgetter, sub

from collector.correlate import RunEvidence, Signal
from collector.gpu import PodGpuEvidence, energy_columns, energy_windows, uuid_at
from collector.model import Energy, PodFacts
from collector.progress.model import PackedSamples, at_pace
from collector.timeunits import EPOCH, US

MIN_WINDOW_S = 60.0  # a shorter window holds too few steps to divide by


def timelines(ev: RunEvidence) -> list[tuple[list[float], list[int], float]]:
    """Each live progress log's (times, steps, median step interval), its current incarnation only."""
    return [line for sig in ev.signals if not sig.retired and not sig.durable and (line := timeline(sig)) is not None]


def timeline(sig: Signal) -> tuple[list[float], list[int], float] | None:
    """A log's (times, steps, median step interval), its current incarnation only; None under 3 steps."""
    samples = sig.scan.samples
    if len(samples) < 3:
        return None  # (a quiet log's: most of a fleet run's)
    got = _packed_line(samples) if isinstance(samples, PackedSamples) else None
    ts, steps = got if got is not None else _line(
        (x.step, x.at.timestamp()) for x in samples if x.step is not None and x.at is not None and not x.skipped)
    if len(steps) < 3:
        return None
    per = [(b - a) / (sb - sa) for a, b, sa, sb in zip(ts, ts[1:], steps, steps[1:], strict=False)]
    return ts, steps, statistics.median(per)


def _line(pairs: Iterable[tuple[int, float]]) -> tuple[list[float], list[int]]:
    """(times, steps) of a log's (step, unix time) pairs: its current incarnation (a step that went back
    starts it over), a step no higher than the one before, or earlier, left out."""
    ts: list[float] = []
    steps: list[int] = []
    for step, t in pairs:
        if steps and (step <= steps[-1] or t < ts[-1]):
            if step < steps[-1]:
                ts, steps = [], []  # a restart: its current incarnation only
            else:
                continue
        ts.append(t)
        steps.append(step)
    return ts, steps


def _packed_line(p: PackedSamples) -> tuple[list[float], list[int]] | None:
    """`_line` of a plain pack in a fixed-offset zone, read from its columns without building its
    samples (every evaluation of a run with an energy window walks its logs: issue 30); the same floats
    as `datetime.timestamp` (the µs since the epoch over 10**6). None: build them."""
    cols = p.steps_stamps()
    if cols is None:
        return None
    base = p.stamp(0)
    if type(base.tzinfo) is not timezone:
        return None
    steps, us = cols
    e = (base - EPOCH) // US
    ts = [(e + u) / 1_000_000 for u in us]
    if at_pace(steps, us):
        return ts, list(steps)  # (a trainer at its pace)
    return _line(zip(steps, ts, strict=True))


def step_at(ts: Sequence[float], steps: Sequence[int], interval: float, t: float) -> float | None:
    """The step reached at `t` (fractional); None before the first step seen."""
    if not ts or t < ts[0]:
        return None
    i = bisect.bisect_right(ts, t) - 1
    if i + 1 < len(ts):
        a, b = ts[i], ts[i + 1]
        return steps[i] + (steps[i + 1] - steps[i]) * ((t - a) / (b - a) if b > a else 0.0)
    return steps[-1] + (min(1.0, (t - ts[-1]) / interval) if interval > 0 else 0.0)


def energy_per_step(ev: RunEvidence, evidence: Iterable[PodGpuEvidence], now: datetime,
                    max_age: timedelta) -> Energy | None:
    """The run's joules per step now; None where no GPU of the run reports anything (nothing to say)."""
    held = {(p.ref.namespace, p.ref.name): p.facts.gpus for p in ev.pods
            if isinstance(p.facts, PodFacts) and not p.facts.terminal and not p.facts.deleting and p.facts.gpus > 0}
    fresh = {(e.namespace, e.pod): e for e in evidence if now - e.read_at <= max_age}
    # (every evaluation: each pod's windows read from its columns as far as needed, a UUID only where said)
    pods = [e for k, e in fresh.items() if k in held]
    count = sum(e.device_count for e in pods)
    if not count:
        return None

    def unknown(why: str) -> Energy:
        return Energy(None, None, count, None, None, why)

    missing = sorted(f"{ns}/{pod}" for (ns, pod), n in held.items()
                     if (ns, pod) not in fresh or fresh[(ns, pod)].device_count < n)
    if missing:
        return unknown(f"pod {missing[0]} holds GPUs with no fresh readings: energy per step unknown")
    # Each device's window in unix seconds (from, to) and its joules, device by device in the pods'
    # order; `owners` the pods by their first device's place (a device named only in a reason).
    froms: list[float] = []
    tos: list[float] = []
    joules: list[float] = []
    owners: list[tuple[int, PodGpuEvidence]] = []
    for e in pods:
        end = e.read_at.timestamp()
        owners.append((len(froms), e))
        cols = energy_columns(e)
        if cols is not None:  # (every device alone, with a window: a run's every pod, most often)
            js, fs, ts = cols
            froms.extend([end - f for f in fs])
            tos.extend([end - t for t in ts])
            joules.extend(js)
            continue
        for i, (not_alone, window) in enumerate(energy_windows(e)):
            if not_alone:
                return unknown(f"GPU {uuid_at(e, i)} is shared or a MIG instance: its energy is not the run's alone")
            if window is None:
                return unknown(f"GPU {uuid_at(e, i)} (node {e.node}) has no energy counter window (not offered, "
                               "just started, or reset): energy per step unknown")
            j, from_s, to_s = window
            froms.append(end - from_s)
            tos.append(end - to_s)
            joules.append(j)

    def device(k: int) -> str:
        """The `k`th device's UUID."""
        first, e = owners[bisect.bisect_right(owners, k, key=itemgetter(0)) - 1]
        return uuid_at(e, k - first)

    if max(froms) >= min(tos):
        return unknown("the GPUs' energy windows do not overlap (one node read long before the others): "
                       "energy per step unknown")
    spans = list(map(sub, tos, froms))
    shortest = min(spans)
    if shortest < MIN_WINDOW_S:
        return unknown(f"GPU {device(spans.index(shortest))}'s energy window is {shortest:.0f} s, "
                       f"under {MIN_WINDOW_S:.0f} s: too few steps to divide by yet")
    lines = timelines(ev)
    if not lines:
        return unknown("no progress log gives the run's steps: energy per step unknown")
    joules_per_step = watts = 0.0
    advanced: list[float] = []
    # The steps over a window, once a window: an agent reads its node's GPUs on one clock, so a node's
    # GPUs share their window (a run of 80 GPUs on 10 nodes: 10 walks of its logs, not 80)
    steps: dict[tuple[float, float], float] = {}
    last: tuple[float, float] | None = None
    n = 0.0
    for k, (a, b, j, span) in enumerate(zip(froms, tos, joules, spans, strict=True)):
        if (a, b) != last:
            last = (a, b)
            got = steps.get(last)
            if got is None:
                counts = [sb - sa for ts, st, iv in lines
                          if (sa := step_at(ts, st, iv, a)) is not None and (sb := step_at(ts, st, iv, b)) is not None]
                if not counts:
                    return unknown(f"no progress log covers GPU {device(k)}'s energy window: energy per step "
                                   "unknown")
                got = statistics.median(counts)
                if got <= 0:
                    return unknown(f"no step advanced over GPU {device(k)}'s energy window ({b - a:.0f} s): "
                                   "no joules per step")
                steps[last] = got
            n = got
        advanced.append(n)
        joules_per_step += j / n
        watts += j / span
    span = statistics.median(spans)
    per_token = joules_per_token(ev, watts, len(spans), min(froms), now)
    tokens = f", {per_token:.3g} J per token" if per_token is not None else ""
    return Energy(joules_per_step, watts, len(spans), statistics.median(advanced), span,
                  f"{joules_per_step:,.0f} J per step{tokens} over {len(spans)} GPUs ({watts:,.0f} W, "
                  f"{statistics.median(advanced):.1f} steps in {span:.0f} s)", per_token)


def joules_per_token(ev: RunEvidence, watts: float, gpus: int, since: float, now: datetime) -> float | None:
    """The run's watts over the tokens it trains per second: the tokens/s per GPU its trainer printed
    (torchtitan, NeMo Automodel) inside the energy windows, median over its live logs, times its GPUs.
    None where no log printed a dated rate in the windows (another trainer, an older line)."""
    end = now.timestamp()
    rates = [sig.scan.tokens.per_gpu for sig in ev.signals
             if not sig.retired and not sig.durable and sig.scan.tokens is not None
             and sig.scan.tokens.at is not None and since <= sig.scan.tokens.at.timestamp() <= end]
    if not rates:
        return None
    return watts / (statistics.median(rates) * gpus)
