"""The long-context settings in the report: claim (p4) with its gate, the summary's section and the retrieval
figure (``perplexity-long.png``), from ``long.csv`` only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting.claims import tally
from ..reporting.markdown import format_number as fmt
from ..reporting.markdown import markdown_table
from . import gating, resampling
from .claims import GATE, MEASURES, MIN_METHODS, P4, RESAMPLING
from .claims_summary import coverage_cell, needed_cell
from .judging import _measures, causal_form, verdict_row
from .long import UNPATCHED, long_frame, long_statistics

__all__ = ["saved_long", "gate", "long_verdicts", "long_lines", "draw_long"]


def saved_long(saved) -> pd.DataFrame:
    """``long.csv`` (empty for a run without the long-context settings, or one made before them)."""
    try:
        return saved.table("long.csv")
    except KeyError:
        return pd.DataFrame()


def gate(frame: pd.DataFrame) -> dict:
    """Per (long setting, length): the unpatched model's retrieval accuracy over the sequences."""
    if frame is None or frame.empty:
        return {}
    base = frame[frame["method"] == UNPATCHED]
    return {key: float(group["correct"].mean()) for key, group in base.groupby(["setting", "long_n"], sort=False)}


def long_verdicts(long: pd.DataFrame, config: dict) -> list[dict]:
    """(p4) per long setting: rho(spectral error, Delta of the key's NLL) across decoder-valid methods, methods and
    sequences resampled; no verdict when the interval's coverage on the run's own methods and sequences is below 90%
    (:func:`.gating.gate_rows`), nor when the unpatched model fails the retrieval gate."""
    frame = long_frame(long)
    if frame is None or frame.empty:
        return []
    rows, accuracy = [], gate(frame)
    for (setting, length), group in frame.groupby(["setting", "long_n"], sort=False):
        methods = group[~group["method"].isin([UNPATCHED, config["control"]]) & group["ok"]]
        methods = methods[(causal_form(methods) != "mask-renormalise").to_numpy()]
        if methods.empty:
            continue
        cells = pd.concat([methods[["method"]], _measures(methods)], axis=1)
        cells["window"], cells["budget"] = methods["sequence"], methods["num_features"].astype(float)
        cells["delta"] = methods["delta_key"].astype(float)
        enough = cells["method"].nunique() >= MIN_METHODS
        cells = cells.reset_index(drop=True)
        statistic = {"p4": resampling.across("spectral")}
        found = resampling.two_level(cells, statistic, columns=MEASURES,
                                     resamples=RESAMPLING["resamples"] if enough else 0, seed=RESAMPLING["seed"])["p4"]
        low, high = resampling.percentile(found[0], found[1], RESAMPLING["level"])
        count = int(cells["method"].nunique())
        row = verdict_row(P4, setting, f"all, {length} tokens", found[0], low, high, methods=count,
                          windows=int(cells["window"].nunique()), points=len(cells), units=count)
        passed = accuracy.get((setting, length), 0.0)
        if passed < GATE:  # the model cannot do the task: no verdict, and no interval to measure
            row["verdict"] = f"no verdict (the exact model retrieves {passed:.0%} < {GATE:.0%})"
        rows += gating.gate_rows([{**row, "_statistic": "p4"}], cells, statistic)
    return rows


def long_lines(saved, verdicts: pd.DataFrame) -> list[str]:
    """The summary's long-context section."""
    long = saved_long(saved)
    if long.empty:
        return []
    config, frame = saved.config, long_frame(long)
    accuracy = gate(frame)
    table = long_statistics(long)
    table = table.assign(**{c: [fmt(float(v)) for v in table[c]] for c in ("accuracy", "delta_key", "delta",
                                                                     "spectral_median")})
    p4 = verdicts[verdicts["claim"] == P4.id]
    shown = p4.assign(**{"estimate [95% CI]": [f"{fmt(e)} [{fmt(lo)}, {fmt(hi)}]" for e, lo, hi in
                                               p4[["estimate", "ci_low", "ci_high"]].to_numpy(float)],
                         "coverage (own units)": [coverage_cell(*v) for v in p4[["coverage", "coverage_low",
                                                                                  "coverage_high"]].to_numpy(float)],
                         "methods for 90%": [needed_cell(c, n, m, max(gating.SIZING["multiples"])) for c, n, m in
                                             p4[["coverage", "units_for_90", "methods"]].itertuples(index=False)]})
    return ["", "## Long context: pass-key retrieval", "",
            f"Sequences of {' and '.join(map(str, config['long_n']))} tokens: {config['long_windows']} WikiText-2 "
            "windows x the key at depths "
            f"{config['long_depths']} (`approxlab.studies.perplexity.passkey`); every layer replaced, the whole "
            "sequence (long-whole) or the context up to the question compressed (long-kv). The exact (unpatched) model "
            "retrieves the key in " + ", ".join(f"{s} at {n} tokens: {a:.0%}" for (s, n), a in accuracy.items())
            + f" of the sequences (the gate of (p4): {GATE:.0%}).", "",
            f"- **(p4)** {P4.statistic}, holds at rho >= {P4.threshold:g} (methods and sequences resampled; no verdict "
            "where the interval's coverage on the run's own units is below 90%): "
            f"{tally(P4, p4['verdict'])}, "
            f"{int(p4['verdict'].astype(str).str.startswith('no verdict: coverage').sum())} no verdict (coverage "
            "below 90%).", "",
            *markdown_table(shown[["setting", "layers", "estimate [95% CI]", "coverage (own units)", "methods for 90%",
                                   "verdict", "methods", "windows"]]), "",
            "Per method and budget: retrieval accuracy, mean change of the key's NLL (nats, summed over its tokens), "
            "mean change in log-perplexity, median spectral error (`long_stats.csv`):", "",
            *markdown_table(table), ""]


def draw_long(saved):
    """``perplexity-long``: retrieval (accuracy and the key's change in NLL) against the budget, per long setting."""
    from ...plotting import figure, figure_legend, method_label, method_style, save_figure, style

    long = saved_long(saved)
    if long.empty:
        return []
    table = long_statistics(long)
    table = table[~table["method"].isin([UNPATCHED, saved.config["control"]])]
    settings = list(dict.fromkeys(map(tuple, table[["setting", "long_n"]].itertuples(index=False, name=None))))
    accuracy = gate(long_frame(long))
    budgets = sorted(int(d) for d in table["num_features"].unique())
    with style():
        fig, axes = figure(2, max(1, len(settings)), panel_size=(3.4, 2.6), sharex=True)
        for column, setting in enumerate(settings):
            rows = table[(table["setting"] == setting[0]) & (table["long_n"] == setting[1])]
            for method, points in rows.groupby("method", sort=False):
                points = points.sort_values("num_features")
                look = method_style(method)
                for row, value in ((0, "accuracy"), (1, "delta_key")):
                    axes[row][column].plot(points["num_features"], points[value], marker=look["marker"],
                                           color=look["color"], label=method_label(method) if row == 0 else None)
            axes[0][column].axhline(accuracy.get(setting, np.nan), color="black", linestyle=":", linewidth=1,
                                    label="exact model" if column == 0 else None)
            axes[0][column].set(title=f"{setting[0]}, {setting[1]} tokens", ylim=(-0.05, 1.05),
                                ylabel="retrieval accuracy")
            axes[1][column].set(xscale="log", xlabel="budget d", ylabel="Δ NLL of the key (nats)")
            axes[1][column].set_xticks(budgets, [str(d) for d in budgets])  # the budgets run, not decades
            axes[1][column].minorticks_off()
            axes[1][column].axhline(0.0, color="#999999", linewidth=0.8)
        figure_legend(fig, axes, ncol=5)
        fig.suptitle("pass-key retrieval against the budget (mean over sequences); dotted: the exact model")
        return save_figure(fig, saved.out / "perplexity-long")
