"""Settings, grouped by concern and passed explicitly; nothing here reads the environment."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class TauGridContract:
    """Where the TauGrid adapter finds things (DESIGN.md §2); TauGrid's CRDs are not public."""

    group: str = "taugrid.io"
    version: str = "v1alpha1"  # the API version the controller watches TauGrid's kinds at
    run_kind: str = "TauRun"
    cluster_kind: str = "TauCluster"
    workspace_kind: str = "TauWorkspace"
    cluster_name: str = "cluster"  # the TauCluster singleton whose resolved profiles are authoritative
    run_phase: str = "status.phase"
    run_profile: str = "spec.profile"
    run_workers: str = "spec.workers"
    run_gpus_per_worker: str = "spec.gpusPerWorker"
    run_rayjob_ref: str = "status.rayJobName"
    run_workload_ref: str = "status.workloadName"
    run_cluster: str = "status.cluster"
    run_checkpoints: str = "spec.checkpointUri"  # Expstore location of the run's checkpoints
    run_phases: frozenset[str] = frozenset({"Pending", "Admitted", "Scheduled", "Running", "Succeeded", "Failed"})

    def role_of(self, kind: str, api_version: str) -> str:
        """"TauRun" | "TauCluster" | "TauWorkspace" | "" for an object of this kind/apiVersion."""
        group = api_version.partition("/")[0] if "/" in api_version else ""
        if group and group != self.group:
            return ""
        return {self.run_kind: "TauRun", self.cluster_kind: "TauCluster", self.workspace_kind: "TauWorkspace"}.get(
            kind, ""
        )


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    """Windows and freshness bounds of the claim engine (DESIGN.md §3)."""

    # Evidence whose source last synced longer ago than this is too old to trust.
    evidence_max_age: timedelta = timedelta(minutes=5)
    # TauCluster resolved status older than this fails target resolution closed.
    taucluster_max_age: timedelta = timedelta(minutes=30)
    # A container restart within this window means the run is not (stably) running.
    restart_window: timedelta = timedelta(minutes=10)
    # Progress stall window, per signal: max(stall_multiplier × p99 step interval, stall_floor) + one
    # scrape, where recurring pauses may widen it but never past the ceiling max(stall_floor,
    # stall_multiplier × median, min(stall_ceiling_multiplier × median step interval, stall_window_max)).
    stall_floor: timedelta = timedelta(seconds=60)
    stall_multiplier: float = 3.0
    stall_ceiling_multiplier: float = 10.0
    stall_window_max: timedelta = timedelta(minutes=30)
    # Per workload profile (TauRun spec.profile), the ceiling itself: a profile whose runs pause for
    # long evaluations by design says how long a pause may be before it is a stall.
    stall_ceiling_by_profile: Mapping[str, timedelta] = field(default_factory=dict)
    scrape_interval: timedelta = timedelta(seconds=15)
    # Events older than this are history, not a reason for the current wait.
    event_horizon: timedelta = timedelta(hours=1)
    # A node agent's log increment that can only confirm a progressing run's claims (newer steps of
    # its one progress log, in order, no finding, its nodes' clocks as its last evaluation saw them:
    # collector/planes/signals.py `uneventful`) re-evaluates the run at most this long after its last
    # evaluation (sooner when its claims are due by the clock, or its stall window could close; each
    # run on its own phase of this period, so a fleet evaluated together does not stay in step:
    # `recheck.refresh_due`);
    # anything else still re-evaluates it at once. Meanwhile the export carries the run's last step and
    # its time and loss with each increment (progress_last_step, last_progress_timestamp: step-rate
    # rules and panels see every pass; `ChangeApplier._carry`), and only these figures lag, by at most
    # this much: the logs plane's evidence age (never younger than an evaluation's), the reason's step
    # and age, energy per step, the /runs history's step; and the GPU comparison's notes (a GPU apart
    # while the run keeps its pace, readings not trusted: a slower pace is evaluated at once). A GPU
    # pass whose devices stayed re-evaluates a run not progressing at most this often too (readings
    # word its reason, never what a claim observes: `planes.node_agents.runs_changed`,
    # `runs_not_progressing`). 0: every increment and every pass at once. The full pass, a backstop,
    # leaves a deferred run to its deferral (collector/controller.py `_mark_all`); past 300 s a healthy
    # run's evaluation ages past TaugridClaimsNotEvaluated's threshold (the controller warns as it
    # starts). 240 s: at 50k pods the deferred evaluations were half the loop's idle CPU at 120 s
    # (issue 30, 2026-12-07).
    confirm_refresh: timedelta = timedelta(seconds=240)

    def for_profile(self, profile: str) -> ClaimSettings:
        """These settings for the runs of one profile (its stall ceiling, where it has one)."""
        ceiling = self.stall_ceiling_by_profile.get(profile) if profile else None
        if ceiling is None:
            return self
        return replace(self, stall_window_max=ceiling, stall_ceiling_multiplier=math.inf)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The live controller: loop cadence, log tailing, leader election, export retention."""

    tick: timedelta = timedelta(seconds=5)  # full re-evaluation, so staleness shows without events
    batch_max: int = 5000  # changes applied per loop turn before claims are re-evaluated
    queue_max: int = 20_000  # changes waiting for the loop; reflectors wait when it is full
    min_eval_interval: timedelta = timedelta(milliseconds=50)  # batch changes this long before re-evaluating
    tune_gc: bool = True  # raise the cycle collector's thresholds and freeze the synced index
    # Runs tracked at most, in all and per namespace (0: no cap). Each costs ~16 series (~4.9 KB of
    # /metrics) and its evaluations; runs past a cap are not tracked, and counted by namespace.
    max_runs: int = 10_000
    max_runs_per_namespace: int = 2_000
    watch_timeout_s: int = 300
    # Initial lists as streaming lists (WatchList, `sendInitialEvents`; Kubernetes 1.32+): objects
    # arrive as watch events instead of pages held whole, a lower start-up peak. A server that
    # refuses them (older, or the feature gate off) is listed page by page, as with false.
    stream_lists: bool = False
    log_poll_interval: timedelta = timedelta(seconds=30)
    log_tail_lines: int = 500
    log_limit_bytes: int = 256 * 1024
    # A container whose last read showed no progress is read every this many passes (collector/logrotation.py)
    log_quiet_every: int = 4
    log_poll_concurrency: int = 16  # API log reads in flight (each a kubelet-proxied round trip)
    # The most one API log pass asks of the API server and the kubelets: GETs (a restarted
    # container's previous log counts) and bytes read; 0: no ceiling. Past either, the containers
    # left are read first next pass, each tenant (namespace) an equal share (README, "Log budget").
    log_pass_max_gets: int = 2000
    log_pass_max_bytes: int = 64 << 20
    # No API log read for a run whose running and progressing claims hold past the next pass, until
    # its stall window nears (README, "Log budget"); false: every printing container every pass.
    log_skip_settled: bool = True
    leader_election: bool = True
    lease_namespace: str = ""  # "": the controller's own namespace (its service account's)
    lease_name: str = "taugrid-evidence-controller"
    lease_duration: timedelta = timedelta(seconds=15)
    lease_renew: timedelta = timedelta(seconds=5)
    retention: timedelta = timedelta(minutes=15)  # series of finished runs are dropped after this
    # Which runs get per-run series on /metrics: "all", or "unhealthy" (a healthy run keeps only its
    # newest step; every run is counted in taugrid_fleet_runs). docs/metrics.md, "Large fleets".
    run_series: str = "all"
    checkpoint_poll_interval: timedelta = timedelta(seconds=60)  # 0 turns the Expstore source off
    ray_poll_interval: timedelta = timedelta(seconds=15)  # 0 turns the Ray runtime source off
    ray_progress_counter: str = "ray_train_steps_total"  # a ray.util.metrics Counter("train_steps")
    # Per workload profile (TauRun spec.profile): the Ray counter that counts its steps, and a log
    # regex with a named group `step` (optional `loss`) for trainers the built-in parsers miss.
    ray_counter_by_profile: Mapping[str, str] = field(default_factory=dict)
    log_regex_by_profile: Mapping[str, str] = field(default_factory=dict)
    # "namespace/raycluster" → URL, for port-forwards and tests; otherwise KubeRay's status says where.
    ray_dashboards: Mapping[str, str] = field(default_factory=dict)
    ray_metrics: Mapping[str, str] = field(default_factory=dict)
    cluster_domain: str = "cluster.local"
    # MultiKueue's origin (Kueue's multiKueue.origin): a worker's copy of a Workload is this manager's
    # only when its kueue.x-k8s.io/multikueue-origin label says so (a worker may serve several managers).
    multikueue_origin: str = "multikueue"
    ray_scrape_workers: bool = True  # also scrape each Running worker pod's metrics port (pod IP)
    # Namespaces where Kueue, KubeRay and TauGrid's controllers run: the environment check lists and
    # counts Deployments only there (a tenant's Deployment with Kueue's image is not Kueue), and the
    # chart grants the read only there. Empty: cluster-wide, every Deployment counts.
    environment_namespaces: frozenset[str] = frozenset({"kueue-system", "ray-system", "kuberay-system",
                                                        "kuberay-operator", "taugrid-system"})
    agents: AgentSourceSettings = field(default_factory=lambda: AgentSourceSettings())  # node agents, dcgm


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """Where the collector's storage credentials may go (docs/security.md). Default: nowhere.

    A TauRun's `spec.checkpointUri` is tenant input: it is listed only when it names one of
    `accounts` on the endpoint suffix of one of `clouds` (public, china, usgov), and, when
    `account_namespaces` names the account, only for runs in those namespaces.
    """

    clouds: frozenset[str] = frozenset({"public"})
    accounts: frozenset[str] = frozenset()
    account_namespaces: Mapping[str, str] = field(default_factory=dict)  # account → "ns1,ns2"
    # Directories a local checkpoint path may lie under (a CSI or blobfuse mount); empty: none.
    # Below a root, no link is followed (checked on every read).
    local_roots: frozenset[str] = frozenset()
    # One run's checkpoint listing: at most this many entries, and this long (walks included);
    # past either the listing fails and that run's checkpoint evidence ages out to unknown.
    checkpoint_max_entries: int = 10_000
    checkpoint_list_budget: timedelta = timedelta(seconds=10)
    # Loopback emulator account URLs (Azurite: http://127.0.0.1:10000/devstoreaccount1); tests only.
    emulator_urls: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class BundleSettings:
    """Evidence bundles (exporters/bundles) and lifecycle traces (exporters/otel.py)."""

    # Automatic capture by the controller: on when a directory (local staging and default store) is set.
    directory: str = ""
    tarball: bool = True  # keep each bundle as one .tar.gz (else a directory)
    # Azure Blob store (workload identity); "" keeps bundles in `directory` only.
    blob_account_url: str = ""
    blob_container: str = "evidence-bundles"
    blob_prefix: str = ""
    max_age: timedelta = timedelta(days=14)  # retention by age ...
    max_total_bytes: int = 20 << 30  # ... and by the total size of the store
    max_bundle_bytes: int = 256 << 20  # one bundle; files past it are left out (and listed as missing)
    log_tail_bytes: int = 1 << 20  # per container log (current and previous)
    min_interval_per_run: timedelta = timedelta(minutes=10)  # rate limit per run
    max_per_hour: int = 30  # rate limit for the whole controller
    history_max_bytes: int = 64 << 20  # raw object history kept in memory for bundles
    history_versions: int = 16  # versions kept per object
    # Where runs leave profiles and dumps (a directory template with {namespace} and {run}), and per
    # workload profile (TauRun spec.profile) where that profile says.
    artifacts: str = ""
    artifacts_by_profile: Mapping[str, str] = field(default_factory=dict)
    otlp_endpoint: str = ""  # OTLP/HTTP traces endpoint (…/v1/traces); "" turns traces off


@dataclass(frozen=True, slots=True)
class RedactionSettings:
    """The operator's redaction rules, applied beside the built-in ones (collector/redact.py).

    `patterns`: RE2 regexes; each match, or its group named `mask`, is masked in every output.
    `keys`: names of secrets (case-insensitive; `*` and `?` globs): their whole value is masked,
    in objects (map keys, env names) and in text (`NAME=value`, `NAME: value`, `--name value`).
    """

    patterns: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Settings:
    taugrid: TauGridContract = field(default_factory=TauGridContract)
    claims: ClaimSettings = field(default_factory=ClaimSettings)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    bundles: BundleSettings = field(default_factory=BundleSettings)
    redaction: RedactionSettings = field(default_factory=RedactionSettings)


@dataclass(frozen=True, slots=True)
class AgentSourceSettings:
    """Where the controller finds node agents (the DaemonSet) and dcgm-exporters, and how often."""

    poll_interval: timedelta = timedelta(seconds=30)  # 0 turns agents and dcgm-exporter off
    namespace: str = ""  # "": the controller's own namespace
    selector: str = "app.kubernetes.io/name=taugrid-evidence,app.kubernetes.io/component=agent"
    port: int = 9402
    # The agents' bearer token (a file: the chart mounts a Secret), sent with every read and only to
    # the agent pods found by `selector` in `namespace`. "" sends none.
    token_file: str = ""
    # Read the agents over https, their certificates checked against this CA bundle and, when set,
    # for `server_name` (the name their certificate carries; "": the pod's IP). "" reads http.
    ca_file: str = ""
    server_name: str = ""
    # node name → dcgm-exporter /metrics URL, for clusters that run it instead of (or beside) the agent
    dcgm: Mapping[str, str] = field(default_factory=dict)
