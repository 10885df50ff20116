"""approxlab.stats: summaries, bootstrap intervals over units, verdicts, win rates and t-test power."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from approxlab import stats


def test_describe_matches_numpy_per_group():
    frame = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 4, "x": [1.0, 2, 3, 4, 100, 5, 6, 7, math.inf]})
    table = stats.describe(frame, ["g"], "x", quantiles=(0.1, 0.25, 0.75))
    assert list(table.columns) == ["samples", "mean", "median", "q10", "q25", "q75", "max"]
    a = np.array([1.0, 2, 3, 4, 100])
    row = table.loc["a"]
    assert row["samples"] == 5 and row["mean"] == a.mean() and row["median"] == 3.0
    assert row["q10"] == pytest.approx(np.quantile(a, 0.1)) and row["q75"] == np.quantile(a, 0.75)
    assert table.loc["b", "max"] == math.inf and table.loc["b", "median"] == 6.5  # a failure's inf counts
    with pytest.raises(ValueError, match="`quantiles` must be a number with 0 < quantiles < 1; got 1.5"):
        stats.describe(frame, ["g"], "x", quantiles=(1.5,))


def test_unit_aggregate_pools_a_multiset_of_units():
    frame = pd.DataFrame({"method": ["m"] * 6, "window": [0, 0, 1, 1, 2, 2], "error": [1.0, 2, 3, 4, 10, 20]})
    median = stats.UnitAggregate(frame, by=["method"], unit="window", column="error")
    mean = stats.UnitAggregate(frame, by=["method"], unit="window", column="error", how="mean")
    assert median([0, 1], "m") == 2.5 and mean([0, 1], "m") == 2.5
    assert median([0, 0, 2], "m") == 2.0  # a unit named twice counts twice: [1, 2, 1, 2, 10, 20]
    assert mean([0, 0, 2], "m") == pytest.approx(36 / 6)
    assert math.isnan(median([5], "m")) and math.isnan(median([0], "other"))
    with pytest.raises(ValueError, match=r"`how` must be one of \['median', 'mean'\]; got 'mode'"):
        stats.UnitAggregate(frame, by=["method"], unit="window", column="error", how="mode")


def test_bootstrap_percentile_interval_of_a_mean():
    rng = np.random.default_rng(0)
    values = rng.normal(10.0, 2.0, size=40)
    intervals = stats.bootstrap(lambda units: {"mean": float(np.mean(units))}, list(values), resamples=4000, seed=1)
    interval = intervals["mean"]
    assert interval.estimate == pytest.approx(values.mean())
    half = 1.96 * values.std(ddof=1) / math.sqrt(40)  # the normal interval it should approach
    assert interval.low == pytest.approx(values.mean() - half, abs=0.15)
    assert interval.high == pytest.approx(values.mean() + half, abs=0.15)
    again = stats.bootstrap(lambda units: {"mean": float(np.mean(units))}, list(values), resamples=4000, seed=1)
    assert again == intervals  # reproducible from its seed
    single = stats.bootstrap(lambda units: {"x": float(np.mean(units))}, [3.0], resamples=50)
    assert single["x"] == stats.Interval(3.0, 3.0, 3.0)  # one unit: nothing to resample


def test_bootstrap_groups_share_one_draw_and_include_the_estimate():
    seen = []

    def statistic(units):
        seen.append(units)
        return {"a": float(np.median(units["a"])), "b": float(np.median(units["b"]))}

    stats.bootstrap(statistic, {"a": [1.0, 2.0, 3.0], "b": [10.0, 20.0, 30.0]}, resamples=20, seed=0)
    for units in seen[1:]:  # the same indices in both groups
        assert [u * 10 for u in units["a"]] == units["b"]
    skewed = stats.bootstrap(lambda u: {"min": float(min(u))}, [0.0, 5.0, 5.0, 5.0, 5.0], resamples=200, seed=0)
    assert skewed["min"].low <= skewed["min"].estimate <= skewed["min"].high
    with pytest.raises(ValueError, match="`units` must give every group at least one unit"):
        stats.bootstrap(statistic, {"a": [], "b": [1.0]})


@pytest.mark.parametrize("side, inside, outside", [
    ("at least", (1.0, 2.0), (0.0, 0.9)), ("above", (1.1, 2.0), (0.0, 1.0)),
    ("at most", (0.0, 1.0), (1.1, 2.0)), ("below", (0.0, 0.9), (1.0, 2.0)),
])
def test_verdicts_by_side(side, inside, outside):
    assert stats.verdict(*inside, 1.0, side) == "reproduced"
    assert stats.verdict(*outside, 1.0, side) == "not reproduced"
    assert stats.verdict(0.5, 1.5, 1.0, side) == "inconclusive"
    assert stats.verdict(math.nan, 1.5, 1.0, side) == "inconclusive"
    with pytest.raises(ValueError, match="`side` must be one of"):
        stats.verdict(0.0, 1.0, 1.0, "over")


def test_win_rate_with_wilson_interval():
    first = np.array([1, 1, 1, 1, 1, 1, 1, 1, 5, 5], dtype=float)
    second = np.full(10, 2.0)
    result = stats.win_rate(first, second)
    assert (result.wins, result.ties, result.count, result.rate) == (8, 0, 10, 0.8)
    assert (result.low, result.high) == (pytest.approx(0.4902, abs=1e-4), pytest.approx(0.9433, abs=1e-4))
    tied = stats.win_rate([1.0, 2.0, np.nan], [1.0, 3.0, 0.0], lower_is_better=True)
    assert (tied.wins, tied.ties, tied.count, tied.rate) == (1, 1, 2, 0.75)
    assert stats.win_rate([3.0], [1.0], lower_is_better=False).rate == 1.0
    with pytest.raises(ValueError, match="`first` and `second` must be paired"):
        stats.win_rate([1.0], [1.0, 2.0])


def test_t_test_power_matches_cohen_and_simulation():
    """One-sample t-test at d = 0.5, alpha = 0.05 two-sided: n = 34 gives power 0.8078 (Cohen 1988,
    G*Power); a paired comparison is the same test on the differences."""
    assert stats.t_test_power(34, difference=0.5, sd=1.0) == pytest.approx(0.8078, abs=5e-4)
    assert stats.t_test_sample_size(difference=0.5, sd=1.0) == 34
    assert stats.t_test_sample_size(difference=0.5, sd=1.0, alternative="greater") == 27
    assert stats.t_test_sample_size(difference=-0.5, sd=1.0, alternative="less") == 27
    assert stats.t_test_power(10, difference=0.0, sd=1.0) == pytest.approx(0.05)
    # Monte Carlo: ratios with mean 1.1 tested against 1 with 8 seeds, sd 0.1.
    rng = np.random.default_rng(0)
    samples = rng.normal(1.1, 0.1, size=(20000, 8))
    rejected = scipy_stats.ttest_1samp(samples, 1.0, axis=1, alternative="greater").pvalue < 0.05
    predicted = stats.t_test_power(8, difference=0.1, sd=0.1, alternative="greater")
    assert float(rejected.mean()) == pytest.approx(predicted, abs=0.01)
    with pytest.raises(ValueError, match="`power` 0.8 is not reached with up to max_n=1000"):
        stats.t_test_sample_size(difference=0.0, sd=1.0, max_n=1000)
    with pytest.raises(ValueError, match="`n` must be an integer >= 2"):
        stats.t_test_power(1, difference=0.5, sd=1.0)
    with pytest.raises(ValueError, match="`sd` must be a finite number > 0; got 0"):
        stats.t_test_power(5, difference=0.5, sd=0)
    with pytest.raises(ValueError, match=r"`alternative` must be one of \['two-sided', 'greater', 'less'\]"):
        stats.t_test_power(5, difference=0.5, sd=1.0, alternative="larger")
