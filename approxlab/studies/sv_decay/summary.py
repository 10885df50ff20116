"""The singular-value study's ``summary.md``: per-case tables, the conditioning claim and the ranks.

Rendered from ``results.csv`` only. Skyformer's claim that the Gaussian kernel's normalisation gives "a
more reasonable condition number" than the softmax structure is decided from the share of numerically
singular heads and, between equal shares, the median finite condition number; the spectral-shifting
paper's "not a low rank matrix" from the numerical ranks of the approximations.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..reporting.markdown import markdown_table
from ..reporting.measured import GATE
from ..reporting.summary import render
from .claims import CONDITIONING, conditioning
from .spectra import MATRICES, RESULTS

__all__ = ["TITLE", "conditioning_by_length", "summary_lines", "summarize", "sections"]

TITLE = "Singular-value decay of attention matrices (Skyformer Appendix B; spectral shifting Fig. 2)"


def _fmt_kappa(values: pd.Series) -> str:
    values = values.astype(float)
    singular = int(np.isinf(values).sum())
    finite = values[np.isfinite(values)]
    if singular == len(values):
        return f"singular ({singular}/{len(values)})"
    text = f"{np.median(finite):.2e}"
    return text + (f", singular {singular}/{len(values)}" if singular else "")


def conditioning_by_length(results: pd.DataFrame) -> pd.DataFrame:
    """Per n x matrix (scores, softmax, kernelized): the share of heads numerically singular, the
    median finite condition number and the mean numerical rank (1e-6) -- the rank/conditioning
    findings, split by n so that the inputs of each length (hidden vs embedding) stay apart."""
    kept = results[results["matrix"].isin(["scores", "softmax", "kernelized"])].copy()
    kept["kappa"] = kept["condition_number"].astype(float)
    rows = []
    for (n, mode, matrix), group in kept.groupby(["n", "mode", "matrix"], sort=True):
        finite = group["kappa"][np.isfinite(group["kappa"])]
        rows.append({"n": n, "mode": mode, "matrix": matrix, "heads": len(group),
                     "singular_share": float(np.isinf(group["kappa"]).mean()),
                     "median_finite_kappa": float(finite.median()) if len(finite) else math.inf,
                     "numerical_rank": float(group["numerical_rank"].mean())})
    return pd.DataFrame(rows)


def _conditioning_lines(results: pd.DataFrame) -> list[str]:
    """The conditioning claim's verdict with its number, interval, unit and test, over all cases and per n."""
    table = pd.concat([conditioning(results), conditioning(results, by="n")], ignore_index=True)
    shown = table.assign(log10_ratio=[f"{e:+.2f} [{lo:+.2f}, {hi:+.2f}]" for e, lo, hi in
                                      zip(table["estimate"], table["ci_low"], table["ci_high"])],
                         coverage=[f"{c:.1%}" if pd.notna(c) else "no draw (1 window per case)"
                                   for c in table["coverage"]],
                         windows_for_90=[_needed(c, n, w) for c, n, w in
                                         zip(table["coverage"], table["windows_for_90"], table["windows"])])
    first = table.iloc[0]
    lines = [f"Statistic ({CONDITIONING.statistic}): below 0 the kernelized matrix is better conditioned. Units: "
             f"{CONDITIONING.varies}; 95% percentile bootstrap of the windows within each case (stratified), the "
             "median pooled over the cases; test: the interval against 0; no verdict where the interval's coverage "
             "measured on the run's own windows is below 90%.", "",
             *markdown_table(shown[["subset", "cases", "windows", "heads", "log10_ratio", "coverage",
                                    "windows_for_90", "verdict"]].rename(columns={"windows_for_90": "windows for 90%"}),
                             default=str), "",
             f"Verdict (all cases): **{first['verdict']}** -- median log10 kappa ratio {first['estimate']:+.2f} "
             f"[{first['ci_low']:+.2f}, {first['ci_high']:+.2f}] over {int(first['heads'])} heads in "
             f"{int(first['windows'])} windows of {int(first['cases'])} cases." + _sized(first), "",
             "### Changes of verdict", "",
             "The former summary said \"kernelized C is not better conditioned than D^-1 A here\" from the pooled "
             "shares of singular heads and medians, with no interval, unit or test; it is replaced by the verdict "
             f"above (**{first['verdict']}**)."]
    return lines


def _needed(coverage, needed, windows) -> str:
    """The windows 90% coverage needs, for a row below it: a count, or more than 12 times the run's."""
    if pd.isna(coverage) or coverage >= GATE:
        return ""
    return f"{int(needed)}" if pd.notna(needed) else f"more than {12 * int(windows)}"


def _sized(row) -> str:
    """What the windows per case would have to be for a verdict (nothing where the coverage reaches 90%)."""
    if pd.isna(row["coverage"]) or row["coverage"] >= GATE:
        return ""
    per_case = int(row["windows"]) // max(1, int(row["cases"]))
    if pd.isna(row["windows_for_90"]):
        return (f" With {per_case} windows per case the stratified bootstrap covers less than 90%, and still does at "
                f"12 times as many ({12 * per_case} per case), by the same resampling of the run's windows.")
    return (f" With {per_case} windows per case the stratified bootstrap covers less than 90%; by the same resampling "
            f"of the run's windows at larger counts it reaches 90% at {int(row['windows_for_90'])} windows "
            f"({int(row['windows_for_90']) // max(1, int(row['cases']))} per case, `--windows` "
            f"{int(row['windows_for_90']) // max(1, int(row['cases']))}; an approximation, the run's windows standing "
            "for the population).")


def _survival_text(config: dict, table: pd.DataFrame) -> list[str]:
    positions = config.get("positions", "none")
    lines = ["## Which rank/conditioning findings survive the inputs", "",
             f"Inputs: n <= 512 hidden states with BERT's positions; n > 512 the input embedding with positions "
             f"`{positions}` (with `--positions none` a window's rows of Q would be fixed by its distinct "
             "tokens and A rank-deficient by construction).", "",
             "| n | mode | matrix | heads | numerically singular | median finite kappa_2 | numerical rank |",
             "|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        lines.append(f"| {row.n} | {row.mode} | {row.matrix} | {row.heads} | {100 * row.singular_share:.0f}% | "
                     f"{row.median_finite_kappa:.3e} | {row.numerical_rank:.1f} |")
    lines.append("")
    for n, group in table.groupby("n"):
        by = group.set_index("matrix")
        if {"softmax", "kernelized"} <= set(by.index):
            better = (by.loc["kernelized", "singular_share"], by.loc["kernelized", "median_finite_kappa"]) < (
                by.loc["softmax", "singular_share"], by.loc["softmax", "median_finite_kappa"])
            singular = ", ".join(f"{m} {100 * by.loc[m, 'singular_share']:.0f}%" for m in by.index)
            lines.append(f"- n = {n}: numerically singular heads: {singular}; the kernelized share and median "
                         f"{'below' if better else 'not below'} softmax's (a description: the verdict with its "
                         "interval is the Claims section's row n = " + f"{n}).")
    return lines + [""]


def summary_lines(config: dict, results: pd.DataFrame) -> list[str]:
    """The lines of ``summary.md`` under its title: per-case tables and the two claims, with numbers."""
    lines = ["Mean over heads and windows (condition number: median of the finite ones, and how many are "
             "numerically singular, i.e. sigma_min <= max(n,k) * eps64 * sigma_1). d_stat(eps) = "
             "sum_i s_i/(s_i + eps*s_1); decay = least-squares slope of ln sigma_i over the first 64 indices, "
             "leaving out those at or below max(n,k) * eps64 * sigma_1 (for a rank-d approximation the fit "
             "includes the drop after its last nonzero sigma).", ""]
    cases = results.groupby(["condition", "n", "layer"], sort=False)
    for (condition, n, layer), group in cases:
        lines += [f"## {condition}, {layer} layer (index {int(group['layer_index'].iloc[0])}), n={n}, "
                  f"mode={group['mode'].iloc[0]}, {group['head'].nunique()} heads x "
                  f"{group['window'].nunique()} windows", "",
                  "| matrix | num. rank (1e-6) | stable rank | eff. rank | d_stat(0.1) | d_stat(0.01) | "
                  "kappa_2 | decay rate |", "|---|---|---|---|---|---|---|---|"]
        for name in MATRICES:
            m = group[group["matrix"] == name]
            if not len(m):
                continue
            lines.append(
                f"| {name} | {m['numerical_rank'].mean():.1f} | {m['stable_rank'].mean():.2f} | "
                f"{m['effective_rank'].mean():.1f} | {m['statistical_dimension_0.1'].mean():.1f} | "
                f"{m['statistical_dimension_0.01'].mean():.1f} | {_fmt_kappa(m['condition_number'])} | "
                f"{m['decay_rate'].mean():.3f} |")
        lines.append("")
    lines += ["## Claims", ""]
    kappa = results[results["matrix"].isin(["scores", "softmax", "kernelized"])]
    by = kappa.groupby("matrix")["condition_number"]
    singular = by.apply(lambda s: float(np.isinf(s.astype(float)).mean()))
    median = by.apply(lambda s: float(np.median(s[np.isfinite(s.astype(float))])) if np.isfinite(s.astype(float)).any()
                      else math.inf)
    lines.append("Skyformer: the Gaussian kernel's normalisation gives \"a more reasonable condition number\" "
                 "than the softmax structure. Over all cases:")
    lines.append("")
    for name in ("scores", "softmax", "kernelized"):
        if name in singular.index:
            lines.append(f"- {name}: numerically singular in {100 * singular[name]:.0f}% of heads; median finite "
                         f"kappa_2 = {median[name]:.3e}")
    if {"softmax", "kernelized"} <= set(singular.index):
        lines += ["", *_conditioning_lines(results)]
    lines += ["", "Spectral-shifting paper (Fig. 2): its approximation \"has no long tail, so it is not a low rank "
                  "matrix\". Numerical rank (1e-6) of the approximations at d = "
                  f"{config['num_features']} vs the exact softmax matrix, mean over all cases:", ""]
    ranks = results.groupby("matrix")["numerical_rank"].mean()
    for name in ("softmax", "kernelized", *config["approximations"]):
        if name in ranks.index:
            lines.append(f"- {name}: {ranks[name]:.1f}")
    approx_low = [a for a in config["approximations"] if a in ranks.index and ranks[a] <= config["num_features"] + 1]
    largest = results.groupby("matrix")["numerical_rank"].max()
    lines += ["", f"Approximations of rank <= d + 1 (low rank): {approx_low or 'none'} -- the largest numerical rank "
                  "over every head x window of each: " + ", ".join(f"{a} {int(largest[a])}" for a in approx_low)
              + f" (of {len(results[results['matrix'] == 'softmax'])} heads x windows); an exact count, no interval: "
                "the rank of a rank-d construction is bounded by d, whatever the data.", ""]
    lines += _survival_text(config, conditioning_by_length(results))
    return lines


def summarize(config: dict, results: pd.DataFrame) -> str:
    """The markdown of ``summary.md``: per-case tables and the two claims, with numbers."""
    return render(TITLE, summary_lines(config, results))


def sections(saved) -> list[str]:
    """The summary's lines from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    return summary_lines(saved.config, saved.table(RESULTS))
