r"""The decoder study's figures and summary, drawn from its saved tables only (``approxlab decoder --plot-only``).

Reads ``results.csv``, ``assumptions.csv``, ``windows.csv``, ``timing.json`` and ``config.json``;
the report step writes ``error_stats.csv``, ``assumption_stats.csv``, ``head_stats.csv`` and ``verdicts.csv``
(:mod:`approxlab.studies.decoder.stats`), ``decoder-errors-<condition>.png/.pdf`` (relative error
against d, one panel per layer x n, the same y-limits per panel in every condition's figure),
``decoder-assumptions.png/.pdf`` (the assumption parameters against n, one line per condition x layer)
and ``summary.md``.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from ..reporting.changes import changes_lines
from ..reporting.claims import coverage_lines, tally
from ..reporting.markdown import format_number as _fmt
from ..reporting.markdown import markdown_table as _markdown
from .stats import (BOOTSTRAP, CLAIMS, HEAD_QUANTITIES, cost_exponents, error_intervals, head_statistics,
                    quantity_intervals)

__all__ = ["RESULTS", "ASSUMPTIONS", "WINDOWS", "ERROR_STATS", "ASSUMPTION_STATS", "HEAD_STATS", "VERDICTS", "TITLE",
           "plot", "summary_lines", "sections", "PANELS"]

RESULTS = "results.csv"
ASSUMPTIONS = "assumptions.csv"
WINDOWS = "windows.csv"
TITLE = "Decoder study: causal approximations and the theorems' assumptions on a real LLM"
ERROR_STATS = "error_stats.csv"
ASSUMPTION_STATS = "assumption_stats.csv"
HEAD_STATS = "head_stats.csv"
ASSUMPTION_CELL = ("condition", "n", "layer", "window")
RESULT_CELL = ("condition", "n", "layer", "window", "method")
VERDICTS = "verdicts.csv"

PANELS = {
    "alpha": (r"$\alpha = n\,\max_j\|Pe_j\|^2$, causal $P$", "n"),
    "alpha_block": (r"$\alpha$ of the unmasked block $A_{[n/2,n),[0,n/2)}$", "n/2"),
    "alpha_block_without_first": (r"block $\alpha$ without the first column", "n/2"),
    "kappa": (r"$\kappa$ of the block (32 heavy entries per row removed)", None),
    "entry_ratio": (r"$\sqrt{\max|s_{ij}|}\,/\,\sqrt{\ln n}$ (Alman-Song $B$ / $\sqrt{\ln n}$)", "1"),
    "sink_mass": (r"sink mass: mean share of a row on token 0", None),
    "stable_rank": (r"stable rank $\|P\|_F^2/\|P\|_2^2$", None),
    "numerical_rank": (r"numerical rank of $P$ / n (rtol $10^{-6}$)", None),
}
"""Quantity -> (panel title, reference line: ``"n"``, ``"n/2"`` (alpha's floor at a causal row 0 / the
block's size), ``"1"``, or None)."""

_LAYER_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
_CONDITION_STYLES = {"pretrained": "-", "initialized": "--"}


def _layer_style(config, layer) -> dict:
    index = config["layers"].index(layer) if layer in config["layers"] else 0
    return {"color": _LAYER_COLORS[index % len(_LAYER_COLORS)], "marker": "osD^v<>"[index % 7]}


def _draw_errors(config, panel, condition):
    """One condition's error figure: rows = layers, columns = n, relative error against d."""
    from ...plotting import error_panel, figure, figure_legend

    layers = [layer for layer in config["layers"] if layer in set(panel["layer"])]
    ns = [n for n in config["n"] if n in set(panel["n"])]
    fig, axes = figure(len(layers), len(ns), panel_size=(2.6, 2.2), sharex=True)
    for i, layer in enumerate(layers):
        for j, n in enumerate(ns):
            ax = axes[i][j]
            cell = panel[(panel["condition"] == condition) & (panel["layer"] == layer) & (panel["n"] == n)]
            error_panel(ax, cell, config["methods"], config["num_features"],
                        secondary=lambda m: config["causal_forms"][m] != True)  # noqa: E712 - "mask-renormalise"
            ax.set_title(f"layer {layer}, n = {n}")
            if j == 0:
                ax.set_ylabel(r"$\|\tilde O - O\|_2 / \|O\|_2$")
            if i == len(layers) - 1:
                ax.set_xlabel("number of features d")
    figure_legend(fig, axes)
    fig.suptitle(f"{config['checkpoint']} ({condition}):\nrelative spectral error against exact causal attention "
                 "(float64); line: median over heads and windows, band: interquartile range;\nthick lines: the "
                 "method's own causal form; thin lines: mask-renormalise (bidirectional landmarks, masked); "
                 "▲ at the top: not finite")
    return fig, axes


def _reference(ax, ns, kind):
    ns = np.asarray(ns, dtype=float)
    values = {"n": ns, "n/2": ns / 2, "1": np.ones_like(ns)}.get(kind)
    if values is not None:
        ax.plot(ns, values, color="#999999", linestyle=":", linewidth=1.0, label=f"reference: {kind}")


def _draw_assumptions(config, medians):
    """The assumption figure: one panel per quantity of :data:`PANELS`, x = n, a line per condition x layer."""
    from matplotlib.ticker import NullLocator

    from ...plotting import figure, figure_legend

    fig, axes = figure(2, 4, panel_size=(2.8, 2.3), sharex=True)
    for ax, (quantity, (title, reference)) in zip(axes.ravel(), PANELS.items()):
        rows = medians[medians["quantity"] == quantity]
        for condition in config["conditions"]:
            for layer in config["layers"]:
                line = rows[(rows["condition"] == condition) & (rows["layer"] == layer)].sort_values("n")
                if line.empty:
                    continue
                scale = line["n"] if quantity == "numerical_rank" else 1.0
                ax.plot(line["n"], line["median"] / scale, linestyle=_CONDITION_STYLES.get(condition, "-"),
                        label=f"{condition}, layer {layer}", **_layer_style(config, layer))
                ax.fill_between(line["n"], line["q25"] / scale, line["q75"] / scale, alpha=0.12,
                                color=_layer_style(config, layer)["color"], linewidth=0)
        _reference(ax, config["n"], reference)
        ax.set_xscale("log", base=2)
        ax.set_xticks(config["n"], [str(n) for n in config["n"]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("linear" if quantity in ("sink_mass", "numerical_rank", "entry_ratio") else "log")
        ax.set_title(title)
        ax.set_xlabel("n")
    figure_legend(fig, axes, ncol=4)
    fig.suptitle(f"{config['checkpoint']}: the theorems' assumptions on the causal $P = D^{{-1}}A$ (float64)\n"
                 "line: median over heads and windows, band: interquartile range; dotted grey: reference")
    return fig


def plot(saved) -> list[pathlib.Path]:
    """The figures from the saved tables: the errors of each condition (the same y-limits per panel in
    every condition's figure) and the assumptions."""
    from ...plotting import save_figure, share_ylimits, style

    config = saved.config
    panel, medians = saved.product(ERROR_STATS), saved.product(ASSUMPTION_STATS)
    written = []
    with style():
        drawn = {c: _draw_errors(config, panel, c) for c in config["conditions"] if c in set(panel["condition"])}
        share_ylimits(*(axes for _, axes in drawn.values()))
        for condition, (fig, _) in drawn.items():
            written += save_figure(fig, saved.out / f"decoder-errors-{condition}")
        written += save_figure(_draw_assumptions(config, medians), saved.out / "decoder-assumptions")
    return written


# -------------------------------------------------------------------------- summary


def _timing_text(runs, config) -> list[str]:
    lines = [f"- Command: `{config['_run'].get('command', 'approxlab decoder')}`"]
    for run in runs:
        lines.append(f"- Run: `{run['command']}`: {run['wall_seconds']:,.0f} s wall ({run['wall_seconds'] / 60:.1f} "
                     f"min), workers {run['workers']}, {run['threads']} thread(s) per process, finished "
                     f"{run['finished']}.")
    if not runs:
        lines.append("- **Not finished**: no finished run is recorded in `timing.json` (see the cell counts below).")
    return lines


def _completeness_text(config, results, assumptions) -> list[str]:
    """How many of the grid's cells each table holds: a stopped run is said to be one."""
    grid = len(config["conditions"]) * len(config["layers"]) * config["windows"]
    found = {"assumptions.csv": (len(assumptions[list(ASSUMPTION_CELL)].drop_duplicates()), grid * len(config["n"])),
             "results.csv": (len(results[list(RESULT_CELL)].drop_duplicates()),
                             grid * len(config["n"]) * len(config["methods"]))}
    text = "; ".join(f"`{name}` {have} of {want}" for name, (have, want) in found.items())
    if all(have == want for have, want in found.values()):
        return [f"- Cells: every cell of the grid ({text})."]
    return [f"- **Partial run**: cells computed {text} (condition x n x layer x window [x method]); the same "
            "command resumes it, computing only the missing cells. The statistics below use the cells present."]


def _cost_text(results) -> str:
    costs = cost_exponents(results)
    measured = "; ".join(f"{row.method} {_fmt(row.seconds_at_n_max)} s, exponent {_fmt(row.exponent)}"
                         for row in costs.itertuples(index=False))
    return (f"- Cost of mask-renormalise: the method's bidirectional approximation (its landmarks and cores, as "
            "without a mask), then the masked products -- by prefix sums, O(n d p_v), for the Nystrom family's "
            "factored matrices, and by forming the approximate matrix row block by row block, O(n^2) per head, for "
            "any other operator (the quadratic cost of the general variant; a decoder would never run it). "
            f"Measured here (median seconds per approximation of all heads of a window at n = "
            f"{int(results['n'].max())}, and the growth exponent of those seconds in n, on a shared machine): "
            f"{measured}.")


def _deviations(config, windows, results) -> list[str]:
    weights = "; ".join(sorted(set(windows["weights"]))) if len(windows) and "weights" in windows else "n/a"
    return [
        "", "## Deviations from the papers' settings", "",
        f"- Weights: {weights} (initialized: the same config as the pretrained model).",
        "- Data: WikiText-2 test windows tokenised by the decoder's own tokenizer (HyperAttention measured "
        "LongBench on ChatGLM2; Alman and Song's results are worst-case theory). Windows: "
        + config["windows_are"] + "; the lengths of one window are nested prefixes, and windows are the "
        "resampling unit.",
        "- Causal forms: performer (prefix-sum FAVOR+) and informer (causal ProbSparse, lazy rows the cumulative "
        "mean of V; the official code's `V.cumsum` is `causal_lazy=\"sum\"`) are the methods' own; the Nystrom "
        "family runs as `causal=\"mask-renormalise\"`, an evaluation variant whose landmarks are pooled over all "
        "positions (future tokens included): not a decoder layer.",
        _cost_text(results),
        f"- kappa: heavy entries are each row's {config['heavy']} largest (an oracle for the sortLSH mask M^H), on "
        "the unmasked lower-left block of the causal recursion (HyperAttention's causal algorithm applies its "
        "theorem there); a causal P has alpha >= n by its row 0 alone.",
        "- B: the split-invariant lower bound sqrt(max|q_i.k_j|/sqrt p) on Alman and Song's entry bound; the "
        "model's own entries (their B of p^(1/4) Q, K) are in `assumptions.csv` (`entry_bound`).",
        f"- Numerical rank (a dense SVD per head) only for n <= {config['rank_max_n']}; above, ||P||_2 for the "
        "stable rank comes from Golub-Kahan bidiagonalisation (tolerance 1e-8, certified).",
    ]


def _verdict_text(table: pd.DataFrame) -> list[str]:
    lines = ["", "## Which assumptions hold", "",
             f"Thresholds fixed in code before the run (`CLAIMS` in approxlab/studies/decoder/stats.py); 95% "
             f"bootstrap intervals over windows ({BOOTSTRAP['resamples']} resamples); a verdict is inconclusive "
             "when its interval crosses the threshold or rests on fewer than 2 windows.", ""]
    if len(table):
        lines += [*coverage_lines([{"claims": "all", "claim": CLAIMS[0], "units": int(table["windows"].min())}]), ""]
    if len(table) and int(table["windows"].min()) < 2:
        lines += ["With a single window there is nothing to resample: no claim has an interval, and every verdict "
                  "is inconclusive (run more --windows).", ""]
    for claim in CLAIMS:
        rows = table[table["claim"] == claim.id]
        lines.append(f"- ({claim.id}) {claim.text}: {claim.statistic} of the median {claim.quantity}, holds "
                     f"{claim.side} {claim.threshold:g}: {tally(claim, rows['verdict'])} (of {len(rows)} condition x "
                     "layer).")
    shown = table.drop(columns=["statistic", "windows", "former_verdict"], errors="ignore").rename(
        columns={"verdict": "holds?"})
    shown["holds?"] = shown["holds?"].map({"reproduced": "yes", "not reproduced": "no", "inconclusive": "?"})
    return lines + ["", *_markdown(shown), *changes_lines(table, ["claim", "condition", "layer"], shown=["estimate"],
                                                           rules="a one-window interval of zero width judged")]


def _quantity_text(assumptions, config) -> list[str]:
    ns = sorted(set(assumptions["n"]))
    lines = ["", "## The quantities at the shortest and longest n", "",
             "Median over heads x windows [95% bootstrap interval over windows]; every head in `assumptions.csv`, "
             "every quantile in `assumption_stats.csv`.", ""]
    header = ["condition", "layer", "quantity", f"n = {ns[0]}", f"n = {ns[-1]}"]
    rows = []
    for quantity in ("alpha", "alpha_block", "alpha_block_without_first", "kappa", "entry_ratio", "sink_mass",
                     "stable_rank"):
        found = quantity_intervals(assumptions, quantity)
        for (condition, layer), group in found.groupby(["condition", "layer"], sort=False):
            cells = []
            for n in (ns[0], ns[-1]):
                row = group[group["n"] == n]
                cells.append("n/a" if row.empty else f"{_fmt(float(row['median'].iloc[0]))} "
                             f"[{_fmt(float(row['ci_low'].iloc[0]))}, {_fmt(float(row['ci_high'].iloc[0]))}]")
            rows.append([condition, layer, quantity, *cells])
    return lines + _markdown(pd.DataFrame(rows, columns=header))


def _head_text(assumptions) -> list[str]:
    heads = head_statistics(assumptions)
    n, conditions = int(heads["n"].max()), set(heads["condition"])
    condition = "pretrained" if "pretrained" in conditions else sorted(conditions)[0]
    shown = heads[(heads["n"] == n) & (heads["condition"] == condition)]
    return ["", f"## Per layer and head ({condition}, n = {n})", "",
            f"Median over windows; every condition and n in `{HEAD_STATS}`, every window in `assumptions.csv`.", "",
            *_markdown(shown[["layer", "head", "kv_head", *HEAD_QUANTITIES]])]


def _error_text(results, config) -> list[str]:
    found = error_intervals(results, config)
    failed = results[results["status"] != "ok"]
    lines = ["", "## Errors", "",
             f"Median relative error ||O~ - O||_2 / ||O||_2 over heads x windows x seeds at n = {max(config['n'])}, "
             f"d = {max(config['num_features'])} [95% bootstrap interval over windows]; every point in "
             f"`error_stats.csv`. Failed approximations: {len(failed)} of {len(results)} rows; rows with a masked "
             f"row sum <= 0 (mask-renormalise divides by it): {int((results['nonpositive_rows'] > 0).sum())}.", ""]
    if found.empty:
        return lines + ["(none)"]
    found["relative error"] = [f"{_fmt(m)} [{_fmt(lo)}, {_fmt(hi)}]"
                               for m, lo, hi in zip(found["median"], found["ci_low"], found["ci_high"])]
    found["causal form"] = found["method"].map(lambda m: "own" if config["causal_forms"].get(m) is True
                                               else "mask-renormalise")
    table = found.pivot_table(index=["condition", "layer"], columns="method", values="relative error",
                              aggfunc="first").reset_index()
    return lines + _markdown(table[["condition", "layer", *[m for m in config["methods"] if m in table]]])


def summary_lines(runs, config, results, assumptions, windows, verdict_table) -> list[str]:
    """The lines of ``summary.md`` under its title (numbers come from the tables; ``runs``: ``timing.json``)."""
    return ["## Run", "", *_timing_text(runs, config), *_completeness_text(config, results, assumptions),
            f"- Checkpoint: `{config['checkpoint']}`; conditions {config['conditions']}; layers {config['layers']}; "
            f"n = {config['n']}; d = {config['num_features']}; {config['windows']} window(s) "
            f"(ids {sorted(set(assumptions['window']))}); {config['seeds']} seed(s) for randomized methods.",
            "- Methods: " + ", ".join(f"{m} ({'own causal form' if f is True else f})"
                                      for m, f in config["causal_forms"].items()) + ".",
            "- Figures: " + ", ".join(f"`decoder-errors-{c}.png`" for c in config["conditions"])
            + " (relative error against d, the same y-limits per panel), `decoder-assumptions.png`.",
            *_deviations(config, windows, results), *_verdict_text(verdict_table), *_quantity_text(assumptions, config),
            *_head_text(assumptions), *_error_text(results, config)]


def sections(saved) -> list[str]:
    """The summary's lines from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    config = {**saved.config, "_run": saved.run}
    return summary_lines(saved.timing, config, saved.table(RESULTS), saved.table(ASSUMPTIONS), saved.table(WINDOWS),
                         saved.product(VERDICTS))


