"""Figure 1's ``summary.md``, rendered from the saved tables only (``approxlab figure1 --plot-only``).

The run's conditions, how it differs from the paper's setting, the statistic (median and mean) and the
claims whose verdict depends on it, the claims and their verdicts, the per-head win rates, the paper's
digitised curves beside this run (:mod:`approxlab.studies.figure1.discussion`), the errors and
float32 beside float64.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ..reporting.changes import changes_lines
from ..reporting.claims import coverage_lines, tally
from ..reporting.calibrated import calibration_lines, coverage_cell, in_short_lines, interval_cell, level_cell
from ..reporting.claims import label as engine_label
from ..reporting.measured import family_lines
from ..reporting.markdown import markdown_table
from ..reporting.summary import render, timing_lines
from .discussion import aggregation_text, deviations_text, paper_text, win_rate_text
from .figures import figure_groups
from .stats import (BLOWUP_FACTOR, BOOTSTRAP, CLAIMS, COVERAGE, NEAR_ZERO_ROW, OWN_COVERAGE, PAPER_METHODS,
                    PRECISION_TOLERANCE, RESULTS, degenerate_lengths, precision_table, verdicts)

__all__ = ["TITLE", "RESULTS", "PANEL_STATS", "CONDITIONING", "WINDOWS", "VERDICTS", "PAPER_COMPARISON",
           "summary_lines", "summarize", "sections"]

TITLE = "Skyformer Figure 1: reproduction summary"
PANEL_STATS = "panel_stats.csv"
CONDITIONING = "conditioning.csv"
WINDOWS = "windows.csv"
VERDICTS = "verdicts.csv"
PAPER_COMPARISON = "paper_comparison.csv"


def _conditions_text(config, results, windows) -> list[str]:
    checkpoints = results.groupby("condition")["checkpoint"].agg(lambda s: ", ".join(sorted(set(s))))
    failures = results[results["status"] != "ok"]
    lines = [
        "## Conditions", "",
        f"- Command: `{config.get('_command', 'approxlab figure1')}`", *config.get("_timing", []),
        "- Checkpoints: " + "; ".join(f"{c}: `{k}`" for c, k in checkpoints.items())
        + f" (requested: `{config.get('checkpoint')}`; None: the offline defaults, a seeded bert-base "
          "BertConfig() and all-MiniLM-L6-v2; the paper uses bert-base-cased).",
        f"- Inputs: {config.get('inputs', 'X = LayerNorm(word + type embedding), no positions')} "
        f"(`--positions {config.get('positions', 'none')}`).",
        f"- Grid: n = {config['n']}, d = {config['num_features']}, dtypes = {config.get('dtypes', ['float64'])}, "
        f"{config['windows']} window(s) ({_window_text(results)}), {config['seeds']} seed(s) for randomized "
        "methods, deterministic methods once.",
        f"- Error: {config['error']}. Rows: {len(results)}; failed approximations: {len(failures)}"
        + _failures_text(failures) + ".",
        *_figures_text(config, results),
    ]
    if len(windows):
        table = windows.groupby(["condition", "n"]).agg(
            distinct_tokens=("distinct_tokens", "median"), distinct_q_rows=("distinct_q_rows", "median"),
            rank_a=("rank_a", "median")).reset_index()
        lines += ["", "Per window (median over windows; Q and A of head 0): distinct tokens, distinct rows of Q, "
                      "numerical rank of A (singular values above n eps64 sigma_1).", "", *markdown_table(table)]
    return lines


def _failures_text(failures: pd.DataFrame) -> str:
    """Where the failed approximations are: ``" (condition method dtype at d = 16: 10, 32: 6)"``."""
    if failures.empty:
        return ""
    columns = [c for c in ("condition", "method", "dtype") if c in failures]
    parts = []
    for key, group in failures.groupby(columns, sort=True):
        counts = group["num_features"].value_counts().sort_index()
        parts.append(" ".join(map(str, key if isinstance(key, tuple) else (key,))) + " at d = "
                     + ", ".join(f"{int(d)}: {int(c)}" for d, c in counts.items()))
    return " (" + "; ".join(parts) + ")"


def _window_text(results) -> str:
    """The window ids of the run: one list when every n has the same ones, else one per n."""
    ids = {int(n): sorted(int(w) for w in set(group)) for n, group in results.groupby("n")["window"]}
    lists = {str(w) for w in ids.values()}
    if len(lists) == 1:
        return f"ids {next(iter(ids.values()))}"
    return "ids " + ", ".join(f"{w} at n = {n}" for n, w in ids.items())


def _figures_text(config, results) -> list[str]:
    """Which figure shows which method, and the methods measured against softmax attention although
    they approximate another target (a deviation from their own paper's error)."""
    from ...methods import available, get
    from ...methods._base import TARGET_NAMES

    groups = figure_groups(config, set(results["method"]))
    lines = ["- Figures: " + "; ".join(f"`{name}.png`: {', '.join(methods)}" for name, methods in groups.items())
             + " (the same y-limits per panel)."]
    other = {m: get(m).target for m in groups.get("figure1-extra", []) + groups.get("figure1", [])
             if m in available() and get(m).target != "softmax"}
    if other:
        lines.append("- Measured against softmax attention although they approximate another target: "
                     + ", ".join(f"{m} ({TARGET_NAMES[t]})" for m, t in other.items())
                     + "; their error includes the gap between that target and softmax attention.")
    return lines


def _panel_text(stats, conditioning) -> list[str]:
    columns = ["condition", "n", "method", "num_features", "median", "mean", "q25", "q75", "max", "error_blowups",
               "blowup_rate", "near_zero_rows", "near_zero_row_rate", "failures"]
    view = stats[stats["dtype"] == "float64"][[c for c in columns if c in stats]]
    lines = ["", "## Errors (float64)", "",
             f"Median, mean and quartiles over heads x windows x seeds; blow-ups: errors above {BLOWUP_FACTOR:g} "
             f"||O||_2 (rate: share of the head errors); near-zero rows: |(A~1)_i| <= {NEAR_ZERO_ROW:g} x the head's "
             "median (rate: share of the rows; n/a for methods that do not report row sums). "
             "All statistics in `panel_stats.csv`.", "", *markdown_table(view)]
    if len(conditioning):
        cols = [c for c in ("condition", "n", "num_features", "statistical_dimension_mean",
                            "core_condition_number_median") if c in conditioning]
        lines += ["", f"Statistical dimension (lambda = 0.1 ||C_bar||_2, first window) and condition number of "
                      f"{PAPER_METHODS[0]}'s sampled core (`conditioning.csv`):", "", *markdown_table(conditioning[cols])]
    return lines


def _verdict_text(table: pd.DataFrame) -> list[str]:
    sky = PAPER_METHODS[0]
    windows = int(table.attrs.get("windows", table["windows"].min() if len(table) else 0))
    lines = ["", "## Claims", "",
             "Thresholds in code (`THRESHOLDS`, `CLAIMS` in approxlab/studies/figure1/stats.py; (a)-(d) fixed before "
             f"the first run); 95% intervals over windows: the bootstrap standard error ({BOOTSTRAP['resamples']} "
             f"resamples of the windows, seed {BOOTSTRAP['seed']}, {BOOTSTRAP['dtype']}) times Student's t with "
             "windows - 1 degrees of freedom, on the log scale for the ratios (a), (b), (b-comparative), on the linear "
             "scale for the gaps (c), (d). Inconclusive when the interval reaches across the threshold or rests on "
             "fewer than 2 windows. Each claim under the median and under the mean over heads x windows x seeds.", "",
             *_coverage_text(windows), "", *_own_coverage_text(table), ""]
    if windows < 2:
        lines += ["**What this run can and cannot decide.** With a single window there is nothing to resample: no "
                  "claim has an interval, and every verdict is inconclusive (run more --windows, e.g. the full grid's "
                  "4). What it shows: each method's error against d at each n (the figure), the estimates below as "
                  "point values, and whether every method runs on the real data; not whether a claim holds.", ""]
    aggregations = list(dict.fromkeys(table["aggregation"])) if "aggregation" in table else [None]
    for claim in CLAIMS:
        counts = []
        for how in aggregations:
            rows = table[(table["claim"] == claim.id) & ((table["aggregation"] == how) if how else True)]
            gated = int(rows["verdict"].astype(str).str.startswith("no verdict").sum())
            kept = int(rows["holm_decided"].astype(bool).sum()) if "holm_decided" in rows else 0
            counts.append((f"{how}: " if how else "") + tally(claim, rows["verdict"]) + f", {gated} no verdict "
                          f"(calibration fails); {kept} of {int(rows['decided'].sum())} decided hold with Holm")
        described = claim.text.format(sky=sky, method="each baseline", baselines=", ".join(PAPER_METHODS[1:]))
        lines.append(f"- ({claim.id}) {described}: statistic {claim.statistic.format(sky=sky, agg='median (or mean)')}, "
                     f"claim holds {claim.side} {claim.threshold:g}: {'; '.join(counts)}.")
    shown = table.assign(coverage=[coverage_cell(r) for _, r in table.iterrows()],
                         calibrated_level=[level_cell(r) for _, r in table.iterrows()],
                         nominal=[interval_cell(lo, hi) for lo, hi in zip(table["nominal_low"], table["nominal_high"])])
    shown = shown.drop(columns=["statistic", "interval", "windows", "former_verdict", "decided", "nominal_low",
                                "nominal_high", "coverage_low", "coverage_high", "calibration"], errors="ignore")
    shown = shown.rename(columns={"coverage": "coverage [MC 95%]", "calibrated_level": "calibrated level",
                                  "nominal": "95% interval", "coverage_draws": "draws"})
    return lines + ["", *markdown_table(shown, default=str),
                    *changes_lines(table, ["claim", "aggregation", "condition", "n", "method"],
                                   shown=["estimate", "nominal_low", "nominal_high", "ci_low", "ci_high"],
                                   rules="the declared 95% interval judged, and no verdict where its coverage on the "
                                         "run's own windows, estimated from the first 200 draws, was below 90%")]


def _in_short(table: pd.DataFrame) -> list[str]:
    """The "In short" section: per claim, under the declared aggregation (the median), how many instances reproduce,
    how many do not and how many this run cannot tell, with how many decided ones keep Holm's adjustment."""
    found = {"reproduced": [], "not reproduced": [], None: []}
    primary = table[table["aggregation"] == "median"] if "aggregation" in table else table
    sky = PAPER_METHODS[0]
    for claim in CLAIMS:
        rows = primary[primary["claim"] == claim.id]
        if not len(rows):
            continue
        text = claim.text.format(sky=sky, method="a baseline", baselines=", ".join(PAPER_METHODS[1:]))
        for outcome in ("reproduced", "not reproduced", None):
            words = [engine_label(claim, outcome)] if outcome else None
            chosen = rows[rows["verdict"].isin(words)] if words else rows[~rows["verdict"].isin(
                [engine_label(claim, "reproduced"), engine_label(claim, "not reproduced")])]
            if len(chosen):
                holm = f", {int(chosen['holm_decided'].sum())} with Holm" if outcome else ""
                found[outcome].append(f"({claim.id}) {text}: {len(chosen)} of {len(rows)} instances{holm}")
    return in_short_lines(found["reproduced"], found["not reproduced"], found[None], notes=[
        "Counts are claim instances (condition x n x method) under the median over heads x windows x seeds, each "
        "judged by its calibrated 95% interval; \"with Holm\": the decided ones that keep Holm's adjustment within "
        "the claim's family."])


def _own_coverage_text(table: pd.DataFrame) -> list[str]:
    """The calibration on the run's own windows per claim and aggregation, and the multiplicity statement."""
    if table.empty or "coverage" not in table or table["coverage"].isna().all():
        return []
    rows = [{"claim": claim.id, "aggregation": how, "claim instances": len(group),
             "coverage of the 95% interval (lowest / median)": f"{group['coverage'].min():.1%} / "
                                                                f"{group['coverage'].median():.1%}",
             "widest MC interval (points)": f"+-{100 * (group['coverage_high'] - group['coverage_low']).max() / 2:.1f}",
             "calibrated level (median / highest)": f"{group['calibrated_level'].median():.1%} / "
                                                    f"{group['calibrated_level'].max():.1%}",
             "calibration fails": int((group["calibration"].astype(str) != "").sum())}
            for claim in CLAIMS for how in ("median", "mean")
            for group in [table[(table["claim"] == claim.id) & (table["aggregation"] == how)]] if len(group)]
    family = table.assign(family=table["claim"] + " / " + table["aggregation"])
    return [*calibration_lines("claim instances"),
            "Here each claim's own statistic (a ratio; a gap with a minimum over baselines; a difference of gaps) is "
            "recomputed with its interval on each draw of the run's windows, the same draw at every n, "
            f"{OWN_COVERAGE['resamples']} bootstrap resamples per draw. The simulated coverage above takes (c) and (d) "
            "as a ratio of medians, which they are not; this measurement is the one the verdicts use.", "",
            *markdown_table(pd.DataFrame(rows), default=str), "",
            *family_lines(family, family="family", what="claim instances", level=BOOTSTRAP["level"])]


def _coverage_text(windows: int) -> list[str]:
    """How often these intervals cover a known truth at this run's window count (simulated), the percentile
    interval beside them."""
    ratio, gap = CLAIMS[0], CLAIMS[3]
    percentile = dataclasses.replace(ratio, interval="bootstrap", scale="linear")
    entries = [{"claims": f"{which} ({how})", "claim": claim, "units": windows, "statistic": COVERAGE[how]}
               for how in ("median", "mean")
               for which, claim in (("(a), (b), (b-comparative)", ratio), ("(c), (d)", gap),
                                    ("former intervals", percentile))]
    return [*coverage_lines(entries), "",
            "The gaps (c), (d) are one minus a ratio of two methods' errors; heavier tails than lognormal "
            "(Skyformer's blow-ups, under the mean) cover less."]


def _precision_text(parted: pd.DataFrame) -> list[str]:
    lines = ["", "## float32 beside float64", ""]
    if parted.empty:
        return lines + [f"float32 and float64 medians agree within {PRECISION_TOLERANCE:.0%} everywhere (or only "
                        "one dtype was run)."]
    methods = ", ".join(sorted(set(parted["method"])))
    lower = int((parted["float32"] < parted["float64"]).sum())
    lines += [f"They part (by more than {PRECISION_TOLERANCE:.0%}) for {methods}; float32 has the smaller error in "
              f"{lower} of these {len(parted)} rows. Where a method inverts a sampled d x d core (Nystrom-type "
              "methods), the pseudo-inverse drops the core's singular values below d eps sigma_1 (approxlab.sketch): "
              "eps is 1.2e-7 in float32 and 2.2e-16 in float64, so an ill-conditioned core keeps directions in "
              "float64 that float32 discards, which can act as a regularisation (smaller error) or lose signal "
              "(larger error). Methods without an inverse (random features, hashing, projections) only see "
              "rounding of order 1e-7.", "", *markdown_table(parted)]
    return lines


def _degenerate_text(config: dict) -> list[str]:
    degenerate = degenerate_lengths(config)
    if not degenerate:
        return []
    return ["", f"No claim is computed at n = {', '.join(map(str, degenerate))}: the largest d "
                f"({max(config['num_features'])}) reaches n there, where a method of d keys or landmarks can be exact "
                "(Informer, top-k) and a relative gap would divide by a rounding error."]


def summary_lines(config: dict, results: pd.DataFrame, stats: pd.DataFrame, *, windows=None, conditioning=None,
                  verdict_table=None) -> list[str]:
    """The sections of ``summary.md`` after its title, rendered from the tables (numbers are computed elsewhere).

    ``config`` holds ``_command`` (the run's command line) and ``_timing`` (its compute runs' lines); ``stats``: :func:`panel_statistics`;
    ``verdict_table``: :func:`verdicts` (computed when None).
    """
    windows = pd.DataFrame() if windows is None else windows
    conditioning = pd.DataFrame() if conditioning is None else conditioning
    verdict_table = verdicts(config, results) if verdict_table is None else verdict_table
    return [*_in_short(verdict_table), *_conditions_text(config, results, windows), *deviations_text(config, results),
            *aggregation_text(verdict_table, stats), *_verdict_text(verdict_table), *_degenerate_text(config),
            *win_rate_text(stats, config),
            *paper_text(stats, config), *_panel_text(stats, conditioning), *_precision_text(precision_table(stats))]


def summarize(config: dict, results: pd.DataFrame, stats: pd.DataFrame, *, windows=None, conditioning=None,
              verdict_table=None) -> str:
    """The text of ``summary.md`` (:func:`summary_lines` under the study's title)."""
    return render(TITLE, summary_lines(config, results, stats, windows=windows, conditioning=conditioning,
                                       verdict_table=verdict_table), study="figure1")


def sections(saved) -> list[str]:
    """The summary's sections from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    config = {**saved.config, "_command": saved.command, "_timing": timing_lines(saved)}
    return summary_lines(config, saved.table(RESULTS), saved.product(PANEL_STATS),
                         windows=saved.table(WINDOWS), conditioning=saved.table(CONDITIONING),
                         verdict_table=saved.product(VERDICTS))
