r"""The perplexity study's resampling: a two-level bootstrap (methods, then windows within each method).

The question "does the error predict the loss?" is asked of attention approximations in general, so the
methods are a sample too: an interval that resamples windows alone treats the 15-odd methods of this run as
the whole population and overstates what the data show about a method not run (the between-method effect
carries the correlation). :func:`two_level` draws, per resample, the methods with replacement and then, for
each method drawn, its windows with replacement (a nested, two-stage cluster bootstrap: A. C. Davison and
D. V. Hinkley, *Bootstrap Methods and their Application*, 1997, Section 3.8, strategy 1: resample at both
stages when the number of clusters is small); a method drawn twice enters twice, with its own windows each
time. Every statistic of :data:`STATISTICS` is evaluated on the same draws, so differences between them are
paired.

A statistic takes the observations of one resample -- arrays ``method`` (copy index), ``window``,
``budget``, ``delta`` and one column per measure -- and returns a float (NaN when undefined).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["ranks", "spearman", "across", "within", "at_budget", "method_means", "window_index", "two_level",
           "percentile"]


def ranks(x: np.ndarray) -> np.ndarray:
    """The ranks of ``x`` (1-based), ties given their average rank: :func:`scipy.stats.rankdata` without its
    checks (it is called for every resample of every statistic).

    Examples
    --------
    >>> ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist()
    [3.5, 1.0, 3.5, 2.0]
    """
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    group = np.cumsum(np.concatenate([[True], ordered[1:] != ordered[:-1]])) - 1
    counts = np.bincount(group)
    average = np.cumsum(counts) - (counts - 1) / 2.0
    found = np.empty(len(x))
    found[order] = average[group]
    return found


def spearman(x, y) -> float:
    """Spearman's rho with average ranks for ties; NaN when either side is constant or fewer than 3 pairs.

    Examples
    --------
    >>> from scipy.stats import spearmanr
    >>> x, y = [1.0, 2.0, 2.0, 5.0, 3.0], [0.5, 0.1, 0.4, 0.9, 0.9]
    >>> bool(np.isclose(spearman(x, y), spearmanr(x, y).statistic))
    True
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.isnan(x).any() or np.isnan(y).any() or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")  # a NaN (a measure a run did not record) leaves rho undefined, as rankdata's
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def across(measure: str):
    """rho(measure, delta) over every observation of the resample (methods x budgets x windows) where the measure
    is finite (the attention mass a method keeps exists for sparse methods only; NaN when none is)."""

    def statistic(data):
        finite = np.isfinite(data[measure])
        return spearman(data[measure][finite], data["delta"][finite])

    return statistic


def method_means(data: dict, measure: str) -> dict:
    """Per (method copy, budget): the mean over its windows of ``measure`` and of delta, as arrays ``copy``,
    ``budget``, ``x`` and ``delta`` (computed once per resample and measure: kept in ``data``)."""
    cached = data.setdefault("_means", {})
    if measure in cached:
        return cached[measure]
    keys = np.stack([data["copy"].astype(float), data["budget"]])
    unique, inverse = np.unique(keys, axis=1, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse)
    cached[measure] = {"copy": unique[0], "budget": unique[1],
                       "x": np.bincount(inverse, weights=data[measure]) / counts,
                       "delta": np.bincount(inverse, weights=data["delta"]) / counts}
    return cached[measure]


def within(measure: str, min_budgets: int = 3):
    r"""The mean over methods of the within-method rho: per method copy, rho over its budgets of the window means
    of ``measure`` and of delta (a method with fewer than ``min_budgets`` budgets, or a constant side, is left
    out)."""

    def statistic(data):
        means = method_means(data, measure)
        values = [spearman(means["x"][means["copy"] == c], means["delta"][means["copy"] == c])
                  for c in np.unique(means["copy"]) if (means["copy"] == c).sum() >= min_budgets]
        values = [v for v in values if np.isfinite(v)]
        return float(np.mean(values)) if values else float("nan")

    return statistic


def at_budget(measure: str, budget):
    """rho across methods at one budget, of the window means of ``measure`` and of delta."""

    def statistic(data):
        means = method_means(data, measure)
        chosen = means["budget"] == budget
        return spearman(means["x"][chosen], means["delta"][chosen])

    return statistic


def window_index(frame: pd.DataFrame) -> list[list[np.ndarray]]:
    """Per method (sorted), the row positions of each of its windows (sorted)."""
    positions = np.arange(len(frame))
    out = []
    for _, rows in frame.groupby("method", sort=True):
        out.append([positions[frame.index.get_indexer(group.index)] for _, group in rows.groupby("window", sort=True)])
    return out


def _data(frame: pd.DataFrame, columns, rows: np.ndarray, copies: np.ndarray) -> dict:
    data = {c: frame[c].to_numpy(float)[rows] for c in columns}
    data["copy"], data["window"] = copies, frame["window"].to_numpy()[rows]
    return data


def two_level(frame: pd.DataFrame, statistics: dict, *, resamples: int, seed: int, columns=()) -> dict:
    """``{name: (estimate, values (resamples,), methods)}`` of each statistic: on the observations as they are,
    and on ``resamples`` two-level draws (methods with replacement, then windows within each drawn method).

    ``frame``: one row per observation with ``method``, ``window``, ``budget``, ``delta`` and ``columns``.
    """
    frame = frame.reset_index(drop=True)
    columns = ["budget", "delta", *columns]
    index = window_index(frame)
    identity = np.concatenate([np.full(len(np.concatenate(w)), i) for i, w in enumerate(index)]) if index else \
        np.zeros(0, int)
    order = np.concatenate([np.concatenate(w) for w in index]) if index else np.zeros(0, int)
    whole = _data(frame, columns, order, identity)
    estimates = {name: f(whole) for name, f in statistics.items()}
    values = {name: np.full(resamples, np.nan) for name in statistics}
    rng = np.random.default_rng(seed)
    for r in range(resamples if len(index) > 1 else 0):
        rows, copies = [], []
        for copy, m in enumerate(rng.integers(0, len(index), len(index))):
            windows = index[m]
            chosen = [windows[w] for w in rng.integers(0, len(windows), len(windows))]
            block = np.concatenate(chosen)
            rows.append(block)
            copies.append(np.full(len(block), copy))
        data = _data(frame, columns, np.concatenate(rows), np.concatenate(copies))
        for name, f in statistics.items():
            values[name][r] = f(data)
    return {name: (estimates[name], values[name], len(index)) for name in statistics}


def percentile(estimate: float, values: np.ndarray, level: float = 0.95) -> tuple:
    """``(low, high)``: the percentile interval of the finite resampled values, widened to hold the estimate;
    NaN when fewer than half of the resamples are finite."""
    finite = values[np.isfinite(values)]
    if not np.isfinite(estimate) or len(finite) < max(2, len(values) // 2):
        return float("nan"), float("nan")
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return float(min(low, estimate)), float(max(high, estimate))
