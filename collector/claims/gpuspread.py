"""Fail-slow GPUs: a GPU whose readings sit apart from its run's other GPUs while the run is slower
than its own baseline, named with its node and UUID; and readings not to be believed.

From the node agents' per-GPU readings (`collector.gpu.PodGpuEvidence`): SM activity, power (as a
share of its limit where the limit is known), SM clock, memory bandwidth use, PCIe and NVLink
throughput. Bandwidth and throughput count only when *lower* than the others' (a starved GPU, a
link trained down): one rank moving more data (rank 0 loading data, writing a checkpoint) is no
fault; and only where the others' median is at least MIN_BPS (a link the run barely uses says
nothing). Power is the mean over the GPU's energy counter window where the agent sends one (NVML's
instantaneous power swings with every collective wait; minutes of joules do not), the instantaneous
reading otherwise. Each is compared over the run's GPUs with a robust z-score (median and MAD ×
1.4826, the MAD floored at MAD_FLOOR of the median, MAD_FLOOR_CLOCK for clocks, so identical
readings do not make a hair's difference infinite), never against a fixed threshold: a GPU is apart
when one reading sits MIN_Z robust deviations *and* MIN_APART of the median away from the others'
(an SM clock held down by a thermal, hardware-slowdown or power-brake reason the GPU itself reports:
MIN_APART_HELD; a 10 % slower GPU runs its clock 9 % lower).
A GPU apart is only a suspect while the run is slower than its own baseline (its recent median step
time against its earlier one, from its progress logs, by at least MIN_SLOWDOWN): a run keeping its
pace has no straggler to explain, and its spread stays unnamed.

Telemetry trust: profiling readings (SM activity) that read 0 while utilization is near 100% are a
known exporter failure mode, not an idle GPU: they are flagged untrustworthy and left out.

Fail closed: fewer than MIN_GPUS fresh, whole (not MIG, not shared) GPUs, or no baseline, name
nobody; nor do more than a quarter of the run's GPUs apart, or most GPUs of one node apart together
(a rank whose whole node computes longer or waits less, a hiccup or its input: the logs name the
rank; one GPU's fault is one GPU's). Pure: readings, signals and a clock.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import islice
from operator import lt
from types import MappingProxyType
from typing import Any, TypeVar

from collector.claims.memo import ByInputs
from collector.claims.stragglers import rising_run
from collector.correlate import Key, RunEvidence, Signal
from collector.gpu import GpuDevice, PodGpuEvidence, Readings, clock_reasons_at, compared, reading_columns, uuid_at
from collector.model import Straggler, Stragglers
from collector.progress.model import PackedSamples, ProgressSample

MIN_GPUS = 4
MIN_Z = 5.0
MIN_APART = 0.10  # of the median reading
MIN_APART_HELD = 0.05  # an SM clock its GPU says a hard slowdown reason holds down
MAD_FLOOR = 0.02  # of the median reading
MAD_FLOOR_CLOCK = 0.01  # SM clocks: healthy GPUs' agree within a clock bin or two (15 MHz bins, ~0.8 %)
MAD_SCALE = 1.4826
MIN_SLOWDOWN = 0.05  # recent step time over the run's own baseline
RECENT_INTERVALS = 15  # the recent step time: the median of this many last intervals ...
BASELINE_INTERVALS = 15  # ... against at least this many before them
MAX_SUSPECTS = 3
MIN_BPS = 1e7  # PCIe/NVLink: the others' median at least this many bytes/s, or the link is not compared
# (name, compared when lower only)
READINGS: tuple[tuple[str, bool], ...] = (
    ("SM activity", False), ("power (of its limit)", False), ("power", False), ("SM clock", False),
    ("memory bandwidth", True), ("PCIe throughput", True), ("NVLink throughput", True))
BUSY_UTIL = 0.90  # utilization at or above this with SM activity reading 0: the SM reading is wrong
ZERO_SM = 0.01
# Clocks-event reasons that slow a GPU down (not idle, not an application setting).
SLOWDOWN_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown"})
HARD_SLOWDOWN = SLOWDOWN_REASONS - {"sw_power_cap"}  # a power cap is everyday under load; these are not

K = TypeVar("K", bound=Hashable)  # a GPU: its UUID, or a key telling UUIDs apart (`gpu.compared`)


def untrusted(d: GpuDevice) -> str:
    """Why this device's profiling readings are not to be believed ("" when nothing says so)."""
    sm, util = d.sm_active, d.utilization
    if sm is not None and util is not None and sm < ZERO_SM and util >= BUSY_UTIL:
        return _untrusted(d.uuid, sm, util)
    return ""


def _untrusted(uuid: str, sm: float, util: float) -> str:
    return (f"{uuid}: SM activity reads {sm:.0%} while utilization is {util:.0%}; "
            "the profiling reading is not trusted (a known exporter failure mode), the GPU is not idle")


def slowdown(ev: RunEvidence) -> float | None:
    """The run's recent step time against its own earlier one, from its live progress logs (the median
    over them); None without enough steps to tell."""
    return slowdown_of(ev.signals)


def slowdown_of(signals: Iterable[Signal]) -> float | None:
    """`slowdown` over these signals (a run's: `RunEvidence.signals`)."""
    ratios = []
    for sig in signals:
        if sig.retired or sig.durable:
            continue
        samples = sig.scan.samples
        if not samples:
            continue  # (a quiet container's: most of a run's signals)
        cols = samples.columns() if isinstance(samples, PackedSamples) else None
        per = _per_step_packed(cols[0], cols[1]) if cols is not None else _per_step(samples)
        if len(per) < RECENT_INTERVALS + BASELINE_INTERVALS:
            continue
        base = statistics.median(per[:-RECENT_INTERVALS])
        if base > 0:
            ratios.append(statistics.median(per[-RECENT_INTERVALS:]) / base - 1)
    return statistics.median(ratios) if ratios else None


def _per_step(samples: Iterable[ProgressSample]) -> list[float]:
    """Seconds per step between the stepped, stamped samples of the current incarnation (`rising_run`)."""
    steps, ats = rising_run((x.step, x.at) for x in samples
                            if x.step is not None and x.at is not None and not x.skipped)
    return [(b - a).total_seconds() / (sb - sa)
            for a, b, sa, sb in zip(ats, ats[1:], steps, steps[1:], strict=False)]


def _per_step_packed(steps: Sequence[int], stamps: Sequence[int]) -> list[float]:
    """`_per_step` of a plain pack's columns (every sample stepped and stamped, stamps in µs): the same
    floats (`total_seconds` divides the µs by 10**6 the same way), without building the samples (the
    deferral asks on every agent increment of a head: issue 30)."""
    if not all(map(lt, steps, islice(steps, 1, None))):  # (else a trainer at its pace: every sample advances)
        steps, stamps = rising_run(zip(steps, stamps, strict=True))
    return [((b - a) / 1_000_000) / (sb - sa)
            for a, b, sa, sb in zip(stamps, islice(stamps, 1, None), steps, islice(steps, 1, None), strict=False)]


def _readings(r: Readings, trusted: bool) -> dict[str, float]:
    _, sm, watts, limit, clock, memory, pcie, nvlink, joules, from_s, to_s = r
    out: dict[str, float] = {}
    if sm is not None and trusted:
        out["SM activity"] = sm
    if joules is not None and from_s is not None and to_s is not None and from_s > to_s:
        watts = joules / (from_s - to_s)  # the mean over its energy window
    if watts is not None:
        if limit:
            out["power (of its limit)"] = watts / limit
        else:
            out["power"] = watts
    if clock is not None:
        out["SM clock"] = clock
    if memory is not None:
        out["memory bandwidth"] = memory
    if pcie is not None:
        out["PCIe throughput"] = pcie
    if nvlink is not None:
        out["NVLink throughput"] = nvlink
    return out


def _fmt(name: str, v: float) -> str:
    if name == "SM clock":
        return f"{v / 1e6:.0f} MHz"
    if name == "power":
        return f"{v:.0f} W"
    if name.endswith("throughput"):
        return f"{v / 1e9:.2f} GB/s"
    return f"{v:.0%}"


@dataclass(frozen=True, slots=True)
class _Core:
    """What the readings alone say (no clock, no logs): the whole GPUs compared, the readings not
    trusted, and each GPU apart with why."""

    devices: int  # the GPUs compared
    per_node: dict[str, int]  # of them, by node
    bad: tuple[str, ...]
    apart: Mapping[str, list[str]]
    # the GPUs apart: their pod's record and place in it (kept per run between the agents' passes:
    # records, not device objects, which the record builds on access)
    where: Mapping[str, tuple[PodGpuEvidence, int]]


# `_Core.apart` and `.where` of a run with no GPU apart (most, kept per run): one shared empty mapping,
# not two dicts a run
_NONE_APART: Mapping[str, Any] = MappingProxyType({})


# Per run, by the fresh evidence objects it was computed from (collector/claims/memo.py): a run
# re-evaluated on a log increment reads the same GPU evidence until the agents' next pass.
_CORES: ByInputs[Key, _Core] = ByInputs()


def gpu_spread(current: Stragglers | None, ev: RunEvidence, evidence: Iterable[PodGpuEvidence], now: datetime,
               max_age: timedelta) -> Stragglers | None:
    """`current` (the log-based verdict) with the GPU suspects and untrusted readings added."""
    fresh = [e for e in evidence if now - e.read_at <= max_age]
    key = ev.key
    kept = _CORES.get(key, fresh)
    if kept is not None:
        core = kept[0]
    else:
        core = _core(fresh)
        _CORES.put(key, fresh, core)
    return _verdict(current, ev, core)


def forget(run: Key) -> None:
    """A run gone: its kept comparison with it."""
    _CORES.forget(run)


def forget_replaced(current: Mapping[tuple[str, str], PodGpuEvidence]) -> None:
    """The agents' new pass (`current`, by pod) replaced the records: every kept comparison read from
    one no longer current goes now. It could not be served again (a new record is another object),
    and a run re-evaluated only on its next log increment (a progressing run, `planes.node_agents.runs_changed`) would
    hold the pass before's records until then: three passes' records at once as the next is decoded."""
    def is_current(e: object) -> bool:
        return isinstance(e, PodGpuEvidence) and current.get((e.namespace, e.pod)) is e

    _CORES.forget_unless(is_current)


def _core(fresh: Iterable[PodGpuEvidence]) -> _Core:
    fresh = list(fresh)
    screened = _screened(fresh)
    return screened if screened is not None else _compared(fresh)


def _compared(fresh: list[PodGpuEvidence]) -> _Core:
    """`_core`, GPU by GPU."""
    # by a key telling UUIDs apart (`gpu.compared`): a UUID's text only where said
    devices: dict[object, tuple[PodGpuEvidence, int, Readings]] = {}
    for e in fresh:
        for k, i, r in compared(e):
            devices[k] = (e, i, r)
    why = {u: _untrusted(uuid_at(e, i), sm, util)
           if (sm := r[1]) is not None and (util := r[0]) is not None and sm < ZERO_SM and util >= BUSY_UTIL else ""
           for u, (e, i, r) in devices.items()}  # (as `untrusted`: a UUID's text only where said)
    bad = tuple(sorted(w for w in why.values() if w))
    apart: dict[object, list[str]] = {}
    per_node: dict[str, int] = {}
    for e, _, _ in devices.values():
        per_node[e.node] = per_node.get(e.node, 0) + 1
    if len(devices) < MIN_GPUS:
        return _Core(len(devices), per_node, bad, _NONE_APART, _NONE_APART)
    per = {u: _readings(r, not why[u]) for u, (_, _, r) in devices.items()}
    for name, lower_only in READINGS:
        vals = {u: r[name] for u, r in per.items() if name in r}
        if len(vals) < MIN_GPUS or none_apart(list(vals.values()), name == "SM clock"):
            continue
        against = against_others(vals)
        for u, v in vals.items():
            center, mad = against[u]
            if lower_only and (v >= center or (name.endswith("throughput") and center < MIN_BPS)):
                continue
            spread = max(MAD_SCALE * mad, (MAD_FLOOR_CLOCK if name == "SM clock" else MAD_FLOOR) * abs(center))
            if spread <= 0:
                continue
            z = (v - center) / spread
            if abs(z) < MIN_Z:
                continue  # (most GPUs: the clock reasons below are read only for the few that are not)
            floor = MIN_APART_HELD if name == "SM clock" and set(clock_reasons_at(*devices[u][:2])) & HARD_SLOWDOWN \
                else MIN_APART
            if abs(v - center) >= floor * abs(center):
                apart.setdefault(u, []).append(f"{name} {_fmt(name, v)} against a median {_fmt(name, center)} "
                                               f"over the run's other {len(against) - 1} GPUs ({z:+.0f} robust "
                                               "deviations)")
    if not apart:
        return _Core(len(devices), per_node, bad, _NONE_APART, _NONE_APART)
    names = {u: uuid_at(*devices[u][:2]) for u in apart}
    return _Core(len(devices), per_node, bad, {names[u]: why for u, why in apart.items()},
                 {names[u]: devices[u][:2] for u in apart})


def _screened(fresh: list[PodGpuEvidence]) -> _Core | None:
    """`_core(fresh)` where its records' columns show no GPU that can read apart (`none_apart` of each
    reading: a healthy run's, on every evaluation), without a key, a tuple and a dict a GPU; None: ask
    `_core`. Only records `gpu.reading_columns` reads alike, no GPU in two records, no reading not trusted."""
    if not fresh:
        return None
    parts = []
    for e in fresh:
        got = reading_columns(e)
        if got is None:
            return None
        parts.append(got)
    keys = b"".join(k for k, _ in parts)
    total = len(keys) // 16
    if total < MIN_GPUS or len({keys[i:i + 16] for i in range(0, len(keys), 16)}) < total:
        return None
    # `_readings` of each GPU, one column at a time, in `_core`'s order of GPUs
    sm_on: list[float] = []
    of_limit: list[float] = []
    plain: list[float] = []
    clocks: list[float] = []
    memory: list[float] = []
    pcie: list[float] = []
    nvlink: list[float] = []
    for _, c in parts:
        util, sm, watts, limit, clock, mem, pc, nv, js, froms, tos = c
        if sm is not None:
            if util is not None and any(s < ZERO_SM and u >= BUSY_UTIL for s, u in zip(sm, util, strict=True)):
                return None  # (a reading not trusted: `_core` says which)
            sm_on += sm
        mean: Sequence[float | None] | None = watts  # (the energy window's mean where there is one)
        if js is not None and froms is not None and tos is not None:
            mean = [j / (f - t) if f > t else w for j, f, t, w in zip(js, froms, tos, watts or (None,) * len(js),
                                                                       strict=True)]
        if mean is not None:
            for w, lim in zip(mean, limit or (None,) * len(mean), strict=True):
                if w is not None:
                    (of_limit if lim else plain).append(w / lim if lim else w)
        for col, out in ((clock, clocks), (mem, memory), (pc, pcie), (nv, nvlink)):
            if col is not None:
                out += col
    for (name, _), vals in zip(READINGS, (sm_on, of_limit, plain, clocks, memory, pcie, nvlink), strict=True):
        if len(vals) >= MIN_GPUS and not none_apart(vals, name == "SM clock"):
            return None
    per_node: dict[str, int] = {}
    for e, (k, _) in zip(fresh, parts, strict=True):
        per_node[e.node] = per_node.get(e.node, 0) + len(k) // 16
    return _Core(total, per_node, (), _NONE_APART, _NONE_APART)


def _verdict(current: Stragglers | None, ev: RunEvidence, core: _Core) -> Stragglers | None:
    """The comparison's verdict against the run's own pace (its logs: read on every evaluation)."""
    devices, bad, apart, where = core.devices, core.bad, core.apart, core.where
    if devices < MIN_GPUS:
        if not bad:
            return current
        return _merged(current, (), bad, "")
    if not apart:
        return _merged(current, (), bad, "") if bad or current is not None else None
    slow = slowdown(ev)
    if len(apart) > max(1, devices // 4):
        return _merged(current, (), bad, f"{len(apart)} of {devices} GPUs read apart: not one GPU; none named")
    # Most of one node's GPUs apart together: its rank's work (its input, its host), which the logs
    # name; a GPU fault is one GPU's
    per_node: dict[str, list[str]] = {}
    for u in apart:
        per_node.setdefault(where[u][0].node, []).append(u)
    whole = sorted(n for n, us in per_node.items() if len(us) >= 2 and
                   2 * len(us) >= core.per_node[n])
    if whole:
        together = [u for n in whole for u in per_node[n]]
        if len(together) == len(apart):
            return _merged(current, (), bad, f"most GPUs of node {', '.join(whole)} read apart together: "
                                             "the node's or rank's work, not one GPU; none named")
        apart = {u: why for u, why in apart.items() if u not in together}
    if slow is None or slow < MIN_SLOWDOWN:
        pace = "its own pace is not known" if slow is None else f"it keeps its own pace ({slow:+.0%})"
        note = (f"GPU {', '.join(sorted(apart))} reads apart from the run's other GPUs, but {pace}: "
                "no straggler to explain, none named")
        return _merged(current, (), bad, note)
    named = []
    for u in sorted(apart, key=lambda u: -len(apart[u]))[:MAX_SUSPECTS]:
        e, i = where[u]
        reasons = sorted(set(clock_reasons_at(e, i)) & SLOWDOWN_REASONS)
        held = f"; clocks held down by {', '.join(reasons)}" if reasons else ""
        named.append(Straggler(
            "gpu", "", e.pod, e.node, slow, None, "gpu-spread",
            f"GPU {u} (pod {e.pod} on node {e.node}): {'; '.join(apart[u])}{held}; the run is {slow:.0%} slower "
            "than its own baseline", gpu=u))
    return _merged(current, tuple(named), bad, "")


def gpu_spread_uncached(current: Stragglers | None, ev: RunEvidence, evidence: Iterable[PodGpuEvidence],
                        now: datetime, max_age: timedelta) -> Stragglers | None:
    """`gpu_spread` computed afresh (tests and benchmarks: what the kept comparison must equal)."""
    return _verdict(current, ev, _core([e for e in evidence if now - e.read_at <= max_age]))


def against_others(vals: Mapping[K, float]) -> dict[K, tuple[float, float]]:
    """For each GPU, the median of the other GPUs' readings and their median absolute deviation from
    it: what `statistics.median` gives over each GPU's others, in O(n log n) instead of O(n² log n)
    (a run of 64 nodes has 512 GPUs, and this runs on every evaluation). The median of all but one
    value is read off the sorted values by its rank; it takes at most three values (`_without`), so
    the deviations are sorted once per value it takes."""
    if len(vals) < 3 or not all(math.isfinite(v) for v in vals.values()):  # (never from the agents' parser)
        return {u: _naive([x for w, x in vals.items() if w != u]) for u in vals}
    ordered = sorted(vals.values())
    k, below, at, above = _without(ordered)
    deviations: dict[float, tuple[list[float], int, float, float, float]] = {}
    out: dict[K, tuple[float, float]] = {}
    left = bisect.bisect_left
    for u, v in vals.items():
        j = left(ordered, v)
        center = below if j < k else at if j == k else above
        d = deviations.get(center)
        if d is None:
            devs = sorted(abs(x - center) for x in ordered)
            d = deviations[center] = (devs, *_without(devs))
        devs, dk, dbelow, dat, dabove = d
        j = left(devs, abs(v - center))
        out[u] = (center, dbelow if j < dk else dat if j == dk else dabove)
    return out


def none_apart(vals: list[float], clock: bool) -> bool:
    """Whether no value of `vals` can read apart from the others (`_core`'s test), told from bounds
    instead of each value's own median and deviation: a healthy run's readings (most runs, every pass)
    cost two sorts in C, not a loop over its GPUs. False says nothing.

    Each value's center (`against_others`) is one of three order statistics (`_without`), between
    `lo` and `hi` of them; its distance from any value is at most `worst`. The deviations around a
    center differ from those around `at` by at most the centers' gap, and so do their medians: each
    GPU's spread is at least `spread`. A value is apart only when both its distance ≥ MIN_Z spreads
    and ≥ MIN_APART_HELD (the least floor) of its center; the bounds say neither can hold. (Float
    rounding is monotone; the margins cover the last bits of the shift between centers.)"""
    if len(vals) < 3:
        return False
    if not math.isfinite(sum(vals)):  # (a NaN or an inf, or past the floats: the exact path)
        return False
    ordered = sorted(vals)
    _, below, at, above = _without(ordered)
    lo, hi = min(below, at, above), max(below, at, above)
    worst = max(ordered[-1] - lo, hi - ordered[0])
    least = min(abs(lo), abs(hi)) if (lo >= 0) == (hi >= 0) else 0.0
    if worst < MIN_APART_HELD * least * (1 - _MARGIN):
        return True
    devs = sorted([abs(x - at) for x in ordered])
    _, d1, d2, d3 = _without(devs)
    # (each deviation is rounded once: a few units in the last place of the largest)
    mad = min(d1, d2, d3) - (hi - lo) * (1 + _MARGIN) - 4 * math.ulp(2 * max(-ordered[0], ordered[-1]))
    spread = max(MAD_SCALE * mad, (MAD_FLOOR_CLOCK if clock else MAD_FLOOR) * least) * (1 - _MARGIN)
    return spread > 0 and worst / spread < MIN_Z


_MARGIN = 1e-9


def _without(ordered: Sequence[float]) -> tuple[int, float, float, float]:
    """`statistics.median` of sorted `ordered` (3 values at least) without its element at rank `j`,
    with the same arithmetic, by `j`: (k, the median for j < k, for j == k, for j > k)."""
    m = len(ordered) - 1
    k = m // 2
    if m % 2:
        return k, ordered[k + 1], ordered[k + 1], ordered[k]
    o = ordered
    return k, (o[k] + o[k + 1]) / 2, (o[k - 1] + o[k + 1]) / 2, (o[k - 1] + o[k]) / 2


def _naive(others: list[float]) -> tuple[float, float]:
    center = statistics.median(others)
    return center, statistics.median(abs(x - center) for x in others)


def _merged(current: Stragglers | None, gpus: Sequence[Straggler], bad: tuple[str, ...], note: str) -> Stragglers:
    base = current or Stragglers((), 0, 0, "")
    reason = "; ".join(x for x in (base.reason if base.suspects or not gpus else "",
                                   *(g.evidence for g in gpus), note) if x)
    if not reason and bad:
        reason = "GPU readings not trusted: " + "; ".join(bad)
    return replace(base, suspects=(*base.suspects, *gpus), reason=reason or base.reason, untrusted=bad)
