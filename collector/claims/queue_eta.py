"""An estimate of the time until a queued run is admitted, from its ClusterQueue's own recent history.

The model, stated with every estimate: admissions to the ClusterQueue come as a Poisson process of
batches (one finish can free room for several workloads: the instants with an admission are the
events, each admitting `per` workloads on average) at the rate the last `window` showed while the
queue had a backlog (the hours some workload waited for quota: an idle queue admits only as fast as
work arrives, which says nothing to a waiting run); with too little backlog in the window, the rate
over the whole window. A run with k workloads ahead needs 1 + k/per such events. The rate itself is
uncertain (a few events), so the estimate is the predictive distribution of the wait with the rate
integrated out (a Gamma(events, hours) belief about it): wait / hours follows a beta-prime(1 + k/per,
events) distribution. The band is its central `level` interval and `mid` its median. With fewer than
`min_admissions` admissions in the window, the estimate is unknown: a short history says nothing
honest.

It is an estimate with a basis, never a promise: a preemption, a higher-priority arrival, a
borrowing cohort or a quota change moves the real admission; the backtest (docs/queue-eta.md,
bench/queue_eta_week.py, queries/admission_eta_backtest.kql) says how often the band held.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from collector.queuefacts import AdmissionEta

WINDOW = timedelta(hours=24)
LEVEL = 0.8
MIN_ADMISSIONS = 5


@dataclass(frozen=True, slots=True)
class QueueRate:
    """What a ClusterQueue's recent history says about its admissions: the same for every run that
    waits in it at one instant (`queue_status.Workloads` keeps one per queue for an evaluation)."""

    hist: str  # "N admissions ... in the last H"
    known: bool  # enough admissions to estimate
    rate: str = ""  # the rate gone by, and over what
    hours: float = 0.0  # the hours the events came in
    events: int = 0  # instants with an admission
    per: float = 0.0  # workloads admitted per event


def admission_eta(ahead: int, admissions: Sequence[datetime], finishes: Sequence[datetime], now: datetime, *,
                  waits: Sequence[tuple[datetime, datetime]] = (), window: timedelta = WINDOW, level: float = LEVEL,
                  min_admissions: int = MIN_ADMISSIONS, observed_since: datetime | None = None,
                  queue: str = "") -> AdmissionEta:
    """The estimate for a run with `ahead` workloads before it, from the queue's admission and finish
    times (any order; those outside (now - window, now] are not counted). `waits`: (queued, admitted
    or now) of the workloads that waited for quota: while one waited the queue had a backlog, and the
    rate that matters to a waiting run is the admissions per hour of backlog (an idle queue admits as
    slowly as work arrives). Without enough admissions in backlog, the rate over the whole window.
    `observed_since`: when the history begins (the oldest evidence kept); a younger history shortens
    the window."""
    rate = queue_rate(admissions, finishes, now, waits=waits, window=window, min_admissions=min_admissions,
                      observed_since=observed_since, queue=queue)
    return eta_for(rate, ahead, level=level, min_admissions=min_admissions)


def queue_rate(admissions: Sequence[datetime], finishes: Sequence[datetime], now: datetime, *,
               waits: Sequence[tuple[datetime, datetime]] = (), window: timedelta = WINDOW,
               min_admissions: int = MIN_ADMISSIONS, observed_since: datetime | None = None,
               queue: str = "") -> QueueRate:
    """The queue's part of `admission_eta` (every run waiting in it shares it)."""
    start = now - window
    if observed_since is not None and observed_since > start:
        start = observed_since
    span_h = (now - start).total_seconds() / 3600
    inside = sorted(t for t in admissions if start < t <= now)
    n = len(inside)
    done = sum(1 for t in finishes if start < t <= now)
    where = f" to ClusterQueue {queue}" if queue else ""
    hist = f"{n} admissions{where} and {done} finishes in the last {_hours(span_h)}"
    if span_h <= 0 or n < min_admissions:
        return QueueRate(hist, False)
    busy = _union([(max(a, start), min(b, now)) for a, b in waits if min(b, now) > max(a, start)])
    busy_h = sum((b - a).total_seconds() for a, b in busy) / 3600
    in_busy = [t for t in inside if _covered(busy, t)] if busy else []
    if busy_h > 0 and len(in_busy) >= min_admissions:
        times, hours = in_busy, busy_h
        rate = (f"{len(in_busy)} of them while workloads waited, over {_hours(busy_h)} of backlog"
                f" ({len(in_busy) / busy_h:.2g}/h)")
    else:
        times, hours = inside, span_h
        rate = f"{n / span_h:.2g}/h over the window (too little backlog to go by)"
    # Kueue admits in batches (one finish can free room for several): the events are the instants
    # with an admission, each admitting `per` workloads on average.
    events = len({t.replace(microsecond=0) for t in times})
    return QueueRate(hist, True, rate, hours, events, len(times) / events)


def eta_for(q: QueueRate, ahead: int, *, level: float = LEVEL, min_admissions: int = MIN_ADMISSIONS) -> AdmissionEta:
    """The estimate for a run with `ahead` workloads before it in a queue whose history says `q`: it
    needs the next admission event and one more per `q.per` workloads ahead."""
    if ahead < 0 or not q.known:
        return AdmissionEta(None, None, None, level, f"unknown: {q.hist}; at least {min_admissions} admissions are"
                                                     f" needed to estimate")
    m = 1 + ahead / q.per
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    low, mid, high = (q.hours * 3600 * _beta_prime_quantile(p, m, q.events) for p in (lo_q, 0.5, hi_q))
    basis = (f"an estimate, not a promise: {q.hist}; {q.rate}; {ahead} workload(s) ahead; admissions taken as a"
             f" Poisson process at that rate; {round(level * 100)}% band")
    return AdmissionEta(low, mid, high, level, basis)


def _union(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(spans: list[tuple[datetime, datetime]], t: datetime) -> bool:
    i = bisect.bisect_right(spans, (t, datetime.max.replace(tzinfo=t.tzinfo))) - 1
    return i >= 0 and spans[i][0] <= t <= spans[i][1]


def _hours(h: float) -> str:
    return f"{h:.0f}h" if h >= 1 else f"{h * 60:.0f}min"


def _beta_prime_quantile(p: float, a: float, b: float) -> float:
    """x with P(X <= x) = p for X ~ beta-prime(a, b), i.e. B / (1 - B) with B ~ Beta(a, b).

    Newton's method on the Beta CDF, kept inside a bracket that every step narrows (a step that
    would leave it bisects instead): ~6 CDF evaluations where bisection to the same precision took
    60 (each a continued fraction: 0.4-3 ms a queued run's estimate, every evaluation)."""
    lo, hi = 0.0, 1.0
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    x = a / (a + b)  # the mean: the quantiles of the band lie near it
    for _ in range(200):  # a bound, never reached: each turn at least bisects or converges
        f = _beta_cdf(x, a, b) - p
        if f < 0:
            lo = x
        else:
            hi = x
        if hi - lo <= 4e-16 * max(hi, 1e-300) or f == 0:
            break
        density = math.exp(log_norm + (a - 1) * math.log(x) + (b - 1) * math.log1p(-x)) if 0 < x < 1 else 0.0
        step = x - f / density if density > 0 else -1.0
        if not lo < step < hi:
            step = (lo + hi) / 2
        if step == x:
            break
        x = step
    return x / (1 - x) if x < 1 else math.inf


def _beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_cf(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_cf(1 - x, b, a) / b


def _beta_cf(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz evaluation)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for k in range(1, 400):
        for num in (k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k)),
                    -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            delta = c * d
            h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h
