r"""Skyformer Table 3: instability scores of attention approximations during training.

Regenerates Table 3 of Skyformer (Chen et al., NeurIPS 2021, Appendix F). A 2-layer encoder
(:class:`approxlab.training.TinyEncoder`: embedding 64, feed-forward 128, 2 heads) is
trained for a few Adam steps (lr ``1e-4``) with each attention in turn; every model starts
from the same weights (one draw from a seeded generator; attentions have no parameters of
their own) and sees the same batches. At step ``i`` the instability score is

.. math::

    \tau_i = \|f(x_i, W_i) - f(x_i, W_{i-1})\|_F^2 \,/\, \|W_i - W_{i-1}\|_F^2

with :math:`f` the embedding after the two layers; a table entry is the mean over the
steps of :math:`\tau_i(\text{method}) / \tau_i(\text{softmax})`, then mean ± std over
seeds. Below 1: the method moves its output less than softmax attention for the same
parameter change (Skyformer's "more stable").

Three steps (STYLE.md convention 9), all behind ``approxlab instability``:

1. **grid** -- :func:`build_config` (saved and hashed in ``config.json``);
2. **compute** -- :func:`compute` runs one runner cell per (task, n, seed, attention)
   through :func:`~approxlab.studies.runner.run_cells` (resumable, optional Dask) and
   writes the tidy table ``results.csv`` (one row per step);
3. **table** -- :func:`write_table` reads only ``results.csv`` and ``config.json`` and
   writes ``ratios.csv`` (one ratio per task x n x seed x attention), ``table.md``
   (laid out like Table 3: rows = attentions, columns = tasks) and ``instability.png/.pdf``
   (per-step ratios). ``--plot-only`` redraws them.

Grid (full run)
---------------
tasks: ListOps (generated, LRA settings, :mod:`approxlab.tasks.listops`) at ``n = 1000``,
and WikiText-2 masked LM (:mod:`approxlab.tasks.mlm`) at ``n = 512`` and ``n = 1024``;
attentions: softmax (reference), kernelized, skyformer, nystromformer, spectral-shifting,
yoso (YOSO-E, see :data:`approxlab.training.ATTENTIONS`); ``num_features = 128``
(Skyformer Section 5); 5 seeds; 20 steps; batch size 4 (ListOps) and 2 (MLM). LRA's ListOps
pads to 2000 tokens with batch 32 and Skyformer trains on a V100: the lengths and batch
sizes here are scaled down so that the whole table fits in about 30 minutes on 2 CPU cores
(``--tasks listops:2000:32`` restores LRA's shape at a much larger cost).

``--quick``: ListOps at ``n = 256`` (batch 4), 2 seeds, 5 steps, all attentions; written
to ``figures/instability-quick/``.

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

from . import default_output_dir
from .._io import atomic_write_text, read_json, read_results, write_csv_atomic
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
    "ratio_table",
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


def ratio_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``"0.77 ± 0.05"`` (mean ± std over seeds)."""
    columns = list(dict.fromkeys(_task_label(t, n) for t, n in per_seed[["task", "n"]].itertuples(index=False)))
    attentions = [a for a in ATTENTION_ORDER if a in set(per_seed["attention"])]
    attentions += [a for a in dict.fromkeys(per_seed["attention"]) if a not in attentions]
    table = pd.DataFrame(index=attentions, columns=columns, dtype=object)
    for (task, n, attention), group in per_seed.groupby(["task", "n", "attention"], sort=False):
        ok = group[group["status"] == "ok"]
        label = _task_label(task, n)
        if len(ok) < len(group):
            reasons = sorted(set(group.loc[group["status"] != "ok", "status"]))
            if not len(ok):
                table.loc[attention, label] = f"failed ({reasons[0][:60]})"
                continue
        values = ok["ratio"].to_numpy(dtype=float)
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        cell = f"{values.mean():.2f} ± {std:.2f}"
        if len(ok) < len(group):
            cell += f" ({len(group) - len(ok)} of {len(group)} seeds failed)"
        table.loc[attention, label] = cell
    return table.fillna("-")


def _markdown(table: pd.DataFrame) -> str:
    header = "| attention | " + " | ".join(table.columns) + " |"
    rule = "|---|" + "---|" * len(table.columns)
    body = [f"| {index} | " + " | ".join(str(v) for v in row) + " |" for index, row in table.iterrows()]
    return "\n".join([header, rule, *body])


def _verdict(per_seed: pd.DataFrame, attention: str, test) -> str:
    ok = per_seed[(per_seed["attention"] == attention) & (per_seed["status"] == "ok")]
    if not len(ok):
        return f"{attention}: no result (not run or failed)"
    means = ok.groupby(["task", "n"], sort=False)["ratio"].mean()
    parts = [f"{_task_label(t, n)} {m:.2f}" for (t, n), m in means.items()]
    holds = [bool(test(m)) for m in means]
    word = "yes" if all(holds) else ("no" if not any(holds) else "partly")
    return f"{attention}: {word} ({', '.join(parts)})"


def summarize(config: dict, per_seed: pd.DataFrame, results: pd.DataFrame) -> str:
    """The markdown of ``table.md``: the table, the paper's Table 3, and the verdicts."""
    table = ratio_table(per_seed)
    paper = pd.DataFrame(PAPER_TABLE3).T
    seconds = results.groupby(list(KEY_COLUMNS))["seconds"].first()
    lines = [
        "# Instability-score ratios (Skyformer Appendix F, Table 3)",
        "",
        f"Mean over {config['steps']} Adam steps (lr {config['lr']:g}) of tau_i(method) / tau_i(softmax), "
        f"mean ± std over {config['seeds']} seeds. tau_i = ||f(x_i, W_i) - f(x_i, W_(i-1))||_F^2 / "
        "||W_i - W_(i-1)||_F^2 with f the embedding after the two encoder layers. Below 1: more stable "
        "than softmax attention.",
        "",
        _markdown(table),
        "",
        f"Model: 2-layer pre-LN encoder, embedding {config['model']['embedding_dim']}, feed-forward "
        f"{config['model']['hidden_dim']}, {config['model']['num_heads']} heads, {config['dtype']}; "
        f"num_features = {config['num_features']}; tasks (name, n, batch): "
        + ", ".join(f"{t['task']} {t['n']} x{t['batch_size']}" for t in config["tasks"])
        + ". `yoso` trains with YOSO-E (the differentiable expectation of YOSO's hashing).",
        "",
        "## Skyformer's Table 3 (LRA, for comparison)",
        "",
        _markdown(paper),
        "",
        "## Does the paper's claim hold here?",
        "",
        "- kernelized below 1? " + _verdict(per_seed, "kernelized", lambda m: m < 1),
        "- skyformer below 1? " + _verdict(per_seed, "skyformer", lambda m: m < 1),
        "- nystromformer near 1 (within 0.9-1.1)? " + _verdict(per_seed, "nystromformer", lambda m: 0.9 <= m <= 1.1),
        "",
        f"Compute: {len(seconds)} cells, {seconds.sum():.0f} s in total "
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
    axes[0][-1].legend(loc="best")
    return save_figure(fig, out / "instability")


def write_table(out) -> list[pathlib.Path]:
    """Read ``results.csv`` + ``config.json``; write ``ratios.csv``, ``table.md`` and the figure."""
    out = pathlib.Path(out)
    if not (out / RESULTS).is_file():
        raise StudyError(f"no {RESULTS} in {str(out)!r}: run the compute step first (without --plot-only).")
    config = read_json(out / "config.json")["config"]
    results = read_results(out / RESULTS)
    per_seed = ratios(results)
    written = [write_csv_atomic(per_seed, out / RATIOS)]
    written.append(atomic_write_text(out / "table.md", summarize(config, per_seed, results)))
    ok = results[results["status"] == "ok"]
    reference = ok[ok["attention"] == "softmax"][["task", "n", "seed", "step", "tau"]]
    per_step = ok.merge(reference, on=["task", "n", "seed", "step"], suffixes=("", "_softmax"))
    per_step = per_step.assign(ratio=per_step["tau"] / per_step["tau_softmax"])
    if len(per_step):
        written += _plot(per_step, out)
    return written


# ------------------------------------------------------------------------------- CLI


def _str_list(text: str) -> list[str]:
    return [x for x in text.replace(",", " ").split() if x]


def add_arguments(parser) -> None:
    """Options of ``approxlab instability`` (besides the common ones)."""
    group = parser.add_argument_group("instability grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--tasks", type=_str_list, default=None,
                       help="comma-separated NAME:N:BATCH entries, e.g. listops:1000:4,wikitext-mlm:512:2")
    group.add_argument("--attentions", type=_str_list, default=None,
                       help="comma-separated attentions (softmax is always included)")
    group.add_argument("--seeds", type=int, default=None, help="number of seeds")
    group.add_argument("--steps", type=int, default=None, help="Adam steps per run (paper: 20)")
    group.add_argument("--num-features", type=int, default=128, help="landmarks/features (paper: 128)")
    group.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (paper: 1e-4)")
    group.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="model precision")


def run(args) -> int:
    """``approxlab instability``: compute (resumable) unless ``--plot-only``, then write the table."""
    out = args.out if args.out is not None else default_output_dir("instability-quick" if args.quick else "instability")
    if not args.plot_only:
        config = build_config(quick=args.quick, tasks=args.tasks, attentions=args.attentions, seeds=args.seeds,
                              steps=args.steps, num_features=args.num_features, lr=args.lr, dtype=args.dtype)
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
