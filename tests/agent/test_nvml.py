"""The real sampler against a scripted NVML at the pynvml boundary."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml

from collector.agent.hang import HangHints, busy_and_cold
from collector.agent.nvml import NvmlSampler, XidEventThread, normalize_pci
from collector.agent.settings import HangSettings
from tests.agent.fake_nvml import FakeDevice, FakeNvml, devices_from_nvsmi_xml


def _gpus(n: int) -> list[FakeDevice]:
    return [FakeDevice(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", pci=f"00000000:{0x1b + i:02X}:00.0")
            for i in range(n)]


def test_readings_and_units() -> None:
    devs = _gpus(2)
    devs[0].util, devs[0].power_mw, devs[0].gpm_sm = 97, 350_500, 85.0
    s = NvmlSampler(FakeNvml(devs))
    assert s.open().state == "ok"
    s.sample()  # GPM needs two samples for a rate
    r0, r1 = s.sample()
    assert (r0.index, r0.uuid, r0.pci) == (0, devs[0].uuid, "0000:1b:00.0")
    assert r0.utilization == 0.97 and r0.power_w == 350.5 and r0.power_limit_w == 700.0
    assert r0.sm_clock_hz == 1980e6 and r0.memory_clock_hz == 2619e6 and r0.temperature_c == 30
    assert r0.sm_active == 0.85 and r1.sm_active is None and "sm_active" in r1.unsupported
    assert ("uncorrected", "aggregate", 0) in r0.ecc and ("corrected", "aggregate", 7) in r0.ecc
    assert dict(r0.nvlink_errors) == {"crc_flit": 0, "crc_data": 0, "replay": 2, "recovery": 0}
    assert r0.clocks_event_reasons == 0x1 and r0.remap_pending is False
    assert not r0.error and not r0.lost


def test_not_supported_fields_are_unsupported_not_errors(fixtures: Path) -> None:
    """A real T4 capture: remapped rows N/A; no NVLink; no GPM."""
    devs = devices_from_nvsmi_xml(fixtures / "xid_nvsmi" / "nvidia_smi_q_x_tesla_t4_telegraf.xml")
    s = NvmlSampler(FakeNvml(devs))
    s.open()
    (r,) = s.sample()
    assert r.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a" and r.name == "Tesla T4"
    assert r.power_w == 26.78 and r.power_limit_w == 70.0 and r.memory_total_bytes == 15360 << 20
    assert r.remapped_correctable is None and {"remapped_rows", "nvlink", "sm_active"} <= r.unsupported
    assert r.error == "" and s.errors == 0


def test_mig_instances_are_their_own_readings(fixtures: Path) -> None:
    """A real A100 capture with MIG on: the parent's utilization is N/A, each instance has memory."""
    devs = devices_from_nvsmi_xml(fixtures / "xid_nvsmi" / "nvidia_smi_q_x_a100_sxm4_80gb_mig_telegraf.xml")
    s = NvmlSampler(FakeNvml(devs))
    s.open()
    readings = s.sample()
    parents = [r for r in readings if not r.parent_uuid]
    migs = [r for r in readings if r.parent_uuid]
    assert len(parents) == len(devs) and parents[0].utilization is None and "utilization" in parents[0].unsupported
    assert len(migs) == sum(len(d.mig) for d in devs) >= 4
    assert migs[0].parent_uuid == parents[0].uuid and migs[0].memory_total_bytes == 19968 << 20
    assert s.errors == 0


def test_each_mig_instance_has_its_own_sm_activity(fixtures: Path) -> None:
    """GPM sampled per GPU instance on the parent: the one per-instance activity NVML gives, so an
    instance's pod is credited with its own work, not the whole GPU's."""
    devs = devices_from_nvsmi_xml(fixtures / "xid_nvsmi" / "nvidia_smi_q_x_a100_sxm4_80gb_mig_telegraf.xml")
    parent = devs[0]
    parent.gpm_sm = 40.0
    for k, m in enumerate(parent.mig):
        m.gpm_sm = 10.0 * (k + 1)
    nv = FakeNvml(devs)
    s = NvmlSampler(nv)
    s.open()
    s.sample()  # two samples for a rate
    migs = {r.uuid: r for r in s.sample() if r.parent_uuid == parent.uuid}
    assert len({m.gi for m in parent.mig}) == len(parent.mig) >= 2, "the capture's instances have their own ids"
    assert {u: r.sm_active for u, r in migs.items()} == {m.uuid: m.gpm_sm / 100 for m in parent.mig}
    assert s.minor_to_uuid() == {i: d.uuid for i, d in enumerate(devs)}
    # re-partitioned: an instance gone takes its samples with it; a new one starts again
    gone = parent.mig.pop()
    parent.mig.append(FakeDevice(uuid="MIG-00000000-0000-0000-0000-00000000abcd", gi=gone.gi, gpm_sm=99.0))
    migs = {r.uuid: r for r in s.sample() if r.parent_uuid == parent.uuid}
    assert migs["MIG-00000000-0000-0000-0000-00000000abcd"].sm_active is None  # primed, no rate yet
    assert migs["MIG-00000000-0000-0000-0000-00000000abcd"] and s.errors == 0
    migs = {r.uuid: r for r in s.sample() if r.parent_uuid == parent.uuid}
    assert migs["MIG-00000000-0000-0000-0000-00000000abcd"].sm_active == 0.99
    sampler_dev = s._devices[0]
    assert gone.uuid not in sampler_dev.migs


def test_a_lost_gpu_never_stops_the_others() -> None:
    devs = _gpus(3)
    nv = FakeNvml(devs)
    s = NvmlSampler(nv)
    s.open()
    s.sample()
    devs[1].lost = True  # fallen off the bus
    readings = s.sample()
    assert [r.lost for r in readings] == [False, True, False]
    assert readings[1].uuid == devs[1].uuid and "GPU is lost" in readings[1].error
    assert readings[0].utilization is not None and readings[2].utilization is not None
    # still lost: one cheap call per tick, not a full read
    before = nv.calls.get("nvmlDeviceGetPowerUsage", 0)
    assert [r.lost for r in s.sample()] == [False, True, False]
    assert nv.calls["nvmlDeviceGetPowerUsage"] == before + 2
    devs[1].lost = False  # reset by an operator
    assert [r.lost for r in s.sample()] == [False, False, False]


def test_lost_in_the_middle_of_a_read_and_other_errors() -> None:
    devs = _gpus(2)
    devs[0].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_GPU_IS_LOST
    devs[1].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    s = NvmlSampler(FakeNvml(devs))
    s.open()
    r0, r1 = s.sample()
    assert r0.lost and not r1.lost
    assert r1.power_w is None and r1.error.startswith("power:") and r1.utilization == 0.0
    assert s.errors >= 2


def test_no_nvml_is_a_status_not_a_crash() -> None:
    s = NvmlSampler(FakeNvml([], library_missing=True), retry_s=3600)
    st = s.open()
    assert st.state == "no-nvml" and "no NVML" in st.message
    assert s.sample() == ()


def test_the_real_pynvml_without_a_gpu_says_no_nvml() -> None:
    """This machine has no libnvidia-ml: the real library raises NVMLError_LibraryNotFound."""
    s = NvmlSampler(retry_s=3600)
    st = s.open()
    assert st.state in ("no-nvml", "driver-not-loaded"), st
    assert "no NVML" in st.message
    assert s.sample() == ()


def test_xid_events_on_their_own_thread() -> None:
    devs = _gpus(2)
    devs[1].xid_events = False  # a device that does not offer XID events
    nv = FakeNvml(devs)
    s = NvmlSampler(nv)
    s.open()
    s.sample()
    got: list[tuple[str, int]] = []
    t = XidEventThread(s, lambda uuid, code: got.append((uuid, code)), wait_ms=50)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not nv.registered and time.monotonic() < deadline:
            time.sleep(0.02)
        nv.inject_xid(devs[0], 79)
        nv.inject_xid(devs[0], 79)
        nv.inject_xid(devs[0], 48)
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        t.stop()
    assert got == [(devs[0].uuid, 79), (devs[0].uuid, 79), (devs[0].uuid, 48)]
    assert t.registered == 1 and t.unsupported == [devs[1].uuid]
    assert not t.alive()


def test_pci_normalization() -> None:
    assert normalize_pci("00000000:9B:00.0") == "0000:9b:00.0"
    assert normalize_pci("0000:9b:00.0") == "0000:9b:00.0"


def test_hang_hint_needs_busy_and_cold_sustained() -> None:
    hs = HangSettings(sustain_s=60)
    devs = _gpus(1)
    devs[0].gpm_sm = 5.0  # SMs nearly idle
    nv = FakeNvml(devs)
    t = [1000.0]
    s = NvmlSampler(nv, clock=lambda: t[0])
    s.open()
    hints = HangHints(hs)
    devs[0].util, devs[0].power_mw = 100, 71_000  # 100% busy at 71 W of 700 W
    (r,) = s.sample()
    assert busy_and_cold(r, hs) is True
    hints.update((r,))
    assert not hints.hinted(r.uuid, t[0])
    t[0] += 61
    hints.update(s.sample())
    assert hints.hinted(r.uuid, t[0])
    devs[0].power_mw = 650_000  # working hard again
    t[0] += 1
    hints.update(s.sample())
    assert hints.since(r.uuid) is None and not hints.hinted(r.uuid, t[0])
    # SM activity, where offered, must agree: busy, cold power, but SMs active → no hint
    devs[0].power_mw, devs[0].gpm_sm = 71_000, 90.0
    s.sample()
    (r,) = s.sample()
    assert busy_and_cold(r, hs) is False
    devs[0].util = 40
    (r,) = s.sample()
    assert busy_and_cold(r, hs) is False


def test_bandwidth_pcie_nvlink_and_the_energy_window() -> None:
    """Memory bandwidth use, PCIe and NVLink throughput, and the energy counter's window (issue 28)."""
    devs = _gpus(2)
    d = devs[0]
    d.util, d.mem_util, d.pcie_kbs, d.nvlink_kib, d.energy_mj = 99, 63, (2_000, 3_000), (1_000, 2_000), 5_000_000
    devs[1].energy_mj = devs[1].pcie_kbs = None  # a device without them: unsupported, not an error
    now = [1000.0]
    s = NvmlSampler(FakeNvml(devs), clock=lambda: now[0])
    s.open()
    r0, r1 = s.sample()
    assert r0.memory_util == 0.63 and r0.pcie_tx_bps == 2_000 * 1024 and r0.pcie_rx_bps == 3_000 * 1024
    assert r0.nvlink_tx_bps is None and r0.energy_mj == 5_000_000 and r0.energy_from is None  # one point yet
    assert r1.energy_mj is None and r1.pcie_tx_bps is None and {"energy", "pcie_throughput"} <= r1.unsupported
    assert r1.nvlink_tx_bps is None and "nvlink_throughput" in r1.unsupported and not r1.error and s.errors == 0
    for k in range(1, 41):  # 400 s at 10 s: 400 W
        now[0] += 10
        d.energy_mj += 4_000_000
        d.nvlink_kib = (d.nvlink_kib[0] + 10 * 1024, d.nvlink_kib[1] + 20 * 1024)
        r0, _ = s.sample()
        assert r0.energy_from is not None and r0.energy_mj is not None
        at, mj = r0.energy_from
        assert (r0.energy_mj - mj) / (now[0] - at) == 400_000  # mJ/s: the window's mean power, 400 W
        assert now[0] - at <= 300 + 15 and (k < 30 or now[0] - at >= 300)
    assert r0.nvlink_tx_bps == 1024 * 1024 and r0.nvlink_rx_bps == 2 * 1024 * 1024
    # a driver reload: the counter starts over, and no window spans the reset
    now[0] += 10
    d.energy_mj = 1_000
    r0, _ = s.sample()
    assert r0.energy_mj == 1_000 and r0.energy_from is None
    now[0] += 20
    d.energy_mj = 8_001_000
    r0, _ = s.sample()
    assert r0.energy_from == (now[0] - 20, 1_000)
    d.energy_mj = None  # the counter no longer read (NOT_SUPPORTED): unknown, and the window is gone
    now[0] += 10
    r0, _ = s.sample()
    assert r0.energy_mj is None and r0.energy_from is None and "energy" in r0.unsupported
