"""Hang hint per GPU (pure): utilization high while power and SM activity stay low, sustained.

NVML utilization is the share of time any kernel ran; a rank spinning in a hung NCCL collective
keeps it near 100% while the GPU draws little power and its SMs do little work. Busy-but-cold for
`sustain_s` is the hint; one reading that is not busy-and-cold (or lacks the readings to judge)
ends it.
"""

from __future__ import annotations

from collector.agent.nvml import GpuReading
from collector.agent.settings import HangSettings


def busy_and_cold(r: GpuReading, s: HangSettings) -> bool | None:
    """True/False, or None when the reading cannot tell (no utilization, or neither power nor SM)."""
    if r.lost or r.utilization is None:
        return None
    if r.utilization < s.busy_utilization:
        return False
    cold: list[bool] = []
    if r.power_w is not None and r.power_limit_w:
        cold.append(r.power_w < s.cold_power_ratio * r.power_limit_w)
    if r.sm_active is not None:
        cold.append(r.sm_active < s.cold_sm_active)
    if not cold:
        return None
    return all(cold)


class HangHints:
    """Since when each GPU has been busy-and-cold; `update` once per sample."""

    def __init__(self, settings: HangSettings) -> None:
        self.s = settings
        self._since: dict[str, float] = {}

    def update(self, readings: tuple[GpuReading, ...]) -> None:
        seen = set()
        for r in readings:
            if r.parent_uuid:
                continue
            seen.add(r.uuid)
            if busy_and_cold(r, self.s):
                self._since.setdefault(r.uuid, r.at)
            else:
                self._since.pop(r.uuid, None)
        for gone in set(self._since) - seen:
            del self._since[gone]

    def since(self, uuid: str) -> float | None:
        """When the GPU started looking busy-and-cold (None: it does not)."""
        return self._since.get(uuid)

    def hinted(self, uuid: str, now: float) -> bool:
        t = self._since.get(uuid)
        return t is not None and now - t >= self.s.sustain_s
