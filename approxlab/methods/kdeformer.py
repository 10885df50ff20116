r"""KDEformer (Zandieh, Han, Daliri and Karbasi, ICML 2023), as its practical algorithm runs.

Softmax attention from the sortLSH blocks (:mod:`approxlab.sortlsh`), computed exactly, plus a sample
of the remaining columns drawn by the norms of the values. ``num_features`` is the number :math:`m` of
sampled columns; ``block_size`` (default :math:`\lfloor m/2\rfloor`, the GloVe demo's
``Bucket_size=num_feats // 2``) and ``bits`` set sortLSH.
"""

from __future__ import annotations

import torch

from .. import sketch, sortlsh
from .._validation import as_generator, check_choice, check_int
from ._base import Approximation, method
from ._masking import check_key_mask, query_mask
from ._sampled_blocks import (Piece, block_logits, check_uniform_draw, logits_at, operator_from_pieces,
                              piece_output, uniform_entry, value_weights)

__all__ = ["kdeformer", "KDEFORMER", "draw_kdeformer", "sampling_weights", "SAMPLINGS", "WEIGHTS"]

SAMPLINGS = ("value-norms", "augmented")

WEIGHTS = ("norm", "code")
r"""The residual columns' weights: ``"norm"`` :math:`\|v_j\|/\|V\|_2 + 1/m_k` (unchanged when :math:`V` is scaled);
``"code"`` :math:`\|v_j\|/\|V\|_2^2 + 1/m_k`, what ``KDEformer.py`` computes (its ``power_method`` iterates on the Gram
matrix :math:`V^\top V`, whose largest eigenvalue is :math:`\|V\|_2^2`)."""


def _block_size(block_size, num_features) -> int:
    if block_size is None:
        return max(1, num_features // 2)
    return check_int(block_size, "block_size", low=1)


def draw_kdeformer(q, k, *, num_features, generator=None, bits=sortlsh.DEFAULT_BITS):
    r"""The random draw of :func:`kdeformer`: sortLSH's hyperplanes and the uniforms of the sample.

    Returns
    -------
    dict
        ``hyperplanes`` ``(*batch, bits, p)``, i.i.d. :math:`\mathcal N(0, 1)` (one hash per batch element,
        as the code's ``Angular_LSH(dim=(batch, heads, d))``), then ``column_uniforms`` ``(*batch, m)`` in
        ``[0, 1)``: the :math:`m` columns by the inverse of the sampling distribution
        (:func:`approxlab.sketch.inverse_cdf`). float64, drawn on the CPU in this order.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.kdeformer import draw_kdeformer
    >>> q = k = torch.zeros(2, 64, 8, dtype=torch.float64)
    >>> drawn = draw_kdeformer(q, k, num_features=16, generator=torch.Generator().manual_seed(0))
    >>> {key: tuple(value.shape) for key, value in drawn.items()}
    {'hyperplanes': (2, 7, 8), 'column_uniforms': (2, 16)}
    """
    check_int(num_features, "num_features", low=1)
    bits = check_int(bits, "bits", low=1, high=30)
    g = as_generator(generator)
    planes = sortlsh.draw_hyperplanes(q.shape[:-2], bits, q.shape[-1], generator=g, device=q.device)
    uniforms = torch.rand(*q.shape[:-2], num_features, generator=g, dtype=torch.float64).to(q.device)
    return {"hyperplanes": planes, "column_uniforms": uniforms}


def sampling_weights(v: torch.Tensor, key_mask: torch.Tensor | None = None, sampling: str = "value-norms",
                     weights: str = "norm"):
    r"""KDEformer's unnormalised column probabilities :math:`\|v_j\|/\|V\|_2 + 1/m_k` (``weights="norm"``) or
    :math:`\|v_j\|/\|V\|_2^2 + 1/m_k` (``"code"``): ``(*batch, m_k)`` float64.

    Parameters
    ----------
    v : torch.Tensor
        ``(*batch, m_k, p_v)``.
    key_mask : torch.Tensor, optional
        ``(*batch, m_k)`` bool: padded keys get weight 0, and :math:`m_k` counts the real keys.
    sampling : {"value-norms", "augmented"}
        ``"value-norms"``: the norms of :math:`V` itself; ``"augmented"``: those of :math:`[V, \mathbf 1]`, the
        values with the column of ones that the code appends to compute the row sums in the same product
        (``value_aug``), as the code does.
    weights : {"norm", "code"}
        ``"norm"``: the ratio :math:`\|v_j\|/\|V\|_2`, so the sample does not depend on the scale of :math:`V`;
        ``"code"``: :math:`\|v_j\|/\|V\|_2^2`, as ``KDEformer.py`` computes it (``calc_A_res``:
        ``power_method(Gram_V)`` with ``Gram_V`` :math:`= V^\top V`, whose power iteration converges to the
        largest eigenvalue :math:`\|V\|_2^2`, not to :math:`\|V\|_2`). The two differ by the factor
        :math:`\|V\|_2` in front of the uniform :math:`1/m_k`: scaling :math:`V` by :math:`c` scales the code's
        first term by :math:`1/c`, so its sample moves towards uniform as the values grow.

    Notes
    -----
    :math:`\|V\|_2` is computed exactly (the singular values of :math:`V`); the code runs 20 power iterations on
    :math:`V^\top V` from a start drawn from torch's global generator (``power_method``), an estimate of
    :math:`\|V\|_2^2` that the iteration may leave a few percent short. :math:`V = 0` gives :math:`0/0`, taken as 0:
    uniform weights.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.kdeformer import sampling_weights
    >>> v = torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    >>> sampling_weights(v)        # ||V||_2 = 4, 1/m_k = 1/3
    tensor([1.0833, 1.3333, 0.3333], dtype=torch.float64)
    >>> sampling_weights(v, weights="code")  # ||V||_2^2 = 16, as KDEformer.py
    tensor([0.5208, 0.5833, 0.3333], dtype=torch.float64)
    """
    check_choice(sampling, "sampling", SAMPLINGS)
    check_choice(weights, "weights", WEIGHTS)
    if sampling == "augmented":
        v = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    if key_mask is not None:
        v = v * key_mask.unsqueeze(-1).to(v.dtype)
    norms = value_weights(v, key_mask, 1.0)  # ||v_j|| / s for the largest entry s of V
    scale = v.detach().to(torch.float64).abs().flatten(-2).amax(-1).clamp_min(torch.finfo(torch.float64).tiny)
    operator_norm = torch.linalg.matrix_norm(v.detach().to(torch.float64) / scale[..., None, None], ord=2)
    if weights == "code":  # ||v_j|| / ||V||_2^2 = (||v_j|| / s) / (||V / s||_2 ||V||_2)
        operator_norm = operator_norm * operator_norm * scale
    ratio = torch.where(operator_norm[..., None] > 0, norms / operator_norm.clamp_min(1e-300)[..., None], 0.0)
    real = v.shape[-2] if key_mask is None else key_mask.sum(-1, keepdim=True).to(torch.float64)
    uniform = 1.0 / real if key_mask is None else key_mask.to(torch.float64) / real
    return ratio + uniform


@method(
    "kdeformer",
    target="softmax",
    features="sampled columns m (block_size, default m // 2, and bits set sortLSH)",
    randomized=True,
    draw=draw_kdeformer,
)
def kdeformer(q, k, v, *, num_features, generator=None, block_size=None, bits=sortlsh.DEFAULT_BITS,
              sampling="value-norms", weights="norm", order="gray", draw=None, key_mask=None):
    r"""KDEformer: exact sortLSH blocks plus value-norm sampled columns, :math:`\tilde D^{-1}\tilde AV`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m_k, p)``, ``(*batch, m_k, p_v)``.
    num_features : int
        :math:`m`, sampled columns (with replacement), ``1 <= m <= m_k``.
    generator : torch.Generator, optional
        CPU generator for the draw (:func:`draw_kdeformer`).
    block_size : int, optional
        :math:`b`, sortLSH's block (the code's ``Bucket_size``); default :math:`\max(1, \lfloor m/2\rfloor)`.
    bits : int, default 7
        Hyperplanes of the hash (the code's ``num_projs=7``).
    sampling : {"value-norms", "augmented"}
        The column probabilities (:func:`sampling_weights`) from the rows of :math:`V` (default) or of the
        code's :math:`[V, \mathbf 1]`.
    weights : {"norm", "code"}
        :math:`p_j \propto \|v_j\|/\|V\|_2 + 1/m_k` (default, unchanged by a scale of :math:`V`) or the code's
        :math:`\|v_j\|/\|V\|_2^2 + 1/m_k` (:func:`sampling_weights`).
    order : {"gray", "code"}
        The bucket order of sortLSH (:func:`approxlab.sortlsh.bucket_ranks`): the Hamming (Gray) order of
        the paper's Section 4, or the code's ``perm[bucket]``.
    draw : dict, optional
        The draw of :func:`draw_kdeformer` (``approxlab.methods.draw``), instead of ``generator``.
    key_mask : torch.Tensor, optional
        ``(*batch, m_k)`` bool, True on real keys: padded keys are in no block, never sampled, and sort
        after the real ones (the real tokens' blocks are those of the unpadded input).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` the ``(*batch, n, m_k)`` matrix
        :math:`\tilde D^{-1}\tilde A` (a :class:`~approxlab.operators.RowSparseOperator`); ``info``:
        ``hyperplanes``, ``columns`` ``(*batch, m)`` (the sampled keys), ``log_row_sums``.

    Notes
    -----
    KDEformer looks for a diagonal :math:`\tilde D` and a sampling matrix :math:`\Pi` with
    :math:`\|\tilde D^{-1}A\Pi^\top\Pi V - D^{-1}AV\|_2 \le \varepsilon\|D^{-1}A\|_2\|V\|_2`. Its theory
    (Sections 3) estimates :math:`D` and the column norms of :math:`D^{-1}A`, which its sampling
    probabilities follow, with a kernel density estimator; approxlab does not implement that estimator.
    Its practical algorithm (Section 4, "exploiting sparsity"; ``KDEformer.py``) splits
    :math:`A = A_{\text{spar}} + A_{\text{res}}`: :math:`A_{\text{spar}} = M^H\odot A` on the sortLSH
    blocks (Figure 6), computed exactly, and the residual by :math:`m` columns drawn i.i.d. with
    probability :math:`p_j \propto \|v_j\|/\|V\|_2 + 1/m_k` and weight :math:`1/(mp_j)`, a query's own
    block left out of its residual; one sample gives both products,

    .. math::

        \tilde A = M^H\odot A + \big((1 - M^H)\odot A\big)\Pi^\top\Pi, \qquad
        \tilde D = \operatorname{diag}(\tilde A\mathbf 1), \qquad \tilde O = \tilde D^{-1}\tilde AV,

    so every :math:`\tilde d_i > 0` (it holds the query's block). Computed in the log domain (the code
    forms :math:`\exp(q^\top k)` unshifted). Cost :math:`O(n(b + m)p + m_kp_v^2)`.

    **Where the published code departs** (majid-daliri/kdeformer ``KDEformer.py``, commit 427df2d):

    - the probabilities use :math:`[V, \mathbf 1]` (``sampling="augmented"``) and divide :math:`\|v_j\|` by
      the squared norm :math:`\|[V, \mathbf 1]\|_2^2` (``weights="code"``): its ``power_method`` iterates
      on the Gram matrix :math:`V^\top V`, whose largest eigenvalue is :math:`\|V\|_2^2`; it runs 20
      iterations from a start drawn from torch's global generator (approxlab: the exact norm);
    - buckets are sorted by ``perm[bucket]`` (``order="code"``) with an unstable ``torch.sort`` (approxlab:
      stable; ties in one bucket keep the token order);
    - the logits are :math:`q^\top k` without :math:`1/\sqrt p` (its GloVe demo divides the inputs by
      :math:`p^{1/4}`) and are exponentiated without subtracting a maximum;
    - lengths must be multiples of ``Bucket_size`` (``view`` fails otherwise); approxlab cuts a shorter
      last block;
    - ``KDEformer(mask_size=...)`` (the GloVe demo) keeps one ``mask_matrix`` across calls and zeroes
      entries of it in place, so a second call also drops the first call's block entries from its residual.

    References
    ----------
    Zandieh, Han, Daliri, Karbasi, "KDEformer: Accelerating Transformers via Kernel Density Estimation",
    ICML 2023 (arXiv 2302.02451): Section 4 and Figure 6; code majid-daliri/kdeformer.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 256, 8, generator=torch.Generator().manual_seed(0))
    >>> v = v + 1.0                                            # values with a common direction, as real ones have
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for m in (16, 64, 256):
    ...     approx = approxlab.approximate("kdeformer", q, k, v, num_features=m, generator=torch.Generator().manual_seed(1))
    ...     print(m, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    16 [0.19, 0.21]
    64 [0.12, 0.1]
    256 [0.03, 0.04]
    """
    num_features = check_int(num_features, "num_features", low=1)
    block_size = _block_size(block_size, num_features)
    bits = check_int(bits, "bits", low=1, high=30)
    check_choice(sampling, "sampling", SAMPLINGS)
    check_choice(weights, "weights", WEIGHTS)
    check_choice(order, "order", sortlsh.ORDERS)
    key_mask = check_key_mask(key_mask, k)
    if key_mask is not None:
        key_mask = key_mask.expand(*k.shape[:-1])
    layout = {"hyperplanes": uniform_entry((*q.shape[:-2], bits, q.shape[-1]), "(*batch, bits, p)"),
              "column_uniforms": uniform_entry((*q.shape[:-2], num_features), "(*batch, m)")}
    if draw is None:
        draw = draw_kdeformer(q, k, num_features=num_features, generator=generator, bits=bits)
    else:
        draw = check_uniform_draw("kdeformer", draw, layout, q.device)
    blocks = sortlsh.heavy_keys(q, k, block_size=block_size, hyperplanes=draw["hyperplanes"], order=order,
                                key_mask=key_mask, query_mask=query_mask(key_mask, q, k))
    heavy = block_logits(q, k, blocks, block_size)
    column_weights = sampling_weights(v, key_mask, sampling, weights)
    columns = sketch.inverse_cdf(column_weights, draw["column_uniforms"]).to(q.device)
    probability = (torch.gather(column_weights, -1, columns.to(column_weights.device))
                   / column_weights.sum(-1, keepdim=True))
    log_weight = -torch.log(probability.to(device=q.device, dtype=q.dtype) * num_features)  # 1 / (m p_j)
    in_block = torch.gather(blocks.key_block, -1, columns).unsqueeze(-2) == blocks.query_block.unsqueeze(-1)
    residual = (logits_at(q, k, columns) + log_weight.unsqueeze(-2)).masked_fill_(in_block, float("-inf"))
    piece = Piece(0, 0, blocks, heavy, block_size, columns, residual)
    log_row_sums = piece.log_row_sums()
    output = piece_output(piece, v, log_row_sums)
    info = {"hyperplanes": draw["hyperplanes"], "columns": columns, "log_row_sums": log_row_sums}
    return Approximation("kdeformer", "softmax", output, lambda: operator_from_pieces([piece], log_row_sums,
                                                                                       k.shape[-2]), info)


KDEFORMER = kdeformer
__test__ = {"kdeformer": kdeformer.function}  # doctest skips a MethodSpec: run its function's examples
