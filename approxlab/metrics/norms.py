r"""Spectral norms and errors, and the Loewner order: the scale-dependent metrics.

:func:`spectral_norm` and :func:`spectral_error` (dense: exact SVD; operators: Golub--Kahan
bidiagonalisation, :func:`approxlab.linalg.golub_kahan`) and :func:`loewner_min_eig`. A result
beyond the float64 range is an ``OverflowError``, never ``inf`` presented as a value. The
conventions (batching, the return rule) are those of :mod:`approxlab.metrics`.
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_int, check_positive_float, check_square, check_tensor
from ..linalg.conditioning import as_result
from ..linalg.lanczos import SpectralNormEstimate, golub_kahan
from ..linalg.scaling import balance, balancing_exponent, log10_magnitude, times_power_of_two
from ..operators import LinearOperator, aslinearoperator

__all__ = ["spectral_norm", "spectral_error", "loewner_min_eig"]


def _rescaled(value: torch.Tensor, exponent: torch.Tensor, what: str) -> torch.Tensor:
    """``value * 2**exponent`` (shapes alike), or ``OverflowError`` naming ``what`` where that is
    beyond the float64 range (rather than returning ``inf`` as if it were the answer)."""
    result = times_power_of_two(value, exponent)
    beyond = ~torch.isfinite(result)
    if bool(beyond.any()):
        size = max(log10_magnitude(float(v), float(e)) for v, e in
                   zip(value[beyond].tolist(), exponent.expand_as(value)[beyond].tolist()))
        raise OverflowError(
            f"{what} is about 1e+{size:.0f}, beyond the largest float64 "
            f"({torch.finfo(torch.float64).max:.3e}); rescale the input."
        )
    return result


def _matrix_like(x, name: str):
    """A tensor (checked), a LinearOperator, or an ``Approximation`` (its ``.operator()``)."""
    if isinstance(x, torch.Tensor):
        return check_tensor(x, name)
    if isinstance(x, LinearOperator):
        return x
    operator = getattr(x, "operator", None)
    if callable(operator):  # approxlab.methods.Approximation (duck-typed: no import cycle)
        op = operator()
        if isinstance(op, LinearOperator):
            return op
    raise TypeError(
        f"`{name}` must be a torch.Tensor, a LinearOperator or an Approximation; got {type(x).__name__}."
    )


GRAM_ASPECT = 8
"""A dense matrix whose longer side is at least this many times its shorter one has its spectral norm from the
smaller Gram matrix (:func:`_largest_singular_value`)."""


def _largest_singular_value(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma_{\max}` of each float64 matrix of ``x`` ``(*batch, n, m)`` (balanced: entries below 1),
    ``(*batch,)``.

    Where :math:`\max(n, m) \ge` :data:`GRAM_ASPECT` :math:`\min(n, m)`: :math:`\sqrt{\lambda_{\max}(G)}` of the
    smaller Gram matrix :math:`G = X^\top X` (or :math:`XX^\top`), :math:`2nm^2` flops and an :math:`m \times m`
    eigenproblem in place of the SVD of :math:`X` (3x faster at ``(12, 4096, 64)`` on one thread). The same number
    to rounding: :math:`\sigma_{\max}^2 = \lambda_{\max}(G)`, the computed :math:`G` is within
    :math:`\gamma_n\,\||X|\|_2^2 \le \gamma_n\min(n, m)\,\|X\|_2^2` of it (Higham (3.13)) and a symmetric
    eigensolver is backward stable, so the relative error is at most about :math:`\tfrac12(n+m)\min(n,m)\,\varepsilon`
    in the worst case (:math:`\approx 10^{-15}` on error matrices: ``tests/test_metrics.py``). Elsewhere the SVD
    (``torch.linalg.matrix_norm(x, 2)``).
    """
    n, m = x.shape[-2], x.shape[-1]
    if max(n, m) < GRAM_ASPECT * min(n, m):
        return torch.linalg.matrix_norm(x, ord=2)
    gram = x.transpose(-1, -2) @ x if n >= m else x @ x.transpose(-1, -2)
    return torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0.0).sqrt()


def _dense_estimate(value: torch.Tensor) -> SpectralNormEstimate:
    zero = torch.zeros_like(value)
    return SpectralNormEstimate(
        estimate=value,
        lower_bound=value.clone(),
        residual=zero,
        distance_bound=zero.clone(),
        num_matvecs=0,
        converged=torch.ones(value.shape, dtype=torch.bool, device=value.device),
    )


def spectral_norm(
    x,
    *,
    tol: float = 1e-10,
    max_iter: int = 300,
    generator: torch.Generator | None = None,
    return_info: bool = False,
):
    r"""Spectral norm :math:`\|X\|_2 = \sigma_{\max}(X)` of a batch of matrices or an operator.

    Parameters
    ----------
    x : torch.Tensor or LinearOperator or Approximation
        ``(*batch, n, m)``. A tensor: exact, from the SVD in float64 (a tall or wide one from its smaller Gram
        matrix, the same to rounding: :data:`GRAM_ASPECT`). An operator (or an
        :class:`~approxlab.methods.Approximation`, via ``.operator()``): Golub--Kahan
        bidiagonalisation of ``x.to(torch.float64)``, matrix-free.
    tol : float
        Relative tolerance of the operator path, ``> 0`` (see
        :func:`approxlab.linalg.golub_kahan`). Ignored for tensors.
    max_iter : int
        Most bidiagonalisation steps, ``>= 1``. Ignored for tensors.
    generator : torch.Generator, optional
        CPU generator for the start vector of the operator path.
    return_info : bool
        Return the full :class:`~approxlab.linalg.SpectralNormEstimate` (estimate, certified
        lower bound, residual, distance bound, matvecs, converged) instead of the estimate.
        For a tensor it holds the exact value, residual 0 and 0 matvecs.

    Returns
    -------
    float or torch.Tensor or SpectralNormEstimate
        float64, ``(*batch,)`` (a ``float`` for one matrix).

    Warns
    -----
    ConvergenceWarning
        Operator path, if some element has not converged in ``max_iter`` steps.

    Notes
    -----
    The operator estimate is the largest Ritz singular value, a certified lower bound on
    :math:`\|X\|_2`; the returned ``residual`` certifies that a singular value lies within
    ``residual / sqrt(2)`` of it (Golub and Kahan, 1965; see
    :class:`~approxlab.linalg.SpectralNormEstimate`).

    References
    ----------
    G. Golub and W. Kahan (1965), "Calculating the singular values and pseudo-inverse of a
    matrix", SIAM J. Numer. Anal. Ser. B 2(2).

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import spectral_norm
    >>> from approxlab.operators import DenseOperator
    >>> m = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    >>> spectral_norm(m)
    3.0
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(2, 40, 30, generator=g, dtype=torch.float64)
    >>> estimate = spectral_norm(DenseOperator(x), generator=torch.Generator().manual_seed(1))  # matrix-free
    >>> bool(torch.allclose(estimate, torch.linalg.matrix_norm(x, ord=2)))
    True
    """
    x = _matrix_like(x, "x")
    tol = check_positive_float(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", low=1)
    generator = as_generator(generator)
    if not isinstance(return_info, bool):
        raise TypeError(f"`return_info` must be a bool; got {return_info!r}.")

    if isinstance(x, torch.Tensor):
        scaled, exponent = balance(x.to(torch.float64))
        value = _rescaled(_largest_singular_value(scaled), exponent[..., 0, 0], "the spectral norm of `x`")
        if return_info:
            return _dense_estimate(value)
        return as_result(value)
    info = golub_kahan(x.to(torch.float64), tol=tol, max_iter=max_iter, generator=generator)
    if return_info:
        return info
    return as_result(info.estimate)


def spectral_error(
    approx,
    exact,
    *,
    relative: bool = False,
    tol: float = 1e-10,
    max_iter: int = 300,
    generator: torch.Generator | None = None,
):
    r"""Spectral-norm error :math:`\|\tilde M - M\|_2` (divided by :math:`\|M\|_2` if ``relative``).

    Parameters
    ----------
    approx, exact : torch.Tensor or LinearOperator or Approximation
        ``(*batch, n, m)`` each (batch dimensions broadcast; the matrix shapes must agree).
        An ``Approximation`` contributes its ``.operator()``, e.g.
        ``spectral_error(approximate(...), ExactAttentionOperator(q, k))``.
    relative : bool
        Divide by :math:`\|M\|_2` of ``exact``, which must be nonzero (0/0 is undefined: a
        ``ValueError``). A tiny norm -- subnormal entries included -- counts like any other:
        the dense path divides in one common power of two, so the ratio is exact wherever it is
        representable; a ratio beyond the float64 range (a reference far smaller than the
        error) is an ``OverflowError``, never ``inf``.
    tol, max_iter, generator
        For the operator path, as in :func:`spectral_norm`.

    Returns
    -------
    float or torch.Tensor
        float64, ``(*batch,)`` (a ``float`` for one matrix).

    Notes
    -----
    Both tensors: the difference is formed in float64 and its norm taken by SVD (exact).
    Otherwise the difference is the lazy operator ``approx.to(float64) - exact.to(float64)``
    and its norm is estimated by Golub--Kahan bidiagonalisation (a certified lower bound,
    converged to ``tol``), at the cost of two products with each operand per step: with an
    :class:`~approxlab.operators.ExactAttentionOperator` nothing ``n x n`` is formed. This is
    the error measure of Skyformer's Figure 1.

    References
    ----------
    Chen et al. (2021), Skyformer, Section 5.1 / Figure 1 (spectral-norm approximation error).
    Golub and Kahan (1965).

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import spectral_error
    >>> exact = torch.eye(3, dtype=torch.float64)
    >>> approx = torch.diag(torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64))
    >>> spectral_error(approx, exact), spectral_error(approx, 2 * exact, relative=True)
    (0.5, 0.75)
    """
    approx = _matrix_like(approx, "approx")
    exact = _matrix_like(exact, "exact")
    if not isinstance(relative, bool):
        raise TypeError(f"`relative` must be a bool; got {relative!r}.")
    tol = check_positive_float(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", low=1)
    generator = as_generator(generator)
    shape_a, shape_e = tuple(approx.shape), tuple(exact.shape)
    try:
        torch.broadcast_shapes(shape_a[:-2], shape_e[:-2])
        compatible = shape_a[-2:] == shape_e[-2:]
    except RuntimeError:
        compatible = False
    if not compatible:
        raise ValueError(
            f"`approx` and `exact` must have the same shape (*batch, n, m) (batch dims may "
            f"broadcast); got {shape_a} and {shape_e}."
        )
    if approx.device != exact.device:
        raise ValueError(f"`approx` and `exact` must be on one device; got {approx.device} and {exact.device}.")

    if isinstance(approx, torch.Tensor) and isinstance(exact, torch.Tensor):
        error, scale = _dense_error(approx.to(torch.float64), exact.to(torch.float64), relative)
    else:
        difference = aslinearoperator(approx).to(torch.float64) - aslinearoperator(exact).to(torch.float64)
        error = golub_kahan(difference, tol=tol, max_iter=max_iter, generator=generator).estimate
        scale = None
        if relative:
            scale = spectral_norm(exact, tol=tol, max_iter=max_iter, generator=generator, return_info=True).estimate
    if relative:
        scale = scale.to(error.device)
        if bool((scale == 0).any()):
            raise ValueError(
                f"`exact` has spectral norm 0 in {int((scale == 0).sum())} batch element(s): the "
                "relative error is undefined; use relative=False."
            )
        ratio = error / scale
        beyond = ~torch.isfinite(ratio)
        if bool(beyond.any()):
            size = max(math.log10(e) - math.log10(c) for e, c in zip(error[beyond].tolist(), scale[beyond].tolist()))
            raise OverflowError(
                f"the relative error ||approx - exact||_2 / ||exact||_2 is about 1e+{size:.0f}, beyond the largest "
                f"float64 ({torch.finfo(torch.float64).max:.3e}): the spectral norm of `exact` is too small against "
                "the error (e.g. a subnormal reference); use relative=False."
            )
        error = ratio
    return as_result(error)


def _dense_error(approx: torch.Tensor, exact: torch.Tensor, relative: bool):
    """``(||approx - exact||_2, ||exact||_2 or None)``; with ``relative``, both in the units of one
    common power of two (their ratio is exact), else the error itself (``OverflowError`` when it
    is beyond the float64 range)."""
    exponent = torch.maximum(balancing_exponent(approx), balancing_exponent(exact))
    approx, exact = times_power_of_two(approx, -exponent), times_power_of_two(exact, -exponent)
    error = torch.linalg.matrix_norm(approx - exact, ord=2)
    if relative:
        return error, torch.linalg.matrix_norm(exact, ord=2)
    return _rescaled(error, exponent[..., 0, 0].expand_as(error), "the spectral norm of `approx - exact`"), None


def loewner_min_eig(a: torch.Tensor, b: torch.Tensor):
    r"""Smallest eigenvalue of the symmetric part of :math:`A - B`.

    Parameters
    ----------
    a, b : torch.Tensor
        ``(*batch, n, n)`` each (batch dims broadcast), finite.

    Returns
    -------
    float or torch.Tensor
        :math:`\lambda_{\min}\bigl(\tfrac12[(A-B) + (A-B)^\top]\bigr)` in float64,
        ``(*batch,)``. :math:`A \succeq B` in the Loewner order iff it is :math:`\ge 0`;
        compare with ``-tol * max(||A||_2, ||B||_2)`` to allow for rounding.

    Notes
    -----
    For symmetric :math:`A, B` the symmetric part is :math:`A - B` itself; symmetrising only
    removes rounding asymmetry. Used to check :math:`\tilde{\bar B} \preceq \bar B` for the
    Nyström approximation of the PSD completion (Skyformer Section 4.3, Eqs. (4)-(6)).

    References
    ----------
    R. A. Horn and C. R. Johnson, *Matrix Analysis*, 2nd ed. (2013), Section 7.7 (Loewner
    order). Chen et al. (2021), Skyformer, Section 4.3.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import loewner_min_eig
    >>> a = torch.diag(torch.tensor([2.0, 1.0], dtype=torch.float64))
    >>> loewner_min_eig(a, 0.5 * a)  # A - B = diag(1, 0.5): A dominates B
    0.5
    """
    check_square(a, "A")
    check_square(b, "B")
    try:
        torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        compatible = a.shape[-1] == b.shape[-1]
    except RuntimeError:
        compatible = False
    if not compatible:
        raise ValueError(
            f"`A` and `B` must have the same shape (*batch, n, n) (batch dims may broadcast); got "
            f"{tuple(a.shape)} and {tuple(b.shape)}."
        )
    a, b = a.to(torch.float64), b.to(torch.float64).to(a.device)
    exponent = torch.maximum(balancing_exponent(a), balancing_exponent(b))  # one power of two: exact
    difference = times_power_of_two(a, -exponent) - times_power_of_two(b, -exponent)
    symmetric = 0.5 * difference + 0.5 * difference.transpose(-1, -2)
    smallest = torch.linalg.eigvalsh(symmetric)[..., 0]
    return as_result(_rescaled(smallest, exponent[..., 0, 0].expand_as(smallest), "lambda_min of `A - B`"))
