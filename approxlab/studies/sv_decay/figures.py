"""The figure of :mod:`approxlab.studies.sv_decay`: singular-value spectra read from ``spectra.csv.gz``.

Per case (condition, n) and layer two panels: every singular value of the exact matrices on a
log index axis, and the rank-d approximations over their first ``1.25 d`` indices beside the
exact matrices they approximate. Each row shares its y axis down to its own
:func:`~approxlab.studies.sv_decay.spectra.noise_floor`, drawn and labelled in every panel; nothing is
drawn below it, and the legend sits below the panels.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from .spectra import EXACT_MATRICES, MATRICES, SPECTRA, noise_floor

__all__ = ["plot"]

_STYLE = {  # A is drawn wide and pale under D^-1 A and C: where the three coincide, all stay visible
    "scores": {"color": "#E06060", "linestyle": "-", "linewidth": 3.2, "label": "A (scores)"},
    "softmax": {"color": "#000000", "linestyle": "-", "linewidth": 1.1, "label": "D^-1 A (softmax)"},
    "kernelized": {"color": "#1F4E9E", "linestyle": "--", "linewidth": 1.1, "label": "C (kernelized)"},
    "completion": {"color": "#888888", "linestyle": ":", "linewidth": 1.2, "label": "C-bar (completion, eig.)"},
    "output": {"color": "#2E8B57", "linestyle": "-", "linewidth": 1.2, "label": "D^-1 A V (output)"},
}


def _draw_curve(ax, curve, style, floor):
    """One matrix's mean spectrum and min-max band against the 1-based index ``i`` (``sigma_i``),
    nothing below ``floor`` (log10 units)."""
    agg = curve.groupby("index").agg(mean=("log10_mean", "mean"), low=("log10_min", "min"),
                                     high=("log10_max", "max"))
    x = agg.index.to_numpy() + 1
    mean = agg["mean"].to_numpy()
    shown = mean >= floor
    ax.plot(x[shown], 10.0 ** mean[shown], **style)
    band = agg["high"].to_numpy() >= floor
    ax.fill_between(x[band], 10.0 ** np.maximum(agg["low"].to_numpy()[band], floor),
                    10.0 ** agg["high"].to_numpy()[band], color=style["color"], alpha=0.12, linewidth=0)


def _draw_floor(ax, n) -> None:
    """The panel's noise floor :func:`noise_floor` as a dashed line, labelled with its value."""
    floor = noise_floor(n)
    ax.axhline(floor, color="#808080", linestyle="--", linewidth=0.8, label="noise floor 2n eps64")
    ax.annotate(f"noise floor 2n eps64 = {floor:.1e}", xy=(0.02, floor), xycoords=("axes fraction", "data"),
                xytext=(0, 2), textcoords="offset points", fontsize=6, color="#606060", va="bottom")


def _draw_exact_panel(ax, data, n) -> None:
    """Every singular value of the exact matrices, index on a log axis (the tail of 2n values and the
    first few both readable)."""
    for name in EXACT_MATRICES:
        curve = data[data["matrix"] == name]
        if len(curve):
            _draw_curve(ax, curve, _STYLE[name], math.log10(noise_floor(n)))
    ax.set_xscale("log")
    ax.set_xlabel("i (log scale)")


def _draw_approximation_panel(ax, data, n, num_features) -> None:
    """The rank-d approximations beside the exact matrices they approximate (D^-1 A; C for Skyformer),
    over the first ``1.25 d`` indices, where all their singular values lie."""
    from ...plotting import method_style

    floor = math.log10(noise_floor(n))
    for name in ("softmax", "kernelized"):
        curve = data[data["matrix"] == name]
        if len(curve):
            _draw_curve(ax, curve, _STYLE[name], floor)
    for name in [m for m in MATRICES if m not in EXACT_MATRICES]:
        curve = data[data["matrix"] == name]
        if len(curve):
            style = {**method_style(name), "linewidth": 1.1, "markersize": 3.5, "markevery": 8,
                     "label": f"{method_style(name)['label']}, d = {num_features}"}
            _draw_curve(ax, curve, style, floor)
    ax.set_xlim(0, 1.25 * num_features + 1)
    ax.set_xlabel("i")


def plot(saved) -> list[pathlib.Path]:
    """Draw ``sv_decay.png/.pdf`` from the saved ``spectra.csv.gz`` (mean over heads and windows,
    min-max band), as the module docstring describes."""
    from ...plotting import figure, save_figure

    config, spectra = saved.config, saved.table(SPECTRA)
    cases = [(c, n) for c in config["conditions"] for n in config["n"]]
    layers = config["layers"]
    fig, axes = figure(len(cases), 2 * len(layers), sharey="row", panel_size=(2.3, 2.2))
    for row, (condition, n) in enumerate(cases):
        mode = config["modes"][str(n)]
        inputs = "hidden, BERT positions" if mode == "hidden" else f"embedding, positions {config.get('positions', 'none')}"
        for col, layer in enumerate(layers):
            data = spectra[(spectra["condition"] == condition) & (spectra["n"] == n) & (spectra["layer"] == layer)]
            exact_ax, approx_ax = axes[row][2 * col], axes[row][2 * col + 1]
            _draw_exact_panel(exact_ax, data, n)
            _draw_approximation_panel(approx_ax, data, n, config["num_features"])
            exact_ax.set_title(f"{condition}, {layer} layer, n={n}\n({inputs}): all", fontsize=7)
            approx_ax.set_title(f"{condition}, {layer} layer, n={n}\nd = {config['num_features']} "
                                "approximations", fontsize=7)
            for ax in (exact_ax, approx_ax):
                _draw_floor(ax, n)
                ax.set_yscale("log")
                ax.set_ylim(noise_floor(n) / 3, 3.0)
        axes[row][0].set_ylabel("sigma_i / sigma_1")
    handles = {}
    for ax in (axes[0][0], axes[0][1]):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=5, fontsize=7)
    return save_figure(fig, saved.out / "sv_decay")
