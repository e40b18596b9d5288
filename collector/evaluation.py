"""How the controller's loop evaluates runs (collector/controller.py): the marked runs, or a slice of a
pass over them, through the claim engine, GPU evidence, an API outage's note and the queue's place;
each run's next due by the clock filed (`Rechecks`); what the leader publishes (Prometheus, the record
sink) and what a standby follows; and every claim unknown, with the cause, when a run cannot be
evaluated or the Lease cannot be renewed (`unknown_claims`).

A mixin of `Controller`, as `ChangeApplier` is: it works on the controller's own state, declared
below, and runs only on the loop's thread.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timedelta

from collector.capture import EvidenceCapture
from collector.changes import ChangeApplier
from collector.claims.gpu import apply_gpu
from collector.claims.gpuspread import forget as forget_spread
from collector.claims.memo import forget as forget_kept
from collector.claims.queue_status import Workloads, attach, cluster_queue_of, pending_workload
from collector.correlate import Key, RunEvidence, clock_marks
from collector.model import Claim, Observed, Ref, RunClaims, Stage, WorkloadFacts, verdict_for
from collector.multicluster import dispatch_target, evaluate_multicluster
from collector.planes.base import PerRun
from collector.recheck import DirtyRuns
from collector.runsapi import RunHistory
from collector.settings import ControllerSettings
from collector.sources.lease import LeaseElector
from collector.workerwatch import WorkerCluster

# How often a queued run's admission estimate (its queue's window slides with the clock) is refreshed.
QUEUE_REFRESH = timedelta(seconds=30)
SLICE_CHUNK = 32  # runs a slice looks up among the marked at a time (~5 ms of evaluation)


class RunEvaluator(ChangeApplier):
    """Evaluates the marked runs and publishes their claims (the loop's thread only)."""

    cfg: ControllerSettings
    history: RunHistory
    capture: EvidenceCapture | None
    elector: LeaseElector | None
    workers: tuple[WorkerCluster, ...]
    evaluations: int
    runs_evaluated: int
    _dirty: DirtyRuns[Key]
    _per_run: tuple[PerRun, ...]
    _workloads: Workloads | None
    _workloads_pass: float | None
    _outage_led: bool

    @property
    def view_complete(self) -> bool:
        raise NotImplementedError  # the controller's

    def failing_sources(self, *, grace_s: float | None = None) -> list[tuple[str, datetime, str]]:
        raise NotImplementedError  # the controller's

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
                roots = {self.index.key_of(ref): ref for ref in self.index.roots()}
                for gone in set(self.claims) - set(roots):
                    rc = self.claims.pop(gone)
                    self._dirty.update(self.caps.release(rc.ref))  # runs a cap kept out may fit now
                    self._dispatched.pop(gone, None)
                    self._clocks_seen.pop(gone, None)
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
                key = self.index.key_of(ref)  # (the one tuple the maps below share)
                if key not in self.claims and not self.caps.admit(ref):
                    continue  # not tracked: a cap is reached (counted and logged by namespace)
                try:
                    ev = self.index.evidence(ref)
                    rc = evaluate_multicluster(ev, worker_runs, now, self.settings.claims,
                                               origin=self.settings.controller.multikueue_origin)
                    if self.workers:
                        if target := dispatch_target(ev):
                            self._dispatched[key] = target
                        else:
                            self._dispatched.pop(key, None)
                    if self._agent_nodes or self._gpus:
                        rc = apply_gpu(rc, ev, self._gpus, self._agent_nodes, now, self.settings.claims,
                                       newest=self._agents_newest)
                    if self.watch.outage:
                        rc = self._with_outage(rc)
                    rc = self._with_queue(rc, ev, now)
                    for p in self._per_run:  # what the per-run sources read for it
                        p.track(key, ev, rc)
                    if (marks := clock_marks(ev.node_skew, ev.node_clock_unsure, ev.node_behind)) is not None:
                        self._clocks_seen[key] = marks
                    else:
                        self._clocks_seen.pop(key, None)
                except Exception:  # one run's evidence that trips the evaluation costs only that run
                    self._failed("run not evaluated; its claims are unknown", "evaluate", str(ref))
                    rc = unknown_claims(ref, self.claims.get(key), now,
                                        "claims could not be evaluated (an internal error, in the collector's log)")
                    ev = None
                    for p in self._per_run:
                        p.forget(key)
                    self._clocks_seen.pop(key, None)
                self.claims[key] = rc
                due = rc.recheck_at
                if rc.queue is not None and (due is None or due > now + QUEUE_REFRESH):
                    due = now + QUEUE_REFRESH  # its estimate moves with its queue's window
                self._rechecks.set(key, due, now)
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

    def _with_outage(self, rc: RunClaims) -> RunClaims:
        """Unknown claims during an API outage say so: the cause, not only the evidence's age."""
        since, error = min(self.watch.outage.values())
        note = f"; Kubernetes API failing since {since:%Y-%m-%dT%H:%M:%SZ} ({error[:200]})"
        def noted(c: Claim) -> Claim:
            return replace(c, reason=c.reason + note) if c.observed is Observed.UNKNOWN else c

        return replace(rc, scheduled=noted(rc.scheduled), running=noted(rc.running),
                       progressing=noted(rc.progressing))


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
                   progressing=claim(prev.progressing), evaluated_at=now, recheck_at=None, recheck_other=None,
                   goodput=g, work_at_risk=w)
