"""The instability study's grid: full and ``--quick`` grids, the config the options make, the cells."""

from __future__ import annotations

import argparse

import torch

from ...errors import UsageError
from .. import checks, options
from ..declaration import Option
from ..options import NUM_FEATURES, SEEDS, STEPS, TASKS, Flatten, positive_float, probability, str_list
from .design import PLANNED_SEEDS, task_seeds
from .report import ATTENTION_ORDER

__all__ = ["FULL_GRID", "QUICK_GRID", "OPTIONS", "configure", "build_config", "make_cells", "make_residual_cells",
           "task_seeds", "check"]

_TASKS_ALLOWED = "comma-separated NAME:N:BATCH[:SEEDS] entries (e.g. listops:1000:4 or text:256:8:40)"

FULL_GRID = {
    "tasks": [
        {"task": "text", "n": 256, "batch_size": 8, "seeds": PLANNED_SEEDS["text"]},
        {"task": "listops", "n": 256, "batch_size": 8},
        {"task": "retrieval", "n": 256, "batch_size": 8, "seeds": PLANNED_SEEDS["retrieval"]},
        {"task": "pathfinder", "n": 256, "batch_size": 8},
        {"task": "image", "n": 256, "batch_size": 8, "seeds": PLANNED_SEEDS["image"]},
    ],
    "attentions": ["softmax", "kernelized", "skyformer", "nystromformer"],
    "seeds": max(PLANNED_SEEDS["listops"], PLANNED_SEEDS["pathfinder"]),
    "steps": 20,
}
"""The full grid (overridable from the command line): Table 3's attentions on its five columns, in its
order, at n = 256 and batch 8. ``seeds`` is the count of every task entry that names none of its own
(ListOps and Pathfinder); the others carry theirs. Every count is :data:`~.design.PLANNED_SEEDS`,
sized before the run for the decision Table 3 asks (:mod:`.design`)."""

QUICK_GRID = {
    **FULL_GRID,
    "tasks": [{"task": "listops", "n": 64, "batch_size": 4}],
    "attentions": list(ATTENTION_ORDER),
    "seeds": 2,
    "steps": 3,
}
"""``--quick``: one task, every attention, 2 seeds, 3 steps (seconds on 2 CPU cores)."""

OPTIONS = (
    TASKS.but(help="comma-separated NAME:N:BATCH[:SEEDS] entries, e.g. listops:1000:4,text:256:8:40 (SEEDS: this "
              "task's seed count, default --seeds)"),
    Option(("--attentions",), "attentions", "comma-separated attentions (softmax is always included)",
           type=str_list, nargs="+", action=Flatten, metavar="NAMES"),
    SEEDS.but(help="seeds of every task that names no count of its own (the full grid's tasks name the counts sized "
                   "for Table 3)"),
    STEPS.but(help="Adam steps per run (paper: 20)"),
    NUM_FEATURES.but(help="landmarks/features (one value; paper: 128, --quick: 64); at most every task's N, a "
                          "larger value is refused, not lowered"),
    Option(("--lr",), "lr", "peak learning rate (default: the paper's per task, ListOps 1e-4, Pathfinder 2e-4)",
           type=positive_float),
    Option(("--optimizer",), "optimizer", "adamw: the paper's AdamW with its warm-up schedule; adam: constant-rate "
           "Adam", choices=("adamw", "adam"), default="adamw"),
    Option(("--dropout",), "dropout", "dropout (paper: 0.1)", type=probability, default=0.1),
    Option(("--dtype",), "dtype", "model precision", choices=("float32", "float64"), default="float32"),
)
"""The options of ``approxlab instability`` besides the common ones."""

_TASK_SETTINGS = {"listops": "listops", "pathfinder": "pathfinder", "text": "text", "retrieval": "retrieval",
                  "image": "image", "wikitext-mlm": "text"}
"""Our task -> the LRA task whose training settings (:data:`approxlab.optim.SKYFORMER_LRA`) it takes."""

MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}


def _parse_task(spec) -> dict:
    """``"listops:1000:4"``, ``"text:256:8:40"`` or a dict -> ``{"task", "n", "batch_size"[, "seeds"]}``."""
    from ...tasks import available

    if isinstance(spec, dict):
        entry = dict(spec)
    else:
        parts = str(spec).split(":")
        if len(parts) not in (3, 4):
            raise UsageError("--tasks", _TASKS_ALLOWED, repr(spec))
        try:
            entry = dict(zip(("task", "n", "batch_size", "seeds"), [parts[0], *map(int, parts[1:])]))
        except ValueError:
            raise UsageError("--tasks", _TASKS_ALLOWED, repr(spec)) from None
    if entry.get("task") not in available():
        raise UsageError("--tasks", f"{_TASKS_ALLOWED} with NAME among {available()}", repr(spec))
    for key in ("n", "batch_size", "seeds"):
        if key in entry and int(entry[key]) < 1:
            raise UsageError("--tasks", f"{_TASKS_ALLOWED} (N, BATCH and SEEDS at least 1)", repr(spec))
    parsed = {"task": entry["task"], "n": int(entry["n"]), "batch_size": int(entry["batch_size"])}
    return parsed | ({"seeds": int(entry["seeds"])} if "seeds" in entry else {})


def configure(args) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``) of the parsed options.

    ``args`` holds (missing ones take their defaults):

    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    tasks : list of str or dict, optional
        ``"name:n:batch_size"`` or ``"name:n:batch_size:seeds"`` entries (names from
        :data:`approxlab.tasks.TASKS`; ``seeds``: this task's seed count).
    attentions : list of str, optional
        Keys of :data:`approxlab.training.ATTENTIONS`; ``"softmax"`` is always added
        (it is the reference of every ratio).
    seeds : int, optional
        Seeds of every task entry that names no count of its own. Given without ``tasks``, every task of
        the grid runs this many (the grid's own per-task counts are dropped).
    steps : int, optional
        Adam steps (Skyformer: 20).
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
        Base of every :func:`~approxlab.studies.engine.cell_seed`.
    """
    from ...optim import SKYFORMER_LRA
    from ...training import ATTENTIONS, TRAINING_OPTIONS

    value = lambda name, default=None: default if getattr(args, name, None) is None else getattr(args, name)  # noqa
    grid = options.grid(QUICK_GRID if value("quick", False) else FULL_GRID, args, OPTIONS)
    tasks = [_parse_task(t) for t in grid["tasks"]]
    if value("tasks") is None and value("seeds") is not None:  # --seeds alone: that count for every task
        tasks = [{k: v for k, v in t.items() if k != "seeds"} for t in tasks]
    # a task's own count is kept only where it differs from the common one, so an entry reads the same
    # in every config that runs it alike (a saved run extends along ``seeds`` and ``tasks``)
    grid["tasks"] = [{k: v for k, v in t.items() if k != "seeds" or v != grid["seeds"]} for t in tasks]
    if len({(t["task"], t["n"]) for t in grid["tasks"]}) < len(grid["tasks"]):
        raise UsageError("--tasks", "entries with distinct NAME:N", ",".join(f"{t['task']}:{t['n']}" for t in tasks))
    for name in grid["attentions"]:
        if name not in ATTENTIONS:
            raise UsageError("--attentions", f"attentions among {sorted(ATTENTIONS)}", repr(name))
    grid["attentions"] = ["softmax"] + [a for a in grid["attentions"] if a != "softmax"]
    num_features = options.one_value("--num-features", value("num_features", 64 if value("quick", False) else 128))
    lr, optimizer, dropout, dtype = value("lr"), value("optimizer", "adamw"), value("dropout", 0.1), value("dtype", "float32")
    clip_value = getattr(args, "clip_value", 1.0)
    for entry in grid["tasks"]:
        paper = SKYFORMER_LRA[_TASK_SETTINGS[entry["task"]]]
        entry.update(lr=float(paper["lr"] if lr is None else lr), warmup=paper["warmup"],
                     total_steps=paper["total_steps"])
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
        "model": dict(MODEL),
        "f": "output of the final LayerNorm after the 2 encoder layers, (batch, n, 64)",
        "W": "all parameters f depends on (embeddings, the 2 layers, final LayerNorm); not the task head",
        "base_seed": int(value("base_seed", 0)),
    }


def build_config(*, quick: bool = False, **values) -> dict:
    """:func:`configure` from keyword values (``build_config(tasks=["listops:64:4"], seeds=2)``), for code and tests."""
    return configure(argparse.Namespace(quick=quick, **values))


def _cell(config: dict, entry: dict, seed: int, settings: dict) -> dict:
    """What a cell of (task, n, seed) needs besides its attention."""
    return {
        "task": entry["task"], "n": entry["n"], "seed": seed, "batch_size": entry["batch_size"],
        "steps": config["steps"], "num_features": config["num_features"], "lr": entry["lr"],
        "warmup": entry["warmup"], "total_steps": entry["total_steps"], "optimizer": config["optimizer"],
        "dropout": config["dropout"], "clip_value": config["clip_value"], "dtype": config["dtype"],
        "base_seed": config["base_seed"], **settings,
    }


def _seeds(config: dict):
    """``(seed, entry)`` pairs, seed by seed: each task runs seeds ``0 .. task_seeds(config, entry) - 1``."""
    for seed in range(max(task_seeds(config, entry) for entry in config["tasks"])):
        for entry in config["tasks"]:
            if seed < task_seeds(config, entry):
                yield seed, entry


def make_cells(config: dict, settings: dict) -> list[dict]:
    """Training cells, one per (task, n, seed, attention), seed by seed (a run stopped early holds whole
    seeds of every task that has them)."""
    return [{**_cell(config, entry, seed, settings), "attention": attention}
            for seed, entry in _seeds(config) for attention in config["attentions"]]


def make_residual_cells(config: dict, settings: dict) -> list[dict]:
    """Residual-stream cells (:func:`~.cells.compute_residual_cell`), one per (task, n, seed) of the grid."""
    return [_cell(config, entry, seed, settings) for seed, entry in _seeds(config)]


def check(args, config: dict) -> None:
    """Before a cell runs: ``num_features`` fits every task (the model computes ``min(d, n)``: a larger d is
    refused, not lowered), every task can be built at its ``n`` (``--tasks``), and the WikiText-2 masked-LM
    tasks fit their windows in the corpus."""
    from ...tasks import make_task
    from ...training import ATTENTIONS

    from ...methods import get

    methods = [ATTENTIONS[a] for a in config["attentions"]]
    checks.check_num_features("--num-features", config["num_features"], methods, [t["n"] for t in config["tasks"]],
                              at_most_n=True)
    if getattr(args, "num_features", None) is not None and all(get(m).features.startswith("ignored") for m in methods):
        raise UsageError("--num-features", "a run with an attention that uses it (every attention of this run, "
                         f"{', '.join(config['attentions'])}, ignores it)", config["num_features"])
    for entry in config["tasks"]:
        if entry["task"] in ("text", "retrieval", "image"):  # drawn from a finite data set: n has limits
            try:
                make_task(entry["task"], n=entry["n"], batch_size=1, num_batches=1,
                          generator=torch.Generator().manual_seed(0), data_dir=getattr(args, "data_dir", None))
            except ValueError as error:
                raise UsageError("--tasks", f"{entry['task']} at a length it can be built at ({error})",
                                 f"{entry['task']}:{entry['n']}") from None
    windows = {t["n"]: range(t["batch_size"] * config["steps"]) for t in config["tasks"] if t["task"] == "wikitext-mlm"}
    if windows:
        checks.check_windows(args, windows, n_option="--tasks")
