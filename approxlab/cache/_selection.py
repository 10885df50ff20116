r"""The attention of a compressed cache: each continuation row over the kept context tokens and, causally, the
continuation.

A cache that keeps the context tokens :math:`\mathcal K` (``kept`` ``(*batch, b)``, indices in
``[0, n_c)``) of a window of :math:`n` tokens gives continuation row :math:`i \ge n_c`

.. math::

    \tilde o_i = \sum_{j\in \mathcal K\,\cup\,\{n_c,\dots,i\}}
    \frac{e^{s_{ij}}}{\sum_{l\in \mathcal K\,\cup\,\{n_c,\dots,i\}} e^{s_{il}}}\, v_j .

:func:`compressed_indices` writes that selection for :func:`~approxlab.methods._selection.attend_selected` and the
row-sparse operator; :func:`attend_compressed` computes the rows against the compressed cache itself, through
torch's fused attention kernel (:func:`attend_compressed_rows` from the continuation's queries alone, as a
decoder's later steps have them).
"""

from __future__ import annotations

import math

import torch

from ..kernels import causal_mask
from ..methods._selection import block_rows, safe_softmax

__all__ = ["compressed_indices", "attend_compressed", "attend_compressed_rows"]


def compressed_indices(kept: torch.Tensor, context_length: int, n: int, start: int, stop: int,
                       key_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection of continuation rows ``start:stop`` (global positions ``context_length + start ...``):
    the kept context tokens ``kept`` ``(*batch, b)``, then the continuation ``context_length .. n - 1``
    causally; ``(*batch, stop - start, b + n - context_length)`` indices and valid mask."""
    batch, budget = kept.shape[:-1], kept.shape[-1]
    rows = stop - start
    continuation = torch.arange(context_length, n, device=kept.device)
    indices = torch.cat([kept.unsqueeze(-2).expand(*batch, rows, budget),
                         continuation.expand(*batch, rows, n - context_length)], dim=-1)
    valid = torch.cat([torch.ones(*batch, rows, budget, dtype=torch.bool, device=kept.device),
                       causal_mask(rows, n - context_length, row_offset=start, device=kept.device).expand(
                           *batch, rows, n - context_length)], dim=-1)
    if key_mask is not None:
        valid = valid & torch.gather(key_mask.expand(*batch, n), -1, indices.flatten(-2)).view_as(valid)
    return indices, valid


def attend_compressed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor, context_length: int,
                      key_mask: torch.Tensor | None) -> torch.Tensor:
    r"""The continuation rows ``context_length`` to ``n - 1``: each the exact softmax over the kept context tokens ``kept``
    ``(*batch, b)`` and, causally, the continuation; ``(*batch, n - context_length, p_v)``.

    ``q, k, v`` are ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; ``key_mask`` ``(*batch, n)`` bool
    (True on real tokens) or None. The same numbers as :func:`~approxlab.methods._selection.attend_selected` with
    :func:`compressed_indices` (to rounding), by attention against the ``b + n - context_length`` keys of the
    compressed cache (the cache a decoder holds), in row blocks, each against the columns its rows can see (the
    kept tokens and the continuation up to the block's last row). A block whose rows each see a key is torch's
    ``scaled_dot_product_attention`` with that boolean mask (its fused kernel: the cost of causal SDPA on the
    cache); a block with a row that sees none (padding) is the explicit softmax, whose empty rows are 0. With no
    kept token and ``context_length = 0`` it is exact causal attention.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.cache import attend_compressed
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 24, 4, generator=torch.Generator().manual_seed(0))
    >>> everything = torch.arange(16).expand(2, 16)  # every context token kept: exact causal attention
    >>> out = attend_compressed(q, k, v, everything, 16, None)
    >>> out.shape, float((out - approxlab.exact_attention(q, k, v, causal=True)[..., 16:, :]).abs().max()) < 1e-12
    (torch.Size([2, 8, 4]), True)
    """
    return attend_compressed_rows(q[..., context_length:, :], k, v, kept, context_length, key_mask)


def attend_compressed_rows(rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor,
                           context_length: int, key_mask: torch.Tensor | None) -> torch.Tensor:
    """:func:`attend_compressed` given the continuation's queries alone, ``rows`` ``(*batch, n - context_length,
    p)`` (``n`` the keys): a decoder's later steps, whose context queries are not needed again."""
    q = rows
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, budget = k.shape[-2], kept.shape[-1]
    k, v = k.expand(*batch, *k.shape[-2:]), v.expand(*batch, *v.shape[-2:])
    cache_keys = torch.cat([torch.gather(k, -2, kept.unsqueeze(-1).expand(*batch, budget, k.shape[-1])),
                            k[..., context_length:, :]], dim=-2)
    cache_values = torch.cat([torch.gather(v, -2, kept.unsqueeze(-1).expand(*batch, budget, v.shape[-1])),
                              v[..., context_length:, :]], dim=-2)
    cache_mask = None
    if key_mask is not None:
        real = key_mask.expand(*batch, n)
        cache_mask = torch.cat([torch.gather(real, -1, kept), real[..., context_length:]], dim=-1)
    rows = q.expand(*batch, n - context_length, q.shape[-1])
    scale = 1.0 / math.sqrt(q.shape[-1])
    if cache_mask is None and budget == 0 and context_length == 0:  # exact causal attention, the fused kernel
        return _fused_attention(rows, cache_keys, cache_values, None, scale)
    # without a key mask every row sees itself, and a block's mask is (rows, width) booleans, whatever the batch
    block = block_rows(batch if cache_mask is not None else (), cache_keys.shape[-2])
    outputs = []
    for start in range(0, n - context_length, block):  # rows start:stop see the kept tokens and b + stop columns
        stop = min(start + block, n - context_length)
        width = budget + stop
        future = ~causal_mask(stop - start, stop, row_offset=start, device=q.device)
        hidden = torch.cat([future.new_zeros(stop - start, budget), future], dim=-1)
        if cache_mask is not None:
            hidden = hidden | ~cache_mask[..., :width].unsqueeze(-2)
        keys, values = cache_keys[..., :width, :], cache_values[..., :width, :]
        if cache_mask is None or not bool(hidden.all(-1).any()):  # every row sees a key: the fused kernel
            outputs.append(_fused_attention(rows[..., start:stop, :], keys, values, ~hidden, scale))
            continue
        # the explicit softmax, whose empty rows are 0 (the kernel's would not be)
        logits = (rows[..., start:stop, :] @ keys.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))
        outputs.append(safe_softmax(logits.masked_fill(hidden, float("-inf"))) @ values)
    return torch.cat(outputs, dim=-2)


def _fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """``softmax(scale * q k^T, over the visible keys) v`` by torch's ``scaled_dot_product_attention`` for
    ``(*batch, r, p)``, ``(*batch, w, p)``, ``(*batch, w, p_v)`` and a boolean ``visible`` ``(r, w)`` or ``(*batch,
    r, w)`` in which every row has a key (``None``: causal, ``r == w``); the batch flattened to ``(1, B)`` (the
    kernel's own layout: with three dimensions torch takes its unfused path)."""
    batch = q.shape[:-2]
    flat = lambda x: x.reshape(1, -1, *x.shape[-2:])  # noqa: E731
    if visible is not None and visible.dim() > 2:
        visible = flat(visible.expand(*batch, *visible.shape[-2:]))
    out = torch.nn.functional.scaled_dot_product_attention(flat(q), flat(k), flat(v), attn_mask=visible,
                                                           is_causal=visible is None, scale=scale)
    return out.reshape(*batch, *out.shape[-2:])
