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
   The table step is :mod:`approxlab.studies.instability_report`, its statistics
   :mod:`approxlab.studies.instability_stats`.

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

description = 'Instability score of the approximations (Skyformer Appendix F / Table 3).'  # transitional

import functools
import pathlib
import time
import warnings

import pandas as pd
import torch

from . import _cli
from .instability_report import (  # noqa: F401 (re-exported: the table step)
    ATTENTION_ORDER, INTERVALS, KEY_COLUMNS, RATIOS, RESULTS, paper_comparison, ratio_table, summarize, verdict_table,
    write_table)
from .instability_stats import (  # noqa: F401 (re-exported: the statistics)
    PAPER_COLUMN, PAPER_DIFFERENCE, PAPER_TABLE3, POWER_GOAL, intervals, power_analysis, ratio_interval, ratios,
    verdict)
from .runner import StudyError, cell_seed, run_cells

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

_TASK_SETTINGS = {"listops": "listops", "pathfinder": "pathfinder", "wikitext-mlm": "text"}
"""Our task -> the LRA task whose training settings (:data:`approxlab.optim.SKYFORMER_LRA`) it takes."""

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
