r"""A truncated Moore--Penrose pseudo-inverse whose backward pass needs no singular-value gaps.

Differentiating a pseudo-inverse through ``torch.linalg.svd`` divides by
:math:`\sigma_i^2 - \sigma_j^2`, which is infinite (``inf``/``NaN`` gradients) as soon as two
singular values coincide -- e.g. a landmark core with repeated rows, whose zero singular
values repeat. The derivative of the pseudo-inverse itself has no such term. For
:math:`X = A^+` and a perturbation :math:`dA` that keeps the rank (Golub and Pereyra, 1973,
Theorem 4.3),

.. math::

    dX = -X\,dA\,X + XX^\top dA^\top (I - AX) + (I - XA)\,dA^\top X^\top X,

so a loss :math:`L` with :math:`G = \partial L/\partial X` has

.. math::

    \frac{\partial L}{\partial A} = -X^\top G X^\top + (I - AX)\,G^\top XX^\top
                                    + X^\top X\,G^\top (I - XA),

built from :math:`X` and :math:`A` alone: finite wherever :math:`X` is, including at repeated
and zero singular values. :func:`pinv` computes :math:`X` by a truncated SVD (without autograd)
and differentiates with this formula.

The truncated pseudo-inverse is discontinuous where the numerical rank changes; the formula
is its derivative on the set of constant numerical rank (the one-sided limit elsewhere), which
for an exactly rank-deficient :math:`A` is also the derivative of
:math:`A \mapsto (A_r)^+` with :math:`A_r` the rank-:math:`r` truncation.

References
----------
Golub, G. H. and Pereyra, V. (1973). The differentiation of pseudo-inverses and nonlinear
least squares problems whose variables separate. SIAM J. Numer. Anal. 10(2), 413-432, Theorem 4.3.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_float, check_tensor
from .conditioning import default_rtol_for_shape

__all__ = ["pinv", "pinv_and_rank", "pinv_backward", "truncated_svd"]


def truncated_svd(matrix: torch.Tensor, rtol: float):
    r"""Reduced SVD with singular values :math:`\le` ``rtol`` :math:`\sigma_1` treated as zero.

    Returns ``(W, sigma_pinv, R, rank)`` with ``matrix ≈ W diag(sigma) R^T``,
    ``sigma_pinv = 1/sigma`` on the kept values and ``0`` elsewhere, ``rank: (*batch,)`` int64.
    Plain ``torch.linalg.svd`` (its autograd is *not* gap-free; :func:`pinv` does not use it).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.pinv_autograd import truncated_svd
    >>> w, sigma_pinv, r, rank = truncated_svd(torch.diag(torch.tensor([2.0, 1e-20], dtype=torch.float64)), 1e-10)
    >>> int(rank), sigma_pinv.tolist()
    (1, [0.5, 0.0])
    """
    w, sigma, rh = torch.linalg.svd(matrix, full_matrices=False)
    keep = sigma > rtol * sigma[..., :1]
    safe = torch.where(keep, sigma, torch.ones_like(sigma))
    sigma_pinv = torch.where(keep, 1.0 / safe, torch.zeros_like(sigma))
    return w, sigma_pinv, rh.transpose(-1, -2), keep.sum(-1)


def _truncated_pinv(a: torch.Tensor, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A_r^+, r)``: pseudo-inverse of the rank-``r`` truncation, ``r = #{sigma > rtol sigma_1}``."""
    w, sigma_pinv, r, rank = truncated_svd(a, rtol)
    return (r * sigma_pinv.unsqueeze(-2)) @ w.transpose(-1, -2), rank


def pinv_backward(grad: torch.Tensor, a: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    r""":math:`\partial L/\partial A` from :math:`G = \partial L/\partial A^+` (Golub--Pereyra formula).

    Parameters
    ----------
    grad : torch.Tensor
        ``(*batch, n, m)``, :math:`G`.
    a : torch.Tensor
        ``(*batch, m, n)``, :math:`A`.
    inverse : torch.Tensor
        ``(*batch, n, m)``, :math:`X = A^+` (or its truncation).

    Returns
    -------
    torch.Tensor
        ``(*batch, m, n)``,
        :math:`-X^\top GX^\top + (I - AX)G^\top XX^\top + X^\top XG^\top(I - XA)`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.pinv_autograd import pinv_backward
    >>> g = torch.Generator().manual_seed(0)
    >>> a = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    >>> grad = torch.randn(3, 4, generator=g, dtype=torch.float64)
    >>> expected, = torch.autograd.grad(torch.linalg.pinv(a), a, grad)  # full rank: torch's gradient is right
    >>> bool(torch.allclose(pinv_backward(grad, a.detach(), torch.linalg.pinv(a.detach())), expected))
    True
    """
    xt = inverse.transpose(-1, -2)
    gt = grad.transpose(-1, -2)
    term_range = gt @ (inverse @ xt)
    term_range = term_range - a @ (inverse @ term_range)  # (I - AX) G^T X X^T
    term_corange = (xt @ inverse) @ gt
    term_corange = term_corange - (term_corange @ inverse) @ a  # X^T X G^T (I - XA)
    return -(xt @ grad @ xt) + term_range + term_corange


class _Pinv(torch.autograd.Function):
    """Truncated SVD pseudo-inverse forward, Golub--Pereyra backward."""

    @staticmethod
    def forward(ctx, a, rtol):
        inverse, rank = _truncated_pinv(a, rtol)
        ctx.save_for_backward(a, inverse)
        ctx.mark_non_differentiable(rank)
        return inverse, rank

    @staticmethod
    def backward(ctx, grad, _grad_rank):
        a, inverse = ctx.saved_tensors
        return pinv_backward(grad, a, inverse), None


def pinv_and_rank(a: torch.Tensor, *, rtol: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Truncated pseudo-inverse :math:`A_r^+` and numerical rank :math:`r`, with a gap-free backward.

    Parameters
    ----------
    a : torch.Tensor
        ``(*batch, m, n)``, finite.
    rtol : float, optional
        Singular values :math:`\le` ``rtol`` :math:`\sigma_1` are treated as zero; ``0 <= rtol < 1``.
        Default ``max(m, n) * eps`` of ``a.dtype`` (``torch.linalg.pinv``'s default cut-off).

    Returns
    -------
    inverse : torch.Tensor
        ``(*batch, n, m)``, :math:`A_r^+`; differentiable (see the module docstring).
    rank : torch.Tensor
        ``(*batch,)`` int64, :math:`r` (not differentiable). A zero matrix has rank 0 and
        pseudo-inverse 0.

    Examples
    --------
    >>> import torch
    >>> a = torch.tensor([[1.0, 2.0], [1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    >>> x, r = pinv_and_rank(a)
    >>> int(r), bool(torch.isfinite(torch.autograd.grad(x.sum(), a)[0]).all())
    (1, True)
    """
    check_tensor(a, "a")
    if rtol is None:
        rtol = default_rtol_for_shape(a.shape[-2], a.shape[-1], a.dtype)
    else:
        rtol = check_positive_float(rtol, "rtol", allow_zero=True)
        if rtol >= 1:
            raise ValueError(f"`rtol` must satisfy 0 <= rtol < 1; got {rtol}.")
    return _Pinv.apply(a, rtol)


def pinv(a: torch.Tensor, *, rtol: float | None = None) -> torch.Tensor:
    r"""Truncated pseudo-inverse ``(*batch, n, m)`` of ``a: (*batch, m, n)``; see :func:`pinv_and_rank`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.pinv_autograd import pinv
    >>> a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)  # rank 1
    >>> bool(torch.allclose(pinv(a), torch.linalg.pinv(a)))
    True
    """
    return pinv_and_rank(a, rtol=rtol)[0]
