"""A pod's GPU evidence packed together (`collector.gpu.PodGpuEvidence`, issue 30): every device reads
back exactly as given, the record keeps the dataclass's behaviour, and the column readers answer as the
devices would."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.gpu import (
    GpuDevice,
    PodGpuEvidence,
    clock_reasons_at,
    compared,
    energy_window,
    energy_windows,
    fault_free,
    faulty,
    readings,
    readings_of,
    sampled,
    uuid_at,
    uuids,
)
from collector.planes.node_agents import same_devices
from tests.agent.test_gpu_device import NAMES, fields_any, same

AT = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class OldPodGpuEvidence:
    """The dataclass `PodGpuEvidence` was before it was packed (5efe548): the reference."""

    namespace: str
    pod: str
    node: str
    source: str
    read_at: datetime
    devices: tuple[GpuDevice, ...]
    containers: tuple[str, ...] = ()


def old_same_devices(a: Any, b: Any) -> bool:
    """`planes.node_agents.same_devices` as it was (5efe548): the reference."""
    return (a.node == b.node and a.source == b.source and a.containers == b.containers
            and len(a.devices) == len(b.devices)
            and all((x.uuid, x.index, x.lost, x.hang_hint, x.xids, x.mig_profile, x.remap_pending, x.remap_failed,
                     x.ecc_uncorrected)
                    == (y.uuid, y.index, y.lost, y.hang_hint, y.xids, y.mig_profile, y.remap_pending, y.remap_failed,
                        y.ecc_uncorrected)
                    for x, y in zip(a.devices, b.devices, strict=True)))


canonical = st.uuids().map(str)
uuid_any = st.one_of(
    canonical.map(lambda u: f"GPU-{u}"), canonical.map(lambda u: f"MIG-{u}"),
    canonical.map(lambda u: f"GPU-{u.upper()}"), canonical.map(lambda u: f"MIG-GPU-{u}/1/0"),
    st.tuples(canonical, st.integers(4, 39), st.sampled_from(" -g\t٣xG")).map(
        lambda t: (f"GPU-{t[0]}"[:t[1]] + t[2] + f"GPU-{t[0]}"[t[1] + 1:])),  # one character off
    st.text(max_size=44), st.sampled_from(["", "GPU-", "GPU-shared"]))


@st.composite
def pod_devices(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A pod's devices: often alike but for a few fields (columns stored once), any value in any field."""
    n = draw(st.sampled_from([0, 1, 2, 8, 8, 8, 3]))
    base = draw(fields_any)
    out = []
    for i in range(n):
        kw = dict(base) if draw(st.booleans()) else draw(fields_any)
        for name in draw(st.lists(st.sampled_from(NAMES), max_size=4)):
            kw[name] = draw(fields_any)[name]
        kw["uuid"] = draw(uuid_any)
        kw["index"] = draw(st.sampled_from([i, i, kw["index"]]))
        out.append(kw)
    return out


def record(kws: list[dict[str, Any]], **kw: Any) -> PodGpuEvidence:
    return PodGpuEvidence("ns", "pod", "node", "agent", AT, tuple(GpuDevice(**k) for k in kws), ("main",), **kw)


@settings(max_examples=500, deadline=None)
@given(pod_devices())
def test_a_pod_record_reads_back_every_device_exactly(kws: list[dict[str, Any]]) -> None:
    e = record(kws)
    devs = e.devices
    assert e.device_count == len(devs) == len(kws)
    for d, kw in zip(devs, kws, strict=True):
        assert isinstance(d, GpuDevice) and d == GpuDevice(**kw)
        for n in NAMES:
            assert same(getattr(d, n), kw[n]), (n, getattr(d, n), kw[n])
    assert uuids(e) == tuple(kw["uuid"] for kw in kws)
    assert all(uuid_at(e, i) == kw["uuid"] and clock_reasons_at(e, i) == kw["clock_reasons"]
               for i, kw in enumerate(kws))
    # the column readers answer as the devices would
    assert same(tuple(readings_of(e)), tuple(readings(d) for d in devs))
    assert same(tuple(energy_windows(e)), tuple((bool(d.shared or d.mig_profile), energy_window(d)) for d in devs))
    assert faulty(e) == [d for d in devs if not fault_free(d)]
    assert same(tuple(sampled(e)), tuple((d.uuid, d.index, d.utilization, d.power_w, d.xids, d.xid_ages)
                                         for d in devs))
    picked = [(i, r) for _, i, r in compared(e)]
    assert same(tuple(picked), tuple((i, readings(d)) for i, d in enumerate(devs)
                                     if not d.lost and not d.shared and not d.mig_profile))
    keys = [k for k, _, _ in compared(e)]
    by_uuid = [d.uuid for d in devs if not d.lost and not d.shared and not d.mig_profile]
    assert all((keys[i] == keys[j]) == (by_uuid[i] == by_uuid[j]) for i in range(len(keys)) for j in range(len(keys)))


@settings(max_examples=300, deadline=None)
@given(pod_devices())
def test_a_pod_record_keeps_the_dataclass_behaviour(kws: list[dict[str, Any]]) -> None:
    e = record(kws)
    old = OldPodGpuEvidence("ns", "pod", "node", "agent", AT, tuple(GpuDevice(**k) for k in kws), ("main",))
    assert repr(e) == repr(old).replace("OldPodGpuEvidence(", "PodGpuEvidence(")
    assert [f.name for f in dataclasses.fields(e)] == [f.name for f in dataclasses.fields(old)]
    assert dataclasses.is_dataclass(e) and PodGpuEvidence.__match_args__ == OldPodGpuEvidence.__match_args__
    assert repr(dataclasses.asdict(e)) == repr(dataclasses.asdict(old))
    again = record(kws)
    assert e == again and hash(e) == hash(again) and (e != again) is False
    for back in (pickle.loads(pickle.dumps(e)), copy.deepcopy(e), copy.copy(e), dataclasses.replace(e)):
        assert back == e and hash(back) == hash(e) and repr(back) == repr(e)
    assert dataclasses.replace(e, pod="other").pod == "other" and dataclasses.replace(e, pod="other") != e
    assert dataclasses.replace(e, devices=e.devices[:-1]).devices == e.devices[:-1]
    assert e != old and e != ("ns", "pod")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.pod = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        e.devices = ()  # type: ignore[misc]


@settings(max_examples=400, deadline=None)
@given(pod_devices(), st.data())
def test_equality_hash_and_same_devices_answer_as_before(kws: list[dict[str, Any]], data: st.DataObject) -> None:
    """Another record: the same devices, or one field of one device changed (often to an equal value of
    another form); equality is the devices' (NaN readings equal), `same_devices` the old comparison."""
    other = [dict(k) for k in kws]
    if other:
        i = data.draw(st.integers(0, len(other) - 1))
        name = data.draw(st.sampled_from(NAMES))
        v = other[i][name]
        other[i][name] = data.draw(st.one_of(st.just(v), st.just(-v) if isinstance(v, float) else st.just(v),
                                             fields_any.map(lambda k: k[name]),
                                             uuid_any if name == "uuid" else st.just(v)))
    a, b = record(kws), record(other)
    assert (a == b) == (a.devices == b.devices) == (tuple(GpuDevice(**k) for k in kws) ==
                                                    tuple(GpuDevice(**k) for k in other))
    if a == b:
        assert hash(a) == hash(b)
    assert same_devices(a, b) == old_same_devices(a, b) == same_devices(b, a)
    assert same_devices(a, a)


@settings(max_examples=300, deadline=None)
@given(uuid_any)
def test_a_uuid_reads_back_as_given_and_a_canonical_one_is_16_bytes(u: str) -> None:
    e = record([{"uuid": u}])
    assert e.devices[0].uuid == u and type(e.devices[0].uuid) is str
    canonical_form = len(u) == 40 and u[:4] in ("GPU-", "MIG-") and u[4:] == str(uuid.UUID(u[4:])) \
        if u[:4] in ("GPU-", "MIG-") and _parses(u[4:]) else False
    assert (e._x is None) == canonical_form, u  # held as its 16 bytes exactly where canonical


def _parses(h: str) -> bool:
    try:
        uuid.UUID(h)
    except ValueError:
        return False
    return True


def test_a_full_h100_pod_is_compact() -> None:
    """What the controller holds a pod of 8 H100s by: ~0.8 KB with its record (the devices: ~2.2 KB)."""
    devs = tuple(GpuDevice(f"GPU-{uuid.UUID(int=i * 7919)}", i, utilization=0.9 + i / 100, sm_active=0.7 + i / 100,
                           power_w=600.0 + i, power_limit_w=700.0, sm_clock_hz=1.98e9 - 1.5e7 * (i % 3),
                           memory_util=0.4 + i / 100, pcie_bps=1e9 + i, nvlink_bps=1e10 + i, energy_j=3e5 + i,
                           energy_from_s=600.0, energy_to_s=0.0, ecc_uncorrected=0,
                           clock_reasons=("sw_power_cap",) if i % 3 == 0 else ())
                 for i in range(8))
    e = PodGpuEvidence("team-a", "job-1-worker-0", "node-1", "agent", AT, devs, ("main",))
    assert sys.getsizeof(e) + sys.getsizeof(e._p) <= 820  # (getsizeof counts the GC header)
    assert e._x is PodGpuEvidence("b", "p", "n", "agent", AT, devs, ("main",))._x  # shared by pods alike
    assert e.containers is PodGpuEvidence("b", "p", "n", "agent", AT, (), ("main",)).containers
    assert e.devices == devs
