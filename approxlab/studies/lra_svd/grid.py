"""The Figure-4 proxy's grid, declared before any run: the tasks and their easier instances, the gates,
the decay statistic, the budget; the config the options make and the cells."""

from __future__ import annotations

import argparse

from ...errors import UsageError
from .. import options
from ..options import SEEDS, STEPS, TASKS

__all__ = ["GATES", "DECAY_INDICES", "MIN_SEEDS", "DECLARED_SEEDS", "SECONDS_PER_SEED", "TASK_OPTIONS", "FULL_GRID", "QUICK_GRID", "OPTIONS", "configure",
           "build_config", "cells"]

GATES = {"listops": 0.30, "pathfinder": 0.65}
"""Accuracy gates, fixed before any run: a model enters the decay comparison only if its final
validation accuracy reaches its task's gate (ListOps: 10 classes, majority about 0.18, LRA
transformers reach about 0.37; Pathfinder: 2 balanced classes)."""

DECAY_INDICES = (2, 64)
r"""The decay statistic, fixed before any run: the least-squares slope of :math:`\ln\sigma_i`
on :math:`i` over :math:`i = 2, \dots, 64` (1-based; :math:`\sigma_1`, the mean direction that
a near-uniform attention row produces, excluded), per test example, averaged over the test batch."""

MIN_SEEDS = 3
"""The task ordering is compared only when at least this many seeds of each task pass their gate."""

SMALLEST_EFFECT = 0.02
DECLARED_SEEDS = 13
"""Seeds per task declared for 80% power at the difference the committed run observed (-0.057 per index), before
they run: the audit's two-sample count, above the 9 that the summary's own t-test on seed-paired differences gives
(its SD is itself uncertain with 5 and 6 seeds). Not yet run. Each seed takes about 10 minutes of one core per task
(about 4.3 core-hours for 13 seeds of both tasks, 2.3 of them new); ``approxlab lra-svd --out figures/lra_svd
--seeds 13`` runs them (only the missing seeds are computed)."""
SECONDS_PER_SEED = 600
"""One seed of one task on one core (2,000 steps and the float64 spectrum), as measured by the committed run."""
r"""The smallest difference of decay slopes (per index) worth detecting, declared before the seeds
run: over the fitted indices 2..64 a slope difference of 0.02 changes
:math:`\sigma_{64}/\sigma_2` by a factor :math:`e^{0.02 \cdot 62} \approx 3.5`, about a tenth of the
slopes themselves (about -0.2 per index); the seeds are sized for 80% power at this difference, not
at an observed one."""

MEASURE_DTYPE = "float64"
r"""The dtype of the measuring forward pass (a copy of the trained float32 model): float32 resolves
:math:`\sigma_j/\sigma_1` only down to about :math:`\epsilon_{32}\sqrt{64} \approx 9.5\cdot 10^{-7}`,
where most of Pathfinder's fitted indices lay; float64 resolves about :math:`2\cdot 10^{-15}`."""

TASK_OPTIONS = {"listops": {"max_depth": 4}, "pathfinder": {"dot_intensity": 128, "path_length": [4, 7]}}
"""Easier instances than LRA's, fixed before the run so that the 2-layer model learns within the
CPU budget (each measured before the run at batch 32, one validation set of 512): ListOps trees of
depth at most 4 (LRA: 10; at depth 10 the model stayed at 0.28-0.29 accuracy after 1,200-1,500 steps
and at depth 6 at 0.30, against 0.37 at depth 4 after 1,000 steps); Pathfinder dots at intensity 128
(paths 255: LRA's dots are discs, larger than the dashes, and on a 16 x 16 canvas a 1-pixel plus in
the paths' intensity left the model at chance after 1,200 steps, 0.65-0.68 with the dots marked)
and paths of 4-7 pixels (default 5-10: 0.75 after 1,000 steps; two paths instead of three: 0.60)."""

FULL_GRID = {
    "tasks": [{"task": "listops", "n": 256, "positions": "learned", "options": TASK_OPTIONS["listops"]},
              {"task": "pathfinder", "n": 256, "positions": "2d", "options": TASK_OPTIONS["pathfinder"]}],
    "seeds": 12,
    "steps": 2000,
    "batch_size": 32,
    "train_batches": 200,
    "eval_every": 250,
    "validation_size": 512,
    "test_size": 32,
    "lr": 1e-3,
    "warmup": 200,
    "optimizer": "adamw",
    "clip_value": 1.0,
    "dropout": 0.1,
}
"""The CPU proxy of Figure 4 (see the module docstring): ListOps padded to n = 256 and
Pathfinder on a 16 x 16 canvas (n = 256, 2-D positions), the instances of :data:`TASK_OPTIONS`;
12 seeds (sized for 80% power at :data:`SMALLEST_EFFECT`); a fixed budget of 2,000 AdamW steps of batch 32 (one-cycle schedule, 200 warm-up steps,
peak lr 1e-3, gradient values clipped at 1, dropout 0.1), no early stop, the last weights kept; a
training pool of 200 batches per task (cycled, in a per-seed order); validation on 512 examples."""

QUICK_GRID = {**FULL_GRID, "tasks": [{"task": "listops", "n": 96, "positions": "learned",
                                      "options": TASK_OPTIONS["listops"]},
                                     {"task": "pathfinder", "n": 256, "positions": "2d",
                                      "options": TASK_OPTIONS["pathfinder"]}],
              "seeds": 2, "steps": 4, "batch_size": 4, "train_batches": 2, "eval_every": 2, "validation_size": 8,
              "test_size": 4, "warmup": 1}
"""``--quick``: 2 seeds, 4 steps of batch 4 (a smoke run of every code path; no model learns)."""

OPTIONS = (
    TASKS.but(help="comma-separated NAME:N[:learned|2d], e.g. listops:256,pathfinder:256:2d"),
    STEPS.but(help="fixed step budget per seed"),
    SEEDS.but(help="seeds per task"),
)
"""The options of ``approxlab lra-svd`` besides the common ones."""

RESULTS, SPECTRA, TRAINING = "results.csv", "spectra.csv", "training.csv"
KEY_COLUMNS = ("task", "n", "seed")
MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}
_GRID_KEYS = ("seeds", "steps", "batch_size", "train_batches", "eval_every", "validation_size", "test_size", "lr",
              "warmup", "optimizer", "clip_value", "dropout")


def _parse_tasks(tasks) -> list[dict]:
    from ...tasks import available

    parsed = []
    for spec in tasks:
        name, _, rest = str(spec).partition(":")
        n, _, positions = rest.partition(":")
        positions = positions or ("2d" if name == "pathfinder" else "learned")
        if name not in available() or not n.isdigit() or int(n) < 1 or positions not in ("learned", "2d"):
            raise UsageError("--tasks", f"comma-separated NAME:N[:learned|2d] entries with NAME among {available()}",
                             repr(spec))
        parsed.append({"task": name, "n": int(n), "positions": positions, "options": dict(TASK_OPTIONS.get(name, {}))})
    return parsed


def configure(args) -> dict:
    """The grid (saved and hashed in ``config.json``) of the parsed options; ``tasks`` as ``"name:n[:positions]"``."""
    grid = options.grid(QUICK_GRID if getattr(args, "quick", False) else FULL_GRID, args, OPTIONS)
    if getattr(args, "tasks", None) is not None:
        grid["tasks"] = _parse_tasks(args.tasks)
        options.check_distinct("--tasks", grid["tasks"], shown=args.tasks)  # listops:32 is listops:32:learned
    return {"study": "lra-svd", "paper": "Skyformer (Chen et al., NeurIPS 2021), Appendix B, Figure 4",
            **grid, "model": dict(MODEL), "attention": "softmax", "layer": 2,
            "matrix": "attention output of layer 2 (heads concatenated, before the output projection), real tokens",
            "gates": dict(GATES), "decay_indices": list(DECAY_INDICES), "min_seeds": MIN_SEEDS,
            "measure_dtype": MEASURE_DTYPE, "smallest_effect": SMALLEST_EFFECT,
            "base_seed": int(getattr(args, "base_seed", 0) or 0)}


def build_config(*, quick: bool = False, **values) -> dict:
    """:func:`configure` from keyword values (``build_config(tasks=["listops:128"], seeds=5)``), for code and tests."""
    return configure(argparse.Namespace(quick=quick, **values))


def _hashable(options: dict) -> tuple:
    """A task's options as sorted (name, value) pairs, lists as tuples (a cache key of the shared task pool)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


def cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (task, seed), seed by seed: it trains and measures one model."""
    common = {k: config[k] for k in _GRID_KEYS if k != "seeds"}
    common["measure_dtype"] = config.get("measure_dtype", "float32")  # runs made before float64 measured in float32
    return [{**entry, "options": _hashable(entry.get("options", {})), "seed": seed, **common,
             "base_seed": config["base_seed"]}
            for seed in range(config["seeds"]) for entry in config["tasks"]]
