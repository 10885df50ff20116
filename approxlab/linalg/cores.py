r"""The middle factor ("core") of a Nyström approximation, and the pseudo-inverse behind it.

A Nyström-type approximation is ``left @ core @ right`` where ``core`` is a (regularised)
pseudo-inverse of a small sampled block :math:`M` (``d x d``). Two cores are computed here:

* ``"pinv"``: the rank-thresholded Moore--Penrose pseudo-inverse :math:`M^+`
  (:func:`stable_pinv`, Eq. (5) of Skyformer), kept *factored* (:class:`CoreFactors`) so
  that the outer factors are projected onto the core's eigenvectors before the small
  eigenvalues are divided out;
* ``"schulz"``: Skyformer's practical core (Section 4.4, Lemma 3), Schulz iterations
  (:func:`approxlab.linalg.iterative_pinv`) on the scaled core of :func:`scaled_core`.

The rank threshold is the one tolerance rule of the library,
:func:`approxlab.linalg.conditioning.default_rtol` (:math:`\max(n, k)\,\varepsilon`).

References
----------
Chen, Zeng, Ji, Yang (2021), "Skyformer: Remodel Self-Attention with Gaussian Kernel and
Nyström Method", NeurIPS: Eq. (5), Lemma 3, Section 4.4.
Xiong et al. (2021), Nystromformer, Eq. (5).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._validation import check_bool, check_choice, check_int, check_positive_float, check_rtol, check_square
from ..errors import NotPSDError
from .._validation import peak_magnitude
from .conditioning import default_rtol
from .scaling import balance, times_power_of_two
from .pinv import INITS, iterative_pinv

__all__ = [
    "CORES",
    "DEFAULT_CORE",
    "DEFAULT_INIT",
    "DEFAULT_GAMMA",
    "DEFAULT_NUM_ITER",
    "CoreFactors",
    "pinv_factors",
    "stable_pinv",
    "scaled_core",
    "check_core_options",
    "nystrom_core",
]

CORES = ("pinv", "schulz")
DEFAULT_CORE = "pinv"
"""The core of Eq. (5) and Theorem 2 of Skyformer (what Figure 1 plots)."""
DEFAULT_INIT = "identity"
"""Schulz start :math:`Z_0` of the ``"schulz"`` core (converges by Skyformer's Lemma 3)."""
DEFAULT_GAMMA = 0.1
r"""Skyformer's regulariser :math:`\gamma` of the ``"schulz"`` core (Section 4.4)."""
DEFAULT_NUM_ITER = 6
"""Schulz iterations of the ``"schulz"`` core (Nystromformer's choice, Eq. (5))."""


class CoreFactors(NamedTuple):
    r"""The middle factor of a Nyström approximation as ``first @ second`` (``second`` may be None).

    For a pseudo-inverse, ``first = V|\Lambda|^{+1/2}`` and ``second = \pm|\Lambda|^{+1/2}U^\top``, so
    ``left @ first`` projects onto the core's eigen/singular vectors *before* dividing by
    the small eigenvalues; forming :math:`M^+` and then ``left @ M^+`` would instead add up
    entries of size :math:`1/\lambda_{\min}` that cancel (a loss of every digit for a
    Gaussian-kernel core with :math:`\kappa(M) \sim 10^{13}`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import pinv_factors
    >>> m = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    >>> factors, spectrum, rank = pinv_factors(m, hermitian=True)
    >>> bool(torch.allclose(factors.first @ factors.second, torch.linalg.inv(m)))
    True
    """

    first: torch.Tensor
    second: torch.Tensor | None

    def matrix(self) -> torch.Tensor:
        """The ``(*batch, d, d)`` core, formed densely."""
        return self.first if self.second is None else self.first @ self.second


def pinv_factors(m: torch.Tensor, *, hermitian: bool, rcond: float | None = None):
    r"""The thresholded pseudo-inverse of :func:`stable_pinv`, factored, with its spectrum and rank.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, d, d)``; symmetric PSD up to rounding when ``hermitian``.
    hermitian : bool
        Eigendecomposition (``True``) or SVD (``False``), as in :func:`stable_pinv`.
    rcond : float, optional
        Relative threshold; default :func:`~approxlab.linalg.conditioning.default_rtol`.

    Returns
    -------
    factors : CoreFactors
        :math:`M^+` as ``first @ second``.
    spectrum : torch.Tensor
        ``(*batch, d)``, eigenvalues clamped at 0 (``hermitian``) or singular values, descending.
    rank : torch.Tensor
        ``(*batch,)`` ``int64``, the number of values kept by the threshold.

    Raises
    ------
    NotPSDError
        With ``hermitian=True``, if an eigenvalue is below :math:`-\sqrt{\epsilon}\,\lambda_{\max}`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import pinv_factors
    >>> m = torch.ones(3, 3, dtype=torch.float64)  # rank 1, eigenvalue 3
    >>> factors, spectrum, rank = pinv_factors(m, hermitian=True)
    >>> int(rank), [round(x, 6) for x in spectrum.tolist()]
    (1, [3.0, 0.0, 0.0])
    >>> bool(torch.allclose(factors.first @ factors.second, m / 9))  # pinv(J) = J / 9
    True
    """
    rcond = default_rtol(m) if rcond is None else rcond
    m, exponent = balance(m, even=True)  # M = 2^e M_b: the factors of M_b^+ scaled by 2^(-e/2), exactly
    if hermitian:
        sym = 0.5 * m + 0.5 * m.transpose(-1, -2)  # the same value as 0.5 (m + m^T), without overflow
        evals, evecs = torch.linalg.eigh(sym)
        top = evals.abs().amax(-1, keepdim=True)
        floor = -math.sqrt(torch.finfo(m.dtype).eps) * top
        if bool((evals < floor).any()):
            worst = float((evals / top.clamp_min(torch.finfo(m.dtype).tiny)).min())
            raise NotPSDError(
                "the sampled Nyström core S^T K S must be positive semidefinite: its smallest "
                f"eigenvalue is {worst:.3e} x its largest, below the tolerance "
                f"-sqrt(eps)={-math.sqrt(torch.finfo(m.dtype).eps):.1e}. Is `K` PSD?"
            )
        keep = evals > rcond * top
        scale = torch.where(keep, torch.where(keep, evals, torch.ones_like(evals)).rsqrt(), torch.zeros_like(evals))
        first = times_power_of_two(evecs * scale.unsqueeze(-2), -exponent / 2)
        spectrum = times_power_of_two(evals.clamp_min(0.0).flip(-1), exponent[..., 0])
        return CoreFactors(first, first.transpose(-1, -2)), spectrum, keep.sum(-1)
    u, s, vh = torch.linalg.svd(m)
    keep = s > rcond * s[..., :1]
    scale = torch.where(keep, torch.where(keep, s, torch.ones_like(s)).rsqrt(), torch.zeros_like(s))
    first = times_power_of_two(vh.transpose(-1, -2) * scale.unsqueeze(-2), -exponent / 2)
    second = times_power_of_two(scale.unsqueeze(-1) * u.transpose(-1, -2), -exponent / 2)
    return CoreFactors(first, second), times_power_of_two(s, exponent[..., 0]), keep.sum(-1)


def stable_pinv(m: torch.Tensor, *, hermitian: bool = True, rcond: float | None = None) -> torch.Tensor:
    r"""Moore--Penrose pseudo-inverse of a small core matrix, with a rank threshold.

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, d, d)``. With ``hermitian=True`` it must be symmetric PSD up to rounding
        (it is symmetrised first).
    hermitian : bool
        ``True``: eigendecomposition of the symmetric PSD core (Nyström cores
        :math:`S^\top K S`); ``False``: SVD (the non-symmetric core :math:`A_{SS}` of plain
        Nyström on a score matrix).
    rcond : float, optional
        Relative threshold; default ``d * eps(dtype)``.

    Returns
    -------
    torch.Tensor
        ``(*batch, d, d)``.

    Raises
    ------
    NotPSDError
        With ``hermitian=True``, if an eigenvalue is below :math:`-\sqrt{\epsilon}\,\lambda_{\max}`.

    Notes
    -----
    Eigenvalues (singular values) :math:`\le \text{rcond}\cdot\lambda_{\max}` are treated as
    exact zeros and dropped; the rest are inverted. With ``rcond = d * eps`` this is the
    rank convention of NumPy's ``matrix_rank``: anything smaller is indistinguishable from
    rounding noise in a ``d x d`` matrix. scikit-learn's ``Nystroem`` instead *floors*
    singular values at ``1e-12`` and inverts all of them; for a Gaussian-kernel core, whose
    spectrum decays to rounding level, that inverts noise of size ``1e-16`` into ``1e12``.
    Dropping them instead keeps the result a pseudo-inverse of the numerically-rank-
    revealed core, so :math:`KS(S^\top KS)^+S^\top K` stays within
    :math:`O(\text{rcond}\,\|K\|)` of its exact-arithmetic value. Negative eigenvalues of a
    PSD core (rounding, :math:`\ge -\sqrt\epsilon\lambda_{\max}`) are dropped with the
    small ones.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg import stable_pinv
    >>> stable_pinv(torch.ones(2, 2, dtype=torch.float64))  # rank 1: pinv(J) = J / 4
    tensor([[0.2500, 0.2500],
            [0.2500, 0.2500]], dtype=torch.float64)
    """
    check_square(m, "m")
    check_bool(hermitian, "hermitian")
    if rcond is not None:
        rcond = check_rtol(rcond, "rcond", allow_zero=False)
    factors, spectrum, rank = pinv_factors(m, hermitian=hermitian, rcond=rcond)
    result = factors.matrix()
    if not math.isfinite(peak_magnitude(result)):
        kept = spectrum.gather(-1, (rank - 1).clamp_min(0).unsqueeze(-1))
        raise OverflowError(
            f"`m` has a pseudo-inverse beyond the largest {m.dtype} ({torch.finfo(m.dtype).max:.3e}): its "
            f"smallest kept {'eigenvalue' if hermitian else 'singular value'} is {float(kept.min()):.3e}, whose "
            "reciprocal is not representable; rescale `m`."
        )
    return result



def scaled_core(m: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Skyformer's scaled core :math:`D_M^{-1/2}(M+\gamma I)D_M^{-1/2}` (Section 4.4, Lemma 3).

    Parameters
    ----------
    m : torch.Tensor
        ``(*batch, d, d)`` symmetric PSD with non-negative entries (a sampled Gaussian-kernel
        core :math:`M = S^\top\bar C S`).
    gamma : float
        :math:`\gamma > 0`.

    Returns
    -------
    scaled : torch.Tensor
        ``(*batch, d, d)``, :math:`X = D_M^{-1/2}(M+\gamma I)D_M^{-1/2}`.
    inv_sqrt_row_sums : torch.Tensor
        ``(*batch, d)``, the diagonal of :math:`D_M^{-1/2}`, :math:`D_M = \operatorname{diag}((M+\gamma I)\mathbf 1)`.

    Notes
    -----
    Lemma 3 of Skyformer: :math:`D_M - (M+\gamma I)` is a graph Laplacian of the
    non-negative weights :math:`M+\gamma I`, hence PSD, so every eigenvalue of :math:`X`
    lies in :math:`(0, 1]` and :math:`\|I - X\| < 1`: the Schulz iteration converges from
    :math:`Z_0 = I`. (The paper writes :math:`(0, 1)`; the value 1 is attained, with
    eigenvector :math:`D_M^{1/2}\mathbf 1`.) The smallest eigenvalue is at least
    :math:`\gamma / \max_i (D_M)_{ii}`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import gaussian_kernel
    >>> from approxlab.linalg import scaled_core
    >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> scaled, inv_sqrt_row_sums = scaled_core(gaussian_kernel(x, x), 0.1)
    >>> eigenvalues = torch.linalg.eigvalsh(scaled)  # in (0, 1] by Lemma 3 of Skyformer
    >>> bool(eigenvalues.min() > 0), round(float(eigenvalues.max()), 6)
    (True, 1.0)
    """
    check_square(m, "m")
    gamma = check_positive_float(gamma, "gamma")
    if bool((m < 0).any()):
        raise ValueError(
            "`m` must have non-negative entries for Skyformer's scaled core (Lemma 3); "
            f"got min entry {float(m.min()):.3e}."
        )
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    w = 0.5 * m + 0.5 * m.transpose(-1, -2) + gamma * eye
    row_sums = w.sum(-1)
    if not math.isfinite(peak_magnitude(row_sums)):
        raise OverflowError(
            f"`m` must have row sums within the range of {m.dtype} for Skyformer's scaled core; got a row sum "
            f"beyond {torch.finfo(m.dtype).max:.3e}. Rescale `m` (and `gamma` with it)."
        )
    inv_sqrt = row_sums.rsqrt()
    return inv_sqrt.unsqueeze(-1) * w * inv_sqrt.unsqueeze(-2), inv_sqrt


def _condition_number(spectrum: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma_{\max}/\sigma_{\min}` of a core whose ``rank`` is full, ``inf`` where the
    threshold dropped a direction -- the rule of :func:`approxlab.linalg.condition_number`, so a
    finite value is never made of rounding noise."""
    spectrum = balance(spectrum, dim=-1)[0]  # a ratio: the same for every power-of-two multiple
    top, bottom = spectrum[..., 0], spectrum[..., -1]
    full = (rank == spectrum.shape[-1]) & (bottom > 0)
    return torch.where(full, top / torch.where(full, bottom, torch.ones_like(bottom)),
                       torch.full_like(top, float("inf")))


def check_core_options(*, core, gamma, num_iter, init) -> None:
    """Validate the ``core``/``gamma``/``num_iter``/``init`` options of :func:`nystrom_core`.

    Examples
    --------
    >>> from approxlab.linalg.cores import check_core_options
    >>> check_core_options(core="schulz", gamma=0.1, num_iter=6, init="identity")
    >>> check_core_options(core="qr", gamma=0.1, num_iter=6, init="identity")
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    check_choice(core, "core", CORES)
    check_positive_float(gamma, "gamma")
    check_int(num_iter, "num_iter", low=0)
    if not isinstance(init, torch.Tensor):
        check_choice(init, "init", INITS)


def nystrom_core(
    block: torch.Tensor,
    *,
    core: str = DEFAULT_CORE,
    gamma: float = DEFAULT_GAMMA,
    num_iter: int = DEFAULT_NUM_ITER,
    init=DEFAULT_INIT,
    hermitian: bool = True,
    rcond: float | None = None,
    diagnostics: bool = True,
) -> tuple[torch.Tensor, dict]:
    r"""The middle factor of a Nyström approximation from its sampled core block.

    Parameters
    ----------
    block : torch.Tensor
        ``(*batch, d, d)``, the sampled core :math:`M` (:math:`S^\top\bar CS` for Skyformer,
        :math:`C_{SS}` for plain Nyström).
    core : {"pinv", "schulz"}
        ``"pinv"``: :math:`M^+` by :func:`stable_pinv` (what Eq. (5) and Theorem 2 of
        Skyformer analyse). ``"schulz"``: Skyformer's practical core (Section 4.4):
        :math:`(M+\gamma I)^{-1} \approx D_M^{-1/2} Z D_M^{-1/2}` where :math:`Z` is
        ``num_iter`` steps of Nystromformer Eq. (5) on the scaled core of
        :func:`scaled_core` (symmetric, non-negative ``block`` only).
    gamma : float
        :math:`\gamma > 0` for ``"schulz"`` (default 0.1).
    num_iter : int
        Schulz iterations for ``"schulz"`` (default 6, as Nystromformer).
    init : {"identity", "nystromformer", "official"} or torch.Tensor
        :math:`Z_0` for ``"schulz"``; ``"identity"`` (default) is justified by Lemma 3.
    hermitian : bool
        Whether ``block`` is symmetric PSD (eigendecomposition) or general (SVD).
    rcond : float, optional
        Rank threshold for ``"pinv"``.
    diagnostics : bool
        ``False``: for ``"schulz"``, leave out ``core_condition_number`` and ``core_rank``, whose
        spectrum costs an eigendecomposition the core itself does not need (training).

    Returns
    -------
    factors : CoreFactors
        The core as ``first @ second`` (``(*batch, d, d)`` each; ``second`` is None for
        ``"schulz"``); ``factors.matrix()`` forms it.
    info : dict
        ``core_block`` (:math:`M`), ``core_condition_number`` (``(*batch,)``,
        :math:`\sigma_{\max}/\sigma_{\min}` of :math:`M`, ``inf`` if the threshold drops a
        direction, i.e. ``core_rank < d``), ``core_rank`` (eigenvalues kept by the threshold),
        and for ``"schulz"`` ``pinv_residuals`` / ``pinv_penrose_residuals``
        (``(num_iter + 1, *batch)``, see :func:`approxlab.linalg.iterative_pinv`).

    Notes
    -----
    From :math:`Z_0 = I` the Schulz residual on an eigenvalue :math:`x` of the scaled core is
    :math:`(1-x)^{3^j}` after :math:`j` steps, and :math:`x \ge \gamma/(d+\gamma)` only: with
    6 steps, directions with :math:`x \lesssim 10^{-2}` are *not* inverted. The practical
    core is therefore a strongly regularised inverse, not :math:`M^+`; ``"pinv"`` is the
    default of the methods for that reason.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import gaussian_kernel
    >>> from approxlab.linalg import nystrom_core
    >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> block = gaussian_kernel(x, x)
    >>> factors, info = nystrom_core(block)  # "pinv": the pseudo-inverse of Eq. (5) of Skyformer
    >>> bool(torch.allclose(factors.first @ factors.second, torch.linalg.pinv(block, hermitian=True)))
    True
    >>> factors, info = nystrom_core(block, core="schulz", gamma=0.1)  # (M + 0.1 I)^-1, Section 4.4
    >>> sorted(info)
    [...]
    """
    check_square(block, "block")
    check_core_options(core=core, gamma=gamma, num_iter=num_iter, init=init)
    check_bool(hermitian, "hermitian")
    if rcond is not None:
        rcond = check_rtol(rcond, "rcond", allow_zero=False)
    if core == "schulz" and not hermitian:
        raise ValueError(
            "`core` must be 'pinv' for a non-symmetric core block (Lemma 3 of Skyformer needs a "
            "symmetric PSD core); got core='schulz'."
        )

    check_bool(diagnostics, "diagnostics")
    if core == "pinv":
        factors, spectrum, rank = pinv_factors(block, hermitian=hermitian, rcond=rcond)
    elif diagnostics:
        spectrum, rank = _spectrum_only(block, hermitian=hermitian, rcond=rcond)
    info = {"core_block": block}
    if core == "pinv" or diagnostics:
        info.update(core_condition_number=_condition_number(spectrum, rank), core_rank=rank)
    if core == "schulz":
        x, inv_sqrt = scaled_core(block, gamma)
        result = iterative_pinv(x, num_iter, init=init, history=False, norm="frobenius")
        factors = CoreFactors(inv_sqrt.unsqueeze(-1) * result.inverse * inv_sqrt.unsqueeze(-2), None)
        info["gamma"] = gamma
        info["pinv_residuals"] = result.residuals
        info["pinv_penrose_residuals"] = result.penrose_residuals
    return factors, info


def _spectrum_only(block, *, hermitian, rcond):
    """Spectrum (balanced by a power of two: only its ratios are used) and numerical rank of ``block``."""
    rcond = default_rtol(block) if rcond is None else rcond
    block = balance(block)[0]
    if hermitian:
        s = torch.linalg.eigvalsh(0.5 * block + 0.5 * block.transpose(-1, -2)).flip(-1)
        top = s.abs()[..., :1]
        return s.clamp_min(0.0), (s > rcond * top).sum(-1)
    s = torch.linalg.svdvals(block)
    return s, (s > rcond * s[..., :1]).sum(-1)

