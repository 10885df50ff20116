r"""The attention each context key received from the context's causal queries, shared where asked.

H2O (:func:`approxlab.methods.h2o.score_h2o`) and observed attention
(:func:`approxlab.methods.observed_attention.observed_attention_scores`) both read the column sums
:math:`F_j = \sum_i a_{ij}` of the context's causal attention (real queries only), :math:`O(n_c^2 p)` work: the
prefill's own attention again. Their budget enters only afterwards (H2O's recent window, the top :math:`b`), so
on one exact prefill every budget, and both policies, can share one computation per layer.
:func:`column_sums` computes them in row blocks; inside :func:`shared_column_sums` (the memo of
:func:`~approxlab.cache._shared_scores.shared`) a call whose ``q``, ``k`` and ``key_mask`` equal (``torch.equal``)
those of an earlier call returns a copy of that call's result, so the sharing is exact: the same blocks, the same
sums, bit for bit.
"""

from __future__ import annotations

import math

import torch

from ..methods._selection import block_rows
from ._shared_scores import shared, shared_scores

__all__ = ["column_sums", "shared_column_sums"]


def shared_column_sums():
    """Within the block, :func:`column_sums` of equal inputs are computed once: the block of
    :func:`~approxlab.cache._shared_scores.shared_scores`, which shares the policies' scores too (the inputs and
    sums are kept until the block ends: about two context-sized tensors per distinct call)."""
    return shared_scores()


@shared
def column_sums(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`F_j = \sum_i a_{ij}`, ``(*batch, n)`` in ``q.dtype``: the causal softmax rows of ``q`` ``(*batch, n,
    p)`` over ``k`` summed over the real queries (``key_mask`` ``(*batch, n)``, True on real tokens, or None);
    inside :func:`shared_column_sums` computed once per equal inputs."""
    return _causal_column_sums(q, k, key_mask)


def _causal_column_sums(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r""":func:`column_sums` computed afresh (no sharing): one pass over row blocks of the causal logits.

    Row block :math:`[r_0, r_1)` forms only its visible logits, :math:`s_{ij} = q_i^\top k_j/\sqrt p` for
    :math:`j < r_1` (the causal triangle, half of :math:`n^2`), masks :math:`j > i` and padded keys to
    :math:`-\infty` in place, and exponentiates in place, :math:`e_{ij} = e^{s_{ij} - \max_l s_{il}}` (a
    row with no visible key gives 0). With :math:`w_i = 1/\sum_l e_{il}` (0 on an empty row or a padded
    query), the block adds :math:`\sum_i w_i e_{ij}` to :math:`F_j` as one product ``w^T e``: the softmax
    weights are never formed. The same sums as normalising each row and summing the rows, to rounding (the
    reciprocal times, not the quotient; the order of the sum). Under autograd (``q`` or ``k`` requiring
    gradients) the exponentials are a new tensor, not the logits overwritten. Memory
    :math:`O(\text{block}\cdot n)`, in ``q.dtype``: ``(*batch, n)``.
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = k.shape[-2]
    accumulated = q.new_zeros(*batch, n)
    real = None if key_mask is None else key_mask.expand(*batch, n)
    block = block_rows(batch, n)
    tracked = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)  # autograd keeps the logits
    for start in range(0, n, block):
        stop = min(start + block, n)
        rows = stop - start
        logits = (q[..., start:stop, :] @ k[..., :stop, :].transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))
        ahead = ~torch.ones(rows, rows, dtype=torch.bool, device=q.device).tril()
        logits[..., start:].masked_fill_(ahead, -math.inf)
        if real is not None:
            logits.masked_fill_(~real[..., None, :stop], -math.inf)
        peak = logits.amax(-1, keepdim=True)
        peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
        logits = (logits - peak).exp() if tracked else logits.sub_(peak).exp_()
        sums = logits.sum(-1, keepdim=True)
        share = torch.where(sums > 0, 1 / sums, torch.zeros_like(sums))
        if real is not None:
            share = share * real[..., start:stop, None].to(share.dtype)
        accumulated[..., :stop] += (share.transpose(-1, -2) @ logits).squeeze(-2)
    return accumulated
