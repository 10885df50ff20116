r"""The perplexity study's figures, drawn from its saved tables only (``approxlab perplexity --plot-only``).

* ``perplexity-d.png/.pdf``: the change in log-perplexity against d, one line per method, one panel per
  whole-window setting (a layer replaced alone, or all of them);
* ``perplexity-error.png/.pdf``: the change in log-perplexity against the relative spectral error of the
  replaced layers, one point per method and d, coloured by method, one panel per setting (the KV cache last);
* ``perplexity-kv.png/.pdf``: the KV-cache setting: the change in log-perplexity of the continuation, and the
  layers' relative spectral error, against the budget b.

The change in log-perplexity can be negative (a method may happen to help on a window) and is drawn on a
symmetric-log axis: logarithmic beyond :data:`LINEAR_WITHIN` nats per token, linear within it.
"""

from __future__ import annotations

import pathlib

import numpy as np

from .grid import KV_CACHE, WHOLE, ignores_features
from .stats import settings_of

__all__ = ["LINEAR_WITHIN", "draw_d", "draw_error", "draw_kv"]

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


def draw_d(saved) -> list[pathlib.Path]:
    """``perplexity-d``: the change in log-perplexity against d, one panel per whole-window setting."""
    from ...plotting import figure, figure_legend, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    panels = [layers for setting, layers in settings_of(table) if setting == WHOLE]
    with style():
        fig, axes = figure(1, max(1, len(panels)), panel_size=(3.2, 3.4), sharey=True)
        for ax, layers in zip(axes[0], panels):
            rows = table[(table["setting"] == WHOLE) & (table["layers"] == layers)]
            _curves(ax, rows, config, "delta", ("delta_low", "delta_high"))
            _delta_axis(ax)
            _d_axis(ax, config["num_features"])
            ax.set(title="every layer replaced" if layers == "all" else f"{layers} replaced", xlabel="d")
        axes[0][0].set_ylabel(_DELTA)
        figure_legend(fig, axes, ncol=5)
        fig.suptitle(f"{config['checkpoint']}, {_windows(config)} of WikiText-2, {config['n']} tokens each: change "
                     "in log-perplexity against d\nline: mean over windows, band: 95% bootstrap interval; "
                     "▲ at the top: the run failed")
        return save_figure(fig, saved.out / "perplexity-d")


def draw_error(saved) -> list[pathlib.Path]:
    """``perplexity-error``: the change in log-perplexity against the relative spectral error, one panel per setting."""
    from ...plotting import figure, figure_legend, method_label, method_style, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    table = table[table["method"] != config["control"]]
    correlations = saved.product("correlations.csv")
    panels = settings_of(table)
    with style():
        fig, axes = figure(1, max(1, len(panels)), panel_size=(3.2, 3.4), sharey=True)
        for ax, (setting, layers) in zip(axes[0], panels):
            rows = table[(table["setting"] == setting) & (table["layers"] == layers)]
            for method, points in rows.groupby("method", sort=False):
                finite = points[np.isfinite(points["delta"]) & np.isfinite(points["spectral_median"])]
                style_ = method_style(method)
                ax.plot(finite["spectral_median"], finite["delta"], linestyle="none", marker=style_["marker"],
                        color=style_["color"], markersize=4, label=method_label(method))
            found = correlations[(correlations["setting"] == setting) & (correlations["layers"] == layers)
                                 & (correlations["measure"] == "spectral")]
            rho = f", ρ = {found['rho'].iloc[0]:.2f}" if len(found) and np.isfinite(found["rho"].iloc[0]) else ""
            ax.set_xscale("log")
            _delta_axis(ax)
            title = "KV cache, every layer" if setting == KV_CACHE else (
                "every layer" if layers == "all" else layers)
            ax.set(title=title + rho, xlabel="relative spectral error (median)")
        axes[0][0].set_ylabel(_DELTA)
        figure_legend(fig, axes, ncol=5)
        fig.suptitle("change in log-perplexity against the replaced layers' relative spectral error (median over "
                     "layers and heads, on each layer's own inputs)\none point per method and d: mean over windows; "
                     "ρ: Spearman over methods x d x windows")
        return save_figure(fig, saved.out / "perplexity-error")


def draw_kv(saved) -> list[pathlib.Path]:
    """``perplexity-kv``: the KV-cache setting against the budget b: the change in log-perplexity and the error."""
    from ...plotting import figure, figure_legend, save_figure, style

    config, table = saved.config, saved.product("delta.csv")
    rows = table[table["setting"] == KV_CACHE]
    with style():
        fig, axes = figure(1, 2, panel_size=(3.4, 2.8))
        _curves(axes[0][0], rows, config, "delta", ("delta_low", "delta_high"))
        _delta_axis(axes[0][0])
        errors = rows[rows["method"] != config["control"]]
        _curves(axes[0][1], errors, {**config, "control": None}, "spectral_median", None)
        axes[0][1].set_yscale("log")
        for ax in axes[0]:
            _d_axis(ax, config["num_features"])
            ax.set_xlabel("budget b")
        axes[0][0].set(ylabel=_DELTA, title="continuation's change in log-perplexity")
        axes[0][1].set(ylabel="relative spectral error (median)", title="the layers' continuation rows")
        figure_legend(fig, axes, ncol=5)
        fig.suptitle(f"KV-cache setting: a context of n_c = {config['context']} tokens compressed in every layer, a "
                     f"continuation of {config['continuation']} tokens scored ({_windows(config)})\nb: the context "
                     "tokens kept per head (cache policies), d of the causal form (every other method); line: mean "
                     "over windows, band: 95% bootstrap interval")
        return save_figure(fig, saved.out / "perplexity-kv")
