r"""Kernelized attention :math:`CV`, :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3)).

Exact (no approximation): the target that ``skyformer`` approximates.
``num_features`` is accepted and ignored.
"""

from __future__ import annotations

import math

import torch

from ..kernels import causal_mask, kernelized_matrix, log_diag_scale
from ..operators import DenseOperator
from ._base import Approximation, method
from ._masking import check_key_mask, mask_columns, masked_fused_attention


def fused_kernelized_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`CV` over kept keys through torch's fused softmax-attention kernel, never forming ``C``.

    ``q: (*batch, n, p)``, ``k: (*batch, n_k, p)``, ``v: (*batch, n_k, p_v)``,
    ``key_mask: (*batch, n_k)`` or ``None``; returns ``(*batch, n, p_v)``.

    Notes
    -----
    With :math:`\ell(x) = \|x\|^2/(2\sqrt p)` (:func:`approxlab.kernels.log_diag_scale`),
    :math:`C_{ij} = \exp(q_i^\top k_j/\sqrt p - \ell(q_i) - \ell(k_j)) \in (0, 1]` (Skyformer
    Lemma 1). One extra "null" key whose logit for query :math:`i` is :math:`\ell(q_i)` turns
    the unnormalised sum into a softmax: over the keys :math:`\{k_j\} \cup \{\text{null}\}` with
    logits :math:`q_i^\top k_j/\sqrt p - \ell(k_j)` and :math:`\ell(q_i)`, the weights are
    :math:`C_{ij}/(1 + R_i)` and :math:`1/(1 + R_i)`, :math:`R_i = \sum_j C_{ij} \le n_k`. So with
    values :math:`[v_j, 0]` and :math:`[0, 1]`,

    .. math::

        (CV)_i = \frac{\sum_j C_{ij} v_j/(1+R_i)}{1/(1+R_i)},

    a ratio of two outputs of one softmax attention whose denominator is at least
    :math:`1/(1+n_k)`: no cancellation, nothing overflows (the kernel subtracts the row maximum),
    and gradients flow through the fused kernel. The logits are built as dot products of
    augmented rows, queries :math:`[q_i/\sqrt p, 1, \ell(q_i)]`, keys :math:`[k_j, -\ell(k_j), 0]`
    and the null key :math:`[0, 0, 1]` (scale 1), zero-padded with the values to one head size.
    """
    p, p_v = q.shape[-1], v.shape[-1]
    width = max(p + 2, p_v + 1)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (x.expand(*batch, *x.shape[-2:]) for x in (q, k, v))
    ones = torch.ones_like(q[..., :1])
    queries = torch.cat([q / math.sqrt(p), ones, log_diag_scale(q).unsqueeze(-1)], dim=-1)
    keys = torch.cat([k, -log_diag_scale(k).unsqueeze(-1), torch.zeros_like(k[..., :1])], dim=-1)
    null = k.new_zeros(*batch, 1, width)
    null[..., p + 1] = 1.0
    keys = torch.cat([torch.nn.functional.pad(keys, (0, width - p - 2)), null], dim=-2)
    values = torch.nn.functional.pad(v, (0, width - p_v))
    null_value = v.new_zeros(*batch, 1, width)
    null_value[..., p_v] = 1.0
    values = torch.cat([values, null_value], dim=-2)
    queries = torch.nn.functional.pad(queries, (0, width - p - 2))
    if key_mask is not None:
        key_mask = torch.cat([key_mask.expand(*batch, k.shape[-2]), key_mask.new_ones(*batch, 1)], dim=-1)
    out = masked_fused_attention(queries, keys, values, key_mask, scale=1.0)
    return out[..., :p_v] / out[..., p_v : p_v + 1]

__all__ = ["kernelized", "KERNELIZED"]


@method("kernelized", target="kernelized", features="ignored (exact)", randomized=False, causal=True,
        differentiable=True)
def kernelized(q, k, v, *, num_features=None, generator=None, key_mask=None, causal=False):
    r"""Kernelized attention; ``q, k: (*batch, n, p)``, ``v: (*batch, n, p_v)``.

    ``key_mask`` ``(*batch, n_k)`` bool (True on keys to attend): masked keys' columns are 0.
    ``causal=True``: :math:`L\odot C`, the entries with key ``j > i`` set to 0 (no renormalisation:
    :math:`C` is not row-normalised), as a dense matrix. Otherwise the output comes from torch's fused
    attention kernel (:func:`fused_kernelized_attention`: no ``n x n_k`` matrix, forward or backward,
    which is how training runs it); ``operator()`` forms the dense matrix when asked.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.kernels import kernelized_matrix
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 16, 4, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("kernelized", q, k, v, num_features=1)
    >>> approx.target, bool(torch.allclose(approx.output, kernelized_matrix(q, k) @ v))
    ('kernelized', True)
    """
    if causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        matrix = mask_columns(kernelized_matrix(q, k, mask=mask), check_key_mask(key_mask, k))
        return Approximation("kernelized", "kernelized", matrix @ v, DenseOperator(matrix))
    key_mask = check_key_mask(key_mask, k)
    output = fused_kernelized_attention(q, k, v, key_mask)
    return Approximation("kernelized", "kernelized", output,
                         lambda: DenseOperator(mask_columns(kernelized_matrix(q, k), key_mask)))


KERNELIZED = kernelized
__test__ = {"kernelized": kernelized.function}  # doctest skips a MethodSpec: run its function's examples
