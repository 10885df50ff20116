r"""Coverage measured on the run's own units, the gate it sets on a verdict, and multiplicity within a family.

The parametric coverage of :func:`~approxlab.studies.reporting.claims.coverage` is that of a model (lognormal
windows, normal seeds); a run's units need not follow it. :func:`measured_coverage` takes the run's **own**
units as the population: it draws as many units as the run has, with replacement, recomputes the claim's
interval on the draw, and counts how often it holds the population value (the statistic on all the run's
units) -- the bootstrap's own estimate of its coverage (B. Efron and R. J. Tibshirani, *An Introduction to the
Bootstrap*, 1993, Section 18.3: a "double bootstrap" with the outer level counting coverage). A unit drawn
twice is two units for the interval, so a study's ``compute`` must treat a repeated unit as two (relabel it).

Rules, applied after :func:`~approxlab.studies.reporting.claims.judge`:

* :func:`gate`: a claim whose measured coverage is below :data:`GATE` (90%) gets **no verdict**, written
  ``"no verdict: coverage 75.8% < 90%"``; :func:`units_needed` says how many units it would need (the same
  resampling at larger unit counts, the first count whose coverage reaches the gate).
* :func:`holm`: the Holm-adjusted p-values of a family of claims (S. Holm, *Scand. J. Statist.* 6, 1979),
  so that a summary states whether its verdicts are per comparison or hold for the family at once;
  :func:`p_value` gives the p-value an interval is the inversion of (Student t, or the bootstrap's share of
  resampled values on the other side of the threshold, doubled).

Public API::

    GATE, MEASURED
    Measured(coverage, low, high, units, trials, truth)
    measured_coverage(compute, units, *, size=None, trials=MEASURED["trials"], seed=MEASURED["seed"]) -> Measured
    units_needed(compute, units, *, sizes=None, trials=..., seed=..., goal=GATE) -> int | None
    sizes_for(count) -> list[int]; needed_size(coverage_at, count, *, sizes=None, goal=GATE) -> int | None | dict
    gate(claim, verdict, measured) -> str
    coverage_text(measured) -> str
    p_value(claim, *, values=None, resampled=None) -> float
    holm(pvalues) -> numpy.ndarray
    holm_column(table, *, family, p="p", level=0.95) -> DataFrame      # adds p_holm and holm_decided
    measured_lines(entries) -> list[str]; family_lines(table, *, family, what, level=0.95) -> list[str]
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats as _scipy_stats

from ...stats.verdicts import wilson_bounds
from .markdown import markdown_table

__all__ = ["GATE", "MEASURED", "Measured", "measured_coverage", "units_needed", "sizes_for", "needed_size", "gate",
           "coverage_text", "p_value", "holm", "holm_column", "measured_lines", "family_lines"]

GATE = 0.90
"""A claim whose interval covers less often than this, measured on the run's own units, gets no verdict."""

MEASURED = {"trials": 400, "seed": 1}
"""How :func:`measured_coverage` resamples: 400 draws of the run's units (a coverage near 90% to about +-3%,
Wilson), seed 1 (not the seed of the claims' own bootstrap)."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """The coverage of a claim's interval with the run's units as the population: the share ``coverage`` of
    ``trials`` draws of ``units`` units whose interval held ``truth`` (the statistic on every unit), with its
    Wilson 95% interval ``low``, ``high``."""

    coverage: float
    low: float
    high: float
    units: int
    trials: int
    truth: float


def measured_coverage(compute, units, *, size: int | None = None, trials: int = MEASURED["trials"],
                      seed: int = MEASURED["seed"]) -> Measured:
    """How often ``compute``'s interval holds the statistic of the population ``units`` (the run's own units).

    Parameters
    ----------
    compute : callable
        ``compute(sample) -> (estimate, low, high)`` for a list of units (a unit may appear more than once:
        it counts as that many units).
    units : sequence, or dict of group -> sequence
        The run's units (windows, seeds, ...), the population; a dict: each group (a task's seeds) drawn at its
        own count, the draw passed to ``compute`` as one list (the groups in order).
    size : int, optional
        Units per draw (default: as many as the run has).
    trials, seed : int
        Draws, and the seed of ``numpy.random.default_rng``.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab import stats
    >>> def t(sample):
    ...     found = stats.t_interval(sample)
    ...     return found.estimate, found.low, found.high
    >>> measured_coverage(t, list(np.linspace(0.5, 1.5, 12)), trials=400).coverage > 0.9
    True
    >>> measured_coverage(t, [1.0, 2.0, 3.0], trials=200).coverage   # 3 units: t's wide interval, or none
    0.94
    """
    groups = {g: list(u) for g, u in units.items()} if isinstance(units, dict) else {None: list(units)}
    if not all(groups.values()):
        raise ValueError("`units` must hold at least one unit in every group; got none.")
    everything = [unit for members in groups.values() for unit in members]
    size = len(everything) if size is None else int(size)
    scale = size / len(everything)
    truth = float(compute(everything)[0])
    rng = np.random.default_rng(seed)
    held = 0
    for _ in range(int(trials)):
        sample = [members[i] for members in groups.values()
                  for i in rng.integers(0, len(members), size=max(1, round(len(members) * scale)))]
        _, low, high = compute(sample)
        held += bool(low <= truth <= high)  # NaN bounds (no interval) hold nothing
    rate = held / int(trials)
    low, high = wilson_bounds(rate, int(trials), 0.95)
    return Measured(rate, float(low), float(high), size, int(trials), truth)


def units_needed(compute, units, *, sizes=None, trials: int = MEASURED["trials"], seed: int = MEASURED["seed"],
                 goal: float = GATE) -> int | None:
    """The fewest units (of ``sizes``, default 2, 3, 4, 6, 8 and 12 times the run's count: :func:`sizes_for`) whose
    interval reaches ``goal`` coverage of the population value, by :func:`measured_coverage` at that size; None where
    none does. An approximation: the run's few units stand for the population at every size. ``units`` as in
    :func:`measured_coverage` (a dict: its groups scaled together, the count being their total).

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab import stats
    >>> def t(sample):
    ...     found = stats.t_interval(sample)
    ...     return found.estimate, found.low, found.high
    >>> units_needed(t, [1.0, 2.0, 3.0, 10.0], trials=200)   # 4 skewed units cover less than 90%; 12 do
    12
    """
    count = sum(len(list(u)) for u in units.values()) if isinstance(units, dict) else len(list(units))
    return needed_size(lambda size: measured_coverage(compute, units, size=size, trials=trials, seed=seed).coverage,
                       count, sizes=sizes, goal=goal)


def sizes_for(count: int) -> list[int]:
    """The unit counts :func:`units_needed` tries: 2, 3, 4, 6, 8 and 12 times the run's ``count``."""
    return [int(count) * k for k in (2, 3, 4, 6, 8, 12)]


def needed_size(coverage_at, count: int, *, sizes=None, goal: float = GATE):
    """The search of :func:`units_needed` over a study's own measurement: ``coverage_at(size)`` is the coverage at
    ``size`` units (a float), or of many claims at once (a dict key -> float, from one nested resampling per size);
    the first of ``sizes`` (default :func:`sizes_for` ``count``) whose coverage reaches ``goal``, None where none
    does -- per key for a dict, the search stopping once every key has its size.

    Examples
    --------
    >>> needed_size(lambda size: {"a": 0.8 + size / 100, "b": 0.5}, 4)   # "a" reaches 90% at 12 units, "b" never
    {'a': 12, 'b': None}
    """
    sizes = sizes_for(count) if sizes is None else list(sizes)
    found, single = {}, None
    for size in sizes:
        covered = coverage_at(size)
        single = not isinstance(covered, dict)
        covered = {None: covered} if single else covered
        for key, value in covered.items():
            if key not in found or found[key] is None:
                found[key] = int(size) if value >= goal else None
        if all(v is not None for v in found.values()):
            break
    if single is None:
        return None
    return found.get(None) if single else found


def gate(claim, verdict: str, measured: Measured | None) -> str:
    """``verdict``, or ``"no verdict: coverage X% < 90%"`` where the measured coverage is below :data:`GATE`.

    Examples
    --------
    >>> gate(None, "reproduced", Measured(0.758, 0.71, 0.80, 3, 400, 0.78))
    'no verdict: coverage 75.8% < 90%'
    >>> gate(None, "reproduced", Measured(0.93, 0.90, 0.95, 12, 400, 1.0))
    'reproduced'
    """
    if measured is None or not math.isfinite(measured.coverage) or measured.coverage >= GATE:
        return verdict
    return f"no verdict: coverage {measured.coverage:.1%} < {GATE:.0%}"


def coverage_text(measured: Measured | None) -> str:
    """``"75.8% [71.4%, 79.7%]"`` (the Wilson interval), or ``"not measured"``."""
    if measured is None:
        return "not measured"
    return f"{measured.coverage:.1%} [{measured.low:.1%}, {measured.high:.1%}]"


def p_value(claim, *, values=None, resampled=None) -> float:
    r"""The two-sided p-value of "the statistic equals ``claim.threshold``" whose inversion is the claim's interval.

    ``values``: the units' values for a Student-t claim (the mean against the threshold; on the log scale when
    ``claim.scale == "log"``). ``resampled``: an :class:`approxlab.stats.Resamples` for a bootstrap claim:
    :math:`2\min(P^*(\hat\theta^* \le c), P^*(\hat\theta^* \ge c))`, capped at 1 (the percentile interval
    excludes :math:`c` exactly when this is below :math:`1 - \text{level}`); for a ``"bootstrap-se"`` claim the
    t-test of its interval, :math:`|\hat\theta - c|/\widehat{\mathrm{se}}` on ``units - 1`` degrees of freedom
    (on the log scale where the claim's is). NaN with fewer than 2 units.

    Examples
    --------
    >>> from approxlab.studies import Claim
    >>> below = Claim("k", "below 1", "mean", side="below", threshold=1.0, interval="t")
    >>> round(p_value(below, values=[0.8, 0.9, 0.85, 0.95]), 4)
    0.0305
    """
    threshold = claim.threshold
    if values is not None:
        values = np.asarray(values, dtype=float)
        if claim.scale == "log":
            values, threshold = np.log(values), math.log(threshold)
        if values.size < 2 or not np.std(values) > 0:
            return math.nan
        return float(_scipy_stats.ttest_1samp(values, threshold).pvalue)
    draws = np.asarray(resampled.values, dtype=float)
    if resampled.units < 2 or not np.isfinite(draws).all():
        return math.nan
    if claim.interval == "bootstrap-se":  # the standard-error interval's own test: t on the claim's scale
        estimate = resampled.estimate
        if claim.scale == "log":
            if estimate <= 0 or (draws <= 0).any():
                return math.nan
            draws, estimate, threshold = np.log(draws), math.log(estimate), math.log(threshold)
        se = float(np.std(draws, ddof=1))
        return float(2 * _scipy_stats.t.sf(abs(estimate - threshold) / se, resampled.units - 1)) if se > 0 else math.nan
    return float(min(1.0, 2 * min(np.mean(draws <= threshold), np.mean(draws >= threshold))))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count towards the family's size).

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03, float("nan")]).round(2).tolist()
    [0.03, 0.06, 0.06, nan]
    """
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, math.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    running, m = 0.0, len(order)
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def holm_column(table: pd.DataFrame, *, family, p: str = "p", level: float = 0.95) -> pd.DataFrame:
    """``table`` with ``p_holm`` (Holm within each ``family``, a column or list of columns) and ``holm_decided``
    (the adjusted p-value below ``1 - level``: the verdict holds with the family's error rate controlled)."""
    table = table.copy()
    table["p_holm"] = math.nan
    if len(table):
        for _, group in table.groupby(family, sort=False):
            table.loc[group.index, "p_holm"] = holm(group[p].to_numpy(dtype=float))
    table["holm_decided"] = table["p_holm"] < 1 - level
    return table


def measured_lines(entries) -> list[str]:
    """A summary's statement of the coverage measured on the run's own units, beside the parametric model's.

    ``entries``: dicts with ``claim`` (its ``varies`` and ``within`` are named), ``measured``
    (:class:`Measured`), optionally ``claims`` (the rows covered, in words), ``parametric`` (the model's
    coverage, in words) and ``needed`` (:func:`units_needed`; shown where the coverage misses the gate).
    """
    rows = []
    for entry in entries:
        claim, found = entry["claim"], entry["measured"]
        needed = entry.get("needed")
        rows.append({"claims": entry.get("claims", claim.id), "units vary at": claim.varies,
                     "statistic computed": f"within {claim.within}, pooled" if claim.within else "over pooled units",
                     "units": found.units if found else "", "coverage (model)": entry.get("parametric", "not stated"),
                     "coverage (own units)": coverage_text(found),
                     "units for 90%": "" if found is None or found.coverage >= GATE else
                     (str(needed) if needed else f"more than {12 * found.units}")})
    return [f"**Coverage on the run's own units.** The run's units taken as the population: {MEASURED['trials']} "
            "draws of as many units as the run has (with replacement), the claim's interval recomputed on each, "
            "and the share that holds the statistic on all units (Wilson 95% interval). A claim whose interval "
            f"covers less than {GATE:.0%} gets no verdict; the units it would need are found by the same resampling "
            "at larger unit counts (an approximation: the run's units stand for the population).", "",
            *markdown_table(pd.DataFrame(rows), default=str)]


def family_lines(table: pd.DataFrame, *, family: str, what: str, level: float = 0.95) -> list[str]:
    """One sentence on multiplicity: the verdicts are per comparison; how many decided ones keep Holm's adjustment
    within each family (``table`` as :func:`holm_column` returns it, with ``decided``: a bool column)."""
    decided = table[table["decided"]]
    kept = int(decided["holm_decided"].sum())
    families = table[family].astype(str).drop_duplicates().tolist() if len(table) else []
    return [f"**Multiplicity.** The verdicts are per comparison ({1 - level:.0%} each): {len(table)} {what} in "
            f"{len(families)} famil{'y' if len(families) == 1 else 'ies'} ({', '.join(families)}). With Holm's "
            f"adjustment within each family (column `p_holm`), {kept} of the {len(decided)} verdicts decided by their "
            "interval hold."]
