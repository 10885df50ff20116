r"""Exact softmax attention, :math:`D^{-1}AV` (Skyformer Section 4.1), as a method: the zero-error reference.

Registered as ``"exact"``. ``num_features`` is accepted and ignored, so ``exact`` runs through every
study grid as the zero-error reference.
"""

from __future__ import annotations

from ..kernels import causal_mask, scaled_logits, softmax_matrix
from ..operators import DenseOperator
from ._base import Approximation, method
from ._masking import check_key_mask, masked_fused_attention, masked_softmax_matrix
from ._selection import safe_softmax

__all__ = ["exact", "EXACT"]


@method("exact", target="softmax", features="ignored (reference)", randomized=False, causal=True,
        differentiable=True)
def exact(q, k, v, *, num_features=None, generator=None, key_mask=None, causal=False):
    """Exact softmax attention; ``q, k: (*batch, n, p)``, ``v: (*batch, n, p_v)``.

    ``key_mask`` ``(*batch, n_k)`` bool (True on keys to attend): softmax over kept keys only.
    ``causal=True``: each row is the softmax over keys ``j <= i`` (the masked dense matrix); with
    ``key_mask`` too, over the kept keys ``j <= i`` (a row with none has output 0).
    Otherwise the output comes from torch's fused attention kernel
    (:func:`~approxlab.methods._masking.masked_fused_attention`: no ``n x n_k`` matrix, forward or
    backward, which is how training runs it); ``operator()`` forms the dense matrix when asked.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 16, 4, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("exact", q, k, v, num_features=1)  # num_features is ignored
    >>> bool(torch.allclose(approx.output, approxlab.exact_attention(q, k, v)))
    True
    >>> keep = torch.arange(16) < 8  # attend to the first 8 keys only
    >>> masked = approxlab.approximate("exact", q, k, v, num_features=1, key_mask=keep)
    >>> bool(torch.allclose(masked.output, approxlab.exact_attention(q, k[..., :8, :], v[..., :8, :])))
    True
    """
    key_mask = check_key_mask(key_mask, k)
    if causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        if key_mask is None:
            matrix = softmax_matrix(q, k, mask=mask)
        else:  # a padded row before the first kept key has no key: weight 0, output 0
            matrix = safe_softmax(scaled_logits(q, k).masked_fill(~(mask & key_mask.unsqueeze(-2)), float("-inf")))
        return Approximation("exact", "softmax", matrix @ v, DenseOperator(matrix))
    output = masked_fused_attention(q, k, v, key_mask)
    return Approximation("exact", "softmax", output, lambda: DenseOperator(masked_softmax_matrix(q, k, key_mask)))


EXACT = exact
__test__ = {"exact": exact.function}  # doctest skips a MethodSpec: run its function's examples
