"""`GpuDevice` packed (issue 30: a controller holds every GPU pod's newest evidence): every field reads
back exactly what was given, equality and hashing are by value, `dataclasses` still treats it as a
dataclass, and every reader (the claims' GPU summary, the fail-slow comparison, energy per step, the
work-at-risk signals) answers as it did with the dataclass it replaces (`OldGpuDevice`, kept here)."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import struct
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.claims.energy import energy_per_step
from collector.claims.gpu import apply_gpu
from collector.claims.gpuspread import gpu_spread_uncached
from collector.claims.workrisk import with_gpu_signals
from collector.gpu import GpuDevice, GpuSummary, PodGpuEvidence, energy_window, fault_free, gpu_summary, readings
from collector.riskfacts import NodeRisk, WorkAtRisk
from tests.claims.test_gpuspread import megatron_log
from tests.claims.test_recheck_at import NOW, S, evidence, pod, taucluster, taurun


@dataclass(frozen=True, slots=True)
class OldGpuDevice:
    """The dataclass `GpuDevice` was before it was packed (1b82892): the reference."""

    uuid: str
    index: int | None = None
    utilization: float | None = None
    sm_active: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    lost: bool = False
    hang_hint: bool = False
    xids: tuple[int, ...] = ()
    mig_profile: str = ""
    shared: bool = False
    sm_clock_hz: float | None = None
    clock_reasons: tuple[str, ...] = ()
    memory_util: float | None = None
    pcie_bps: float | None = None
    nvlink_bps: float | None = None
    energy_j: float | None = None
    energy_from_s: float | None = None
    energy_to_s: float | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    xid_ages: tuple[tuple[int, float], ...] = ()
    ecc_uncorrected: int | None = None


def old_compared(e: PodGpuEvidence) -> list[tuple[object, int, Any]]:
    """The devices `claims.gpuspread` compared as it was (5efe548: by UUID, read one by one)."""
    return [(d.uuid, i, Both(d)) for i, d in enumerate(e.devices) if not d.lost and not d.shared and not d.mig_profile]


class Both(tuple):  # type: ignore[type-arg]
    """A device's readings (`readings`) that also answer as the device (`old_spread_readings`)."""

    d: GpuDevice

    def __new__(cls, d: GpuDevice) -> Both:
        out = super().__new__(cls, readings(d))
        out.d = d
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.d, name)


def old_energy_windows(e: PodGpuEvidence) -> list[tuple[bool, tuple[float, float, float] | None]]:
    """What energy per step read of each device as it was (5efe548): one by one."""
    return [(bool(d.shared or d.mig_profile), old_energy_window(d)) for d in e.devices]


def old_spread_readings(d: Any, trusted: bool) -> dict[str, float]:
    """`claims.gpuspread._readings` as it was (1b82892): the reference."""
    out: dict[str, float] = {}
    if d.sm_active is not None and trusted:
        out["SM activity"] = d.sm_active
    watts = d.power_w
    if d.energy_j is not None and d.energy_from_s is not None and d.energy_to_s is not None and \
            d.energy_from_s > d.energy_to_s:
        watts = d.energy_j / (d.energy_from_s - d.energy_to_s)  # the mean over its energy window
    if watts is not None:
        if d.power_limit_w:
            out["power (of its limit)"] = watts / d.power_limit_w
        else:
            out["power"] = watts
    if d.sm_clock_hz is not None:
        out["SM clock"] = d.sm_clock_hz
    if d.memory_util is not None:
        out["memory bandwidth"] = d.memory_util
    if d.pcie_bps is not None:
        out["PCIe throughput"] = d.pcie_bps
    if d.nvlink_bps is not None:
        out["NVLink throughput"] = d.nvlink_bps
    return out


def old_energy_window(d: Any) -> tuple[float, float, float] | None:
    """What energy per step read one by one (1b82892): the three fields, None where any is None."""
    if d.energy_j is None or d.energy_from_s is None or d.energy_to_s is None:
        return None
    return d.energy_j, d.energy_from_s, d.energy_to_s


def old_gpu_summary(evidence: Iterable[PodGpuEvidence], pods: Iterable[tuple[str, str]], now: datetime,
                    max_age: timedelta) -> GpuSummary:
    """`gpu_summary` as it was (1b82892): the reference."""
    wanted = set(pods)
    newest: dict[tuple[str, str], PodGpuEvidence] = {}
    for e in evidence:
        key = (e.namespace, e.pod)
        if key in wanted and now - e.read_at <= max_age and (key not in newest or e.read_at > newest[key].read_at):
            newest[key] = e
    devices = {d.uuid: d for e in newest.values() for d in e.devices}
    utils = [d.utilization for d in devices.values() if d.utilization is not None]
    powers = [d.power_w for d in devices.values() if d.power_w is not None]
    limits = [d.power_limit_w for d in devices.values() if d.power_limit_w is not None]
    return GpuSummary(
        pods=len(newest),
        allocated=len(devices),
        lost=tuple(sorted(u for u, d in devices.items() if d.lost)),
        hang_hint=tuple(sorted(u for u, d in devices.items() if d.hang_hint)),
        utilization=sum(utils) / len(utils) if utils else None,
        power_w=sum(powers) / len(powers) if powers else None,
        power_limit_w=sum(limits) / len(limits) if limits else None,
        xids=tuple(sorted({x for d in devices.values() for x in d.xids})),
        read_at=min((e.read_at for e in newest.values()), default=None),
    )


NAMES = [f.name for f in dataclasses.fields(OldGpuDevice)]
READINGS = ("utilization", "sm_active", "power_w", "power_limit_w", "sm_clock_hz", "memory_util", "pcie_bps",
            "nvlink_bps", "energy_j", "energy_from_s", "energy_to_s")
FLAGS = ("lost", "hang_hint", "shared", "remap_pending", "remap_failed")


def same(a: object, b: object) -> bool:
    """The same value of the same type: NaN as NaN of the same bits, -0.0 apart from 0.0 (recursively)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", float(b))  # type: ignore[arg-type]
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return a == b


def key(kw: dict[str, Any]) -> tuple[object, ...]:
    """Field equality with NaN readings equal to each other (the packed record's documented semantics;
    the dataclass's depended on the float objects' identity)."""
    def norm(v: object) -> object:
        if isinstance(v, tuple):
            return tuple(map(norm, v))
        return None if isinstance(v, float) and math.isnan(v) else ("v", v)
    return tuple(norm(kw[n]) for n in NAMES)


# Any value each field can be given, the odd ones included (a reading given as an int, an index past
# 16 bits, an ECC count past 16 bits, negative, NaN of other bits, -0.0, ±inf).
odd_float = st.sampled_from([math.nan, -math.nan, struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0],
                             0.0, -0.0, math.inf, -math.inf, 5e-324, sys.float_info.max])
reading = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), odd_float,
                    st.integers(-(1 << 70), 1 << 70))
count = st.one_of(st.none(), st.integers(-5, 70_000), st.integers(-(1 << 80), 1 << 80))
flag = st.one_of(st.booleans(), st.sampled_from([0, 1, None]))
text = st.text(max_size=12)
fields_any = st.fixed_dictionaries({
    "uuid": text, "index": count, **dict.fromkeys(READINGS, reading), **dict.fromkeys(FLAGS, flag),
    "xids": st.tuples() | st.lists(st.integers(-(1 << 40), 1 << 40), max_size=4).map(tuple),
    "mig_profile": text, "clock_reasons": st.lists(text, max_size=3).map(tuple),
    "xid_ages": st.lists(st.tuples(st.integers(0, 9999), st.floats(allow_nan=True)), max_size=3).map(tuple),
    "ecc_uncorrected": count})


@settings(max_examples=600, deadline=None)
@given(fields_any)
def test_every_field_reads_back_exactly_what_was_given(kw: dict[str, Any]) -> None:
    d = GpuDevice(**kw)
    for n in NAMES:
        assert same(getattr(d, n), kw[n]), (n, getattr(d, n), kw[n])
    assert same(readings(d), tuple(kw[n] for n in READINGS))
    window = (kw["energy_j"], kw["energy_from_s"], kw["energy_to_s"])
    assert same(energy_window(d), None if None in window else window)
    assert fault_free(d) == (not (kw["lost"] or kw["remap_pending"] or kw["remap_failed"] or kw["ecc_uncorrected"]
                                  or kw["xids"]))
    old = OldGpuDevice(**kw)
    assert [f.name for f in dataclasses.fields(d)] == NAMES and dataclasses.is_dataclass(d)
    assert list(GpuDevice.__match_args__) == NAMES
    assert repr(d) == repr(old).replace("OldGpuDevice(", "GpuDevice(")
    for back in (pickle.loads(pickle.dumps(d)), copy.deepcopy(d), copy.copy(d), dataclasses.replace(d)):
        assert all(same(getattr(back, n), kw[n]) for n in NAMES)
        assert back == d and hash(back) == hash(d)
    assert d == d and hash(d) == hash(GpuDevice(**kw))
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.uuid = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.utilization = 0.5  # type: ignore[misc]


@settings(max_examples=400, deadline=None)
@given(fields_any, st.data())
def test_equality_and_hash_are_field_equality(kw: dict[str, Any], data: st.DataObject) -> None:
    # another device: the same, or one field changed (often to an equal value of another form: 0.0 / -0.0)
    name = data.draw(st.sampled_from(NAMES))
    v = kw[name]
    other = {**kw, name: data.draw(st.one_of(
        st.just(v), st.just(-v) if isinstance(v, float) else st.just(v), fields_any.map(lambda k: k[name])))}
    a, b = GpuDevice(**kw), GpuDevice(**other)
    assert (a == b) == (key(kw) == key(other)), (name, kw[name], other[name])
    assert (a != b) == (key(kw) != key(other))
    if a == b:
        assert hash(a) == hash(b)
    if "nan" not in repr((kw, other)):
        assert (a == b) == (OldGpuDevice(**kw) == OldGpuDevice(**other))  # NaN aside, the dataclass's answer
    assert a != OldGpuDevice(**kw) and a != kw["uuid"]


@settings(max_examples=300, deadline=None)
@given(fields_any, st.data())
def test_replace_changes_one_field_and_keeps_the_others(kw: dict[str, Any], data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES))
    v = data.draw(fields_any.map(lambda k: k[name]))
    d = dataclasses.replace(GpuDevice(**kw), **{name: v})
    assert isinstance(d, GpuDevice)
    for n in NAMES:
        assert same(getattr(d, n), v if n == name else kw[n]), n
    assert dataclasses.asdict(d).keys() == dataclasses.asdict(OldGpuDevice(**kw)).keys()


def test_fault_free_is_no_fault_field_set() -> None:
    base = GpuDevice("GPU-a", 0, utilization=0.9, ecc_uncorrected=0)
    assert fault_free(base) and fault_free(GpuDevice("GPU-a")) and fault_free(GpuDevice("GPU-a", xid_ages=((79, 1.0),)))
    for changed in ({"lost": True}, {"remap_pending": True}, {"remap_failed": True}, {"ecc_uncorrected": 1},
                    {"ecc_uncorrected": 256}, {"ecc_uncorrected": 1 << 40}, {"xids": (79,)}, {"lost": 1}):
        assert not fault_free(dataclasses.replace(base, **changed)), changed
    assert fault_free(dataclasses.replace(base, lost=0))  # (a falsy value kept aside)


def test_a_device_is_compact() -> None:
    """What the controller holds a device by: ~200 B (the dataclass: ~470 B with its 11 float objects)."""
    d = GpuDevice("GPU-x", 3, utilization=0.9, sm_active=0.7, power_w=600.0, power_limit_w=700.0, sm_clock_hz=1.9e9,
                  memory_util=0.4, pcie_bps=1e9, nvlink_bps=1e10, energy_j=3e5, energy_from_s=600.0,
                  energy_to_s=0.0, clock_reasons=("sw_power_cap",), ecc_uncorrected=0)
    assert sys.getsizeof(d) + sys.getsizeof(d._b) <= 192  # (getsizeof counts the GC header)
    assert d._m == 0 and d._rare is GpuDevice("GPU-y", clock_reasons=("sw_power_cap",))._rare  # shared
    assert GpuDevice("GPU-z")._rare is None
    assert GpuDevice("GPU-a", 0, utilization=0.5)._m is GpuDevice("GPU-b", 1, utilization=0.7)._m  # shared


def test_the_records_hold_only_their_slots_and_refuse_changes() -> None:
    """`GpuDevice` and `PodGpuEvidence` share their frozen guards (`gpudevice._Frozen`), which add nothing to
    an object: no `__dict__`, no `__weakref__`, its own slots only; no field deleted or added after `__init__`."""
    d = GpuDevice("GPU-a", 0, utilization=0.5)
    e = PodGpuEvidence("ns", "pod", "node", "agent", datetime(2026, 1, 1), (d,))
    for rec, name, value in ((d, "uuid", "GPU-a"), (e, "pod", "pod")):
        cls = type(rec)
        assert not hasattr(rec, "__dict__") and not hasattr(rec, "__weakref__")
        assert cls.__basicsize__ == object.__basicsize__ + struct.calcsize("P") * len(cls.__slots__)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(rec, name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec.extra = 1  # type: ignore[union-attr]
        assert getattr(rec, name) == value
        for back in (pickle.loads(pickle.dumps(rec)), copy.copy(rec), copy.deepcopy(rec)):
            assert type(back) is cls and back == rec and hash(back) == hash(rec)


# --- the readers: same answers as with the dataclass ---------------------------------------------------

REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "gpu_idle", "sw_thermal_slowdown")


def unit(lo: float, hi: float, nan: bool = False) -> st.SearchStrategy[float | None]:
    extra = [0.0, -0.0, lo, hi] + ([math.nan, math.inf] if nan else [])
    return st.one_of(st.none(), st.floats(lo, hi), st.sampled_from(extra))


@st.composite
def device(draw: st.DrawFn, uuid: str, index: int, slow: bool, clean: bool) -> dict[str, Any]:
    """Any device a source can send; `clean`: a whole healthy one with every reading and a common energy
    window (so that the fail-slow comparison and energy per step get to their answers), `slow` apart."""
    if clean:
        jit = draw(st.floats(-0.02, 0.02))
        return {"uuid": uuid, "index": index, "utilization": 0.99, "sm_active": 0.9 * (1 + jit),
                "power_w": 600.0 * (1 + jit), "power_limit_w": 700.0,
                "sm_clock_hz": (1.41e9 if slow else 1.98e9 * (1 + jit)),
                "clock_reasons": ("hw_thermal_slowdown",) if slow else (), "memory_util": 0.5 * (1 + jit),
                "pcie_bps": 1e9 * (1 + jit), "nvlink_bps": 1e11 * (1 + jit), "energy_j": 600.0 * 300.0 * (1 + jit),
                "energy_from_s": 302.0, "energy_to_s": 2.0, "ecc_uncorrected": 0}
    energy = draw(st.none() | st.tuples(st.floats(100.0, 400.0), st.floats(0.0, 30.0), st.floats(100.0, 700.0)))
    xids = tuple(sorted(draw(st.sets(st.sampled_from([13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95]), max_size=2))))
    return {
        "uuid": uuid, "index": draw(st.sampled_from([index, index, None, 70_000])),
        "utilization": draw(unit(0.0, 1.0, nan=True)), "sm_active": draw(unit(0.0, 1.0)),
        # (dcgm: watts of any float, NaN included; a test's int)
        "power_w": draw(st.one_of(unit(50.0, 700.0, nan=True), st.just(650 if slow else 600))),
        "power_limit_w": draw(st.sampled_from([None, 700.0, 0.0, 700])),
        "lost": draw(st.booleans()) and draw(st.booleans()), "hang_hint": draw(st.booleans()),
        "xids": xids, "mig_profile": draw(st.sampled_from(["", "", "", "1g.10gb"])),
        "shared": draw(st.booleans()) and draw(st.booleans()),
        "sm_clock_hz": draw(st.one_of(st.none(), st.sampled_from([1.98e9, 1.965e9, 1.41e9 if slow else 1.98e9]),
                                      st.floats(1e9, 2e9))),
        "clock_reasons": tuple(sorted(draw(st.sets(st.sampled_from(REASONS), max_size=2)))),
        "memory_util": draw(unit(0.0, 1.0)), "pcie_bps": draw(unit(0.0, 2e10)), "nvlink_bps": draw(unit(0.0, 9e11)),
        "energy_j": None if energy is None else energy[2] * (energy[0] - energy[1]),
        "energy_from_s": None if energy is None else energy[0], "energy_to_s": None if energy is None else energy[1],
        "remap_pending": draw(st.booleans()) and draw(st.booleans()),
        "remap_failed": draw(st.booleans()) and draw(st.booleans()),
        "xid_ages": tuple((x, draw(st.floats(0.0, 600.0))) for x in xids if draw(st.booleans())),
        "ecc_uncorrected": draw(st.sampled_from([None, 0, 0, 2, 70_000])),
    }


def canonical(p: int, i: int, prefix: str = "GPU-") -> str:
    return f"{prefix}{uuid.UUID(int=p << 64 | i * 0x9E3779B97F4A7C15 % (1 << 64))}"


@st.composite
def fleet(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[dict[str, Any]], float]]]:
    """A run of `workers` pods: per pod, its index, its devices and how long ago it was read."""
    workers = draw(st.integers(1, 4))
    clean = draw(st.booleans())
    pods = []
    for p in range(workers + 1):
        n = 8 if clean else draw(st.sampled_from([0, 8, 8, 8, 6]))
        slow = draw(st.integers(-1, n - 1)) if n else -1
        # canonical UUIDs (held as 16 bytes), MIG ones, others kept aside as given, one two pods name
        canon = draw(st.booleans())
        uuids = [(canonical(p, i) if canon else f"GPU-{p}-{i}") if clean else draw(st.sampled_from(
            [canonical(p, i), canonical(p, i), f"GPU-{p}-{i}", canonical(p, i, "MIG-"), "GPU-shared",
             canonical(99, 0)])) for i in range(n)]
        pods.append((p, [draw(device(u, i, i == slow and (p == 0 or not clean), clean)) for i, u in enumerate(uuids)],
                     10.0 if clean else draw(st.sampled_from([10.0, 10.0, 30.0, 400.0]))))
    return workers, pods


def build(cls: type[Any], pods: list[tuple[int, list[dict[str, Any]], float]]) -> dict[tuple[str, str], PodGpuEvidence]:
    return {("ns", f"r-{p}"): PodGpuEvidence("ns", f"r-{p}", f"node-r-{p}", "agent", NOW - timedelta(seconds=ago),
                                             tuple(cls(**kw) for kw in devs), ("main",))
            for p, devs, ago in pods}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fleet(), st.sampled_from([megatron_log(slow_from=35, slower=0.3), megatron_log(n=60), ""]))
def test_the_readers_answer_as_with_the_dataclass(f: tuple[int, list[Any]], log: str) -> None:
    workers, pods = f
    new = old = build(GpuDevice, pods)
    for p, devs, _ in pods:  # the packed records hold every device as given
        assert all(same(getattr(d, n), getattr(OldGpuDevice(**kw), n)) for d, kw in
                   zip(new[("ns", f"r-{p}")].devices, devs, strict=True) for n in NAMES)
    ev = evidence([taurun(workers=workers), taucluster(timedelta(minutes=1), workers=workers),
                   *(pod(f"r-{p}") for p, _, _ in pods)], log=log)
    keys = list(new)
    age = S.evidence_max_age
    assert repr(gpu_summary(new.values(), keys, NOW, age)) == repr(old_gpu_summary(old.values(), keys, NOW, age))
    spread = gpu_spread_uncached(None, ev, new.values(), NOW, age)
    with mock.patch("collector.claims.gpuspread.compared", old_compared), \
            mock.patch("collector.claims.gpuspread._readings", old_spread_readings):
        assert repr(spread) == repr(gpu_spread_uncached(None, ev, old.values(), NOW, age))
    energy = energy_per_step(ev, new.values(), NOW, age)
    with mock.patch("collector.claims.energy.energy_windows", old_energy_windows):
        assert repr(energy) == repr(energy_per_step(ev, old.values(), NOW, age))
    event(f"energy per step {'known' if energy is not None and energy.joules_per_step is not None else 'unknown'}")
    event(f"GPU suspects named: {bool(spread is not None and spread.suspects)}")
    w = WorkAtRisk(1.0, 8, None, "run-start", "", nodes=tuple(NodeRisk(f"node-r-{p}", 0.0, (), (), 8, 1.0)
                                                              for p, _, _ in pods))
    got = with_gpu_signals(w, new.values(), NOW, age)
    event(f"work-at-risk signals: {bool(got is not None and any(n.signals for n in got.nodes))}")
    with mock.patch("collector.claims.workrisk.faulty", lambda e: list(e.devices)):  # the loop as it was: no skip
        assert repr(got) == repr(with_gpu_signals(w, old.values(), NOW, age))
    # the whole GPU plane of the claims
    rc = evaluate(ev, NOW, S)
    nodes = {f"node-r-{p}": NOW - timedelta(seconds=10) for p, _, _ in pods}
    got_rc = apply_gpu(rc, ev, new, nodes, NOW, S)
    with mock.patch("collector.claims.gpu.gpu_summary", old_gpu_summary), \
            mock.patch("collector.claims.workrisk.faulty", lambda e: list(e.devices)), \
            mock.patch("collector.claims.gpuspread.compared", old_compared), \
            mock.patch("collector.claims.gpuspread._readings", old_spread_readings), \
            mock.patch("collector.claims.energy.energy_windows", old_energy_windows):
        assert repr(got_rc) == repr(apply_gpu(rc, ev, old, nodes, NOW, S))


def test_orjson_refuses_the_packed_records_instead_of_crashing() -> None:
    """orjson reads a dataclass's fields from its class's own dict and takes each value as borrowed: a
    packed record's readings are made on each read, so it freed them under itself and the process
    died (SIGSEGV). The records keep their fields on a base (`dataclasses` still sees them) and orjson
    refuses them with a TypeError. Run apart: a regression must not take the test run down with it."""
    import subprocess

    code = """
import orjson
from datetime import datetime, UTC
from collector.gpu import GpuDevice, PodGpuEvidence
d = GpuDevice("GPU-a", 0, utilization=0.5, power_w=300.0)
for record in (d, PodGpuEvidence("ns", "p", "n", "agent", datetime(2026, 1, 1, tzinfo=UTC), (d,))):
    try:
        orjson.dumps(record)
    except TypeError as e:
        print("refused:", e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-500:]}"
    assert done.stdout.count("refused: Type is not JSON serializable") == 2, done.stdout
    d = GpuDevice("GPU-a", 0, utilization=0.5)
    assert dataclasses.is_dataclass(d)
    assert [f.name for f in dataclasses.fields(d)][:3] == ["uuid", "index", "utilization"]
    assert dataclasses.replace(d, utilization=0.7).utilization == 0.7 and dataclasses.asdict(d)["utilization"] == 0.5


STATE = ("uuid", "index", "lost", "hang_hint", "xids", "mig_profile", "remap_pending", "remap_failed",
         "ecc_uncorrected")
# Devices as agents report them, mostly: canonical UUIDs, plain readings, small indexes and counts.
fields_plain = st.fixed_dictionaries({
    "uuid": st.sampled_from([f"GPU-{uuid.UUID(int=i)}" for i in range(4)]), "index": st.integers(0, 7),
    **dict.fromkeys(READINGS, st.none() | st.floats(0.0, 1e4)), **dict.fromkeys(FLAGS, st.booleans()),
    "xids": st.sampled_from([(), (), (79,)]), "mig_profile": st.just(""), "clock_reasons": st.just(()),
    "xid_ages": st.just(()), "ecc_uncorrected": st.none() | st.integers(0, 3)})
fields_mixed = fields_plain | fields_plain | fields_any


@settings(max_examples=400, deadline=None)
@given(st.lists(fields_mixed, min_size=1, max_size=4), st.data())
def test_the_same_held_bytes_mean_the_same_devices(devices: list[dict[str, Any]], data: st.DataObject) -> None:
    """`same_held_bytes` (a GPU pass's quick answer, pod by pod) says true only where the devices agree
    on every field `same_devices` compares; for devices alike but for their readings, as a steady
    pass has them, it says so without building either's held state."""
    from collector.gpu import held_state, same_held_bytes
    from collector.planes.node_agents import same_devices

    changed = []
    for kw in devices:
        name = data.draw(st.sampled_from([*READINGS, *READINGS, *STATE]))
        changed.append({**kw, name: data.draw(fields_mixed.map(lambda k, n=name: k[n]))})
    a = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in devices), ("main",))
    b = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in changed), ("main",))
    if same_held_bytes(a, b):
        event("same bytes")
        assert held_state(a) is not None and held_state(a) == held_state(b)
        assert [tuple(getattr(d, f) for f in STATE) for d in a.devices] == \
            [tuple(getattr(d, f) for f in STATE) for d in b.devices]
        assert same_devices(a, b)


@settings(max_examples=400, deadline=None)
@given(st.lists(fields_mixed, min_size=1, max_size=4), st.data())
def test_same_devices_is_the_fields_it_compares_and_nothing_else(devices: list[dict[str, Any]],
                                                                 data: st.DataObject) -> None:
    """`same_devices` (whether a pass changed a pod's devices for the claims) says the same as comparing
    the fields it names, device by device: readings, throttle reasons and XID ages moving (a power cap
    on and off, pass after pass) are no change; one of those fields moving is."""
    from collector.planes.node_agents import same_devices

    changed = []
    for kw in devices:
        names = data.draw(st.lists(st.sampled_from([*READINGS, "clock_reasons", "xid_ages", *STATE]), max_size=3))
        new = {n: data.draw(fields_mixed.map(lambda k, n=n: k[n])) for n in names}
        if data.draw(st.booleans()):  # a throttle reason on or off, as a GPU under load shows pass after pass
            new["clock_reasons"] = data.draw(st.sampled_from([(), ("sw_power_cap",), ("hw_slowdown", "sw_power_cap")]))
        changed.append({**kw, **new})
    a = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in devices), ("main",))
    b = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in changed), ("main",))
    fields_alike = [tuple(getattr(d, f) for f in STATE) for d in a.devices] == \
        [tuple(getattr(d, f) for f in STATE) for d in b.devices]
    assert same_devices(a, b) == fields_alike


rare_only = st.fixed_dictionaries({
    "uuid": st.sampled_from([f"GPU-{uuid.UUID(int=i)}" for i in range(3)] + ["GPU-not-canonical"]),
    "index": st.integers(0, 3), "utilization": st.floats(0.0, 1.0), "xids": st.sampled_from([(), (79,), (48,)]),
    "clock_reasons": st.sampled_from([(), ("sw_power_cap",)]), "xid_ages": st.sampled_from([(), ((79, 5.0),)]),
    "mig_profile": st.sampled_from(["", "", "1g.10gb"])})


@settings(max_examples=500, deadline=None)
@given(st.lists(rare_only, min_size=1, max_size=3), st.data())
def test_rare_fields_alone_moving_are_told_apart_from_xids_and_profiles(devices: list[dict[str, Any]],
                                                                        data: st.DataObject) -> None:
    """Devices alike but for their rare fields (throttle reasons, XID ages: no change for the claims;
    XIDs, a MIG profile: a change), with UUIDs packed or kept aside: `same_devices` and the quick
    `same_held_bytes` agree with the fields they stand for."""
    from collector.gpu import same_held_bytes
    from collector.planes.node_agents import same_devices

    changed = [{**kw, **data.draw(st.fixed_dictionaries({}, optional={
        k: rare_only.map(lambda r, k=k: r[k]) for k in ("xids", "clock_reasons", "xid_ages", "mig_profile")}))}
        for kw in devices]
    a = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in devices), ("main",))
    b = PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(GpuDevice(**kw) for kw in changed), ("main",))
    alike = [tuple(getattr(d, f) for f in STATE) for d in a.devices] == \
        [tuple(getattr(d, f) for f in STATE) for d in b.devices]
    assert same_devices(a, b) == alike
    assert not same_held_bytes(a, b) or alike


def test_a_steady_pass_is_told_alike_by_its_bytes() -> None:
    from collector.gpu import same_held_bytes

    def pod(util: float) -> PodGpuEvidence:
        return PodGpuEvidence("ns", "p", "n", "agent", NOW, tuple(
            GpuDevice(f"GPU-{uuid.UUID(int=i)}", i, utilization=util, power_w=500.0 + i, power_limit_w=700.0)
            for i in range(8)), ("main",))
    assert same_held_bytes(pod(0.9), pod(0.5))
    lost = pod(0.9)
    lost = PodGpuEvidence("ns", "p", "n", "agent", NOW, (dataclasses.replace(lost.devices[0], lost=True),
                                                           *lost.devices[1:]), ("main",))
    assert not same_held_bytes(pod(0.9), lost)
