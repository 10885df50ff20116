r"""What ``vattention`` and ``magicpig`` share: a deterministic set of keys per query (attention sinks, a local
window, the largest logits) and a row of importance weights over the keys.

Both methods form every logit in row blocks (:func:`~approxlab.methods._selection.logit_blocks`), decide per
query a *fixed* set :math:`F_i` that is attended exactly and a random set of further keys, and return the
output :math:`\tilde o_i = \sum_j c_{ij} v_j / \sum_j c_{ij}` for non-negative coefficients :math:`c_{ij}`
(the softmax numerator on :math:`F_i`, an importance-weighted one on the sampled keys). The operator is the
:class:`~approxlab.operators.RowSparseOperator` of the normalised coefficients' non-zeros.
"""

from __future__ import annotations

import math

import torch

from ._selection import sparse_approximation

__all__ = ["fixed_keys", "row_weights", "weighted_output", "assemble", "stack_rows", "BlockLogits", "row_block",
           "ROW_BLOCK"]


def fixed_keys(logits: torch.Tensor, start: int, *, heavy: int, sink: int, window: int) -> torch.Tensor:
    r"""``(*batch, rows, m)`` bool: the keys attended exactly by rows ``start .. start + rows - 1``.

    The union of the attention sinks (keys ``j < sink``), the local window (keys
    :math:`i - \text{window} < j \le i` of query :math:`i`) and the ``heavy`` largest logits among the other
    keys (sparse-attention-hub's sink, local and ``oracle_top_k`` maskers, composed in that order); only
    visible keys (finite logits) are ever fixed.
    """
    visible = torch.isfinite(logits)
    rows, m = logits.shape[-2:]
    keys = torch.arange(m, device=logits.device)
    queries = torch.arange(start, start + rows, device=logits.device).unsqueeze(-1)
    fixed = visible & ((keys < sink) | ((keys <= queries) & (keys > queries - window)))
    if heavy > 0:
        values, indices = logits.masked_fill(fixed, float("-inf")).topk(min(heavy, m), dim=-1)
        fixed = fixed | torch.zeros_like(fixed).scatter(-1, indices, torch.isfinite(values))
    return fixed


def row_weights(logits: torch.Tensor) -> torch.Tensor:
    r"""``exp(logits - max)`` per row in the logits' dtype; 0 on invisible keys and on rows that see no key."""
    peak = logits.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    return torch.exp(logits - peak)


def weighted_output(coefficients: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""``(output, indices, weights)`` of one row block from its ``(*batch, rows, m)`` coefficients :math:`c_{ij}\ge 0`.

    ``output`` ``(*batch, rows, p_v)`` is :math:`\sum_j c_{ij} v_j / \sum_j c_{ij}` (0 on a row without
    coefficients); ``indices`` and ``weights`` ``(*batch, rows, s)`` are the non-zero columns of the normalised
    row and their values (weight 0 on unused slots), ``s`` the most non-zeros of a row in the block.
    """
    sums = coefficients.sum(-1, keepdim=True)
    normalised = coefficients / torch.where(sums > 0, sums, torch.ones_like(sums))
    output = normalised @ v
    nonzero = normalised != 0
    width = max(1, int(nonzero.sum(-1).max()))
    indices = torch.argsort(nonzero.to(torch.int8), dim=-1, descending=True, stable=True)[..., :width]
    return output, indices, torch.gather(normalised, -1, indices)


def assemble(name: str, blocks: list, m: int, dtype: torch.dtype, info: dict):
    """The :class:`Approximation` of the row blocks ``[(output, indices, weights), ...]`` (outputs cast to ``dtype``)."""
    output = torch.cat([block[0] for block in blocks], dim=-2).to(dtype)
    indices, weights = stack_rows([block[1:] for block in blocks], dtype)
    return sparse_approximation(name, output, m, lambda: (indices, weights), info)


def stack_rows(blocks: list, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, weights)`` ``(*batch, n, s)`` of the row blocks' ``[(indices, weights), ...]``, each padded to the
    widest block's ``s`` (weight 0, index 0), the weights cast to ``dtype``."""
    width = max(block[0].shape[-1] for block in blocks)

    def pad(x):
        return torch.nn.functional.pad(x, (0, width - x.shape[-1]))

    indices = torch.cat([pad(block[0]) for block in blocks], dim=-2)
    weights = torch.cat([pad(block[1]) for block in blocks], dim=-2).to(dtype)
    return indices, weights


ROW_BLOCK = 1 << 23
"""Entries of one row block's ``(B, r, w)`` logits in :class:`BlockLogits` (32 MiB in float32): twice
:data:`~approxlab.methods._selection.BLOCK_ELEMENTS`, half as many blocks (measured on one thread, 3 heads,
n = 8,192: 5 to 10% faster for both methods, within the noise of a shared machine; four times was slower for
``magicpig``)."""


def row_block(heads: int, m: int) -> int:
    """Rows per block of :class:`BlockLogits` for ``heads`` sequences of ``m`` keys (at least 1).

    Examples
    --------
    >>> from approxlab.methods._weighted_keys import row_block
    >>> row_block(3, 8192)
    341
    """
    return max(1, ROW_BLOCK // max(1, heads * m))


class BlockLogits:
    r"""The logits :math:`QK^\top/\sqrt p` of row blocks ``(B, r, w)`` (the first ``w`` keys) in the inputs' dtype,
    written into one buffer kept for every block when ``reuse`` (a fresh block of this size costs its page faults
    each time), else into fresh memory (for blocks that outlive the next one). ``q`` ``(B, n, p)``, ``k``
    ``(B, m, p)``; ``rows`` the most rows of a block. When :math:`\sqrt p` is a power of two, ``q`` is divided by
    it once (exactly) instead of each block's product: the same numbers, a pass less."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, rows: int, *, reuse: bool = True):
        p = q.shape[-1]
        self.exact = math.log2(p) % 2 == 0  # sqrt(p) a power of two: q / sqrt(p) rounds nothing
        self.q, self.k = (q / math.sqrt(p) if self.exact else q), k
        size = q.shape[0] * min(rows, q.shape[-2]) * k.shape[-2]
        self.buffer = torch.empty(size, dtype=q.dtype, device=q.device) if reuse else None

    def __call__(self, start: int, stop: int, width: int) -> torch.Tensor:
        rows, keys = self.q[..., start:stop, :], self.k[..., :width, :].transpose(-1, -2)
        out = None if self.buffer is None else self.buffer[:self.q.shape[0] * (stop - start) * width].view(
            self.q.shape[0], stop - start, width)
        logits = torch.matmul(rows, keys, out=out)
        return logits if self.exact else logits.div_(math.sqrt(self.q.shape[-1]))
