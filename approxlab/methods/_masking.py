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

from ..kernels import scaled_logits

__all__ = ["check_key_mask", "masked_softmax_matrix", "mask_columns"]


def check_key_mask(key_mask, k: torch.Tensor) -> torch.Tensor | None:
    """Validate ``key_mask`` against keys ``k: (*batch, n_k, p)``; ``None`` passes through.

    Raises
    ------
    TypeError
        If ``key_mask`` is not a bool tensor.
    ValueError
        If its last dimension is not ``n_k``, it does not broadcast against ``k``'s batch
        shape, or some sequence has no kept key (its softmax would be 0/0).
    """
    if key_mask is None:
        return None
    if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
        got = key_mask.dtype if isinstance(key_mask, torch.Tensor) else type(key_mask).__name__
        raise TypeError(f"`key_mask` must be a bool torch.Tensor (True on keys to attend); got {got}.")
    n_k = k.shape[-2]
    _refuse_attention_mask(key_mask, k)
    if key_mask.ndim < 1 or key_mask.shape[-1] != n_k:
        raise ValueError(
            f"`key_mask` must have shape (*batch, n_k) with n_k={n_k}; got {tuple(key_mask.shape)}."
        )
    try:
        torch.broadcast_shapes(tuple(key_mask.shape), tuple(k.shape[:-1]))
    except RuntimeError:
        raise ValueError(
            f"`key_mask` of shape {tuple(key_mask.shape)} does not broadcast against the keys' "
            f"(*batch, n_k) = {tuple(k.shape[:-1])}."
        ) from None
    if not bool(key_mask.any(-1).all()):
        raise ValueError("`key_mask` must keep at least one key in every sequence; got an all-False row.")
    return key_mask.to(k.device)


def _refuse_attention_mask(key_mask: torch.Tensor, k: torch.Tensor) -> None:
    """A ``(..., n, n)`` query-by-key mask (e.g. a causal one) given as ``key_mask`` is refused:
    broadcast as a key mask its row axis would become an extra batch dimension of the output."""
    n_k = k.shape[-2]
    if key_mask.ndim >= 2 and key_mask.ndim > k.ndim - 1 and tuple(key_mask.shape[-2:]) == (n_k, n_k):
        raise ValueError(
            f"`key_mask` must have shape (*batch, n_k) (one flag per key, like the keys' batch "
            f"{tuple(k.shape[:-1])}); got {tuple(key_mask.shape)}, an (n, n) query-by-key mask, which "
            "would be broadcast as an extra batch dimension. For causal attention pass causal=True "
            "(approxlab.exact_attention, attention_matrix, ExactAttentionOperator) instead of a mask."
        )


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
