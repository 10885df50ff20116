"""The long-context study's whole-sequence setting in its report: the methods that are not cache policies, each
replacing every layer over the whole sequence (``whole.csv``), beside the exact model on the same sequences.

Public API::

    complete_sequences(whole, config) -> DataFrame   # the rows of the sequences every method ran on
    whole_methods(saved) -> DataFrame        # whole_methods.csv: per length, method and ratio
    whole_lines(saved) -> list of str        # the summary's section
    whole_panels(axes, saved, length)        # the figure's row: accuracy per method, error against loss
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..reporting.markdown import markdown_table
from .cells import RESULTS, WHOLE
from .grid import KEY
from .tables import method_table

__all__ = ["complete_sequences", "whole_methods", "whole_lines", "whole_panels"]

COLUMNS = ["length", "method", "compression_ratio", "num_features", "sequences", "texts", "accuracy",
           "exact_accuracy", "delta_logprob", "delta_all", "delta_key", "clean_spectral", "patched_spectral",
           "clean_worst_head", "seconds", "failures"]
"""The columns of ``whole_methods.csv`` (``clean_worst_head`` where the rows record the worst head's error)."""


def complete_sequences(whole: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The rows of the sequences every method and ratio of the config has run on (a stopped run's last sequences
    hold only some methods: left out, so that every method is read on the same sequences)."""
    methods, ratios = config.get("whole_methods") or [], config.get("whole_ratios") or []
    wanted = {(m, float(r)) for m in methods for r in ratios}
    done = whole.groupby(list(KEY))[["method", "compression_ratio"]].apply(
        lambda g: wanted <= set(zip(g["method"], g["compression_ratio"].astype(float))))
    complete = done[done].index
    return whole.set_index(list(KEY)).loc[lambda f: f.index.isin(complete)].reset_index()


def whole_methods(saved) -> pd.DataFrame:
    """``whole_methods.csv``: on the sequences every method has run on (:func:`complete_sequences`), per length,
    method and ratio of the whole-sequence setting, the budget d (median
    over sequences), sequences and texts, accuracy beside the exact model's on the same sequences, the mean losses
    (nats, against the exact model), the median clean- and patched-input error (mean over layers of each layer's
    median over heads; over all rows of the sequence), median seconds, failures."""
    whole = saved.table(WHOLE)
    if whole is None or whole.empty:
        return pd.DataFrame(columns=[column for column in COLUMNS if column != "clean_worst_head"])
    results = saved.table(RESULTS)
    exact = results[results["method"] == "unpatched"][[*KEY, "correct"]].rename(columns={"correct": "exact_correct"})
    frame = complete_sequences(whole, saved.config).merge(exact, on=list(KEY), how="left")
    table = method_table(frame, texts=("text", "nunique"), exact_accuracy=("exact_correct", "mean"))
    return table[[column for column in COLUMNS if column in table]]


def whole_lines(saved) -> list[str]:
    """The summary's section on the whole-sequence setting: what ran, its table, and what it costs."""
    config = saved.config
    table = saved.product("whole_methods.csv")
    if not config.get("whole_texts") or not config.get("whole_methods"):
        return ["## Whole sequence", "", "Not run (`--whole-texts 0` or no `--whole-methods`).", ""]
    shortest = min(config["lengths"])
    head = (f"The methods that are not cache policies ({', '.join(config['whole_methods'])}), each replacing the "
            f"attention of every layer over the whole sequence (its causal form: row i reads tokens <= i), at "
            f"{shortest} tokens on {_texts(len(config['whole_texts']))} x every task and depth, at ratios "
            f"{config['whole_ratios']} (budget d = max(1, int(n_c (1 - r))), the context tokens a policy keeps at that "
            "ratio; `approxlab.patching.sweep_methods`). Nothing is shared between methods but the reference (the "
            "exact prefill, the unpatched continuation, the key tokens, the clean q, k, v and exact attention of "
            "every layer): each method runs the model over all tokens. Exact match is teacher-forced (every answer "
            "token the patched model's argmax; for a causal method what greedy decoding gives). Errors are over "
            "every row of the sequence, not the continuation's alone as for a policy.")
    if table.empty:
        return ["## Whole sequence", "", head, "", "No whole-sequence cell has run yet.", ""]
    done = int(table["sequences"].max())
    planned = len(config["whole_texts"]) * len(config["ruler_tasks"]) * len(config["depths"])
    seconds = float(np.nansum(table["seconds"] * table["sequences"]))
    started = len(saved.table(WHOLE).groupby(list(KEY)))
    near_zero = table[table["clean_spectral"] < 1e-5]
    exactly = ([f"{row.method} (worst head {row.clean_worst_head:.3g})" for row in near_zero.itertuples()]
               if "clean_worst_head" in table else list(near_zero["method"]))  # the worst head: what the rest lose
    caveat = [] if not len(exactly) else [
        f"The error of {', '.join(exactly)} is near 0 (below 1e-5): it is the mean over layers of each layer's median "
        "over heads, and a method exact in most heads (DuoAttention's retrieval heads) has the median of an exact "
        "head, whatever its other heads lose.", ""]
    return ["## Whole sequence", "", head, "",
            f"Sequences with every method: {done} of the {planned} declared ({started} begun); median seconds per "
            f"method and sequence {float(table['seconds'].median()):.0f} (about {seconds / 3600:.1f} worker-hours in "
            "this table). `exact_accuracy`: the exact model on the same sequences.", "", *markdown_table(table), "",
            *caveat]


def _texts(count: int) -> str:
    """``"the first text"`` or ``"the first 10 texts"``."""
    return "the first text" if count == 1 else f"the first {count} texts"


def whole_panels(axes, saved, length: int) -> None:
    """Two panels of the whole-sequence setting at ``length``: each method's accuracy (and the exact model's on
    the same sequences), and each method's median clean-input error against its mean answer log-prob loss."""
    from matplotlib.ticker import NullFormatter

    from ...plotting import method_style

    table = saved.product("whole_methods.csv")
    at = table[table["length"] == length].sort_values("accuracy", ascending=False).reset_index(drop=True)
    left, right = axes
    x = np.arange(len(at))
    left.bar(x, at["accuracy"], color=[method_style(m).get("color", "grey") for m in at["method"]])
    if len(at):
        left.axhline(float(at["exact_accuracy"].mean()), color="black", linestyle=":", linewidth=0.8,
                     label="exact model, same sequences")
        left.legend(fontsize=6, loc="upper right")
    left.set_xticks(x, [f"{m}\nr={r:g}" for m, r in zip(at["method"], at["compression_ratio"])], fontsize=5,
                    rotation=90)
    left.set_ylim(-0.05, 1.05)
    left.set_ylabel("accuracy (exact match)")
    sequences = int(at["sequences"].max()) if len(at) else 0
    left.set_title(f"whole sequence, {length} tokens ({sequences} sequences)", fontsize=8)
    for _, row in at.iterrows():
        style = method_style(row["method"])
        if math.isfinite(float(row["clean_spectral"])):
            right.scatter(row["clean_spectral"], row["delta_logprob"], s=14, label=row["method"],
                          **{k: v for k, v in style.items() if k in ("color", "marker")})
    right.set_xscale("log")
    right.xaxis.set_minor_formatter(NullFormatter())  # few points over less than a decade: no crowded minor labels
    right.set_xlabel("clean-input spectral error (median, all rows)")
    right.set_ylabel("answer log-prob loss (nats, mean)")
    right.set_title(f"whole sequence: error against loss, {length} tokens", fontsize=8)
    if len(at):
        right.legend(fontsize=5, loc="best", ncol=2)
