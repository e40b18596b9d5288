"""The live controller: evidence sources → run index → claims (on every change, when due, on a tick) → exporters.

The controller is composed of sources (collector/planes: the watched resources, API logs, node
agents and dcgm-exporters, Ray heads, Expstore, Kueue's visibility API, MultiKueue workers, the
environment check), built from the settings in one place (collector/planes/registry.py). Their
threads only enqueue; one loop thread owns the index, applies changes in batches and re-evaluates
the runs they touched (collector/changes.py applies the changes, collector/evaluation.py evaluates
and publishes). Evidence ageing past its bound turns claims unknown (or a run stalled) without
any new event: each evaluation reports when the run's claims could next change by the clock alone
(`RunClaims.recheck_at`) and the loop re-evaluates the run then. A full pass over every run on a
tick remains as a backstop.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry

from collector.backlog import Backlog
from collector.capture import EvidenceCapture, capture_for
from collector.changes import describe
from collector.claims.queue_status import Workloads
from collector.correlate import ClockMarks, Key, RunIndex
from collector.endpoints import BoundedHTTPServer, HttpOptions, WithPath
from collector.endpoints import serve as serve_http
from collector.evaluation import RunEvaluator
from collector.gpu import PodGpuEvidence
from collector.model import ObjectRecord, Ref, RunClaims
from collector.nodeclock import NodeClocks
from collector.planes.base import Change, SourceContext, SourceHealth, SourceState, log_weight
from collector.planes.node_agents import GpuPass
from collector.planes.registry import build_sources, error_labels
from collector.progress.model import LogScan
from collector.recheck import CpuBudget, DirtyRuns, Rechecks
from collector.runcaps import RunCaps
from collector.runsapi import RunHistory, runs_answer
from collector.settings import ControllerSettings, Settings
from collector.sources.kube_api import Backoff, KubeApi, Resource, resources_for
from collector.sources.lease import LeaseElector
from collector.sources.queuewatch import QueueWatch
from collector.workerwatch import WorkerCluster
from exporters.adx.exporter import EvidenceSink
from exporters.prometheus import ClaimsExporter, new_registry, render
from exporters.prometheus_fleet import RunSeries
from exporters.prometheus_health import ErrorClass, HealthMetrics

log = logging.getLogger("taugrid.controller")

Now = Callable[[], datetime]


class Controller(RunEvaluator):
    """Keeps every run's claims current from a Kubernetes API; read-only apart from its Lease."""

    def __init__(self, api: KubeApi, settings: Settings, now: Now, *, registry: CollectorRegistry | None = None,
                 resources: tuple[Resource, ...] | None = None, identity: str = "",
                 capture: EvidenceCapture | None = None, sink: EvidenceSink | None = None,
                 workers: tuple[WorkerCluster, ...] = ()) -> None:
        resources = resources if resources is not None else resources_for(settings.taugrid)
        self.api = api
        # Kueue's visibility API for the queues of runs blocked in queue admission (the `kueue-visibility` source)
        self.queues = QueueWatch(api)
        self._workloads: Workloads | None = None  # the Workloads indexed once per pass (queued runs)
        self._workloads_pass: float | None = None  # ... of the pass in slices that began then (`upto`)
        self.sink = sink  # records for ADX / the embedded store (opened and closed by the caller)
        self.settings = settings
        self.cfg: ControllerSettings = settings.controller
        self.now = now
        self.registry = registry or new_registry()
        self.index = RunIndex(settings.taugrid)
        self.exporter = ClaimsExporter(self.registry, retention=self.cfg.retention,
                                       run_series=RunSeries(self.cfg.run_series), key_of=self.index.key_of)
        self.health = HealthMetrics(self.registry, resources=[r.name for r in resources],
                                    sources=error_labels(resources, tuple(w.name for w in workers)))
        self.clocks = NodeClocks(self.index)  # node clocks from their Leases and heartbeats
        self.claims: dict[Key, RunClaims] = {}
        self.history = RunHistory(key_of=self.index.key_of)  # each run's latest claim transitions, for /runs
        self.caps = RunCaps(self.cfg.max_runs, self.cfg.max_runs_per_namespace)  # on tracked runs
        self.skipped: list[str] = []  # what could not be read, newest last (bounded)
        self._failure_logged: dict[str, float] = {}  # see _failed
        # Bounded: a loop that falls behind makes the sources wait instead of growing memory.
        self._changes: queue.Queue[Change] = queue.Queue(maxsize=self.cfg.queue_max)
        self._log_backlog = Backlog(LOG_BACKLOG)  # ... and log evidence by its weight (collector/backlog.py)
        self._dirty: DirtyRuns[Key] = DirtyRuns()  # runs to re-evaluate, stamped by the change that marked them
        self._roots_memo: dict[Key, Ref | None] = {}  # see _root_of
        self._roots_shape = -1
        self._roots_changed = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._latencies: list[float] = []
        self.evaluations = 0  # evaluation passes
        self.runs_evaluated = 0  # runs evaluated in them
        self.coalesced = 0  # log changes whose re-evaluation waited, the loop being behind (changes.py)
        self._outage_led = False  # exporting every run unknown through a Lease outage (see evaluate)
        self.tick_s = self.cfg.tick.total_seconds()  # the tick in effect (stretched at fleet size)
        refresh = self.settings.claims.confirm_refresh.total_seconds()
        if refresh > NOT_EVALUATED_ALERT_S:
            log.warning("claims.confirm_refresh is longer than TaugridClaimsNotEvaluated's threshold: a "
                        "healthy run's evaluation ages past it between evaluations, and its figures that "
                        "follow the newest step (but its last step, which the export carries) wait as long",
                        extra={"confirm_refresh_s": refresh, "alert_after_s": NOT_EVALUATED_ALERT_S})
        # Runs due for re-evaluation by the clock alone (their claims' recheck_at), and the CPU that
        # those re-evaluations may take; `rechecked` counts the runs re-evaluated that way.
        self._rechecks: Rechecks[Key] = Rechecks()
        self._recheck_budget = CpuBudget(RECHECK_SHARE, RECHECK_BURST_S, time.monotonic())
        self.rechecked = 0
        self.ready = threading.Event()
        self.elector = LeaseElector(api, self.cfg, now, identity=identity) if self.cfg.leader_election else None
        self._was_leader = False
        self._http: BoundedHTTPServer | None = None
        # Evidence bundles and lifecycle traces (settings.bundles); None when not configured.
        self.capture = capture or capture_for(settings, api, now)
        # Node agents (and dcgm-exporters): GPU evidence by pod, when each node was last read, and the
        # pods whose logs an agent reads on the node (the API log source skips those).
        self._gpus: dict[tuple[str, str], PodGpuEvidence] = {}
        self._agent_nodes: dict[str, datetime] = {}
        self._agents_newest: datetime | None = None
        self._gpu_passing: GpuPass | None = None
        self._gpu_node_pods: dict[str, tuple[tuple[str, str], ...]] = {}
        self.agent_log_pods: frozenset[tuple[str, str]] = frozenset()
        # Set once the loop holds the agents' first pass (at once without agents): the API log
        # source waits for it, so that it does not read every pod's log through the API server at
        # start (48,680 kubelet-proxied GETs at fleet size) only to leave most of them to the agents.
        self.agents_first = threading.Event()
        if self.cfg.agents.poll_interval.total_seconds() <= 0:
            self.agents_first.set()
        # MultiKueue workers, configured explicitly (collector/multicluster.py joins dispatched runs).
        self.workers = workers
        self._dispatched: dict[Key, str] = {}  # manager run → the worker it was dispatched to
        self._clocks_seen: dict[Key, ClockMarks] = {}
        self.composed = build_sources(SourceContext(
            api, settings, now, self, self.health, self._stop, self.registry, self.queues, capture=self.capture,
            exporting=sink is not None, workers=workers), resources)
        self.watch = self.composed.watch  # the watched resources (their reflectors, listings, outages)
        self.sources = {s.name: s for s in self.composed.all}
        self._per_run = self.composed.per_run

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Discover APIs and start the watches, the loop, the other sources, leader election."""
        if self.cfg.tune_gc:
            # The index holds frozen records and tuples, freed by reference counting; the default
            # generation-0 threshold makes the cycle collector rescan them thousands of times a second.
            gc.set_threshold(100_000, 50, 100)
        self.watch.open()
        if self._stop.is_set():
            return  # asked to stop before the API server ever answered
        self.spawn(self._loop, "controller-loop", None)
        for s in self.composed.all:
            if s is not self.watch:
                s.open()
        if self.elector is not None:
            self.elector.start()
        if self.capture is not None:
            self.capture.open()

    def spawn(self, target: Callable[[], None], name: str, state: SourceState | None) -> None:
        """`target` on a thread of its own; if it fails (a bug, or input nobody foresaw), the failure
        is logged and counted (as the source's, `state`; else the controller's) and it starts again
        after a back-off: one source that trips must not stop for good while the rest of the
        collector looks healthy."""
        def supervised() -> None:
            backoff = Backoff(base=1.0, cap=60.0)
            while not self._stop.is_set():
                try:
                    target()
                    return
                except Exception as e:
                    log.exception("thread failed; starting it again", extra={"thread_name": name})
                    if state is not None:
                        state.error(ErrorClass.PERMANENT, f"{type(e).__name__}: {e}")
                    else:
                        self.health.error("controller", ErrorClass.PERMANENT)
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
        self.watch.close()
        if self.elector is not None:
            self.elector.stop()  # releases the Lease: the series must not say this replica leads after that
            self.health.set_leader(self.elector.identity, False)
        for s in self.composed.all:
            if s is not self.watch:
                s.close()
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
    def resources(self) -> list[Resource]:
        """The watched resources the API server serves (discovered at `open`)."""
        return self.watch.resources

    @property
    def synced(self) -> bool:
        """Every resource's first listing applied to the index by the loop (`KubeWatch.synced`)."""
        return self.watch.synced

    def stale_sources(self) -> list[str]:
        return self.watch.stale()

    @property
    def view_complete(self) -> bool:
        return self.watch.view_complete

    @property
    def leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    # --- Loop: what the sources call (from their threads) ----------------------------------------

    def put(self, change: Change) -> None:
        """Queue a change, waiting while the queue is full, but never past shutdown."""
        change.received = time.monotonic()
        while not self._stop.is_set():
            try:
                self._changes.put(change, timeout=0.5)
                return
            except queue.Full:
                continue

    def put_log(self, change: Change, scan: LogScan) -> None:
        """Queue a change carrying log evidence, waiting while the backlog's budget is spent."""
        self._put_batch([change], log_weight(scan))

    def put_logs(self, changes: Iterable[tuple[Change, int]]) -> None:
        """Queue changes carrying log evidence (a node agent's document: every container it reads), each
        with its weight (`planes.base.log_weight`), in batches of up to LOG_BATCH_WEIGHT: one queue entry
        and one take from the backlog a batch, not one a container. At 50k pods a pass's quiet containers
        came by the 45,000, each a queue get and a give back in the loop (~3 % of it) besides its own work."""
        batch: list[Change] = []
        weight = 0
        for change, w in changes:
            if batch and weight + w > LOG_BATCH_WEIGHT:
                self._put_batch(batch, weight)
                batch, weight = [], 0
            batch.append(change)
            weight += w
        if batch:
            self._put_batch(batch, weight)

    def _put_batch(self, batch: list[Change], weight: int) -> None:
        """Queue `batch` (one change as itself) once `weight` is taken from the log backlog."""
        change = batch[0] if len(batch) == 1 else Change("batch", None, batch)
        if self._log_backlog.take(weight, self._stop):
            change.weight = weight
            self.put(change)

    def holds_signal(self, ref: Ref, container: str) -> bool:
        return self.index.signal_of(ref, container) is not None

    def keeps(self, rec: ObjectRecord) -> bool:
        return self.index.keeps(rec)

    # --- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        tick = self.cfg.tick.total_seconds()
        pause = self.cfg.min_eval_interval.total_seconds()
        next_tick = time.monotonic()
        last_eval = 0.0
        waiting: deque[float] = deque()  # arrival times of changes not yet covered by an evaluation
        recheck_pending = False  # runs due by the clock are among the dirty ones
        # The pass in progress (once ready): the runs marked by its start, oldest first, in slices of
        # EVAL_SLICE_S with the queue applied and each slice exported between them. Whole, a pass over
        # a burst's every run (~0.15 s) made a change wait for it, the pause and the next pass.
        pass_start: float | None = None
        pass_full = pass_sliced = False
        pass_cpu = pass_s = 0.0  # its CPU, and its slices' time (one observation of the evaluation histogram)
        while not self._stop.is_set():
            now_m = time.monotonic()
            to_tick = next_tick - now_m
            timeout = min(max(to_tick, last_eval + pause - now_m) if self.ready.is_set() else to_tick, 0.5)
            if pass_start is not None:
                timeout = 0.0
            elif self._dirty:
                timeout = min(timeout, last_eval + pause - now_m)
            due = self._rechecks.next_due()
            if due is not None:
                # In the claims' clock (the API server's); capped at 0.5 s by the above, so a clock
                # that runs faster or jumps (a simulator's) is followed closely enough.
                until = max((due - self.now()).total_seconds(), self._recheck_budget.wait_s(now_m))
                timeout = min(timeout, until)
            deferred = self._rechecks.next_deferred()
            if deferred is not None:  # (a change's own evaluation, deferred: not the clock's budget)
                timeout = min(timeout, (deferred - self.now()).total_seconds())
            batch: list[Change] = []
            try:
                batch.append(self._changes.get(timeout=max(0.0, timeout)))
                while len(batch) < self.cfg.batch_max:
                    batch.append(self._changes.get_nowait())
            except queue.Empty:
                pass
            try:
                counts: dict[str, int] = {}
                dirty = self._dirty
                for change in batch:
                    dirty.stamp = change.received  # the runs it marks wait from its arrival
                    for c in change.payload if change.op == "batch" else (change,):
                        try:
                            self._apply(c)
                        except Exception:  # one change that trips (hostile input nobody foresaw) costs only itself
                            self._failed("change not applied; the rest of the batch goes on", c.op,
                                         describe(c))
                            continue
                        if c.op in ("upsert", "delete") and c.resource is not None:
                            name = c.resource.name  # (a property: a string built on each read)
                            counts[name] = counts.get(name, 0) + 1
                            waiting.append(change.received)
                for name, n in counts.items():
                    self.health.events_processed(name, n)
                now_m = dirty.stamp = time.monotonic()
                if deferred is not None:
                    self._dirty.update(self._rechecks.pop_deferred(self.now()))
                if self._recheck_budget.wait_s(now_m) == 0.0:
                    # Every run whose claims may have changed by the clock since: one batch.
                    due_runs = self._rechecks.pop_due(self.now())
                    if due_runs:
                        self._dirty.update(due_runs)
                        self.rechecked += len(due_runs)
                        recheck_pending = True
                if pass_start is None:
                    # ... and once every source has synced: the first complete view, which makes it ready
                    # without waiting for a tick that may be long. Once ready, the tick's pass waits out
                    # the pause too: in a burst it is the next pass, not one more right after the last.
                    paused = now_m - last_eval >= pause
                    full = (now_m >= next_tick and (paused or not self.ready.is_set())) or (
                        not self.ready.is_set() and self.synced)
                    # Changes are batched for at most `min_eval_interval`: one evaluation covers many
                    # events of the same runs, which is what keeps a burst cheap.
                    if full or (self._dirty and paused):
                        pass_start, pass_full, pass_cpu, pass_s = now_m, full, 0.0, 0.0
                        pass_sliced = self.ready.is_set()
                        if full and pass_sliced:
                            self._mark_all()
                if pass_start is not None:
                    cpu0, t0 = time.thread_time(), time.monotonic()
                    if pass_sliced:
                        self.evaluate(until=t0 + EVAL_SLICE_S, upto=pass_start)
                    else:  # whole until ready: ready means every run evaluated
                        self.evaluate(full=pass_full)
                    done = time.monotonic()
                    pass_cpu += time.thread_time() - cpu0
                    pass_s += done - t0
                    # Covered: every change that arrived before the oldest mark left (all, once none is).
                    oldest = self._dirty.oldest()
                    while waiting and waiting[0] < oldest:
                        self._latencies.append(done - waiting.popleft())
                    if len(self._latencies) > 100_000:
                        del self._latencies[:50_000]
                    if oldest > pass_start:  # the pass is over
                        if pass_sliced:
                            self.health.observe_evaluation(pass_s)
                        for p in self._per_run:  # new lists, swapped in whole (read without a lock)
                            p.publish()
                        last_eval = done
                        if recheck_pending and not pass_full:
                            self._recheck_budget.spend(pass_cpu, done)
                        recheck_pending = False
                        if pass_full:
                            # The tick re-evaluates every run: a backstop (FULL_PASS_SHARE). At fleet size one
                            # pass costs a second or more: the tick stretches so those passes take at most
                            # FULL_PASS_SHARE of a core, up to MAX_TICK_S.
                            next_tick = done + max(tick, min(pass_cpu / FULL_PASS_SHARE, MAX_TICK_S))
                            self.tick_s = next_tick - done
                        pass_start = None
            except Exception:  # keep the loop alive; what failed is in the log and the error counter
                log.exception("controller loop error")
                self.health.error("controller", ErrorClass.PERMANENT)
                pass_start = None
            finally:
                for change in batch:  # applied (or lost to an error above): the producers may go on
                    if change.weight:
                        self._log_backlog.give(change.weight)

    def _mark_all(self) -> None:
        """A full pass in slices: every run marked (the roots listed again as its first slice begins)
        but those the deferral of a confirming log increment covers (`ChangeApplier._deferred`): one
        due within the longer of MAX_TICK_S and `claims.confirm_refresh` of the run's last evaluation
        (every deferral: each is due by then), or one that came due in the last MAX_TICK_S / 2 (the next
        increment defers it again). At fleet size the tick is as long as MAX_TICK_S: a run the pass
        re-evaluated between its deferrals would be evaluated twice as often as they ask. (A pass that
        skips most runs is cheap, and the tick shrinks after it: the window is not the tick's.) A run
        skipped is evaluated by its deferral or a later pass: every run at least every 1.5 × MAX_TICK_S
        and a pass, or `confirm_refresh` if longer. Nor are the runs a cap keeps out marked: a
        place freeing marks them (`RunCaps.release`), as does a change of their own objects; at 150k
        pods, 5,000 such runs were marked, sorted by age and refused on every pass."""
        self._roots_changed = True
        tick = timedelta(seconds=MAX_TICK_S)
        bound = max(tick, self.settings.claims.confirm_refresh)
        claims = self.claims
        covered = {key for key, due in self._rechecks.deferred_items()
                   if (rc := claims.get(key)) is not None and due <= rc.evaluated_at + bound}
        covered.update(self._rechecks.came_due_since(self.now() - tick / 2))
        covered.update(self.caps.kept_out())
        self._dirty.update(key for ref in self.index.roots() if (key := ref.key) not in covered)

    def skip(self, what: str) -> None:
        log.warning("skipped", extra={"problem": what})
        self.skipped.append(what)
        del self.skipped[:-100]

    def failing_sources(self, *, grace_s: float | None = None) -> list[tuple[str, datetime, str]]:
        """Sources failing now for longer than `grace_s`: each watched resource whose last attempt
        failed with no intact answer since, and the Lease while it cannot be renewed. (name, since on
        the API server's clock, the error). Read from the HTTP thread: copies, never iteration."""
        grace_s = SOURCE_FAIL_GRACE_S if grace_s is None else grace_s
        now_m = time.monotonic()
        out = self.watch.failing(grace_s)
        e = self.elector
        since = e.failing_since if e is not None else None
        if e is not None and since is not None and now_m - e.failing_since_m >= grace_s:
            out.append(("lease", since, e.failure))
        return out

    def latencies(self) -> list[float]:
        return list(self._latencies)

    def source_health(self) -> list[SourceHealth]:
        """Each source's own account: errors, its last error, its passes (collector/planes/base.py)."""
        return [s.health() for s in self.composed.all]

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
        self.spawn(self._http.serve_forever, "http", None)
        return int(self._http.server_address[1])


# A watched resource or the Lease failing this long (no answer since) makes /readyz 503.
SOURCE_FAIL_GRACE_S = 10.0
# The most of one core the periodic full re-evaluation may take between events (issue 9), and the
# longest the tick is stretched to keep it there. It is a backstop: a run is re-evaluated when a change
# touches it, when its claims are due by the clock (`recheck_at`) and when a deferral comes due (the full
# pass skips the runs a deferral covers or covered in the last MAX_TICK_S / 2, `_mark_all`); goodput
# and work at risk grow at the exporters' clock between evaluations (`RunClaims.at`); queued runs'
# estimates are refreshed every QUEUE_REFRESH (collector/evaluation.py). So the tick only catches what
# none of those would, and every run is evaluated at least every 1.5 × MAX_TICK_S and a pass, or
# `claims.confirm_refresh` if longer (TaugridClaimsNotEvaluated waits NOT_EVALUATED_ALERT_S), whatever
# the fleet's size.
FULL_PASS_SHARE = 0.02
MAX_TICK_S = 120.0
# How long TaugridClaimsNotEvaluated (charts/taugrid-evidence/rules) lets a run's evaluation age.
NOT_EVALUATED_ALERT_S = 300.0
# Log samples and findings queued for the loop at most (≈ 200 bytes each: ≈ 4 MiB; collector/backlog.py).
# Agents hand every container on each pass: at 100,000, a pass's quiet containers (weight 2, ≈ 500 bytes
# of change each) waited by the 50,000, and what they left behind as free blocks in Python's pools (a
# pass's worth of transient objects beside what the loop keeps) was 60 MiB at 50k pods (issue 30).
LOG_BACKLOG = 20_000
# The most log evidence one queued batch carries (`Controller.put_logs`): a node's quiet containers
# (weight 2 each) go in one, a first document's long tails one or a few a batch.
LOG_BATCH_WEIGHT = LOG_BACKLOG // 8
# The most of one core, on average, re-evaluating runs whose claims are due to change by the clock
# (in bursts of up to RECHECK_BURST_S CPU seconds): deadlines that keep coming are batched, not spun on.
RECHECK_SHARE = 0.05
RECHECK_BURST_S = 1.0
# One slice of an evaluation pass at most (wall time; one run at least), then the queue is applied.
EVAL_SLICE_S = 0.010
