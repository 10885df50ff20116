r"""Skyformer Figure 1: spectral-norm error of approximate attention outputs.

Regenerates Figure 1 of Skyformer (Chen et al., NeurIPS 2021, Section 4.5): for Q, K, V
obtained by embedding Wikitext-2 text into an *initialized* and a *pretrained* BERT-style
model, the spectral norm :math:`\|\tilde O - O\|_2` of the difference between an
approximate attention output :math:`\tilde O` and exact softmax attention
:math:`O = D^{-1}AV`, against the number of features ``d``, for several sequence lengths.

Three steps, all behind ``approxlab figure1``:

1. **grid** -- :func:`build_config` declares it; it is saved in ``config.json`` (hashed).
2. **compute** -- :func:`compute` runs the cells through
   :func:`approxlab.studies.runner.run_cells` (resumable, optional Dask) and writes the
   tidy tables ``results.csv``, ``conditioning.csv`` and ``windows.csv``.
3. **plot** -- :func:`~approxlab.studies.figure1_report.plot` and
   :func:`~approxlab.studies.figure1_report.write_summary` read only those files and write
   ``panel_stats.csv`` and ``verdicts.csv`` (:mod:`approxlab.studies.figure1_stats`, on
   :mod:`approxlab.stats`), ``figure1.png/.pdf`` (the paper's four methods),
   ``figure1-extra.png/.pdf`` (every other method of the run, built-in or registered with
   :func:`approxlab.methods.register` / ``--plugin``, with the same y-limits per panel) and
   ``summary.md`` (``--plot-only`` redraws them).

Grid (full run)
---------------
conditions {initialized, pretrained} x n {512, 1024, 2048, 4096} x num_features
{16, 32, 64, 128, 256} x methods (the paper's four: skyformer-softmax, nystromformer,
performer, informer; five extra: performer-lra, yoso, spectral-shifting, nystrom, linformer) x dtypes
{float64, float32} x 4 windows x 3 seeds. Deterministic methods (``MethodSpec.randomized`` False) run once, with seed 0.
Windows are drawn once, reproducibly (``window_seed``), from the first ``window_pool``
windows of each length (Wikitext-2 test has 66 disjoint windows of 4096 tokens, so every
id is valid for every n <= 4096), the same ids for every n <= 4096 and condition; longer n
draw from the windows that fit in the same 262,144 tokens (:func:`window_ids`). Q/K/V come
from :func:`approxlab.data.get_qkv` in ``"embedding"`` mode at layer 0: X is BERT's whole input
embedding, LayerNorm(word + position + type). Beyond BERT's 512 positions the table is extended
as ``--positions`` says: ``interpolate`` (default; the table resampled linearly to n rows, every
position distinct — Position Interpolation, Chen et al. 2023; ViT fine-tuning), ``copy``
(Longformer, Beltagy et al. 2020, §5: the table repeated every 512 positions) or ``none``
(no positions: rows of Q fixed by token identity, rank of A at most the number of distinct
tokens). ``--checkpoint`` picks the BERT-family model (see :func:`approxlab.data.load_model`).

``--quick``: n {512, 1024}, d {16, 64, 256}, 1 window, 1 seed, float64. Output: ``--out``,
by default ``approxlab-results/figure1`` in the current directory (``figure1-quick`` with
``--quick``, so a smoke run never resumes into the full run); the committed run in
``figures/figure1/`` is rewritten only with ``--out figures/figure1``.

Tables
------
``results.csv``: one row per condition x n x dtype x window x method x num_features x seed.
The error is computed per attention head (spectral norm of the ``(n, p_v)`` difference, in
float64); a row stores every head's error (``error_heads``, space-separated) and its mean,
std, min and max over the heads (``error_*``), the same for the relative error
:math:`\|\tilde O - O\|_2/\|O\|_2` (``relative_error_*``), the blow-up counts
(``error_blowups``: heads whose error exceeds ``BLOWUP_FACTOR`` = 10 times
:math:`\|O\|_2`; ``near_zero_rows``: rows of :math:`\tilde A\mathbf 1` with
:math:`|(\tilde A\mathbf 1)_i| \le` ``NEAR_ZERO_ROW`` = 1e-3 times the head's median
:math:`|(\tilde A\mathbf 1)_j|`, summed over heads, for methods that report their row sums,
``row_sums_reported``), the checkpoint, the wall time, the number of warnings the method
raised and a ``status`` ("ok", or the error that stopped the method, whose errors are then ``inf``).

``windows.csv``: one row per condition x n x window: distinct tokens, distinct rows of Q
(head 0), the numerical rank of A (head 0; singular values above ``n * eps64 * sigma_1``) and
the wall time of these diagnostics (``seconds``; the dense SVD is nearly all of it).

``panel_stats.csv``, ``verdicts.csv`` (median and mean) and ``paper_comparison.csv``: written by
the plot step from ``results.csv`` (:mod:`approxlab.studies.figure1_stats`,
:mod:`approxlab.studies.figure1_paper`).

``conditioning.csv``: one row per condition x n x num_features, on the first window:
the statistical dimension :math:`d_{stat}(\lambda) = \operatorname{tr}\bar C(\bar C+\lambda I)^{-1}`
of the PSD completion :math:`\bar C = \kappa([Q;K]/p^{1/4})` (Skyformer Eq. (4), Theorem 2)
with :math:`\lambda = 0.1\|\bar C\|_2` for the heads in ``panel_stats.heads`` (an
eigendecomposition of a ``2n x 2n`` matrix per head; the subset keeps n = 4096 affordable),
and the condition number of the sampled core reported by ``skyformer-softmax`` (seed 0,
all heads), when the method reports one.

Cells and caching
-----------------
A runner cell is (condition, n, window, method); it returns the rows of all its
num_features x seeds. Cells are ordered so that those sharing a window are adjacent,
and the window's Q/K/V, exact output and its norms are kept in a per-process LRU cache
(:func:`reference`), so an in-process run computes each once and a Dask worker at most
once per window it sees. Each approximation's generator is seeded with
:func:`~approxlab.studies.runner.cell_seed` of (condition, n, window, method, d, seed),
so results do not depend on run order or executor.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer: Remodel Self-Attention with Gaussian Kernel and Nystrom
Method*. NeurIPS 2021. Section 4.5 and Figure 1; Eqs. (3)-(5); Theorem 2.
"""

from __future__ import annotations

description = 'Skyformer Figure 1: spectral-norm error of approximate attention outputs (BERT Q/K/V, Wikitext-2).'  # transitional

import functools
import math
import pathlib
import time
import warnings

import numpy as np
import pandas as pd
import torch

from ..data.qkv import resolve_checkpoint
from ..attention import approximate, exact_attention
from ..kernels import kernelized_matrix
from ..leverage import completion_operator, estimate_ridge_quantities
from ..methods import get
from ..metrics import spectral_norm
from . import _cli
from ..operators import ExactAttentionOperator
from .figure1_report import CONDITIONING, RESULTS, WINDOWS, figure_groups, plot, summarize, write_summary
from .figure1_stats import (BLOWUP_FACTOR, BOOTSTRAP, CLAIMS, NEAR_ZERO_ROW, PAPER_METHODS, THRESHOLDS,
                            VERDICT_COLUMNS, head_errors, panel_statistics, precision_table, verdicts)
from .grid import override_grid
from .runner import StudyError, cell_seed, run_cells

__all__ = [
    "PAPER_METHODS", "EXTRA_METHODS", "FULL_GRID", "QUICK_GRID", "build_config", "window_ids", "make_cells",
    "load_qkv", "reference", "compute_cell", "compute_panel", "compute_window", "compute", "add_arguments", "run",
    # the plot step, from figure1_report / figure1_stats
    "plot", "figure_groups", "write_summary", "summarize", "panel_statistics", "head_errors", "precision_table",
    "verdicts", "CLAIMS", "THRESHOLDS", "BOOTSTRAP", "VERDICT_COLUMNS", "BLOWUP_FACTOR", "NEAR_ZERO_ROW",
]

EXTRA_METHODS = ("performer-lra", "yoso", "spectral-shifting", "nystrom", "linformer")
"""Methods added to the comparison (drawn as secondary curves). ``performer-lra`` is Performer as the
Skyformer authors' code feeds it (:mod:`approxlab.methods.performer_lra`), to compare with the paper's
Performer curve."""

FULL_GRID = {
    "conditions": ["initialized", "pretrained"],
    "n": [512, 1024, 2048, 4096],
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(PAPER_METHODS + EXTRA_METHODS),
    "dtypes": ["float64", "float32"],
    "windows": 4,
    "seeds": 3,
}
"""The full grid (overridable from the command line)."""

QUICK_GRID = {**FULL_GRID, "n": [512, 1024], "num_features": [16, 64, 256], "dtypes": ["float64"], "windows": 1,
              "seeds": 1}
"""``--quick``: a smoke run of a few minutes on 2 CPU cores (float64 only; ``--dtypes`` adds float32)."""

KEY_COLUMNS = ("condition", "n", "dtype", "window", "method")
WINDOW_KEY_COLUMNS = ("condition", "n", "window")
POSITIONS = ("interpolate", "copy", "none")
DENSE_MAX_N = 4096
"""Above this n: exact attention without n x n memory, d_stat estimated matrix-free (``--matrix-free-above``)."""
PANEL_KEY_COLUMNS = ("condition", "n")
ESTIMATE_DSTAT_FROM_N = 4096
"""From this n (and above ``--matrix-free-above``), d_stat is the matrix-free estimate of
:func:`approxlab.leverage.estimate_ridge_quantities` (float32 products, within 1 % of the
eigendecomposition) instead of a float64 ``eigvalsh`` of the 2n x 2n completion."""


def build_config(
    *,
    quick: bool = False,
    conditions=None,
    n=None,
    num_features=None,
    methods=None,
    windows=None,
    seeds=None,
    dtypes=None,
    positions: str = "interpolate",
    checkpoint=None,
    layer: int = 0,
    stat_heads: int = 2,
    window_seed: int = 0,
    base_seed: int = 0,
    model_seed: int = 0,
) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    Parameters
    ----------
    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    conditions, n, num_features, methods, windows, seeds
        Overrides of the grid entries (``None``: keep).
    dtypes : list of {"float64", "float32"}
        Precisions of the approximations and of the exact reference, a grid axis (errors are
        always measured in float64). Default: both.
    positions : {"interpolate", "copy", "none"}
        How positions enter X beyond BERT's table (:func:`approxlab.data.qkv.position_embeddings`).
    checkpoint : str, optional
        BERT-family checkpoint (Hub id or local folder); None: the offline defaults.
    layer : int
        0 (the paper's setting): the input embedding projected by layer 0's W_Q, W_K, W_V;
        ``layer > 0``: the model's real hidden states entering that layer (``"hidden"`` mode).
    stat_heads : int
        Number of heads (the first ones) whose statistical dimension is computed.
    window_seed, base_seed, model_seed : int
        Seeds of the window choice, of the per-cell generators (through
        :func:`~approxlab.studies.runner.cell_seed`), and of the initialized model.
    """
    from ..methods import available

    def check_method(method):
        if method not in available():
            raise StudyError(f"--methods: {method!r} is not a registered method; choose from {available()}.")

    overrides = {"conditions": conditions, "n": n, "num_features": num_features, "methods": methods,
                 "windows": windows, "seeds": seeds, "dtypes": dtypes}
    grid = override_grid(QUICK_GRID if quick else FULL_GRID, overrides, check_method=check_method)
    if not grid["dtypes"] or any(x not in ("float64", "float32") for x in grid["dtypes"]):
        raise StudyError(f"--dtypes must be among ['float64', 'float32']; got {grid['dtypes']}.")
    grid["dtypes"] = sorted(set(grid["dtypes"]), reverse=True)  # float64 first
    if positions not in POSITIONS:
        raise StudyError(f"--positions must be one of {list(POSITIONS)}; got {positions!r}.")
    inputs = ("X = LayerNorm(word + position + type embedding) of BERT, layer-0 W_Q, W_K, W_V" if layer == 0 else
              f"X = the hidden states entering layer {layer} (the model run up to it), its W_Q, W_K, W_V")
    return {
        "study": "figure1",
        "paper": "Skyformer (Chen et al., NeurIPS 2021), Section 4.5, Figure 1",
        **grid,
        "mode": "embedding" if layer == 0 else "hidden",
        "positions": positions,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "inputs": f"{inputs}; positions beyond the 512-row table: {positions}",
        "layer": int(layer),
        "window_pool": 64,
        "window_seed": int(window_seed),
        "base_seed": int(base_seed),
        "model_seed": int(model_seed),
        "deterministic_methods": "run once with seed 0",
        "error": "spectral norm per head of the (n, p_v) output difference, float64; "
                 "rows hold every head's error (error_heads) and their mean/std/min/max",
        "panel_stats": {"window": "first", "heads": list(range(int(stat_heads))), "lambda_scale": 0.1},
    }


def window_ids(config: dict, n: int | None = None) -> list[int]:
    """The windows of the grid at length ``n``: ``config["windows"]`` ids drawn without
    replacement with a generator seeded by ``config["window_seed"]``, sorted.

    The pool is the first ``window_pool * 4096`` tokens (262,144 of Wikitext-2's 273,178):
    ``window_pool`` windows for every ``n <= 4096`` (the same ids for all of them), and the
    ``window_pool * 4096 // n`` windows that fit in it for longer ``n`` (16 at n = 16384).
    """
    pool = config["window_pool"]
    if n is not None and n > 4096:
        pool = max(1, pool * 4096 // n)
    generator = torch.Generator().manual_seed(config["window_seed"])
    chosen = torch.randperm(pool, generator=generator)[: config["windows"]]
    return sorted(int(i) for i in chosen)


def _seeds(config: dict, method: str) -> list[int]:
    return list(range(config["seeds"])) if get(method).randomized else [0]


def make_cells(config: dict, *, data_dir=None, cache_dir=None, device: str = "cpu",
               dense_max_n: int | None = None) -> list[dict]:
    """Runner cells, one per (condition, n, window, method), adjacent per window.

    The data location and device travel in the cells (they are not part of the grid).
    """
    cells = []
    for condition in config["conditions"]:
        for n in config["n"]:
            for dtype in config["dtypes"]:
                for window in window_ids(config, n):
                    for method in config["methods"]:
                        features = [d for d in config["num_features"] if d <= get(method).max_features(n)]
                        if not features:
                            continue
                        cells.append({
                            "condition": condition, "n": n, "window": window, "method": method,
                            "num_features": features, "seeds": _seeds(config, method),
                            **_data_settings(config, data_dir, cache_dir, device, dense_max_n, dtype),
                        })
    return cells


def _data_settings(config, data_dir, cache_dir, device, dense_max_n=None, dtype="float64"):
    return {
        "dense_max_n": DENSE_MAX_N if dense_max_n is None else int(dense_max_n),
        "mode": config["mode"], "layer": config["layer"], "model_seed": config["model_seed"],
        "positions": config.get("positions", "none"), "checkpoint": config.get("checkpoint"),
        "dtype": dtype, "base_seed": config["base_seed"],
        "data_dir": None if data_dir is None else str(data_dir),
        "cache_dir": None if cache_dir is None else str(cache_dir),
        "device": device,
    }


def load_qkv(condition, n, window, *, mode, layer, model_seed, data_dir, cache_dir, device,
             positions="interpolate", checkpoint=None):
    """Q, K, V ``(heads, n, head_dim)`` (float32) of one window, and the checkpoint name.

    Thin wrapper of :func:`approxlab.data.get_qkv` (tests replace it with synthetic data).
    """
    qkv = _get_qkv(condition, n, window, mode, layer, model_seed, data_dir, cache_dir, device, positions,
                   checkpoint)
    return qkv.q[0], qkv.k[0], qkv.v[0], str(qkv.checkpoint)


def load_window(condition, n, window, *, mode, layer, model_seed, data_dir, cache_dir, device,
                positions="interpolate", checkpoint=None):
    """Token ids ``(n,)``, Q and K ``(heads, n, head_dim)`` of one window (tests replace it)."""
    qkv = _get_qkv(condition, n, window, mode, layer, model_seed, data_dir, cache_dir, device, positions,
                   checkpoint)
    return qkv.input_ids[0], qkv.q[0], qkv.k[0]


def _get_qkv(condition, n, window, mode, layer, model_seed, data_dir, cache_dir, device, positions, checkpoint):
    from ..data import get_qkv

    return get_qkv(condition, n, [window], mode=mode, layer=layer, seed=model_seed, data_dir=data_dir,
                   cache_dir=cache_dir, device=device, dtype=torch.float32, positions=positions,
                   checkpoint=checkpoint)


@functools.lru_cache(maxsize=2)
def reference(condition, n, window, mode, layer, model_seed, data_dir, cache_dir, device, dtype,
              dense_max_n=DENSE_MAX_N, positions="interpolate", checkpoint=None):
    """Per-process cache of one window: ``dict(q, k, v, output, output_norm, checkpoint)``.

    ``output`` is exact softmax attention ``(heads, n, p_v)`` in ``dtype`` (all heads in one
    call of the fused kernel, head by head above ``dense_max_n``), ``output_norm`` its spectral norm per head (float64). Above
    ``n = dense_max_n`` each head is applied as an
    :class:`~approxlab.operators.ExactAttentionOperator` in row blocks, so memory stays
    O(n * block) instead of O(n^2) (the same numbers up to rounding).
    """
    q, k, v, checkpoint = load_qkv(condition, n, window, mode=mode, layer=layer, model_seed=model_seed,
                                   data_dir=data_dir, cache_dir=cache_dir, device=device, positions=positions,
                                   checkpoint=checkpoint)
    dt = getattr(torch, dtype)
    q, k, v = (x.to(dt) for x in (q, k, v))
    if n > dense_max_n:
        output = torch.stack([ExactAttentionOperator(q[h], k[h], "softmax").matmat(v[h]) for h in range(q.shape[0])])
    else:
        output = exact_attention(q, k, v)  # all heads in one fused-kernel call
    return {"q": q, "k": k, "v": v, "output": output, "output_norm": _spectral_norm(output),
            "checkpoint": checkpoint}


def _reference(cell):
    return reference(cell["condition"], cell["n"], cell["window"], cell["mode"], cell["layer"],
                     cell["model_seed"], cell["data_dir"], cell["cache_dir"], cell["device"], cell["dtype"],
                     cell.get("dense_max_n", DENSE_MAX_N), cell.get("positions", "none"), cell.get("checkpoint"))


def _spectral_norm(x: torch.Tensor) -> torch.Tensor:
    """Largest singular value of each ``(heads, n, m)`` matrix (float64 dense SVD, on CPU)."""
    return spectral_norm(x.detach().cpu())


def _generator(cell, method, d, seed):
    key = (cell["condition"], cell["n"], cell["window"], method, d, seed)
    return torch.Generator().manual_seed(cell_seed(*key, base_seed=cell["base_seed"]))


def _summary_stats(prefix, values: torch.Tensor) -> dict:
    values = values.to(torch.float64)
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std(correction=0)),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


def _blowup_columns(error: torch.Tensor, output_norm: torch.Tensor, approx) -> dict:
    """Per-head errors and blow-up counts of one approximation (see the module docstring)."""
    row_sums = None if approx is None else approx.info.get("row_sums")
    near_zero = 0
    if row_sums is not None:
        magnitude = torch.as_tensor(row_sums).detach().cpu().to(torch.float64).abs()
        magnitude = magnitude.reshape(-1, magnitude.shape[-1])
        floor = NEAR_ZERO_ROW * magnitude.median(dim=-1, keepdim=True).values
        near_zero = int((magnitude <= floor).sum())
    return {
        "error_heads": " ".join(repr(float(e)) for e in error.to(torch.float64)),
        "error_blowups": int((error > BLOWUP_FACTOR * output_norm).sum()),
        "near_zero_rows": near_zero, "row_sums_reported": row_sums is not None,
    }


def compute_cell(cell: dict) -> list[dict]:
    """Rows of one (condition, n, window, method) cell: all its num_features x seeds.

    Warnings the method raises are counted (``num_warnings``, ``warnings``) rather than
    propagated; a method that fails (``FloatingPointError`` for a non-finite output,
    ``ArithmeticError``, ``torch.linalg.LinAlgError``) gives a row with ``status`` naming
    the error and ``inf`` errors, so the sweep goes on and the failure is visible.
    """
    ref = _reference(cell)
    heads = ref["q"].shape[0]
    rows = []
    for d in cell["num_features"]:
        for seed in cell["seeds"]:
            start = time.perf_counter()
            approx = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    approx = approximate(cell["method"], ref["q"], ref["k"], ref["v"], num_features=d,
                                         generator=_generator(cell, cell["method"], d, seed))
                    error = _spectral_norm(approx.output - ref["output"])
                    status = "ok"
                except (ArithmeticError, torch.linalg.LinAlgError) as failure:
                    error = torch.full((heads,), math.inf, dtype=torch.float64)
                    status = f"{type(failure).__name__}: {failure}".replace("\n", " ")
            seconds = time.perf_counter() - start
            kinds = sorted({w.category.__name__ for w in caught})
            rows.append({
                "num_features": d, "seed": seed, "checkpoint": ref["checkpoint"], "heads": heads,
                **_summary_stats("error", error),
                **_summary_stats("relative_error", error / ref["output_norm"]),
                **_blowup_columns(error, ref["output_norm"], approx),
                "output_norm_mean": float(ref["output_norm"].mean()),
                "seconds": seconds, "status": status,
                "num_warnings": len(caught), "warnings": ";".join(kinds) if kinds else "none",
            })
    return rows


def _core_condition_number(info: dict):
    for name in ("core_condition_number", "condition_number"):
        if name in info:
            value = info[name]
            return torch.as_tensor(value, dtype=torch.float64).reshape(-1)
    return None


def compute_panel(cell: dict) -> list[dict]:
    r"""Panel statistics of one (condition, n): rows per num_features (first window).

    The statistical dimension (Skyformer Theorem 2) of the completion
    :math:`\bar C = \kappa([Q;K]/p^{1/4})` (Eq. (4)) at :math:`\lambda = s\,\|\bar C\|_2`
    (``s = lambda_scale``), :math:`d_{stat} = \sum_i \mu_i/(\mu_i+\lambda)` over the
    eigenvalues :math:`\mu_i \ge 0` of :math:`\bar C`, for ``cell["stat_heads"]`` (from
    :data:`ESTIMATE_DSTAT_FROM_N` on, the matrix-free estimate; column
    ``statistical_dimension_method``); and the
    sampled-core condition number that ``skyformer-softmax`` reports in ``info`` (seed 0).
    """
    ref = _reference(cell)
    heads = [h for h in cell["stat_heads"] if h < ref["q"].shape[0]]
    dstats, lambdas = [], []
    estimated = cell["n"] >= ESTIMATE_DSTAT_FROM_N or cell["n"] > cell.get("dense_max_n", DENSE_MAX_N)
    if estimated and heads:  # matrix-free: within 1 % of the eigendecomposition (leverage.py)
        q, k = (ref[x][heads].to(torch.float32) for x in ("q", "k"))
        est = estimate_ridge_quantities(completion_operator(q, k), lambda_scale=cell["lambda_scale"],
                                        generator=_generator(cell, "statistical-dimension", 0, 0))
        dstats, lambdas = est.statistical_dimension.tolist(), est.lam.tolist()
    for h in [] if estimated else heads:
        z = torch.cat([ref["q"][h], ref["k"][h]]).to(torch.float64)
        completion = kernelized_matrix(z, z)
        eigenvalues = torch.linalg.eigvalsh(completion).clamp_min(0.0)
        lam = cell["lambda_scale"] * float(eigenvalues.max())
        dstats.append(float((eigenvalues / (eigenvalues + lam)).sum()))
        lambdas.append(lam)
    dstats = torch.tensor(dstats or [float("nan")], dtype=torch.float64)
    rows = []
    method = cell["core_method"]
    for d in cell["num_features"]:
        row = {
            "num_features": d, "window": cell["window"], "checkpoint": ref["checkpoint"],
            "stat_heads": len(heads), "lambda_mean": float(np.mean(lambdas)) if lambdas else float("nan"),
            "statistical_dimension_mean": float(dstats.mean()),
            "statistical_dimension_min": float(dstats.min()),
            "statistical_dimension_max": float(dstats.max()),
            "statistical_dimension_fraction": float(dstats.mean()) / (2 * cell["n"]),
            "statistical_dimension_method": "estimate" if estimated else "eigvalsh",
        }
        if method is not None and d <= get(method).max_features(cell["n"]):
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                info = approximate(method, ref["q"], ref["k"], ref["v"], num_features=d,
                                   generator=_generator(cell, method, d, 0)).info
            kappa = _core_condition_number(info)
            if kappa is not None:
                row["core_condition_number_median"] = float(kappa.median())
                row["core_condition_number_max"] = float(kappa.max())
        rows.append(row)
    return rows


def compute_window(cell: dict) -> list[dict]:
    r"""One row per (condition, n, window): what the inputs allow.

    ``distinct_tokens``; ``distinct_q_rows`` of head 0 (at most the distinct tokens without
    positions); ``rank_a``: numerical rank of head 0's :math:`A = \exp(QK^\top/\sqrt p)`
    (float64; singular values above ``n * eps64 * sigma_1``, the rounding level of an SVD). The
    rank needs a dense SVD, :math:`O(n^3)` (24 s on one core at n = 4096, the largest single cost
    of a Figure-1 window): above ``n = dense_max_n`` (``--matrix-free-above``) it is NaN.
    ``seconds``: the wall time of these diagnostics, the window's loading excluded.
    """
    from ..kernels import scaled_logits

    ids, q, k = load_window(cell["condition"], cell["n"], cell["window"], mode=cell["mode"], layer=cell["layer"],
                            model_seed=cell["model_seed"], data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                            device=cell["device"], positions=cell["positions"], checkpoint=cell["checkpoint"])
    start = time.perf_counter()
    q0, k0 = q[0].detach().cpu().to(torch.float64), k[0].detach().cpu().to(torch.float64)
    n, rank = q0.shape[0], math.nan
    if n <= cell.get("dense_max_n", DENSE_MAX_N):
        logits = scaled_logits(q0, k0)
        sigma = torch.linalg.svdvals(torch.exp(logits - logits.max()))
        rank = int((sigma > n * torch.finfo(torch.float64).eps * sigma[0]).sum())
    return [{"distinct_tokens": int(torch.as_tensor(ids).unique().numel()),
             "distinct_q_rows": int(torch.unique(q0, dim=0).shape[0]),
             "rank_a": rank, "positions": cell["positions"], "seconds": time.perf_counter() - start}]


def _run_info(args_like: dict) -> dict:
    return {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in args_like.items()}


def compute(config: dict, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None, workers=None,
            progress=True, restart=False, run_info=None,
            dense_max_n: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or resume) the grid; write ``results.csv``, ``conditioning.csv``, ``windows.csv``, ``config.json``.

    Returns
    -------
    (results, panel_stats) : tuple of pandas.DataFrame
    """
    out = pathlib.Path(out)
    common = dict(config=config, run_info=run_info, scheduler=scheduler, workers=workers, progress=progress,
                  restart=restart)
    cells = make_cells(config, data_dir=data_dir, cache_dir=cache_dir, device=device, dense_max_n=dense_max_n)
    results = run_cells(cells, compute_cell,
                        results_path=out / RESULTS, key_columns=KEY_COLUMNS, **common)
    panels = [  # the statistical dimension and core conditioning in float64
        {"condition": c, "n": n, "window": window_ids(config, n)[0], "num_features": config["num_features"],
         "stat_heads": config["panel_stats"]["heads"], "lambda_scale": config["panel_stats"]["lambda_scale"],
         "core_method": "skyformer-softmax" if "skyformer-softmax" in config["methods"] else None,
         **_data_settings(config, data_dir, cache_dir, device, dense_max_n)}
        for c in config["conditions"] for n in config["n"]
    ]
    stats = run_cells(panels, compute_panel, results_path=out / CONDITIONING, key_columns=PANEL_KEY_COLUMNS,
                      **common)
    window_cells = [{"condition": c, "n": n, "window": w,
                     **_data_settings(config, data_dir, cache_dir, device, dense_max_n)}
                    for c in config["conditions"] for n in config["n"] for w in window_ids(config, n)]
    run_cells(window_cells, compute_window, results_path=out / WINDOWS, key_columns=WINDOW_KEY_COLUMNS, **common)
    return results, stats


# ------------------------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    """Options of ``approxlab figure1`` (besides the common ones)."""
    group = parser.add_argument_group("figure1 grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--methods", type=_cli.str_list, nargs="+", action=_cli.Flatten, default=None, help="comma-separated method names")
    group.add_argument("--conditions", type=_cli.str_list, nargs="+", action=_cli.Flatten, default=None, help="initialized,pretrained")
    group.add_argument("--n", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None, help="comma-separated sequence lengths")
    group.add_argument("--num-features", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None, help="comma-separated d values")
    group.add_argument("--windows", type=_cli.positive_int, default=None, help="number of Wikitext-2 windows")
    group.add_argument("--seeds", type=_cli.positive_int, default=None, help="seeds per randomized method")
    group.add_argument("--dtypes", type=_cli.str_list, nargs="+", action=_cli.Flatten, default=None,
                       help="precisions of the approximations, a grid axis (default float64,float32)")
    group.add_argument("--positions", choices=POSITIONS, default="interpolate",
                       help="positions beyond BERT's 512-row table: interpolate (default; the table resampled "
                            "linearly to n rows), copy (Longformer: repeated every 512), none (no positions)")
    group.add_argument("--checkpoint", default=None, metavar="NAME_OR_DIR",
                       help="BERT-family checkpoint (Hub id with network, local folder always), with its "
                            "tokenizer; the initialized condition takes its config and tokenizer "
                            "(default: bert-base config / all-MiniLM-L6-v2, offline)")
    group.add_argument("--layer", type=_cli.nonnegative_int, default=0,
                       help="attention layer: 0 (default, the paper's: the input embedding through layer 0's "
                            "projections) or L > 0 (the real hidden states entering layer L)")
    group.add_argument("--matrix-free-above", type=_cli.positive_int, default=DENSE_MAX_N,
                       help="n above which exact attention is applied in row blocks (never n x n in memory) "
                            f"and the statistical dimension is estimated matrix-free (default {DENSE_MAX_N})")
    group.add_argument("--stat-heads", type=_cli.positive_int, default=2,
                       help="heads whose statistical dimension is computed (default 2)")


def run(args) -> int:
    """``approxlab figure1``: compute (resumable) unless ``--plot-only``, then plot and summarise."""
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, conditions=args.conditions, n=args.n,
                              num_features=args.num_features, methods=args.methods, windows=args.windows,
                              seeds=args.seeds, dtypes=args.dtypes, positions=args.positions,
                              checkpoint=args.checkpoint, layer=args.layer, stat_heads=args.stat_heads)
        _cli.check_model(args, config["conditions"], layer=args.layer, encoder_only=True)
        _cli.check_windows(args, {n: window_ids(config, n) for n in config["n"]}, windows=config["windows"])
        _cli.check_heads("--stat-heads", args.stat_heads, config["conditions"], checkpoint=args.checkpoint)
        # every method at every (n, d) of the grid, or a one-line refusal: never a thinner figure
        _cli.check_num_features("--num-features", max(config["num_features"]), config["methods"], config["n"])
        run_info = _run_info({"command": getattr(args, "command", "approxlab figure1"), "device": args.device,
                              "scheduler": args.scheduler, "workers": args.workers,
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "matrix_free_above": args.matrix_free_above,
                              "checkpoints": {c: resolve_checkpoint(c, args.checkpoint) for c in config["conditions"]}})
        start = time.perf_counter()
        compute(config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                scheduler=args.scheduler, workers=args.workers, progress=args.progress,
                restart=args.restart, run_info=run_info, dense_max_n=args.matrix_free_above)
        print(f"figure1: computed in {time.perf_counter() - start:.1f} s -> {out}")
    paths = plot(out)
    summary = write_summary(out)
    for path in [*paths, summary]:
        print(f"figure1: wrote {path}")
    return 0
