r"""Figure 1's figures and summary, drawn from its saved tables only (``approxlab figure1 --plot-only``).

Reads ``results.csv``, ``conditioning.csv``, ``windows.csv`` and ``config.json`` in a run's
folder; writes ``panel_stats.csv`` and ``verdicts.csv`` (:mod:`approxlab.studies.figure1_stats`),
``paper_comparison.csv`` (:mod:`approxlab.studies.figure1_paper`), ``figure1.png/.pdf`` (the paper's
methods, :data:`~approxlab.studies.figure1_stats.PAPER_METHODS`, their variants
:data:`~approxlab.studies.figure1_paper.PAPER_COUNTERPARTS`, and the paper's own curves drawn
faintly), ``figure1-extra.png/.pdf`` (every other method the run computed, built-in or registered,
with the same y-limits per panel as the main figure) and ``summary.md`` (with the deviations from
the paper's setting, :mod:`approxlab.studies.figure1_summary`).
"""

from __future__ import annotations

import math
import pathlib

import pandas as pd

from ._compat_io import atomic_write_text, has_results, read_json, read_results
from .figure1_paper import PAPER_COUNTERPARTS, paper_comparison, paper_curves
from .figure1_summary import aggregation_text, deviations_text, paper_text, win_rate_text
from .figure1_stats import (BLOWUP_FACTOR, BOOTSTRAP, CLAIMS, NEAR_ZERO_ROW, PAPER_METHODS, PRECISION_TOLERANCE,
                            THRESHOLDS, panel_statistics, precision_table, verdicts)
from .runner import StudyError, saved_config

__all__ = ["RESULTS", "PANEL_STATS", "CONDITIONING", "WINDOWS", "VERDICTS", "PAPER_COMPARISON", "FIGURES", "plot",
           "summarize", "write_summary"]

RESULTS = "results.csv"
PANEL_STATS = "panel_stats.csv"
CONDITIONING = "conditioning.csv"
WINDOWS = "windows.csv"
VERDICTS = "verdicts.csv"
PAPER_COMPARISON = "paper_comparison.csv"
FIGURES = {"figure1": "the paper's methods", "figure1-extra": "the other methods"}
"""File name (without suffix) -> which methods it shows: :data:`PAPER_METHODS` and their variants
(:data:`PAPER_COUNTERPARTS`), then every other method."""


REQUIRED_COLUMNS = ("condition", "n", "window", "method", "num_features", "seed", "status", "error_mean")
"""Columns of ``results.csv`` the plot step reads (``dtype`` and ``error_heads`` are optional)."""


def _load(out):
    out = pathlib.Path(out)
    if not has_results(out / RESULTS):
        raise StudyError(f"no {RESULTS} in {str(out)!r}: run the compute step first (without --plot-only).")
    config = saved_config(out / "config.json", RESULTS)
    results = read_results(out / RESULTS, required=REQUIRED_COLUMNS)
    if results.empty:
        raise StudyError(f"{str(out / RESULTS)!r} holds no rows yet: nothing to plot; rerun without --plot-only.")
    stats = read_results(out / CONDITIONING) if (out / CONDITIONING).is_file() else pd.DataFrame()
    return config, results, stats


def _read_optional(path) -> pd.DataFrame:
    return read_results(path) if pathlib.Path(path).is_file() else pd.DataFrame()


def figure_groups(config: dict, methods) -> dict:
    """``{figure name: methods}``: the run's paper methods and their variants, then all its other methods (in the run's order;
    methods of ``methods`` missing from the config at the end); empty groups left out."""
    ordered = [m for m in config["methods"] if m in set(methods)] + sorted(set(methods) - set(config["methods"]))
    main = set(PAPER_METHODS) | set(PAPER_COUNTERPARTS)
    groups = {"figure1": [m for m in ordered if m in main], "figure1-extra": [m for m in ordered if m not in main]}
    return {name: chosen for name, chosen in groups.items() if chosen}


def plot(out) -> list[pathlib.Path]:
    """Draw ``figure1.png/.pdf`` (the paper's methods) and ``figure1-extra.png/.pdf`` (every other
    method of the run) in ``out`` from ``results.csv`` only; also (re)writes ``panel_stats.csv``.

    Rows: conditions; columns: n. x: number of features d (log2 axis); y: the error
    :math:`\\|\\tilde O - O\\|_2` on a log axis, the same limits per panel in both figures
    (:func:`approxlab.plotting.share_ylimits`). Solid line: median over heads x windows x seeds
    in float64, band: its interquartile range; dotted line: the float32 median
    (:func:`approxlab.plotting.method_curve`). A method whose median is not finite at some d
    (failures) is marked by a triangle at the top edge. The paper's own curves
    (:func:`~approxlab.studies.figure1_paper.paper_curves`) are drawn faintly (thin, dashed, hollow
    markers, the method's colour) in the panels of the methods they belong to.
    """
    from ..plotting import save_figure, share_ylimits, style

    config, results, _ = _load(out)
    out = pathlib.Path(out)
    panel = panel_statistics(results)
    over = ("heads, windows and seeds" if "error_heads" in results
            else "windows and seeds of head means (no per-head errors saved)")
    atomic_write_text(out / PANEL_STATS, panel.to_csv(index=False))
    atomic_write_text(out / PAPER_COMPARISON, paper_comparison(panel).to_csv(index=False))
    with style():
        groups = figure_groups(config, set(panel["method"]))
        drawn = {name: _draw(config, panel, methods, FIGURES[name], over, twins=[f"{twin}.png" for twin in groups
                                                                                 if twin != name])
                 for name, methods in groups.items()}
        share_ylimits(*(axes for _, axes in drawn.values()))
        return [path for name, (fig, _) in drawn.items() for path in save_figure(fig, out / name)]


def _draw(config, panel, methods, label, over="heads, windows and seeds", twins=()):
    """One figure of ``methods``: ``(fig, axes)``, rows = conditions, columns = n (not saved yet);
    ``twins``: the figures drawn with the same y-limits per panel (named in the title)."""
    from ..plotting import error_panel, figure, figure_legend

    conditions = [c for c in config["conditions"] if c in set(panel["condition"])]
    ns = [n for n in config["n"] if n in set(panel["n"])]
    fig, axes = figure(len(conditions), len(ns), panel_size=(2.9, 2.4), sharex=True)
    paper_drawn = False
    for i, condition in enumerate(conditions):
        for j, n in enumerate(ns):
            ax = axes[i][j]
            cell = panel[(panel["condition"] == condition) & (panel["n"] == n)]
            error_panel(ax, cell, methods, config["num_features"], secondary=lambda m: m not in PAPER_METHODS)
            paper_drawn |= _draw_paper(ax, condition, n, methods)
            ax.set_title(f"{condition}, n = {n}")
            if j == 0:
                ax.set_ylabel(r"$\|\tilde O - O\|_2$")
            if i == len(conditions) - 1:
                ax.set_xlabel("number of features d")
    figure_legend(fig, axes, ncol=3)
    fig.suptitle(f"Skyformer Figure 1, {label}: spectral-norm error against softmax attention "
                 f"(positions: {config.get('positions', 'none')})\n"
                 f"line: median over {over} (float64), band: interquartile range; "
                 + ("dotted: float32 median; " if "float32" in set(panel["dtype"]) else "")
                 + "▲ at the top: not finite" + (f"; y-limits per panel as in {', '.join(twins)}" if twins else "")
                 + ("\nfaint dashed with hollow markers: the paper's own curve in the method's colour "
                    "(Chen et al. 2021, Fig. 1, digitised; a linear axis there)" if paper_drawn else ""))
    return fig, axes


PAPER_LABEL = "the paper's curve (faint, dashed)"
"""Legend entry of the paper's faint curves (one entry for all of them)."""


def _draw_paper(ax, condition, n, methods) -> bool:
    """The paper's curves of the paper methods among ``methods`` on ``ax`` (faint; one legend entry);
    whether there was any (the paper has no panel beyond n = 4096)."""
    from ..plotting import method_style

    paper = paper_curves()
    paper = paper[(paper["condition"] == condition) & (paper["n"] == n)]
    drawn = False
    for method in [m for m in PAPER_METHODS if m in methods]:
        rows = paper[paper["method"] == method].sort_values("num_features")
        if rows.empty:
            continue
        style = method_style(method)
        ax.plot(rows["num_features"], rows["error"], color=style["color"], marker=style["marker"], markersize=3.5,
                markerfacecolor="none", linestyle=(0, (4, 2)), linewidth=0.9, alpha=0.5, zorder=1,
                label="_nolegend_")
        drawn = True
    if drawn:
        ax.plot([], [], color="0.45", marker="o", markersize=3.5, markerfacecolor="none", linestyle=(0, (4, 2)),
                linewidth=0.9, alpha=0.7, label=PAPER_LABEL)
    return drawn


# -------------------------------------------------------------------------- summary step


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e7:
        return str(int(x))
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _markdown(frame: pd.DataFrame) -> list[str]:
    """A DataFrame as markdown table lines (numbers with 3 significant digits)."""
    if frame.empty:
        return ["(none)"]
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return lines


def _conditions_text(config, results, windows) -> list[str]:
    checkpoints = results.groupby("condition")["checkpoint"].agg(lambda s: ", ".join(sorted(set(s))))
    failures = results[results["status"] != "ok"]
    lines = [
        "## Conditions", "",
        f"- Command: `{config.get('_command', 'approxlab figure1')}`",
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
                      "numerical rank of A (singular values above n eps64 sigma_1).", "", *_markdown(table)]
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
    from ..methods import available, get
    from ..methods._base import TARGET_NAMES

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
             "All statistics in `panel_stats.csv`.", "", *_markdown(view)]
    if len(conditioning):
        cols = [c for c in ("condition", "n", "num_features", "statistical_dimension_mean",
                            "core_condition_number_median") if c in conditioning]
        lines += ["", f"Statistical dimension (lambda = 0.1 ||C_bar||_2, first window) and condition number of "
                      f"{PAPER_METHODS[0]}'s sampled core (`conditioning.csv`):", "", *_markdown(conditioning[cols])]
    return lines


def _verdict_text(table: pd.DataFrame) -> list[str]:
    sky = PAPER_METHODS[0]
    lines = ["", "## Claims", "",
             f"Thresholds in code (`THRESHOLDS`, `CLAIMS` in approxlab/studies/figure1_stats.py; (a)-(d) fixed before "
             f"the first run); 95% bootstrap intervals over windows ({BOOTSTRAP['resamples']} resamples, seed "
             f"{BOOTSTRAP['seed']}, {BOOTSTRAP['dtype']}); inconclusive when the interval reaches across the threshold. "
             "Each claim under the median and under the mean over heads x windows x seeds.", ""]
    if table.attrs.get("windows", 2) < 2:
        lines += ["With a single window there is nothing to resample: the intervals have no width and the "
                  "verdicts carry no uncertainty (run more --windows).", ""]
    aggregations = list(dict.fromkeys(table["aggregation"])) if "aggregation" in table else [None]
    for claim, (text, statistic, side) in CLAIMS.items():
        counts = []
        for how in aggregations:
            rows = table[(table["claim"] == claim) & ((table["aggregation"] == how) if how else True)]
            tally = rows["verdict"].value_counts()
            counts.append((f"{how}: " if how else "") + ", ".join(
                f"{tally.get(v, 0)} {v}" for v in ("reproduced", "not reproduced", "inconclusive")))
        described = text.format(sky=sky, method="each baseline", baselines=", ".join(PAPER_METHODS[1:]))
        lines.append(f"- ({claim}) {described}: statistic {statistic.format(sky=sky, agg='median (or mean)')}, "
                     f"claim holds {side} {THRESHOLDS[claim]:g}: {'; '.join(counts)}.")
    shown = table.drop(columns=["statistic"])
    return lines + ["", *_markdown(shown)]


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
              "rounding of order 1e-7.", "", *_markdown(parted)]
    return lines


def summarize(config: dict, results: pd.DataFrame, stats: pd.DataFrame, *, windows=None, conditioning=None,
              verdict_table=None) -> str:
    """The text of ``summary.md``, rendered from the tables (numbers are computed elsewhere).

    ``stats``: :func:`panel_statistics`; ``verdict_table``: :func:`verdicts` (computed when None).
    """
    windows = pd.DataFrame() if windows is None else windows
    conditioning = pd.DataFrame() if conditioning is None else conditioning
    verdict_table = verdicts(config, results) if verdict_table is None else verdict_table
    lines = ["# Skyformer Figure 1: reproduction summary", "",
             "Generated from the tables in this folder by `approxlab figure1 --plot-only`; do not edit by hand.", "",
             *_conditions_text(config, results, windows), *deviations_text(config, results),
             *aggregation_text(verdict_table, stats), *_verdict_text(verdict_table), *win_rate_text(stats, config),
             *paper_text(stats, config), *_panel_text(stats, conditioning), *_precision_text(precision_table(stats)),
             ""]
    return "\n".join(lines)


def write_summary(out) -> pathlib.Path:
    """Write ``verdicts.csv`` and ``summary.md`` in ``out`` from its saved tables only."""
    out = pathlib.Path(out)
    config, results, conditioning = _load(out)
    record = read_json(out / "config.json")
    grid = {**config, "_command": record.get("run", {}).get("command", "approxlab figure1")}
    table = verdicts(grid, results)
    atomic_write_text(out / VERDICTS, table.to_csv(index=False))
    text = summarize(grid, results, panel_statistics(results), windows=_read_optional(out / WINDOWS),
                     conditioning=conditioning, verdict_table=table)
    return atomic_write_text(out / "summary.md", text)


