r"""The perplexity study's claims judged on its saved tables (:mod:`.claims` declares them).

:func:`observations` turns the cells of one setting into what a decoder claim is over (the control, failed
runs, ``mask-renormalise`` methods and degenerate points out; :math:`\Delta` tied at 0 inside the noise floor)
and says what it dropped; :func:`judge_setting` evaluates every claim of the setting on one set of two-level
resamples (:func:`.resampling.two_level`); :func:`per_method` gives each method's own within-method rho with an
interval over windows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting import claims as engine
from . import gating, resampling
from .claims import MEASURES, MIN_BUDGETS, MIN_METHODS, P1, P1_BUDGET, P1_METHOD, P1_WITHIN, P2, RESAMPLING
from .grid import KV_CACHE

__all__ = ["EXACT_ERROR", "VERDICT_COLUMNS", "causal_form", "noise_floor", "exact_column", "degenerate", "observations",
           "judge_setting", "per_method", "verdict_row", "measures_of"]

EXACT_ERROR = 1e-6
"""A largest relative spectral error over the replaced layers' heads below this (its median over windows): the method
returned exact attention in every head (a degenerate point). The median over heads would also drop a method that is
exact in most heads only (DuoAttention's retrieval heads), whatever its other heads lose."""

VERDICT_COLUMNS = ["claim", "setting", "layers", "measure", "method", "reference", "num_features", "estimate",
                   "ci_low", "ci_high", "threshold", "verdict", "methods", "windows", "points", *gating.COLUMNS]
"""Every claim's row of ``verdicts.csv``; :data:`.gating.COLUMNS`: the calibration of (p3) and (p4) (the declared
interval's coverage on the run's own units, the calibrated level and p) and ``former_verdict`` (the 90% coverage
gate's verdict for (p3) and (p4); the reading of the percentile interval for the superseded claims)."""


def causal_form(frame: pd.DataFrame) -> pd.Series:
    """Each row's causal form: the ``causal`` column the cells record, else the method's registration (older
    tables); ``"unknown"`` for a method no longer registered."""
    if "causal" in frame:
        return frame["causal"].astype(str)
    from ...methods import available, get

    names = set(available())
    return frame["method"].map(lambda m: str(get(m).causal) if m in names else "unknown")


def noise_floor(frame: pd.DataFrame, control: str) -> float:
    """The setting's noise floor: the control's largest :math:`|\\Delta|` over windows plus twice its SD
    (:data:`.claims.FLOOR`); 0 without a control."""
    values = frame.loc[(frame["method"] == control) & frame["ok"], "delta"].to_numpy(float)
    if len(values) == 0:
        return 0.0
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.max(np.abs(values)) + 2 * spread)


def exact_column(frame: pd.DataFrame) -> str:
    """The column :data:`EXACT_ERROR` is compared with: ``spectral_max`` (per cell the largest relative spectral error
    over the replaced layers and their heads; in ``delta.csv`` its median over windows), or ``spectral_median`` in a
    table that lacks it (the rule as first declared)."""
    return "spectral_max" if "spectral_max" in frame else "spectral_median"


def degenerate(frame: pd.DataFrame, config: dict) -> pd.Series:
    """Per row: its point (method x d) is degenerate (:data:`.claims.DEGENERATE`)."""
    compressed = np.where(frame["setting"] == KV_CACHE, config.get("context", np.inf), config.get("n", np.inf))
    budget = frame["num_features"].to_numpy(float) >= compressed
    median = frame.groupby(["setting", "layers", "method", "num_features"])[exact_column(frame)].transform("median")
    return pd.Series(budget | (median.to_numpy(float) < EXACT_ERROR), index=frame.index)


def measures_of(frame: pd.DataFrame) -> pd.DataFrame:
    """The predictors of :data:`.claims.MEASURES` as columns (NaN where a run did not record one)."""
    out = pd.DataFrame(index=frame.index)
    for name in ("spectral", "frobenius", "worst_query"):
        out[name] = frame[f"{name}_median"].astype(float)
    out["missed_mass"] = 1.0 - frame["kept_mass_median"].astype(float) if "kept_mass_median" in frame else np.nan
    out["total_variation"] = frame["total_variation_median"].astype(float) if "total_variation_median" in frame \
        else np.nan
    out["inverse_budget"] = 1.0 / frame["num_features"].astype(float)
    return out


def observations(frame: pd.DataFrame, config: dict) -> tuple[pd.DataFrame, dict]:
    """``(cells, counts)``: the decoder-valid, non-degenerate cells of one setting with ``budget``, ``delta`` (tied
    at 0 inside the floor) and the measures; ``counts``: ``floor``, ``failed``, ``mask_renormalise``,
    ``degenerate`` (points), ``tied`` (cells), ``no_loss`` (points) and ``points``."""
    control = config["control"]
    floor = noise_floor(frame, control)
    methods = frame[frame["method"] != control]
    form = causal_form(methods)
    valid = methods[(form != "mask-renormalise").to_numpy()]
    counts = {"floor": floor, "failed": int((~valid["ok"]).sum()),
              "mask_renormalise": int(methods.loc[(form == "mask-renormalise").to_numpy(), "method"].nunique())}
    ran = valid[valid["ok"]]
    bad = degenerate(ran, config)
    counts["degenerate"] = int(ran.loc[bad, ["method", "num_features"]].drop_duplicates().shape[0])
    counts["degenerate_points"] = ", ".join(f"{m} d={d}" for m, d in ran.loc[bad, ["method", "num_features"]]
                                            .drop_duplicates().itertuples(index=False, name=None))
    kept = ran[~bad]
    cells = pd.concat([kept[["method", "window"]], measures_of(kept)], axis=1)
    cells["budget"] = kept["num_features"].astype(float)
    inside = kept["delta"].abs() <= floor
    cells["delta"] = np.where(inside, 0.0, kept["delta"].astype(float))
    counts["tied"] = int(inside.sum())
    points = kept.groupby(["method", "num_features"])["delta"].agg(["mean", "min", "max"])
    counts["no_loss"] = int(((points["mean"].abs() <= floor) | ((points["min"] <= 0) & (points["max"] >= 0))).sum())
    counts["points"] = len(points)
    return cells.reset_index(drop=True), counts


def verdict_row(claim, setting, layers, estimate, low, high, *, methods, windows, points, units, **extra) -> dict:
    """One row of ``verdicts.csv``."""
    return {"claim": claim.id, "setting": setting, "layers": layers, "measure": extra.get("measure", "spectral"),
            "method": extra.get("method", ""), "reference": extra.get("reference", ""),
            "num_features": extra.get("num_features", -1), "estimate": estimate, "ci_low": low, "ci_high": high,
            "threshold": claim.threshold, "verdict": engine.judge(claim, low, high, units=units),
            "methods": methods, "windows": windows, "points": points}


def _difference(measure: str):
    """rho(measure) - rho(spectral) on the cells where the measure is finite (paired: the same cells)."""

    def statistic(data):
        finite = np.isfinite(data[measure])
        return (resampling.spearman(data[measure][finite], data["delta"][finite])
                - resampling.spearman(data["spectral"][finite], data["delta"][finite]))

    return statistic


def statistics_of(cells: pd.DataFrame) -> dict:
    """The statistics one setting's claims need, by name."""
    found = {f"across {m}": resampling.across(m) for m in MEASURES}
    found["within spectral"] = resampling.within("spectral", MIN_BUDGETS)
    for budget in sorted(set(cells["budget"])):
        found[f"budget {budget:g}"] = resampling.at_budget("spectral", budget)
    for measure in MEASURES[1:]:
        if np.isfinite(cells[measure]).sum() >= 3:
            found[f"difference {measure}"] = _difference(measure)
    return found


def judge_setting(cells: pd.DataFrame, setting: str, layers: str) -> tuple[list[dict], list[dict]]:
    """``(verdict rows, correlation rows)`` of one setting: p1, p1w, p1d, p2 and every measure's rho."""
    statistics = statistics_of(cells)
    methods, windows = int(cells["method"].nunique()), int(cells["window"].nunique())
    # below the fewest methods a verdict needs, no interval is drawn (the verdict is withheld anyway)
    found = resampling.two_level(cells, statistics, columns=MEASURES, seed=RESAMPLING["seed"],
                                 resamples=RESAMPLING["resamples"] if methods >= MIN_METHODS else 0)
    common = {"methods": methods, "windows": windows, "points": len(cells), "units": methods}

    def row(claim, name, **extra):
        estimate, values, _ = found[name]
        low, high = resampling.percentile(estimate, values, RESAMPLING["level"])
        return {**verdict_row(claim, setting, layers, estimate, low, high, **{**common, **extra}), "_statistic": name}

    verdicts = [row(P1, "across spectral")]
    within = cells.groupby("method")["budget"].nunique()
    verdicts.append(row(P1_WITHIN, "within spectral", methods=int((within >= MIN_BUDGETS).sum()),
                        units=int((within >= MIN_BUDGETS).sum())))
    for name in statistics:
        if name.startswith("budget "):
            budget = float(name.split()[1])
            at = cells[cells["budget"] == budget]
            verdicts.append(row(P1_BUDGET, name, num_features=int(budget), methods=int(at["method"].nunique()),
                                units=int(at["method"].nunique()), points=len(at)))
        if name.startswith("difference "):
            measure = name.split()[1]
            subset = cells[np.isfinite(cells[measure])]
            verdicts.append(row(P2, name, measure=measure, methods=int(subset["method"].nunique()),
                                units=int(subset["method"].nunique()), points=len(subset)))
    verdicts = gating.superseded(verdicts)
    correlations = []
    for measure in MEASURES:
        estimate, values, _ = found[f"across {measure}"]
        low, high = resampling.percentile(estimate, values, RESAMPLING["level"])
        subset = cells[np.isfinite(cells[measure])]
        correlations.append({"setting": setting, "layers": layers, "measure": measure, "rho": estimate,
                             "ci_low": low, "ci_high": high, "points": len(subset),
                             "windows": int(subset["window"].nunique()), "methods": int(subset["method"].nunique())})
    return verdicts, correlations


def per_method(cells: pd.DataFrame, setting: str, layers: str) -> list[dict]:
    """(p1m): per method with at least :data:`.claims.MIN_BUDGETS` budgets, rho over its budgets of the window
    means of the spectral error and of :math:`\\Delta`, with an interval over its windows."""
    rows = []
    for method, group in cells.groupby("method", sort=True):
        if group["budget"].nunique() < MIN_BUDGETS:
            continue
        tables = {c: group.pivot_table(index="window", columns="budget", values=c, aggfunc="mean")
                  for c in ("spectral", "delta")}
        x, y = (tables[c].to_numpy(float) for c in ("spectral", "delta"))
        windows = len(x)
        estimate, low, high = _over_windows(x, y, RESAMPLING["resamples"])(range(windows))
        row = verdict_row(P1_METHOD, setting, layers, estimate, low, high, method=method, methods=1, windows=windows,
                          points=len(group), units=windows)
        rows.append(gating.superseded([row])[0])
    return rows


def _over_windows(x: np.ndarray, y: np.ndarray, resamples: int):
    """``compute(windows) -> (rho, low, high)``: rho over budgets of the means over ``windows`` (row positions of
    ``x``, ``y``: windows x budgets; a repeat counts twice) with its percentile interval, windows resampled."""

    def rho(chosen):
        return resampling.spearman(np.nanmean(x[chosen], axis=0), np.nanmean(y[chosen], axis=0))

    def compute(windows):
        chosen = np.asarray(list(windows), dtype=int)
        rng = np.random.default_rng(RESAMPLING["seed"])
        values = np.array([rho(chosen[rng.integers(0, len(chosen), len(chosen))])
                           for _ in range(resamples if len(chosen) > 1 else 0)])
        low, high = resampling.percentile(rho(chosen), values, RESAMPLING["level"]) if len(values) else (np.nan,
                                                                                                      np.nan)
        return rho(chosen), low, high

    return compute
