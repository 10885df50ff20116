r"""Exact causal softmax over a sparse pattern given as a boolean mask: what the sparse-prefill methods share.

MInference, XAttention and DuoAttention each decide, for every query :math:`i`, a set :math:`S_i \subseteq
\{0, \dots, i\}` of keys -- as columns and diagonals, as blocks, or per head -- and compute

.. math::

    \tilde o_i = \sum_{j\in S_i} \frac{e^{s_{ij}}}{\sum_{l\in S_i} e^{s_{il}}}\, v_j,
    \qquad s_{ij} = q_i^\top k_j/\sqrt p .

Here a method hands over ``visible(start, stop)``, the ``(*batch, stop - start, stop)`` boolean mask of the
keys rows ``start:stop`` attend (keys at or after ``stop`` are never visible in a causal pattern), and
:func:`attend_mask` computes the rows in blocks, in the log domain: each block's logits are formed against every
earlier key, :math:`O(n^2 p)` time in all and memory :math:`O(\text{block}\cdot n)`, as dense causal attention.
It is the reference the methods' sparse route is tested against, and what their row-sparse operator is read
from; their outputs come from :mod:`~approxlab.methods._sparse_attention`, which forms the logits of the kept
blocks, columns and diagonals only, at the cost of the authors' kernels (:func:`mask_approximation`'s
``output``).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ._selection import block_rows, safe_softmax, sparse_approximation

__all__ = ["attend_mask", "mask_approximation", "block_visible"]

Visible = Callable[[int, int], torch.Tensor]


def _blocks(q, k, visible: Visible, batch):
    """``(start, stop, weights)`` per row block: the softmax over each row's visible keys, ``(*batch, rows,
    stop)`` (0 off the pattern)."""
    n, p = q.shape[-2], q.shape[-1]
    block = block_rows(batch, n)
    for start in range(0, n, block):
        stop = min(start + block, n)
        logits = (q[..., start:stop, :] @ k[..., :stop, :].transpose(-1, -2)).div_(math.sqrt(p))
        shown = visible(start, stop)
        yield start, stop, safe_softmax(logits.expand(*batch, stop - start, stop).masked_fill(~shown, -math.inf))


def attend_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: Visible) -> torch.Tensor:
    r"""Exact softmax of each query over the keys its mask shows, in row blocks; ``(*batch, n, p_v)``.

    ``q, k, v`` are ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; ``visible(start, stop)`` the
    ``(*batch, stop - start, stop)`` bool mask of rows ``start:stop`` over keys ``0:stop``. A row with no
    visible key gets output 0.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 3, 2, dtype=torch.float64)
    >>> v = torch.tensor([[[1.0], [2.0], [4.0]]], dtype=torch.float64)
    >>> diagonal = lambda start, stop: torch.eye(stop, dtype=torch.bool)[start:stop]  # each row sees itself
    >>> attend_mask(q, k, v, diagonal)[0, :, 0].tolist()
    [1.0, 2.0, 4.0]
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return torch.cat([weights @ v[..., :stop, :] for _, stop, weights in _blocks(q, k, visible, batch)], dim=-2)


def _record(q, k, v, visible: Visible):
    """The ``(*batch, n, s)`` indices and weights of :func:`attend_mask`'s rows (``s`` the most keys a row sees;
    weight 0 on unused slots), for the row-sparse operator."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n = q.shape[-2]
    blocks = [torch.nn.functional.pad(weights, (0, n - stop)) for _, stop, weights in _blocks(q, k, visible, batch)]
    dense = torch.cat(blocks, dim=-2)
    width = max(1, int((dense > 0).sum(-1).max()))
    weights, indices = dense.topk(width, dim=-1)
    return indices, weights


def mask_approximation(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: Visible,
                       info: dict, output: torch.Tensor | None = None):
    """The :class:`~approxlab.methods.Approximation` of :func:`attend_mask`: its output (``output`` when given,
    the same attention computed sparsely by :mod:`~approxlab.methods._sparse_attention`), ``info``, and a
    :class:`~approxlab.operators.RowSparseOperator` formed on request from ``visible``."""
    if output is None:
        output = attend_mask(q, k, v, visible)
    return sparse_approximation(name, output, k.shape[-2], lambda: _record(q, k, v, visible), info)


def block_visible(chosen: torch.Tensor, block_size: int) -> Visible:
    """``visible(start, stop)`` of a block-sparse pattern: the keys ``j <= i`` in a key block ``chosen`` for the
    query's block; ``chosen`` bool ``(*batch, N, N)`` over blocks of ``block_size`` rows.

    Examples
    --------
    >>> import torch
    >>> chosen = torch.tensor([[True, False], [True, False]])  # block 1 keeps key block 0 only
    >>> block_visible(chosen, 2)(2, 4).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0]]
    """
    def visible(start, stop):
        rows = torch.arange(start, stop, device=chosen.device)
        keys = torch.arange(stop, device=chosen.device)
        return chosen[..., rows // block_size, :][..., keys // block_size] & (keys <= rows.unsqueeze(-1))

    return visible
