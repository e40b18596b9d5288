"""The evidence document's stamps: the fast spelling of UTC datetimes is isoformat()'s, exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.agent.evidence import _iso


@settings(max_examples=500, deadline=None)
@given(st.datetimes(timezones=st.just(UTC)))
def test_utc_stamps_read_as_isoformat(at: datetime) -> None:
    assert _iso(at) == at.isoformat()


def test_other_stamps_and_none() -> None:
    assert _iso(None) is None
    naive = datetime(2026, 1, 10, 12, 0, 1, 5)
    assert _iso(naive) == naive.isoformat()
    east = datetime(2026, 1, 10, 12, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert _iso(east) == "2026-01-10T12:00:01+05:30"
    assert _iso(datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00+00:00"
