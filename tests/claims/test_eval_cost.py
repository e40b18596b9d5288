"""The cheaper forms of a run's evaluation (issue 30, burst latency) answer as the forms they replace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from collector.claims.common import latest, latest_condition
from collector.model import Condition, ObjectRecord, Ref

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
# stamps a few seconds apart, some equal to each other in another zone (equal, not the same object)
STAMPS = st.none() | st.builds(lambda s, east: (T0 + timedelta(seconds=s)).astimezone(timezone(timedelta(hours=east))),
                               st.integers(0, 4), st.integers(0, 2))
CONDITIONS = st.lists(st.builds(Condition, st.sampled_from(["Ready", "PodScheduled", "Other"]),
                                st.sampled_from(["True", "False", "Unknown", "true"]), st.just(""), st.just(""),
                                STAMPS), max_size=4)


def _record(conditions: list[Condition]) -> ObjectRecord:
    return ObjectRecord(Ref("Pod", "ns", "p"), "v1", "1", None, None, {}, (), tuple(conditions), None, None)


@given(st.lists(CONDITIONS, max_size=6), st.sampled_from(["Ready", "PodScheduled"]), st.booleans())
def test_latest_condition_is_latest_of_the_generator(pods: list[list[Condition]], type_: str, true: bool) -> None:
    records = [_record(cs) for cs in pods]
    want = latest(c.last_transition for p in records for c in p.conditions
                  if c.type == type_ and (not true or c.is_true))
    got = latest_condition(records, type_, true=true)
    assert got == want and got is want  # the very object max picks: the first of equal stamps (its zone)
