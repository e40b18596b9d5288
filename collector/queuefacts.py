"""Records of a run's place in its Kueue queue: what Kueue's visibility API says about the queue, and
what the collector makes of it (position, the workloads ahead, the quota that is not free, an
estimate of the time to admission). Frozen records; no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class PendingItem:
    """One item of a PendingWorkloadsSummary (visibility.kueue.x-k8s.io)."""

    namespace: str
    name: str
    local_queue: str
    priority: int
    position_cq: int  # 0-based
    position_lq: int  # 0-based


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """A queue's pending Workloads, as the visibility API answered at `read_at` (the server's clock)."""

    queue: str  # "ClusterQueue/NAME" or "LocalQueue/NS/NAME"
    items: tuple[PendingItem, ...]
    read_at: datetime


@dataclass(frozen=True, slots=True)
class AdmissionEta:
    """An estimate of the time until admission, never a promise: a band at `level` and its middle, or
    unknown (`low_s` None) when the queue's history is too short to say."""

    low_s: float | None
    mid_s: float | None
    high_s: float | None
    level: float  # the band's stated coverage, e.g. 0.8
    basis: str  # what it rests on, in words

    @property
    def known(self) -> bool:
        return self.low_s is not None

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return {"estimate": "known" if self.known else "unknown", "low_seconds": r(self.low_s),
                "mid_seconds": r(self.mid_s), "high_seconds": r(self.high_s), "level": self.level,
                "basis": self.basis}


@dataclass(frozen=True, slots=True)
class AheadWorkload:
    """A workload ahead of the run in its ClusterQueue, and what it requests in all."""

    namespace: str
    name: str
    priority: int
    position_cq: int
    requests: tuple[tuple[str, float], ...]  # resource → total over its pod sets; () when not observed

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "priority": self.priority,
                "position_in_cluster_queue": self.position_cq, "requests": dict(self.requests)}


@dataclass(frozen=True, slots=True)
class QuotaShort:
    """Quota the run needs that is not free now, in one flavor of its ClusterQueue."""

    flavor: str
    resource: str
    needed: float  # the run's total request
    free: float  # nominal quota minus what is reserved (borrowing aside)
    nominal: float

    @property
    def short(self) -> float:
        return max(0.0, self.needed - self.free)

    def to_json(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "resource": self.resource, "needed": self.needed, "free": self.free,
                "nominal": self.nominal, "short": self.short}


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Where a run blocked in queue admission stands in its queue."""

    cluster_queue: str
    local_queue: str
    workload: str
    position_cq: int | None  # None: the visibility API was not read (refused, not served) or lists it not
    position_lq: int | None
    pending_cq: int | None  # pending workloads in the ClusterQueue, as the visibility API listed them
    ahead: tuple[AheadWorkload, ...]  # the first few ahead, in order
    short: tuple[QuotaShort, ...]
    eta: AdmissionEta
    source: str  # where the position came from, or why there is none

    def to_json(self) -> dict[str, Any]:
        return {"cluster_queue": self.cluster_queue, "local_queue": self.local_queue, "workload": self.workload,
                "position_in_cluster_queue": self.position_cq, "position_in_local_queue": self.position_lq,
                "pending_in_cluster_queue": self.pending_cq, "ahead": [a.to_json() for a in self.ahead],
                "quota_short": [s.to_json() for s in self.short], "admission_eta": self.eta.to_json(),
                "source": self.source}


_SUFFIX = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60}


def quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity ("8", "500m", "16Gi", "1e3", 4) as a number; None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    s = value.strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E"):
        if s.endswith(suffix):
            try:
                scaled = float(s[: -len(suffix)]) * _SUFFIX[suffix]
            except ValueError:
                return None
            return scaled if math.isfinite(scaled) else None
    try:
        out = float(s)
    except ValueError:
        return None
    return out if math.isfinite(out) else None
