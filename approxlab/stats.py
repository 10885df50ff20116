r"""The statistics every study reports: summaries, bootstrap intervals, verdicts, win rates, power.

One module, shared by the studies (``figure1`` today), so a claim is judged the same way
everywhere: a statistic, its uncertainty from resampling the independent unit (a text window,
a training seed), a threshold fixed before the run and the side on which the claim holds, and
the power to see it.

Public API::

    describe(frame, by, column, *, quantiles=(0.25, 0.75)) -> DataFrame    # samples, mean, median, q.., max
    UnitAggregate(frame, *, by, unit, column, how="median")                 # aggregate over a multiset of units
    bootstrap(statistic, units, *, resamples=2000, seed=0, level=0.95) -> {key: Interval}
    verdict(low, high, threshold, side) -> "reproduced" | "not reproduced" | "inconclusive"
    win_rate(first, second, *, level=0.95, lower_is_better=True) -> WinRate
    t_test_power(n, *, difference, sd, alpha=0.05, alternative="two-sided") -> float
    t_test_sample_size(*, difference, sd, power=0.8, alpha=0.05, alternative="two-sided") -> int

Everything is NumPy/SciPy/pandas in float64; nothing here draws from a global random state
(:func:`bootstrap` takes its ``seed``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as _scipy_stats

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
]

AGGREGATIONS = ("median", "mean")
"""How :class:`UnitAggregate` pools the values of a multiset of units."""

SIDES = ("at least", "above", "at most", "below")
"""On which side of its threshold a claim holds (:func:`verdict`)."""

ALTERNATIVES = ("two-sided", "greater", "less")
"""The alternative hypotheses of :func:`t_test_power`."""


def _choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {list(allowed)}; got {value!r}.")
    return value


def _probability(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < 1):
        raise ValueError(f"`{name}` must be a number with 0 < {name} < 1; got {value!r}.")
    return float(value)


def describe(frame: pd.DataFrame, by: Sequence[str], column: str, *, quantiles=(0.25, 0.75)) -> pd.DataFrame:
    """Per group of ``by``: ``samples``, ``mean``, ``median``, one ``q<100 level>`` column per quantile, ``max``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Long table, one value per row in ``column`` (``inf`` counts, as a failure's worst case).
    by : sequence of str
        Grouping columns (sorted groups, as ``DataFrame.groupby(sort=True)``).
    column : str
        The values.
    quantiles : sequence of float
        Levels in (0, 1), linear interpolation (pandas' default), e.g. ``(0.25, 0.75)`` gives
        ``q25``, ``q75``.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``by``.

    Examples
    --------
    >>> import pandas as pd
    >>> from approxlab.stats import describe
    >>> frame = pd.DataFrame({"n": [64, 64, 64, 128, 128], "error": [0.1, 0.2, 0.4, 0.3, 0.5]})
    >>> describe(frame, ["n"], "error")
         samples      mean  median   q25   q75  max
    n
    64         3  0.233333     0.2  0.15  0.30  0.4
    128        2  0.400000     0.4  0.35  0.45  0.5
    """
    levels = [_probability(level, "quantiles") for level in quantiles]
    grouped = frame.groupby(list(by), sort=True)[column]
    columns = {"samples": grouped.size(), "mean": grouped.mean(), "median": grouped.median()}
    for level in levels:
        columns[f"q{round(100 * level):d}"] = grouped.quantile(level)
    columns["max"] = grouped.max()
    return pd.DataFrame(columns)


class UnitAggregate:
    """The median (or mean) of a grid point's values pooled over a multiset of resampling units.

    ``aggregate(units, *key)`` concatenates the values of ``key`` in each of ``units`` (a unit
    named twice counts twice, as in a bootstrap resample) and returns their median or mean;
    NaN when none of ``units`` has values for ``key``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Long table with the columns ``by``, ``unit`` and ``column``.
    by : sequence of str
        The columns that name a grid point (the ``key``).
    unit : str
        The resampling unit (e.g. ``"window"``: heads and seeds within a window share its text,
        so windows are the independent draws).
    column : str
        The values.
    how : {"median", "mean"}
        The aggregation.

    Examples
    --------
    >>> import pandas as pd
    >>> from approxlab.stats import UnitAggregate
    >>> frame = pd.DataFrame({"n": [64] * 4, "window": [0, 0, 1, 1], "error": [1.0, 2.0, 3.0, 5.0]})
    >>> aggregate = UnitAggregate(frame, by=["n"], unit="window", column="error")
    >>> aggregate([0, 1], 64)  # the median of all four values
    2.5
    >>> aggregate([1, 1], 64)  # window 1 drawn twice, as in a bootstrap resample
    4.0
    >>> aggregate([0], 128)  # no values for this grid point
    nan
    """

    def __init__(self, frame: pd.DataFrame, *, by: Sequence[str], unit: str, column: str, how: str = "median"):
        self.how = _choice(how, "how", AGGREGATIONS)
        self._function = np.median if how == "median" else np.mean
        self.arrays = {key: {u: g[column].to_numpy() for u, g in group.groupby(unit)}
                       for key, group in frame.groupby(list(by))}

    def __call__(self, units, *key) -> float:
        per_unit = self.arrays.get(key)
        if not per_unit:
            return math.nan
        parts = [per_unit[u] for u in units if u in per_unit]
        return float(self._function(np.concatenate(parts))) if parts else math.nan


@dataclasses.dataclass(frozen=True)
class Interval:
    """A statistic and its bootstrap percentile interval (widened to include the estimate).

    Examples
    --------
    >>> from approxlab.stats import Interval
    >>> interval = Interval(estimate=0.5, low=0.25, high=0.75)
    >>> interval.high - interval.low
    0.5
    """

    estimate: float
    low: float
    high: float


def bootstrap(statistic: Callable[[dict], Mapping], units: Mapping[object, Sequence] | Sequence, *,
              resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    r"""Percentile bootstrap intervals of every value ``statistic`` returns, resampling ``units``.

    Parameters
    ----------
    statistic : callable
        ``statistic(resampled) -> {key: value}``, where ``resampled`` has the structure of
        ``units`` (a dict group -> list of units, or a list).
    units : dict of group -> sequence, or sequence
        The independent units of each group (e.g. the windows at each sequence length). One
        draw of ``c = max_g |units[g]|`` indices :math:`i_1..i_c` uniform on ``[0, c)`` serves
        every group: group ``g`` gets ``units[g][i_j mod |units[g]|]`` (the same resample for
        all groups of equal size, e.g. the same windows at every n).
    resamples : int
        Number of bootstrap resamples.
    seed : int
        Seed of ``numpy.random.default_rng``: the draws are reproducible.
    level : float
        Coverage of the percentile interval, in (0, 1).

    Returns
    -------
    dict of key -> Interval
        ``estimate`` = the statistic on ``units``; ``low``, ``high`` = the ``(1 - level)/2`` and
        ``(1 + level)/2`` quantiles of the resampled statistics, widened to include the estimate
        where they miss it; NaN when a resampled value is not finite.

    Notes
    -----
    With a single unit per group there is nothing to resample: the interval has no width.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.stats import bootstrap
    >>> errors = {64: [0.1, 0.2, 0.3, 0.4], 128: [0.2, 0.4, 0.6, 0.8]}
    >>> def median_error(resampled):
    ...     return {n: float(np.median(values)) for n, values in resampled.items()}
    >>> intervals = bootstrap(median_error, errors, resamples=200, seed=0)
    >>> intervals[128].estimate
    0.5
    >>> bool(intervals[128].low <= 0.5 <= intervals[128].high)
    True
    """
    level = _probability(level, "level")
    grouped = isinstance(units, Mapping)
    groups = dict(units) if grouped else {None: list(units)}
    if not groups or any(len(u) == 0 for u in groups.values()):
        raise ValueError(f"`units` must give every group at least one unit; got {units!r}.")
    estimate = statistic(units)
    rng = np.random.default_rng(seed)
    count = max(len(u) for u in groups.values())
    draws = rng.integers(0, count, size=(int(resamples), count))
    samples = {key: [] for key in estimate}
    for draw in draws:
        resampled = {g: [u[i % len(u)] for i in draw] for g, u in groups.items()}
        values = statistic(resampled if grouped else resampled[None])
        for key in samples:
            samples[key].append(values.get(key, math.nan))
    alpha = (1 - level) / 2
    intervals = {}
    for key, value in estimate.items():
        values = np.asarray(samples[key], dtype=float)
        low, high = (np.quantile(values, [alpha, 1 - alpha]) if np.isfinite(values).all() else (math.nan,) * 2)
        intervals[key] = Interval(value, min(float(low), value), max(float(high), value))
    return intervals


def verdict(low: float, high: float, threshold: float, side: str) -> str:
    """``"reproduced"`` when the whole interval ``[low, high]`` lies on the claim's ``side`` of
    ``threshold``, ``"not reproduced"`` when it lies wholly on the other side, else
    ``"inconclusive"`` (also for a non-finite bound).

    ``side`` (:data:`SIDES`): ``"at least"`` (claim: value >= threshold), ``"above"`` (>),
    ``"at most"`` (<=), ``"below"`` (<).

    Examples
    --------
    >>> from approxlab.stats import verdict
    >>> verdict(0.6, 0.9, threshold=0.5, side="at least")
    'reproduced'
    >>> verdict(0.1, 0.4, threshold=0.5, side="at least")
    'not reproduced'
    >>> verdict(0.4, 0.6, threshold=0.5, side="at least")
    'inconclusive'
    """
    _choice(side, "side", SIDES)
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    holds = {"at least": low >= threshold, "above": low > threshold,
             "at most": high <= threshold, "below": high < threshold}[side]
    fails = {"at least": high < threshold, "above": high <= threshold,
             "at most": low > threshold, "below": low >= threshold}[side]
    return "reproduced" if holds else "not reproduced" if fails else "inconclusive"


@dataclasses.dataclass(frozen=True)
class WinRate:
    """How often ``first`` beats ``second`` over paired units, with a Wilson score interval.

    Attributes: ``rate`` (wins + ties / 2, over ``count``), ``low``, ``high``, ``wins``, ``ties``,
    ``count``.

    Examples
    --------
    >>> from approxlab.stats import win_rate
    >>> result = win_rate([1.0, 2.0], [2.0, 2.0])
    >>> result.wins, result.ties, result.count, result.rate
    (1, 1, 2, 0.75)
    """

    rate: float
    low: float
    high: float
    wins: int
    ties: int
    count: int


def win_rate(first, second, *, level: float = 0.95, lower_is_better: bool = True) -> WinRate:
    r"""Win rate of ``first`` over ``second`` on paired units (e.g. the same window and seed).

    Parameters
    ----------
    first, second : array_like
        Paired values of the two methods (same length, finite or ``inf``; NaN pairs are dropped).
    level : float
        Coverage of the interval.
    lower_is_better : bool
        ``True`` (errors): ``first`` wins where it is smaller.

    Returns
    -------
    WinRate
        ``rate`` :math:`\hat p = (w + t/2)/N` for ``w`` wins and ``t`` ties out of ``N`` pairs, and
        the Wilson score interval :math:`\frac{\hat p + z^2/2N \pm z\sqrt{\hat p(1-\hat p)/N + z^2/4N^2}}{1 + z^2/N}`
        (Wilson 1927), which stays inside [0, 1] and keeps its coverage near 0 and 1 where the
        normal interval does not. Treats pairs as independent: pass one pair per resampling unit
        (e.g. medians per window) when values within a unit are correlated.

    Examples
    --------
    >>> from approxlab.stats import win_rate
    >>> first = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    >>> second = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1]
    >>> result = win_rate(first, second)  # first has the smaller error in 7 of 8 pairs
    >>> result.rate, result.wins, result.count
    (0.875, 7, 8)
    >>> round(result.low, 3), round(result.high, 3)
    (0.529, 0.978)
    """
    level = _probability(level, "level")
    a, b = np.asarray(first, dtype=float).ravel(), np.asarray(second, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"`first` and `second` must be paired (same length); got {a.size} and {b.size}.")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size == 0:
        raise ValueError("`first` and `second` must have at least one pair without NaN; got none.")
    better = a < b if lower_is_better else a > b
    wins, ties, count = int(better.sum()), int((a == b).sum()), int(a.size)
    rate = (wins + ties / 2) / count
    z = float(_scipy_stats.norm.ppf(0.5 + level / 2))
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return WinRate(rate, max(0.0, centre - half), min(1.0, centre + half), wins, ties, count)


def _check_effect(difference, sd, alpha, alternative):
    if isinstance(difference, bool) or not isinstance(difference, (int, float)) or not math.isfinite(difference):
        raise ValueError(f"`difference` must be a finite number; got {difference!r}.")
    if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not (0 < sd < math.inf):
        raise ValueError(f"`sd` must be a finite number > 0; got {sd!r}.")
    _probability(alpha, "alpha")
    _choice(alternative, "alternative", ALTERNATIVES)


def t_test_power(n: int, *, difference: float, sd: float, alpha: float = 0.05,
                 alternative: str = "two-sided") -> float:
    r"""Power of a one-sample (or paired) t-test with ``n`` units to detect a mean ``difference``.

    Parameters
    ----------
    n : int
        Number of independent units (``>= 2``): e.g. training seeds, each giving one ratio.
    difference : float
        The true mean minus the tested value: for "the mean ratio
        :math:`\tau/\tau_{softmax}` exceeds ``r0``", ``difference = mean ratio - r0``; for a paired
        comparison, the mean of the per-unit differences.
    sd : float
        Standard deviation of one unit's value (of the ratios, or of the paired differences).
    alpha : float
        Significance level.
    alternative : {"two-sided", "greater", "less"}
        ``"greater"``: the claim is mean > value.

    Returns
    -------
    float
        :math:`P(\text{reject})` under the noncentral :math:`t_{n-1}(\delta\sqrt n)` law of the
        statistic, :math:`\delta = \text{difference}/\text{sd}` (Cohen 1988, Ch. 2).

    Examples
    --------
    >>> from approxlab.stats import t_test_power
    >>> round(t_test_power(20, difference=0.5, sd=1.0), 3)
    0.565
    >>> round(t_test_power(20, difference=0.5, sd=1.0, alternative="greater"), 3)
    0.695
    """
    _check_effect(difference, sd, alpha, alternative)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"`n` must be an integer >= 2 (a t-test needs a variance); got {n!r}.")
    df, noncentrality = n - 1, difference / sd * math.sqrt(n)
    law = _scipy_stats.nct(df, noncentrality)
    if alternative == "two-sided":
        critical = _scipy_stats.t.ppf(1 - alpha / 2, df)
        return float(law.sf(critical) + law.cdf(-critical))
    critical = _scipy_stats.t.ppf(1 - alpha, df)
    return float(law.sf(critical) if alternative == "greater" else law.cdf(-critical))


def t_test_sample_size(*, difference: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                       alternative: str = "two-sided", max_n: int = 1_000_000) -> int:
    """The smallest ``n >= 2`` whose :func:`t_test_power` reaches ``power``.

    Raises
    ------
    ValueError
        Bad arguments, or ``power`` not reached by ``max_n`` units (e.g. a difference of 0, or of
        the wrong sign for a one-sided alternative).

    Examples
    --------
    >>> from approxlab.stats import t_test_sample_size, t_test_power
    >>> n = t_test_sample_size(difference=0.5, sd=1.0, power=0.8)
    >>> n
    34
    >>> t_test_power(n - 1, difference=0.5, sd=1.0) < 0.8 <= t_test_power(n, difference=0.5, sd=1.0)
    True
    """
    _check_effect(difference, sd, alpha, alternative)
    power = _probability(power, "power")
    low, high = 2, 2
    while t_test_power(high, difference=difference, sd=sd, alpha=alpha, alternative=alternative) < power:
        if high >= max_n:
            raise ValueError(f"`power` {power} is not reached with up to max_n={max_n} units for difference="
                             f"{difference}, sd={sd}, alternative={alternative!r}.")
        low, high = high, min(2 * high, max_n)
    while low < high:  # power grows with n where it is reachable: bisect in (low, high]
        middle = (low + high) // 2
        reached = t_test_power(middle, difference=difference, sd=sd, alpha=alpha, alternative=alternative) >= power
        low, high = (low, middle) if reached else (middle + 1, high)
    return high
