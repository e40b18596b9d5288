"""The agent poller's fast path for a GPU's entry that carries only its readings (what every agent sends
every pass): the same records as the general path, byte for byte, whatever the document holds."""

from __future__ import annotations

import math
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.gpu import GpuDevice, PodGpuEvidence
from collector.sources import agents
from collector.sources.agents import EVIDENCE_VERSION, AgentEndpoint, decode_evidence, parse_evidence

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
    "energy": st.lists(st.floats(min_value=0, max_value=50), min_size=3, max_size=3),
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
    doc: dict[str, Any] = {"version": EVIDENCE_VERSION, "node": "node-a", "nvml": {"state": "ok"},
                           "podresources": {"up": True}, "at": 1000.0, "gpus": gpus}
    named = [g["uuid"] for g in gpus if isinstance(g.get("uuid"), str)]
    if named and draw(st.booleans()):  # an XID the document lists beside a device
        doc["xids"] = [{"uuid": draw(st.sampled_from(named)), "code": 79}]
    if draw(st.booleans()):  # a device the kubelet allocated that NVML does not list, or one it does
        doc["allocations"] = [{"namespace": "ns", "pod": draw(st.sampled_from(["p1", "p4"])), "container": "main",
                               "device": draw(st.one_of(canonical, st.sampled_from(named or ["GPU-x"])))}]
    return doc


def general(doc: dict[str, Any]) -> agents.AgentReport:
    """The report without the fast path (every entry through `_device` and `PodGpuEvidence(...)`)."""
    plain = agents._PLAIN
    agents._PLAIN = frozenset()
    try:
        return parse_evidence(doc, EP, AT)
    finally:
        agents._PLAIN = plain


def same(a: agents.AgentReport, b: agents.AgentReport) -> None:
    assert a == b
    assert [(e.namespace, e.pod, e.containers, e._p, e._x) for e in a.gpus] == \
        [(e.namespace, e.pod, e.containers, e._p, e._x) for e in b.gpus]


@settings(max_examples=400, deadline=None)
@given(documents())
def test_the_fast_path_makes_the_general_paths_records(doc: dict[str, Any]) -> None:
    same(parse_evidence(doc, EP, AT), general(doc))


@settings(max_examples=200, deadline=None)
@given(documents())
def test_off_the_wire_too(doc: dict[str, Any]) -> None:
    """Through JSON, as the poller reads it (orjson: big ints as floats, no NaN)."""
    try:
        body = orjson.dumps(doc)
    except TypeError:  # (an integer orjson will not write: no agent sends one)
        return
    same(decode_evidence(body, EP, AT), general(orjson.loads(body)))


def test_an_agents_pass_takes_the_fast_path() -> None:
    """Every GPU of a plain document goes through the fast path (the general path is not called), and
    its readings read back as sent."""
    ids = [f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, str(i))}" for i in range(8)]
    gpus = [{"uuid": u, "index": i, "utilization": 0.5 + i / 100, "sm_active": 0.7, "power_w": 600.0,
             "power_limit_w": 700.0, "pods": [{"namespace": "ns", "pod": "p1", "container": "main"}]}
            for i, u in enumerate(ids)]
    body = orjson.dumps({"version": EVIDENCE_VERSION, "node": "node-a", "gpus": gpus})
    calls = []
    device = agents._device

    def counted(*a: Any) -> GpuDevice:
        calls.append(a)
        return device(*a)
    agents._device = counted
    try:
        report = decode_evidence(body, EP, AT)
    finally:
        agents._device = device
    assert calls == []
    (ev,) = report.gpus
    assert [d.uuid for d in ev.devices] == ids
    assert [d.utilization for d in ev.devices] == [0.5 + i / 100 for i in range(8)]
    assert {d.power_limit_w for d in ev.devices} == {700.0} and {d.index for d in ev.devices} == set(range(8))
    assert all(d.xids == () and d.ecc_uncorrected is None and d.energy_j is None for d in ev.devices)
    same(report, general(orjson.loads(body)))


def test_not_json_is_named() -> None:
    with pytest.raises(agents.AgentReadError, match=r"http://10.0.0.1:9402/evidence: not JSON"):
        decode_evidence(b"{", EP, AT)


look_alike = st.uuids().map(lambda u: f"GPU-{u}"[:-1] + "g")  # (40 characters, one not hex)
rows = st.tuples(st.one_of(canonical, canonical, st.uuids().map(lambda u: f"MIG-{u}"), st.text(max_size=4),
                           st.uuids().map(lambda u: f"GPU-{str(u).upper()}"), look_alike),
                 st.one_of(st.integers(-40000, 40000), st.none(), st.sampled_from([0, 1, 2, 3])),
                 *(st.one_of(st.floats(), st.none(), st.sampled_from([700.0, 0.0, -0.0, math.inf]),
                             st.integers(0, 3)) for _ in range(4)))


@settings(max_examples=400, deadline=None)
@given(st.lists(rows, max_size=9))
def test_from_readings_packs_as_the_devices_do(rs: list[Any]) -> None:
    a = PodGpuEvidence.from_readings("ns", "p", "n", "agent", AT, rs, ("main",))
    b = PodGpuEvidence("ns", "p", "n", "agent", AT, tuple(GpuDevice(*r) for r in rs), ("main",))
    assert (a._p, a._x, a.containers) == (b._p, b._x, b.containers)
    assert a == b and a.devices == b.devices
