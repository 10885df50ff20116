r"""Matrix-free spectral norms by Golub--Kahan(--Lanczos) bidiagonalisation.

Implements the Lanczos bidiagonalisation of Golub and Kahan (1965), with full
reorthogonalisation, for a batched :class:`~approxlab.operators.LinearOperator`
``A: (*batch, n, m)``. Only ``matmat``/``rmatmat`` on ``(*batch, ., 1)`` blocks are used,
so ``||A||_2`` of an ``n x n`` attention error operator is estimated without forming it.

After :math:`j` steps from a unit start vector :math:`v_1`,

.. math::

    A V_j = U_j B_j, \qquad A^\top U_j = V_j B_j^\top + \beta_j v_{j+1} e_j^\top,

with orthonormal :math:`U_j: n\times j`, :math:`V_j: m\times j` and the upper bidiagonal
:math:`B_j` (diagonal :math:`\alpha_1..\alpha_j`, superdiagonal :math:`\beta_1..\beta_{j-1}`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from .._validation import as_generator, check_int, check_positive_float, check_tensor
from .scaling import balance, safe_norm, times_power_of_two
from ..errors import ConvergenceWarning
from ..operators import DenseOperator, LinearOperator

__all__ = ["SpectralNormEstimate", "golub_kahan"]


@dataclasses.dataclass
class SpectralNormEstimate:
    r"""What :func:`golub_kahan` (and ``metrics.spectral_norm(..., return_info=True)``) returns.

    Every tensor field has shape ``(*batch,)`` (0-dimensional for a single matrix), dtype of
    the operator (float64 from :func:`approxlab.metrics.spectral_norm`).

    Attributes
    ----------
    estimate : torch.Tensor
        :math:`\theta_1`, the largest Ritz singular value (largest singular value of
        :math:`B_j`). The reported estimate of :math:`\|A\|_2`.
    lower_bound : torch.Tensor
        A certified lower bound on :math:`\|A\|_2`: equal to ``estimate``, since
        :math:`B_j = U_j^\top A V_j` with orthonormal :math:`U_j, V_j` (kept orthonormal to
        working precision by full reorthogonalisation), so
        :math:`\theta_1 = \|U_j^\top A V_j\|_2 \le \|A\|_2` (up to rounding, a few ulps of
        :math:`\|A\|_2`).
    residual : torch.Tensor
        :math:`r = \beta_j |e_j^\top y_1|` with :math:`y_1` the top left singular vector of
        :math:`B_j`: the norm of :math:`(Av - \theta_1 u,\; A^\top u - \theta_1 v)` for the top
        Ritz triple :math:`(\theta_1, u = U_j y_1, v = V_j x_1)` (the first component is 0).
    distance_bound : torch.Tensor
        :math:`r/\sqrt 2`. Certified: **some** singular value :math:`\sigma` of :math:`A` (or
        0 when ``n != m``) satisfies :math:`|\sigma - \theta_1| \le r/\sqrt 2`. This bounds
        the distance to the *nearest* singular value; it is **not** an upper bound on
        :math:`\|A\|_2`: no Krylov method can certify one, because the start vector may be
        (nearly) orthogonal to the top singular vector. Hence there is no ``upper_bound``
        field. For a random start this failure has probability zero, and in practice
        ``estimate + distance_bound`` bounds :math:`\|A\|_2` once the top Ritz value has
        converged.
    num_matvecs : int
        Operator products used: one ``matmat`` and one ``rmatmat`` per step, each on a
        ``(*batch, ., 1)`` block (i.e. one product per batch element), so ``2 * steps``.
    converged : torch.Tensor
        Bool, ``(*batch,)``: whether this element met the stopping rule (see
        :func:`golub_kahan`). The other fields are frozen at the step where it did.

    Examples
    --------
    >>> import torch
    >>> from approxlab.metrics import spectral_norm
    >>> from approxlab.operators import DenseOperator
    >>> a = torch.diag(torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    >>> info = spectral_norm(DenseOperator(a), generator=torch.Generator().manual_seed(0), return_info=True)
    >>> round(float(info.estimate), 8), bool(info.converged), bool(info.lower_bound <= 5.0 + 1e-12)
    (5.0, True, True)
    """

    estimate: torch.Tensor
    lower_bound: torch.Tensor
    residual: torch.Tensor
    distance_bound: torch.Tensor
    num_matvecs: int
    converged: torch.Tensor


class _Basis:
    """Orthonormal columns ``(*batch, dim, count)`` in a buffer that grows by doubling."""

    def __init__(self, batch, dim, capacity, dtype, device):
        self.batch, self.dim = tuple(batch), dim
        self.buffer = torch.zeros(*batch, dim, max(1, capacity), dtype=dtype, device=device)
        self.count = 0

    def append(self, column):
        if self.count == self.buffer.shape[-1]:
            grown = torch.zeros(*self.batch, self.dim, 2 * self.count, dtype=self.buffer.dtype,
                                device=self.buffer.device)
            grown[..., : self.count] = self.buffer
            self.buffer = grown
        self.buffer[..., self.count : self.count + 1] = column
        self.count += 1

    def orthogonalize(self, w):
        """Classical Gram--Schmidt, twice ("twice is enough"), against all stored columns."""
        if self.count == 0:
            return w
        basis = self.buffer[..., : self.count]
        for _ in range(2):
            w = w - basis @ (basis.transpose(-1, -2) @ w)
        return w


def _random_column(batch, dim, generator, dtype, device):
    """A standard Gaussian ``(*batch, dim, 1)`` column, drawn on CPU from ``generator``."""
    return torch.randn(*batch, dim, 1, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)


def _normalize_or_restart(w, basis, scale, generator, threshold):
    """Return ``(w / ||w||, ||w||)``; where ``||w|| <= threshold * scale`` (an invariant
    subspace was found), substitute a random unit vector orthogonal to ``basis`` and report
    a norm of exactly 0, so the bidiagonal relations stay exact.

    The norm and the division are scale-safe (:func:`approxlab.linalg.scaling.balance`): a
    vector of entries ``1e-310`` or ``1e307`` is normalised like any other. A norm beyond the
    dtype's range is an ``OverflowError`` (the operator's spectral norm is not representable)."""
    scaled, exponent = balance(w, (-2, -1))
    scaled_norm = torch.linalg.vector_norm(scaled, dim=(-2, -1))
    norm = times_power_of_two(scaled_norm, exponent[..., 0, 0])
    if not bool(torch.isfinite(norm).all()):
        raise OverflowError(
            f"`op` has a spectral norm beyond the largest {w.dtype} ({torch.finfo(w.dtype).max:.3e}): a "
            "Golub--Kahan coefficient overflowed; rescale the operator."
        )
    broke = norm <= threshold * scale
    safe = torch.where(scaled_norm > 0, scaled_norm, torch.ones_like(scaled_norm))
    w = scaled / safe[..., None, None]
    if bool(broke.any()):
        fresh = basis.orthogonalize(_random_column(basis.batch, basis.dim, generator, w.dtype, w.device))
        fresh = fresh / torch.linalg.vector_norm(fresh, dim=(-2, -1), keepdim=True)
        w = torch.where(broke[..., None, None], fresh, w)
        norm = torch.where(broke, torch.zeros_like(norm), norm)
    return w, norm


def _finite_product(x: torch.Tensor, step: int) -> torch.Tensor:
    if not bool(torch.isfinite(x).all()):
        raise FloatingPointError(
            f"`op` produced non-finite values (NaN or inf) in its products at step {step}: its spectral "
            f"norm is undefined (non-finite entries, or entries beyond the range of {x.dtype})."
        )
    return x


def _check_inputs(op, tol, max_iter, generator):
    """The validation block of :func:`golub_kahan`: ``(operator, tol, max_iter, generator)``."""
    if isinstance(op, torch.Tensor):
        check_tensor(op, "op")
        op = DenseOperator(op)
    elif not isinstance(op, LinearOperator):
        raise TypeError(f"`op` must be a LinearOperator or torch.Tensor; got {type(op).__name__}.")
    tol = check_positive_float(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", low=1)
    if generator is not None and isinstance(generator, torch.Generator) and generator.device.type != "cpu":
        raise ValueError(
            f"`generator` must be a CPU torch.Generator (draws are moved to the operator's device); "
            f"got one on {generator.device}."
        )
    generator = as_generator(generator)
    if not op.dtype.is_floating_point:
        raise TypeError(f"`op` must have a floating dtype (float32 or float64); got {op.dtype}.")
    if min(op.shape[-2:]) < 1:
        raise ValueError(f"`op` must have n >= 1 and m >= 1; got shape {tuple(op.shape)}.")
    return op, tol, max_iter, generator


def _top_ritz_triple(alphas, betas):
    r"""Top Ritz value :math:`\theta_1` of :math:`B_j` and its residual :math:`\beta_j|e_j^\top y_1|`.

    ``alphas``/``betas``: the ``j`` coefficients so far, each ``(*batch,)``; ``betas[-1]`` is
    :math:`\beta_j`. The ``j x j`` upper bidiagonal is small: its SVD runs on CPU in float64.
    """
    diag = torch.stack(alphas, -1).to("cpu", torch.float64)
    bidiagonal = torch.diag_embed(diag)
    if len(alphas) > 1:
        bidiagonal = bidiagonal + torch.diag_embed(torch.stack(betas[:-1], -1).to("cpu", torch.float64), offset=1)
    left_vectors, singular, _ = torch.linalg.svd(bidiagonal)
    return singular[..., 0], betas[-1].to("cpu", torch.float64) * left_vectors[..., -1, 0].abs()


def _warn_not_converged(relative, done, *, method, budget, measure, tol, note):
    """A :class:`ConvergenceWarning` naming the batch elements not ``done`` and the worst ``relative``
    residual among them (shared by :func:`golub_kahan` and ``normal_block_lanczos``); it points
    at the caller of ``method``."""
    worst = float(relative[~done].max())
    warnings.warn(
        ConvergenceWarning(
            f"{method} did not converge in {budget} for {int((~done).sum())} of {done.numel()} batch "
            f"elements: largest {measure} {worst:.3e} > tol={tol:.1e}{note}",
            residual=worst,
        ),
        stacklevel=3,
    )


def golub_kahan(
    op,
    *,
    tol: float = 1e-10,
    max_iter: int = 300,
    generator: torch.Generator | None = None,
) -> SpectralNormEstimate:
    r"""Estimate :math:`\|A\|_2` of a batched operator by Golub--Kahan bidiagonalisation.

    Parameters
    ----------
    op : LinearOperator or torch.Tensor
        ``A: (*batch, n, m)``; works in ``op.dtype`` on ``op.device`` (pass
        ``op.to(torch.float64)`` for float64, as :func:`approxlab.metrics.spectral_norm` does).
        If ``n < m`` the iteration runs on ``A^T`` (same singular values).
    tol : float
        Relative residual tolerance, ``> 0``. An element has converged when
        ``residual <= tol * estimate``: then a singular value is certified to lie within
        ``tol * estimate / sqrt(2)`` of the estimate (and, once the top singular value is
        separated from the rest by a gap :math:`\delta`, the estimate's error is of order
        ``residual**2 / delta``). There is deliberately no "relative change of the estimate"
        test: the estimate can stall for many steps just below a cluster of top singular values
        (e.g. ``1`` and ``1 - 1e-5``) before the iteration resolves it. The residual cannot
        fall much below ``eps(dtype) * ||A||``: use ``tol >= 1e-6`` for float32 operators
        (:func:`approxlab.metrics.spectral_norm` always works in float64).
    max_iter : int
        Most bidiagonalisation steps, ``>= 1`` (each one ``matmat`` + one ``rmatmat``). Capped
        at ``min(n, m)``, where the Krylov space is the whole space and the answer is exact.
    generator : torch.Generator, optional
        CPU generator for the Gaussian start vector (and for restarts after an invariant
        subspace is found). ``None``: a fresh OS-seeded one. The same seed gives the same result.

    Returns
    -------
    SpectralNormEstimate
        ``estimate``, ``lower_bound``, ``residual``, ``distance_bound``, ``num_matvecs``,
        ``converged`` (see its docstring for what each certifies).

    Warns
    -----
    ConvergenceWarning
        If some batch element has not converged after ``max_iter`` steps; its ``residual``
        attribute is the largest relative residual ``residual / estimate`` over the batch.

    Notes
    -----
    Golub--Kahan recurrence with full reorthogonalisation (classical Gram--Schmidt applied
    twice against all previous vectors): from a random unit :math:`v_1`,

    .. math::

        \alpha_j u_j = A v_j - \beta_{j-1} u_{j-1}, \qquad
        \beta_j v_{j+1} = A^\top u_j - \alpha_j v_j .

    The singular values of :math:`B_j` are the Ritz values; the top one increases
    monotonically to :math:`\|A\|_2` for a start vector not orthogonal to the top right
    singular vector (probability one for a Gaussian start). For the top Ritz triple,
    :math:`Av = \theta u` exactly and :math:`A^\top u - \theta v = \beta_j (e_j^\top y_1) v_{j+1}`;
    applying the Krylov--Weinstein residual bound to the Jordan--Wielandt matrix
    :math:`\begin{psmallmatrix}0 & A\\ A^\top & 0\end{psmallmatrix}` (eigenvalues
    :math:`\pm\sigma_i` and :math:`|n-m|` zeros) with the unit vector
    :math:`(u; v)/\sqrt 2` gives ``distance_bound`` :math:`= r/\sqrt2`.

    A breakdown (:math:`\alpha_j` or :math:`\beta_j` below ``eps * sqrt(max(n, m))`` times the
    largest coefficient seen) means an invariant subspace was found; the coefficient is set
    to 0 and the iteration continues from a random vector orthogonal to the basis, which
    keeps :math:`B_j = U_j^\top A V_j` and the relations above exact.

    Cost per step: one ``matmat`` and one ``rmatmat`` on ``(*batch, ., 1)`` blocks, plus
    :math:`O((n+m) j)` for reorthogonalisation and an SVD of the ``j x j`` bidiagonal
    (on CPU). Memory: :math:`O((n + m) j)` per batch element for the two bases.

    References
    ----------
    G. Golub and W. Kahan (1965), "Calculating the singular values and pseudo-inverse of a
    matrix", SIAM J. Numer. Anal. Ser. B 2(2), 205-224. B. N. Parlett, *The Symmetric
    Eigenvalue Problem* (1998), Theorem 4.5.1 (residual bound). J. Baglama and L. Reichel
    (2005), "Augmented implicitly restarted Lanczos bidiagonalization methods" (residual of
    a Ritz triple).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import golub_kahan
    >>> from approxlab.operators import DenseOperator
    >>> g = torch.Generator().manual_seed(0)
    >>> a = torch.randn(3, 60, 40, generator=g, dtype=torch.float64)
    >>> result = golub_kahan(DenseOperator(a), generator=g)
    >>> bool(result.converged.all()), bool(torch.allclose(result.estimate, torch.linalg.matrix_norm(a, ord=2)))
    (True, True)
    """
    op, tol, max_iter, generator = _check_inputs(op, tol, max_iter, generator)
    a = op.T if op.shape[-2] < op.shape[-1] else op  # iterate with n_rows >= n_cols
    batch = tuple(a.shape[:-2])
    n_rows, n_cols = a.shape[-2], a.shape[-1]
    dtype, device = a.dtype, a.device
    threshold = torch.finfo(dtype).eps * math.sqrt(n_rows)
    steps = min(max_iter, n_cols)

    left = _Basis(batch, n_rows, min(steps, 16), dtype, device)
    right = _Basis(batch, n_cols, min(steps + 1, 16), dtype, device)
    scale = torch.zeros(batch, dtype=dtype, device=device)
    start = _random_column(batch, n_cols, generator, dtype, device)
    v, _ = _normalize_or_restart(start, right, torch.ones_like(scale), generator, 0.0)
    right.append(v)

    alphas, betas = [], []
    u_prev = beta_prev = None
    done = torch.zeros(batch, dtype=torch.bool)
    out_theta = torch.zeros(batch, dtype=torch.float64)
    out_residual = torch.zeros(batch, dtype=torch.float64)
    num_matvecs = 0
    for j in range(1, steps + 1):
        w = _finite_product(a.matmat(v), j)
        if w.shape[:-2] != batch:
            w = w.expand(*batch, *w.shape[-2:])
        if u_prev is not None:
            w = w - beta_prev[..., None, None] * u_prev
        w = left.orthogonalize(w)
        scale = torch.maximum(scale, safe_norm(w, dim=(-2, -1)))
        u, alpha = _normalize_or_restart(w, left, scale, generator, threshold)
        left.append(u)

        z = _finite_product(a.rmatmat(u), j)
        if z.shape[:-2] != batch:
            z = z.expand(*batch, *z.shape[-2:])
        z = right.orthogonalize(z - alpha[..., None, None] * v)
        num_matvecs += 2
        if j == n_cols:  # V_j spans R^m: A^T U_j = V_j B_j^T exactly, beta_j = 0
            beta = torch.zeros_like(alpha)
            v_next = None
        else:
            scale = torch.maximum(scale, safe_norm(z, dim=(-2, -1)))
            v_next, beta = _normalize_or_restart(z, right, scale, generator, threshold)
            right.append(v_next)
        alphas.append(alpha)
        betas.append(beta)

        theta, residual = _top_ritz_triple(alphas, betas)
        now = residual <= tol * theta
        update = ~done
        out_theta = torch.where(update, theta, out_theta)
        out_residual = torch.where(update, residual, out_residual)
        done = done | now
        if bool(done.all()):
            break
        v, u_prev, beta_prev = v_next, u, beta

    if not bool(done.all()):
        _warn_not_converged(
            out_residual / out_theta.clamp_min(torch.finfo(torch.float64).tiny), done, method="golub_kahan",
            budget=f"max_iter={max_iter} steps", measure="relative residual residual/estimate =", tol=tol,
            note=". `estimate` is still a certified lower bound on the spectral norm; raise `max_iter` for a "
            "converged value.",
        )

    estimate = out_theta.to(device=device, dtype=dtype)
    residual = out_residual.to(device=device, dtype=dtype)
    return SpectralNormEstimate(
        estimate=estimate,
        lower_bound=estimate.clone(),
        residual=residual,
        distance_bound=residual / math.sqrt(2.0),
        num_matvecs=num_matvecs,
        converged=done.to(device),
    )
