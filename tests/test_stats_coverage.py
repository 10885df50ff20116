"""approxlab.stats.coverage: how often each interval method the studies use covers a known truth, at the unit
counts of the committed runs (4 and 8 windows, 3 seeds per task, 10 seeds); and the bootstrap's two intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from approxlab import stats


def test_percentile_bootstrap_of_a_median_covers_the_range_of_its_units_at_most():
    """With 4 units the percentile interval of a median is the range of the 4 values, which holds a continuous
    distribution's median with probability 1 - 2 * 0.5^4 = 87.5%; with 8 units about 93% (lognormal units)."""
    four = stats.coverage("percentile", 4, trials=4000, resamples=300)
    assert four.coverage == pytest.approx(0.875, abs=0.015) and four.low <= 0.875 <= four.high + 0.005
    normal = stats.coverage("percentile", 4, model=stats.UnitModel("normal", sigma=3.0), trials=4000, resamples=300)
    assert normal.coverage <= 0.875 + 3 * math.sqrt(0.875 * 0.125 / 4000)  # any continuous distribution
    eight = stats.coverage("percentile", 8, trials=2000, resamples=1000)  # the studies' resamples: 2,000
    assert 0.91 <= eight.coverage <= 0.945 and eight.high < 0.95  # below its nominal 95%
    assert stats.coverage("percentile", 3, trials=2000, resamples=300).coverage == pytest.approx(0.75, abs=0.03)
    mean = stats.coverage("percentile", 4, statistic="mean", trials=1000, resamples=300)
    assert mean.coverage < 0.8  # the skewed mean of lognormal units covers even less
    single = stats.coverage("percentile", 1, trials=50, resamples=10)
    assert single.coverage == 0.0 and single.units == 1  # one unit: no interval


def test_bootstrap_standard_error_reaches_beyond_the_range_of_few_units():
    """Figure 1's ratios of medians over 4 windows: the percentile interval stays below 90%, the bootstrap standard
    error with Student-t quantiles (log scale) covers at least 90%; over 10 windows both do."""
    ratio = {"statistic": "ratio of medians", "trials": 1000, "resamples": 300}
    assert stats.coverage("percentile", 4, **ratio).coverage < 0.9
    assert stats.coverage("standard-error", 4, log=True, **ratio).coverage >= 0.9
    assert stats.coverage("standard-error", 4, **ratio).coverage >= 0.9  # the gaps, on the linear scale
    assert stats.coverage("standard-error", 10, log=True, **ratio).coverage >= 0.9
    assert stats.coverage("percentile", 10, **ratio).coverage >= 0.9


def test_t_and_welch_intervals():
    """Student's t on the logs is exact for lognormal seeds (the geometric mean); on skewed ratios the arithmetic
    mean's covers less; Welch's interval holds its level for normal slopes, 3 seeds per task."""
    geometric = stats.coverage("t", 10, statistic="geometric mean", trials=4000)
    assert geometric.coverage == pytest.approx(0.95, abs=0.012)
    assert stats.coverage("t", 10, statistic="mean", trials=4000).coverage < 0.9  # sigma = 1 on the log scale
    assert stats.coverage("t", 10, statistic="mean", model=stats.UnitModel(sigma=0.1)).coverage > 0.93
    welch = stats.coverage("welch", (3, 3), model=stats.UnitModel("normal"), trials=4000)
    assert welch.coverage >= 0.94 and welch.units == (3, 3)
    assert stats.coverage("welch", 12, model=stats.UnitModel("normal")).coverage == pytest.approx(0.95, abs=0.015)
    assert stats.coverage("t", 1, statistic="mean", trials=20).coverage == 0.0


def test_the_same_seed_gives_the_same_coverage():
    first = stats.coverage("standard-error", 5, statistic="ratio of means", log=True, trials=300, resamples=200)
    assert first == stats.coverage("standard-error", 5, statistic="ratio of means", log=True, trials=300,
                                   resamples=200)
    assert first != stats.coverage("standard-error", 5, statistic="ratio of means", log=True, trials=300,
                                   resamples=200, seed=1)


def test_bootstrap_intervals_from_one_set_of_resamples():
    values = np.array([1.0, 1.5, 2.0, 2.5, 4.0])
    found = stats.resample(lambda u: {"median": float(np.median(u))}, list(values), resamples=500, seed=3)["median"]
    assert found.units == 5 and found.values.shape == (500,)
    percentile = stats.bootstrap_interval(found)
    assert percentile == stats.bootstrap(lambda u: {"median": float(np.median(u))}, list(values), resamples=500,
                                         seed=3)["median"]
    se, t = float(np.std(found.values, ddof=1)), float(scipy_stats.t.ppf(0.975, 4))
    linear = stats.bootstrap_interval(found, method="standard-error")
    assert (linear.low, linear.high) == pytest.approx((2.0 - t * se, 2.0 + t * se))
    logged = stats.bootstrap_interval(found, method="standard-error", log=True)
    log_se = float(np.std(np.log(found.values), ddof=1))
    assert (logged.low, logged.high) == pytest.approx((2.0 * math.exp(-t * log_se), 2.0 * math.exp(t * log_se)))
    assert logged.low > 0 and linear.low < percentile.low  # reaches beyond the range of the units
    negative = stats.Resamples(-1.0, np.array([-1.0, 1.0, 2.0]), 3)
    assert math.isnan(stats.bootstrap_interval(negative, method="standard-error", log=True).low)
    one = stats.Resamples(2.0, np.full(10, 2.0), 1)
    assert math.isnan(stats.bootstrap_interval(one, method="standard-error").high)
    welch = stats.welch_interval([1.0, 2.0, 4.0], [0.5, 0.7, 0.6, 0.9])
    reference = scipy_stats.ttest_ind([1.0, 2.0, 4.0], [0.5, 0.7, 0.6, 0.9], equal_var=False).confidence_interval()
    assert (welch.low, welch.high, welch.units) == (pytest.approx(reference.low), pytest.approx(reference.high), 3)
    assert math.isnan(stats.welch_interval([1.0], [2.0, 3.0]).low)


COVERAGE_BAD_INPUTS = [
    ("method", lambda: stats.coverage("bca", 4), ValueError,
     r"^`method` must be one of \['percentile', 'standard-error', 't', 'welch'\]; got 'bca'\.$"),
    ("statistic", lambda: stats.coverage("t", 4, statistic="median"), ValueError,
     r"^`statistic` must be one of \['mean', 'geometric mean'\]; got 'median'\.$"),
    ("units", lambda: stats.coverage("percentile", 0), ValueError, r"^`units` must be an integer >= 1; got 0\.$"),
    ("units-float", lambda: stats.coverage("percentile", 4.0), TypeError,
     r"^`units` must be an integer >= 1; got 4\.0 \(float\)\.$"),
    ("welch-units", lambda: stats.coverage("welch", (3, 3, 3)), ValueError,
     r"^`units` must be an integer or a pair of integers for 'welch'; got \(3, 3, 3\)\.$"),
    ("model", lambda: stats.coverage("percentile", 4, model="lognormal"), TypeError,
     r"^`model` must be an approxlab\.stats\.UnitModel; got str\.$"),
    ("ratio-normal", lambda: stats.coverage("percentile", 4, statistic="ratio of medians",
                                            model=stats.UnitModel("normal")), ValueError,
     r"^`model` must be lognormal for statistic 'ratio of medians'; got 'normal'\.$"),
    ("t-members", lambda: stats.coverage("t", 4, statistic="mean", model=stats.UnitModel(members=3, within=1.0)),
     ValueError, r"^`model` must hold one value per unit \(members=1\) for 't'; got 3\.$"),
    ("log-percentile", lambda: stats.coverage("percentile", 4, log=True), ValueError,
     r"^`log` is for the 'standard-error' interval of a positive statistic; got method 'percentile'"),
    ("trials", lambda: stats.coverage("percentile", 4, trials=0), ValueError, r"^`trials` must be an integer >= 1"),
    ("level", lambda: stats.coverage("percentile", 4, level=95), ValueError,
     r"^`level` must be a number with 0 < level < 1; got 95\.$"),
    ("sigma", lambda: stats.UnitModel(sigma=0.0), ValueError, r"^`sigma` must be a finite number > 0; got 0\.0\.$"),
    ("within", lambda: stats.UnitModel(within=-1.0), ValueError, r"^`within` must be a finite number >= 0; got -1"),
    ("distribution", lambda: stats.UnitModel("cauchy"), ValueError,
     r"^`distribution` must be one of \['lognormal', 'normal'\]; got 'cauchy'\.$"),
    ("interval-method", lambda: stats.bootstrap_interval(stats.Resamples(1.0, np.ones(3), 3), method="bca"),
     ValueError, r"^`method` must be one of \['percentile', 'standard-error'\]; got 'bca'\.$"),
    ("interval-resamples", lambda: stats.bootstrap_interval([1.0, 2.0]), TypeError,
     r"^`resamples` must be an approxlab\.stats\.Resamples; got list\.$"),
    ("welch-empty", lambda: stats.welch_interval([], [1.0]), ValueError,
     r"^`first` must hold at least one finite number per unit; got \[\]\.$"),
]


@pytest.mark.parametrize("name, call, error, message", COVERAGE_BAD_INPUTS, ids=[c[0] for c in COVERAGE_BAD_INPUTS])
def test_bad_inputs_are_refused_with_a_message(name, call, error, message):
    with pytest.raises(error, match=message):
        call()
