"""Devices allocated through Dynamic Resource Allocation (DRA), as pod-resources names them, and
the names the kubelet and the drivers hand over, bounded before anything keeps them.

pod-resources v1 gives each container's ResourceClaims (`dynamic_resources`): per allocated device
the driver, pool and device name of the driver's ResourceSlice (kubelets from 1.31), and the CDI
device names the runtime injected. A GPU UUID is found, in this order:

1. in the names themselves: drivers that name devices by UUID (`GPU-…`, `MIG-…`);
2. in the node's ResourceSlices (`collector.agent.draslices`): the device's `uuid` attribute,
   which the NVIDIA DRA driver publishes for GPUs and MIG instances alike;
3. from the NVIDIA driver's naming convention and NVML: a whole GPU is `gpu-<minor>`, a MIG
   instance `gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>`, the very
   identity the driver itself looks the instance up by.

A device none of these resolves stays an allocation with `resolved=False` (the pod holds a device
the agent cannot name) and is counted, never guessed.

Every name that reaches a label, a log line or the evidence document is bounded here: cut to a
length limit and stripped of unprintable characters, each such change counted by a fixed reason.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

# Upper bounds on what one List answer may make the agent keep.
MAX_NAME = 253  # a Kubernetes object name (pods, claims, namespaces, pools)
MAX_RESOURCE = 253  # resource and driver names
MAX_CDI = 512  # one CDI device name ("vendor/class=name")
MAX_ALLOCATIONS = 4096  # device allocations per node; more is a broken or hostile answer
MAX_CDI_PER_DEVICE = 16

REASONS = ("too-long", "unprintable", "too-many", "malformed")

# GPU and MIG UUIDs as NVML spells them; a MIG instance of drivers before R470 is
# "MIG-GPU-<uuid>/<gi>/<ci>".
_HEX = r"[0-9a-fA-F]"
_UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
UUID_RE = re.compile(rf"(?:MIG-GPU-{_UUID}/\d{{1,3}}/\d{{1,3}}|(?:GPU|MIG)-{_UUID})")
# The NVIDIA DRA driver's CDI device name: "<claim UID>-<device name>"
_CLAIM_PREFIX = re.compile(rf"^{_UUID}-(.+)$")
_MINOR_NAME = re.compile(r"^gpu-(\d{1,3})$")
_MIG_NAME = re.compile(r"^gpu-(\d{1,3})-mig-.{1,64}-(\d{1,4})-(\d{1,3})$")

# DRA drivers whose devices are GPUs (the NVIDIA driver; "gpu.resource.nvidia.com" before 2024).
GPU_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com", "gpu.resource.nvidia.com")
NVIDIA_DRIVERS = frozenset(GPU_DRIVERS)


class Bounds:
    """Cuts and cleans names, counting each change by reason (`rejected`)."""

    def __init__(self) -> None:
        self.rejected: Counter[str] = Counter()

    def name(self, text: str, limit: int = MAX_NAME) -> str:
        if not text.isprintable():
            self.rejected["unprintable"] += 1
            text = "".join(c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text[:limit * 2])
        if len(text) > limit:
            self.rejected["too-long"] += 1
            text = text[:limit - 1] + "\N{HORIZONTAL ELLIPSIS}"
        return text


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device a container holds: through a device plugin (`resource`, `device`) or a
    ResourceClaim (`claim`, `driver`, `pool`, `dra_device`; `resource` is then the driver)."""

    namespace: str
    pod: str
    container: str
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"; a DRA driver ("gpu.nvidia.com")
    device: str  # a GPU or MIG UUID (a `::N` replica suffix removed); unresolved DRA: "driver/pool/device"
    claim: str = ""  # "namespace/name" of the ResourceClaim (DRA)
    driver: str = ""
    pool: str = ""
    dra_device: str = ""  # the device's name in the driver's ResourceSlice
    shared: bool = False  # allocated as a share: a time-slicing or MPS replica, or a DRA share_id
    resolved: bool = True  # False: a DRA device no GPU UUID was found for


def literal_uuid(*names: str) -> str:
    """A GPU or MIG UUID written in one of `names` ("" when none is)."""
    for n in names:
        m = UUID_RE.search(n)
        if m:
            return m.group(0)
    return ""


def device_from_cdi(cdi: str) -> str:
    """The driver's device name inside a CDI name of the NVIDIA driver's form
    "k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0" ("" when the name is not of that form)."""
    _, sep, name = cdi.partition("=")
    if not sep:
        return ""
    m = _CLAIM_PREFIX.match(name)
    return m.group(1) if m else name


def driver_from_cdi(cdi: str) -> str:
    """"k8s.gpu.nvidia.com/claim=…" → "gpu.nvidia.com" (the NVIDIA driver's CDI vendor is "k8s." + its name)."""
    vendor = cdi.partition("/")[0]
    return vendor[4:] if vendor.startswith("k8s.") else vendor


SliceIndex = Mapping[tuple[str, str, str], str]  # (driver, pool, device name) → UUID
MigIndex = Mapping[tuple[int, int, int], str]  # (parent minor, GI profile id, placement start) → MIG UUID


class DraResolver:
    """Gives each DRA allocation the GPU UUID behind it, from ResourceSlices (`slices`, read on
    demand) and NVML (`minors`, `migs`); what none of them names stays unresolved."""

    def __init__(self, minors: Callable[[], Mapping[int, str]], slices: Callable[[], SliceIndex] | None = None,
                 migs: Callable[[], MigIndex] | None = None) -> None:
        self._minors = minors
        self._slices = slices
        self._migs = migs
        self.unresolved = 0  # in the last answer

    def __call__(self, allocs: tuple[Allocation, ...]) -> tuple[Allocation, ...]:
        if all(a.resolved for a in allocs):
            self.unresolved = 0
            return allocs
        index: SliceIndex = self._slices() if self._slices is not None else {}
        minors = self._minors()
        migs = self._migs() if self._migs is not None else {}
        out = []
        for a in allocs:
            if not a.resolved:
                uuid = self._resolve(a, index, minors, migs)
                if uuid:
                    a = replace(a, device=uuid, resolved=True)
            out.append(a)
        self.unresolved = sum(1 for a in out if not a.resolved)
        return tuple(out)

    @staticmethod
    def _resolve(a: Allocation, index: SliceIndex, minors: Mapping[int, str], migs: MigIndex) -> str:
        uuid = index.get((a.driver, a.pool, a.dra_device), "")
        if not uuid and not a.pool:  # a kubelet before 1.31 names no pool: unique on this node
            found = {u for (d, _, n), u in index.items() if d == a.driver and n == a.dra_device}
            uuid = found.pop() if len(found) == 1 else ""
        if uuid:
            return uuid
        if a.driver not in NVIDIA_DRIVERS:
            return ""
        if m := _MINOR_NAME.match(a.dra_device):
            return minors.get(int(m.group(1)), "")
        if m := _MIG_NAME.match(a.dra_device):
            return migs.get((int(m.group(1)), int(m.group(2)), int(m.group(3))), "")
        return ""
