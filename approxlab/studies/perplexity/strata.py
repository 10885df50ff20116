r"""Statistics of the premise's claims on a crossed bootstrap: methods and windows drawn as multiplicities.

Every method and every window of a setting is a sample (of approximations, of text), and they are **crossed**:
each method ran on each window. A draw of the data is a multiplicity per method :math:`c_m` and per window
:math:`w_k` (how many times each was drawn: B. Efron and R. Tibshirani's bootstrap on the counts; crossed
designs: P. McCullagh, *Bernoulli* 6, 2000; A. B. Owen, *Ann. Appl. Stat.* 1, 2007, the "pigeonhole"
bootstrap), so every statistic here is a function of the two count vectors, vectorised over resamples.

* :class:`WithinWindows` -- Spearman's :math:`\rho` between an error and :math:`\Delta` over the points (method
  x budget) of one window, a method drawn :math:`c_m` times counting :math:`c_m` times (ties by average rank), then
  the mean over windows weighted by :math:`w_k`: a **stratified** :math:`\rho`, which ranks only points that share
  a text, so the window-to-window spread of :math:`\Delta` does not enter it.
* :func:`stratum_mean` -- the weighted mean of one number per (method, window) stratum (a within-method
  statistic over the budgets of one window: :func:`paired_difference`).
* :func:`partial_sums` and :func:`partial_correlation` -- the pooled partial rank correlation of an error and
  :math:`\Delta` given the budget, within (method, window) strata.

With :math:`L_{ij} = 1[x_j < x_i] + \tfrac12 1[x_j = x_i, j \ne i]`, the average rank of point :math:`i` among
the drawn points is :math:`r_i = \sum_j c_j L_{ij} + (c_i + 1)/2`; Spearman's :math:`\rho` is the Pearson
correlation of the ranks weighted by :math:`c`.

Public API::

    counts(picks, size) -> (resamples, size) array; redraw(base, resamples, rng) -> (resamples, size)
    WithinWindows(x, y, point_method).values(c) -> (resamples, windows); .mean(c, w) -> (resamples,)
    stratum_mean(values, c, w) -> (resamples,)
    ranks_over(x) / paired_difference(x, budget, y) / partial_sums(x, budget, y) / partial_correlation(sums, c, w)
    calibrate_setting(found, methods, windows) -> {key: Calibrated}; calibrate_windows(values) -> Calibrated
"""

from __future__ import annotations

import numpy as np

from ...stats import Resamples
from ...stats.calibration import IntervalFamily
from ..reporting import calibrated as calibration
from .premise_claims import INNER
from .resampling import ranks, spearman

__all__ = ["counts", "redraw", "WithinWindows", "stratum_mean", "paired_difference", "partial_sums",
           "partial_correlation", "weighted_mean", "weighted_rho", "calibrate_setting", "calibrate_windows"]


def counts(picks: np.ndarray, size: int) -> np.ndarray:
    """``(rows, size)`` multiplicities of the indices in each row of ``picks`` (``(rows, draws)`` ints)."""
    picks = np.atleast_2d(np.asarray(picks, dtype=int))
    out = np.zeros((picks.shape[0], size))
    np.add.at(out, (np.repeat(np.arange(picks.shape[0]), picks.shape[1]), picks.ravel()), 1.0)
    return out


def redraw(base: np.ndarray, resamples: int, rng) -> np.ndarray:
    """``(resamples, len(base))`` multiplicities of draws from the multiset ``base`` (a multiplicity per unit): as
    many units as it holds, with replacement.

    Examples
    --------
    >>> import numpy as np
    >>> drawn = redraw(np.array([2.0, 0.0, 1.0]), 4, np.random.default_rng(0))
    >>> drawn.shape, bool((drawn[:, 1] == 0).all()), drawn.sum(axis=1).tolist()
    ((4, 3), True, [3.0, 3.0, 3.0, 3.0])
    """
    members = np.repeat(np.arange(len(base)), np.asarray(base, dtype=int))
    return counts(members[rng.integers(0, len(members), (int(resamples), len(members)))], len(base))


def _comparisons(x: np.ndarray) -> np.ndarray:
    """:math:`L_{ij}`: 1 where ``x[j] < x[i]``, 1/2 where equal (``j != i``), else 0."""
    less = (x[None, :] < x[:, None]).astype(float)
    equal = (x[None, :] == x[:, None]).astype(float)
    np.fill_diagonal(equal, 0.0)
    return less + 0.5 * equal


def weighted_rho(lx: np.ndarray, ly: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Spearman's rho of the points with multiplicities ``weights`` (``(resamples, points)``), from their
    comparison matrices (``(points, points)``, or ``(resamples, points, points)`` where a side's values change with
    the draw); NaN where fewer than 3 points are drawn or a side is constant.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.studies.perplexity.strata import _comparisons, weighted_rho
    >>> lx, ly = _comparisons(np.array([1.0, 2.0, 3.0])), _comparisons(np.array([1.0, 3.0, 2.0]))
    >>> weighted_rho(lx, ly, np.ones((1, 3))).tolist(), weighted_rho(lx, ly[None], np.ones((1, 3))).tolist()
    ([0.5], [0.5])
    """
    return _rho(_ranked(lx, weights), _ranked(ly, weights), weights)


def _rho(rx: np.ndarray, ry: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson's correlation of the average ranks ``rx``, ``ry`` (``(resamples, points)``) under ``weights``: the
    rho of :func:`weighted_rho`."""
    total = weights.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = (weights * rx).sum(axis=1, keepdims=True) / total
        my = (weights * ry).sum(axis=1, keepdims=True) / total
        dx, dy = rx - mx, ry - my
        cov = (weights * dx * dy).sum(axis=1)
        var = (weights * dx * dx).sum(axis=1) * (weights * dy * dy).sum(axis=1)
        rho = cov / np.sqrt(var)
    distinct = (weights > 0).sum(axis=1)
    return np.where((distinct >= 3) & (var > 1e-12 * np.maximum(total[:, 0], 1) ** 6), rho, np.nan)


def _ranked(comparisons: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The average ranks :math:`\\sum_j c_j L_{ij} + (c_i + 1)/2` of the points under ``weights``."""
    if comparisons.ndim == 3:
        return np.einsum("rj,rij->ri", weights, comparisons) + (weights + 1) / 2
    return weights @ comparisons.T + (weights + 1) / 2


class WithinWindows:
    r"""The stratified :math:`\rho`: per window, Spearman's :math:`\rho` of ``x`` and ``y`` over the points whose
    both values are finite, methods counted by their multiplicity.

    Parameters
    ----------
    x, y : ndarray, (windows, points)
        The error and :math:`\Delta` of every point (method x budget) in every window (NaN: not measured).
    point_method : ndarray of int, (points,)
        Each point's method index (the multiplicities are per method).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    >>> y = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    >>> within = WithinWindows(x, y, np.arange(4))
    >>> within.values(np.ones((1, 4))).tolist(), within.mean(np.ones((1, 4)), np.array([[3.0, 1.0]])).tolist()
    ([[1.0, -1.0]], [0.5])
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, point_method: np.ndarray):
        self.point_method = np.asarray(point_method, dtype=int)
        self.methods = int(self.point_method.max()) + 1 if self.point_method.size else 0
        self.strata, self._last = [], (None, None)
        for xk, yk in zip(np.asarray(x, float), np.asarray(y, float)):
            finite = np.flatnonzero(np.isfinite(xk) & np.isfinite(yk))
            # the comparisons summed over each method's points: a point's rank is sum_m c_m (sum_{j in m} L_ij),
            # one (resamples, methods) x (methods, points) product instead of (resamples, points) x (points, points);
            # the same numbers (every term a small integer or half of one: exact in float64)
            member = np.zeros((len(finite), self.methods))
            member[np.arange(len(finite)), self.point_method[finite]] = 1.0
            self.strata.append((finite, (_comparisons(xk[finite]) @ member).T, (_comparisons(yk[finite]) @ member).T))

    def values(self, c: np.ndarray) -> np.ndarray:
        """``(resamples, windows)``: each window's rho under the method multiplicities ``c`` (``(resamples,
        methods)``)."""
        if c is self._last[0]:  # one draw's multiplicities, asked for by several statistics
            return self._last[1]
        out = np.full((np.atleast_2d(c).shape[0], len(self.strata)), np.nan)
        given, c = c, np.atleast_2d(c)
        present = c[:, :self.methods]  # the methods with points (c may count more)
        for k, (finite, mx, my) in enumerate(self.strata):
            if len(finite) >= 3:
                weights = c[:, self.point_method[finite]]
                own = (weights + 1) / 2
                out[:, k] = _rho(present @ mx + own, present @ my + own, weights)
        self._last = (given, out)
        return out

    def mean(self, c: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``(resamples,)``: the mean of the windows' rho weighted by the window multiplicities ``w``."""
        return weighted_mean(self.values(c), w)


def weighted_mean(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row, the mean of the finite ``values`` (``(resamples, strata)``) weighted by ``w``; NaN where none."""
    finite = np.isfinite(values)
    weight = np.where(finite, np.atleast_2d(w), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight.sum(axis=1) > 0, (weight * np.where(finite, values, 0.0)).sum(axis=1)
                        / weight.sum(axis=1), np.nan)


def stratum_mean(values: np.ndarray, c: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``(resamples,)``: the mean of one number per (method, window) stratum (``values``: ``(methods, windows)``,
    NaN: none) weighted by :math:`c_m w_k`.

    Examples
    --------
    >>> import numpy as np
    >>> stratum_mean(np.array([[1.0, np.nan], [3.0, 5.0]]), np.array([[1.0, 1.0]]), np.array([[1.0, 1.0]])).tolist()
    [3.0]
    """
    finite = np.isfinite(values)
    weight = np.einsum("rm,rk->rmk", np.atleast_2d(c), np.atleast_2d(w)) * finite
    with np.errstate(invalid="ignore", divide="ignore"):
        total = weight.sum(axis=(1, 2))
        return np.where(total > 0, (weight * np.where(finite, values, 0.0)).sum(axis=(1, 2)) / total, np.nan)


def ranks_over(x: np.ndarray) -> np.ndarray:
    """Average ranks of ``x`` (any NaN: all NaN)."""
    x = np.asarray(x, float)
    return np.full(len(x), np.nan) if np.isnan(x).any() else ranks(x)


def paired_difference(x, budget, y) -> float:
    r""":math:`\rho(x, y) - \rho(1/d, y)` over the budgets of one stratum (NaN where either is undefined).

    Examples
    --------
    >>> paired_difference([0.5, 0.4, 0.3], [16, 32, 64], [0.2, 0.3, 0.1])   # rho(x) 0.5, rho(1/d) 0.5
    0.0
    """
    inverse = 1.0 / np.asarray(budget, float)
    return spearman(x, y) - spearman(inverse, y)


def partial_sums(x, budget, y) -> np.ndarray:
    r"""``(sxy, sxx, syy)``: the cross and square sums of the ranks of ``x`` and of ``y`` after each is regressed
    (least squares, with an intercept) on the ranks of the budget over one stratum's budgets; NaN where a value is
    missing. Pooled over strata by :func:`partial_correlation`.

    Examples
    --------
    >>> [float(round(v, 6)) for v in partial_sums([0.5, 0.4, 0.3], [16, 32, 64], [0.2, 0.3, 0.1])]   # x follows d
    [0.0, 0.0, 1.5]
    """
    rx, rd, ry = ranks_over(x), ranks_over(np.asarray(budget, float)), ranks_over(y)
    if np.isnan(rx).any() or np.isnan(ry).any() or len(rx) < 3:
        return np.full(3, np.nan)
    design = np.column_stack([np.ones(len(rd)), rd])
    ex = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    ey = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    ex, ey = np.where(np.abs(ex) < 1e-9, 0.0, ex), np.where(np.abs(ey) < 1e-9, 0.0, ey)
    return np.array([ex @ ey, ex @ ex, ey @ ey])


def partial_correlation(sums: np.ndarray, c: np.ndarray, w: np.ndarray) -> np.ndarray:
    r"""``(resamples,)``: the pooled partial rank correlation :math:`\sum c_m w_k s^{xy}_{mk} / \sqrt{\sum c_m w_k
    s^{xx}_{mk} \sum c_m w_k s^{yy}_{mk}}` from :func:`partial_sums` per stratum (``sums``: ``(methods, windows,
    3)``); NaN where either residual vanishes everywhere (the error, or the loss, is a function of the budget).

    Examples
    --------
    >>> import numpy as np
    >>> sums = np.array([[[1.0, 2.0, 2.0]], [[-1.0, 2.0, 2.0]]])
    >>> partial_correlation(sums, np.array([[3.0, 1.0]]), np.array([[1.0]])).tolist()
    [0.25]
    """
    weighted = [stratum_mean(sums[:, :, i], c, w) for i in range(3)]  # the common weight total cancels
    with np.errstate(invalid="ignore", divide="ignore"):
        out = weighted[0] / np.sqrt(weighted[1] * weighted[2])
    return np.where((weighted[1] > 1e-12) & (weighted[2] > 1e-12), out, np.nan)


def _families(found: dict, c0: np.ndarray, w0: np.ndarray, resamples: int, rng, units: int) -> dict:
    """Every statistic's percentile family on the data set ``(c0, w0)``, all on the same inner draws."""
    c, w = redraw(c0, resamples, rng), redraw(w0, resamples, rng)
    return {key: IntervalFamily.percentile(Resamples(float(f(c0[None], w0[None])[0]), f(c, w), units))
            for key, f in found.items()}


def calibrate_setting(found: dict, methods: int, windows: int, *, former_draws: int | None = None) -> dict:
    """``{key: Calibrated}`` of the statistics ``found`` (``{key: statistic(c, w) -> (resamples,)}`` of the method
    and window multiplicities), calibrated together on the run's ``methods`` and ``windows``
    (:func:`approxlab.studies.reporting.calibrated.calibrate`, crossed: each outer draw draws both; each draw's
    interval a percentile interval of :data:`.premise_claims.INNER` resamples); ``former_draws``: the former 90%
    coverage gate's draws (:attr:`~approxlab.studies.reporting.calibrated.Calibrated.former`)."""
    if not found:
        return {}
    units = {"method": [("m", i) for i in range(methods)], "window": [("w", k) for k in range(windows)]}

    def compute(sample, trial):
        c0 = counts([[i for kind, i in sample if kind == "m"]], methods)[0]
        w0 = counts([[k for kind, k in sample if kind == "w"]], windows)[0]
        resamples = INNER["final"] if trial < 0 else INNER["resamples"]
        rng = np.random.default_rng([INNER["seed"], trial + 1])
        return _families(found, c0, w0, resamples, rng, methods)

    return calibration.calibrate(compute, units, former_draws=former_draws)


def calibrate_windows(values: np.ndarray):
    """The calibrated interval of :func:`stratum_mean` of ``values`` (``(strata, windows)``: one number per stratum
    and window, NaN: none) with the strata fixed and the windows drawn (the unit), each draw's interval a percentile
    interval of :data:`.premise_claims.INNER` resamples; None with fewer than 2 windows.

    Examples
    --------
    >>> import numpy as np
    >>> round(calibrate_windows(np.array([[0.1, 0.2, 0.15, 0.3], [0.2, 0.1, 0.25, 0.2]])).estimate, 4)
    0.1875
    >>> calibrate_windows(np.array([[0.1], [0.2]])) is None   # one window: no interval
    True
    """
    values = np.asarray(values, dtype=float)
    windows, ones = values.shape[1], np.ones((1, values.shape[0]))
    if windows < 2:
        return None

    def compute(sample, trial):
        w0 = counts([list(sample)], windows)[0]
        rng = np.random.default_rng([INNER["seed"], trial + 1])
        w = redraw(w0, INNER["final"] if trial < 0 else INNER["resamples"], rng)
        return IntervalFamily.percentile(Resamples(float(stratum_mean(values, ones, w0[None])[0]),
                                                   stratum_mean(values, ones, w), windows))

    return calibration.calibrate(compute, list(range(windows)))
