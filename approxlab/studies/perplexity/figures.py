r"""The perplexity study's figures, drawn from its saved tables only (``approxlab perplexity --plot-only``).

* ``perplexity-d.png/.pdf``: the change in log-perplexity against the budget d, one line per method, one row of
  panels per whole-window setting (a layer replaced alone, or all of them), one panel per family of methods;
* ``perplexity-error.png/.pdf``: the change in log-perplexity against the relative spectral error of the
  replaced layers, one point per method and d, coloured by method, one row per setting (the KV cache last), one
  panel per family;
* ``perplexity-within.png/.pdf``: each method's budgets joined in order, error against loss, the same panels;
* ``perplexity-kv.png/.pdf``: the KV-cache setting: the change in log-perplexity of the continuation (top row)
  and the layers' relative spectral error (bottom row) against the budget d, one column per family.

Every panel holds at most :data:`approxlab.plotting.MAX_LINES` methods (:func:`approxlab.plotting.panel_groups`)
and every x axis of the budget is labelled :data:`approxlab.plotting.BUDGET_LABEL`.

The change in log-perplexity can be negative (a method may happen to help on a window) and is drawn on a
symmetric-log axis: logarithmic beyond :data:`LINEAR_WITHIN` nats per token, linear within it.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np

from .grid import KV_CACHE, WHOLE, ignores_features
from .judging import EXACT_ERROR, exact_column
from .premise import AS_BUDGET
from .stats import settings_of

__all__ = ["LINEAR_WITHIN", "draw_d", "draw_error", "draw_within", "draw_kv"]

LINEAR_WITHIN = 1e-3
"""The symmetric-log axis of the change in log-perplexity is linear on [-LINEAR_WITHIN, LINEAR_WITHIN]."""

_DELTA = r"$\Delta$ log-perplexity (nats/token)"


def _windows(config) -> str:
    return f"{config['windows']} window" + ("s" if config["windows"] != 1 else "")


def _delta_axis(ax) -> None:
    ax.set_yscale("symlog", linthresh=LINEAR_WITHIN)
    ax.axhline(0.0, color="#999999", linewidth=0.8, zorder=1)


def _d_axis(ax, ds) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(ds, [str(d) for d in ds])
    ax.xaxis.set_minor_locator(NullLocator())


def _flat(method: str, control) -> bool:
    """The control, and a method that ignores d: drawn as a level across the panel."""
    from ...methods import available

    return method == control or (method in available() and ignores_features(method))


def _curves(ax, table, config, center: str, band) -> None:
    """One line per method against d; the control and a method that ignores d are dashed levels."""
    from ...plotting import method_curve, method_label, method_style

    for method in [config["control"], *config["methods"]]:
        rows = table[table["method"] == method].sort_values("num_features")
        if rows.empty:
            continue
        if not _flat(method, config["control"]):
            method_curve(ax, rows, method, center=center, band=band)
            continue
        value = float(rows[center].iloc[0])
        if np.isfinite(value):
            control = method == config["control"]
            ax.axhline(value, color=method_style(method)["color"], linestyle=":" if control else "--",
                       linewidth=1.0, label=method_label(method) + (" (control)" if control else " (no d)"))


def _panels(table, config) -> dict:
    """Panel title -> the methods of ``table`` drawn in it (the control apart: it is drawn in every panel)."""
    from ...plotting import panel_groups

    present = set(table["method"])
    return panel_groups([m for m in config["methods"] if m in present and m != config["control"]])


def _curve_grid(rows, panels, config, draw, *, title, ylabel):
    """``(fig, axes)``: one row per entry of ``rows``, one column per panel of ``panels`` (title -> methods);
    ``draw(ax, row, methods)`` draws a panel's curves against d; ``title(row)`` and ``ylabel(row)`` name them."""
    from ...plotting import BUDGET_LABEL, figure

    fig, axes = figure(len(rows), max(1, len(panels)), panel_size=(3.0, 2.7), sharex=True, sharey="row")
    for r, row in enumerate(rows):
        for c, (name, methods) in enumerate(panels.items()):
            ax = axes[r][c]
            draw(ax, row, methods)
            _d_axis(ax, config["num_features"])
            ax.set_title(f"{title(row)}: {name}", fontsize=8)
            if r == len(rows) - 1:
                ax.set_xlabel(BUDGET_LABEL)
        axes[r][0].set_ylabel(ylabel(row))
    return fig, axes


def _panel_curves(ax, table, config, methods, center, band, *, control=True) -> None:
    """The curves of ``methods`` (and the control's level, when ``control``) from ``table``."""
    chosen = {**config, "methods": methods, "control": config["control"] if control else None}
    _curves(ax, table[table["method"].isin([chosen["control"], *methods])], chosen, center, band)


def draw_d(saved) -> list[pathlib.Path]:
    """``perplexity-d``: the change in log-perplexity against d, one row per whole-window setting, one panel per
    family of methods."""
    from ...plotting import figure_legend, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    settings = [layers for setting, layers in settings_of(table) if setting == WHOLE]
    whole = table[table["setting"] == WHOLE]
    with style():
        fig, axes = _curve_grid(settings, _panels(whole, config), config,
                                lambda ax, layers, methods: _panel_curves(ax, whole[whole["layers"] == layers],
                                                                          config, methods, "delta",
                                                                          ("delta_low", "delta_high")),
                                title=lambda layers: "every layer" if layers == "all" else layers,
                                ylabel=lambda layers: _DELTA)
        for ax in axes.ravel():
            _delta_axis(ax)
        figure_legend(fig, axes, ncol=5)
        fig.suptitle(f"{config['checkpoint']}, {_windows(config)} of WikiText-2, {config['n']} tokens each: change "
                     "in log-perplexity against the budget d, one row per replaced setting, one panel per family\n"
                     "line: mean over windows, band: 95% bootstrap interval; dotted: the control; dashed: a method "
                     "that ignores d; ▲ at the top: the run failed")
        return save_figure(fig, saved.out / "perplexity-d")


def _title(setting, layers) -> str:
    return "KV cache, every layer" if setting == KV_CACHE else ("every layer" if layers == "all" else layers)


def _rho(premise, claim, setting, layers) -> str:
    """The premise claim's estimate [calibrated CI] on the error the figures draw (``delta.csv``'s: clean with one
    layer replaced, drifting with several)."""
    kind = "clean" if str(layers).startswith("layer ") else "drifting"
    found = premise[(premise["claim"] == claim) & (premise["setting"] == setting) & (premise["layers"] == layers)
                    & (premise["kind"] == kind)]
    if found.empty or not np.isfinite(found["estimate"].iloc[0]):
        return ""
    row, symbol = found.iloc[0], "ρ" if claim == "p1" else "Δρ"
    share = re.match(re.escape(AS_BUDGET) + r": ([\d.]+%) of", str(row["verdict"]))
    if share:  # (pw): too many draws in the budget's order for an interval
        return f"{symbol} = {row['estimate']:.2f} ({share.group(1)} of draws in d's order)"
    if not (np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])):
        return f"{symbol} = {row['estimate']:.2f} (no calibrated interval)"
    return f"{symbol} = {row['estimate']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _sizes(ds, all_ds) -> np.ndarray:
    """Marker area grows with d (the budget): 12 at the smallest d of the grid, 90 at the largest."""
    ranks = np.searchsorted(sorted(all_ds), ds) / max(1, len(all_ds) - 1)
    return 12 + 78 * ranks


def _family_grid(table, draw) -> tuple:
    """``(fig, axes)``: one row per setting of ``table``, one panel per family of its methods (at most
    :data:`approxlab.plotting.MAX_LINES` to a panel); ``draw(ax, rows, name, setting, layers)`` draws the panel's
    rows (those methods in that setting) and returns its title; the axes are the shared ones (log error, the
    symmetric-log change in log-perplexity)."""
    from ...plotting import figure, panel_groups

    pairs = settings_of(table)
    panels = panel_groups(list(dict.fromkeys(table["method"])))
    fig, axes = figure(max(1, len(pairs)), max(1, len(panels)), panel_size=(3.0, 2.5), sharey=True, sharex=True)
    for r, (setting, layers) in enumerate(pairs):
        rows = table[(table["setting"] == setting) & (table["layers"] == layers)]
        for c, (name, methods) in enumerate(panels.items()):
            ax = axes[r][c]
            ax.set_title(draw(ax, rows[rows["method"].isin(methods)], name, setting, layers), fontsize=8)
            ax.set_xscale("log")
            _delta_axis(ax)
            if r == len(pairs) - 1:
                ax.set_xlabel("relative spectral error (median)")
        axes[r][0].set_ylabel(_DELTA)
    return fig, axes


def draw_error(saved) -> list[pathlib.Path]:
    """``perplexity-error``: the change in log-perplexity against the relative spectral error, one row per setting,
    one panel per family of methods; marker size: d; shaded: the noise floor; title: the premise's (p1), rho
    within windows [calibrated CI]."""
    from ...plotting import figure_legend, method_label, method_style, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    table = table[table["method"] != config["control"]]
    exact = (table[exact_column(table)] < EXACT_ERROR).to_numpy()  # degenerate: exact attention in every head
    table = table[~exact]
    verdicts, observed = saved.product("premise.csv"), saved.product("observations.csv")

    def draw(ax, rows, name, setting, layers):
        for method, points in rows.groupby("method", sort=False):
            finite = points[np.isfinite(points["delta"]) & np.isfinite(points["spectral_median"])]
            look = method_style(method)
            ax.scatter(finite["spectral_median"], finite["delta"], s=_sizes(finite["num_features"],
                       config["num_features"]), marker=look["marker"], color=look["color"], alpha=0.8,
                       label=method_label(method))
        floor = observed[(observed["setting"] == setting) & (observed["layers"] == layers)]["floor"]
        if len(floor):
            ax.axhspan(-float(floor.iloc[0]), float(floor.iloc[0]), color="#cccccc", alpha=0.6, zorder=0)
        rho = "" if name.startswith("Nyström") else "\n(p1, within windows) " + _rho(verdicts, "p1", setting, layers)
        return f"{_title(setting, layers)}: {name}{rho}"

    with style():
        fig, axes = _family_grid(table, draw)
        figure_legend(fig, axes, ncol=6)
        fig.suptitle("change in log-perplexity against the replaced layers' relative spectral error\none point per "
                     "method and d (mean over windows), larger markers: larger d; grey band: the noise floor; "
                     f"left out: {int(exact.sum())} points of exact attention (a budget covering the tokens)\n(p1, within "
                     "windows): the stratified Spearman rho of the error drawn (premise.csv) [calibrated 95% "
                     "interval, methods and windows resampled]", fontsize=9)
        return save_figure(fig, saved.out / "perplexity-error")


def draw_within(saved) -> list[pathlib.Path]:
    """``perplexity-within``: each method's path over its budgets (error against loss), one row per setting and one
    panel per family of decoder-valid methods; the titles give the premise's (pw) [calibrated CI]."""
    from ...plotting import figure_legend, method_family, method_label, method_style, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    decoder = np.array([not method_family(m).startswith("Nyström") for m in table["method"]], dtype=bool)
    exact = (table[exact_column(table)] < EXACT_ERROR).to_numpy()  # degenerate: exact attention in every head
    table = table[(table["method"] != config["control"]).to_numpy() & decoder & ~exact]
    verdicts = saved.product("premise.csv")

    def draw(ax, rows, name, setting, layers):
        for method, points in rows.groupby("method", sort=False):
            points = points[np.isfinite(points["delta"])].sort_values("num_features")
            if len(points) < 2:
                continue
            look = method_style(method)
            ax.plot(points["spectral_median"], points["delta"], color=look["color"], linewidth=0.8,
                    marker=look["marker"], markersize=3, label=method_label(method))
        pooled = _rho(verdicts, "pw", setting, layers) or "no estimate (fewer than 5 budgets)"
        return f"{_title(setting, layers)}: {name}\n(pw) {pooled}"

    with style():
        fig, axes = _family_grid(table, draw)
        figure_legend(fig, axes, ncol=6)
        fig.suptitle("within a method: its budgets joined in order of d (decoder-valid methods; points of exact "
                     "attention left out)\n(pw) Δρ: rho(error, Delta) - rho(1/d, Delta) over each method's budgets, mean "
                     "over methods and windows, every family of the row (premise.csv) [calibrated 95% interval]",
                     fontsize=9)
        return save_figure(fig, saved.out / "perplexity-within")


def draw_kv(saved) -> list[pathlib.Path]:
    """``perplexity-kv``: the KV-cache setting against the budget d: the change in log-perplexity (top row) and the
    layers' error (bottom row), one column per family of methods."""
    from ...plotting import figure_legend, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    rows = table[table["setting"] == KV_CACHE]
    bands = {"delta": ("delta_low", "delta_high"), "spectral_median": None}
    with style():
        fig, axes = _curve_grid(list(bands), _panels(rows, config), config,
                                lambda ax, quantity, methods: _panel_curves(ax, rows, config, methods, quantity,
                                                                            bands[quantity],
                                                                            control=quantity == "delta"),
                                title=lambda q: "Δ log-perplexity" if q == "delta" else "spectral error",
                                ylabel=lambda q: _DELTA if q == "delta" else "rel. spectral error (median)")
        for ax in axes[0]:
            _delta_axis(ax)
        for ax in axes[1]:
            ax.set_yscale("log")
        figure_legend(fig, axes, ncol=5)
        fig.suptitle(f"KV-cache setting: a context of n_c = {config['context']} tokens compressed in every layer, a "
                     f"continuation of {config['continuation']} tokens scored ({_windows(config)});\nd: the context "
                     "tokens kept per head (cache policies), the features of the causal form (every other method); "
                     "top: the continuation's change in log-perplexity, bottom: the error of the layers' continuation "
                     "rows;\nline: mean over windows, band: 95% bootstrap interval; dotted: the control; dashed: a "
                     "method that ignores d; ▲ at the top: the run failed")
        return save_figure(fig, saved.out / "perplexity-kv")
