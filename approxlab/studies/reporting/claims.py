r"""One claims engine: intervals, power and verdicts, for every claim every study makes.

A claim (:class:`~approxlab.studies.Claim`) is a statistic, a threshold fixed in code before the run,
the side of it on which the claim holds and how its uncertainty is measured. The engine gives

* the intervals: a bootstrap over the resampling units (:func:`resample` draws once, :func:`interval`
  turns the draws into the claim's interval -- the percentile interval, or the bootstrap standard error
  with Student-t quantiles, on the claim's scale; :func:`bootstrap` gives percentile intervals at once),
  Student's t on the units' values (:func:`t_interval`) and Welch's t on two groups (:func:`welch_interval`);
* how often each of these intervals covers a known truth with the units at hand (:func:`coverage`,
  :func:`coverage_lines`: :func:`approxlab.stats.coverage` under a declared model), stated beside every
  claim table;
* the power of the units at hand to see an effect of a given size, and the units 80% power needs
  (:func:`power`, a two-sided one-sample t-test: :func:`approxlab.stats.t_test_power`);
* the verdict (:func:`judge`), by these rules, in this order:

  1. fewer than 2 units (or fewer than the claim's ``min_units``): no verdict, **too few units**; an
     interval that could not be computed (a NaN bound, e.g. a bootstrap over one unit) is
     **inconclusive**;
  2. **reproduced** when the whole interval is on the claim's side of the threshold, **not reproduced**
     when it is wholly on the other side (:func:`approxlab.stats.verdict`; with ``strict`` claims a
     bound equal to the threshold decides nothing);
  3. an interval across the threshold that excludes the paper's own value (``paper``, or the claim's
     ``paper_value``): **rejects the paper's value** -- the data say the paper's number is not what
     this setting gives, though they cannot place it on either side of the threshold;
  4. otherwise **not confirmed (underpowered)** where the claim sets a power goal that the units miss
     at the effect the study sizes for (declared before the run, never the observed effect), else
     **inconclusive**;
  5. the interval judged is the **calibrated** one (``calibrated``:
     :func:`approxlab.studies.reporting.calibrated.calibrate`, the double bootstrap on the run's own units), and
     where calibration fails the verdict is **no verdict**, with its reason (``"no verdict: the interval has
     zero width ..."``); a coverage estimate is never a gate. The former rule (an interval whose coverage on the
     run's units was below 90% got no verdict, :func:`approxlab.studies.reporting.measured.gate`) is kept as the
     former verdict (:func:`approxlab.studies.reporting.calibrated.former_verdict`) in each summary's "Changes of
     verdict".

Each claim declares the level at which its units vary (``Claim.varies``), the clusters its statistic is
computed within (``Claim.within``) and its family (``Claim.family``); a summary names them beside the coverage
(:func:`approxlab.studies.reporting.measured.measured_lines`) and states the family's Holm-adjusted p-values
(:func:`approxlab.studies.reporting.measured.holm_column`).

A study names these outcomes in its own words through the claim's ``labels`` (Table 3's "below 1" /
"above 1"). Every rule that turns an interval into a word is in :func:`judge`, so a change of rule is
made here once; :mod:`approxlab.studies.reporting.changes` keeps the rules as they stood before 1 and 3
and lists the verdicts that differ.

Public API::

    LABELS, OUTCOMES, INTERVALS
    judge(claim, low, high, *, power=nan, units=None, paper=None, measured=None, calibrated=None) -> str
    label(claim, outcome) -> str
    threshold_outcome(claim, low, high) -> str          # rule 2 alone, an outcome of OUTCOMES
    resample(statistic, units, *, resamples, seed, memoize=False) -> {key: approxlab.stats.Resamples}
    interval(claim, resamples, *, level=0.95) -> approxlab.stats.Interval
    bootstrap(statistic, units, *, resamples, seed, level, memoize=False) -> {key: approxlab.stats.Interval}
    t_interval(values, *, level=0.95) -> (mean, low, high)
    welch_interval(first, second, *, level=0.95) -> (difference, low, high)
    power(difference, sd, units, *, alpha=0.05, goal=0.8) -> (power, units_needed)
    coverage(claim, units, *, statistic=None, model=None, level=0.95) -> approxlab.stats.Coverage
    coverage_lines(entries, *, level=0.95) -> list[str]         # the coverage table beside a claim table
    model_text(model) -> str
    tally(claim, verdicts, outcomes=("reproduced", "not reproduced", "inconclusive")) -> str
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from ... import stats
from .markdown import markdown_table
from .measured import gate

__all__ = ["LABELS", "OUTCOMES", "INTERVALS", "SIMULATION", "judge", "label", "threshold_outcome", "resample",
           "interval", "bootstrap", "t_interval", "welch_interval", "power", "coverage", "coverage_lines", "model_text",
           "tally"]

OUTCOMES = ("reproduced", "not reproduced", "inconclusive", "rejects paper", "underpowered", "too few units")
"""What the engine can conclude about a claim."""

LABELS = {"reproduced": "reproduced", "not reproduced": "not reproduced", "inconclusive": "inconclusive",
          "rejects paper": "rejects the paper's value", "underpowered": "not confirmed (underpowered)",
          "too few units": "inconclusive"}
"""The words of each outcome, unless a claim's ``labels`` give its own."""

INTERVALS = {"bootstrap": "percentile", "bootstrap-se": "standard-error", "t": "t", "welch": "welch"}
"""A claim's ``interval`` -> the method of :func:`approxlab.stats.coverage` (and of
:func:`approxlab.stats.bootstrap_interval` for the two bootstraps)."""

SIMULATION = {"trials": 2000, "resamples": 500, "seed": 0}
"""How :func:`coverage` simulates: 2,000 data sets (the coverage to about +-1%), 500 bootstrap resamples each (the
studies draw 2,000; with few units the percentile interval's coverage barely moves with it), seed 0."""

DESCRIPTIONS = {"bootstrap": "percentile bootstrap", "bootstrap-se": "bootstrap standard error x Student t",
                "t": "Student t", "welch": "Welch t"}
"""How a summary names each interval."""


def label(claim, outcome: str) -> str:
    """The claim's word for ``outcome`` (one of :data:`OUTCOMES`)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"`outcome` must be one of {OUTCOMES}; got {outcome!r}.")
    return claim.labels.get(outcome, LABELS[outcome])


def judge(claim, low: float, high: float, *, power: float = math.nan, units: int | None = None,
          paper: float | None = None, measured=None, calibrated=None) -> str:
    """The verdict on ``claim`` from its interval ``[low, high]``, in the claim's words (the rules 1-5 of the
    module docstring).

    Parameters
    ----------
    claim : approxlab.studies.Claim
        Its ``threshold``, ``side``, ``strict``, ``power_goal``, ``min_units``, ``paper_value`` and ``labels``.
    low, high : float
        The interval (NaN bounds: none could be computed).
    power : float
        The power of the units at the effect the study sizes for (NaN: none to size for).
    units : int, optional
        How many units the interval is over; fewer than 2 (or than ``claim.min_units``) decide nothing.
    paper : float, optional
        The paper's own value of the statistic (default: ``claim.paper_value``).
    measured : approxlab.studies.reporting.measured.Measured, optional
        The interval's coverage on the run's own units: below 90%, no verdict (the former rule 5, kept for the
        studies that still gate: :mod:`approxlab.studies.perplexity`).
    calibrated : approxlab.studies.reporting.calibrated.Calibrated, optional
        The calibration of the interval passed as ``low, high`` (its calibrated bounds): where it fails, "no
        verdict" and its reason (rule 5).

    Examples
    --------
    >>> from approxlab.studies import Claim
    >>> claim = Claim("a", "x falls", "ratio", side="at most", threshold=0.5)
    >>> judge(claim, 0.2, 0.4), judge(claim, 0.6, 0.9), judge(claim, 0.4, 0.6)
    ('reproduced', 'not reproduced', 'inconclusive')
    >>> judge(claim, 0.3, 0.3, units=1)                       # one unit: a zero-width interval decides nothing
    'inconclusive'
    >>> below = Claim("k", "below 1", "mean ratio", side="below", threshold=1.0, interval="t", power_goal=0.8,
    ...               labels={"reproduced": "below 1", "not reproduced": "above 1"})
    >>> judge(below, 0.7, 0.9), judge(below, 0.8, 1.2, power=0.3), judge(below, 0.8, 1.2, power=0.9)
    ('below 1', 'not confirmed (underpowered)', 'inconclusive')
    >>> judge(below, 0.97, 1.85, power=0.3, paper=0.77)       # holds 1, excludes the paper's 0.77
    "rejects the paper's value"
    >>> from approxlab.studies.reporting.measured import Measured
    >>> judge(below, 0.7, 0.9, measured=Measured(0.838, 0.80, 0.87, 3, 400, 0.8))
    'no verdict: coverage 83.8% < 90%'
    """
    if units is not None and units < max(2, claim.min_units or 2):
        return label(claim, "too few units")
    if calibrated is not None and calibrated.reason is not None:
        return f"no verdict: {calibrated.reason}"
    if measured is not None:
        return gate(claim, judge(claim, low, high, power=power, units=units, paper=paper), measured)
    outcome = threshold_outcome(claim, low, high)
    paper = claim.paper_value if paper is None else paper
    if outcome == "inconclusive" and paper is not None and math.isfinite(low) and math.isfinite(high) \
            and not low <= paper <= high:
        outcome = "rejects paper"
    elif outcome == "inconclusive" and claim.power_goal is not None and power < claim.power_goal:
        outcome = "underpowered"
    return label(claim, outcome)


def threshold_outcome(claim, low: float, high: float) -> str:
    """Rule 2 alone: ``"reproduced"``, ``"not reproduced"`` or ``"inconclusive"`` (also for a NaN bound) from
    where ``[low, high]`` lies against the claim's threshold, ``strict`` or not (:func:`approxlab.stats.verdict`)."""
    if not claim.strict:
        return stats.verdict(low, high, claim.threshold, claim.side)
    threshold, below = claim.threshold, claim.side in ("below", "at most")
    return ("reproduced" if (high < threshold if below else low > threshold) else
            "not reproduced" if (low > threshold if below else high < threshold) else "inconclusive")


def tally(claim, verdicts, outcomes=("reproduced", "not reproduced", "inconclusive")) -> str:
    """``"3 reproduced, 0 not reproduced, 1 inconclusive"``: how often each outcome's word occurs in ``verdicts``."""
    counts = {}
    for verdict in verdicts:
        counts[verdict] = counts.get(verdict, 0) + 1
    return ", ".join(f"{counts.get(label(claim, o), 0)} {label(claim, o)}" for o in outcomes)


def resample(statistic, units, *, resamples: int, seed: int, memoize: bool = False) -> dict:
    """The bootstrap distribution of every value ``statistic(units)`` returns (:func:`approxlab.stats.resample`;
    groups of equal size share one draw); :func:`interval` turns each into a claim's interval.

    ``memoize``: the statistic depends only on the multiset of units drawn (a median over pooled
    units does not depend on their order), so compute it once per multiset -- W units give only
    C(2W-1, W) distinct ones among the resamples (10 for W = 3).
    """
    if memoize:
        statistic = _per_multiset(statistic)
    return stats.resample(statistic, units, resamples=resamples, seed=seed)


def interval(claim, resamples, *, level: float = 0.95) -> stats.Interval:
    """The claim's bootstrap interval from one bootstrap distribution (:func:`resample`): the percentile
    interval (``claim.interval == "bootstrap"``) or the bootstrap standard error with Student-t quantiles
    (``"bootstrap-se"``), on the claim's ``scale`` (:func:`approxlab.stats.bootstrap_interval`). NaN bounds
    with fewer than 2 units."""
    if claim.interval not in ("bootstrap", "bootstrap-se"):
        raise ValueError(f"`claim` must be judged by a bootstrap interval ('bootstrap' or 'bootstrap-se'); claim "
                         f"{claim.id!r} has {claim.interval!r}.")
    return stats.bootstrap_interval(resamples, method=INTERVALS[claim.interval], level=level,
                                    log=claim.scale == "log")


def bootstrap(statistic, units, *, resamples: int, seed: int, level: float, memoize: bool = False) -> dict:
    """Percentile bootstrap intervals of every value ``statistic(units)`` returns (:func:`approxlab.stats.bootstrap`;
    NaN bounds where a group has a single unit: rule 1 then makes the verdict inconclusive). ``memoize`` as in
    :func:`resample`."""
    found = resample(statistic, units, resamples=resamples, seed=seed, memoize=memoize)
    return {key: stats.bootstrap_interval(values, level=level) for key, values in found.items()}


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
    r"""Mean of ``values`` and its Student-t interval :math:`\bar x \pm t_{(1+\text{level})/2,\,s-1}\,\hat\sigma/\sqrt s`
    (:func:`approxlab.stats.t_interval`).

    ``low = high = nan`` for fewer than 2 values. The units are taken as independent draws, roughly
    normal; the width shrinks like :math:`1/\sqrt s`.

    Examples
    --------
    >>> mean, low, high = t_interval([0.8, 1.0, 1.2])
    >>> round(mean, 3), round(low, 3), round(high, 3)
    (1.0, 0.503, 1.497)
    """
    found = stats.t_interval(values, level=level)
    return found.estimate, found.low, found.high


def welch_interval(first, second, *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``first`` minus mean of ``second``, with Welch's t interval (:func:`approxlab.stats.welch_interval`)."""
    found = stats.welch_interval(first, second, level=level)
    return found.estimate, found.low, found.high


def power(difference: float, sd: float, units: int, *, alpha: float = 0.05, goal: float = 0.8):
    """``(power, units_needed)``: a two-sided one-sample t-test at ``alpha`` of "no effect" when the effect is
    ``difference`` and the per-unit spread ``sd``, with ``units`` units; and the units ``goal`` power needs.

    ``difference`` is the effect the study sizes for, declared before the run (a paper's value, a smallest
    effect of interest): power at the observed effect only restates the p-value. For a claim judged on the
    log scale (a geometric mean), pass the log effect and the SD of the logs.

    ``(nan, None)`` when there is nothing to size (no spread, no effect, fewer than 2 units); ``units_needed``
    without the power of the units at hand when ``units`` is None.
    """
    if not (sd > 0 and difference != 0):
        return float("nan"), None
    needed = stats.t_test_sample_size(difference=difference, sd=sd, power=goal, alpha=alpha, max_n=10**6)
    if units is None or units < 2:
        return float("nan"), needed
    return stats.t_test_power(int(units), difference=difference, sd=sd, alpha=alpha), needed


def coverage(claim, units, *, statistic: str | None = None, model=None, level: float = 0.95) -> stats.Coverage:
    """How often the claim's interval covers a known truth with ``units`` units (:func:`approxlab.stats.coverage`
    with :data:`SIMULATION` -- 2,000 simulated data sets of 500 bootstrap resamples each, seed 0; computed once
    per process for each set of arguments).

    ``statistic``: what the claim's statistic is simulated as (one of
    :data:`approxlab.stats.COVERAGE_STATISTICS` for the claim's interval; default its first); ``model``: an
    :class:`approxlab.stats.UnitModel` (default: lognormal units, one value each, sigma = 1; normal units for
    Welch's interval).
    """
    method = INTERVALS[claim.interval]
    if model is None:
        model = stats.UnitModel("normal" if method == "welch" else "lognormal")
    units = tuple(units) if isinstance(units, (list, tuple)) else int(units)
    return _coverage(method, units, statistic, model, float(level), claim.scale == "log")


@functools.lru_cache(maxsize=256)
def _coverage(method, units, statistic, model, level, log) -> stats.Coverage:
    return stats.coverage(method, units, statistic=statistic, model=model, level=level, log=log, **SIMULATION)


def coverage_lines(entries, *, level: float = 0.95) -> list[str]:
    """A summary's statement of coverage beside its claim table: a sentence and a table with one row per entry.

    ``entries``: dicts with ``claim`` (its ``interval`` and ``scale`` are measured), ``units`` (the run's count:
    an int, or a pair for Welch), and optionally ``claims`` (which rows of the claim table it covers, in words),
    ``statistic`` and ``model`` (as in :func:`coverage`). Each row gives the coverage of :func:`coverage` with its
    Wilson 95% interval; with fewer than 2 units, "no interval". The simulated units are named in the sentence
    when every row shares them, else in a column.
    """
    rows, models = [], []
    for entry in entries:
        claim = entry["claim"]
        found = coverage(claim, entry["units"], statistic=entry.get("statistic"), model=entry.get("model"), level=level)
        units = found.units if isinstance(found.units, int) else min(found.units)
        models.append(model_text(found.model))
        rows.append({"claims": entry.get("claims", claim.id),
                     "interval": DESCRIPTIONS[claim.interval] + (", log scale" if found.log else ""),
                     "statistic (simulated)": found.statistic,
                     claim.unit + "s": found.units if isinstance(found.units, int) else
                     " and ".join(map(str, found.units)),
                     "simulated units": models[-1],
                     "coverage [95% interval]": "no interval" if units < 2 else
                     f"{found.coverage:.1%} [{found.low:.1%}, {found.high:.1%}]"})
    table, shared = pd.DataFrame(rows), len(set(models)) == 1
    return [f"**Coverage.** How often these {level:.0%} intervals hold the true value with this run's units, measured "
            f"by simulation with a known truth (`approxlab.stats.coverage`: {SIMULATION['trials']:,} simulated data "
            + (f"sets of {models[0]}, " if shared else "sets, ")
            + f"{SIMULATION['resamples']} bootstrap resamples per set; a percentile interval cannot leave the range of "
            "its few units):", "",
            *markdown_table(table.drop(columns=["simulated units"]) if shared else table, default=str)]


def model_text(model) -> str:
    """``"lognormal units (sigma = 1 on the log scale), one value each"``: a :class:`approxlab.stats.UnitModel` in words."""
    scale = " on the log scale" if model.distribution == "lognormal" else ""
    text = f"{model.distribution} units (sigma = {model.sigma:g}{scale})"
    if model.members > 1:
        text += f", {model.members} values each (within-unit sigma = {model.within:g})"
    else:
        text += ", one value each"
    if model.shared:
        text += f", a unit effect shared by a ratio's two sides (sigma = {model.shared:g})"
    return text
