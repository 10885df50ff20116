r"""Growth exponents in n, per text window, with an interval over windows.

The theorems assume quantities of size :math:`n^{o(1)}`, which no finite set of lengths can test: the study
reports the **growth exponent**, the least-squares slope of :math:`\log x` on :math:`\log n`, as a
description, not as a test of :math:`o(1)`. It is fitted separately in each window (windows are the
independent unit: heads and the prefixes of one window share its text) over at least 4 lengths (3 points
leave one degree of freedom; 2,161 -> 675 -> 10,184 is what three can look like), and the windows' slopes
are summarised by their mean with a Student-t interval (:func:`approxlab.stats.t_interval`), which, unlike a
percentile bootstrap over 3-4 windows, is not confined to the range of the windows' values.

Public API::

    MIN_LENGTHS
    growth_exponents(lengths, values, *, min_lengths=MIN_LENGTHS) -> ndarray (*windows,)
    growth_exponent_interval(lengths, values, *, level=0.95, min_lengths=MIN_LENGTHS) -> stats.Interval
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from .. import stats

__all__ = ["MIN_LENGTHS", "growth_exponents", "growth_exponent_interval"]

MIN_LENGTHS = 4
"""The fewest distinct lengths n a growth exponent is fitted over."""


def _lengths(lengths, min_lengths) -> np.ndarray:
    if isinstance(min_lengths, bool) or not isinstance(min_lengths, numbers.Integral) or min_lengths < 2:
        raise ValueError(f"`min_lengths` must be an integer >= 2; got {min_lengths!r}.")
    array = np.asarray(lengths, dtype=float)
    if array.ndim != 1 or not np.isfinite(array).all() or (array <= 0).any():
        raise ValueError(f"`lengths` must be a 1-D sequence of positive lengths n; got {lengths!r}.")
    if np.unique(array).size < min_lengths or np.unique(array).size != array.size:
        raise ValueError(f"`lengths` must hold at least {min_lengths} distinct lengths, none repeated; got "
                         f"{array.tolist()}.")
    return array


def growth_exponents(lengths, values, *, min_lengths: int = MIN_LENGTHS) -> np.ndarray:
    r"""The slope of :math:`\log x` on :math:`\log n` (least squares), for each row of ``values``.

    Parameters
    ----------
    lengths : sequence of float
        The lengths :math:`n_1, \dots, n_L`, positive and distinct, ``L >= min_lengths``.
    values : array-like or torch.Tensor
        ``(*windows, L)``: the quantity at each length (e.g. per window, its median over heads), positive
        and finite (a zero or NaN is an error: it has no logarithm, and dropping it would change the fit).
    min_lengths : int
        :data:`MIN_LENGTHS` (4) by default.

    Returns
    -------
    numpy.ndarray
        ``(*windows,)`` float64: :math:`\hat\beta` with :math:`\log x \approx \hat\beta\log n + c` in each row.

    Examples
    --------
    >>> import numpy as np
    >>> n = [512, 1024, 2048, 4096]
    >>> growth_exponents(n, [3 * np.sqrt(n), 5 * np.asarray(n, dtype=float)]).round(6).tolist()
    [0.5, 1.0]
    """
    x = np.log(_lengths(lengths, min_lengths))
    array = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=float)
    if array.ndim < 1 or array.shape[-1] != x.size:
        raise ValueError(f"`values` must have shape (*windows, {x.size}) (one value per length); got {array.shape}.")
    if not np.isfinite(array).all() or (array <= 0).any():
        raise ValueError("`values` must be positive and finite (their logarithms are fitted); got "
                         f"{int((~np.isfinite(array) | (array <= 0)).sum())} other entries.")
    centred = x - x.mean()
    y = np.log(array)
    return (y - y.mean(-1, keepdims=True)) @ centred / (centred @ centred)


def growth_exponent_interval(lengths, values, *, level: float = 0.95,
                             min_lengths: int = MIN_LENGTHS) -> stats.Interval:
    r"""The mean growth exponent over windows with its Student-t interval.

    ``values``: ``(windows, L)``, one row per independent window (:func:`growth_exponents`); the estimate is
    the mean of the windows' slopes and the interval :func:`approxlab.stats.t_interval` at ``level`` over
    windows (NaN bounds with one window: one unit has no spread).

    Examples
    --------
    >>> n = [512, 1024, 2048, 4096]
    >>> windows = [[a * m ** slope for m in n] for a, slope in ((1.0, 0.1), (2.0, 0.2), (3.0, 0.3))]
    >>> interval = growth_exponent_interval(n, windows)
    >>> round(interval.estimate, 6), round(interval.low, 4), round(interval.high, 4)
    (0.2, -0.0484, 0.4484)
    """
    slopes = growth_exponents(lengths, values, min_lengths=min_lengths)
    if slopes.ndim != 1:
        raise ValueError(f"`values` must have shape (windows, L); got {np.shape(values)}.")
    return stats.t_interval(slopes, level=level)
