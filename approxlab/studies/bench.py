r"""``approxlab bench``: time and memory of matrix-free spectral errors and of the approximations.

Spectral errors at scale, measured. One command, run in **one process**
(so that time ratios compare like with like), that measures for one attention head of BERT
on Wikitext-2 (Q/K/V from :func:`approxlab.data.get_qkv`, ``"embedding"`` mode, layer 0,
head 0, one contiguous window of ``n`` tokens):

1. ``accuracy`` part, n in {1024, 2048, 4096}: the spectral error
   :math:`\|\tilde D^{-1}\tilde A - D^{-1}A\|_2` of one approximation (default
   ``nystromformer`` with 64 landmarks), computed four ways:

   * ``dense``: both matrices formed in float64, ``torch.linalg.matrix_norm(., ord=2)``
     of the difference (full SVD; the reference);
   * ``golub-kahan``: the library path :func:`approxlab.metrics.spectral_error`, i.e.
     :func:`approxlab.linalg.golub_kahan` on ``approx.to(float64) - ExactAttentionOperator(q, k).to(float64)``
     (two products with the exact operator per step, float64);
   * ``block-lanczos``: the fast path, :func:`approxlab.linalg.normal_lanczos.normal_block_lanczos` (below);
   * ``scipy``: :func:`scipy.linalg.interpolative.estimate_spectral_norm_diff` (randomized
     power method, ``its=20``) on the same two operators wrapped as SciPy ``LinearOperator``.

   Recorded: wall and CPU time, time ratio to ``dense``, relative disagreement with
   ``dense``, products with the exact operator, peak RSS.
2. ``scale`` part, n in {8192, 16384, 32768}: ``block-lanczos`` alone (dense is infeasible):
   time, passes, matvecs, certified lower bound, residual bound, peak RSS. Both parts:
   :mod:`approxlab.studies._bench_spectral`.
3. ``forward`` part, n in {1024, ..., 32768}: forward time and memory of each approximation
   (``approximate(...).output``) against exact attention through the fused kernel
   (``exact-sdpa``: ``ExactAttentionOperator(q, k).matmat(v)``, the kernel of
   ``approxlab.exact_attention``), torch's own ``scaled_dot_product_attention``
   (``torch-sdpa``) and the row-blocked reference (``exact-blocked``, up to ``--dense-max-n``):
   the "linear cost" claim, measured; :mod:`approxlab.studies._bench_forward`.
4. ``ratios`` part: the performance targets' ratios, printed in
   ``summary.md`` with their targets: ``ExactAttentionOperator`` matmat and rmatmat against one
   SDPA forward at n = 16384 in float32 and float64; the matrix-free spectral error (block
   Lanczos through the SDPA operator, block = p) at n = 32768 against one SDPA forward of the
   same head; the n = 4096 Figure-1 cell (:func:`approxlab.studies.figure1.compute` on the
   initialized condition, one window, d in {64, 256}, one seed, all eight methods) against
   float64 exact attention of its 12 heads; :mod:`approxlab.studies._bench_ratios`.
5. ``training`` part, n = 1024, batch 8 (``--quick``: n = 256, batch 4): one training step
   (forward, backward, Adam) of :class:`approxlab.training.TinyEncoder` with each attention it
   trains, against the same model with torch's ``scaled_dot_product_attention`` (the models timed
   in turn, on ``--training-threads`` torch threads, else ``--threads`` when given, else one);
   :mod:`approxlab.studies._bench_training`. Target: every ratio within 3.

The fused blocked path (``block-lanczos``)
-------------------------------------------
An exact-operator product costs :math:`O(n^2 p)` (logits and their ``exp``), the
approximation's :math:`O(nd)`, so the cost of a spectral error is the number of times the
logits are computed. :func:`normal_block_lanczos` lowers it in three ways, each measured
(see ``benchmarks/README.md``):

* **one pass per step**: with :math:`M = \tilde S - S` (:math:`S = D^{-1}A`), the normal
  product :math:`M^\top M X = \tilde S^\top R - S^\top R`, :math:`R = \tilde S X - S X`, needs
  each row block :math:`S_I` once: :math:`R_I = (\tilde S X)_I - S_I X` is known as soon as
  :math:`S_I` is, and :math:`S_I^\top R_I` is accumulated in the same pass
  (:func:`fused_normal_pass`). Golub--Kahan needs :math:`S` twice per step (``matmat``, then
  ``rmatmat`` on a vector that depends on the whole ``matmat``);
* **a block of vectors per pass** (block Lanczos, Rayleigh--Ritz on the block Krylov space of
  :math:`M^\top M`), which amortises the logits over ``block`` vectors and converges in
  fewer passes for clustered top singular values (Musco and Musco, 2015);
* **float32 logits and softmax in row blocks of at most ~16 MB** (reused buffers: larger
  blocks are served by ``mmap`` and page-faulted afresh on every allocation), with the
  Krylov basis, the products' accumulation across blocks and the Rayleigh--Ritz step in
  float64. The ``accuracy`` part checks the result against the dense float64 reference.

It returns the same certificates as :func:`approxlab.linalg.golub_kahan`: the estimate is a
Ritz value, hence a certified lower bound on :math:`\|M\|_2` (up to rounding of the
products), and the residual certifies that some singular value lies within
``distance_bound`` of it. Like any Krylov method it cannot certify an upper bound; it adds
the probabilistic bound of Kuczyński and Woźniakowski (1992) for a random start.

Peak memory
-----------
On CPU, ``peak_rss_mb`` is the peak resident set size of the whole process during the timed
calls, sampled every 2 ms by a background thread (``psutil``); ``rss_before_mb`` is the RSS
just before them, so ``peak_rss_mb - rss_before_mb`` is what the measurement added (torch's
CPU allocations are invisible to ``tracemalloc``). ``ru_maxrss_mb`` is the process high-water
mark from ``getrusage``. On a GPU, ``gpu_peak_mb`` is ``torch.cuda.max_memory_allocated``
after ``torch.cuda.reset_peak_memory_stats``.

Timing
------
:func:`measure`: forward-type timings make one untimed warm-up call and report the median
``wall_s`` (``time.perf_counter``) and ``cpu_s`` (``time.process_time``) of ``repeats >= 5``
calls (``wall_min_s``, ``wall_max_s`` beside them); on a GPU each timed call is bracketed by
``torch.cuda.synchronize()``, so kernels are timed, not their launches. The operator-product
ratios time SDPA, ``matmat`` and ``rmatmat`` in turn (:func:`measure_interleaved`), so a drift
of the machine's speed reaches all three alike; the training part times its models in turn too. The spectral-error routes and the Figure-1 cell
run once. The 1-minute load average is recorded per measurement.

Outputs (``--out``, default ``approxlab-results/bench``; ``--quick``: ``approxlab-results/bench-quick``)
-----------------------------------------------------------------------------------------------------
``results.csv`` (tidy: one row per part x n x method x algorithm), ``config.json``,
``bench.png``/``bench.pdf`` and ``summary.md``; ``--plot-only`` redraws the last two from
the CSV (:mod:`approxlab.studies._bench_report`).

References
----------
G. Golub and W. Kahan (1965), "Calculating the singular values and pseudo-inverse of a matrix".
G. Golub and R. Underwood (1977), "The block Lanczos method for computing eigenvalues".
C. Musco and C. Musco (2015), "Randomized block Krylov methods for stronger and faster
approximate singular value decomposition", NeurIPS.
J. Kuczyński and H. Woźniakowski (1992), "Estimating the largest eigenvalue by the power and
Lanczos algorithms with a random start", SIAM J. Matrix Anal. Appl. 13(4), Theorem 4.2.
B. N. Parlett, *The Symmetric Eigenvalue Problem* (1998), Theorem 4.5.1 (residual bound).
Chen et al. (2021), Skyformer, Figure 1 (the spectral-norm error this benchmark computes at scale).
"""

from __future__ import annotations

description = 'Time and memory benchmark of the approximations.'  # transitional

import os
import pathlib

import torch

from . import _cli
from ._compat_io import read_results
from ._bench_cells import load_head
from ._bench_forward import forward_rows
from ._bench_ratios import CELL_PARTS, RATIOS, TARGETS, ratio_rows  # noqa: F401 (re-exported)
from ._bench_report import plot, write_summary
from ._bench_spectral import spectral_rows
from ._bench_training import training_rows
from ._timing import Measurement, measure, measure_interleaved
from .runner import StudyError, cell_seed, run_cells

__all__ = [
    "FULL_GRID",
    "QUICK_GRID",
    "add_arguments",
    "run",
    "build_config",
    "build_cells",
    "compute",
    "plot",
    "write_summary",
    "Measurement",
    "measure",
    "measure_interleaved",
    "ratio_rows",
]

FULL_GRID = {
    "accuracy_n": [1024, 2048, 4096],
    "scale_n": [8192, 16384, 32768],
    "forward_n": [1024, 2048, 4096, 8192, 16384, 32768],
    "error_method": "nystromformer",
    "num_features": 64,
    "forward_methods": [
        "skyformer",
        "skyformer-softmax",
        "nystromformer",
        "nystrom",
        "spectral-shifting",
        "performer",
        "informer",
        "linformer",
        "yoso",
    ],
    "dense_max_n": 8192,
    "source": "bert",
    "condition": "pretrained",
    "layer": 0,
    "head": 0,
    "window": 0,
    "mode": "embedding",
    "model_seed": 0,
    "tol": 1e-6,
    "max_iter": 300,
    "lanczos_block": 4,
    "compute_dtype": "float32",
    "scipy_its": 20,
    "parts": ["accuracy", "scale", "forward", "ratios", "training"],
    "seed": 0,
    "repeats": 5,
    "ratio_n": 16384,
    "spectral_ratio_n": 32768,
    "figure1_ratio_n": 4096,
    "training_n": 1024,
    "training_batch": 8,
    "training_features": 128,
    "training_threads": 1,
    "training_attentions": ["softmax", "kernelized", "skyformer", "nystromformer", "spectral-shifting", "yoso"],
}
"""The full benchmark (``python3 -m approxlab bench``; see ``benchmarks/README.md``)."""

QUICK_GRID = {
    **FULL_GRID,
    "accuracy_n": [256, 512],
    "scale_n": [1024],
    "forward_n": [256, 512, 1024],
    "dense_max_n": 1024,
    "num_features": 32,
    "repeats": 5,
    "ratio_n": 1024,
    "spectral_ratio_n": 2048,
    "figure1_ratio_n": 256,
    "training_n": 256,
    "training_batch": 4,
    "training_features": 32,
}
"""``--quick``: the same measurements at small n (seconds)."""

KEY_COLUMNS = ("part", "n", "method")
PARTS = ("accuracy", "scale", "forward", "ratios", "training")
_GRID_OPTIONS = {
    "accuracy_n": "accuracy_n",
    "scale_n": "scale_n",
    "forward_n": "forward_n",
    "error_method": "error_method",
    "num_features": "num_features",
    "forward_methods": "forward_methods",
    "dense_max_n": "dense_max_n",
    "source": "source",
    "condition": "condition",
    "head": "head",
    "tol": "tol",
    "lanczos_block": "lanczos_block",
    "compute_dtype": "compute_dtype",
    "parts": "parts",
    "repeats": "repeats",
    "training_n": "training_n",
    "training_batch": "training_batch",
    "training_features": "training_features",
    "training_threads": "training_threads",
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ----------------------------------------------------------------------------------------
# Grid and cells
# ----------------------------------------------------------------------------------------


def build_config(*, quick: bool = False, **overrides) -> dict:
    """The benchmark grid: :data:`FULL_GRID` (or :data:`QUICK_GRID`) with ``overrides`` (None: keep)."""
    config = dict(QUICK_GRID if quick else FULL_GRID)
    for key, value in overrides.items():
        if key not in config:
            raise StudyError(f"unknown bench setting {key!r}; known: {sorted(config)}.")
        if value is not None:
            config[key] = list(value) if isinstance(value, (list, tuple)) else value
    for part in config["parts"]:
        if part not in PARTS:
            raise StudyError(f"--parts must be among {list(PARTS)}; got {part!r}.")
    if config["source"] not in ("bert", "synthetic"):
        raise StudyError(f"--source must be 'bert' or 'synthetic'; got {config['source']!r}.")
    if config["compute_dtype"] not in _DTYPES:
        raise StudyError(f"--compute-dtype must be one of {sorted(_DTYPES)}; got {config['compute_dtype']!r}.")
    for key in ("accuracy_n", "scale_n", "forward_n"):
        bad = [n for n in config[key] if int(n) < 2]
        if bad:
            raise StudyError(f"--{key.replace('_', '-')} values must be integers >= 2; got {bad}.")
    for key, low in (("training_n", 2), ("training_batch", 1), ("training_features", 1), ("training_threads", 1)):
        if int(config[key]) < low:
            raise StudyError(f"--{key.replace('_', '-')} must be an integer >= {low}; got {config[key]}.")
    return config


def build_cells(config: dict, *, data_dir=None, cache_dir=None, device="cpu") -> list[dict]:
    """One cell per (part, n, method), in the order they run (small n first)."""
    common = {"config": config, "data_dir": None if data_dir is None else str(data_dir),
              "cache_dir": None if cache_dir is None else str(cache_dir), "device": device}
    cells = []
    if "accuracy" in config["parts"]:
        cells += [{"part": "accuracy", "n": int(n), "method": config["error_method"], **common}
                  for n in config["accuracy_n"]]
    if "scale" in config["parts"]:
        cells += [{"part": "scale", "n": int(n), "method": config["error_method"], **common}
                  for n in config["scale_n"]]
    if "forward" in config["parts"]:
        for n in config["forward_n"]:
            for method in ["exact", *config["forward_methods"]]:
                cells.append({"part": "forward", "n": int(n), "method": method, **common})
    if "ratios" in config["parts"]:
        cells += [{"part": "ratios", "n": int(config[key]), "method": name, **common}
                  for name, key in RATIOS.items()
                  if not (name == "figure1-cell" and config["source"] == "synthetic")]
    if "training" in config["parts"]:
        cells.append({"part": "training", "n": int(config["training_n"]), "method": "training-step", **common})
    return cells


def compute(cell: dict) -> list[dict]:
    """Rows of one (part, n, method) cell (see the module docstring)."""
    config = cell["config"]
    n, method, part = cell["n"], cell["method"], cell["part"]
    if part == "training":
        return _tidy(training_rows(cell))
    q, k, v = load_head(config, n, data_dir=cell["data_dir"], cache_dir=cell["cache_dir"], device=cell["device"])
    p = int(q.shape[-1])
    compute_dtype = _DTYPES[config["compute_dtype"]]
    seed = cell_seed(part, n, method, base_seed=config["seed"])
    common = {"p": p, "num_features": min(config["num_features"], n), "dtype": str(q.dtype).replace("torch.", "")}
    if part == "forward":
        return _tidy(forward_rows(config, method, q, k, v, n, common, cell["device"]))
    if part == "ratios":
        return _tidy(ratio_rows(cell, q, k, v, common))
    return _tidy(spectral_rows(config, part, method, q, k, v, n, common, seed, compute_dtype))


def _tidy(rows: list[dict]) -> list[dict]:
    """Wide measurement dicts -> tidy rows ``(algorithm, compute_dtype, quantity, value)``.

    Every row of ``results.csv`` then holds a number, and no row carries a NaN for a quantity
    that does not apply to its algorithm.
    """
    tidy = []
    for row in rows:
        row = dict(row)
        algorithm = row.pop("algorithm")
        compute_dtype = row.pop("compute_dtype", row.get("dtype"))
        row.pop("dtype", None)
        for quantity, value in row.items():
            tidy.append({"algorithm": algorithm, "compute_dtype": compute_dtype, "quantity": quantity,
                         "value": float(value)})
    return tidy


# ----------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    """The bench's own options (the common ones come from :mod:`approxlab.cli`)."""
    from ..methods import available

    group = parser.add_argument_group("bench options (default: the full grid, see FULL_GRID)")
    group.add_argument("--parts", nargs="+", choices=PARTS, default=None, help="which parts to run")
    group.add_argument("--accuracy-n", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None,
                       help="n of the accuracy part")
    group.add_argument("--scale-n", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None,
                       help="n of the scale part")
    group.add_argument("--forward-n", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None,
                       help="n of the forward part")
    group.add_argument("--error-method", choices=available(), default=None,
                       help="approximation whose spectral error is computed")
    group.add_argument("--num-features", type=_cli.positive_int, default=None, help="num_features of every approximation")
    group.add_argument("--forward-methods", nargs="+", choices=[m for m in available() if m != "exact"],
                       default=None, help="methods of the forward part (exact is always run)")
    group.add_argument("--dense-max-n", type=_cli.positive_int, default=None, help="largest n for dense exact attention")
    group.add_argument("--source", choices=("bert", "synthetic"), default=None, help="Q/K/V source")
    group.add_argument("--condition", choices=("initialized", "pretrained"), default=None, help="BERT condition")
    group.add_argument("--head", type=_cli.nonnegative_int, default=None, help="attention head")
    group.add_argument("--tol", type=_cli.positive_float, default=None,
                       help="relative tolerance of the matrix-free routes")
    group.add_argument("--lanczos-block", type=_cli.positive_int, default=None, help="vectors per block Lanczos pass")
    group.add_argument("--compute-dtype", choices=sorted(_DTYPES), default=None,
                       help="dtype of the logits in the fused passes")
    group.add_argument("--training-n", type=_cli.positive_int, default=None,
                       help="sequence length of the training part")
    group.add_argument("--training-batch", type=_cli.positive_int, default=None,
                       help="sequences per batch of the training part")
    group.add_argument("--training-features", type=_cli.positive_int, default=None,
                       help="num_features of the attentions in the training part")
    group.add_argument("--training-threads", type=_cli.positive_int, default=None,
                       help="torch threads of the training part's steps (default: --threads when given, else 1, "
                            "as the studies train, whatever $OMP_NUM_THREADS says)")
    group.add_argument("--repeats", type=int, default=None,
                       help="timed calls per forward-type measurement (median; at least 5), after one warm-up")


def _grid_overrides(args) -> dict:
    """The grid settings the command line gives (None: the grid's default).

    ``training_threads`` is ``--training-threads``, else the common ``--threads`` when it was given
    (``args.threads_source == "--threads"``); a thread count from ``$OMP_NUM_THREADS`` or the
    default leaves the training part at its own default, one thread.
    """
    overrides = {key: getattr(args, option, None) for key, option in _GRID_OPTIONS.items()}
    if overrides["training_threads"] is None and getattr(args, "threads_source", None) == "--threads":
        overrides["training_threads"] = args.threads
    return overrides


def _check_grid(args, config) -> None:
    """Lengths, head and num_features of ``config`` fit the data and the methods (before computing)."""
    if config["source"] == "bert":
        for option in ("--accuracy-n", "--scale-n", "--forward-n"):
            ns = config[option[2:].replace("-", "_")]
            _cli.check_windows(args, {int(n): [config["window"]] for n in ns}, n_option=option)
        _cli.check_heads("--head", config["head"], [config["condition"]], index=True)
    elif config["head"] != 0:
        raise _cli.UsageError("--head", "0 (the synthetic source has one head)", config["head"])
    _cli.check_num_features("--num-features", config["num_features"], [config["error_method"]],
                            [*config["accuracy_n"], *config["scale_n"]])
    _cli.check_num_features("--num-features", config["num_features"], config["forward_methods"], config["forward_n"])


def _machine() -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads, Python {platform.python_version()}")


def run(args) -> int:
    """Compute (resumable, in-process only) and/or redraw; returns the exit status."""
    from ._compat_io import read_json

    out = pathlib.Path(args.out)
    results_path = out / "results.csv"
    if getattr(args, "scheduler", None) is not None or getattr(args, "workers", None) is not None:
        raise StudyError("bench runs in one process so that its time ratios are fair; drop --workers/--scheduler.")
    if not args.plot_only:
        config = build_config(quick=args.quick, **_grid_overrides(args))
        _check_grid(args, config)
        cells = build_cells(config, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device)
        run_info = {"command": getattr(args, "command", "approxlab bench"), "machine": _machine(),
                    "device": args.device}
        results = run_cells(cells, compute, results_path=results_path, key_columns=KEY_COLUMNS, config=config,
                            run_info=run_info, progress=args.progress, flush_every_seconds=0.0,
                            restart=args.restart)
    else:
        try:
            results = read_results(results_path, required=KEY_COLUMNS)
        except FileNotFoundError as error:
            raise StudyError(str(error)) from None
    if results.empty:
        raise StudyError(f"{str(results_path)!r} holds no rows; nothing to plot.")
    record = read_json(out / "config.json")
    plot(results, out / "bench")
    summary = write_summary(results, record, out / "summary.md")
    print(summary.read_text(encoding="utf-8"))
    return 0
