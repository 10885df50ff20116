r"""Ridge leverage scores, statistical dimension and coherence of a matrix ``K`` (Skyformer Theorem 2).

:func:`ridge_leverage_scores`, :func:`statistical_dimension` and :func:`coherence` from an
eigendecomposition of ``K`` in float64, and :func:`approximate_ridge_leverage_scores` from a
sample of its columns. The definitions, conventions and references are those of
:mod:`approxlab.leverage`.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_positive_float, check_square, check_tensor
from ..errors import NotPSDError
from ..linalg.conditioning import as_result
from ..linalg.scaling import balancing_exponent, times_power_of_two
from ..sketch import check_columns, gather_rows

__all__ = ["ridge_leverage_scores", "statistical_dimension", "coherence", "approximate_ridge_leverage_scores"]


def _psd_ridge_ratios(K: torch.Tensor, lam, tol) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Validate; return eigenvalue ratios s/(s+lam) ``(*batch, N)``, eigenvectors (float64), lam."""
    check_square(K, "K")
    lam = check_positive_float(lam, "lam")
    n = K.shape[-1]
    tol = 10.0 * n * torch.finfo(K.dtype).eps if tol is None else check_positive_float(tol, "tol")
    k64 = K.to(torch.float64)
    exponent = balancing_exponent(k64, tuple(range(k64.ndim)))  # one power of two for K and lam: exact
    k64 = times_power_of_two(k64, -exponent)
    lam = _scaled_ridge(lam, float(exponent.reshape(-1)[0]))
    norm = k64.abs().amax((-1, -2))
    norm = torch.where(norm > 0, norm, torch.ones_like(norm))
    asym = float(((k64 - k64.transpose(-1, -2)).abs().amax((-1, -2)) / norm).max())
    if asym > tol:
        raise NotPSDError(
            f"`K` must be symmetric positive semidefinite; got max |K - K^T| / max |K| = {asym:.3e} "
            f"> tol={tol:.1e}."
        )
    evals, evecs = torch.linalg.eigh(0.5 * k64 + 0.5 * k64.transpose(-1, -2))
    spectral = evals.abs().amax(-1)
    ratio = evals[..., 0] / torch.where(spectral > 0, spectral, torch.ones_like(spectral))
    if bool((ratio < -tol).any()):
        worst = int(ratio.argmin()) if ratio.ndim else 0
        raise NotPSDError(
            f"`K` must be positive semidefinite: its smallest eigenvalue is "
            f"{float(evals[..., 0].reshape(-1)[worst]):.3e}, below -tol * ||K|| with tol={tol:.1e} "
            f"and ||K||={float(spectral.reshape(-1)[worst]):.3e}."
        )
    evals = evals.clamp_min(0.0)
    return evals / (evals + lam), evecs, lam


def _scaled_ridge(lam: float, exponent: float) -> float:
    """``lam * 2**-exponent`` beside the balanced ``K``: a ridge that would underflow acts as the
    smallest positive number (every ratio ``s/(s+lam)`` of a nonzero ``s`` rounds to 1), one that
    would overflow as ``inf`` (every ratio is below the smallest float64, i.e. 0)."""
    try:
        scaled = math.ldexp(lam, -int(exponent))
    except OverflowError:
        return math.inf
    return max(scaled, math.ulp(0.0))


def ridge_leverage_scores(K: torch.Tensor, lam: float, *, tol: float | None = None) -> torch.Tensor:
    r"""Exact ridge leverage scores :math:`\ell_i = [K(K+\lambda I)^{-1}]_{ii}`.

    Parameters
    ----------
    K : torch.Tensor
        ``(*batch, N, N)`` symmetric positive semidefinite.
    lam : float
        Ridge :math:`\lambda > 0` (Skyformer Theorem 2 uses :math:`\lambda = \varepsilon\|C\|`).
    tol : float, optional
        Relative tolerance of the PSD check, default ``10 * N * eps(K.dtype)``.

    Returns
    -------
    torch.Tensor
        ``(*batch, N)``, entries in :math:`[0, 1)`, in ``K.dtype``.

    Raises
    ------
    ValueError
        If ``lam <= 0``.
    NotPSDError
        If ``K`` is not symmetric or its smallest eigenvalue is below :math:`-\text{tol}\,\|K\|`.

    Notes
    -----
    With :math:`K = U\operatorname{diag}(s)U^\top`,
    :math:`\ell_i = \sum_j U_{ij}^2\, s_j/(s_j+\lambda)`. Rounding-level negative eigenvalues
    are set to 0. These are the :math:`\lambda`-ridge leverage scores of Alaoui & Mahoney
    (2015) and the :math:`\ell_i` of Skyformer Theorem 2 when ``K`` is the completion
    :math:`\bar C`.

    References
    ----------
    Skyformer (Chen et al., 2021), Theorem 2; Alaoui & Mahoney (2015).

    Examples
    --------
    >>> import torch
    >>> from approxlab.leverage import ridge_leverage_scores
    >>> K = torch.diag(torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64))
    >>> ridge_leverage_scores(K, lam=1.0)  # s_i / (s_i + lam) for a diagonal K
    tensor([0.7500, 0.5000, 0.0000], dtype=torch.float64)
    >>> from approxlab.synthetic import psd_matrix
    >>> K = psd_matrix(torch.tensor([4.0, 2.0, 1.0, 0.5], dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    >>> round(float(ridge_leverage_scores(K, lam=1.0).sum()), 6)  # their sum is d_stat = 4/5 + 2/3 + 1/2 + 1/3
    2.3
    """
    ratios, evecs, _ = _psd_ridge_ratios(K, lam, tol)
    return ((evecs * evecs) @ ratios.unsqueeze(-1)).squeeze(-1).to(K.dtype)


def statistical_dimension(K: torch.Tensor, lam: float, *, tol: float | None = None) -> torch.Tensor:
    r"""Statistical dimension :math:`d_{stat} = \operatorname{Tr}K(K+\lambda I)^{-1} = \sum_i s_i/(s_i+\lambda)`.

    Parameters and errors as :func:`ridge_leverage_scores`; returns a ``float`` for one matrix,
    a float64 tensor ``(*batch,)`` for a batch.

    Notes
    -----
    Skyformer Theorem 2's :math:`d_{stat}`; it is the sum of the ridge leverage scores and
    the squared Frobenius norm of :math:`\Psi` in Appendix D, whose stable rank is at most
    :math:`2 d_{stat}` when :math:`\lambda \le \|K\|`.

    References
    ----------
    Skyformer (Chen et al., 2021), Theorem 2 and Appendix D.

    Examples
    --------
    >>> import torch
    >>> from approxlab.leverage import statistical_dimension
    >>> from approxlab.synthetic import psd_matrix
    >>> eigenvalues = torch.tensor([4.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    >>> K = psd_matrix(eigenvalues, generator=torch.Generator().manual_seed(0))
    >>> round(statistical_dimension(K, lam=1.0), 6)  # 4/5 + 2/3 + 1/2 + 1/3
    2.3
    >>> statistical_dimension(K.expand(3, 4, 4), lam=1.0).shape  # a batch gives a tensor
    torch.Size([3])
    """
    ratios, _, _ = _psd_ridge_ratios(K, lam, tol)
    return as_result(ratios.sum(-1))


def coherence(K: torch.Tensor, lam: float, *, tol: float | None = None) -> torch.Tensor:
    r"""Skyformer Theorem 2's :math:`\beta = \min_i d_{stat}/(N\ell_i) = d_{stat}/(N\max_i\ell_i)`.

    Parameters and errors as :func:`ridge_leverage_scores`; returns a value in :math:`(0, 1]`:
    a ``float`` for one matrix, a float64 tensor ``(*batch,)`` for a batch.

    Notes
    -----
    :math:`\beta = 1` iff all leverage scores are equal (uniform sampling is then optimal);
    a small :math:`\beta` means a few columns carry most of the leverage and uniform
    sampling needs :math:`1/\beta` times more columns (Lemma C.2). For ``K = 0`` every
    :math:`\ell_i = 0` and any :math:`\beta` satisfies the condition: 1 is returned.

    References
    ----------
    Skyformer (Chen et al., 2021), Theorem 2 and Lemma C.2.

    Examples
    --------
    >>> import torch
    >>> from approxlab.leverage import coherence
    >>> coherence(torch.eye(4, dtype=torch.float64), lam=0.1)  # equal leverage: uniform sampling is optimal
    1.0
    >>> K = torch.diag(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    >>> coherence(K, lam=0.1)  # one column carries all the leverage: 1/N
    0.25
    """
    ratios, evecs, _ = _psd_ridge_ratios(K, lam, tol)
    scores = ((evecs * evecs) @ ratios.unsqueeze(-1)).squeeze(-1)
    d_stat = ratios.sum(-1)
    top = scores.amax(-1)
    n = K.shape[-1]
    beta = torch.where(top > 0, d_stat / (n * torch.where(top > 0, top, torch.ones_like(top))), torch.ones_like(top))
    return as_result(beta.clamp_max(1.0))


def approximate_ridge_leverage_scores(
    k_columns: torch.Tensor,
    k_diag: torch.Tensor,
    columns: torch.Tensor,
    lam: float,
    *,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Nyström estimate of ridge leverage scores from sampled columns and the diagonal only.

    Parameters
    ----------
    k_columns : torch.Tensor
        ``(*batch, N, d)``, the sampled columns :math:`K_{:,S}` of a symmetric PSD ``K``.
    k_diag : torch.Tensor
        ``(*batch, N)``, the diagonal of ``K``.
    columns : torch.Tensor
        ``(d,)`` or ``(*batch, d)`` indices :math:`S` of the sampled columns (so that
        :math:`K_{SS}` is read from ``k_columns``); repeats allowed.
    lam : float
        Ridge :math:`\lambda > 0`.
    weights : torch.Tensor, optional
        ``(d,)`` or ``(*batch, d)`` positive sampling weights :math:`w_k`, i.e. the sketch
        :math:`\Pi = [\sqrt{w_1}e_{s_1},\dots,\sqrt{w_d}e_{s_d}]`. ``None``: all 1 (plain
        column selection). For ``d`` i.i.d. uniform draws from ``N`` use :math:`w = N/d`
        (Skyformer's :math:`\Pi = \sqrt N S`); for draws with probabilities :math:`p_i`, use
        :math:`w_k = 1/(d\,p_{s_k})`.

    Returns
    -------
    torch.Tensor
        ``(*batch, N)`` estimates :math:`\tilde\ell_i \ge 0`, in ``k_columns.dtype``.

    Notes
    -----
    The estimator of Alaoui & Mahoney (2015) / Musco & Musco (2017, Eq. (3)):

    .. math::

        \tilde\ell_i = \frac1\lambda\Bigl(K_{ii} - K_{iS}W^{1/2}\bigl(W^{1/2}K_{SS}W^{1/2}+\lambda I\bigr)^{-1}W^{1/2}K_{Si}\Bigr)
                     = b_i^\top\bigl(B^\top\Pi\Pi^\top B+\lambda I\bigr)^{-1}b_i,

    for any factorisation :math:`K = BB^\top` (Woodbury), while the exact score is
    :math:`\ell_i = b_i^\top(B^\top B+\lambda I)^{-1}b_i`. Hence:

    * **unweighted, distinct columns** (``weights=None``): :math:`\Pi\Pi^\top \preceq I`, so
      deterministically :math:`\ell_i \le \tilde\ell_i \le K_{ii}/\lambda`, with equality
      :math:`\tilde\ell = \ell` when every column is sampled and :math:`\tilde\ell_i \le 1` for
      sampled ``i`` -- an over-estimate, safe for oversampling;
    * **uniform with replacement, w = N/d**: if :math:`d \ge \tfrac{28}{3}\,\tfrac{2d_{stat}}{\beta}\log\tfrac{2N}{\delta}`
      (and :math:`\lambda \le \|K\|`), Lemma C.2 gives Eq. (7) of Skyformer,
      :math:`\tfrac12(B^\top B+\lambda I) \preceq B^\top\Pi\Pi^\top B+\lambda I \preceq \tfrac32(B^\top B+\lambda I)`,
      hence :math:`\tfrac23\ell_i \le \tilde\ell_i \le 2\ell_i` for all ``i`` with probability
      :math:`1-\delta`: a constant-factor (3) approximation.

    Cost: one ``d x d`` Cholesky factorisation and :math:`O(Nd^2)`; computed in float64.
    Rounding can make :math:`K_{ii} - (\dots)` slightly negative; such values are set to 0
    (the exact-arithmetic value is :math:`\ge 0`).

    References
    ----------
    Alaoui & Mahoney (2015), Section 3; Musco & Musco (2017), Eq. (3) and Lemma 6;
    Skyformer (Chen et al., 2021), Lemma C.2 and Appendix D, Eq. (7).

    Examples
    --------
    >>> import torch
    >>> from approxlab.leverage import approximate_ridge_leverage_scores, ridge_leverage_scores
    >>> from approxlab.synthetic import psd_matrix
    >>> eigenvalues = torch.tensor([4.0, 2.0, 1.0, 0.5, 0.0, 0.0], dtype=torch.float64)
    >>> K = psd_matrix(eigenvalues, generator=torch.Generator().manual_seed(0))
    >>> columns = torch.tensor([0, 2, 4])
    >>> estimate = approximate_ridge_leverage_scores(K[:, columns], K.diagonal(), columns, lam=0.5)
    >>> estimate.shape
    torch.Size([6])
    >>> everything = torch.arange(6)  # with every column, the estimate is exact
    >>> exact = approximate_ridge_leverage_scores(K, K.diagonal(), everything, lam=0.5)
    >>> torch.allclose(exact, ridge_leverage_scores(K, lam=0.5))
    True
    >>> bool((estimate >= exact - 1e-12).all())  # fewer columns over-estimate the scores
    True
    """
    check_tensor(k_columns, "k_columns")
    check_tensor(k_diag, "k_diag", min_ndim=1)
    batch, n, d = tuple(k_columns.shape[:-2]), k_columns.shape[-2], k_columns.shape[-1]
    if tuple(k_diag.shape) != (*batch, n):
        raise ValueError(
            f"`k_diag` must have shape (*batch, N) = {(*batch, n)} to match `k_columns` "
            f"{tuple(k_columns.shape)}; got {tuple(k_diag.shape)}."
        )
    columns = check_columns(columns, n, batch_shape=batch)
    if columns.shape[-1] != d:
        raise ValueError(
            f"`columns` must hold one index per sampled column (d={d}); got {columns.shape[-1]}."
        )
    lam = check_positive_float(lam, "lam")
    if weights is not None:
        check_tensor(weights, "weights", min_ndim=1)
        if weights.shape[-1] != d or (weights.ndim > 1 and tuple(weights.shape[:-1]) != batch):
            raise ValueError(f"`weights` must have shape (d,) or (*batch, d) with d={d}; got {tuple(weights.shape)}.")
        if bool((weights <= 0).any()):
            raise ValueError(f"`weights` must be > 0; got min {float(weights.min()):.3e}.")

    kc = k_columns.to(torch.float64)
    k_ss = gather_rows(kc, columns)  # (*batch, d, d): K_{S,S}
    k_ss = 0.5 * (k_ss + k_ss.transpose(-1, -2))
    if weights is None:
        root = torch.ones(*batch, d, dtype=torch.float64, device=kc.device)
    else:
        root = weights.to(kc.device, torch.float64).expand(*batch, d).sqrt()
    eye = torch.eye(d, dtype=torch.float64, device=kc.device)
    core = root.unsqueeze(-1) * k_ss * root.unsqueeze(-2) + lam * eye
    chol, failed = torch.linalg.cholesky_ex(core)
    if bool((failed != 0).any()):
        raise NotPSDError(
            "`k_columns` must be columns of a symmetric PSD matrix: W^1/2 K_SS W^1/2 + lam I is not "
            f"positive definite (lam={lam:.3e})."
        )
    y = torch.linalg.solve_triangular(chol, (kc * root.unsqueeze(-2)).transpose(-1, -2), upper=False)
    residual = k_diag.to(torch.float64) - (y * y).sum(-2)
    return (residual.clamp_min(0.0) / lam).to(k_columns.dtype)
