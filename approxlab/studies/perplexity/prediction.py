r"""Which measure predicts the loss of a method never seen: leave-one-method-out prediction, and how the
method-level interval of (p1) behaves (its coverage, and its width against the number of methods).

**Prediction.** For each measure of :data:`.claims.MEASURES` and each method, an isotonic (non-decreasing)
fit of :math:`\log_{10}\max(\Delta, \text{floor})` on the measure over the other methods' points (method x d,
window means; :func:`scipy.optimize.isotonic_regression`, a monotone map: no functional form assumed) predicts
the held-out method's points by interpolation; its error is the mean absolute error in decades. Per measure:
the mean over methods [95% interval, methods resampled], and its difference from the spectral error's, paired
over the same methods.

**Coverage** of the two-level interval at this run's units, measured on the run's own data
(:func:`coverage`): the run is taken as the population, its estimate as the truth; a data set is drawn from it
as the run was (methods with replacement, windows within), the interval computed on that, and the share of
draws whose interval holds the truth is the coverage (a double bootstrap: P. Hall, *The Bootstrap and Edgeworth
Expansion*, 1992, Section 3.11). Drawn with more methods than the run has, the same measurement sizes the methods
a claim would need (:mod:`.gating`).

**Width against methods** (:func:`narrowing`): the (p1) interval's mean width on random subsets of 5, 10 and
all methods.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from ...stats.verdicts import wilson_bounds
from ..reporting.measured import Measured
from . import resampling
from .claims import MEASURES, RESAMPLING

__all__ = ["COVERAGE_TRIALS", "leave_one_method_out", "coverage", "narrowing"]

COVERAGE_TRIALS = {"trials": 100, "resamples": 200, "subsets": 10, "seed": 1}
"""The double bootstrap of :func:`coverage` and :func:`narrowing`: 100 outer draws (the coverage to about +-4%)
of 200 inner resamples."""


def _points(cells: pd.DataFrame, measure: str, floor: float) -> pd.DataFrame:
    finite = cells[np.isfinite(cells[measure])]
    means = finite.groupby(["method", "budget"])[[measure, "delta"]].mean().reset_index()
    means["target"] = np.log10(np.maximum(means["delta"], max(floor, 1e-12)))
    return means.rename(columns={measure: "x"})


def _held_out(points: pd.DataFrame) -> dict:
    """Per method: the mean absolute error (decades) of the isotonic fit on the other methods."""
    errors = {}
    for method in points["method"].unique():
        train, test = points[points["method"] != method], points[points["method"] == method]
        if train["method"].nunique() < 2:
            continue
        ordered = train.sort_values("x")
        fitted = isotonic_regression(ordered["target"].to_numpy(float)).x
        x = np.log(np.maximum(ordered["x"].to_numpy(float), 1e-300))
        predicted = np.interp(np.log(np.maximum(test["x"].to_numpy(float), 1e-300)), x, fitted)
        errors[method] = float(np.mean(np.abs(predicted - test["target"].to_numpy(float))))
    return errors


def leave_one_method_out(cells: pd.DataFrame, floor: float, setting: str, layers: str) -> list[dict]:
    """Rows of ``prediction.csv``: per measure, the held-out error (mean over methods, decades of Delta) [95%
    interval, methods resampled] and its paired difference from the spectral error's."""
    errors = {m: _held_out(_points(cells, m, floor)) for m in MEASURES}
    rng = np.random.default_rng(RESAMPLING["seed"])
    rows = []
    for measure in MEASURES:
        found = errors[measure]
        methods = sorted(found)
        if len(methods) < 2:
            continue
        mine = np.array([found[m] for m in methods])
        common = [m for m in methods if m in errors["spectral"]]
        difference = np.array([found[m] - errors["spectral"][m] for m in common])
        draws = rng.integers(0, len(methods), (RESAMPLING["resamples"], len(methods)))
        low, high = resampling.percentile(float(mine.mean()), mine[draws].mean(axis=1), RESAMPLING["level"])
        draws = rng.integers(0, len(common), (RESAMPLING["resamples"], len(common)))
        d_low, d_high = (resampling.percentile(float(difference.mean()), difference[draws].mean(axis=1),
                                               RESAMPLING["level"]) if len(common) > 1 else (np.nan, np.nan))
        rows.append({"setting": setting, "layers": layers, "measure": measure, "methods": len(methods),
                     "held_out_error": float(mine.mean()), "ci_low": low, "ci_high": high,
                     "minus_spectral": float(difference.mean()) if len(common) else np.nan,
                     "minus_spectral_low": d_low, "minus_spectral_high": d_high})
    return rows


def _interval(cells: pd.DataFrame, statistic, resamples: int, seed: int) -> tuple:
    estimate, values, _ = resampling.two_level(cells, {"s": statistic}, columns=MEASURES, resamples=resamples,
                                               seed=seed)["s"]
    return (estimate, *resampling.percentile(estimate, values, RESAMPLING["level"]))


def _draw(cells: pd.DataFrame, index: list, rng, methods: int | None = None) -> pd.DataFrame:
    """A data set drawn from the run as the run was drawn: ``methods`` methods (default: as many as the run has)
    with replacement (a copy is a new method), then each drawn method's windows with replacement (``index``: per
    method, its windows' row positions)."""
    rows, copies, windows = [], [], []
    for copy, m in enumerate(rng.integers(0, len(index), len(index) if methods is None else int(methods))):
        for slot, w in enumerate(rng.integers(0, len(index[m]), len(index[m]))):
            block = index[m][w]
            rows.append(block)
            copies.append(np.full(len(block), copy))
            windows.append(np.full(len(block), slot))
    drawn = cells.iloc[np.concatenate(rows)].reset_index(drop=True)
    return drawn.assign(method=np.concatenate(copies), window=np.concatenate(windows))


def coverage(cells: pd.DataFrame, statistics: dict, *, columns=MEASURES, methods: int | None = None,
             trials: int | None = None, resamples: int | None = None) -> dict:
    """``{name: Measured}``: the share of data sets drawn from the run (:func:`_draw`, ``methods`` methods each,
    default the run's) whose two-level interval holds the run's estimate, over the draws whose interval exists
    (``trials`` of them drawn, ``resamples`` each: default :data:`COVERAGE_TRIALS`), with its Wilson 95% interval;
    None below 3 methods or 2 windows, or where no draw gave an interval. ``columns``: the columns the statistics
    read besides ``budget`` and ``delta``."""
    if cells["method"].nunique() < 3 or cells["window"].nunique() < 2:
        return {name: None for name in statistics}
    trials = COVERAGE_TRIALS["trials"] if trials is None else int(trials)
    resamples = COVERAGE_TRIALS["resamples"] if resamples is None else int(resamples)
    cells = cells.reset_index(drop=True)
    truth = {name: value[0] for name, value in
             resampling.two_level(cells, statistics, columns=columns, resamples=0, seed=0).items()}
    rng = np.random.default_rng(COVERAGE_TRIALS["seed"])
    held = {name: [] for name in statistics}
    index = resampling.window_index(cells)
    for t in range(trials):
        drawn = _draw(cells, index, rng, methods)
        found = resampling.two_level(drawn, statistics, columns=columns, resamples=resamples, seed=t)
        for name, (estimate, values, _) in found.items():
            low, high = resampling.percentile(estimate, values, RESAMPLING["level"])
            if np.isfinite(low) and np.isfinite(truth[name]):  # equal up to rounding holds (a rho of 1, [1, 1])
                slack = 1e-12 * max(1.0, abs(truth[name]))
                held[name].append(low - slack <= truth[name] <= high + slack)
    out = {}
    for name, values in held.items():
        if not values:
            out[name] = None
            continue
        rate = float(np.mean(values))
        low, high = wilson_bounds(rate, len(values), 0.95)
        out[name] = Measured(rate, float(low), float(high), int(methods or len(index)), len(values),
                             float(truth[name]))
    return out


def narrowing(cells: pd.DataFrame, sizes=(5, 10)) -> list[dict]:
    """The (p1) interval's mean width on random subsets of ``sizes`` methods (and on all of them)."""
    methods = sorted(set(cells["method"]))
    rng = np.random.default_rng(COVERAGE_TRIALS["seed"])
    rows = []
    for size in [s for s in sizes if s < len(methods)] + [len(methods)]:
        subsets = 1 if size == len(methods) else COVERAGE_TRIALS["subsets"]
        widths = []
        for i in range(subsets):
            chosen = methods if size == len(methods) else list(rng.choice(methods, size, replace=False))
            _, low, high = _interval(cells[cells["method"].isin(chosen)], resampling.across("spectral"),
                                     COVERAGE_TRIALS["resamples"], i)
            widths.append(high - low)
        rows.append({"methods": size, "label": "all" if size == len(methods) else str(size), "subsets": subsets,
                     "mean_width": float(np.nanmean(widths))
                     if np.isfinite(widths).any() else np.nan})
    return rows
