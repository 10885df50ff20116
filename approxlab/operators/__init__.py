"""Linear operators on batches of matrices, and exact attention applied as one.

- :mod:`approxlab.operators.linear`: :class:`LinearOperator` (``matmat``/``rmatmat`` on
  ``(*batch, n, m)``), its dense, diagonal, product, sum and adjoint forms and
  :func:`aslinearoperator`; composition (``A @ B``, ``A - B``, ``c * A``, ``A.T``) builds lazy
  operators, so the error of an approximation is itself an operator.
- :mod:`approxlab.operators.fused_attention`: :func:`softmax_attention` and
  :class:`ExactAttentionOperator` through torch's fused attention kernel (or in row blocks), and
  :func:`check_causal`.
- :mod:`approxlab.operators.sparse`: :class:`RowSparseOperator`, a matrix with a few stored entries
  per row (the attention matrix of the key-selection, sampled and hashed methods: top-k, StreamingLLM, H2O,
  HyperAttention, KDEformer, ...).
"""

from .fused_attention import ExactAttentionOperator, check_causal, softmax_attention
from .linear import (
    AdjointOperator,
    DenseOperator,
    DiagonalOperator,
    LinearOperator,
    ProductOperator,
    SumOperator,
    aslinearoperator,
)
from .sparse import RowSparseOperator

__all__ = [
    "LinearOperator",
    "DenseOperator",
    "DiagonalOperator",
    "ProductOperator",
    "SumOperator",
    "AdjointOperator",
    "aslinearoperator",
    "RowSparseOperator",
    "ExactAttentionOperator",
    "softmax_attention",
    "check_causal",
]
