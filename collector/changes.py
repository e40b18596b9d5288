"""How the controller's loop applies the changes its sources deliver (collector/planes) to the run
index: objects and their listings, node clocks, progress signals, Ray heads, GPU evidence, queue and
worker answers. Each change marks the runs whose claims it may move (`_dirty`); the controller
re-evaluates those (collector/controller.py). A node agent's log increment that can only confirm a
progressing run's claims defers that re-evaluation instead (`_deferred`, `claims.confirm_refresh`).

A mixin of `Controller`: it works on the controller's own state, declared below, and runs only on
the loop's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from collector.backlog import Backlog
from collector.claims.gpuspread import forget as forget_spread
from collector.claims.gpuspread import forget_replaced
from collector.correlate import ClockMarks, Key, RunIndex, Signal
from collector.gpu import PodGpuEvidence, uuids
from collector.malloc import release_free
from collector.model import NodeFacts, ObjectRecord, Ref, RunClaims
from collector.nodeclock import NodeClocks
from collector.planes.base import Change
from collector.planes.kube_watch import KubeWatch
from collector.planes.node_agents import GpuPass, NodePart, PassEnd, gpu_records, runs_changed, runs_not_progressing
from collector.planes.signals import alone, carried, confirms, folded, quiet_adds_nothing, uneventful
from collector.progress.model import ProgressSample
from collector.recheck import Rechecks, refresh_due
from collector.runcaps import RunCaps
from collector.settings import Settings
from collector.sources.agents import QuietLog, quiet_scan
from collector.sources.kube_api import Resource
from collector.sources.queuewatch import QueueWatch
from exporters.adx.exporter import EvidenceSink
from exporters.prometheus import ClaimsExporter
from exporters.prometheus_health import ErrorClass, HealthMetrics

__all__ = ["FAILURE_LOG_S", "OVERLOAD_COALESCE", "ROOTS_MEMO_MAX", "ChangeApplier", "describe"]

log = logging.getLogger("taugrid.controller")

FAILURE_LOG_S = 60.0  # a contained failure of one kind is logged with its traceback this often at most
ROOTS_MEMO_MAX = 1 << 13  # pods whose run `_root_of` remembers (~1 MiB at most)
_UNKNOWN_ROOT = object()
ZERO = timedelta(0)
# While the loop is behind its log producers (the log backlog at least half spent: agents' documents
# wait to be queued), a log change marks a run evaluated less than this long ago for this long after
# that evaluation instead of at once (`_coalesced`): a start or restart at 150k pods hands the loop
# every container's first document, a run's 20 spread over minutes by the backlog, and evaluating the
# run on each kept the loop saturated past 13 minutes (issue 30). The agents' pass interval: a run's
# pods have all reported by then.
OVERLOAD_COALESCE = timedelta(seconds=30)
_ROOTISH = frozenset({"TauRun", "RayJob", "RayCluster", "Job", "JobSet", "PyTorchJob", "Workload"})


class ChangeApplier:
    """Applies changes to the index (the loop's thread only)."""

    settings: Settings
    index: RunIndex
    clocks: NodeClocks
    claims: dict[Key, RunClaims]
    queues: QueueWatch
    watch: KubeWatch
    health: HealthMetrics
    sink: EvidenceSink | None
    exporter: ClaimsExporter
    _was_leader: bool  # led at the last evaluation (and published every run then)
    skipped: list[str]
    agents_first: threading.Event
    ready: threading.Event
    agent_log_pods: frozenset[tuple[str, str]]
    _dirty: set[Key]
    _log_backlog: Backlog
    _rechecks: Rechecks[Key]
    _dispatched: dict[Key, str]
    # What the run's nodes' clocks said at its last evaluation, for the runs where one was not ours
    # (`correlate.clock_marks`): a deferral holds only while they say the same (`_deferred`).
    _clocks_seen: dict[Key, ClockMarks]
    _gpus: dict[tuple[str, str], PodGpuEvidence]
    _agent_nodes: dict[str, datetime]
    _agents_newest: datetime | None  # the latest of `_agent_nodes`' reads (per pass, not per run)
    _gpu_passing: GpuPass | None  # the agents' pass in progress
    _gpu_node_pods: dict[str, tuple[tuple[str, str], ...]]  # each node's pods in the last whole pass
    _roots_memo: dict[Key, Ref | None]
    _roots_shape: int
    _roots_changed: bool
    _failure_logged: dict[str, float]
    caps: RunCaps
    coalesced: int  # log changes whose re-evaluation waited (`_coalesced`)

    now: Callable[[], datetime]

    @property
    def leader(self) -> bool:
        raise NotImplementedError  # the controller's

    @property
    def synced(self) -> bool:
        raise NotImplementedError  # the controller's

    def _apply(self, c: Change) -> None:
        r = c.resource
        if c.ack is not None:
            c.ack()
        if c.op == "worker":
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
        elif c.op == "listed":  # a list's Events that the index does not keep (see KubeWatch.replace)
            assert r is not None
            for rec in c.payload:
                self._upsert(r, rec)
        elif c.op == "synced":
            assert r is not None
            self.index.synced[self.settings.taugrid.role_of(r.kind, r.api_version) or r.kind] = c.payload
            self.health.synced(r.name, c.payload)
            self.watch.applied_listing(r.name)
        elif c.op == "ray":
            root_ref, cluster, runtime, ray_sig = c.payload
            self.index.set_ray(cluster, runtime)
            source = f"ray-metrics:{cluster.name}"
            if ray_sig is None or runtime.error:
                self.index.drop_signal(root_ref, source)  # a head we cannot read is no evidence now
            else:
                self.index.set_signal(replace(ray_sig, ref=root_ref, source=source))
            self._dirty.add(root_ref.key)
        elif c.op == "gpu-node":
            self._gpu_part(c.payload)
        elif c.op == "gpu":
            self._gpu_end(c.payload)
        elif c.op == "agent-quiet":
            self._quiet(*c.payload)
        elif c.op == "log-fresh":
            ref, container, read_at = c.payload
            prev = self.index.signal_of(ref, container)
            if prev is not None:
                self._refresh(prev, read_at)
        elif c.op in ("log", "signal", "agent-log"):
            sig, after = c.payload if c.op == "agent-log" else (c.payload, None)
            prev = self.index.signal_of(sig.ref, sig.source) if c.op != "signal" else None
            inc = sig
            fold = folded(prev, sig, c.op, after, self.settings.claims)
            if fold is None:
                assert prev is not None
                self._refresh(prev, sig.read_at)  # an agent's increment with nothing new: read now, as it was
                return
            # (a held signal's root was found when it came: a quiet container's pass, by the 100,000, is
            # not looked up again; at 50k pods the lookups were 4 % of the loop)
            if c.op == "agent-log" and self.ready.is_set() and self.index.get(*sig.ref.key) is not None \
                    and self._root_of(sig.ref) is None:
                return  # a pod no run owns (a node's own pods, which agents read with logScope all)
            sig, read = fold
            self.index.set_signal(sig)
            root = self._root_of(sig.ref)  # (remembered while the links hold: a pass's reads find each run once)
            if root is not None:
                key = root.key
                if key not in self.claims and self.caps.keeps_out(key):
                    pass  # a run a cap keeps out: its log's increments do not retry it (`RunCaps.release` does)
                elif (prev is None or after is None or not self._deferred(prev, inc, after, sig, root)) \
                        and not self._coalesced(key):
                    self._dirty.add(key)
                if self.sink is not None and self.leader:
                    source = f"{sig.ref.name}/{sig.source}"
                    self._export(f"{root} {source}", self.sink.signal, root, source, sig.plane.value, sig.durable,
                                 read)
        elif c.op == "error":
            assert r is not None
            self.watch.applied_error(r.name, c.payload, c.received)
        elif c.op == "restart":
            assert r is not None
            self.health.watch_restarted(r.name)
            if c.payload:
                self.health.relisted(r.name)

    def _deferred(self, held: Signal, inc: Signal, after: int, sig: Signal, root: Ref) -> bool:
        """Whether the re-evaluation that `inc` (an agent's increment of `held`, folded into `sig`) asks of
        `root`'s run is deferred, being one that can only confirm the run's current claims: then it is
        scheduled (`Rechecks.defer`) for the earliest of the run's refresh (`recheck.refresh_due`: within
        `claims.confirm_refresh` of its last evaluation, on the run's own phase), its claims' own due but
        the stall windows of the newest step they saw (`RunClaims.recheck_other`: the increment's newer step
        moved those), and the soonest the stall window of the increment's newest step could close (that
        evaluation's due at the earliest). That replaces the run's clock entry and any earlier deferral;
        neither may have come due before the increment did (a window that closed before the newer step is a
        gap an evaluation must judge). The run's nodes' clocks must say what its last evaluation saw
        (`_clocks_seen`): a clock measured anew places its stamps elsewhere (the claim's `since` moves), and
        a Lease renewal marks no run. Where none runs off ours, the export carries the newest step meanwhile
        (`_carry`)."""
        s = self.settings.claims
        key = root.key
        if not s.confirm_refresh or key in self._dirty or key in self._dispatched:
            return False  # (a run marked is evaluated anyway)
        newest = uneventful(held, inc, after, s.stall_floor + s.scrape_interval)  # (the window's floor)
        if newest is None or newest.at is None:
            return False
        rc = self.claims.get(key)
        now = self.now()
        if rc is None or not confirms(rc, sig, now):
            return False
        signals, marks = self.index.run_signals(root)  # (not the run's whole evidence: only its signals)
        if marks != self._clocks_seen.get(key):
            return False  # a node's clock measured anew since (its stamps placed elsewhere: `since` moves)
        if not alone(sig, signals):
            return False
        ahead = max((skew for _, skew in marks[0]), default=None) if marks is not None else None
        # the window is judged on the evaluation's clock: a node ahead stamps its steps that much later
        closes = newest.at - max(ahead or ZERO, ZERO) + s.stall_floor + s.scrape_interval  # (the window's floor)
        due = min(refresh_due(key, rc.evaluated_at, s.confirm_refresh), closes)  # (each run on its own phase)
        if rc.recheck_other is not None:
            due = min(due, rc.recheck_other + self._rechecks.slack)
        for held_due in (self._rechecks.due_of(key), self._rechecks.deferred_of(key)):
            if held_due is not None and held_due <= now:
                return False  # due before this increment came: judged now, as it would have been
        if due <= now:
            return False
        self._rechecks.defer(key, due)
        if marks is None:
            self._carry(rc, newest, now)
        return True

    def _carry(self, rc: RunClaims, newest: ProgressSample, now: datetime) -> None:
        """A deferred run's exported progress carried to `newest` (`planes.signals.carried`) until its
        evaluation: its last step and time follow the agents' passes, not `claims.confirm_refresh`, and
        step-rate rules and panels see a step every pass. Only what an evaluation would say now: the
        leader's, published before (`_was_leader`), every clock of the run's nodes running with ours
        (the caller's), and `newest` not past `now`. `self.claims` keeps the evaluation's claims."""
        assert newest.at is not None
        if self._was_leader and self.leader and newest.at <= now:
            self.exporter.carry(carried(rc, newest), now)

    def _coalesced(self, key: Key) -> bool:
        """Whether a log change's re-evaluation of run `key` waits, the loop being behind its log
        producers: then the run is evaluated OVERLOAD_COALESCE after its last evaluation, or at its
        clock's due or deferral if earlier (`Rechecks.defer`: what would change its claims by the clock
        is judged on time), with what every change until then brought. Not a run marked anyway, never
        evaluated, or due already."""
        backlog = self._log_backlog
        if backlog.held * 2 < backlog.limit or key in self._dirty or key in self._dispatched:
            return False
        rc = self.claims.get(key)
        if rc is None:
            return False
        now = self.now()
        at = rc.evaluated_at + OVERLOAD_COALESCE
        for held_due in (self._rechecks.due_of(key), self._rechecks.deferred_of(key)):
            if held_due is not None:
                at = min(at, held_due)
        if at <= now:
            return False
        self._rechecks.defer(key, at, firm=True)  # (a confirming increment after it may not move it later)
        self.coalesced += 1
        self.health.log_change_coalesced()
        return True

    def _quiet(self, read_at: datetime, source: str, rows: Sequence[QuietLog]) -> None:
        """A node agent's quiet containers (`sources.agents.QuietLog`, read at `read_at`): each one's
        held signal read again where the increment adds nothing to it (`quiet_adds_nothing`: what an
        `"agent-log"` change of its scan finds first), any other applied as that change; each contained
        alone (one that trips costs only itself)."""
        read_again = self.index.read_again
        soon = self.settings.claims.evidence_max_age / 2
        for row in rows:
            ns, pod, container, lines, fmt, after = row
            try:
                prev = read_again(("Pod", ns, pod), container, read_at,
                                  lambda scan: quiet_adds_nothing(scan, lines, fmt))  # noqa: B023 (called at once)
                if prev is not None:  # (read again, as `_refresh`)
                    if read_at - prev.read_at > soon:
                        self._stale_soon(prev)
                else:
                    scan = quiet_scan(source, fmt, lines)
                    self._apply(Change("agent-log", None, (Signal(Ref("Pod", ns, pod), container, scan, read_at),
                                                           after)))
            except Exception:
                self._failed("quiet log not applied; the rest of its change goes on", "agent-quiet",
                             f"{ns}/{pod}/{container}")

    def _refresh(self, prev: Signal, read_at: datetime) -> None:
        """`prev`, the held signal, read again at `read_at` with nothing new: only its read time moves,
        and a pod's signal takes the index's own `Ref` of the pod (`RunIndex.read_again`)."""
        self.index.read_again(prev.ref.key, prev.source, read_at, lambda scan: scan is prev.scan)  # (`prev`: held)
        if read_at - prev.read_at > self.settings.claims.evidence_max_age / 2:
            self._stale_soon(prev)

    def _stale_soon(self, prev: Signal) -> None:
        """`prev`, read again with nothing new more than half `evidence_max_age` after its last read:
        claims judged it fresh until prev.read_at + evidence_max_age and the run is rechecked then
        (`Clock.within`); its run is re-evaluated now, that being near or past."""
        root = self._root_of(prev.ref)
        if root is not None and not self._coalesced(root.key):
            self._dirty.add(root.key)

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

    def _gpu_pass(self, pass_id: int) -> GpuPass:
        """The agents' pass in progress (`planes.node_agents`), a new one from a part of another."""
        p = self._gpu_passing
        if p is None or p.pass_id != pass_id:
            p = self._gpu_passing = GpuPass(pass_id)
        return p

    def _gpu_part(self, part: NodePart, *, only_new: bool = False) -> None:
        """One agent's records: each pod's replaces the pass before's now (or an earlier part's of this
        pass, from an agent before it in the pass's order); the runs whose devices changed are marked,
        the node's GpuSamples and new XIDs exported. `only_new`: pods no part of the pass named (dcgm)."""
        p = self._gpu_pass(part.pass_id)
        if part.read_at is not None:
            p.nodes[part.node] = part.read_at
            self._agent_nodes[part.node] = part.read_at  # (fresh as read; nodes not read go at the end)
            if self._agents_newest is None or part.read_at > self._agents_newest:
                self._agents_newest = part.read_at
        new: dict[tuple[str, str], PodGpuEvidence] = {}
        for g in part.gpus:
            k = (g.namespace, g.pod)
            by = p.seen.get(k)
            if by is None or (by <= part.order and not only_new):
                p.seen[k] = part.order
                new[k] = g
        if not new:
            return
        held = self._gpus
        old = {k: was for k in new if (was := held.get(k)) is not None}
        self._dirty |= runs_changed(old, new, self.index.root_of, self.claims, self._dirty)
        if self.sink is not None and self.leader:  # the GpuSamples and GpuXids tables
            p.node_pods[part.node] = (*p.node_pods.get(part.node, ()), *new)
            # the XIDs a node's devices reported in the pass before: its pods' records then
            before = {**{k: h for k in self._gpu_node_pods.get(part.node, ()) if (h := held.get(k)) is not None
                         and h.node == part.node and k not in new}, **old}
            samples, xids = gpu_records(before, new, self.index.root_of)
            if only_new:  # a GPU an agent reported this pass is its pod's (the agent's answer wins)
                taken = {u for k in p.node_pods.get(part.node, ()) if k not in new and (h := held.get(k)) is not None
                         for u in uuids(h)}
                samples = [x for x in samples if x.uuid not in taken]
                xids = [x for x in xids if x.uuid not in taken]
            self._export("gpu", self.sink.gpu, samples, xids)
        held.update(new)
        for k in old:  # (a replaced record's kept comparison goes with it: no pass held twice)
            root = self._root_of(Ref("Pod", *k))
            if root is not None:
                forget_spread(root.key)

    def _gpu_end(self, end: PassEnd) -> None:
        """A pass's end: dcgm-exporters' records where no agent's came, the pods and nodes it did not
        read go (their runs marked), the runs not progressing re-evaluated as `runs_not_progressing` says."""
        p = self._gpu_pass(end.pass_id)
        for node, at in end.dcgm_nodes.items():
            if node not in p.nodes:
                p.nodes[node] = at
                self._agent_nodes[node] = at
        by_node: dict[str, list[PodGpuEvidence]] = {}
        for g in end.dcgm:
            by_node.setdefault(g.node, []).append(g)
        for node, recs in by_node.items():
            self._gpu_part(NodePart(p.pass_id, -1, node, None, tuple(recs)), only_new=True)
        held, seen = self._gpus, p.seen
        gone = {k: g for k, g in held.items() if k not in seen}
        self._dirty |= runs_changed({}, gone, self.index.root_of, self.claims, self._dirty)
        self._dirty |= runs_not_progressing(held.__contains__, self.index.member_pods, self.claims, self._dirty,
                                            now=self.now(), every=self.settings.claims.confirm_refresh)
        for k in gone:
            del held[k]
        for ns, pod in self.agent_log_pods - end.log_pods:  # (read by no agent now: the API log source's
            root = self._root_of(Ref("Pod", ns, pod))  # targets for its run, at its evaluation)
            if root is not None:
                self._dirty.add(root.key)
        self._agent_nodes = dict(p.nodes)
        self._agents_newest = max(p.nodes.values(), default=None)
        self.agent_log_pods = end.log_pods
        self._gpu_node_pods = p.node_pods
        self._gpu_passing = None
        forget_replaced(held)  # (what a gone pod's kept comparison read goes too)
        release_free()  # (the replaced records' pages: they are past pymalloc's size, in the C heap)
        self.agents_first.set()

    def _export(self, what: str, call: Callable[..., object], *args: Any, **kw: Any) -> None:
        """A call into the record sink (ADX, embedded) or the evidence capture: a failure there costs
        only these records."""
        try:
            call(*args, **kw)
        except Exception:
            self._failed("export failed; the evidence stays in the index", "export", what, source="export")

    def _touch(self, ref: Ref, *, moved: bool = True) -> None:
        """`ref`'s run marked for re-evaluation; `moved`: the write may have moved a root (the index's
        `shape` changed), so the runs are listed again before the next evaluation."""
        root = self._root_of(ref)
        if root is not None:
            self._dirty.add(root.key)
        if moved and ref.kind in _ROOTISH:
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
            if len(memo) < ROOTS_MEMO_MAX and key[0] != "Event":  # (an Event comes and goes without moving `shape`)
                memo[self.index.key_of(ref)] = root
        return root  # type: ignore[return-value]

    def _upsert(self, r: Resource, rec: ObjectRecord) -> None:
        old = self.index.get(*rec.ref.key)
        if isinstance(rec.facts, NodeFacts):
            self._node_clock(old, rec)
        if old is not None and _same_evidence(old, rec):
            self.index.upsert(rec)  # a resourceVersion bump with nothing the claims read: no re-evaluation
            return
        before = self.index.root_of(rec.ref) if rec.ref.kind in _ROOTISH else None
        shape = self.index.shape
        self.index.upsert(rec)
        if before is not None:
            self._dirty.add(before.key)
        self._touch(rec.ref, moved=self.index.shape != shape)
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


def describe(c: Change) -> str:
    """A change in a few words for the log: its operation, resource and object (no payload)."""
    p = c.payload
    ref = p.ref if isinstance(p, ObjectRecord | Signal) else p if isinstance(p, Ref) else None
    if ref is None and isinstance(p, tuple) and p and isinstance(p[0], Ref | Signal):
        ref = p[0] if isinstance(p[0], Ref) else p[0].ref
    where = f" {ref.kind} {ref.namespace}/{ref.name}" if ref is not None else ""
    return f"{c.op}{' ' + c.resource.name if c.resource else ''}{where}"


def _same_evidence(a: ObjectRecord, b: ObjectRecord) -> bool:
    """Equal in everything the claims and correlation read (resourceVersion aside)."""
    return (a.facts == b.facts and a.conditions == b.conditions and a.labels == b.labels
            and a.owners == b.owners and a.generation == b.generation and a.ref.uid == b.ref.uid)
