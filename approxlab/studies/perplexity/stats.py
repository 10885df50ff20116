r"""The perplexity study's numbers from its saved tables: the change in log-perplexity, the rank correlations
with the error measures, the claims and their verdicts.

Everything here is a function of ``baseline.csv``, ``perplexity.csv``, ``encoder.csv`` and ``references.csv``
(no model, no data). Windows are the independent unit of every interval: the methods, budgets and layers of
one window share its text.

**The change in log-perplexity** of a cell (setting x replaced layers x method x d x window) is
:math:`\Delta = \bar\ell_{\text{patched}} - \bar\ell_{\text{unpatched}}`, the mean negative log-likelihood
of the window's scored tokens (nats per token) with the method in place minus without, on the same tokens;
over windows, its mean with a 95% percentile bootstrap interval (:data:`BOOTSTRAP`).

**The error of a cell** is, per measure (relative spectral, relative Frobenius, worst query's relative
:math:`\ell_2`), the median over the replaced layers and their heads of the layer's output error against
exact attention on its own inputs in that run.

**Claims, fixed here before the first full run** (:data:`CLAIMS`), each judged by
:func:`approxlab.studies.reporting.claims.judge` from a 95% bootstrap interval over windows, with no verdict
below 3 windows. Observations are the cells of a setting (methods x d x windows; the control ``exact`` and
failed runs left out), and a resample draws whole windows (:func:`approxlab.stats.rank_correlation`):

* **(p1)** per setting, Spearman's :math:`\rho` of the relative spectral error and :math:`\Delta`; the
  spectral error ranks the losses when :math:`\rho \ge 0.7` (:data:`P1_REASON`);
* **(p2)** per setting, each measure's :math:`\rho`; for the Frobenius and the worst-query measure,
  :math:`\rho(\text{measure}) - \rho(\text{spectral})` on the same resamples: the measure ranks the losses
  better when the whole interval is above 0 (:data:`P2_REASON`);
* **(p3)** per compared ranking (``references.csv``), setting and d: :math:`\rho` of the reference's error of
  each method (fixed) and the methods' :math:`\Delta`, over the methods both measured; a method keeps its
  place when :math:`\rho \ge 0.8` (:data:`P3_REASON`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ... import stats
from ..declaration import Claim
from ..reporting import claims as engine
from .cells import MEASURES
from .grid import KV_CACHE, WHOLE

__all__ = ["BOOTSTRAP", "MIN_WINDOWS", "P1", "P2", "P3", "CLAIMS", "P1_REASON", "P2_REASON", "P3_REASON", "GROUP",
           "deltas", "delta_statistics", "correlations", "reference_agreement", "verdicts", "encoder_statistics"]

BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95}
MIN_WINDOWS = 3
GROUP = ["setting", "layers", "method", "num_features"]
_NO_VERDICT = {"too few units": f"no verdict (fewer than {MIN_WINDOWS} windows)"}

P1_REASON = ("rho = 0.7 is where the error's ranks account for about half the variance of the losses' ranks "
             "(rho^2 = 0.49): below it, something other than the spectral error decides most of the order of "
             "the losses")
P2_REASON = ("the question is which measure orders the losses better, not by how much: the paired difference "
             "of the two correlations on the same resampled windows, its whole interval above 0")
P3_REASON = ("with m methods, rho >= 0.8 allows squared rank displacements summing to at most m(m^2 - 1)/30: for 6 "
             "methods 7, i.e. up to three swaps of neighbours, but not two methods trading places two apart")

P1 = Claim("p1", "the relative spectral error ranks the methods' losses ({where})",
           "Spearman rho(relative spectral error, change in log-perplexity) across methods x d", side="at least",
           threshold=0.7, min_units=MIN_WINDOWS, quantity="spectral",
           labels={"reproduced": "ranks the losses", "not reproduced": "does not rank the losses", **_NO_VERDICT})
P2 = Claim("p2", "the {measure} error ranks the losses better than the spectral norm ({where})",
           "rho(measure) - rho(spectral), paired", side="above", threshold=0.0, strict=True, min_units=MIN_WINDOWS,
           labels={"reproduced": "better than spectral", "not reproduced": "worse than spectral", **_NO_VERDICT})
P3 = Claim("p3", "a method's place in {reference}'s error ranking is its place in the perplexity ranking ({where})",
           "Spearman rho(reference's error, change in log-perplexity) across the methods both measured",
           side="at least", threshold=0.8, min_units=MIN_WINDOWS,
           labels={"reproduced": "same places", "not reproduced": "different places", **_NO_VERDICT})
CLAIMS = (P1, P2, P3)

VERDICT_COLUMNS = ["claim", "setting", "layers", "measure", "reference", "num_features", "estimate", "ci_low",
                   "ci_high", "threshold", "verdict", "windows", "points", "methods"]


def deltas(perplexity: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    r"""``perplexity.csv`` with ``baseline`` (the unpatched mean NLL of the same setting and window), ``delta``
    (:math:`\Delta`, ``inf`` for a failed run) and ``ok``."""
    base = baseline[["setting", "window", "nll"]].rename(columns={"nll": "baseline"})
    frame = perplexity.merge(base, on=["setting", "window"], how="inner", validate="many_to_one")
    frame["ok"] = frame["status"] == "ok"
    frame["delta"] = np.where(frame["ok"], frame["nll"] - frame["baseline"], np.inf)
    return frame


def _mean_intervals(frame: pd.DataFrame, by: list, column: str, how: str = "mean") -> pd.DataFrame:
    """The mean (or median) of ``column`` over windows per point of ``by``, with a bootstrap interval over windows."""
    if frame.empty:
        return pd.DataFrame(columns=[*by, "estimate", "ci_low", "ci_high"])
    aggregate = stats.UnitAggregate(frame, by=by, unit="window", column=column, how=how)
    points = sorted(set(map(tuple, frame[by].itertuples(index=False, name=None))), key=str)
    found = engine.bootstrap(lambda u: {p: aggregate(u, *p) for p in points}, sorted(set(frame["window"])),
                             memoize=True, **BOOTSTRAP)
    return pd.DataFrame([{**dict(zip(by, point)), "estimate": i.estimate, "ci_low": i.low, "ci_high": i.high}
                         for point, i in found.items()])


def _counts(frame: pd.DataFrame, by: list) -> pd.DataFrame:
    """Per point of ``by``: the windows run and the failed runs."""
    return frame.groupby(by, sort=False).agg(windows=("window", "nunique"), failures=("ok", lambda s: int((~s).sum())))


def delta_statistics(frame: pd.DataFrame) -> pd.DataFrame:
    """``delta.csv``: per setting x layers x method x d, the mean change in log-perplexity over the windows whose
    run succeeded [95% bootstrap interval], each error measure's median over windows, the runs and failures."""
    ok = frame[frame["ok"]]
    counts = _counts(frame, GROUP)
    errors = ok.groupby(GROUP, sort=False)[[f"{m}_median" for m in MEASURES]].median()
    found = _mean_intervals(ok, GROUP, "delta").rename(columns={"estimate": "delta", "ci_low": "delta_low",
                                                                   "ci_high": "delta_high"})
    table = counts.join(errors).reset_index().merge(found, on=GROUP, how="left")
    table[["delta", "delta_low", "delta_high"]] = table[["delta", "delta_low", "delta_high"]].fillna(np.inf)
    return table[[*GROUP, "delta", "delta_low", "delta_high", *[f"{m}_median" for m in MEASURES], "windows",
                  "failures"]]


def _observations(frame: pd.DataFrame, control: str) -> pd.DataFrame:
    return frame[frame["ok"] & (frame["method"] != control)]


def _where(setting, layers) -> str:
    return f"{layers}" if setting == WHOLE else f"KV cache, {layers} layers"


def _bootstrap(group) -> dict:
    """The bootstrap settings for a group of observations: one resample when a single window leaves nothing to
    resample (the interval is the estimate; no verdict is given below :data:`MIN_WINDOWS` windows anyway)."""
    return {**BOOTSTRAP, "resamples": BOOTSTRAP["resamples"] if group["window"].nunique() > 1 else 1}


def correlations(frame: pd.DataFrame, control: str) -> pd.DataFrame:
    """``correlations.csv``: per setting x layers and measure, Spearman's rho of the error and the change in
    log-perplexity across methods x d x windows [95% bootstrap interval over windows] (p1, p2)."""
    rows = []
    for (setting, layers), group in _observations(frame, control).groupby(["setting", "layers"], sort=False):
        for measure in MEASURES:
            x, delta = group[f"{measure}_median"].to_numpy(float), group["delta"].to_numpy(float)
            ok = len(group) >= 2 and np.ptp(x) > 0 and np.ptp(delta) > 0
            found = (stats.rank_correlation(x, delta, units=group["window"].to_numpy(), **_bootstrap(group))
                     if ok else stats.Interval(np.nan, np.nan, np.nan))
            rows.append({"setting": setting, "layers": layers, "measure": measure, "rho": found.estimate,
                         "ci_low": found.low, "ci_high": found.high, "points": len(group),
                         "windows": group["window"].nunique(), "methods": group["method"].nunique()})
    return pd.DataFrame(rows, columns=["setting", "layers", "measure", "rho", "ci_low", "ci_high", "points", "windows",
                                       "methods"])


def _verdict(claim, setting, layers, interval, group, **extra) -> dict:
    windows = int(group["window"].nunique())
    return {"claim": claim.id, "setting": setting, "layers": layers, "measure": extra.get("measure", ""),
            "reference": extra.get("reference", ""), "num_features": extra.get("num_features", -1),
            "estimate": interval.estimate, "ci_low": interval.low, "ci_high": interval.high,
            "threshold": claim.threshold, "verdict": engine.judge(claim, interval.low, interval.high, units=windows),
            "windows": windows, "points": len(group), "methods": int(group["method"].nunique())}


def _p1_p2(frame: pd.DataFrame, control: str, found: pd.DataFrame) -> list[dict]:
    """(p1) from the spectral rows of ``correlations.csv`` (``found``); (p2) the paired differences."""
    rows = []
    for (setting, layers), group in _observations(frame, control).groupby(["setting", "layers"], sort=False):
        spectral = found[(found["setting"] == setting) & (found["layers"] == layers) & (found["measure"] == "spectral")]
        if spectral.empty or not np.isfinite(spectral["rho"].iloc[0]):
            continue
        p1 = stats.Interval(*spectral[["rho", "ci_low", "ci_high"]].iloc[0].to_numpy(float))
        rows.append(_verdict(P1, setting, layers, p1, group, measure="spectral"))
        units, delta = group["window"].to_numpy(), group["delta"].to_numpy(float)
        for measure in MEASURES[1:]:
            difference = stats.rank_correlation_difference(group[f"{measure}_median"].to_numpy(float),
                                                           group["spectral_median"].to_numpy(float), delta,
                                                           units=units, **_bootstrap(group))
            rows.append(_verdict(P2, setting, layers, difference, group, measure=measure))
    return rows


def _matches(reference_row, layers: str) -> bool:
    """Which of this run's whole-window settings a reference layer is compared with: every one for figure1
    (one encoder layer), the same layer for decoder."""
    return reference_row["study"] == "figure1" or layers == f"layer {int(reference_row['layer'])}"


def reference_agreement(frame: pd.DataFrame, references: pd.DataFrame, control: str) -> list[dict]:
    """(p3): per compared ranking x whole-window setting x common d, rho over the methods both measured."""
    rows = []
    if references is None or references.empty:
        return rows
    observed = _observations(frame, control)
    observed = observed[observed["setting"] == WHOLE]
    keys = ["reference", "study", "layer"]
    for (reference, study, layer), ranking in references.groupby(keys, sort=False):
        for layers, group in observed.groupby("layers", sort=False):
            if not _matches({"study": study, "layer": layer}, layers):
                continue
            for d, points in group.groupby("num_features", sort=True):
                errors = ranking[ranking["num_features"] == d].set_index("method")["error"]
                points = points[points["method"].isin(errors.index)]
                if points["method"].nunique() < 3 or points["delta"].nunique() < 2:
                    continue
                x = errors.loc[points["method"]].to_numpy(float)
                found = stats.rank_correlation(x, points["delta"].to_numpy(float), units=points["window"].to_numpy(),
                                               **_bootstrap(points))
                rows.append(_verdict(P3, WHOLE, layers, found, points, num_features=int(d),
                                     reference=f"{study} ({reference}, layer {int(layer)})"))
    return rows


def verdicts(frame: pd.DataFrame, references: pd.DataFrame, control: str, found: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: every claim's estimate, 95% bootstrap interval over windows and verdict (``found``: the
    table of :func:`correlations`)."""
    rows = _p1_p2(frame, control, found) + reference_agreement(frame, references, control)
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def encoder_statistics(encoder: pd.DataFrame) -> pd.DataFrame:
    """``encoder_stats.csv``: per method x d, the median over windows of one minus the cosine similarity of the
    embedding to the exact model's [95% bootstrap interval], the errors' medians, the runs and failures."""
    frame = encoder.assign(ok=encoder["status"] == "ok")
    by = ["method", "num_features"]
    counts = _counts(frame, by)
    ok = frame[frame["ok"]]
    errors = ok.groupby(by, sort=False)[[f"{m}_median" for m in MEASURES]].median()
    found = _mean_intervals(ok, by, "cosine_distance", how="median").rename(
        columns={"estimate": "cosine_distance", "ci_low": "cosine_distance_low", "ci_high": "cosine_distance_high"})
    table = counts.join(errors).reset_index().merge(found, on=by, how="left")
    for column in ("cosine_distance", "cosine_distance_low", "cosine_distance_high"):
        table[column] = table[column].fillna(np.inf)
    return table


def settings_of(frame: pd.DataFrame) -> list[tuple]:
    """The (setting, layers) pairs of a table in the order of the grid: the whole-window ones, then the KV cache."""
    pairs = list(dict.fromkeys(map(tuple, frame[["setting", "layers"]].itertuples(index=False, name=None))))
    return [p for p in pairs if p[0] == WHOLE] + [p for p in pairs if p[0] == KV_CACHE]
