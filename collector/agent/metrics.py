"""The agent's Prometheus families, rendered from one snapshot per scrape (docs/metrics.md, "Node agent").

Per-GPU families carry `gpu` (NVML index), `uuid`, and the holder's `pod`, `namespace`,
`container` from the cached pod-resources answer: empty when no pod holds the device, and empty
too when several pods share it (time-slicing, MPS, a shared ResourceClaim): a shared GPU's
readings are the sum of its sharers' work, so they are not credited to any one of them;
`taugrid_gpu_sharers` counts the pods and `taugrid_gpu_allocation{shared="true"}` names them.
A MIG instance is its own series with `uuid` the MIG UUID and `gpu` its parent's index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collector.agent.evidence import Snapshot
from collector.agent.nvml import CLOCKS_EVENT_REASONS, GpuReading
from collector.agent.podresources import Allocation
from collector.agent.podresources.dra import REASONS
from collector.progress.xid import describe

GPU_LABELS = ["gpu", "uuid", "pod", "namespace", "container"]


class AgentHealth:
    """Counters the agent's threads own, read at scrape time."""

    def __init__(self) -> None:
        self.nvml_errors: Callable[[], int] = lambda: 0
        self.podresources_errors: Callable[[], int] = lambda: 0
        self.kmsg: Callable[[], tuple[bool, int, int]] = lambda: (False, 0, 0)  # up, records, malformed
        self.logs: Callable[[], tuple[int, int, dict[str, int]]] = lambda: (0, 0, {})  # followed, lines, problems
        self.sample_seconds: Callable[[], float] = lambda: 0.0
        self.xid_counts: Callable[[], dict[tuple[str, int, str], int]] = dict
        self.podresources_rejected: Callable[[], dict[str, int]] = dict  # names cut or cleaned, by reason
        self.dra_unresolved: Callable[[], int] = lambda: 0


def _directed(name: str, doc: str, gpus: list[GpuReading], labels: Callable[[GpuReading], list[str]],
              value: Callable[[GpuReading], tuple[float | None, float | None]]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, "direction"])
    for r in gpus:
        for direction, v in zip(("tx", "rx"), value(r), strict=True):
            if v is not None:
                g.add_metric([*labels(r), direction], v)
    return g


class AgentCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot], health: AgentHealth) -> None:
        self._snapshot = snapshot
        self._health = health

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        h = self._health
        holders: dict[str, Allocation] = {}
        sharers: dict[str, set[tuple[str, str]]] = {}
        for a in sorted(snap.allocations, key=lambda a: (a.namespace, a.pod, a.container)):
            holders.setdefault(a.device, a)
            sharers.setdefault(a.device, set()).add((a.namespace, a.pod))

        def labels(r: GpuReading) -> list[str]:
            a = holders.get(r.uuid) if len(sharers.get(r.uuid, ())) == 1 else None  # shared: no one pod's
            return [str(r.index), r.uuid, a.pod if a else "", a.namespace if a else "", a.container if a else ""]

        def gauge(name: str, doc: str, value: Callable[[GpuReading], float | int | bool | None],
                  unit_scale: float = 1.0) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for r in snap.gpus:
                v = value(r)
                if v is not None:
                    g.add_metric(labels(r), float(v) * unit_scale)
            return g

        gpus = [r for r in snap.gpus if not r.parent_uuid]
        yield gauge("taugrid_gpu_utilization_ratio", "Share of time a kernel ran (NVML), 0-1.", lambda r: r.utilization)
        yield gauge("taugrid_gpu_sm_active_ratio", "Share of SMs busy (NVML GPM), 0-1; absent where not offered.",
                    lambda r: r.sm_active)
        yield gauge("taugrid_gpu_memory_used_bytes", "Device memory used.", lambda r: r.memory_used_bytes)
        yield gauge("taugrid_gpu_memory_capacity_bytes", "Device memory size.", lambda r: r.memory_total_bytes)
        yield gauge("taugrid_gpu_power_watts", "Power draw.", lambda r: r.power_w)
        yield gauge("taugrid_gpu_power_limit_watts", "Enforced power limit.", lambda r: r.power_limit_w)
        yield gauge("taugrid_gpu_temperature_celsius", "GPU core temperature.", lambda r: r.temperature_c)
        yield gauge("taugrid_gpu_sm_clock_hertz", "SM clock.", lambda r: r.sm_clock_hz)
        yield gauge("taugrid_gpu_memory_clock_hertz", "Memory clock.", lambda r: r.memory_clock_hz)
        yield gauge("taugrid_gpu_memory_utilization_ratio",
                    "Share of time device memory was read or written (NVML), 0-1: memory bandwidth use.",
                    lambda r: r.memory_util)
        yield _directed("taugrid_gpu_pcie_bytes_per_second", "PCIe throughput (NVML, a short sample), by direction.",
                        gpus, labels, lambda r: (r.pcie_tx_bps, r.pcie_rx_bps))
        yield _directed("taugrid_gpu_nvlink_bytes_per_second",
                        "NVLink data throughput over all links since the previous sample, by direction.",
                        gpus, labels, lambda r: (r.nvlink_tx_bps, r.nvlink_rx_bps))
        energy = CounterMetricFamily("taugrid_gpu_energy_joules",
                                     "Energy the GPU used since the driver loaded (NVML total energy counter).",
                                     labels=GPU_LABELS)
        for r in gpus:
            if r.energy_mj is not None:
                energy.add_metric(labels(r), r.energy_mj / 1000.0)
        yield energy
        yield gauge("taugrid_gpu_lost", "1 when NVML says the GPU is lost (fallen off the bus).",
                    lambda r: r.lost if not r.parent_uuid else None)
        yield gauge("taugrid_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.",
                    lambda r: r.remap_pending)
        yield gauge("taugrid_gpu_row_remap_failed", "1 when a row remap failed (replace the GPU).",
                    lambda r: r.remap_failed)
        hang = GaugeMetricFamily("taugrid_gpu_hang_hint",
                                 "1 when utilization stayed high while power and SM activity stayed low for the "
                                 "sustain window (suspected collective hang).", labels=GPU_LABELS)
        for r in gpus:
            if r.lost or r.utilization is None:
                continue
            since = snap.hang_since.get(r.uuid)
            hang.add_metric(labels(r), 1.0 if since is not None and snap.at - since >= snap.hang_sustain_s else 0.0)
        yield hang
        reasons = GaugeMetricFamily("taugrid_gpu_clocks_event_active",
                                    "1 while a clocks-event (throttle) reason holds clocks down.",
                                    labels=[*GPU_LABELS, "reason"])
        # Cumulative device counts are counters (exposed with `_total`): NVML's volatile ones restart
        # at a driver reload or GPU reset, which rate() and increase() read as a counter reset.
        ecc = CounterMetricFamily("taugrid_gpu_ecc_errors", "ECC error counts by type and counter (NVML).",
                                  labels=[*GPU_LABELS, "error_type", "scope"])
        rows = CounterMetricFamily("taugrid_gpu_remapped_rows", "Rows remapped, by cause.",
                                   labels=[*GPU_LABELS, "error_type"])
        nvlink = CounterMetricFamily("taugrid_gpu_nvlink_errors", "NVLink error totals over all links, by type.",
                                     labels=[*GPU_LABELS, "error_type"])
        for r in gpus:
            lab = labels(r)
            if r.clocks_event_reasons is not None:
                for bit, name in CLOCKS_EVENT_REASONS:
                    reasons.add_metric([*lab, name], 1.0 if r.clocks_event_reasons & bit else 0.0)
            for etype, scope, n in r.ecc:
                ecc.add_metric([*lab, etype, scope], float(n))
            if r.remapped_correctable is not None:
                rows.add_metric([*lab, "correctable"], float(r.remapped_correctable))
            if r.remapped_uncorrectable is not None:
                rows.add_metric([*lab, "uncorrectable"], float(r.remapped_uncorrectable))
            for etype, n in r.nvlink_errors:
                nvlink.add_metric([*lab, etype], float(n))
        yield from (reasons, ecc, rows, nvlink)

        alloc = GaugeMetricFamily("taugrid_gpu_allocation",
                                  "1 per device a container holds (kubelet pod-resources: device plugins and "
                                  "ResourceClaims); shared: time-slicing/MPS replica, DRA share, or several pods.",
                                  labels=["uuid", "resource_name", "pod", "namespace", "container", "resource_claim",
                                          "shared"])
        for a in snap.allocations:
            shared = a.shared or len(sharers.get(a.device, ())) > 1
            alloc.add_metric([a.device, a.resource, a.pod, a.namespace, a.container, a.claim,
                              "true" if shared else "false"], 1.0)
        yield alloc
        count = GaugeMetricFamily("taugrid_gpu_sharers", "Pods holding this GPU or MIG instance (over 1: shared).",
                                  labels=["gpu", "uuid"])
        for r in snap.gpus:
            count.add_metric([str(r.index), r.uuid], float(len(sharers.get(r.uuid, ()))))
        yield count

        xid = CounterMetricFamily("taugrid_gpu_xid_errors", "XID events since the agent started.",
                                  labels=["uuid", "code", "origin"])
        codes = set()
        for (dev, code, origin), n in sorted(h.xid_counts().items()):
            xid.add_metric([dev, str(code), origin], float(n))
            codes.add(code)
        yield xid
        info = GaugeMetricFamily("taugrid_gpu_xid_info", "Meaning and recommended action of each XID code seen.",
                                 labels=["code", "meaning", "action"])
        for code in sorted(codes):
            meaning, action = describe(code)
            info.add_metric([str(code), meaning, action], 1.0)
        yield info

        # --- the agent's own health ---
        up = GaugeMetricFamily("taugrid_agent_nvml_up", "1 when NVML is initialized and answering.",
                               labels=["state"])
        up.add_metric([snap.nvml.state], 1.0 if snap.nvml.state == "ok" else 0.0)
        yield up
        yield GaugeMetricFamily("taugrid_agent_gpus", "Physical GPUs NVML reports.", value=len(gpus))
        yield CounterMetricFamily("taugrid_agent_nvml_errors", "NVML calls that failed (NOT_SUPPORTED aside).",
                                  value=h.nvml_errors())
        yield GaugeMetricFamily("taugrid_agent_sample_duration_seconds", "Time the last NVML sampling pass took.",
                                value=h.sample_seconds())
        yield GaugeMetricFamily("taugrid_agent_podresources_up", "1 when the last pod-resources List succeeded.",
                                value=1.0 if snap.podresources_up else 0.0)
        yield GaugeMetricFamily("taugrid_agent_podresources_last_success_timestamp_seconds",
                                "When pod-resources List last succeeded, unix seconds.",
                                value=snap.podresources_last_success)
        yield CounterMetricFamily("taugrid_agent_podresources_errors", "Failed pod-resources List calls.",
                                  value=h.podresources_errors())
        rejected = CounterMetricFamily("taugrid_agent_podresources_rejected",
                                       "Names in pod-resources answers cut or cleaned, or entries dropped, by reason.",
                                       labels=["reason"])
        counts = h.podresources_rejected()
        for reason in REASONS:
            rejected.add_metric([reason], float(counts.get(reason, 0)))
        yield rejected
        yield GaugeMetricFamily("taugrid_agent_dra_unresolved_devices",
                                "ResourceClaim devices held on this node that no GPU UUID was found for.",
                                value=h.dra_unresolved())
        kup, records, malformed = h.kmsg()
        yield GaugeMetricFamily("taugrid_agent_kmsg_up", "1 while the kernel log is being followed.",
                                value=1.0 if kup else 0.0)
        yield CounterMetricFamily("taugrid_agent_kmsg_records", "Kernel log records read.", value=records)
        yield CounterMetricFamily("taugrid_agent_kmsg_malformed", "Kernel log records that did not parse (skipped).",
                                  value=malformed)
        followed, lines, problems = h.logs()
        yield GaugeMetricFamily("taugrid_agent_log_containers", "Containers whose logs are followed.", value=followed)
        yield CounterMetricFamily("taugrid_agent_log_lines", "Container log lines read.", value=lines)
        prob = CounterMetricFamily("taugrid_agent_log_problems", "Log files rotated, truncated, deleted, malformed...",
                                   labels=["problem"])
        for kind, n in sorted(problems.items()):
            prob.add_metric([kind], float(n))
        yield prob
