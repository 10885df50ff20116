r"""Iterated-bootstrap calibration of an interval's nominal level: :func:`calibration` and :func:`double_bootstrap`.

An interval procedure :math:`I_\lambda(X)` of nominal level :math:`\lambda` covers the true :math:`\theta` with
probability :math:`\pi(\lambda) = P(\theta \in I_\lambda(X))`, which with few or skewed units falls short of
:math:`\lambda`. The double bootstrap estimates it with the data as the population (the plug-in truth
:math:`\hat\theta = \theta(X)`): :math:`\hat\pi(\lambda) = P^*(\hat\theta \in I_\lambda(X^*))` over resamples
:math:`X^*` of the units, each interval computed from its own (inner) resamples of :math:`X^*`. The
**calibrated level** is the nominal level whose estimated coverage reaches the target :math:`1 - \alpha`,
:math:`\hat\lambda` with :math:`\hat\pi(\hat\lambda) = 1 - \alpha`, and the calibrated interval is
:math:`I_{\hat\lambda}(X)`, the same procedure on all the units at that level (P. Hall, "On the bootstrap and
confidence intervals", *Ann. Statist.* 14, 1986, 1431--1452; R. Beran, "Prepivoting to reduce level error of
confidence sets", *Biometrika* 74, 1987, 457--468; P. Hall and M. A. Martin, "On bootstrap resampling and
iteration", *Biometrika* 75, 1988, 661--671: calibration reduces the coverage error of a two-sided percentile
interval from :math:`O(n^{-1})` to :math:`O(n^{-2})`; B. Efron and R. J. Tibshirani, *An Introduction to the
Bootstrap*, 1993, Section 18.3). This is iterated-bootstrap calibration, not a studentized or BCa interval: it
applies unchanged to every interval the studies use (percentile, bootstrap standard error, Student t, Welch t).

Each tail is calibrated on its own, as Beran's prepivoting does: an interval family indexed by one-sided levels
(:class:`IntervalFamily`: the percentile interval's quantiles of its resampled values, or a Student-t interval
:math:`c + t_{\nu,p}\,s`) gives each outer replicate :math:`r` the **root** :math:`u_r`, the one-sided level at
which its bound reaches :math:`\hat\theta` -- for the percentile interval :math:`u_r = \hat F^{**}_r(\hat\theta)`,
the share of replicate :math:`r`'s inner draws below :math:`\hat\theta` (ties counted half); for a t interval
:math:`u_r = F_{t_\nu}((\hat\theta - c_r)/s_r)`. Replicate :math:`r`'s interval between one-sided levels
:math:`(p_L, p_U)` holds :math:`\hat\theta` exactly when :math:`p_L \le u_r \le p_U`, so the calibrated levels are
the :math:`\alpha/2` and :math:`1 - \alpha/2` order statistics of the roots (:math:`1 - \alpha` the target), and
the calibrated interval on all the units lies between them: its nominal level is :math:`p_U - p_L` (A. C.
Davison and D. V. Hinkley, *Bootstrap Methods and their Application*, 1997, Section 5.6, the adjusted percentile
method; Hall and Martin 1988, Section 3). A skewed statistic gets a wider bound on its short side only.

Two choices are made here, and stated wherever a verdict rests on them:

* the calibrated levels never fall inside the declared ones (:math:`p_L \le (1 - \lambda_0)/2`,
  :math:`p_U \ge (1 + \lambda_0)/2`): calibration only widens an interval that covers too little, so no verdict
  rests on an interval narrower than the declared one;
* calibration **fails** -- no calibrated interval, and the reason in words -- where more than :math:`\alpha/2`
  of the replicates give no interval at all or one of zero width (too few distinct units: with 3 units, 1 draw in 9
  repeats one unit), where the calibrated bound is not finite,
  or where the calibrated interval has zero width (a statistic that does not vary under resampling is never
  judged by its coverage). A replicate whose truth lies beyond all its inner draws has a root of 0 or 1; where more
  than :math:`\alpha/2` of them do, the calibrated bound is the extreme of the resampled values (level 100%), as
  the adjusted percentile method takes it: the calibrated level then says so.

The coverage of the declared interval, the share of replicates whose :math:`\lambda_0` interval holds
:math:`\hat\theta`, is reported with its Wilson 95% interval (the Monte-Carlo error of the outer draws);
:func:`settled` says when the outer draws are enough for that interval to be at most :data:`HALF_WIDTH` (2 points)
either side.

Public API::

    HALF_WIDTH
    IntervalFamily.percentile(resamples) / .standard_error(resamples, log=False) / .student(values, log=False)
        / .welch(first, second); .interval(level) -> (low, high); .between(lower, upper) -> (low, high);
        .position(value) -> float
    Calibration(coverage, low, high, draws, lower, upper, level, reason)
    calibration(positions, held, *, target=0.95, level=0.95) -> Calibration
    calibrated_bounds(family, calibration) -> ((low, high), reason)
    settled(held, *, half_width=HALF_WIDTH) -> bool
    double_bootstrap(values, statistic, *, outer=1000, inner=200, resamples=2000, seed=0, target=0.95,
                     level=0.95) -> (Interval, Calibration)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats as _scipy_stats

from ._checks import integer, probability
from .intervals import Interval, Resamples, bounds
from .verdicts import wilson_bounds

__all__ = ["HALF_WIDTH", "IntervalFamily", "Calibration", "calibration", "settled", "calibrated_bounds", "double_bootstrap"]

HALF_WIDTH = 0.02
"""The widest Monte-Carlo error (half the Wilson 95% interval) a coverage estimate may carry: 2 points."""


@dataclasses.dataclass(frozen=True)
class IntervalFamily:
    r"""An interval procedure's bounds at every one-sided level, on one data set.

    ``kind``: ``"percentile"`` (the quantiles of ``draws``, widened to hold ``estimate`` as
    :func:`approxlab.stats.bootstrap_interval` does) or ``"student"`` (:math:`c + t_{\nu,p}\,s` with ``centre``
    :math:`c`, ``scale`` :math:`s`, ``df`` :math:`\nu`; exponentiated where ``log``). ``units``: the units it rests
    on (fewer than 2: no interval, NaN bounds and a NaN position).

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.stats import Resamples
    >>> family = IntervalFamily.percentile(Resamples(2.0, np.array([1.0, 2.0, 2.0, 3.0]), 4))
    >>> family.interval(0.95), family.position(2.0), family.position(0.5)
    ((1.075, 2.925), 0.5, 0.0)
    >>> t = IntervalFamily.student([1.0, 2.0, 3.0])
    >>> [round(b, 4) for b in t.interval(0.95)], round(t.position(2.0), 2)
    ([-0.4841, 4.4841], 0.5)
    """

    kind: str
    estimate: float
    units: int
    draws: np.ndarray | None = None
    centre: float = math.nan
    scale: float = math.nan
    df: float = math.nan
    log: bool = False

    @classmethod
    def percentile(cls, resamples: Resamples) -> "IntervalFamily":
        """The percentile interval of one bootstrap distribution."""
        return cls("percentile", float(resamples.estimate), int(resamples.units),
                   draws=np.asarray(resamples.values, dtype=float))

    @classmethod
    def standard_error(cls, resamples: Resamples, *, log: bool = False) -> "IntervalFamily":
        r"""The bootstrap standard error times Student's t on ``units - 1`` degrees of freedom, on the log scale where
        ``log`` (:func:`approxlab.stats.bootstrap_interval`, ``method="standard-error"``)."""
        estimate, draws = float(resamples.estimate), np.asarray(resamples.values, dtype=float)
        bad = not math.isfinite(estimate) or not np.isfinite(draws).all() or resamples.units < 2
        if log:
            bad = bad or estimate <= 0 or bool((draws <= 0).any())
            centre, spread = (math.nan, math.nan) if bad else (math.log(estimate), float(np.log(draws).std(ddof=1)))
        else:
            centre, spread = (math.nan, math.nan) if bad else (estimate, float(draws.std(ddof=1)))
        return cls("student", estimate, int(resamples.units), centre=centre, scale=spread, df=resamples.units - 1,
                   log=log)

    @classmethod
    def student(cls, values, *, log: bool = False) -> "IntervalFamily":
        r"""Student's t interval of the mean of ``values`` (one per unit; of their logs where ``log``, the geometric
        mean's interval): :math:`\bar x + t_{W-1,p}\,s/\sqrt W`."""
        values = np.asarray(values, dtype=float)
        values = np.log(values) if log else values
        count, centre = int(values.size), float(values.mean()) if values.size else math.nan
        spread = float(values.std(ddof=1) / math.sqrt(count)) if count > 1 else math.nan
        return cls("student", math.exp(centre) if log else centre, count, centre=centre, scale=spread, df=count - 1,
                   log=log)

    @classmethod
    def welch(cls, first, second) -> "IntervalFamily":
        r"""Welch's interval of a difference of means, :math:`\bar x - \bar y + t_{\nu,p}\sqrt{s_x^2/m + s_y^2/k}`
        with the Welch--Satterthwaite :math:`\nu`; ``units`` is the smaller group's size."""
        a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
        units = int(min(a.size, b.size))
        difference = float(a.mean() - b.mean()) if units else math.nan
        if units < 2:
            return cls("student", difference, units)
        va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        scale = float(math.sqrt(va + vb))
        df = float((va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))) if scale > 0 else math.inf
        return cls("student", difference, units, centre=difference, scale=scale, df=df)

    def interval(self, level: float) -> tuple[float, float]:
        """The two-sided interval of nominal ``level``."""
        if self.kind == "percentile":
            low, high = bounds(self.draws, self.estimate, units=self.units, method="percentile", level=level)
            return float(low), float(high)
        return self.between((1 - level) / 2, (1 + level) / 2)

    def between(self, lower: float, upper: float) -> tuple[float, float]:
        """The interval from the one-sided level ``lower`` (its lower bound) to ``upper``, both in [0, 1]."""
        if self.units < 2:
            return math.nan, math.nan
        if self.kind == "percentile":
            if not math.isfinite(self.estimate) or not np.isfinite(self.draws).all():
                return math.nan, math.nan
            low, high = np.quantile(self.draws, [lower, upper])
            return float(min(low, self.estimate)), float(max(high, self.estimate))
        quantiles = _scipy_stats.t.ppf([lower, upper], self.df) if math.isfinite(self.df) else \
            _scipy_stats.norm.ppf([lower, upper])
        low, high = (self.centre + q * self.scale if self.scale > 0 else self.centre for q in quantiles)
        return (math.exp(low), math.exp(high)) if self.log else (float(low), float(high))

    def position(self, value: float) -> float:
        """The one-sided level at which a bound of this family reaches ``value`` (the root of the calibration): the
        share of ``draws`` below it, ties counted half, or the t distribution's CDF at its standardised distance;
        NaN where there is no interval, or one of zero width (draws that do not vary, no spread): such a draw is
        never judged by its coverage, it counts as a draw without an interval."""
        if self.units < 2:
            return math.nan
        if self.kind == "percentile":
            if not math.isfinite(self.estimate) or not np.isfinite(self.draws).all() or \
                    self.draws.min() == self.draws.max():
                return math.nan
            return float((np.sum(self.draws < value) + 0.5 * np.sum(self.draws == value)) / self.draws.size)
        if not (math.isfinite(self.centre) and math.isfinite(self.scale)) or self.scale == 0:
            return math.nan
        if self.log:
            if value <= 0:
                return 0.0
            value = math.log(value)
        distance = (value - self.centre) / self.scale
        return float(_scipy_stats.t.cdf(distance, self.df) if math.isfinite(self.df) else
                     _scipy_stats.norm.cdf(distance))


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The coverage of an interval at its declared level, estimated by the double bootstrap, and its calibration.

    Attributes
    ----------
    coverage, low, high : float
        The share of ``draws`` outer replicates whose interval at the declared level held the plug-in truth, and its
        Wilson 95% interval (the Monte-Carlo error).
    draws : int
        Outer replicates.
    lower, upper : float
        The calibrated one-sided levels of the lower and upper bound (NaN where calibration fails).
    level : float
        The calibrated nominal level, ``upper - lower`` (NaN where calibration fails).
    reason : str or None
        Why calibration fails, in words; None where it succeeds.

    Examples
    --------
    What :func:`calibration` gives from 201 outer replicates whose roots spread evenly (no correction needed) and
    from 100 of which 5 give no interval (calibration fails):

    >>> import numpy as np
    >>> roots = np.linspace(0.0, 1.0, 201)
    >>> found = calibration(roots, (roots >= 0.025) & (roots <= 0.975))
    >>> found.draws, found.lower, found.upper, round(found.level, 4), found.reason
    (201, 0.025, 0.975, 0.95, None)
    >>> bool(found.low < found.coverage < found.high)              # the Wilson interval of the coverage
    True
    >>> failed = calibration([np.nan] * 5 + [0.5] * 95, [False] * 5 + [True] * 95)
    >>> failed.coverage, bool(np.isnan(failed.level)), failed.reason is not None
    (0.95, True, True)
    """

    coverage: float
    low: float
    high: float
    draws: int
    lower: float
    upper: float
    level: float
    reason: str | None


def calibration(positions, held, *, target: float = 0.95, level: float = 0.95) -> Calibration:
    r"""The calibrated one-sided levels from the outer replicates' roots (the module docstring's math).

    Parameters
    ----------
    positions : array_like, (draws,)
        Each outer replicate's root :math:`u_r` (:meth:`IntervalFamily.position` of the plug-in truth); NaN where
        the replicate gives no interval (it then holds nothing at any level).
    held : array_like of bool, (draws,)
        Whether each replicate's interval at the declared ``level`` held the plug-in truth.
    target : float
        The coverage the calibrated interval must reach, in (0, 1).
    level : float
        The declared nominal level, in (0, 1); the calibrated levels never fall inside it.

    Returns
    -------
    Calibration

    Examples
    --------
    >>> import numpy as np
    >>> roots = np.linspace(0.0, 1.0, 201)[::-1]         # replicates spread evenly: no correction needed
    >>> found = calibration(roots, (roots >= 0.025) & (roots <= 0.975))
    >>> found.lower, found.upper, round(found.coverage, 3)
    (0.025, 0.975, 0.95)
    >>> skewed = np.clip(roots - 0.05, 0.0, 1.0)          # 5% of replicates below every draw
    >>> calibration(skewed, skewed >= 0.025).reason is None, calibration(skewed, skewed >= 0.025).lower
    (True, 0.0)
    >>> calibration([np.nan] * 5 + [0.5] * 95, [False] * 5 + [True] * 95).reason
    '5.0% of 100 resamples give no interval (more than the 2.5% a tail may miss)'
    """
    target, level = probability(target, "target"), probability(level, "level")
    positions = np.asarray(positions, dtype=float)
    held = np.asarray(held, dtype=bool)
    if positions.ndim != 1 or positions.size < 1 or held.shape != positions.shape:
        raise ValueError(f"`positions` and `held` must be 1-d arrays of one value per outer replicate (the same "
                         f"length, >= 1); got shapes {positions.shape} and {held.shape}.")
    draws = int(positions.size)
    coverage = float(held.mean())
    low, high = wilson_bounds(coverage, draws, 0.95)
    miss = (1 - target) / 2
    k = int(math.floor(miss * draws + 1e-9))  # at most k replicates may fall outside each calibrated bound
    lower = float(np.sort(np.where(np.isnan(positions), -math.inf, positions))[k])
    upper = float(np.sort(np.where(np.isnan(positions), math.inf, positions))[draws - 1 - k])
    if not (math.isfinite(lower) and math.isfinite(upper)):
        none = float(np.isnan(positions).mean())
        reason = f"{none:.1%} of {draws} resamples give no interval (more than the {miss:.1%} a tail may miss)"
        return Calibration(coverage, low, high, draws, math.nan, math.nan, math.nan, reason)
    lower, upper = min(lower, (1 - level) / 2), max(upper, (1 + level) / 2)
    return Calibration(coverage, low, high, draws, lower, upper, upper - lower, None)


def settled(held, *, half_width: float = HALF_WIDTH) -> bool:
    """Whether the coverage estimated from ``held`` (bools, one per outer replicate) has a Wilson 95% interval at
    most ``half_width`` either side of it (the wider side counts).

    Examples
    --------
    >>> settled([True] * 95 + [False] * 5), settled([True] * 950 + [False] * 50)
    (False, True)
    """
    held = np.asarray(held, dtype=bool)
    if held.size == 0:
        return False
    rate = float(held.mean())
    low, high = wilson_bounds(rate, int(held.size), 0.95)
    return max(rate - low, high - rate) <= half_width


def calibrated_bounds(family: IntervalFamily, found: Calibration) -> tuple[tuple[float, float], str | None]:
    """The calibrated interval of ``family`` (on all the units) at ``found``'s levels, or NaN bounds and the reason
    calibration fails: ``found.reason``, a bound that is not finite, or an interval of zero width.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.stats import Resamples
    >>> roots = np.linspace(0.0, 1.0, 201)
    >>> skewed = np.clip(roots - 0.05, 0.0, 1.0)                  # calibrated levels 0 and 0.975
    >>> found = calibration(skewed, skewed >= 0.025)
    >>> family = IntervalFamily.percentile(Resamples(2.0, np.linspace(1.0, 4.0, 13), 13))
    >>> [round(b, 3) for b in family.interval(0.95)]               # the declared interval
    [1.075, 3.925]
    >>> calibrated_bounds(family, found)                          # widened on its lower side only
    ((1.0, 3.925), None)
    >>> calibrated_bounds(IntervalFamily.percentile(Resamples(2.0, np.full(13, 2.0), 13)), found)
    ((nan, nan), 'the interval has zero width (every resample gives 2)')
    >>> calibrated_bounds(IntervalFamily.student([1.0, 2.0, 3.0]), found)[1]  # a t bound at level 0
    'no finite interval reaches 97.50% nominal (one-sided levels 0.0000, 0.9750): too few units to calibrate'
    """
    if found.reason is not None:
        return (math.nan, math.nan), found.reason
    low, high = family.between(found.lower, found.upper)
    if not (math.isfinite(low) and math.isfinite(high)):
        return (math.nan, math.nan), (f"no finite interval reaches {found.level:.2%} nominal (one-sided levels "
                                      f"{found.lower:.4f}, {found.upper:.4f}): too few units to calibrate")
    if low == high:
        return (math.nan, math.nan), f"the interval has zero width (every resample gives {low:.6g})"
    return (low, high), None


def double_bootstrap(values, statistic, *, outer: int = 1000, inner: int = 200, resamples: int = 2000, seed: int = 0,
                     target: float = 0.95, level: float = 0.95):
    r"""The calibrated percentile interval of ``statistic`` over independent units, vectorised with NumPy.

    Parameters
    ----------
    values : array_like, (W,)
        One real number per unit, ``W >= 2``, all finite.
    statistic : callable
        ``statistic(x, axis=-1)``, vectorised over leading axes (``numpy.mean``, ``numpy.median``).
    outer, inner : int
        Outer replicates (the coverage and the roots) and inner resamples per outer replicate.
    resamples : int
        Resamples of the interval on all the units.
    seed : int
        Seed of ``numpy.random.default_rng``.
    target, level
        As in :func:`calibration`.

    Returns
    -------
    (Interval, Calibration)
        The percentile interval between the calibrated levels (NaN bounds where calibration fails), and the
        calibration.

    Examples
    --------
    >>> import numpy as np
    >>> values = np.random.default_rng(3).lognormal(size=10)
    >>> interval, found = double_bootstrap(values, np.mean, outer=400, inner=200, seed=0)
    >>> bool(found.level >= 0.95 and interval.low < interval.estimate < interval.high)
    True
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size < 2 or not np.isfinite(values).all():
        raise ValueError(f"`values` must hold at least 2 finite numbers, one per unit; got {values.size} value(s).")
    for name, count in (("outer", outer), ("inner", inner), ("resamples", resamples), ("seed", seed)):
        integer(count, name, low=0 if name == "seed" else 1)
    rng, units = np.random.default_rng(seed), values.size
    family = IntervalFamily.percentile(
        Resamples(float(statistic(values, axis=-1)), statistic(values[rng.integers(0, units, size=(resamples, units))],
                                                                axis=-1), units))
    truth = family.estimate
    first = values[rng.integers(0, units, size=(outer, units))]                              # (outer, W)
    second = statistic(first[np.arange(outer)[:, None, None], rng.integers(0, units, size=(outer, inner, units))],
                       axis=-1)                                                                # (outer, inner)
    estimates = statistic(first, axis=-1)
    low, high = bounds(second, estimates, units=units, method="percentile", level=level)
    held = (low <= truth) & (truth <= high)
    positions = (np.sum(second < truth, axis=-1) + 0.5 * np.sum(second == truth, axis=-1)) / inner
    found = calibration(positions, held, target=target, level=level)
    (low, high), _ = calibrated_bounds(family, found)
    return Interval(truth, low, high, units), found
