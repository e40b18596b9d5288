"""The live controller: evidence sources → run index → claims (on every change, when due, on a tick) → exporters.

The controller is composed of sources (collector/planes: the watched resources, API logs, node
agents and dcgm-exporters, Ray heads, Expstore, Kueue's visibility API, MultiKueue workers, the
environment check), built from the settings in one place (collector/planes/registry.py). Their
threads only enqueue; one loop thread owns the index, applies changes in batches and re-evaluates
the runs they touched. Evidence ageing past its bound turns claims unknown (or a run stalled) without
any new event: each evaluation reports when the run's claims could next change by the clock alone
(`RunClaims.recheck_at`) and the loop re-evaluates the run then. A full pass over every run on a
tick remains as a backstop.
"""

from __future__ import annotations

import gc
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry

from collector.backlog import Backlog
from collector.capture import EvidenceCapture, capture_for
from collector.changes import ChangeApplier, describe
from collector.claims.gpu import apply_gpu
from collector.claims.gpuspread import forget as forget_spread
from collector.claims.memo import forget as forget_kept
from collector.claims.queue_status import Workloads, attach, cluster_queue_of, pending_workload
from collector.correlate import Key, RunEvidence, RunIndex
from collector.endpoints import BoundedHTTPServer, HttpOptions, WithPath
from collector.endpoints import serve as serve_http
from collector.gpu import PodGpuEvidence
from collector.model import Claim, ObjectRecord, Observed, Ref, RunClaims, Stage, WorkloadFacts, verdict_for
from collector.multicluster import dispatch_target, evaluate_multicluster
from collector.nodeclock import NodeClocks
from collector.planes.base import Change, SourceContext, SourceHealth, SourceState
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


class Controller(ChangeApplier):
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
        self.exporter = ClaimsExporter(self.registry, retention=self.cfg.retention,
                                       run_series=RunSeries(self.cfg.run_series))
        self.health = HealthMetrics(self.registry, resources=[r.name for r in resources],
                                    sources=error_labels(resources, tuple(w.name for w in workers)))
        self.index = RunIndex(settings.taugrid)
        self.clocks = NodeClocks(self.index)  # node clocks from their Leases and heartbeats
        self.claims: dict[Key, RunClaims] = {}
        self.history = RunHistory()  # each run's latest claim transitions, for /runs
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
        self._http: BoundedHTTPServer | None = None
        # Evidence bundles and lifecycle traces (settings.bundles); None when not configured.
        self.capture = capture or capture_for(settings, api, now)
        # Node agents (and dcgm-exporters): GPU evidence by pod, when each node was last read, and the
        # pods whose logs an agent reads on the node (the API log source skips those).
        self._gpus: dict[tuple[str, str], PodGpuEvidence] = {}
        self._agent_nodes: dict[str, datetime] = {}
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
        weight = len(scan.samples) + len(scan.hangs) + len(scan.xids) + 2  # (+ the signal and scan themselves)
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
        """A full pass in slices: every run marked (the roots listed again as its first slice begins)."""
        self._roots_changed = True
        self._dirty.update(ref.key for ref in self.index.roots())

    def skip(self, what: str) -> None:
        log.warning("skipped", extra={"problem": what})
        self.skipped.append(what)
        del self.skipped[:-100]

    def evaluate(self, *, full: bool = False, until: float | None = None, upto: float = math.inf) -> list[RunClaims]:
        """Re-evaluate the marked runs (every run: `full`) and export their claims. A slice of a pass
        (`until`, monotonic): the runs marked at or before `upto`, oldest first, until `until` (one at
        least); the rest stay marked. Whole while a run cap may bind: which runs it admits depends on
        seeing them together (RunCaps.order)."""
        now = self.now()
        # One index of the Workloads a pass, as when a pass was one call: its slices share it (the
        # queue's records as its first queued run saw them), a new pass or a whole call indexes anew.
        if until is None or upto != self._workloads_pass:
            self._workloads = None
            self._workloads_pass = upto if until is not None else None
        sliced = until is not None and not full and len(self.claims) + len(self._dirty) <= self.caps.floor
        targets: list[Ref] = []  # whole: the runs to evaluate (sliced: `todo` takes them as it goes)
        todo: Iterable[Ref] = ()
        n = 0  # runs taken
        with self.health.time_evaluation() if until is None else nullcontext():  # (slices: a pass, `_loop`)
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
                    for p in self._per_run:
                        p.forget(gone)
                    forget_spread(gone)  # what was kept for the run between evaluations (its GPU comparison,
                    forget_kept(gone)  # its pods' lineage: collector/claims/memo.py)
                    self.queues.waiting(gone, None)
                self._roots_changed = False
                self.caps.prune(roots.keys())
                if sliced:
                    todo = self._slice(upto, until, roots.get)
                else:
                    targets = list(roots.values()) if full else [roots[k] for k in self._dirty if k in roots]
            elif sliced:
                todo = self._slice(upto, until, self._target)
            else:
                targets = [self.claims[k].ref for k in self._dirty if k in self.claims]
                targets += [rec.ref for k in self._dirty if k not in self.claims and self.index.is_root(k)
                            for rec in (self.index.get(*k),) if rec is not None]
            if not sliced:
                self._dirty.clear()
                todo = targets if len(self.claims) + len(targets) <= self.caps.floor else \
                    self.caps.order(targets, self.claims, self._created)
            out = []
            worker_runs = {w.name: w.runs() for w in self.workers}
            for ref in todo:
                n += 1
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
                    if self.watch.outage:
                        rc = self._with_outage(rc)
                    rc = self._with_queue(rc, ev, now)
                    for p in self._per_run:  # what the per-run sources read for it
                        p.track(ref.key, ev, rc)
                except Exception:  # one run's evidence that trips the evaluation costs only that run
                    self._failed("run not evaluated; its claims are unknown", "evaluate", str(ref))
                    rc = unknown_claims(ref, self.claims.get(ref.key), now,
                                        "claims could not be evaluated (an internal error, in the collector's log)")
                    ev = None
                    for p in self._per_run:
                        p.forget(ref.key)
                self.claims[ref.key] = rc
                due = rc.recheck_at
                if rc.queue is not None and (due is None or due > now + QUEUE_REFRESH):
                    due = now + QUEUE_REFRESH  # its estimate moves with its queue's window
                self._rechecks.set(ref.key, due, now)
                out.append(rc)
                if self.capture is not None and self.leader and ev is not None:
                    self._export(f"{ref} capture", self.capture.evaluated, ev, rc, now)
        self.evaluations += 1
        self.runs_evaluated += n
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
            self.watch.log_unlisted()
        if until is None:  # (a pass in slices publishes once, as it ends: `_loop`)
            for p in self._per_run:  # new lists, swapped in whole: the sources' threads read them without a lock
                p.publish()
        if self.synced and not self.ready.is_set():
            self.ready.set()
            if self.cfg.tune_gc:
                gc.freeze()  # what the initial lists built is long-lived: keep it out of collections
        return out

    def _slice(self, upto: float, until: float | None, run: Callable[[Key], Ref | None]) -> Iterator[Ref]:
        """A slice: the runs marked at or before `upto` (`run`: the run a key names, None for none),
        oldest first, until `until` (one at least); each unmarked as its turn comes, the rest stay
        marked in their places. What a key names is not a run is unmarked as it comes up."""
        dirty = self._dirty
        first = True
        while chunk := dirty.first(upto, SLICE_CHUNK):
            for key in chunk:
                t = dirty.since.get(key)
                if t is None or t > upto:
                    continue  # (unmarked or marked anew meanwhile: nothing in an evaluation does that)
                ref = run(key)
                if ref is not None and not first and until is not None and time.monotonic() >= until:
                    return
                dirty.discard(key)
                if ref is not None:
                    first = False
                    yield ref

    def _target(self, key: Key) -> Ref | None:
        """The run `key` names, if it is one: tracked, or a root of the index."""
        rc = self.claims.get(key)
        if rc is not None:
            return rc.ref
        rec = self.index.get(*key) if self.index.is_root(key) else None
        return rec.ref if rec is not None else None

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
        out = self.watch.failing(grace_s)
        e = self.elector
        since = e.failing_since if e is not None else None
        if e is not None and since is not None and now_m - e.failing_since_m >= grace_s:
            out.append(("lease", since, e.failure))
        return out

    def _with_outage(self, rc: RunClaims) -> RunClaims:
        """Unknown claims during an API outage say so: the cause, not only the evidence's age."""
        since, error = min(self.watch.outage.values())
        note = f"; Kubernetes API failing since {since:%Y-%m-%dT%H:%M:%SZ} ({error[:200]})"
        def noted(c: Claim) -> Claim:
            return replace(c, reason=c.reason + note) if c.observed is Observed.UNKNOWN else c

        return replace(rc, scheduled=noted(rc.scheduled), running=noted(rc.running),
                       progressing=noted(rc.progressing))

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
    # Goodput and work at risk as last evaluated, growing no more: no time is counted that nobody saw.
    g = prev.goodput.frozen() if prev.goodput is not None else None
    w = replace(prev.work_at_risk, grows=False) if prev.work_at_risk is not None else None
    return replace(prev, scheduled=claim(prev.scheduled), running=claim(prev.running),
                   progressing=claim(prev.progressing), evaluated_at=now, recheck_at=None, goodput=g,
                   work_at_risk=w)


# A watched resource or the Lease failing this long (no answer since) makes /readyz 503.
SOURCE_FAIL_GRACE_S = 10.0
# The most of one core the periodic full re-evaluation may take between events (issue 9), and the
# longest the tick is stretched to keep it there. It is a backstop: a run is re-evaluated when a change
# touches it and when its claims are due by the clock (`recheck_at`); goodput and work at risk grow at
# the exporters' clock between evaluations (`RunClaims.at`); queued runs' estimates are refreshed every
# QUEUE_REFRESH. So the tick only catches what none of those would, and every run is evaluated at least
# every MAX_TICK_S (the TaugridClaimsNotEvaluated alert waits 300 s) whatever the fleet's size.
FULL_PASS_SHARE = 0.02
MAX_TICK_S = 120.0
# How often a queued run's admission estimate (its queue's window slides with the clock) is refreshed.
QUEUE_REFRESH = timedelta(seconds=30)
# Log samples and findings queued for the loop at most (≈ 200 bytes each: ≈ 20 MiB; collector/backlog.py).
LOG_BACKLOG = 100_000
# The most of one core, on average, re-evaluating runs whose claims are due to change by the clock
# (in bursts of up to RECHECK_BURST_S CPU seconds): deadlines that keep coming are batched, not spun on.
RECHECK_SHARE = 0.05
RECHECK_BURST_S = 1.0
# One slice of an evaluation pass at most (wall time; one run at least), then the queue is applied.
EVAL_SLICE_S = 0.010
SLICE_CHUNK = 32  # runs a slice looks up among the marked at a time (~5 ms of evaluation)
