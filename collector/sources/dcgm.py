"""dcgm-exporter as a GPU source: its `/metrics` exposition → per-GPU readings and per-pod evidence.

Label spellings differ across dcgm-exporter versions and configurations, all accepted here:
`UUID`/`uuid`, `Hostname`/`hostname`, `pod`/`pod_name`, `namespace`/`pod_namespace`,
`container`/`container_name` (old `--kubernetes-gpu-id-type` era), metric names upper or lower case,
MIG instances as `GPU_I_PROFILE`/`GPU_I_ID`, and empty pod labels when pod attribution is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from collector.gpu import GpuDevice, PodGpuEvidence


class DcgmError(Exception):
    pass


@dataclass(slots=True)
class DcgmGpu:
    """One GPU (or MIG instance) held by one container (or by none: empty pod)."""

    uuid: str
    gpu: str = ""
    host: str = ""
    model: str = ""
    mig_profile: str = ""
    mig_instance: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    values: dict[str, float] = field(default_factory=dict)  # DCGM_FI_* name (upper case) → value

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    gpus: tuple[DcgmGpu, ...]
    problems: tuple[str, ...]


def _label(labels: Mapping[str, str], *names: str) -> str:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return ""


def parse_dcgm(text: str, *, source: str = "dcgm-exporter") -> DcgmScrape:
    """Every `DCGM_FI_*` series with a GPU UUID, grouped by (GPU, MIG instance, pod, container).

    A body that stops parsing midway keeps what parsed before, with the problem named.
    """
    gpus: dict[tuple[str, str, str, str, str], DcgmGpu] = {}
    problems: list[str] = []
    no_uuid = 0
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name = s.name.upper()
                if not name.startswith("DCGM_FI_") or name.endswith("_CREATED"):
                    continue
                lab = s.labels
                uuid = _label(lab, "UUID", "uuid")
                if not uuid:
                    no_uuid += 1
                    continue
                pod = _label(lab, "pod", "pod_name")
                ns = _label(lab, "namespace", "pod_namespace")
                container = _label(lab, "container", "container_name")
                gi = _label(lab, "GPU_I_ID", "gpu_i_id")
                key = (uuid, gi, ns, pod, container)
                g = gpus.get(key)
                if g is None:
                    g = gpus[key] = DcgmGpu(
                        uuid=uuid, gpu=_label(lab, "gpu"), host=_label(lab, "Hostname", "hostname"),
                        model=_label(lab, "modelName", "modelname"),
                        mig_profile=_label(lab, "GPU_I_PROFILE", "gpu_i_profile"), mig_instance=gi,
                        pod=pod, namespace=ns, container=container)
                base = name[:-6] if name.endswith("_TOTAL") and fam.type == "counter" else name
                g.values[base] = float(s.value)
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        problems.append(f"{source}: exposition stops parsing ({type(e).__name__}: {str(e)[:120]}); "
                        f"kept {len(gpus)} GPU series before it")
    if no_uuid:
        problems.append(f"{source}: {no_uuid} DCGM series without a GPU UUID label skipped")
    return DcgmScrape(tuple(gpus.values()), tuple(problems))


def _ratio(v: float | None, scale: float) -> float | None:
    return None if v is None else max(0.0, min(1.0, v / scale))


def to_device(g: DcgmGpu) -> GpuDevice:
    # GPU_UTIL is a percent; PROF_* activities are ratios. XID_ERRORS holds the last XID's code (0: none).
    xid = g.get("DCGM_FI_DEV_XID_ERRORS")
    return GpuDevice(
        uuid=g.uuid,
        index=int(g.gpu) if g.gpu.isdigit() else None,
        utilization=_ratio(g.get("DCGM_FI_DEV_GPU_UTIL"), 100.0),
        sm_active=_ratio(g.get("DCGM_FI_PROF_SM_ACTIVE"), 1.0),
        power_w=g.get("DCGM_FI_DEV_POWER_USAGE"),
        power_limit_w=g.get("DCGM_FI_DEV_POWER_MGMT_LIMIT") or g.get("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
        xids=(int(xid),) if xid else (),
        mig_profile=g.mig_profile,
    )


def pod_evidence(scrape: DcgmScrape, *, node: str, read_at: datetime) -> tuple[PodGpuEvidence, ...]:
    """Per-pod GPU evidence from one scrape; series with empty pod labels are no pod's evidence."""
    by: dict[tuple[str, str], tuple[list[GpuDevice], set[str]]] = {}
    for g in scrape.gpus:
        if not g.pod:
            continue
        devs, containers = by.setdefault((g.namespace, g.pod), ([], set()))
        devs.append(to_device(g))
        if g.container:
            containers.add(g.container)
    return tuple(
        PodGpuEvidence(ns, pod, node, "dcgm", read_at, tuple(devs), tuple(sorted(containers)))
        for (ns, pod), (devs, containers) in sorted(by.items())
    )


def read_dcgm(url: str, *, pool: urllib3.PoolManager | None = None, timeout_s: float = 5.0,
              max_body: int = 16 << 20) -> DcgmScrape:
    """GET one dcgm-exporter endpoint (bounded body) and parse it; DcgmError when it cannot be read."""
    pool = pool or urllib3.PoolManager()
    try:
        resp = pool.request("GET", url, timeout=urllib3.Timeout(total=timeout_s), retries=False,
                            preload_content=False, redirect=False)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise DcgmError(f"{url}: {type(e).__name__}: {e}") from e
    try:
        body = resp.read(max_body + 1)
    finally:
        resp.release_conn()
    if resp.status != 200:
        raise DcgmError(f"{url}: HTTP {resp.status}")
    if len(body) > max_body:
        raise DcgmError(f"{url}: body over the {max_body:,} byte limit")
    return parse_dcgm(body.decode("utf-8", "replace"), source=url)
