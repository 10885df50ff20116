r"""How often an interval covers what it claims: :func:`coverage`, measured by simulation with a known truth.

A 95% interval is a procedure that covers the true value in 95% of repetitions, and with a few
units many procedures do not: a percentile bootstrap of a median over 4 units cannot leave the range
of the 4 values, so it covers at most :math:`1 - 2 \cdot 0.5^4 = 87.5\%` whatever its level. This
module draws units from a declared model (:class:`UnitModel`), computes the interval by the same
bound functions the studies use (:func:`~approxlab.stats.intervals.bounds`,
:func:`~approxlab.stats.intervals.t_bounds`, :func:`~approxlab.stats.intervals.welch_bounds`) and counts
how often it holds the truth.

Public API::

    COVERAGE_METHODS, COVERAGE_STATISTICS
    UnitModel(distribution="lognormal", sigma=1.0, members=1, within=0.0, shared=0.0)
    coverage(method, units, *, statistic=None, model=UnitModel(), level=0.95, log=False, trials=2000,
             resamples=1000, seed=0) -> Coverage
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._checks import choice, flag, integer, is_real, probability
from .intervals import BOOTSTRAP_METHODS, bounds, t_bounds, welch_bounds
from .verdicts import wilson_bounds

__all__ = ["COVERAGE_METHODS", "COVERAGE_STATISTICS", "UnitModel", "Coverage", "coverage"]

COVERAGE_METHODS = (*BOOTSTRAP_METHODS, "t", "welch")
"""The interval methods :func:`coverage` measures: the bootstrap's two (:func:`approxlab.stats.bootstrap_interval`),
Student's t (:func:`approxlab.stats.t_interval`) and Welch's (:func:`approxlab.stats.welch_interval`)."""

COVERAGE_STATISTICS = {
    "percentile": ("median", "mean", "ratio of medians", "ratio of means"),
    "standard-error": ("median", "mean", "ratio of medians", "ratio of means"),
    "t": ("mean", "geometric mean"),
    "welch": ("difference of means",),
}
"""Method -> the statistics it is measured on. Pooled statistics (median, mean) are over every member of
the units; a ratio's numerator and denominator are two values per member of the same units (paired, as
one window's errors at two d); the geometric mean is the t interval on the logs, exponentiated."""

_CHUNK = 1 << 22
"""Simulated values per vectorised batch (32 MiB of float64)."""


@dataclasses.dataclass(frozen=True)
class UnitModel:
    r"""How simulated units are drawn around a known truth.

    A unit :math:`w` (a text window, a seed) holds ``members`` values (a window's heads x seeds; 1: one
    value per unit). On the log scale (``distribution="lognormal"``; the values themselves for
    ``"normal"``) member :math:`h` of unit :math:`w` is :math:`s_w + a_w + \varepsilon_{wh}`, with
    :math:`a_w \sim N(0, \sigma^2)` (``sigma``), :math:`\varepsilon_{wh} \sim N(0, \text{within}^2)` and, for
    ratios, :math:`s_w \sim N(0, \text{shared}^2)` shared by numerator and denominator (the same window at
    both d) while :math:`a_w, \varepsilon_{wh}` are drawn afresh for each. The truth is the population's:
    median :math:`e^0 = 1` (0 for ``"normal"``), mean :math:`e^{(\sigma^2 + \text{within}^2)/2}`, ratios 1,
    geometric mean 1, difference of means 0.

    Examples
    --------
    >>> from approxlab.stats import UnitModel
    >>> UnitModel(sigma=0.5, members=12, within=1.0).members
    12
    """

    distribution: str = "lognormal"
    sigma: float = 1.0
    members: int = 1
    within: float = 0.0
    shared: float = 0.0

    def __post_init__(self):
        choice(self.distribution, "distribution", ("lognormal", "normal"))
        for name in ("sigma", "within", "shared"):
            value = getattr(self, name)
            if not is_real(value) or not (0 <= value < math.inf) or (name == "sigma" and value == 0):
                raise ValueError(f"`{name}` must be a finite number {'> 0' if name == 'sigma' else '>= 0'}; "
                                 f"got {value!r}.")
        integer(self.members, "members", low=1)

    def truth(self, statistic: str) -> float:
        """The population value of ``statistic`` under this model."""
        if statistic == "mean" and self.distribution == "lognormal":
            return math.exp((self.sigma**2 + self.within**2) / 2)
        return 0.0 if statistic in ("difference of means",) or self.distribution == "normal" else 1.0

    def draw(self, rng, shape: tuple, shared=None) -> np.ndarray:
        """``shape + (members,)`` values (``shared``: the log-scale unit effects to add, ``shape``)."""
        logs = rng.normal(0.0, self.sigma, size=(*shape, 1)) + rng.normal(0.0, self.within, size=(*shape, self.members))
        if shared is not None:
            logs = logs + shared[..., None]
        return np.exp(logs) if self.distribution == "lognormal" else logs


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The measured coverage of an interval method: ``coverage`` (the share of ``trials`` whose interval
    held the truth) with its Wilson 95% interval ``low``, ``high``; and what was measured (``method``,
    ``statistic``, ``units``, nominal ``level``, ``log``, ``trials``, ``model``).

    Examples
    --------
    >>> from approxlab.stats import coverage
    >>> found = coverage("t", 10, statistic="mean", trials=200, seed=0)
    >>> found.method, found.units, found.low <= found.coverage <= found.high
    ('t', 10, True)
    """

    method: str
    statistic: str
    units: int | tuple
    level: float
    coverage: float
    low: float
    high: float
    trials: int
    log: bool
    model: UnitModel


def coverage(method: str, units, *, statistic: str | None = None, model: UnitModel | None = None, level: float = 0.95,
             log: bool = False, trials: int = 2000, resamples: int = 1000, seed: int = 0) -> Coverage:
    r"""How often ``method``'s ``level`` interval of ``statistic`` over ``units`` units holds the truth.

    Parameters
    ----------
    method : {"percentile", "standard-error", "t", "welch"}
        The interval (:data:`COVERAGE_METHODS`), computed by the studies' own bound functions.
    units : int or (int, int)
        Units per interval, ``>= 1`` (one unit: no interval, coverage 0); for ``"welch"`` the two groups'
        sizes (an int: both).
    statistic : str, optional
        One of ``COVERAGE_STATISTICS[method]`` (default: the first, the median for the bootstrap).
    model : UnitModel, optional
        How units are drawn (default: lognormal units, one value each, :math:`\sigma = 1`). Ratios and the
        geometric mean need ``"lognormal"``; t and Welch need ``members=1``.
    level : float
        Nominal coverage, in (0, 1).
    log : bool
        The standard-error interval on the log scale (positive statistics only).
    trials : int
        Simulated data sets, ``>= 1`` (the Wilson interval of the result says how precise it is).
    resamples : int
        Bootstrap resamples per data set, ``>= 1`` (each data set draws its own).
    seed : int
        Seed of ``numpy.random.default_rng``, ``>= 0``.

    Returns
    -------
    Coverage

    Raises
    ------
    TypeError, ValueError
        An unknown ``method`` or a ``statistic`` it is not measured on; ``units`` not an integer ``>= 1``
        (a pair for Welch); a ``model`` that cannot give the statistic; ``log`` for another method than
        ``"standard-error"`` or a statistic that can be negative; ``level``, ``trials``, ``resamples``,
        ``seed`` out of range.

    Notes
    -----
    A percentile interval of a median of :math:`W` units lies within the range of the :math:`W` values
    (more precisely, of the statistic over the :math:`\binom{2W-1}{W}` distinct resamples), which holds a
    continuous distribution's median with probability :math:`1 - 2 \cdot 0.5^W`: at most 87.5% at
    :math:`W = 4`, 75% at :math:`W = 3`. The coverage measured here is that of the model: heavier tails
    than the model's, or dependence between units, lower it.

    Examples
    --------
    >>> from approxlab.stats import coverage
    >>> found = coverage("percentile", 4, trials=2000, resamples=300)  # at most 1 - 2 * 0.5**4 = 0.875
    >>> found.coverage, round(found.low, 3), round(found.high, 3)
    (0.8735, 0.858, 0.887)
    >>> coverage("t", 10, statistic="geometric mean", trials=2000).coverage  # exact for lognormal units
    0.9445
    """
    method = choice(method, "method", COVERAGE_METHODS)
    statistic = choice(COVERAGE_STATISTICS[method][0] if statistic is None else statistic, "statistic",
                       COVERAGE_STATISTICS[method])
    model = UnitModel() if model is None else model
    if not isinstance(model, UnitModel):
        raise TypeError(f"`model` must be an approxlab.stats.UnitModel; got {type(model).__name__}.")
    sizes = (units, units) if method == "welch" and not isinstance(units, (tuple, list)) else units
    if method == "welch":
        if not isinstance(sizes, (tuple, list)) or len(sizes) != 2:
            raise ValueError(f"`units` must be an integer or a pair of integers for 'welch'; got {units!r}.")
        sizes = tuple(integer(size, "units", low=1) for size in sizes)
    else:
        sizes = integer(units, "units", low=1)
    level = probability(level, "level")
    log = flag(log, "log")
    trials = integer(trials, "trials", low=1)
    resamples = integer(resamples, "resamples", low=1)
    seed = integer(seed, "seed", low=0)
    if model.distribution != "lognormal" and (statistic.startswith("ratio") or statistic == "geometric mean"):
        raise ValueError(f"`model` must be lognormal for statistic {statistic!r}; got {model.distribution!r}.")
    if method in ("t", "welch") and model.members != 1:
        raise ValueError(f"`model` must hold one value per unit (members=1) for {method!r}; got {model.members}.")
    if log and (method != "standard-error" or model.distribution != "lognormal"):
        raise ValueError(f"`log` is for the 'standard-error' interval of a positive statistic; got method "
                         f"{method!r} with {model.distribution!r} units.")
    rng = np.random.default_rng(seed)
    if method == "welch":
        covered = _welch(model, sizes, trials, level, rng)
    elif method == "t":
        covered = _student(model, sizes, statistic, trials, level, rng)
    else:
        covered = _bootstrap(model, sizes, statistic, method, trials, resamples, level, log, rng)
    rate = float(np.mean(covered))
    low, high = wilson_bounds(rate, trials, 0.95)
    return Coverage(method, statistic, sizes, level, rate, low, high, trials, log, model)


def _holds(low, high, truth) -> np.ndarray:
    return (low <= truth) & (truth <= high)  # NaN bounds (no interval) hold nothing


def _welch(model, sizes, trials, level, rng) -> np.ndarray:
    first, second = (model.draw(rng, (trials, size))[..., 0] for size in sizes)
    if min(sizes) < 2:
        return np.zeros(trials, dtype=bool)
    low, high = welch_bounds(first, second, level)
    return _holds(low, high, 0.0)


def _student(model, units, statistic, trials, level, rng) -> np.ndarray:
    values = model.draw(rng, (trials, units))[..., 0]
    if units < 2:
        return np.zeros(trials, dtype=bool)
    if statistic == "geometric mean":
        low, high = t_bounds(np.log(values), level)
        return _holds(np.exp(low), np.exp(high), 1.0)
    low, high = t_bounds(values, level)
    return _holds(low, high, model.truth("mean"))


def _pooled(values: np.ndarray, how: str) -> np.ndarray:
    """The median or mean over the last two axes (units x members) at once."""
    flat = values.reshape(*values.shape[:-2], -1)
    return flat.mean(axis=-1) if how == "mean" else _middle(np.sort(flat, axis=-1))  # about 4x numpy's median


def _middle(ordered: np.ndarray) -> np.ndarray:
    """numpy's median of rows already sorted along the last axis."""
    middle = ordered.shape[-1] // 2
    return ordered[..., middle] if ordered.shape[-1] % 2 else (ordered[..., middle - 1] + ordered[..., middle]) / 2


def _bootstrap(model, units, statistic, method, trials, resamples, level, log, rng) -> np.ndarray:
    """Each data set gets its own resamples (one index draw shared by all would make every data set's bootstrap
    quantiles err the same way, and the coverage jump with the draw)."""
    ratio = statistic.startswith("ratio")
    how = "median" if statistic in ("median", "ratio of medians") else "mean"
    chunk = max(1, _CHUNK // (resamples * units * model.members * (2 if ratio else 1)))
    covered = []
    for start in range(0, trials, chunk):
        count = min(chunk, trials - start)
        rows = np.arange(count)[:, None, None]
        indices = rng.integers(0, units, size=(count, resamples, units), dtype=np.int32)
        if ratio:
            shared = rng.normal(0.0, model.shared, size=(count, units))
            top, bottom = model.draw(rng, (count, units), shared), model.draw(rng, (count, units), shared)
            estimate = _pooled(top, how) / _pooled(bottom, how)
            values = _pooled(top[rows, indices], how) / _pooled(bottom[rows, indices], how)
        elif how == "median" and model.members == 1:  # iid positions resample the sorted values as well, and
            ordered = np.sort(model.draw(rng, (count, units))[..., 0], axis=-1)  # sorted positions draw them sorted
            estimate, values = _middle(ordered), _middle(ordered[rows, np.sort(indices, axis=-1)])
        else:
            data = model.draw(rng, (count, units))
            estimate, values = _pooled(data, how), _pooled(data[rows, indices], how)
        low, high = bounds(values, estimate, units=units, method=method, level=level, log=log)
        covered.append(_holds(low, high, model.truth(statistic)))
    return np.concatenate(covered)
