r"""The decoder study's numbers from its saved tables: error and assumption statistics, claims, verdicts.

Everything here is a function of ``results.csv`` and ``assumptions.csv`` (no model, no data); the
statistics themselves (quantiles, bootstrap over windows, verdicts) are :mod:`approxlab.stats`.
Windows are the independent unit: heads, seeds and the prefixes of one window (its n) share its text.

Claims (the assumptions of the theorems; thresholds fixed in code before the run, :data:`CLAIMS`), each
judged per condition x layer from the median over heads x windows, with a 95% bootstrap interval over
windows (:data:`BOOTSTRAP`) and a verdict of the claims engine (:mod:`approxlab.studies.reporting.claims`):

* ``alpha``, ``alpha_block``, ``kappa``, ``stable_rank`` -- :math:`x = n^{o(1)}` (HyperAttention's
  assumption on :math:`\alpha` and :math:`\kappa`; a low stable rank, the other escape from the
  quadratic lower bounds that Han et al. cite). Statistic: the growth exponent, the least-squares slope
  of :math:`\log x` against :math:`\log n` over the run's n. An :math:`n^{o(1)}` quantity has slope
  tending to 0; the claim holds below 0.5 (half-way to linear growth).
* ``bounded_entries`` -- Alman and Song's :math:`B = o(\sqrt{\log n})`. Statistic: at the largest n,
  :math:`\sqrt{\max|s_{ij}|}/\sqrt{\ln n}` (the split-invariant lower bound on their :math:`B`, over
  :math:`\sqrt{\ln n}`); the claim holds below 1 -- a ratio above 1 puts the model at the scale of their
  hardness theorem (:math:`B = \Theta(\sqrt{\log n})`), whatever the constant.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ... import stats
from ..declaration import Claim
from ..reporting import changes
from ..reporting import claims as engine

__all__ = ["ERROR_GROUP", "ASSUMPTION_GROUP", "CLAIMS", "BOOTSTRAP", "VERDICT_COLUMNS", "SHOWN_QUANTITIES",
           "HEAD_QUANTITIES", "head_errors", "error_statistics", "assumption_statistics", "head_statistics",
           "growth_exponent", "verdicts", "error_intervals", "quantity_intervals", "cost_exponents"]

ERROR_GROUP = ["condition", "layer", "n", "method", "num_features"]
ASSUMPTION_GROUP = ["condition", "layer", "n"]
BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95}
"""Windows resampled with replacement (:func:`approxlab.stats.bootstrap`), the same draw for every n."""

_EXPONENT = "growth exponent in n"

CLAIMS = (
    Claim("alpha", "HyperAttention: alpha = n^o(1) on the causal D^-1 A", _EXPONENT, side="below", threshold=0.5,
          quantity="alpha"),
    Claim("alpha_block", "HyperAttention: alpha = n^o(1) on the unmasked block of its causal recursion", _EXPONENT,
          side="below", threshold=0.5, quantity="alpha_block"),
    Claim("kappa", "HyperAttention: kappa = n^o(1) on that block (heavy entries removed)", _EXPONENT, side="below",
          threshold=0.5, quantity="kappa"),
    Claim("bounded_entries", "Alman-Song: B = o(sqrt(log n))", "value at the largest n", side="below", threshold=1.0,
          quantity="entry_ratio"),
    Claim("stable_rank", "low stable rank: stable rank of the causal D^-1 A = n^o(1)", _EXPONENT, side="below",
          threshold=0.5, quantity="stable_rank"),
)
"""The claims (quantity, statistic, side, threshold): see the module docstring."""

VERDICT_COLUMNS = ["claim", "condition", "layer", "quantity", "statistic", "estimate", "ci_low", "ci_high",
                   "threshold", "verdict", "windows", "former_verdict"]
"""``former_verdict``: the verdict of the former rules, which judged a one-window interval of zero width
(:mod:`approxlab.studies.reporting.changes`); fewer than 2 windows now give "inconclusive"."""

SHOWN_QUANTITIES = ["alpha", "alpha_block", "alpha_block_without_first", "kappa", "kappa_all_entries",
                    "entry_ratio", "entry_bound", "logit_bound", "sink_mass", "sink_heaviest", "stable_rank",
                    "numerical_rank"]
"""The quantities of ``assumption_stats.csv`` (``entry_ratio`` = sqrt(logit_bound) / sqrt(ln n))."""

HEAD_QUANTITIES = ["alpha", "alpha_block", "kappa", "entry_ratio", "sink_mass", "stable_rank"]
"""The quantities of ``head_stats.csv``, per condition x layer x head x n."""


def head_errors(results: pd.DataFrame) -> pd.DataFrame:
    """One row per head x window x seed x grid point: ``ERROR_GROUP + [window, seed, error, relative_error]``
    (failed approximations count as ``inf``)."""
    frame = results.copy()
    for column in ("error_heads", "relative_error_heads"):
        frame[column] = frame[column].astype(str).str.split()
    long = frame[[*ERROR_GROUP, "window", "seed", "causal_form", "error_heads", "relative_error_heads"]]
    long = long.explode(["error_heads", "relative_error_heads"])
    long = long.rename(columns={"error_heads": "error", "relative_error_heads": "relative_error"})
    return long.astype({"error": float, "relative_error": float}).reset_index(drop=True)


def error_statistics(results: pd.DataFrame) -> pd.DataFrame:
    """``error_stats.csv``: per grid point, the relative error over heads x windows x seeds (samples, mean,
    median, q25, q75, max), the causal form, failures and the near-zero / non-positive masked row sums."""
    long = head_errors(results)
    summary = stats.describe(long, ERROR_GROUP, "relative_error")
    counts = results.assign(failures=(results["status"] != "ok").astype(int))
    totals = counts.groupby(ERROR_GROUP, sort=True).agg(
        causal_form=("causal_form", "first"), failures=("failures", "sum"),
        near_zero_rows=("near_zero_rows", "sum"), nonpositive_rows=("nonpositive_rows", "sum"))
    return summary.join(totals).reset_index()


def _with_ratio(assumptions: pd.DataFrame) -> pd.DataFrame:
    return assumptions.assign(entry_ratio=np.sqrt(assumptions["logit_bound"]) / assumptions["sqrt_log_n"])


def assumption_statistics(assumptions: pd.DataFrame) -> pd.DataFrame:
    """``assumption_stats.csv``: per condition x layer x n x quantity, its median, quartiles, max and mean
    over heads x windows (NaN values -- a numerical rank above ``rank_max_n`` -- left out)."""
    frame = _with_ratio(assumptions)
    long = frame.melt(id_vars=[*ASSUMPTION_GROUP, "window", "head"], value_vars=SHOWN_QUANTITIES,
                      var_name="quantity", value_name="value").dropna(subset=["value"])
    return stats.describe(long, [*ASSUMPTION_GROUP, "quantity"], "value").reset_index()


def head_statistics(assumptions: pd.DataFrame) -> pd.DataFrame:
    """``head_stats.csv``: per condition x layer x head (with its key/value head) x n, the median over windows
    of each of :data:`HEAD_QUANTITIES` -- alpha and kappa per layer and head."""
    frame = _with_ratio(assumptions)
    return frame.groupby([*ASSUMPTION_GROUP[:2], "head", "kv_head", "n"], sort=True)[HEAD_QUANTITIES].median() \
        .reset_index()


def cost_exponents(results: pd.DataFrame) -> pd.DataFrame:
    r"""Per method and causal form: the growth exponent in n of its median seconds per approximation (all
    heads of one window at once), and the seconds at the largest n -- the measured cost, on a shared machine."""
    ok = results[results["status"] == "ok"]
    medians = ok.groupby(["method", "causal_form", "n"], sort=True)["seconds"].median().reset_index()
    rows = []
    for (method, form), group in medians.groupby(["method", "causal_form"], sort=False):
        rows.append({"method": method, "causal_form": form, "exponent": growth_exponent(group["n"], group["seconds"]),
                     "n_max": int(group["n"].max()), "seconds_at_n_max": float(group["seconds"].iloc[-1])})
    return pd.DataFrame(rows, columns=["method", "causal_form", "exponent", "n_max", "seconds_at_n_max"])


def growth_exponent(ns, values) -> float:
    r"""Least-squares slope of :math:`\log x` against :math:`\log n` (NaN with fewer than two finite points)."""
    x, y = np.log(np.asarray(ns, dtype=float)), np.asarray(values, dtype=float)
    keep = np.isfinite(y) & (y > 0)
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(x[keep], np.log(y[keep]), 1)[0])


def _claim_values(config, median, units, layers) -> dict:
    """Every claim's statistic for one multiset of windows: ``{(claim, condition, layer): value}``."""
    out = {}
    ns = config["n"]
    for condition in config["conditions"]:
        for layer in layers:
            for claim in CLAIMS:
                if claim.statistic == _EXPONENT:
                    value = growth_exponent(ns, [median[claim.quantity](units[n], condition, layer, n) for n in ns])
                else:
                    value = median[claim.quantity](units[ns[-1]], condition, layer, ns[-1])
                out[(claim.id, condition, layer)] = value
    return out


def verdicts(config: dict, assumptions: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: each claim's statistic, its bootstrap interval over windows and the verdict
    (:func:`approxlab.studies.reporting.claims.judge`; inconclusive when the interval crosses the threshold or
    rests on fewer than 2 windows), beside the former rules' verdict."""
    frame = _with_ratio(assumptions)
    ns = [n for n in config["n"] if n in set(frame["n"])]
    if not ns:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    config = {**config, "n": ns, "conditions": [c for c in config["conditions"] if c in set(frame["condition"])]}
    layers = [layer for layer in config["layers"] if layer in set(frame["layer"])]
    median = {quantity: stats.UnitAggregate(frame.dropna(subset=[quantity]), by=ASSUMPTION_GROUP, unit="window",
                                            column=quantity, how="median")
              for quantity in {claim.quantity for claim in CLAIMS}}
    units = {n: sorted(set(frame.loc[frame["n"] == n, "window"])) for n in ns}
    found = engine.resample(lambda u: _claim_values(config, median, u, layers), units, memoize=True,
                            resamples=BOOTSTRAP["resamples"], seed=BOOTSTRAP["seed"])
    declared = {claim.id: claim for claim in CLAIMS}
    rows = []
    for (claim, condition, layer), resampled in found.items():
        declared_claim = declared[claim]
        interval = engine.interval(declared_claim, resampled, level=BOOTSTRAP["level"])
        former = changes.former_interval(resampled, level=BOOTSTRAP["level"])
        rows.append({"claim": claim, "condition": condition, "layer": layer, "quantity": declared_claim.quantity,
                     "statistic": "growth exponent over n" if declared_claim.statistic == _EXPONENT
                     else f"at n = {ns[-1]}",
                     "estimate": interval.estimate, "ci_low": interval.low, "ci_high": interval.high,
                     "threshold": declared_claim.threshold,
                     "verdict": engine.judge(declared_claim, interval.low, interval.high, units=resampled.units),
                     "windows": resampled.units, "former_verdict": changes.former_judge(declared_claim, *former)})
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def _intervals(frame, by, column, points) -> pd.DataFrame:
    """Median over heads x windows (x seeds) of ``column`` at each of ``points`` (tuples of ``by``), with a
    bootstrap interval over windows."""
    median = stats.UnitAggregate(frame, by=by, unit="window", column=column, how="median")
    units = sorted(set(frame["window"]))
    found = engine.bootstrap(lambda u: {point: median(u, *point) for point in points}, units, memoize=True,
                             **BOOTSTRAP)
    return pd.DataFrame([{**dict(zip(by, point)), "median": i.estimate, "ci_low": i.low, "ci_high": i.high}
                         for point, i in found.items()])


def error_intervals(results: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The median relative error at the largest d and n per condition x layer x method, with its interval."""
    long = head_errors(results)
    n, d = max(config["n"]), max(config["num_features"])
    long = long[(long["n"] == n) & (long["num_features"] == d)]
    points = sorted(set(map(tuple, long[["condition", "layer", "method"]].itertuples(index=False, name=None))))
    if not points:
        return pd.DataFrame(columns=["condition", "layer", "method", "median", "ci_low", "ci_high"])
    return _intervals(long, ["condition", "layer", "method"], "relative_error", points)


def quantity_intervals(assumptions: pd.DataFrame, quantity: str) -> pd.DataFrame:
    """The median of ``quantity`` over heads x windows per condition x layer x n, with its interval."""
    frame = _with_ratio(assumptions).dropna(subset=[quantity])
    points = sorted(set(map(tuple, frame[ASSUMPTION_GROUP].itertuples(index=False, name=None))))
    if not points:
        return pd.DataFrame(columns=[*ASSUMPTION_GROUP, "median", "ci_low", "ci_high"])
    return _intervals(frame, ASSUMPTION_GROUP, quantity, points)
