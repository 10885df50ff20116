r"""The ``accuracy`` and ``scale`` parts of ``approxlab bench``: the matrix-free spectral error.

The spectral error :math:`\|\tilde D^{-1}\tilde A - D^{-1}A\|_2` of one approximation by the fused
block Lanczos path (:func:`approxlab.linalg.normal_lanczos.normal_block_lanczos`, both parts) and,
in the ``accuracy`` part, by the dense float64 SVD (the reference), Golub--Kahan
(:func:`approxlab.metrics.spectral_error`'s route) and SciPy's
:func:`scipy.linalg.interpolative.estimate_spectral_norm_diff`. See :mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import torch

from .parts import approximation, measured_row
from .timing import measure
from ...linalg.normal_lanczos import default_row_block, normal_block_lanczos

__all__ = ["spectral_rows"]


def _dense_error(q, k, approx_op):
    from ...kernels import softmax_matrix

    exact = softmax_matrix(q.to(torch.float64), k.to(torch.float64))
    difference = approx_op.to(torch.float64).to_dense() - exact
    del exact
    return float(torch.linalg.matrix_norm(difference, ord=2).max())


def _golub_kahan_error(q, k, approx_op, tol, max_iter, generator):
    """What :func:`approxlab.metrics.spectral_error` does on operators, keeping the diagnostics."""
    from ...linalg.lanczos import golub_kahan
    from ...operators import ExactAttentionOperator

    exact = ExactAttentionOperator(q, k, "softmax", block_size=default_row_block(q.shape[-2]))
    difference = approx_op.to(torch.float64) - exact.to(torch.float64)
    return golub_kahan(difference, tol=tol, max_iter=max_iter, generator=generator)


def _scipy_error(q, k, approx_op, its, seed):
    """:func:`scipy.linalg.interpolative.estimate_spectral_norm_diff` on the two operators."""
    import numpy as np
    import scipy.linalg.interpolative as interpolative
    from scipy.sparse.linalg import LinearOperator as ScipyOperator

    from ...operators import ExactAttentionOperator

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


def spectral_rows(config, part, method, q, k, v, n, common, seed, compute_dtype) -> list[dict]:
    """Wide rows of one ``accuracy`` or ``scale`` cell (before the bench's ``_tidy``)."""
    approx = approximation(config, method, q, k, v, n)
    approx_op = approx.operator()
    rows = []
    fast, m = measure(normal_block_lanczos, q, k, approx_op, block=config["lanczos_block"], tol=config["tol"],
                      max_iter=config["max_iter"], generator=torch.Generator().manual_seed(seed),
                      compute_dtype=compute_dtype)
    fast_row = measured_row("block-lanczos", m, estimate=float(fast.estimate.max()),
                            lower_bound=float(fast.lower_bound.max()), distance_bound=float(fast.distance_bound.max()),
                            probabilistic_upper_bound=float(fast.probabilistic_upper_bound.max()),
                            passes=fast.num_passes, matvecs=fast.num_matvecs, converged=bool(fast.converged.all()),
                            compute_dtype=config["compute_dtype"], **common)
    rows.append(fast_row)
    if part == "accuracy":
        dense, m = measure(_dense_error, q, k, approx_op)
        dense_row = measured_row("dense", m, estimate=dense, lower_bound=dense, distance_bound=0.0, passes=0,
                                 matvecs=0, converged=True, compute_dtype="float64", **common)
        gk, m = measure(_golub_kahan_error, q, k, approx_op, config["tol"], config["max_iter"],
                        torch.Generator().manual_seed(seed))
        gk_row = measured_row("golub-kahan", m, estimate=float(gk.estimate.max()),
                              lower_bound=float(gk.lower_bound.max()), distance_bound=float(gk.distance_bound.max()),
                              passes=gk.num_matvecs, matvecs=gk.num_matvecs, converged=bool(gk.converged.all()),
                              compute_dtype="float64", **common)
        (scipy_value, scipy_matvecs), m = measure(_scipy_error, q, k, approx_op, config["scipy_its"], seed)
        scipy_row = measured_row("scipy", m, estimate=scipy_value, passes=scipy_matvecs, matvecs=scipy_matvecs,
                                 compute_dtype=str(q.dtype).replace("torch.", ""), **common)
        rows = [dense_row, gk_row, fast_row, scipy_row]
        for row in rows:
            row["relative_disagreement"] = abs(row["estimate"] - dense) / dense
            row["time_ratio_vs_dense"] = dense_row["wall_s"] / row["wall_s"]
            row["cpu_ratio_vs_dense"] = dense_row["cpu_s"] / row["cpu_s"]
    return rows
