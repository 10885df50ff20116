r"""Figure 1's numbers from its saved ``results.csv.bz2``: panel statistics, the claims and their verdicts.

Everything here is a function of the tables (no data, no model): the cells of
:mod:`approxlab.studies.figure1` write ``results.csv.bz2`` (:data:`RESULTS`); its report step calls these to
write ``panel_stats.csv``, ``verdicts.csv``, the figures and ``summary.md``. The statistics themselves
(quantiles, bootstrap over windows) are :mod:`approxlab.stats`; intervals and verdicts come from the
claims engine (:mod:`approxlab.studies.reporting.claims`).

Claims (Skyformer Section 4.5, Figure 1), each judged from the median *and* from the mean over
heads x windows x seeds (float64; :data:`PRIMARY_AGGREGATION` says which one leads and why) with a
95% interval over windows (the bootstrap standard error with Student-t quantiles) against a threshold
fixed in code (:data:`CLAIMS`, :data:`THRESHOLDS`):

(a) Skyformer's error falls markedly as d grows; (b) each baseline gains little as d grows;
(b-comparative) Skyformer gains more than each baseline as d grows (the paper's sentence read as a
comparison); (c) Skyformer beats the best baseline at the largest d; (d) the gap of (c) grows with n.

Beside them, per grid point (:func:`panel_statistics`): the blow-up rates (errors above
:data:`BLOWUP_FACTOR` ``||O||_2``; near-zero rows of ``A~ 1``) and the per-head win rate of Skyformer
against the best baseline (:func:`win_rates`, :func:`approxlab.stats.win_rate`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ... import stats
from ..declaration import Claim
from ...stats.calibration import IntervalFamily
from ..reporting import calibrated
from ..reporting import claims as engine
from ..reporting import measured

__all__ = [
    "RESULTS",
    "PAPER_METHODS",
    "BLOWUP_FACTOR",
    "NEAR_ZERO_ROW",
    "GROUP",
    "PRIMARY_AGGREGATION",
    "head_errors",
    "win_rates",
    "panel_statistics",
    "THRESHOLDS",
    "CLAIMS",
    "BOOTSTRAP",
    "COVERAGE",
    "OWN_COVERAGE",
    "calibrated_verdicts",
    "VERDICT_COLUMNS",
    "degenerate_lengths",
    "verdicts",
    "aggregation_differences",
    "PRECISION_TOLERANCE",
    "precision_table",
]

RESULTS = "results.csv.bz2"
"""The cells' table: one row per condition x n x dtype x window x method x num_features x seed, bzip2-compressed
(at the default grid's 12 windows it is 11 MB as text, 4.3 MB gzip-compressed and 3.9 MB bzip2-compressed)."""

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

PRIMARY_AGGREGATION = "median"
"""The statistic the figure draws and the summary leads with; the mean is reported beside it for
every claim (``verdicts.csv``, column ``aggregation``). Why the median: a Nystrom-type method that
divides by its own row sums ``A~ 1`` (Skyformer) has a heavy upper tail -- a few heads whose
approximate row sum is near zero give errors orders of magnitude above the rest (``near_zero_rows``,
``error_blowups``) -- and the mean over heads x windows x seeds is then the tail's size, not the
typical head's error. The median is the robust location of the same errors. Both are legitimate
answers to different questions (the typical head; the expected error including its failures), so
a verdict that changes between them is stated as such, never resolved by choosing one."""


def head_errors(results: pd.DataFrame) -> pd.DataFrame:
    """One row per head x window x seed x grid point: ``GROUP + [window, seed, error, head]``.

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
    long["head"] = long.groupby(level=0).cumcount()
    return long.reset_index(drop=True)


def panel_statistics(results: pd.DataFrame) -> pd.DataFrame:
    """``panel_stats.csv``: per grid point, error statistics over heads x windows x seeds.

    Columns: ``samples``, ``mean``, ``median``, ``q25``, ``q75``, ``max``
    (:func:`approxlab.stats.describe`), ``failures`` (rows whose method raised),
    ``error_blowups`` (errors above ``BLOWUP_FACTOR * ||O||_2``) and ``blowup_rate`` (their share of
    the ``samples`` head errors), ``near_zero_rows`` (rows of A~1 near zero, see
    :data:`NEAR_ZERO_ROW`) and ``near_zero_row_rate`` (their share of the ``samples x n`` rows; NaN
    for methods that do not report row sums), and on Skyformer's rows its per-head win rate against
    the best baseline (:func:`win_rates`: ``best_baseline``, ``win_rate``, ``win_rate_low``,
    ``win_rate_high``, ``win_pairs``).
    """
    long = head_errors(results)
    summary = stats.describe(long, GROUP, "error")
    frame = results.assign(dtype=results["dtype"] if "dtype" in results else "float64")
    counts = frame.assign(failures=(frame["status"] != "ok").astype(int))
    for column in ("error_blowups", "near_zero_rows"):
        if column not in counts:
            counts[column] = 0
    reported = counts["row_sums_reported"].astype(str) == "True" if "row_sums_reported" in counts else False
    counts["reported"] = reported
    totals = counts.groupby(GROUP, sort=True).agg(failures=("failures", "sum"), error_blowups=("error_blowups", "sum"),
                                                   near_zero_rows=("near_zero_rows", "sum"), reported=("reported", "any"))
    table = summary.join(totals).reset_index()
    table["blowup_rate"] = table["error_blowups"] / table["samples"]
    table["near_zero_row_rate"] = (table["near_zero_rows"] / (table["samples"] * table["n"])).where(table["reported"])
    table = table.drop(columns="reported")
    wins = win_rates(long, table)
    return table.merge(wins, on=GROUP, how="left") if len(wins) else table


def win_rates(long: pd.DataFrame, panel: pd.DataFrame) -> pd.DataFrame:
    """Per-head win rate of Skyformer against the best baseline, per grid point (``GROUP`` columns).

    The best baseline is the one of ``PAPER_METHODS[1:]`` with the smallest median error at that
    grid point (``panel``). Pairs are (window, head): each method's error there is its median over
    seeds, and Skyformer wins a pair where its error is smaller (:func:`approxlab.stats.win_rate`,
    Wilson 95% interval). Heads of one window share its text, so the pairs are not independent and
    the interval is narrower than one that resamples windows would be.

    Returns
    -------
    pandas.DataFrame
        ``GROUP`` (method = Skyformer) + ``best_baseline``, ``win_rate``, ``win_rate_low``,
        ``win_rate_high``, ``win_pairs``; empty when Skyformer or every baseline is missing.
    """
    sky, key = PAPER_METHODS[0], [c for c in GROUP if c != "method"]
    pairs = long.groupby([*GROUP, "window", "head"], sort=True)["error"].median().reset_index()
    candidates = panel[panel["method"].isin(PAPER_METHODS[1:])]
    rows = []
    for point, group in candidates.groupby(key, sort=True):
        best = group.sort_values(["median", "method"]).iloc[0]["method"]
        select = dict(zip(key, point))
        mask = pd.Series(True, index=pairs.index)
        for column, value in select.items():
            mask &= pairs[column] == value
        ours = pairs[mask & (pairs["method"] == sky)].set_index(["window", "head"])["error"]
        theirs = pairs[mask & (pairs["method"] == best)].set_index(["window", "head"])["error"]
        common = ours.index.intersection(theirs.index)
        if len(common) == 0:
            continue
        rate = stats.win_rate(ours[common].to_numpy(), theirs[common].to_numpy(), level=BOOTSTRAP["level"])
        rows.append({**select, "method": sky, "best_baseline": best, "win_rate": rate.rate, "win_rate_low": rate.low,
                     "win_rate_high": rate.high, "win_pairs": rate.count})
    return pd.DataFrame(rows, columns=[*GROUP, "best_baseline", "win_rate", "win_rate_low", "win_rate_high",
                                       "win_pairs"])


# -------------------------------------------------------------------------- verdicts

_BOTH = ("median", "mean")

CLAIMS = (
    Claim("a", "{sky} error falls markedly as d grows", "{agg} error ratio d_max/d_min", side="at most",
          threshold=0.5, aggregations=_BOTH, interval="bootstrap-se", scale="log", family="a"),
    Claim("b", "{method} gains little as d grows", "{agg} error ratio d_max/d_min", side="at least",
          threshold=0.8, aggregations=_BOTH, interval="bootstrap-se", scale="log", family="b"),
    Claim("b-comparative", "{sky} gains more than {method} as d grows",
          "{sky}'s {agg} error ratio d_max/d_min / the baseline's", side="below", threshold=1.0, aggregations=_BOTH,
          interval="bootstrap-se", scale="log", family="b-comparative"),
    Claim("c", "{sky} beats {baselines} at d_max", "(best baseline - {sky}) / best baseline, {agg} errors at d_max",
          side="above", threshold=0.0, aggregations=_BOTH, interval="bootstrap-se", family="c"),
    Claim("d", "the gap of (c) grows with n", "gap(n_max) - gap(n_min)", side="above", threshold=0.0,
          aggregations=_BOTH, interval="bootstrap-se", family="d"),
)
"""The claims, with their thresholds fixed before the first run ((b-comparative) has no free threshold:
Skyformer's ratio below the baseline's), judged per condition x n (x baseline) under both aggregations.
Skyformer is ``PAPER_METHODS[0]``, its baselines ``PAPER_METHODS[1:]``. (b) is the absolute reading of the
paper's "the baselines gain little" (a fixed bar on each baseline's ratio); (b-comparative) the relative
one (Skyformer's ratio against each baseline's). Every interval is the bootstrap standard error over windows
with Student-t quantiles (``interval="bootstrap-se"``), on the log scale for the ratios: with the few windows
of a run a percentile interval cannot leave the range of the windows' values and covers less than it
claims (:data:`COVERAGE`)."""

THRESHOLDS = {claim.id: claim.threshold for claim in CLAIMS}
"""Claim id -> its threshold (see :data:`CLAIMS`)."""

BOOTSTRAP = {"resamples": 2000, "seed": 0, "level": 0.95, "dtype": "float64"}
"""Windows are resampled with replacement (they are the independent unit: heads and seeds
share a window's text), the same draw for every n, with ``numpy.random.default_rng(seed)``
(:func:`approxlab.stats.bootstrap`)."""

COVERAGE = {"median": "ratio of medians", "mean": "ratio of means"}
"""What each aggregation's claims are simulated as when the summary states their coverage
(:func:`approxlab.studies.reporting.claims.coverage`, lognormal windows): the ratios (a), (b), (b-comparative)
on the log scale, the gaps (c), (d) -- one minus a ratio of two methods' errors -- on the linear one."""

VERDICT_COLUMNS = ["claim", "aggregation", "condition", "n", "method", "statistic", "estimate", "ci_low", "ci_high",
                   "threshold", "verdict", "interval", "windows", *calibrated.CALIBRATED_COLUMNS, "decided", "p",
                   "p_holm", "holm_decided", "former_verdict"]
"""``ci_low``, ``ci_high``: the claim's interval (``interval``) calibrated on the run's own windows
(:func:`calibrated_verdicts`; ``nominal_low``, ``nominal_high`` the declared 95% interval, ``calibrated_level`` its
calibrated nominal level, ``coverage`` the declared interval's coverage with its Monte-Carlo interval
``coverage_low``, ``coverage_high`` over ``coverage_draws`` draws, ``calibration`` why calibration fails where it
does); the verdict is read from the calibrated interval. ``former_verdict``: the verdict the former rule gave (the
declared interval, no verdict where the coverage of the first 200 draws was below 90%). ``p``: the calibrated test
(:meth:`approxlab.studies.reporting.calibrated.Calibrated.p_value`), ``p_holm`` Holm's adjustment within the claim's
family (claim x aggregation) and ``holm_decided`` whether the verdict holds with it (the verdicts are per
comparison)."""

OWN_COVERAGE = {"trials": 200, "resamples": 500, "seed": 1}
""":func:`calibrated_verdicts`: each draw of the run's windows (the same draw at every n) gets the claim's interval
from 500 bootstrap resamples (seed 2 + the draw's number, as the former coverage estimate drew them); the first
200 draws (seed 1) are that former estimate."""


def calibrated_verdicts(statistic, windows: dict, claims_by_key, *, level: float) -> dict:
    """Per key of ``statistic``: its claim's interval calibrated on the run's own windows
    (:func:`approxlab.studies.reporting.calibrated.calibrate`, paired: the same draw at every n; each claim's own
    statistic -- a gap with a minimum over baselines, a difference of gaps -- is what is recomputed)."""
    statistic = engine._per_multiset(statistic)  # every draw is a multiset of the run's windows: computed once each

    def compute(sample, trial):
        found = engine.resample(statistic, sample, resamples=BOOTSTRAP["resamples"] if trial < 0 else
                                OWN_COVERAGE["resamples"], seed=BOOTSTRAP["seed"] if trial < 0 else
                                OWN_COVERAGE["seed"] + 1 + trial)
        return {key: _family(claims_by_key(key), resampled) for key, resampled in found.items()}

    return calibrated.calibrate(compute, windows, paired=True, former_draws=OWN_COVERAGE["trials"],
                                seed=OWN_COVERAGE["seed"], level=level)


def _family(claim, resampled) -> IntervalFamily:
    """The claim's interval family on one bootstrap distribution (the bootstrap standard error x Student t on the
    claim's scale, or the percentile interval)."""
    if claim.interval == "bootstrap-se":
        return IntervalFamily.standard_error(resampled, log=claim.scale == "log")
    return IntervalFamily.percentile(resampled)


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
                if sky in ratio:
                    out[("b-comparative", condition, n, m)] = ratio[sky] / ratio[m]
            if sky in methods and baselines:
                best = min(med(wins, condition, n, m, d_hi) for m in baselines)
                gaps[(condition, n)] = (best - med(wins, condition, n, sky, d_hi)) / best
                out[("c", condition, n, sky)] = gaps[(condition, n)]
        n_lo, n_hi = min(config["n"]), max(config["n"])
        if n_lo != n_hi and (condition, n_hi) in gaps:
            out[("d", condition, n_hi, sky)] = gaps[(condition, n_hi)] - gaps[(condition, n_lo)]
    return out


def degenerate_lengths(config: dict) -> list[int]:
    """The lengths n of ``config`` at which the largest d is at least n: there a method of d keys or landmarks can be
    exact (Informer and top-k keep every key), its error a rounding error of about 1e-14, and a relative gap divided
    by it is meaningless (a quick run's (c) and (d) read -5.84e+12). No claim is computed at them (:func:`verdicts`).

    Examples
    --------
    >>> degenerate_lengths({"n": [256, 512], "num_features": [16, 64, 256]})
    [256]
    """
    largest = max(int(d) for d in config["num_features"])
    return [int(n) for n in config["n"] if largest >= int(n)]


def verdicts(config: dict, results: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: each claim's statistic, bootstrap 95% interval and verdict, under both aggregations.

    Columns: :data:`VERDICT_COLUMNS`; ``aggregation`` is ``median`` (:data:`PRIMARY_AGGREGATION`, first)
    or ``mean`` over heads x windows x seeds (float64 runs, :class:`approxlab.stats.UnitAggregate`),
    with the same thresholds. The interval is each claim's (:data:`CLAIMS`: the bootstrap standard error of
    :data:`BOOTSTRAP` resamples of the windows times Student's t, the same draws for both aggregations;
    no claim at a length where the largest d reaches n, :func:`degenerate_lengths`;
    :func:`approxlab.studies.reporting.claims.interval`); ``inconclusive`` when it reaches across the threshold
    or rests on one window (:func:`approxlab.studies.reporting.claims.judge`). Beside it, the percentile interval
    of the same resamples and the former rules' verdict on it.
    """
    errors = head_errors(results)
    errors = errors[errors["dtype"] == BOOTSTRAP["dtype"]]
    methods = set(errors["method"])
    ns = [n for n in config["n"] if n in set(errors["n"]) and n not in degenerate_lengths(config)]
    config = {**config, "n": ns, "conditions": [c for c in config["conditions"] if c in set(errors["condition"])]}
    if not ns:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    windows = {n: sorted(set(errors.loc[errors["n"] == n, "window"])) for n in ns}
    order = [PRIMARY_AGGREGATION] + [a for a in stats.AGGREGATIONS if a != PRIMARY_AGGREGATION]
    declared = {claim.id: claim for claim in CLAIMS}
    rows = []
    for how in order:
        aggregate = stats.UnitAggregate(errors, by=["condition", "n", "method", "num_features"], unit="window",
                                        column="error", how=how)
        def statistic(units, aggregate=aggregate):
            return _claim_statistics(config, aggregate, units, methods)
        found = calibrated_verdicts(statistic, windows, lambda key: declared[key[0]], level=BOOTSTRAP["level"]) \
            if min(len(w) for w in windows.values()) > 1 else None
        nominal = engine.resample(statistic, windows, resamples=BOOTSTRAP["resamples"], seed=BOOTSTRAP["seed"]) \
            if found is None else {}
        for key in (found if found is not None else nominal):
            claim, condition, n, method = key
            declared_claim = declared[claim]
            if found is not None:
                calibration = found[key]
                estimate, low, high, units = calibration.estimate, calibration.low, calibration.high, len(windows[n])
            else:  # one window: nothing to resample, nothing to calibrate
                calibration, interval = None, engine.interval(declared_claim, nominal[key], level=BOOTSTRAP["level"])
                estimate, low, high, units = interval.estimate, interval.low, interval.high, nominal[key].units
            verdict = engine.judge(declared_claim, low, high, units=units, calibrated=calibration)
            rows.append({"claim": claim, "aggregation": how, "condition": condition, "n": n, "method": method,
                         "statistic": declared_claim.statistic.format(sky=PAPER_METHODS[0], agg=how),
                         "estimate": estimate, "ci_low": low, "ci_high": high,
                         "threshold": declared_claim.threshold, "verdict": verdict,
                         "interval": declared_claim.interval + (" (log)" if declared_claim.scale == "log" else ""),
                         "windows": units, **calibrated.calibrated_columns(calibration),
                         "p": calibration.p_value(declared_claim.threshold) if calibration else float("nan"),
                         "decided": verdict in (engine.label(declared_claim, "reproduced"),
                                                engine.label(declared_claim, "not reproduced")),
                         "former_verdict": calibrated.former_verdict(declared_claim, calibration, units=units)
                         if calibration else verdict})
    table = pd.DataFrame(rows, columns=[c for c in VERDICT_COLUMNS if c not in ("p_holm", "holm_decided")])
    table = measured.holm_column(table, family=["claim", "aggregation"], level=BOOTSTRAP["level"])[VERDICT_COLUMNS]
    table.attrs["windows"] = min(len(w) for w in windows.values())
    return table


def aggregation_differences(table: pd.DataFrame) -> pd.DataFrame:
    """The claims of ``table`` (:func:`verdicts`) whose verdict differs between the median and the mean.

    Returns
    -------
    pandas.DataFrame
        ``claim, condition, n, method``, then ``median``/``mean`` (estimates) and ``median_verdict``/
        ``mean_verdict``; one row per claim instance whose two verdicts differ.
    """
    key = ["claim", "condition", "n", "method"]
    columns = [*key, "median", "median_verdict", "mean", "mean_verdict"]
    if table.empty or "aggregation" not in table:
        return pd.DataFrame(columns=columns)
    sides = [table[table["aggregation"] == how].set_index(key)[["estimate", "verdict"]]
             .rename(columns={"estimate": how, "verdict": f"{how}_verdict"}) for how in ("median", "mean")]
    both = sides[0].join(sides[1], how="inner").reset_index()
    return both[both["median_verdict"] != both["mean_verdict"]][columns].reset_index(drop=True)


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
