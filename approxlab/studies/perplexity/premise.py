r"""The premise's claims (:mod:`.premise_claims`) judged on the saved tables, with calibrated intervals.

Per setting and kind of error (clean, drifting), every statistic of :func:`statistics` is evaluated on the same
crossed draws (methods and windows, :mod:`.strata`); :func:`calibrate_setting` calibrates them together on the
run's own methods and windows (:func:`approxlab.studies.reporting.calibrated.calibrate`: each outer draw a data
set of as many methods and windows as the run's, its inner bootstrap of :data:`.premise_claims.INNER` resamples).
:func:`premise_tables` gives ``premise.csv`` (every claim instance: its estimate, calibrated interval, coverage
with its Monte-Carlo interval, calibrated p, Holm within its family, the committed run's verdict beside),
``premise_rho.csv`` (rho at each unit: cells, window means, within windows) and ``premise_loss.csv`` (no
measurable loss, by the stated rule, at both floors).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting import calibrated as calibration
from ..reporting import claims as engine
from ..reporting.measured import holm_column
from . import judging, strata
from .strata import calibrate_setting
from .cells import PATCHED
from .claims import MIN_BUDGETS, MIN_METHODS
from .premise_claims import (BUDGET, CONFIGS, DEPTH, DIFFERENCE, MEASURES, MIN_CONFIGS, OUTPUT_AWARE,
                             OUTPUT_AWARE_CLAIM, PAIRED, PARTIAL, PRACTICAL_FLOOR, PRIMARY, RHO, SECONDARY)
from .premise_data import Points, single_layer
from .resampling import spearman

__all__ = ["PREMISE_COLUMNS", "UNDEFINED", "AS_BUDGET", "LOSS", "SAME", "SAME_TOLERANCE", "as_budget_strata",
           "statistics", "calibrate_setting",
           "setting_rows", "depth_rows", "config_rows", "output_aware_rows", "unit_rows", "loss_rows", "with_holm",
           "noise_floor_of"]

PREMISE_COLUMNS = ["claim", "setting", "layers", "kind", "measure", "num_features", "estimate", "ci_low", "ci_high",
                   "threshold", "verdict", "methods", "windows", "points", *calibration.CALIBRATED_COLUMNS, "p",
                   "family", "p_holm", "holm_decided"]
"""``premise.csv``: ``ci_low``, ``ci_high`` the calibrated interval (``nominal_low``, ``nominal_high`` the declared
95% one); ``p`` the calibrated test of the threshold, ``p_holm`` Holm's adjustment within ``family`` (claim and
kind of error), ``holm_decided`` whether the verdict stands with it."""


def _within_stats(points: Points, kind: str) -> tuple[np.ndarray, np.ndarray, int]:
    """``(paired differences (methods, windows), partial sums (methods, windows, 3), methods)`` over the methods
    with at least :data:`.claims.MIN_BUDGETS` budgets."""
    shape = (len(points.methods), len(points.windows))
    difference, sums = np.full(shape, np.nan), np.full((*shape, 3), np.nan)
    eligible = points.cells.groupby("method")["budget"].nunique()
    for (m, k), (budget, x, y) in points.strata(kind, "spectral").items():
        if eligible[points.methods[m]] >= MIN_BUDGETS and len(budget) >= MIN_BUDGETS:
            difference[m, k] = strata.paired_difference(x, budget, y)
            sums[m, k] = strata.partial_sums(x, budget, y)
    return difference, sums, int((eligible >= MIN_BUDGETS).sum())


def statistics(points: Points, kind: str) -> dict:
    """``{(claim id, measure, d): (statistic(c, w) -> (resamples,), methods)}`` of one setting and kind."""
    spectral = strata.WithinWindows(*points.arrays(kind, "spectral"))
    out = {("p1", "spectral", -1): (spectral.mean, len(points.methods))}
    for budget in sorted(set(points.cells["budget"])):
        x, y, index = points.arrays(kind, "spectral", budget)
        out[("p1d", "spectral", int(budget))] = (strata.WithinWindows(x, y, index).mean, len(set(index)))
    x0, y0, index0 = points.arrays(kind, "spectral")
    for measure in MEASURES:
        x, y, index = points.arrays(kind, measure)
        if np.isfinite(x).sum() < 3:
            continue
        mine = strata.WithinWindows(x, y, index)
        base = spectral if (np.isfinite(x) == np.isfinite(x0)).all() else strata.WithinWindows(
            np.where(np.isfinite(x), x0, np.nan), y0, index0)  # the spectral error on the points the measure has
        used = len(set(index[np.isfinite(x).any(axis=0)]))
        out[("p2", measure, -1)] = ((lambda c, w, a=mine, b=base: a.mean(c, w) - b.mean(c, w)), used)
    difference, sums, eligible = _within_stats(points, kind)
    out[("pw", "spectral", -1)] = ((lambda c, w: strata.stratum_mean(difference, c, w)), eligible)
    out[("pp", "spectral", -1)] = ((lambda c, w: strata.partial_correlation(sums, c, w)), eligible)
    return out


def _row(claim, setting, layers, kind, measure, budget, found, *, methods, windows, points, reason=None,
         estimate=np.nan, as_budget=None) -> dict:
    """One row of ``premise.csv`` (``estimate``: the statistic where no interval was drawn, too few units;
    ``as_budget``: for (pw) and (pp), the (method, window) strata whose error ranks the budgets as d does, and all: where
    some do and too many draws give no interval, the verdict says so, :func:`_as_budget`)."""
    if reason:
        verdict, columns = f"not run: {reason}", calibration.calibrated_columns(None, claim.threshold)
    elif as_budget is not None and as_budget[0] > 0 and found is not None and np.isfinite(found.estimate) \
            and _undefined_draws(found):
        verdict, columns = _as_budget(claim, found, *as_budget), calibration.calibrated_columns(found, claim.threshold)
    elif found is not None and not np.isfinite(found.estimate):
        verdict = f"no verdict: undefined on the run ({UNDEFINED.get(claim.id, 'a side is constant')})"
        columns = calibration.calibrated_columns(found, claim.threshold)
    else:
        verdict = engine.judge(claim, np.nan if found is None else found.low, np.nan if found is None else found.high,
                               units=methods if claim.unit == "method" else windows, calibrated=found)
        columns = calibration.calibrated_columns(found, claim.threshold)
    return {"claim": claim.id, "setting": setting, "layers": layers, "kind": kind, "measure": measure,
            "num_features": budget, "estimate": estimate if found is None else found.estimate,
            "ci_low": np.nan if found is None else found.low, "ci_high": np.nan if found is None else found.high,
            "threshold": claim.threshold, "verdict": verdict, "methods": methods, "windows": windows,
            "points": points, **columns, "family": f"{claim.id} ({kind})"}


AS_BUDGET = "the error ranks the budgets exactly as the budget does"
"""The start of a (pw) or (pp) verdict whose draws are too often undefined or constant for an interval: what the
data say there, in place of a failed calibration (:func:`_as_budget`)."""


def _undefined_draws(found) -> bool:
    """Whether calibration failed because too many outer draws gave no interval (NaN roots)."""
    return found.reason is not None and bool(np.isnan(found.roots).any()) and "give no interval" in found.reason


def _as_budget(claim, found, strata_as_budget: int, strata: int) -> str:
    r"""A (pw) or (pp) verdict where the draws without an interval are too many: in their resamples every drawn
    (method, window) stratum has its error in the budget's order (the paired difference is 0 in each, a constant;
    the error's residual given d vanishes, the partial correlation undefined), so the error says nothing beyond d
    there; the share of such draws and of such strata on the run are stated in place of a failed calibration.

    Examples
    --------
    >>> import types, numpy as np
    >>> found = types.SimpleNamespace(roots=np.array([0.1, np.nan, np.nan, 0.7]), calibration=types.SimpleNamespace(
    ...     draws=4))
    >>> _as_budget(PARTIAL, found, 30, 40)
    "the error ranks the budgets exactly as the budget does: 50.0% of 4 draws give no interval (pp undefined or constant in their resamples, each stratum drawn in d's order); on the run in 30 of 40 method x window strata"
    """
    share = float(np.isnan(found.roots).mean())
    return (f"{AS_BUDGET}: {share:.1%} of {found.calibration.draws:,} draws give no interval ({claim.id} undefined "
            f"or constant in their resamples, each stratum drawn in d's order); on the run in {strata_as_budget} of "
            f"{strata} method x window strata")


def as_budget_strata(points: Points, kind: str) -> tuple[int, int]:
    """``(strata whose error ranks the budgets exactly as 1/d does, strata)`` over the (method, window) strata that
    (pw) and (pp) use: at least :data:`.claims.MIN_BUDGETS` budgets, the error and the loss measured at each."""
    eligible = points.cells.groupby("method")["budget"].nunique()
    found = [np.array_equal(strata.ranks_over(x), strata.ranks_over(1.0 / np.asarray(budget, float)))
             for (m, _), (budget, x, y) in points.strata(kind, "spectral").items()
             if eligible[points.methods[m]] >= MIN_BUDGETS and len(budget) >= MIN_BUDGETS
             and np.isfinite(np.asarray(x, float)).all() and np.isfinite(np.asarray(y, float)).all()]
    return int(sum(found)), len(found)


UNDEFINED = {"pp": "the error or the loss orders every method's budgets as d does: no residual given d",
             "pw": "no method has a defined rho over its budgets in any window"}
"""Why a statistic can be undefined on the run itself (then no verdict, and the reason)."""

_CLAIMS = {"p1": RHO, "p1d": BUDGET, "p2": DIFFERENCE, "pw": PAIRED, "pp": PARTIAL}


def setting_rows(setting, layers, points: Points) -> list[dict]:
    """Every claim instance of one setting, per kind of error (clean: not run where it was not measured)."""
    rows = []
    windows, count = len(points.windows), len(points.cells)
    kinds = points.kinds if PRIMARY in points.kinds else (PRIMARY, *points.kinds)
    for kind in kinds:
        if kind not in points.kinds:
            rows += [_row(claim, setting, layers, kind, "spectral", -1, None, methods=0, windows=0, points=0,
                          reason="clean_errors.csv holds no clean-input error for this setting")
                     for claim in (RHO, PAIRED, PARTIAL)]
            continue
        found = statistics(points, kind)
        judged = {key: f for key, (f, units) in found.items() if units >= MIN_METHODS}
        calibrated = calibrate_setting(judged, len(points.methods), windows)
        ones = np.ones((1, len(points.methods))), np.ones((1, windows))
        ordered = as_budget_strata(points, kind)
        for key, (f, units) in found.items():
            claim, measure, budget = _CLAIMS[key[0]], key[1], key[2]
            rows.append(_row(claim, setting, layers, kind, measure, budget, calibrated.get(key), methods=units,
                             windows=windows, points=count, estimate=float(f(*ones)[0]),
                             as_budget=ordered if key[0] in ("pw", "pp") else None))
    return rows


def depth_rows(settings: dict) -> list[dict]:
    """(p1-depths): the stratified rho over (depth, window) strata of the single-layer settings (methods and
    windows drawn as one: the same method multiplicity at every depth)."""
    depths = {layers: points for (setting, layers), points in settings.items() if single_layer(layers)}
    if len(depths) < 2:
        return [_row(DEPTH, "whole", "-", PRIMARY, "spectral", -1, None, methods=0, windows=0, points=0,
                     reason=f"{len(depths)} single-layer depth(s) in {PATCHED}; pooling needs at least 2")]
    methods = sorted(set().union(*(p.methods for p in depths.values())))
    windows = sorted(set().union(*(p.windows for p in depths.values())))
    parts = []
    for points in depths.values():
        x, y, index = points.arrays(PRIMARY, "spectral")
        rows = [points.windows.index(k) if k in points.windows else None for k in windows]
        pad = np.full((len(windows), x.shape[1]), np.nan)
        x_all, y_all = pad.copy(), pad.copy()
        for i, r in enumerate(rows):
            if r is not None:
                x_all[i], y_all[i] = x[r], y[r]
        global_index = np.array([methods.index(points.methods[i]) for i in index], dtype=int)
        parts.append(strata.WithinWindows(x_all, y_all, global_index))

    def pooled(c, w):
        return strata.weighted_mean(np.concatenate([p.values(c) for p in parts], axis=1),
                                    np.tile(np.atleast_2d(w), len(parts)))

    found = calibrate_setting({"depths": pooled}, len(methods), len(windows))["depths"]
    return [_row(DEPTH, "whole", ", ".join(depths), PRIMARY, "spectral", -1, found, methods=len(methods),
                 windows=len(windows), points=int(sum(len(p.cells) for p in depths.values())))]


def config_rows(configs: pd.DataFrame, baseline: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """(pc) on ``configs.csv``: ``(verdict rows, per-method rho rows)``; "not run" without the table."""
    if configs.empty:
        return [_row(CONFIGS, "kv-cache", "all", PRIMARY, "spectral", -1, None, methods=0, windows=0, points=0,
                     reason="configs.csv holds no rows")], []
    base = baseline[baseline["setting"] == "kv-cache"].set_index("window")["nll"]
    ok = configs[configs["status"] == "ok"] if "status" in configs else configs
    ok = ok.assign(delta=ok["nll"].to_numpy(float) - base.reindex(ok["window"]).to_numpy(float))
    budget = int(ok["num_features"].iloc[0]) if "num_features" in ok and len(ok) else -1
    counts = ok.groupby("method")["config"].nunique()
    methods = sorted(counts[counts >= MIN_CONFIGS].index)
    windows = sorted(set(ok["window"]))
    rows, per_method = [], []
    for kind, column in ((PRIMARY, "clean_spectral_median"), (SECONDARY, "spectral_median")):
        if column not in ok or not methods:
            continue
        values = np.full((len(methods), len(windows)), np.nan)
        for (method, window), group in ok[ok["method"].isin(methods)].groupby(["method", "window"]):
            values[methods.index(method), windows.index(window)] = spearman(group[column], group["delta"])
        per_method += [{"setting": "kv-cache", "layers": "all", "kind": kind, "measure": "spectral",
                        "unit": f"configurations of {m}", "rho": float(np.nanmean(values[i]))
                        if np.isfinite(values[i]).any() else np.nan, "methods": 1, "windows": len(windows),
                        "points": int((ok["method"] == m).sum())} for i, m in enumerate(methods)]
        found = strata.calibrate_windows(values)
        rows.append(_row(CONFIGS, "kv-cache", "all", kind, "spectral", budget, found, methods=len(methods),
                         windows=len(windows), points=int(ok["method"].isin(methods).sum())))
    if not rows:
        rows.append(_row(CONFIGS, "kv-cache", "all", PRIMARY, "spectral", budget, None, methods=len(methods),
                         windows=len(windows), points=len(ok), reason=f"no method with {MIN_CONFIGS} configurations "
                         "and a clean error"))
    return rows, per_method


LOSS = "loss"
"""The ``kind`` of a claim on the losses alone ((po): no error enters its statistic)."""
SAME = "the same losses in every window (the same kept tokens at this budget)"
"""The verdict of a (po) instance whose pairs' two policies lose the same in every window, within
:data:`SAME_TOLERANCE` (CriticalKV's first stage is SnapKV's observation window of 32 tokens, so at b <= 32 both keep
the window alone); such a pair is left out of the pooled statistic."""
SAME_TOLERANCE = 1e-4
"""Nats per token: two policies whose Delta differ by at most this in every window keep the same tokens (gathered in
another order, their attention sums round differently over the 30 layers, far below this), declared before the
full run."""


def output_aware_rows(frame: pd.DataFrame) -> list[dict]:
    """(po) on the KV-cache rows of ``frame`` (:func:`.stats.deltas`' table): per budget d where every pair of
    :data:`.premise_claims.OUTPUT_AWARE` ran, the mean over pairs and windows of Delta(base) - Delta(output-aware)
    (``measure`` "pooled") and each pair's alone (``measure`` "criticalkv - snapkv", ...), windows resampled, the
    interval calibrated (:func:`.strata.calibrate_windows`); "not run" while a policy of a pair has no ok row; a pair
    whose policies lose the same in every window at a budget is said so (:data:`SAME`) and left out of the pool."""
    kv = frame[(frame["setting"] == "kv-cache") & frame["ok"]]
    pairs = list(OUTPUT_AWARE.items())
    missing = [m for m in dict.fromkeys(m for pair in pairs for m in pair) if m not in set(kv["method"])]
    if missing:
        return [_row(OUTPUT_AWARE_CLAIM, "kv-cache", "all", LOSS, "pooled", -1, None, methods=0, windows=0, points=0,
                     reason=f"{PATCHED} holds no KV-cache rows of {', '.join(missing)}")]
    rows = []
    for budget, at in kv.groupby("num_features", sort=True):
        delta = at.pivot_table(index="window", columns="method", values="delta", aggfunc="mean")
        if not all(m in delta for pair in pairs for m in pair):
            continue
        values = np.stack([(delta[base] - delta[aware]).to_numpy(float) for aware, base in pairs])
        values = values[:, np.isfinite(values).all(axis=0)]  # the windows where every pair ran
        same = (np.abs(values) <= SAME_TOLERANCE).all(axis=1)  # the same kept tokens: named, not counted
        parts = [("pooled", values[~same], ", ".join(f"{a} = {b}" for (a, b), s in zip(pairs, same) if s))]
        parts += [(f"{a} - {b}", values[i:i + 1], f"{a} = {b}" if same[i] else "") for i, (a, b) in enumerate(pairs)]
        for measure, chosen, equal in parts:
            if not len(chosen) or (measure != "pooled" and equal):
                shown = chosen if len(chosen) else values  # the mean difference, within the tolerance
                rows.append({**_row(OUTPUT_AWARE_CLAIM, "kv-cache", "all", LOSS, measure, int(budget), None,
                                    methods=0, windows=values.shape[1], points=0, estimate=float(shown.mean())),
                             "verdict": f"{SAME}: {equal}"})
                continue
            found = strata.calibrate_windows(chosen)
            rows.append(_row(OUTPUT_AWARE_CLAIM, "kv-cache", "all", LOSS, measure, int(budget), found,
                             methods=len(chosen), windows=chosen.shape[1], points=2 * chosen.size,
                             estimate=float(chosen.mean()) if chosen.size else np.nan))
    return rows or [_row(OUTPUT_AWARE_CLAIM, "kv-cache", "all", LOSS, "pooled", -1, None, methods=0, windows=0,
                         points=0, reason="no budget at which every policy of a pair ran")]


def unit_rows(setting, layers, points: Points) -> list[dict]:
    """``premise_rho.csv``: the spectral error's rho at three units -- every cell, the window means of each point,
    within windows (stratified) -- per kind of error."""
    rows = []
    for kind in points.kinds:
        column = f"{kind} spectral"
        finite = points.cells[np.isfinite(points.cells[column])]
        means = finite.groupby(["method", "budget"])[[column, "delta"]].mean()
        x, y, index = points.arrays(kind, "spectral")
        within = strata.WithinWindows(x, y, index)
        common = {"setting": setting, "layers": layers, "kind": kind, "measure": "spectral",
                  "methods": len(points.methods), "windows": len(points.windows), "points": len(finite)}
        rows += [{**common, "unit": "cells", "rho": spearman(finite[column], finite["delta"])},
                 {**common, "unit": "window means", "rho": spearman(means[column], means["delta"])},
                 {**common, "unit": "within windows",
                  "rho": float(within.mean(np.ones((1, len(points.methods))), np.ones((1, len(points.windows))))[0])}]
    return rows


def loss_rows(setting, layers, points: Points, delta: pd.DataFrame, floor: float) -> dict:
    """``premise_loss.csv``'s row of one setting: the points with no measurable loss (:data:`.premise_claims.NO_LOSS`
    at the kernel ``floor``), with no loss that matters (:data:`.premise_claims.PRACTICAL_FLOOR`), and the cells
    whose Delta equals another cell's of the same window (ties)."""
    table = points.table.assign(num_features=lambda t: t["budget"].astype(int))
    mine = delta[(delta["setting"] == setting) & (delta["layers"] == layers)].merge(
        table[["method", "num_features"]], on=["method", "num_features"])
    kernel = (mine["delta"].abs() <= floor) | ((mine["delta_low"] <= 0) & (mine["delta_high"] >= 0))
    practical = (mine["delta_low"] > -PRACTICAL_FLOOR) & (mine["delta_high"] < PRACTICAL_FLOOR)
    tied = int(points.cells.groupby("window")["delta"].apply(lambda d: d.duplicated(keep=False).sum()).sum())
    return {"setting": setting, "layers": layers, "points": len(mine), "kernel_floor": floor,
            "no_measurable_loss": int(kernel.sum()), "practical_floor": PRACTICAL_FLOOR,
            "no_loss_that_matters": int(practical.sum()), "tied_cells": tied, "cells": len(points.cells),
            "merged": "; ".join(f"{m} d={d} (= {same})" for m, d, same in points.merged)}


def with_holm(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with Holm's adjustment within each family (the claim instances that ran)."""
    return holm_column(table.assign(p=table["p"].astype(float)), family="family", p="p")


def noise_floor_of(frame: pd.DataFrame, setting, layers, control) -> float:
    """The kernel floor of one setting (:func:`.judging.noise_floor`)."""
    return judging.noise_floor(frame[(frame["setting"] == setting) & (frame["layers"] == layers)], control)
