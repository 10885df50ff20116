r"""Every metric of the spectral-error studies, in one place.

* spectral norms and errors: :func:`spectral_norm`, :func:`spectral_error` (dense: exact SVD;
  operators: Golub--Kahan bidiagonalisation, :func:`approxlab.linalg.golub_kahan`);
* conditioning: :func:`condition_number` (``inf`` when numerically singular),
  :func:`is_numerically_singular`;
* the singular-value study (Skyformer Appendix B): :func:`stable_rank`,
  :func:`numerical_rank`, :func:`effective_rank`, :func:`singular_value_decay_rate`;
* Loewner order: :func:`loewner_min_eig`;
* ridge leverage (Skyformer Theorem 2), re-exported from :mod:`approxlab.leverage`:
  ``ridge_leverage_scores``, ``statistical_dimension``, ``coherence``,
  ``approximate_ridge_leverage_scores``.

Conventions
-----------
Inputs are batched ``(*batch, n, m)``; computations are in float64. **One return rule** for
every scalar metric here and in :mod:`approxlab.leverage` (that of NumPy's ``linalg.cond`` and
``matrix_rank``): for a single matrix ``(n, m)`` a Python scalar -- ``float``, ``int`` for
:func:`numerical_rank`, ``bool`` for :func:`is_numerically_singular`; for a batch a tensor of
shape ``(*batch,)`` -- float64, int64 or bool. Per-row quantities (leverage scores) are tensors
``(*batch, N)``; ``return_info=True`` returns the :class:`SpectralNormEstimate` of tensors.

Scale: the scale-invariant metrics (condition number, ranks, decay rate, relative errors) are
computed from the input balanced by a power of two (:mod:`approxlab.linalg.scaling`), so
``1e-310 * M`` and ``1e308 * M`` give the same answer as ``M``; a scale-dependent result
(a norm, an error, :math:`\lambda_{\min}`) that lies beyond the float64 range is an
``OverflowError``, never ``inf`` presented as a value.
"""

from __future__ import annotations

import math

import torch

from ._validation import (
    as_generator,
    check_dtype,
    check_int,
    check_positive_float,
    check_rtol,
    check_square,
    check_tensor,
)
from .leverage import (
    approximate_ridge_leverage_scores,
    coherence,
    ridge_leverage_scores,
    statistical_dimension,
)
from .linalg.conditioning import (
    as_result,
    condition_number,
    is_numerically_singular,
    ratio_or_inf,
    relative_singular_values,
)
from .linalg.lanczos import SpectralNormEstimate, golub_kahan
from .linalg.scaling import balance, balancing_exponent, log10_magnitude, times_power_of_two
from .operators import LinearOperator, aslinearoperator

__all__ = [
    "spectral_norm",
    "spectral_error",
    "SpectralNormEstimate",
    "condition_number",
    "is_numerically_singular",
    "stable_rank",
    "numerical_rank",
    "effective_rank",
    "singular_value_decay_rate",
    "spectrum_measures",
    "loewner_min_eig",
    "ridge_leverage_scores",
    "statistical_dimension",
    "coherence",
    "approximate_ridge_leverage_scores",
]


def _relative(sigma: torch.Tensor) -> torch.Tensor:
    """:math:`\\sigma_i/\\sigma_1` (a zero ``sigma_1`` is refused by the callers): squares and sums
    of the relative values cannot overflow, those of ``sigma`` itself can (``1e200**2``)."""
    top = sigma[..., :1]
    return sigma / torch.where(top > 0, top, torch.ones_like(top))


def _stable_rank_of(sigma: torch.Tensor) -> torch.Tensor:
    """:math:`\\sum_i\\sigma_i^2/\\sigma_1^2` of descending singular values ``(*batch, r)``."""
    return (_relative(sigma) ** 2).sum(-1)


def _effective_rank_of(sigma: torch.Tensor) -> torch.Tensor:
    """Roy--Vetterli :math:`\\exp H(\\sigma/\\sum\\sigma)` with :math:`0\\log 0 = 0`."""
    relative = _relative(sigma)
    p = relative / relative.sum(-1, keepdim=True)
    entropy = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p)).sum(-1)
    return torch.exp(entropy)


def _decay_fit(lead: torch.Tensor, level: float):
    """Least-squares slope of :math:`\\log\\sigma_i` on :math:`i` over ``lead`` ``(*batch, num)``,
    leaving out values at or below ``level * sigma_1``; returns ``(slope, count)`` (the slope
    is meaningful only where ``count >= 2``)."""
    weight = (lead > level * lead[..., :1]).to(torch.float64)
    count = weight.sum(-1)
    index = torch.arange(lead.shape[-1], dtype=torch.float64, device=lead.device)
    y = torch.log(torch.where(weight > 0, lead, torch.ones_like(lead)))
    index_mean = (weight * index).sum(-1, keepdim=True) / count.clamp_min(1).unsqueeze(-1)
    y_mean = (weight * y).sum(-1, keepdim=True) / count.clamp_min(1).unsqueeze(-1)
    centred = weight * (index - index_mean)
    slope = (centred * (y - y_mean)).sum(-1) / (centred * (index - index_mean)).sum(-1).clamp_min(1e-300)
    return slope, count


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
        ``(*batch, n, m)``. A tensor: exact, from the SVD in float64. An operator (or an
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
        value = _rescaled(torch.linalg.matrix_norm(scaled, ord=2), exponent[..., 0, 0], "the spectral norm of `x`")
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
        Divide by :math:`\|M\|_2` of ``exact`` (which must be nonzero).
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
        error = error / scale
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


def stable_rank(m: torch.Tensor):
    r"""Stable rank :math:`\|M\|_F^2 / \|M\|_2^2 = \sum_i \sigma_i^2/\sigma_1^2`.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite, nonzero.

    Returns
    -------
    float or torch.Tensor
        In :math:`[1, \operatorname{rank} M]`; ``(*batch,)`` float64.

    Notes
    -----
    The quantity ``s`` of Skyformer's Lemma C.2 (:math:`d \ge \tfrac{28}{3}\tfrac{s}{\beta}
    \log\tfrac{2n}{\delta}`), where :math:`s \le 2 d_{\text{stat}}`.

    References
    ----------
    Rudelson and Vershynin (2007), "Sampling from large matrices"; Chen et al. (2021),
    Skyformer, Lemma C.2.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import stable_rank
    >>> stable_rank(torch.diag(torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)))  # (4 + 1 + 1) / 4
    1.5
    """
    sigma = relative_singular_values(m)
    _check_nonzero(sigma, "stable rank")
    return as_result(_stable_rank_of(sigma))


def _check_nonzero(sigma, what):
    zero = sigma[..., 0] == 0
    if bool(zero.any()):
        raise ValueError(f"`M` must be nonzero: the {what} of a zero matrix is undefined; got "
                         f"{int(zero.sum())} zero matrices.")


def numerical_rank(m: torch.Tensor, rtol: float = 1e-6):
    r"""Number of singular values above ``rtol`` times the largest: :math:`\#\{i:\sigma_i > \text{rtol}\,\sigma_1\}`.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite.
    rtol : float
        Relative threshold, ``0 <= rtol < 1`` (Skyformer Appendix B uses 1e-6).

    Returns
    -------
    int or torch.Tensor
        int64, ``(*batch,)`` (an ``int`` for one matrix); 0 for a zero matrix.

    References
    ----------
    Golub and Van Loan, *Matrix Computations*, 4th ed., Section 5.4.1.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import numerical_rank
    >>> numerical_rank(torch.diag(torch.tensor([1.0, 1e-3, 1e-9], dtype=torch.float64)))
    2
    """
    check_tensor(m, "M")
    rtol = check_rtol(rtol)
    sigma = relative_singular_values(m)
    return as_result((sigma > rtol * sigma[..., :1]).sum(-1))


def effective_rank(m: torch.Tensor):
    r"""Effective rank of Roy and Vetterli (2007): :math:`\exp(H(p))`, :math:`p_i = \sigma_i/\sum_j\sigma_j`.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite, nonzero.

    Returns
    -------
    float or torch.Tensor
        In :math:`[1, \operatorname{rank} M]`; ``(*batch,)`` float64.

    Notes
    -----
    :math:`H(p) = -\sum_i p_i \log p_i` with :math:`0\log 0 = 0` (Definition 1 of Roy and
    Vetterli). Equals :math:`r` for :math:`r` equal nonzero singular values.

    References
    ----------
    O. Roy and M. Vetterli (2007), "The effective rank: a measure of effective
    dimensionality", EUSIPCO, Definition 1.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import effective_rank
    >>> round(effective_rank(torch.eye(4, dtype=torch.float64)), 6)  # four equal singular values
    4.0
    """
    sigma = relative_singular_values(m)
    _check_nonzero(sigma, "effective rank")
    return as_result(_effective_rank_of(sigma))


def singular_value_decay_rate(m: torch.Tensor, num: int = 64):
    r"""Least-squares slope of :math:`\log\sigma_i` against :math:`i` over the first ``num`` indices.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite.
    num : int
        Number of leading singular values, ``>= 2``; ``min(num, min(n, k))`` are used.

    Returns
    -------
    float or torch.Tensor
        The slope :math:`c` in :math:`\sigma_i \approx C e^{c i}` (natural log, per index);
        negative for a decaying spectrum, 0 for a flat one. ``(*batch,)`` float64.

    Raises
    ------
    ValueError
        If fewer than 2 of the leading singular values are above the numerical-zero level
        :math:`\max(n,k)\,\varepsilon\,\sigma_1` (with :math:`\varepsilon` of ``m.dtype``).

    Notes
    -----
    Singular values at or below the numerical-zero level (whose logarithm is rounding noise
    or :math:`-\infty`) are left out of the fit, per matrix. The fit is ordinary least squares
    of :math:`y_i = \log \sigma_i` on :math:`i = 0, \dots, \text{num}-1`:
    :math:`c = \sum_i (i-\bar i)(y_i-\bar y)/\sum_i (i-\bar i)^2`. Used for the singular-value
    decay study of Skyformer Appendix B.

    References
    ----------
    Chen et al. (2021), Skyformer, Appendix B (singular-value decay of attention matrices).

    Examples
    --------
    >>> import math, torch
    >>> from approxlab.metrics import singular_value_decay_rate
    >>> sigma = torch.exp(-0.5 * torch.arange(10, dtype=torch.float64))  # sigma_i = e^(-i/2)
    >>> round(singular_value_decay_rate(torch.diag(sigma)), 6)
    -0.5
    """
    check_tensor(m, "M")
    num = check_int(num, "num", low=2)
    sigma = relative_singular_values(m)[..., :num]
    level = max(m.shape[-2], m.shape[-1]) * torch.finfo(m.dtype).eps
    slope, count = _decay_fit(sigma, level)
    if bool((count < 2).any()):
        raise ValueError(
            f"`M` must have at least 2 singular values above the numerical-zero level "
            f"{level:.1e} * sigma_1 among the first num={num}; got {int(count.min())}."
        )
    return as_result(slope)


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


def spectrum_measures(sigma: torch.Tensor, shape, *, rtol: float = 1e-6, num: int = 64,
                      eps=(0.1, 0.01), dtype=torch.float64) -> dict:
    r"""Rank, conditioning and decay measures of one matrix from its singular values.

    Parameters
    ----------
    sigma : torch.Tensor
        ``(*batch, r)`` singular values (or eigenvalues of a PSD matrix), descending, >= 0.
    shape : tuple of int
        ``(n, k)`` of the matrix (for the singularity threshold).
    rtol : float
        Relative threshold of the numerical rank (Skyformer Appendix B: 1e-6).
    num : int
        Leading singular values in the decay fit.
    eps : sequence of float
        :math:`\lambda = \epsilon\sigma_1` of the statistical dimensions.
    dtype : torch.dtype
        Precision the matrix was formed in (the singularity threshold is
        :math:`\max(n,k)\,\varepsilon_{dtype}`, as :func:`approxlab.metrics.condition_number`).

    Returns
    -------
    dict of str -> torch.Tensor ``(*batch,)``
        ``numerical_rank``, ``stable_rank``, ``effective_rank``, ``decay_rate``,
        ``condition_number`` (``inf`` if singular), ``statistical_dimension_<eps>``.

    Notes
    -----
    The same definitions, and the same code, as :func:`numerical_rank`, :func:`stable_rank`
    (:math:`\sum\sigma_i^2/\sigma_1^2`), :func:`effective_rank` (:math:`\exp H(\sigma/\sum\sigma)`),
    :func:`singular_value_decay_rate` (0 where fewer than 2 values are above the numerical-zero
    level, instead of raising) and :func:`condition_number`, and
    :math:`d_{stat}(\lambda) = \sum_i \sigma_i/(\sigma_i+\lambda)` (Skyformer Theorem 2; for
    a non-PSD matrix this is the statistical dimension of :math:`(M^\top M)^{1/2}`), computed
    from one SVD instead of one per measure.

    References
    ----------
    Skyformer Theorem 2 and Appendix B; Roy and Vetterli (2007); Golub and Van Loan 5.4.1.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import spectrum_measures
    >>> sigma = torch.tensor([4.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    >>> measures = spectrum_measures(sigma, (4, 4))
    >>> int(measures["numerical_rank"]), float(measures["stable_rank"]), float(measures["condition_number"])
    (3, 1.3125, inf)
    """
    check_tensor(sigma, "sigma", min_ndim=1)
    if not (isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 2):
        raise ValueError(f"`shape` must be a pair (n, k); got {shape!r}.")
    shape = tuple(check_int(size, "shape", low=1) for size in shape)
    rtol = check_rtol(rtol)
    num = check_int(num, "num", low=2)
    eps = [check_positive_float(e, "eps") for e in (eps if isinstance(eps, (tuple, list)) else [eps])]
    check_dtype(dtype)
    sigma = balance(sigma.to(torch.float64).clamp_min(0.0), dim=-1)[0]  # every measure is scale-invariant
    s1 = sigma[..., :1]
    if bool((s1 == 0).any()):
        raise ValueError("`sigma` must belong to nonzero matrices; got a zero largest singular value.")
    out = {"numerical_rank": (sigma > rtol * s1).sum(-1).to(torch.float64)}
    out["stable_rank"] = _stable_rank_of(sigma)
    out["effective_rank"] = _effective_rank_of(sigma)
    level = max(shape) * torch.finfo(dtype).eps
    slope, count = _decay_fit(sigma[..., :num], level)
    out["decay_rate"] = torch.where(count >= 2, slope, torch.zeros_like(slope))
    singular = sigma[..., -1] <= level * s1[..., 0]
    kappa = ratio_or_inf(s1[..., 0], sigma[..., -1])
    out["condition_number"] = torch.where(singular, torch.full_like(kappa, math.inf), kappa)
    for e in eps:
        lam = e * s1
        out[f"statistical_dimension_{e:g}"] = (sigma / (sigma + lam)).sum(-1)
    return out
