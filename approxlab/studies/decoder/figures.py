r"""The decoder study's figures, drawn from its saved tables only (``approxlab decoder --plot-only``).

* ``decoder-errors-<condition>-<family>``: relative error against d, one panel per layer x n, one figure per
  family of methods (:data:`approxlab.plotting.FAMILY_FILES`: ``cache-attention``, ``cache-geometry``,
  ``sparse``, ``low-rank``, ``nystrom``; a family's panels have the same y-limits in every condition's figure);
* ``decoder-kv-cache``: the KV-cache setting, relative error of the continuation's rows against the budget,
  one row of panels per family x condition, one column per layer;
* ``decoder-assumptions``: the assumption parameters against n, one line per condition x layer;
* ``decoder-sampling``: the uniform samples HyperAttention's residual needs on each block of its causal
  recursion (:math:`(c/r)\,\alpha/\varepsilon^2`) against the block's columns: above the diagonal sampling saves
  nothing;
* ``decoder-hyperattention``: HyperAttention's error per head against :math:`\alpha` and :math:`\kappa` (the
  correlation claims).
"""

from __future__ import annotations

import pathlib

import numpy as np

__all__ = ["PANELS", "plot"]

PANELS = {
    "alpha": (r"$\alpha$ of the causal $P$ (structural: $\geq n$)", "n"),
    "alpha_block": (r"$\alpha$ of the top unmasked block", "n/2"),
    "kappa_sortlsh": (r"$\kappa$ of that block, sortLSH mask ($b = 256$)", None),
    "kappa_oracle": (r"$\kappa$ of that block, oracle mask (32 per row)", None),
    "kappa_all_entries": (r"$\kappa$ of that block, nothing removed", None),
    "entry_ratio": (r"lower bound on Alman-Song $B$ / $\sqrt{\ln n}$", "1"),
    "sink_mass": (r"sink mass: mean share of a row on token 0", None),
    "stable_rank": (r"stable rank $\|P\|_F^2/\|P\|_2^2$", None),
}
"""Quantity -> (panel title, reference line: ``"n"``, ``"n/2"``, ``"1"`` or None)."""

_LAYER_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
_CONDITION_STYLES = {"pretrained": "-", "initialized": "--"}


def _layer_style(config, layer) -> dict:
    index = config["layers"].index(layer) if layer in config["layers"] else 0
    return {"color": _LAYER_COLORS[index % len(_LAYER_COLORS)], "marker": "osD^v<>"[index % 7]}


def _scale(ax, axis: str, values, scale: str = "log") -> None:
    """``scale`` on ``axis`` when ``values`` hold a finite positive number; else linear, with a note that the
    quantity is not defined here (a log axis without data cannot be drawn)."""
    values = np.asarray(values, dtype=float)
    if scale == "log" and not (np.isfinite(values) & (values > 0)).any():
        ax.text(0.5, 0.5, "not defined at these lengths", transform=ax.transAxes, ha="center", fontsize=7)
        scale = "linear"
    getattr(ax, f"set_{axis}scale")(scale)


def _secondary(config):
    return lambda method: config["causal_forms"].get(method) != True  # noqa: E712 - "mask-renormalise"


def _error_grid(config, rows, columns, select, ticks, *, title, ylabel, xlabel, methods=None,
                panel_size=(2.7, 2.25)):
    """A grid of error panels: ``select(row, column)`` the statistics of one panel (:func:`approxlab.plotting.
    error_panel`), ``title(row, column)`` its title, ``methods(row)`` the methods drawn in a row (default: all
    of the run's); the legend below."""
    from ...plotting import error_panel, figure, figure_legend

    fig, axes = figure(len(rows), len(columns), panel_size=panel_size, sharex=True)
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            ax = axes[i][j]
            drawn = config["methods"] if methods is None else methods(row)
            error_panel(ax, select(row, column), drawn, ticks, secondary=_secondary(config))
            ax.set_title(title(row, column))
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(rows) - 1:
                ax.set_xlabel(xlabel)
    figure_legend(fig, axes, ncol=5)
    return fig, axes


def _draw_errors(config, panel, condition, family, methods):
    """One condition's error figure for one family of methods: rows = layers, columns = n, error against d."""
    from ...plotting import BUDGET_LABEL

    layers = [layer for layer in config["layers"] if layer in set(panel["layer"])]
    ns = [n for n in config["n"] if n in set(panel["n"])]
    fig, axes = _error_grid(
        config, layers, ns,
        lambda layer, n: panel[(panel["condition"] == condition) & (panel["layer"] == layer) & (panel["n"] == n)],
        config["num_features"], title=lambda layer, n: f"layer {layer}, n = {n}",
        ylabel=r"$\|\tilde O - O\|_2 / \|O\|_2$", xlabel=BUDGET_LABEL, methods=lambda layer: methods)
    masked = any(_secondary(config)(m) for m in methods)
    fig.suptitle(f"{config['checkpoint']} ({condition}), {family}:\nrelative spectral error against exact causal attention "
                 "(float64); line: median over heads and windows, band: interquartile range;\n"
                 + ("thin lines: mask-renormalise (bidirectional landmarks, masked); " if masked else "")
                 + "▲ at the top: not finite")
    return fig, axes


def _draw_kv(config, kv):
    """The KV-cache figure: rows = family x condition, columns = layers, error of the continuation against the
    budget."""
    from ...plotting import BUDGET_LABEL, group_by_family, tidy_log_axis

    panel = kv.rename(columns={"budget": "num_features"})
    families = group_by_family(config["methods"])
    rows = [(name, c) for name in families for c in config["conditions"] if c in set(kv["condition"])]
    fig, axes = _error_grid(
        config, rows, [layer for layer in config["layers"] if layer in set(kv["layer"])],
        lambda row, layer: panel[(panel["condition"] == row[1]) & (panel["layer"] == layer)],
        config["kv_budgets"], title=lambda row, layer: f"{row[0]}\n{row[1]}, layer {layer}",
        ylabel="continuation rows:\n" r"$\|\tilde O - O\|_2 / \|O\|_2$", xlabel=BUDGET_LABEL,
        methods=lambda row: families[row[0]], panel_size=(3.4, 2.6 if len(rows) > 1 else 3.6))
    for ax in axes.ravel():
        tidy_log_axis(ax)
    fig.suptitle(f"{config['checkpoint']}: KV-cache setting, a context of {config['kv_context']} tokens compressed,\n"
                 f"then {config['kv_continuation']} continuation tokens; budget d: context tokens kept (cache "
                 "policies)\nor the method's own num_features on the whole window (per-query methods);\n"
                 "median over heads and windows, band: interquartile range")
    return fig


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
                ax.plot(line["n"], line["median"], linestyle=_CONDITION_STYLES.get(condition, "-"),
                        label=f"{condition}, layer {layer}", **_layer_style(config, layer))
                ax.fill_between(line["n"], line["q25"], line["q75"], alpha=0.12,
                                color=_layer_style(config, layer)["color"], linewidth=0)
        _reference(ax, config["n"], reference)
        ax.set_xscale("log", base=2)
        ax.set_xticks(config["n"], [str(n) for n in config["n"]])
        ax.xaxis.set_minor_locator(NullLocator())
        _scale(ax, "y", rows["median"], "linear" if quantity in ("sink_mass", "entry_ratio") else "log")
        ax.set_title(title)
        ax.set_xlabel("n")
    figure_legend(fig, axes, ncol=4)
    fig.suptitle(f"{config['checkpoint']}: the theorems' assumptions on the causal $P = D^{{-1}}A$ (float64)\n"
                 "line: median over heads and windows, band: interquartile range; dotted grey: reference")
    return fig


def _draw_sampling(config, levels):
    """Samples needed at epsilon against the block's columns, per condition; a line per layer x depth over n."""
    from ...plotting import figure, figure_legend

    conditions = [c for c in config["conditions"] if c in set(levels["condition"])]
    fig, axes = figure(1, max(1, len(conditions)), panel_size=(3.4, 3.0))
    for ax, condition in zip(axes[0], conditions):
        rows = levels[levels["condition"] == condition]
        for (layer, depth), line in rows.groupby(["layer", "depth"], sort=True):
            line = line.sort_values("n")
            ax.plot(line["columns"], line["sampling_ratio"] * line["columns"], linestyle="-" if depth == 0 else ":",
                    label=f"layer {layer}" if depth == 0 else None, **_layer_style(config, layer))
        span = np.array([max(1.0, rows["columns"].min() / 2), rows["columns"].max() * 2], dtype=float)
        ax.plot(span, span, color="#999999", linestyle="--", linewidth=1.0, label="samples = columns")
        ax.set_xscale("log", base=2)
        _scale(ax, "y", rows["sampling_ratio"])
        ax.set_title(condition)
        ax.set_xlabel("columns c of the block")
        ax.set_ylabel(r"samples needed $(c/r)\,\alpha/\varepsilon^2$")
    figure_legend(fig, axes, ncol=4)
    fig.suptitle(f"{config['checkpoint']}: uniform sampling of HyperAttention's unmasked blocks at "
                 f"$\\varepsilon$ = {config['epsilon']:g};\nworst block of each depth (solid: the top block, dotted: "
                 "deeper), median head, each point one n; above the dashed line sampling saves nothing")
    return fig


def _draw_hyperattention(config, heads):
    """Scatter of HyperAttention's error per head against alpha (worst block) and kappa (sortLSH, worst block)."""
    from ...plotting import figure, figure_legend

    conditions = [c for c in config["conditions"] if c in set(heads["condition"])]
    fig, axes = figure(len(conditions), 2, panel_size=(3.0, 2.6), squeeze=False)
    for i, condition in enumerate(conditions):
        rows = heads[heads["condition"] == condition]
        for j, (quantity, label) in enumerate((("alpha_worst", r"$\alpha$, worst unmasked block"),
                                               ("kappa_worst", r"$\kappa$ (sortLSH), worst sampled block"))):
            ax = axes[i][j]
            for layer, points in rows.groupby("layer", sort=True):
                style = _layer_style(config, layer)
                ax.plot(points[quantity], points["relative_error"], linestyle="none", marker=style["marker"],
                        color=style["color"], markersize=4, alpha=0.8, label=f"layer {layer}")
            _scale(ax, "x", rows[quantity])
            _scale(ax, "y", rows["relative_error"])
            ax.set_xlabel(label)
            ax.set_ylabel("relative error" if j == 0 else "")
            ax.set_title(condition)
    first = heads.iloc[0]
    figure_legend(fig, axes)
    fig.suptitle(f"{config['checkpoint']}: causal HyperAttention at n = {int(first['n'])}, m = "
                 f"{int(first['num_features'])}, one point per head and window")
    return fig


def plot(saved) -> list[pathlib.Path]:
    """Every figure from the saved tables (a figure whose table the run did not write is left out)."""
    from ...plotting import FAMILY_FILES, group_by_family, save_figure, share_ylimits, style, tidy_log_axis

    config = saved.config
    panel, medians = saved.product("error_stats.csv"), saved.product("assumption_stats.csv")
    written = []
    with style():
        drawn = {(c, name): _draw_errors(config, panel, c, name, methods) for c in config["conditions"]
                 if c in set(panel["condition"]) for name, methods in group_by_family(config["methods"]).items()}
        for name in {name for _, name in drawn}:  # a family's panels read the same in every condition
            share_ylimits(*(axes for (_, family), (_, axes) in drawn.items() if family == name))
        for _, axes in drawn.values():
            for ax in axes.ravel():
                tidy_log_axis(ax)
        for (condition, name), (fig, _) in drawn.items():
            written += save_figure(fig, saved.out / f"decoder-errors-{condition}-{FAMILY_FILES[name]}")
        written += save_figure(_draw_assumptions(config, medians), saved.out / "decoder-assumptions")
        others = (("kv_stats.csv", _draw_kv, "decoder-kv-cache"), ("level_stats.csv", _draw_sampling,
                                                                     "decoder-sampling"),
                  ("hyperattention.csv", _draw_hyperattention, "decoder-hyperattention"))
        for table, draw, name in others:
            frame = saved.product(table)
            if len(frame):
                written += save_figure(draw(config, frame), saved.out / name)
    return written
