r"""Third-order iterative Moore--Penrose pseudo-inverse (Razavi et al., 2014).

Implements Eq. (5) of Nystromformer (Lemma 1 of its supplement), also used by
Skyformer's practical core (Skyformer Section 4.4, Lemma 3):

.. math::

    Z_{j+1} = \tfrac14 Z_j\bigl(13I - MZ_j(15I - MZ_j(7I - MZ_j))\bigr),

which converges in third order to :math:`M^+` whenever :math:`\|MM^+ - MZ_0\| < 1`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from .._validation import check_bool, check_choice, check_int, check_positive_float, check_square, check_tensor
from .._validation import peak_magnitude
from ..errors import ConvergenceWarning
from .scaling import balancing_exponent, times_power_of_two

__all__ = ["PinvResult", "iterative_pinv", "INITS"]

INITS = ("nystromformer", "official", "identity")
_NORMS = {"spectral": 2, "frobenius": "fro"}


@dataclasses.dataclass
class PinvResult:
    """Result of :func:`iterative_pinv`.

    Attributes
    ----------
    inverse : torch.Tensor
        ``(*batch, m, m)``, the last iterate :math:`Z_J`.
    residuals : torch.Tensor
        ``(num_iter + 1, *batch)``, :math:`\\|I - MZ_j\\|_2` for ``j = 0..num_iter``. For a singular
        ``M`` it tends to 1, not 0 (:math:`I - MM^+` is a projector).
    penrose_residuals : torch.Tensor
        ``(num_iter + 1, *batch)``, :math:`\\|MZ_jM - M\\|_2 / \\|M\\|_2`, which tends to 0 for any
        ``M`` once the iteration converges (first Penrose condition).
    inverse_residuals : torch.Tensor
        ``(num_iter + 1, *batch)``, :math:`\\|Z_jMZ_j - Z_j\\|_2 / \\|Z_j\\|_2` (second Penrose
        condition). It exposes the null-space drift described in :func:`iterative_pinv`'s
        Notes, which the first condition cannot see.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import iterative_pinv
    >>> result = iterative_pinv(torch.eye(3, dtype=torch.float64).expand(2, 3, 3), 4)
    >>> result.inverse.shape, result.residuals.shape  # (num_iter + 1, *batch)
    (torch.Size([2, 3, 3]), torch.Size([5, 2]))
    """

    inverse: torch.Tensor
    residuals: torch.Tensor
    penrose_residuals: torch.Tensor
    inverse_residuals: torch.Tensor


def _initial(m: torch.Tensor, init) -> torch.Tensor:
    """:math:`Z_0` for ``init``; exactly 0 for every zero matrix of the batch (whose ``M^+`` is 0)."""
    mt = m.transpose(-1, -2)
    tiny = torch.finfo(m.dtype).tiny
    if isinstance(init, torch.Tensor):
        check_tensor(init, "init")
        if init.shape[-2:] != m.shape[-2:] or _broadcasts(init.shape[:-2], m.shape[:-2]) != tuple(m.shape[:-2]):
            raise ValueError(
                f"`init` as a tensor must have shape (*batch, {m.shape[-1]}, {m.shape[-1]}) broadcasting "
                f"to m.shape={tuple(m.shape)}; got {tuple(init.shape)}."
            )
        z0 = init.to(m).expand_as(m)
    elif not isinstance(init, str) or init not in INITS:
        raise ValueError(f"`init` must be one of {INITS} or a tensor; got {init!r}.")
    elif init == "nystromformer":
        # Z0 = M^T / (||M||_1 ||M||_inf), per matrix: guarantees ||I - M Z0|| < 1 on range(M).
        # Divided one norm at a time (their product can underflow); a zero norm means M = 0.
        col = m.abs().sum(-2).amax(-1).clamp_min(tiny)[..., None, None]
        row = m.abs().sum(-1).amax(-1).clamp_min(tiny)[..., None, None]
        z0 = mt / col / row
    elif init == "official":
        # Nystromformer's released code: M^T / (largest column sum over the whole batch).
        largest = m.sum(-2).amax()
        if not bool(largest > 0) and bool(m.ne(0).any()):
            raise ValueError(
                "`init`='official' divides M^T by the largest column sum of `m` over the batch, which "
                f"must be > 0 (it is for softmax matrices); got {float(largest):.3e}. Use init='nystromformer'."
            )
        z0 = mt / largest.clamp_min(tiny)
    else:
        # "identity": valid when ||I - M|| < 1, e.g. Skyformer's scaled core (Lemma 3).
        z0 = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device).expand_as(m)
    zero = (m == 0).all(-1).all(-1)[..., None, None]
    return torch.where(zero, torch.zeros_like(z0), z0)


def _matrix_norm(x: torch.Tensor, ord_) -> torch.Tensor:
    """``matrix_norm`` per matrix, ``inf`` for a matrix with a non-finite entry (where the SVD
    of the spectral norm would fail): the residual of an iterate that overflowed."""
    finite = torch.isfinite(x).all(-1).all(-1)
    norm = torch.linalg.matrix_norm(torch.where(finite[..., None, None], x, torch.zeros_like(x)), ord=ord_)
    return torch.where(finite, norm, torch.full_like(norm, float("inf")))


def _broadcasts(shape, target) -> tuple | None:
    try:
        return tuple(torch.broadcast_shapes(shape, target))
    except RuntimeError:
        return None


def iterative_pinv(
    m: torch.Tensor,
    num_iter: int = 6,
    *,
    init="nystromformer",
    tol: float | None = None,
    history: bool = True,
    norm: str = "spectral",
) -> PinvResult:
    r"""Approximate :math:`M^+` by ``num_iter`` steps of Nystromformer Eq. (5).

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, k, k)`` square matrices.
    num_iter : int
        Iterations (Nystromformer uses 6), ``>= 0``.
    init : {"nystromformer", "official", "identity"} or torch.Tensor
        :math:`Z_0`. ``"nystromformer"``: :math:`M^\top/(\|M\|_1\|M\|_\infty)` per matrix (the
        published choice); ``"official"``: :math:`M^\top/\max_j \sum_i M_{ij}` with the maximum
        taken over the whole batch (the released code; that maximum must be positive, as it is
        for softmax matrices); ``"identity"``: :math:`I`, valid when :math:`\|I - M\| < 1`
        (Skyformer Lemma 3); or an explicit finite ``(*batch, k, k)`` tensor (batch dimensions
        broadcasting to those of ``m``). Whatever ``init``, a zero matrix starts (and stays) at
        :math:`Z = 0`, its pseudo-inverse.
    tol : float, optional
        If given, a :class:`~approxlab.errors.ConvergenceWarning` is issued when either final
        Penrose residual (``penrose_residuals`` or ``inverse_residuals``) exceeds ``tol``.
        Without it, the warning is issued only if the iteration diverged (final Penrose
        residual above both the initial one and :math:`\sqrt{\varepsilon}`, or non-finite).
    history : bool
        ``True`` (default): residuals of every iterate, ``(num_iter + 1, *batch)``. ``False``:
        only of :math:`Z_0` and the last iterate, ``(2, *batch)``. Each residual costs three
        ``k x k`` SVDs, far more than an iteration itself, so methods that call this inside
        attention (Nystromformer, Skyformer's Schulz core) default to ``False``.
    norm : {"spectral", "frobenius"}
        Norm of the residuals. ``"spectral"`` (default) is the 2-norm of Lemma 1 (an SVD per
        residual); ``"frobenius"`` costs one pass over the entries and is what the methods
        use for their diagnostics (it bounds the 2-norm within a factor :math:`\sqrt k`).

    Returns
    -------
    PinvResult
        For a zero ``M`` (in any batch element): ``inverse`` 0, ``residuals`` 1
        (:math:`I - MM^+ = I`), ``penrose_residuals`` and ``inverse_residuals`` 0. Residuals
        of an iterate that overflowed (a divergent ``init``) are ``inf``, with the warning.

    Raises
    ------
    ValueError
        If ``init='official'`` and the largest column sum of a nonzero ``m`` is not positive.

    Notes
    -----
    On an eigenvalue :math:`\lambda` of a symmetric ``M`` the iteration maps
    :math:`\lambda z \mapsto \lambda z(13 - \lambda z(15 - \lambda z(7 - \lambda z)))/4`, which
    multiplies a small :math:`\lambda z` by about 13/4 per step. For a numerically singular
    ``M`` that includes round-off eigenvalues (:math:`\sim 10^{-16}\|M\|`): iterating far past
    convergence on the true range slowly inverts them too, and the iterate drifts away from
    :math:`M^+`. Use the ``penrose_residuals`` history to choose ``num_iter``.

    References
    ----------
    Razavi, Kerayechian, Gachpazan, Shateyi (2014), "A new iterative method for finding
    approximate inverses of complex matrices". Xiong et al. (2021), Nystromformer, Eq. (5)
    and supplement Lemma 1.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import iterative_pinv
    >>> m = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    >>> result = iterative_pinv(m, 6)  # Nystromformer's six steps of Eq. (5)
    >>> bool(torch.allclose(result.inverse, torch.linalg.inv(m))), float(result.residuals[-1]) < 1e-12
    (True, True)
    """
    check_square(m, "m")
    num_iter = check_int(num_iter, "num_iter", low=0)
    if tol is not None:
        tol = check_positive_float(tol, "tol")
    check_bool(history, "history")
    check_choice(norm, "norm", _NORMS)
    ord_ = _NORMS[norm]

    # Z_j(2^-e M) = 2^e Z_j(M) for the norm-scaled starts: iterate on M balanced by a power of two
    # (exact; per matrix, over the batch for "official"'s batch-wide maximum) and scale back.
    exponent = torch.zeros((), dtype=torch.float64, device=m.device)
    if isinstance(init, str) and init in ("nystromformer", "official"):
        exponent = balancing_exponent(m, (-2, -1) if init == "nystromformer" else tuple(range(m.ndim)))
        m = times_power_of_two(m, -exponent)
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    tiny = torch.finfo(m.dtype).tiny
    m_detached = m.detach()
    m_norm = _matrix_norm(m_detached, ord_).clamp_min(tiny)

    @torch.no_grad()
    def residuals(z):
        # Diagnostics only: never part of the autograd graph (they are SVDs, whose
        # backward is expensive and undefined at repeated singular values).
        m, z = m_detached, z.detach()
        mz = m @ z
        return (
            _matrix_norm(eye - mz, ord_),
            _matrix_norm(mz @ m - m, ord_) / m_norm,
            # inf / inf (an overflowed iterate) is reported as inf, not NaN
            (_matrix_norm(z @ mz - z, ord_) / _matrix_norm(z, ord_).clamp_min(tiny)).nan_to_num(nan=float("inf")),
        )

    z = _initial(m, init)
    records = [residuals(z)]
    for step in range(num_iter):
        mz = m @ z
        z = 0.25 * z @ (13 * eye - mz @ (15 * eye - mz @ (7 * eye - mz)))
        if history or step == num_iter - 1:
            records.append(residuals(z))

    res = torch.stack([r[0] for r in records])
    pen = torch.stack([r[1] for r in records])
    inv = torch.stack([r[2] for r in records])
    final = torch.maximum(pen[-1], inv[-1]) if tol is not None else pen[-1]
    worst = float(final.max()) if final.numel() else 0.0
    # Diverged: the final residual grew beyond the initial one and beyond rounding level.
    diverged = (final > pen[0]) & (final > torch.finfo(m.dtype).eps ** 0.5)
    if not bool(torch.isfinite(final).all()) or (tol is not None and worst > tol) or (
        tol is None and bool(diverged.any())
    ):
        warnings.warn(
            ConvergenceWarning(
                f"iterative_pinv did not converge in num_iter={num_iter} iterations: largest final "
                f"Penrose residual (||MZM - M||/||M||, ||ZMZ - Z||/||Z||) = {worst:.3e}"
                + (f" > tol={tol:.1e}" if tol is not None else " (diverged)")
                + ".",
                residual=worst,
            ),
            stacklevel=2,
        )
    inverse = times_power_of_two(z, -exponent)
    if not math.isfinite(peak_magnitude(inverse)) and math.isfinite(peak_magnitude(z)):
        raise OverflowError(
            f"`m` has a pseudo-inverse beyond the largest {m.dtype} ({torch.finfo(m.dtype).max:.3e}): its entries "
            f"are about 2^{int(-exponent.min())} times those of a matrix of norm 1; rescale `m`."
        )
    return PinvResult(inverse, res, pen, inv)
