r"""The perplexity study's numbers from its saved tables: the change in log-perplexity, the rank correlations
with the error measures, the claims and their verdicts.

Everything here is a function of ``baseline.csv``, ``perplexity.csv.gz``, ``encoder.csv`` and ``references.csv``
(no model, no data). The per-point intervals resample windows (the methods, budgets and layers of one window
share its text).

**The change in log-perplexity** of a cell (setting x replaced layers x method x d x window) is
:math:`\Delta = \bar\ell_{\text{patched}} - \bar\ell_{\text{unpatched}}`, the mean negative log-likelihood
of the window's scored tokens (nats per token) with the method in place minus without, on the same tokens;
over windows, its mean with a 95% percentile bootstrap interval (:data:`BOOTSTRAP`).

**The error of a cell** is, per measure (relative spectral, relative Frobenius, worst query's relative
:math:`\ell_2`), the median over the replaced layers and their heads of the layer's output error against
exact attention on its own inputs in that run.

**The claims** are declared in :mod:`.claims` and judged in :mod:`.judging`; :func:`claim_inputs`,
:func:`claim_tables` and :func:`counts_table` gather them over the settings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ... import stats
from ..reporting import claims as engine
from . import judging
from .cells import MEASURES
from .claims import RESAMPLING
from .grid import KV_CACHE, WHOLE

__all__ = ["BOOTSTRAP", "GROUP", "deltas", "delta_statistics", "claim_inputs", "claim_tables", "counts_table",
           "encoder_statistics", "settings_of"]

BOOTSTRAP = RESAMPLING
"""The bootstrap of the per-point intervals over windows (the claims' own settings, :data:`.claims.RESAMPLING`)."""
GROUP = ["setting", "layers", "method", "num_features"]


def deltas(perplexity: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    r"""``perplexity.csv.gz`` with ``baseline`` (the unpatched mean NLL of the same setting and window), ``delta``
    (:math:`\Delta`, ``inf`` for a failed run) and ``ok``."""
    base = baseline[["setting", "window", "nll"]].rename(columns={"nll": "baseline"})
    frame = perplexity.merge(base, on=["setting", "window"], how="inner", validate="many_to_one")
    frame["ok"] = frame["status"] == "ok"
    frame["delta"] = np.where(frame["ok"], frame["nll"] - frame["baseline"], np.inf)
    return frame


def _mean_intervals(frame: pd.DataFrame, by: list, column: str, how: str = "mean") -> pd.DataFrame:
    """The mean (or median) of ``column`` over windows per point of ``by``, with a bootstrap interval over that
    point's own windows (those whose run succeeded: a resample never lacks the point, so the interval holds its
    estimate; NaN bounds for a point of one window)."""
    if frame.empty:
        return pd.DataFrame(columns=[*by, "estimate", "ci_low", "ci_high"])
    aggregate = stats.UnitAggregate(frame, by=by, unit="window", column=column, how=how)
    windows = {point: sorted(set(rows["window"])) for point, rows in frame.groupby(by, sort=False)}
    points = sorted(windows, key=str)
    found = engine.bootstrap(lambda u: {p: aggregate(u[p], *p) for p in points}, {p: windows[p] for p in points},
                             **BOOTSTRAP)
    return pd.DataFrame([{**dict(zip(by, point)), "estimate": i.estimate, "ci_low": i.low, "ci_high": i.high}
                         for point, i in found.items()])


def _counts(frame: pd.DataFrame, by: list) -> pd.DataFrame:
    """Per point of ``by``: the windows run and the failed runs."""
    return frame.groupby(by, sort=False).agg(windows=("window", "nunique"), failures=("ok", lambda s: int((~s).sum())))


def delta_statistics(frame: pd.DataFrame) -> pd.DataFrame:
    """``delta.csv``: per setting x layers x method x d, the mean change in log-perplexity over the windows whose
    run succeeded [95% bootstrap interval over those windows], each error measure's median over windows, the median
    over windows of the largest spectral error over heads (``spectral_max``, where the cells have it: what tells exact
    attention, :data:`.judging.EXACT_ERROR`), the runs (``windows``) and ``failures``. ``delta`` is ``inf`` where every run failed; the bounds are NaN where no
    interval exists (fewer than two windows succeeded)."""
    ok = frame[frame["ok"]]
    counts = _counts(frame, GROUP)
    largest = ["spectral_max"] if "spectral_max" in frame else []  # a table written before it: the rule's fallback
    errors = ok.groupby(GROUP, sort=False)[[*[f"{m}_median" for m in MEASURES], *largest]].median()
    found = _mean_intervals(ok, GROUP, "delta").rename(columns={"estimate": "delta", "ci_low": "delta_low",
                                                                   "ci_high": "delta_high"})
    table = counts.join(errors).reset_index().merge(found, on=GROUP, how="left")
    table["delta"] = table["delta"].fillna(np.inf)  # every run failed; bounds not computed stay NaN
    return table[[*GROUP, "delta", "delta_low", "delta_high", *[f"{m}_median" for m in MEASURES], *largest,
                  "windows", "failures"]]


def _where(setting, layers) -> str:
    return f"{layers}" if setting == WHOLE else f"KV cache, {layers} layers"


def claim_inputs(frame: pd.DataFrame, config: dict) -> dict:
    """``{(setting, layers): (cells, counts)}``: each decoder setting's observations (:func:`.judging.observations`)."""
    return {pair: judging.observations(frame[(frame["setting"] == pair[0]) & (frame["layers"] == pair[1])], config)
            for pair in settings_of(frame)}


def counts_table(inputs: dict) -> pd.DataFrame:
    """``observations.csv``: per setting, what entered the claims and what was dropped (floor, ties, degenerate
    points, mask-renormalise methods, failures)."""
    rows = [{"setting": setting, "layers": layers, "methods": int(cells["method"].nunique()),
             "windows": int(cells["window"].nunique()), "cells": len(cells), **counts}
            for (setting, layers), (cells, counts) in inputs.items()]
    return pd.DataFrame(rows)


def claim_tables(inputs: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(verdicts of p1, p1w, p1d, p1m, p2; correlations.csv)`` over every setting."""
    verdicts, correlations = [], []
    for (setting, layers), (cells, _) in inputs.items():
        if cells.empty:
            continue
        found, rhos = judging.judge_setting(cells, setting, layers)
        verdicts += found + judging.per_method(cells, setting, layers)
        correlations += rhos
    return (pd.DataFrame(verdicts, columns=judging.VERDICT_COLUMNS),
            pd.DataFrame(correlations, columns=["setting", "layers", "measure", "rho", "ci_low", "ci_high", "points",
                                                "windows", "methods"]))


def encoder_statistics(encoder: pd.DataFrame) -> pd.DataFrame:
    """``encoder_stats.csv``: per method x d, the median over windows of one minus the cosine similarity of the
    embedding to the exact model's [95% bootstrap interval over the windows whose run succeeded], the errors'
    medians, the runs (``windows``) and ``failures`` (``inf`` where every run failed; NaN bounds where no interval
    exists)."""
    frame = encoder.assign(ok=encoder["status"] == "ok")
    by = ["method", "num_features"]
    counts = _counts(frame, by)
    ok = frame[frame["ok"]]
    errors = ok.groupby(by, sort=False)[[f"{m}_median" for m in MEASURES]].median()
    found = _mean_intervals(ok, by, "cosine_distance", how="median").rename(
        columns={"estimate": "cosine_distance", "ci_low": "cosine_distance_low", "ci_high": "cosine_distance_high"})
    table = counts.join(errors).reset_index().merge(found, on=by, how="left")
    table["cosine_distance"] = table["cosine_distance"].fillna(np.inf)  # every run failed; bounds stay NaN
    return table


def settings_of(frame: pd.DataFrame) -> list[tuple]:
    """The (setting, layers) pairs of a table in the order of the grid: the whole-window ones, then the KV cache."""
    pairs = list(dict.fromkeys(map(tuple, frame[["setting", "layers"]].itertuples(index=False, name=None))))
    return [p for p in pairs if p[0] == WHOLE] + [p for p in pairs if p[0] == KV_CACHE]
