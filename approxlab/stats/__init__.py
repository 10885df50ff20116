"""The statistics every study reports: summaries, bootstrap intervals, verdicts, win rates, power.

One module, shared by the studies (``figure1`` today), so a claim is judged the same way
everywhere: a statistic, its uncertainty from resampling the independent unit (a text window,
a training seed), a threshold fixed before the run and the side on which the claim holds, and
the power to see it.

Public API::

    describe(frame, by, column, *, quantiles=(0.25, 0.75)) -> DataFrame    # samples, mean, median, q.., max
    UnitAggregate(frame, *, by, unit, column, how="median")                 # aggregate over a multiset of units
    bootstrap(statistic, units, *, resamples=2000, seed=0, level=0.95, paired=True) -> {key: Interval}
    verdict(low, high, threshold, side) -> "reproduced" | "not reproduced" | "inconclusive"
    win_rate(first, second, *, level=0.95, lower_is_better=True) -> WinRate
    t_test_power(n, *, difference, sd, alpha=0.05, alternative="two-sided") -> float
    t_test_sample_size(*, difference, sd, power=0.8, alpha=0.05, alternative="two-sided") -> int
    t_interval(values, *, level=0.95) -> Interval                           # the mean over units, Student t
    rank_correlation(x, y, *, units=None, method="spearman", ...) -> Interval  # with a bootstrap over units
    rank_correlation_difference(first, second, target, *, units=None, ...) -> Interval

Everything is NumPy/SciPy/pandas in float64; nothing here draws from a global random state
(:func:`bootstrap` takes its ``seed``). Each function validates its inputs first: a message names
the parameter, what is allowed and what came in.

Modules: :mod:`~approxlab.stats.summaries`, :mod:`~approxlab.stats.intervals`,
:mod:`~approxlab.stats.verdicts`, :mod:`~approxlab.stats.power`, :mod:`~approxlab.stats.correlation`.
"""

from .correlation import CORRELATIONS, rank_correlation, rank_correlation_difference
from .intervals import Interval, bootstrap, t_interval
from .power import ALTERNATIVES, t_test_power, t_test_sample_size
from .summaries import AGGREGATIONS, UnitAggregate, describe
from .verdicts import SIDES, WinRate, verdict, win_rate

__all__ = [
    "AGGREGATIONS",
    "SIDES",
    "ALTERNATIVES",
    "describe",
    "UnitAggregate",
    "Interval",
    "bootstrap",
    "verdict",
    "WinRate",
    "win_rate",
    "t_test_power",
    "t_test_sample_size",
    "t_interval",
    "CORRELATIONS",
    "rank_correlation",
    "rank_correlation_difference",
]
