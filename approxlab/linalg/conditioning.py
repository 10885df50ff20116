r"""2-norm condition numbers that report numerical singularity as such.

A condition number computed as :math:`\sigma_{\max}/\sigma_{\min}` from floating-point
singular values is meaningless once :math:`\sigma_{\min}` is below the rounding level
:math:`\approx \max(n, m)\,\varepsilon\,\sigma_{\max}`: the computed :math:`\sigma_{\min}` is
then noise, and the ratio (``1e+17``, ``1e+81``, ...) says nothing about the matrix. Here such
a matrix is *numerically singular* and its condition number is ``inf``.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_float, check_tensor
from .scaling import balance

__all__ = [
    "singular_values",
    "relative_singular_values",
    "default_rtol",
    "default_rtol_for_shape",
    "is_numerically_singular",
    "condition_number",
    "as_result",
]


def as_result(x: torch.Tensor):
    """The return convention of every scalar metric: a 0-dimensional result (one matrix) as a
    Python scalar (``float``, ``int`` or ``bool``), a batched one as the tensor ``(*batch,)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.conditioning import as_result
    >>> as_result(torch.tensor(2.5, dtype=torch.float64)), as_result(torch.tensor([1.0, 2.0], dtype=torch.float64))
    (2.5, tensor([1., 2.], dtype=torch.float64))
    """
    return x.item() if x.ndim == 0 else x


def singular_values(m: torch.Tensor) -> torch.Tensor:
    """Singular values of ``m: (*batch, n, k)`` in float64, descending: ``(*batch, min(n, k))``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import singular_values
    >>> singular_values(torch.tensor([[0.0, 3.0], [1.0, 0.0]]))
    tensor([3., 1.], dtype=torch.float64)
    """
    check_tensor(m, "M")
    return torch.linalg.svdvals(m.to(torch.float64))


def relative_singular_values(m: torch.Tensor) -> torch.Tensor:
    r"""Singular values of ``m`` up to one power of two per matrix: :math:`2^{-e}\sigma_i(M)`, descending.

    For the scale-invariant quantities (condition numbers, ranks): ``m`` is balanced first
    (:func:`approxlab.linalg.scaling.balance`), so a matrix of subnormal (``1e-310``) or
    near-overflow (``1e308``) entries has the same ratios :math:`\sigma_i/\sigma_1` as any
    other multiple of it. Unchanged, bit for bit, for entries of magnitude in
    the safe range of :mod:`approxlab.linalg.scaling`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.conditioning import relative_singular_values
    >>> sigma = relative_singular_values(torch.diag(torch.tensor([2e-310, 1e-310], dtype=torch.float64)))
    >>> float(sigma[1] / sigma[0])  # the ratio survives although the entries are subnormal
    0.5
    """
    check_tensor(m, "M")
    return torch.linalg.svdvals(balance(m.to(torch.float64))[0])


def default_rtol(m: torch.Tensor) -> float:
    r"""The default relative singularity threshold :math:`\max(n, k)\,\varepsilon_{\text{dtype}}`.

    :math:`\varepsilon` is the machine epsilon of ``m.dtype`` (the precision the matrix was
    given in; a float32 matrix cannot resolve singular values below
    :math:`\approx \max(n,k)\,\varepsilon_{32}\,\sigma_{\max}`), as in NumPy's ``matrix_rank``
    and ``torch.linalg.pinv``. This is the library's one tolerance rule: condition numbers,
    the Nyström cores (:mod:`approxlab.linalg.cores`) and spectral shifting all use it.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import default_rtol
    >>> default_rtol(torch.zeros(3, 4, dtype=torch.float64)) == 4 * torch.finfo(torch.float64).eps
    True
    """
    check_tensor(m, "M", finite=False)
    return default_rtol_for_shape(m.shape[-2], m.shape[-1], m.dtype)


def default_rtol_for_shape(rows: int, cols: int, dtype: torch.dtype) -> float:
    """:func:`default_rtol` of a ``(*batch, rows, cols)`` matrix of ``dtype``, without the matrix.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import default_rtol, default_rtol_for_shape
    >>> default_rtol_for_shape(3, 4, torch.float32) == default_rtol(torch.zeros(3, 4))
    True
    """
    return max(rows, cols) * torch.finfo(dtype).eps


def _check(m, rtol):
    check_tensor(m, "M")
    if min(m.shape[-2:]) < 1:
        raise ValueError(f"`M` must have at least one row and one column; got shape {tuple(m.shape)}.")
    if rtol is None:
        return default_rtol(m)
    rtol = check_positive_float(rtol, "rtol", allow_zero=True)
    if rtol >= 1:
        raise ValueError(f"`rtol` must satisfy 0 <= rtol < 1; got {rtol}.")
    return rtol


def _singular(sigma: torch.Tensor, rtol: float) -> torch.Tensor:
    return sigma[..., -1] <= rtol * sigma[..., 0]


def ratio_or_inf(top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
    """``top / bottom``, ``inf`` where ``bottom`` is 0 (no floor that would turn a tiny ``bottom`` into another number)."""
    safe = torch.where(bottom > 0, bottom, torch.ones_like(bottom))
    return torch.where(bottom > 0, top / safe, torch.full_like(top, float("inf")))


def is_numerically_singular(m: torch.Tensor, *, rtol: float | None = None):
    r"""Whether :math:`\sigma_{\min}(M) \le \text{rtol}\cdot\sigma_{\max}(M)`.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite.
    rtol : float, optional
        Relative threshold, ``0 <= rtol < 1``; default :func:`default_rtol`
        (:math:`\max(n,k)\,\varepsilon` of ``m.dtype``). ``rtol=0`` flags only exact zeros.

    Returns
    -------
    bool or torch.Tensor
        A ``bool`` for one matrix, a bool tensor ``(*batch,)`` for a batch. A zero matrix is
        singular. For ``n != k``, :math:`\sigma_{\min}` is the ``min(n, k)``-th singular value
        (rank deficiency).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import is_numerically_singular
    >>> is_numerically_singular(torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64))
    True
    >>> is_numerically_singular(torch.eye(2, dtype=torch.float64).expand(3, 2, 2))
    tensor([False, False, False])
    """
    rtol = _check(m, rtol)
    return as_result(_singular(relative_singular_values(m), rtol))


def condition_number(m: torch.Tensor, *, rtol: float | None = None):
    r"""2-norm condition number :math:`\kappa_2(M) = \sigma_{\max}/\sigma_{\min}`, ``inf`` if singular.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, n, k)``, finite; singular values computed in float64.
    rtol : float, optional
        See :func:`is_numerically_singular`; default :math:`\max(n,k)\,\varepsilon` of
        ``m.dtype``.

    Returns
    -------
    float or torch.Tensor
        float64, ``(*batch,)`` (a ``float`` for one matrix). Exactly ``inf`` where
        :func:`is_numerically_singular`, never a huge finite number made of rounding noise.

    Notes
    -----
    :math:`\kappa_2(M) = \sigma_1/\sigma_{\min(n,k)}`, from the singular values of ``m`` balanced
    by a power of two (:func:`relative_singular_values`), so it does not depend on the scale
    of ``m``: ``1e-310 * I`` and ``1e308 * I`` have :math:`\kappa_2 = 1`. With the default ``rtol`` a finite value
    is at most :math:`1/(\max(n,k)\,\varepsilon)`, the largest condition number the input's
    precision can resolve.

    References
    ----------
    G. H. Golub and C. F. Van Loan, *Matrix Computations*, 4th ed. (2013), Sections 2.6.2
    and 5.4.1 (numerical rank).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import condition_number
    >>> condition_number(torch.diag(torch.tensor([4.0, 2.0, 0.5], dtype=torch.float64)))
    8.0
    >>> condition_number(torch.ones(3, 3, dtype=torch.float64))  # rank 1: singular
    inf
    >>> condition_number(1e-310 * torch.eye(2, dtype=torch.float64))  # scale-free, even for subnormals
    1.0
    """
    rtol = _check(m, rtol)
    sigma = relative_singular_values(m)
    ratio = ratio_or_inf(sigma[..., 0], sigma[..., -1])
    kappa = torch.where(_singular(sigma, rtol), torch.full_like(ratio, float("inf")), ratio)
    return as_result(kappa)
