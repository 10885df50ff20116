"""Summaries of a long table by group: :func:`describe`, and :class:`UnitAggregate` over multisets of units."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ._checks import check_frame, choice, probability

__all__ = ['AGGREGATIONS', 'describe', 'UnitAggregate']

AGGREGATIONS = ("median", "mean")
"""How :class:`UnitAggregate` pools the values of a multiset of units."""


def describe(frame: pd.DataFrame, by: Sequence[str], column: str, *, quantiles=(0.25, 0.75)) -> pd.DataFrame:
    """Per group of ``by``: ``samples``, ``mean``, ``median``, one ``q<100 level>`` column per quantile, ``max``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Long table, one value per row in ``column`` (``inf`` counts, as a failure's worst case).
    by : str or sequence of str
        Grouping columns (sorted groups, as ``DataFrame.groupby(sort=True)``); a str is one column.
    column : str
        The values: real numbers, ``inf`` allowed, **no NaN**. A NaN is neither a value nor a
        failure, and pandas would count it in ``samples`` while ``mean`` and ``median`` skip it,
        so it is refused: drop such rows (``frame.dropna(subset=[column])``) or record a failure
        as ``inf``.
    quantiles : sequence of float
        Levels in (0, 1), linear interpolation (pandas' default), e.g. ``(0.25, 0.75)`` gives
        ``q25``, ``q75``. Levels that round to the same column name are refused.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``by``.

    Raises
    ------
    TypeError, ValueError
        ``frame`` not a DataFrame; ``by`` empty or naming a column ``frame`` lacks; ``column``
        missing, not numeric or holding a NaN; ``quantiles`` not a sequence of levels in (0, 1) or
        two of them giving one column name.

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
    by = check_frame(frame, by, column)
    if isinstance(quantiles, (str, bytes)) or not isinstance(quantiles, Sequence):
        raise TypeError(f"`quantiles` must be a sequence of levels in (0, 1), e.g. (0.25, 0.75); got {quantiles!r} "
                        f"({type(quantiles).__name__}).")
    levels = [probability(level, "quantiles") for level in quantiles]
    names = [f"q{round(100 * level):d}" for level in levels]
    if len(set(names)) != len(names):
        raise ValueError(f"`quantiles` must give distinct columns q<100 level>; got {list(quantiles)!r}, columns "
                         f"{names}.")
    grouped = frame.groupby(by, sort=True)[column]
    columns = {"samples": grouped.size(), "mean": grouped.mean(), "median": grouped.median()}
    for level, name in zip(levels, names):
        columns[name] = grouped.quantile(level)
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
        The values: real numbers, ``inf`` allowed, no NaN (as :func:`describe`).
    how : {"median", "mean"}
        The aggregation.

    Raises
    ------
    TypeError, ValueError
        As :func:`describe` for ``frame``, ``by`` and ``column``; ``unit`` not a column of
        ``frame``; ``how`` not in :data:`AGGREGATIONS`.

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
        by = check_frame(frame, by, column, unit=unit)
        self.how = choice(how, "how", AGGREGATIONS)
        self._function = np.median if how == "median" else np.mean
        self.arrays = {key: {u: g[column].to_numpy() for u, g in group.groupby(unit)}
                       for key, group in frame.groupby(by)}

    def __call__(self, units, *key) -> float:
        per_unit = self.arrays.get(key)
        if not per_unit:
            return math.nan
        parts = [per_unit[u] for u in units if u in per_unit]
        return float(self._function(np.concatenate(parts))) if parts else math.nan
