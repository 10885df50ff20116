r"""Skyformer Table 3: instability scores of attention approximations during training.

Regenerates Table 3 of Skyformer (Chen et al., NeurIPS 2021, Appendix F). A 2-layer encoder
(:class:`approxlab.training.TinyEncoder`: embedding 64, feed-forward 128, 2 heads) is
trained for a few Adam steps (lr ``1e-4``) with each attention in turn; every model starts
from the same weights (one draw from a seeded generator; attentions have no parameters of
their own) and sees the same batches. At step ``i`` the instability score is

.. math::

    \tau_i = \|f(x_i, W_i) - f(x_i, W_{i-1})\|_F^2 \,/\, \|W_i - W_{i-1}\|_F^2

with :math:`f` the embedding after the two layers; a table entry is the mean over the
steps of :math:`\tau_i(\text{method}) / \tau_i(\text{softmax})`, then the mean over seeds
with its 95% Student-t confidence interval (:func:`ratio_interval`) and a verdict
(:func:`verdict`): "below 1" only when the whole interval is below 1, "inconclusive" when it
contains 1. Below 1: the method moves its output less than softmax attention for the same
parameter change (Skyformer's "more stable").

Three steps (STYLE.md convention 9), all behind ``approxlab instability``:

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
tasks: ListOps (generated, LRA's generator, :mod:`approxlab.tasks.listops`) at ``n = 1000``,
batch 4; Pathfinder (generated, :mod:`approxlab.tasks.pathfinder`) at LRA's ``n = 1024``
(32 x 32), batch 4; WikiText-2 masked LM (:mod:`approxlab.tasks.mlm`) at ``n = 512``, batch 2.
Attentions: softmax (reference), kernelized, skyformer (Schulz core), nystromformer,
spectral-shifting, yoso (YOSO-E with YOSO's Eq. (4) backward; see
:data:`approxlab.training.ATTENTIONS` and :data:`~approxlab.training.TRAINING_OPTIONS`);
padding keys masked in every attention; ``num_features = 128`` (Skyformer Section 5);
5 seeds; 20 steps. LRA's ListOps pads to 2000 tokens with batch 32 and Skyformer trains on a
V100: one softmax step at that shape took 73 s on this 2-core CPU machine (shared), so a
20-step table would take hours; ``--tasks listops:2000:32`` restores LRA's shape at that cost.

``--quick``: ListOps at ``n = 256`` (batch 4), 2 seeds, 5 steps, all attentions; written
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
        {"task": "listops", "n": 1000, "batch_size": 4},
        {"task": "pathfinder", "n": 1024, "batch_size": 4},
        {"task": "wikitext-mlm", "n": 512, "batch_size": 2},
    ],
    "attentions": list(ATTENTION_ORDER),
    "seeds": 5,
    "steps": 20,
}
"""The full grid (overridable from the command line)."""

QUICK_GRID = {
    **FULL_GRID,
    "tasks": [{"task": "listops", "n": 256, "batch_size": 4}],
    "seeds": 2,
    "steps": 5,
}
"""``--quick``: one task, 2 seeds, 5 steps (under 2 minutes on 2 CPU cores)."""

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
    lr: float = 1e-4,
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
    lr : float
        Adam learning rate (Skyformer: 1e-4 for ListOps and Text).
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
    if not float(lr) > 0:
        raise StudyError(f"--lr must be > 0; got {lr}.")
    if dtype not in ("float32", "float64"):
        raise StudyError(f"--dtype must be 'float32' or 'float64'; got {dtype!r}.")
    return {
        "study": "instability",
        "paper": "Skyformer (Chen et al., NeurIPS 2021), Appendix F, Table 3",
        **grid,
        "num_features": int(num_features),
        "attention_options": {a: TRAINING_OPTIONS[a] for a in grid["attentions"] if a in TRAINING_OPTIONS},
        "padding": "padding keys masked inside every attention (key_mask); padding left out of the mean pooling",
        "lr": float(lr),
        "optimizer": "Adam (betas 0.9, 0.999; eps 1e-8)",
        "dtype": dtype,
        "model": dict(_MODEL),
        "f": "output of the final LayerNorm after the 2 encoder layers, (batch, n, 64)",
        "W": "all parameters f depends on (embeddings, the 2 layers, final LayerNorm); not the task head",
        "base_seed": int(base_seed),
    }


def make_cells(config: dict, *, data_dir=None, cache_dir=None, device: str = "cpu") -> list[dict]:
    """Runner cells, one per (task, n, seed, attention), adjacent per (task, n, seed)."""
    cells = []
    for entry in config["tasks"]:
        for seed in range(config["seeds"]):
            for attention in config["attentions"]:
                cells.append({
                    "task": entry["task"], "n": entry["n"], "seed": seed, "attention": attention,
                    "batch_size": entry["batch_size"], "steps": config["steps"],
                    "num_features": config["num_features"], "lr": config["lr"], "dtype": config["dtype"],
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
        kind=task.kind, num_classes=task.num_classes, generator=init, dtype=dtype, **_MODEL,
    ).to(cell["device"])
    batches = [_to_device(b, cell["device"]) for b in task.batches]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = instability_trace(model, batches, lr=cell["lr"], seed=attention_seed % (2**62))
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


def verdict(low: float, high: float) -> str:
    """``"below 1"`` when the whole interval is below 1, ``"above 1"`` when above, else ``"inconclusive"``."""
    if high < 1.0:
        return "below 1"
    if low > 1.0:
        return "above 1"
    return "inconclusive"


def intervals(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, attention): seeds, failed seeds, mean, 95% CI (low, high) and verdict."""
    rows = []
    for (task, n, attention), group in per_seed.groupby(["task", "n", "attention"], sort=False):
        ok = group[group["status"] == "ok"]
        entry = {"task": task, "n": int(n), "attention": attention, "seeds": len(ok), "failed": len(group) - len(ok)}
        if attention == "softmax" or not len(ok):
            rows.append({**entry, "mean": 1.0 if len(ok) else None, "low": None, "high": None,
                         "verdict": "reference" if len(ok) else "failed"})
            continue
        mean, low, high = ratio_interval(ok["ratio"].to_numpy(dtype=float))
        rows.append({**entry, "mean": mean, "low": low, "high": high,
                     "verdict": verdict(low, high) if len(ok) > 1 else "inconclusive (1 seed)"})
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


def _interval_cell(row) -> str:
    if row.verdict == "failed":
        return "failed"
    if row.verdict == "reference":
        return "1 (reference)"
    text = f"{row.mean:.2f}" if row.seeds < 2 else f"{row.mean:.2f} [{row.low:.2f}, {row.high:.2f}]"
    return text + (f" ({row.failed} seeds failed)" if row.failed else "")


def ratio_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``"0.77 [0.65, 0.89]"`` (mean, 95% CI over seeds)."""
    return _layout(intervals(per_seed), _interval_cell)


def verdict_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``below 1`` / ``above 1`` / ``inconclusive``."""
    return _layout(intervals(per_seed), lambda row: row.verdict)


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


def summarize(config: dict, per_seed: pd.DataFrame, results: pd.DataFrame) -> str:
    """The markdown of ``table.md``: the table with intervals, verdicts, the paper's Table 3."""
    summary = intervals(per_seed)
    paper = pd.DataFrame(PAPER_TABLE3).T
    seconds = results.groupby(list(KEY_COLUMNS))["seconds"].first()
    options = config.get("attention_options", {})
    lines = [
        "# Instability-score ratios (Skyformer Appendix F, Table 3)",
        "",
        f"Mean over {config['steps']} Adam steps (lr {config['lr']:g}) of tau_i(method) / tau_i(softmax); "
        f"mean over {config['seeds']} seeds with its 95% confidence interval (Student t over seeds). "
        "tau_i = ||f(x_i, W_i) - f(x_i, W_(i-1))||_F^2 / ||W_i - W_(i-1)||_F^2 with f the embedding after "
        "the two encoder layers. Below 1: more stable than softmax attention.",
        "",
        _markdown(_layout(summary, _interval_cell)),
        "",
        "Verdicts: \"below 1\" only when the whole 95% interval is below 1, \"above 1\" when it is above, "
        "\"inconclusive\" when it contains 1.",
        "",
        _markdown(_layout(summary, lambda row: row.verdict)),
        "",
        f"Model: 2-layer pre-LN encoder, embedding {config['model']['embedding_dim']}, feed-forward "
        f"{config['model']['hidden_dim']}, {config['model']['num_heads']} heads, {config['dtype']}; "
        f"num_features = {config['num_features']}; tasks (name, n, batch): "
        + ", ".join(f"{t['task']} {t['n']} x{t['batch_size']}" for t in config["tasks"])
        + ". Padding keys are masked inside every attention. `yoso` is YOSO-E (the expectation of YOSO's "
        "hashing) trained with "
        + ("the lower bound of YOSO's Eq. (4) as its backward pass, as the YOSO paper trains"
           if options.get("yoso", {}).get("gradient") == "lower-bound" else "the true derivative of its weights")
        + "; `skyformer` uses its " + options.get("skyformer", {}).get("core", "pinv") + " core.",
        "",
        "## Skyformer's Table 3 (LRA, for comparison)",
        "",
        _markdown(paper),
        "",
        "## Entry by entry against Table 3",
        "",
        _records_markdown(paper_comparison(summary)),
        "",
        "## Does the paper's claim hold here? (from the intervals)",
        "",
        "- kernelized below 1 on every task? " + _claim(summary, "kernelized", _below_one),
        "- skyformer below 1 on every task? " + _claim(summary, "skyformer", _below_one),
        "- nystromformer around 1 (interval within 0.9-1.1)? " + _claim(summary, "nystromformer", _near_one),
        "",
        "Appendix B's Figure 4 (singular values of a trained model's attention output) is regenerated by "
        "`approxlab lra-svd` (figures/lra_svd/summary.md says what matches it).",
        "",
        f"Compute: {len(seconds)} cells, {seconds.sum():.0f} s of cell time in total "
        f"(slowest attention: {seconds.groupby(level='attention').sum().idxmax()}).",
    ]
    failed = per_seed[per_seed["status"] != "ok"]
    if len(failed):
        lines += ["", "## Failed entries", ""]
        lines += [f"- {r.task} n={r.n} seed={r.seed} {r.attention}: {r.status}" for r in failed.itertuples()]
    return "\n".join(lines) + "\n"


def _plot(per_step: pd.DataFrame, out: pathlib.Path) -> list:
    from ..plotting import figure, method_style, save_figure

    panels = list(dict.fromkeys(per_step[["task", "n"]].itertuples(index=False, name=None)))
    fig, axes = figure(1, len(panels), sharey=True)
    for ax, (task, n) in zip(axes[0], panels):
        data = per_step[(per_step["task"] == task) & (per_step["n"] == n)]
        for attention, group in data.groupby("attention", sort=False):
            curve = group.groupby("step")["ratio"].mean()
            style = method_style(attention if attention != "yoso" else "yoso-e")
            style["label"] = attention
            ax.plot(curve.index, curve.to_numpy(), **style)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_title(_task_label(task, n))
        ax.set_xlabel("step i")
    axes[0][0].set_ylabel("tau_i / tau_i(softmax), mean over seeds")
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5))  # outside the data
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
    ok = results[results["status"] == "ok"]
    reference = ok[ok["attention"] == "softmax"][["task", "n", "seed", "step", "tau"]]
    per_step = ok.merge(reference, on=["task", "n", "seed", "step"], suffixes=("", "_softmax"))
    per_step = per_step.assign(ratio=per_step["tau"] / per_step["tau_softmax"])
    if len(per_step):
        written += _plot(per_step, out)
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
    group.add_argument("--lr", type=_cli.positive_float, default=1e-4, help="Adam learning rate (paper: 1e-4)")
    group.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="model precision")


def run(args) -> int:
    """``approxlab instability``: compute (resumable) unless ``--plot-only``, then write the table."""
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, tasks=args.tasks, attentions=args.attentions, seeds=args.seeds,
                              steps=args.steps, num_features=args.num_features, lr=args.lr, dtype=args.dtype)
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
