"""Plot and summary of ``approxlab bench``, from the saved ``results.csv`` only.

:func:`plot` draws the panels (spectral-error time, agreement with the dense reference,
memory; forward time of the low-rank and kernel methods, of the sparse and sampled ones, of the causal forms); :func:`summary_lines` gives ``summary.md`` with the parts' tables. See
:mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import math

import pandas as pd

from ..reporting.markdown import markdown_table
from .causal import causal_lines
from .growth import forward_cost_lines
from .patched import patch_lines
from .ratios import ratio_lines
from .training import training_lines

__all__ = ["TITLE", "plot", "draw", "summary_lines", "sections"]

TITLE = "approxlab bench"


def _wide(results):
    """``results.csv`` pivoted to one row per (part, n, method, algorithm)."""
    index = ["part", "n", "method", "algorithm", "compute_dtype"]
    wide = results.pivot_table(index=index, columns="quantity", values="value", aggfunc="first")
    return wide.reset_index()


def _n_ticks(ax, ns) -> None:
    """Log-2 n axis with a labelled tick at every measured n (1k = 1024)."""
    ns = sorted({int(n) for n in ns})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ns])
    ax.minorticks_off()


def plot(results, path_without_suffix, machine: str | None = None) -> list:
    """Panels from the saved table: spectral-error time, disagreement, memory, then forward time (three groups,
    each over as many panels as keep it to at most ten lines),
    under a title naming the study and ``machine`` (the run's CPU model, cores, torch threads, or its GPU).

    Returns the written paths; none when only the training part ran (its table is in the summary).
    """
    from ...plotting import figure, method_style, save_figure

    if not results["part"].isin(["accuracy", "scale", "ratios", "forward"]).any():  # training, patch: tables only
        return []
    wide = _wide(results)
    forward = wide[wide["part"] == "forward"]
    panels = _forward_panels(forward)
    fig, axes = figure(1 + max(1, math.ceil(len(panels) / 3)), 3, panel_size=(3.6, 2.8))
    fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, wspace=0.02, hspace=0.04)  # tight margins
    fig.suptitle(f"{TITLE}: time and memory against torch's fused SDPA\n"
                 f"{machine or 'machine not recorded'} (the latest run's, as config.json records it)", fontsize=9)
    styles = {
        "dense": {"color": "#000000", "marker": "s", "label": "dense SVD (float64)"},
        "golub-kahan": {"color": "#0072B2", "marker": "^", "label": "Golub-Kahan (metrics.spectral_error)"},
        "block-lanczos": {"color": "#D55E00", "marker": "o", "label": "fused block Lanczos"},
        "scipy": {"color": "#009E73", "marker": "D", "label": "SciPy estimate_spectral_norm_diff"},
        "spectral-error-sdpa-lanczos": {"color": "#CC79A7", "marker": "*", "label": "block Lanczos via SDPA operator"},
    }
    errors = wide[wide["part"].isin(["accuracy", "scale", "ratios"]) & wide["algorithm"].isin(list(styles))]
    ax = axes[0, 0]
    for algorithm, style in styles.items():
        sub = errors[errors["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            ax.plot(sub["n"], sub["wall_s"], **style)
    ax.set(yscale="log", xlabel="n", ylabel="wall time (s)",
           title=r"time to compute $\|\tilde D^{-1}\tilde A - D^{-1}A\|_2$ (one head)")
    _n_ticks(ax, errors["n"])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, loc="lower right", fontsize=5)
    ax = axes[0, 1]
    accuracy = wide[(wide["part"] == "accuracy") & (wide["algorithm"] != "dense")]
    for algorithm, style in styles.items():
        sub = accuracy[accuracy["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            ax.plot(sub["n"], sub["relative_disagreement"].clip(lower=1e-17), **style)
    ax.set(xlabel="n", ylabel="|estimate - dense| / dense", title="agreement with the dense reference")
    if len(accuracy):
        ax.axhline(1e-4, color="#999999", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        _n_ticks(ax, accuracy["n"])
    else:
        ax.text(0.5, 0.5, "accuracy part not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    ax = axes[0, 2]
    gpu = "gpu_peak_mb" in errors and errors["gpu_peak_mb"].notna().any()
    for algorithm, style in styles.items():
        sub = errors[errors["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            added = sub["gpu_peak_mb"] if gpu else (sub["peak_rss_mb"] - sub["rss_before_mb"]).clip(lower=0)
            ax.plot(sub["n"], added / 1024, **{**style, "markerfacecolor": "none"})  # hollow: series near 0 overlap
    ax.set(xlabel="n", ylabel="peak GPU memory (GiB)" if gpu else "RSS added during the call (GiB)",
           title="memory of the spectral error")
    ax.set_ylim(bottom=-0.04 * ax.get_ylim()[1])  # room for whole markers at 0
    ax.axhline(0.0, color="#999999", linewidth=0.6, zorder=0)
    _n_ticks(ax, errors["n"])
    below = list(axes[1:].flat)
    for ax, (title, (methods, baselines)) in zip(below, panels.items()):
        _forward_panel(ax, forward, methods, baselines, title, method_style)
        _n_ticks(ax, forward["n"] if len(forward) else errors["n"])
    for ax in below[len(panels):]:
        ax.set_axis_off()
    return save_figure(fig, path_without_suffix)


SPARSE_METHODS = ("hyperattention", "kdeformer", "topk", "topp", "quest", "informer", "yoso", "yoso-e", "vattention",
                  "magicpig")
"""Forward panel of the sparse, sampled and hashing methods; the others (low-rank, kernel, and methods
registered by users) share one panel, and the methods timed in their causal form a third."""

_EXACT_STYLES = {"exact-sdpa": ("s", "-"), "torch-sdpa": ("x", ":"), "torch-sdpa-causal": ("x", "-."),
                 "exact-blocked": (".", "--")}


def _forward_groups(forward) -> dict:
    """``{panel title: (methods, exact baselines)}`` of the forward part, empty panels left out."""
    approximations = forward[forward["algorithm"] == "approximation"]
    causal = set(approximations.loc[approximations["causal"] == 1.0, "method"]) if "causal" in forward else set()
    methods = [m for m in dict.fromkeys(approximations["method"]) if m not in causal]
    groups = {"forward: low-rank, kernel": ([m for m in methods if m not in SPARSE_METHODS],
                                                                 ("exact-sdpa", "torch-sdpa", "exact-blocked")),
              "forward: sparse, sampled, hashing": ([m for m in methods if m in SPARSE_METHODS],
                                                               ("exact-sdpa", "torch-sdpa", "exact-blocked")),
              "forward, causal: KV-cache policies": (sorted(causal), ("torch-sdpa-causal",))}
    return {title: group for title, group in groups.items() if group[0]}


def _forward_panels(forward) -> dict:
    """The forward groups (:func:`_forward_groups`) in panels of at most :data:`approxlab.plotting.MAX_LINES`
    lines, baselines included: a group with more methods is drawn over several panels (``"(1 of 2)"``)."""
    from ...plotting import MAX_LINES, panel_groups

    return {panel: (part, baselines) for title, (methods, baselines) in _forward_groups(forward).items()
            for panel, part in panel_groups({title: methods}, limit=MAX_LINES - len(baselines)).items()}


def _forward_panel(ax, forward, methods, baselines, title, method_style) -> None:
    """Median forward time against n of ``methods`` and the exact ``baselines`` (black)."""
    for algorithm in baselines:
        sub = forward[forward["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            marker, line = _EXACT_STYLES[algorithm]
            ax.plot(sub["n"], sub["wall_s"], color="#000000", marker=marker, linestyle=line, label=algorithm,
                    linewidth=1.0, markersize=3.5)
    for method in methods:
        sub = forward[(forward["algorithm"] == "approximation") & (forward["method"] == method)].sort_values("n")
        style = method_style(method, secondary=True)
        ax.plot(sub["n"], sub["wall_s"], **{**style, "linestyle": "-", "alpha": 0.9})
    ax.set(yscale="log", xlabel="n", ylabel="forward wall time (s, median)")
    ax.set_title(title, fontsize="medium")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, fontsize=5, ncol=2, loc="best")


def _markdown_table(frame, columns, formats) -> str:
    """``columns`` of ``frame`` (missing ones empty) with their formats, ``—`` where a value is missing."""
    shown = pd.DataFrame({column: frame[column] if column in frame else None for column in columns})
    return "\n".join(markdown_table(shown, formats=formats, default="{}", missing="—", empty=None))


def summary_lines(results, config_record: dict) -> list[str]:
    """``summary.md`` under its title: the command, the machine, and the parts' tables, from the saved files."""
    wide = _wide(results)
    config = config_record.get("config", {})
    run_info = config_record.get("run", {})
    fmt = {"n": "{:.0f}", "estimate": "{:.10g}", "relative_disagreement": "{:.2e}", "wall_s": "{:.3f}",
           "cpu_s": "{:.3f}", "time_ratio_vs_dense": "{:.1f}", "cpu_ratio_vs_dense": "{:.1f}",
           "passes": "{:.0f}", "matvecs": "{:.0f}", "peak_rss_mb": "{:.0f}", "rss_before_mb": "{:.0f}",
           "distance_bound": "{:.1e}", "load_average": "{:.1f}", "p": "{:.0f}", "row_block": "{:.0f}"}
    lines = [
        f"Command: `{run_info.get('command', 'approxlab bench')}`",
        "",
        f"Machine: {run_info.get('machine', 'unknown')}. Q/K/V: {config.get('source')} "
        f"({config.get('condition')}, {config.get('mode')} mode, layer {config.get('layer')}, head "
        f"{config.get('head')}, window {config.get('window')}); error of `{config.get('error_method')}` with "
        f"num_features={config.get('num_features')}; tol={config.get('tol')}, Lanczos block "
        f"{config.get('lanczos_block')}, compute dtype {config.get('compute_dtype')}.",
        "",
        "Times are wall seconds (and process CPU seconds) measured in one process. Forward-type timings "
        "(the forward, ratios and training parts) are the median of `repeats` calls after one warm-up call "
        "(`wall_min_s`/`wall_max_s` in results.csv); the spectral-error routes and the Figure-1 cell run "
        "once. On a GPU every timed call is bracketed by `torch.cuda.synchronize()` and the memory is "
        "`torch.cuda.max_memory_allocated`; on CPU, the process RSS sampled every 2 ms. The machine may be "
        "shared: the 1-minute load average is recorded per measurement.",
        "",
    ]
    lines += ratio_lines(wide)
    lines += forward_cost_lines(wide)
    lines += causal_lines(wide, planned=config.get("causal_n"))
    lines += patch_lines(wide)
    lines += training_lines(wide)
    accuracy = wide[wide["part"] == "accuracy"].sort_values(["n", "algorithm"])
    if len(accuracy):
        lines += ["## Spectral error vs dense and SciPy", "",
                  _markdown_table(accuracy, ["n", "p", "algorithm", "estimate", "relative_disagreement", "wall_s",
                                             "cpu_s", "time_ratio_vs_dense", "cpu_ratio_vs_dense", "passes",
                                             "matvecs", "distance_bound", "peak_rss_mb", "rss_before_mb",
                                             "load_average"], fmt), ""]
    scale = wide[wide["part"] == "scale"].sort_values("n")
    if len(scale):
        lines += ["## Matrix-free path at scale", "",
                  _markdown_table(scale, ["n", "p", "algorithm", "estimate", "distance_bound", "wall_s", "cpu_s",
                                          "passes", "matvecs", "peak_rss_mb", "rss_before_mb", "load_average"],
                                  fmt), ""]
    forward = wide[wide["part"] == "forward"].sort_values(["n", "method", "algorithm"])
    if len(forward):
        lines += ["## Forward time and memory", "",
                  _markdown_table(forward, ["n", "method", "algorithm", "wall_s", "cpu_s", "peak_rss_mb",
                                            "rss_before_mb", "load_average"], fmt), ""]
    return lines


def sections(saved) -> list[str]:
    """The summary's lines from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    return summary_lines(saved.table("results.csv"), saved.record)


def draw(saved) -> list:
    """``bench.png/.pdf`` from the saved run (none when only the training part ran)."""
    return plot(saved.table("results.csv"), saved.out / "bench", machine=saved.record.get("run", {}).get("machine"))
