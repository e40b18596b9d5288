"""GPU evidence per pod, from node agents or dcgm-exporter (records only; pure).

The claims read these through `gpu_summary`: how many GPUs the kubelet actually allocated to a
run's pods (scheduled), whether any is lost (blocked stage / running), and whether they look busy
but cold, the hang hint (progressing). Readings older than the freshness bound are not used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class GpuDevice:
    uuid: str  # GPU or MIG UUID
    index: int | None = None
    utilization: float | None = None  # ratio 0–1
    sm_active: float | None = None  # ratio 0–1
    power_w: float | None = None
    power_limit_w: float | None = None
    lost: bool = False
    hang_hint: bool = False
    xids: tuple[int, ...] = ()  # codes seen recently on this GPU
    mig_profile: str = ""
    shared: bool = False  # several pods use it (time-slicing, MPS, a shared claim): its readings are all of theirs
    sm_clock_hz: float | None = None
    clock_reasons: tuple[str, ...] = ()  # clocks-event (throttle) reasons holding its clocks down, by name
    memory_util: float | None = None  # ratio 0–1 of time device memory was read or written (bandwidth use)
    pcie_bps: float | None = None  # PCIe bytes/s, TX + RX
    nvlink_bps: float | None = None  # NVLink bytes/s over all links, TX + RX
    # The energy counter's window: joules used from `energy_from_s` to `energy_to_s` seconds before the
    # record's `read_at` (the agent's clock turned into the reader's); None: no counter, or one point yet.
    energy_j: float | None = None
    energy_from_s: float | None = None
    energy_to_s: float | None = None
    # NVML's remapped rows: a remap waits for the next GPU reset / a remap failed (replace the GPU)
    remap_pending: bool = False
    remap_failed: bool = False
    # when the agent first saw each XID code: (code, seconds before the record's `read_at`), by code
    xid_ages: tuple[tuple[int, float], ...] = ()
    ecc_uncorrected: int | None = None  # NVML's volatile uncorrected ECC errors (since the GPU's last reset)


@dataclass(frozen=True, slots=True)
class PodGpuEvidence:
    """The devices one pod holds on its node, as one source saw them at `read_at` (reader's clock)."""

    namespace: str
    pod: str
    node: str
    source: str  # "agent" | "dcgm"
    read_at: datetime
    devices: tuple[GpuDevice, ...]
    containers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSummary:
    pods: int  # pods with fresh GPU evidence
    allocated: int  # devices allocated to them
    lost: tuple[str, ...]  # UUIDs of lost GPUs under them
    hang_hint: tuple[str, ...]  # UUIDs busy-but-cold for the sustain window
    utilization: float | None  # mean ratio over devices that report it
    power_w: float | None  # mean watts per device
    power_limit_w: float | None
    xids: tuple[int, ...]
    read_at: datetime | None  # the oldest reading used


def gpu_summary(evidence: Iterable[PodGpuEvidence], pods: Iterable[tuple[str, str]], now: datetime,
                max_age: timedelta) -> GpuSummary:
    """Fresh GPU evidence for the (namespace, pod) pairs of one run; one record per pod (newest)."""
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
