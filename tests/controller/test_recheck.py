"""Clock-driven claim changes happen on time, without full passes (issue 9).

The full re-evaluation tick is forced to 10 minutes, so only the per-run deadlines
(`RunClaims.recheck_at`, kept by `collector.recheck`) can turn claims over in these tests: through
the live controller against the API simulator, on a manual clock shared by the test.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from collector.controller import Controller
from collector.model import RunClaims
from collector.recheck import CpuBudget, Rechecks
from kubesim.server import Simulator
from tests.controller.test_controller import (
    T0,
    Clock,
    apply_run,
    ensure_namespaces,
    observed,
    sim,
    start,
    wait_until,
)
from tests.dumpkit import ts

__all__ = ["sim"]  # the simulator fixture, shared with test_controller

BASE = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)

LONG_TICK = timedelta(minutes=10)


def run_claims(c: Controller, run: str) -> RunClaims:
    return next(r for r in c.claims.values() if r.ref.name == run)


def claim_of(c: Controller, run: str, name: str) -> str:
    return observed(c, run).get(name, "")


def steady(c: Controller, run: str, name: str, value: str, seconds: float = 1.5) -> None:
    """`run`'s claim stays `value` for `seconds` (several loop turns)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert claim_of(c, run, name) == value, f"{run} {name} changed before its deadline"
        time.sleep(0.05)


def test_a_stalled_run_turns_not_progressing_at_its_window(sim: Simulator) -> None:
    clock = Clock(T0)
    ensure_namespaces(sim, "research")
    # Logs are read once: the run appears after the controller is ready, the poller reads its log within
    # a second, and its next poll is a minute away. The deadline notices that the window closed; the
    # read came before it, so the claim turns unknown then (a stall is judged on a read after the window).
    c = start(sim, clock, tick=LONG_TICK, log_poll_interval=timedelta(seconds=60))
    try:
        # a step every 10 s until T0: window max(3 × 10 s, 60 s) + 15 s scrape, so stalled after T0 + 75 s
        lines = [f"{ts(T0 - timedelta(seconds=10 * k))} iteration {1000 - k:8d}/ 100000 | lm loss: 2.5 |"
                 for k in range(12, -1, -1)]
        sim.store.append_log("research", "llm-w0", "main", lines, T0)
        apply_run(sim, "llm")
        wait_until(lambda: claim_of(c, "llm", "progressing") == "true", what="progressing")
        assert c.tick_s >= LONG_TICK.total_seconds() - 1e-6  # next_tick - done: float rounding
        due = T0 + timedelta(seconds=75)
        assert run_claims(c, "llm").recheck_at == due
        rechecked = c.rechecked
        clock.set(due - timedelta(seconds=1))
        steady(c, "llm", "progressing", "true")
        assert c.rechecked == rechecked
        clock.set(due + timedelta(seconds=1))
        t = time.monotonic()
        wait_until(lambda: claim_of(c, "llm", "progressing") == "unknown", timeout=5, what="window closed")
        assert time.monotonic() - t < 3
        assert c.rechecked == rechecked + 1
        rc = run_claims(c, "llm")
        assert "stall window closed at 12:01:15 (window 1m15s" in rc.progressing.reason
        assert "llm-w0/main was last read at 12:00:00, before then: not read since" in rc.progressing.reason
        assert rc.evaluated_at == due + timedelta(seconds=1)
        # Next: the log read ageing out, 5 min after it. Nothing is due meanwhile, so a clock standing
        # still costs no evaluation (no spin on a deadline just passed).
        assert rc.recheck_at == T0 + timedelta(minutes=5)
        evaluations = c.evaluations
        time.sleep(1.5)
        assert c.evaluations == evaluations
    finally:
        c.close()


def test_evidence_ageing_past_its_bound_turns_unknown_on_time_in_one_batch(sim: Simulator) -> None:
    clock = Clock(T0)
    runs = [f"llm-{i}" for i in range(8)]
    for run in runs:
        apply_run(sim, run)
    c = start(sim, clock, tick=LONG_TICK)
    try:
        for run in runs:
            wait_until(lambda run=run: claim_of(c, run, "running") == "true", what=f"{run} running")
        sim.close()  # the API is gone: nothing will ever say the pods are still there
        time.sleep(1.0)  # its last bookmarks are in
        bound = T0 + c.settings.claims.evidence_max_age  # the sources last synced at T0 (the clock stood still)
        assert {rc.recheck_at for rc in c.claims.values()} == {bound}
        clock.set(bound - timedelta(seconds=1))
        steady(c, runs[0], "running", "true")
        rechecked = c.rechecked
        batches: list[int] = []  # how many runs, each time the clock made some due
        pop_due = c._rechecks.pop_due

        def counted(now: datetime) -> list[tuple[str, str, str]]:
            got = pop_due(now)
            if got:
                batches.append(len(got))
            return got
        c._rechecks.pop_due = counted  # type: ignore[method-assign]
        clock.set(bound + timedelta(seconds=1))
        t = time.monotonic()
        for run in runs:
            wait_until(lambda run=run: claim_of(c, run, "running") == "unknown", timeout=5, what=f"{run} unknown")
        assert time.monotonic() - t < 3
        rc = run_claims(c, runs[0])
        assert rc.scheduled.observed.value == "unknown" and "5m01s old" in rc.scheduled.reason
        assert rc.recheck_at is None  # nothing left to age: unscheduled
        # Every run was due at once: marked in one batch, not one evaluation each. (Counted where the clock
        # hands them over: under load the batch's evaluation may take more than one 10 ms slice.)
        assert c.rechecked - rechecked == len(runs)
        assert batches == [len(runs)]
    finally:
        c.close()


# --- the schedule itself -------------------------------------------------------------------------------


def test_missing_or_past_deadlines_are_not_scheduled() -> None:
    r: Rechecks[str] = Rechecks()
    r.set("a", None, BASE)
    r.set("b", BASE - timedelta(seconds=1), BASE)
    assert len(r) == 0 and r.next_due() is None and r.pop_due(BASE + timedelta(days=1)) == []


def test_due_runs_come_out_in_one_batch_after_the_slack_and_superseded_entries_never() -> None:
    r: Rechecks[str] = Rechecks()
    for i in range(100):
        r.set(f"run-{i}", BASE + timedelta(seconds=10), BASE)
    r.set("run-0", BASE + timedelta(seconds=30), BASE)  # re-evaluated meanwhile: a later deadline
    r.set("late", BASE + timedelta(hours=1), BASE)
    r.forget("run-1")  # deleted
    due = BASE + timedelta(seconds=10) + r.slack
    assert r.next_due() == due
    assert r.pop_due(due - timedelta(microseconds=1)) == []
    batch = r.pop_due(due)
    assert sorted(batch) == sorted(f"run-{i}" for i in range(2, 100))
    assert r.pop_due(due) == []  # popped once
    assert r.next_due() == BASE + timedelta(seconds=30) + r.slack
    assert r.pop_due(BASE + timedelta(hours=2)) == ["run-0", "late"]


def test_the_heap_stays_bounded_when_runs_are_re_evaluated_before_they_are_due() -> None:
    r: Rechecks[int] = Rechecks()
    for turn in range(50):
        for k in range(100):
            r.set(k, BASE + timedelta(minutes=5, seconds=turn), BASE)
    assert len(r) == 100
    assert len(r._heap) <= 2 * 100 + 1024
    assert sorted(r.pop_due(BASE + timedelta(hours=1))) == list(range(100))


def test_end_of_time_is_never() -> None:
    r: Rechecks[str] = Rechecks()
    r.set("forged", datetime.max.replace(tzinfo=UTC), BASE)
    assert r.next_due() is None


def test_cpu_budget_bounds_the_average_share_and_allows_a_burst() -> None:
    b = CpuBudget(share=0.05, burst_s=1.0, now_m=0.0)
    assert b.wait_s(0.0) == 0.0
    b.spend(0.4, 0.0)
    assert b.wait_s(0.0) == 0.0  # within the burst
    b.spend(2.6, 0.0)  # a mass expiry: 2 s over
    assert abs(b.wait_s(0.0) - 2.0 / 0.05) < 0.01
    assert b.wait_s(39.0) > 0 and b.wait_s(40.1) == 0.0
    b.spend(0.0, 10_000.0)
    assert b.wait_s(10_000.0) == 0.0 and b._tokens == 1.0  # refilled to the burst, not beyond
