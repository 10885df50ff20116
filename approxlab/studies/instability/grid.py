"""The instability study's grid: full and ``--quick`` grids, the config the options make, the cells."""

from __future__ import annotations

import argparse

from ...errors import UsageError
from .. import checks, options
from ..declaration import Option
from ..options import NUM_FEATURES, SEEDS, STEPS, TASKS, Flatten, positive_float, probability, str_list
from .report import ATTENTION_ORDER

__all__ = ["FULL_GRID", "QUICK_GRID", "OPTIONS", "configure", "build_config", "make_cells", "check"]

_TASKS_ALLOWED = "comma-separated NAME:N:BATCH entries (e.g. listops:1000:4)"

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

OPTIONS = (
    TASKS.but(help="comma-separated NAME:N:BATCH entries, e.g. listops:1000:4,wikitext-mlm:512:2"),
    Option(("--attentions",), "attentions", "comma-separated attentions (softmax is always included)",
           type=str_list, nargs="+", action=Flatten, metavar="NAMES"),
    SEEDS, STEPS.but(help="Adam steps per run (paper: 20)"),
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

_TASK_SETTINGS = {"listops": "listops", "pathfinder": "pathfinder", "wikitext-mlm": "text"}
"""Our task -> the LRA task whose training settings (:data:`approxlab.optim.SKYFORMER_LRA`) it takes."""

MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}


def _parse_task(spec) -> dict:
    """``"listops:1000:4"`` or a dict -> ``{"task", "n", "batch_size"}``."""
    from ...tasks import available

    if isinstance(spec, dict):
        entry = dict(spec)
    else:
        parts = str(spec).split(":")
        if len(parts) != 3:
            raise UsageError("--tasks", _TASKS_ALLOWED, repr(spec))
        try:
            entry = {"task": parts[0], "n": int(parts[1]), "batch_size": int(parts[2])}
        except ValueError:
            raise UsageError("--tasks", _TASKS_ALLOWED, repr(spec)) from None
    if entry.get("task") not in available():
        raise UsageError("--tasks", f"{_TASKS_ALLOWED} with NAME among {available()}", repr(spec))
    for key in ("n", "batch_size"):
        if int(entry.get(key, 0)) < 1:
            raise UsageError("--tasks", f"{_TASKS_ALLOWED} (N and BATCH at least 1)", repr(spec))
    return {"task": entry["task"], "n": int(entry["n"]), "batch_size": int(entry["batch_size"])}


def configure(args) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``) of the parsed options.

    ``args`` holds (missing ones take their defaults):

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
        Base of every :func:`~approxlab.studies.engine.cell_seed`.
    """
    from ...optim import SKYFORMER_LRA
    from ...training import ATTENTIONS, TRAINING_OPTIONS

    value = lambda name, default=None: default if getattr(args, name, None) is None else getattr(args, name)  # noqa
    grid = options.grid(QUICK_GRID if value("quick", False) else FULL_GRID, args, OPTIONS)
    grid["tasks"], written = [_parse_task(t) for t in grid["tasks"]], grid["tasks"]
    options.check_distinct("--tasks", grid["tasks"], shown=written)  # listops:64:2 and listops:064:2 are one
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


def make_cells(config: dict, settings: dict) -> list[dict]:
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
                    "base_seed": config["base_seed"], **settings,
                })
    return cells


def check(args, config: dict) -> None:
    """The WikiText-2 masked-LM tasks fit their windows in the corpus (``--tasks``), and ``num_features`` fits
    every task (the model computes ``min(d, n)``: a larger d is refused, not lowered), before a cell runs."""
    from ...training import ATTENTIONS

    checks.check_num_features("--num-features", config["num_features"], [ATTENTIONS[a] for a in config["attentions"]],
                              [t["n"] for t in config["tasks"]], at_most_n=True)
    checks.check_windows(args, {t["n"]: range(t["batch_size"] * config["steps"]) for t in config["tasks"]
                                if t["task"] == "wikitext-mlm"}, n_option="--tasks")
