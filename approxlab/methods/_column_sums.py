r"""The attention each context key received from the context's causal queries, shared where asked.

H2O (:func:`approxlab.methods.h2o.score_h2o`) and observed attention
(:func:`approxlab.methods.observed_attention.observed_attention_scores`) both read the column sums
:math:`F_j = \sum_i a_{ij}` of the context's causal attention (real queries only), :math:`O(n_c^2 p)` work: the
prefill's own attention again. Their budget enters only afterwards (H2O's recent window, the top :math:`b`), so
on one exact prefill every budget, and both policies, can share one computation per layer.
:func:`column_sums` computes them in row blocks; inside :func:`shared_column_sums` a call whose ``q``, ``k`` and
``key_mask`` equal (``torch.equal``) those of an earlier call returns that call's result, so the sharing is
exact: the same blocks, the same sums, bit for bit.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from ._selection import logit_blocks, safe_softmax

__all__ = ["column_sums", "shared_column_sums"]

_SHARED = contextvars.ContextVar("approxlab_shared_column_sums", default=None)


@contextlib.contextmanager
def shared_column_sums():
    """Within the block, :func:`column_sums` of equal inputs are computed once (the inputs and sums are kept
    until the block ends: about two context-sized tensors per distinct call)."""
    token = _SHARED.set([])
    try:
        yield
    finally:
        _SHARED.reset(token)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))


def column_sums(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`F_j = \sum_i a_{ij}`, ``(*batch, n)`` in ``q.dtype``: the causal softmax rows of ``q`` ``(*batch, n,
    p)`` over ``k`` summed over the real queries (``key_mask`` ``(*batch, n)``, True on real tokens, or None)."""
    memo = _SHARED.get()
    if memo is not None:
        for seen_q, seen_k, seen_mask, found in memo:
            if _same(q, seen_q) and _same(k, seen_k) and _same(key_mask, seen_mask):
                return found
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = k.shape[-2]
    accumulated = q.new_zeros(*batch, n)
    real = None if key_mask is None else key_mask.expand(*batch, n)
    for start, stop, logits in logit_blocks(q, k, causal=True, key_mask=key_mask):
        weights = safe_softmax(logits)
        if real is not None:
            weights = weights * real[..., start:stop].unsqueeze(-1).to(weights.dtype)
        accumulated += weights.sum(-2)
    if memo is not None:
        memo.append((q, k, key_mask, accumulated))
    return accumulated
