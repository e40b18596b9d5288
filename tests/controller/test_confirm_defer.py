"""A node agent's log increment that can only confirm a progressing run's claims defers the run's
re-evaluation (`collector.planes.signals.uneventful`, `confirms`, `alone`; `ChangeApplier._deferred`;
`claims.confirm_refresh`, issue 30). Two controllers fed the same fleet, the same GPU passes and the
same increments at the same instants: D defers, I (confirm_refresh 0) evaluates every increment at
once. Whenever D defers, I's evaluation with the increment says what D's standing claims say (observed,
verdict, cause, since, blocked, straggler suspects, evidence fields, reasons but for the figures that
follow the newest step; the GPU comparison's notes may wait) and is due no earlier than D's deferral;
when D's deferral or its claims' clock comes due, D's evaluation is I's then, exactly. Increments that
carry anything else (a hang, an Xid, a resume, a replay, a non-finite or zero loss, a skipped step, the
total reached, a stamp from the future or going back, undated steps, a new format, diagnostics or rank
track, a redrawn lead sample, a slower pace) are never deferred."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.bench_controller import realistic_pod, run_name
from collector.claims import gpuspread
from collector.claims.memo import ByInputs
from collector.controller import Controller
from collector.correlate import Key, Signal, clock_marks
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.kube import NodeLease, normalize
from collector.model import Claim, Observed, Plane, Ref, RunClaims
from collector.planes.base import Change
from collector.planes.node_agents import pass_changes
from collector.progress.model import HangFinding, LogScan, ProgressSample, RankSteps, ResumeFinding, XidFinding
from collector.recheck import refresh_due
from collector.settings import ClaimSettings, ControllerSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for, resources_for
from exporters.prometheus import ClaimsExporter, _last_step, _newest_per_plane
from tests.test_explain_fixtures import taurun

PODS = 4
NOW0 = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
TOTAL = 500_000
FMT = "megatron"
WARM = 8  # increments (30 steps a second apart each) before the run is judged: a history and a pace


class _Fleet:
    """A controller (never opened, or its loop alone) with one run of PODS GPU pods whose Ray head
    prints a step a second, fed as bench_fleet's `live-heads` (the workers' logs quiet)."""

    def __init__(self, refresh: timedelta, *, tick: timedelta = timedelta(seconds=5)) -> None:
        self.clock = [NOW0]
        s = Settings(claims=replace(ClaimSettings(), confirm_refresh=refresh),
                     controller=replace(ControllerSettings(), leader_election=False, log_poll_interval=timedelta(0),
                                        tick=tick))
        self.c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), s, lambda: self.clock[0])
        res = {r.kind: r for r in resources_for(s.taugrid)}
        created = NOW0 - timedelta(hours=3)
        stamp = NOW0.strftime("%Y-%m-%dT%H:%M:%SZ")
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{n:02d}"}, "spec": {},
             "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": stamp}]}}
            for n in range(PODS)]
        ns, run = run_name(0)
        objs.append(taurun(run, ns, "Running", created, workers=PODS - 1))
        self.pods = [realistic_pod(ns, run, j, created, f"gpu-{j:02d}") for j in range(PODS)]
        for o in [*objs, *self.pods]:
            rec = normalize(o).record
            assert rec is not None
            self.c._upsert(res[o["kind"]], rec)
        for kind in ("Pod", "Node", "TauRun", "Event", "Workload", "Job", "RayCluster", "RayJob"):
            self.c.index.synced[kind] = NOW0
        for n in range(PODS):  # every node's clock measured (its kubelet's Lease): stamps placed
            self.c.clocks.lease(NodeLease(f"gpu-{n:02d}", NOW0, timedelta(seconds=40)), timedelta(0), listed=False)
        self.c.ready.set()
        self.key: Key = ("TauRun", ns, run)
        head = self.pods[0]
        self.head = Ref("Pod", ns, head["metadata"]["name"])
        self.container = head["spec"]["containers"][0]["name"]

    def move(self, seconds: float) -> None:
        """The clock `seconds` on, every resource listed at it."""
        self.clock[0] += timedelta(seconds=seconds)
        self.synced_now()

    def synced_now(self) -> None:
        for kind in list(self.c.index.synced):  # every resource's watch alive: its status trusted
            self.c.index.synced[kind] = self.clock[0]

    def quiet_workers(self) -> None:
        """The workers' trainers: their first document (3 lines, no step), read again each pass."""
        for change in self.worker_changes():
            self.c._apply(change)

    def worker_changes(self) -> list[Change]:
        out = []
        for p in self.pods[1:]:
            ref = Ref("Pod", p["metadata"]["namespace"], p["metadata"]["name"])
            name = p["spec"]["containers"][0]["name"]
            scan = LogScan(f"{ref.namespace}/{ref.name}/{name}", None, (), (), (), (), 3, first_at=NOW0)
            held = self.c.index.signal_of(ref, name)
            out.append(Change("agent-log", None, (Signal(ref, name, scan, self.clock[0]), None if held is None else 3)))
        return out

    def gpu_changes(self, seed: int) -> list[Change]:
        """A pass of the agents (`gpus_at`), as the agent poller hands it: agent by agent, then its end."""
        gpus = gpus_at(self.clock[0], seed, False)
        return pass_changes(gpus, {g.node: self.clock[0] for g in gpus.values()}, frozenset())


def gpus_at(now: datetime, seed: int, apart: bool) -> dict[tuple[str, str], PodGpuEvidence]:
    """Every pod's 8 GPUs' readings (seeded); `apart`: one GPU's SM clock far below the others'."""
    import random
    rng = random.Random(seed)
    out: dict[tuple[str, str], PodGpuEvidence] = {}
    ns, run = run_name(0)
    for k in range(PODS):
        name = realistic_pod(ns, run, k, NOW0, "x")["metadata"]["name"]
        devs = tuple(GpuDevice(uuid=f"GPU-{k:04d}{i:04d}-0000-4000-8000-000000000000", index=i,
                               utilization=rng.uniform(0.85, 1.0), sm_active=rng.uniform(0.6, 0.9),
                               power_w=rng.uniform(500.0, 700.0), power_limit_w=700.0,
                               sm_clock_hz=(1.2e9 if apart and k == 1 and i == 0 else 1.98e9) * rng.uniform(0.99, 1.01))
                     for i in range(8))
        out[(ns, name)] = PodGpuEvidence(ns, name, f"gpu-{k:02d}", "agent", now, devs, ("main",))
    return out


# --- increments ------------------------------------------------------------------------------------

# Kinds an increment can take: "ok" carries the trainer on (a step a second), every other one carries
# something the claims may turn on (or the predicate cannot vouch for) and must never be deferred.
CONFIRMING = ("ok", "ok-lead", "ok-strided")
EVENTFUL = ("hang", "xid", "resume", "replay", "nan", "zero", "skipped", "total", "future", "backwards",
            "undated", "format", "diag", "ranks", "lead-redrawn", "tokens")
SLOW = "slow"  # a slower pace: refused once the run's own pace (not the increment alone) falls behind


class Feed:
    """The head's log as an agent reads it: steps, lines sent, and the increments of each kind."""

    def __init__(self) -> None:
        self.step = 1000
        self.line = 0
        self.last: ProgressSample | None = None
        self.diag: tuple[str, ...] = ()
        self.fmt = FMT  # the format the agent's document names (the samples' own stay megatron)

    def increment(self, kind: str, now: datetime, n: int, lag: int) -> tuple[LogScan, int | None]:
        """`n` new steps, the newest `lag` s before `now` (the read), one a second, of `kind`."""
        after = self.line if self.last is not None else None
        out: list[ProgressSample] = []
        if kind in ("ok-lead", "lead-redrawn") and self.last is not None:
            lead = self.last if kind == "ok-lead" else replace(self.last, loss=(self.last.loss or 1.0) + 0.5)
            out.append(lead)
        spacing = 3 if kind == "slow" else 1
        start = now - timedelta(seconds=lag + spacing * (n - 1))
        hangs: tuple[HangFinding, ...] = ()
        xids: tuple[XidFinding, ...] = ()
        resumes: tuple[ResumeFinding, ...] = ()
        ranks: tuple[RankSteps, ...] = ()
        for i in range(n):
            self.line += 1
            step = self.step + 1 + i * (7 if kind == "ok-strided" else 1)
            at: datetime | None = start + timedelta(seconds=spacing * i)
            loss: float | None = 2.0 + 0.01 * (i % 7)
            skipped = False
            if kind == "replay":
                step = self.step - 50 + i
            elif kind == "nan" and i == n - 1:
                loss = math.nan
            elif kind == "zero" and i == n - 1:
                loss = 0.0
            elif kind == "skipped" and i == n - 1:
                skipped = True
            elif kind == "total" and i == n - 1:
                step = TOTAL
            elif kind == "future" and i == n - 1:
                at = now + timedelta(seconds=20)
            elif kind == "backwards" and i == 0 and self.last is not None and self.last.at is not None:
                at = self.last.at - timedelta(seconds=5)
            elif kind == "undated" and i == n - 1:
                at = None
            out.append(ProgressSample(step, at, loss, self.line, FMT, skipped, TOTAL))
        if kind == "hang":
            self.line += 1
            hangs = (HangFinding("nccl-watchdog-timeout", self.line, "ALLREDUCE", 600000, 3,
                                 now - timedelta(seconds=lag)),)
        elif kind == "xid":
            self.line += 1
            xids = (XidFinding(79, "0000:3b:00.0", self.line, "GPU has fallen off the bus", "reset",
                               now - timedelta(seconds=lag)),)
        elif kind == "resume":
            self.line += 1
            resumes = (ResumeFinding(self.line, now - timedelta(seconds=lag), self.step - 100, FMT),)
        elif kind == "format":
            self.fmt = "deepspeed" if self.fmt == FMT else FMT
        elif kind == "diag":
            self.diag = (*self.diag, f"diagnostic {self.line}")
        elif kind == "ranks":
            ranks = (RankSteps(0, (1, 2), (now, now)), RankSteps(1, (1, 2), (now, now)))
        kept = [x for x in out if x.line > (after or 0)]
        if kind not in ("replay", "total"):
            self.step = max([self.step, *(x.step for x in kept if x.step is not None)])
        if kept:
            self.last = kept[-1]
        scan = LogScan("head", self.fmt, tuple(out), hangs, xids, self.diag,
                       self.line, first_at=start, resumes=resumes, ranks=ranks,
                       tokens=None if kind != "tokens" else _tokens(now))
        return scan, after


def _tokens(now: datetime) -> Any:
    from collector.progress.model import TokenRate
    return TokenRate(3000.0, now)


# --- comparing claims ------------------------------------------------------------------------------

_FIGURE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|[smhd]))+\b|[+-]?\d[\d,.:]*%?")  # (durations as 1m16s: one figure)


def shape(text: str) -> str:
    """A reason without its figures (steps, stamps, ages, rates, windows and how they were drawn): what a
    deferral may leave standing. A note the newest step can only remove (the run slower than usual, skipped reports
    before a real step) goes too: never one that turns a claim."""
    text = re.sub(r"; slower than usual \([^)]*\)", "", text)
    text = re.sub(r"window [^;]*", "window #", text)  # (the stall window, drawn from the pace)
    text = re.sub(r"; [\d,]+ skipped step report\(s\) since [^;]*\(fp16 overflow\)", "", text)
    return _FIGURE.sub("#", text)


def claim_shape(c: Claim) -> tuple[Any, ...]:
    return (c.asserted, c.observed, c.verdict, c.since, c.cause, shape(c.reason),
            tuple((e.plane, e.ref, e.field) for e in c.evidence))


def confirmed(held: RunClaims, fresh: RunClaims) -> list[str]:
    """What `fresh` (an evaluation with the increment) says that `held` (the run's standing claims) does
    not, the figures that follow the newest step aside; [] when nothing."""
    diffs = []
    for name in ("scheduled", "running", "progressing"):
        a, b = getattr(held, name), getattr(fresh, name)
        if claim_shape(a) != claim_shape(b):
            diffs.append(f"{name}: {claim_shape(a)} != {claim_shape(b)}")
    if held.blocked != fresh.blocked or held.finished != fresh.finished or held.extra != fresh.extra:
        diffs.append("blocked/finished/context")
    if (held.work_at_risk is None) != (fresh.work_at_risk is None):
        diffs.append(f"work_at_risk: {held.work_at_risk} != {fresh.work_at_risk}")
    # the suspects named, never late; the GPU comparison's notes (readings apart while the run keeps
    # its pace, readings not trusted) may wait for the deferred evaluation (`planes.signals.alone`)
    sa = held.stragglers.suspects if held.stragglers is not None else ()
    sb = fresh.stragglers.suspects if fresh.stragglers is not None else ()
    if sa != sb:
        diffs.append(f"stragglers: {held.stragglers} != {fresh.stragglers}")
    if held.work_at_risk is not None and fresh.work_at_risk is not None:
        wa, wb = held.work_at_risk.at(fresh.evaluated_at), fresh.work_at_risk
        if (wa.gpus, wa.since, wa.basis, shape(wa.reason), wa.checkpoint_step, wa.missing, wa.grows,
                [(n.node, n.score) for n in wa.nodes]) != (
                wb.gpus, wb.since, wb.basis, shape(wb.reason), wb.checkpoint_step, wb.missing, wb.grows,
                [(n.node, n.score) for n in wb.nodes]) or (wa.gpu_hours is None) != (wb.gpu_hours is None) or \
                (wa.gpu_hours is not None and wb.gpu_hours is not None
                 and not math.isclose(wa.gpu_hours, wb.gpu_hours, abs_tol=1e-9)):
            diffs.append(f"work at risk: {wa} != {wb}")
    if (held.energy is None) != (fresh.energy is None):
        diffs.append("energy")
    ga, gb = held.goodput, fresh.goodput
    # (goodput's figures are recomputed from the history at each evaluation, with the stall window the
    # pace gives then: figures, like the window; what it accrues as now is compared)
    if (ga is None) != (gb is None) or (ga is not None and gb is not None and (
            ga.accrues != gb.accrues or ga.rated != gb.rated or (ga.ratio is None) != (gb.ratio is None))):
        diffs.append(f"goodput: {ga} != {gb}")
    return diffs


# --- the two controllers, step by step --------------------------------------------------------------


class Pair:
    """D (deferring) and I (every increment at once), fed alike; D's deferrals checked as they happen."""

    def __init__(self) -> None:
        gpuspread._CORES = ByInputs()  # (another test's kept comparisons: none of this fleet's)
        self.d = _Fleet(ClaimSettings().confirm_refresh)
        self.i = _Fleet(timedelta(0))
        self.feed = Feed()
        self.now = NOW0
        self.deferred = 0
        self.refused: dict[str, int] = {}
        self.fired = 0
        self.skewed = 0  # deferrals whose steps were not carried (a node's clock ahead)

    def at(self, now: datetime) -> None:
        self.now = now
        for f in (self.d, self.i):
            f.clock[0] = now
            f.synced_now()

    def gpu(self, seed: int, apart: bool) -> None:
        gpus = gpus_at(self.now, seed, apart)  # the same records to both (the kept comparisons are by them)
        for f in (self.d, self.i):
            for ch in pass_changes(gpus, {g.node: self.now for g in gpus.values()}, frozenset()):
                f.c._apply(ch)
            f.quiet_workers()

    def clock(self, seed: int) -> None:
        """A node's kubelet renews its Lease, its clock `CLOCKS[...]` ahead of ours (behind: negative),
        to both; as the loop applies it, it marks no run (`NodeClocks`)."""
        node, ahead = f"gpu-{seed % PODS:02d}", CLOCKS[(seed >> 2) % len(CLOCKS)]
        for f in (self.d, self.i):
            f.c._apply(Change("lease", None, (NodeLease(node, self.now + ahead, timedelta(seconds=40)), ahead)))

    def evaluate(self) -> None:
        """Both evaluate what is marked; where D evaluates the run, it must say what I says then."""
        d_dirty = self.d.key in self.d.c._dirty
        self.d.c.evaluate()
        self.i.c._dirty.add(self.i.key)  # (I is always current: evaluated whenever D is)
        self.i.c.evaluate()
        if d_dirty:
            assert repr(self.d.c.claims[self.d.key]) == repr(self.i.c.claims[self.i.key])

    def until(self, then: datetime) -> None:
        """The clock moves on to `then`; D's deferrals and both clocks' dues fire on time (no CPU budget here)."""
        while True:
            dues = [x for f in (self.d, self.i) for x in (f.c._rechecks.next_due(), f.c._rechecks.next_deferred())
                    if x is not None]
            nxt = min(dues, default=None)
            if nxt is None or nxt > then:
                break
            self.at(nxt)
            for f in (self.d, self.i):
                due = f.c._rechecks.pop_due(nxt) + f.c._rechecks.pop_deferred(nxt)
                f.c._dirty.update(due)
            self.fired += self.d.key in self.d.c._dirty
            self.evaluate()
        self.at(then)

    def increment(self, kind: str, n: int, lag: int) -> bool:
        """The head's increment of `kind` to both; whether D deferred its run's re-evaluation."""
        scan, after = self.feed.increment(kind, self.now, n, lag)
        for f in (self.d, self.i):
            f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, self.now), after)))
        held = self.d.c.claims.get(self.d.key)
        deferred = self.d.key not in self.d.c._dirty
        if deferred:
            assert held is not None
            self.deferred += 1
            due = self.d.c._rechecks.next_deferred()
            assert due is not None and self.now < due <= held.evaluated_at + ClaimSettings().confirm_refresh
            self.i.c.evaluate()  # I, at once: what D's standing claims must already say
            fresh = self.i.c.claims[self.i.key]
            assert fresh.progressing.observed is Observed.TRUE
            assert confirmed(held, fresh) == [], (kind, confirmed(held, fresh))
            assert fresh.recheck_at is None or fresh.recheck_at + self.d.c._rechecks.slack >= due
            assert self.d.c.claims[self.d.key] is held  # (the evaluation's claims stand: only the export moves)
            if self.d.key in self.d.c._clocks_seen:  # a node's clock not ours: its steps wait for the evaluation
                assert _last_step(self.d.c.exporter._runs[self.d.key].claims) == _last_step(held)
                self.skewed += 1
            else:
                self.carried(fresh)
        else:
            self.refused[kind] = self.refused.get(kind, 0) + 1
            self.evaluate()
        return deferred

    def carried(self, fresh: RunClaims) -> None:
        """What D exports for its deferred run (`ChangeApplier._carry`) says the step, loss and step time
        that I's evaluation says now, in both of the exporter's renderings; no plane's evidence reads
        younger than in I's, and what no step moves is the evaluation's."""
        ex, key = self.d.c.exporter, self.d.key
        shown = ex._runs[key].claims
        assert _last_step(shown) == _last_step(fresh) is not None
        assert _figure(shown, "last_loss") == _figure(fresh, "last_loss")
        held = self.d.c.claims[key]
        assert (shown.evaluated_at, shown.scheduled, shown.running, shown.progressing.reason) == (
            held.evaluated_at, held.scheduled, held.running, held.progressing.reason)
        newest, fresh_newest = dict(ex._runs[key].newest), dict(_newest_per_plane(fresh))
        assert newest.keys() == fresh_newest.keys()
        assert all(at <= fresh_newest[plane] for plane, at in newest.items())
        assert newest[Plane.LOGS] >= _last_step(fresh)[1]  # (its step's time, at least)
        text = ex.exposition().decode()
        for fam, value in (("taugrid_run_progress_last_step", _last_step(fresh)[0]),
                           ("taugrid_run_last_progress_timestamp_seconds", _last_step(fresh)[1])):
            lines = [ln for ln in text.splitlines() if ln.startswith(fam + "{")]
            assert len(lines) == 1 and float(lines[0].rsplit(" ", 1)[1]) == value, (fam, lines, value)
        collected = {m.name: m for m in ex.collect()}
        assert [s.value for s in collected["taugrid_run_progress_last_step"].samples] == [_last_step(fresh)[0]]
        # the carried entry is what `update` writes for the same claims, byte for byte
        assert ex._now_at is not None
        again = ClaimsExporter()
        again.update([shown], ex._now_at)
        assert again.exposition() == ex.exposition()

    def warm(self) -> None:
        for k in range(WARM):
            self.until(self.now + timedelta(seconds=30))
            self.gpu(k, False)
            self.increment("ok", 30, 0)
            self.d.c._dirty.add(self.d.key)
            self.evaluate()
        rc = self.d.c.claims[self.d.key]
        assert rc.progressing.observed is Observed.TRUE, rc.progressing.reason


# How far a node's clock runs ahead of ours at a renewal (`Pair.clock`): behind past the limit (unsure),
# behind within it, on time, ahead within the tolerance, skewed ahead.
CLOCKS = tuple(timedelta(seconds=x) for x in (-120, -70, -30, 0, 10, 20, 45))
Step = tuple[int, str, int, int, int]  # (seconds on, increment kind or "gpu"/"gpu-apart"/"none", steps, lag, seed)
STEPS = st.tuples(
    st.integers(1, 100),
    st.sampled_from((*CONFIRMING, *CONFIRMING, *CONFIRMING, *EVENTFUL, SLOW, "gpu", "gpu-apart", "clock", "none")),
    st.integers(1, 40), st.integers(0, 40), st.integers(0, 1 << 16))


def _figure(rc: RunClaims, name: str) -> Any:
    return next(((e.value, e.at) for e in rc.progressing.evidence if e.field == name), None)


def _play(steps: list[Step]) -> Pair:
    p = Pair()
    p.warm()
    for dt, kind, n, lag, seed in steps:
        p.until(p.now + timedelta(seconds=dt))
        if kind in ("gpu", "gpu-apart"):
            p.gpu(seed, kind == "gpu-apart")
        elif kind == "clock":
            p.clock(seed)
        elif kind != "none":
            deferred = p.increment(kind, n, min(lag, dt))
            assert not (deferred and kind in EVENTFUL), kind
    p.until(p.now + timedelta(seconds=200))  # every deferral due by then: D's claims are I's
    assert repr(p.d.c.claims[p.d.key]) == repr(p.i.c.claims[p.i.key])
    return p


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEPS, min_size=1, max_size=12))
@example([(30, "ok", 30, 0, 0), (5, "gpu-apart", 1, 0, 7), (25, "ok", 30, 0, 0), (30, "ok", 30, 0, 0)])
@example([(30, "ok", 30, 0, 0), (20, "hang", 5, 0, 0), (30, "ok", 30, 0, 0)])
@example([(30, "ok", 30, 0, 0), (30, "replay", 30, 0, 0), (30, "ok", 30, 0, 0)])
@example([(30, "ok", 30, 0, 0), (5, "clock", 1, 0, 0), (25, "ok", 30, 0, 0), (30, "ok", 30, 0, 0)])
@example([(30, "ok", 30, 0, 0), (5, "clock", 1, 0, 24), (25, "ok", 30, 0, 0), (30, "ok", 30, 0, 0)])
def test_a_deferred_increment_only_confirms_and_its_evaluation_when_due_is_the_immediate_one(
        steps: list[Step]) -> None:
    _play(steps)


def test_a_node_clock_measured_anew_is_judged_at_once_and_a_skewed_runs_steps_wait_for_it() -> None:
    """A node's clock measured anew (its Lease renewed 45 s ahead, then on time again) marks no run, and
    its stamps move (`since` with them): the run's next increment is evaluated at once, not deferred
    (`ChangeApplier._clocks_seen`). While that clock stays ahead the run's increments are deferred
    again, its steps not carried to the export (placed on our clock by the evaluation)."""
    p = _play([(30, "ok", 30, 0, 0), (5, "clock", 1, 0, 24), (25, "ok", 30, 0, 0), (30, "ok", 30, 0, 0),
               (5, "clock", 1, 0, 12), (25, "ok", 30, 0, 0), (30, "ok", 30, 0, 0)])
    assert CLOCKS[(24 >> 2) % len(CLOCKS)] == timedelta(seconds=45) and CLOCKS[(12 >> 2) % len(CLOCKS)] == timedelta(0)
    assert p.refused.get("ok") == 2 and p.skewed == 1
    assert p.d.key not in p.d.c._clocks_seen  # (on time again: nothing kept)


def test_the_live_heads_cadence_is_deferred_and_every_eventful_kind_refused() -> None:
    """A head read every 30 s: its increments deferred (not every one evaluated), and each eventful kind,
    arriving while the run progresses, refused."""
    p = _play([(30, "ok", 30, 0, 0)] * 8)
    assert p.deferred >= 4 and p.fired >= 1
    for kind in (*EVENTFUL, SLOW):
        q = Pair()
        q.warm()
        q.until(q.now + timedelta(seconds=30))
        assert q.increment("ok", 30, 0)  # (the run's claims admit a deferral now)
        q.until(q.now + timedelta(seconds=10))
        assert not q.increment(kind, 10, 0), kind


def test_a_gpu_apart_on_a_run_at_its_pace_is_said_by_the_deferred_evaluation() -> None:
    """A GPU pass does not re-evaluate a progressing run whose devices stayed (`runs_changed`), nor
    does a deferral compare its GPUs: a GPU apart while the run keeps its pace is a note (no suspect),
    said by the deferred evaluation, within `confirm_refresh`; a slower pace is evaluated at once (the
    suspect named then, `test_a_gpu_apart_on_a_slower_run_is_named_at_once`)."""
    p = Pair()
    p.warm()
    p.until(p.now + timedelta(seconds=30))
    assert p.increment("ok", 30, 0)
    p.until(p.now + timedelta(seconds=5))
    p.gpu(7, True)
    assert p.d.key not in p.d.c._dirty  # (the pass alone: not re-evaluated)
    p.until(p.now + timedelta(seconds=25))
    assert p.increment("ok", 30, 0)
    assert p.d.c.claims[p.d.key].stragglers is None  # (the note waits for the deferred evaluation)
    i_st = p.i.c.claims[p.i.key].stragglers
    assert i_st is not None and not i_st.suspects and "reads apart" in i_st.reason, i_st
    due = p.d.c._rechecks.next_deferred()
    assert due is not None and due - p.now <= ClaimSettings().confirm_refresh
    last = p.d.c.claims[p.d.key].evaluated_at  # (each increment's newer step may move the deferral on to
    fired = p.fired  # the interval's end, never past it)
    while p.fired == fired:  # the head printing on, each increment deferred, until the deferral fires
        assert p.now < last + ClaimSettings().confirm_refresh
        p.until(p.now + timedelta(seconds=30))
        if p.fired == fired:
            assert p.increment("ok", 30, 0)
    st_ = p.d.c.claims[p.d.key].stragglers
    assert st_ is not None and not st_.suspects and "reads apart" in st_.reason, st_
    # and with the note standing, the next confirming increment is deferred again
    assert p.increment("ok", 30, 0)


def test_a_gpu_apart_on_a_slower_run_is_named_at_once() -> None:
    """A GPU apart while the run falls behind its own pace: the increment that shows the slower pace is
    evaluated at once, and names the GPU."""
    p = Pair()
    p.warm()
    p.until(p.now + timedelta(seconds=30))
    p.gpu(7, True)
    for _ in range(4):  # steps three seconds apart: the recent median falls behind the baseline
        p.until(p.now + timedelta(seconds=30))
        deferred = p.increment(SLOW, 10, 0)
    assert not deferred
    st_ = p.d.c.claims[p.d.key].stragglers
    assert st_ is not None and [s.gpu for s in st_.suspects], st_


def test_no_deferral_when_the_setting_is_zero_the_claims_are_due_or_the_steps_left_a_gap() -> None:
    p = Pair()
    p.warm()
    p.d.c.settings = replace(p.d.c.settings, claims=replace(p.d.c.settings.claims, confirm_refresh=timedelta(0)))
    p.until(p.now + timedelta(seconds=30))
    assert not p.increment("ok", 30, 0)

    def held_back() -> tuple[Pair, datetime]:
        p = Pair()
        p.warm()
        rc = p.d.c.claims[p.d.key]
        assert rc.recheck_at is not None and rc.recheck_other is not None and rc.recheck_other > rc.recheck_at
        p.d.c._rechecks.set(p.d.key, None, p.now)  # (its clock's recheck held back, as a spent CPU budget does)
        p.i.c._rechecks.set(p.i.key, None, p.now)
        return p, rc.recheck_at

    # past its newest step's window, steps since that leave no gap as long as the window's floor: the
    # window never closed, and the newer steps stand for the old one's (its other bounds still ahead)
    p, window = held_back()
    p.at(window + timedelta(seconds=1))
    assert p.increment("ok", 30, 0)
    # ... a gap longer than the floor before them: a stall an evaluation must judge
    p, window = held_back()
    p.at(window + timedelta(seconds=40))
    assert not p.increment("ok", 30, 0)
    # ... or its clock's entry came due before the increment: judged now, as it would have been
    p = Pair()
    p.warm()
    due = p.d.c._rechecks.due_of(p.d.key)
    assert due is not None
    p.at(due + timedelta(seconds=1))
    assert not p.increment("ok", 30, 0)


# --- the loop -------------------------------------------------------------------------------------


def _wait(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _warmed(refresh: timedelta) -> tuple[_Fleet, Feed]:
    """A fleet (no full pass but the first, `tick` an hour) whose run is progressing after WARM agent
    passes (GPU readings, the workers' quiet increments, the head's 30 steps, an evaluation each),
    its loop not started."""
    gpuspread._CORES = ByInputs()
    f = _Fleet(refresh, tick=timedelta(hours=1))
    feed = Feed()
    for k in range(WARM):
        f.move(30)
        for ch in f.gpu_changes(k):
            f.c._apply(ch)
        f.quiet_workers()
        scan, after = feed.increment("ok", f.clock[0], 30, 0)
        f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
        f.c._dirty.add(f.key)  # (evaluated each pass: no deferral left pending when the loop starts)
        f.c.evaluate()
    return f, feed


@contextmanager
def _looping(refresh: timedelta) -> Iterator[tuple[_Fleet, Feed]]:
    """`_warmed`'s fleet with its loop running on its own thread, after the loop's first full pass."""
    f, feed = _warmed(refresh)
    n0 = f.c.evaluations
    t = threading.Thread(target=f.c._loop, daemon=True)
    t.start()
    try:
        assert _wait(lambda: f.c.evaluations > n0)  # its first full pass (the run, just evaluated, skipped)
        yield f, feed
    finally:
        f.c.request_stop()
        t.join(5)


def test_the_loop_defers_confirming_increments_evaluates_eventful_ones_at_once_and_keeps_deadlines() -> None:
    with _looping(timedelta(seconds=120)) as (f, feed):
        def put(kind: str, n: int = 30) -> None:
            scan, after = feed.increment(kind, f.clock[0], n, 0)
            f.c.put(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))

        move = f.move

        def evaluated() -> datetime:
            return f.c.claims[f.key].evaluated_at

        t0 = evaluated()
        d0, fired0 = f.c._rechecks.deferrals, f.c._rechecks.deferred_due
        assert f.c.claims[f.key].progressing.observed is Observed.TRUE
        # a confirming increment 30 s on: not evaluated
        move(30)
        put("ok")
        assert _wait(lambda: f.c._rechecks.deferrals == d0 + 1)
        time.sleep(0.3)
        assert evaluated() == t0
        due = f.c._rechecks.next_deferred()
        assert due is not None and due <= t0 + timedelta(seconds=120)
        # ... until its deferral comes due (here the stall window of the last evaluated step: sooner)
        move((due - f.clock[0]).total_seconds() - 1)
        time.sleep(0.3)
        assert evaluated() == t0
        move(1)
        assert _wait(lambda: evaluated() > t0)
        assert f.c.claims[f.key].progressing.observed is Observed.TRUE
        assert f.c._rechecks.deferred_due == fired0 + 1
        # an eventful one (a collective timed out): at once
        t1 = evaluated()
        move(5)
        put("hang", 3)
        assert _wait(lambda: evaluated() > t1)
        rc = f.c.claims[f.key]
        assert rc.progressing.observed is Observed.FALSE and "watchdog timeout" in rc.progressing.reason, \
            rc.progressing.reason
        assert f.c._rechecks.deferrals == d0 + 1


def test_a_steady_stream_is_evaluated_at_the_interval_not_at_its_first_increments_window() -> None:
    """Confirming increments every 30 s: each newer step moves the deferral later (its stall window
    closes later), so the run is evaluated once per refresh interval (240 s: at its refresh,
    `recheck.refresh_due`), not when the first deferred increment's window would have closed."""
    refresh = timedelta(seconds=240)
    with _looping(refresh) as (f, feed):
        move = f.move
        t0 = f.c.claims[f.key].evaluated_at
        expected = refresh_due(f.key, t0, refresh)
        floor = ClaimSettings().stall_floor + ClaimSettings().scrape_interval
        assert t0 + refresh / 2 <= expected <= t0 + refresh
        d0 = f.c._rechecks.deferrals
        dues = []
        # (increments until the newest one's window closes past the refresh, all before it)
        n = int((expected - t0 - floor).total_seconds() // 30) + 1
        for i in range(1, n + 1):  # +30, +60, ... s
            move(30)  # a pass as agents send it: GPU readings, the workers' quiet logs, the head's steps
            for change in (*f.gpu_changes(WARM + i), *f.worker_changes()):
                f.c.put(change)
            scan, after = feed.increment("ok", f.clock[0], 30, 0)
            f.c.put(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
            assert _wait(partial(lambda n: f.c._rechecks.deferrals == n, d0 + i)), i
            dues.append(f.c._rechecks.next_deferred())
        time.sleep(0.3)
        assert f.c.claims[f.key].evaluated_at == t0
        first_window = t0 + timedelta(seconds=30) + floor
        assert dues[0] is not None and dues[0] <= first_window  # the first: its own step's window
        assert dues[-1] == expected  # the last: the refresh, later than the first's
        move((first_window - f.clock[0]).total_seconds() + 5)  # past the first one's window: not due
        time.sleep(0.3)
        assert f.c.claims[f.key].evaluated_at == t0
        move((expected + timedelta(seconds=1) - f.clock[0]).total_seconds())
        assert _wait(lambda: f.c.claims[f.key].evaluated_at > t0)
        assert f.c.claims[f.key].progressing.observed is Observed.TRUE


def test_the_loop_still_fires_a_deadline_earlier_than_the_interval() -> None:
    """A deferred increment, then silence: the run's progressing turns (unknown: no read after the
    window) when the window of its newest step closes, a deadline sooner than the refresh interval,
    not the interval after its last evaluation."""
    with _looping(timedelta(minutes=10)) as (f, feed):
        move = f.move
        t0 = f.c.claims[f.key].evaluated_at
        d0 = f.c._rechecks.deferrals
        move(30)
        scan, after = feed.increment("ok", f.clock[0], 30, 0)
        newest = f.clock[0]
        f.c.put(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
        assert _wait(lambda: f.c._rechecks.deferrals == d0 + 1)
        # the loop follows the clock: in steps, as the deadlines come (no increment after this one)
        for _ in range(30):
            move(5)
            time.sleep(0.1)
            rc = f.c.claims[f.key]
            if rc.progressing.observed is not Observed.TRUE:
                break
        rc = f.c.claims[f.key]
        # (no read after the window: unknown, not yet stalled, which only a read after it can show)
        assert rc.progressing.observed is Observed.UNKNOWN and "stall window closed" in rc.progressing.reason, \
            rc.progressing.reason
        window = ClaimSettings().stall_floor + ClaimSettings().scrape_interval  # (a step a second: the floor)
        assert rc.evaluated_at <= newest + window + timedelta(seconds=10)
        assert rc.evaluated_at < t0 + timedelta(minutes=10)


@pytest.mark.parametrize("kind", (*CONFIRMING, *EVENTFUL))
def test_each_eventful_kind_is_refused_by_the_increment_alone(kind: str) -> None:
    from collector.planes.signals import uneventful
    feed = Feed()
    now = NOW0
    scan, _ = feed.increment("ok", now, 30, 0)
    held = Signal(Ref("Pod", "ns", "p"), "main", scan, now)
    now += timedelta(seconds=30)
    inc, after = feed.increment(kind, now, 10, 0)
    assert after is not None
    newest = uneventful(held, Signal(held.ref, "main", inc, now), after)
    assert (newest is not None) == (kind in CONFIRMING), kind
    assert newest is None or newest == inc.samples[-1]


def test_a_deferral_replaces_the_runs_clock_entry_and_earlier_deferral_and_an_evaluation_covers_it() -> None:
    from collector.recheck import Rechecks
    r: Rechecks[str] = Rechecks()
    t = NOW0
    r.set("a", t + timedelta(seconds=60), t)
    r.set("z", t + timedelta(seconds=65), t)
    r.defer("a", t + timedelta(seconds=20))
    r.defer("a", t + timedelta(seconds=90))  # a newer one (a newer step's window) replaces it, and a's clock
    r.defer("b", t + timedelta(seconds=30))
    assert r.next_deferred() == t + timedelta(seconds=30) and r.deferrals == 3 and r.deferred_of("a") == \
        t + timedelta(seconds=90)
    assert r.pop_deferred(t + timedelta(seconds=25)) == []  # (a's first deferral no longer counts)
    assert r.due_of("a") is None and r.next_due() == t + timedelta(seconds=65) + r.slack  # (z's, untouched)
    assert r.pop_deferred(t + timedelta(seconds=40)) == ["b"]
    assert r.pop_due(t + timedelta(seconds=70)) == ["z"]  # (a's clock entry went with its deferral)
    r.set("a", t + timedelta(seconds=70), t + timedelta(seconds=41))  # evaluated: its deferral is covered
    assert r.next_deferred() is None and r.pop_deferred(t + timedelta(hours=1)) == []
    assert r.deferred_due == 1 and r.due_of("a") == t + timedelta(seconds=70) + r.slack
    r.defer("c", t + timedelta(seconds=80))
    r.forget("c")
    assert r.next_deferred() is None and r.deferred_of("c") is None and len(r) == 1


def test_the_full_pass_skips_a_run_a_deferral_covers(caplog: pytest.LogCaptureFixture) -> None:
    """The tick's full pass (a backstop) marks every run but one whose deferred re-evaluation comes
    within the longer of MAX_TICK_S and `confirm_refresh` of its last evaluation: that one is evaluated
    when its deferral is due, once, not also by the pass; so is one deferred past MAX_TICK_S by a longer
    `confirm_refresh` (at 50k pods, 240 s evaluated more runs than 120 s while the pass did not leave
    those). Past TaugridClaimsNotEvaluated's threshold the controller says so as it starts."""
    from collector.controller import MAX_TICK_S, NOT_EVALUATED_ALERT_S
    for refresh in (timedelta(seconds=120), timedelta(seconds=MAX_TICK_S + 60), timedelta(seconds=360)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="taugrid.controller"):
            f, feed = _warmed(refresh)
        warned = [r for r in caplog.records if "confirm_refresh is longer" in r.getMessage()]
        assert bool(warned) is (refresh.total_seconds() > NOT_EVALUATED_ALERT_S)
        assert all(r.__dict__["confirm_refresh_s"] == 360 for r in warned)
        for k in range(2):  # two passes, 30 s apart: the deferral at the newer step's window or the refresh
            f.move(30)
            for change in (*f.gpu_changes(WARM + k), *f.worker_changes()):
                f.c._apply(change)
            scan, after = feed.increment("ok", f.clock[0], 30, 0)
            f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
        due = f.c._rechecks.deferred_of(f.key)
        assert f.key not in f.c._dirty and due is not None
        assert due <= f.c.claims[f.key].evaluated_at + max(refresh, timedelta(seconds=MAX_TICK_S))
        f.c.tick_s = 100.0  # (evaluated 60 s ago: not in the last half tick)
        f.c._mark_all()
        assert f.key not in f.c._dirty, refresh
        f.c._rechecks.defer(f.key, f.c.claims[f.key].evaluated_at + max(refresh, timedelta(seconds=MAX_TICK_S))
                            + timedelta(seconds=1))  # (none is due later: if one were, the pass would not wait)
        f.c._mark_all()
        assert f.key in f.c._dirty, refresh


def test_the_full_pass_skips_a_run_whose_deferral_came_due_in_the_last_max_tick_half() -> None:
    """A run whose deferral came due in the last MAX_TICK_S / 2 (just evaluated for it; the next
    increment defers it again) is not evaluated again by the pass, however short the tick is (a pass
    that skipped most runs shrinks it); one whose deferral came due earlier is, and so is one evaluated
    recently for anything else (the pass is the backstop for what no change marks)."""
    f, _ = _warmed(timedelta(seconds=120))
    f.c.tick_s = 5.0
    t = f.c.claims[f.key].evaluated_at
    f.c._mark_all()
    assert f.key in f.c._dirty  # (evaluated just now, by the warm-up's own evaluation: marked all the same)
    f.c._rechecks.defer(f.key, t + timedelta(seconds=10))
    f.clock[0] = t + timedelta(seconds=10)
    assert f.c._rechecks.pop_deferred(f.clock[0]) == [f.key]
    for seconds, marked in ((59, False), (61, True)):
        f.c._dirty.clear()
        f.clock[0] = t + timedelta(seconds=10 + seconds)
        f.c._mark_all()
        assert (f.key in f.c._dirty) is marked, seconds


def test_a_signal_read_again_copies_every_field_but_its_read_time_and_ref() -> None:
    """`Signal.read_again` builds the signal directly (the quiet containers' path): it names every field
    (a field added to the class and not copied would be lost on each pass)."""
    from dataclasses import fields

    from collector.model import Plane
    assert tuple(f.name for f in fields(Signal)) == (  # (the fields `read_again` copies: one added here too)
        "ref", "source", "scan", "read_at", "plane", "durable", "retired", "unseen")
    scan = LogScan("x", FMT, (), (), (), (), 3)
    sig = Signal(Ref("Pod", "ns", "p", "uid-1"), "c", scan, NOW0, Plane.GPU, True, True, "previous log")
    ref = Ref("Pod", "ns", "p")
    again = sig.read_again(NOW0 + timedelta(seconds=30), ref)
    assert again == replace(sig, read_at=NOW0 + timedelta(seconds=30), ref=ref) and again.ref is ref


def test_carried_claims_copy_every_field_but_the_last_step_and_loss() -> None:
    """`planes.signals.carried` builds the run's claims directly (on every agent pass of every deferred run):
    it names every field of the three classes it builds (one added to a class and not copied would be lost
    between evaluations), and gives what `replace` of the last step's and loss's evidence gives."""
    from dataclasses import fields

    from collector.model import Blocked, Evidence, Stage, Verdict
    from collector.planes.signals import carried
    assert tuple(f.name for f in fields(Evidence)) == ("plane", "ref", "field", "value", "at", "cluster")
    assert tuple(f.name for f in fields(Claim)) == (
        "asserted", "observed", "verdict", "since", "reason", "evidence", "cause")
    assert tuple(f.name for f in fields(RunClaims)) == (
        "ref", "scheduled", "running", "progressing", "blocked", "evaluated_at", "finished", "goodput", "extra",
        "recheck_at", "recheck_other", "queue", "stragglers", "work_at_risk", "energy")
    at = NOW0 - timedelta(seconds=5)
    ev = (Evidence(Plane.LOGS, "pod/c", "last_step", 1200, at, "east"),
          Evidence(Plane.LOGS, "pod/c", "last_loss", 2.5, at, "east"),
          Evidence(Plane.GPU, "node/n", "sm_active", 0.9, at),
          Evidence(Plane.LOGS, "pod/c", "stall_window_s", 60.0, None))
    claim = Claim(True, Observed.TRUE, Verdict.VERIFIED, at, "steps advancing", ev, "")
    other = Claim(True, Observed.TRUE, Verdict.VERIFIED, at - timedelta(minutes=3), "pods running", ev[2:], "")
    blocked = Blocked(list(Stage)[0], "waiting", at)
    rc = RunClaims(Ref("TauRun", "ns", "r", "uid-1"), other, other, claim, blocked, NOW0, False, None,
                   {"queue": "q"}, NOW0 + timedelta(minutes=2), NOW0 + timedelta(minutes=1))
    newest = ProgressSample(1230, NOW0 + timedelta(seconds=20), 2.25, 1231, FMT, total=TOTAL)
    got = carried(rc, newest)

    def moved(e: Evidence) -> Evidence:
        if e.field == "last_step":
            return replace(e, value=newest.step, at=newest.at)
        if e.field == "last_loss":
            return replace(e, value=newest.loss, at=newest.at)
        return e
    assert got == replace(rc, progressing=replace(claim, evidence=tuple(map(moved, ev))))
    assert got.blocked is blocked and got.extra is rc.extra and got.scheduled is other
    assert got.progressing.evidence[2] is ev[2] and got.progressing.evidence[0].cluster == "east"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("set", "drop")), st.integers(0, 11), st.integers(0, 3)), max_size=40))
def test_an_objects_signals_are_held_as_a_dict_of_them_by_source(ops: list[tuple[str, int, int]]) -> None:
    """`RunIndex` holds an object's signals as a tuple up to SMALL_SIGNALS, a dict past it: what it reads
    back (`signal_of`, `signals_of`, in order) is what one dict by source holds, over sets and drops
    (hypothesis: containers past the bound, replaced in place, dropped and set again)."""
    from collector.correlate import SMALL_SIGNALS, RunIndex
    assert SMALL_SIGNALS < 12
    index = RunIndex()
    ref = Ref("Pod", "ns", "p")
    model: dict[str, Signal] = {}
    for op, c, v in ops:
        source = f"c{c}"
        if op == "set":
            sig = Signal(ref, source, LogScan(source, None, (), (), (), (), v), NOW0 + timedelta(seconds=v))
            index.set_signal(sig)
            model[source] = sig
        else:
            index.drop_signal(ref, source)
            model.pop(source, None)
        assert list(index.signals_of(ref.key)) == list(model.values())
        assert all(index.signal_of(ref, f"c{k}") is model.get(f"c{k}") for k in range(12))
    assert list(index.all_signals()) == list(model.values())


def test_a_runs_signals_and_clock_ahead_are_what_its_evidence_says() -> None:
    """`RunIndex.run_signals` (the deferral's view: no objects filed) gives `evidence`'s signals (in no set
    order), and what its pods' nodes' clocks say (ahead, unsure, behind: `clock_marks` of its evidence),
    retired pods' signals and nodes included; None where every clock runs with ours."""
    def by_source(signals: list[Signal]) -> list[Signal]:
        return sorted(signals, key=lambda g: (g.ref.key, g.source))

    p = Pair()
    p.warm()
    c = p.d.c
    root = c.index.get(*p.d.key)
    assert root is not None
    s = timedelta(seconds=1)
    for skews, unsure, behind in (({}, set(), {}), ({"gpu-01": -3 * s}, {"gpu-03"}, {}),
                                  ({"gpu-00": 4 * s, "gpu-02": 9 * s}, set(), {"gpu-01": None}),
                                  ({}, {"gpu-09"}, {"gpu-08": s})):
        c.index.node_skew, c.index.node_clock_unsure, c.index.node_behind = dict(skews), set(unsure), dict(behind)
        signals, marks = c.index.run_signals(root.ref)
        ev = c.index.evidence(root.ref)
        assert by_source(signals) == ev.signals and len(signals) == PODS
        assert marks == clock_marks(ev.node_skew, ev.node_clock_unsure, ev.node_behind)
        mine = {"gpu-00", "gpu-01", "gpu-02", "gpu-03"}
        assert (marks is None) is not bool(skews.keys() & mine or unsure & mine or behind.keys() & mine)
    worker = p.d.pods[1]["metadata"]
    c.index.delete(Ref("Pod", worker["namespace"], worker["name"]))  # (its signal kept, retired, if it has steps)
    signals, _ = c.index.run_signals(root.ref)
    assert by_source(signals) == c.index.evidence(root.ref).signals and signals
