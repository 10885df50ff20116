"""Figure 1's figures, drawn from its saved tables only: ``figure1.png/.pdf`` and ``figure1-extra.png/.pdf``.

``figure1`` shows the paper's methods (:data:`~approxlab.studies.figure1.stats.PAPER_METHODS`), their
variants (:data:`~approxlab.studies.figure1.paper.PAPER_COUNTERPARTS`) and the paper's own curves (wide, pale
lines, told apart from the thin dotted float32 medians in the legend), each panel's y-limits fitting its own
curves; ``figure1-extra`` every other method the run computed, built-in or registered, with y-limits per panel
that cover the main figure's too (so a curve there reads against the paper's methods).
"""

from __future__ import annotations

import pathlib
import textwrap

from .paper import PAPER_COUNTERPARTS, paper_curves
from .stats import PAPER_METHODS, RESULTS

__all__ = ["RESULTS", "PANEL_STATS", "FIGURES", "PAPER_LABEL", "FLOAT32_LABEL", "PAPER_ALPHA", "figure_groups",
           "plot"]

PANEL_STATS = "panel_stats.csv"
FIGURES = {"figure1": "the paper's methods", "figure1-extra": "the other methods"}
"""File name (without suffix) -> which methods it shows: :data:`PAPER_METHODS` and their variants
(:data:`PAPER_COUNTERPARTS`), then every other method."""


def figure_groups(config: dict, methods) -> dict:
    """``{figure name: methods}``: the run's paper methods and their variants, then all its other methods (in the run's order;
    methods of ``methods`` missing from the config at the end); empty groups left out."""
    ordered = [m for m in config["methods"] if m in set(methods)] + sorted(set(methods) - set(config["methods"]))
    main = set(PAPER_METHODS) | set(PAPER_COUNTERPARTS)
    groups = {"figure1": [m for m in ordered if m in main], "figure1-extra": [m for m in ordered if m not in main]}
    return {name: chosen for name, chosen in groups.items() if chosen}


def plot(saved) -> list[pathlib.Path]:
    """Draw ``figure1.png/.pdf`` (the paper's methods) and ``figure1-extra.png/.pdf`` (every other
    method of the run) from the saved run (:class:`~approxlab.studies.reporting.Saved`).

    Rows: conditions; columns: n. x: the budget d (log2 axis); y: the error
    :math:`\\|\\tilde O - O\\|_2` on a log axis: the main figure's limits fit its own curves, the companion's
    cover both figures' (:func:`approxlab.plotting.share_ylimits`, the main figure's limits kept). Solid line:
    median over heads x windows x seeds in float64, band: its interquartile range; thin dotted line with hollow
    markers: the float32 median (:func:`approxlab.plotting.method_curve`). A method whose median is not finite
    at some d (failures) is marked by a triangle at the top edge. The paper's own curves
    (:func:`~approxlab.studies.figure1_paper.paper_curves`) are wide, pale lines in the method's colour, without
    markers, in the panels of the methods they belong to; each kind has its own legend entry.
    """
    from ...plotting import save_figure, share_ylimits, style, tidy_log_axis

    config, results, panel = saved.config, saved.table(RESULTS), saved.product(PANEL_STATS)
    over = ("heads, windows and seeds" if "error_heads" in results
            else "windows and seeds of head means (no per-head errors saved)")
    with style():
        groups = figure_groups(config, set(panel["method"]))
        drawn = {name: _draw(config, panel, methods, FIGURES[name], over,
                             twins=[f"{twin}.png" for twin in groups if twin != name and name != "figure1"])
                 for name, methods in groups.items()}
        for _, axes in drawn.values():
            for ax in axes.ravel():
                tidy_log_axis(ax)
        if "figure1" in drawn:  # the companion covers the main figure's limits; the main figure keeps its own
            own = [ax.get_ylim() for ax in drawn["figure1"][1].ravel()]
            share_ylimits(*(axes for _, axes in drawn.values()))
            for ax, limits in zip(drawn["figure1"][1].ravel(), own):
                ax.set_ylim(*limits)
        return [path for name, (fig, _) in drawn.items() for path in save_figure(fig, saved.out / name)]


def _draw(config, panel, methods, label, over="heads, windows and seeds", twins=()):
    """One figure of ``methods``: ``(fig, axes)``, rows = conditions, columns = n (not saved yet);
    ``twins``: the figures whose y-limits per panel this one's cover (named in the title)."""
    from ...plotting import BUDGET_LABEL, error_panel, figure, figure_legend

    conditions = [c for c in config["conditions"] if c in set(panel["condition"])]
    ns = [n for n in config["n"] if n in set(panel["n"])]
    # taller panels for many methods: curves a factor of 2 apart on a log axis of several decades stay apart
    height = 2.4 if len(methods) <= CROWDED else 3.4
    fig, axes = figure(len(conditions), len(ns), panel_size=(2.9, height), sharex=True)
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
                ax.set_xlabel(BUDGET_LABEL)
    if "float32" in set(panel["dtype"]):  # the dotted curves, named once (drawn without a label of their own)
        axes[0][0].plot([], [], color="0.35", linestyle=":", linewidth=1.0, marker="o", markersize=2.5,
                        markerfacecolor="none", label=FLOAT32_LABEL)
    figure_legend(fig, axes, ncol=3)
    title = (f"Skyformer Figure 1, {label}: spectral-norm error against softmax attention "
             f"(positions: {config.get('positions', 'none')})\n"
             f"line: median over {over} (float64), band: interquartile range; "
             + ("thin dotted, hollow markers: float32 median; " if "float32" in set(panel["dtype"]) else "")
             + "▲ at the top: not finite" + (f"; y-limits per panel cover {', '.join(twins)}" if twins else "")
             + ("\nwide pale line, no markers: the paper's own curve in the method's colour "
                "(Chen et al. 2021, Fig. 1, digitised; a linear axis there)" if paper_drawn else ""))
    # wrapped to the panels' width: a title wider than the figure widens it, leaving margins blank; where a line
    # would wrap, the whole title is filled as one text (no line of one or two words left over)
    width = max(60, 52 * len(ns))
    lines = title.split("\n")
    fig.suptitle("\n".join(lines) if max(map(len, lines)) <= width else textwrap.fill("; ".join(lines), width))
    return fig, axes


CROWDED = 6
"""Above this many methods a figure's panels are drawn taller."""

PAPER_LABEL = "the paper's curve (wide, pale; Chen et al. 2021)"
"""Legend entry of the paper's curves (one entry for all of them)."""

FLOAT32_LABEL = "float32 median (thin, dotted)"
"""Legend entry of the float32 medians (one entry for all of them)."""

PAPER_ALPHA = 0.35
"""Opacity of the paper's curves: wide and pale, below the run's curves."""


def _draw_paper(ax, condition, n, methods) -> bool:
    """The paper's curves of the paper methods among ``methods`` on ``ax`` (wide, pale; one legend entry);
    whether there was any (the paper has no panel beyond n = 4096)."""
    from ...plotting import method_style

    paper = paper_curves()
    paper = paper[(paper["condition"] == condition) & (paper["n"] == n)]
    drawn = False
    for method in [m for m in PAPER_METHODS if m in methods]:
        rows = paper[paper["method"] == method].sort_values("num_features")
        if rows.empty:
            continue
        style = method_style(method)
        ax.plot(rows["num_features"], rows["error"], color=style["color"], linestyle="-", linewidth=3.5,
                alpha=PAPER_ALPHA, solid_capstyle="round", zorder=1, label="_nolegend_")
        drawn = True
    if drawn:
        ax.plot([], [], color="0.45", linestyle="-", linewidth=3.5, alpha=PAPER_ALPHA, label=PAPER_LABEL)
    return drawn
