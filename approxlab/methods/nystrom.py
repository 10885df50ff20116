r"""Standard Nyström on the (non-PSD) score matrix, row-normalised: the "Nyström" baseline.

Target: softmax attention :math:`D^{-1}AV`. One set ``S`` of ``d`` token indices is used for
both rows and columns: :math:`\tilde A = A_{:,S}A_{SS}^+A_{S,:}`, then
:math:`\tilde D = \operatorname{diag}(\tilde A\mathbf 1)`. ``num_features`` is ``d``,
``1 <= d <= n``. :math:`A` is neither symmetric nor PSD, so, unlike Skyformer's completion
(Theorem 2), this has no error guarantee: it is the "Nyström (uniform)" curve of
Skyformer's Figure 1.
"""

from __future__ import annotations

import torch

from .. import kernels, sketch
from .._validation import check_choice, check_int, check_positive_float
from ..leverage import approximate_ridge_leverage_scores
from ..linalg.cores import nystrom_core
from ._base import Approximation, method
from .skyformer import gaussian_skeleton, skeleton_attention

SAMPLINGS = ("uniform", "ridge-leverage")


def _ridge_leverage_sample(k, d, generator, ridge_lambda):
    """Columns sampled by approximate ridge leverage of the key kernel ``kappa(K', K')`` (see nystrom)."""
    n = k.shape[-2]
    batch = tuple(k.shape[:-2])
    lam = n / d if ridge_lambda is None else ridge_lambda
    pilot = sketch.uniform_columns(n, d, batch_shape=batch, generator=generator, device=k.device)
    key_columns = kernels.kernelized_matrix(k, sketch.gather_rows(k, pilot))  # (*batch, n, d)
    diag = torch.ones(*batch, n, dtype=k.dtype, device=k.device)  # kappa(x, x) = 1
    scores = approximate_ridge_leverage_scores(key_columns, diag, pilot, lam)
    columns = sketch.ridge_leverage_columns(scores, d, generator=generator, replace=False)
    return columns, {"pilot_columns": pilot, "ridge_leverage_scores": scores, "ridge_lambda": lam}


@method("nystrom", target="softmax", features="sampled columns (landmarks) d")
def nystrom(
    q,
    k,
    v,
    *,
    num_features,
    generator=None,
    sampling="uniform",
    columns=None,
    ridge_lambda=None,
):
    r"""Nyström approximation :math:`A_{:,S}A_{SS}^+A_{S,:}` of the raw scores, row-normalised.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (``A`` must be square).
    num_features : int
        ``d``, the number of landmark tokens, ``1 <= d <= n``.
    generator : torch.Generator, optional
        CPU generator for the sample.
    sampling : {"uniform", "ridge-leverage"}
        ``"uniform"`` (default): ``d`` distinct tokens uniformly. ``"ridge-leverage"``: ``d``
        distinct tokens drawn with probability proportional to approximate ridge leverage
        scores of the key Gaussian kernel :math:`G = \kappa(K', K')` (PSD, unlike
        :math:`A`), estimated from a uniform pilot sample of ``d`` keys by
        :func:`approxlab.leverage.approximate_ridge_leverage_scores` (unweighted, so an
        over-estimate: :math:`\ell_i \le \tilde\ell_i`).
    columns : torch.Tensor, optional
        ``(d,)`` or ``(*batch, d)`` explicit token indices (``d == num_features``);
        overrides ``sampling``.
    ridge_lambda : float, optional
        :math:`\lambda` of the pilot scores, default :math:`\operatorname{Tr}G/d = n/d`, the
        ridge at which :math:`d_{stat}(G) \le \operatorname{Tr}G/\lambda = d`.

    Returns
    -------
    Approximation
        ``output`` :math:`\tilde D^{-1}\tilde AV`; operator
        ``Diagonal(1/row_sums) @ ProductOperator(left @ core, right)``; ``info``:
        ``columns``, ``core_block`` (:math:`C_{SS} = \kappa(Q_S', K_S')`),
        ``core_condition_number``, ``core_rank``, ``row_sums``, ``min_abs_row_sum``,
        ``num_nonpositive_row_sums`` and, for ``"ridge-leverage"``, ``pilot_columns``,
        ``ridge_leverage_scores``, ``ridge_lambda``.

    Notes
    -----
    Overflow-safe route (shared with ``skyformer-softmax``): with
    :math:`A = D_Q^{1/2}CD_K^{1/2}` (Skyformer Section 4.1),

    .. math::

        \tilde A = D_Q^{1/2}\,C_{:,S}\,C_{SS}^+\,C_{S,:}\,D_K^{1/2},

    which equals :math:`A_{:,S}A_{SS}^+A_{S,:}` whenever :math:`A_{SS}` is invertible
    (:math:`(D_1C_{SS}D_2)^{-1} = D_2^{-1}C_{SS}^{-1}D_1^{-1}`). For a numerically singular
    core the two pseudo-inverses differ; this implementation thresholds the singular values
    of the well-scaled Gaussian core :math:`C_{SS}` (entries in ``(0, 1]``) rather than
    those of :math:`A_{SS}`, whose entries can span :math:`e^{\pm 80}`
    (:func:`approxlab.linalg.stable_pinv`, SVD, ``rcond = d * eps``). Row sums are used
    unclamped; see :func:`approxlab.methods.skyformer.skeleton_attention` for what a non-positive one
    does.

    References
    ----------
    Williams & Seeger (2001); Chen et al. (2021), Skyformer, Section 3.2 and Figure 1;
    Musco & Musco (2017) for ridge-leverage sampling.
    """
    check_choice(sampling, "sampling", SAMPLINGS)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "`q` and `k` must have the same length n for plain Nyström (one index set S for rows "
            f"and columns); got {q.shape[-2]} and {k.shape[-2]}."
        )
    n = k.shape[-2]
    batch = tuple(k.shape[:-2])
    if ridge_lambda is not None:
        ridge_lambda = check_positive_float(ridge_lambda, "ridge_lambda")
    extra_info: dict = {}
    if columns is not None:
        columns = sketch.check_columns(columns, n, batch_shape=batch).to(k.device)
        if num_features is not None and columns.shape[-1] != num_features:
            raise ValueError(
                f"`columns` must hold num_features={num_features} indices when given; got {columns.shape[-1]}."
            )
    else:
        num_features = check_int(num_features, "num_features", low=1, high=n)
        if sampling == "uniform":
            columns = sketch.uniform_columns(n, num_features, batch_shape=batch, generator=generator, device=k.device)
        else:
            columns, extra_info = _ridge_leverage_sample(k, num_features, generator, ridge_lambda)

    skeleton = gaussian_skeleton(q, k, sketch.gather_rows(k, columns), sketch.gather_rows(q, columns), normalized=True)
    core_factors, info = nystrom_core(skeleton.block, core="pinv", hermitian=False)
    output, operator, row_info = skeleton_attention(skeleton, core_factors, v)
    info.update(row_info)
    info.update(extra_info)
    info["columns"] = columns
    return Approximation("nystrom", "softmax", output, operator, info)


NYSTROM = nystrom
