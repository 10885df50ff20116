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
    single = stats.bootstrap(lambda units: {"x": float(np.mean(units))}, [3.0], resamples=50)["x"]
    assert single.estimate == 3.0 and single.units == 1  # one unit: nothing to resample, no interval
    assert math.isnan(single.low) and math.isnan(single.high)


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


# -- bootstrap: each group at its own size; equal sizes as before, bit for bit ------------------

def _frozen_resamples(units, resamples, seed):
    """The resamples of approxlab.stats.bootstrap as first released (one draw of the largest group's
    size, ``u[i % len(u)]`` for every group), frozen here: for groups of equal size the current
    function must reproduce them exactly (the committed studies' intervals depend on them)."""
    groups = dict(units)
    rng = np.random.default_rng(seed)
    count = max(len(u) for u in groups.values())
    draws = rng.integers(0, count, size=(int(resamples), count))
    return [{g: [u[i % len(u)] for i in draw] for g, u in groups.items()} for draw in draws]


def _recording(statistic):
    seen = []

    def record(units):
        seen.append(units)
        return statistic(units)

    return record, seen


def _medians(units):
    return {g: float(np.median(v)) for g, v in units.items()}


@pytest.mark.parametrize("sizes, seed", [((7, 7, 7), 0), ((1, 1), 3), ((12,), 5), ((4, 4), 2**40)])
def test_bootstrap_equal_groups_resample_exactly_as_first_released(sizes, seed):
    rng = np.random.default_rng(1)
    units = {f"g{j}": list(rng.normal(size=size)) for j, size in enumerate(sizes)}
    record, seen = _recording(_medians)
    intervals = stats.bootstrap(record, units, resamples=300, seed=seed)
    frozen = _frozen_resamples(units, 300, seed)
    if max(sizes) == 1:  # every resample would be the units themselves: no interval, the statistic called once
        assert len(seen) == 1 and all(math.isnan(i.low) and i.units == 1 for i in intervals.values())
        return
    assert seen[1:] == frozen
    values = {g: np.array([float(np.median(r[g])) for r in frozen]) for g in units}
    for g, interval in intervals.items():
        low, high = np.quantile(values[g], [0.025, 0.975])
        assert (interval.low, interval.high) == (min(low, interval.estimate), max(high, interval.estimate))


def test_bootstrap_resamples_unequal_groups_at_their_own_size_as_scipy_does():
    """Groups of 5 and 3 units, mean statistic: b's resampled means average b's mean (3.67; the
    first release's wrap-around draw gave 2.42), and both intervals are scipy's percentile ones."""
    units = {"a": [0, 0, 0, 0, 10], "b": [0, 1, 10]}
    record, seen = _recording(lambda u: {g: float(np.mean(v)) for g, v in u.items()})
    intervals = stats.bootstrap(record, units, resamples=4000, seed=0)
    assert all(len(r["a"]) == 5 and len(r["b"]) == 3 for r in seen[1:])
    assert np.mean([np.mean(r["b"]) for r in seen[1:]]) == pytest.approx(11 / 3, abs=0.1)
    for g, values in units.items():
        reference = scipy_stats.bootstrap((values,), np.mean, n_resamples=4000, method="percentile",
                                          rng=np.random.default_rng(1)).confidence_interval
        assert (intervals[g].low, intervals[g].high) == (reference.low, reference.high)


def test_bootstrap_gives_each_group_its_own_degrees_of_freedom():
    """Groups of 8 and 3 units: the standard-error interval of a's mean uses t with 7 degrees of freedom, not the
    smallest group's 2 (the former rule: every key took the smallest group's count); a statistic over both groups
    keeps the smallest count."""
    units = {"a": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0], "b": [1.0, 2.0, 4.0]}
    found = stats.resample(lambda u: {**{g: float(np.mean(v)) for g, v in u.items()},
                                      ("a", "spread"): float(np.std(u["a"])),
                                      "both": float(np.mean(u["a"]) - np.mean(u["b"]))}, units, resamples=500, seed=0)
    assert (found["a"].units, found["b"].units, found[("a", "spread")].units, found["both"].units) == (8, 3, 8, 3)
    interval = stats.bootstrap_interval(found["a"], method="standard-error")
    half = scipy_stats.t.ppf(0.975, 7) * float(np.std(found["a"].values, ddof=1))
    assert interval.high - interval.estimate == pytest.approx(half)
    assert interval.units == 8


def test_bootstrap_pairs_only_groups_of_equal_size():
    units = {"a": [1.0, 2.0, 3.0], "b": [10.0, 20.0, 30.0], "c": [5.0, 6.0, 7.0, 8.0], "d": [50.0, 60.0, 70.0, 80.0]}
    record, seen = _recording(_medians)
    stats.bootstrap(record, units, resamples=50, seed=0)
    assert all([10 * u for u in r["a"]] == r["b"] and [10 * u for u in r["c"]] == r["d"] for r in seen[1:])
    record, seen = _recording(_medians)
    stats.bootstrap(record, units, resamples=50, seed=0, paired=False)
    assert any([10 * u for u in r["a"]] != r["b"] for r in seen[1:])


# -- every stats function validates its inputs in one block -------------------------------------

_FRAME = pd.DataFrame({"n": [64, 64, 128], "window": [0, 1, 0], "error": [0.1, 0.2, 0.3]})
_NAN_FRAME = _FRAME.assign(error=[0.1, math.nan, 0.3])
_TEXT_FRAME = _FRAME.assign(error=["a", "b", "c"])


def _mean_of(units):
    return {"mean": float(np.mean(units))}


STATS_BAD_INPUTS = [
    ("describe-frame-dict", lambda: stats.describe({"n": [1]}, ["n"], "error"), TypeError,
     r"^`frame` must be a pandas\.DataFrame; got dict\.$"),
    ("describe-missing-column", lambda: stats.describe(_FRAME, ["n"], "err"), ValueError,
     r"^`column` must name columns of `frame` \(one of \['n', 'window', 'error'\]\); got 'err', which is not one\.$"),
    ("describe-missing-by", lambda: stats.describe(_FRAME, ["size"], "error"), ValueError,
     r"^`by` must name columns of `frame` .*; got 'size', which is not one\.$"),
    ("describe-by-empty", lambda: stats.describe(_FRAME, [], "error"), ValueError,
     r"^`by` must be a column name or a non-empty list of column names; got \[\]\.$"),
    ("describe-by-unhashable", lambda: stats.describe(_FRAME, [["n"]], "error"), ValueError,
     r"^`by` must name columns of `frame` .*; got \['n'\], which is not one\.$"),
    ("describe-nan", lambda: stats.describe(_NAN_FRAME, ["n"], "error"), ValueError,
     r"^`column` 'error' must hold no NaN \(drop those rows, or record a failure as inf\); got 1 NaN value\(s\) of 3\.$"),
    ("describe-text-values", lambda: stats.describe(_TEXT_FRAME, ["n"], "error"), TypeError,
     r"^`column` 'error' must hold real numbers; got dtype (object|str)\.$"),
    ("describe-quantiles-scalar", lambda: stats.describe(_FRAME, ["n"], "error", quantiles=0.5), TypeError,
     r"^`quantiles` must be a sequence of levels in \(0, 1\), e\.g\. \(0\.25, 0\.75\); got 0\.5 \(float\)\.$"),
    ("describe-quantiles-str", lambda: stats.describe(_FRAME, ["n"], "error", quantiles="0.5"), TypeError,
     r"^`quantiles` must be a sequence of levels .*; got '0\.5' \(str\)\.$"),
    ("describe-quantiles-one-column", lambda: stats.describe(_FRAME, ["n"], "error", quantiles=(0.251, 0.249)),
     ValueError, r"^`quantiles` must give distinct columns q<100 level>; got \[0\.251, 0\.249\], columns \['q25', 'q25'\]\.$"),
    ("describe-quantile-one", lambda: stats.describe(_FRAME, ["n"], "error", quantiles=(1.0,)), ValueError,
     r"^`quantiles` must be a number with 0 < quantiles < 1; got 1\.0\.$"),
    ("aggregate-missing-unit", lambda: stats.UnitAggregate(_FRAME, by=["n"], unit="seed", column="error"), ValueError,
     r"^`unit` must name columns of `frame` .*; got 'seed', which is not one\.$"),
    ("aggregate-by-empty", lambda: stats.UnitAggregate(_FRAME, by=(), unit="window", column="error"), ValueError,
     r"^`by` must be a column name or a non-empty list of column names; got \(\)\.$"),
    ("aggregate-nan", lambda: stats.UnitAggregate(_NAN_FRAME, by=["n"], unit="window", column="error"), ValueError,
     r"^`column` 'error' must hold no NaN"),
    ("bootstrap-resamples-float", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], resamples=2.7), TypeError,
     r"^`resamples` must be an integer >= 1; got 2\.7 \(float\)\.$"),
    ("bootstrap-resamples-zero", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], resamples=0), ValueError,
     r"^`resamples` must be an integer >= 1; got 0\.$"),
    ("bootstrap-resamples-negative", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], resamples=-5), ValueError,
     r"^`resamples` must be an integer >= 1; got -5\.$"),
    ("bootstrap-resamples-bool", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], resamples=True), TypeError,
     r"^`resamples` must be an integer >= 1; got True \(bool\)\.$"),
    ("bootstrap-seed-negative", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], seed=-1), ValueError,
     r"^`seed` must be an integer >= 0; got -1\.$"),
    ("bootstrap-seed-none", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], seed=None), TypeError,
     r"^`seed` must be an integer >= 0; got None \(NoneType\)\.$"),
    ("bootstrap-level-one", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], level=1), ValueError,
     r"^`level` must be a number with 0 < level < 1; got 1\.$"),
    ("bootstrap-paired-int", lambda: stats.bootstrap(_mean_of, [1.0, 2.0], paired=1), TypeError,
     r"^`paired` must be a bool \(True or False\); got 1 \(int\)\.$"),
    ("bootstrap-statistic-float", lambda: stats.bootstrap(lambda u: float(np.mean(u)), [1.0, 2.0]), TypeError,
     r"^`statistic` must return a dict of key -> number; got float \(1\.5\) on the units themselves\.$"),
    ("bootstrap-statistic-array-value", lambda: stats.bootstrap(lambda u: {"x": np.array(u)}, [1.0, 2.0]), TypeError,
     r"^`statistic` must return a dict of key -> number; got array\(\[1\., 2\.\]\) \(ndarray\) for key 'x'"),
    ("bootstrap-statistic-not-callable", lambda: stats.bootstrap("mean", [1.0, 2.0]), TypeError,
     r"^`statistic` must be a function of the resampled units returning a dict; got str\.$"),
    ("bootstrap-units-str", lambda: stats.bootstrap(_mean_of, "abc"), TypeError,
     r"^`units` must be a dict of group -> sequence of units, or a sequence of units; got str\.$"),
    ("bootstrap-group-scalar", lambda: stats.bootstrap(_mean_of, {64: 3.0}), TypeError,
     r"^`units` must be a dict of group -> sequence of units, or a sequence of units; got float for group 64\.$"),
    ("bootstrap-group-empty", lambda: stats.bootstrap(_mean_of, {64: [], 128: [1.0]}), ValueError,
     r"^`units` must give every group at least one unit; got"),
    ("verdict-inverted", lambda: stats.verdict(0.9, 0.1, 0.5, "at least"), ValueError,
     r"^`low` and `high` must bound an interval, low <= high; got low=0\.9, high=0\.1\.$"),
    ("verdict-string-low", lambda: stats.verdict("0.1", 0.9, 0.5, "at least"), TypeError,
     r"^`low` must be a real number; got '0\.1' \(str\)\.$"),
    ("verdict-string-high", lambda: stats.verdict(0.1, "0.9", 0.5, "at most"), TypeError,
     r"^`high` must be a real number; got '0\.9' \(str\)\.$"),
    ("verdict-bool-threshold", lambda: stats.verdict(0.1, 0.9, True, "at most"), TypeError,
     r"^`threshold` must be a real number; got True \(bool\)\.$"),
    ("verdict-nan-threshold", lambda: stats.verdict(0.1, 0.9, math.nan, "at least"), ValueError,
     r"^`threshold` must be a number fixed before the run \(inf allowed\); got nan\.$"),
    ("verdict-side-list", lambda: stats.verdict(0.1, 0.9, 0.5, ["at least"]), ValueError,
     r"^`side` must be one of \['at least', 'above', 'at most', 'below'\]; got \['at least'\]\.$"),
    ("win-rate-strings", lambda: stats.win_rate(["a", "b"], [1.0, 2.0]), TypeError,
     r"^`first` must be an array of real numbers; got dtype <U1 \(e\.g\. np\.str_\('a'\)\)\.$"),
    ("win-rate-numeric-strings", lambda: stats.win_rate([1.0, 2.0], ["1", "2"]), TypeError,
     r"^`second` must be an array of real numbers; got dtype <U1"),
    ("win-rate-bools", lambda: stats.win_rate([True, False], [1.0, 2.0]), TypeError,
     r"^`first` must be an array of real numbers; got dtype bool"),
    ("win-rate-lower-is-better-str", lambda: stats.win_rate([1.0], [2.0], lower_is_better="yes"), TypeError,
     r"^`lower_is_better` must be a bool \(True or False\); got 'yes' \(str\)\.$"),
    ("permutation-nan", lambda: stats.permutation_test([1.0, math.nan, 3.0], [4.0, 5.0, 6.0]), ValueError,
     r"^`first` must hold finite numbers \(a NaN or an inf has no place in a mean\); got 1 NaN and 0 inf of 3 "
     r"values\.$"),
    ("permutation-inf", lambda: stats.permutation_test([1.0, 2.0, 3.0], [4.0, math.inf, 6.0]), ValueError,
     r"^`second` must hold finite numbers .*; got 0 NaN and 1 inf of 3 values\.$"),
    ("permutation-strings", lambda: stats.permutation_test(["a", "b"], [1.0, 2.0]), TypeError,
     r"^`first` must be an array of real numbers; got dtype <U1"),
    ("permutation-2d", lambda: stats.permutation_test([[1.0, 2.0], [3.0, 4.0]], [5.0, 6.0]), ValueError,
     r"^`first` must be one-dimensional \(one real number per unit\); got shape \(2, 2\)\.$"),
    ("permutation-scalar", lambda: stats.permutation_test([1.0, 2.0], 3.0), ValueError,
     r"^`second` must be one-dimensional \(one real number per unit\); got shape \(\)\.$"),
    ("permutation-ragged", lambda: stats.permutation_test([1.0, [2.0, 3.0]], [4.0]), TypeError,
     r"^`first` must be an array of real numbers; got a ragged sequence"),
    ("permutation-empty", lambda: stats.permutation_test([], [1.0, 2.0]), ValueError,
     r"^`first` must hold at least one value; got none\.$"),
    ("permutation-alternative", lambda: stats.permutation_test([1.0], [2.0], alternative="lower"), ValueError,
     r"^`alternative` must be one of \['two-sided', 'less', 'greater'\]; got 'lower'\.$"),
    ("power-n-float", lambda: stats.t_test_power(10.0, difference=0.5, sd=1.0), TypeError,
     r"^`n` must be an integer >= 2 \(a t-test needs a variance\); got 10\.0 \(float\)\.$"),
    ("power-difference-str", lambda: stats.t_test_power(10, difference="0.5", sd=1.0), TypeError,
     r"^`difference` must be a finite number; got '0\.5'\.$"),
    ("sample-size-max-n-one", lambda: stats.t_test_sample_size(difference=0.5, sd=1.0, max_n=1), ValueError,
     r"^`max_n` must be an integer >= 2 \(the smallest t-test has 2 units\); got 1\.$"),
    ("sample-size-max-n-str", lambda: stats.t_test_sample_size(difference=0.5, sd=1.0, max_n="100"), TypeError,
     r"^`max_n` must be an integer >= 2 \(the smallest t-test has 2 units\); got '100' \(str\)\.$"),
]


@pytest.mark.parametrize("call, error, match", [case[1:] for case in STATS_BAD_INPUTS],
                         ids=[case[0] for case in STATS_BAD_INPUTS])
def test_stats_refuse_bad_inputs_naming_the_parameter(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_stats_accept_what_they_document():
    """The decided cases: a str ``by`` is one column, ``inf`` thresholds and bounds, numpy scalars."""
    assert list(stats.describe(_FRAME, "n", "error").index) == [64, 128]
    assert stats.verdict(0.1, 0.9, math.inf, "at most") == "reproduced"
    assert stats.verdict(-math.inf, 0.9, 0.5, "at most") == "inconclusive"
    assert stats.verdict(np.float32(0.6), np.float64(0.9), 0.5, "at least") == "reproduced"
    assert stats.t_test_sample_size(difference=0.5, sd=1.0, max_n=np.int64(100)) == 34
    assert stats.win_rate(np.array([1, 2], dtype=object), [2.0, 1.0]).wins == 1


def test_permutation_test_counts_ties_at_the_scale_of_the_values():
    """A split whose difference equals the observed one up to the rounding of the sums is as extreme: the tie
    tolerance follows the values' magnitude (an absolute 1e-12 misses ties among values near 1e6)."""
    for scale in (0.0, 1e6, 1e9):  # equal means in exact arithmetic: every split is as far from 0, p = 1
        first, second = [scale + 0.1, scale + 0.7], [scale + 0.3, scale + 0.5]
        assert stats.permutation_test(first, second) == 1.0 and stats.permutation_test(second, first) == 1.0
    small = [0.1, 0.2, 0.3]
    assert stats.permutation_test(small, [0.3, 0.1, 0.2]) == 1.0
    assert stats.permutation_test(np.float32([1.0, 2.0]), (3, 4)) == pytest.approx(2 / 6)


def _permutation_by_enumeration(first, second, alternative):
    """Every split listed (the test's definition), for the check below."""
    import itertools

    pooled, size = np.concatenate([first, second]), len(first)
    observed, total = np.mean(first) - np.mean(second), pooled.sum()
    tie = 4 * pooled.size * np.finfo(float).eps * np.abs(pooled).max()
    sign = {"two-sided": 0, "less": -1, "greater": 1}[alternative]
    extreme = count = 0
    for chosen in itertools.combinations(range(pooled.size), size):
        part = pooled[list(chosen)].sum()
        difference = part / size - (total - part) / (pooled.size - size)
        extreme += int(abs(difference) >= abs(observed) - tie if sign == 0 else sign * difference >= sign * observed - tie)
        count += 1
    return extreme / count


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_the_permutation_test_counts_what_listing_every_split_counts(alternative):
    """Meeting in the middle counts the same splits as listing them, ties (repeated integers) included."""
    rng = np.random.default_rng(3)
    for trial in range(60):
        n1, n2 = rng.integers(1, 8, size=2)
        if trial % 3 == 0:
            first, second = rng.integers(0, 4, n1).astype(float), rng.integers(0, 4, n2).astype(float)
        else:
            first, second = rng.normal(size=n1), rng.normal(size=n2) + rng.normal()
        assert stats.permutation_test(first, second, alternative=alternative) == pytest.approx(
            _permutation_by_enumeration(first, second, alternative), abs=1e-12)


def test_the_permutation_test_takes_thirteen_units_a_group_and_refuses_too_many():
    """13 seeds a task (10,400,600 splits) is counted exactly; beyond PERMUTATION_UNITS the error says so."""
    from approxlab.stats.verdicts import PERMUTATION_UNITS

    assert stats.permutation_test(np.arange(13.0), np.arange(13.0) + 100) == pytest.approx(2 / math.comb(26, 13))
    with pytest.raises(ValueError, match="at most 40 units"):
        stats.permutation_test(np.zeros(PERMUTATION_UNITS), np.ones(1))
