r"""The decoder study's descriptive statistics from its saved tables: errors, the KV-cache setting, the
assumptions, the levels of HyperAttention's causal recursion, Performer's control, the measured cost.

Everything here is a function of the saved tables (no model, no data); quantiles are
:func:`approxlab.stats.describe`, intervals over windows :func:`approxlab.stats.bootstrap` through the claims
engine. Windows are the independent unit: heads, seeds and the prefixes of one window (its n) share its text.
The claims and verdicts are in :mod:`.claims`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ... import stats
from ...errors import StudyError
from ..reporting import claims as engine

__all__ = ["ERROR_GROUP", "KV_GROUP", "ASSUMPTION_GROUP", "LEVEL_GROUP", "BOOTSTRAP", "SHOWN_QUANTITIES",
           "HEAD_QUANTITIES", "LEVEL_QUANTITIES", "require_rows", "head_errors", "kv_errors", "error_statistics",
           "kv_statistics", "assumption_statistics", "head_statistics", "level_statistics", "performer_statistics",
           "growth_exponent", "error_intervals", "quantity_intervals", "cost_exponents"]

ERROR_GROUP = ["condition", "layer", "n", "method", "num_features"]
KV_GROUP = ["condition", "layer", "method", "budget"]
ASSUMPTION_GROUP = ["condition", "layer", "n"]
LEVEL_GROUP = ["condition", "layer", "n", "depth"]
BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95}
"""Windows resampled with replacement (:func:`approxlab.stats.bootstrap`), the same draw for every n."""

SHOWN_QUANTITIES = ["alpha", "alpha_block", "alpha_block_without_first", "kappa_oracle", "kappa_sortlsh",
                    "kappa_all_entries", "entry_ratio", "entry_ratio_balanced_split", "logit_bound", "sink_mass",
                    "sink_heaviest", "stable_rank", "numerical_rank", "performer_xy_norm"]
"""The quantities of ``assumption_stats.csv`` (every one of them a column of ``assumptions.csv``)."""

HEAD_QUANTITIES = ["alpha_block", "kappa_oracle", "kappa_sortlsh", "kappa_all_entries", "entry_ratio", "sink_mass",
                   "stable_rank", "performer_xy_norm"]
"""The quantities of ``head_stats.csv``, per condition x layer x head x n."""

LEVEL_QUANTITIES = ["alpha", "kappa_oracle", "kappa_sortlsh", "kappa_all_entries", "sampling_ratio",
                    "break_even_epsilon"]
"""The quantities of ``levels.csv`` summarised in ``level_stats.csv``."""


def require_rows(frame: pd.DataFrame, name: str, out) -> pd.DataFrame:
    """``frame`` if it holds rows, else a :class:`~approxlab.errors.StudyError`: the table ``name`` in ``out``
    holds none (a run stopped before its step), so there is nothing to report from it."""
    if frame is None or frame.empty:
        raise StudyError(f"{str(out / name)!r} holds no rows yet: nothing to plot; rerun without --plot-only to "
                         "compute its cells.")
    return frame


def _long(frame: pd.DataFrame, group) -> pd.DataFrame:
    """One row per head of each row of ``frame`` (``error_heads``, ``relative_error_heads``): ``group + [window,
    seed, error, relative_error]`` (failed approximations count as ``inf``)."""
    frame = frame.copy()
    for column in ("error_heads", "relative_error_heads"):
        frame[column] = frame[column].astype(str).str.split()
    long = frame[[*group, "window", "seed", "error_heads", "relative_error_heads"]]
    long = long.explode(["error_heads", "relative_error_heads"])
    long = long.rename(columns={"error_heads": "error", "relative_error_heads": "relative_error"})
    long = long.astype({"error": float, "relative_error": float}).reset_index(drop=True)
    long["head"] = long.groupby([*group, "window", "seed"]).cumcount()
    return long


def head_errors(results: pd.DataFrame) -> pd.DataFrame:
    """One row per head x window x seed x grid point of ``results.csv``: ``ERROR_GROUP + [window, seed, error,
    relative_error, head]``."""
    return _long(results, ERROR_GROUP)


def kv_errors(kv: pd.DataFrame) -> pd.DataFrame:
    """One row per head x window x seed x point of ``kv_cache.csv``: ``KV_GROUP + [window, seed, error,
    relative_error, head]``."""
    return _long(kv, KV_GROUP)


def _described(results, group, totals) -> pd.DataFrame:
    summary = stats.describe(_long(results, group), group, "relative_error")
    counts = results.assign(failures=(results["status"] != "ok").astype(int))
    return summary.join(counts.groupby(group, sort=True).agg(failures=("failures", "sum"), **totals)).reset_index()


def error_statistics(results: pd.DataFrame) -> pd.DataFrame:
    """``error_stats.csv``: per grid point, the relative error over heads x windows x seeds (samples, mean,
    median, q25, q75, max), the causal form, failures and the near-zero / non-positive masked row sums."""
    return _described(results, ERROR_GROUP, {"causal_form": ("causal_form", "first"),
                                             "near_zero_rows": ("near_zero_rows", "sum"),
                                             "nonpositive_rows": ("nonpositive_rows", "sum")})


def kv_statistics(kv: pd.DataFrame) -> pd.DataFrame:
    """``kv_stats.csv``: per condition x layer x method x budget, the relative error of the continuation's rows
    over heads x windows x seeds, the setting (``compressed`` or the causal form used) and failures."""
    return _described(kv, KV_GROUP, {"setting": ("setting", "first"), "context": ("context", "first"),
                                     "continuation": ("continuation", "first")})


def assumption_statistics(assumptions: pd.DataFrame) -> pd.DataFrame:
    """``assumption_stats.csv``: per condition x layer x n x quantity, its median, quartiles, max and mean
    over heads x windows (NaN values -- a numerical rank above ``rank_max_n``, sortLSH's kappa where one
    block holds every key -- left out)."""
    present = [q for q in SHOWN_QUANTITIES if q in assumptions]
    long = assumptions.melt(id_vars=[*ASSUMPTION_GROUP, "window", "head"], value_vars=present,
                            var_name="quantity", value_name="value").dropna(subset=["value"])
    return stats.describe(long, [*ASSUMPTION_GROUP, "quantity"], "value").reset_index()


def head_statistics(assumptions: pd.DataFrame) -> pd.DataFrame:
    """``head_stats.csv``: per condition x layer x head (with its key/value head) x n, the median over windows
    of each of :data:`HEAD_QUANTITIES`."""
    present = [q for q in HEAD_QUANTITIES if q in assumptions]
    return assumptions.groupby([*ASSUMPTION_GROUP[:2], "head", "kv_head", "n"], sort=True)[present].median() \
        .reset_index()


def level_statistics(levels: pd.DataFrame) -> pd.DataFrame:
    r"""``level_stats.csv``: per condition x layer x n x depth of the causal recursion, the blocks and their size,
    the median over heads x windows of each of :data:`LEVEL_QUANTITIES` (each head's worst block), and
    ``saves_nothing_share``, the share of heads x windows with a block where uniform sampling needs at least
    the block's columns."""
    found = levels[levels["depth"] >= 0]
    if found.empty:
        return pd.DataFrame(columns=[*LEVEL_GROUP, "blocks", "rows", "columns", "heads", *LEVEL_QUANTITIES,
                                     "saves_nothing_share"])
    grouped = found.groupby(LEVEL_GROUP, sort=True)
    table = grouped[LEVEL_QUANTITIES].median()
    table["blocks"], table["rows"], table["columns"] = (grouped[c].first() for c in ("blocks", "rows", "columns"))
    table["heads"] = grouped["head"].size()
    table["saves_nothing_share"] = grouped["saves_nothing"].apply(lambda s: float((s > 0).mean()))
    return table.reset_index()


def performer_statistics(performer: pd.DataFrame, assumptions: pd.DataFrame) -> pd.DataFrame:
    r"""``performer_stats.csv``: per condition x layer x n, the medians over heads x windows of the
    attention-weighted :math:`\|x+y\|^2` (``xy_norm``), of Lemma 2's relative standard deviation of one entry
    :math:`\sqrt{(e^{\|x+y\|^2}-1)/r}` at the run's :math:`r` (``lemma2_std``; per head, then the median), of
    causal Performer's relative error, and of the same three with Q and K multiplied by ``scale`` (the control:
    :math:`\|x+y\|^2` times ``scale**2``)."""
    columns = [*ASSUMPTION_GROUP, "num_features", "scale", "xy_norm", "lemma2_std", "relative_error",
               "xy_norm_scaled", "lemma2_std_scaled", "relative_error_scaled"]
    if performer.empty or "performer_xy_norm" not in assumptions:
        return pd.DataFrame(columns=columns)
    keys = [*ASSUMPTION_GROUP, "window", "head"]
    frame = performer.merge(assumptions[[*keys, "performer_xy_norm"]], on=keys, how="left")
    frame["xy_norm"] = frame["performer_xy_norm"]
    frame["xy_norm_scaled"] = frame["xy_norm"] * frame["scale"] ** 2
    for suffix in ("", "_scaled"):
        xy = frame[f"xy_norm{suffix}"].to_numpy(dtype=float)
        with np.errstate(over="ignore"):
            frame[f"lemma2_std{suffix}"] = np.sqrt(np.expm1(xy) / frame["num_features"].to_numpy(dtype=float))
    grouped = frame.groupby(ASSUMPTION_GROUP, sort=True)
    table = grouped[[c for c in columns if c not in ASSUMPTION_GROUP + ["num_features", "scale"]]].median()
    table["num_features"], table["scale"] = grouped["num_features"].first(), grouped["scale"].first()
    return table.reset_index()[columns]


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
    r"""Least-squares slope of :math:`\log x` against :math:`\log n` (NaN with fewer than two finite points):
    a description of measured cost; the claims use :func:`approxlab.assumptions.growth_exponent_interval`."""
    x, y = np.log(np.asarray(ns, dtype=float)), np.asarray(values, dtype=float)
    keep = np.isfinite(y) & (y > 0)
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(x[keep], np.log(y[keep]), 1)[0])


def _intervals(frame, by, column, points) -> pd.DataFrame:
    """Median over heads x windows (x seeds) of ``column`` at each of ``points`` (tuples of ``by``), with a
    bootstrap interval over windows."""
    median = stats.UnitAggregate(frame, by=by, unit="window", column=column, how="median")
    units = sorted(set(frame["window"]))
    found = engine.bootstrap(lambda u: {point: median(u, *point) for point in points}, units, memoize=True,
                             **BOOTSTRAP)
    return pd.DataFrame([{**dict(zip(by, point)), "median": i.estimate, "ci_low": i.low, "ci_high": i.high}
                         for point, i in found.items()])


def error_intervals(long: pd.DataFrame, group) -> pd.DataFrame:
    """The median relative error over heads x windows x seeds per ``group`` of a per-head table (:func:`head_errors`,
    :func:`kv_errors`, restricted by the caller), with its bootstrap interval over windows."""
    group = list(group)
    points = sorted(set(map(tuple, long[group].itertuples(index=False, name=None))))
    if not points:
        return pd.DataFrame(columns=[*group, "median", "ci_low", "ci_high"])
    return _intervals(long, group, "relative_error", points)


def quantity_intervals(table: pd.DataFrame, quantity: str, group=ASSUMPTION_GROUP) -> pd.DataFrame:
    """The median of ``quantity`` over heads x windows per ``group``, with its bootstrap interval over windows."""
    group = list(group)
    frame = table.dropna(subset=[quantity])
    points = sorted(set(map(tuple, frame[group].itertuples(index=False, name=None))))
    if not points:
        return pd.DataFrame(columns=[*group, "median", "ci_low", "ci_high"])
    return _intervals(frame, group, quantity, points)
