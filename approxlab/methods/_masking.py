r"""Key-padding masks for the methods used in training: masked keys get zero weight.

A key mask is a bool tensor ``(*batch, n_k)`` (broadcastable against the key batch shape,
e.g. ``(sequences, 1, n_k)`` for ``(sequences, heads, n_k, p)`` keys), **True on keys that may
be attended** (real tokens) and False on padding -- the convention of
:class:`approxlab.tasks.Batch` ``.mask``. (PyTorch's ``key_padding_mask`` is the negation.)

For a softmax target the masked row is :math:`\operatorname{softmax}` over the kept keys only,

.. math::

    S^{\text{mask}}_{ij} = \frac{\exp(q_i^\top k_j/\sqrt p)\,\mathbb 1[j\ \text{kept}]}
                                {\sum_{l\ \text{kept}} \exp(q_i^\top k_l/\sqrt p)},

computed in the log domain (masked logits set to :math:`-\infty`); for unnormalised targets
(kernelized attention, YOSO-E, YOSO-m) masked columns are multiplied by 0.

**Padding cannot leak.** A method that builds landmarks from the tokens (Skyformer's sampled
rows of :math:`[Q; K]`, the segment means of Nyströmformer and spectral shifting) builds them
from real tokens only, sequence by sequence, so the outputs of real rows do not depend on the
padded rows' ``q``, ``k``, ``v`` at all (``tests/test_masking.py`` checks this for every method
that takes a mask, to 1e-12 in float64). In self-attention (``q`` and ``k`` of the same length
``n``) the key mask is the token padding mask, and padded *queries* are left out of the
landmarks too (:func:`query_mask`), as the authors' code does: it multiplies padded ``q`` and
``k`` by 0 before taking landmarks (pkuzengqi/Skyformer ``attention_skyformer.py`` samples
among the first ``mask.sum()`` rows of ``Q`` and of ``K``; mlpen/Nystromformer
``attention_nystrom.py`` zeroes padded ``Q``, ``K`` before the segment means). The outputs of
padded query rows are not specified.
"""

from __future__ import annotations

import torch

from .._validation import check_key_mask
from ..kernels import scaled_logits

__all__ = ["check_key_mask", "query_mask", "masked_softmax_matrix", "masked_fused_attention", "mask_columns"]


def query_mask(key_mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The mask of the real query rows that may become landmarks: ``(*batch, n)`` or ``None``.

    In self-attention (``q: (*batch, n, p)`` and ``k: (*batch, n, p)`` of one length) the key
    mask marks the padded tokens, which are padded queries too: it is returned as is. With
    ``n != n_k`` (queries and keys from different sequences) nothing marks padded queries, and
    every query row may be a landmark: ``None``.
    """
    if key_mask is None or q.shape[-2] != k.shape[-2]:
        return None
    return key_mask


def masked_softmax_matrix(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    r"""Row-stochastic :math:`\operatorname{softmax}(QK^\top/\sqrt p)` over kept keys, ``(*batch, n, n_k)``.

    ``key_mask=None`` is the unmasked softmax. Masked entries are exactly 0 (log domain,
    logits :math:`-\infty`), and their gradient is 0.
    """
    logits = scaled_logits(q, k)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.unsqueeze(-2), float("-inf"))
    return torch.softmax(logits, dim=-1)


def masked_fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, *, scale: float | None = None
) -> torch.Tensor:
    r""":math:`\operatorname{softmax}(s\,QK^\top)V` over kept keys through torch's fused kernel, ``(*batch, n, p_v)``.

    ``q: (*batch, n, p)``, ``k: (*batch, n_k, p)``, ``v: (*batch, n_k, p_v)`` (batch dimensions
    broadcast), ``key_mask: (*batch, n_k)`` or ``None``, ``scale`` :math:`s` (default
    :math:`1/\sqrt p`). One call of :func:`torch.nn.functional.scaled_dot_product_attention` on the
    flattened batch with the mask as its boolean ``attn_mask``: on CPU its flash kernel (equal head
    sizes ``p_v == p``) never forms the ``n x n_k`` matrix, forward or backward, and masked keys get
    weight exactly 0 (gradient 0).
    """
    shapes = [q.shape[:-2], k.shape[:-2], v.shape[:-2]] + ([] if key_mask is None else [key_mask.shape[:-1]])
    batch = torch.broadcast_shapes(*shapes)
    flat = [x.expand(*batch, *x.shape[-2:]).reshape(1, -1, *x.shape[-2:]) for x in (q, k, v)]
    attn_mask = None
    if key_mask is not None:
        attn_mask = key_mask.expand(*batch, k.shape[-2]).reshape(1, -1, 1, k.shape[-2])
    out = torch.nn.functional.scaled_dot_product_attention(*flat, attn_mask=attn_mask, scale=scale)
    return out.reshape(*batch, q.shape[-2], v.shape[-1])


def mask_columns(matrix: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """``matrix: (*batch, n, n_k)`` with the columns of masked keys set to 0."""
    if key_mask is None:
        return matrix
    return matrix * key_mask.unsqueeze(-2).to(matrix.dtype)
