"""Clocks for object timestamps and the scenario timeline: wall, accelerated, and manual."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Anything that tells the current (scenario) time as an aware UTC datetime."""

    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ScaledClock:
    """Time that starts at `start` (default: now) and runs `speed` times faster than the wall clock."""

    def __init__(self, speed: float = 1.0, start: datetime | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.speed = speed
        self._start = start or datetime.now(UTC)
        self._mono0 = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._mono0) * self.speed)

    def wall_seconds_until(self, when: datetime) -> float:
        """Real seconds to wait until this clock reads `when` (0 when already past)."""
        return max(0.0, (when - self.now()).total_seconds() / self.speed)


class ManualClock:
    """A clock that moves only when told: tests step scenarios without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: datetime) -> None:
        """Move to `when`; the clock never goes backwards."""
        with self._lock:
            if when > self._now:
                self._now = when

    def advance(self, seconds: float) -> datetime:
        """Move forward by `seconds` and return the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


def rfc3339(when: datetime) -> str:
    """`2026-01-10T10:00:00Z` (second precision, like metav1.Time)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(when: datetime) -> str:
    """`2026-01-10T10:00:00.123456Z` (metav1.MicroTime)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_nano(when: datetime) -> str:
    """`2026-01-10T10:00:00.123456000Z` (the kubelet's log timestamps)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (`Z` or offset) into an aware UTC datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
