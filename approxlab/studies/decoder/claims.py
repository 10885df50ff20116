r"""The decoder study's claims, fixed in code before the run, and their verdicts from the saved tables.

Every criterion below is **this study's operationalisation** of a theorem's assumption, not the paper's
statement: the theorems are asymptotic (:math:`n^{o(1)}`, :math:`o(\sqrt{\log n})`), which no finite set of
lengths can test, so each is replaced by what the theorem's *cost* needs at the measured lengths. Windows are
the independent units of every interval; a claim over fewer than 2 windows, or a growth exponent over fewer
than 4 lengths, has no verdict ("inconclusive").

Assumption claims (``verdicts.csv``; :data:`CLAIMS`), per condition x layer, each from the median head:

* ``alpha_block`` -- HyperAttention's :math:`\alpha` on the **top unmasked block** of its causal recursion
  (rows :math:`[n/2, n)`, columns :math:`[0, n/2)`, Algorithm 4 applies Theorem 1 there). Uniform sampling of
  the residual needs :math:`m \approx \alpha/\varepsilon^2` columns
  (:func:`approxlab.assumptions.uniform_samples_needed`), the block has :math:`n/2`: sampling saves work at
  large n only if :math:`\alpha` grows slower than :math:`n`. Statistic: the growth exponent of the median
  head's :math:`\alpha` over the run's :math:`\ge 4` lengths, fitted per window, with a Student-t interval
  over windows (:func:`approxlab.assumptions.growth_exponent_interval`); holds below 1.
* ``sampling`` -- at the largest n, on the **worst block of every depth** the recursion uses: the uniform
  samples needed at :math:`\varepsilon` (``config["epsilon"]``, 0.1) over the block's columns; holds below 1
  (at or above 1, sampling saves nothing there). Statistic: the geometric mean over windows of the median
  head's ratio, t interval on the logarithms.
* ``kappa`` -- :math:`\kappa` of the top block **with sortLSH's own mask** at the algorithm's block size
  (``kappa_sortlsh``; the oracle mask and no mask are reported beside it). Lemma 1's sample count grows at
  least linearly in :math:`\kappa`: growth exponent below 1, as for ``alpha_block``.
* ``stable_rank`` -- the stable rank of the causal :math:`D^{-1}A` (the low-rank escape from the lower bounds
  that Han et al. cite): a budget proportional to it stays below the n columns only if its growth exponent is
  below 1.
* ``bounded_entries`` -- Alman and Song's :math:`B = o(\sqrt{\log n})`. Statistic: at the largest n, the
  split-invariant lower bound on :math:`B` over :math:`\sqrt{\ln n}` (``entry_ratio``), t interval over windows.
  Its interval wholly above 1 (the study's convention): **fails for every split**; otherwise
  **undetermined** (a lower bound below 1 shows nothing), unless the balanced split's own ratio is wholly
  below 1: **holds for an explicit split** (:func:`approxlab.assumptions.bounded_entries_label`).

:math:`\alpha` of the whole causal :math:`D^{-1}A` is **structural** (:data:`approxlab.assumptions.STRUCTURAL`:
at least n for every causal matrix): reported, never judged.

Correlation claims (``correlations.csv``; :data:`CORRELATION_CLAIMS`), per condition over every head of the
run's layers: **does HyperAttention's error grow with** :math:`\alpha` **and** :math:`\kappa` **across heads, as
its theorem says?** At the largest n and the largest ``num_features`` of the run, Spearman's :math:`\rho`
between the causal method's relative error per head and (a) the largest :math:`\alpha` over every unmasked
block of the recursion (Theorem 1 is applied to each block with the same m, so the guarantee for the whole
matrix needs every block: the worst one binds), (b) the largest sortLSH :math:`\kappa` over the blocks that
sample; a bootstrap interval over windows (:func:`approxlab.stats.rank_correlation`, units = windows); holds
when the interval lies above 0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ... import stats
from ...assumptions import MIN_LENGTHS, growth_exponents
from ...assumptions.bounded_entries import HOLDS_FOR_AN_EXPLICIT_SPLIT
from ...stats.calibration import IntervalFamily
from ..declaration import Claim
from ..reporting import calibrated
from ..reporting import claims as engine
from ..reporting import measured
from .stats import BOOTSTRAP, head_errors

__all__ = ["CLAIMS", "CORRELATION_CLAIMS", "VERDICT_COLUMNS", "CORRELATION_COLUMNS", "STRUCTURAL_NOTE",
           "verdicts", "hyperattention_heads", "correlations"]

_GROWTH = "growth exponent in n (per window over the run's lengths; mean over windows, Student t)"
_FEW = {"too few units": "inconclusive"}
_WITHIN = ("Spearman rho of error and {} within each layer x window (ranks within the cluster, pooled over clusters), "
           "percentile bootstrap over windows")

CLAIMS = (
    Claim("alpha_block", "HyperAttention: uniform sampling of the top unmasked block saves work at large n (its "
          "alpha/eps^2 samples grow slower than the block's n/2 columns)", _GROWTH, side="below", threshold=1.0,
          interval="t", min_units=2, labels=_FEW, quantity="alpha_block", strict=True, family="assumptions"),
    Claim("sampling", "HyperAttention: at the largest n, uniform sampling saves work on the worst block of each depth "
          "of the causal recursion (samples needed at eps fewer than the block's columns)",
          "samples needed / columns, worst block (geometric mean over windows, t on the logs)", side="below",
          threshold=1.0, interval="t", min_units=2, labels=_FEW, quantity="sampling_ratio", strict=True,
          family="assumptions"),
    Claim("kappa", "HyperAttention: kappa with sortLSH's own mask (top block) grows slower than n (Lemma 1's "
          "samples, at least linear in kappa, stay below the block's columns)", _GROWTH, side="below",
          threshold=1.0, interval="t", min_units=2, labels=_FEW, quantity="kappa_sortlsh", strict=True,
          family="assumptions"),
    Claim("stable_rank", "low stable rank: the stable rank of the causal D^-1 A grows slower than n (a budget "
          "proportional to it stays below the n columns)", _GROWTH, side="below", threshold=1.0, interval="t",
          min_units=2, labels=_FEW, quantity="stable_rank", strict=True, family="assumptions"),
    Claim("bounded_entries", "Alman-Song: B = o(sqrt(log n))", "lower bound on B over every split / sqrt(ln n) at "
          "the largest n (mean over windows, Student t)", side="below", threshold=1.0, interval="t", min_units=2,
          labels={"reproduced": "undetermined", "not reproduced": "fails for every split",
                  "inconclusive": "undetermined", **_FEW}, quantity="entry_ratio", family="assumptions"),
)
"""The assumption claims (see the module docstring); thresholds fixed before the run."""

CORRELATION_CLAIMS = (
    Claim("hyper_alpha", "HyperAttention's error grows with alpha across the heads of a layer (worst unmasked block)",
          _WITHIN.format("alpha"), side="above", threshold=0.0, min_units=2, labels=_FEW, quantity="alpha_worst",
          strict=True, varies="head within layer x window", within="layer x window", family="correlation"),
    Claim("hyper_kappa", "HyperAttention's error grows with kappa across the heads of a layer (sortLSH, worst sampled "
          "block)", _WITHIN.format("kappa"), side="above", threshold=0.0, min_units=2, labels=_FEW,
          quantity="kappa_worst", strict=True, varies="head within layer x window", within="layer x window",
          family="correlation"),
)
"""The claims on HyperAttention's error against its assumptions (see the module docstring)."""

STRUCTURAL_NOTE = ("alpha of the causal D^-1 A is structural: row 0 of any causal row-stochastic matrix is e_0, "
                   "so alpha >= n whatever the model; reported, not judged")

_MEASURED = [*calibrated.CALIBRATED_COLUMNS, "p", "former_verdict"]
VERDICT_COLUMNS = ["claim", "condition", "layer", "depth", "quantity", "statistic", "estimate", "ci_low", "ci_high",
                   "interval", "threshold", "verdict", "windows", "note", *_MEASURED]
CORRELATION_COLUMNS = ["claim", "condition", "layers", "n", "num_features", "quantity", "heads", "heads_per_layer",
                       "estimate", "ci_low", "ci_high", "threshold", "verdict", "windows", "note", "pooled",
                       "pooled_low", "pooled_high", *_MEASURED, "gated_verdict"]
"""``ci_low``, ``ci_high``: the interval calibrated on the run's own windows
(:func:`approxlab.studies.reporting.calibrated.calibrate`; the columns of
:data:`approxlab.studies.reporting.calibrated.CALIBRATED_COLUMNS`: the declared 95% interval, its coverage with the
Monte-Carlo interval and draws, the calibrated level and why calibration fails where it does), the verdict read from
it; ``former_verdict``: the verdict the former rule gave (the declared interval, no verdict where its coverage on
the first 400 draws was below 90%; for the correlations that reading is ``gated_verdict``, and ``former_verdict``
the verdict on the rho pooled over every head of the run's layers: ``pooled``, ``pooled_low``, ``pooled_high``)."""


def _t(sample, _=None) -> IntervalFamily:
    return IntervalFamily.student(sample)


def _log_mean(sample, _=None) -> IntervalFamily:
    return IntervalFamily.student(sample, log=True)


def _calibrate(family, values):
    """``family``'s interval calibrated on the run's own windows (``values``, one per window); None for fewer than 2
    windows. The first 400 draws are the former coverage estimate."""
    values = list(values)
    if len(values) < 2:
        return None
    return calibrated.calibrate(family, values, former_draws=measured.MEASURED["trials"])


def _per_window(frame: pd.DataFrame, column: str, ns) -> pd.DataFrame:
    """Windows x lengths: the median over heads of ``column`` at each n (positive, finite values only)."""
    table = frame.groupby(["window", "n"])[column].median().unstack("n").reindex(columns=list(ns))
    return table.where(np.isfinite(table) & (table > 0))


def _row(claim, condition, layer, estimate, low, high, windows, note="", depth=math.nan, verdict=None,
         found=None) -> dict:
    """One verdict row; with ``found`` (a calibration) the interval is the calibrated one and ``verdict`` (a
    function of the interval, or None for :func:`approxlab.studies.reporting.claims.judge`) is read from it."""
    judged = verdict or (lambda lo, hi: engine.judge(claim, lo, hi, units=windows))
    if found is not None:
        low, high = found.low, found.high
    word = f"no verdict: {found.reason}" if found is not None and found.reason else judged(low, high)
    former = judged(found.nominal_low, found.nominal_high) if found is not None else word
    if found is not None and found.former is not None and found.former.coverage < measured.GATE:
        former = measured.gate(claim, former, found.former)
    return {"claim": claim.id, "condition": condition, "layer": layer, "depth": depth, "quantity": claim.quantity,
            "statistic": claim.statistic, "estimate": estimate, "ci_low": low, "ci_high": high,
            "interval": claim.interval, "threshold": claim.threshold, "verdict": word,
            "windows": windows, "note": note, **calibrated.calibrated_columns(found, threshold=claim.threshold),
            "former_verdict": former}


def _growth(claim, frame, condition, layer, ns) -> dict:
    table = _per_window(frame, claim.quantity, ns).dropna(axis="columns", how="any")
    lengths = list(table.columns)
    if len(lengths) < MIN_LENGTHS or table.empty:
        return _row(claim, condition, layer, math.nan, math.nan, math.nan, len(table),
                    f"{len(lengths)} length(s) with a value in every window; the exponent needs {MIN_LENGTHS}",
                    verdict=lambda lo, hi: engine.label(claim, "too few units"))
    slopes = growth_exponents(lengths, table.to_numpy())  # the t interval over windows of their exponents
    whole = _t(slopes)
    return _row(claim, condition, layer, whole.estimate, *whole.interval(0.95), len(table),
                f"n = {', '.join(map(str, lengths))}", found=_calibrate(_t, slopes))


def _sampling(claim, levels, condition, layer, n) -> list[dict]:
    rows = []
    at_n = levels[(levels["n"] == n) & (levels["depth"] >= 0)]
    for depth, frame in at_n.groupby("depth", sort=True):
        values = frame.groupby("window")[claim.quantity].median().to_numpy(dtype=float)
        whole = _log_mean(values)
        rows.append(_row(claim, condition, layer, whole.estimate, *whole.interval(0.95), len(values),
                         f"n = {n}; blocks of {int(frame['rows'].min())} x {int(frame['columns'].min())}",
                         depth=int(depth), found=_calibrate(_log_mean, values)))
    return rows


def _bounded(claim, frame, condition, layer, n) -> dict:
    at_n = frame[frame["n"] == n].groupby("window")[["entry_ratio", "entry_ratio_balanced_split"]].median()
    lower = stats.t_interval(at_n["entry_ratio"].to_numpy())
    explicit = stats.t_interval(at_n["entry_ratio_balanced_split"].to_numpy())

    def verdict(low, high):
        word = engine.judge(claim, low, high, units=len(at_n))
        return HOLDS_FOR_AN_EXPLICIT_SPLIT if word == "undetermined" and explicit.high < claim.threshold else word

    return _row(claim, condition, layer, lower.estimate, lower.low, lower.high, len(at_n),
                f"n = {n}; balanced split {explicit.estimate:.3g} [{explicit.low:.3g}, {explicit.high:.3g}]",
                verdict=verdict, found=_calibrate(_t, at_n["entry_ratio"].to_numpy(dtype=float)))


def verdicts(config: dict, assumptions: pd.DataFrame, levels: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: every assumption claim (:data:`CLAIMS`) per condition x layer (x depth for ``sampling``):
    its statistic, interval over windows and verdict (:func:`approxlab.studies.reporting.claims.judge`)."""
    ns = [n for n in config["n"] if n in set(assumptions["n"])]
    rows = []
    for condition in [c for c in config["conditions"] if c in set(assumptions["condition"])]:
        for layer in [layer for layer in config["layers"] if layer in set(assumptions["layer"])]:
            frame = assumptions[(assumptions["condition"] == condition) & (assumptions["layer"] == layer)]
            level = levels[(levels["condition"] == condition) & (levels["layer"] == layer)] if len(levels) else levels
            for claim in CLAIMS:
                if claim.id == "sampling":
                    rows += _sampling(claim, level, condition, layer, ns[-1]) if len(level) else []
                elif claim.id == "bounded_entries":
                    rows.append(_bounded(claim, frame, condition, layer, ns[-1]))
                else:
                    rows.append(_growth(claim, frame, condition, layer, ns))
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def hyperattention_heads(config: dict, results: pd.DataFrame, assumptions: pd.DataFrame,
                         levels: pd.DataFrame) -> pd.DataFrame:
    """``hyperattention.csv``: per condition x layer x window x head at the largest n and ``num_features`` of
    HyperAttention in the run, its relative error (median over seeds) beside ``alpha_worst`` and ``kappa_worst``
    (the largest alpha over every unmasked block of the recursion, the largest sortLSH kappa over the blocks that
    sample), the top block's alpha and its three kappa."""
    keys = ["condition", "layer", "window", "head"]
    columns = [*keys, "n", "num_features", "relative_error", "alpha_worst", "kappa_worst", "alpha_block",
               "kappa_oracle", "kappa_sortlsh", "kappa_all_entries"]
    ours = results[results["method"] == "hyperattention"] if len(results) else results
    if ours.empty:
        return pd.DataFrame(columns=columns)
    n = int(ours["n"].max())
    d = int(ours.loc[ours["n"] == n, "num_features"].max())
    long = head_errors(ours[(ours["n"] == n) & (ours["num_features"] == d)])
    errors = long.groupby(keys)["relative_error"].median().reset_index()
    blocks = levels[(levels["n"] == n) & (levels["depth"] >= 0)].groupby(keys)
    worst = pd.DataFrame({"alpha_worst": blocks["alpha"].max(), "kappa_worst": blocks["kappa_sortlsh"].max()})
    top = assumptions[assumptions["n"] == n][[*keys, "alpha_block", "kappa_oracle", "kappa_sortlsh",
                                              "kappa_all_entries"]]
    table = errors.merge(worst.reset_index(), on=keys, how="left").merge(top, on=keys, how="left")
    table["n"], table["num_features"] = n, d
    return table[columns]


def _window_sums(used: pd.DataFrame, quantity: str) -> tuple[list, np.ndarray]:
    """Per window, the sums over its layers' heads of the products and squares of the ranks centred within each
    layer x window (ties: mean ranks): ``(windows, (W, 3) array of [sum rx*ry, sum rx^2, sum ry^2])``."""
    grouped = used.groupby(["layer", "window"])
    centred = {c: used[c].groupby([used["layer"], used["window"]]).rank() - grouped[c].transform(
        lambda s: (len(s) + 1) / 2) for c in (quantity, "relative_error")}
    x, y = centred[quantity], centred["relative_error"]
    sums = pd.DataFrame({"xy": x * y, "xx": x * x, "yy": y * y, "window": used["window"]}).groupby("window").sum()
    return list(sums.index), sums[["xy", "xx", "yy"]].to_numpy(dtype=float)


def _stratified(sums: np.ndarray) -> np.ndarray:
    """Spearman's rho within clusters, pooled: sum rx*ry / sqrt(sum rx^2 sum ry^2) over the last-but-one axis."""
    total = sums.sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total[..., 0] / np.sqrt(total[..., 1] * total[..., 2])


def within_layer_rho(sums: np.ndarray, *, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    r"""Spearman's :math:`\rho` within layer x window clusters, pooled, with a percentile bootstrap over windows.

    ``sums``: ``(W, 3)`` per window (:func:`_window_sums`). The ranks are taken within each layer x window, so a
    layer whose heads all err more (and have larger alpha) adds nothing: the statistic is the association among
    the heads of one layer, which is what the theorem's per-head guarantee speaks to. A window drawn twice counts
    twice. ``(estimate, low, high)``; NaN bounds for one window.
    """
    found = _rho_family(sums, resamples=resamples, seed=seed)
    return (found.estimate, *found.interval(level)) if found.units > 1 else (found.estimate, math.nan, math.nan)


def _rho_family(sums: np.ndarray, *, resamples: int, seed: int) -> IntervalFamily:
    """The percentile interval family of :func:`within_layer_rho` (windows resampled, ``seed``)."""
    sums = np.asarray(sums, dtype=float)
    estimate = float(_stratified(sums))
    if len(sums) < 2:
        return IntervalFamily.percentile(stats.Resamples(estimate, np.full(1, estimate), len(sums)))
    draws = np.random.default_rng(seed).integers(0, len(sums), size=(resamples, len(sums)))
    return IntervalFamily.percentile(stats.Resamples(estimate, _stratified(sums[draws]), len(sums)))


def correlations(heads: pd.DataFrame, *, bootstrap: dict = BOOTSTRAP) -> pd.DataFrame:
    """``correlations.csv``: each claim of :data:`CORRELATION_CLAIMS` per condition, over every head with the
    quantity defined: Spearman's rho within each layer x window, pooled (:func:`within_layer_rho`; ``bootstrap``:
    its ``resamples``, ``seed`` and ``level``), its coverage measured on the run's own windows and its verdict;
    beside it the rho pooled over every head of the run's layers (``pooled``: it mixes the contrast between
    layers with the association within them) and the verdict the former rules gave on it."""
    rows = []
    for condition, frame in heads.groupby("condition", sort=False):
        for claim in CORRELATION_CLAIMS:
            used = frame.dropna(subset=[claim.quantity, "relative_error"])
            windows = int(used["window"].nunique())
            per_layer = used.groupby(["layer", "window"]).size()
            base = {"claim": claim.id, "condition": condition,
                    "layers": " ".join(map(str, sorted(set(used["layer"])))), "n": int(frame["n"].iloc[0]),
                    "num_features": int(frame["num_features"].iloc[0]), "quantity": claim.quantity,
                    "heads": len(used), "heads_per_layer": int(per_layer.max()) if len(per_layer) else 0,
                    "threshold": claim.threshold, "windows": windows}
            if len(used) < 3 or used[claim.quantity].nunique() < 2 or used["relative_error"].nunique() < 2:
                rows.append({**base, "estimate": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                             "verdict": engine.label(claim, "too few units"),
                             "note": "fewer than 3 heads with distinct values"})
                continue
            pooled = stats.rank_correlation(used[claim.quantity], used["relative_error"], units=used["window"],
                                            method="spearman", **bootstrap)
            _, sums = _window_sums(used, claim.quantity)
            def family(sample, trial):
                return _rho_family(np.asarray(sample), resamples=bootstrap["resamples"] if trial < 0 else 400,
                                   seed=bootstrap["seed"])
            found = _calibrate(family, list(sums))
            whole = family(list(sums), -1)
            low, high = (found.low, found.high) if found is not None else whole.interval(bootstrap["level"])
            rows.append({**base, "estimate": whole.estimate, "ci_low": low, "ci_high": high,
                         "verdict": engine.judge(claim, low, high, units=windows, calibrated=found),
                         "note": "ranks within layer x window, pooled; percentile bootstrap over windows, calibrated",
                         "pooled": pooled.estimate, "pooled_low": pooled.low, "pooled_high": pooled.high,
                         **calibrated.calibrated_columns(found, threshold=claim.threshold),
                         "gated_verdict": calibrated.former_verdict(claim, found, units=windows) if found else
                         engine.judge(claim, low, high, units=windows),
                         "former_verdict": engine.judge(claim, pooled.low, pooled.high, units=windows)})
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)
