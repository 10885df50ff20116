r"""A matrix with a few stored entries per row: the attention matrix of every key-selection method.

:class:`SparseRowsOperator` holds, for each row :math:`i`, the columns ``indices[..., i, :]`` and their
weights ``weights[..., i, :]`` (a weight of 0 stands for an unused slot), so an ``(*batch, n, m)``
matrix with at most ``s`` entries per row costs :math:`O(n s)` memory, never :math:`O(n m)`.
Products go in row blocks: ``matmat`` gathers ``(*batch, block, s, k)`` rows of ``x`` at a time,
``rmatmat`` scatter-adds.
"""

from __future__ import annotations

import torch

from .._validation import check_int, check_tensor
from .linear import LinearOperator

__all__ = ["SparseRowsOperator"]

_BLOCK_ELEMENTS = 1 << 22
"""Entries of the ``(*batch, block, s, k)`` gathered block formed at once by :meth:`SparseRowsOperator.matmat`."""


class SparseRowsOperator(LinearOperator):
    r"""The ``(*batch, n, m)`` matrix :math:`W` with :math:`W_{i,\,\mathrm{indices}_{ir}} \mathrel{+}= \mathrm{weights}_{ir}`.

    Parameters
    ----------
    indices : torch.Tensor
        ``(*batch, n, s)`` integer column indices in ``[0, m)``.
    weights : torch.Tensor
        ``(*batch, n, s)`` floating weights; a slot of weight 0 contributes nothing (its index is
        still required to be in range). Repeated indices in a row add up.
    m : int
        The number of columns.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators.sparse import SparseRowsOperator
    >>> op = SparseRowsOperator(torch.tensor([[0, 2], [1, 1]]), torch.tensor([[0.5, 0.5], [0.25, 0.75]],
    ...                         dtype=torch.float64), 3)
    >>> op.to_dense()
    tensor([[0.5000, 0.0000, 0.5000],
            [0.0000, 1.0000, 0.0000]], dtype=torch.float64)
    >>> op.rmatvec(torch.ones(2, dtype=torch.float64))
    tensor([0.5000, 1.0000, 0.5000], dtype=torch.float64)
    """

    def __init__(self, indices: torch.Tensor, weights: torch.Tensor, m: int):
        check_tensor(weights, "weights", finite=True)
        m = check_int(m, "m", low=1)
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
            got = indices.dtype if isinstance(indices, torch.Tensor) else type(indices).__name__
            raise TypeError(f"`indices` must be an integer torch.Tensor (*batch, n, s); got {got}.")
        if indices.shape != weights.shape:
            raise ValueError(f"`indices` and `weights` must have one shape (*batch, n, s); got "
                             f"{tuple(indices.shape)} and {tuple(weights.shape)}.")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= m):
            raise ValueError(f"`indices` must lie in [0, m) = [0, {m}); got values in "
                             f"[{int(indices.min())}, {int(indices.max())}].")
        self.indices = indices.long()
        self.weights = weights
        self.shape = (*weights.shape[:-1], m)
        self.dtype = weights.dtype
        self.device = weights.device

    def _block_rows(self, columns: int) -> int:
        batch = max(1, int(torch.Size(self.shape[:-2]).numel()))
        per_row = max(1, batch * self.indices.shape[-1] * max(1, columns))
        return max(1, _BLOCK_ELEMENTS // per_row)

    def _matmat(self, x):
        batch = torch.broadcast_shapes(self.shape[:-2], x.shape[:-2])
        x = x.expand(*batch, *x.shape[-2:])
        indices = self.indices.expand(*batch, *self.indices.shape[-2:])
        weights = self.weights.expand(*batch, *self.weights.shape[-2:])
        n, columns = self.shape[-2], x.shape[-1]
        block = self._block_rows(columns)
        out = []
        for start in range(0, n, block):
            rows = indices[..., start:start + block, :]
            gathered = torch.gather(x.unsqueeze(-3).expand(*batch, rows.shape[-2], *x.shape[-2:]), -2,
                                    rows.unsqueeze(-1).expand(*rows.shape, columns))
            out.append((weights[..., start:start + block, :].unsqueeze(-1) * gathered).sum(-2))
        return torch.cat(out, dim=-2)

    def _rmatmat(self, y):
        batch = torch.broadcast_shapes(self.shape[:-2], y.shape[:-2])
        y = y.expand(*batch, *y.shape[-2:])
        indices = self.indices.expand(*batch, *self.indices.shape[-2:])
        weights = self.weights.expand(*batch, *self.weights.shape[-2:])
        columns = y.shape[-1]
        contributions = weights.unsqueeze(-1) * y.unsqueeze(-2)  # (*batch, n, s, k)
        flat = contributions.reshape(*batch, -1, columns)
        index = indices.reshape(*batch, -1, 1).expand(*batch, flat.shape[-2], columns)
        return y.new_zeros(*batch, self.shape[-1], columns).scatter_add_(-2, index, flat)

    def to_dense(self) -> torch.Tensor:
        dense = self.weights.new_zeros(self.shape)
        return dense.scatter_add_(-1, self.indices, self.weights)

    def to(self, dtype):
        return SparseRowsOperator(self.indices, self.weights.to(dtype), self.shape[-1])
