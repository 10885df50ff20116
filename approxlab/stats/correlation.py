r"""Rank correlations between two measurements of the same items, with intervals over independent units.

A study often asks whether one measurement orders its items as another does: does a method's
spectral error rank the methods as their loss in perplexity does; does HyperAttention's error grow
with the α and κ of the heads it runs on? :func:`rank_correlation` gives Spearman's (or Kendall's)
coefficient with a percentile bootstrap interval that resamples the **independent units** the
observations come from (text windows, seeds): every observation of a drawn unit enters the
resample, so observations that share a unit are never treated as independent.
:func:`rank_correlation_difference` compares two measurements against the same third one on the
same resamples (a paired comparison).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _scipy_stats

from ._checks import choice, integer, probability, reals
from .intervals import Interval, Resamples, bootstrap_interval

__all__ = ["CORRELATIONS", "rank_correlation", "rank_correlation_difference"]

CORRELATIONS = ("spearman", "kendall")
"""The rank correlations :func:`rank_correlation` computes."""


def _coefficient(x: np.ndarray, y: np.ndarray, method: str) -> float:
    """Spearman's rho or Kendall's tau-b of paired values; NaN when either side is constant (no ranking)."""
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    if method == "spearman":  # Pearson's correlation of the mean ranks (scipy's spearmanr, without its overhead)
        rx, ry = _scipy_stats.rankdata(x), _scipy_stats.rankdata(y)
        rx, ry = rx - rx.mean(), ry - ry.mean()
        return float(np.clip((rx @ ry) / math.sqrt((rx @ rx) * (ry @ ry)), -1.0, 1.0))
    return float(_scipy_stats.kendalltau(x, y).statistic)


def _check_pairs(arrays: dict, units) -> tuple[dict, np.ndarray]:
    """The measurements as float arrays of one length (finite; ``inf`` is a rank too, NaN is refused), and
    the unit of each observation (each its own unit when ``units`` is None)."""
    checked = {name: reals(values, name) for name, values in arrays.items()}
    lengths = {name: array.shape for name, array in checked.items()}
    first = next(iter(checked.values()))
    if any(array.ndim != 1 for array in checked.values()) or len(set(lengths.values())) != 1 or first.size < 2:
        raise ValueError(f"{', '.join(f'`{name}`' for name in checked)} must be 1-d sequences of one length >= 2 "
                         f"(one value per observation); got shapes {lengths}.")
    for name, array in checked.items():
        if np.isnan(array).any():
            raise ValueError(f"`{name}` must hold no NaN (a failed measurement has no rank); got "
                             f"{int(np.isnan(array).sum())} NaN value(s) of {array.size}.")
    if units is None:
        return checked, np.arange(first.size)
    labels = np.asarray(units, dtype=object)
    if labels.shape != first.shape:
        raise ValueError(f"`units` must give the unit of each observation, shape {first.shape}; got shape "
                         f"{labels.shape}.")
    return checked, labels


def _resampled_indices(labels: np.ndarray, resamples: int, seed: int) -> list[np.ndarray]:
    """For each resample, the observations of ``len(units)`` units drawn with replacement (all of each)."""
    distinct = list(dict.fromkeys(labels.tolist()))
    members = [np.flatnonzero(labels == unit) for unit in distinct]
    draws = np.random.default_rng(seed).integers(0, len(distinct), size=(resamples, len(distinct)))
    return [np.concatenate([members[j] for j in row]) for row in draws]


def _percentile(estimate: float, values: np.ndarray, level: float, labels: np.ndarray) -> Interval:
    """The percentile interval of :func:`~approxlab.stats.bootstrap_interval` over the distinct units of ``labels``."""
    return bootstrap_interval(Resamples(estimate, values, len(set(labels.tolist()))), level=level)


def rank_correlation(x, y, *, units=None, method: str = "spearman", resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> Interval:
    r"""Spearman's :math:`\rho` (or Kendall's :math:`\tau_b`) of paired observations, with a bootstrap interval.

    Parameters
    ----------
    x, y : sequence of float
        ``(N,)`` the two measurements of each observation (``inf`` allowed: it ranks last; NaN refused).
    units : sequence, optional
        ``(N,)`` the independent unit each observation comes from (e.g. its text window). The bootstrap
        draws units with replacement and keeps every observation of a drawn unit. ``None``: every
        observation is its own unit.
    method : {"spearman", "kendall"}
        The rank correlation.
    resamples : int
        Bootstrap resamples, ``>= 1``.
    seed : int
        Seed of ``numpy.random.default_rng``, ``>= 0``.
    level : float
        Coverage of the percentile interval, in (0, 1).

    Returns
    -------
    Interval
        ``estimate`` the coefficient on all observations; ``low``, ``high`` the percentile interval over
        the resamples (widened to include the estimate). NaN bounds when a resample leaves one side
        constant (e.g. one unit only: no interval), NaN estimate when one side is constant.

    Raises
    ------
    TypeError, ValueError
        ``x``, ``y`` not 1-d real sequences of one length ``>= 2``, or holding NaN; ``units`` of another
        length; ``method``, ``resamples``, ``seed`` or ``level`` out of range.

    Notes
    -----
    Spearman's :math:`\rho` is Pearson's correlation of the ranks (ties get their mean rank); Kendall's
    :math:`\tau_b` counts concordant against discordant pairs, corrected for ties (``scipy.stats``).
    The percentile bootstrap of a correlation undercovers with few units; report the number of units
    beside the interval.

    Examples
    --------
    >>> from approxlab.stats import rank_correlation
    >>> x = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2]
    >>> y = [1.0, 1.5, 1.4, 2.0, 3.0, 2.9]                  # increasing but for two swaps
    >>> result = rank_correlation(x, y, units=[0, 0, 1, 1, 2, 2])
    >>> round(result.estimate, 3), result.low <= result.estimate <= result.high
    (0.886, True)
    """
    method = choice(method, "method", CORRELATIONS)
    resamples = integer(resamples, "resamples", low=1)
    seed = integer(seed, "seed", low=0)
    level = probability(level, "level")
    arrays, labels = _check_pairs({"x": x, "y": y}, units)
    x, y = arrays["x"], arrays["y"]
    estimate = _coefficient(x, y, method)
    values = np.array([_coefficient(x[i], y[i], method) for i in _resampled_indices(labels, resamples, seed)])
    return _percentile(estimate, values, level, labels)


def rank_correlation_difference(first, second, target, *, units=None, method: str = "spearman",
                                resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    r"""How much better ``first`` ranks ``target`` than ``second`` does: :math:`\rho(\text{first}, \text{target})
    - \rho(\text{second}, \text{target})`, with a paired bootstrap interval (both on the same resamples).

    The arguments are as in :func:`rank_correlation`; ``first``, ``second`` and ``target`` are ``(N,)``
    measurements of the same observations (e.g. the Frobenius error, the spectral error and the loss of each
    method and budget). An interval above 0 says ``first`` tracks ``target`` better than ``second``.

    Examples
    --------
    >>> from approxlab.stats import rank_correlation_difference
    >>> loss = [1, 2, 3, 4, 5, 6]
    >>> result = rank_correlation_difference([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5], loss)
    >>> round(result.estimate, 3)
    0.171
    """
    method = choice(method, "method", CORRELATIONS)
    resamples = integer(resamples, "resamples", low=1)
    seed = integer(seed, "seed", low=0)
    level = probability(level, "level")
    arrays, labels = _check_pairs({"first": first, "second": second, "target": target}, units)
    a, b, t = arrays["first"], arrays["second"], arrays["target"]

    def difference(i):
        return _coefficient(a[i], t[i], method) - _coefficient(b[i], t[i], method)

    estimate = difference(np.arange(t.size))
    values = np.array([difference(i) for i in _resampled_indices(labels, resamples, seed)])
    return _percentile(estimate, values, level, labels)
