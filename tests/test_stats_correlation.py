"""Rank correlations with intervals over units (approxlab.stats.correlation)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from approxlab.stats import rank_correlation, rank_correlation_difference


def test_estimates_are_scipys_and_intervals_hold_them():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    y = x + rng.normal(scale=0.5, size=30)
    for method, reference in (("spearman", scipy_stats.spearmanr), ("kendall", scipy_stats.kendalltau)):
        result = rank_correlation(x, y, method=method, resamples=300)
        assert result.estimate == pytest.approx(reference(x, y).statistic, abs=1e-15)
        assert result.low <= result.estimate <= result.high < 1.0 + 1e-12


def test_units_are_resampled_whole():
    """Observations of one unit travel together: with every unit a perfectly monotone block the
    resampled correlation never drops below the correlation of the blocks' levels."""
    x = np.repeat([0.0, 1.0, 2.0, 3.0], 3) + np.tile([0.0, 0.1, 0.2], 4)
    y = x.copy()
    result = rank_correlation(x, y, units=np.repeat([0, 1, 2, 3], 3), resamples=200)
    assert result.estimate == pytest.approx(1.0) and result.low == pytest.approx(1.0)
    single = rank_correlation(x, -y, units=np.zeros(12, dtype=int), resamples=50)
    assert single.estimate == pytest.approx(-1.0) and single.units == 1  # one unit: no interval
    assert np.isnan(single.low) and np.isnan(single.high)


def test_coverage_of_a_known_correlation():
    """The interval covers the population Spearman correlation of a bivariate normal most of the time
    (rho_s = 6/pi asin(r/2)); a wrong resampling (e.g. the same indices for every resample) fails this."""
    r = 0.6
    truth = 6 / math.pi * math.asin(r / 2)
    rng = np.random.default_rng(1)
    covered = 0
    trials = 40
    for trial in range(trials):
        z = rng.multivariate_normal([0, 0], [[1, r], [r, 1]], size=40)
        result = rank_correlation(z[:, 0], z[:, 1], resamples=250, seed=trial)
        covered += result.low <= truth <= result.high
    assert covered >= 0.8 * trials


def test_difference_is_paired_and_signed():
    target = np.arange(20.0)
    good = target + 0.01 * np.sin(target)
    bad = target[::-1].copy()
    result = rank_correlation_difference(good, bad, target, resamples=200)
    assert result.estimate == pytest.approx(2.0) and result.low > 0
    same = rank_correlation_difference(good, good, target, resamples=50)
    assert same.estimate == same.low == same.high == 0.0


@pytest.mark.parametrize("arguments, error, match", [
    (dict(x=[1, 2], y=[1, 2, 3]), ValueError, r"`x`, `y` must be 1-d sequences of one length >= 2"),
    (dict(x=[1], y=[1]), ValueError, r"of one length >= 2"),
    (dict(x=[1, float("nan")], y=[1, 2]), ValueError, r"`x` must hold no NaN"),
    (dict(x=["a", "b"], y=[1, 2]), TypeError, r"`x` must be an array of real numbers"),
    (dict(x=[1, 2], y=[1, 2], units=[0]), ValueError, r"`units` must give the unit of each observation"),
    (dict(x=[1, 2], y=[1, 2], method="pearson"), ValueError, r"`method` must be one of \['spearman', 'kendall'\]"),
    (dict(x=[1, 2], y=[1, 2], resamples=0), ValueError, r"`resamples` must be an integer >= 1"),
    (dict(x=[1, 2], y=[1, 2], level=1.0), ValueError, r"`level` must be a number with 0 < level < 1"),
])
def test_bad_inputs_name_the_parameter(arguments, error, match):
    with pytest.raises(error, match=match):
        rank_correlation(**arguments)


def test_constant_side_has_no_correlation():
    result = rank_correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], resamples=10)
    assert math.isnan(result.estimate) and math.isnan(result.low)
