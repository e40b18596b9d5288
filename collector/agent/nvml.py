"""NVML sampling through nvidia-ml-py (module `pynvml`): per-GPU readings, failures kept per device.

The library is reached through `nv`, the `pynvml` module by default. Tests hand in a scripted
stand-in with the same functions that raises pynvml's own error classes, so this code runs
unchanged against it. One GPU fallen off the bus (NVML_ERROR_GPU_IS_LOST) marks that GPU lost and
never stops the others; a field the device does not offer (NOT_SUPPORTED: consumer boards, MIG)
is recorded as unsupported, not as an error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("taugrid.agent.nvml")

NvmlLib = Any  # the pynvml module, or a stand-in with its functions and error classes

# NVML return codes (nvml.h); the same values as pynvml's NVML_ERROR_* constants.
NOT_SUPPORTED = 3
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15

# nvmlDeviceGetFieldValues ids: NVLink error totals over all lanes (nvml.h NVML_FI_DEV_NVLINK_*_TOTAL).
NVLINK_FIELDS: tuple[tuple[int, str], ...] = ((38, "crc_flit"), (45, "crc_data"), (52, "replay"), (59, "recovery"))
# ... and NVLink data through the device, KiB since the driver loaded (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX).
NVLINK_TX_KIB, NVLINK_RX_KIB = 138, 139
PCIE_TX, PCIE_RX = 0, 1  # nvmlPcieUtilCounter_t: KB/s over NVML's own short sampling interval

# The energy window the agent sends: the total energy counter (mJ since the driver loaded) read
# now and at most ENERGY_WINDOW_S ago, points kept at least ENERGY_POINT_S apart; a counter that
# goes back (driver reload, GPU reset) starts the window over.
ENERGY_WINDOW_S = 300.0
ENERGY_POINT_S = 15.0

# nvmlClocksEventReasons bits (formerly "throttle reasons").
CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
MIG_ENABLED = 1
GPM_SM_UTIL = 2  # NVML_GPM_METRIC_SM_UTIL: percent of SMs busy over the interval between two samples


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One device at one instant. `None`: not read (unsupported, failed, or lost)."""

    index: int
    uuid: str
    name: str = ""
    pci: str = ""  # "0000:9b:00.0", lower case
    parent_uuid: str = ""  # a MIG instance: the physical GPU it lives on
    lost: bool = False
    error: str = ""  # the first failure of this reading, if any
    utilization: float | None = None  # ratio 0–1 of time a kernel ran
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    clocks_event_reasons: int | None = None
    ecc: tuple[tuple[str, str, int], ...] = ()  # (type corrected|uncorrected, counter volatile|aggregate, count)
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    nvlink_errors: tuple[tuple[str, int], ...] = ()
    sm_active: float | None = None  # ratio 0–1 (GPM, Hopper and later)
    memory_util: float | None = None  # ratio 0–1 of time device memory was read or written (bandwidth use)
    pcie_tx_bps: float | None = None  # bytes/s
    pcie_rx_bps: float | None = None
    nvlink_tx_bps: float | None = None  # bytes/s over all links since the previous reading
    nvlink_rx_bps: float | None = None
    energy_mj: int | None = None  # the total energy counter now
    # the energy window: (when, counter) of its oldest point; with `at`/`energy_mj` its newest
    energy_from: tuple[float, int] | None = None
    unsupported: frozenset[str] = frozenset()
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    state: str  # "ok" | "no-nvml" | "driver-not-loaded" | "error" | "not-started"
    message: str
    driver: str = ""
    devices: int = 0


class _Lost(Exception):
    pass


@dataclass(slots=True)
class _Device:
    handle: Any
    uuid: str = ""
    name: str = ""
    pci: str = ""
    minor: int | None = None  # /dev/nvidia<minor>: the NVIDIA DRA driver names a whole GPU "gpu-<minor>"
    lost: str = ""  # why, once lost
    gpm: bool | None = None  # GPM supported (None: not asked yet)
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False
    migs: dict[str, _Mig] = field(default_factory=dict)  # MIG UUID → its GPU instance
    energy: list[tuple[float, int]] = field(default_factory=list)  # (when, mJ) points, oldest first
    nvlink_kib: tuple[float, int, int] | None = None  # (when, TX KiB, RX KiB) at the previous reading


@dataclass(slots=True)
class _Mig:
    """A MIG instance's GPU instance: its id, and the (profile id, placement start) the NVIDIA DRA
    driver names it by ("gpu-<minor>-mig-<profile>-<profile id>-<placement start>")."""

    gi: int | None = None
    profile_id: int | None = None
    placement_start: int | None = None
    samples: list[Any] = field(default_factory=list)  # GPM
    primed: bool = False


def _text(v: object) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def normalize_pci(bus_id: str) -> str:
    """NVML's "00000000:9B:00.0" → "0000:9b:00.0" (the kernel log's spelling)."""
    s = bus_id.strip().lower()
    dom, _, rest = s.partition(":")
    if not rest:
        return s
    return f"{dom[-4:].rjust(4, '0')}:{rest}"


class NvmlSampler:
    """Reads every GPU (and MIG instance) once per `sample()`; safe to call from one thread."""

    def __init__(self, nv: NvmlLib | None = None, *, clock: Callable[[], float] = time.time,
                 retry_s: float = 60.0) -> None:
        self._nv: Any = nv
        self._clock = clock
        self._retry_s = retry_s
        self._next_try = 0.0
        self._devices: dict[int, _Device] = {}
        self.status = NvmlStatus("not-started", "NVML not initialized yet")
        self.errors = 0  # NVML calls that failed with something other than NOT_SUPPORTED
        self.lock = threading.Lock()  # held while NVML is called (the XID thread shares the library)

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def nv(self) -> NvmlLib:
        return self._nv

    @property
    def ok(self) -> bool:
        return self.status.state == "ok"

    def open(self) -> NvmlStatus:
        """Initialize NVML; a missing library or driver is a status, not an exception."""
        self._next_try = time.monotonic() + self._retry_s
        if self._nv is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError:
                self.status = NvmlStatus("no-nvml", "no NVML: the nvidia-ml-py package is not installed")
                return self.status
            self._nv = pynvml
        nv = self._nv
        try:
            with self.lock:
                nv.nvmlInit()
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code == LIBRARY_NOT_FOUND:
                self.status = NvmlStatus("no-nvml", f"no NVML: libnvidia-ml.so not found ({e}); no GPU readings, "
                                         "logs and status still served")
            elif code == DRIVER_NOT_LOADED:
                self.status = NvmlStatus("driver-not-loaded", f"no NVML: the NVIDIA driver is not loaded ({e})")
            else:
                self.status = NvmlStatus("error", f"NVML failed to initialize: {e}")
            return self.status
        except OSError as e:  # a broken library file
            self.status = NvmlStatus("no-nvml", f"no NVML: {e}")
            return self.status
        driver = ""
        with contextlib.suppress(nv.NVMLError):
            driver = _text(nv.nvmlSystemGetDriverVersion())
        self.status = NvmlStatus("ok", "NVML initialized", driver)
        return self.status

    def close(self) -> None:
        if self.ok:
            try:
                with self.lock:
                    self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
        self.status = NvmlStatus("not-started", "NVML shut down")

    # --- sampling --------------------------------------------------------------------------------

    def handles(self) -> list[tuple[int, Any, str]]:
        """(index, handle, uuid) of each physical GPU seen so far and not lost."""
        return [(i, d.handle, d.uuid) for i, d in sorted(self._devices.items()) if not d.lost]

    def minor_to_uuid(self) -> dict[int, str]:
        """Device minor number → GPU UUID (DRA devices named by minor, `podresources.dra`)."""
        return {d.minor: d.uuid for d in list(self._devices.values()) if d.minor is not None and d.uuid}

    def pci_to_uuid(self) -> dict[str, str]:
        """Bus id without function ("0000:9b:00") → GPU UUID, for kernel-log XIDs."""
        return {d.pci.rsplit(".", 1)[0]: d.uuid for d in self._devices.values() if d.pci}

    def sample(self) -> tuple[GpuReading, ...]:
        if not self.ok:
            if time.monotonic() >= self._next_try:
                self.open()
            if not self.ok:
                return ()
        nv = self._nv
        with self.lock:
            try:
                count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as e:
                self.errors += 1
                self.status = NvmlStatus("error", f"nvmlDeviceGetCount failed: {e}", self.status.driver)
                return ()
            out: list[GpuReading] = []
            for i in range(count):
                out.extend(self._sample_device(i))
        self.status = NvmlStatus("ok", "NVML initialized", self.status.driver, count)
        return tuple(out)

    def _sample_device(self, i: int) -> list[GpuReading]:
        nv = self._nv
        now = self._clock()
        dev = self._devices.get(i)
        try:
            if dev is None:
                dev = _Device(nv.nvmlDeviceGetHandleByIndex(i))
                dev.uuid = _text(nv.nvmlDeviceGetUUID(dev.handle))
                self._devices[i] = dev
                try:
                    dev.name = _text(nv.nvmlDeviceGetName(dev.handle))
                    dev.pci = normalize_pci(_text(nv.nvmlDeviceGetPciInfo(dev.handle).busId))
                except nv.NVMLError as e:
                    if getattr(e, "value", None) == GPU_IS_LOST:
                        raise
                with contextlib.suppress(nv.NVMLError):
                    dev.minor = int(nv.nvmlDeviceGetMinorNumber(dev.handle))
            if dev.lost:
                # A lost GPU stays lost until reset; one cheap call says whether it came back.
                nv.nvmlDeviceGetUUID(dev.handle)
                dev.lost = ""
            return self._read(i, dev, now)
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            self.errors += 1
            if dev is None:
                # Never reachable: no handle, nothing known but its index.
                return [GpuReading(i, "", lost=code == GPU_IS_LOST, error=str(e), at=now)]
            if code == GPU_IS_LOST or dev.lost:
                if not dev.lost:
                    log.warning("GPU lost", extra={"gpu": i, "uuid": dev.uuid, "error": str(e)})
                dev.lost = str(e)
                return [GpuReading(i, dev.uuid, dev.name, dev.pci, lost=True, error=dev.lost, at=now)]
            return [GpuReading(i, dev.uuid, dev.name, dev.pci, error=str(e), at=now)]
        except _Lost as e:
            assert dev is not None
            self.errors += 1
            if not dev.lost:
                log.warning("GPU lost", extra={"gpu": i, "uuid": dev.uuid, "error": str(e)})
            dev.lost = str(e)
            return [GpuReading(i, dev.uuid, dev.name, dev.pci, lost=True, error=dev.lost, at=now)]

    def _read(self, i: int, dev: _Device, now: float) -> list[GpuReading]:
        nv = self._nv
        h = dev.handle
        unsupported: set[str] = set()
        errors: list[str] = []

        def get(name: str, fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(h, *args)
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code == NOT_SUPPORTED:
                    unsupported.add(name)
                    return None
                if code == GPU_IS_LOST:
                    raise _Lost(str(e)) from e
                self.errors += 1
                errors.append(f"{name}: {e}")
                return None

        util = get("utilization", nv.nvmlDeviceGetUtilizationRates)
        energy = get("energy", nv.nvmlDeviceGetTotalEnergyConsumption)
        pcie_tx = get("pcie_throughput", nv.nvmlDeviceGetPcieThroughput, PCIE_TX)
        pcie_rx = get("pcie_throughput", nv.nvmlDeviceGetPcieThroughput, PCIE_RX) if pcie_tx is not None else None
        mem = get("memory", nv.nvmlDeviceGetMemoryInfo)
        power = get("power", nv.nvmlDeviceGetPowerUsage)
        limit = get("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
        temp = get("temperature", nv.nvmlDeviceGetTemperature, 0)  # NVML_TEMPERATURE_GPU
        sm_clock = get("sm_clock", nv.nvmlDeviceGetClockInfo, 1)  # NVML_CLOCK_SM
        mem_clock = get("memory_clock", nv.nvmlDeviceGetClockInfo, 2)  # NVML_CLOCK_MEM
        reasons = get("clocks_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons)
        ecc: list[tuple[str, str, int]] = []
        for etype, ename in ((1, "uncorrected"), (0, "corrected")):
            for ctype, cname in ((0, "volatile"), (1, "aggregate")):
                v = get("ecc", nv.nvmlDeviceGetTotalEccErrors, etype, ctype)
                if v is None:
                    break
                ecc.append((ename, cname, int(v)))
            if "ecc" in unsupported:
                break
        rows = get("remapped_rows", nv.nvmlDeviceGetRemappedRows)
        nvlink, nvlink_tx, nvlink_rx = self._nvlink(dev, now, get, unsupported)
        energy_from = self._energy(dev, now, int(energy)) if energy is not None else None
        if energy is None:
            dev.energy = []
        sm_active = self._sm_active(dev, get, unsupported)
        readings = [GpuReading(
            index=i, uuid=dev.uuid, name=dev.name, pci=dev.pci,
            error=errors[0] if errors else "",
            utilization=float(util.gpu) / 100.0 if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            power_w=float(power) / 1000.0 if power is not None else None,
            power_limit_w=float(limit) / 1000.0 if limit is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            sm_clock_hz=float(sm_clock) * 1e6 if sm_clock is not None else None,
            memory_clock_hz=float(mem_clock) * 1e6 if mem_clock is not None else None,
            clocks_event_reasons=int(reasons) if reasons is not None else None,
            ecc=tuple(ecc),
            remapped_correctable=int(rows[0]) if rows is not None else None,
            remapped_uncorrectable=int(rows[1]) if rows is not None else None,
            remap_pending=bool(rows[2]) if rows is not None else None,
            remap_failed=bool(rows[3]) if rows is not None else None,
            nvlink_errors=nvlink,
            sm_active=sm_active,
            memory_util=float(util.memory) / 100.0 if util is not None else None,
            pcie_tx_bps=float(pcie_tx) * 1024.0 if pcie_tx is not None else None,
            pcie_rx_bps=float(pcie_rx) * 1024.0 if pcie_rx is not None else None,
            nvlink_tx_bps=nvlink_tx, nvlink_rx_bps=nvlink_rx,
            energy_mj=int(energy) if energy is not None else None, energy_from=energy_from,
            unsupported=frozenset(unsupported),
            at=now,
        )]
        mode = get("mig_mode", nv.nvmlDeviceGetMigMode)
        if mode is not None and mode[0] == MIG_ENABLED:
            readings.extend(self._mig(i, dev, now))
        return readings

    def _nvlink(self, dev: _Device, now: float, get: Callable[..., Any],
                unsupported: set[str]) -> tuple[tuple[tuple[str, int], ...], float | None, float | None]:
        """NVLink error totals, and TX/RX bytes/s since the previous reading (None the first time,
        after a counter went back, or where the device offers no NVLink throughput)."""
        ids = [fid for fid, _ in NVLINK_FIELDS] + [NVLINK_TX_KIB, NVLINK_RX_KIB]
        values = get("nvlink", self._nv.nvmlDeviceGetFieldValues, ids)
        if values is None:
            dev.nvlink_kib = None
            return (), None, None
        out = []
        for (_, name), v in zip(NVLINK_FIELDS, values, strict=False):
            if v.nvmlReturn == 0:
                out.append((name, int(v.value.ullVal)))
        if not out:
            unsupported.add("nvlink")
        tx_rx = list(values)[len(NVLINK_FIELDS):]
        if len(tx_rx) != 2 or any(v.nvmlReturn != 0 for v in tx_rx):
            unsupported.add("nvlink_throughput")
            dev.nvlink_kib = None
            return tuple(out), None, None
        tx, rx = int(tx_rx[0].value.ullVal), int(tx_rx[1].value.ullVal)
        prev, dev.nvlink_kib = dev.nvlink_kib, (now, tx, rx)
        if prev is None or now <= prev[0] or tx < prev[1] or rx < prev[2]:
            return tuple(out), None, None
        dt = now - prev[0]
        return tuple(out), (tx - prev[1]) * 1024.0 / dt, (rx - prev[2]) * 1024.0 / dt

    @staticmethod
    def _energy(dev: _Device, now: float, mj: int) -> tuple[float, int] | None:
        """The oldest point of this GPU's energy window, `now`/`mj` being its newest; None while the
        window holds no earlier point (the first reading, or just after the counter went back)."""
        pts = dev.energy
        if pts and (mj < pts[-1][1] or now < pts[-1][0]):
            pts.clear()  # a driver reload or GPU reset restarted the counter: no delta spans it
        if not pts or now - pts[-1][0] >= ENERGY_POINT_S:
            pts.append((now, mj))
        while len(pts) > 1 and now - pts[1][0] >= ENERGY_WINDOW_S:
            pts.pop(0)
        first = pts[0]
        return first if first[0] < now and first[1] <= mj else None

    def _sm_active(self, dev: _Device, get: Callable[..., Any], unsupported: set[str]) -> float | None:
        """SM activity from GPM (two samples one interval apart); None where the GPU lacks GPM."""
        nv = self._nv
        if dev.gpm is None:
            query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
            support = get("sm_active", query) if query is not None else None
            dev.gpm = bool(support is not None and support.isSupportedDevice)
            if dev.gpm:
                dev.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        if not dev.gpm:
            unsupported.add("sm_active")
            return None
        prev, cur = dev.gpm_samples
        if get("sm_active", nv.nvmlGpmSampleGet, cur) is None:
            return None
        dev.gpm_samples = [cur, prev]
        if not dev.gpm_primed:
            dev.gpm_primed = True
            return None
        return self._gpm_sm(prev, cur)

    def _gpm_sm(self, prev: Any, cur: Any) -> float | None:
        """SM activity between two GPM samples (of a GPU, or of one MIG GPU instance)."""
        nv = self._nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.sample1 = prev
        mg.sample2 = cur
        mg.metrics[0].metricId = GPM_SM_UTIL
        try:
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError:
            self.errors += 1
            return None
        if mg.metrics[0].nvmlReturn != 0:
            return None
        return max(0.0, min(1.0, float(mg.metrics[0].value) / 100.0))

    def _mig(self, i: int, dev: _Device, now: float) -> list[GpuReading]:
        """MIG instances: identity and memory (the parent's utilization is NOT_SUPPORTED under MIG)."""
        nv = self._nv
        out: list[GpuReading] = []
        try:
            n = int(nv.nvmlDeviceGetMaxMigDeviceCount(dev.handle))
        except nv.NVMLError:
            return out
        seen: set[str] = set()
        for k in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, k)
            except nv.NVMLError:
                continue  # NOT_FOUND: an empty slot
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(mh))
            except nv.NVMLError:
                continue
            seen.add(uuid)
            used = total = None
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(mh)
                used, total = int(mem.used), int(mem.total)
            except nv.NVMLError:
                pass
            mig = dev.migs.get(uuid)
            if mig is None:
                mig = dev.migs[uuid] = self._mig_instance(dev, mh)
            out.append(GpuReading(i, uuid, dev.name, dev.pci, parent_uuid=dev.uuid, memory_used_bytes=used,
                                  memory_total_bytes=total, sm_active=self._mig_sm_active(dev, mig),
                                  unsupported=frozenset() if dev.gpm else frozenset({"sm_active"}), at=now))
        for gone in set(dev.migs) - seen:  # re-partitioned: that instance's samples are no use
            del dev.migs[gone]
        return out

    def _mig_instance(self, dev: _Device, mh: Any) -> _Mig:
        """Its GPU instance id, profile id and placement (asked once per instance)."""
        nv = self._nv
        mig = _Mig()
        try:
            mig.gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(dev.handle, mig.gi))
            mig.profile_id, mig.placement_start = int(info.profileId), int(info.placement.start)
        except nv.NVMLError as e:
            if getattr(e, "value", None) != NOT_SUPPORTED:
                self.errors += 1
        return mig

    def mig_placements(self) -> dict[tuple[int, int, int], str]:
        """(parent minor, GPU instance profile id, placement start) → MIG UUID (DRA device names)."""
        out = {}
        for d in list(self._devices.values()):
            for uuid, m in list(d.migs.items()):
                if d.minor is not None and m.profile_id is not None and m.placement_start is not None:
                    out[(d.minor, m.profile_id, m.placement_start)] = uuid
        return out

    def _mig_sm_active(self, dev: _Device, mig: _Mig) -> float | None:
        """One MIG instance's own SM activity: GPM sampled for its GPU instance on the parent (the
        only per-instance activity NVML offers; utilization is NOT_SUPPORTED on MIG)."""
        nv = self._nv
        if not dev.gpm or mig.gi is None:
            return None
        try:
            if not mig.samples:
                mig.samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            prev, cur = mig.samples
            nv.nvmlGpmMigSampleGet(dev.handle, mig.gi, cur)
        except nv.NVMLError as e:
            if getattr(e, "value", None) != NOT_SUPPORTED:
                self.errors += 1
            return None
        mig.samples = [cur, prev]
        if not mig.primed:
            mig.primed = True
            return None
        return self._gpm_sm(prev, cur)


class XidEventThread:
    """NVML's event API on its own thread: each XID critical error becomes `on_xid(uuid, code)`."""

    def __init__(self, sampler: NvmlSampler, on_xid: Callable[[str, int], object], *, wait_ms: int = 500) -> None:
        self._sampler = sampler
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered = 0
        self.unsupported: list[str] = []  # UUIDs that do not offer XID events
        self.errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        s = self._sampler
        while not self._stop.is_set() and not (s.ok and s.handles()):
            self._stop.wait(1.0)  # the sampler initializes NVML and finds the devices
        if self._stop.is_set():
            return
        nv = s.nv
        with s.lock:
            try:
                event_set = nv.nvmlEventSetCreate()
            except nv.NVMLError as e:
                self.errors += 1
                log.warning("NVML event set not created: no XID events from NVML", extra={"error": str(e)})
                return
            for _, handle, uuid in s.handles():
                try:
                    nv.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
                    self.registered += 1
                except nv.NVMLError:
                    self.unsupported.append(uuid)
        if not self.registered:
            log.info("no GPU offers NVML XID events; XIDs come from the kernel log only")
            return
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(event_set, self._wait_ms)  # blocks: never under the lock
            except nv.NVMLError as e:
                if getattr(e, "value", None) == TIMEOUT:
                    continue
                self.errors += 1
                self._stop.wait(1.0)
                continue
            if not data.eventType & XID_EVENT:
                continue
            uuid = ""
            try:
                with s.lock:
                    uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                pass
            self._on_xid(uuid, int(data.eventData))
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlEventSetFree(event_set)
