r"""Skyformer Appendix B, Figure 4: singular values of a trained transformer's attention output.

Regenerates Figure 4 of Skyformer (Chen et al., NeurIPS 2021, Appendix B): "the singular value
distribution of attention output from the second layer of a trained vanilla transformer ...
averaged across one random batch from the test set in each LRA task", and the decay rate per
task that Appendix B reads as task difficulty ("the singular values in Document Retrieval and
Pathfinder tasks decay slower ... those two tasks are more difficult than Text Classification
and ListOps"). The companion study on BERT/MiniLM attention matrices of WikiText-2 is
:mod:`approxlab.studies.sv_decay`.

A CPU proxy (:data:`FULL_GRID`), declared with its gates before any run: Skyformer's models were
trained to LRA accuracy (up to 50k steps on a GPU); on a 2-core CPU the proxy uses shorter
sequences (ListOps padded to 256 tokens, :mod:`approxlab.tasks.listops`; Pathfinder on a 16 x 16
canvas, :mod:`approxlab.tasks.pathfinder`, with row + column position embeddings so the model
sees which pixels neighbour each other), easier instances (:data:`TASK_OPTIONS`: shallower ListOps
trees, Pathfinder dots in their own intensity), a fixed step budget with no early stop, and the
authors' optimiser (:mod:`approxlab.optim`). Per (task, seed) -- one runner cell each, ``--workers``
of them at once:

1. train the 2-layer softmax :class:`approxlab.training.TinyEncoder` of Skyformer Section 5
   (embedding 64, feed-forward 128, 2 heads, dropout 0.1) for the fixed budget
   (:func:`approxlab.training.train_classifier` with ``patience=None``, last weights kept);
2. measure the final validation accuracy on ``validation_size`` held-out examples against the
   task's gate (:data:`GATES`, fixed in code before the run);
3. on one test batch, take the second layer's attention output (heads concatenated, before
   the output projection; the real tokens' rows: an ``(n_i, 64)`` matrix per example), its
   singular values :math:`\sigma_j/\sigma_1` (float64), and the decay statistic fixed in
   advance (:data:`DECAY_INDICES`, :func:`decay_slope`: slope of :math:`\ln\sigma_i` over
   :math:`i = 2..64`), averaged over the batch.

Appendix B's reading, "Pathfinder decays slower than ListOps", is tested by :func:`ordering` on
the seeds that pass their gates (Welch t interval on the difference of the mean slopes), only
when at least :data:`MIN_SEEDS` seeds of each task pass; otherwise nothing is said about the
ordering.

Tables (split from the resumable journal ``cells.csv``, which holds every row of a finished cell):
``results.csv`` (per task and seed: steps, final validation accuracy and its size,
majority-class rate, gate, passed, test-batch accuracy, decay slope mean and std over the batch,
seconds), ``spectra.csv`` (per task, seed and index: mean, min and max over the batch of
:math:`\sigma_j/\sigma_1`), ``training.csv`` (per evaluation: step, training loss, validation
accuracy); ``lra_svd.png/.pdf`` and ``summary.md`` are drawn from them (``--plot-only`` redraws).

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021. Section 5, Appendix B (Figure 4).

Tay et al. *Long Range Arena*. ICLR 2021.
"""

from __future__ import annotations

description = "Singular values of a trained 2-layer model's attention output on generated LRA tasks (Skyformer Appendix B, Figure 4)."  # transitional

import functools
import math
import pathlib
import time

import numpy as np
import pandas as pd
import torch

from . import _cli
from ._compat_io import atomic_write_text, read_results, write_table
from .runner import StudyError, cell_seed, run_cells, saved_config

__all__ = ["FULL_GRID", "QUICK_GRID", "TASK_OPTIONS", "GATES", "DECAY_INDICES", "build_config", "attention_output_spectrum",
           "resolution_floor",
           "decay_slope", "compute_cell", "compute", "ordering", "plot", "summarize", "add_arguments", "run"]

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
    "seeds": 3,
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
3 seeds; a fixed budget of 2,000 AdamW steps of batch 32 (one-cycle schedule, 200 warm-up steps,
peak lr 1e-3, gradient values clipped at 1, dropout 0.1), no early stop, the last weights kept; a
training pool of 200 batches per task (cycled, in a per-seed order); validation on 512 examples."""

QUICK_GRID = {**FULL_GRID, "tasks": [{"task": "listops", "n": 96, "positions": "learned",
                                      "options": TASK_OPTIONS["listops"]},
                                     {"task": "pathfinder", "n": 256, "positions": "2d",
                                      "options": TASK_OPTIONS["pathfinder"]}],
              "seeds": 2, "steps": 4, "batch_size": 4, "train_batches": 2, "eval_every": 2, "validation_size": 8,
              "test_size": 4, "warmup": 1}
"""``--quick``: 2 seeds, 4 steps of batch 4 (a smoke run of every code path; no model learns)."""

RESULTS, SPECTRA, TRAINING, CELLS = "results.csv", "spectra.csv", "training.csv", "cells.csv"
_COLUMNS = {"results": ["steps", "validation_accuracy", "validation_size", "majority_rate", "gate", "passed",
                        "test_batch_accuracy", "decay_slope", "decay_slope_std", "num_singular_values", "seconds"],
            "spectra": ["index", "mean", "min", "max"],
            "training": ["step", "train_loss", "validation_accuracy"]}
_OPTION_TEXT = {"max_depth": "trees of depth <= {}", "dot_intensity": "dots at intensity {}, paths at 255",
                "path_length": "paths of {0[0]}-{0[1]} pixels"}
_TYPES = {"steps": int, "validation_size": int, "num_singular_values": int, "index": int, "step": int}
KEY_COLUMNS = ("task", "n", "seed")
_MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}
_LABELS = {"listops": "ListOps", "pathfinder": "Pathfinder"}
_GRID_KEYS = ("seeds", "steps", "batch_size", "train_batches", "eval_every", "validation_size", "test_size", "lr",
              "warmup", "optimizer", "clip_value", "dropout")


def _parse_tasks(tasks) -> list[dict]:
    from ..tasks import available

    parsed = []
    for spec in tasks:
        name, _, rest = str(spec).partition(":")
        n, _, positions = rest.partition(":")
        positions = positions or ("2d" if name == "pathfinder" else "learned")
        if name not in available() or not n.isdigit() or int(n) < 1 or positions not in ("learned", "2d"):
            raise StudyError(f"--tasks entries must be NAME:N[:learned|2d] with NAME in {available()}; got {spec!r}.")
        parsed.append({"task": name, "n": int(n), "positions": positions, "options": dict(TASK_OPTIONS.get(name, {}))})
    return parsed


def build_config(*, quick: bool = False, tasks=None, steps=None, seeds=None, base_seed: int = 0) -> dict:
    """The grid (saved and hashed in ``config.json``); ``tasks`` as ``"name:n[:positions]"`` strings."""
    grid = dict(QUICK_GRID if quick else FULL_GRID)
    if tasks is not None:
        grid["tasks"] = _parse_tasks(tasks)
    for name, value in (("steps", steps), ("seeds", seeds)):
        if value is not None:
            if int(value) < 1:
                raise StudyError(f"--{name} must be an integer >= 1; got {value}.")
            grid[name] = int(value)
    return {"study": "lra-svd", "paper": "Skyformer (Chen et al., NeurIPS 2021), Appendix B, Figure 4",
            **grid, "model": dict(_MODEL), "attention": "softmax", "layer": 2,
            "matrix": "attention output of layer 2 (heads concatenated, before the output projection), real tokens",
            "gates": dict(GATES), "decay_indices": list(DECAY_INDICES), "min_seeds": MIN_SEEDS,
            "base_seed": int(base_seed)}


def decay_slope(sigma: torch.Tensor, indices=DECAY_INDICES) -> torch.Tensor:
    r"""Least-squares slope of :math:`\ln\sigma_i` on :math:`i` over ``indices`` (1-based, inclusive).

    Parameters
    ----------
    sigma : torch.Tensor
        ``(*batch, r)`` positive singular values in decreasing order, ``r >= indices[1]``.
    indices : (int, int)
        First and last index of the fit (default :data:`DECAY_INDICES`: 2..64, :math:`\sigma_1` out).

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64 slopes :math:`c` in :math:`\sigma_i \approx C e^{c i}`; the same for
        :math:`\sigma` and :math:`\sigma/\sigma_1`.
    """
    first, last = int(indices[0]), int(indices[1])
    if not 1 <= first < last or sigma.shape[-1] < last:
        raise ValueError(f"`sigma` must hold at least {last} values for indices {first}..{last}; "
                         f"got {sigma.shape[-1]}.")
    y = torch.log(sigma[..., first - 1:last].to(torch.float64))
    if not bool(torch.isfinite(y).all()):
        raise ValueError("`sigma` must be positive over the fitted indices (a log of 0 has no slope).")
    i = torch.arange(first, last + 1, dtype=torch.float64)
    i = i - i.mean()
    return ((y - y.mean(-1, keepdim=True)) * i).sum(-1) / i.square().sum()


def attention_output_spectrum(model, batch, *, layer: int = 1):
    r"""Normalised singular values of layer ``layer``'s attention output (0-based).

    Returns
    -------
    torch.Tensor
        ``(batch, r)`` float64, :math:`\sigma_j/\sigma_1` of each example's ``(n_i, e)`` matrix
        (its real tokens' rows), ``r = min(min_i n_i, e)``.
    """
    from ..linalg.conditioning import singular_values

    outputs = []
    with torch.no_grad():
        model.eval()
        model.predict(batch, attention_outputs=outputs)
    matrices = [outputs[layer][i][batch.mask[i]].to(torch.float64) for i in range(batch.mask.shape[0])]
    rank = min(min(m.shape) for m in matrices)
    sigma = torch.stack([singular_values(m)[:rank] for m in matrices])
    return sigma / sigma[:, :1]


@functools.lru_cache(maxsize=4)
def _task_data(task, n, options, base_seed, batch_size, train_batches, validation_size):
    """A task's training pool and validation set, shared by its seeds (generation costs as much as a step)."""
    from ..tasks import make_task

    def batches(split, size, count):
        g = torch.Generator().manual_seed(cell_seed(task, n, split, base_seed=base_seed))
        return make_task(task, n=n, batch_size=size, num_batches=count, generator=g, **dict(options))

    validation_batch = min(32, validation_size)
    return (batches("train", batch_size, train_batches),
            batches("validation", validation_batch, -(-validation_size // validation_batch)).batches)


def _train(cell):
    from ..tasks import make_task
    from ..training import TinyEncoder, train_classifier

    train, validation = _task_data(cell["task"], cell["n"], cell["options"], cell["base_seed"], cell["batch_size"],
                                   cell["train_batches"], cell["validation_size"])
    seed = lambda part: cell_seed(cell["task"], cell["n"], cell["seed"], part, base_seed=cell["base_seed"])  # noqa: E731
    order = torch.cat([torch.randperm(len(train.batches), generator=torch.Generator().manual_seed(seed("order") + e))
                       for e in range(-(-cell["steps"] // len(train.batches)))])[:cell["steps"]]
    model = TinyEncoder(vocab_size=train.vocab_size, n=cell["n"], attention="softmax", kind="classification",
                        num_classes=train.num_classes, positions=cell["positions"], dropout=cell["dropout"],
                        generator=torch.Generator().manual_seed(seed("init")), **_MODEL)
    trained = train_classifier(model, [train.batches[int(i)] for i in order], validation, lr=cell["lr"],
                               eval_every=cell["eval_every"], patience=None, seed=seed("steps") % 2**62,
                               optimizer=cell["optimizer"], warmup=cell["warmup"], clip_value=cell["clip_value"],
                               keep="last")
    test = make_task(cell["task"], n=cell["n"], batch_size=cell["test_size"], num_batches=1,
                     generator=torch.Generator().manual_seed(seed("test")), **dict(cell["options"])).batches[0]
    labels = torch.cat([b.labels for b in validation])
    return model, trained, test, float(torch.bincount(labels).max()) / labels.numel()


def _cell_tables(cell: dict) -> dict:
    """Train and measure one (task, seed): its rows of the three tables."""
    from ..training import accuracy

    start = time.perf_counter()
    model, trained, test, majority = _train(cell)
    sigma = attention_output_spectrum(model, test, layer=1)
    last = DECAY_INDICES[1]
    slope = decay_slope(sigma) if sigma.shape[-1] >= last else torch.full((sigma.shape[0],), float("nan"))
    gate = GATES.get(cell["task"], float("nan"))
    summary = {"steps": trained["steps"], "validation_accuracy": trained["final_accuracy"],
               "validation_size": cell["validation_size"], "majority_rate": majority, "gate": gate,
               "passed": bool(trained["final_accuracy"] >= gate),
               "test_batch_accuracy": accuracy(model, [test]), "decay_slope": float(slope.mean()),
               "decay_slope_std": float(slope.std()) if slope.numel() > 1 else 0.0,
               "num_singular_values": sigma.shape[-1], "seconds": time.perf_counter() - start}
    spectra = [{"index": j + 1, "mean": float(sigma[:, j].mean()), "min": float(sigma[:, j].min()),
                "max": float(sigma[:, j].max())} for j in range(sigma.shape[-1])]
    return {"results": [summary], "spectra": spectra, "training": trained["history"]}


def _hashable(options: dict) -> tuple:
    """A task's options as sorted (name, value) pairs, lists as tuples (a cache key of :func:`_task_data`)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


def compute_cell(cell: dict) -> list[dict]:
    """Every row of one (task, seed), each tagged with its table ("results", "spectra", "training")."""
    return [{"table": name, **row} for name, rows in _cell_tables(cell).items() for row in rows]


def compute(config: dict, out, *, workers=None, progress=True, restart=False, run_info=None):
    """Train and measure every (task, seed); write the three tables and ``config.json``.

    The cells' rows go to one journal, ``cells.csv`` (resumable, one row per table row, tagged by
    table); the three tables are split from it. ``workers`` trains that many cells at once, each in
    a single-threaded process (:func:`approxlab.studies.runner.run_cells`).
    """
    out = pathlib.Path(out)
    common_keys = {k: config[k] for k in _GRID_KEYS if k != "seeds"}
    cells = [{**entry, "options": _hashable(entry.get("options", {})), "seed": seed, **common_keys,
              "base_seed": config["base_seed"]}
             for seed in range(config["seeds"]) for entry in config["tasks"]]
    rows = run_cells(cells, compute_cell, results_path=out / CELLS, key_columns=KEY_COLUMNS, config=config,
                     run_info=run_info, workers=workers, progress=progress, restart=restart)
    tables = []
    for name, path in (("results", RESULTS), ("spectra", SPECTRA), ("training", TRAINING)):
        columns = [*KEY_COLUMNS, *_COLUMNS[name]]
        table = rows.loc[rows["table"] == name, columns].reset_index(drop=True)
        table = table.astype({c: _TYPES[c] for c in columns if c in _TYPES})
        tables.append(read_results(write_table(table, out / path, KEY_COLUMNS)))  # as the file reads back
    return tables


def _load(out):
    out = pathlib.Path(out)
    for name in (RESULTS, SPECTRA, TRAINING):
        if not (out / name).is_file():
            raise StudyError(f"no {name} in {str(out)!r}: run the compute step first (without --plot-only).")
    return (saved_config(out / "config.json", RESULTS), read_results(out / RESULTS, required=KEY_COLUMNS),
            read_results(out / SPECTRA), read_results(out / TRAINING))


def _run_record(out) -> dict:
    """The ``run`` entry of ``config.json`` (command line, threads, workers), or {}."""
    from ._compat_io import read_json

    try:
        return read_json(pathlib.Path(out) / "config.json").get("run", {}) or {}
    except (OSError, ValueError):
        return {}


def _label(task, n):
    return f"{_LABELS.get(task, task)} (n={n})"


def ordering(results: pd.DataFrame, *, level: float = 0.95, min_seeds: int = MIN_SEEDS) -> dict:
    r"""Appendix B's claim "Pathfinder decays slower than ListOps" on the seeds that pass their gate.

    The difference is Pathfinder's mean decay slope minus ListOps' (both negative; a positive
    difference = Pathfinder slower), with a Welch t interval over seeds (each seed one trained
    model). Verdict: ``"Pathfinder slower"`` when the interval is above 0, ``"Pathfinder faster"``
    when below, ``"inconclusive"`` when it contains 0, and ``"not compared (gate)"`` when fewer than
    ``min_seeds`` seeds of a task passed: then nothing is said about the ordering.
    """
    from scipy import stats

    passed = results[results["passed"].astype(bool)]
    slopes = {t: passed.loc[passed["task"] == t, "decay_slope"].to_numpy(dtype=float) for t in ("pathfinder", "listops")}
    entry = {"seeds_pathfinder": len(slopes["pathfinder"]), "seeds_listops": len(slopes["listops"]),
             "difference": float("nan"), "low": float("nan"), "high": float("nan")}
    if min(len(v) for v in slopes.values()) < max(min_seeds, 2):
        return {**entry, "verdict": "not compared (gate)"}
    test = stats.ttest_ind(slopes["pathfinder"], slopes["listops"], equal_var=False)
    interval = test.confidence_interval(level)
    low, high = float(interval.low), float(interval.high)
    verdict = "Pathfinder slower" if low > 0 else "Pathfinder faster" if high < 0 else "inconclusive"
    difference = float(slopes["pathfinder"].mean() - slopes["listops"].mean())
    return {**entry, "difference": difference, "low": low, "high": high, "verdict": verdict,
            **_power(difference, *(float(np.std(slopes[t], ddof=1)) for t in ("pathfinder", "listops")),
                     min(len(v) for v in slopes.values()), 1 - level)}


def _power(difference, sd_pathfinder, sd_listops, seeds, alpha) -> dict:
    r"""Power of the seeds at hand to see ``difference`` at the observed spreads, and the seeds per
    task that 80% power needs: a t-test on seed-paired differences, :math:`sd = \sqrt{s_P^2 + s_L^2}`,
    ``seeds - 1`` degrees of freedom (no more than Welch's; :func:`approxlab.stats.t_test_power`)."""
    from ..stats import t_test_power, t_test_sample_size

    sd = math.hypot(sd_pathfinder, sd_listops)
    if not (sd > 0 and difference != 0 and seeds >= 2):
        return {"power": float("nan"), "seeds_for_80": float("nan")}
    return {"power": t_test_power(seeds, difference=difference, sd=sd, alpha=alpha),
            "seeds_for_80": t_test_sample_size(difference=difference, sd=sd, power=0.8, alpha=alpha, max_n=10**6)}


def plot(out) -> list:
    """``lra_svd.png/.pdf``: per seed, the test batch's mean sigma_j/sigma_1 (left) and the decay slope (right)."""
    from ..plotting import figure, save_figure

    config, results, spectra, _ = _load(out)
    fig, axes = figure(1, 2, panel_size=(4.4, 3.2))
    left, right = axes[0]
    colours = {}
    for k, ((task, n), data) in enumerate(spectra.groupby(["task", "n"], sort=False)):
        rows = results[(results["task"] == task) & (results["n"] == n)]
        colour = colours.setdefault(task, f"C{k}")
        passed = int(rows["passed"].astype(bool).sum())
        for seed, curve in data.groupby("seed"):
            ok = bool(rows.loc[rows["seed"] == seed, "passed"].iloc[0])
            left.plot(curve["index"], curve["mean"], color=colour, linestyle="-" if ok else "--", linewidth=1,
                      label=f"{_label(task, n)}: {passed}/{len(rows)} seeds pass the gate" if seed == 0 else None)
        x = np.full(len(rows), k, dtype=float) + np.linspace(-0.08, 0.08, len(rows))
        right.scatter(x, rows["decay_slope"], color=colour, marker="o", zorder=3)
        right.errorbar([k + 0.25], [rows["decay_slope"].mean()], yerr=[[0.0], [0.0]], fmt="_", color=colour,
                       markersize=14)
    left.axvspan(DECAY_INDICES[0], DECAY_INDICES[1], color="grey", alpha=0.08, label="indices of the decay fit")
    left.axhline(resolution_floor(config["model"]["embedding_dim"]), color="black", linestyle=":", linewidth=0.8,
                 label="float32 resolution (below: rounding)")
    left.set_yscale("log")
    left.set_xlabel("index j")
    left.set_ylabel("sigma_j / sigma_1 (mean over a test batch)")
    left.set_title("Layer-2 attention output (dashed: below the gate)", fontsize="medium")
    left.legend(loc="upper right", fontsize="small")
    labels = [_label(t, n) for t, n in spectra.groupby(["task", "n"], sort=False).groups]
    right.set_xticks(range(len(labels)), labels)
    right.set_xlim(-0.5, len(labels) - 0.5)
    right.set_ylabel(f"slope of ln sigma_i, i = {DECAY_INDICES[0]}..{DECAY_INDICES[1]}")
    right.set_title("Decay slope per seed (dash: mean)", fontsize="medium")
    return save_figure(fig, pathlib.Path(out) / "lra_svd")


def _setting_lines(config) -> list[str]:
    tasks = "; ".join(f"{_LABELS.get(t['task'], t['task'])} n = {t['n']} ({t['positions']} positions"
                      + "".join(f", {_OPTION_TEXT[k].format(v)}" for k, v in t.get("options", {}).items()) + ")"
                      for t in config["tasks"])
    return [
        "## The CPU proxy (declared before the run)", "",
        f"- Tasks: {tasks}. Skyformer's LRA settings: ListOps n = 2000, Pathfinder-32 n = 1024, learned 1-D "
        "positions, trained up to 50k steps on a GPU; here shorter sequences and, for Pathfinder, a learned "
        "row + column embedding (2-D positions) so the model can see which pixels neighbour each other. "
        "Easier instances than LRA's, so that the 2-layer model learns within the budget: ListOps trees no "
        "deeper than stated (LRA: 10), and Pathfinder dots drawn at their own intensity (LRA's dots are discs, "
        "larger than the dashes; here a 1-pixel plus, which only its intensity tells from a path) on shorter "
        "paths (by default 5-10 pixels on this canvas).",
        f"- Model: the paper's 2-layer softmax encoder (embedding {config['model']['embedding_dim']}, "
        f"feed-forward {config['model']['hidden_dim']}, {config['model']['num_heads']} heads), dropout "
        f"{config['dropout']:g} (no attention dropout).",
        f"- Budget: {config['steps']} steps of batch {config['batch_size']} per seed, fixed, no early stop, "
        f"the last weights kept; {config['optimizer']} with a one-cycle schedule ({config['warmup']} warm-up "
        f"steps, peak lr {config['lr']:g}; the paper: 1e-4 / 2e-4 over 50k steps), gradient values clipped at "
        f"{config['clip_value']:g}. Training pool: {config['train_batches']} generated batches per task, "
        "shared by the seeds and cycled in a per-seed order (generation costs about as much as a step); no "
        "self-pretraining.",
        f"- Seeds: {config['seeds']} per task (initial weights, batch order, dropout, test batch). Validation: "
        f"{config['validation_size']} held-out examples per task, accuracy of the final weights.",
        "- Gates (fixed in code before the run): " + ", ".join(f"{_LABELS[t]} >= {g:.2f}" for t, g in
                                                               config["gates"].items()) + ".",
        f"- Decay statistic (fixed before the run): least-squares slope of ln sigma_i on i over i = "
        f"{config['decay_indices'][0]}..{config['decay_indices'][1]} (sigma_1 excluded), per test example "
        f"(a batch of {config['test_size']}), averaged over the batch; compared between tasks over the seeds "
        f"that pass their gate (Welch t, 95%), only when at least {config['min_seeds']} seeds of each task pass.",
        "",
    ]


def summarize(out) -> pathlib.Path:
    """``summary.md``: the declared proxy, accuracy against the gates per seed, the decay comparison."""
    config, results, spectra, training = _load(out)
    lines = ["# Singular values of the trained model's attention output (Skyformer Appendix B, Figure 4)", "",
             *_setting_lines(config),
             "| task | seed | steps | val. acc. (n) | majority class | gate | passed | test-batch acc. "
             "| decay slope (mean ± std over the batch) | values |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.itertuples(index=False):
        lines.append(f"| {_label(r.task, r.n)} | {r.seed} | {r.steps} | {r.validation_accuracy:.3f} "
                     f"({r.validation_size}) | {r.majority_rate:.3f} | {r.gate:.2f} | {'yes' if r.passed else 'no'} "
                     f"| {r.test_batch_accuracy:.3f} | {r.decay_slope:.4f} ± {r.decay_slope_std:.4f} "
                     f"| {r.num_singular_values} |")
    verdict = ordering(results, min_seeds=config["min_seeds"])
    lines += ["", "## Against Appendix B (\"Pathfinder decays slower than ListOps\")", "", _ordering_text(verdict),
              "", *_resolution_lines(spectra, config["model"]["embedding_dim"]),
              "Figure 4's curves are not given as numbers in the paper (and its models were trained to LRA "
              "accuracy on a GPU), so only the pre-declared slope comparison is made.", "",
              f"Compute: {results['seconds'].sum():.0f} s of cell time; {len(training)} evaluations. "
              f"Command: `{_run_record(out).get('command', 'approxlab lra-svd')}`."]
    return atomic_write_text(pathlib.Path(out) / "summary.md", "\n".join(lines) + "\n")


def resolution_floor(columns: int) -> float:
    r"""The smallest :math:`\sigma_j/\sigma_1` a float32 forward pass resolves: the model's
    attention output :math:`M` (``columns`` wide) carries rounding :math:`E` with
    :math:`\|E\|_2 \le \|E\|_F \approx \epsilon_{32}\|M\|_F \le \epsilon_{32}\sqrt{\text{columns}}\,\sigma_1`,
    and by Weyl's inequality :math:`|\sigma_j(M + E) - \sigma_j(M)| \le \|E\|_2`: below
    :math:`\epsilon_{32}\sqrt{\text{columns}}` the measured values are rounding, not the model's."""
    return float(np.finfo(np.float32).eps) * math.sqrt(columns)


def _resolution_lines(spectra: pd.DataFrame, columns: int) -> list[str]:
    """Per task and seed: where the mean spectrum falls below :func:`resolution_floor`."""
    floor = resolution_floor(columns)
    first, last = DECAY_INDICES
    parts = []
    for (task, n, seed), curve in spectra.groupby(["task", "n", "seed"], sort=False):
        window = curve[(curve["index"] >= first) & (curve["index"] <= last)]
        below = curve.loc[curve["mean"] < floor, "index"]
        parts.append(f"{_label(task, n)} seed {seed}: from j = {int(below.min())}, "
                     f"{(window['mean'] < floor).mean():.0%} of the fit" if len(below) else
                     f"{_label(task, n)} seed {seed}: never")
    return [f"**Resolution.** The models run in float32, so sigma_j / sigma_1 below {floor:.1e} "
            f"(float32's epsilon x sqrt({columns}), Weyl's bound on its rounding) is rounding rather than the "
            "model's spectrum. The mean spectrum falls below it: " + "; ".join(parts) + ". Where most of a task's "
            "fit lies below it, its slope measures the rounding floor's flatness, and the comparison above says "
            "nothing about the models; a forward pass in float64 resolves it.", ""]


def _ordering_text(verdict: dict) -> str:
    seeds = f"{verdict['seeds_pathfinder']} Pathfinder and {verdict['seeds_listops']} ListOps seeds pass their gates"
    if verdict["verdict"] == "not compared (gate)":
        return (f"Not compared: {seeds}, fewer than required. These models did not learn their tasks to the "
                "gate, so this run says nothing about the ordering of the tasks.")
    power = ""
    if math.isfinite(verdict.get("power", float("nan"))):
        power = (f" Power of these seeds to see a difference of this size at the observed spread: "
                 f"{verdict['power']:.2f}; 80% power needs {int(verdict['seeds_for_80'])} seeds per task (a t-test "
                 "on seed-paired differences, sd = sqrt(s_P^2 + s_L^2)).")
    return (f"{seeds}. Pathfinder's slope minus ListOps': {verdict['difference']:+.4f} per index, 95% interval "
            f"[{verdict['low']:+.4f}, {verdict['high']:+.4f}] (Welch t over seeds); verdict: **{verdict['verdict']}**"
            + (" (Appendix B's ordering)." if verdict["verdict"] == "Pathfinder slower" else
               " (Appendix B has Pathfinder slower).") + power)


def add_arguments(parser) -> None:
    """Options of ``approxlab lra-svd`` (besides the common ones)."""
    group = parser.add_argument_group("lra-svd grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--tasks", type=_cli.str_list, default=None,
                       help="comma-separated NAME:N[:learned|2d], e.g. listops:256,pathfinder:256:2d")
    group.add_argument("--steps", type=_cli.positive_int, default=None, help="fixed step budget per seed (default 2000)")
    group.add_argument("--seeds", type=_cli.positive_int, default=None, help="seeds per task (default 3)")


def run(args) -> int:
    """``approxlab lra-svd``: train and measure (resumable) unless ``--plot-only``, then plot and summarise."""
    if getattr(args, "scheduler", None) is not None:
        raise StudyError("lra-svd trains in local processes; use --workers N instead of --scheduler.")
    if getattr(args, "device", "cpu") != "cpu":
        raise StudyError(f"lra-svd runs on the CPU only; got --device {args.device}.")
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, tasks=args.tasks, steps=args.steps, seeds=args.seeds)
        run_info = {"command": getattr(args, "command", "approxlab lra-svd"), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "workers": getattr(args, "workers", None)}
        start = time.perf_counter()
        compute(config, out, workers=getattr(args, "workers", None), progress=args.progress, restart=args.restart,
                run_info=run_info)
        print(f"lra-svd: computed in {time.perf_counter() - start:.1f} s -> {out}")
    for path in [*plot(out), summarize(out)]:
        print(f"lra-svd: wrote {path}")
    return 0
