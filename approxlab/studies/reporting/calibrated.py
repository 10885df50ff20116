r"""Calibrated intervals for every claim: the double bootstrap on the run's own units, once, for every study.

A claim's interval is computed on the run's units; with few or skewed units it covers less than its nominal 95%.
:func:`calibrate` takes the run's **own** units as the population (as
:func:`~approxlab.studies.reporting.measured.measured_coverage` does): it draws as many units as the run has,
with replacement, recomputes the claim's interval family on each draw (an
:class:`approxlab.stats.calibration.IntervalFamily`: the percentile interval's inner resamples, or a Student-t
interval), and records for each draw whether its 95% interval holds the statistic on all units (the coverage, with
its Wilson interval) and the draw's **root** (the one-sided level at which its bound reaches that value). The
calibrated interval lies between the roots' 2.5% and 97.5% order statistics (:func:`approxlab.stats.calibration.
calibration`: iterated-bootstrap calibration, Hall 1986, Beran 1987, Hall and Martin 1988; the adjusted percentile
method of Davison and Hinkley 1997, Section 5.6), never inside the declared 95% interval, and the verdict is read
from it (:func:`~approxlab.studies.reporting.claims.judge` with ``calibrated``). Calibration fails -- **no
verdict**, with the reason -- only where too many draws give no interval, where a calibrated bound is not finite,
or where the interval has zero width; a coverage estimate is never a gate.

The outer draws are adaptive: batches of :data:`CALIBRATION` ``["batch"]`` until every key's coverage has a
Wilson 95% interval at most 2 points either side (:func:`approxlab.stats.calibration.settled`), at least
``min_draws`` and at most ``max_draws`` (2,500: enough for +-2 points at any coverage). A study that gated on a
coverage estimate of its first ``former_draws`` draws (the former rule: below 90%, no verdict) passes that count,
and :attr:`Calibrated.former` is that estimate, so the former verdict is reproduced from the same draws
(:func:`former_verdict`).

Public API::

    CALIBRATION
    Calibrated(...)                        # the calibrated interval, its level, the coverage and its MC interval
    calibrate(compute, units, *, paired=False, former_draws=None, **CALIBRATION) -> Calibrated | {key: Calibrated}
    former_verdict(claim, calibrated, *, power=nan, units=None, paper=None) -> str   # the 90% gate, as it was
    calibrated_columns(calibrated, threshold=None) -> dict   # the columns a verdict table carries (and p)
    coverage_cell(row) -> str                # "88.5% [86.4, 90.4] (1,000)" from those columns
    calibration_lines(what="claims") -> list[str]   # the summary's paragraph on the method
    calibration_table(table, key, *, verdict="verdict", former="former_verdict") -> list[str]
    interval_cell(low, high) -> str; level_cell(row) -> str
    in_short_lines(reproduces, fails, open_, *, notes=()) -> list[str]   # the "In short" section, first
    holm_lines(table, key, *, family, decided, level=0.95) -> list[str]  # Holm per claim family, beside each verdict
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ...stats import calibration as _calibration
from ...stats.verdicts import wilson_bounds
from .markdown import markdown_table
from .measured import Measured, gate, holm_column

__all__ = ["CALIBRATION", "Calibrated", "calibrate", "former_verdict", "calibrated_columns", "coverage_cell",
           "calibration_lines", "calibration_table", "interval_cell", "level_cell", "in_short_lines", "holm_lines", "CALIBRATED_COLUMNS"]

CALIBRATION = {"target": 0.95, "level": 0.95, "batch": 100, "min_draws": 200, "max_draws": 2500, "seed": 1}
"""How :func:`calibrate` draws: the coverage the calibrated interval targets (95%), the declared level (95%),
outer draws in batches of 100, at least 200 and at most 2,500, until the coverage's Wilson interval is at most
+-2 points; seed 1 of ``numpy.random.default_rng`` (not the seed of the claims' own bootstrap)."""

CALIBRATED_COLUMNS = ["nominal_low", "nominal_high", "calibrated_level", "coverage", "coverage_low", "coverage_high",
                      "coverage_draws", "calibration"]
"""The columns :func:`calibrated_columns` gives a verdict table: the declared 95% interval, the calibrated nominal
level, the declared interval's coverage on the run's own units with its Wilson 95% interval and the outer draws,
and ``calibration`` (empty, or why calibration fails)."""


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """One claim instance's calibrated interval.

    Attributes
    ----------
    estimate : float
        The statistic on all the run's units.
    low, high : float
        The calibrated interval (NaN where calibration fails).
    level : float
        Its nominal level (the calibrated one-sided levels' span; NaN where calibration fails).
    nominal_low, nominal_high : float
        The declared 95% interval on all the units.
    calibration : approxlab.stats.calibration.Calibration
        The coverage of the declared interval on the run's own units, its Wilson interval, the draws and the
        calibrated levels.
    reason : str or None
        Why calibration fails (then the verdict is "no verdict: <reason>"), else None.
    former : Measured or None
        The coverage of the first ``former_draws`` draws, as the former rule estimated it (None if not asked).
    family : approxlab.stats.calibration.IntervalFamily
        The interval family on all the units.
    roots : numpy.ndarray
        The outer draws' roots, sorted (NaN where a draw gave no interval).
    """

    estimate: float
    low: float
    high: float
    level: float
    nominal_low: float
    nominal_high: float
    calibration: _calibration.Calibration
    reason: str | None
    former: Measured | None
    family: _calibration.IntervalFamily
    roots: np.ndarray

    def p_value(self, threshold: float) -> float:
        r"""The calibrated two-sided p-value of "the statistic equals ``threshold``": with :math:`u` the threshold's
        root on all the units (:meth:`~approxlab.stats.calibration.IntervalFamily.position`) and :math:`G` the
        empirical distribution of the outer draws' roots, :math:`\max(2\min(u, 1-u), 2\min(G(u), 1-G(u)))` --
        below 5% exactly when the calibrated interval (never narrower than the declared one) excludes the
        threshold, up to the draws' resolution (Beran's prepivoted test). NaN where calibration fails."""
        if self.reason is not None or not math.isfinite(threshold):
            return math.nan
        u = self.family.position(threshold)
        if not math.isfinite(u):
            return math.nan
        roots = self.roots  # NaN roots (draws without an interval) count on neither side
        if 0 < u < 1:
            g = (np.sum(roots < u) + 0.5 * np.sum(roots == u)) / roots.size
        else:  # the threshold beyond every resampled value: the calibrated interval (at most their range) excludes it
            g = float(u)
        return float(min(1.0, max(2 * min(u, 1 - u), 2 * min(g, 1 - g))))


def calibrate(compute, units, *, paired: bool = False, former_draws: int | None = None,
              target: float = CALIBRATION["target"], level: float = CALIBRATION["level"],
              batch: int = CALIBRATION["batch"], min_draws: int = CALIBRATION["min_draws"],
              max_draws: int = CALIBRATION["max_draws"], seed: int = CALIBRATION["seed"]):
    """The calibrated interval of ``compute``'s statistic, with the run's ``units`` as the population.

    Parameters
    ----------
    compute : callable
        ``compute(sample, trial) -> IntervalFamily`` (or a dict key -> IntervalFamily, every key calibrated from
        the same draws) for a list of units (a unit may appear more than once: it counts as that many units);
        ``trial`` is the draw's number (-1 for all the units), for a compute whose inner bootstrap seeds by draw.
    units : sequence, or dict of group -> sequence
        The run's units; a dict: each group drawn at its own count, the draw passed as one list (the groups in
        order), or with ``paired`` one draw of positions shared by every group (a dict of group -> list passed).
    paired : bool
        Draw the same positions in every group (groups of one count: the same windows at every n).
    former_draws : int, optional
        The draws of the former coverage estimate (its rule: below 90%, no verdict); at least that many are drawn.
    target, level, batch, min_draws, max_draws, seed
        As :data:`CALIBRATION` describes.

    Returns
    -------
    Calibrated, or dict key -> Calibrated

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.stats.calibration import IntervalFamily
    >>> values = list(np.random.default_rng(0).lognormal(size=12))
    >>> found = calibrate(lambda sample, trial: IntervalFamily.student(sample), values)
    >>> found.reason is None and found.level >= 0.95 and found.low <= found.nominal_low
    True
    >>> found.calibration.high - found.calibration.low <= 0.04
    True
    """
    groups = {g: list(u) for g, u in units.items()} if isinstance(units, dict) else {None: list(units)}
    if not groups or not all(groups.values()):
        raise ValueError("`units` must hold at least one unit in every group; got none.")
    everything = dict(groups) if paired else [unit for members in groups.values() for unit in members]
    single = False
    whole = compute(everything, -1)
    if not isinstance(whole, dict):
        whole, single = {None: whole}, True
    truth = {key: family.estimate for key, family in whole.items()}
    count = min(len(members) for members in groups.values())
    rng = np.random.default_rng(seed)
    roots = {key: [] for key in whole}
    held = {key: [] for key in whole}
    floor = max(int(min_draws), int(former_draws or 0))
    trial = 0
    while trial < max_draws:
        if paired:
            picks = rng.integers(0, count, size=count)
            sample = {g: [members[i] for i in picks] for g, members in groups.items()}
        else:
            sample = [members[i] for members in groups.values() for i in rng.integers(0, len(members),
                                                                                     size=len(members))]
        found = compute(sample, trial)
        found = {None: found} if single else found
        for key in whole:
            family = found[key]
            low, high = family.interval(level)
            held[key].append(bool(low <= truth[key] <= high))  # NaN bounds (no interval) hold nothing
            roots[key].append(family.position(truth[key]))
        trial += 1
        if trial >= floor and trial % batch == 0 and all(_calibration.settled(h) for h in held.values()):
            break
    out = {key: _calibrated(whole[key], np.asarray(roots[key], dtype=float), np.asarray(held[key]), former_draws,
                            target, level, count) for key in whole}
    return out[None] if single else out


def _calibrated(family, roots, held, former_draws, target, level, units) -> Calibrated:
    found = _calibration.calibration(roots, held, target=target, level=level)
    (low, high), reason = _calibration.calibrated_bounds(family, found)
    nominal_low, nominal_high = family.interval(level)
    former = None
    if former_draws:
        rate = float(held[:former_draws].mean())
        former = Measured(rate, *wilson_bounds(rate, int(former_draws), 0.95), units, int(former_draws),
                          family.estimate)
    return Calibrated(family.estimate, low, high, math.nan if reason else found.level, nominal_low, nominal_high,
                      found, reason, former, family, np.sort(roots))


def former_verdict(claim, calibrated: Calibrated, *, power: float = math.nan, units: int | None = None,
                   paper: float | None = None) -> str:
    """The verdict the former rule gave: the declared 95% interval judged, withheld where the coverage of the first
    ``former_draws`` draws was below 90% (``"no verdict: coverage 88.5% < 90%"``)."""
    from .claims import judge

    verdict = judge(claim, calibrated.nominal_low, calibrated.nominal_high, power=power, units=units, paper=paper)
    if units is not None and units < max(2, claim.min_units or 2):
        return verdict
    return gate(claim, verdict, calibrated.former)


def calibrated_columns(calibrated: Calibrated | None, threshold: float | None = None) -> dict:
    """The :data:`CALIBRATED_COLUMNS` of one claim instance (NaN and "" where there is none), and with a
    ``threshold`` its calibrated p-value ``p`` (:meth:`Calibrated.p_value`)."""
    extra = {} if threshold is None else {"p": math.nan if calibrated is None else calibrated.p_value(threshold)}
    if calibrated is None:
        return {"nominal_low": math.nan, "nominal_high": math.nan, "calibrated_level": math.nan,
                "coverage": math.nan, "coverage_low": math.nan, "coverage_high": math.nan, "coverage_draws": 0,
                "calibration": "no interval", **extra}
    found = calibrated.calibration
    return {"nominal_low": calibrated.nominal_low, "nominal_high": calibrated.nominal_high,
            "calibrated_level": calibrated.level, "coverage": found.coverage, "coverage_low": found.low,
            "coverage_high": found.high, "coverage_draws": found.draws, "calibration": calibrated.reason or "",
            **extra}


def coverage_cell(row) -> str:
    """``"88.5% [86.4, 90.4]"``: the declared interval's coverage on the run's own units with its Monte-Carlo
    (Wilson 95%) interval, from a row with :data:`CALIBRATED_COLUMNS` ("" where none)."""
    coverage = row.get("coverage", math.nan)
    if coverage is None or not np.isfinite(float(coverage)):
        return ""
    return f"{float(coverage):.1%} [{100 * float(row['coverage_low']):.1f}, {100 * float(row['coverage_high']):.1f}]"


def level_cell(row) -> str:
    """``"97.3%"``: the calibrated nominal level of a row with :data:`CALIBRATED_COLUMNS` ("" where none)."""
    level = row.get("calibrated_level", math.nan)
    return "" if level is None or not np.isfinite(float(level)) else f"{float(level):.1%}"


def calibration_lines(what: str = "claims") -> list[str]:
    """The summary's paragraph on how the verdicts' intervals are calibrated."""
    return [f"**Calibrated intervals.** The verdicts on these {what} are read from calibrated intervals, not from a "
            "coverage gate: the run's own units taken as the population, each draw of as many units (with "
            "replacement) recomputes the claim's interval, and records whether its declared 95% interval holds the "
            "statistic on all units (the coverage, shown with its Monte-Carlo Wilson 95% interval) and the one-sided "
            "level at which its bounds reach that value. The calibrated interval lies between the 2.5% and 97.5% "
            "points of those levels (iterated-bootstrap calibration: Hall 1986, Beran 1987, Hall and Martin 1988), "
            "never narrower than the declared one; its nominal level is shown beside it. Draws continue in batches "
            f"of {CALIBRATION['batch']} until the coverage is known to +-2 points (at most "
            f"{CALIBRATION['max_draws']:,} draws). No verdict only where calibration fails (too many draws without "
            "an interval, an unbounded or a zero-width interval), with the reason."]


def interval_cell(low, high) -> str:
    """``"[0.612, 0.845]"`` (4 significant digits), or ``"-"`` where a bound is missing."""
    if low is None or high is None or not (np.isfinite(float(low)) and np.isfinite(float(high))):
        return "-"
    return f"[{float(low):.4g}, {float(high):.4g}]"


def key_cell(value):
    """A key column's value as a summary table shows it: ``"-"`` where the key does not apply to the row (NaN,
    e.g. the decoder's depth for a claim measured at every depth), the value itself otherwise.

    >>> key_cell(float("nan")), key_cell(15), key_cell("layer 0")
    ('-', 15, 'layer 0')
    """
    return "-" if isinstance(value, float) and not np.isfinite(value) else value


def calibration_table(table, key, *, verdict: str = "verdict", former: str | None = "former_verdict") -> list[str]:
    """A summary's table of the calibration behind each verdict: the ``key`` columns, the declared 95% interval,
    its coverage on the run's own units with the Monte-Carlo interval and the draws, the calibrated level and
    interval (``ci_low``, ``ci_high``), the ``verdict`` and (where given) the ``former`` one (``table`` has
    :data:`CALIBRATED_COLUMNS`)."""
    if table is None or not len(table):
        return ["No claim instance to calibrate."]
    rows = []
    for _, row in table.iterrows():
        rows.append({**{k: key_cell(row[k]) for k in key},
                     "95% interval": interval_cell(row["nominal_low"], row["nominal_high"]),
                     "coverage [MC 95%]": coverage_cell(row) or "-",
                     "draws": int(row["coverage_draws"]) if np.isfinite(float(row["coverage_draws"])) else 0,
                     "calibrated level": level_cell(row) or "-",
                     "calibrated interval": interval_cell(row["ci_low"], row["ci_high"]),
                     "verdict": row[verdict], **({"former verdict": row[former]} if former else {})})
    return markdown_table(pd.DataFrame(rows), default=str)


def in_short_lines(reproduces, fails, open_, *, notes=()) -> list[str]:
    """A summary's "In short" section, first in it: what reproduces, what does not and what this run cannot tell,
    each a list of short phrases (claim instances with their verdict), in plain words; ``notes``: further lines."""
    def joined(items):
        items = list(items)
        return "; ".join(items) if items else "nothing"

    return ["## In short", "",
            f"- **Reproduces ({len(list(reproduces))}):** {joined(reproduces)}.",
            f"- **Does not reproduce ({len(list(fails))}):** {joined(fails)}.",
            f"- **Cannot be told from this run ({len(list(open_))}):** {joined(open_)}.",
            *[f"- {note}" for note in notes], ""]


def holm_lines(table: pd.DataFrame, key, *, family, decided, level: float = 0.95) -> list[str]:
    """A summary's multiplicity table: each claim instance's calibrated p-value (column ``p``), Holm's adjustment
    within its ``family`` (a column or list of columns; :func:`approxlab.studies.reporting.measured.holm_column`),
    and its verdict beside the one that stands with Holm (a verdict whose adjusted p-value is not below
    ``1 - level`` reads "not decided with Holm"). ``decided``: the verdict words that decide (reproduced / not
    reproduced, in the claim's words)."""
    if table is None or not len(table) or "p" not in table:
        return []
    table = holm_column(table, family=family, p="p", level=level)
    rows = [{**{k: key_cell(row[k]) for k in key}, "verdict": row["verdict"],
             "p": "" if not np.isfinite(float(row["p"])) else f"{float(row['p']):.3g}",
             "p (Holm)": "" if not np.isfinite(float(row["p_holm"])) else f"{float(row['p_holm']):.3g}",
             "verdict with Holm": row["verdict"] if row["verdict"] not in decided or row["holm_decided"]
             else "not decided with Holm"} for _, row in table.iterrows()]
    families = table[family].astype(str).drop_duplicates() if isinstance(family, str) else \
        table[list(family)].astype(str).drop_duplicates()
    kept = sum(1 for r in rows if r["verdict"] in decided and r["verdict with Holm"] == r["verdict"])
    total = sum(1 for r in rows if r["verdict"] in decided)
    return [f"**Multiplicity.** The verdicts above are per comparison ({1 - level:.0%} each). Holm's adjustment within "
            f"each claim family ({len(families)} famil{'y' if len(families) == 1 else 'ies'}) on the calibrated "
            "p-values (the test each calibrated interval inverts: `Calibrated.p_value`): "
            f"{kept} of the {total} decided verdicts stand with it.", "",
            *markdown_table(pd.DataFrame(rows), default=str), ""]
