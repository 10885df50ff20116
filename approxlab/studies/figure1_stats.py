r"""Figure 1's numbers from its saved ``results.csv``: panel statistics, the claims and their verdicts.

Everything here is a function of the tables (no data, no model): :mod:`approxlab.studies.figure1`
writes ``results.csv``; :mod:`approxlab.studies.figure1_report` calls these to write
``panel_stats.csv``, ``verdicts.csv``, the figures and ``summary.md``. The statistics themselves
(quantiles, bootstrap over windows, verdicts) are :mod:`approxlab.stats`.

Claims (Skyformer Section 4.5, Figure 1), each judged from the medians over heads x windows x
seeds (float64) with a 95% bootstrap interval over windows against a threshold fixed in code
before the run (:data:`THRESHOLDS`, :data:`CLAIMS`):

(a) Skyformer's error falls markedly as d grows; (b) each baseline gains little as d grows;
(c) Skyformer beats the best baseline at the largest d; (d) the gap of (c) grows with n.
"""

from __future__ import annotations

import pandas as pd

from .. import stats

__all__ = [
    "PAPER_METHODS",
    "BLOWUP_FACTOR",
    "NEAR_ZERO_ROW",
    "GROUP",
    "head_errors",
    "panel_statistics",
    "THRESHOLDS",
    "CLAIMS",
    "BOOTSTRAP",
    "VERDICT_COLUMNS",
    "verdicts",
    "PRECISION_TOLERANCE",
    "precision_table",
]

PAPER_METHODS = ("skyformer-softmax", "nystromformer", "performer", "informer")
"""The four methods of Skyformer's Figure 1 (its own figure); the first is Skyformer, the others
are the baselines of its claims."""

BLOWUP_FACTOR = 10.0
"""A head's error is a blow-up when it exceeds this multiple of the exact output's ``||O||_2``."""

NEAR_ZERO_ROW = 1e-3
"""A row of the approximate ``A~ 1`` is near zero when ``|(A~ 1)_i| <= NEAR_ZERO_ROW * median_j |(A~ 1)_j|``
(per head): its normalisation ``1 / (A~ 1)_i`` then amplifies that row by 1e3 or more."""

GROUP = ["condition", "n", "dtype", "method", "num_features"]
"""The columns of one curve point (a panel x dtype x method x d)."""


def head_errors(results: pd.DataFrame) -> pd.DataFrame:
    """One row per head x window x seed x grid point: ``GROUP + [window, seed, error]``.

    Failed approximations count with error ``inf`` (they are medians' worst case, not dropped).
    """
    frame = results.copy()
    if "dtype" not in frame:
        frame["dtype"] = "float64"
    if "error_heads" not in frame:  # results from before per-head errors: the head mean
        frame["error_heads"] = frame["error_mean"].map(repr)
    frame["error"] = frame["error_heads"].astype(str).str.split()
    long = frame[[*GROUP, "window", "seed", "error"]].explode("error")
    long["error"] = long["error"].astype(float)
    return long.reset_index(drop=True)


def panel_statistics(results: pd.DataFrame) -> pd.DataFrame:
    """``panel_stats.csv``: per grid point, error statistics over heads x windows x seeds.

    Columns: ``samples``, ``mean``, ``median``, ``q25``, ``q75``, ``max``
    (:func:`approxlab.stats.describe`), ``failures`` (rows whose method raised),
    ``error_blowups`` (errors above ``BLOWUP_FACTOR * ||O||_2``), ``near_zero_rows`` (rows of
    A~1 near zero, see :data:`NEAR_ZERO_ROW`).
    """
    summary = stats.describe(head_errors(results), GROUP, "error")
    frame = results.assign(dtype=results["dtype"] if "dtype" in results else "float64")
    counts = frame.assign(failures=(frame["status"] != "ok").astype(int))
    for column in ("error_blowups", "near_zero_rows"):
        if column not in counts:
            counts[column] = 0
    totals = counts.groupby(GROUP, sort=True)[["failures", "error_blowups", "near_zero_rows"]].sum()
    return summary.join(totals).reset_index()


# -------------------------------------------------------------------------- verdicts

THRESHOLDS = {"a": 0.5, "b": 0.8, "c": 0.0, "d": 0.0}
"""Verdict thresholds, fixed before any run (see :data:`CLAIMS`)."""

CLAIMS = {
    "a": ("{sky} error falls markedly as d grows", "median error ratio d_max/d_min", "at most"),
    "b": ("{method} gains little as d grows", "median error ratio d_max/d_min", "at least"),
    "c": ("{sky} beats {baselines} at d_max", "(best baseline - {sky}) / best baseline, medians at d_max",
          "above"),
    "d": ("the gap of (c) grows with n", "gap(n_max) - gap(n_min)", "above"),
}
"""Claim id -> (claim, statistic, side of the threshold on which the claim holds, see
:func:`approxlab.stats.verdict`). Skyformer is ``PAPER_METHODS[0]``, its baselines ``PAPER_METHODS[1:]``."""

BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95, "dtype": "float64"}
"""Windows are resampled with replacement (they are the independent unit: heads and seeds
share a window's text), the same draw for every n, with ``numpy.random.default_rng(seed)``
(:func:`approxlab.stats.bootstrap`)."""

VERDICT_COLUMNS = ["claim", "condition", "n", "method", "statistic", "estimate", "ci_low", "ci_high", "threshold",
                   "verdict"]


def _claim_statistics(config, med, windows, methods) -> dict:
    """Every claim's statistic for one multiset of windows: ``{(claim, condition, n, method): value}``."""
    sky, baselines = PAPER_METHODS[0], [m for m in PAPER_METHODS[1:] if m in methods]
    d_lo, d_hi = min(config["num_features"]), max(config["num_features"])
    out, gaps = {}, {}
    for condition in config["conditions"]:
        for n in config["n"]:
            wins = windows[n]
            ratio = {m: med(wins, condition, n, m, d_hi) / med(wins, condition, n, m, d_lo)
                     for m in (sky, *baselines) if m in methods}
            if sky in ratio:
                out[("a", condition, n, sky)] = ratio[sky]
            for m in baselines:
                out[("b", condition, n, m)] = ratio[m]
            if sky in methods and baselines:
                best = min(med(wins, condition, n, m, d_hi) for m in baselines)
                gaps[(condition, n)] = (best - med(wins, condition, n, sky, d_hi)) / best
                out[("c", condition, n, sky)] = gaps[(condition, n)]
        n_lo, n_hi = min(config["n"]), max(config["n"])
        if n_lo != n_hi and (condition, n_hi) in gaps:
            out[("d", condition, n_hi, sky)] = gaps[(condition, n_hi)] - gaps[(condition, n_lo)]
    return out


def verdicts(config: dict, results: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: each claim's statistic, bootstrap 95% interval and verdict.

    Columns: :data:`VERDICT_COLUMNS`. Medians over heads x windows x seeds (float64 runs,
    :class:`approxlab.stats.UnitAggregate`). The interval is the percentile interval of
    :data:`BOOTSTRAP` resamples of the windows, widened to include the estimate where it misses
    it (:func:`approxlab.stats.bootstrap`); ``inconclusive`` when it reaches across the threshold
    (:func:`approxlab.stats.verdict`).
    """
    errors = head_errors(results)
    errors = errors[errors["dtype"] == BOOTSTRAP["dtype"]]
    med = stats.UnitAggregate(errors, by=["condition", "n", "method", "num_features"], unit="window",
                              column="error", how="median")
    methods = set(errors["method"])
    ns = [n for n in config["n"] if n in set(errors["n"])]
    config = {**config, "n": ns, "conditions": [c for c in config["conditions"] if c in set(errors["condition"])]}
    if not ns:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    windows = {n: sorted(set(errors.loc[errors["n"] == n, "window"])) for n in ns}
    intervals = stats.bootstrap(lambda units: _claim_statistics(config, med, units, methods), windows,
                                resamples=BOOTSTRAP["resamples"], seed=BOOTSTRAP["seed"], level=BOOTSTRAP["level"])
    rows = []
    for (claim, condition, n, method), interval in intervals.items():
        text, statistic, side = CLAIMS[claim]
        rows.append({"claim": claim, "condition": condition, "n": n, "method": method,
                     "statistic": statistic.format(sky=PAPER_METHODS[0]), "estimate": interval.estimate,
                     "ci_low": interval.low, "ci_high": interval.high, "threshold": THRESHOLDS[claim],
                     "verdict": stats.verdict(interval.low, interval.high, THRESHOLDS[claim], side)})
    table = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    table.attrs["windows"] = min(len(w) for w in windows.values())
    return table


PRECISION_TOLERANCE = 0.01
"""float32 and float64 "part" where their median errors differ by more than 1 %."""


def precision_table(panel: pd.DataFrame) -> pd.DataFrame:
    """Median error in float32 beside float64 per condition x n x method x d, and their relative
    difference ``|m32 - m64| / m64``; rows where they part (above :data:`PRECISION_TOLERANCE`)."""
    if "float32" not in set(panel["dtype"]) or "float64" not in set(panel["dtype"]):
        return pd.DataFrame(columns=["condition", "n", "method", "num_features", "float64", "float32", "difference"])
    wide = panel.pivot_table(index=["condition", "n", "method", "num_features"], columns="dtype",
                             values="median").reset_index()
    wide["difference"] = (wide["float32"] - wide["float64"]).abs() / wide["float64"]
    return wide[wide["difference"] > PRECISION_TOLERANCE].reset_index(drop=True)
