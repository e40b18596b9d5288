"""The live controller: watch sources → run index → claims (on every change, when due, on a tick) → exporters.

Reflector threads and the log poller only enqueue; one loop thread owns the index, applies
changes in batches and re-evaluates the runs they touched. Evidence ageing past its bound turns
claims unknown (or a run stalled) without any new event: each evaluation reports when the run's
claims could next change by the clock alone (`RunClaims.recheck_at`) and the loop re-evaluates
the run then. A full pass over every run on a tick remains as a backstop.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from collector.backlog import Backlog
from collector.capture import EvidenceCapture, capture_for
from collector.claims.gpu import apply_gpu
from collector.claims.progress import compacted
from collector.claims.queue_status import Workloads, attach, cluster_queue_of, pending_workload
from collector.correlate import Key, RunEvidence, RunIndex, Signal
from collector.endpoints import BoundedHTTPServer, HttpOptions, WithPath
from collector.endpoints import serve as serve_http
from collector.envcheck import EnvironmentPoller
from collector.gpu import PodGpuEvidence
from collector.kube import MalformedObject, NodeLease, node_lease, normalize
from collector.kube_pod import PodObject, normalize_pod, pod_record
from collector.model import (
    Claim,
    NodeFacts,
    ObjectRecord,
    Observed,
    PodFacts,
    RayClusterFacts,
    RayJobFacts,
    Ref,
    RunClaims,
    Stage,
    TauRunFacts,
    WorkloadFacts,
    verdict_for,
)
from collector.multicluster import dispatch_target, evaluate_multicluster
from collector.nodeclock import NodeClocks
from collector.progress.history import extend_history, merge_history
from collector.progress.model import LogScan
from collector.recheck import CpuBudget, Rechecks
from collector.runcaps import RunCaps
from collector.runsapi import RunHistory, runs_answer
from collector.settings import ControllerSettings, Settings
from collector.sources.agents import AgentReader, AgentReport, discover_agents
from collector.sources.checkpoints import CheckpointSourceError, CheckpointStore, read_checkpoints, store_for
from collector.sources.dcgm import DcgmError, pod_evidence, read_dcgm
from collector.sources.decode import decoder_for
from collector.sources.kube_api import (
    JSON,
    Backoff,
    KubeApi,
    PermanentSourceError,
    Resource,
    SourceError,
    resources_for,
)
from collector.sources.lease import LeaseElector
from collector.sources.logs import (
    ApiLogPoller,
    ApiLogSettings,
    BadRegex,
    LogFresh,
    LogTarget,
    PassReport,
    quiet_until,
)
from collector.sources.queuewatch import QueueWatch
from collector.sources.ray import RayPoller, RayTarget
from collector.sources.ray_urls import dashboard_url_for, metrics_url_for, owned_by, worker_metrics_url
from collector.sources.watch import Reflector
from collector.workerwatch import WorkerCluster
from exporters.adx.exporter import EvidenceSink
from exporters.prometheus import ClaimsExporter, ErrorClass, HealthMetrics, new_registry, render
from exporters.prometheus_fleet import RunSeries
from exporters.prometheus_logs import LogPassMetrics

log = logging.getLogger("taugrid.controller")

Now = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class _PollTargets:
    logs: tuple[tuple[Ref, str, str, int], ...]  # (pod, container, progress regex or "", restart count)
    checkpoints: tuple[tuple[Ref, str], ...]  # (run root, checkpoint URI)
    ray: tuple[tuple[Ref, RayTarget], ...]  # (run root, head)


@dataclass(slots=True)
class _Change:
    op: str  # "upsert" | "delete" | "replace" | "listed" | "synced" | "log" | "error" | "restart" | "worker"
    resource: Resource | None
    payload: Any
    received: float = 0.0  # time.monotonic() when queued (`_put`); 0 inside a batch
    weight: int = 0  # log evidence: what it took from the backlog (`_put_log`), given back once applied


class Controller:
    """Keeps every run's claims current from a Kubernetes API; read-only apart from its Lease."""

    def __init__(self, api: KubeApi, settings: Settings, now: Now, *, registry: CollectorRegistry | None = None,
                 resources: tuple[Resource, ...] | None = None, identity: str = "",
                 capture: EvidenceCapture | None = None, sink: EvidenceSink | None = None,
                 workers: tuple[WorkerCluster, ...] = ()) -> None:
        resources = resources if resources is not None else resources_for(settings.taugrid)
        self.api = api
        # Kueue's visibility API for the queues of runs blocked in queue admission; 0 turns it off
        self.queues = QueueWatch(api)
        self.queue_poll_s = QUEUE_POLL_S
        self._workloads: Workloads | None = None  # the Workloads indexed once per evaluation (queued runs)
        self.sink = sink  # records for ADX / the embedded store (opened and closed by the caller)
        self.settings = settings
        self.cfg: ControllerSettings = settings.controller
        self.now = now
        self.registry = registry or new_registry()
        self.exporter = ClaimsExporter(self.registry, retention=self.cfg.retention,
                                       run_series=RunSeries(self.cfg.run_series))
        self.health = HealthMetrics(self.registry, resources=[r.name for r in resources],
                                    sources=[r.name for r in resources]
                                    + ["logs", "lease", "expstore", "ray", "controller", "export"]
                                    + [f"worker:{w.name}" for w in workers])
        self.wanted = resources
        self.resources: list[Resource] = []
        self.index = RunIndex(settings.taugrid)
        self.clocks = NodeClocks(self.index)  # node clocks from their Leases and heartbeats
        self.claims: dict[Key, RunClaims] = {}
        self.history = RunHistory()  # each run's latest claim transitions, for /runs
        self.caps = RunCaps(self.cfg.max_runs, self.cfg.max_runs_per_namespace)  # on tracked runs
        self.skipped: list[str] = []  # what could not be read, newest last (bounded)
        self._failure_logged: dict[str, float] = {}  # see _failed
        # Bounded: a loop that falls behind makes the reflectors wait instead of growing memory.
        self._changes: queue.Queue[_Change] = queue.Queue(maxsize=self.cfg.queue_max)
        self._log_backlog = Backlog(LOG_BACKLOG)  # ... and log evidence by its weight (collector/backlog.py)
        self._pending: dict[str, list[_Change]] = {}  # per resource, filled by its reflector thread
        self._dirty: set[Key] = set()
        self._roots_memo: dict[Key, Ref | None] = {}  # see _root_of
        self._roots_shape = -1
        self._roots_changed = True
        self._reflectors: list[Reflector] = []
        self._listed: set[str] = set()  # resources whose first listing the loop has applied (its "synced")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log_targets: list[tuple[Ref, str, str, int]] = []
        self._checkpoint_targets: list[tuple[Ref, str]] = []
        self._ray_targets: list[tuple[Ref, RayTarget]] = []
        self._targets_by_run: dict[Key, _PollTargets] = {}
        # Runs whose claims need no API log read before a deadline (`quiet_until`), with their targets.
        self._log_quiet: dict[Key, tuple[datetime, tuple[LogTarget, ...]]] = {}
        self.log_metrics = LogPassMetrics(self.registry, max_gets=self.cfg.log_pass_max_gets,
                                          max_bytes=self.cfg.log_pass_max_bytes)
        self._targets_changed = False
        self._latencies: list[float] = []
        self.evaluations = 0  # evaluation passes
        self.runs_evaluated = 0  # runs evaluated in them
        # Resources whose API server does not answer: since when, and the error (for claim reasons).
        self._outage: dict[str, tuple[datetime, str]] = {}
        # ... and, on the monotonic clock, when each first failed and last failed (see failing_sources).
        self._failed_m: dict[str, tuple[float, float]] = {}
        self._outage_led = False  # exporting every run unknown through a Lease outage (see evaluate)
        self.tick_s = self.cfg.tick.total_seconds()  # the tick in effect (stretched at fleet size)
        # Runs due for re-evaluation by the clock alone (their claims' recheck_at), and the CPU that
        # those re-evaluations may take; `rechecked` counts the runs re-evaluated that way.
        self._rechecks: Rechecks[Key] = Rechecks()
        self._recheck_budget = CpuBudget(RECHECK_SHARE, RECHECK_BURST_S, time.monotonic())
        self.rechecked = 0
        self.ready = threading.Event()
        self.elector = LeaseElector(api, self.cfg, now, identity=identity) if self.cfg.leader_election else None
        self._was_leader = False
        self._unlisted_logged = float("-inf")
        self._opened_at = time.monotonic()
        self._http: BoundedHTTPServer | None = None
        # Evidence bundles and lifecycle traces (settings.bundles); None when not configured.
        self.capture = capture or capture_for(settings, api, now)
        # Node agents (and dcgm-exporters): GPU evidence by pod, when each node was last read, and the
        # pods whose logs an agent reads on the node (the API log poller skips those).
        self._gpus: dict[tuple[str, str], PodGpuEvidence] = {}
        self._agent_nodes: dict[str, datetime] = {}
        self._agent_log_pods: frozenset[tuple[str, str]] = frozenset()
        # Set once the loop holds the agents' first pass (at once without agents): the API log
        # poller waits for it, so that it does not read every pod's log through the API server at
        # start (48,680 kubelet-proxied GETs at fleet size) only to leave most of them to the agents.
        self._agents_first = threading.Event()
        if self.cfg.agents.poll_interval.total_seconds() <= 0:
            self._agents_first.set()
        # The supported-environment check (issue 14), on its own thread and interval.
        # MultiKueue workers, configured explicitly (collector/multicluster.py joins dispatched runs).
        self.workers = workers
        self._dispatched: dict[Key, str] = {}  # manager run → the worker it was dispatched to
        self._workers_changed: set[str] = set()  # workers with changes not yet queued (coalesced)
        self._workers_lock = threading.Lock()
        for w in workers:
            w.on_change, w.on_error = self._worker_changed, self._worker_error
        self.environment = EnvironmentPoller(api, self.registry, now, workers=[(w.name, w.api) for w in workers],
                                             deployment_namespaces=sorted(self.cfg.environment_namespaces))

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Discover APIs, start reflectors, the loop, the log poller, leader election."""
        if self.cfg.tune_gc:
            # The index holds frozen records and tuples, freed by reference counting; the default
            # generation-0 threshold makes the cycle collector rescan them thousands of times a second.
            gc.set_threshold(100_000, 50, 100)
        self._opened_at = time.monotonic()
        backoff = Backoff()
        notes: list[str] = []
        while not self._stop.is_set():
            try:
                self.resources, notes = self.api.discover(self.wanted)
                break
            except SourceError as e:
                self.health.error("discovery", ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT)
                log.warning("discovery failed", extra={"error": str(e)})
                if isinstance(e, PermanentSourceError):
                    raise
                self._stop.wait(backoff.next())
        if self._stop.is_set():
            return  # asked to stop before the API server ever answered
        for note in notes:
            log.info("optional API absent", extra={"note": note})
        for r in self.resources:
            # Evidence capture keeps whole objects; otherwise only the fields the records read are decoded.
            decoder = decoder_for(r.api_version, r.kind, full=self.capture is not None)
            refl = Reflector(self.api, r, self, self.now, watch_timeout_s=self.cfg.watch_timeout_s, decoder=decoder)
            self._reflectors.append(refl)
            refl.start()
        self._spawn(self._loop, "controller-loop")
        if self.cfg.log_poll_interval.total_seconds() > 0:
            self._spawn(self._poll_logs, "log-poller")
        if self.cfg.checkpoint_poll_interval.total_seconds() > 0:
            self._spawn(self._poll_checkpoints, "checkpoint-poller")
        if self.cfg.ray_poll_interval.total_seconds() > 0:
            self._spawn(self._poll_ray, "ray-poller")
        if self.cfg.agents.poll_interval.total_seconds() > 0:
            self._spawn(self._poll_agents, "agent-poller")
        if self.queue_poll_s > 0:
            self._spawn(self._poll_queues, "queue-poller")
        for w in self.workers:
            w.open()
        self._spawn(lambda: self.environment.run(self._stop), "environment-check")
        if self.elector is not None:
            self.elector.start()
        if self.capture is not None:
            self.capture.open()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        """`target` on a thread of its own; if it fails (a bug, or input nobody foresaw), the failure
        is logged and counted and it starts again after a back-off: one source that trips must
        not stop for good while the rest of the collector looks healthy."""
        source = _THREAD_SOURCES.get(name, "controller")

        def supervised() -> None:
            backoff = Backoff(base=1.0, cap=60.0)
            while not self._stop.is_set():
                try:
                    target()
                    return
                except Exception:
                    log.exception("thread failed; starting it again", extra={"thread_name": name})
                    self.health.error(source, ErrorClass.PERMANENT)
                    self.health.thread_restarted(name)
                    self._stop.wait(backoff.next())

        t = threading.Thread(target=supervised, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def request_stop(self) -> None:
        """Ask every loop to end (safe from a signal handler); `close` then finishes the job."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        for r in self._reflectors:
            r.stop()
        if self.elector is not None:
            self.elector.stop()  # releases the Lease: the series must not say this replica leads after that
            self.health.set_leader(self.elector.identity, False)
        for w in self.workers:
            w.close()
        if self._http is not None:
            self._http.shutdown()  # before the joins: serve_forever is one of the threads
            self._http.server_close()
        for t in self._threads:
            t.join(5)
        if self.capture is not None:
            self.capture.close()

    def __enter__(self) -> Controller:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def synced(self) -> bool:
        """Every resource's first listing applied to the index by the loop. Not the reflectors' own
        flags: a reflector queues its listing and then says it synced, so the loop could see a
        resource synced while its listing still waits in the queue (a RayJob then evaluated as a
        root before its TauRun arrives, and exported)."""
        return all(r.resource.name in self._listed for r in self._reflectors)

    def stale_sources(self) -> list[str]:
        """Watched resources with nothing intact from the API server for longer than the evidence
        bound (`claims.evidence_max_age`): past it their claims are unknown, so not ready."""
        bound = self.settings.claims.evidence_max_age.total_seconds()
        now_m = time.monotonic()
        return [r.resource.name for r in self._reflectors if r.synced_once.is_set() and now_m - r.last_ok > bound]

    @property
    def view_complete(self) -> bool:
        """Every watched resource listed once, or the startup grace past. Nothing is exported before:
        a partial view shows runs under the wrong root (a RayJob before its TauRun), and those rows
        would stay in the exported streams; but a resource that never lists (forbidden) must not
        silence the others."""
        return self.synced or time.monotonic() - self._opened_at > STARTUP_GRACE_S

    @property
    def leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    # --- WatchSink (called from reflector threads) -----------------------------------------------

    # Normalizing here, in the reflector's thread, keeps raw JSON out of the queue: the queue then
    # holds small records, and a backlog no longer feeds the cycle collector big dicts.
    # Watch events are buffered per resource (one reflector thread each) and queued once per read:
    # one queue operation per network read instead of one per event.
    def upsert(self, resource: Resource, obj: JSON | PodObject) -> None:
        if resource.kind == "Lease":
            lease = self._node_lease(resource, obj)
            if lease is not None:  # how far ahead its renewal is, measured as it arrives
                change = _Change("lease", resource, (lease, lease.renewed - self.now()))
                self._pending.setdefault(resource.name, []).append(change)
            return
        rec = pod_record(obj, self.settings.taugrid) if type(obj) is PodObject else None
        if rec is None:
            rec = self._normalize(resource, obj)
        if rec is not None:
            if self.capture is not None and isinstance(obj, dict):  # capturing decodes in full: dicts
                self.capture.observe(rec.ref, obj)
            self._pending.setdefault(resource.name, []).append(_Change("upsert", resource, rec))

    def delete(self, resource: Resource, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        if resource.kind == "Lease":
            self._pending.setdefault(resource.name, []).append(_Change("lease-gone", resource, str(meta.get("name"))))
            return
        kind = self.settings.taugrid.role_of(resource.kind, resource.api_version) or resource.kind
        ref = Ref(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if self.capture is not None:
            self.capture.observe_deleted(ref, obj)
        self._pending.setdefault(resource.name, []).append(_Change("delete", resource, ref))

    def flush(self, resource: Resource) -> None:
        changes = self._pending.pop(resource.name, None)
        if changes:
            self._put(_Change("batch", resource, changes))

    def replace(self, resource: Resource, objs: Iterable[JSON]) -> None:
        if resource.kind == "Lease":
            leases = [(lease, lease.renewed - self.now()) for obj in objs
                      if (lease := self._node_lease(resource, obj)) is not None]
            self._put(_Change("leases", resource, leases))
            return
        # Normalized as the pages arrive: only records are kept, never a whole list of raw objects.
        recs: list[ObjectRecord] = []
        # Without an exporter, Events no claim reads (most of a fleet's) are not held until the list
        # ends: the index lets them go anyway. (An exporter gets them at the list's end, as before,
        # when the objects they regard are more likely indexed, so their rows name their run.)
        passing: list[ObjectRecord] = []
        pass_through = self.sink is None
        for obj in objs:
            rec = self._normalize(resource, obj)
            if rec is not None:
                if self.capture is not None:
                    self.capture.observe(rec.ref, obj)
                if not pass_through or self.index.keeps(rec):
                    recs.append(rec)
                    continue
                passing.append(rec)
                if len(passing) >= 500:
                    self._put(_Change("listed", resource, passing))
                    passing = []
        if passing:
            self._put(_Change("listed", resource, passing))
        self._put(_Change("replace", resource, recs))

    def _node_lease(self, resource: Resource, obj: JSON | PodObject) -> NodeLease | None:
        try:
            return node_lease(obj)
        except MalformedObject as e:
            self._skip(str(e))
            self.health.error(resource.name, ErrorClass.PERMANENT)
            return None

    def mark_synced(self, resource: Resource, at: datetime) -> None:
        self._put(_Change("synced", resource, at))

    def source_error(self, resource: Resource, error: SourceError) -> None:
        self._put(_Change("error", resource, error))

    def watch_restarted(self, resource: Resource, relist: bool) -> None:
        self._put(_Change("restart", resource, relist))

    def _worker_changed(self, name: str) -> None:
        """A worker's index changed (reflector thread): re-evaluate the runs dispatched to it."""
        with self._workers_lock:
            if name in self._workers_changed:
                return  # one queued change covers every change until the loop applies it
            self._workers_changed.add(name)
        self._put(_Change("worker", None, name))

    def _worker_error(self, name: str, error: SourceError) -> None:
        self.health.error(f"worker:{name}", ErrorClass.RETRYABLE if error.retryable else ErrorClass.PERMANENT)

    def _put(self, change: _Change) -> None:
        """Queue a change, waiting while the queue is full, but never past shutdown."""
        change.received = time.monotonic()
        while not self._stop.is_set():
            try:
                self._changes.put(change, timeout=0.5)
                return
            except queue.Full:
                continue

    def _put_log(self, change: _Change, scan: LogScan) -> None:
        """Queue a change carrying log evidence, waiting while the backlog's budget is spent."""
        weight = len(scan.samples) + len(scan.hangs) + len(scan.xids) + 2  # (+ the signal and scan themselves)
        if self._log_backlog.take(weight, self._stop):
            change.weight = weight
            self._put(change)

    # --- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        tick = self.cfg.tick.total_seconds()
        pause = self.cfg.min_eval_interval.total_seconds()
        next_tick = time.monotonic()
        last_eval = 0.0
        waiting: list[float] = []  # arrival times of changes not yet covered by an evaluation
        recheck_pending = False  # runs due by the clock are among the dirty ones
        while not self._stop.is_set():
            now_m = time.monotonic()
            timeout = min(next_tick - now_m, 0.5)
            if self._dirty:
                timeout = min(timeout, last_eval + pause - now_m)
            due = self._rechecks.next_due()
            if due is not None:
                # In the claims' clock (the API server's); capped at 0.5 s by the above, so a clock
                # that runs faster or jumps (a simulator's) is followed closely enough.
                until = max((due - self.now()).total_seconds(), self._recheck_budget.wait_s(now_m))
                timeout = min(timeout, until)
            batch: list[_Change] = []
            try:
                batch.append(self._changes.get(timeout=max(0.0, timeout)))
                while len(batch) < self.cfg.batch_max:
                    batch.append(self._changes.get_nowait())
            except queue.Empty:
                pass
            try:
                counts: dict[str, int] = {}
                for change in batch:
                    for c in change.payload if change.op == "batch" else (change,):
                        try:
                            self._apply(c)
                        except Exception:  # one change that trips (hostile input nobody foresaw) costs only itself
                            self._failed("change not applied; the rest of the batch goes on", c.op,
                                         _describe(c))
                            continue
                        if c.op in ("upsert", "delete") and c.resource is not None:
                            counts[c.resource.name] = counts.get(c.resource.name, 0) + 1
                            waiting.append(change.received)
                for name, n in counts.items():
                    self.health.events_processed(name, n)
                now_m = time.monotonic()
                if self._recheck_budget.wait_s(now_m) == 0.0:
                    # Every run whose claims may have changed by the clock since: one batch.
                    due_runs = self._rechecks.pop_due(self.now())
                    if due_runs:
                        self._dirty.update(due_runs)
                        self.rechecked += len(due_runs)
                        recheck_pending = True
                # ... and once every source has synced: the first complete view, which makes it ready
                # without waiting for a tick that may be long.
                full = now_m >= next_tick or (not self.ready.is_set() and self.synced)
                # Changes are batched for at most `min_eval_interval`: one evaluation covers many
                # events of the same runs, which is what keeps a burst cheap.
                if full or (self._dirty and now_m - last_eval >= pause):
                    cpu0 = time.thread_time()
                    self.evaluate(full=full)
                    last_eval = done = time.monotonic()
                    if recheck_pending and not full:
                        self._recheck_budget.spend(time.thread_time() - cpu0, done)
                    recheck_pending = False
                    if full:
                        # The tick re-evaluates every run: a backstop now that each run is re-evaluated
                        # when its claims are due (and what moves with the clock without changing a
                        # claim: reasons' ages, goodput). At fleet size one pass costs a second or more:
                        # the tick stretches so those passes take at most FULL_PASS_SHARE of a core.
                        cost = time.thread_time() - cpu0
                        next_tick = done + max(tick, cost / FULL_PASS_SHARE)
                        self.tick_s = next_tick - done
                    self._latencies.extend(done - t for t in waiting)
                    waiting.clear()
                    if len(self._latencies) > 100_000:
                        del self._latencies[:50_000]
            except Exception:  # keep the loop alive; what failed is in the log and the error counter
                log.exception("controller loop error")
                self.health.error("controller", ErrorClass.PERMANENT)
            finally:
                for change in batch:  # applied (or lost to an error above): the producers may go on
                    if change.weight:
                        self._log_backlog.give(change.weight)

    def _apply(self, c: _Change) -> None:
        r = c.resource
        if c.op == "worker":
            with self._workers_lock:
                self._workers_changed.discard(c.payload)
            self._dirty.update(k for k, w in self._dispatched.items() if w == c.payload)
        elif c.op == "upsert":
            assert r is not None
            self._upsert(r, c.payload)
        elif c.op == "delete":
            assert r is not None
            self._delete_ref(r, c.payload)
        elif c.op == "lease":
            lease, ahead = c.payload
            self.clocks.lease(lease, ahead, listed=False)
        elif c.op == "leases":
            for lease, ahead in c.payload:
                self.clocks.lease(lease, ahead, listed=True)
            self.clocks.leases_listed({lease.node for lease, _ in c.payload})
        elif c.op == "queue":
            self._dirty.update(k for k in self.queues.runs_in(c.payload) if isinstance(k, tuple))
        elif c.op == "lease-gone":
            self.clocks.lease_gone(c.payload)
        elif c.op == "replace":
            assert r is not None
            self._replace(r, c.payload)
        elif c.op == "listed":  # a list's Events that the index does not keep (see replace)
            assert r is not None
            for rec in c.payload:
                self._upsert(r, rec)
        elif c.op == "synced":
            assert r is not None
            self.index.synced[self.settings.taugrid.role_of(r.kind, r.api_version) or r.kind] = c.payload
            self.health.synced(r.name, c.payload)
            self._listed.add(r.name)
            self._outage.pop(r.name, None)
            self._failed_m.pop(r.name, None)
        elif c.op == "ray":
            root_ref, cluster, runtime, ray_sig = c.payload
            self.index.set_ray(cluster, runtime)
            source = f"ray-metrics:{cluster.name}"
            if ray_sig is None or runtime.error:
                self.index.drop_signal(root_ref, source)  # a head we cannot read is no evidence now
            else:
                self.index.set_signal(replace(ray_sig, ref=root_ref, source=source))
            self._dirty.add(root_ref.key)
            if runtime.error:
                self.health.error("ray", ErrorClass.RETRYABLE)
        elif c.op == "gpu":
            gpus, nodes, log_pods = c.payload
            for ns, pod in set(self._gpus) | set(gpus):
                root = self.index.root_of(Ref("Pod", ns, pod))
                if root is None or root.key in self._dirty:
                    continue
                old, new = self._gpus.get((ns, pod)), gpus.get((ns, pod))
                rc = self.claims.get(root.key)
                if old is not None and new is not None and _same_devices(old, new) and rc is not None \
                        and rc.progressing.observed is Observed.TRUE:
                    # only readings moved (utilization, power), which a progressing run's claims do not
                    # say: it is re-evaluated when its evidence would age out (`Clock.within`)
                    continue
                self._dirty.add(root.key)
            self._gpus, self._agent_nodes, self._agent_log_pods = gpus, nodes, log_pods
            self._agents_first.set()
        elif c.op == "log-fresh":
            ref, container, read_at = c.payload
            prev = self.index.signal_of(ref, container)
            if prev is not None:
                self._refresh(prev, read_at)
        elif c.op in ("log", "signal", "agent-log"):
            after: int | None = None
            if c.op == "agent-log":
                sig, after = c.payload
                if self.ready.is_set() and self.index.get(*sig.ref.key) is not None and self._root_of(sig.ref) is None:
                    return  # a pod no run owns (a node's own pods, which agents read with logScope all)
            else:
                sig = c.payload
            prev = self.index.signal_of(sig.ref, sig.source) if c.op != "signal" else None
            if prev is not None and after is not None and _adds_nothing(prev.scan, sig.scan, after):
                self._refresh(prev, sig.read_at)  # an agent's increment with nothing new: read now, as it was
                return
            if prev is not None and after is not None:
                # a node agent's increment: what it read after the document before
                sig = replace(sig, scan=extend_history(prev.scan, sig.scan, after))
            elif prev is not None and not sig.scan.lines and c.op == "log":
                sig = replace(prev, read_at=sig.read_at)  # no line since the last read: what it saw stands
            elif prev is not None:
                # a poll reads a bounded tail: keep what earlier polls saw (goodput, pre-restart mark)
                sig = replace(sig, scan=merge_history(prev.scan, sig.scan))
            read = sig.scan  # every sample read, for the sink; the index keeps the compacted history
            if c.op != "signal":
                sig = compacted(sig, self.settings.claims)
            self.index.set_signal(sig)
            root = self.index.root_of(sig.ref)
            if root is not None:
                self._dirty.add(root.key)
                if self.sink is not None and self.leader:
                    source = f"{sig.ref.name}/{sig.source}"
                    self._export(f"{root} {source}", self.sink.signal, root, source, sig.plane.value, sig.durable,
                                 read)
        elif c.op == "error":
            err: SourceError = c.payload
            self.health.error(r.name if r else "logs", ErrorClass.RETRYABLE if err.retryable else ErrorClass.PERMANENT)
            if r is not None and err.retryable:  # a watched resource failing: until it syncs again, an outage
                self._outage.setdefault(r.name, (self.now(), str(err)))
                first, _ = self._failed_m.get(r.name, (c.received, 0.0))
                self._failed_m[r.name] = (first, c.received)
        elif c.op == "restart":
            assert r is not None
            self.health.watch_restarted(r.name)
            if c.payload:
                self.health.relisted(r.name)

    def _refresh(self, prev: Signal, read_at: datetime) -> None:
        """`prev` read again at `read_at` with nothing new: only its read time moves."""
        self.index.set_signal(replace(prev, read_at=read_at))
        # Claims judged it fresh until prev.read_at + evidence_max_age and the run is rechecked then
        # (`Clock.within`): re-evaluate now only if that is near or past.
        if read_at - prev.read_at > self.settings.claims.evidence_max_age / 2:
            root = self.index.root_of(prev.ref)
            if root is not None:
                self._dirty.add(root.key)

    def _normalize(self, r: Resource, obj: JSON | PodObject) -> ObjectRecord | None:
        try:
            if type(obj) is PodObject:  # `where` is built only for a warning
                n = normalize_pod(obj, self.settings.taugrid)
            else:
                n = normalize(obj, self.settings.taugrid, where=f"{r.kind} {_name_of(obj)}")
        except MalformedObject as e:
            self._skip(str(e))
            self.health.error(r.name, ErrorClass.PERMANENT)
            return None
        for p in n.problems:
            log.debug("odd field", extra={"problem": p})
        return n.record

    def _skip(self, what: str) -> None:
        log.warning("skipped", extra={"problem": what})
        self.skipped.append(what)
        del self.skipped[:-100]

    def _failed(self, message: str, kind: str, what: str, *, source: str = "controller") -> None:
        """An exception inside the loop, contained to the one change, run or export it hit: counted
        (errors_total{source}), and logged with its traceback once a minute per kind (a tenant who
        keeps tripping it must not flood the log)."""
        self.health.error(source, ErrorClass.PERMANENT)
        now = time.monotonic()
        if now - self._failure_logged.get(kind, -FAILURE_LOG_S) >= FAILURE_LOG_S:
            self._failure_logged[kind] = now
            log.exception(message, extra={"kind": kind, "what": what[:300]})
        else:
            log.debug(message, extra={"kind": kind, "what": what[:300]})

    def _export(self, what: str, call: Callable[..., object], *args: Any, **kw: Any) -> None:
        """A call into the record sink (ADX, embedded) or the evidence capture: a failure there costs
        only these records."""
        try:
            call(*args, **kw)
        except Exception:
            self._failed("export failed; the evidence stays in the index", "export", what, source="export")

    def _touch(self, ref: Ref) -> None:
        root = self._root_of(ref)
        if root is not None:
            self._dirty.add(root.key)
        if ref.kind in _ROOTISH:
            self._roots_changed = True

    def _root_of(self, ref: Ref) -> Ref | None:
        """`index.root_of`, remembered while the index's links stay as they were (`RunIndex.shape`):
        a burst of pod updates finds each pod's run once. Bounded: past the bound, it computes."""
        memo = self._roots_memo
        if self._roots_shape != self.index.shape:
            memo.clear()
            self._roots_shape = self.index.shape
        key = ref.key
        root = memo.get(key, _UNKNOWN_ROOT)
        if root is _UNKNOWN_ROOT:
            root = self.index.root_of(ref)
            if len(memo) < ROOTS_MEMO_MAX:
                memo[key] = root
        return root  # type: ignore[return-value]

    def _upsert(self, r: Resource, rec: ObjectRecord) -> None:
        old = self.index.get(*rec.ref.key)
        if isinstance(rec.facts, NodeFacts):
            self._node_clock(old, rec)
        if old is not None and _same_evidence(old, rec):
            self.index.upsert(rec)  # a resourceVersion bump with nothing the claims read: no re-evaluation
            return
        before = self.index.root_of(rec.ref) if rec.ref.kind in _ROOTISH else None
        self.index.upsert(rec)
        if before is not None:
            self._dirty.add(before.key)
        self._touch(rec.ref)
        self._export_event(rec)

    def _node_clock(self, old: ObjectRecord | None, rec: ObjectRecord) -> None:
        """A node's status heartbeat, stamped on its own clock (`collector.nodeclock`)."""
        f = rec.facts
        assert isinstance(f, NodeFacts)
        before = old.facts.heartbeat if old is not None and isinstance(old.facts, NodeFacts) else None
        self.clocks.heartbeat(rec.ref.name, f.heartbeat, before, self.now())

    def _export_event(self, rec: ObjectRecord) -> None:
        """Events regarding a run's objects only: tenants create Events at will, and the rest (most
        of a fleet's) would crowd the spool while saying nothing about any run (docs/security.md).
        Until every resource has listed once, an Event whose object is not indexed yet may still
        regard a run: it is exported as before (the first listing bounds those)."""
        if self.sink is not None and rec.ref.kind == "Event" and self.leader:
            regarding = getattr(rec.facts, "regarding", None)  # EventFacts
            root = self.index.root_of(regarding) if isinstance(regarding, Ref) else None
            if root is not None or not self.synced:
                self._export(str(rec.ref), self.sink.event, rec, root.name if root is not None else "")

    def _delete_ref(self, r: Resource, ref: Ref) -> None:
        self._touch(ref)
        self.index.delete(ref)
        if ref.kind == "Node":
            self.clocks.forget(ref.name)

    def _replace(self, r: Resource, recs: list[ObjectRecord]) -> None:
        """A (re)list: upsert all, and delete what was known but is gone (no lost DELETED)."""
        kind = self.settings.taugrid.role_of(r.kind, r.api_version) or r.kind
        gone = self.index.keys_of_kind(kind)
        for rec in recs:
            gone.discard(rec.ref.key)
            if isinstance(rec.facts, NodeFacts):  # first sight (or a relist): its clock, as far as it says
                self._node_clock(self.index.get(*rec.ref.key), rec)
            self.index.upsert(rec)
            self._touch(rec.ref)
            self._export_event(rec)
        for key in gone:
            self._delete_ref(r, Ref(*key))

    def evaluate(self, *, full: bool = False) -> list[RunClaims]:
        now = self.now()
        self._workloads = None
        with self.health.time_evaluation():
            if self._roots_changed or full:
                roots = {ref.key: ref for ref in self.index.roots()}
                for gone in set(self.claims) - set(roots):
                    rc = self.claims.pop(gone)
                    self._dirty.update(self.caps.release(rc.ref))  # runs a cap kept out may fit now
                    self._dispatched.pop(gone, None)
                    self._rechecks.forget(gone)
                    self.exporter.forget(rc.ref)
                    self.history.forget(gone)
                    if self.capture is not None:
                        self.capture.forget(gone, now)
                    self._targets_by_run.pop(gone, None)
                    self._log_quiet.pop(gone, None)
                    self.queues.waiting(gone, None)
                    self._targets_changed = True
                self._roots_changed = False
                self.caps.prune(roots.keys())
                targets = list(roots.values()) if full else [roots[k] for k in self._dirty if k in roots]
            else:
                targets = [self.claims[k].ref for k in self._dirty if k in self.claims]
                targets += [rec.ref for k in self._dirty if k not in self.claims and self.index.is_root(k)
                            for rec in (self.index.get(*k),) if rec is not None]
            self._dirty.clear()
            out = []
            worker_runs = {w.name: w.runs() for w in self.workers}
            if len(self.claims) + len(targets) > self.caps.floor:
                targets = self.caps.order(targets, self.claims, self._created)
            for ref in targets:
                if ref.key not in self.claims and not self.caps.admit(ref):
                    continue  # not tracked: a cap is reached (counted and logged by namespace)
                try:
                    ev = self.index.evidence(ref)
                    rc = evaluate_multicluster(ev, worker_runs, now, self.settings.claims,
                                               origin=self.settings.controller.multikueue_origin)
                    if self.workers:
                        if target := dispatch_target(ev):
                            self._dispatched[ref.key] = target
                        else:
                            self._dispatched.pop(ref.key, None)
                    if self._agent_nodes or self._gpus:
                        rc = apply_gpu(rc, ev, self._gpus, self._agent_nodes, now, self.settings.claims)
                    if self._outage:
                        rc = self._with_outage(rc)
                    rc = self._with_queue(rc, ev, now)
                    polled = self._poll_targets(ev, rc)
                except Exception:  # one run's evidence that trips the evaluation costs only that run
                    self._failed("run not evaluated; its claims are unknown", "evaluate", str(ref))
                    rc = unknown_claims(ref, self.claims.get(ref.key), now,
                                        "claims could not be evaluated (an internal error, in the collector's log)")
                    ev, polled = None, _PollTargets((), (), ())
                self.claims[ref.key] = rc
                self._rechecks.set(ref.key, rc.recheck_at, now)
                out.append(rc)
                if self.capture is not None and self.leader and ev is not None:
                    self._export(f"{ref} capture", self.capture.evaluated, ev, rc, now)
                until = quiet_until(rc) if polled.logs else None
                if until is None:
                    self._log_quiet.pop(ref.key, None)
                else:
                    self._log_quiet[ref.key] = (until, polled.logs)
                if self._targets_by_run.get(ref.key) != polled:
                    self._targets_by_run[ref.key] = polled
                    self._targets_changed = True
        self.evaluations += 1
        self.runs_evaluated += len(targets)
        self.history.record(out)
        self.health.set_runs_tracked(len(self.claims))
        self.health.set_runs_untracked(self.caps.untracked())
        leader = self.leader and self.view_complete
        lease_outage = self._lease_outage() if not leader else None
        if leader:
            # A new leader publishes every run, not just the ones that changed.
            self.exporter.update(out if self._was_leader else self.claims.values(), now)
            self._outage_led = False
            if self.sink is not None:
                if not self._was_leader and self.elector is not None:  # taking over: until when the other led
                    self._export("takeover", self.sink.track, (), led_until=self.elector.led_until)
                self._export("claims", self.sink.claims, out if self._was_leader else list(self.claims.values()))
        elif lease_outage is not None and (self._was_leader or self._outage_led):
            # The leader lost its Lease to an API outage, and no replica can renew one: rather than
            # withdrawing every run (dashboards blank), each stays exported as unknown with the cause.
            # An unknown cannot double-count should another replica lead meanwhile; no ADX rows are
            # written without the Lease (the transitions resume when it is held again).
            moved = out if self._outage_led else self.claims.values()  # all at first, then what moved
            self.exporter.update([unknown_claims(rc.ref, rc, now, lease_outage) for rc in moved], now,
                                 replace=not self._outage_led)
            self._outage_led = True
        elif self._was_leader or self._outage_led:
            self.exporter.update([], now, replace=True)
            self._outage_led = False
        self.health.set_failing({name: since for name, since, _ in self.failing_sources(grace_s=0.0)})
        if not leader and self.sink is not None and self.elector is not None and self.view_complete:
            # A standby follows the claim transitions, to take over without gaps or repeats.
            self._export("track", self.sink.track, out, led_until=self.elector.led_until)
        self._was_leader = leader
        self.health.set_leader(self.elector.identity if self.elector is not None else "", leader)
        if self.leader and not leader:
            self._log_unlisted()
        if self._targets_changed:
            # New lists, swapped in whole: the poller threads read them without a lock.
            runs = list(self._targets_by_run.values())
            self._log_targets = [t for r in runs for t in r.logs]
            self._checkpoint_targets = [t for r in runs for t in r.checkpoints]
            self._ray_targets = [t for r in runs for t in r.ray]
            self._targets_changed = False
        if self.synced and not self.ready.is_set():
            self.ready.set()
            if self.cfg.tune_gc:
                gc.freeze()  # what the initial lists built is long-lived: keep it out of collections
        return out

    def _with_queue(self, rc: RunClaims, ev: RunEvidence, now: datetime) -> RunClaims:
        """A run blocked in queue admission with its place in the queue (the poller's latest answer)."""
        wl = pending_workload(ev) if rc.blocked is not None and rc.blocked.stage is Stage.QUEUE_ADMISSION else None
        if wl is None or not isinstance(wl.facts, WorkloadFacts):
            self.queues.waiting(rc.ref.key, None)
            return rc
        summary, note = self.queues.waiting(rc.ref.key, (cluster_queue_of(ev, wl), wl.ref.namespace,
                                                         wl.facts.queue_name))
        if self._workloads is None:  # once per evaluation, for all its queued runs
            self._workloads = Workloads(r for k in self.index.keys_of_kind("Workload")
                                        if (r := self.index.get(*k)) is not None)
        return attach(rc, ev, summary, self._workloads, now, note=note)

    def _poll_queues(self) -> None:
        """Kueue's visibility API, every `queue_poll_s`, for the queues runs wait in; a changed answer
        re-evaluates the runs waiting there."""
        while not self._stop.wait(self.queue_poll_s):
            for key in self.queues.poll():
                self._put(_Change("queue", None, key))

    def _log_unlisted(self) -> None:
        """Holding the Lease (or leading alone) but exporting nothing yet: say which watched resources
        have not been listed, every UNLISTED_LOG_S at most, until they are or the start-up grace ends."""
        now_m = time.monotonic()
        if now_m - self._unlisted_logged < UNLISTED_LOG_S:
            return
        self._unlisted_logged = now_m
        pending = sorted(r.resource.name for r in self._reflectors if not r.synced_once.is_set())
        log.warning("leading, not exporting yet: watched resources not listed", extra={
            "pending": ", ".join(pending[:20]), "exports_in_s": round(STARTUP_GRACE_S - (now_m - self._opened_at))})

    def _created(self, ref: Ref) -> datetime | None:
        rec = self.index.get(*ref.key)
        return rec.created if rec is not None else None

    def _lease_outage(self) -> str | None:
        """The reason every run is unknown while the Lease cannot be renewed (API unreachable), or None."""
        e = self.elector
        since = e.failing_since if e is not None else None
        if e is None or since is None:
            return None
        return (f"unknown: the Kubernetes API has not answered since {since:%Y-%m-%dT%H:%M:%SZ} "
                f"(the Lease could not be renewed: {e.failure[:200]}); claims resume when it answers")

    def failing_sources(self, *, grace_s: float | None = None) -> list[tuple[str, datetime, str]]:
        """Sources failing now for longer than `grace_s`: each watched resource whose last attempt
        failed with no intact answer since, and the Lease while it cannot be renewed. (name, since on
        the API server's clock, the error). Read from the HTTP thread: copies, never iteration."""
        grace_s = SOURCE_FAIL_GRACE_S if grace_s is None else grace_s
        now_m = time.monotonic()
        failed, outage = dict(self._failed_m), dict(self._outage)
        out = []
        for r in list(self._reflectors):
            name = r.resource.name
            if name in failed and name in outage:
                first, last = failed[name]
                if r.last_ok < last and now_m - first >= grace_s:
                    out.append((name, *outage[name]))
        e = self.elector
        since = e.failing_since if e is not None else None
        if e is not None and since is not None and now_m - e.failing_since_m >= grace_s:
            out.append(("lease", since, e.failure))
        return out

    def _with_outage(self, rc: RunClaims) -> RunClaims:
        """Unknown claims during an API outage say so: the cause, not only the evidence's age."""
        since, error = min(self._outage.values())
        note = f"; Kubernetes API failing since {since:%Y-%m-%dT%H:%M:%SZ} ({error[:200]})"
        def noted(c: Claim) -> Claim:
            return replace(c, reason=c.reason + note) if c.observed is Observed.UNKNOWN else c

        return replace(rc, scheduled=noted(rc.scheduled), running=noted(rc.running),
                       progressing=noted(rc.progressing))

    def latencies(self) -> list[float]:
        return list(self._latencies)

    # --- logs ------------------------------------------------------------------------------------

    def _poll_targets(self, ev: RunEvidence, rc: RunClaims) -> _PollTargets:
        """What the pollers should read for this run: container logs, checkpoints, Ray heads."""
        if rc.finished:
            return _PollTargets((), (), ())
        # Only for the pollers that run: a tuple per running container costs memory at fleet size.
        logs: tuple[tuple[Ref, str, str, int], ...] = ()
        if self.cfg.log_poll_interval.total_seconds() > 0:
            regex = self.cfg.log_regex_by_profile.get(_profile(ev), "")
            logs = tuple(
                (pod.ref, c.name, regex, c.restart_count) for pod in ev.pods
                if isinstance(pod.facts, PodFacts) and pod.facts.phase == "Running"
                for c in pod.facts.containers if not c.init and c.state == "running"
            )
        t = ev.taurun.facts if ev.taurun is not None else None
        checkpoints = ((rc.ref, t.checkpoints),) if isinstance(t, TauRunFacts) and t.checkpoints \
            and self.cfg.checkpoint_poll_interval.total_seconds() > 0 else ()
        ray = tuple(self._ray_targets_of(ev)) if self.cfg.ray_poll_interval.total_seconds() > 0 else ()
        return _PollTargets(logs, checkpoints, ray)

    def _ray_targets_of(self, ev: RunEvidence) -> list[tuple[Ref, RayTarget]]:
        ns = ev.root.ref.namespace
        clusters: dict[str, dict[str, str]] = {}
        cluster_uids = {rcl.ref.name: rcl.ref.uid for rcl in ev.rayclusters}
        for rj in ev.rayjobs:
            jf = rj.facts
            if isinstance(jf, RayJobFacts) and jf.cluster_name:
                clusters.setdefault(jf.cluster_name, {}).update(job_id=jf.job_id, dashboard=jf.dashboard_url)
        for rcl in ev.rayclusters:
            cf = rcl.facts
            if isinstance(cf, RayClusterFacts):
                clusters.setdefault(rcl.ref.name, {}).update(service=cf.head_service, dport=cf.dashboard_port,
                                                             mport=cf.metrics_port)
        out = []
        for name, info in sorted(clusters.items()):
            dash = dashboard_url_for(ns, name, overrides=self.cfg.ray_dashboards,
                                     rayjob_dashboard_url=info.get("dashboard"), head_service=info.get("service"),
                                     dashboard_port=info.get("dport") or None, cluster_domain=self.cfg.cluster_domain)
            if dash is None:
                continue
            metrics = metrics_url_for(ns, name, overrides=self.cfg.ray_metrics, head_service=info.get("service"),
                                      metrics_port=info.get("mport") or None, cluster_domain=self.cfg.cluster_domain)
            counter = self.cfg.ray_counter_by_profile.get(_profile(ev), self.cfg.ray_progress_counter)
            workers = tuple(
                url for pod in ev.pods
                if isinstance(pf := pod.facts, PodFacts) and pf.ray_node_type == "worker" and pf.pod_ip
                and pf.phase == "Running" and name in cluster_uids  # owned, not just labelled: labels are tenant's
                and owned_by(pod.owners, "RayCluster", name, cluster_uids[name])
                and (url := worker_metrics_url(pf.pod_ip, info.get("mport") or None))  # validated parts only
            ) if self.cfg.ray_scrape_workers else ()
            target = RayTarget(Ref("RayCluster", ns, name), dash, metrics, info.get("job_id") or None,
                               counter=counter, worker_metrics_urls=workers)
            out.append((ev.root.ref, target))
        return out

    def _poll_ray(self) -> None:
        """Each Ray head's Jobs, state and metrics APIs: runtime state and a progress counter."""
        poller = RayPoller()
        interval = self.cfg.ray_poll_interval.total_seconds()
        while not self._stop.wait(interval if self._ray_targets else min(interval, 1.0)):
            pairs = list(self._ray_targets)
            roots = {t.cluster.key: root for root, t in pairs}
            for cluster, runtime, sig in poller.poll_each([t for _, t in pairs], self.now()):  # each as it is read
                root = roots[cluster.key]
                self._put(_Change("ray", None, (root, cluster, runtime, sig)))

    def _poll_logs(self) -> None:
        """Container logs through the API, one pass every `log_poll_interval` from the start of the
        one before (a pass that outlasts it is followed at once; its length is in /metrics)."""
        interval = self.cfg.log_poll_interval.total_seconds()
        # Quiet containers are read every few passes, and always well inside the evidence's max age.
        fresh_passes = int(self.settings.claims.evidence_max_age.total_seconds() / 2 // interval)
        poller = ApiLogPoller(self.api, ApiLogSettings(
            tail_lines=self.cfg.log_tail_lines, limit_bytes=self.cfg.log_limit_bytes,
            quiet_every=max(1, min(self.cfg.log_quiet_every, fresh_passes)),
            concurrency=self.cfg.log_poll_concurrency, interval_s=interval,
            max_gets=self.cfg.log_pass_max_gets, max_bytes=self.cfg.log_pass_max_bytes), self.now)
        bitten = 0.0  # when the ceiling was last logged (monotonic; 0: it is not biting)
        poller.open()
        wait = interval
        agents_by = time.monotonic() + interval  # agents that do not answer hold the API reads one interval at most
        try:
            while not self._stop.wait(wait if self._log_targets else min(interval, 1.0)):
                if not self._agents_first.is_set() and time.monotonic() < agents_by:
                    wait = min(interval, 0.1)
                    continue
                started = time.monotonic()
                quiet = {(ref.namespace, ref.name): until for until, targets in list(self._log_quiet.values())
                         for ref, *_ in targets}
                for out in poller.run_pass(list(self._log_targets), agent_pods=self._agent_log_pods,
                                           held=self._holds_signal, stop=self._stop, quiet=quiet):
                    if isinstance(out, Signal):
                        self._put_log(_Change("log", None, out), out.scan)
                    elif isinstance(out, LogFresh):
                        self._put(_Change("log-fresh", None, (out.ref, out.container, out.at)))
                    elif isinstance(out, BadRegex):
                        self._skip(out.message)
                    else:
                        self._put(_Change("error", None, out))
                took = time.monotonic() - started
                self.health.poll_pass("logs", took)
                bitten = self._log_pass_done(poller.last_pass, bitten)
                wait = max(0.0, interval - took)
        finally:
            poller.close()

    def _log_pass_done(self, p: PassReport, bitten: float) -> float:
        """A pass's cost into /metrics; a ceiling that bites is logged when it starts and every
        LOG_CEILING_LOG_S while it goes on, and when passes fit again. Returns when it was last logged."""
        self.log_metrics.update(gets=p.gets, read_bytes=p.bytes, due=p.due, deferred=p.deferred, skipped=p.skipped)
        now_m = time.monotonic()
        if p.deferred and (not bitten or now_m - bitten >= LOG_CEILING_LOG_S):
            log.warning("API log pass ceiling reached: containers left for the next pass", extra={
                "ceiling": p.ceiling, "gets": p.gets, "bytes": p.bytes, "due": p.due, "deferred": p.deferred,
                "tenants_deferred": p.tenants_deferred, "urgent_deferred": p.urgent_deferred,
                "max_gets": self.cfg.log_pass_max_gets,
                "max_bytes": self.cfg.log_pass_max_bytes})
            return now_m
        if not p.deferred and bitten:
            log.info("API log passes fit their ceiling again", extra={"gets": p.gets, "bytes": p.bytes})
            return 0.0
        return bitten

    def _holds_signal(self, ref: Ref, container: str) -> bool:
        return self.index.signal_of(ref, container) is not None

    def _poll_agents(self) -> None:
        """Node agents' evidence (GPU readings by pod, parsed container logs) and dcgm-exporters."""
        cfg = self.cfg.agents
        reader = AgentReader.from_settings(self.now, token_file=cfg.token_file, ca_file=cfg.ca_file,
                                           server_name=cfg.server_name)
        namespace = cfg.namespace or self.cfg.lease_namespace or "default"
        interval = cfg.poll_interval.total_seconds()
        wait = 0.0  # the first pass at once: the API log poller waits for it
        while not self._stop.wait(wait):
            started = time.monotonic()
            gpus: dict[tuple[str, str], PodGpuEvidence] = {}
            nodes: dict[str, datetime] = {}
            log_pods: set[tuple[str, str]] = set()
            try:
                endpoints = discover_agents(self.api, namespace, selector=cfg.selector, port=cfg.port,
                                            scheme=reader.scheme)
            except SourceError as e:
                self.health.error("agents", ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT)
                endpoints = []
            # Each agent's logs are handed on as its document is read (a first pass carries every
            # container's log, which need not all be held at once); its GPUs in the endpoints'
            # order afterwards, so that a pod two agents name gets the later one's.
            by_endpoint: list[tuple[int, AgentReport]] = []
            for i, rep in reader.read_each(endpoints):
                if self._stop.is_set():
                    break  # (the reads still out end on their own)
                if isinstance(rep, str):
                    self.health.error("agents", ErrorClass.RETRYABLE)
                    log.warning("node agent not read", extra={"error": rep})
                    continue
                for c in rep.logs:
                    sig = Signal(Ref("Pod", c.namespace, c.pod), c.container, c.scan, rep.read_at)
                    self._put_log(_Change("agent-log", None, (sig, c.after)), sig.scan)
                log_pods |= rep.log_pods()
                by_endpoint.append((i, replace(rep, logs=())))
            reader.forget(endpoints)
            for _, rep in sorted(by_endpoint, key=lambda x: x[0]):
                nodes[rep.endpoint.node] = rep.read_at
                gpus.update({(g.namespace, g.pod): g for g in rep.gpus})
            for node, url in sorted(cfg.dcgm.items()):
                try:
                    scrape = read_dcgm(url)
                except DcgmError as e:
                    self.health.error("agents", ErrorClass.RETRYABLE)
                    log.warning("dcgm-exporter not read", extra={"error": str(e)})
                    continue
                at = self.now()
                nodes.setdefault(node, at)
                for g in pod_evidence(scrape, node=node, read_at=at):
                    gpus.setdefault((g.namespace, g.pod), g)  # the agent's answer wins where both exist
            self._put(_Change("gpu", None, (gpus, nodes, frozenset(log_pods))))
            took = time.monotonic() - started
            self.health.poll_pass("agents", took)
            wait = max(0.0, interval - took)  # from the start of the pass before

    def _poll_checkpoints(self) -> None:
        """List each running run's checkpoint location: durable progress from Expstore."""
        stores: dict[tuple[str, str], tuple[CheckpointStore, str]] = {}
        refused: set[tuple[str, str]] = set()
        interval = self.cfg.checkpoint_poll_interval.total_seconds()
        try:
            while not self._stop.wait(interval if self._checkpoint_targets else min(interval, 1.0)):
                for ref, uri in list(self._checkpoint_targets):
                    key = (ref.namespace, uri)  # what a location may reach depends on the run's namespace
                    if key in refused:
                        continue
                    try:
                        if key not in stores:
                            store, prefix = store_for(uri, self.settings.storage, namespace=ref.namespace)
                            store.open()
                            stores[key] = (store, prefix)
                        store, prefix = stores[key]
                        sig = read_checkpoints(store, prefix, ref, self.now())
                    except ValueError as e:  # refused or unusable (docs/security.md): say so once, never fetch
                        if len(refused) > 10_000:
                            refused.clear()
                        refused.add(key)
                        self.health.error("expstore", ErrorClass.PERMANENT)
                        self._skip(f"{ref}: {e}")
                        continue
                    except CheckpointSourceError as e:
                        self.health.error("expstore", ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT)
                        log.warning("checkpoint listing failed", extra={"run": str(ref), "error": str(e)})
                        continue
                    self._put(_Change("signal", None, sig))
        finally:
            for store, _ in stores.values():
                store.close()

    # --- HTTP: /metrics, /healthz, /readyz -------------------------------------------------------

    def serve(self, host: str, port: int, options: HttpOptions | None = None) -> int:
        def healthz() -> tuple[int, str, bytes]:
            alive = all(t.is_alive() for t in self._threads)
            return (200, "text/plain", b"ok\n") if alive else (500, "text/plain", b"loop stopped\n")

        def readyz() -> tuple[int, str, bytes]:
            if not self.ready.is_set():
                return 503, "text/plain", b"not synced\n"
            stale = self.stale_sources()
            if stale:
                return 503, "text/plain", f"stale: {', '.join(stale)}\n".encode()
            failing = self.failing_sources()
            if failing:
                # Not only past the evidence bound: an API server that stopped answering shows at once.
                lines = "".join(f"  {name} since {since:%Y-%m-%dT%H:%M:%SZ}: {error[:200]}\n"
                                for name, since, error in failing)
                return 503, "text/plain", f"sources failing:\n{lines}".encode()
            return 200, "text/plain", b"ok\n"

        def runs(path: str) -> tuple[int, str, bytes]:
            return runs_answer(path, lambda: dict(self.claims), self.now, self.history, self.ready.is_set())

        options = options or HttpOptions()  # /runs: behind /metrics' token and TLS
        self._http = serve_http(host, port, {
            "/metrics": lambda: (200, "text/plain; version=0.0.4", render(self.registry)),
            "/healthz": healthz, "/readyz": readyz, "/runs": WithPath(runs),
        }, replace(options, protected=options.protected | {"/runs"}))
        self._spawn(self._http.serve_forever, "http")
        return int(self._http.server_address[1])


def unknown_claims(ref: Ref, prev: RunClaims | None, now: datetime, reason: str) -> RunClaims:
    """Every claim of a run unknown with `reason` (fail closed): what it asserted, its context and its
    evidence kept from `prev` when there is one, so that ages keep growing where people look."""
    def claim(c: Claim | None) -> Claim:
        asserted = c.asserted if c is not None else None
        return Claim(asserted, Observed.UNKNOWN, verdict_for(asserted, Observed.UNKNOWN),
                     c.since if c is not None and c.observed is Observed.UNKNOWN else None, reason,
                     c.evidence if c is not None else ())

    if prev is None:
        return RunClaims(ref, claim(None), claim(None), claim(None), None, now)
    return replace(prev, scheduled=claim(prev.scheduled), running=claim(prev.running),
                   progressing=claim(prev.progressing), evaluated_at=now, recheck_at=None)


def _describe(c: _Change) -> str:
    """A change in a few words for the log: its operation, resource and object (no payload)."""
    p = c.payload
    ref = p.ref if isinstance(p, ObjectRecord | Signal) else p if isinstance(p, Ref) else None
    if ref is None and isinstance(p, tuple) and p and isinstance(p[0], Ref | Signal):
        ref = p[0] if isinstance(p[0], Ref) else p[0].ref
    where = f" {ref.kind} {ref.namespace}/{ref.name}" if ref is not None else ""
    return f"{c.op}{' ' + c.resource.name if c.resource else ''}{where}"


def _profile(ev: RunEvidence) -> str:
    t = ev.taurun.facts if ev.taurun is not None else None
    return t.profile if isinstance(t, TauRunFacts) else ""


# The source a thread's failures are counted under (taugrid_collector_errors_total{source}).
_THREAD_SOURCES = {"log-poller": "logs", "checkpoint-poller": "expstore", "ray-poller": "ray",
                   "agent-poller": "agents", "environment-check": "environment", "queue-poller": "kueue-visibility"}

# How long after start the controller exports claims even if a watched resource never listed.
STARTUP_GRACE_S = 60.0
QUEUE_POLL_S = 30.0  # Kueue's visibility API, for the queues runs wait in (Kueue computes each answer on demand)
UNLISTED_LOG_S = 10.0
LOG_CEILING_LOG_S = 600.0  # a log pass ceiling that keeps biting is logged this often
# A watched resource or the Lease failing this long (no answer since) makes /readyz 503.
SOURCE_FAIL_GRACE_S = 10.0
FAILURE_LOG_S = 60.0  # a contained failure of one kind is logged with its traceback this often at most

ROOTS_MEMO_MAX = 1 << 13  # pods whose run `_root_of` remembers (~1 MiB at most)
_UNKNOWN_ROOT = object()
# The most of one core the periodic full re-evaluation may take between events (issue 9).
FULL_PASS_SHARE = 0.05  # the rest of the 0.1-core idle budget: bookmarks, HTTP, the pollers
# Log samples and findings queued for the loop at most (≈ 200 bytes each: ≈ 20 MiB; collector/backlog.py).
LOG_BACKLOG = 100_000
# The most of one core, on average, re-evaluating runs whose claims are due to change by the clock
# (in bursts of up to RECHECK_BURST_S CPU seconds): deadlines that keep coming are batched, not spun on.
RECHECK_SHARE = 0.05
RECHECK_BURST_S = 1.0

_ROOTISH = frozenset({"TauRun", "RayJob", "RayCluster", "Job", "JobSet", "PyTorchJob", "Workload"})


def _same_devices(a: PodGpuEvidence, b: PodGpuEvidence) -> bool:
    """The same devices in the same state for the claims (`claims.gpu.apply_gpu`): held, lost, hang
    hint, XIDs; readings (utilization, power) and the read time aside."""
    return (a.node == b.node and a.source == b.source and a.containers == b.containers
            and len(a.devices) == len(b.devices)
            and all((x.uuid, x.index, x.lost, x.hang_hint, x.xids, x.mig_profile)
                    == (y.uuid, y.index, y.lost, y.hang_hint, y.xids, y.mig_profile)
                    for x, y in zip(a.devices, b.devices, strict=True)))


def _adds_nothing(held: LogScan, inc: LogScan, after: int) -> bool:
    """A node agent's increment (what it read after line `after`) that `extend_history` would add
    nothing to `held` with: no finding, no sample but the lead one the history already holds as it
    is, and the same line count and notes."""
    return (not inc.hangs and not inc.xids and not inc.resumes and inc.lines == held.lines and inc.format == held.format
            and inc.diagnostics == held.diagnostics and len(inc.samples) <= 1
            and (not inc.samples or (inc.samples[0].line <= after and bool(held.samples)
                                     and inc.samples[0] == held.samples[-1])))


def _same_evidence(a: ObjectRecord, b: ObjectRecord) -> bool:
    """Equal in everything the claims and correlation read (resourceVersion aside)."""
    return (a.facts == b.facts and a.conditions == b.conditions and a.labels == b.labels
            and a.owners == b.owners and a.generation == b.generation and a.ref.uid == b.ref.uid)


def _name_of(obj: JSON | PodObject) -> str:
    if type(obj) is PodObject:
        return obj.name_of()
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        return f"{meta.get('namespace') or ''}/{meta.get('name') or '?'}".lstrip("/")
    return "?"
