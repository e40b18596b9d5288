"""new_advance builds the same Advance as the dataclass's own __init__, field for field; the stall window
with one sort and no words where none are asked is the one `statistics` gives, words and all."""

from __future__ import annotations

import math
import statistics
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from collector.claims.common import human_age
from collector.claims.progress_view import (
    ADVANCE_FIELDS,
    OUTLIER_MADS,
    RECENT_INTERVALS,
    Advance,
    _quantile_sorted,
    new_advance,
    stall_window,
    stall_window_of,
)
from collector.settings import ClaimSettings

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


def _reference_window(intervals: list[tuple[datetime, float, int]], s: ClaimSettings) -> tuple[timedelta, str]:
    """The stall window as it was written first: `statistics` for the medians, a sort for each (and a
    profile's own ceiling with a median of 0 s no longer NaN); the p99's interpolation is the module's
    own, which the rewrite did not change."""
    xs = [secs for _, secs, _ in intervals[-RECENT_INTERVALS:]]
    floor = f"floor {human_age(s.stall_floor)}"
    if not xs:
        return s.stall_floor + s.scrape_interval, f"{floor}: no step interval yet"
    p99 = _quantile_sorted(sorted(xs), 0.99)
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    cap = med + OUTLIER_MADS * max(mad, 0.1 * med)
    ys = sorted(xs)
    second = ys[-2] if len(ys) >= 2 else ys[-1]
    est = min(p99, max(cap, second))
    what = f"p99 of last {len(xs)} step interval{'s' if len(xs) != 1 else ''}"
    if est < p99:
        what += f", one {human_age(timedelta(seconds=ys[-1]))} outlier clipped"
    scaled = timedelta(seconds=s.stall_multiplier * est)
    if scaled < s.stall_floor:
        return s.stall_floor + s.scrape_interval, f"{floor} ({what} is {human_age(timedelta(seconds=est))})"
    by_cadence = math.inf if math.isinf(s.stall_ceiling_multiplier) else s.stall_ceiling_multiplier * med
    ceiling = max(s.stall_floor, timedelta(seconds=s.stall_multiplier * med),
                  s.stall_window_max if by_cadence >= s.stall_window_max.total_seconds()
                  else timedelta(seconds=by_cadence))
    if scaled > ceiling:
        return ceiling + s.scrape_interval, (f"ceiling {human_age(ceiling)} ({s.stall_multiplier:g} × "
                                             f"{human_age(timedelta(seconds=est))} from {what} is wider)")
    return scaled + s.scrape_interval, f"{s.stall_multiplier:g} × {human_age(timedelta(seconds=est))} from {what}"


SECONDS = st.floats(0.0, 86_400.0) | st.sampled_from([0.5, 1.0, 1.0, 2.0, 30.0, 3_600.0])


@given(st.lists(SECONDS, max_size=2 * RECENT_INTERVALS), st.sampled_from([1.0, 3.0, 7.5]),
       st.sampled_from([0, 60, 600]), st.sampled_from([10.0, float("inf")]), st.sampled_from([60, 1_800]))
def test_the_stall_window_is_the_reference_one(secs: list[float], multiplier: float, floor_s: int,
                                               ceiling_multiplier: float, max_s: int) -> None:
    s = replace(ClaimSettings(), stall_multiplier=multiplier, stall_floor=timedelta(seconds=floor_s),
                stall_ceiling_multiplier=ceiling_multiplier, stall_window_max=timedelta(seconds=max_s))
    intervals = [(datetime(2026, 1, 1, tzinfo=UTC), x, 1) for x in secs]
    want = _reference_window(intervals, s)
    assert stall_window(secs, s) == want
    assert stall_window_of(secs[-RECENT_INTERVALS:], s) == want[0]


def test_a_profiles_ceiling_holds_for_steps_stamped_in_the_same_second() -> None:
    """Steps a trainer prints several a second, stamped to the second, make most intervals 0 s: with a
    profile's own stall ceiling (`for_profile`: an infinite multiplier) the cadence ceiling was inf × 0,
    NaN, and the window raised (every evaluation of the run failed, its claims unknown). The profile's
    ceiling holds."""
    s = ClaimSettings(stall_ceiling_by_profile={"slow": timedelta(minutes=20)}).for_profile("slow")
    assert math.isinf(s.stall_ceiling_multiplier)
    secs = [0.0, 0.0, 0.0, 30.0] * 10
    window, why = stall_window(secs, s)
    assert window == timedelta(seconds=3 * 30.0) + s.scrape_interval and "from p99" in why
    assert stall_window_of(secs, s) == window
