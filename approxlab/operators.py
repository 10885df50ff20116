r"""Linear operators on batches of matrices, applied without forming them.

An operator has ``shape = (*batch, n, m)`` and acts on blocks of vectors:
``matmat(x: (*batch, m, k)) -> (*batch, n, k)`` and
``rmatmat(y: (*batch, n, k)) -> (*batch, m, k)`` (the adjoint). This mirrors
SciPy's ``LinearOperator`` (only products are needed) and GPyTorch's batched
``LinearOperator``. Dense ``n x n`` matrices are formed only by :meth:`to_dense`.

Composition: ``A @ B`` (product), ``A - B``, ``A + B``, ``c * A`` and ``A.T`` build
lazy operators, so e.g. the error ``approx.operator() - exact_operator`` of an
attention approximation is itself an operator whose spectral norm can be
estimated by Golub--Kahan bidiagonalisation (``approxlab.metrics.spectral_norm``).
"""

from __future__ import annotations

import math

import torch

from . import kernels
from ._validation import check_choice, check_int, check_qkv, check_real, check_tensor

__all__ = [
    "LinearOperator",
    "DenseOperator",
    "DiagonalOperator",
    "ProductOperator",
    "SumOperator",
    "AdjointOperator",
    "aslinearoperator",
    "ExactAttentionOperator",
]


class LinearOperator:
    """Base class: subclasses set ``shape``, ``dtype``, ``device`` and implement
    ``_matmat`` and ``_rmatmat`` on ``(*batch, m, k)`` / ``(*batch, n, k)`` blocks."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device

    # -- to implement -------------------------------------------------------
    def _matmat(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _rmatmat(self, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- public ---------------------------------------------------------------
    @property
    def batch_shape(self) -> tuple:
        return tuple(self.shape[:-2])

    def matmat(self, x: torch.Tensor) -> torch.Tensor:
        """``self @ x`` for ``x: (*batch, m, k)``; returns ``(*batch, n, k)``."""
        self._check_block(x, "x")
        if x.shape[-2] != self.shape[-1]:
            raise ValueError(
                f"`x` must have shape (*batch, {self.shape[-1]}, k) to multiply an operator of shape "
                f"{tuple(self.shape)}; got {tuple(x.shape)}."
            )
        return self._matmat(x)

    def rmatmat(self, y: torch.Tensor) -> torch.Tensor:
        """``self^T @ y`` for ``y: (*batch, n, k)``; returns ``(*batch, m, k)``."""
        self._check_block(y, "y")
        if y.shape[-2] != self.shape[-2]:
            raise ValueError(
                f"`y` must have shape (*batch, {self.shape[-2]}, k) for the adjoint of an operator of "
                f"shape {tuple(self.shape)}; got {tuple(y.shape)}."
            )
        return self._rmatmat(y)

    def _check_block(self, x, name: str) -> None:
        check_tensor(x, name)
        if x.dtype != self.dtype or x.device != self.device:
            raise ValueError(
                f"`{name}` must have the operator's dtype and device ({self.dtype}/{self.device}); "
                f"got {x.dtype}/{x.device}. Use .to(dtype) on the operator or the block."
            )

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        """``self @ x`` for ``x: (*batch, m)``."""
        check_tensor(x, "x", min_ndim=1)
        return self.matmat(x.unsqueeze(-1)).squeeze(-1)

    def rmatvec(self, y: torch.Tensor) -> torch.Tensor:
        """``self^T @ y`` for ``y: (*batch, n)``."""
        check_tensor(y, "y", min_ndim=1)
        return self.rmatmat(y.unsqueeze(-1)).squeeze(-1)

    def to_dense(self) -> torch.Tensor:
        """Form the ``(*batch, n, m)`` matrix (``m`` products with unit vectors)."""
        eye = torch.eye(self.shape[-1], dtype=self.dtype, device=self.device)
        return self.matmat(eye.expand(*self.batch_shape, *eye.shape))

    def to(self, dtype: torch.dtype) -> "LinearOperator":
        """The same operator evaluated in ``dtype`` (default: a cast wrapper)."""
        return _CastOperator(self, dtype)

    @property
    def T(self) -> "LinearOperator":
        return AdjointOperator(self)

    def __matmul__(self, other):
        if isinstance(other, LinearOperator):
            return ProductOperator(self, other)
        return self.matmat(other)

    def __add__(self, other):
        return SumOperator([self, aslinearoperator(other)], [1.0, 1.0])

    def __sub__(self, other):
        return SumOperator([self, aslinearoperator(other)], [1.0, -1.0])

    def __mul__(self, c):
        return SumOperator([self], [check_real(c, "c")])

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype})"


class DenseOperator(LinearOperator):
    """Wrap an explicit ``(*batch, n, m)`` tensor."""

    def __init__(self, matrix: torch.Tensor):
        self.matrix = check_tensor(matrix, "matrix", finite=False)
        self.shape = tuple(matrix.shape)
        self.dtype = matrix.dtype
        self.device = matrix.device

    def _matmat(self, x):
        return self.matrix @ x

    def _rmatmat(self, y):
        return self.matrix.transpose(-1, -2) @ y

    def to_dense(self):
        return self.matrix

    def to(self, dtype):
        return DenseOperator(self.matrix.to(dtype))


class DiagonalOperator(LinearOperator):
    """``diag(d)`` for ``d: (*batch, n)``."""

    def __init__(self, diag: torch.Tensor):
        self.diag = check_tensor(diag, "diag", min_ndim=1, finite=False)
        n = diag.shape[-1]
        self.shape = (*diag.shape[:-1], n, n)
        self.dtype = diag.dtype
        self.device = diag.device

    def _matmat(self, x):
        return self.diag.unsqueeze(-1) * x

    _rmatmat = _matmat

    def to(self, dtype):
        return DiagonalOperator(self.diag.to(dtype))


class ProductOperator(LinearOperator):
    """``F_1 @ F_2 @ ... @ F_r`` of operators or tensors, applied right to left.

    A low-rank factorisation ``U (W) V^T`` costs ``O((n + m) r k)`` per block of ``k`` vectors.
    """

    def __init__(self, *factors):
        if not factors:
            raise ValueError("`factors` must contain at least one operator or tensor; got none.")
        self.factors = [aslinearoperator(f) for f in factors]
        for left, right in zip(self.factors[:-1], self.factors[1:]):
            if left.shape[-1] != right.shape[-2]:
                raise ValueError(
                    f"`factors` have incompatible shapes {tuple(left.shape)} and {tuple(right.shape)}."
                )
        first, last = self.factors[0], self.factors[-1]
        batch = torch.broadcast_shapes(*(tuple(f.shape[:-2]) for f in self.factors))
        self.shape = (*batch, first.shape[-2], last.shape[-1])
        self.dtype = first.dtype
        self.device = first.device

    def _matmat(self, x):
        for f in reversed(self.factors):
            x = f.matmat(x)
        return x

    def _rmatmat(self, y):
        for f in self.factors:
            y = f.rmatmat(y)
        return y

    def to(self, dtype):
        return ProductOperator(*(f.to(dtype) for f in self.factors))


class SumOperator(LinearOperator):
    """``sum_i c_i A_i`` of operators of one shape."""

    def __init__(self, operators, coefficients):
        self.operators = [aslinearoperator(a) for a in operators]
        self.coefficients = [float(c) for c in coefficients]
        shapes = {tuple(a.shape[-2:]) for a in self.operators}
        if len(shapes) != 1:
            raise ValueError(f"`operators` must share their matrix shape; got {sorted(shapes)}.")
        batch = torch.broadcast_shapes(*(tuple(a.shape[:-2]) for a in self.operators))
        self.shape = (*batch, *shapes.pop())
        self.dtype = self.operators[0].dtype
        self.device = self.operators[0].device

    def _matmat(self, x):
        return sum(c * a.matmat(x) for c, a in zip(self.coefficients, self.operators))

    def _rmatmat(self, y):
        return sum(c * a.rmatmat(y) for c, a in zip(self.coefficients, self.operators))

    def to(self, dtype):
        return SumOperator([a.to(dtype) for a in self.operators], self.coefficients)


class AdjointOperator(LinearOperator):
    """The transpose of an operator."""

    def __init__(self, op: LinearOperator):
        self.op = op
        self.shape = (*op.shape[:-2], op.shape[-1], op.shape[-2])
        self.dtype = op.dtype
        self.device = op.device

    def _matmat(self, x):
        return self.op.rmatmat(x)

    def _rmatmat(self, y):
        return self.op.matmat(y)

    def to(self, dtype):
        return AdjointOperator(self.op.to(dtype))


class _CastOperator(LinearOperator):
    """Apply ``op`` to inputs cast to ``op.dtype``, return results in ``dtype``."""

    def __init__(self, op: LinearOperator, dtype: torch.dtype):
        self.op = op
        self.shape = op.shape
        self.dtype = dtype
        self.device = op.device

    def _matmat(self, x):
        return self.op.matmat(x.to(self.op.dtype)).to(self.dtype)

    def _rmatmat(self, y):
        return self.op.rmatmat(y.to(self.op.dtype)).to(self.dtype)


def aslinearoperator(x) -> LinearOperator:
    """Return ``x`` if it is an operator, else wrap a tensor in :class:`DenseOperator`."""
    if isinstance(x, LinearOperator):
        return x
    if isinstance(x, torch.Tensor):
        return DenseOperator(x)
    raise TypeError(f"expected a LinearOperator or torch.Tensor; got {type(x).__name__}.")


# -- row-blocked exact attention (appended) ---------------------------------------------

EXACT_KINDS = ("softmax", "scores", "kernelized")


class ExactAttentionOperator(LinearOperator):
    r"""An exact attention matrix applied in blocks of query rows, never formed ``n x m``.

    Parameters
    ----------
    q : torch.Tensor
        ``(*batch, n, p)`` queries.
    k : torch.Tensor
        ``(*batch, m, p)`` keys (same batch dims, dtype and device as ``q``).
    kind : {"softmax", "scores", "kernelized"}
        Which matrix (the kinds of :func:`approxlab.attention_matrix`):

        * ``"softmax"``: :math:`D^{-1}A = \operatorname{softmax}(QK^\top/\sqrt p)`, each row
          block computed in the log domain (max-subtracted), so it never overflows;
        * ``"scores"``: :math:`A = \exp(QK^\top/\sqrt p)`; raises ``OverflowError`` (as
          :func:`approxlab.kernels.score_matrix` does) when an entry exceeds the dtype's range;
        * ``"kernelized"``: :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Eq. (3) of Skyformer),
          entries in ``(0, 1]``.
    block_size : int
        Query rows per block, ``>= 1``. Memory is ``O(block_size * m)`` per batch element;
        the last block may be shorter (``block_size`` need not divide ``n``).

    Notes
    -----
    ``matmat(x)`` for ``x: (*batch, m, k)`` computes, for each row block
    :math:`I`, the block's logits :math:`Q_I K^\top/\sqrt p` (``block x m``), its exact
    rows :math:`M_{I,:}` and the product :math:`M_{I,:}x`; ``rmatmat(y)`` accumulates
    :math:`\sum_I M_{I,:}^\top y_I`. Each product costs :math:`O(nmp + nmk)` time. Block rows
    are computed with the same functions as the dense matrices of :mod:`approxlab.kernels`,
    so :meth:`to_dense` agrees with :func:`approxlab.attention_matrix` to rounding.

    ``to(dtype)`` recomputes from ``q`` and ``k`` cast to ``dtype`` (it does not cast the
    float32 matrix), so ``op.to(torch.float64)`` is the float64 exact matrix of the same
    (rounded) inputs. This is what lets
    ``spectral_error(approx.operator(), ExactAttentionOperator(q, k))`` run at ``n = 32768``.

    References
    ----------
    Chen et al. (2021), Skyformer, Section 4.1 and Eq. (3); Vaswani et al. (2017),
    scaled dot-product attention.
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, kind: str = "softmax", block_size: int = 1024):
        check_qkv(q, k)
        check_choice(kind, "kind", EXACT_KINDS)
        block_size = check_int(block_size, "block_size", low=1)
        self.q = q
        self.k = k
        self.kind = kind
        self.block_size = block_size
        self.shape = (*q.shape[:-2], q.shape[-2], k.shape[-2])
        self.dtype = q.dtype
        self.device = q.device

    def _ranges(self):
        n = self.shape[-2]
        return [(start, min(start + self.block_size, n)) for start in range(0, n, self.block_size)]

    def _block(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the matrix, ``(*batch, stop - start, m)``."""
        q_block = self.q[..., start:stop, :]
        if self.kind == "softmax":
            return kernels.softmax_matrix(q_block, self.k)
        if self.kind == "kernelized":
            return kernels.kernelized_matrix(q_block, self.k)
        logits = kernels.scaled_logits(q_block, self.k)
        block = torch.exp(logits)
        if not bool(torch.isfinite(block).all()):
            raise OverflowError(
                f"ExactAttentionOperator(kind='scores') overflows {self.dtype}: a logit in query rows "
                f"{start}:{stop} is {float(logits.max()):.1f}, above "
                f"log(finfo.max)={math.log(torch.finfo(self.dtype).max):.1f}. Use .to(torch.float64) "
                "or kind='softmax' (computed in the log domain)."
            )
        return block

    def _matmat(self, x):
        return torch.cat([self._block(a, b) @ x for a, b in self._ranges()], dim=-2)

    def _rmatmat(self, y):
        out = None
        for a, b in self._ranges():
            part = self._block(a, b).transpose(-1, -2) @ y[..., a:b, :]
            out = part if out is None else out + part
        return out

    def to_dense(self) -> torch.Tensor:
        """The ``(*batch, n, m)`` matrix, assembled from its row blocks."""
        return torch.cat([self._block(a, b) for a, b in self._ranges()], dim=-2)

    def to(self, dtype: torch.dtype) -> "ExactAttentionOperator":
        """The same matrix recomputed from ``q`` and ``k`` cast to ``dtype``."""
        return ExactAttentionOperator(self.q.to(dtype), self.k.to(dtype), self.kind, self.block_size)

    def __repr__(self) -> str:
        return (
            f"ExactAttentionOperator(kind={self.kind!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"block_size={self.block_size})"
        )
