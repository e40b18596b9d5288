"""The admission estimate: a pure function of the queue's history, its position and a clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.claims.queue_eta import _beta_cdf, _beta_prime_quantile, admission_eta
from collector.claims.queue_status import quota_short
from collector.queuefacts import quantity

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def _every(minutes: float, n: int) -> list[datetime]:
    return [NOW - timedelta(minutes=minutes * (i + 1)) for i in range(n)]


def test_unknown_when_history_is_short() -> None:
    eta = admission_eta(0, _every(30, 4), [], NOW)
    assert not eta.known and eta.low_s is None and eta.mid_s is None
    assert "4 admissions" in eta.basis and "at least 5" in eta.basis
    # admissions older than the window do not count
    assert not admission_eta(0, _every(60 * 5, 10), [], NOW, window=timedelta(hours=24)).known


def test_band_grows_with_the_runs_ahead_and_shrinks_with_the_rate() -> None:
    hist = _every(30, 48)  # 2 an hour over 24 h
    first, fifth = admission_eta(0, hist, hist, NOW), admission_eta(4, hist, hist, NOW)
    assert first.known and fifth.known
    assert first.low_s is not None and first.mid_s is not None and first.high_s is not None
    assert first.low_s < first.mid_s < first.high_s
    assert fifth.mid_s is not None and fifth.mid_s > 3 * first.mid_s
    # median wait for the next admission at 2/h: about ln 2 / 2 h (the rate uncertainty widens it a little)
    assert 0.3 * 3600 < first.mid_s < 0.4 * 3600
    faster = admission_eta(0, _every(10, 144), [], NOW)
    assert faster.mid_s is not None and faster.mid_s < first.mid_s / 2
    assert "not a promise" in first.basis and "4 workload(s) ahead" in fifth.basis and "80% band" in first.basis


def test_history_younger_than_the_window_shortens_it() -> None:
    hist = _every(6, 10)  # 10 admissions in the last hour
    whole = admission_eta(0, hist, [], NOW)  # as if a 24 h history held only these: a slow queue
    young = admission_eta(0, hist, [], NOW, observed_since=NOW - timedelta(hours=1))
    assert whole.mid_s is not None and young.mid_s is not None and young.mid_s < whole.mid_s / 10


def test_band_covers_its_level_when_the_model_holds() -> None:
    """Poisson admissions at an unknown rate: the 80% band holds about 80% of the time."""
    rng = random.Random(7)
    inside = trials = 0
    for _ in range(400):
        rate_h = rng.uniform(0.5, 6)
        t, hist = 0.0, []
        while True:
            t += rng.expovariate(rate_h)
            if t > 24:
                break
            hist.append(NOW - timedelta(hours=24 - t))
        ahead = rng.randrange(0, 6)
        eta = admission_eta(ahead, hist, [], NOW)
        if not eta.known:
            continue
        assert eta.low_s is not None and eta.high_s is not None
        wait_h = sum(rng.expovariate(rate_h) for _ in range(ahead + 1))
        trials += 1
        inside += eta.low_s <= wait_h * 3600 <= eta.high_s
    assert trials > 300
    assert 0.74 <= inside / trials <= 0.86


@pytest.mark.parametrize(("a", "b", "p"), [(1, 5, 0.1), (3, 20, 0.5), (6, 200, 0.9), (40, 8, 0.5)])
def test_beta_prime_quantile_inverts_the_cdf(a: int, b: int, p: float) -> None:
    q = _beta_prime_quantile(p, a, b)
    x = q / (1 + q)
    assert _beta_cdf(x, a, b) == pytest.approx(p, abs=1e-9)


def test_beta_cdf_matches_a_closed_form() -> None:
    # I_x(1, b) = 1 - (1 - x)^b; I_x(a, 1) = x^a
    for x in (0.01, 0.3, 0.77):
        assert _beta_cdf(x, 1, 7) == pytest.approx(1 - (1 - x) ** 7, rel=1e-9)
        assert _beta_cdf(x, 5, 1) == pytest.approx(x ** 5, rel=1e-9)


def test_quantities_and_quota_short() -> None:
    assert quantity("8") == 8 and quantity("500m") == 0.5 and quantity("16Gi") == 16 * 2 ** 30
    assert quantity(4) == 4 and quantity("1e3") == 1000 and quantity("2k") == 2000
    for bad in ("", "abc", "1x", True, None, "inf", "9" * 100, "nanGi"):
        assert quantity(bad) is None, bad
    short = quota_short({"nvidia.com/gpu": 16, "cpu": 64}, [("a100", "nvidia.com/gpu", 40), ("a100", "cpu", 1000),
                                                            ("h100", "nvidia.com/gpu", 16)],
                        [("a100", "nvidia.com/gpu", 32), ("h100", "nvidia.com/gpu", 8)])
    assert [(s.flavor, s.resource, s.free, s.short) for s in short] == [("a100", "nvidia.com/gpu", 8, 8),
                                                                         ("h100", "nvidia.com/gpu", 8, 8)]


def test_the_rate_is_the_backlogs_and_batches_count_once() -> None:
    # 12 admissions in 24 h, but 10 of them in the last 2 h, while workloads waited
    hist = _every(12, 10) + [NOW - timedelta(hours=10), NOW - timedelta(hours=20)]
    waits = [(NOW - timedelta(hours=2), NOW)]
    idle = admission_eta(0, hist, [], NOW)
    busy = admission_eta(0, hist, [], NOW, waits=waits)
    assert idle.mid_s is not None and busy.mid_s is not None and busy.mid_s < idle.mid_s / 4
    assert "10 of them while workloads waited, over 2h of backlog" in busy.basis
    # the same admissions two at a time: half the events, each admitting two; the 5th in line needs 3 of
    # them (not 5): about the same median, and a wider band (fewer, bigger steps)
    pairs = [t for t in _every(24, 5) for _ in (0, 1)]
    one_by_one = admission_eta(4, _every(12, 10), [], NOW, waits=waits)
    batched = admission_eta(4, pairs, [], NOW, waits=waits)
    assert one_by_one.mid_s is not None and batched.mid_s is not None
    assert one_by_one.high_s is not None and batched.high_s is not None
    assert 0.9 < batched.mid_s / one_by_one.mid_s < 1.4 and batched.high_s > 1.3 * one_by_one.high_s


def _bisected(p: float, a: float, b: float) -> float:
    """The quantile by 60 halvings of (0, 1): slow and sure (the method before Newton's)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        x = (lo + hi) / 2
        if _beta_cdf(x, a, b) < p:
            lo = x
        else:
            hi = x
    x = (lo + hi) / 2
    return x / (1 - x)


@settings(max_examples=150, deadline=None)
@given(st.floats(0.02, 0.98), st.floats(1.0, 3000.0), st.integers(1, 5000))
def test_beta_prime_quantile_is_the_bisected_one(p: float, a: float, b: int) -> None:
    """Newton's steps, kept in their bracket, land where bisection does (the band's three quantiles
    with `ahead` workloads ahead: a = 1 + ahead/per, b = the admission events)."""
    q = _beta_prime_quantile(p, a, b)
    assert q == pytest.approx(_bisected(p, a, b), rel=1e-9)
