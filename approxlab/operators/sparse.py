r"""A matrix with a few nonzeros per row, given row by row: :class:`RowSparseOperator`.

The sampled and hashed approximations (HyperAttention, KDEformer) keep, for each query, a block of keys
and a few sampled keys: row :math:`i` of their matrix is :math:`\sum_t w_{it}\,e_{j_{it}}^\top` with
:math:`t \le T` entries. Products cost :math:`O(nTk)` and memory stays :math:`O(nT)`; the
:math:`n \times m` matrix is formed only by :meth:`~approxlab.operators.LinearOperator.to_dense`.
"""

from __future__ import annotations

import torch

from .._validation import check_tensor
from .linear import LinearOperator

__all__ = ["RowSparseOperator"]

_CHUNK_ELEMENTS = 1 << 22
"""Entries of the ``(*batch, rows, T, k)`` gathered block formed at once by the products."""


class RowSparseOperator(LinearOperator):
    r"""``(*batch, n, m)`` matrix :math:`W_{ij} = \sum_{t: j_{it} = j} w_{it}`, from per-row columns and weights.

    Parameters
    ----------
    columns : torch.Tensor
        ``(*batch, n, T)`` int64 column indices in ``[0, m)`` (repeats add up; pad a row with weight 0).
    weights : torch.Tensor
        ``(*batch, n, T)`` float32/float64, the entries.
    num_columns : int
        ``m``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import RowSparseOperator
    >>> columns = torch.tensor([[0, 2], [1, 1]])
    >>> weights = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    >>> RowSparseOperator(columns, weights, 3).to_dense()
    tensor([[0.5000, 0.0000, 0.5000],
            [0.0000, 1.0000, 0.0000]], dtype=torch.float64)
    """

    def __init__(self, columns: torch.Tensor, weights: torch.Tensor, num_columns: int):
        check_tensor(weights, "weights", finite=False)
        if not isinstance(columns, torch.Tensor) or columns.dtype != torch.long or columns.shape != weights.shape:
            raise ValueError(f"`columns` must be an int64 tensor of the shape of `weights` {tuple(weights.shape)}; "
                             f"got {getattr(columns, 'dtype', type(columns).__name__)} "
                             f"{tuple(getattr(columns, 'shape', ()))}.")
        self.columns = columns
        self.weights = weights
        self.shape = (*weights.shape[:-1], int(num_columns))
        self.dtype = weights.dtype
        self.device = weights.device

    def _rows_per_chunk(self, k: int) -> int:
        batch = max(1, torch.Size(self.shape[:-2]).numel())
        return max(1, _CHUNK_ELEMENTS // max(1, batch * self.weights.shape[-1] * k))

    def _matmat(self, x):
        batch = torch.broadcast_shapes(self.shape[:-2], x.shape[:-2])
        n, entries, k = self.shape[-2], self.weights.shape[-1], x.shape[-1]
        x = x.expand(*batch, *x.shape[-2:])
        out = []
        step = self._rows_per_chunk(k)
        for start in range(0, n, step):
            cols = self.columns[..., start : start + step, :].expand(*batch, -1, entries)
            rows = cols.shape[-2]
            gathered = torch.gather(x, -2, cols.reshape(*batch, rows * entries, 1).expand(*batch, rows * entries, k))
            weights = self.weights[..., start : start + step, :].expand(*batch, rows, entries)
            out.append((weights.unsqueeze(-2) @ gathered.reshape(*batch, rows, entries, k)).squeeze(-2))
        return torch.cat(out, dim=-2)

    def _rmatmat(self, y):
        batch = torch.broadcast_shapes(self.shape[:-2], y.shape[:-2])
        n, entries, k = self.shape[-2], self.weights.shape[-1], y.shape[-1]
        out = y.new_zeros(*batch, self.shape[-1], k)
        step = self._rows_per_chunk(k)
        for start in range(0, n, step):
            cols = self.columns[..., start : start + step, :].expand(*batch, -1, entries)
            rows = cols.shape[-2]
            weights = self.weights[..., start : start + step, :].expand(*batch, rows, entries)
            contributions = weights.unsqueeze(-1) * y[..., start : start + step, :].expand(*batch, rows, k).unsqueeze(-2)
            out.scatter_add_(-2, cols.reshape(*batch, rows * entries, 1).expand(*batch, rows * entries, k),
                             contributions.reshape(*batch, rows * entries, k))
        return out

    def to_dense(self):
        dense = self.weights.new_zeros(self.shape)
        return dense.scatter_add_(-1, self.columns, self.weights)

    def to(self, dtype):
        return RowSparseOperator(self.columns, self.weights.to(dtype), self.shape[-1])
