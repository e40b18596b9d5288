"""The epoch and the microsecond, the units the collector's packed stamps and schedules count in (one
definition: `PackedSamples` columns, refresh slots, energy timelines and the exporter's accruals agree)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

US = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_us(t: datetime) -> int:
    """`t` in integer microseconds since the epoch (naive: UTC, as the rest of the collector)."""
    return ((t if t.tzinfo else t.replace(tzinfo=UTC)) - EPOCH) // US
