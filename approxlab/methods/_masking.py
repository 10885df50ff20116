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
(kernelized attention, YOSO-E) masked columns are multiplied by 0.
"""

from __future__ import annotations

import torch

from .._validation import check_key_mask
from ..kernels import scaled_logits

__all__ = ["check_key_mask", "masked_softmax_matrix", "mask_columns"]


def masked_softmax_matrix(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    r"""Row-stochastic :math:`\operatorname{softmax}(QK^\top/\sqrt p)` over kept keys, ``(*batch, n, n_k)``.

    ``key_mask=None`` is the unmasked softmax. Masked entries are exactly 0 (log domain,
    logits :math:`-\infty`), and their gradient is 0.
    """
    logits = scaled_logits(q, k)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.unsqueeze(-2), float("-inf"))
    return torch.softmax(logits, dim=-1)


def mask_columns(matrix: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """``matrix: (*batch, n, n_k)`` with the columns of masked keys set to 0."""
    if key_mask is None:
        return matrix
    return matrix * key_mask.unsqueeze(-2).to(matrix.dtype)
