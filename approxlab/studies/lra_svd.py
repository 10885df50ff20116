r"""Skyformer Appendix B, Figure 4: singular values of a trained transformer's attention output.

Regenerates Figure 4 of Skyformer (Chen et al., NeurIPS 2021, Appendix B): "the singular value
distribution of attention output from the second layer of a trained vanilla transformer ...
averaged across one random batch from the test set in each LRA task", and the decay rate per
task that Appendix B reads as task difficulty ("the singular values in Document Retrieval and
Pathfinder tasks decay slower ... those two tasks are more difficult than Text Classification
and ListOps"). The companion study on BERT/MiniLM attention matrices of WikiText-2 is
:mod:`approxlab.studies.sv_decay`.

Per generated LRA task (ListOps, :mod:`approxlab.tasks.listops`; Pathfinder-32,
:mod:`approxlab.tasks.pathfinder`) -- one runner cell each:

1. train the 2-layer softmax :class:`approxlab.training.TinyEncoder` of Skyformer Section 5
   (embedding 64, feed-forward 128, 2 heads) with Adam
   (:func:`approxlab.training.train_classifier`) until the validation accuracy has not
   improved for ``patience`` evaluations or the step budget is spent; keep the best weights;
2. on one test batch, take the second layer's attention output (heads concatenated, before
   the output projection; the real tokens' rows: an ``(n_i, 64)`` matrix per example), its
   singular values :math:`\sigma_j/\sigma_1` (float64), averaged over the batch, and each
   example's decay rate (least-squares slope of :math:`\ln\sigma_j` on :math:`j`,
   :func:`approxlab.metrics.singular_value_decay_rate`), averaged over the batch.

Tables: ``results.csv`` (per task: steps, why training stopped, best validation accuracy,
majority-class rate of the validation set, accuracy on the test batch, decay rate mean and
std over the batch, seconds), ``spectra.csv`` (per task and index: mean, min and max over the
batch of :math:`\sigma_j/\sigma_1`), ``training.csv`` (per evaluation: step, training loss,
validation accuracy); ``lra_svd.png/.pdf`` and ``summary.md`` are drawn from them
(``--plot-only`` redraws). Defaults are sized for a 2-core CPU (see :data:`FULL_GRID`):
Skyformer trains for thousands of steps on a GPU, so accuracies here are lower than LRA's.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021. Section 5, Appendix B (Figure 4).

Tay et al. *Long Range Arena*. ICLR 2021.
"""

from __future__ import annotations

import functools
import pathlib
import time

import numpy as np
import pandas as pd
import torch

from .._io import atomic_write_text, read_results
from .runner import StudyError, cell_seed, run_cells, saved_config

__all__ = ["FULL_GRID", "QUICK_GRID", "build_config", "attention_output_spectrum", "compute_cell", "compute",
           "plot", "summarize", "add_arguments", "run"]

FULL_GRID = {
    "tasks": [{"task": "listops", "n": 1000}, {"task": "pathfinder", "n": 1024}],
    "batch_size": 8,
    "max_steps": 200,
    "eval_every": 25,
    "patience": 3,
    "validation_size": 64,
    "test_size": 32,
    "lr": 1e-3,
}
"""Full grid: LRA's ListOps (here n = 1000) and Pathfinder-32 (n = 1024); at most 200 Adam
steps of batch 8, lr 1e-3; validation on 64 examples every 25 steps, patience 3."""

QUICK_GRID = {**FULL_GRID, "tasks": [{"task": "listops", "n": 256}, {"task": "pathfinder", "n": 256}],
              "max_steps": 20, "eval_every": 10, "validation_size": 16, "test_size": 8}
"""``--quick``: n = 256, 20 steps (a smoke run)."""

RESULTS, SPECTRA, TRAINING = "results.csv", "spectra.csv", "training.csv"
KEY_COLUMNS = ("task", "n")
_MODEL = {"embedding_dim": 64, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}
_LABELS = {"listops": "ListOps", "pathfinder": "Pathfinder"}


def build_config(*, quick: bool = False, tasks=None, max_steps=None, patience=None, base_seed: int = 0) -> dict:
    """The grid (saved and hashed in ``config.json``); ``tasks`` as ``"name:n"`` strings."""
    from ..tasks import available

    grid = dict(QUICK_GRID if quick else FULL_GRID)
    if tasks is not None:
        parsed = []
        for spec in tasks:
            name, _, n = str(spec).partition(":")
            if name not in available() or not n.isdigit() or int(n) < 1:
                raise StudyError(f"--tasks entries must be NAME:N with NAME in {available()}; got {spec!r}.")
            parsed.append({"task": name, "n": int(n)})
        grid["tasks"] = parsed
    for name, value in (("max_steps", max_steps), ("patience", patience)):
        if value is not None:
            if int(value) < 1:
                raise StudyError(f"--{name.replace('_', '-')} must be an integer >= 1; got {value}.")
            grid[name] = int(value)
    return {"study": "lra-svd", "paper": "Skyformer (Chen et al., NeurIPS 2021), Appendix B, Figure 4",
            **grid, "model": dict(_MODEL), "attention": "softmax", "layer": 2,
            "matrix": "attention output of layer 2 (heads concatenated, before the output projection), real tokens",
            "base_seed": int(base_seed)}


def attention_output_spectrum(model, batch, *, layer: int = 1):
    r"""Normalised singular values and decay rates of layer ``layer``'s attention output (0-based).

    Returns
    -------
    sigma : torch.Tensor
        ``(batch, r)`` float64, :math:`\sigma_j/\sigma_1` of each example's ``(n_i, e)`` matrix
        (its real tokens' rows), ``r = min(min_i n_i, e)``.
    decay : torch.Tensor
        ``(batch,)`` decay rates (:func:`approxlab.metrics.singular_value_decay_rate`).
    """
    from ..linalg.conditioning import singular_values
    from ..metrics import singular_value_decay_rate

    outputs = []
    with torch.no_grad():
        model.eval()
        model.predict(batch, attention_outputs=outputs)
    matrices = [outputs[layer][i][batch.mask[i]].to(torch.float64) for i in range(batch.mask.shape[0])]
    rank = min(min(m.shape) for m in matrices)
    sigma = torch.stack([singular_values(m)[:rank] for m in matrices])
    decay = torch.tensor([float(singular_value_decay_rate(m, num=rank)) for m in matrices], dtype=torch.float64)
    return sigma / sigma[:, :1], decay


def _data(cell):
    from ..tasks import make_task

    def batches(split, batch_size, count):
        g = torch.Generator().manual_seed(cell_seed(cell["task"], cell["n"], split, base_seed=cell["base_seed"]))
        return make_task(cell["task"], n=cell["n"], batch_size=batch_size, num_batches=count, generator=g)

    train = batches("train", cell["batch_size"], cell["max_steps"])
    validation = batches("validation", min(16, cell["validation_size"]), max(cell["validation_size"] // 16, 1))
    test = batches("test", cell["test_size"], 1)
    return train, validation.batches, test.batches[0]


@functools.lru_cache(maxsize=4)
def _cell_tables(frozen: tuple) -> dict:
    from ..training import TinyEncoder, accuracy, train_classifier

    cell = dict(frozen)
    start = time.perf_counter()
    train, validation, test = _data(cell)
    init = torch.Generator().manual_seed(cell_seed(cell["task"], cell["n"], "init", base_seed=cell["base_seed"]))
    model = TinyEncoder(vocab_size=train.vocab_size, n=cell["n"], attention="softmax", kind="classification",
                        num_classes=train.num_classes, generator=init, **_MODEL)
    trained = train_classifier(model, train.batches, validation, lr=cell["lr"], eval_every=cell["eval_every"],
                               patience=cell["patience"])
    sigma, decay = attention_output_spectrum(model, test, layer=1)
    labels = torch.cat([b.labels for b in validation])
    summary = {"steps": trained["steps"], "stopped": trained["stopped"], "best_step": trained["best_step"],
               "validation_accuracy": trained["best_accuracy"],
               "majority_rate": float(torch.bincount(labels).max()) / labels.numel(),
               "test_batch_accuracy": accuracy(model, [test]), "test_batch_size": int(test.labels.numel()),
               "decay_rate": float(decay.mean()), "decay_rate_std": float(decay.std()) if decay.numel() > 1 else 0.0,
               "num_singular_values": sigma.shape[-1], "seconds": time.perf_counter() - start}
    spectra = [{"index": j, "mean": float(sigma[:, j].mean()), "min": float(sigma[:, j].min()),
                "max": float(sigma[:, j].max())} for j in range(sigma.shape[-1])]
    return {"results": [summary], "spectra": spectra, "training": trained["history"]}


def compute_cell(cell: dict, table: str = "results") -> list[dict]:
    """Rows of ``table`` ("results", "spectra" or "training") for one task (computed once)."""
    return _cell_tables(tuple(sorted(cell.items())))[table]


def _spectra_rows(cell):
    return compute_cell(cell, "spectra")


def _training_rows(cell):
    return compute_cell(cell, "training")


def compute(config: dict, out, *, progress=True, restart=False, run_info=None):
    """Train and measure every task (in process); write the three tables and ``config.json``."""
    out = pathlib.Path(out)
    keys = ("batch_size", "max_steps", "eval_every", "patience", "validation_size", "test_size", "lr", "base_seed")
    cells = [{**entry, **{k: config[k] for k in keys}} for entry in config["tasks"]]
    common = dict(key_columns=KEY_COLUMNS, config=config, run_info=run_info, progress=progress, restart=restart)
    tables = [run_cells(cells, function, results_path=out / name, **common)
              for function, name in ((_spectra_rows, SPECTRA), (_training_rows, TRAINING), (compute_cell, RESULTS))]
    _cell_tables.cache_clear()
    return tables


def _load(out):
    out = pathlib.Path(out)
    for name in (RESULTS, SPECTRA, TRAINING):
        if not (out / name).is_file():
            raise StudyError(f"no {name} in {str(out)!r}: run the compute step first (without --plot-only).")
    return (saved_config(out / "config.json", RESULTS), read_results(out / RESULTS, required=KEY_COLUMNS),
            read_results(out / SPECTRA), read_results(out / TRAINING))


def _label(task, n):
    return f"{_LABELS.get(task, task)} (n={n})"


def plot(out) -> list:
    """``lra_svd.png/.pdf``: mean normalised singular values per task (min-max band over the batch)."""
    from ..plotting import figure, save_figure

    _, results, spectra, _ = _load(out)
    fig, axes = figure(1, 1, panel_size=(4.6, 3.2))
    ax = axes[0][0]
    for (task, n), data in spectra.groupby(["task", "n"], sort=False):
        row = results[(results["task"] == task) & (results["n"] == n)].iloc[0]
        label = (f"{_label(task, n)}: decay {row['decay_rate']:.3f}/index, "
                 f"val. acc. {row['validation_accuracy']:.2f}")
        line, = ax.plot(data["index"] + 1, data["mean"], label=label)
        ax.fill_between(data["index"] + 1, data["min"], data["max"], color=line.get_color(), alpha=0.15)
    ax.set_yscale("log")
    ax.set_xlabel("index j")
    ax.set_ylabel("sigma_j / sigma_1 (mean over a test batch)")
    ax.set_title("Layer-2 attention output, trained softmax model")
    ax.legend(loc="upper right", fontsize="small")
    return save_figure(fig, pathlib.Path(out) / "lra_svd")


def summarize(out) -> pathlib.Path:
    """``summary.md``: accuracy reached and decay rate per task, and the comparison with Appendix B."""
    config, results, spectra, training = _load(out)
    second = spectra[spectra["index"] == 1].set_index(["task", "n"])["mean"]
    lines = ["# Singular values of the trained model's attention output (Skyformer Appendix B, Figure 4)", "",
             f"2-layer softmax encoder (embedding 64, 2 heads), Adam lr {config['lr']:g}, batch "
             f"{config['batch_size']}, at most {config['max_steps']} steps; validation accuracy on "
             f"{config['validation_size']} examples every {config['eval_every']} steps, stop after "
             f"{config['patience']} evaluations without improvement; best weights kept. Spectrum: layer 2's "
             f"attention output on one test batch of {config['test_size']}.", "",
             "| task | steps | stopped | best val. acc. (step) | majority class | test-batch acc. | decay rate (mean ± std) | sigma_2/sigma_1 | values |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results.itertuples(index=False):
        lines.append(f"| {_label(r.task, r.n)} | {r.steps} | {r.stopped} | {r.validation_accuracy:.3f} ({r.best_step}) "
                     f"| {r.majority_rate:.3f} | {r.test_batch_accuracy:.3f} | {r.decay_rate:.4f} ± "
                     f"{r.decay_rate_std:.4f} | {second.get((r.task, r.n), float('nan')):.1e} | {r.num_singular_values} |")
    order = results.sort_values("decay_rate")["task"].map(_LABELS).tolist()
    lines += ["", "## Against Appendix B", "", f"Fastest decay first: {', '.join(order)}. " + _ordering_verdict(results),
              _caveat(results, second),
              "Figure 4's curves are not given as numbers in the paper (and its models were trained to LRA "
              "accuracy on a GPU), so only the ordering of the tasks is compared.", "",
              f"Compute: {results['seconds'].sum():.0f} s in total; {len(training)} evaluations."]
    return atomic_write_text(pathlib.Path(out) / "summary.md", "\n".join(lines) + "\n")


def _caveat(results: pd.DataFrame, second: pd.Series) -> str:
    """Say so when no model learned its task or every spectrum is numerically rank one."""
    parts = []
    if (results["validation_accuracy"] <= results["majority_rate"] + 1e-12).all():
        parts.append("No model got above its majority-class rate: these are models that have not learned "
                     "their task, unlike Figure 4's trained ones.")
    if len(second) and (second < 1e-3).all():
        parts.append(f"Every attention output is numerically rank one (sigma_2/sigma_1 <= {second.max():.0e}): "
                     "the attention rows are nearly uniform, so each output row is about the mean of V, and the "
                     "decay rate mostly measures that one gap -- the ordering of the tasks says little here.")
    return " ".join(parts)


def _ordering_verdict(results: pd.DataFrame) -> str:
    """Whether Pathfinder's spectrum decays slower than ListOps' (Appendix B's reading)."""
    rates = dict(zip(results["task"], results["decay_rate"]))
    if not {"listops", "pathfinder"} <= set(rates):
        return "Appendix B's ordering (Pathfinder slower than ListOps) needs both tasks; not compared."
    if rates["pathfinder"] > rates["listops"]:
        return "Matches Appendix B: Pathfinder decays slower than ListOps."
    return ("Does not match Appendix B, which has Pathfinder decaying slower than ListOps "
            f"(here {rates['pathfinder']:.4f} vs {rates['listops']:.4f} per index).")


def _str_list(text: str) -> list[str]:
    return [x for x in text.replace(",", " ").split() if x]


def add_arguments(parser) -> None:
    """Options of ``approxlab lra-svd`` (besides the common ones)."""
    group = parser.add_argument_group("lra-svd grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--tasks", type=_str_list, default=None, help="comma-separated NAME:N, e.g. listops:1000")
    group.add_argument("--max-steps", type=int, default=None, help="step budget per task (default 200)")
    group.add_argument("--patience", type=int, default=None,
                       help="evaluations without improvement before stopping (default 3)")


def run(args) -> int:
    """``approxlab lra-svd``: train and measure (resumable) unless ``--plot-only``, then plot and summarise."""
    if getattr(args, "workers", None) is not None or getattr(args, "scheduler", None) is not None:
        raise StudyError("lra-svd trains in one process; drop --workers/--scheduler.")
    if getattr(args, "device", "cpu") != "cpu":
        raise StudyError(f"lra-svd runs on the CPU only; got --device {args.device}.")
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, tasks=args.tasks, max_steps=args.max_steps, patience=args.patience)
        run_info = {"command": getattr(args, "command", "approxlab lra-svd"), "torch": torch.__version__,
                    "threads": torch.get_num_threads()}
        start = time.perf_counter()
        compute(config, out, progress=args.progress, restart=args.restart, run_info=run_info)
        print(f"lra-svd: computed in {time.perf_counter() - start:.1f} s -> {out}")
    for path in [*plot(out), summarize(out)]:
        print(f"lra-svd: wrote {path}")
    return 0
