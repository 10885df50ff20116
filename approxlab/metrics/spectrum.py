r"""Measures of a singular-value spectrum (Skyformer Appendix B): the scale-invariant metrics.

:func:`stable_rank`, :func:`numerical_rank` (and :func:`numerical_rank_lu`, the same count of a
square matrix with few small singular values from an LU factorisation), :func:`effective_rank`,
:func:`singular_value_decay_rate`, and :func:`spectrum_measures` (all of them, with the
condition number and the eps-ranks, from one set of singular values). Each is computed from
the input balanced by a power of two (:mod:`approxlab.linalg.scaling`), so ``1e-310 * M`` and
``1e308 * M`` give the same answer as ``M``. The conventions (batching, the return rule) are
those of :mod:`approxlab.metrics`.
"""

from __future__ import annotations

import math

import torch

from .._validation import (as_generator, check_dtype, check_int, check_positive_float, check_rtol, check_square,
                           check_tensor)
from ..linalg.conditioning import as_result, ratio_or_inf, relative_singular_values
from ..linalg.scaling import balance

__all__ = ["stable_rank", "numerical_rank", "numerical_rank_lu", "effective_rank", "singular_value_decay_rate", "spectrum_measures"]


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


def _rank_from_lu(m: torch.Tensor, rtol: float, block: int, tol: float, max_iter: int, generator) -> int | None:
    """:func:`numerical_rank_lu` of one balanced float64 matrix, or ``None`` where the iteration
    cannot decide it (non-finite solves, ``block - 1`` or more small singular values, no convergence)."""
    from .norms import spectral_norm
    from ..operators import aslinearoperator

    n = m.shape[-1]
    sigma_1 = float(spectral_norm(aslinearoperator(m), tol=1e-12, generator=generator))
    threshold = rtol * sigma_1
    lu, pivots, singular = torch.linalg.lu_factor_ex(m)
    if int(singular) != 0:  # an exact zero pivot: A is singular in floating point
        return None
    x = torch.linalg.qr(torch.randn(n, block, dtype=m.dtype, generator=generator)).Q
    previous = None
    for _ in range(max_iter):
        z = torch.linalg.lu_solve(lu, pivots, x, adjoint=True)  # A^{-T} X
        if not bool(torch.isfinite(z).all()):
            return None
        upper = 1.0 / torch.linalg.svdvals(z)  # upper[i] >= sigma_{n-i}(A), ascending
        small = int((upper <= threshold).sum())
        if small >= block - 1:
            return None
        lead = upper[: small + 1]
        if previous is not None and bool(((previous[: small + 1] - lead).abs() <= tol * lead).all()):
            return n - small
        previous = upper
        x = torch.linalg.qr(torch.linalg.lu_solve(lu, pivots, z)).Q  # (A^T A)^{-1} X, orthonormalised
    return None


def numerical_rank_lu(m: torch.Tensor, rtol: float = 1e-6, *, block: int = 32, tol: float = 1e-6,
                      max_iter: int = 20, generator: torch.Generator | None = None):
    r""":func:`numerical_rank` of a square matrix with few singular values below the threshold,
    from an LU factorisation instead of an SVD: :math:`\#\{i:\sigma_i > \text{rtol}\,\sigma_1\}`.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, n)``, finite; computed in float64.
    rtol : float
        Relative threshold, ``0 <= rtol < 1``.
    block : int
        Width of the iterated block, ``>= 2`` (at most ``n`` is used): at most ``block - 2``
        singular values below the threshold are counted this way; more fall back to the SVD.
    tol : float
        Relative change of the Ritz values between two steps at which the iteration stops, ``> 0``.
    max_iter : int
        Most steps, ``>= 1``; an iteration still moving after them falls back to the SVD.
    generator : torch.Generator, optional
        CPU generator of the start block and of the Lanczos start vector for :math:`\sigma_1`.

    Returns
    -------
    int or torch.Tensor
        int64, ``(*batch,)`` (an ``int`` for one matrix).

    Notes
    -----
    :math:`\sigma_1` is the Golub--Kahan estimate (:func:`~approxlab.metrics.spectral_norm`,
    relative tolerance ``1e-12``), so the threshold is :math:`\tau = \text{rtol}\,\sigma_1`. With
    :math:`PA = LU` (partial pivoting, :math:`\tfrac23 n^3` flops in level-3 BLAS, against about
    :math:`\tfrac83 n^3` for the bidiagonalisation of an SVD, half of it matrix--vector products),
    subspace iteration on :math:`(A^\top A)^{-1}` (Golub and Van Loan, Section 8.2.4) keeps an
    orthonormal block :math:`X` (``n x block``, a Gaussian start) and forms
    :math:`Z = A^{-\top}X` by two triangular solves. For orthonormal :math:`X`,
    :math:`\sigma_i(Z) = \sigma_i(X^\top A^{-1}) \le \sigma_i(A^{-1}) = 1/\sigma_{n+1-i}(A)`
    (interlacing), so :math:`u_i = 1/\sigma_i(Z) \ge \sigma_{n+1-i}(A)`: every :math:`u_i \le \tau`
    *certifies* a singular value of :math:`A` at or below :math:`\tau`, and the count ``s`` of them
    gives the rank bound :math:`\operatorname{rank} \le n - s`. The iteration stops when
    :math:`u_1, \dots, u_{s+1}` move by less than ``tol`` (relative) in one step, i.e. when
    :math:`u_{s+1} > \tau` has converged to :math:`\sigma_{n-s}(A)`, so no further singular value
    lies below :math:`\tau`; the start block reaches every singular direction with probability 1, and the
    convergence factor of :math:`u_i` per step is :math:`(\sigma_{n+1-i}/\sigma_{n-\text{block}})^2`.
    The factors carry the backward error of LU (:math:`\|E\| \approx \epsilon\|A\|` times the growth
    factor), of the order of an SVD's own, so the two counts agree except for a singular value
    within rounding of :math:`\tau`. Where the block fills (``block - 1`` or more small singular
    values), a solve is not finite (an exactly singular :math:`A`) or the iteration has not
    settled in ``max_iter`` steps, the count is :func:`numerical_rank`'s, from the SVD.

    References
    ----------
    Golub and Van Loan, *Matrix Computations*, 4th ed., Sections 3.4 (LU with partial pivoting),
    5.4.1 (numerical rank), 8.2.4 (orthogonal iteration).

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import numerical_rank_lu
    >>> m = torch.diag(torch.tensor([1.0, 1e-3, 1e-9, 0.5], dtype=torch.float64))
    >>> numerical_rank_lu(m, block=3, generator=torch.Generator().manual_seed(0))
    3
    """
    check_square(m, "M")
    rtol = check_rtol(rtol)
    block = min(check_int(block, "block", low=2), max(2, m.shape[-1]))
    tol = check_positive_float(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", low=1)
    generator = as_generator(generator)
    flat = m.to(torch.float64).reshape(-1, *m.shape[-2:])
    ranks = []
    for matrix in flat:
        matrix = balance(matrix)[0]
        rank = _rank_from_lu(matrix, rtol, block, tol, max_iter, generator) if bool(matrix.any()) else 0
        ranks.append(numerical_rank(matrix, rtol) if rank is None else rank)
    return as_result(torch.tensor(ranks, dtype=torch.int64).reshape(m.shape[:-2]))


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
