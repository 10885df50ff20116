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
from .._validation import as_generator, check_choice, check_int, check_positive_float
from ..leverage import approximate_ridge_leverage_scores
from ..linalg.cores import nystrom_core
from ._base import Approximation, method
from .draws import DrawEntry, check_draw
from .skyformer import gaussian_skeleton, skeleton_attention

__all__ = ["nystrom", "NYSTROM", "draw_landmarks", "rpcholesky_landmarks", "SAMPLINGS"]

SAMPLINGS = ("uniform", "ridge-leverage", "rpcholesky")


def _pilot_scores(k, pilot, ridge_lambda):
    """Approximate ridge leverage of the key kernel ``kappa(K', K')`` from the pilot columns (see nystrom)."""
    n, d = k.shape[-2], pilot.shape[-1]
    batch = tuple(k.shape[:-2])
    lam = n / d if ridge_lambda is None else ridge_lambda
    key_columns = kernels.kernelized_matrix(k, sketch.gather_rows(k, pilot))  # (*batch, n, d)
    diag = torch.ones(*batch, n, dtype=k.dtype, device=k.device)  # kappa(x, x) = 1
    return approximate_ridge_leverage_scores(key_columns, diag, pilot, lam), lam


def _key_kernel_column(k):
    r"""The column oracle of the key Gaussian kernel :math:`\kappa(K', K')` (for RPCholesky)."""
    def column(pivots):
        return kernels.kernelized_matrix(k.detach(), sketch.gather_rows(k.detach(), pivots.unsqueeze(-1))).squeeze(-1)
    return column


def rpcholesky_landmarks(k, uniforms):
    r"""``d`` landmark tokens: RPCholesky's pivots on the key Gaussian kernel :math:`G = \kappa(K', K')`.

    Algorithm 1 of Chen, Epperly, Tropp and Webber (2024) (:func:`approxlab.sketch.rpcholesky_columns`)
    on :math:`G` (diagonal 1, PSD, unlike the score matrix), from ``uniforms`` ``(*batch, d)``: ``(*batch, d)``
    int64, :math:`nd` kernel entries.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.nystrom import rpcholesky_landmarks
    >>> g = torch.Generator().manual_seed(0)
    >>> k = torch.randn(2, 10, 4, generator=g, dtype=torch.float64)
    >>> rpcholesky_landmarks(k, torch.rand(2, 3, generator=g, dtype=torch.float64)).shape
    torch.Size([2, 3])
    """
    diagonal = torch.ones(k.shape[:-1], dtype=torch.float64, device=k.device)
    return sketch.rpcholesky_columns(diagonal, _key_kernel_column(k), uniforms.shape[-1], uniforms=uniforms)


def draw_landmarks(q, k, *, num_features, generator=None, sampling="uniform", ridge_lambda=None):
    r"""The random draw of :func:`nystrom`: ``d`` distinct landmark tokens (and the pilot sample).

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` each (plain Nyström needs a square score matrix).
    num_features : int
        ``d``, ``1 <= d <= n``.
    generator : torch.Generator, optional
        CPU generator.
    sampling, ridge_lambda
        As for :func:`nystrom`.

    Returns
    -------
    dict
        ``{"columns": (*batch, d) int64}`` in ``[0, n)``, on ``k.device``: a uniformly random
        ``d``-subset (``"uniform"``), or ``d`` distinct tokens drawn successively with probability
        proportional to approximate ridge leverage scores (``"ridge-leverage"``, which also returns
        the uniform pilot sample ``"pilot_columns"`` ``(*batch, d)`` the scores came from); with
        ``"rpcholesky"``, ``{"pivot_uniforms": (*batch, d) float64}`` in ``[0, 1)``, the uniforms of the
        pivot choices (the pivots depend on the keys; :func:`rpcholesky_landmarks`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.nystrom import draw_landmarks
    >>> q = k = torch.randn(2, 10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> draw_landmarks(q, k, num_features=3, generator=torch.Generator().manual_seed(1))["columns"].shape
    torch.Size([2, 3])
    >>> sorted(draw_landmarks(q, k, num_features=3, sampling="ridge-leverage", generator=torch.Generator().manual_seed(1)))
    ['columns', 'pilot_columns']
    """
    check_choice(sampling, "sampling", SAMPLINGS)
    n, batch = k.shape[-2], tuple(k.shape[:-2])
    num_features = check_int(num_features, "num_features", low=1, high=n)
    if ridge_lambda is not None:
        ridge_lambda = check_positive_float(ridge_lambda, "ridge_lambda")
    if sampling == "rpcholesky":
        uniforms = torch.rand(*batch, num_features, generator=as_generator(generator), dtype=torch.float64)
        return {"pivot_uniforms": uniforms.to(k.device)}
    pilot = sketch.uniform_columns(n, num_features, batch_shape=batch, generator=generator, device=k.device)
    if sampling == "uniform":
        return {"columns": pilot}
    scores, _ = _pilot_scores(k, pilot, ridge_lambda)
    columns = sketch.ridge_leverage_columns(scores, num_features, generator=generator, replace=False)
    return {"pilot_columns": pilot, "columns": columns}


def _landmark_layout(k, num_features, sampling) -> dict:
    shape, n = (*k.shape[:-2], num_features), k.shape[-2]
    if sampling == "rpcholesky":
        return {"pivot_uniforms": DrawEntry(shape, "(*batch, d)")}
    layout = {"columns": DrawEntry(shape, "(*batch, d)", high=n)}
    if sampling == "ridge-leverage":
        layout["pilot_columns"] = DrawEntry(shape, "(*batch, d)", high=n)
    return layout


@method("nystrom", target="softmax", features="sampled columns (landmarks) d", draw=draw_landmarks,
        causal="mask-renormalise", differentiable=True)
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
    draw=None,
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
    sampling : {"uniform", "ridge-leverage", "rpcholesky"}
        ``"uniform"`` (default): ``d`` distinct tokens uniformly. ``"ridge-leverage"``: ``d``
        distinct tokens drawn with probability proportional to approximate ridge leverage
        scores of the key Gaussian kernel :math:`G = \kappa(K', K')` (PSD, unlike
        :math:`A`), estimated from a uniform pilot sample of ``d`` keys by
        :func:`approxlab.leverage.approximate_ridge_leverage_scores` (unweighted, so an
        over-estimate: :math:`\ell_i \le \tilde\ell_i`). ``"rpcholesky"``: the ``d`` pivots of
        randomly pivoted Cholesky on the same :math:`G` (Algorithm 1 of Chen, Epperly, Tropp and
        Webber 2024; :func:`rpcholesky_landmarks`), each drawn with probability proportional to the
        diagonal of the current Nyström residual of :math:`G`.
    columns : torch.Tensor, optional
        ``(d,)`` or ``(*batch, d)`` explicit token indices (``d == num_features``);
        overrides ``sampling``.
    ridge_lambda : float, optional
        :math:`\lambda` of the pilot scores, default :math:`\operatorname{Tr}G/d = n/d`, the
        ridge at which :math:`d_{stat}(G) \le \operatorname{Tr}G/\lambda = d`.
    draw : dict, optional
        The draw of :func:`draw_landmarks` (``approxlab.methods.draw``), used instead of
        ``generator``: ``{"columns": (*batch, d)}`` int64 in ``[0, n)`` (plus ``"pilot_columns"``
        ``(*batch, d)`` with ``"ridge-leverage"``; ``{"pivot_uniforms": (*batch, d)}`` float64 with
        ``"rpcholesky"``). The same draw gives the same output bit for bit.
        Exclusive with ``columns``.

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

    **Draw.** Williams & Seeger sample landmarks uniformly; here ``d`` distinct tokens, one set
    for rows and columns (:func:`draw_landmarks`).

    References
    ----------
    Williams & Seeger (2001); Chen et al. (2021), Skyformer, Section 3.2 and Figure 1;
    Musco & Musco (2017) for ridge-leverage sampling.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> approx = approxlab.approximate("nystrom", q, k, v, num_features=32)  # every token a landmark: exact
    >>> bool((spectral_error(approx.output, exact, relative=True) < 1e-12).all())
    True
    >>> approx = approxlab.approximate("nystrom", q, k, v, num_features=8, generator=torch.Generator().manual_seed(1))
    >>> [e > 10 for e in spectral_error(approx.output, exact, relative=True).tolist()]  # no PSD structure: it can blow up
    [True, True]
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
        if draw is not None:
            raise ValueError("pass at most one of `columns` and `draw`; got both.")
        columns = sketch.check_columns(columns, n, batch_shape=batch, num_features=num_features).to(k.device)
    else:
        if draw is None:
            draw = draw_landmarks(q, k, num_features=num_features, generator=generator, sampling=sampling,
                                  ridge_lambda=ridge_lambda)
        else:
            draw = check_draw("nystrom", draw, _landmark_layout(k, num_features, sampling), device=k.device)
        columns = draw["columns"] if sampling != "rpcholesky" else rpcholesky_landmarks(k, draw["pivot_uniforms"])
        if sampling == "ridge-leverage":
            scores, lam = _pilot_scores(k, draw["pilot_columns"], ridge_lambda)
            extra_info = {"pilot_columns": draw["pilot_columns"], "ridge_leverage_scores": scores,
                          "ridge_lambda": lam}

    skeleton = gaussian_skeleton(q, k, sketch.gather_rows(k, columns), sketch.gather_rows(q, columns), normalized=True)
    core_factors, info = nystrom_core(skeleton.block, core="pinv", hermitian=False)
    output, operator, row_info = skeleton_attention(skeleton, core_factors, v)
    info.update(row_info)
    info.update(extra_info)
    info["columns"] = columns
    return Approximation("nystrom", "softmax", output, operator, info)


NYSTROM = nystrom
__test__ = {"nystrom": nystrom.function}  # doctest skips a MethodSpec: run its function's examples
