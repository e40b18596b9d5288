"""Small pieces the claim modules share: the evaluation clock, freshness of sources, evidence from events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from collector.model import Claim, EventFacts, Evidence, ObjectRecord, Observed, Plane, verdict_for

# A stamp later than the clock by more than this is not from a skewed clock but forged (or from a
# clock too wrong to trust): it is no evidence of freshness. Matches the dump's capture bound.
FUTURE_SKEW = timedelta(minutes=5)
_END_OF_TIME = datetime.max.replace(tzinfo=UTC)


class Clock:
    """The instant claims are evaluated at, and the earliest later instant at which they could change
    by the clock alone (`recheck_at`): every comparison of evidence time against `now` goes through
    `within`, `recent` or `reached`, which note when their answer will flip.

    So the live controller can re-evaluate a run exactly when its evidence ages past a bound, instead
    of waiting for a periodic full pass.

    `other`: the earliest of those instants that is not a stall window of a stream's newest step
    (noted with `step=True`). A newer step moves every such deadline later, to its own window, which
    closes no sooner than the window's floor after it; the controller may then put off a run's
    re-evaluation on an increment that only carries its one progress log on, up to `other`
    (collector/changes.py `_deferred`). A deadline noted without `step` is in both.

    `slack`: how much later than `now` the evidence may really have been captured. The live controller
    reads the API server's clock (0); a dump's capture time is known only from control-plane stamps
    that trail it (`sources.dump`), so a claim that holds only while a window is open must hold up to
    `now + slack` (`within_latest`). None: no upper bound is known at all.
    """

    __slots__ = ("now", "slack", "recheck_at", "other")

    def __init__(self, now: datetime, slack: timedelta | None = timedelta(0)) -> None:
        self.now = now
        self.slack = slack
        self.recheck_at: datetime | None = None
        self.other: datetime | None = None

    @property
    def latest(self) -> datetime | None:
        """The latest instant the evidence can have been captured at (None: unknown)."""
        return None if self.slack is None else self.now + self.slack

    @property
    def horizon(self) -> datetime:
        """Evidence stamped up to here can be real; later is skew or forgery (not known yet). With no
        upper bound on the capture time, any stamp can be real (and no window can be shown open)."""
        latest = self.latest
        return latest if latest is not None else _END_OF_TIME

    def within(self, t: datetime, bound: timedelta, *, step: bool = False) -> bool:
        """`now - bound <= t <= now + FUTURE_SKEW`: evidence stamped `t` is still inside `bound`, and
        not from the future. While it is, `t + bound` (after which it is not) is a deadline. A stamp
        past the skew allowance is untrusted (a year-9999 stamp is not "fresh forever")."""
        if t > self.now + FUTURE_SKEW:
            return False
        end = t + bound  # no overflow: t is at most now + skew, and bounds are hours
        if self.now > end:
            return False
        self.expires(end, step=step)
        return True

    def within_latest(self, t: datetime, bound: timedelta, *, step: bool = False) -> bool:
        """`latest - bound <= t`: still inside `bound` at the latest instant the evidence can have been
        captured (so at every instant it can have been); never when that instant is unknown."""
        latest = self.latest
        if latest is None or t > latest + FUTURE_SKEW:
            return False
        end = t + bound
        if latest > end:
            return False
        self.expires(end - (self.slack or timedelta(0)), step=step)
        return True

    def recent(self, t: datetime, bound: timedelta, *, step: bool = False) -> bool:
        """`now - bound <= t`, a stamp in the future included: for problems (a restart), which count
        as recent when in doubt."""
        try:
            end = t + bound
        except OverflowError:
            return True
        if self.now > end:
            return False
        self.expires(end, step=step)
        return True

    def reached(self, t: datetime) -> bool:
        """`t <= horizon`: evidence stamped `t` (ahead of this clock: skew) is known by now. While it is
        not, `t` is a deadline."""
        if t <= self.horizon:
            return True
        self.expires(t)
        return False

    def expires(self, at: datetime, *, step: bool = False) -> None:
        """Something evaluated now may read differently once the clock passes `at`; `step`: `at` is a
        stall window of a stream's newest step (not in `other`)."""
        if at < self.now:
            return
        if self.recheck_at is None or at < self.recheck_at:
            self.recheck_at = at
        if not step and (self.other is None or at < self.other):
            self.other = at


@dataclass(frozen=True, slots=True)
class Freshness:
    """When each source last synced, judged against the clock: fail closed when too old."""

    synced: Mapping[str, datetime]
    clock: Clock
    max_age: timedelta
    # `ok` by source: one evaluation asks about the same few sources for every pod (same clock,
    # same answer; the clock has noted the deadline the first time).
    _ok: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @property
    def now(self) -> datetime:
        return self.clock.now

    def at(self, source: str) -> datetime | None:
        return self.synced.get(source)

    def ok(self, source: str) -> bool:
        ok = self._ok.get(source)
        if ok is None:
            t = self.synced.get(source)
            ok = self._ok[source] = t is not None and self.clock.within(t, self.max_age)
        return ok

    def why_not(self, source: str) -> str:
        t = self.synced.get(source)
        if t is None:
            return f"{source} source has not synced"
        return f"{source} evidence is {human_age(self.now - t)} old (bound {human_age(self.max_age)})"


def latest(times: Iterable[datetime | None]) -> datetime | None:
    return max((t for t in times if t is not None), default=None)


def latest_condition(records: Iterable[ObjectRecord], type_: str, *, true: bool = False) -> datetime | None:
    """`latest` of the last transitions of the records' conditions of `type_` (`true`: only those True),
    in one loop: a run's evaluation asks this of every pod on each watch event (nested generators
    cost ~3x)."""
    out: datetime | None = None
    for r in records:
        for c in r.conditions:
            if c.type == type_ and (not true or c.is_true):
                t = c.last_transition
                if t is not None and (out is None or t > out):  # (the first of equals, as max keeps)
                    out = t
    return out


def event_evidence(events: Iterable[ObjectRecord]) -> list[Evidence]:
    out = []
    for e in events:
        f = e.facts
        if isinstance(f, EventFacts):
            value = f"{f.reason}: {f.message}" if f.count <= 1 else f"{f.reason} (x{f.count}): {f.message}"
            out.append(Evidence(Plane.KUBERNETES, f"Event/{e.ref.namespace}/{e.ref.name}",
                                f"{f.regarding.kind}/{f.regarding.name}", value[:300], f.last))
    return out


def human_age(d: timedelta) -> str:
    s = max(0, int(d.total_seconds()))  # evidence stamped ahead of the clock (skew) is "now"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def claim(asserted: bool | None, observed: Observed, since: datetime | None, reason: str,
          evidence: list[Evidence], status: Evidence, cause: str = "") -> Claim:
    """A claim with its verdict from the table, the run's own status first in its evidence."""
    return Claim(asserted, observed, verdict_for(asserted, observed), since, reason, (status, *evidence), cause)


def hm(t: datetime) -> str:
    return t.strftime("%H:%M:%S")
