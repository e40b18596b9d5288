"""While the loop is behind its log producers (the log backlog at least half spent), a log change's
re-evaluation of a run evaluated less than OVERLOAD_COALESCE ago waits until then, or until the run's
clock or deferral if sooner (`ChangeApplier._coalesced`, issue 30: a 150k start evaluated each run on
each of its containers' first documents). Two controllers fed alike, as in test_confirm_defer: D with
its backlog spent, I evaluating every change at once. Whenever D evaluates the run, its verdicts are
I's then; D never waits past OVERLOAD_COALESCE after its last evaluation nor past its clock's due."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.changes import OVERLOAD_COALESCE
from collector.controller import Controller
from collector.correlate import Signal
from collector.model import Observed, RunClaims
from collector.planes.base import Change
from tests.controller.test_confirm_defer import (
    CONFIRMING,
    EVENTFUL,
    SLOW,
    Pair,
    _looping,
    _wait,
    _warmed,
)

NOW = datetime(2026, 12, 6, 1, 0, tzinfo=UTC)


def _spent(c: Controller) -> None:
    backlog = c._log_backlog
    backlog.held = backlog.limit  # (the producers waiting: what `put_log` takes and the loop gives back)


def test_a_log_change_waits_for_the_interval_after_the_last_evaluation_only_under_overload() -> None:
    for overloaded in (False, True):
        f, feed = _warmed(timedelta(0))  # (no confirming deferral: every increment would be evaluated)
        if overloaded:
            _spent(f.c)
        t = f.c.claims[f.key].evaluated_at
        f.move(5)
        scan, after = feed.increment("hang", f.clock[0], 3, 0)  # (eventful: judged at once but for overload)
        c0 = f.c.coalesced
        f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
        assert (f.key in f.c._dirty) is not overloaded
        assert f.c.coalesced == c0 + overloaded
        if overloaded:
            due = f.c._rechecks.deferred_of(f.key)
            clock = f.c.claims[f.key].recheck_at
            assert due is not None and due <= t + OVERLOAD_COALESCE
            assert clock is None or due <= clock + f.c._rechecks.slack
            # ... and judged then, with the finding
            f.clock[0] = due
            f.c._dirty.update(f.c._rechecks.pop_deferred(due))
            f.c.evaluate()
            rc = f.c.claims[f.key]
            assert rc.evaluated_at == due and rc.progressing.observed is Observed.FALSE, rc.progressing.reason


def test_an_earlier_clock_due_is_kept_and_a_due_passed_or_an_old_evaluation_is_judged_at_once() -> None:
    f, feed = _warmed(timedelta(0))
    _spent(f.c)
    t = f.c.claims[f.key].evaluated_at
    f.c._rechecks.set(f.key, t + timedelta(seconds=10), t)  # the run's claims due by the clock sooner
    f.move(5)
    assert f.c._coalesced(f.key)
    assert f.c._rechecks.deferred_of(f.key) == t + timedelta(seconds=10) + f.c._rechecks.slack
    f.move(6)  # that due has passed: now
    assert not f.c._coalesced(f.key)
    f.c._rechecks.set(f.key, None, t)  # no clock entry; the last evaluation OVERLOAD_COALESCE ago
    f.c._rechecks.forget(f.key)
    f.clock[0] = t + OVERLOAD_COALESCE
    assert not f.c._coalesced(f.key)
    f.clock[0] = t + OVERLOAD_COALESCE / 2
    f.c._dirty.add(f.key)  # marked anyway: nothing to defer
    assert not f.c._coalesced(f.key)
    f.c._dirty.clear()
    assert not f.c._coalesced(("TauRun", "ns", "never-evaluated"))
    f.c._log_backlog.held = f.c._log_backlog.limit // 2 - 1  # less than half spent: not behind
    assert not f.c._coalesced(f.key)
    f.c._log_backlog.held += 1
    assert f.c._coalesced(f.key)


def test_a_confirming_increment_after_a_coalesced_change_does_not_put_its_evaluation_off() -> None:
    """A hang coalesced (judged 30 s after the last evaluation at the latest), then an increment that
    only carries the trainer on: its deferral (the refresh interval, 120 s) may not move the hang's
    evaluation later (`Rechecks.defer(firm=True)`); once the run is evaluated, deferrals move freely."""
    f, feed = _warmed(timedelta(seconds=120))
    _spent(f.c)
    t = f.c.claims[f.key].evaluated_at
    f.move(5)
    scan, after = feed.increment("hang", f.clock[0], 3, 0)
    f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
    promised = f.c._rechecks.deferred_of(f.key)
    assert f.c.coalesced == 1 and promised is not None and promised <= t + OVERLOAD_COALESCE
    f.move(10)
    scan, after = feed.increment("ok", f.clock[0], 10, 0)
    f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
    assert f.key not in f.c._dirty and f.c._rechecks.deferred_of(f.key) == promised
    f.clock[0] = promised
    f.c._dirty.update(f.c._rechecks.pop_deferred(promised))
    assert "timeout_ms=600000" not in repr(f.c.claims[f.key].progressing.evidence)
    f.c.evaluate()
    rc = f.c.claims[f.key]  # judged then, the hang among its evidence (the steps after it: progressing)
    assert rc.evaluated_at == promised and "timeout_ms=600000" in repr(rc.progressing.evidence), rc.progressing


def test_a_firm_deferral_moves_earlier_never_later_until_the_run_is_evaluated() -> None:
    from collector.recheck import Rechecks
    r: Rechecks[str] = Rechecks()
    t = NOW
    r.defer("a", t + timedelta(seconds=30), firm=True)
    r.defer("a", t + timedelta(seconds=120))
    assert r.deferred_of("a") == t + timedelta(seconds=30)
    r.defer("a", t + timedelta(seconds=10))  # sooner: taken
    assert r.deferred_of("a") == t + timedelta(seconds=10)
    r.defer("a", t + timedelta(seconds=60))  # (a later one replaces it, as deferrals do: up to the firm one)
    assert r.deferred_of("a") == t + timedelta(seconds=30)
    r.set("a", t + timedelta(seconds=300), t + timedelta(seconds=1))  # evaluated: the promise kept
    r.defer("a", t + timedelta(seconds=120))
    assert r.deferred_of("a") == t + timedelta(seconds=120)
    r.defer("b", t + timedelta(seconds=30), firm=True)
    assert r.pop_deferred(t + timedelta(seconds=30)) == ["b"]
    r.defer("b", t + timedelta(seconds=90))  # (fired: no longer held)
    assert r.deferred_of("b") == t + timedelta(seconds=90)
    r.defer("c", t + timedelta(seconds=30), firm=True)
    r.forget("c")
    r.defer("c", t + timedelta(seconds=90))
    assert r.deferred_of("c") == t + timedelta(seconds=90)


def test_a_quiet_containers_read_near_its_evidence_bound_waits_under_overload_too() -> None:
    """A quiet container read again after half the evidence bound marks its run (its evidence would
    age out): coalesced like any log change, never past the run's clock (which ages it out on time)."""
    f, _ = _warmed(timedelta(0))
    _spent(f.c)
    max_age = f.c.settings.claims.evidence_max_age
    t = f.c.claims[f.key].evaluated_at
    f.move(1)
    worker = f.worker_changes()[0]
    sig, _ = worker.payload
    held = f.c.index.signal_of(sig.ref, sig.source)
    assert held is not None
    late = Signal(sig.ref, sig.source, sig.scan, held.read_at + max_age / 2 + timedelta(seconds=1))
    f.c._apply(Change("agent-log", None, (late, 3)))
    assert f.key not in f.c._dirty and f.c._rechecks.deferred_of(f.key) is not None
    assert f.c._rechecks.deferred_of(f.key) <= t + OVERLOAD_COALESCE  # type: ignore[operator]


def test_the_loop_judges_a_coalesced_change_when_it_comes_due() -> None:
    with _looping(timedelta(0)) as (f, feed):
        _spent(f.c)  # (changes `put` whole weigh nothing: the backlog stays spent)
        t = f.c.claims[f.key].evaluated_at
        f.move(5)
        scan, after = feed.increment("hang", f.clock[0], 3, 0)
        f.c.put(Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)))
        assert _wait(lambda: f.c.coalesced == 1)
        time.sleep(0.3)
        assert f.c.claims[f.key].evaluated_at == t
        due = f.c._rechecks.deferred_of(f.key)
        assert due is not None
        f.move((due - f.clock[0]).total_seconds())
        assert _wait(lambda: f.c.claims[f.key].evaluated_at > t)
        rc = f.c.claims[f.key]
        assert rc.progressing.observed is Observed.FALSE and "watchdog timeout" in rc.progressing.reason


def _verdicts(rc: RunClaims) -> tuple[object, ...]:
    """What a run's claims say (not since when: an evaluation a coalesced change skipped may have seen
    a verdict come and go, which D never saw, so its `since` may be earlier than I's)."""
    claims = tuple((c.asserted, c.observed, c.verdict, c.cause) for c in (rc.scheduled, rc.running, rc.progressing))
    suspects = rc.stragglers.suspects if rc.stragglers is not None else ()
    return claims, suspects, rc.blocked is None, rc.finished


class Coalescing(Pair):
    """Pair's two controllers, D's backlog spent: D defers confirming increments (`confirm_refresh`)
    and coalesces the rest, I evaluates every change at once. Where D evaluates the run its verdicts
    must be I's at that instant; a change D coalesced is judged by the time it was put off to (no
    later change, a confirming increment's deferral say, may push it later)."""

    def __init__(self) -> None:
        super().__init__()
        self.coalesced = 0
        self.promised: datetime | None = None  # the latest D may evaluate the run at: a change coalesced

    def kept(self) -> None:
        """D's next evaluation of the run comes no later than what a coalesced change was promised."""
        if self.promised is None or self.d.key in self.d.c._dirty:
            return
        r = self.d.c._rechecks
        nxt = min((x for x in (r.deferred_of(self.d.key), r.due_of(self.d.key)) if x is not None), default=None)
        assert nxt is not None and nxt <= self.promised, (nxt, self.promised)

    def evaluate(self) -> None:
        d_dirty = self.d.key in self.d.c._dirty
        self.d.c.evaluate()
        self.i.c._dirty.add(self.i.key)
        self.i.c.evaluate()
        if d_dirty:
            d, i = self.d.c.claims[self.d.key], self.i.c.claims[self.i.key]
            assert _verdicts(d) == _verdicts(i), (d, i)
            assert self.promised is None or self.now <= self.promised
            self.promised = None

    def gpu(self, seed: int, apart: bool) -> None:
        super().gpu(seed, apart)
        self.kept()

    def increment(self, kind: str, n: int, lag: int) -> bool:
        scan, after = self.feed.increment(kind, self.now, n, lag)
        c0 = self.d.c.coalesced
        for f in (self.d, self.i):
            f.c._apply(Change("agent-log", None, (Signal(f.head, f.container, scan, self.now), after)))
        waited = self.d.key not in self.d.c._dirty
        if self.d.c.coalesced > c0:
            held = self.d.c.claims[self.d.key]
            due = self.d.c._rechecks.deferred_of(self.d.key)
            assert due is not None and self.now < due <= held.evaluated_at + OVERLOAD_COALESCE
            assert held.recheck_at is None or due <= held.recheck_at + self.d.c._rechecks.slack
            self.coalesced += 1
            self.promised = due if self.promised is None else min(self.promised, due)
        self.kept()
        if waited:
            self.i.c._dirty.add(self.i.key)
            self.i.c.evaluate()
        else:
            self.evaluate()
        return waited


def _play(steps: list[tuple[int, str, int, int, int]]) -> Coalescing:
    p = Coalescing()
    p.warm()
    _spent(p.d.c)
    for dt, kind, n, lag, seed in steps:
        p.until(p.now + timedelta(seconds=dt))
        if kind in ("gpu", "gpu-apart"):
            p.gpu(seed, kind == "gpu-apart")
        elif kind != "none":
            p.increment(kind, n, min(lag, dt))
    p.until(p.now + OVERLOAD_COALESCE)  # every wait over: D has judged all it was handed, as I has
    p.d.c._dirty.add(p.d.key)  # (and both at the same instant)
    p.evaluate()
    return p


STEPS = st.tuples(
    st.integers(1, 40),
    st.sampled_from((*CONFIRMING, *CONFIRMING, *EVENTFUL, SLOW, "gpu", "gpu-apart", "none")),
    st.integers(1, 40), st.integers(0, 40), st.integers(0, 1 << 16))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEPS, min_size=1, max_size=10))
@example([(5, "hang", 3, 0, 0), (10, "ok", 30, 0, 0), (40, "ok", 30, 0, 0)])
@example([(5, "ok", 5, 0, 0), (3, "xid", 3, 0, 0), (3, "resume", 3, 0, 0), (30, "ok", 30, 0, 0)])
def test_a_coalesced_run_says_what_an_immediate_evaluation_says_whenever_it_is_evaluated(
        steps: list[tuple[int, str, int, int, int]]) -> None:
    _play(steps)


def test_the_search_coalesces_and_its_oracle_can_fail() -> None:
    """The property above is not vacuous: changes do wait, and a D judged on stale inputs (its
    coalesced evaluations made without the change) is caught."""
    p = _play([(5, "hang", 3, 0, 0), (10, "ok", 30, 0, 0), (40, "ok", 30, 0, 0)])
    assert p.coalesced >= 2
    q = Coalescing()
    q.warm()
    _spent(q.d.c)
    q.until(q.now + timedelta(seconds=5))
    scan, after = q.feed.increment("hang", q.now, 3, 0)
    q.i.c._apply(Change("agent-log", None, (Signal(q.i.head, q.i.container, scan, q.now), after)))  # I alone
    q.until(q.now + timedelta(seconds=1))
    q.d.c._dirty.add(q.d.key)
    try:
        q.evaluate()
    except AssertionError:
        return
    raise AssertionError("a D that missed the hang was not told apart from I")
