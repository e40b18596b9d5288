"""Versions 2 and 3 of the evidence document (the GPUs column by column; 3, what the reader asks for,
with what the controller reads only): the poller's records from them are version 1's, byte for byte,
whatever the document holds; the agent's version 2 is its version 1 column by column, its version 3
about half the bytes; a GPU an agent reports every pass never takes the general path."""

from __future__ import annotations

import math
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector import gpupack
from collector.agent.evidence import CONTROLLER_COLUMNS, Snapshot, as_columns, evidence_document, for_controller
from collector.agent.nvml import GpuReading, NvmlStatus
from collector.agent.podresources import Allocation
from collector.agent.xids import XidEvent
from collector.gpu import Columns, GpuDevice, NodeColumns, PodGpuEvidence
from collector.sources import agent_gpus, agents
from collector.sources.agents import AgentEndpoint, decode_evidence, parse_evidence
from tests.agent.test_gpu_device import FLAGS
from tests.agent.test_gpu_device import READINGS as READINGS_OF_A_DEVICE

EP = AgentEndpoint("node-a", "agent-a", "http://10.0.0.1:9402")
AT = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)

canonical = st.uuids().map(lambda u: f"GPU-{u}")
uuids = st.one_of(canonical, st.uuids().map(lambda u: f"MIG-{u}"), st.uuids().map(lambda u: f"GPU-{str(u).upper()}"),
                  st.text(min_size=0, max_size=6), st.just("x" * 200), st.integers(), st.none())
readings = st.one_of(st.floats(), st.integers(min_value=-2**70, max_value=2**70), st.booleans(), st.none(),
                     st.text(max_size=3), st.just(-0.0))
indexes = st.one_of(st.integers(min_value=-40000, max_value=40000), st.integers(), st.none(), st.booleans(),
                    st.floats(allow_nan=False, max_value=10, min_value=-10), st.text(max_size=2))
pod_refs = st.fixed_dictionaries({"pod": st.sampled_from(["p1", "p2", "p3", "", None, 5])},
                                 optional={"namespace": st.sampled_from(["ns", "", None, 3]),
                                           "container": st.sampled_from(["main", "side", "", None])})
READINGS = ("index", "utilization", "sm_active", "power_w", "power_limit_w")
RARE = st.fixed_dictionaries({}, optional={
    "lost": st.sampled_from([True, False, None, 1]), "shared": st.booleans(), "hang_hint": st.booleans(),
    "energy": st.lists(st.one_of(st.floats(min_value=0, max_value=50), st.integers(0, 50), st.booleans(), st.floats()),
                       min_size=3, max_size=3) | st.sampled_from([None, [1.0, 2.0], "x"]),
    "pcie_bps": readings, "nvlink_bps": readings, "sm_clock_hz": readings,
    "remap_pending": st.sampled_from([True, False, None, 1]), "remap_failed": st.booleans(),
    "clocks_event_reasons": st.lists(st.sampled_from(["SwThermalSlowdown", "HwSlowdown"]), max_size=2),
    "memory_util": readings, "ecc_uncorrected": st.fixed_dictionaries({"volatile": st.integers(0, 5)}),
    "xid_first_seen": st.dictionaries(st.sampled_from(["79", "48"]), st.floats(0, 100), max_size=1)})


@st.composite
def gpu_entries(draw: Any) -> dict[str, Any]:
    g: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        g["uuid"] = draw(uuids)
    for k in READINGS:
        if draw(st.integers(0, 5)):
            g[k] = draw(indexes if k == "index" else readings)
    if draw(st.integers(0, 9)):
        g["pods"] = draw(st.one_of(st.lists(pod_refs, min_size=1, max_size=2), st.none(), st.just("p1")))
    if not draw(st.integers(0, 4)):
        g.update(draw(RARE))
    return g


@st.composite
def documents(draw: Any) -> dict[str, Any]:
    gpus = draw(st.lists(gpu_entries(), max_size=10))
    doc: dict[str, Any] = {"version": 1, "node": "node-a", "nvml": {"state": "ok"},
                           "podresources": {"up": True}, "at": 1000.0, "gpus": gpus}
    named = [g["uuid"] for g in gpus if isinstance(g.get("uuid"), str)]
    if named and draw(st.booleans()):  # an XID the document lists beside a device
        doc["xids"] = [{"uuid": draw(st.sampled_from(named)), "code": 79}]
    if draw(st.booleans()):  # a device the kubelet allocated that NVML does not list, or one it does
        doc["allocations"] = [{"namespace": "ns", "pod": draw(st.sampled_from(["p1", "p4"])), "container": "main",
                               "device": draw(st.one_of(canonical, st.sampled_from(named or ["GPU-x"])))}]
    return doc


def same(a: agents.AgentReport, b: agents.AgentReport) -> None:
    assert a == b and a.problems == b.problems
    assert [(e.namespace, e.pod, e.containers, e._p, e._x) for e in a.gpus] == \
        [(e.namespace, e.pod, e.containers, e._p, e._x) for e in b.gpus]


@settings(max_examples=500, deadline=None)
@given(documents())
def test_columns_make_version_1s_records(doc: dict[str, Any]) -> None:
    same(parse_evidence(as_columns(doc), EP, AT), parse_evidence(doc, EP, AT))


@settings(max_examples=200, deadline=None)
@given(documents())
def test_off_the_wire_too(doc: dict[str, Any]) -> None:
    """Through JSON, as the poller reads it (orjson: big ints as floats, no NaN)."""
    try:
        v1, v2 = orjson.dumps(doc), orjson.dumps(as_columns(doc))
    except TypeError:  # (an integer orjson will not write: no agent sends one)
        return
    same(decode_evidence(v2, EP, AT), decode_evidence(v1, EP, AT))


@settings(max_examples=500, deadline=None)
@given(documents())
def test_the_controllers_version_makes_the_same_records(doc: dict[str, Any]) -> None:
    """Version 3 leaves out what the reader never reads (columns, each pod's resource, allocations a GPU's
    entry already says): the same records and problems, directly and through JSON."""
    v3 = for_controller(doc)
    assert set(v3["gpus"]) <= set(CONTROLLER_COLUMNS) and v3["version"] == 3
    same(parse_evidence(v3, EP, AT), parse_evidence(doc, EP, AT))
    try:
        v1, b3 = orjson.dumps(doc), orjson.dumps(v3)
    except TypeError:  # (an integer orjson will not write: no agent sends one)
        return
    same(decode_evidence(b3, EP, AT), decode_evidence(v1, EP, AT))


# An energy window's numbers and an ECC count as an agent sends them, and past every bound the
# reader holds them to (windows inverted, too long, ahead of the document, too many joules; counts past
# 2**53, negative, not counts)
edge_floats = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 3600.0, 3600.0000001, 1e308, -1e308, 1000.0, 999.0]))
windows = st.lists(st.one_of(st.floats(min_value=0, max_value=4000), edge_floats), min_size=3, max_size=3)


@st.composite
def windows_near(draw: Any, at: float) -> list[float]:
    """A window of `at`'s document at its bounds: from and to seconds before it, the joules the most
    a window that long may hold, and just past each."""
    fr = draw(st.one_of(st.sampled_from([300.0, 30.0, 3600.0, 3600.0000001, 0.0, 1e-9]), st.floats(-10, 4000)))
    to = draw(st.one_of(st.sampled_from([0.0, -0.0, 2.0, -1e-9, fr, fr + 1.0, fr - 1e-9]), st.floats(-10, 4000)))
    x, y = at - fr, at - to
    cap = agent_gpus.ENERGY_MAX_W * (y - x)
    j = draw(st.one_of(st.sampled_from([0.0, -0.0, cap, math.nextafter(cap, math.inf), -1.0, cap / 2]), edge_floats))
    return [x, y, j]
counts = st.one_of(st.integers(0, 5), st.integers(), st.just(2**53), st.just(2**53 - 1), st.booleans(), st.none(),
                   st.floats(0, 5), st.text(max_size=2))


@settings(max_examples=500, deadline=None)
@given(documents(), st.data())
def test_every_gpu_with_a_window_and_a_count_reads_as_version_1(doc: dict[str, Any], data: Any) -> None:
    """Every GPU with an energy window of three floats and an ECC count object, as an agent sends them,
    at and past every bound, the document at any time: version 1's records and problems."""
    doc["at"] = data.draw(st.one_of(st.just(1000.0), edge_floats, st.none()))
    at = doc["at"]
    near = isinstance(at, float) and math.isfinite(at) and data.draw(st.booleans())
    alike = data.draw(st.booleans())  # (a node's GPUs share their window)
    shared = data.draw(windows_near(at) if near else windows)
    for g in doc["gpus"]:
        if data.draw(st.integers(0, 4)):  # (most GPUs held by a pod: records to compare)
            g["uuid"] = data.draw(canonical)
            g["pods"] = [{"namespace": "ns", "pod": data.draw(st.sampled_from(["p1", "p2"])), "container": "main"}]
        g["energy"] = list(shared) if alike else data.draw(windows_near(at) if near else windows)
        if data.draw(st.integers(0, 9)):
            g["ecc_uncorrected"] = {"volatile": data.draw(counts), "aggregate": 0}
        elif data.draw(st.booleans()):
            g["ecc_uncorrected"] = data.draw(st.one_of(st.none(), st.integers(), st.lists(st.integers(), max_size=1)))
    same(parse_evidence(as_columns(doc), EP, AT), parse_evidence(doc, EP, AT))
    v3 = for_controller(doc)
    same(parse_evidence(v3, EP, AT), parse_evidence(doc, EP, AT))


@settings(max_examples=200, deadline=None)
@given(documents(), st.data())
def test_a_column_cut_or_of_another_type_is_named_and_left_out(doc: dict[str, Any], data: Any) -> None:
    """A column that is not a list of one value a GPU counts as absent on every GPU (named): the
    records are version 1's without that key."""
    v2 = as_columns(doc)
    key = data.draw(st.sampled_from(sorted(v2["gpus"])))
    if key == "uuid":
        return
    col = v2["gpus"][key]
    v2["gpus"][key] = data.draw(st.sampled_from([col[:-1], col + [None], None, {"x": 1}, "x"]))
    if isinstance(v2["gpus"][key], list) and len(v2["gpus"][key]) == len(col):
        return
    v1 = {**doc, "gpus": [{k: v for k, v in g.items() if k != key} if isinstance(g, dict) else g
                          for g in doc["gpus"]]}
    report = parse_evidence(v2, EP, AT)
    assert report.gpus == parse_evidence(v1, EP, AT).gpus
    assert any("GPU columns" in p and key[:64] in p for p in report.problems)


def test_version_2_whose_gpus_are_not_columns_is_named() -> None:
    doc = {"version": 2, "node": "node-a", "gpus": [{"uuid": "GPU-1", "pods": [{"namespace": "ns", "pod": "p"}]}]}
    report = parse_evidence(doc, EP, AT)
    assert report.gpus == () and any("not an object of columns" in p for p in report.problems)
    assert parse_evidence({**doc, "gpus": {"uuid": []}}, EP, AT).problems == ()


H100 = dict(name="NVIDIA H100 80GB HBM3", utilization=0.97, sm_active=0.81, power_w=612.0, power_limit_w=700.0,
            memory_used_bytes=71 << 30, memory_total_bytes=80 << 30, temperature_c=61.0, sm_clock_hz=1.98e9,
            memory_clock_hz=2.6e9, memory_util=0.55, pcie_tx_bps=3e9, pcie_rx_bps=2e9, nvlink_tx_bps=6e10,
            nvlink_rx_bps=6e10, remap_pending=False, remap_failed=False,
            ecc=(("uncorrected", "volatile", 0), ("uncorrected", "aggregate", 2), ("corrected", "volatile", 5)))


def snapshot(n: int = 8, *, pods: int = 1, reasons: bool = True, xid: bool = False, at: float = 1e9) -> Snapshot:
    """A node as an agent holds it: `n` GPUs with every reading an H100 reports (a power-cap reason on
    some), held by `pods` pods, with an energy window."""
    gpus = tuple(GpuReading(index=i, uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, str(i))}",
                            pci=f"0000:{0x18 + i:02x}:00.0", at=at, energy_mj=5_000_000 + i,
                            energy_from=(at - 30.0, 1_000_000), clocks_event_reasons=4 if reasons and i % 3 == 0 else 0,
                            **H100)  # type: ignore[arg-type]
                 for i in range(n))
    allocs = tuple(Allocation("team", f"run-{i * pods // n}", "main", "nvidia.com/gpu", g.uuid)
                   for i, g in enumerate(gpus))
    xids = (XidEvent(code=79, uuid=gpus[1].uuid, pci=gpus[1].pci, origin="nvml", at=at, meaning="", action="",
                     message=""),) if xid else ()
    return Snapshot(node="node-a", at=at, nvml=NvmlStatus("ok", "", "550.54.15", n), gpus=gpus, hang_since={},
                    hang_sustain_s=300.0, allocations=allocs, podresources_up=True, podresources_last_success=at,
                    podresources_error="", xids=xids, logs=(),
                    xid_first_seen={gpus[1].uuid: {79: at - 5}} if xid else {})


def test_the_agents_version_2_is_its_version_1_column_by_column() -> None:
    for snap in (snapshot(), snapshot(3, pods=2, xid=True), snapshot(0)):
        v1, v2 = evidence_document(snap), evidence_document(snap, version=2)
        assert v2 == as_columns(v1)
        assert v2["version"] == 2 and set(v2["gpus"]) == set(v1["gpus"][0] if v1["gpus"] else ("uuid",))
        same(decode_evidence(orjson.dumps(v2), EP, AT), decode_evidence(orjson.dumps(v1), EP, AT))


def test_the_agents_version_3_is_what_the_controller_reads_of_version_2() -> None:
    """The agent's version 3: the columns the controller reads, no allocation its GPUs' entries say
    (every one, on a node whose GPUs all render), under three fifths of version 2's bytes; read back,
    version 1's records."""
    for snap in (snapshot(), snapshot(3, pods=2, xid=True), snapshot(0)):
        v1, v3 = evidence_document(snap), evidence_document(snap, version=3)
        assert v3 == for_controller(v1) == for_controller(evidence_document(snap, version=2))
        assert v3["allocations"] == [] and set(v3["gpus"]) == (set(CONTROLLER_COLUMNS) if snap.gpus else {"uuid"})
        assert all("resource" not in p for ps in v3["gpus"].get("pods", []) for p in ps)
        same(decode_evidence(orjson.dumps(v3), EP, AT), decode_evidence(orjson.dumps(v1), EP, AT))
        if snap.gpus:
            assert len(orjson.dumps(v3)) < 0.6 * len(orjson.dumps(evidence_document(snap, version=2)))


def counted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    device = agent_gpus._device

    def counting(*a: Any) -> GpuDevice:
        calls.append(a)
        return device(*a)
    monkeypatch.setattr(agent_gpus, "_device", counting)
    return calls


def test_an_agents_pass_packs_every_gpu_from_the_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an agent sends every pass (every reading an H100 reports, throttle reasons, ECC counts, an
    energy window) never takes the general path, and reads back as the agent read it."""
    snap = snapshot(8, pods=2)
    body = orjson.dumps(evidence_document(snap, version=agents.EVIDENCE_VERSION))
    calls = counted(monkeypatch)
    report = decode_evidence(body, EP, AT)
    assert calls == []
    assert [e.pod for e in report.gpus] == ["run-0", "run-1"]
    devs = {d.uuid: d for e in report.gpus for d in e.devices}
    for r in snap.gpus:
        d = devs[r.uuid]
        assert (d.index, d.utilization, d.sm_active, d.power_w, d.power_limit_w, d.sm_clock_hz, d.memory_util) == \
            (r.index, 0.97, 0.81, 612.0, 700.0, 1.98e9, 0.55)
        assert (d.pcie_bps, d.nvlink_bps, d.ecc_uncorrected, d.xids) == (5e9, 1.2e11, 0, ())
        assert (d.energy_j, d.energy_from_s, d.energy_to_s) == ((5_000_000 + r.index - 1_000_000) / 1000, 30.0, 0.0)
        assert d.clock_reasons == (("sw_power_cap",) if r.index % 3 == 0 else ())
    # an XID on one GPU: that pod's GPUs take the general path, the other pod's do not
    calls.clear()
    report = decode_evidence(orjson.dumps(evidence_document(snapshot(4, pods=2, xid=True),
                                                            version=agents.EVIDENCE_VERSION)), EP, AT)
    assert {a[1] for a in calls} == {snap.gpus[0].uuid, snap.gpus[1].uuid}
    assert [d.xids for d in report.gpus[0].devices] == [(), (79,)]


def test_not_json_is_named() -> None:
    with pytest.raises(agents.AgentReadError, match=r"http://10.0.0.1:9402/evidence: not JSON"):
        decode_evidence(b"{", EP, AT)


look_alike = st.uuids().map(lambda u: f"GPU-{u}"[:-1] + "g")  # (40 characters, one not hex)
flags = st.one_of(st.none(), st.booleans(), st.just(1))


@st.composite
def columns(draw: Any) -> tuple[list[Any], Columns]:
    """A pod's devices as rows (the `GpuDevice` arguments) and as the columns of them."""
    n = draw(st.integers(1, 9))
    col = [draw(st.one_of(st.none(), st.lists(
        st.one_of(st.floats(), st.none(), st.sampled_from([700.0, 0.0, -0.0, math.inf]), st.integers(0, 3)),
        min_size=n, max_size=n))) for _ in range(11)]
    uu = draw(st.lists(st.one_of(canonical, canonical, st.uuids().map(lambda u: f"MIG-{u}"), st.text(max_size=4),
                                 st.uuids().map(lambda u: f"GPU-{str(u).upper()}"), look_alike),
                       min_size=n, max_size=n))
    ix = draw(st.one_of(st.none(), st.lists(
        st.one_of(st.integers(-40000, 40000), st.none(), st.sampled_from([0, 1, 2])), min_size=n, max_size=n)))
    ecc = draw(st.one_of(st.none(), st.lists(st.one_of(st.integers(-2, 70000), st.none(), st.just(0)),
                                             min_size=n, max_size=n)))
    fl = [draw(st.one_of(st.none(), st.lists(flags, min_size=n, max_size=n))) for _ in range(5)]
    reasons = draw(st.one_of(st.none(), st.lists(st.sampled_from([(), ("sw_power_cap",), ("a", "b")]),
                                                 min_size=n, max_size=n)))

    def at(c: list[Any] | None, i: int, default: Any = None) -> Any:
        return default if c is None else c[i]
    rows = [dict(uuid=uu[i], index=at(ix, i), ecc_uncorrected=at(ecc, i),
                 **{k: at(col[j], i) for j, k in enumerate(READINGS_OF_A_DEVICE)},
                 **{k: at(fl[j], i, False) for j, k in enumerate(FLAGS)},
                 clock_reasons=at(reasons, i, ())) for i in range(n)]
    return rows, Columns(uu, ix, ecc, col, fl, reasons)




@settings(max_examples=600, deadline=None)
@given(columns(), st.data())
def test_from_columns_packs_as_the_devices_do(c: tuple[list[Any], Columns], data: Any) -> None:
    """A pod's devices (any of the document's, in order), where they pack, are the constructor's record
    over the devices, byte for byte; where one does not (a value a device keeps aside), `from_columns`
    says so (None)."""
    rows, cols = c
    n = len(rows)
    idx = data.draw(st.one_of(st.just(list(range(n))), st.lists(st.integers(0, n - 1), min_size=1, max_size=n)
                              .map(lambda x: sorted(set(x)))))
    b = PodGpuEvidence("ns", "p", "n", "agent", AT, tuple(GpuDevice(**rows[i]) for i in idx), ("main",))
    a = PodGpuEvidence.from_columns("ns", "p", "n", "agent", AT, NodeColumns(cols), idx, ("main",))
    if a is None:
        assert any(d._m & (1 << 18) for d in b.devices)  # (`_ODD`: some value kept aside)
        return
    assert (a._p, a._x, a.containers) == (b._p, b._x, b.containers)
    assert a == b and a.devices == b.devices
    if b._x is not None and gpupack._SHARED_ASIDE.get(b._x) is b._x:  # (pods alike share one: memory at fleet size)
        assert a._x is b._x
