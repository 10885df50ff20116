r"""Figure 1's cells: one approximation cell per (condition, n, dtype, window, method), one panel cell per
(condition, n), one window cell per (condition, n, window).

Cells sharing a window are adjacent, and the window's Q/K/V, exact output and its norms come from the
shared per-process cache (:func:`approxlab.studies.inputs.wikitext.reference`); so does the oracles' ranking of
each query's logits (:func:`approxlab.methods.rank_keys`, :data:`_RANKINGS`), formed once for every d of
``topk`` and ``topp``. Where the grid holds an oracle (float64, up to ``dense_max_n``) the window's exact output is
that ranking's (:data:`_REFERENCES`): one pass over the logits for both. Each approximation's
generator is seeded with :func:`~approxlab.studies.engine.cell_seed` of (condition, n, window, method,
d, seed), so results do not depend on run order or executor.
"""

from __future__ import annotations

import collections
import math
import warnings

import numpy as np
import torch

from ...attention import approximate
from ...kernels import kernelized_matrix
from ...leverage import completion_operator, estimate_ridge_quantities
from ...methods import get, rank_keys
from ...metrics import numerical_rank_lu, spectral_norm
from ..engine.clock import Stopwatch
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from ..inputs import wikitext
from ..inputs.wikitext import DENSE_MAX_N, Window, method_seeds
from .grid import window_ids
from .stats import BLOWUP_FACTOR, NEAR_ZERO_ROW

__all__ = ["approximation_cells", "panel_cells", "window_cells", "compute_cell", "compute_panel", "compute_window",
           "ESTIMATE_DSTAT_FROM_N", "ESTIMATE_DSTAT_TOL"]

ESTIMATE_DSTAT_FROM_N = 4096
"""From this n (and above ``--matrix-free-above``), d_stat is the estimate of
:func:`approxlab.leverage.estimate_ridge_quantities` (float32 products, within 1 % of the
eigendecomposition) instead of a float64 ``eigvalsh`` of the 2n x 2n completion. Up to
``--matrix-free-above`` its products multiply the float32 completion formed once
(``completion_operator(..., dense=True)``), above it they go through the fused kernel (nothing 2n x 2n);
the two give the same estimate to float32 rounding (``tests/test_figure1_shared.py``)."""

ESTIMATE_DSTAT_TOL = 1e-6
"""The relative residual at which the estimate's conjugate gradients stop (``tol`` of
:func:`approxlab.leverage.estimate_ridge_quantities`, whose default is 1e-8). Its products are float32 (unit
roundoff 6e-8, sums over 2n terms), so a smaller residual asks for more than the operator carries; on the bench's
n = 4096 window (initialized) it takes one product of 32 columns fewer (4 iterations instead of 5) and moves the
estimate by 1.4e-9 relative (``tests/test_figure1_shared.py`` checks the move stays far below the estimate's stated
1 %)."""


def _data(config, settings, dtype="float64") -> dict:
    """What a cell needs to load its window (it travels in the cell; not part of the grid)."""
    return {"dense_max_n": int(settings.get("dense_max_n", DENSE_MAX_N)), "mode": config["mode"],
            "layer": config["layer"], "model_seed": config["model_seed"],
            "positions": config.get("positions", "none"), "checkpoint": config.get("checkpoint"), "dtype": dtype,
            "base_seed": config["base_seed"], "data_dir": settings["data_dir"], "cache_dir": settings["cache_dir"],
            "device": settings["device"]}


def _features(config, method, n) -> list[int]:
    return [d for d in config["num_features"] if d <= get(method).max_features(n)]


def approximation_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (condition, n, dtype, window, method), adjacent per window; all its d x seeds.

    Each cell carries ``ranking_budgets``: every d of the grid's methods that take a ranking (``topk``, ``topp``)
    at its n, the budgets of the window's shared ranking and reference (:func:`_reference`); empty without them."""
    cells = []
    for condition in config["conditions"]:
        for n in config["n"]:
            ranked = {d for method in config["methods"] if "ranking" in (get(method).options() or [])
                      for d in _features(config, method, n)}
            for dtype in config["dtypes"]:
                for window in window_ids(config, n):
                    for method in config["methods"]:
                        features = _features(config, method, n)
                        if features:
                            cells.append({"condition": condition, "n": n, "window": window, "method": method,
                                          "num_features": features, "seeds": method_seeds(config["seeds"], method),
                                          "ranking_budgets": sorted(ranked), **_data(config, settings, dtype)})
    return cells


def panel_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (condition, n): the statistical dimension and core conditioning, on the first window."""
    return [{"condition": c, "n": n, "window": window_ids(config, n)[0], "num_features": config["num_features"],
             "stat_heads": config["panel_stats"]["heads"], "lambda_scale": config["panel_stats"]["lambda_scale"],
             "core_method": "skyformer-softmax" if "skyformer-softmax" in config["methods"] else None,
             **_data(config, settings)}
            for c in config["conditions"] for n in config["n"]]


def window_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (condition, n, window): what the inputs allow."""
    return [{"condition": c, "n": n, "window": w, **_data(config, settings)}
            for c in config["conditions"] for n in config["n"] for w in window_ids(config, n)]


def _window(cell) -> Window:
    return Window(cell["condition"], cell["n"], cell["window"], mode=cell["mode"], layer=cell["layer"],
                  model_seed=cell["model_seed"], data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                  device=cell["device"], positions=cell.get("positions", "none"), checkpoint=cell.get("checkpoint"))


def _reference(cell):
    """The window's ``q``, ``k``, ``v``, exact ``output``, ``output_norm`` and ``checkpoint``
    (:func:`approxlab.studies.inputs.wikitext.reference`'s dict).

    The window's entry in :data:`_REFERENCES`, for any cell of that window and dtype (the panel's too), when there
    is one. Else, for a cell with ``ranking_budgets`` in float64 up to ``dense_max_n``, a new entry: the window's
    Q/K/V, its key ranking at those budgets and the exact output from the same pass over the logits
    (:func:`approxlab.methods.rank_keys` given ``v``; the fused kernel's output to rounding), the ranking kept as
    ``ranking`` for the oracles (:func:`_shared_options`). Otherwise the fused kernel's
    (:func:`~approxlab.studies.inputs.wikitext.reference`)."""
    dense_max_n = cell.get("dense_max_n", DENSE_MAX_N)
    key, record = (_window(cell), cell["dtype"], dense_max_n), wikitext.qkv(_window(cell))
    if key in _REFERENCES and _REFERENCES[key][0] is record:
        return _REFERENCES[key][1]
    budgets = cell.get("ranking_budgets") or []
    if not budgets or cell["dtype"] != "float64" or cell["n"] > dense_max_n:
        return wikitext.reference(_window(cell), dtype=cell["dtype"], dense_max_n=dense_max_n)
    q, k, v = (x[0, :, :cell["n"]].to(torch.float64).contiguous() for x in (record.q, record.k, record.v))
    ranking = rank_keys(q, k, budgets, v=v)
    _REFERENCES.clear()
    _REFERENCES[key] = (record, {"q": q, "k": k, "v": v, "output": ranking.output, "ranking": ranking,
                                 "output_norm": spectral_norm(ranking.output), "checkpoint": str(record.checkpoint)})
    return _REFERENCES[key][1]


_REFERENCES: collections.OrderedDict = collections.OrderedDict()
"""The reference of the latest window whose exact output came from its key ranking (:func:`_reference`), by
(window, dtype, ``dense_max_n``): ``(record, reference)``, the window's Q/K/V record it was formed from (an entry
whose record is no longer the one :func:`~approxlab.studies.inputs.wikitext.qkv` returns, after
:func:`~approxlab.studies.inputs.wikitext.clear_caches`, is formed again) and the reference with the ranking
(``ranking``). One entry: the ranking is 16 bytes per head, query and kept key of each budget (250 MB for 12 heads,
n = 4096, d in {64, 256})."""


def _generator(cell, method, d, seed):
    key = (cell["condition"], cell["n"], cell["window"], method, d, seed)
    return torch.Generator().manual_seed(cell_seed(*key, base_seed=cell["base_seed"]))


_CORE_CONDITIONS: collections.OrderedDict = collections.OrderedDict()
"""The sampled-core condition numbers of the seed-0 approximations this process has run, by
:func:`_core_key` (at most :data:`_CORE_CONDITIONS_SIZE`, oldest dropped): the panel cell of a
(condition, n) reads the one its window's approximation cell computed instead of running the
method again (the same inputs and generator, so the same numbers)."""

_CORE_CONDITIONS_SIZE = 64


def _core_key(cell, method, d):
    return (_window(cell), cell["dtype"], cell.get("dense_max_n", DENSE_MAX_N), cell["base_seed"], method, d)


def _remember_core_condition(cell, d, info) -> None:
    kappa = _core_condition_number(info)
    if kappa is not None:
        _CORE_CONDITIONS[_core_key(cell, cell["method"], d)] = kappa
        while len(_CORE_CONDITIONS) > _CORE_CONDITIONS_SIZE:
            _CORE_CONDITIONS.popitem(last=False)


_RANKINGS: collections.OrderedDict = collections.OrderedDict()
"""The key ranking (:func:`approxlab.methods.rank_keys`) of the latest window whose cell asked for one, by
(window, dtype, budgets): the oracles ``topk`` and ``topp`` read it at every d instead of forming the window's
:math:`n \times n` logits once per method and d (the same numbers, ``tests/test_figure1_shared.py``). One entry:
16 bytes per head, query and kept key of each d (250 MB for 12 heads, n = 4096, d in {64, 256})."""


def _shared_options(cell, ref) -> dict:
    """The options that hand a method of ``cell`` the work its window shares: ``ranking`` for a method that takes
    one (``topk``, ``topp``), up to ``dense_max_n`` (above it the study keeps nothing of size ``n x d``); none for
    the others. The reference's ranking when it has one at every d of the cell (its time is the reference's, before
    any method's row); else one formed here (:data:`_RANKINGS`), whose time counts in the row of the cell and d
    that formed it."""
    if "ranking" not in (get(cell["method"]).options() or []) or cell["n"] > cell.get("dense_max_n", DENSE_MAX_N):
        return {}
    shared = ref.get("ranking")
    if shared is not None and set(cell["num_features"]) <= set(shared.ranked):
        return {"ranking": shared}
    key = (_window(cell), cell["dtype"], tuple(cell["num_features"]))
    if key not in _RANKINGS:
        _RANKINGS.clear()
        _RANKINGS[key] = rank_keys(ref["q"], ref["k"], cell["num_features"])
    return {"ranking": _RANKINGS[key]}


def _summary_stats(prefix, values: torch.Tensor) -> dict:
    values = values.to(torch.float64)
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_std": float(values.std(correction=0)),
            f"{prefix}_min": float(values.min()), f"{prefix}_max": float(values.max())}


def _blowup_columns(error: torch.Tensor, output_norm: torch.Tensor, approx) -> dict:
    """Per-head errors and blow-up counts of one approximation (see the study's docstring)."""
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
    propagated; a method that fails (any exception it raises, e.g. ``FloatingPointError`` for a
    non-finite output, or a registered method's result of the wrong shape:
    :mod:`approxlab.studies.engine.failures`) gives a row with ``status`` naming
    the error and ``inf`` errors, so the sweep goes on and the failure is visible.
    """
    ref = _reference(cell)
    heads = ref["q"].shape[0]
    rows = []
    for d in cell["num_features"]:
        for seed in cell["seeds"]:
            watch = Stopwatch()
            approx = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    approx = approximate(cell["method"], ref["q"], ref["k"], ref["v"], num_features=d,
                                         generator=_generator(cell, cell["method"], d, seed),
                                         **_shared_options(cell, ref))
                    error = spectral_norm((approx.output - ref["output"]).detach().cpu())
                    status = "ok"
                    if seed == 0:
                        _remember_core_condition(cell, d, approx.info)
                except METHOD_ERRORS as failure:  # the method's failure: a failed row
                    error = torch.full((heads,), math.inf, dtype=torch.float64)
                    status = method_status(cell["method"], failure)
            seconds = watch.seconds()
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
            return torch.as_tensor(info[name], dtype=torch.float64).reshape(-1)
    return None


def _statistical_dimensions(cell, ref, heads):
    r""":math:`d_{stat}(\lambda)` and :math:`\lambda` of ``heads``, and whether they are the matrix-free estimate."""
    dense = cell["n"] <= cell.get("dense_max_n", DENSE_MAX_N)
    estimated = cell["n"] >= ESTIMATE_DSTAT_FROM_N or not dense
    if estimated and heads:  # within 1 % of the eigendecomposition (leverage.py); the completion formed up to
        q, k = (ref[x][heads].to(torch.float32) for x in ("q", "k"))  # dense_max_n (the same to rounding)
        est = estimate_ridge_quantities(completion_operator(q, k, dense=dense), lambda_scale=cell["lambda_scale"],
                                        tol=ESTIMATE_DSTAT_TOL,
                                        generator=_generator(cell, "statistical-dimension", 0, 0))
        return est.statistical_dimension.tolist(), est.lam.tolist(), True
    dstats, lambdas = [], []
    for h in [] if estimated else heads:
        z = torch.cat([ref["q"][h], ref["k"][h]]).to(torch.float64)
        eigenvalues = torch.linalg.eigvalsh(kernelized_matrix(z, z)).clamp_min(0.0)
        lam = cell["lambda_scale"] * float(eigenvalues.max())
        dstats.append(float((eigenvalues / (eigenvalues + lam)).sum()))
        lambdas.append(lam)
    return dstats, lambdas, estimated


def compute_panel(cell: dict) -> list[dict]:
    r"""Panel statistics of one (condition, n): rows per num_features (first window).

    The statistical dimension (Skyformer Theorem 2) of the completion
    :math:`\bar C = \kappa([Q;K]/p^{1/4})` (Eq. (4)) at :math:`\lambda = s\,\|\bar C\|_2`
    (``s = lambda_scale``), :math:`d_{stat} = \sum_i \mu_i/(\mu_i+\lambda)` over the
    eigenvalues :math:`\mu_i \ge 0` of :math:`\bar C`, for ``cell["stat_heads"]`` (from
    :data:`ESTIMATE_DSTAT_FROM_N` on, the matrix-free estimate; column
    ``statistical_dimension_method``); and the sampled-core condition number that
    ``skyformer-softmax`` reports in ``info`` (seed 0): the one its approximation cell of the same
    window computed when that ran in this process (:data:`_CORE_CONDITIONS`), else computed here
    (the same inputs and generator either way).
    """
    ref = _reference(cell)
    heads = [h for h in cell["stat_heads"] if h < ref["q"].shape[0]]
    dstats, lambdas, estimated = _statistical_dimensions(cell, ref, heads)
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
            kappa = _CORE_CONDITIONS.get(_core_key(cell, method, d))
            if kappa is None:  # not run in this process (another worker, or a resumed run)
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
    (float64; singular values above :math:`\tau = n\,\epsilon_{64}\,\sigma_1`, the rounding level
    of an SVD), by :func:`approxlab.metrics.numerical_rank_lu`: an LU factorisation of :math:`A`
    (:math:`\tfrac23 n^3` flops) and subspace iteration on :math:`(A^\top A)^{-1}`, whose Ritz values
    certify each singular value it counts below :math:`\tau`; where more than a block's worth lie
    below it (e.g. ``--positions none``: rank at most the distinct tokens) the count comes from the
    dense SVD, as every count did before (the same counts on the committed run's 32 windows; at
    n = 4096 about a fifth of the SVD's time). Above ``n = dense_max_n`` (``--matrix-free-above``)
    it is NaN: both need :math:`A` in memory. ``seconds``: the wall time of these diagnostics, the
    window's loading excluded.
    """
    from ...kernels import scaled_logits

    record = wikitext.qkv(_window(cell))
    ids, q, k = record.input_ids[0], record.q[0], record.k[0]
    watch = Stopwatch()
    q0, k0 = q[0].detach().cpu().to(torch.float64), k[0].detach().cpu().to(torch.float64)
    n, rank = q0.shape[0], math.nan
    if n <= cell.get("dense_max_n", DENSE_MAX_N):
        logits = scaled_logits(q0, k0)
        rank = numerical_rank_lu(torch.exp(logits - logits.max()), n * torch.finfo(torch.float64).eps,
                                 generator=_generator(cell, "rank-of-a", 0, 0))
    return [{"distinct_tokens": int(torch.as_tensor(ids).unique().numel()),
             "distinct_q_rows": int(torch.unique(q0, dim=0).shape[0]),
             "rank_a": rank, "positions": cell["positions"], "seconds": watch.seconds()}]
