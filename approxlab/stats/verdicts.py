"""From an interval to a word: :func:`verdict` against a threshold fixed before the run, and :func:`win_rate`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats as _scipy_stats

from ._checks import choice, flag, is_real, probability, reals, unit_values

__all__ = ['SIDES', 'verdict', 'WinRate', 'win_rate', 'permutation_test']

SIDES = ("at least", "above", "at most", "below")
"""On which side of its threshold a claim holds (:func:`verdict`)."""


def verdict(low: float, high: float, threshold: float, side: str) -> str:
    """``"reproduced"`` when the whole interval ``[low, high]`` lies on the claim's ``side`` of
    ``threshold``, ``"not reproduced"`` when it lies wholly on the other side, else
    ``"inconclusive"`` (also for a non-finite bound).

    ``side`` (:data:`SIDES`): ``"at least"`` (claim: value >= threshold), ``"above"`` (>),
    ``"at most"`` (<=), ``"below"`` (<).

    ``low`` and ``high`` are real numbers with ``low <= high``; a NaN or infinite bound (an
    interval that could not be computed) gives ``"inconclusive"``. ``threshold`` is a real number
    fixed before the run, ``inf`` allowed; a NaN threshold is refused: it is no threshold, and a
    verdict against it would read as a measured "inconclusive".

    Raises
    ------
    TypeError, ValueError
        A bound or ``threshold`` that is not a real number (a str, a bool); ``low > high`` (an
        inverted interval); a NaN ``threshold``; ``side`` not in :data:`SIDES`.

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
    for name, value in (("low", low), ("high", high), ("threshold", threshold)):
        if not is_real(value):
            raise TypeError(f"`{name}` must be a real number; got {value!r} ({type(value).__name__}).")
    if math.isnan(threshold):
        raise ValueError(f"`threshold` must be a number fixed before the run (inf allowed); got {threshold!r}.")
    if low > high:
        raise ValueError(f"`low` and `high` must bound an interval, low <= high; got low={low!r}, high={high!r}.")
    choice(side, "side", SIDES)
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
        Paired values of the two methods: real numbers (same length, finite or ``inf``; NaN pairs
        are dropped, as pairs where a method has no value; strings and bools are refused).
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
    a, b = reals(first, "first"), reals(second, "second")
    level = probability(level, "level")
    lower_is_better = flag(lower_is_better, "lower_is_better")
    if a.shape != b.shape:
        raise ValueError(f"`first` and `second` must be paired (same length); got {a.size} and {b.size}.")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size == 0:
        raise ValueError("`first` and `second` must have at least one pair without NaN; got none.")
    better = a < b if lower_is_better else a > b
    wins, ties, count = int(better.sum()), int((a == b).sum()), int(a.size)
    rate = (wins + ties / 2) / count
    return WinRate(rate, *wilson_bounds(rate, count, level), wins, ties, count)


def wilson_bounds(rate: float, count: int, level: float) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``rate`` observed over ``count`` trials (see :func:`win_rate`)."""
    z = float(_scipy_stats.norm.ppf(0.5 + level / 2))
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(0.0, centre - half), min(1.0, centre + half)




def permutation_test(first, second, *, alternative: str = "two-sided") -> float:
    r"""The exact permutation test of equal means of two independent groups: the share of the
    :math:`\binom{n_1+n_2}{n_1}` splits of the pooled values whose difference of means (first minus second) is
    at least as extreme as the observed one (no normality assumed; exact under exchangeability of the units).
    ``alternative``: ``"two-sided"`` (as far from 0), ``"less"`` (as low) or ``"greater"`` (as high).
    ``first`` and ``second``: one-dimensional, one finite real number per unit, at least one each, at most
    :data:`PERMUTATION_UNITS` together (a NaN or an inf is refused: it has no mean, and would make every split
    look as extreme, or none). Splits whose difference lies within the rounding of the sums,
    :math:`4 N \epsilon \max_i |x_i|` for :math:`N` pooled values, count as ties (as extreme).

    Every split is counted, not sampled, by meeting in the middle: the difference of means is increasing in the
    first group's sum :math:`s` (:math:`\bar x_1 - \bar x_2 = s (1/n_1 + 1/n_2) - \sum_i x_i / n_2`), so a split is
    as extreme when :math:`s` is beyond one or two thresholds; the pooled values are cut in two halves, the sums of
    every subset of each half are listed by size (:math:`2^{N/2}` each) and sorted, and the splits of each size
    pair are counted by binary search.

    Examples
    --------
    >>> round(permutation_test([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]), 4)  # 2 of 462 splits
    0.0043
    >>> round(permutation_test([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0, 11.0], alternative="less"), 4)
    0.0022
    """
    alternative = choice(alternative, "alternative", ("two-sided", "less", "greater"))
    first, second = unit_values(first, "first"), unit_values(second, "second")
    pooled, size = np.concatenate([first, second]), first.size
    if pooled.size > PERMUTATION_UNITS:
        raise ValueError(f"`first` and `second` must hold at most {PERMUTATION_UNITS} units together (the exact "
                         f"test lists 2^(N/2) subset sums per half); got {first.size} + {second.size}.")
    other = pooled.size - size
    observed, total = first.mean() - second.mean(), pooled.sum()
    tie = 4 * pooled.size * np.finfo(float).eps * float(np.abs(pooled).max())  # the sums' rounding
    if alternative == "two-sided" and abs(observed) <= tie:  # every split is as extreme (the two tails overlap)
        return 1.0
    slope = 1.0 / size + 1.0 / other  # difference = slope * s - total / other
    high = (abs(observed) - tie + total / other) / slope if alternative == "two-sided" else \
        (observed - tie + total / other) / slope  # s >= high is as extreme (as high)
    low = (-abs(observed) + tie + total / other) / slope if alternative == "two-sided" else \
        (observed + tie + total / other) / slope  # s <= low is as extreme (as low)
    left, right = _subset_sums(pooled[: pooled.size // 2]), _subset_sums(pooled[pooled.size // 2:])
    extreme = 0
    for k, sums in left.items():
        partner = right.get(size - k)
        if partner is None:
            continue
        if alternative in ("two-sided", "greater"):
            extreme += int((partner.size - np.searchsorted(partner, high - sums, side="left")).sum())
        if alternative in ("two-sided", "less"):
            extreme += int(np.searchsorted(partner, low - sums, side="right").sum())
    return float(min(1.0, extreme / math.comb(pooled.size, size)))


PERMUTATION_UNITS = 40
"""The most units :func:`permutation_test` takes (both groups together): two halves of at most 2^20 subset sums."""


def _subset_sums(values: np.ndarray) -> dict[int, np.ndarray]:
    """The sum of every subset of ``values``, by subset size, each sorted."""
    count = values.size
    masks = np.arange(2**count, dtype=np.int64)
    bits = ((masks[:, None] >> np.arange(count)) & 1).astype(bool)
    sums, sizes = bits @ values if count else np.zeros(1), bits.sum(axis=1)
    return {int(k): np.sort(sums[sizes == k]) for k in np.unique(sizes)}
