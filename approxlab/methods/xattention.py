r"""XAttention (Xu et al., ICML 2025): block-sparse prefill chosen by antidiagonal scoring and a mass threshold.

Each block of the causal attention matrix is scored by the attention mass along strided antidiagonals; each
query block keeps the first and diagonal key blocks and, in decreasing order of score, the fewest others whose
cumulative mass reaches the threshold. The kept blocks are attended exactly
(:func:`~approxlab.methods._sparse_attention.attend_blocks`: the logits of the kept blocks only).
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float
from ._base import CAUSAL_ONLY, method
from ._mask_attention import block_visible, mask_approximation
from ._sparse_attention import attend_blocks

__all__ = ["xattention", "XATTENTION", "antidiagonal_block_scores", "threshold_blocks"]


def antidiagonal_block_scores(q, k, *, block_size: int = 128, stride: int = 8) -> torch.Tensor:
    r"""XAttention's block scores: softmax of the strided antidiagonal sums, summed over each block.

    With :math:`S` = ``stride``, query group :math:`g` and key group :math:`h` of :math:`S` rows each (``q`` and
    ``k`` zero-padded to whole blocks), the antidiagonal logit is

    .. math::

        a_{gh} = \frac{1}{S\sqrt p}\sum_{s=0}^{S-1} q_{gS + S-1-s}^\top k_{hS + s},

    softmax over the key groups :math:`h \le g` (padded groups excluded), and a block's score is the sum of
    these weights over its :math:`(B/S)^2` groups (Section 2.2, Eq. (1)-(2) of the paper; ``xattn_estimate``
    with ``select_mode="inverse"``). Returns ``(*batch, N, N)`` for :math:`N = \lceil n/B\rceil`, 0 above the
    block diagonal. ``block_size`` must be a multiple of ``stride``.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 8, 2, dtype=torch.float64)
    >>> antidiagonal_block_scores(q, k, block_size=4, stride=2)[0].round(decimals=4).tolist()  # group g: 1/(g+1) each
    [[2.0, 0.0], [1.1667, 0.8333]]
    """
    n, p = k.shape[-2], k.shape[-1]
    blocks = -(-n // block_size)
    padded = blocks * block_size
    groups, per_block = padded // stride, block_size // stride

    def grouped(x, reverse):
        x = torch.nn.functional.pad(x, (0, 0, 0, padded - n)).reshape(*x.shape[:-2], groups, stride, p)
        return (x.flip(-2) if reverse else x).flatten(-2)

    logits = grouped(q, True) @ grouped(k, False).transpose(-1, -2) / (stride * math.sqrt(p))
    g = torch.arange(groups, device=q.device)
    hidden = (g.unsqueeze(-1) < g) | (g * stride >= n)  # later key groups; groups of padding only
    weights = torch.softmax(logits.masked_fill(hidden, -math.inf), dim=-1)
    weights = weights.masked_fill((g * stride >= n).unsqueeze(-1), 0.0)  # query groups of padding only
    return weights.reshape(*weights.shape[:-2], blocks, per_block, blocks, per_block).sum((-3, -1))


def threshold_blocks(scores: torch.Tensor, threshold: float, max_blocks: int | None = None) -> torch.Tensor:
    r"""XAttention's block selection (``find_blocks_chunked``, causal prefill): query block :math:`I` keeps key
    block 0 and :math:`I`, then the others :math:`J < I` by decreasing score while the mass kept before each is
    below ``threshold`` times the row's total; at most ``max_blocks`` blocks in all (forced ones first).
    ``scores`` ``(*batch, N, N)`` -> bool ``(*batch, N, N)``.

    Examples
    --------
    >>> import torch
    >>> scores = torch.tensor([[1.0, 0, 0, 0], [0.2, 0.8, 0, 0], [0.1, 0.6, 0.3, 0], [0.1, 0.2, 0.5, 0.2]])
    >>> threshold_blocks(scores, 0.9).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    >>> threshold_blocks(scores, 0.3).int().tolist()  # block 0 and the diagonal always
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    blocks = scores.shape[-1]
    index = torch.arange(blocks, device=scores.device)
    forced = (index == 0) | (index.unsqueeze(-1) == index)  # (N, N): the first block and the diagonal
    order_keys = torch.where(forced, math.inf, scores.masked_fill(index > index.unsqueeze(-1), -math.inf))
    ordered, order = order_keys.sort(dim=-1, descending=True, stable=True)
    mass = torch.gather(scores, -1, order)
    before = mass.cumsum(-1) - mass  # the mass kept before each block in the order
    keep = (before < threshold * scores.sum(-1, keepdim=True)) & (ordered > -math.inf)
    keep = keep | torch.isinf(ordered) & (ordered > 0)  # forced blocks whatever the mass
    if max_blocks is not None:
        keep = keep & (index < max_blocks)
    return torch.zeros_like(keep).scatter_(-1, order, keep)


@method("xattention", target="softmax", features="cap on the keys per query (whole blocks, fewer when the "
        "threshold is reached)", randomized=False, causal=CAUSAL_ONLY)
def xattention(q, k, v, *, num_features, generator=None, threshold=0.9, block_size=128, stride=8, causal=True):
    r"""XAttention's sparse causal prefill: the blocks whose antidiagonal mass reaches a threshold, attended exactly.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (self-attention over the whole sequence).
    num_features : int
        A cap :math:`b` on the keys per query (``1 <= b <= n``): each query block keeps at most
        :math:`\max(2, \lceil b/B\rceil)` key blocks of :math:`B` = ``block_size`` (the first and diagonal
        blocks always); the threshold may keep fewer. ``num_features = n`` leaves the threshold alone to decide,
        as in the paper.
    generator : torch.Generator, optional
        Unused (deterministic).
    threshold : float, default 0.9
        :math:`\tau \in (0, 1]`, the share of each query block's antidiagonal mass the kept blocks reach (the
        authors' default 0.9 in ``xattn_estimate``; their prefill entry point's default is 0.8).
    block_size : int, default 128
        :math:`B`, rows per block (the authors' 128); a multiple of ``stride``.
    stride : int, default 8
        :math:`S`, the antidiagonal stride (the authors' 8).
    causal : bool, default True
        Only True is accepted: the method exists in causal form only.

    Returns
    -------
    Approximation
        The ``(*batch, n, p_v)`` output, the row-sparse operator on request
        (:class:`~approxlab.operators.RowSparseOperator`), and in ``info``: ``blocks`` (bool ``(*batch, N, N)``, the kept blocks) and ``scores``
        (their antidiagonal mass, :func:`antidiagonal_block_scores`).

    Notes
    -----
    Row :math:`i` of query block :math:`I` attends (exact softmax over) the keys :math:`j \le i` of the blocks
    :func:`threshold_blocks` keeps for :math:`I` from the scores of :func:`antidiagonal_block_scores`: Algorithm 1
    of the paper (antidiagonal scoring, threshold block selection) as ``xattn_estimate`` and
    ``find_blocks_chunked`` implement it for causal prefill.

    **Where the published code departs** (mit-han-lab/x-attention, ``xattn/src/Xattention.py`` and
    ``utils.py``): (1) it pads to chunks of at least 2,048 tokens and masks key groups that are padding only,
    as here (padding changes no kept set); (2) its softmax runs in float32 and its threshold test in float64,
    here both in the inputs' dtype; (3) ``num_features`` below :math:`n` caps the kept blocks, which the
    authors' method does not (their budget is the threshold).

    **Cost**: the scores :math:`O(n^2 p / S)`; the attention :math:`O(n\bar c B p)` for :math:`\bar c` kept
    blocks per query block (:func:`~approxlab.methods._sparse_attention.attend_blocks`: the kept blocks' logits
    only, as the authors' block-sparse kernel), the same outputs as the dense mask route to rounding.

    References
    ----------
    Xu, Guo, Han, Li, Ding, Wang and Han, "XAttention: Block sparse attention with antidiagonal scoring",
    ICML 2025 (arXiv:2503.16428); code mit-han-lab/x-attention.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("xattention", q, k, v, num_features=32, causal=True, threshold=1.0,
    ...                                block_size=8, stride=4)
    >>> float((approx.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12
    True
    """
    if causal is not True:
        raise ValueError(f"xattention is causal-only: pass causal=True; got causal={causal!r}.")
    stride = check_int(stride, "stride", low=1)
    size = check_int(block_size, "block_size", low=stride)
    if size % stride:
        raise ValueError(f"`block_size` must be a multiple of `stride` ({stride}); got {size}.")
    tau = check_positive_float(threshold, "threshold")
    if tau > 1:
        raise ValueError(f"`threshold` must be in (0, 1]; got {threshold!r}.")
    scores = antidiagonal_block_scores(q, k, block_size=size, stride=stride)
    chosen = threshold_blocks(scores, tau, max(2, -(-num_features // size)))
    info = {"blocks": chosen, "scores": scores}
    return mask_approximation("xattention", q, k, v, block_visible(chosen, size), info,
                              attend_blocks(q, k, v, chosen, size))


XATTENTION = xattention
__test__ = {"xattention": xattention.function}  # doctest skips a MethodSpec: run its function's examples
