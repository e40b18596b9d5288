"""new_advance builds the same Advance as the dataclass's own __init__, field for field."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from collector.claims.progress_view import ADVANCE_FIELDS, Advance, new_advance

STAMPS = st.datetimes(timezones=st.just(UTC))


def test_advance_fields_are_the_class_fields_in_order() -> None:
    assert tuple(f.name for f in fields(Advance)) == ADVANCE_FIELDS


@given(at=STAMPS, step=st.none() | st.integers(-(2**63), 2**63), source=st.text(max_size=20),
       replay_from=st.none() | STAMPS, bridged=st.booleans(), stream=st.text(max_size=20))
def test_new_advance_is_the_dataclass_advance(at: datetime, step: int | None, source: str,
                                              replay_from: datetime | None, bridged: bool, stream: str) -> None:
    fast = new_advance(at, step, source, replay_from, bridged, stream)
    slow = Advance(at, step, source, replay_from, bridged, stream)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert type(fast) is Advance


def test_new_advance_stays_frozen() -> None:
    a = new_advance(datetime(2026, 1, 1, tzinfo=UTC), 3, "p/c", None, False, "p/c")
    try:
        a.step = 4  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("an Advance built by new_advance could be changed")
    assert a.at + timedelta(0) == datetime(2026, 1, 1, tzinfo=UTC)
