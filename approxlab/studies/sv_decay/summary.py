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
from ..reporting.calibrated import calibration_lines, calibration_table, holm_lines, in_short_lines
from ..reporting.summary import render, run_lines
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


def _conditioning_table(results: pd.DataFrame) -> pd.DataFrame:
    """The claim over all cases and per n (:func:`~.claims.conditioning`)."""
    return pd.concat([conditioning(results), conditioning(results, by="n")], ignore_index=True)


def _conditioning_lines(table: pd.DataFrame) -> list[str]:
    """The conditioning claim's verdict with its number, calibrated interval, unit and test, over all cases and per n
    (``table``: :func:`_conditioning_table`); the calibration behind each, and the verdicts that changed."""
    shown = table.assign(log10_ratio=[_signed_interval(e, lo, hi) for e, lo, hi in
                                      zip(table["estimate"], table["ci_low"], table["ci_high"])])
    first = table.iloc[0]
    changed = table[table["verdict"] != table["gated_verdict"]]
    lines = [f"Statistic ({CONDITIONING.statistic}): below 0 the kernelized matrix is better conditioned. Units: "
             f"{CONDITIONING.varies}; 95% percentile bootstrap of the windows within each case (stratified), the "
             "median pooled over the cases, calibrated on the run's own windows; test: the calibrated interval "
             "against 0.", "",
             *markdown_table(shown[["subset", "cases", "windows", "heads", "log10_ratio", "verdict"]]
                             .rename(columns={"log10_ratio": "log10 ratio [calibrated interval]"}), default=str), "",
             f"Verdict (all cases): **{first['verdict']}** -- median log10 kappa ratio "
             f"{_signed_interval(first['estimate'], first['ci_low'], first['ci_high'])} over {int(first['heads'])} heads in "
             f"{int(first['windows'])} windows of {int(first['cases'])} cases.", "",
             *calibration_lines("windows"), "",
             *calibration_table(table, ["subset"], former="gated_verdict"), "",
             *holm_lines(table.assign(family=CONDITIONING.id), ["subset"], family="family",
                         decided=(CONDITIONING.labels["reproduced"], CONDITIONING.labels["not reproduced"])),
             "### Changes of verdict", "",
             "Each verdict is also computed as the former rule gave it (the declared 95% percentile interval judged, "
             "and no verdict where its coverage on the run's own windows, estimated from 200 draws, was below 90%): "
             f"{len(changed)} of {len(table)} verdict(s) change" + (":" if len(changed) else "."), ""]
    if len(changed):
        lines += [*markdown_table(changed[["subset", "gated_verdict", "verdict"]].rename(
            columns={"gated_verdict": "former verdict", "verdict": "verdict now"}), default=str), ""]
    return lines + ["Before that rule, the summary said \"kernelized C is not better conditioned than D^-1 A here\" "
                    "from the pooled shares of singular heads and medians, with no interval, unit or test."]


def _signed_interval(estimate, low, high) -> str:
    """``"+0.09 [+0.08, +0.12]"``; ``n/a`` for what was not computed (a bound, or the estimate, NaN)."""
    value = f"{estimate:+.2f}" if math.isfinite(estimate) else "n/a"
    bounds = f"[{low:+.2f}, {high:+.2f}]" if math.isfinite(low) and math.isfinite(high) else "[n/a]"
    return f"{value} {bounds}"


def _in_short(table: pd.DataFrame | None) -> list[str]:
    """The "In short" section: Skyformer's conditioning claim, over all cases and per n, by its calibrated interval
    (``table``: :func:`_conditioning_table`; None: no kernelized and softmax pair to compare)."""
    if table is None:
        return in_short_lines([], [], ["the conditioning claim: no kernelized and softmax matrices in this run"])
    words = {CONDITIONING.labels["reproduced"]: [], CONDITIONING.labels["not reproduced"]: [], None: []}
    for row in table.itertuples(index=False):
        text = (f"kernelized C better conditioned than D^-1 A, {row.subset} ({row.verdict}; median log10 kappa ratio "
                f"{_signed_interval(row.estimate, row.ci_low, row.ci_high)})")
        words.get(row.verdict, words[None]).append(text)
    return in_short_lines(words[CONDITIONING.labels["reproduced"]], words[CONDITIONING.labels["not reproduced"]],
                          words[None])


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
    """The lines of ``summary.md`` under its title: "In short", per-case tables and the two claims, with numbers."""
    matrices = set(results["matrix"])
    table = _conditioning_table(results) if {"softmax", "kernelized"} <= matrices else None
    lines = [*_in_short(table), "Mean over heads and windows (condition number: median of the finite ones, and how many are "
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
        lines += ["", *_conditioning_lines(table)]
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
    return summary_lines(saved.config, saved.table(RESULTS)) + run_lines(saved)
