"""A scripted NVML at the pynvml function boundary: no GPU exists here (DEVELOPERS.md: a fake only
for what cannot exist, exactly at the library boundary).

`FakeNvml` has the pynvml functions the sampler calls, takes devices from a table a test scripts
(or from a real `nvidia-smi -q -x` capture), raises pynvml's own error classes, and returns pynvml's
own ctypes structures where the real library does (field values, GPM). Anything not defined here
(constants, NVMLError) is pynvml's.
"""

from __future__ import annotations

import ctypes
import queue
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

NA = None  # a reading the device does not offer: NOT_SUPPORTED


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci: str = "00000000:1B:00.0"
    util: int | None = 0  # percent
    mem_util: int = 0  # percent of time device memory was read or written (with `util`)
    mem_used: int | None = 1 << 30
    mem_total: int | None = 80 << 30
    power_mw: int | None = 70_000
    limit_mw: int | None = 700_000
    temp: int | None = 30
    sm_mhz: int | None = 1980
    mem_mhz: int | None = 2619
    reasons: int | None = 0x1
    ecc: dict[tuple[int, int], int] | None = field(default_factory=lambda: {(1, 0): 0, (1, 1): 0, (0, 0): 3, (0, 1): 7})
    rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    nvlink: dict[int, int] | None = field(default_factory=lambda: {38: 0, 45: 0, 52: 2, 59: 0})
    nvlink_kib: tuple[int, int] | None = None  # NVLink TX, RX data KiB counters; None: NOT_SUPPORTED
    pcie_kbs: tuple[int, int] | None = (0, 0)  # PCIe TX, RX KB/s
    energy_mj: int | None = 1_000_000  # total energy counter, mJ; None: NOT_SUPPORTED
    gpm_sm: float | None = None  # percent; None: no GPM on this device
    mig: list[FakeDevice] = field(default_factory=list)
    mig_enabled: bool = False
    xid_events: bool = True
    minor: int | None = None  # /dev/nvidia<minor>; None: its index
    gi: int = 0  # a MIG instance: its GPU instance id (GPM per instance: set `gpm_sm` on it)
    profile_id: int = 19  # a MIG instance: its GPU instance profile id (19: A100 1g.10gb)
    placement_start: int = 0
    lost: bool = False
    fail: dict[str, int] = field(default_factory=dict)  # pynvml function name → NVML error code


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


class FakeNvml:
    """Module-like: `FakeNvml(devices).nvmlDeviceGetCount()` etc.; `calls` counts each function."""

    def __init__(self, devices: list[FakeDevice], *, library_missing: bool = False, driver: str = "550.54.15") -> None:
        self.devices = devices
        self.library_missing = library_missing
        self.driver = driver
        self.initialized = False
        self.events: queue.Queue[tuple[FakeDevice, int]] = queue.Queue()
        self.registered: list[FakeDevice] = []
        self.calls: dict[str, int] = {}
        self._gpm: dict[int, float] = {}

    def __getattr__(self, name: str) -> Any:  # constants, error classes, structures
        return getattr(pynvml, name)

    def _call(self, fn: str, dev: FakeDevice | None = None) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self.initialized and fn != "nvmlInit":
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        if dev is not None:
            if dev.lost:
                _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
            if fn in dev.fail:
                _raise(dev.fail[fn])

    @staticmethod
    def _value(v: Any) -> Any:
        if v is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return v

    # --- library ---
    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.library_missing:
            _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        self._call("nvmlDeviceGetHandleByIndex")
        if i >= len(self.devices):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[i]

    # --- per device ---
    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str:
        self._call("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetMinorNumber(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetMinorNumber", h)
        return h.minor if h.minor is not None else self.devices.index(h)

    def nvmlDeviceGetName(self, h: FakeDevice) -> str:
        self._call("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetPciInfo(self, h: FakeDevice) -> Any:
        self._call("nvmlDeviceGetPciInfo", h)
        info = pynvml.nvmlPciInfo_t()
        info.busId = h.pci.encode()
        return info

    def nvmlDeviceGetUtilizationRates(self, h: FakeDevice) -> Any:
        self._call("nvmlDeviceGetUtilizationRates", h)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu = self._value(h.util)
        u.memory = h.mem_util
        return u

    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice, version: Any = None) -> Any:
        self._call("nvmlDeviceGetMemoryInfo", h)
        m = pynvml.c_nvmlMemory_t()
        m.total = self._value(h.mem_total)
        m.used = self._value(h.mem_used)
        m.free = m.total - m.used
        return m

    def nvmlDeviceGetPowerUsage(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetPowerUsage", h)
        return int(self._value(h.power_mw))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption", h)
        return int(self._value(h.energy_mj))

    def nvmlDeviceGetPcieThroughput(self, h: FakeDevice, counter: int) -> int:
        self._call("nvmlDeviceGetPcieThroughput", h)
        return int(self._value(h.pcie_kbs)[counter])

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetEnforcedPowerLimit", h)
        return int(self._value(h.limit_mw))

    def nvmlDeviceGetTemperature(self, h: FakeDevice, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", h)
        return int(self._value(h.temp))

    def nvmlDeviceGetClockInfo(self, h: FakeDevice, kind: int) -> int:
        self._call("nvmlDeviceGetClockInfo", h)
        return int(self._value(h.sm_mhz if kind == pynvml.NVML_CLOCK_SM else h.mem_mhz))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(self._value(h.reasons))

    def nvmlDeviceGetTotalEccErrors(self, h: FakeDevice, etype: int, ctype: int) -> int:
        self._call("nvmlDeviceGetTotalEccErrors", h)
        return int(self._value(h.ecc)[(etype, ctype)])

    def nvmlDeviceGetRemappedRows(self, h: FakeDevice) -> tuple[int, int, int, int]:
        self._call("nvmlDeviceGetRemappedRows", h)
        rows: tuple[int, int, int, int] = self._value(h.rows)
        return rows

    def nvmlDeviceGetFieldValues(self, h: FakeDevice, ids: list[int]) -> Any:
        self._call("nvmlDeviceGetFieldValues", h)
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            values[i].fieldId = fid
            kib = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: h.nvlink_kib[0],
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: h.nvlink_kib[1]} if h.nvlink_kib else {}
            fields = {**(h.nvlink or {}), **kib}
            if fid not in fields:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = fields[fid]
        return values

    def nvmlDeviceGetMigMode(self, h: FakeDevice) -> tuple[int, int]:
        self._call("nvmlDeviceGetMigMode", h)
        if not h.mig_enabled and not h.mig:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        m = pynvml.NVML_DEVICE_MIG_ENABLE if h.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return (m, m)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeDevice, i: int) -> FakeDevice:
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if i >= len(h.mig):
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return h.mig[i]

    # --- GPM (SM activity) ---
    def nvmlGpmQueryDeviceSupport(self, h: FakeDevice) -> Any:
        self._call("nvmlGpmQueryDeviceSupport", h)
        s = pynvml.c_nvmlGpmSupport_t()
        s.isSupportedDevice = 1 if h.gpm_sm is not None else 0
        return s

    def nvmlGpmSampleAlloc(self) -> Any:
        self._call("nvmlGpmSampleAlloc")
        return ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleGet(self, h: FakeDevice, sample: Any) -> Any:
        self._call("nvmlGpmSampleGet", h)
        self._gpm[ctypes.addressof(sample.contents)] = float(self._value(h.gpm_sm))
        return sample

    def nvmlDeviceGetGpuInstanceId(self, h: FakeDevice) -> int:
        self._call("nvmlDeviceGetGpuInstanceId", h)
        return h.gi

    def nvmlDeviceGetGpuInstanceById(self, h: FakeDevice, gi: int) -> FakeDevice:
        self._call("nvmlDeviceGetGpuInstanceById", h)
        mig = next((m for m in h.mig if m.gi == gi), None)
        if mig is None:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        assert mig is not None
        return mig  # the GPU instance's handle: its MIG device stands in for it

    def nvmlGpuInstanceGetInfo(self, gi: FakeDevice) -> Any:
        self._call("nvmlGpuInstanceGetInfo", gi)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi.gi, gi.profile_id
        info.placement.start, info.placement.size = gi.placement_start, 1
        return info

    def nvmlGpmMigSampleGet(self, h: FakeDevice, gi: int, sample: Any) -> Any:
        self._call("nvmlGpmMigSampleGet", h)
        mig = next((m for m in h.mig if m.gi == gi), None)
        if mig is None:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        assert mig is not None
        self._gpm[ctypes.addressof(sample.contents)] = float(self._value(mig.gpm_sm))
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._call("nvmlGpmMetricsGet")
        for i in range(mg.numMetrics):
            mg.metrics[i].nvmlReturn = pynvml.NVML_SUCCESS
            mg.metrics[i].value = self._gpm[ctypes.addressof(mg.sample2.contents)]
        return mg

    # --- events ---
    def nvmlEventSetCreate(self) -> object:
        self._call("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: FakeDevice, types: int, event_set: object) -> None:
        self._call("nvmlDeviceRegisterEvents", h)
        if not h.xid_events:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(h)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self._call("nvmlEventSetWait")
        try:
            dev, code = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(device=dev, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code,
                               gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._call("nvmlEventSetFree")

    def inject_xid(self, dev: FakeDevice, code: int) -> None:
        self.events.put((dev, code))


# --- devices from a real `nvidia-smi -q -x` capture ---------------------------------------------

def _num(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.match(r"\s*([\d.]+)", text)
    return float(m.group(1)) if m else None  # "N/A" → None (NOT_SUPPORTED)


def devices_from_nvsmi_xml(path: Path) -> list[FakeDevice]:
    """One FakeDevice per <gpu> with the readings the capture shows; "N/A" becomes NOT_SUPPORTED."""
    root = ET.parse(path).getroot()
    out = []
    for g in root.findall("gpu"):
        mib = 1 << 20
        fb = g.find("fb_memory_usage")
        power = g.find("gpu_power_readings") if g.find("gpu_power_readings") is not None else g.find("power_readings")
        clocks = g.find("clocks")
        mig_on = (g.findtext("mig_mode/current_mig") or "").strip() == "Enabled"
        util = _num(g.findtext("utilization/gpu_util"))
        draw = _num(power.findtext("power_draw")) if power is not None else None
        limit = _num(power.findtext("enforced_power_limit")) if power is not None else None
        used = _num(fb.findtext("used")) if fb is not None else None
        total = _num(fb.findtext("total")) if fb is not None else None
        uuid = (g.findtext("uuid") or "").strip()
        dev = FakeDevice(
            uuid=uuid, name=(g.findtext("product_name") or "").strip(), pci=g.get("id", ""),
            util=int(util) if util is not None else NA,
            mem_used=int(used * mib) if used is not None else NA,
            mem_total=int(total * mib) if total is not None else NA,
            power_mw=int(draw * 1000) if draw is not None else NA,
            limit_mw=int(limit * 1000) if limit is not None else NA,
            temp=int(t) if (t := _num(g.findtext("temperature/gpu_temp"))) is not None else NA,
            sm_mhz=int(c) if clocks is not None and (c := _num(clocks.findtext("sm_clock"))) is not None else NA,
            mem_mhz=int(c) if clocks is not None and (c := _num(clocks.findtext("mem_clock"))) is not None else NA,
            rows=NA if (g.findtext("remapped_rows") or "").strip() == "N/A" else (0, 0, 0, 0),
            nvlink=None, mig_enabled=mig_on,
            energy_mj=NA,  # these captures do not show the total energy counter
        )
        for m in g.findall("mig_devices/mig_device"):
            mfb = m.find("fb_memory_usage")
            mu = _num(mfb.findtext("used")) if mfb is not None else None
            mt = _num(mfb.findtext("total")) if mfb is not None else None
            gi = (m.findtext("gpu_instance_id") or "").strip()
            dev.mig.append(FakeDevice(uuid=f"MIG-{uuid[4:]}-gi{gi}", name=dev.name, pci=dev.pci, util=NA,
                                      gi=int(gi) if gi.isdigit() else 0,
                                      mem_used=int(mu * mib) if mu is not None else NA,
                                      mem_total=int(mt * mib) if mt is not None else NA))
        out.append(dev)
    return out
