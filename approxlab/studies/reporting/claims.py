r"""One claims engine: intervals, power and verdicts, for every claim every study makes.

A claim (:class:`~approxlab.studies.Claim`) is a statistic, a threshold fixed in code before the run,
the side of it on which the claim holds and how its uncertainty is measured. The engine gives

* the intervals: a percentile bootstrap over the resampling units (:func:`bootstrap`, on
  :func:`approxlab.stats.bootstrap`; both aggregations of a claim from the same draws), Student's t
  on the units' values (:func:`t_interval`) and Welch's t on two groups (:func:`welch_interval`);
* the power of the units at hand to see an effect of a given size, and the units 80% power needs
  (:func:`power`, a two-sided one-sample t-test: :func:`approxlab.stats.t_test_power`);
* the verdict (:func:`judge`): **reproduced** when the whole interval is on the claim's side of the
  threshold, **not reproduced** when it is wholly on the other side (:func:`approxlab.stats.verdict`;
  with ``strict`` claims a bound equal to the threshold decides nothing), else **inconclusive** --
  or **not confirmed (underpowered)** where the claim sets a power goal that the units miss; with
  fewer units than the claim's ``min_units``, no verdict. A study names these outcomes in its own
  words through the claim's ``labels`` (Table 3's "below 1" / "above 1").

Every rule that turns an interval into a word is in :func:`judge`, so a change of rule is made here once.

Public API::

    LABELS, OUTCOMES
    judge(claim, low, high, *, power=nan, units=None) -> str
    label(claim, outcome) -> str
    bootstrap(statistic, units, *, resamples, seed, level, memoize=False) -> {key: approxlab.stats.Interval}
    t_interval(values, *, level=0.95) -> (mean, low, high)
    welch_interval(first, second, *, level=0.95) -> (difference, low, high)
    power(difference, sd, units, *, alpha=0.05, goal=0.8) -> (power, units_needed)
    tally(claim, verdicts, outcomes=("reproduced", "not reproduced", "inconclusive")) -> str
"""

from __future__ import annotations

import math

import numpy as np

from ... import stats

__all__ = ["LABELS", "OUTCOMES", "judge", "label", "bootstrap", "t_interval", "welch_interval", "power", "tally"]

OUTCOMES = ("reproduced", "not reproduced", "inconclusive", "underpowered", "too few units")
"""What the engine can conclude about a claim."""

LABELS = {"reproduced": "reproduced", "not reproduced": "not reproduced", "inconclusive": "inconclusive",
          "underpowered": "not confirmed (underpowered)", "too few units": "inconclusive"}
"""The words of each outcome, unless a claim's ``labels`` give its own."""


def label(claim, outcome: str) -> str:
    """The claim's word for ``outcome`` (one of :data:`OUTCOMES`)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"`outcome` must be one of {OUTCOMES}; got {outcome!r}.")
    return claim.labels.get(outcome, LABELS[outcome])


def judge(claim, low: float, high: float, *, power: float = math.nan, units: int | None = None) -> str:
    """The verdict on ``claim`` from its interval ``[low, high]``, in the claim's words.

    Parameters
    ----------
    claim : approxlab.studies.Claim
        Its ``threshold``, ``side``, ``strict``, ``power_goal``, ``min_units`` and ``labels``.
    low, high : float
        The interval.
    power : float
        The power of the units at the effect the study sizes for (NaN: none to size for).
    units : int, optional
        How many units the interval is over.

    Examples
    --------
    >>> from approxlab.studies import Claim
    >>> claim = Claim("a", "x falls", "ratio", side="at most", threshold=0.5)
    >>> judge(claim, 0.2, 0.4), judge(claim, 0.6, 0.9), judge(claim, 0.4, 0.6)
    ('reproduced', 'not reproduced', 'inconclusive')
    >>> below = Claim("k", "below 1", "mean ratio", side="below", threshold=1.0, interval="t", power_goal=0.8,
    ...               labels={"reproduced": "below 1", "not reproduced": "above 1"})
    >>> judge(below, 0.7, 0.9), judge(below, 0.8, 1.2, power=0.3), judge(below, 0.8, 1.2, power=0.9)
    ('below 1', 'not confirmed (underpowered)', 'inconclusive')
    """
    if claim.min_units is not None and units is not None and units < claim.min_units:
        return label(claim, "too few units")
    if claim.strict:
        threshold = claim.threshold
        below = claim.side in ("below", "at most")
        outcome = ("reproduced" if (high < threshold if below else low > threshold) else
                   "not reproduced" if (low > threshold if below else high < threshold) else "inconclusive")
    else:
        outcome = stats.verdict(low, high, claim.threshold, claim.side)
    if outcome == "inconclusive" and claim.power_goal is not None and power < claim.power_goal:
        outcome = "underpowered"
    return label(claim, outcome)


def tally(claim, verdicts, outcomes=("reproduced", "not reproduced", "inconclusive")) -> str:
    """``"3 reproduced, 0 not reproduced, 1 inconclusive"``: how often each outcome's word occurs in ``verdicts``."""
    counts = {}
    for verdict in verdicts:
        counts[verdict] = counts.get(verdict, 0) + 1
    return ", ".join(f"{counts.get(label(claim, o), 0)} {label(claim, o)}" for o in outcomes)


def bootstrap(statistic, units, *, resamples: int, seed: int, level: float, memoize: bool = False) -> dict:
    """Percentile bootstrap intervals of every value ``statistic(units)`` returns (:func:`approxlab.stats.bootstrap`).

    ``memoize``: the statistic depends only on the multiset of units drawn (a median over pooled
    units does not depend on their order), so compute it once per multiset -- W units give only
    C(2W-1, W) distinct ones among the resamples (10 for W = 3).
    """
    if memoize:
        statistic = _per_multiset(statistic)
    return stats.bootstrap(statistic, units, resamples=resamples, seed=seed, level=level)


def _per_multiset(statistic):
    seen = {}

    def memoized(units):
        key = tuple(sorted((str(group), tuple(sorted(ids))) for group, ids in units.items())) \
            if isinstance(units, dict) else tuple(sorted(units))
        if key not in seen:
            seen[key] = statistic(units)
        return seen[key]

    return memoized


def t_interval(values, *, level: float = 0.95) -> tuple[float, float, float]:
    r"""Mean of ``values`` and its Student-t interval :math:`\bar x \pm t_{(1+\text{level})/2,\,s-1}\,\hat\sigma/\sqrt s`.

    ``low = high = nan`` for fewer than 2 values. The units are taken as independent draws, roughly
    normal; the width shrinks like :math:`1/\sqrt s`.

    Examples
    --------
    >>> mean, low, high = t_interval([0.8, 1.0, 1.2])
    >>> round(mean, 3), round(low, 3), round(high, 3)
    (1.0, 0.503, 1.497)
    """
    from scipy import stats as scipy_stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if values.size < 2:
        return mean, float("nan"), float("nan")
    half = float(scipy_stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size))
    return mean, mean - half, mean + half


def welch_interval(first, second, *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``first`` minus mean of ``second``, with Welch's t interval (unequal variances)."""
    from scipy import stats as scipy_stats

    first, second = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    interval = scipy_stats.ttest_ind(first, second, equal_var=False).confidence_interval(level)
    return float(first.mean() - second.mean()), float(interval.low), float(interval.high)


def power(difference: float, sd: float, units: int, *, alpha: float = 0.05, goal: float = 0.8):
    """``(power, units_needed)``: a two-sided one-sample t-test at ``alpha`` of "no effect" when the effect is
    ``difference`` and the per-unit spread ``sd``, with ``units`` units; and the units ``goal`` power needs.

    ``(nan, None)`` when there is nothing to size (no spread, no effect, fewer than 2 units).
    """
    if not (sd > 0 and difference != 0 and units >= 2):
        return float("nan"), None
    return (stats.t_test_power(int(units), difference=difference, sd=sd, alpha=alpha),
            stats.t_test_sample_size(difference=difference, sd=sd, power=goal, alpha=alpha, max_n=10**6))
