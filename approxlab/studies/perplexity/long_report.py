"""The long-context settings in the report: claim (p4) with its retrieval gate and calibrated interval, the summary's section and the retrieval
figure (``perplexity-long.png``), from ``long.csv`` only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting.markdown import markdown_table
from ..reporting.markdown import format_number as fmt
from . import gating
from .claims import GATE, P4
from .claims_summary import CALIBRATED_SHOWN, calibrated_cells, verdict_tally
from .judging import causal_form, measures_of, verdict_row
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
    sequences drawn crossed (:func:`.gating.rho_over_cells`), the interval calibrated on the run's own methods and
    sequences (:func:`.gating.calibrated_row`); no verdict when the unpatched model fails the retrieval gate."""
    frame = long_frame(long)
    if frame is None or frame.empty:
        return []
    rows, accuracy = [], gate(frame)
    for (setting, length), group in frame.groupby(["setting", "long_n"], sort=False):
        methods = group[~group["method"].isin([UNPATCHED, config["control"]]) & group["ok"]]
        methods = methods[(causal_form(methods) != "mask-renormalise").to_numpy()]
        if methods.empty:
            continue
        cells = pd.concat([methods[["method"]], measures_of(methods)], axis=1)
        cells["window"], cells["budget"] = methods["sequence"], methods["num_features"].astype(float)
        cells["delta"] = methods["delta_key"].astype(float)
        cells = cells.reset_index(drop=True)
        statistic = gating.rho_over_cells(cells)
        count, windows = int(cells["method"].nunique()), int(cells["window"].nunique())
        estimate = float(statistic(np.ones((1, count)), np.ones((1, windows)))[0])
        row = verdict_row(P4, setting, f"all, {length} tokens", estimate, np.nan, np.nan, methods=count,
                          windows=windows, points=len(cells), units=count)
        passed = accuracy.get((setting, length), 0.0)
        if passed < GATE:  # the model cannot do the task: no verdict, and no interval to calibrate
            row["verdict"] = f"no verdict (the exact model retrieves {passed:.0%} < {GATE:.0%})"
        rows.append(gating.calibrated_row(P4, row, statistic, count, windows))
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
    shown = calibrated_cells(p4)
    return ["", "## Long context: pass-key retrieval", "",
            f"Sequences of {' and '.join(map(str, config['long_n']))} tokens: {config['long_windows']} WikiText-2 "
            "windows x the key at depths "
            f"{config['long_depths']} (`approxlab.studies.perplexity.passkey`); every layer replaced, the whole "
            "sequence (long-whole) or the context up to the question compressed (long-kv). The exact (unpatched) model "
            "retrieves the key in " + ", ".join(f"{s} at {n} tokens: {a:.0%}" for (s, n), a in accuracy.items())
            + f" of the sequences (the gate of (p4): {GATE:.0%}).", "",
            f"- **(p4)** {P4.statistic}, holds at rho >= {P4.threshold:g} (methods and sequences drawn crossed; the "
            "verdict read from the interval calibrated on the run's own methods and sequences, the former 90% "
            f"coverage gate's verdict beside): {verdict_tally(P4, p4['verdict'])}.", "",
            *markdown_table(shown[["setting", "layers", *CALIBRATED_SHOWN, "methods", "windows"]]), "",
            "Per method and budget: retrieval accuracy, mean change of the key's NLL (nats, summed over its tokens), "
            "mean change in log-perplexity, median spectral error (`long_stats.csv`):", "",
            *markdown_table(table), ""]


def depth_table(long: pd.DataFrame, config: dict) -> dict:
    """Per long setting ``(setting, long_n)``: two frames, ``accuracy`` and ``delta_key``, one row per method
    (the unpatched model first, then the methods of ``config`` in order; the control left out) and one column per
    budget x depth (``"d = 64, depth 25%"``): the retrieval accuracy and the mean change of the key's negative
    log-probability over the windows whose run succeeded at that depth (NaN where the method did not run: a
    method that ignores d runs at one budget); and ``failed``, the failed runs of each cell."""
    frame = long_frame(long)
    if frame is None or frame.empty:
        return {}
    order = [UNPATCHED, *[m for m in config["methods"] if m != config["control"]]]
    found = {}
    for key, rows in frame.groupby(["setting", "long_n"], sort=False):
        rows = rows[rows["method"].isin(order)]
        budgets = sorted(int(d) for d in rows.loc[rows["method"] != UNPATCHED, "num_features"].unique())
        columns = [(d, depth) for d in budgets for depth in sorted(rows["depth"].unique())]
        names = [f"d = {d}, depth {depth:.0%}" for d, depth in columns]
        methods = [m for m in order if m in set(rows["method"])]
        tables = {name: pd.DataFrame(np.nan, index=methods, columns=names) for name in ("accuracy", "delta_key")}
        failed = pd.DataFrame(0, index=methods, columns=names)
        for (method, d, depth), cell in rows.groupby(["method", "num_features", "depth"]):
            targets = [name for (budget, at), name in zip(columns, names)
                       if at == depth and (budget == d or method == UNPATCHED)]
            ok = cell[cell["ok"]]
            for name in targets:
                failed.loc[method, name] = int((~cell["ok"]).sum())
                if len(ok):
                    tables["accuracy"].loc[method, name] = float(ok["correct"].mean())
                    tables["delta_key"].loc[method, name] = float(ok["delta_key"].mean())
        found[key] = {**tables, "failed": failed}
    return found


def _heatmap(ax, table, failed, *, cmap, vmin, vmax, fmt_cell) -> object:
    """``table`` (methods x columns) as coloured cells with their values written in; a cell of no run is blank, a
    cell with failed runs says how many."""
    values = table.to_numpy(dtype=float)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            value, lost = values[i, j], int(failed.iat[i, j])
            text = ("" if not np.isfinite(value) else fmt_cell(value)) + (f" ({lost} failed)" if lost else "")
            if text:  # dark text on a light cell, light text on a dark one
                red, green, blue, _ = image.cmap(image.norm(value)) if np.isfinite(value) else (1, 1, 1, 1)
                ax.text(j, i, text, ha="center", va="center", fontsize=5.5,
                        color="black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white")
    ax.set_xticks(range(values.shape[1]), [c.replace("d = ", "d=").replace(", depth ", "\n") for c in table.columns],
                  fontsize=6)
    ax.set_yticks(range(values.shape[0]), list(table.index), fontsize=6)
    ax.grid(False)
    return image


def draw_long(saved):
    """``perplexity-long``: pass-key retrieval per method, budget and depth of the key, per long setting: the
    accuracy over windows, and the mean change of the key's negative log-probability."""
    from ...plotting import figure, method_label, save_figure, style

    long = saved_long(saved)
    if long.empty:
        return []
    tables = depth_table(long, saved.config)
    if not tables:
        return []
    accuracy = gate(long_frame(long))
    rows = max(len(t["accuracy"]) for t in tables.values())
    with style():
        fig, axes = figure(1, 2 * len(tables), panel_size=(2.7, 0.22 * rows + 1.2), sharey=True)
        for column, ((setting, length), found) in enumerate(tables.items()):
            labels = {m: "exact model (unpatched)" if m == UNPATCHED else method_label(m)
                      for m in found["accuracy"].index}
            for offset, (quantity, look) in enumerate((
                    ("accuracy", {"cmap": "viridis", "vmin": 0.0, "vmax": 1.0, "fmt_cell": lambda v: f"{v:.2f}"}),
                    ("delta_key", {"cmap": "magma_r", "vmin": 0.0, "vmax": max(1.0, float(np.nanmax(
                        np.clip(found["delta_key"].to_numpy(dtype=float), 0, None)))), "fmt_cell": fmt}))):
                ax = axes[0][2 * column + offset]
                image = _heatmap(ax, found[quantity].rename(index=labels), found["failed"].rename(index=labels),
                                 **look)
                what = "retrieval accuracy" if quantity == "accuracy" else "Δ NLL of the key (nats)"
                ax.set_title(f"{setting}, {length} tokens:\n{what}", fontsize=8)
                fig.colorbar(image, ax=ax, shrink=0.4, pad=0.02)
                ax.set_xlabel("budget d, depth of the key", fontsize=7)
        fig.suptitle("pass-key retrieval per budget d and depth of the key (the share of the sequence before it); mean "
                     "over windows; the exact model retrieves "
                     + ", ".join(f"{a:.0%} ({s}, {n} tokens)" for (s, n), a in accuracy.items())
                     + "\nblank: not run (a method that ignores d runs at one budget)", fontsize=8)
        return save_figure(fig, saved.out / "perplexity-long")
