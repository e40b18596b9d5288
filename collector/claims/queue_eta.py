"""An estimate of the time until a queued run is admitted, from its ClusterQueue's own recent history.

The model, stated with every estimate: admissions to the ClusterQueue arrive as a Poisson process
whose rate is what the last `window` showed (n admissions in T hours); a run with k workloads ahead
of it is admitted at the (k+1)-th admission from now. The rate itself is uncertain (n is small), so
the estimate is the predictive distribution of that wait, the rate integrated out (a Gamma(n, T)
belief about it): wait / T follows a beta-prime(k+1, n) distribution. The band is its central
`level` interval and `mid` its median. With fewer than `min_admissions` admissions in the window,
the estimate is unknown: a short history says nothing honest.

It is an estimate with a basis, never a promise: a preemption, a higher-priority arrival, a
borrowing cohort or a quota change moves the real admission; the backtest (docs/queue-eta.md,
queries/admission_eta_backtest.kql) says how often the band held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from collector.queuefacts import AdmissionEta

WINDOW = timedelta(hours=24)
LEVEL = 0.8
MIN_ADMISSIONS = 5


def admission_eta(ahead: int, admissions: Sequence[datetime], finishes: Sequence[datetime], now: datetime, *,
                  window: timedelta = WINDOW, level: float = LEVEL, min_admissions: int = MIN_ADMISSIONS,
                  observed_since: datetime | None = None, queue: str = "") -> AdmissionEta:
    """The estimate for a run with `ahead` workloads before it, from the queue's admission and finish
    times (any order; those outside (now - window, now] are not counted). `observed_since`: when the
    history begins (the oldest evidence kept); a younger history shortens the window."""
    start = now - window
    if observed_since is not None and observed_since > start:
        start = observed_since
    span_h = (now - start).total_seconds() / 3600
    n = sum(1 for t in admissions if start < t <= now)
    done = sum(1 for t in finishes if start < t <= now)
    where = f" to ClusterQueue {queue}" if queue else ""
    hist = f"{n} admissions{where} and {done} finishes in the last {_hours(span_h)}"
    if ahead < 0 or span_h <= 0 or n < min_admissions:
        return AdmissionEta(None, None, None, level, f"unknown: {hist}; at least {min_admissions} admissions are"
                                                     f" needed to estimate")
    m = ahead + 1
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    low, mid, high = (span_h * 3600 * _beta_prime_quantile(p, m, n) for p in (lo_q, 0.5, hi_q))
    basis = (f"an estimate, not a promise: {hist} ({n / span_h:.2g}/h); {ahead} workload(s) ahead; admissions taken"
             f" as a Poisson process at that rate; {round(level * 100)}% band")
    return AdmissionEta(low, mid, high, level, basis)


def _hours(h: float) -> str:
    return f"{h:.0f}h" if h >= 1 else f"{h * 60:.0f}min"


def _beta_prime_quantile(p: float, a: float, b: float) -> float:
    """x with P(X <= x) = p for X ~ beta-prime(a, b), i.e. B / (1 - B) with B ~ Beta(a, b)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection on the Beta CDF: monotone; 60 halvings reach 1e-18
        x = (lo + hi) / 2
        if _beta_cdf(x, a, b) < p:
            lo = x
        else:
            hi = x
    x = (lo + hi) / 2
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
