"""Node agent settings, grouped and passed explicitly; nothing here reads the environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from collector.agent.cri import CHUNK_BYTES


@dataclass(frozen=True, slots=True)
class HangSettings:
    """Hang hint per GPU: NVML utilization stays near 100% in a hung NCCL collective (the SMs spin
    on a flag) while power and SM activity fall, so busy-but-cold for long enough is the hint."""

    busy_utilization: float = 0.80  # utilization ratio at or above which the GPU "looks busy"
    cold_power_ratio: float = 0.40  # power below this share of the enforced limit is "cold"
    cold_sm_active: float = 0.20  # SM activity ratio below this is "cold" (where the driver offers it)
    sustain_s: float = 120.0  # how long busy-and-cold must last


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Node-local container logs (`/var/log/pods/<ns>_<pod>_<uid>/<container>/<N>.log`)."""

    root: Path = Path("/var/log/pods")
    # "gpu": containers of pods that hold GPUs (pod-resources); "all": every pod in `namespaces`.
    scope: str = "gpu"
    namespaces: frozenset[str] = frozenset()  # empty: all namespaces
    poll_s: float = 2.0
    first_read_bytes: int = 1 << 20  # a file first seen is read from its last MiB, not from byte 0
    read_bytes_per_poll: int = 4 << 20  # per file and poll: a burst is read over several polls
    read_chunk_bytes: int = CHUNK_BYTES  # per read: its lines are parsed before the next read (memory)
    max_containers: int = 500
    max_line_bytes: int = 64 << 10
    samples_kept: int = 512  # per container, newest
    findings_kept: int = 64  # hangs and XIDs per container, newest


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str = ""
    address: str = "127.0.0.1:9402"  # the DaemonSet passes $(POD_IP):<port>, with a token
    # /metrics and /evidence require `Authorization: Bearer <this file's token>` (re-read when it
    # changes); TLS with this certificate and key. Beyond loopback a token is required unless
    # `allow_unauthenticated` (a NetworkPolicy alone then guards every tenant's evidence).
    token_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    allow_unauthenticated: bool = False
    sample_interval_s: float = 1.0
    nvml_retry_s: float = 60.0  # how often to retry NVML after it failed to load
    podresources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    podresources_interval_s: float = 10.0
    podresources_timeout_s: float = 2.0
    # Attribution older than this is dropped (fail closed): a kubelet gone for long may have moved pods.
    podresources_max_age_s: float = 120.0
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/",)
    # DRA drivers whose ResourceClaim devices are GPUs (pod-resources `dynamic_resources`)
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com", "gpu.resource.nvidia.com")
    # ResourceSlices read from this API server to name DRA devices' GPU UUIDs ("" off; read only:
    # get/list on resource.k8s.io resourceslices), with this bearer token file and CA bundle.
    api_server: str = ""
    api_token_file: Path | None = None
    api_ca_file: Path | None = None
    resource_slices_interval_s: float = 60.0
    kmsg_path: Path | None = Path("/dev/kmsg")
    state_dir: Path | None = None  # where log offsets persist across restarts (a hostPath)
    hang: HangSettings = field(default_factory=HangSettings)
    logs: LogSettings = field(default_factory=LogSettings)
    xid_events: bool = True  # NVML's XID event thread
