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
   * ``block-lanczos``: the fast path of this module, :func:`normal_block_lanczos` (below);
   * ``scipy``: :func:`scipy.linalg.interpolative.estimate_spectral_norm_diff` (randomized
     power method, ``its=20``) on the same two operators wrapped as SciPy ``LinearOperator``.

   Recorded: wall and CPU time, time ratio to ``dense``, relative disagreement with
   ``dense``, products with the exact operator, peak RSS.
2. ``scale`` part, n in {8192, 16384, 32768}: ``block-lanczos`` alone (dense is infeasible):
   time, passes, matvecs, certified lower bound, residual bound, peak RSS.
3. ``forward`` part, n in {1024, ..., 32768}: forward time and memory of each approximation
   (``approximate(...).output``) against exact attention through the fused kernel
   (``exact-sdpa``: ``ExactAttentionOperator(q, k).matmat(v)``, the kernel of
   ``approxlab.exact_attention``), torch's own ``scaled_dot_product_attention``
   (``torch-sdpa``) and the row-blocked reference (``exact-blocked``, up to ``--dense-max-n``):
   the "linear cost" claim, measured.
4. ``ratios`` part: the performance targets' ratios, printed in
   ``summary.md`` with their targets: ``ExactAttentionOperator`` matmat and rmatmat against one
   SDPA forward at n = 16384 in float32 and float64; the matrix-free spectral error (block
   Lanczos through the SDPA operator, block = p) at n = 32768 against one SDPA forward of the
   same head; the n = 4096 Figure-1 cell (:func:`approxlab.studies.figure1.compute` on the
   initialized condition, one window, d in {64, 256}, one seed, all eight methods) against
   float64 exact attention of its 12 heads.
5. ``training`` part, n = 1024, batch 8 (``--quick``: n = 256, batch 4): one training step
   (forward, backward, Adam) of :class:`approxlab.training.TinyEncoder` with each attention it
   trains, against the same model with torch's ``scaled_dot_product_attention`` (the models timed
   in turn, one torch thread by default); :mod:`approxlab.studies._bench_training`. Target: every
   ratio within 3.

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
the CSV.

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

import math
import os
import pathlib
import sys

import torch

from . import _cli
from .._io import atomic_write_text, read_results
from ._bench_training import training_lines, training_rows
from ._timing import Measurement, measure, measure_interleaved
from .runner import StudyError, cell_seed, run_cells
from ..linalg.normal_lanczos import default_row_block, normal_block_lanczos

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


def load_head(config: dict, n: int, *, data_dir=None, cache_dir=None, device="cpu"):
    """``q, k, v: (1, n, p)``: one head of one contiguous window of ``n`` tokens.

    ``source="bert"``: :func:`approxlab.data.get_qkv` (``config["condition"]``, ``"embedding"``
    mode, so any ``n`` works: the corpus's first ``n`` tokens for window 0); head
    ``config["head"]``. ``source="synthetic"``: :func:`approxlab.synthetic.synthetic_qkv` with
    ``p = 32`` and unit-scale entries (tests).
    """
    if config["source"] == "synthetic":
        from ..synthetic import synthetic_qkv

        generator = torch.Generator().manual_seed(cell_seed("qkv", n, base_seed=config["seed"]))
        q, k, v = synthetic_qkv((1,), n, 32, generator=generator, dtype=torch.float32)
        return q.to(device), k.to(device), v.to(device)
    from ..data import get_qkv

    qkv = get_qkv(config["condition"], n, [config["window"]], mode=config["mode"], layer=config["layer"],
                  seed=config["model_seed"], data_dir=data_dir, cache_dir=cache_dir, device=device)
    head = config["head"]
    return tuple(x[0, head : head + 1].contiguous() for x in (qkv.q, qkv.k, qkv.v))


def _approximation(config, method, q, k, v, n):
    from ..attention import approximate

    generator = torch.Generator().manual_seed(cell_seed(method, n, base_seed=config["seed"]))
    return approximate(method, q, k, v, num_features=min(config["num_features"], n), generator=generator)


def _dense_error(q, k, approx_op):
    from ..kernels import softmax_matrix

    exact = softmax_matrix(q.to(torch.float64), k.to(torch.float64))
    difference = approx_op.to(torch.float64).to_dense() - exact
    del exact
    return float(torch.linalg.matrix_norm(difference, ord=2).max())


def _golub_kahan_error(q, k, approx_op, tol, max_iter, generator):
    """What :func:`approxlab.metrics.spectral_error` does on operators, keeping the diagnostics."""
    from ..linalg.lanczos import golub_kahan
    from ..operators import ExactAttentionOperator

    exact = ExactAttentionOperator(q, k, "softmax", block_size=default_row_block(q.shape[-2]))
    difference = approx_op.to(torch.float64) - exact.to(torch.float64)
    return golub_kahan(difference, tol=tol, max_iter=max_iter, generator=generator)


def _scipy_error(q, k, approx_op, its, seed):
    """:func:`scipy.linalg.interpolative.estimate_spectral_norm_diff` on the two operators."""
    import numpy as np
    import scipy.linalg.interpolative as interpolative
    from scipy.sparse.linalg import LinearOperator as ScipyOperator

    from ..operators import ExactAttentionOperator

    n = q.shape[-2]
    exact = ExactAttentionOperator(q, k, "softmax", block_size=default_row_block(n))

    def wrap(op):
        def apply(f):
            def call(x):
                x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).reshape(1, n, -1)
                return f(x.to(op.dtype).to(op.device)).to("cpu", torch.float64).reshape(n, -1).numpy().squeeze(-1)
            return call

        return ScipyOperator((n, n), matvec=apply(op.matmat), rmatvec=apply(op.rmatmat), dtype=np.float64)

    counter = {"matvecs": 0}

    def counted(op):
        inner = wrap(op)

        def matvec(x):
            counter["matvecs"] += 1
            return inner.matvec(x)

        def rmatvec(x):
            counter["matvecs"] += 1
            return inner.rmatvec(x)

        return ScipyOperator((n, n), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)

    value = interpolative.estimate_spectral_norm_diff(wrap(approx_op), counted(exact), its=its,
                                                      rng=np.random.default_rng(seed))
    return float(value), counter["matvecs"]


def _row(algorithm, measurement, **values) -> dict:
    return {"algorithm": algorithm, **values, **measurement.as_row()}


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
        return _tidy(_forward_rows(config, method, q, k, v, n, common, cell["device"]))
    if part == "ratios":
        return _tidy(ratio_rows(cell, q, k, v, common))

    approx = _approximation(config, method, q, k, v, n)
    approx_op = approx.operator()
    rows = []
    fast, m = measure(normal_block_lanczos, q, k, approx_op, block=config["lanczos_block"], tol=config["tol"],
                      max_iter=config["max_iter"], generator=torch.Generator().manual_seed(seed),
                      compute_dtype=compute_dtype)
    fast_row = _row("block-lanczos", m, estimate=float(fast.estimate.max()), lower_bound=float(fast.lower_bound.max()),
                    distance_bound=float(fast.distance_bound.max()),
                    probabilistic_upper_bound=float(fast.probabilistic_upper_bound.max()),
                    passes=fast.num_passes, matvecs=fast.num_matvecs, converged=bool(fast.converged.all()),
                    compute_dtype=config["compute_dtype"], **common)
    rows.append(fast_row)
    if part == "accuracy":
        dense, m = measure(_dense_error, q, k, approx_op)
        dense_row = _row("dense", m, estimate=dense, lower_bound=dense, distance_bound=0.0, passes=0, matvecs=0,
                         converged=True, compute_dtype="float64", **common)
        gk, m = measure(_golub_kahan_error, q, k, approx_op, config["tol"], config["max_iter"],
                        torch.Generator().manual_seed(seed))
        gk_row = _row("golub-kahan", m, estimate=float(gk.estimate.max()), lower_bound=float(gk.lower_bound.max()),
                      distance_bound=float(gk.distance_bound.max()), passes=gk.num_matvecs, matvecs=gk.num_matvecs,
                      converged=bool(gk.converged.all()), compute_dtype="float64", **common)
        (scipy_value, scipy_matvecs), m = measure(_scipy_error, q, k, approx_op, config["scipy_its"], seed)
        scipy_row = _row("scipy", m, estimate=scipy_value, passes=scipy_matvecs, matvecs=scipy_matvecs,
                         compute_dtype=str(q.dtype).replace("torch.", ""), **common)
        rows = [dense_row, gk_row, fast_row, scipy_row]
        for row in rows:
            row["relative_disagreement"] = abs(row["estimate"] - dense) / dense
            row["time_ratio_vs_dense"] = dense_row["wall_s"] / row["wall_s"]
            row["cpu_ratio_vs_dense"] = dense_row["cpu_s"] / row["cpu_s"]
    return _tidy(rows)


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


def _timed(config, device):
    """Keyword arguments of :func:`measure` for a forward-type timing: warm-up, then the median."""
    return {"repeats": max(5, int(config["repeats"])), "warmup": 1, "device": device}


def _forward_rows(config, method, q, k, v, n, common, device):
    from ..operators import ExactAttentionOperator

    rows = []
    timed = _timed(config, device)
    if method == "exact":
        sdpa = ExactAttentionOperator(q, k, "softmax")  # approxlab.exact_attention's kernel
        out, m = measure(sdpa.matmat, v, **timed)
        rows.append(_row("exact-sdpa", m, compute_dtype=common["dtype"], **common))
        _, m = measure(torch.nn.functional.scaled_dot_product_attention, q[None], k[None], v[None], **timed)
        rows.append(_row("torch-sdpa", m, compute_dtype=common["dtype"], **common))
        if n <= config["dense_max_n"]:
            block = default_row_block(n)
            blocked = ExactAttentionOperator(q, k, "softmax", block_size=block, algorithm="blocked")
            reference, m = measure(blocked.matmat, v, **timed)
            rows.append(_row("exact-blocked", m, row_block=block, compute_dtype=common["dtype"],
                             max_abs_difference=float((reference - out).abs().max()), **common))
        return rows
    try:
        approx, m = measure(_approximation, config, method, q, k, v, n, **timed)
    except (ImportError, ValueError, FloatingPointError, RuntimeError, MemoryError) as error:
        # Recorded, not hidden: the row says the method failed at this n and why (stderr).
        print(f"approxlab bench: {method} failed at n={n}: {type(error).__name__}: {error}", file=sys.stderr)
        return [{"algorithm": "approximation-failed", "compute_dtype": common["dtype"], "failed": 1.0, **common}]
    rows.append(_row("approximation", m, compute_dtype=common["dtype"], **common))
    return rows


# ----------------------------------------------------------------------------------------
# The target ratios
# ----------------------------------------------------------------------------------------

RATIOS = {"operator-products": "ratio_n", "spectral-error": "spectral_ratio_n", "figure1-cell": "figure1_ratio_n"}
"""The ratio cells of the ``ratios`` part and the config key of their n."""


def _sdpa_forward(q, k, v):
    """One head through :func:`torch.nn.functional.scaled_dot_product_attention`, ``(1, n, p)``."""
    return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]


def _operator_ratio_rows(config, q, k, v, common, device):
    """ExactAttentionOperator matmat and rmatmat against one SDPA forward, float32 and float64.

    The three are timed in turn (:func:`measure_interleaved`). The adjoint's row
    log-sum-exps are computed once per operator (in the warm-up call) and cached, as in any
    sequence of products with one operator."""
    from ..operators import ExactAttentionOperator

    rows, timed = [], _timed(config, device)
    for dtype in (torch.float32, torch.float64):
        q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
        name = str(dtype).replace("torch.", "")
        op = ExactAttentionOperator(q_, k_)
        base, *products = measure_interleaved(
            [lambda: _sdpa_forward(q_, k_, v_), lambda: op.matmat(v_), lambda: op.rmatmat(v_)],  # noqa: B023
            repeats=timed["repeats"], warmup=timed["warmup"], device=device)
        rows.append(_row("torch-sdpa", base, compute_dtype=name, **common))
        for algorithm, m in zip(("operator-matmat", "operator-rmatmat"), products):
            rows.append(_row(algorithm, m, compute_dtype=name, ratio_vs_sdpa=m.wall_s / base.wall_s, **common))
    return rows


def _spectral_ratio_rows(config, q, k, v, n, common, device, seed):
    """Matrix-free ||S~ - S||_2 (block Lanczos through the SDPA operator) against one SDPA forward."""
    from ..operators import ExactAttentionOperator

    _, base = measure(_sdpa_forward, q, k, v, **_timed(config, device))
    approx_op = _approximation(config, config["error_method"], q, k, v, n).operator()
    result, m = measure(normal_block_lanczos, q, k, approx_op, block=int(q.shape[-1]), tol=config["tol"],
                        max_iter=config["max_iter"], generator=torch.Generator().manual_seed(seed),
                        exact_operator=ExactAttentionOperator(q, k), device=device)
    return [_row("torch-sdpa", base, compute_dtype=common["dtype"], **common),
            _row("spectral-error-sdpa-lanczos", m, compute_dtype=common["dtype"], estimate=float(result.estimate.max()),
                 distance_bound=float(result.distance_bound.max()), passes=result.num_passes,
                 ratio_vs_sdpa=m.wall_s / base.wall_s, **common)]


def _figure1_ratio_rows(cell, n, common):
    """The Figure-1 cell (initialized, one window, d in {64, 256}, one seed, all methods, float64,
    the cell whose cost is targeted): its compute as ``approxlab figure1`` runs it (window diagnostics,
    exact references, every method, panel statistics), against float64 SDPA exact attention of
    the same window's heads. Three more rows split it: ``figure1-cell-methods``, the methods' own
    ``seconds`` in ``results.csv`` (approximation and its error); ``figure1-cell-window-rank``,
    the window diagnostics' ``seconds`` in ``windows.csv`` (the dense SVD for the rank of A,
    added to the cell after its target was set); and ``figure1-cell-without-window-rank``,
    the compute less that, i.e. the cell the target was set for."""
    import tempfile

    from ..attention import exact_attention
    from . import figure1

    config, device = cell["config"], cell["device"]
    grid = figure1.build_config(conditions=["initialized"], n=[n], num_features=[64, 256], windows=1, seeds=1,
                                dtypes=["float64"])
    window = figure1.window_ids(grid, n)[0]
    q, k, v, _ = figure1.load_qkv("initialized", n, window, mode=grid["mode"], layer=grid["layer"],
                                  model_seed=grid["model_seed"], data_dir=cell["data_dir"],
                                  cache_dir=cell["cache_dir"], device=device)
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    _, base = measure(exact_attention, q, k, v, **_timed(config, device))
    figure1.reference.cache_clear()
    with tempfile.TemporaryDirectory() as out:
        _, m = measure(figure1.compute, grid, out, data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                       device=device, progress=False)
        methods_s = float(read_results(pathlib.Path(out) / figure1.RESULTS)["seconds"].sum())
        rank_s = float(read_results(pathlib.Path(out) / figure1.WINDOWS)["seconds"].sum())
    heads = {**common, "p": int(q.shape[-1]), "heads": int(q.shape[0]), "dtype": "float64"}
    parts = {"figure1-cell-methods": methods_s, "figure1-cell-window-rank": rank_s,
             "figure1-cell-without-window-rank": m.wall_s - rank_s}
    return [_row("exact-attention-sdpa-all-heads", base, compute_dtype="float64", **heads),
            _row("figure1-cell-compute", m, compute_dtype="float64", ratio_vs_sdpa=m.wall_s / base.wall_s, **heads),
            *({"algorithm": name, "compute_dtype": "float64", "wall_s": seconds,
               "ratio_vs_sdpa": seconds / base.wall_s, **heads} for name, seconds in parts.items())]


def ratio_rows(cell: dict, q, k, v, common: dict) -> list[dict]:
    """Rows of one ``ratios`` cell (see :data:`RATIOS`); each carries ``ratio_vs_sdpa``."""
    config, n, device = cell["config"], cell["n"], cell["device"]
    if cell["method"] == "operator-products":
        return _operator_ratio_rows(config, q, k, v, common, device)
    if cell["method"] == "spectral-error":
        return _spectral_ratio_rows(config, q, k, v, n, common, device, cell_seed("ratios", n, base_seed=config["seed"]))
    return _figure1_ratio_rows(cell, n, common)


# ----------------------------------------------------------------------------------------
# Plot and summary (read only the saved table)
# ----------------------------------------------------------------------------------------


def _wide(results):
    """``results.csv`` pivoted to one row per (part, n, method, algorithm)."""
    index = ["part", "n", "method", "algorithm", "compute_dtype"]
    wide = results.pivot_table(index=index, columns="quantity", values="value", aggfunc="first")
    return wide.reset_index()


def _n_ticks(ax, ns) -> None:
    """Log-2 n axis with a labelled tick at every measured n (1k = 1024)."""
    ns = sorted({int(n) for n in ns})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ns])
    ax.minorticks_off()


def plot(results, path_without_suffix):
    """Four panels from the saved table: spectral-error time, disagreement, memory, forward time."""
    from ..plotting import figure, method_style, save_figure

    wide = _wide(results)
    fig, axes = figure(2, 2, panel_size=(3.6, 2.8))
    styles = {
        "dense": {"color": "#000000", "marker": "s", "label": "dense SVD (float64)"},
        "golub-kahan": {"color": "#0072B2", "marker": "^", "label": "Golub-Kahan (metrics.spectral_error)"},
        "block-lanczos": {"color": "#D55E00", "marker": "o", "label": "fused block Lanczos"},
        "scipy": {"color": "#009E73", "marker": "D", "label": "SciPy estimate_spectral_norm_diff"},
        "spectral-error-sdpa-lanczos": {"color": "#CC79A7", "marker": "*", "label": "block Lanczos via SDPA operator"},
    }
    errors = wide[wide["part"].isin(["accuracy", "scale", "ratios"]) & wide["algorithm"].isin(list(styles))]
    ax = axes[0, 0]
    for algorithm, style in styles.items():
        sub = errors[errors["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            ax.plot(sub["n"], sub["wall_s"], **style)
    ax.set(yscale="log", xlabel="n", ylabel="wall time (s)",
           title=r"time to compute $\|\tilde D^{-1}\tilde A - D^{-1}A\|_2$ (one head)")
    _n_ticks(ax, errors["n"])
    ax.legend(frameon=False, loc="upper left", fontsize=5)
    ax = axes[0, 1]
    accuracy = wide[(wide["part"] == "accuracy") & (wide["algorithm"] != "dense")]
    for algorithm, style in styles.items():
        sub = accuracy[accuracy["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            ax.plot(sub["n"], sub["relative_disagreement"].clip(lower=1e-17), **style)
    ax.set(xlabel="n", ylabel="|estimate - dense| / dense", title="agreement with the dense reference")
    if len(accuracy):
        ax.axhline(1e-4, color="#999999", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        _n_ticks(ax, accuracy["n"])
    else:
        ax.text(0.5, 0.5, "accuracy part not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    ax = axes[1, 0]
    gpu = "gpu_peak_mb" in errors and errors["gpu_peak_mb"].notna().any()
    for algorithm, style in styles.items():
        sub = errors[errors["algorithm"] == algorithm].sort_values("n")
        if len(sub):
            added = sub["gpu_peak_mb"] if gpu else (sub["peak_rss_mb"] - sub["rss_before_mb"]).clip(lower=0)
            ax.plot(sub["n"], added / 1024, **{**style, "markerfacecolor": "none"})  # hollow: series near 0 overlap
    ax.set(xlabel="n", ylabel="peak GPU memory (GiB)" if gpu else "RSS added during the call (GiB)",
           title="memory of the spectral error")
    ax.set_ylim(bottom=-0.04 * ax.get_ylim()[1])  # room for whole markers at 0
    ax.axhline(0.0, color="#999999", linewidth=0.6, zorder=0)
    _n_ticks(ax, errors["n"])
    ax = axes[1, 1]
    forward = wide[wide["part"] == "forward"]
    exact_styles = {"exact-sdpa": ("s", "-"), "torch-sdpa": ("x", ":"), "exact-blocked": (".", "--")}
    for (method, algorithm), sub in forward.groupby(["method", "algorithm"]):
        sub = sub.sort_values("n")
        if algorithm == "approximation":
            style = method_style(method, secondary=True)
        elif algorithm in exact_styles:
            marker, line = exact_styles[algorithm]
            style = {"color": "#000000", "marker": marker, "linestyle": line, "label": algorithm}
        else:
            continue
        ax.plot(sub["n"], sub["wall_s"], **style)
    ax.set(yscale="log", xlabel="n", ylabel="forward wall time (s, median)",
           title="approximations vs exact attention")
    _n_ticks(ax, forward["n"] if len(forward) else errors["n"])
    ax.legend(frameon=False, fontsize=5, ncol=2)
    return save_figure(fig, path_without_suffix)


def _markdown_table(frame, columns, formats) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        cells = []
        for column in columns:
            value = row.get(column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("—")
            else:
                cells.append(formats.get(column, "{}").format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


TARGETS = {"operator-matmat": 1.3, "operator-rmatmat": 1.3, "spectral-error-sdpa-lanczos": 12.0,
           "figure1-cell-compute": 10.0}
"""The performance targets: upper bounds on ``ratio_vs_sdpa``."""


CELL_PARTS = {
    "figure1-cell-methods": "its methods' own seconds (approximations and their errors, as results.csv reports "
                            "them) / the same",
    "figure1-cell-window-rank": "its window diagnostics (the dense SVD for the rank of A; windows.csv "
                                "seconds) / the same",
    "figure1-cell-without-window-rank": "its compute less the window diagnostics (the cell the target was set for) "
                                        "/ the same",
}
"""Rows that split the Figure-1 cell's compute (no target of their own)."""


def _ratio_lines(wide) -> list[str]:
    """The "Target ratios" section: each measured ratio, its target and whether it is met."""
    rows = wide[(wide["part"] == "ratios") & wide["algorithm"].isin([*TARGETS, *CELL_PARTS])]
    if rows.empty:
        return []
    what = {"operator-matmat": "ExactAttentionOperator.matmat / SDPA forward (one head)",
            "operator-rmatmat": "ExactAttentionOperator.rmatmat / SDPA forward (one head)",
            "spectral-error-sdpa-lanczos": "matrix-free spectral error / one SDPA forward (same head)",
            "figure1-cell-compute": "Figure-1 cell compute (initialized, float64, d in {64, 256}, 1 window, 1 seed, "
                                    "8 methods, d_stat, rank of A) / float64 SDPA exact attention of its heads",
            **CELL_PARTS}
    lines = ["## Target ratios", "", "| ratio | n | dtype | seconds | baseline seconds | ratio | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    base = wide[wide["part"] == "ratios"]
    for _, row in rows.sort_values(["algorithm", "compute_dtype"]).iterrows():
        ratio, target = float(row["ratio_vs_sdpa"]), TARGETS.get(row["algorithm"])
        verdict = ("—", "—") if target is None else (f"<= {target:g}", "yes" if ratio <= target else "no")
        lines.append(f"| {what[row['algorithm']]} | {int(row['n'])} | {row['compute_dtype']} | {row['wall_s']:.3f} | "
                     f"{row['wall_s'] / ratio:.3f} | {ratio:.2f} | {verdict[0]} | {verdict[1]} |")
    load = base["load_average"].agg(["min", "max"])
    return lines + ["", f"1-minute load average during these measurements: {load['min']:.1f} to {load['max']:.1f}.", ""]


def write_summary(results, config_record: dict, path) -> pathlib.Path:
    """``summary.md``: the command, the machine, and the three tables, from the saved files."""
    wide = _wide(results)
    config = config_record.get("config", {})
    run_info = config_record.get("run", {})
    fmt = {"n": "{:.0f}", "estimate": "{:.10g}", "relative_disagreement": "{:.2e}", "wall_s": "{:.3f}",
           "cpu_s": "{:.3f}", "time_ratio_vs_dense": "{:.1f}", "cpu_ratio_vs_dense": "{:.1f}",
           "passes": "{:.0f}", "matvecs": "{:.0f}", "peak_rss_mb": "{:.0f}", "rss_before_mb": "{:.0f}",
           "distance_bound": "{:.1e}", "load_average": "{:.1f}", "p": "{:.0f}", "row_block": "{:.0f}"}
    lines = [
        "# approxlab bench",
        "",
        f"Command: `{run_info.get('command', 'approxlab bench')}`",
        "",
        f"Machine: {run_info.get('machine', 'unknown')}. Q/K/V: {config.get('source')} "
        f"({config.get('condition')}, {config.get('mode')} mode, layer {config.get('layer')}, head "
        f"{config.get('head')}, window {config.get('window')}); error of `{config.get('error_method')}` with "
        f"num_features={config.get('num_features')}; tol={config.get('tol')}, Lanczos block "
        f"{config.get('lanczos_block')}, compute dtype {config.get('compute_dtype')}.",
        "",
        "Times are wall seconds (and process CPU seconds) measured in one process. Forward-type timings "
        "(the forward, ratios and training parts) are the median of `repeats` calls after one warm-up call "
        "(`wall_min_s`/`wall_max_s` in results.csv); the spectral-error routes and the Figure-1 cell run "
        "once. On a GPU every timed call is bracketed by `torch.cuda.synchronize()` and the memory is "
        "`torch.cuda.max_memory_allocated`; on CPU, the process RSS sampled every 2 ms. The machine may be "
        "shared: the 1-minute load average is recorded per measurement.",
        "",
    ]
    lines += _ratio_lines(wide)
    lines += training_lines(wide)
    accuracy = wide[wide["part"] == "accuracy"].sort_values(["n", "algorithm"])
    if len(accuracy):
        lines += ["## Spectral error vs dense and SciPy", "",
                  _markdown_table(accuracy, ["n", "p", "algorithm", "estimate", "relative_disagreement", "wall_s",
                                             "cpu_s", "time_ratio_vs_dense", "cpu_ratio_vs_dense", "passes",
                                             "matvecs", "distance_bound", "peak_rss_mb", "rss_before_mb",
                                             "load_average"], fmt), ""]
    scale = wide[wide["part"] == "scale"].sort_values("n")
    if len(scale):
        lines += ["## Matrix-free path at scale", "",
                  _markdown_table(scale, ["n", "p", "algorithm", "estimate", "distance_bound", "wall_s", "cpu_s",
                                          "passes", "matvecs", "peak_rss_mb", "rss_before_mb", "load_average"],
                                  fmt), ""]
    forward = wide[wide["part"] == "forward"].sort_values(["n", "method", "algorithm"])
    if len(forward):
        lines += ["## Forward time and memory", "",
                  _markdown_table(forward, ["n", "method", "algorithm", "wall_s", "cpu_s", "peak_rss_mb",
                                            "rss_before_mb", "load_average"], fmt), ""]
    return atomic_write_text(path, "\n".join(lines) + "\n")


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
                       help="torch threads of the training part's steps (default 1, as the studies train)")
    group.add_argument("--repeats", type=int, default=None,
                       help="timed calls per forward-type measurement (median; at least 5), after one warm-up")


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
    from .._io import read_json

    out = pathlib.Path(args.out)
    results_path = out / "results.csv"
    if getattr(args, "scheduler", None) is not None or getattr(args, "workers", None) is not None:
        raise StudyError("bench runs in one process so that its time ratios are fair; drop --workers/--scheduler.")
    if not args.plot_only:
        overrides = {key: getattr(args, option, None) for key, option in _GRID_OPTIONS.items()}
        config = build_config(quick=args.quick, **overrides)
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
