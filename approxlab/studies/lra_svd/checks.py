r"""The Figure-4 proxy checked against our own bug, from its saved tables: do the seeds train, which seeds lie far
from the rest, how the verdict's statistic moves with the choices around it, and what matrix is measured.

A finding against a paper is first checked not to be our fault. The checks, the rule that names a seed
outlying (:data:`OUTLIER_SCALED_MADS`) and the variants of the statistic (:func:`sensitivity`) are fixed here,
in code, before they are read; they are reported beside the verdict and never change it (the verdict is the
rule declared before the data, :func:`approxlab.studies.lra_svd.report.ordering`).

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021, Appendix B (Figure 4); the authors' code,
github.com/pkuzengqi/Skyformer, ``src/models/attention.py`` (``Attention.forward``).

Hampel. The influence curve and its role in robust estimation. JASA 69 (1974): the median absolute
deviation, scaled by 1.4826 to estimate a normal standard deviation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ... import stats
from ...tasks import listops, pathfinder
from ..reporting.markdown import markdown_table
from .cells import decay_slope
from .grid import DECAY_INDICES

__all__ = ["OUTLIER_SCALED_MADS", "outlying_seeds", "batch_mean_slopes", "input_rank_bound", "sensitivity",
           "bug_check_lines"]

OUTLIER_SCALED_MADS = 3.0
"""A gate-passing seed is outlying when its decay slope lies farther than this many scaled median absolute
deviations (1.4826 x MAD, a normal SD's estimate; Hampel 1974) from its task's median over the passing seeds.
Fixed before the check was read."""

_CLASSES = {"listops": listops.NUM_CLASSES, "pathfinder": pathfinder.NUM_CLASSES}
_LABELS = {"listops": "ListOps", "pathfinder": "Pathfinder"}


def outlying_seeds(results: pd.DataFrame, *, mads: float = OUTLIER_SCALED_MADS) -> pd.DataFrame:
    """The gate-passing rows of ``results`` with ``median`` (their task's median slope) and ``outlying``.

    Examples
    --------
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"task": ["pathfinder"] * 5, "seed": range(5), "passed": True,
    ...                      "decay_slope": [-0.24, -0.25, -0.23, -0.24, -0.35]})
    >>> outlying_seeds(rows).loc[lambda t: t["outlying"], "seed"].tolist()
    [4]
    """
    passed = results[results["passed"].astype(bool)].copy()
    grouped = passed.groupby("task")["decay_slope"]
    passed["median"] = grouped.transform("median")
    spread = (passed["decay_slope"] - passed["median"]).abs()
    scale = 1.4826 * spread.groupby(passed["task"]).transform("median")
    passed["outlying"] = spread > mads * scale
    return passed


def batch_mean_slopes(spectra: pd.DataFrame) -> pd.Series:
    r"""Per (task, n, seed): the slope of :math:`\ln` of the batch's mean :math:`\sigma_j/\sigma_1` over
    :data:`DECAY_INDICES` -- Figure 4's averaging ("averaged across one random batch"), where the declared
    statistic averages each example's slope (the mean of the logs).

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> curve = pd.DataFrame({"task": "listops", "n": 8, "seed": 0, "index": range(1, 65),
    ...                       "mean": np.exp(-0.2 * np.arange(1, 65))})
    >>> round(float(batch_mean_slopes(curve).iloc[0]), 6)
    -0.2
    """
    def slope(curve):
        return float(decay_slope(torch.tensor(curve.sort_values("index")["mean"].to_numpy(dtype=float))))

    return spectra.groupby(["task", "n", "seed"], sort=False)[["index", "mean"]].apply(slope)


def input_rank_bound(task: dict, embedding_dim: int) -> int:
    r"""The largest rank layer 1's input can have for one example: a token vector plus position vectors.

    With learned positions each of the ``n`` tokens has its own position vector: up to
    ``min(n, embedding_dim)``. With 2-D positions (``"2d"``) a pixel's input is
    :math:`E_{v} + R_{r} + C_{c}` (intensity, row, column); over a ``side x side`` image with ``V``
    intensities these span at most :math:`V + 2\,\mathrm{side} - 2` dimensions (three one-hot groups whose
    sums are the same all-ones column), whatever the weights.

    Examples
    --------
    >>> input_rank_bound({"task": "pathfinder", "n": 256, "positions": "2d",
    ...                   "options": {"dot_intensity": 128}}, 64)  # 3 intensities + 16 rows + 16 columns - 2
    33
    >>> input_rank_bound({"task": "listops", "n": 256, "positions": "learned"}, 64)
    64
    """
    n = int(task["n"])
    if task.get("positions") != "2d":
        return min(n, embedding_dim)
    intensities = {0, pathfinder.INK, int(dict(task.get("options", {})).get("dot_intensity", pathfinder.INK))}
    return min(len(intensities) + 2 * math.isqrt(n) - 2, embedding_dim)


def sensitivity(results: pd.DataFrame, spectra: pd.DataFrame) -> pd.DataFrame:
    """Pathfinder's slope minus ListOps' under variants of the statistic, each with Welch's 95% interval over
    seeds (plain, not calibrated; nan for the median, and everything nan below 2 seeds a task): the declared one, the median over seeds, without the
    outlying seeds (:func:`outlying_seeds`), and the slope of the batch-averaged spectrum
    (:func:`batch_mean_slopes`). Reported, never judged.
    """
    passed = outlying_seeds(results)
    averaged = batch_mean_slopes(spectra).rename("averaged").reset_index()
    passed = passed.merge(averaged, on=["task", "n", "seed"], how="left")
    variants = (("declared: mean of the seeds' slopes", passed, "decay_slope", np.mean),
                ("median of the seeds' slopes", passed, "decay_slope", np.median),
                ("without the outlying seeds", passed[~passed["outlying"]], "decay_slope", np.mean),
                ("slope of the batch's mean sigma_j / sigma_1 (Figure 4 averages over the batch)", passed, "averaged",
                 np.mean))
    rows = []
    for name, table, column, centre in variants:
        values = {t: table.loc[table["task"] == t, column].to_numpy(dtype=float) for t in ("pathfinder", "listops")}
        enough = min(len(v) for v in values.values()) >= 2
        interval = stats.welch_interval(values["pathfinder"], values["listops"]) if enough and centre is np.mean \
            else None
        rows.append({"variant": name, "seeds": f"{len(values['pathfinder'])} and {len(values['listops'])}",
                     "difference": float(centre(values["pathfinder"]) - centre(values["listops"])) if enough
                     else float("nan"),
                     "low": interval.low if interval else float("nan"),
                     "high": interval.high if interval else float("nan")})
    return pd.DataFrame(rows)


def _range(values, digits=3) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def _training_line(results: pd.DataFrame, training: pd.DataFrame) -> str:
    ordered = training[training["step"] > 0].sort_values("step").groupby(["task", "seed"])
    first, last = ordered.head(1).set_index(["task", "seed"]), ordered.tail(1).set_index(["task", "seed"])
    parts = []
    for task, rows in results[results["passed"].astype(bool)].groupby("task", sort=False):
        keys = [(task, s) for s in rows["seed"] if (task, s) in last.index]
        if not keys:
            continue
        parts.append(f"{_possessive(task)} {len(rows)} gate-passing seeds end at validation accuracy "
                     f"{_range(rows['validation_accuracy'])} (majority class {rows['majority_rate'].iloc[0]:.3f}; at "
                     f"step {int(first.loc[keys[0], 'step'])}: {_range(first.loc[keys, 'validation_accuracy'])}) and "
                     f"training loss {_range(last.loc[keys, 'train_loss'])} (uniform guess: ln {_CLASSES[task]} = "
                     f"{math.log(_CLASSES[task]):.3f})")
    return ("- **Do the seeds train?** " + "; ".join(parts) + ". A non-finite training loss stops a seed with an error "
            "(`approxlab.training.train_classifier`), so no seed in the tables trained through a NaN.")


def _outlier_line(results: pd.DataFrame, training: pd.DataFrame) -> str:
    passed = outlying_seeds(results)
    far, near = passed[passed["outlying"]], passed[~passed["outlying"]]
    rule = (f"farther than {OUTLIER_SCALED_MADS:g} scaled MADs from its task's median slope, a rule fixed in code "
            "(`approxlab.studies.lra_svd.checks`)")
    if far.empty:
        return f"- **Outlying seeds** ({rule}): none."
    last = training.sort_values("step").groupby(["task", "seed"]).tail(1).set_index(["task", "seed"])["train_loss"]
    seeds = "; ".join(f"{_LABELS.get(r.task, r.task)} seed {r.seed}: slope {r.decay_slope:.3f} (median "
                      f"{r.median:.3f}), validation accuracy {r.validation_accuracy:.3f}, test-batch accuracy "
                      f"{r.test_batch_accuracy:.3f}, final training loss {float(last.get((r.task, r.seed))):.3f}"
                      for r in far.itertuples(index=False))
    trained = all(r.passed and r.validation_accuracy > r.majority_rate
                  and float(last.get((r.task, r.seed))) < math.log(_CLASSES[r.task]) for r in far.itertuples(index=False))
    return (f"- **Outlying seeds** ({rule}): {seeds}. "
            + ("Each passes its gate, above its majority class's rate (which a constant answer cannot pass), with a "
               "training loss below the uniform guess's: they trained and did not collapse to one class. "
               if trained else "Not every one of them trained (see above). ")
            + "Their slopes' spread over the test batch (the std of its examples' slopes): " + "; ".join(
                f"{_possessive(task)} {_range(rows['decay_slope_std'])}, against "
                f"{_range(near.loc[near['task'] == task, 'decay_slope_std'])} for its other passing seeds"
                for task, rows in far.groupby("task", sort=False))
            + ". Where it is wide, a few examples of the batch carry much steeper slopes than the rest (see "
            "**Resolution** for those whose smallest values reach rounding).")


def _possessive(task: str) -> str:
    label = _LABELS.get(task, task)
    return label + ("'" if label.endswith("s") else "'s")


def _input_line(config: dict) -> str:
    width = config["model"]["embedding_dim"]
    bounds = {t["task"]: (t["positions"], input_rank_bound(t, width)) for t in config["tasks"]}
    text = "; ".join(f"{_LABELS.get(t, t)} ({positions} positions): at most {bound} of {width}"
                     for t, (positions, bound) in bounds.items())
    short = [(t, bound) for t, (positions, bound) in bounds.items() if positions == "2d" and bound < width]
    if not short:
        return f"- **The inputs.** The rank layer 1's input can reach, for every example: {text}."
    task, bound = short[0]
    return (f"- **The inputs.** The rank layer 1's input can reach, for every example: {text}. With 2-D positions "
            f"each pixel's input is an intensity, a row and a column vector added, so {width - bound} of "
            f"{_possessive(task)} {width} dimensions get no input of their own, and its sigma_j past "
            f"j = {bound} come only from layer 1's nonlinearities (LayerNorm, GELU, the attention's weights). That can "
            f"steepen {_possessive(task)} decay over the fit whatever the task asks, and the declared comparison "
            "cannot tell it from the task's difficulty (Appendix B's models: learned 1-D positions for "
            "every task).")


def bug_check_lines(config: dict, results: pd.DataFrame, spectra: pd.DataFrame, training: pd.DataFrame) -> list[str]:
    """The summary's "Checked against our own bug" section from the saved tables and the run's config."""
    if results[results["passed"].astype(bool)].empty:
        return []
    table = sensitivity(results, spectra)
    table["interval"] = [f"[{r.low:+.4f}, {r.high:+.4f}]" if math.isfinite(r.low) else "-"
                         for r in table.itertuples(index=False)]
    rows = table[["variant", "seeds", "difference", "interval"]].rename(columns={
        "seeds": "seeds (Pathfinder and ListOps)", "interval": "Welch 95%"})
    width = config["model"]["embedding_dim"]
    return [
        "### Checked against our own bug", "",
        "Before the verdict is read as the tasks' (above all where it goes against Appendix B), the run is checked "
        "for a fault of ours. These checks report; the verdict stays the rule declared before the data.", "",
        _training_line(results, training),
        _outlier_line(results, training),
        "- **The matrix.** Appendix B: \"the singular value distribution of attention output from the second layer "
        "of a trained vanilla transformer ... averaged across one random batch from the test set\"; Figure 4 plots "
        "indices 1-64 on a log scale (64: the model's width). Here: layer 2's attention output, heads concatenated "
        f"before the output projection, each test example's real-token rows, sigma_j / sigma_1 (a slope does not "
        f"depend on the scale), fitted over {DECAY_INDICES[0]}..{DECAY_INDICES[1]} (Figure 4's range without "
        "sigma_1). Not as in the authors' code: their `Attention.forward` (pkuzengqi/Skyformer, "
        "`src/models/attention.py`) returns the output after the output projection (`self.ff`, a "
        f"{width} x {width} map and a bias), and their module's output has a row for every position, ListOps' padding "
        "included; their code for Figure 4 is not published.",
        _input_line(config),
        "", "Sensitivity of the difference (Pathfinder minus ListOps, per index) to the statistic, over the "
        "gate-passing seeds, with Welch's plain 95% interval (reported, not judged):", "",
        *markdown_table(rows, formats={"difference": "{:+.4f}"}, default=str),
    ]
