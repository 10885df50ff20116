"""Skyformer Table 3 drawn: ``instability.png/.pdf`` (:func:`plot`), from the saved ratios and intervals only."""

from __future__ import annotations

import pathlib

import numpy as np

from .report import ATTENTION_ORDER, INTERVALS, RATIOS, _columns, _task_label
from .stats import table3_value

__all__ = ["plot"]


def plot(saved) -> list[pathlib.Path]:
    """``instability.png/.pdf``: per task, each attention's per-seed ratios (dots), the arithmetic mean and its
    95% interval, Table 3's value, on a logarithmic axis (the ratios are skewed: a seed at 4 and one at 1/4
    are as far from 1); the panel's title counts its seeds. Nothing when no ratio could be computed."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    from ...plotting import figure, figure_legend, method_style, save_figure

    per_seed, summary = saved.product(RATIOS), saved.product(INTERVALS)
    ok = per_seed[per_seed["status"] == "ok"]
    if not len(ok):
        return []
    panels = _columns(per_seed)
    attentions = [a for a in ATTENTION_ORDER if a in set(per_seed["attention"]) and a != "softmax"]
    fig, axes = figure(1, len(panels), sharey=True, panel_size=(3.0, 3.6))
    for ax, (task, n) in zip(axes[0], panels):
        for x, attention in enumerate(attentions):
            colour = method_style(attention if attention != "yoso" else "yoso-e")["color"]
            values = ok[(ok["task"] == task) & (ok["n"] == n) & (ok["attention"] == attention)]["ratio"]
            values = values.to_numpy(dtype=float)
            jitter = np.linspace(-0.1, 0.1, len(values)) if len(values) > 1 else np.zeros(len(values))
            ax.scatter(x - 0.15 + jitter, values, s=8, color=colour, alpha=0.7 if len(values) <= 20 else 0.35,
                       linewidths=0)
            row = summary[(summary["task"] == task) & (summary["n"] == n) & (summary["attention"] == attention)]
            if len(row) and row["seeds"].iloc[0] > 1:
                mean, low, high = (float(row[k].iloc[0]) for k in ("mean", "nominal_low", "nominal_high"))
                ax.errorbar([x + 0.15], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color=colour,
                            capsize=3, markersize=4, label="mean [95% t interval]" if x == 0 else None)
            paper = table3_value(task, attention)
            if paper is not None:
                ax.plot([x - 0.3, x + 0.3], [paper, paper], color="black", linewidth=0.9, linestyle="--",
                        label="Table 3 (paper)")
        ax.axhline(1.0, color="grey", linewidth=1.0, label="softmax (reference, 1)")
        ax.set_xticks(range(len(attentions)), attentions, rotation=30, ha="right", fontsize="small")
        ax.set_xlim(-0.6, len(attentions) - 0.4)
        seeds = ok[(ok["task"] == task) & (ok["n"] == n) & (ok["attention"] != "softmax")].groupby("attention")["seed"]
        ax.set_title(f"{_task_label(task, n)}\n{seeds.nunique().max() if len(seeds.size()) else 0} seeds",
                     fontsize="medium")
    axes[0][0].set_yscale("log")
    ticks = [0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8]
    axes[0][0].yaxis.set_major_locator(FixedLocator(ticks))
    axes[0][0].yaxis.set_major_formatter(lambda value, _: f"{value:g}")
    axes[0][0].yaxis.set_minor_formatter(NullFormatter())
    axes[0][0].set_ylabel("tau / tau(softmax) per seed (log scale)")
    figure_legend(fig, axes, ncol=3)
    return save_figure(fig, saved.out / "instability")
