"""Version 4 of the evidence document: each pod's devices packed by the agent as the controller holds
them (`agent.evidence.packed`), checked by the controller as it would check the columns
(`gpupack.sent_problem`, `PodGpuEvidence.from_sent`). The records are version 3's, byte for byte,
whatever the document holds; and any record the controller takes, however it was made, is exactly
what version 1 makes of the devices it says (a seeded search of records mutated byte by byte)."""

from __future__ import annotations

import base64
import math
import random
import struct
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from collector import gpupack
from collector.agent.evidence import evidence_document, for_controller, packed
from collector.gpu import GpuDevice, NodeColumns, PodGpuEvidence, sendable
from collector.sources import agent_gpus, agents
from collector.sources.agents import decode_evidence, parse_evidence
from tests.agent.test_evidence_columns import (
    AT,
    EP,
    canonical,
    columns,
    counts,
    documents,
    edge_floats,
    same,
    snapshot,
    windows,
    windows_near,
)


def v4(doc: dict[str, Any]) -> dict[str, Any]:
    out = packed(for_controller(doc))
    assert out["version"] == 4
    return out


def test_the_controller_asks_for_version_4() -> None:
    assert agents.EVIDENCE_VERSION == 4 and 4 in agents.READ_VERSIONS


@settings(max_examples=500, deadline=None)
@given(documents())
def test_version_4_makes_version_3s_records(doc: dict[str, Any]) -> None:
    """Any document: version 4 of it reads as version 3 (records and problems), directly and through JSON."""
    v3, b4 = for_controller(doc), v4(doc)
    same(parse_evidence(b4, EP, AT), parse_evidence(v3, EP, AT))
    try:
        j3, j4 = orjson.dumps(v3), orjson.dumps(b4)
    except TypeError:  # (an integer orjson will not write: no agent sends one)
        return
    same(decode_evidence(j4, EP, AT), decode_evidence(j3, EP, AT))


@settings(max_examples=400, deadline=None)
@given(documents(), st.data())
def test_windows_and_counts_at_their_bounds_too(doc: dict[str, Any], data: Any) -> None:
    """Most GPUs held, each with an energy window and an ECC count at and past every bound the
    controller holds them to, the document at any time: version 4 reads as version 3."""
    doc["at"] = data.draw(st.one_of(st.just(1000.0), edge_floats, st.none()))
    at = doc["at"]
    near = isinstance(at, float) and math.isfinite(at) and data.draw(st.booleans())
    shared = data.draw(windows_near(at) if near else windows)
    alike = data.draw(st.booleans())
    for g in doc["gpus"]:
        if data.draw(st.integers(0, 4)):
            g["uuid"] = data.draw(canonical)
            g["pods"] = [{"namespace": "ns", "pod": data.draw(st.sampled_from(["p1", "p2"])), "container": "main"}]
        g["energy"] = list(shared) if alike else data.draw(windows_near(at) if near else windows)
        if data.draw(st.integers(0, 9)):
            g["ecc_uncorrected"] = {"volatile": data.draw(counts), "aggregate": 0}
    same(parse_evidence(v4(doc), EP, AT), parse_evidence(for_controller(doc), EP, AT))


def test_an_agents_pass_is_sent_packed() -> None:
    """What an agent sends every pass: every pod packed, no GPU left in the columns, under half of version
    3's bytes, read back as version 3; a pod with an XID on a GPU keeps its GPUs in the columns."""
    snap = snapshot(8, pods=2)
    d3, d4 = evidence_document(snap, version=3), evidence_document(snap, version=4)
    assert d4["gpus"] == {} and [r["pod"] for r in d4["records"]] == ["run-0", "run-1"]
    assert any(r.get("reasons") for r in d4["records"])  # (a power-cap reason on some GPUs)
    b3, b4 = orjson.dumps(d3), orjson.dumps(d4)
    assert len(b4) < 0.5 * len(b3)
    same(decode_evidence(b4, EP, AT), decode_evidence(b3, EP, AT))
    snap = snapshot(4, pods=2, xid=True)
    d4 = evidence_document(snap, version=4)
    assert [r["pod"] for r in d4["records"]] == ["run-1"]
    assert d4["gpus"]["uuid"] == [snap.gpus[0].uuid, snap.gpus[1].uuid]
    r4 = decode_evidence(orjson.dumps(d4), EP, AT)
    same(r4, decode_evidence(orjson.dumps(evidence_document(snap, version=3)), EP, AT))
    assert [d.xids for d in r4.gpus[0].devices] == [(), (79,)]


def healthy() -> tuple[dict[str, Any], bytes]:
    d4 = evidence_document(snapshot(8), version=4)
    (rec,) = d4["records"]
    return d4, base64.b64decode(rec["record"])


def entry(doc: dict[str, Any], p: bytes, **more: Any) -> dict[str, Any]:
    return {**doc["records"][0], "record": base64.b64encode(p).decode(), **more}


def test_records_that_do_not_hold_are_named_and_cost_only_their_pod() -> None:
    d4, p = healthy()
    good = entry(d4, p)
    bad = [
        ({**good, "record": "not base64!"}, "packed record left out"),
        ({**good, "record": 5}, "without a pod or a record"),
        ({**good, "record": "A" * (agent_gpus.MAX_RECORD_CHARS + 4)}, "without a pod or a record"),
        ({**good, "pod": None}, "without a pod or a record"),
        (entry(d4, p[:-8]), "bytes, its layout"),
        (entry(d4, p, reasons=[["x"]]), "its reasons not one a device"),
        (entry(d4, p, reasons="x"), "its reasons not one a device"),
    ]
    for e, why in bad:
        other = {**good, "pod": "other"}
        report = parse_evidence({**d4, "records": [e, other]}, EP, AT)
        assert [x.pod for x in report.gpus] == ["other"], why
        assert any(why in x for x in report.problems), (why, report.problems)
    twice = parse_evidence({**d4, "records": [good, good, good]}, EP, AT)
    assert twice.gpus == () and any("sent packed twice" in x for x in twice.problems)
    uuid = snapshot(8).gpus[3].uuid
    with_xid = parse_evidence({**d4, "xids": [{"uuid": uuid, "code": 79}]}, EP, AT)
    assert with_xid.gpus == () and any("has XIDs" in x for x in with_xid.problems)
    # a pod both packed and named by a GPU's column: the columns' word, the record named and left out
    cols = {"uuid": ["GPU-00000000-0000-0000-0000-000000000001"],
            "pods": [[{"namespace": good["namespace"], "pod": good["pod"]}]]}
    both = parse_evidence({**d4, "gpus": cols}, EP, AT)
    assert [x.device_count for x in both.gpus] == [1] and any("both sent packed" in x for x in both.problems)
    # an agent of this release, its version 4 read by a controller: nothing named
    assert parse_evidence(d4, EP, AT).problems == ()


def _set(p: bytes, off: int, fmt: str, *v: Any) -> bytes:
    b = bytearray(p)
    struct.pack_into(fmt, b, off, *v)
    return bytes(b)


def test_each_check_refuses_what_no_column_makes() -> None:
    """One record of a healthy node, changed in one way each: every change is refused, each for its reason."""
    devs = tuple(GpuDevice(f"GPU-00000000-0000-0000-0000-00000000000{i}", index=i, utilization=0.9 + i / 100,
                           sm_active=0.8, power_w=600.0 + i, power_limit_w=700.0, sm_clock_hz=1.98e9,
                           memory_util=0.5 + i / 100, pcie_bps=3e9 + i, nvlink_bps=6e10 + i, energy_j=18_000.0 + i,
                           energy_from_s=30.0, energy_to_s=0.0, ecc_uncorrected=0) for i in range(8))
    p = PodGpuEvidence("ns", "p", "node-a", "agent", AT, devs)._p
    n, flags, any_ = gpupack._HEAD.unpack_from(p)
    _, _, lay = gpupack._layout(p)

    def at(c: int) -> int:
        col = lay[c]
        assert col is not None
        return col[0]
    util, ratio, rate, energy = at(gpupack._UTIL), at(gpupack._UTIL + 5), at(gpupack._UTIL + 6), at(gpupack._ENERGY)
    assert lay[gpupack._UTIL] is not None and lay[gpupack._MASK] is not None
    assert not lay[gpupack._UTIL][2] and lay[gpupack._MASK][2]  # (readings per device; one bits column)
    mask = struct.unpack_from("<I", p, at(gpupack._MASK))[0]
    cases = {
        "too short": p[:5],
        "more devices than it holds": _set(p, 0, "<I", n + 1),
        "no devices": _set(p, 0, "<I", 0),
        "an unknown column flag": _set(p, 4, "<H", flags | 1 << 15),
        "a trailing byte": p + b"\0",
        "a NaN": _set(p, util, "<d", math.nan),
        "an infinity": _set(p, util + 8, "<d", -math.inf),
        "a ratio past 1": _set(p, ratio, "<d", 1.5),
        "a rate past 10 TB/s": _set(p, rate, "<d", 1e13),
        "a negative rate": _set(p, rate, "<d", -1.0),
        "an energy window ahead of the document": _set(p, energy + 8 * n + 8, "<d", -1.0),
        "an energy window too long": _set(p, energy + 8 * n, "<d", 3601.0),
        "too many joules": _set(p, energy, "<d", 1e9),
        "an energy window in part": _set(_set(_set(p, at(gpupack._MASK), "<I", mask | 1 << 9), 6, "<I", any_ | 1 << 9),
                                         energy + 8 * n, "<d", 0.0),  # (its start said absent, and +0.0)
        "a reading absent but not zero": _set(_set(p, at(gpupack._MASK), "<I", mask | 1), 6, "<I", any_ | 1),
        "a bit no column sets (a value kept aside)": _set(_set(p, at(gpupack._MASK), "<I", mask | 1 << 18), 6, "<I",
                                                          any_ | 1 << 18),
        "a UUID kept aside": _set(_set(p, at(gpupack._MASK), "<I", mask | 2 << 20), 6, "<I", any_ | 2 << 20),
        "the header's bits not the devices'": _set(p, 6, "<I", any_ | 1 << 13),
        "an ECC count seen where none is": _set(_set(p, at(gpupack._MASK), "<I", mask | 1 << 19), 6, "<I",
                                               any_ | 1 << 19),
        "an index where none is said": _set(_set(p, at(gpupack._MASK), "<I", mask | 1 << 11), 6, "<I",
                                           any_ | 1 << 11),
    }
    # a column alike on every device stored per device: the power limit (stored once) written out
    limit = lay[gpupack._LIMIT]
    assert limit is not None and limit[2]
    v = p[limit[0]:limit[0] + 8]
    cases["a column alike stored per device"] = _set(p[:limit[0]] + v * n + p[limit[0] + 8:], 4, "<H",
                                                     flags & ~(1 << gpupack._LIMIT))
    # indexes 0..n-1 written out (the record says them by a flag)
    ecc_at = at(gpupack._ECC)
    cases["indexes 0..n-1 written out"] = _set(p[:ecc_at] + struct.pack(f"<{n}h", *range(n)) + p[ecc_at:], 4, "<H",
                                               flags & ~gpupack._ARANGE)
    cases["a window of no length"] = _set(_set(p, energy + 8 * n + 8, "<d", 30.0), energy, f"<{n}d",
                                          *[-0.0 if i % 2 else 0.0 for i in range(n)])  # (no joules; not alike)
    cases["no devices at all"] = gpupack._HEAD.pack(0, 0, 0)
    # devices unlike in their bits (one without an index), each with its own window: one with part of it
    odd = tuple(GpuDevice(d.uuid, index=None if i == 0 else i, utilization=d.utilization, power_w=d.power_w,
                          energy_j=d.energy_j, energy_from_s=30.0 + i, energy_to_s=float(i) / 10)
                for i, d in enumerate(devs))
    q = PodGpuEvidence("ns", "p", "node-a", "agent", AT, odd)._p
    assert gpupack.sent_problem(q) is None
    qn, qflags, qany = gpupack._HEAD.unpack_from(q)
    _, _, qlay = gpupack._layout(q)
    masks_at, from_at = qlay[gpupack._MASK][0], qlay[gpupack._ENERGY + 1][0]  # type: ignore[index]
    m0 = struct.unpack_from("<I", q, masks_at)[0]
    cases["one device's window in part"] = _set(_set(_set(q, masks_at, "<I", m0 | 1 << 9), from_at, "<d", 0.0), 6, "<I",
                                                qany | 1 << 9)
    assert gpupack.sent_problem(p) is None
    for what, q in cases.items():
        assert gpupack.sent_problem(q) is not None, what
        assert PodGpuEvidence.from_sent("ns", "p", "n", "agent", AT, q) is None, what


def as_version_1(ev: PodGpuEvidence) -> dict[str, Any]:
    """A version 1 document saying `ev`'s devices, at -0.0 on the agent's clock: an energy window's ends
    then read back exactly (x - (-x) is x; -0.0 - 0.0 is -0.0, -0.0 - (-0.0) is 0.0, as an agent's own
    clock may make them)."""
    gpus = []
    for d in ev.devices:
        g: dict[str, Any] = {"uuid": d.uuid, "index": d.index, "utilization": d.utilization,
                             "sm_active": d.sm_active, "power_w": d.power_w, "power_limit_w": d.power_limit_w,
                             "sm_clock_hz": d.sm_clock_hz, "memory_util": d.memory_util, "pcie_bps": d.pcie_bps,
                             "nvlink_bps": d.nvlink_bps, "lost": d.lost, "hang_hint": d.hang_hint,
                             "shared": d.shared, "remap_pending": d.remap_pending, "remap_failed": d.remap_failed,
                             "clocks_event_reasons": list(d.clock_reasons),
                             "pods": [{"namespace": ev.namespace, "pod": ev.pod, "container": c}
                                      for c in ev.containers]}
        if d.energy_j is not None or d.energy_from_s is not None or d.energy_to_s is not None:
            g["energy"] = [-d.energy_from_s if d.energy_from_s is not None else None,
                           -d.energy_to_s if d.energy_to_s is not None else None, d.energy_j]
        if d.ecc_uncorrected is not None:
            g["ecc_uncorrected"] = {"volatile": d.ecc_uncorrected}
        gpus.append(g)
    return {"version": 1, "node": "node-a", "nvml": {"state": "ok"}, "at": -0.0, "gpus": gpus}


def held_as_version_1(ev: PodGpuEvidence) -> None:
    """A record the controller took is what version 1 makes of the devices it says, byte for byte."""
    (back,) = parse_evidence(as_version_1(ev), EP, AT).gpus
    assert (back._p, back._x, back.containers) == (ev._p, ev._x, ev.containers)


def _mutated(rng: random.Random, p: bytes) -> bytes:
    b = bytearray(p)
    n = struct.unpack_from("<I", b)[0]
    for _ in range(rng.randint(1, 3)):
        where = rng.random()
        if where < 0.15:  # the header: devices, column flags, bits
            i = rng.randrange(0, 10)
        elif where < 0.35:  # the bits column
            i = rng.randrange(10 + 16 * n, min(len(b), 10 + 16 * n + 4 * n))
        else:
            i = rng.randrange(0, len(b))
        b[i] = rng.choice((0, 0xFF, 0x7F, 0x80, 0x3F, 0xF0, b[i] ^ 1 << rng.randrange(8), rng.randrange(256)))
    if rng.random() < 0.05:
        b = b[:rng.randrange(len(b))] if rng.random() < 0.5 else b + bytes(rng.randrange(1, 16))
    return bytes(b)


@settings(max_examples=400, deadline=None)
@given(columns(), st.data())
def test_any_record_the_controller_takes_is_version_1s(c: tuple[list[Any], Any], data: Any) -> None:
    """Records of any devices `NodeColumns` packs, then changed byte by byte (the header, the bits, any
    value): whatever `from_sent` takes is exactly version 1's record of the devices it says; what a
    source may send packed of a pod it takes unchanged."""
    rows, cols = c
    ev = PodGpuEvidence.from_columns("ns", "p", "node-a", "agent", AT, NodeColumns(cols), list(range(len(rows))),
                                     ("main",))
    if ev is None:
        return
    sent = sendable(ev)
    if sent is not None:
        back = PodGpuEvidence.from_sent("ns", "p", "node-a", "agent", AT, sent[0], sent[1], ("main",))
        assert back is not None and (back._p, back._x) == (ev._p, ev._x)
        held_as_version_1(back)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(20):
        q = _mutated(rng, ev._p)
        took = PodGpuEvidence.from_sent("ns", "p", "node-a", "agent", AT, q, None, ("main",))
        if took is not None:
            held_as_version_1(took)


def test_a_seeded_search_of_changed_records_finds_none_version_1_would_not_make() -> None:
    """20,000 changes of healthy and odd records: some taken, most refused; every one taken is version 1's."""
    rng = random.Random(30)
    _, healthy_p = healthy()
    seeds = [healthy_p]
    for n in (1, 2, 3, 8):
        devs = tuple(GpuDevice(f"GPU-{rng.getrandbits(128):032x}"[:8 + 4] + "-0000-0000-0000-000000000000",
                               index=i if i % 3 else None, utilization=rng.choice((None, 0.5, -0.0)),
                               power_w=rng.uniform(0, 700), power_limit_w=700.0, memory_util=rng.random(),
                               lost=i == 1, ecc_uncorrected=rng.choice((None, 0, 3)), energy_j=10.0,
                               energy_from_s=30.0, energy_to_s=0.0)
                     for i in range(n))
        p = PodGpuEvidence("ns", "p", "node-a", "agent", AT, devs)._p
        if gpupack.sent_problem(p) is None:
            seeds.append(p)
    assert len(seeds) >= 3
    taken = refused = 0
    for k in range(20_000):
        q = _mutated(rng, seeds[k % len(seeds)])
        took = PodGpuEvidence.from_sent("ns", "p", "node-a", "agent", AT, q, None, ("main",))
        if took is None:
            refused += 1
        else:
            taken += 1
            held_as_version_1(took)
    assert taken > 1000 and refused > 5000, (taken, refused)


def test_sendable_says_only_what_a_record_and_reasons_can() -> None:
    u = "GPU-00000000-0000-0000-0000-000000000001"

    def rec(**kw: Any) -> PodGpuEvidence:
        return PodGpuEvidence("ns", "p", "node-a", "agent", AT, (GpuDevice(u, index=0, utilization=0.5, **kw),
                                                                 GpuDevice(u[:-1] + "2", index=1, utilization=0.6)))
    plain = sendable(rec())
    assert plain is not None and plain[1] is None
    assert sendable(rec(clock_reasons=("sw_power_cap",))) == (rec(clock_reasons=("sw_power_cap",))._p,
                                                              [("sw_power_cap",), ()])
    for kw in ({"xids": (79,)}, {"mig_profile": "1g.10gb"}, {"xid_ages": ((79, 5.0),)}, {"power_w": 5}):
        assert sendable(rec(**kw)) is None, kw
    aside = PodGpuEvidence("ns", "p", "node-a", "agent", AT, (GpuDevice("MIG-GPU-x/1/2", index=0),))
    assert sendable(aside) is None


def test_the_largest_record_a_controller_takes_fits_its_limit() -> None:
    """MAX_SENT_DEVICES devices, every column stored per device: within MAX_RECORD_CHARS, and taken."""
    n = gpupack.MAX_SENT_DEVICES
    devs = tuple(GpuDevice(f"GPU-00000000-0000-0000-0000-{i:012x}", index=n - i, utilization=i / n,
                           sm_active=i / n, power_w=float(i), power_limit_w=float(i), sm_clock_hz=float(i),
                           memory_util=i / n, pcie_bps=float(i), nvlink_bps=float(i), energy_j=float(i),
                           energy_from_s=30.0 + i, energy_to_s=float(i), ecc_uncorrected=i % 3 + 1, lost=i % 2 == 1)
                 for i in range(n))
    p = PodGpuEvidence("ns", "p", "node-a", "agent", AT, devs)._p
    assert gpupack.sent_problem(p) is None
    assert len(base64.b64encode(p)) == agent_gpus.MAX_RECORD_CHARS
    more = PodGpuEvidence("ns", "p", "node-a", "agent", AT, (*devs, devs[0]))._p
    assert gpupack.sent_problem(more) is not None
