r"""Where the spread of the per-seed ratios comes from, from the study's own tables.

The per-seed ratio :math:`R_s = \frac1T\sum_i \tau_i^{(s)}(\text{method})/\tau_i^{(s)}(\text{softmax})`
varies a lot from seed to seed (an SD of 0.6-1.1 on every column), which is what the seeds of
:mod:`.design` pay for. Three measurements say what that spread is, each cheap:

* **A property of the seed, not of the steps** (:func:`split_halves`): the ratio over the odd steps
  and over the even steps of one seed, correlated across seeds (Pearson, on the logs). With
  correlation :math:`r` between the halves, the share of the per-seed variance that step-to-step
  noise leaves in the mean over all steps is :math:`(1 - r)/(1 + r)` (Spearman-Brown: the whole
  mean's reliability is :math:`2r/(1 + r)`). Near 0, more steps would not help; more seeds do.
* **The design is paired** (:func:`pairing`): within a seed every attention starts from the same
  weights and sees the same batches and dropout masks, so the seed's own difficulty cancels in the
  ratio. The SD of :math:`\log R_s` is set against the SD when each seed's method is divided by the
  next seed's softmax (cyclically: the same values, unpaired).
* **The mechanism** (:func:`mechanism`): softmax attention averages the values, kernelized attention
  (Eq. (5) of Skyformer, no row normalisation) sums them with Gaussian weights over every key, so the
  residual stream entering the final LayerNorm is far larger
  (:func:`~.cells.compute_residual_cell`: its RMS at the initial weights). Per seed, the log of the
  two RMS's ratio is correlated (Spearman) with :math:`\log R_s`; Skyformer, Nyström's
  approximation of kernelized attention, is compared with kernelized seed by seed (the median of
  :math:`|R_s^{sky}/R_s^{ker} - 1|`): when it tracks kernelized, the spread belongs to the kernel,
  not to the approximation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting.markdown import markdown_table

__all__ = ["SPREAD_ATTENTIONS", "split_halves", "pairing", "mechanism", "spread_lines"]

SPREAD_ATTENTIONS = ("kernelized", "skyformer")
"""The attentions whose spread is analysed (those Table 3's question is about)."""


def _per_step(results: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, seed, step): tau of softmax and of each attention of :data:`SPREAD_ATTENTIONS`
    (rows of training that did not fail)."""
    ok = results[results["status"] == "ok"]
    return ok.pivot_table(index=["task", "n", "seed", "step"], columns="attention", values="tau", aggfunc="first")


def _correlation(x, y, method: str = "pearson") -> float:
    x, y = pd.Series(np.asarray(x, dtype=float)), pd.Series(np.asarray(y, dtype=float))
    return float(x.corr(y, method=method)) if len(x) > 2 else float("nan")


def split_halves(results: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, attention): seeds, the correlation across seeds of the log ratios over odd and over
    even steps, and the share of the per-seed variance left by step-to-step noise, ``(1 - r)/(1 + r)``."""
    steps = _per_step(results)
    rows = []
    for (task, n), group in steps.groupby(level=["task", "n"], sort=False):
        step = group.index.get_level_values("step")
        for attention in (a for a in SPREAD_ATTENTIONS if a in group.columns):
            ratio = (group[attention] / group["softmax"]).dropna()
            odd = ratio[ratio.index.get_level_values("step") % 2 == 1].groupby(level="seed").mean()
            even = ratio[ratio.index.get_level_values("step") % 2 == 0].groupby(level="seed").mean()
            both = pd.concat([odd, even], axis=1, join="inner").dropna()
            r = _correlation(np.log(both.iloc[:, 0]), np.log(both.iloc[:, 1]))
            rows.append({"task": task, "n": int(n), "attention": attention, "seeds": len(both),
                         "steps": int(step.max()), "odd_even_correlation": r, "step_noise_share": (1 - r) / (1 + r)})
    return pd.DataFrame.from_records(rows, columns=["task", "n", "attention", "seeds", "steps", "odd_even_correlation",
                                                    "step_noise_share"])


def pairing(results: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, attention): SD of the log per-seed ratio as run (paired: same weights, batches and masks)
    and with each seed's attention divided by the next seed's softmax (unpaired), and their ratio."""
    steps = _per_step(results)
    rows = []
    for (task, n), group in steps.groupby(level=["task", "n"], sort=False):
        for attention in (a for a in SPREAD_ATTENTIONS if a in group.columns):
            table = group[[attention, "softmax"]].dropna().unstack("step")  # rows seeds, columns (attention, step)
            method, softmax = table[attention].to_numpy(), table["softmax"].to_numpy()
            if len(table) < 3:
                continue
            paired = np.log((method / softmax).mean(axis=1))
            unpaired = np.log((method / np.roll(softmax, -1, axis=0)).mean(axis=1))
            sd_paired, sd_unpaired = float(paired.std(ddof=1)), float(unpaired.std(ddof=1))
            rows.append({"task": task, "n": int(n), "attention": attention, "seeds": len(table),
                         "log_sd_paired": sd_paired, "log_sd_unpaired": sd_unpaired,
                         "unpaired_over_paired": sd_unpaired / sd_paired if sd_paired > 0 else float("nan")})
    return pd.DataFrame.from_records(rows, columns=["task", "n", "attention", "seeds", "log_sd_paired",
                                                    "log_sd_unpaired", "unpaired_over_paired"])


def mechanism(residual: pd.DataFrame, per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n): seeds, the median (and range) over seeds of the residual stream's RMS before the
    final LayerNorm for softmax and kernelized attention, the Spearman correlation across seeds of
    ``log(rms_kernelized / rms_softmax)`` with the kernelized ``log R``, and the median of
    ``|R(skyformer)/R(kernelized) - 1|``."""
    ok = per_seed[per_seed["status"] == "ok"].pivot_table(index=["task", "n", "seed"], columns="attention",
                                                          values="ratio", aggfunc="first")
    rows = []
    for (task, n), group in residual.groupby(["task", "n"], sort=False):
        merged = group.set_index(["task", "n", "seed"]).join(ok, how="inner")
        row = {"task": task, "n": int(n), "seeds": len(group)}
        for attention in ("softmax", "kernelized"):
            values = group[f"rms_{attention}"]
            row.update({f"rms_{attention}": float(values.median()), f"rms_{attention}_min": float(values.min()),
                        f"rms_{attention}_max": float(values.max())})
        if "kernelized" in merged:
            row["rms_log_correlation"] = _correlation(np.log(merged["rms_kernelized"] / merged["rms_softmax"]),
                                                      np.log(merged["kernelized"]), "spearman")
        if {"kernelized", "skyformer"} <= set(merged.columns):
            row["skyformer_vs_kernelized"] = float((merged["skyformer"] / merged["kernelized"] - 1).abs().median())
        rows.append(row)
    return pd.DataFrame.from_records(rows)


def _number(value, digits: int = 2) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _ordered(frame: pd.DataFrame, columns: list) -> pd.DataFrame:
    """``frame``'s rows in the order of ``columns`` (``(task, n)`` pairs), stably."""
    if not len(frame):
        return frame
    rank = {pair: i for i, pair in enumerate(columns)}
    keys = [rank.get((t, int(n)), len(rank)) for t, n in frame[["task", "n"]].itertuples(index=False)]
    return frame.assign(_rank=keys).sort_values("_rank", kind="stable").drop(columns="_rank")


def spread_lines(results: pd.DataFrame, per_seed: pd.DataFrame, residual: pd.DataFrame | None, label,
                 columns: list) -> list[str]:
    """The section of ``table.md`` on where the spread comes from (``label(task, n)``: a column's name;
    ``columns``: the ``(task, n)`` pairs in the order the tables list them)."""
    halves, paired = _ordered(split_halves(results), columns), pairing(results)
    rows = []
    for h in halves.itertuples(index=False):
        p = paired[(paired["task"] == h.task) & (paired["n"] == h.n) & (paired["attention"] == h.attention)]
        p = p.iloc[0] if len(p) else None
        rows.append([label(h.task, h.n), h.attention, h.seeds, _number(h.odd_even_correlation, 3),
                     f"{h.step_noise_share:.1%}" if not pd.isna(h.step_noise_share) else "-",
                     "-" if p is None else _number(p["log_sd_paired"], 3),
                     "-" if p is None else _number(p["log_sd_unpaired"], 3)])
    both = paired.dropna(subset=["unpaired_over_paired"])
    lowered = int((both["unpaired_over_paired"] > 1).sum())
    lines = [
        "## Where the spread comes from", "",
        "From the cells above (`results.csv`): the log ratio over the odd steps against the even steps of each "
        "seed, correlated across seeds; the share of the per-seed variance that step-to-step noise leaves in the "
        "mean over steps, (1 - r)/(1 + r); and the SD of the log per-seed ratio as run (paired: within a seed every "
        "attention starts from the same weights and sees the same batches and dropout masks) against the SD when "
        "each seed's attention is divided by the next seed's softmax (unpaired).", "",
        *markdown_table(pd.DataFrame(rows, columns=["task", "attention", "seeds", "odd/even correlation (logs)",
                                                    "step-noise share", "log SD paired", "log SD unpaired"]),
                        default=str, empty="(no seeds yet)"), "",
    ]
    if len(both):
        lines += [f"Pairing lowers the SD of the log ratio on {lowered} of {len(both)} entries"
                  + ("; where it does not, the softmax reference varies little from seed to seed beside the method"
                     if lowered < len(both) else "") + ". What is left is the spread of the method's own ratio "
                  "from seed to seed, which only more seeds narrow.", ""]
    if residual is None or not len(residual):
        return lines + ["The residual-stream measurement (`residual.csv`) is not in this run.", ""]
    mech = _ordered(mechanism(residual, per_seed), columns)
    table = [[label(m.task, m.n), m.seeds,
              f"{_number(m.rms_softmax)} ({_number(m.rms_softmax_min)}-{_number(m.rms_softmax_max)})",
              f"{_number(m.rms_kernelized)} ({_number(m.rms_kernelized_min)}-{_number(m.rms_kernelized_max)})",
              _number(getattr(m, "rms_log_correlation", None)), _number(getattr(m, "skyformer_vs_kernelized", None), 4)]
             for m in mech.itertuples(index=False)]
    return lines + [
        "The mechanism (`residual.csv`: the initial weights, the seed's first batch, dropout off): the RMS of the "
        "residual stream entering the final LayerNorm, median (range) over seeds. Softmax attention averages the "
        "values; kernelized attention sums them with unnormalised Gaussian weights over all n keys, so its stream "
        "is far larger, by a factor that varies from seed to seed with the initial weights, and the final "
        "LayerNorm divides every change of f by it. Beside it, the Spearman correlation across seeds of "
        "log(RMS kernelized / RMS softmax) with the kernelized log ratio, and how "
        "closely Skyformer tracks kernelized seed by seed (median |R_skyformer / R_kernelized - 1|).", "",
        *markdown_table(pd.DataFrame(table, columns=["task", "seeds", "RMS softmax", "RMS kernelized",
                                                     "Spearman(log RMS ratio, log R)", "Skyformer vs kernelized"]),
                        default=str, empty=None), "",
    ]
