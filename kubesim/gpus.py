"""Simulated GPU readings of training runs: what NVML on each node would read (issue 28).

A run's train step (`train` with `gpus: true`) plays its pods' GPUs: every GPU of a rank in
lockstep computes for its rank's share of the step and waits in the collective for the rest, so
its SM activity and power follow its busy share; clocks, memory bandwidth use, PCIe and NVLink
traffic and the total energy counter follow from them. Healthy GPUs differ a little for good (the
silicon lottery: power within a few %, clocks within 1 %) and jitter per step; NVML's PCIe reading
is a short sample and jitters more.

A throttling GPU (`throttleGpu`: the straggler pod's GPU index) is the straggler's cause: while
its rank is slow its SM clock drops by the slowdown (a 25 % slower GPU clocks 1/1.25 of the others),
its power by more (dynamic power goes with the clock and the square of the voltage), its clocks-event reasons
name the slowdown (thermal or power brake), and it moves memory at its lower clock's pace; the
other GPUs of the run wait for it, so their busy share falls together.

Truth and readings only: nothing here is served through the Kubernetes API (the bench hands the
readings to the real agent's sampler through its fake NVML).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

SM_MHZ = 1980.0
LIMIT_W = 700.0
IDLE_W = 95.0
PEAK_W = 650.0
MEM_UTIL = 0.55  # share of time memory is read or written at full SM activity
PCIE_BPS = 3e9  # host traffic per GPU (input batches, logging), bytes/s, TX + RX
NVLINK_BYTES = 40e9  # gradients all-reduced per GPU per step, TX and RX each
# nvmlClocksEventReasons bits a throttling GPU sets
HW_THERMAL, SW_THERMAL, POWER_BRAKE, SW_POWER_CAP = 0x40, 0x20, 0x80, 0x4


def gpu_uuid(node: str, index: int) -> str:
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(slots=True)
class SimGpu:
    """One GPU: its identity, its counters, and its latest instantaneous readings (NVML's units)."""

    uuid: str
    index: int
    node: str
    pod: str
    power_bias: float = 1.0  # for good: the silicon lottery
    clock_bias: float = 1.0
    energy_mj: int = 0
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    util: int = 0  # percent
    mem_util: int = 0  # percent
    power_mw: int = int(IDLE_W * 1000)
    limit_mw: int = int(LIMIT_W * 1000)
    sm_mhz: int = int(SM_MHZ)
    gpm_sm: float = 0.0  # percent
    pcie_kbs: tuple[int, int] = (0, 0)
    reasons: int = 0x1  # idle
    throttled: bool = False  # truth: this GPU is throttling now


@dataclass(slots=True)
class GpuPlay:
    """The GPUs of one run's pods, by pod name."""

    rng: random.Random
    jitter: float = 0.02  # per step, on activity and power
    sm_level: float = 0.85  # the run's SM activity at full busy share
    pods: dict[str, list[SimGpu]] = field(default_factory=dict)
    throttle_pod: str = ""
    throttle_index: int = -1
    throttle_reason: int = HW_THERMAL | SW_THERMAL

    def gpus_of(self, pod: str, node: str, count: int) -> list[SimGpu]:
        have = self.pods.get(pod)
        if have is None or (have and have[0].node != node):
            have = self.pods[pod] = [
                SimGpu(gpu_uuid(node, i), i, node, pod, power_bias=self.rng.uniform(0.97, 1.03),
                       clock_bias=self.rng.uniform(0.99, 1.0), energy_mj=self.rng.randrange(10**9, 10**11),
                       nvlink_tx_kib=self.rng.randrange(10**9), nvlink_rx_kib=self.rng.randrange(10**9))
                for i in range(count)]
        return have

    def truth(self) -> SimGpu | None:
        """The throttling GPU while it throttles."""
        return next((g for gs in self.pods.values() for g in gs if g.throttled), None)

    def step(self, pods: list[tuple[str, str, int, float]], delay: float, slow: bool, slower: float) -> None:
        """One lockstep step of `delay` seconds: each (pod, node, GPUs, compute seconds) computed for
        its share and waited in the collective for the rest."""
        rng, j = self.rng, self.jitter
        pcie = PCIE_BPS * rng.uniform(0.9, 1.1)  # the run's input rate this step
        for pod, node, count, compute in pods:
            for g in self.gpus_of(pod, node, count):
                throttled = slow and pod == self.throttle_pod and g.index == self.throttle_index
                busy = 1.0 if throttled else min(1.0, compute / (1 + slower if pod == self.throttle_pod and slow
                                                                  else 1.0) / delay)
                act = max(0.0, min(1.0, busy * rng.uniform(1 - j, 1 + j)))
                watts = (IDLE_W + (PEAK_W - IDLE_W) * act) * g.power_bias * rng.uniform(1 - j / 2, 1 + j / 2)
                mhz = SM_MHZ * g.clock_bias * rng.uniform(0.997, 1.0)
                mem = MEM_UTIL * act
                reasons = 0
                if throttled:
                    mhz /= 1 + slower
                    watts *= (1 + slower) ** -2.5  # dynamic power ~ f·V², the voltage down with the clock
                    mem /= 1 + slower
                    reasons = self.throttle_reason
                elif watts >= 0.97 * LIMIT_W:
                    reasons = SW_POWER_CAP
                g.throttled = throttled
                g.util = 100 if busy > 0 else 0  # NCCL's kernels keep a waiting GPU "utilized"
                g.gpm_sm = 100 * (self.sm_level * act + 0.04 * (1 - act))
                g.power_mw = int(min(watts, LIMIT_W) * 1000)
                g.sm_mhz = int(mhz)
                g.mem_util = int(round(100 * mem))
                g.reasons = reasons
                rate = pcie * rng.uniform(0.6, 1.4) / 1024  # NVML's PCIe reading: a 20 ms sample
                g.pcie_kbs = (int(rate * 0.2), int(rate * 0.8))
                g.energy_mj += int(g.power_mw * delay)
                kib = int(NVLINK_BYTES / 1024)
                g.nvlink_tx_kib += kib
                g.nvlink_rx_kib += kib
