r"""Skyformer Table 3: instability scores of attention approximations during training.

Regenerates Table 3 of Skyformer (Chen et al., NeurIPS 2021, Appendix F). A 2-layer encoder
(:class:`approxlab.training.TinyEncoder`: embedding 64, feed-forward 128, 2 heads, dropout 0.1)
is trained for 20 steps with each attention in turn, with the optimiser of the authors' LRA code
(:mod:`approxlab.optim`: AdamW, the task's warm-up schedule, gradient values clipped at 1);
every model starts from the same weights (one draw from a seeded generator; attentions have no
parameters of their own) and sees the same batches. At step ``i`` the instability score is

.. math::

    \tau_i = \|f(x_i, W_i) - f(x_i, W_{i-1})\|_F^2 \,/\, \|W_i - W_{i-1}\|_F^2

with :math:`f` the embedding after the two layers (both passes of a step share their landmarks
and dropout masks); a table entry is the mean over the steps of :math:`\tau_i(\text{method}) /
\tau_i(\text{softmax})`, then over seeds the arithmetic mean (the paper's statistic) and the
geometric mean, each with a 95% Student-t interval (:func:`ratio_interval`), the power of the
seeds to tell the paper's value from 1 and the seeds 80% power needs (:func:`power_analysis`),
and a verdict (:func:`verdict`): "below 1" / "above 1" only when the whole interval is on that
side, "not confirmed (underpowered)" when it contains 1 at a power below :data:`POWER_GOAL`,
"inconclusive" otherwise. Below 1: the method moves its output less than softmax attention for
the same parameter change (Skyformer's "more stable").

Three steps, all behind ``approxlab instability``:

1. **grid** -- :func:`build_config` (saved and hashed in ``config.json``);
2. **compute** -- :func:`compute` runs one runner cell per (task, n, seed, attention)
   through :func:`~approxlab.studies.runner.run_cells` (resumable, optional Dask) and
   writes the tidy table ``results.csv`` (one row per step);
3. **table** -- :func:`write_table` reads only ``results.csv`` and ``config.json`` and
   writes ``ratios.csv`` (one ratio per task x n x seed x attention), ``intervals.csv``
   (mean, 95% CI and verdict per task x attention), ``table.md`` (laid out like Table 3:
   rows = attentions, columns = tasks, then the verdicts and an entry-by-entry comparison
   with Table 3) and ``instability.png/.pdf`` (per-step ratios). ``--plot-only`` redraws them.

Grid (full run)
---------------
tasks: ListOps (generated, LRA's generator, :mod:`approxlab.tasks.listops`) and Pathfinder
(generated, :mod:`approxlab.tasks.pathfinder`, 16 x 16), both at ``n = 256``, batch 8, at the
paper's learning rates (1e-4, 2e-4); attentions: Table 3's (softmax as reference, kernelized,
skyformer with its Schulz core, nystromformer; ``--attentions`` adds spectral-shifting and yoso);
padding keys masked in every attention; ``num_features = 128`` (Skyformer Section 5); 10 seeds,
run seed by seed (a run stopped early keeps whole seeds, and the table counts the seeds it has);
20 steps. LRA's ListOps pads to 2000 tokens and Pathfinder-32 has 1024 with batch 128 on a V100;
on this 2-core CPU those shapes leave no budget for seeds (``--tasks listops:2000:32`` restores
LRA's ListOps shape at that cost). ``table.md`` names every setting as kept or changed.

``--quick``: ListOps at ``n = 64`` (batch 4), every attention, 2 seeds, 3 steps; written
to ``approxlab-results/instability-quick/`` unless ``--out`` is given.

Seeds. The batches of (task, n, seed) come from a generator seeded with
:func:`~approxlab.studies.runner.cell_seed` of (task, n, seed, "data"); the initial weights
from (task, n, seed, "init"); the random draws of randomized attentions from (task, n, seed,
"attention"), fixed per step so that both forward passes of a step see the same landmarks.

Table ``results.csv``: task, n, seed, attention, step, tau, output_change,
parameter_change, loss, seconds (wall time of the cell), warnings (count raised in the
cell), status ("ok", or the error that stopped training, e.g. a non-finite gradient; its
numeric columns are then empty and the table marks the entry "failed").

References
----------
Chen, Zeng, Ji, Yang. *Skyformer: Remodel Self-Attention with Gaussian Kernel and Nystrom
Method*. NeurIPS 2021. Section 5 (model and training settings), Appendix F and Table 3.

Liu, Liu, Gao, Chen, Han. *Understanding the Difficulty of Training Transformers*. EMNLP 2020.
"""

from __future__ import annotations

import functools
import pathlib
import time
import warnings

import numpy as np
import pandas as pd
import torch

from .._io import atomic_write_text, read_results, write_csv_atomic
from . import _cli
from .runner import StudyError, cell_seed, run_cells, saved_config

__all__ = [
    "FULL_GRID",
    "QUICK_GRID",
    "PAPER_TABLE3",
    "build_config",
    "make_cells",
    "task_batches",
    "compute_cell",
    "compute",
    "ratios",
    "ratio_interval",
    "verdict",
    "intervals",
    "ratio_table",
    "verdict_table",
    "write_table",
    "add_arguments",
    "run",
]

ATTENTION_ORDER = ("softmax", "kernelized", "skyformer", "nystromformer", "spectral-shifting", "yoso")
"""Rows of the table (softmax is the reference, ratio 1 by definition)."""

FULL_GRID = {
    "tasks": [
        {"task": "listops", "n": 256, "batch_size": 8},
        {"task": "pathfinder", "n": 256, "batch_size": 8},
    ],
    "attentions": ["softmax", "kernelized", "skyformer", "nystromformer"],
    "seeds": 10,
    "steps": 20,
}
"""The full grid (overridable from the command line): Table 3's attentions on its two tasks that
can be generated here, at n = 256 and batch 8 (the CPU budget goes to seeds, see ``table.md``)."""

QUICK_GRID = {
    **FULL_GRID,
    "tasks": [{"task": "listops", "n": 64, "batch_size": 4}],
    "attentions": list(ATTENTION_ORDER),
    "seeds": 2,
    "steps": 3,
}
"""``--quick``: one task, every attention, 2 seeds, 3 steps (seconds on 2 CPU cores)."""

PAPER_DIFFERENCE = "paper"
"""The effect the power analysis sizes for: each entry's own Table 3 value against 1 (ListOps
kernelized: 0.77 vs 1.0)."""

POWER_GOAL = 0.8
"""Power a verdict needs before "no difference from 1" may be read as such (two-sided t, 5%)."""

_TASK_SETTINGS = {"listops": "listops", "pathfinder": "pathfinder", "wikitext-mlm": "text"}
"""Our task -> the LRA task whose training settings (:data:`approxlab.optim.SKYFORMER_LRA`) it takes."""

PAPER_TABLE3 = {
    "nystromformer": {"Text": 1.03, "ListOps": 1.01, "Retrieval": 0.97, "Pathfinder": 0.99, "Image": 1.02},
    "kernelized": {"Text": 0.83, "ListOps": 0.77, "Retrieval": 0.64, "Pathfinder": 0.74, "Image": 0.62},
    "skyformer": {"Text": 0.81, "ListOps": 0.79, "Retrieval": 0.64, "Pathfinder": 0.79, "Image": 0.65},
}
"""Skyformer Table 3 (ratios of instability score on LRA), for the comparison in table.md."""

RESULTS = "results.csv"
RATIOS = "ratios.csv"
INTERVALS = "intervals.csv"
KEY_COLUMNS = ("task", "n", "seed", "attention")
_MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}


# ------------------------------------------------------------------------------ grid


def _parse_task(spec) -> dict:
    """``"listops:1000:4"`` or a dict -> ``{"task", "n", "batch_size"}``."""
    from ..tasks import available

    if isinstance(spec, dict):
        entry = dict(spec)
    else:
        parts = str(spec).split(":")
        if len(parts) != 3:
            raise StudyError(f"--tasks entries must look like NAME:N:BATCH (e.g. listops:1000:4); got {spec!r}.")
        try:
            entry = {"task": parts[0], "n": int(parts[1]), "batch_size": int(parts[2])}
        except ValueError:
            raise StudyError(f"--tasks entries must look like NAME:N:BATCH with integers; got {spec!r}.") from None
    if entry.get("task") not in available():
        raise StudyError(f"--tasks: {entry.get('task')!r} is not a registered task; choose from {available()}.")
    for key in ("n", "batch_size"):
        if int(entry.get(key, 0)) < 1:
            raise StudyError(f"--tasks: `{key}` must be an integer >= 1; got {entry.get(key)!r} in {spec!r}.")
    return {"task": entry["task"], "n": int(entry["n"]), "batch_size": int(entry["batch_size"])}


def build_config(
    *,
    quick: bool = False,
    tasks=None,
    attentions=None,
    seeds=None,
    steps=None,
    num_features: int = 128,
    lr: float | None = None,
    optimizer: str = "adamw",
    dropout: float = 0.1,
    clip_value: float | None = 1.0,
    dtype: str = "float32",
    base_seed: int = 0,
) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    Parameters
    ----------
    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    tasks : list of str or dict, optional
        ``"name:n:batch_size"`` entries (names from :data:`approxlab.tasks.TASKS`).
    attentions : list of str, optional
        Keys of :data:`approxlab.training.ATTENTIONS`; ``"softmax"`` is always added
        (it is the reference of every ratio).
    seeds, steps : int, optional
        Seeds (table: mean ± std over them) and Adam steps (Skyformer: 20).
    num_features : int
        Landmarks / features of the approximations (Skyformer Section 5: 128).
    lr : float, optional
        Peak learning rate; default the paper's per task (ListOps 1e-4, Pathfinder 2e-4).
    optimizer : {"adamw", "adam"}
        ``"adamw"``: Skyformer's code (AdamW, eps 1e-6, one-cycle schedule with the paper's
        warm-up over 50k steps); ``"adam"``: Adam at a constant rate.
    dropout : float
        Dropout (paper: 0.1; the two forward passes of a step share their masks).
    clip_value : float or None
        Gradient value clipping (paper: 1).
    dtype : {"float32", "float64"}
        Model precision.
    base_seed : int
        Base of every :func:`~approxlab.studies.runner.cell_seed`.
    """
    from ..training import ATTENTIONS, TRAINING_OPTIONS

    grid = dict(QUICK_GRID if quick else FULL_GRID)
    if tasks is not None:
        grid["tasks"] = list(tasks)
    grid["tasks"] = [_parse_task(t) for t in grid["tasks"]]
    if attentions is not None:
        grid["attentions"] = list(attentions)
    for name in grid["attentions"]:
        if name not in ATTENTIONS:
            raise StudyError(f"--attentions: {name!r} is not known; choose from {sorted(ATTENTIONS)}.")
    grid["attentions"] = ["softmax"] + [a for a in grid["attentions"] if a != "softmax"]
    for name, value in (("seeds", seeds), ("steps", steps)):
        if value is not None:
            grid[name] = int(value)
        if int(grid[name]) < 1:
            raise StudyError(f"--{name} must be an integer >= 1; got {grid[name]}.")
    if int(num_features) < 1:
        raise StudyError(f"--num-features must be an integer >= 1; got {num_features}.")
    from ..optim import SKYFORMER_LRA

    if lr is not None and not float(lr) > 0:
        raise StudyError(f"--lr must be > 0; got {lr}.")
    if optimizer not in ("adamw", "adam"):
        raise StudyError(f"--optimizer must be 'adamw' or 'adam'; got {optimizer!r}.")
    if not 0.0 <= float(dropout) < 1.0:
        raise StudyError(f"--dropout must be in [0, 1); got {dropout}.")
    for entry in grid["tasks"]:
        paper = SKYFORMER_LRA[_TASK_SETTINGS[entry["task"]]]
        entry.update(lr=float(paper["lr"] if lr is None else lr), warmup=paper["warmup"],
                     total_steps=paper["total_steps"])
    if dtype not in ("float32", "float64"):
        raise StudyError(f"--dtype must be 'float32' or 'float64'; got {dtype!r}.")
    return {
        "study": "instability",
        "paper": "Skyformer (Chen et al., NeurIPS 2021), Appendix F, Table 3",
        **grid,
        "num_features": int(num_features),
        "attention_options": {a: TRAINING_OPTIONS[a] for a in grid["attentions"] if a in TRAINING_OPTIONS},
        "padding": "padding keys masked inside every attention (key_mask); padding left out of the mean pooling",
        "optimizer": optimizer,
        "optimizer_detail": ("AdamW (betas 0.9, 0.999; eps 1e-6; no weight decay), one-cycle schedule: "
                             "lr/25 -> lr linearly over the task's warm-up, then linearly down over total_steps"
                             if optimizer == "adamw" else "Adam (betas 0.9, 0.999; eps 1e-8), constant rate"),
        "dropout": float(dropout),
        "clip_value": None if clip_value is None else float(clip_value),
        "dtype": dtype,
        "model": dict(_MODEL),
        "f": "output of the final LayerNorm after the 2 encoder layers, (batch, n, 64)",
        "W": "all parameters f depends on (embeddings, the 2 layers, final LayerNorm); not the task head",
        "base_seed": int(base_seed),
    }


def make_cells(config: dict, *, data_dir=None, cache_dir=None, device: str = "cpu") -> list[dict]:
    """Runner cells, one per (task, n, seed, attention), seed by seed (a run stopped early holds whole seeds)."""
    cells = []
    for seed in range(config["seeds"]):
        for entry in config["tasks"]:
            for attention in config["attentions"]:
                cells.append({
                    "task": entry["task"], "n": entry["n"], "seed": seed, "attention": attention,
                    "batch_size": entry["batch_size"], "steps": config["steps"],
                    "num_features": config["num_features"], "lr": entry["lr"], "warmup": entry["warmup"],
                    "total_steps": entry["total_steps"], "optimizer": config["optimizer"],
                    "dropout": config["dropout"], "clip_value": config["clip_value"], "dtype": config["dtype"],
                    "base_seed": config["base_seed"],
                    "data_dir": None if data_dir is None else str(data_dir),
                    "cache_dir": None if cache_dir is None else str(cache_dir),
                    "device": device,
                })
    return cells


# --------------------------------------------------------------------------- compute


@functools.lru_cache(maxsize=2)
def task_batches(task, n, seed, batch_size, steps, base_seed, data_dir, cache_dir):
    """The task of (task, n, seed): ``steps`` batches, identical for every attention."""
    from ..tasks import make_task

    kwargs = {"n": n, "batch_size": batch_size, "num_batches": steps,
              "generator": torch.Generator().manual_seed(cell_seed(task, n, seed, "data", base_seed=base_seed)),
              "data_dir": data_dir}
    if task == "wikitext-mlm":
        kwargs["cache_dir"] = cache_dir
    return make_task(task, **kwargs)


def _to_device(batch, device):
    from ..tasks import Batch

    return Batch(batch.input_ids.to(device), batch.mask.to(device), batch.labels.to(device))


def compute_cell(cell: dict) -> list[dict]:
    """Train one attention on one (task, n, seed) and return one row per step."""
    from ..training import TinyEncoder, instability_trace

    start = time.perf_counter()
    task = task_batches(cell["task"], cell["n"], cell["seed"], cell["batch_size"], cell["steps"],
                        cell["base_seed"], cell["data_dir"], cell["cache_dir"])
    dtype = {"float32": torch.float32, "float64": torch.float64}[cell["dtype"]]
    init = torch.Generator().manual_seed(cell_seed(cell["task"], cell["n"], cell["seed"], "init",
                                                   base_seed=cell["base_seed"]))
    attention_seed = cell_seed(cell["task"], cell["n"], cell["seed"], "attention", base_seed=cell["base_seed"])
    model = TinyEncoder(
        vocab_size=task.vocab_size, n=task.n, attention=cell["attention"], num_features=cell["num_features"],
        kind=task.kind, num_classes=task.num_classes, dropout=cell["dropout"], generator=init, dtype=dtype, **_MODEL,
    ).to(cell["device"])
    batches = [_to_device(b, cell["device"]) for b in task.batches]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = instability_trace(model, batches, lr=cell["lr"], seed=attention_seed % (2**62),
                                      optimizer=cell["optimizer"], warmup=cell["warmup"],
                                      total_steps=max(cell["total_steps"], len(batches)),
                                      clip_value=cell["clip_value"])
            status = "ok"
        except (FloatingPointError, ValueError, RuntimeError, ImportError, torch.linalg.LinAlgError) as error:
            trace, status = None, f"failed: {type(error).__name__}: {error}"
    seconds = time.perf_counter() - start
    common = {"seconds": seconds, "warnings": len(caught), "status": status}
    if trace is None:
        return [{"step": 0, "tau": None, "output_change": None, "parameter_change": None, "loss": None, **common}]
    return [
        {"step": i + 1, "tau": float(trace["tau"][i]), "output_change": float(trace["output_change"][i]),
         "parameter_change": float(trace["parameter_change"][i]), "loss": float(trace["loss"][i]), **common}
        for i in range(len(batches))
    ]


def compute(config: dict, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None, workers=None,
            progress=True, restart=False, run_info=None) -> pd.DataFrame:
    """Run (or resume) the grid; write ``results.csv`` and ``config.json``; return the table."""
    out = pathlib.Path(out)
    return run_cells(make_cells(config, data_dir=data_dir, cache_dir=cache_dir, device=device), compute_cell,
                     results_path=out / RESULTS, key_columns=KEY_COLUMNS, config=config, run_info=run_info,
                     scheduler=scheduler, workers=workers, progress=progress, restart=restart)


# ----------------------------------------------------------------------------- table


def ratios(results: pd.DataFrame) -> pd.DataFrame:
    r"""Per (task, n, seed, attention): the mean over steps of :math:`\tau_i/\tau_i^{softmax}`.

    Returns
    -------
    pandas.DataFrame
        Columns task, n, seed, attention, ratio, steps, status. ``status`` is "ok", or
        why there is no ratio (the attention's or the reference's training failed); the
        ratio of a failed entry is not computed.
    """
    rows = []
    for (task, n, seed), group in results.groupby(["task", "n", "seed"], sort=False):
        reference = group[group["attention"] == "softmax"]
        ref_ok = len(reference) and (reference["status"] == "ok").all()
        ref_tau = reference.set_index("step")["tau"] if ref_ok else None
        for attention, rows_a in group.groupby("attention", sort=False):
            ok = (rows_a["status"] == "ok").all()
            entry = {"task": task, "n": int(n), "seed": int(seed), "attention": attention, "steps": len(rows_a)}
            if not ok:
                rows.append({**entry, "ratio": None, "status": str(rows_a["status"].iloc[0])})
            elif not ref_ok:
                rows.append({**entry, "ratio": None, "status": "no softmax reference"})
            else:
                tau = rows_a.set_index("step")["tau"]
                per_step = (tau / ref_tau.reindex(tau.index)).to_numpy(dtype=float)
                rows.append({**entry, "ratio": float(np.mean(per_step)), "status": "ok"})
    return pd.DataFrame.from_records(rows)


def _task_label(task: str, n: int) -> str:
    return {"listops": "ListOps", "pathfinder": "Pathfinder", "wikitext-mlm": "WikiText-2 MLM"}.get(task, task) + f" (n={n})"


def ratio_interval(values, *, level: float = 0.95) -> tuple[float, float, float]:
    r"""Mean ratio over seeds and its Student-t confidence interval.

    Parameters
    ----------
    values : array_like
        ``(s,)`` per-seed ratios (each the mean over steps of :math:`\tau_i/\tau_i^{softmax}`).
    level : float
        Confidence level (default 0.95).

    Returns
    -------
    (mean, low, high) : tuple of float
        :math:`\bar r \pm t_{(1+\text{level})/2,\,s-1}\,\hat\sigma/\sqrt s` (``hat sigma`` the
        sample standard deviation); ``low = high = nan`` for ``s < 2``.

    Notes
    -----
    Seeds differ in data, initial weights and landmarks, so the per-seed ratios are
    independent draws; the t interval assumes they are roughly normal (5 seeds cannot check
    that), and its width shrinks like :math:`1/\sqrt s`.
    """
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if values.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size))
    return mean, mean - half, mean + half


def verdict(low: float, high: float, power: float = float("nan")) -> str:
    """``"below 1"`` / ``"above 1"`` when the whole interval is on that side of 1; otherwise
    ``"not confirmed (underpowered)"`` when the seeds had less than :data:`POWER_GOAL` power to
    tell the paper's value from 1, else ``"inconclusive"`` (``power`` NaN: no paper value to size for)."""
    if high < 1.0:
        return "below 1"
    if low > 1.0:
        return "above 1"
    if power < POWER_GOAL:
        return "not confirmed (underpowered)"
    return "inconclusive"


def power_analysis(values, paper_value) -> tuple[float, float, int | None]:
    """``(sd, power, seeds_needed)`` of a two-sided one-sample t-test (5%) of "mean ratio = 1" when the
    true mean is ``paper_value``, at the per-seed spread ``sd`` of ``values``: the power of these seeds
    and the seeds 80% power needs (:func:`approxlab.stats.t_test_power`, ``t_test_sample_size``).
    NaN / None when there is no paper value, fewer than 2 seeds or no spread."""
    from ..stats import t_test_power, t_test_sample_size

    values = np.asarray(values, dtype=float)
    sd = float(values.std(ddof=1)) if values.size > 1 else float("nan")
    if paper_value is None or not sd > 0 or values.size < 2 or abs(paper_value - 1.0) < 0.05:
        return sd, float("nan"), None
    difference = float(paper_value) - 1.0
    power = t_test_power(int(values.size), difference=difference, sd=sd)
    return sd, power, t_test_sample_size(difference=difference, sd=sd, power=POWER_GOAL, max_n=10**6)


def _paper_value(task, attention):
    column = PAPER_COLUMN.get(task)
    return PAPER_TABLE3.get(attention, {}).get(column) if column else None


def intervals(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, attention): seeds, failed seeds, arithmetic mean (the paper's statistic) with its
    95% t interval, geometric mean with its interval (t on the log ratios), per-seed SD, power and
    seeds needed for 80% power at the paper's value, and the verdicts of both means."""
    rows = []
    for (task, n, attention), group in per_seed.groupby(["task", "n", "attention"], sort=False):
        ok = group[group["status"] == "ok"]
        entry = {"task": task, "n": int(n), "attention": attention, "seeds": len(ok), "failed": len(group) - len(ok)}
        if attention == "softmax" or not len(ok):
            rows.append({**entry, "mean": 1.0 if len(ok) else None, "low": None, "high": None,
                         "verdict": "reference" if len(ok) else "failed"})
            continue
        values = ok["ratio"].to_numpy(dtype=float)
        mean, low, high = ratio_interval(values)
        log_mean, log_low, log_high = ratio_interval(np.log(values))
        sd, power, needed = power_analysis(values, _paper_value(task, attention))
        rows.append({**entry, "mean": mean, "low": low, "high": high, "geo_mean": float(np.exp(log_mean)),
                     "geo_low": float(np.exp(log_low)), "geo_high": float(np.exp(log_high)), "sd": sd,
                     "paper": _paper_value(task, attention), "power": power, "seeds_for_80": needed,
                     "verdict": verdict(low, high, power) if len(ok) > 1 else "inconclusive (1 seed)",
                     "geo_verdict": verdict(np.exp(log_low), np.exp(log_high), power) if len(ok) > 1 else
                     "inconclusive (1 seed)"})
    return pd.DataFrame.from_records(rows)


def _layout(summary: pd.DataFrame, cell) -> pd.DataFrame:
    """Rows = attentions, columns = tasks, entries ``cell(row)``."""
    columns = list(dict.fromkeys(_task_label(t, n) for t, n in summary[["task", "n"]].itertuples(index=False)))
    attentions = [a for a in ATTENTION_ORDER if a in set(summary["attention"])]
    attentions += [a for a in dict.fromkeys(summary["attention"]) if a not in attentions]
    table = pd.DataFrame(index=attentions, columns=columns, dtype=object)
    for row in summary.itertuples(index=False):
        table.loc[row.attention, _task_label(row.task, row.n)] = cell(row)
    return table.fillna("-")


def _interval_cell(row, prefix: str = "") -> str:
    if row.verdict == "failed":
        return "failed"
    if row.verdict == "reference":
        return "1 (reference)"
    mean, low, high = (getattr(row, prefix + k) for k in ("mean", "low", "high"))
    text = f"{mean:.2f}" if row.seeds < 2 else f"{mean:.2f} [{low:.2f}, {high:.2f}]"
    return text + (f" ({row.failed} seeds failed)" if row.failed else "")


def _verdict_cell(row) -> str:
    """The verdict, the power beside it where the paper gives a value to size for, and the geometric
    mean's verdict where it differs."""
    text = row.verdict
    power = getattr(row, "power", float("nan"))
    if power is not None and not pd.isna(power):
        text += f" (power {power:.2f})"
    geo = getattr(row, "geo_verdict", None)
    if isinstance(geo, str) and geo != row.verdict:
        text += f"; geometric mean: {geo}"
    return text


def ratio_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``"0.77 [0.65, 0.89]"`` (mean, 95% CI over seeds)."""
    return _layout(intervals(per_seed), _interval_cell)


def verdict_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``below 1`` / ``above 1`` / ``inconclusive``."""
    return _layout(intervals(per_seed), _verdict_cell)


def _markdown(table: pd.DataFrame) -> str:
    header = "| attention | " + " | ".join(table.columns) + " |"
    rule = "|---|" + "---|" * len(table.columns)
    body = [f"| {index} | " + " | ".join(str(v) for v in row) + " |" for index, row in table.iterrows()]
    return "\n".join([header, rule, *body])


def _claim(summary: pd.DataFrame, attention: str, holds) -> str:
    """Whether a paper claim holds on every task, from the intervals (``holds(row) -> bool|None``)."""
    rows = summary[summary["attention"] == attention]
    if not len(rows) or (rows["verdict"] == "failed").all():
        return f"{attention}: no result (not run or failed)"
    answers = [holds(r) for r in rows.itertuples(index=False)]
    parts = [f"{_task_label(r.task, r.n)}: {_interval_cell(r)}, {r.verdict}" for r in rows.itertuples(index=False)]
    word = ("yes" if all(a is True for a in answers) else "no" if any(a is False for a in answers)
            else "inconclusive" if all(a is None for a in answers) else "partly (the other tasks inconclusive)")
    return f"{attention}: {word} ({'; '.join(parts)})"


def _below_one(row):
    return {"below 1": True, "above 1": False}.get(row.verdict)


def _near_one(row):
    """Nyströmformer "fluctuates around 1": the interval lies within [0.9, 1.1]."""
    if row.low is None or np.isnan(row.low):
        return None
    if 0.9 <= row.low and row.high <= 1.1:
        return True
    return False if (row.high < 0.9 or row.low > 1.1) else None


PAPER_COLUMN = {"listops": "ListOps", "pathfinder": "Pathfinder"}
"""Our task -> its column of Table 3 (WikiText-2 MLM has none; Table 3's Text is IMDb classification)."""


def paper_comparison(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (attention, task) with a Table 3 counterpart: the paper's ratio, ours with its interval,
    whether the paper's value lies inside our interval and whether both are on the same side of 1."""
    rows = []
    for row in summary.itertuples(index=False):
        column = PAPER_COLUMN.get(row.task)
        if column is None or row.attention not in PAPER_TABLE3 or row.verdict == "failed":
            continue
        paper = PAPER_TABLE3[row.attention][column]
        inside = row.low is not None and not np.isnan(row.low) and row.low <= paper <= row.high
        ours_side = {"below 1": "below", "above 1": "above"}.get(row.verdict, "undecided")
        rows.append({"attention": row.attention, "task": _task_label(row.task, row.n), "paper": f"{paper:.2f}",
                     "ours [95% CI]": _interval_cell(row), "paper inside our CI": "yes" if inside else "no",
                     "same side of 1": ("yes" if ours_side == ("below" if paper < 1 else "above") else
                                        "undecided" if ours_side == "undecided" else "no")})
    return pd.DataFrame.from_records(rows)


def _records_markdown(frame: pd.DataFrame) -> str:
    if not len(frame):
        return "(no task with a Table 3 counterpart)"
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    return "\n".join([header, rule, *("| " + " | ".join(map(str, r)) + " |" for r in frame.itertuples(index=False))])


def _power_lines(summary: pd.DataFrame) -> list[str]:
    """The power analysis: per entry with a Table 3 value below 1, the per-seed SD, the power of the
    seeds run and the seeds 80% power needs."""
    rows = summary[summary["attention"].isin(["kernelized", "skyformer"])]
    lines = ["## Power analysis", "",
             "Each seed gives one ratio (its own data, initial weights, landmarks and dropout masks). The question "
             "is whether the mean ratio differs from 1 when it is in truth the paper's value (e.g. 0.77): a "
             "two-sided one-sample t-test at 5%, with the per-seed standard deviation measured here. A verdict "
             "that is not decisive counts as \"not confirmed (underpowered)\" when the power is below "
             f"{POWER_GOAL:.0%}. The SD of a handful of seeds is itself a rough estimate, so the last column is "
             "indicative; an entry with one seed has no SD and no power.", "",
             "| attention | task | seeds | per-seed SD | paper | power at the paper's value | seeds for 80% power |",
             "|---|---|---|---|---|---|---|"]
    for r in rows.itertuples(index=False):
        if r.verdict == "failed":
            continue
        needed = "-" if r.seeds_for_80 is None or pd.isna(r.seeds_for_80) else f"{int(r.seeds_for_80)}"
        paper = "-" if r.paper is None or pd.isna(r.paper) else f"{r.paper:.2f}"
        power = "-" if pd.isna(r.power) else f"{r.power:.2f}"
        lines.append(f"| {r.attention} | {_task_label(r.task, r.n)} | {r.seeds} | {r.sd:.3f} | {paper} | {power} "
                     f"| {needed} |")
    return lines + [""]


def _settings_lines(config: dict) -> list[str]:
    """Every setting of Skyformer's Table 3 run, kept or changed here."""
    from ..optim import SKYFORMER_LRA

    tasks = {t["task"]: t for t in config["tasks"]}
    lines = ["## Settings: the paper's, kept or changed", "", "| setting | paper (Skyformer's LRA code) | here | |",
             "|---|---|---|---|"]

    def row(name, paper, here):
        lines.append(f"| {name} | {paper} | {here} | {'kept' if str(paper) == str(here) else 'changed'} |")

    for task, label in (("listops", "ListOps"), ("pathfinder", "Pathfinder")):
        paper, ours = SKYFORMER_LRA[task], tasks.get(task)
        if ours is None:
            row(f"{label} task", "in Table 3", "not run")
            continue
        row(f"{label} sequence length", paper["n"], ours["n"])
        row(f"{label} batch", paper["batch_size"], ours["batch_size"])
        row(f"{label} peak learning rate", f"{paper['lr']:g}", f"{ours['lr']:g}")
        row(f"{label} warm-up / schedule length", f"{paper['warmup']} / {paper['total_steps']}",
            f"{ours['warmup']} / {ours['total_steps']}")
    row("optimiser", "adamw", config.get("optimizer", "adam"))
    row("gradient value clipping", "1", "none" if config.get("clip_value") is None else f"{config['clip_value']:g}")
    row("dropout", "0.1", f"{config.get('dropout', 0.0):g}")
    row("attention dropout (on softmax's matrix)", "0.1", "0 (no attention here forms the n x n matrix to drop)")
    row("steps scored", 20, config["steps"])
    row("num_features (landmarks, features)", 128, config["num_features"])
    row("precision", "mixed (fp16 autocast, GPU)", config["dtype"])
    lines += ["", "- Pathfinder images come from our own generator (`approxlab.tasks.pathfinder`: 3 dashed paths, "
              "no anti-aliasing), not LRA's Pathfinder-32 files; ListOps from LRA's generator rules "
              "(`approxlab.tasks.listops`).",
              "- WikiText-2 masked LM is not a Table 3 task (Table 3's Text is IMDb byte-level classification); it "
              "is available with `--tasks wikitext-mlm:512:2` and not in the default grid.",
              "- Text (IMDb), Retrieval (ACL Anthology pairs) and Image (CIFAR-10) are missing: their data are not "
              "shipped with the package and cannot be fetched here (no network beside the package registries), "
              "and Text and Retrieval are 4,000 tokens long, beyond this CPU budget.",
              "- Sequence lengths and the Pathfinder batch are cut so that the CPU budget buys seeds (see the power "
              f"analysis); an approximation with {config['num_features']} landmarks is closer to exact at the "
              "shorter lengths than at LRA's.",
              "- With the paper's schedule the scored steps lie at the start of the warm-up (the rate rises "
              "from lr/25), as in a Table 3 run at the start of training.", ""]
    return lines


def summarize(config: dict, per_seed: pd.DataFrame, results: pd.DataFrame) -> str:
    """The markdown of ``table.md``: intervals, verdicts with their power, the power analysis, the
    settings against the paper's, Table 3 beside ours, and the compute budget."""
    summary = intervals(per_seed)
    seconds = results.groupby(list(KEY_COLUMNS))["seconds"].first()
    seeds_run = sorted(per_seed["seed"].unique().tolist())
    lines = [
        "# Instability-score ratios (Skyformer Appendix F, Table 3)", "",
        f"Mean over {config['steps']} training steps of tau_i(method) / tau_i(softmax) per seed; then over "
        f"{len(seeds_run)} seeds (of {config['seeds']} configured) the arithmetic mean (the paper's statistic) "
        "with its 95% Student-t interval. tau_i = ||f(x_i, W_i) - f(x_i, W_(i-1))||_F^2 / ||W_i - W_(i-1)||_F^2, "
        "f the embedding after the two encoder layers. Below 1: more stable than softmax attention.", "",
        _markdown(_layout(summary, _interval_cell)), "",
        "Geometric mean of the ratios (exp of the mean log ratio, 95% t interval on the logs), beside it:", "",
        _markdown(_layout(summary, lambda r: _interval_cell(r, "geo_"))), "",
        "Verdicts (arithmetic mean): \"below 1\" / \"above 1\" only when the whole 95% interval is on that "
        "side; otherwise \"not confirmed (underpowered)\" when the seeds had less than "
        f"{POWER_GOAL:.0%} power to tell the paper's value from 1, else \"inconclusive\". The power is printed "
        "beside; where the geometric mean's verdict differs, it is named.", "",
        _markdown(_layout(summary, _verdict_cell)), "",
        *_power_lines(summary),
        f"Model: 2-layer pre-LN encoder, embedding {config['model']['embedding_dim']}, feed-forward "
        f"{config['model']['hidden_dim']}, {config['model']['num_heads']} heads; padding keys masked inside every "
        "attention (landmarks and segment means over real tokens only); " + _method_note(config) + ".", "",
        *_settings_lines(config),
        "## Skyformer's Table 3 (LRA, for comparison)", "", _markdown(pd.DataFrame(PAPER_TABLE3).T), "",
        "## Entry by entry against Table 3", "", _records_markdown(paper_comparison(summary)), "",
        "## Does the paper's claim hold here? (from the intervals)", "",
        "- kernelized below 1 on every task? " + _claim(summary, "kernelized", _below_one),
        "- skyformer below 1 on every task? " + _claim(summary, "skyformer", _below_one),
        "- nystromformer around 1 (interval within 0.9-1.1)? " + _claim(summary, "nystromformer", _near_one), "",
        f"Compute: seeds {', '.join(map(str, seeds_run))}; {len(seconds)} cells, {seconds.sum():.0f} s of cell "
        f"time in total (slowest attention: {seconds.groupby(level='attention').sum().idxmax()}).",
    ]
    failed = per_seed[per_seed["status"] != "ok"]
    if len(failed):
        lines += ["", "## Failed entries", ""]
        lines += [f"- {r.task} n={r.n} seed={r.seed} {r.attention}: {r.status}" for r in failed.itertuples()]
    return "\n".join(lines) + "\n"


def _method_note(config: dict) -> str:
    options = config.get("attention_options", {})
    notes = []
    if "yoso" in config["attentions"]:
        notes.append("`yoso` is YOSO-E trained with " + (
            "the lower bound of YOSO's Eq. (4) as its backward pass" if options.get("yoso", {}).get("gradient")
            == "lower-bound" else "the true derivative of its weights"))
    notes.append("`skyformer` uses its " + options.get("skyformer", {}).get("core", "pinv") + " core")
    notes.append(f"num_features = {config['num_features']}")
    return "; ".join(notes)


def _plot(per_seed: pd.DataFrame, out: pathlib.Path) -> list:
    """Per task, each attention's per-seed ratios (dots), the arithmetic mean and its 95% interval."""
    from ..plotting import figure, method_style, save_figure

    summary = intervals(per_seed)
    panels = list(dict.fromkeys(per_seed[["task", "n"]].itertuples(index=False, name=None)))
    attentions = [a for a in ATTENTION_ORDER if a in set(per_seed["attention"]) and a != "softmax"]
    fig, axes = figure(1, len(panels), sharey=True, panel_size=(3.6, 3.0))
    for ax, (task, n) in zip(axes[0], panels):
        for x, attention in enumerate(attentions):
            colour = method_style(attention if attention != "yoso" else "yoso-e")["color"]
            values = per_seed[(per_seed["task"] == task) & (per_seed["n"] == n) & (per_seed["attention"] == attention)
                              & (per_seed["status"] == "ok")]["ratio"].to_numpy(dtype=float)
            ax.scatter(x - 0.12 + np.linspace(-0.06, 0.06, len(values)), values, s=10, color=colour, alpha=0.6)
            row = summary[(summary["task"] == task) & (summary["n"] == n) & (summary["attention"] == attention)]
            if len(row) and row["seeds"].iloc[0] > 1:
                mean, low, high = (float(row[k].iloc[0]) for k in ("mean", "low", "high"))
                ax.errorbar([x + 0.12], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color=colour,
                            capsize=3, markersize=4)
            paper = _paper_value(task, attention)
            if paper is not None:
                ax.plot([x - 0.25, x + 0.25], [paper, paper], color="black", linewidth=0.8, linestyle="--")
        ax.axhline(1.0, color="grey", linewidth=1.0, label="softmax (reference, 1)")
        ax.set_xticks(range(len(attentions)), attentions, rotation=30, ha="right", fontsize="small")
        ax.set_xlim(-0.6, len(attentions) - 0.4)
        ax.set_title(_task_label(task, n))
    axes[0][0].plot([], [], color="black", linewidth=0.8, linestyle="--", label="Table 3 (paper)")
    axes[0][0].set_ylabel("tau / tau(softmax): seeds, mean [95% CI]")
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[0][-1].legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.02, 0.5),
                       fontsize="small")  # outside the data
    return save_figure(fig, out / "instability")


def write_table(out) -> list[pathlib.Path]:
    """Read ``results.csv`` + ``config.json``; write ``ratios.csv``, ``table.md`` and the figure."""
    out = pathlib.Path(out)
    if not (out / RESULTS).is_file():
        raise StudyError(f"no {RESULTS} in {str(out)!r}: run the compute step first (without --plot-only).")
    config = saved_config(out / "config.json", RESULTS)
    results = read_results(out / RESULTS, required=KEY_COLUMNS)
    per_seed = ratios(results)
    written = [write_csv_atomic(per_seed, out / RATIOS), write_csv_atomic(intervals(per_seed), out / INTERVALS)]
    written.append(atomic_write_text(out / "table.md", summarize(config, per_seed, results)))
    if (per_seed["status"] == "ok").any():
        written += _plot(per_seed, out)
    return written


# ------------------------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    """Options of ``approxlab instability`` (besides the common ones)."""
    group = parser.add_argument_group("instability grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--tasks", type=_cli.str_list, default=None,
                       help="comma-separated NAME:N:BATCH entries, e.g. listops:1000:4,wikitext-mlm:512:2")
    group.add_argument("--attentions", type=_cli.str_list, default=None,
                       help="comma-separated attentions (softmax is always included)")
    group.add_argument("--seeds", type=_cli.positive_int, default=None, help="number of seeds")
    group.add_argument("--steps", type=_cli.positive_int, default=None, help="Adam steps per run (paper: 20)")
    group.add_argument("--num-features", type=_cli.positive_int, default=128, help="landmarks/features (paper: 128)")
    group.add_argument("--lr", type=_cli.positive_float, default=None,
                       help="peak learning rate (default: the paper's per task, ListOps 1e-4, Pathfinder 2e-4)")
    group.add_argument("--optimizer", choices=("adamw", "adam"), default="adamw",
                       help="adamw: the paper's AdamW with its warm-up schedule; adam: constant-rate Adam")
    group.add_argument("--dropout", type=_cli.probability, default=0.1, help="dropout (paper: 0.1)")
    group.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="model precision")


def run(args) -> int:
    """``approxlab instability``: compute (resumable) unless ``--plot-only``, then write the table."""
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, tasks=args.tasks, attentions=args.attentions, seeds=args.seeds,
                              steps=args.steps, num_features=args.num_features, lr=args.lr,
                              optimizer=args.optimizer, dropout=args.dropout, dtype=args.dtype)
        _cli.check_windows(args, {t["n"]: range(t["batch_size"] * config["steps"]) for t in config["tasks"]
                                  if t["task"] == "wikitext-mlm"}, n_option="--tasks")
        run_info = {"command": getattr(args, "command", "approxlab instability"), "device": args.device,
                    "scheduler": args.scheduler, "workers": args.workers, "torch": torch.__version__,
                    "threads": torch.get_num_threads()}
        start = time.perf_counter()
        compute(config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                scheduler=args.scheduler, workers=args.workers, progress=args.progress, restart=args.restart,
                run_info=run_info)
        print(f"instability: computed in {time.perf_counter() - start:.1f} s -> {out}")
    for path in write_table(out):
        print(f"instability: wrote {path}")
    return 0
