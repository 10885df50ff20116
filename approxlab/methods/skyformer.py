r"""Skyformer: Nyström on the PSD completion of the scores (Skyformer Eqs. (4)-(6)).

Both registry entries are this one computation on the completion :math:`X = [Q; K]`:

* ``skyformer`` (here) approximates kernelized attention :math:`CV`,
  :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Eq. (3) of Skyformer);
* ``skyformer-softmax`` (:mod:`approxlab.methods.skyformer_softmax`) approximates softmax
  attention from the same skeleton with the row and key rescaling of Lemma 1, then
  normalises the rows (the "Skyformer" curve of Figure 1).

``num_features`` is the number ``d`` of sampled columns of the ``2n x 2n`` completion,
``1 <= d <= 2n``. The skeleton helpers here (:func:`gaussian_skeleton`,
:func:`skeleton_attention`) are shared with :mod:`approxlab.methods.nystrom`.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import kernels, sketch
from .._validation import as_generator, check_choice, check_int
from ..linalg.cores import (DEFAULT_CORE, DEFAULT_GAMMA, DEFAULT_INIT, DEFAULT_NUM_ITER, CoreFactors,
                            check_core_options, nystrom_core)
from ..operators import DiagonalOperator, ProductOperator
from ._base import Approximation, method
from ._masking import check_key_mask, mask_columns, query_mask
from .draws import DrawEntry, check_draw

__all__ = [
    "SAMPLINGS",
    "draw_completion_columns",
    "rpcholesky_completion_columns",
    "completion_landmarks",
    "Skeleton",
    "gaussian_skeleton",
    "skeleton_attention",
    "completion_nystrom",
    "skyformer",
    "SKYFORMER",
]


# -- skeletons of attention score matrices -------------------------------------------------


SAMPLINGS = ("uniform", "rpcholesky")
"""How ``skyformer`` and ``skyformer-softmax`` choose the ``d`` columns of the completion."""


def draw_completion_columns(q, k, *, num_features, generator=None, key_mask=None, sampling="uniform"):
    r"""Skyformer's random draw: ``d`` distinct rows of the completion's :math:`X = [Q; K]`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``.
    num_features : int
        ``d``, ``1 <= d <= n + m``.
    generator : torch.Generator, optional
        CPU generator: one uniformly random ``d``-subset per batch element
        (:func:`approxlab.sketch.uniform_columns`, without replacement).
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on real keys: the rows are drawn among the real rows of
        :math:`[Q; K]` only (:func:`approxlab.sketch.uniform_real_columns`; real keys, and real
        queries in self-attention; every real row, some repeated, when there are fewer than ``d``).
    sampling : {"uniform", "rpcholesky"}
        ``"rpcholesky"``: the draw is the ``d`` uniforms of RPCholesky's pivot choices
        (:func:`rpcholesky_completion_columns`); the pivots depend on the data, so the method computes
        them from the uniforms (and reports them in ``info["columns"]``).

    Returns
    -------
    dict
        ``{"columns": (*batch, d) int64}`` on ``q.device``, indices into ``range(n + m)``: row
        ``i < n`` is query ``i``, row ``n + j`` key ``j``; with ``"rpcholesky"``,
        ``{"pivot_uniforms": (*batch, d) float64}`` in ``[0, 1)``.

    Notes
    -----
    Skyformer's analysis (Definition 1, Theorem 2) samples with replacement, with the weight
    :math:`1/\sqrt d` that leaves a Nyström approximation unchanged; distinct columns waste
    no budget on repeats. A draw with repeats can be handed back and changes nothing.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.skyformer import draw_completion_columns
    >>> q = k = torch.zeros(2, 5, 4, dtype=torch.float64)
    >>> columns = draw_completion_columns(q, k, num_features=3, generator=torch.Generator().manual_seed(0))["columns"]
    >>> columns.shape, bool(((0 <= columns) & (columns < 10)).all())  # rows of [Q; K]: 5 queries, 5 keys
    (torch.Size([2, 3]), True)
    """
    total = q.shape[-2] + k.shape[-2]
    num_features = check_int(num_features, "num_features", low=1, high=total)
    check_choice(sampling, "sampling", SAMPLINGS)
    batch = tuple(q.shape[:-2])
    if sampling == "rpcholesky":
        uniforms = torch.rand(*batch, num_features, generator=as_generator(generator), dtype=torch.float64)
        return {"pivot_uniforms": uniforms.to(q.device)}
    rows = _landmark_row_mask(check_key_mask(key_mask, k), q, k)
    if rows is not None:
        return {"columns": sketch.uniform_real_columns(rows.expand(*batch, total), num_features, generator=generator,
                                                       device=q.device)}
    return {"columns": sketch.uniform_columns(total, num_features, batch_shape=batch, generator=generator,
                                              device=q.device)}


def _completion_draw_layout(q, k, num_features, sampling="uniform") -> dict:
    total = q.shape[-2] + k.shape[-2]
    if sampling == "rpcholesky":
        return {"pivot_uniforms": DrawEntry((*q.shape[:-2], num_features), "(*batch, d)")}
    return {"columns": DrawEntry((*q.shape[:-2], num_features), "(*batch, d)", high=total)}


def rpcholesky_completion_columns(q, k, uniforms, *, normalized, key_mask=None):
    r"""``d`` rows of :math:`X = [Q; K]` chosen by RPCholesky on the PSD kernel Skyformer samples.

    Algorithm 1 of Chen, Epperly, Tropp and Webber (2024) (:func:`approxlab.sketch.rpcholesky_columns`,
    :math:`(n + m)d` kernel entries) from ``uniforms`` ``(*batch, d)`` in ``[0, 1)``, on the Gaussian
    completion :math:`\bar C = \kappa(X', X')` (Eq. (4), diagonal 1; ``normalized=False``, ``skyformer``)
    or on the score completion :math:`\bar A = \bar D^{1/2}\bar C\bar D^{1/2}` (Lemma 1;
    ``normalized=True``, ``skyformer-softmax``), evaluated as :math:`e^{-2\max\ell}\bar A`, entries
    :math:`w_i\bar C_{ij}w_j`, :math:`w_i = e^{\ell_i - \max\ell} \le 1`, :math:`\ell_i = \|x_i\|^2/(2\sqrt p)`
    (a constant factor changes no pivot probability, and nothing overflows). With ``key_mask`` only real
    rows can be pivots. Returns ``(*batch, d)`` int64 pivots in ``range(n + m)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.skyformer import rpcholesky_completion_columns
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 6, 4, generator=g, dtype=torch.float64), torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    >>> columns = rpcholesky_completion_columns(q, k, torch.rand(2, 3, generator=g, dtype=torch.float64), normalized=True)
    >>> columns.shape, all(len(set(row.tolist())) == 3 for row in columns)
    (torch.Size([2, 3]), True)
    """
    x = torch.cat([q, k], dim=-2).detach().to(torch.float64)
    rows = _landmark_row_mask(check_key_mask(key_mask, k), q, k)
    log_scale = x.new_zeros(x.shape[:-1])
    if normalized:
        log_scale = kernels.log_diag_scale(x)
        peak = log_scale if rows is None else log_scale.masked_fill(~rows, float("-inf"))
        log_scale = log_scale - peak.amax(-1, keepdim=True)
    scale = log_scale.exp()
    diagonal = scale.square() if rows is None else scale.square() * rows.to(scale.dtype)

    def column(pivots):
        pivot_rows = sketch.gather_rows(x, pivots.unsqueeze(-1))  # (*batch, 1, p)
        values = kernels.kernelized_matrix(x, pivot_rows).squeeze(-1)
        return values * scale * torch.gather(scale, -1, pivots.unsqueeze(-1))

    return sketch.rpcholesky_columns(diagonal, column, uniforms.shape[-1], uniforms=uniforms)


def completion_landmarks(q, k, num_features, *, generator=None, columns=None, key_mask=None):
    r"""Landmark rows :math:`X_S` of the completion's :math:`X = [Q; K]`, and their indices ``S``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)`` raw queries and keys.
    num_features : int or None
        ``d``, ``1 <= d <= n + m``; may be ``None`` when ``columns`` is given.
    generator : torch.Generator, optional
        CPU generator for :func:`approxlab.sketch.uniform_columns` (``d`` distinct indices per batch element).
    columns : torch.Tensor, optional
        Explicit ``(d,)`` or ``(*batch, d)`` indices into ``range(n + m)`` (validated with
        :func:`approxlab.sketch.check_columns`; ``d`` must equal ``num_features`` when both are given).
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on real keys: the draw is among real rows only
        (:func:`draw_completion_columns`), and explicit ``columns`` must index real rows.

    Returns
    -------
    landmarks : torch.Tensor
        ``(*batch, d, p)``, raw (unscaled) rows of :math:`[Q; K]`.
    columns : torch.Tensor
        ``(*batch, d)`` ``int64`` on ``q.device``.

    Notes
    -----
    Row ``i < n`` of :math:`X` is query ``i``; row ``n + j`` is key ``j`` (Eq. (4) of Skyformer).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.skyformer import completion_landmarks
    >>> q, k = torch.zeros(4, 2, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64)
    >>> landmarks, columns = completion_landmarks(q, k, None, columns=torch.tensor([0, 5]))
    >>> landmarks  # row 0 of [Q; K] is query 0, row 5 is key 1
    tensor([[0., 0.],
            [1., 1.]], dtype=torch.float64)
    """
    x = torch.cat([q, k], dim=-2)
    total = x.shape[-2]
    batch = tuple(x.shape[:-2])
    if columns is None:
        columns = draw_completion_columns(q, k, num_features=num_features, generator=generator,
                                          key_mask=key_mask)["columns"]
    else:
        columns = sketch.check_columns(columns, total, batch_shape=batch, num_features=num_features)
        rows = _landmark_row_mask(check_key_mask(key_mask, k), q, k)
        if rows is not None and not bool(torch.gather(rows.expand(*batch, total), -1, columns.to(rows.device)).all()):
            raise ValueError("`columns` (or `draw['columns']`) must index real (unmasked) rows of [Q; K] when "
                             "`key_mask` is given; got an index of a padded row (draw with the same key_mask).")
    columns = columns.to(x.device)
    return sketch.gather_rows(x, columns), columns


@dataclasses.dataclass
class Skeleton:
    r"""The three sampled blocks of a Nyström-type approximation ``left @ core^+ @ right``.

    Attributes
    ----------
    left : torch.Tensor
        ``(*batch, n, d)``.
    block : torch.Tensor
        ``(*batch, d, d)``, the sampled core (before any inversion).
    right : torch.Tensor
        ``(*batch, d, m)``.
    normalized : bool
        ``True`` when the blocks are the row- and key-rescaled ones of a softmax target (see
        :func:`gaussian_skeleton`); the approximation is then only meaningful after row
        normalisation.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.skyformer import gaussian_skeleton
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    >>> skeleton = gaussian_skeleton(q, k, q[:2], q[:2], normalized=False)
    >>> skeleton.left.shape, skeleton.block.shape, skeleton.right.shape
    (torch.Size([6, 2]), torch.Size([2, 2]), torch.Size([2, 5]))
    """

    left: torch.Tensor
    block: torch.Tensor
    right: torch.Tensor
    normalized: bool


def gaussian_skeleton(
    q: torch.Tensor,
    k: torch.Tensor,
    left_landmarks: torch.Tensor,
    right_landmarks: torch.Tensor,
    *,
    normalized: bool,
    key_mask: torch.Tensor | None = None,
) -> Skeleton:
    r"""Blocks :math:`\kappa(Q', Y_L)`, :math:`\kappa(Y_R, Y_L)`, :math:`\kappa(Y_R, K')` of the Gaussian kernel.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` queries, ``(*batch, m, p)`` keys (raw, not scaled).
    left_landmarks : torch.Tensor
        ``(*batch, d, p)`` rows :math:`Y_L` (raw): the columns of the left block.
    right_landmarks : torch.Tensor
        ``(*batch, d, p)`` rows :math:`Y_R` (raw): the rows of the right block.
    normalized : bool
        ``False``: the exact blocks of :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer
        Eq. (3)), for a kernelized target. ``True``: blocks of the raw scores
        :math:`A = D_Q^{1/2} C D_K^{1/2}` (Lemma 1 / Section 4.1) with every factor that
        cancels in :math:`\tilde D^{-1}\tilde A` removed (see Notes), for a softmax target.
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on real keys: the largest :math:`D_K^{1/2}` of ``normalized``
        is taken over real keys only (the masked keys' columns are zeroed by the caller).

    Returns
    -------
    Skeleton
        The primes denote :math:`X' = X/p^{1/4}`; the core block is always
        :math:`\kappa(Y_R', Y_L')`.

    Notes
    -----
    With :math:`\ell(x) = \|x\|^2/(2\sqrt p)` (:func:`approxlab.kernels.log_diag_scale`),
    :math:`\log\kappa(x', y') = x^\top y/\sqrt p - \ell(x) - \ell(y)`. For
    ``normalized=True`` the approximation :math:`\tilde A = D_Q^{1/2}\,L\,M^+R\,D_K^{1/2}` is
    only used through :math:`\tilde D^{-1}\tilde A`, :math:`\tilde D = \operatorname{diag}(\tilde A\mathbf 1)`,
    which is unchanged by (i) any positive diagonal scaling of the rows of :math:`\tilde A`
    and (ii) any positive scalar factor. So we return

    * ``left`` :math:`= \exp(\log L_{is} + \ell(q_i) - \max_s(\log L_{is} + \ell(q_i)))`,
      each row's largest entry 1 (removes :math:`D_Q^{1/2}` and prevents a query far from
      every landmark from underflowing to a zero row);
    * ``right`` :math:`= R\,D_K^{1/2}/\max_j (D_K^{1/2})_{jj}`, computed as one exponent
      :math:`\exp(y^\top k_j/\sqrt p - \ell(y) - \max_j \ell(k_j)) \le 1`.

    No factor exceeds 1, so nothing overflows even for float32 logits of :math:`\pm 80`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import kernelized_matrix
    >>> from approxlab.methods.skyformer import gaussian_skeleton
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    >>> x = torch.cat([q, k])  # all rows of the completion as landmarks: the blocks are C's own
    >>> skeleton = gaussian_skeleton(q, k, x, x, normalized=False)
    >>> approx = skeleton.left @ torch.linalg.pinv(skeleton.block) @ skeleton.right
    >>> bool(torch.allclose(approx, kernelized_matrix(q, k)))
    True
    """
    if normalized:  # in place where autograd allows: each new (n, d) array costs a page-faulting allocation
        log_left = kernels.scaled_logits(q, left_landmarks).sub_(kernels.log_diag_scale(left_landmarks).unsqueeze(-2))
        left = (log_left - log_left.amax(-1, keepdim=True)).exp_()  # amax keeps log_left for its gradient
        key_scale = kernels.log_diag_scale(k)
        if key_mask is not None:  # the largest real key sets the scale; padded keys' columns are zeroed
            key_scale = key_scale.masked_fill(~key_mask, float("-inf"))
        log_right = (
            kernels.scaled_logits(right_landmarks, k)
            .sub_(kernels.log_diag_scale(right_landmarks).unsqueeze(-1))
            .sub_(key_scale.amax(-1, keepdim=True).unsqueeze(-1))
        )
        right = log_right.clamp_max_(0.0).exp_()
    else:
        left = kernels.kernelized_matrix(q, left_landmarks)
        right = kernels.kernelized_matrix(right_landmarks, k)
    block = kernels.kernelized_matrix(right_landmarks, left_landmarks)
    return Skeleton(left, block, right, normalized)


def skeleton_attention(skeleton: Skeleton, core: CoreFactors, v: torch.Tensor):
    r"""Output, operator and row-sum diagnostics of ``left @ core @ right``, never ``n x m``.

    Parameters
    ----------
    skeleton : Skeleton
        From :func:`gaussian_skeleton`.
    core : CoreFactors
        From :func:`approxlab.linalg.nystrom_core`.
    v : torch.Tensor
        ``(*batch, m, p_v)`` values.

    Returns
    -------
    output : torch.Tensor
        ``(*batch, n, p_v)``: ``(left @ first) @ ((second @ right) @ v)``, divided row-wise by
        the approximate row sums :math:`\tilde A\mathbf 1` when ``skeleton.normalized``.
    operator : LinearOperator
        ``ProductOperator(left @ first, second @ right)`` (the core folded into the two
        outer ``n x d`` / ``d x m`` factors, see :class:`CoreFactors`), preceded by
        ``DiagonalOperator(1 / row_sums)`` when normalized.
    info : dict
        When normalized: ``row_sums`` ``(*batch, n)`` (in the rescaled units of
        :func:`gaussian_skeleton`: each row of ``left`` has largest entry 1),
        ``min_abs_row_sum`` ``(*batch,)`` and ``num_nonpositive_row_sums`` ``(*batch,)``.

    Notes
    -----
    The approximate row sums :math:`\tilde D = \tilde A\mathbf 1` of a Nyström
    approximation are *not* guaranteed positive: :math:`\tilde A` has negative entries in
    general. They are used as they are, never clamped: a negative row sum flips the sign of
    that output row, and a zero row sum makes it ``inf``/``NaN``, which
    :func:`approxlab.approximate` reports as a ``FloatingPointError``. Studies read
    ``min_abs_row_sum`` and ``num_nonpositive_row_sums`` to see how close a sample came.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import kernelized_matrix
    >>> from approxlab.linalg import nystrom_core
    >>> from approxlab.methods.skyformer import gaussian_skeleton, skeleton_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    >>> x = torch.cat([q, k])
    >>> skeleton = gaussian_skeleton(q, k, x, x, normalized=False)
    >>> output, operator, info = skeleton_attention(skeleton, nystrom_core(skeleton.block)[0], v)
    >>> bool(torch.allclose(output, kernelized_matrix(q, k) @ v)), operator.shape
    (True, (8, 8))
    """
    left = skeleton.left @ core.first
    right = skeleton.right if core.second is None else core.second @ skeleton.right
    numerator = left @ (right @ v)
    info: dict = {}
    if not skeleton.normalized:
        return numerator, ProductOperator(left, right), info
    row_sums = (left @ right.sum(-1, keepdim=True)).squeeze(-1)
    info["row_sums"] = row_sums
    info["min_abs_row_sum"] = row_sums.abs().amin(-1)
    info["num_nonpositive_row_sums"] = (row_sums <= 0).sum(-1)
    operator = ProductOperator(DiagonalOperator(1.0 / row_sums), left, right)
    return numerator / row_sums.unsqueeze(-1), operator, info


# -- the method ----------------------------------------------------------------------------


def _landmark_row_mask(key_mask, q, k):
    r"""``(*batch, n + m)`` bool: the rows of :math:`[Q; K]` that may be landmarks, or ``None``.

    Real keys, and real queries in self-attention (:func:`approxlab.methods._masking.query_mask`;
    every query when ``n != m``). So real rows' outputs do not depend on padded rows: the
    landmarks, the core and the left block of a real query are made of real rows only, as in
    Skyformer's published code, which samples among the first ``mask.sum()`` rows of ``Q`` and
    of ``K`` (pkuzengqi/Skyformer, ``attention_skyformer.py``, ``uniform_sketching``).
    """
    if key_mask is None:
        return None
    rows_q = query_mask(key_mask, q, k)
    if rows_q is None:
        rows_q = torch.ones(q.shape[-2], dtype=torch.bool, device=key_mask.device)
    batch = torch.broadcast_shapes(key_mask.shape[:-1], rows_q.shape[:-1])
    return torch.cat([rows_q.expand(*batch, q.shape[-2]), key_mask.expand(*batch, k.shape[-2])], dim=-1)


def completion_nystrom(
    q,
    k,
    v,
    *,
    num_features,
    normalized,
    generator,
    core,
    gamma,
    num_iter,
    init,
    columns,
    key_mask,
    draw=None,
    diagnostics=True,
    sampling="uniform",
):
    r"""The one body of ``skyformer`` (``normalized=False``) and ``skyformer-softmax`` (``True``).

    Parameters are those of :func:`skyformer`; ``normalized`` selects the skeleton of
    :func:`gaussian_skeleton` (and with it the target and the registry name of the result).
    ``key_mask`` ``(*batch, m)`` bool (True on keys to attend) zeroes the masked keys' columns
    of the right block, so they get zero weight (and, normalised, leave the row sums), and the
    landmarks are drawn from the real rows of :math:`[Q; K]` only (:func:`_landmark_row_mask`).
    ``draw``: ``{"columns": (*batch, d)}`` from :func:`draw_completion_columns` (exclusive with
    ``columns``; with ``key_mask``, its columns must index real rows), or ``{"pivot_uniforms": (*batch, d)}``
    with ``sampling="rpcholesky"`` (:func:`rpcholesky_completion_columns`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.skyformer import completion_nystrom
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 16, 4, generator=torch.Generator().manual_seed(0))
    >>> approx = completion_nystrom(q, k, v, num_features=8, normalized=True, generator=torch.Generator().manual_seed(1),
    ...                             core="pinv", gamma=0.1, num_iter=6, init="identity", columns=None, key_mask=None)
    >>> approx.method, approx.target, approx.output.shape
    ('skyformer-softmax', 'softmax', torch.Size([2, 16, 4]))
    """
    check_core_options(core=core, gamma=gamma, num_iter=num_iter, init=init)
    check_choice(sampling, "sampling", SAMPLINGS)
    key_mask = check_key_mask(key_mask, k)
    uniforms = None
    if draw is not None:
        if columns is not None:
            raise ValueError("pass at most one of `columns` and `draw`; got both.")
        name = "skyformer-softmax" if normalized else "skyformer"
        checked = check_draw(name, draw, _completion_draw_layout(q, k, num_features, sampling), device=q.device)
        columns, uniforms = checked.get("columns"), checked.get("pivot_uniforms")
    if columns is None and sampling == "rpcholesky":
        if uniforms is None:
            uniforms = draw_completion_columns(q, k, num_features=num_features, generator=generator,
                                               sampling=sampling)["pivot_uniforms"]
        columns = rpcholesky_completion_columns(q, k, uniforms, normalized=normalized, key_mask=key_mask)
    landmarks, columns = completion_landmarks(q, k, num_features, generator=generator, columns=columns,
                                              key_mask=key_mask)
    skeleton = gaussian_skeleton(q, k, landmarks, landmarks, normalized=normalized, key_mask=key_mask)
    skeleton.right = mask_columns(skeleton.right, key_mask)
    core_factors, info = nystrom_core(skeleton.block, core=core, gamma=gamma, num_iter=num_iter, init=init,
                                      diagnostics=diagnostics)
    output, operator, extra = skeleton_attention(skeleton, core_factors, v)
    info.update(extra)
    info["columns"] = columns
    if normalized:
        return Approximation("skyformer-softmax", "softmax", output, operator, info)
    return Approximation("skyformer", "kernelized", output, operator, info)


@method(
    "skyformer",
    target="kernelized",
    features="sampled columns d of the 2n x 2n completion (Eq. (5))",
    max_features=lambda n, m: n + m,
    draw=draw_completion_columns,
    differentiable=True,
)
def skyformer(q, k, v, *, num_features, generator=None, core=DEFAULT_CORE, gamma=DEFAULT_GAMMA,
              num_iter=DEFAULT_NUM_ITER, init=DEFAULT_INIT, columns=None, key_mask=None, draw=None,
              diagnostics=True, sampling="uniform"):
    r"""Skyformer's modified Nyström approximation of kernelized attention :math:`CV`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        ``d``, sampled columns of the completion, ``1 <= d <= n + m``.
    generator : torch.Generator, optional
        CPU generator for the column sample.
    core : {"pinv", "schulz"}
        ``"pinv"`` (default): the exact, rank-thresholded pseudo-inverse of
        :math:`M = S^\top\bar CS` (Eq. (5); what Theorem 2 bounds and what Figure 1 plots).
        ``"schulz"``: the paper's practical core (Section 4.4, Lemma 3),
        :math:`(M+\gamma I)^{-1}` by ``num_iter`` Schulz steps on
        :math:`D_M^{-1/2}(M+\gamma I)D_M^{-1/2}`; see :func:`approxlab.linalg.nystrom_core`.
    gamma : float
        :math:`\gamma > 0` for ``core="schulz"`` (default 0.1).
    num_iter : int
        Schulz iterations for ``core="schulz"`` (default 6).
    init : {"identity", "nystromformer", "official"}
        Schulz start for ``core="schulz"``; ``"identity"`` (default) converges by Lemma 3.
    columns : torch.Tensor, optional
        ``(d,)`` or ``(*batch, d)`` explicit indices into the ``n + m`` rows of
        :math:`[Q; K]` (``d`` must equal ``num_features``); no random draw then.
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys to attend: masked keys get zero weight, and the ``d``
        columns are drawn among the real rows of :math:`[Q; K]` only, per batch element (real
        keys, and real queries when ``n == m``; every real row, some repeated, when there are
        fewer than ``d``): real rows' outputs do not depend on padded rows at all
        (:mod:`approxlab.methods._masking`).
    draw : dict, optional
        ``{"columns": (*batch, d) int64}`` in ``[0, n + m)``, the draw of
        :func:`draw_completion_columns` (``approxlab.methods.draw``), used instead of ``generator``:
        the same draw gives the same output bit for bit. Exclusive with ``columns``.
    diagnostics : bool
        ``False``: leave out the ``"schulz"`` core's ``core_condition_number`` and ``core_rank``
        (an eigendecomposition the approximation does not need; how training calls it).
    sampling : {"uniform", "rpcholesky"}
        ``"uniform"`` (default): ``d`` distinct rows uniformly. ``"rpcholesky"``: ``d`` pivots of
        randomly pivoted Cholesky on the completion :math:`\bar C` itself (Algorithm 1 of Chen, Epperly,
        Tropp and Webber 2024; :func:`rpcholesky_completion_columns`): each pivot drawn with probability
        proportional to the diagonal of the current Nyström residual, :math:`(n + m)d` kernel entries; the
        draw is then ``{"pivot_uniforms": (*batch, d)}``.

    Returns
    -------
    Approximation
        ``output`` :math:`\tilde CV`, operator ``ProductOperator(left @ core, right)`` (see
        :func:`skeleton_attention`);
        ``info``: ``columns`` ``(*batch, d)``, ``core_block`` :math:`M`,
        ``core_condition_number``, ``core_rank`` (and Schulz residuals for ``"schulz"``).

    Notes
    -----
    With :math:`X = [Q; K]/p^{1/4}` (``2n x p``), :math:`\bar C = \kappa(X, X)` is PSD
    (Eq. (4)) and

    .. math::

        \tilde C = (I, 0)\,\bar CS(S^\top\bar CS)^+S^\top\bar C\,(0, I)^\top
                 = \kappa(Q', X_S)\,M^+\,\kappa(X_S, K')   \qquad \text{(Eqs. (5)-(6))},

    computed as ``(left @ core) @ (right @ v)`` (core kept factored) in :math:`O(ndp + nd\,p_v + d^3)`, never
    ``n x n``. By Appendix D, :math:`\|C - \tilde C\| \le \|\bar C - \tilde{\bar C}\|`, and
    Theorem 2 bounds the latter by :math:`\lambda` once ``d`` exceeds
    :math:`\tfrac{28}{3}\,\tfrac{2d_{stat}}{\beta}\log\tfrac{4n}{\delta}` (uniform columns).
    **Draw.** ``d`` distinct rows of :math:`[Q;K]`, uniformly (the paper's Definition 1 samples
    with replacement; repeats waste budget and change nothing when passed explicitly):
    ``{"columns": (*batch, d)}`` (:func:`draw_completion_columns`).

    References
    ----------
    Chen et al. (2021), Skyformer, Eqs. (3)-(6), Theorem 2, Lemma 3, Section 4.4.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.kernels import kernelized_matrix
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = kernelized_matrix(q, k) @ v  # the target: kernelized attention CV
    >>> for d in (8, 16, 64):  # d = 2n = 64 samples the whole completion: exact
    ...     approx = approxlab.approximate("skyformer", q, k, v, num_features=d, generator=torch.Generator().manual_seed(1))
    ...     print(d, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    8 [0.63, 0.6]
    16 [0.55, 0.34]
    64 [0.0, 0.0]
    """
    return completion_nystrom(q, k, v, num_features=num_features, normalized=False, generator=generator, core=core,
                              gamma=gamma, num_iter=num_iter, init=init, columns=columns, key_mask=key_mask,
                              draw=draw, diagnostics=diagnostics, sampling=sampling)


SKYFORMER = skyformer
__test__ = {"skyformer": skyformer.function}  # doctest skips a MethodSpec: run its function's examples
