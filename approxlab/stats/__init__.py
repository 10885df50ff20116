"""The statistics every study reports: summaries, bootstrap intervals, verdicts, win rates, power.

One module, shared by the studies (``figure1`` today), so a claim is judged the same way
everywhere: a statistic, its uncertainty from resampling the independent unit (a text window,
a training seed), a threshold fixed before the run and the side on which the claim holds, and
the power to see it.

Public API::

    describe(frame, by, column, *, quantiles=(0.25, 0.75)) -> DataFrame    # samples, mean, median, q.., max
    UnitAggregate(frame, *, by, unit, column, how="median")                 # aggregate over a multiset of units
    bootstrap(statistic, units, *, resamples=2000, seed=0, level=0.95, paired=True, method="percentile",
              log=False) -> {key: Interval}                                 # percentile or standard-error
    resample(statistic, units, *, resamples=2000, seed=0, paired=True) -> {key: Resamples}
    bootstrap_interval(resamples, *, method="percentile", level=0.95, log=False) -> Interval
    verdict(low, high, threshold, side) -> "reproduced" | "not reproduced" | "inconclusive"
    win_rate(first, second, *, level=0.95, lower_is_better=True) -> WinRate
    permutation_test(first, second) -> float                                # exact, two-sided, equal means
    t_test_power(n, *, difference, sd, alpha=0.05, alternative="two-sided") -> float
    t_test_sample_size(*, difference, sd, power=0.8, alpha=0.05, alternative="two-sided") -> int
    t_interval(values, *, level=0.95) -> Interval                           # the mean over units, Student t
    welch_interval(first, second, *, level=0.95) -> Interval                # a difference of means, Welch t
    coverage(method, units, *, statistic="median", model=UnitModel(), level=0.95, ...) -> Coverage
    rank_correlation(x, y, *, units=None, method="spearman", ...) -> Interval  # with a bootstrap over units
    rank_correlation_difference(first, second, target, *, units=None, ...) -> Interval

Everything is NumPy/SciPy/pandas in float64; nothing here draws from a global random state
(:func:`bootstrap` takes its ``seed``). Each function validates its inputs first: a message names
the parameter, what is allowed and what came in.

Modules: :mod:`~approxlab.stats.summaries`, :mod:`~approxlab.stats.intervals`,
:mod:`~approxlab.stats.verdicts`, :mod:`~approxlab.stats.power`, :mod:`~approxlab.stats.correlation`,
:mod:`~approxlab.stats.coverage` (how often each interval method covers a known truth, by simulation).
"""

from .correlation import CORRELATIONS, rank_correlation, rank_correlation_difference
from .coverage import COVERAGE_METHODS, COVERAGE_STATISTICS, Coverage, UnitModel, coverage
from .intervals import (BOOTSTRAP_METHODS, Interval, Resamples, bootstrap, bootstrap_interval, resample, t_interval,
                        welch_interval)
from .power import ALTERNATIVES, t_test_power, t_test_sample_size
from .summaries import AGGREGATIONS, UnitAggregate, describe
from .verdicts import SIDES, WinRate, permutation_test, verdict, win_rate

__all__ = [
    "AGGREGATIONS",
    "SIDES",
    "ALTERNATIVES",
    "describe",
    "UnitAggregate",
    "Interval",
    "BOOTSTRAP_METHODS",
    "Resamples",
    "resample",
    "bootstrap_interval",
    "bootstrap",
    "verdict",
    "WinRate",
    "win_rate",
    "permutation_test",
    "t_test_power",
    "t_test_sample_size",
    "t_interval",
    "welch_interval",
    "COVERAGE_METHODS",
    "COVERAGE_STATISTICS",
    "UnitModel",
    "Coverage",
    "coverage",
    "CORRELATIONS",
    "rank_correlation",
    "rank_correlation_difference",
]
