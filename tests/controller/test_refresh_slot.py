"""A deferred run's refresh falls on its own slot (`collector.recheck.refresh_due`, issue 30): within
[half, all] of `claims.confirm_refresh` after its last evaluation, exactly one period after a slot it
was evaluated on (a little late included), on its slot from the refresh after an evaluation off it,
and a fleet evaluated at one instant spread over the period from its second refresh on, where
`evaluated_at + confirm_refresh` kept it in step (at 50k pods: 5,000 runs evaluated together every
240 s)."""

from __future__ import annotations

import collections
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from bench.bench_controller import run_name
from collector.recheck import refresh_due

EVERY = timedelta(seconds=240)
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)

keys = st.tuples(st.sampled_from(["TauRun", "RayJob", "Job"]), st.text(max_size=20), st.text(max_size=40))
instants = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
periods = st.integers(2, 3_600_000_000).map(lambda us: timedelta(microseconds=us))


@given(keys, instants, periods, st.floats(0, 1, exclude_max=True))
def test_within_the_period_on_the_slot_from_the_next_refresh(key: tuple[str, str, str], at: datetime,
                                                              every: timedelta, late: float) -> None:
    due = refresh_due(key, at, every)
    assert at + every // 2 <= due <= at + every
    on = refresh_due(key, due, every)  # evaluated when the refresh came: on its slot from then
    slot = refresh_due(key, on, every)
    assert slot - on == every  # on the slot: due exactly one period later ...
    lag = timedelta(microseconds=int(late * (every // 2 // timedelta(microseconds=1))))
    assert refresh_due(key, on + lag, every) == slot  # ... and evaluated late, still its slot
    # the same key and period, the same wheel: whatever instant it was asked from
    assert refresh_due(key, on - every * 3, every) == on - every * 2


def test_no_period_is_now() -> None:
    assert refresh_due(("TauRun", "ns", "r"), T0, timedelta(0)) == T0


def test_a_fleet_evaluated_at_once_is_spread_over_the_period() -> None:
    """5,000 runs (bench_fleet's names) evaluated at one instant, each then evaluated when its refresh
    comes (a few ms late): from the second refresh on, the refreshes of every period spread over it (24
    buckets of 10 s, each within a third of the mean), each one period after the one before; where
    `evaluated_at + confirm_refresh` kept all 5,000 at one instant of every period."""
    runs = [("TauRun", *run_name(i)) for i in range(5000)]
    at = dict.fromkeys(runs, T0)
    for _ in range(2):
        at = {k: refresh_due(k, t, EVERY) + timedelta(milliseconds=i % 7) for i, (k, t) in enumerate(at.items())}
    due = {k: refresh_due(k, t, EVERY) for k, t in at.items()}
    assert all(due[k] - at[k] <= EVERY for k in runs)
    start = min(due.values())
    buckets = collections.Counter(int((d - start).total_seconds() // 10) for d in due.values())
    mean = len(runs) / 24
    assert set(buckets) <= set(range(24))
    assert all(abs(buckets[b] - mean) < mean / 3 for b in range(24)), sorted(buckets.items())
    again = {k: refresh_due(k, d + timedelta(milliseconds=3), EVERY) for k, d in due.items()}
    assert all(again[k] - due[k] == EVERY for k in runs)
    # on whole seconds: the runs of a slot share the loop's pass (at most a few dozen a second here)
    assert all(d.microsecond == 0 for d in due.values())
    assert max(collections.Counter(due.values()).values()) <= 60
