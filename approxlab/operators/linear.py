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

import torch

from .._validation import check_real, check_tensor

__all__ = [
    "LinearOperator",
    "DenseOperator",
    "DiagonalOperator",
    "ProductOperator",
    "SumOperator",
    "AdjointOperator",
    "aslinearoperator",
]


class LinearOperator:
    """Base class: subclasses set ``shape``, ``dtype``, ``device`` and implement
    ``_matmat`` and ``_rmatmat`` on ``(*batch, m, k)`` / ``(*batch, n, k)`` blocks.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import LinearOperator
    >>> class Scaling(LinearOperator):  # c * I, never formed
    ...     def __init__(self, c, n):
    ...         self.c, self.shape, self.dtype, self.device = c, (n, n), torch.float64, torch.device("cpu")
    ...     def _matmat(self, x):
    ...         return self.c * x
    ...     def _rmatmat(self, y):
    ...         return self.c * y
    >>> op = Scaling(3.0, 4)
    >>> op.matvec(torch.ones(4, dtype=torch.float64))
    tensor([3., 3., 3., 3.], dtype=torch.float64)
    >>> (op - op.T).to_dense().abs().max().item()
    0.0
    """

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
        """``self @ x`` for ``x: (*batch, m, k)``; returns ``(*batch, n, k)``.

        The batch dimensions of ``x`` and the operator broadcast; a block that does not fit
        (rows, batch, dtype, device) is a ``ValueError`` naming both shapes, and so is a result of
        another shape than ``(*batch, n, k)`` from a subclass's ``_matmat``.
        """
        batch = self._check_block(x, "x", self.shape[-1], "to multiply")
        return self._checked_product(self._matmat(x), (*batch, self.shape[-2], x.shape[-1]), x, "_matmat")

    def rmatmat(self, y: torch.Tensor) -> torch.Tensor:
        """``self^T @ y`` for ``y: (*batch, n, k)``; returns ``(*batch, m, k)`` (checked as :meth:`matmat`)."""
        batch = self._check_block(y, "y", self.shape[-2], "for the adjoint of")
        return self._checked_product(self._rmatmat(y), (*batch, self.shape[-1], y.shape[-1]), y, "_rmatmat")

    def _check_block(self, x, name: str, rows: int, action: str) -> tuple:
        """The batch shape of ``self`` times block ``x``, after checking that ``x`` fits."""
        check_tensor(x, name)
        if x.dtype != self.dtype or x.device != self.device:
            raise ValueError(
                f"`{name}` must have the operator's dtype and device ({self.dtype}/{self.device}); "
                f"got {x.dtype}/{x.device}. Use .to(dtype) on the operator or the block."
            )
        batch = _broadcast(self.batch_shape, tuple(x.shape[:-2]))
        if x.shape[-2] != rows or batch is None:
            raise ValueError(
                f"`{name}` must have shape (*batch, {rows}, k), its batch broadcasting with the operator's "
                f"{self.batch_shape}, {action} an operator of shape {tuple(self.shape)}; got {tuple(x.shape)}."
            )
        return batch

    def _checked_product(self, result, expected: tuple, block: torch.Tensor, method: str) -> torch.Tensor:
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != expected:
            got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
            raise ValueError(
                f"{type(self).__name__}.{method} must return a tensor of shape {expected} for an operator of shape "
                f"{tuple(self.shape)} and a block of shape {tuple(block.shape)}; got {got}."
            )
        return result

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
    """Wrap an explicit ``(*batch, n, m)`` tensor.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import DenseOperator
    >>> op = DenseOperator(torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64))
    >>> op.matvec(torch.tensor([1.0, 1.0], dtype=torch.float64)), op.rmatvec(torch.tensor([1.0, 1.0], dtype=torch.float64))
    (tensor([3., 7.], dtype=torch.float64), tensor([4., 6.], dtype=torch.float64))
    """

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
    """``diag(d)`` for ``d: (*batch, n)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import DiagonalOperator
    >>> DiagonalOperator(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).matvec(torch.ones(3, dtype=torch.float64))
    tensor([1., 2., 3.], dtype=torch.float64)
    """

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
    """``F_1 @ F_2 @ … @ F_r`` of operators or tensors, applied right to left.

    A low-rank factorisation ``U (W) V^T`` costs ``O((n + m) r k)`` per block of ``k`` vectors.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import ProductOperator
    >>> g = torch.Generator().manual_seed(0)
    >>> u, w = torch.randn(50, 3, generator=g, dtype=torch.float64), torch.randn(3, 3, generator=g, dtype=torch.float64)
    >>> op = ProductOperator(u, w, u.T)  # rank 3, 50 x 50, applied in O(50 * 3) per vector
    >>> op.shape, bool(torch.allclose(op.to_dense(), u @ w @ u.T))
    ((50, 50), True)
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
        batch = _broadcast(*(tuple(f.shape[:-2]) for f in self.factors))
        if batch is None:
            raise ValueError("`factors` must have batch dimensions that broadcast (*batch, n, m); got shapes "
                             f"{[tuple(f.shape) for f in self.factors]}.")
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

    def to_dense(self):
        """The last factor's dense matrix with the others applied on its left (no identity pushed through
        every factor: a sparse last factor forms its matrix in :math:`O(\\text{nonzeros})`)."""
        x = self.factors[-1].to_dense()
        for f in reversed(self.factors[:-1]):
            x = f.matmat(x)
        return x

    def to(self, dtype):
        return ProductOperator(*(f.to(dtype) for f in self.factors))


class SumOperator(LinearOperator):
    """``sum_i c_i A_i`` of operators of one shape.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import SumOperator
    >>> eye = torch.eye(2, dtype=torch.float64)
    >>> SumOperator([eye, 2 * eye], [1.0, -0.5]).to_dense()  # I - 0.5 * (2I) = 0
    tensor([[0., 0.],
            [0., 0.]], dtype=torch.float64)
    """

    def __init__(self, operators, coefficients):
        self.operators = [aslinearoperator(a) for a in operators]
        self.coefficients = [float(c) for c in coefficients]
        shapes = {tuple(a.shape[-2:]) for a in self.operators}
        if len(shapes) != 1:
            raise ValueError(f"`operators` must share their matrix shape; got {sorted(shapes)}.")
        batch = _broadcast(*(tuple(a.shape[:-2]) for a in self.operators))
        if batch is None:
            raise ValueError("`operators` must have batch dimensions that broadcast (*batch, n, m); got shapes "
                             f"{[tuple(a.shape) for a in self.operators]}.")
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
    """The transpose of an operator.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import AdjointOperator, DenseOperator
    >>> a = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    >>> AdjointOperator(DenseOperator(a)).shape, bool(torch.equal(DenseOperator(a).T.to_dense(), a.T))
    ((3, 1), True)
    """

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


def _broadcast(*shapes) -> tuple | None:
    """The broadcast of batch shapes, or None where they do not broadcast."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def aslinearoperator(x) -> LinearOperator:
    """Return ``x`` if it is an operator, else wrap a tensor in :class:`DenseOperator`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import DenseOperator, aslinearoperator
    >>> op = aslinearoperator(torch.eye(3, dtype=torch.float64))
    >>> op, aslinearoperator(op) is op
    (DenseOperator(shape=(3, 3), dtype=torch.float64), True)
    """
    if isinstance(x, LinearOperator):
        return x
    if isinstance(x, torch.Tensor):
        return DenseOperator(x)
    raise TypeError(f"expected a LinearOperator or torch.Tensor; got {type(x).__name__}.")
