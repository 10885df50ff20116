r"""Column sampling and the Nyström method, shared by every Nyström-type approximation.

One module, one concept: choosing columns (uniform or by ridge leverage scores), the
Nyström approximation :math:`KS(S^\top KS)^+S^\top K` of a PSD matrix, the stable
pseudo-inverse of its sampled core, and the *skeleton* (left block, core block, right
block) of an attention score matrix from which ``skyformer``, ``skyformer-softmax`` and
``nystrom`` are all assembled. The method files only choose landmarks; everything they
compute lives here once.

Conventions: ``(*batch)`` leading dimensions everywhere; column indices are
``LongTensor`` of shape ``(*batch, d)`` or ``(d,)`` (the same columns for every batch
element); random draws come from a CPU ``torch.Generator`` and are moved to the data's
device afterwards.

References
----------
Chen, Zeng, Ji, Yang (2021), "Skyformer: Remodel Self-Attention with Gaussian Kernel and
Nyström Method", NeurIPS: Definition 1 (uniform sub-sampling), Eqs. (4)-(6), Lemma 3.
Williams & Seeger (2001), "Using the Nyström method to speed up kernel machines".
Musco & Musco (2017), "Recursive sampling for the Nyström method", NeurIPS.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch

from . import kernels
from ._validation import (
    as_generator,
    check_bool,
    check_choice,
    check_int,
    check_positive_float,
    check_qkv,
    check_rtol,
    check_shape,
    check_square,
    check_tensor,
)
from .errors import NotPSDError
from .linalg.pinv import INITS, iterative_pinv
from .operators import DiagonalOperator, ProductOperator

__all__ = [
    "check_columns",
    "gather_rows",
    "uniform_columns",
    "completion_landmarks",
    "ridge_leverage_columns",
    "stable_pinv",
    "nystrom",
    "scaled_core",
    "check_core_options",
    "CoreFactors",
    "nystrom_core",
    "Skeleton",
    "gaussian_skeleton",
    "skeleton_attention",
    "CORES",
]

CORES = ("pinv", "schulz")


# -- columns -----------------------------------------------------------------------------


def check_columns(columns, num_columns: int, *, batch_shape=(), name: str = "columns") -> torch.Tensor:
    """Validate column indices and return them as ``(*batch_shape, d)`` ``int64``.

    Parameters
    ----------
    columns : torch.Tensor
        Integer tensor ``(d,)`` (the same columns for every batch element) or
        ``(*batch_shape, d)``, entries in ``[0, num_columns)``. Repeated indices are allowed
        (sampling with replacement, Skyformer Definition 1).
    num_columns : int
        ``N``, the number of columns to choose from.
    batch_shape : tuple
        The batch dimensions the indices must broadcast to.
    """
    if not isinstance(columns, torch.Tensor):
        raise TypeError(f"`{name}` must be an integer torch.Tensor; got {type(columns).__name__}.")
    if columns.dtype.is_floating_point or columns.dtype.is_complex or columns.dtype == torch.bool:
        raise TypeError(f"`{name}` must have an integer dtype (e.g. torch.long); got {columns.dtype}.")
    num_columns = check_int(num_columns, "num_columns", low=1)
    batch_shape = check_shape(batch_shape)
    if columns.ndim == 0 or columns.shape[-1] == 0:
        raise ValueError(f"`{name}` must have shape (d,) or (*batch, d) with d >= 1; got {tuple(columns.shape)}.")
    if columns.ndim > 1 and tuple(columns.shape[:-1]) != batch_shape:
        raise ValueError(
            f"`{name}` must have shape (d,) or (*batch, d) with batch {batch_shape}; "
            f"got {tuple(columns.shape)}."
        )
    low, high = int(columns.min()), int(columns.max())
    if low < 0 or high >= num_columns:
        raise ValueError(
            f"`{name}` must hold indices in [0, {num_columns}); got values in [{low}, {high}]."
        )
    return columns.to(torch.long).expand(*batch_shape, columns.shape[-1])


def gather_rows(x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Rows ``x[..., columns, :]`` per batch element: ``(*batch, N, p), (*batch, d) -> (*batch, d, p)``."""
    columns = columns.to(x.device)
    index = columns.unsqueeze(-1).expand(*columns.shape, x.shape[-1])
    return torch.gather(x, -2, index)


def uniform_columns(
    num_columns: int,
    d: int,
    *,
    batch_shape=(),
    generator: torch.Generator | None = None,
    replace: bool = False,
    device=None,
) -> torch.Tensor:
    r"""``d`` column indices drawn uniformly from ``range(num_columns)``, per batch element.

    Parameters
    ----------
    num_columns : int
        ``N >= 1``.
    d : int
        Number of columns, ``1 <= d`` (``<= N`` without replacement).
    batch_shape : tuple
        Independent draws for each batch element.
    generator : torch.Generator, optional
        CPU generator; all draws come from it.
    replace : bool
        ``True``: i.i.d. uniform indices (the sub-sampling matrix of Skyformer Definition 1,
        whose columns are :math:`e_i/\sqrt d` with probability :math:`1/N`; the
        :math:`1/\sqrt d` weight does not change a Nyström approximation). ``False``: a
        uniformly random ``d``-subset (no wasted duplicate columns).
    device : torch.device, optional
        Where to put the result (drawn on CPU first).

    Returns
    -------
    torch.Tensor
        ``(*batch_shape, d)`` ``int64``.
    """
    num_columns = check_int(num_columns, "num_columns", low=1)
    d = check_int(d, "d", low=1, high=None if replace else num_columns)
    check_bool(replace, "replace")
    g = as_generator(generator)
    batch_shape = check_shape(batch_shape)
    if replace:
        idx = torch.randint(0, num_columns, (*batch_shape, d), generator=g)
    else:
        idx = torch.rand(*batch_shape, num_columns, generator=g).argsort(-1)[..., :d]
    return idx if device is None else idx.to(device)


def completion_landmarks(q, k, num_features, *, generator=None, columns=None):
    r"""Landmark rows :math:`X_S` of the completion's :math:`X = [Q; K]`, and their indices ``S``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)`` raw queries and keys.
    num_features : int or None
        ``d``, ``1 <= d <= n + m``; may be ``None`` when ``columns`` is given.
    generator : torch.Generator, optional
        CPU generator for :func:`uniform_columns` (``d`` distinct indices per batch element).
    columns : torch.Tensor, optional
        Explicit ``(d,)`` or ``(*batch, d)`` indices into ``range(n + m)`` (validated with
        :func:`check_columns`; ``d`` must equal ``num_features`` when both are given).

    Returns
    -------
    landmarks : torch.Tensor
        ``(*batch, d, p)``, raw (unscaled) rows of :math:`[Q; K]`.
    columns : torch.Tensor
        ``(*batch, d)`` ``int64`` on ``q.device``.

    Notes
    -----
    Row ``i < n`` of :math:`X` is query ``i``; row ``n + j`` is key ``j`` (Eq. (4) of Skyformer).
    """
    check_qkv(q, k)
    x = torch.cat([q, k], dim=-2)
    total = x.shape[-2]
    batch = tuple(x.shape[:-2])
    if columns is None:
        num_features = check_int(num_features, "num_features", low=1, high=total)
        columns = uniform_columns(total, num_features, batch_shape=batch, generator=generator)
    else:
        columns = check_columns(columns, total, batch_shape=batch)
        if num_features is not None and columns.shape[-1] != num_features:
            raise ValueError(
                f"`columns` must hold num_features={num_features} indices when given; "
                f"got {columns.shape[-1]}."
            )
    columns = columns.to(x.device)
    return gather_rows(x, columns), columns


def ridge_leverage_columns(
    scores: torch.Tensor,
    d: int,
    *,
    generator: torch.Generator | None = None,
    replace: bool = True,
) -> torch.Tensor:
    r"""``d`` columns sampled with probability :math:`p_i = \ell_i / \sum_j \ell_j`.

    Parameters
    ----------
    scores : torch.Tensor
        ``(*batch, N)`` non-negative (approximate) ridge leverage scores, e.g. from
        :func:`approxlab.leverage.approximate_ridge_leverage_scores`; each batch element
        needs a positive entry (``d`` of them without replacement).
    d : int
        Number of columns, ``>= 1``.
    generator : torch.Generator, optional
        CPU generator.
    replace : bool
        ``True`` (default): i.i.d. draws, the scheme the leverage-score analyses assume
        (Musco & Musco 2017); reweight sampled column ``i`` by :math:`1/\sqrt{d p_i}` when an
        unbiased sketch is needed. ``False``: successive draws without replacement.

    Returns
    -------
    torch.Tensor
        ``(*batch, d)`` ``int64`` on ``scores.device``.
    """
    check_tensor(scores, "scores", min_ndim=1)
    d = check_int(d, "d", low=1)
    check_bool(replace, "replace")
    if bool((scores < 0).any()):
        raise ValueError(f"`scores` must be >= 0; got min {float(scores.min()):.3e}.")
    positive = (scores > 0).sum(-1)
    need = 1 if replace else d
    if bool((positive < need).any()):
        raise ValueError(
            f"`scores` must have at least {need} positive entries per batch element "
            f"(d={d}, replace={replace}); got {int(positive.min())}."
        )
    g = as_generator(generator)
    flat = scores.detach().to("cpu", torch.float64).reshape(-1, scores.shape[-1])
    idx = torch.multinomial(flat, d, replacement=replace, generator=g)
    return idx.reshape(*scores.shape[:-1], d).to(scores.device)


# -- the Nyström core ----------------------------------------------------------------------


def _default_rcond(m: torch.Tensor) -> float:
    return m.shape[-1] * torch.finfo(m.dtype).eps


class CoreFactors(NamedTuple):
    r"""The middle factor of a Nyström approximation as ``first @ second`` (``second`` may be None).

    For a pseudo-inverse, ``first = V|\Lambda|^{+1/2}`` and ``second = \pm|\Lambda|^{+1/2}U^\top``, so
    ``left @ first`` projects onto the core's eigen/singular vectors *before* dividing by
    the small eigenvalues; forming :math:`M^+` and then ``left @ M^+`` would instead add up
    entries of size :math:`1/\lambda_{\min}` that cancel (a loss of every digit for a
    Gaussian-kernel core with :math:`\kappa(M) \sim 10^{13}`).
    """

    first: torch.Tensor
    second: torch.Tensor | None

    def matrix(self) -> torch.Tensor:
        """The ``(*batch, d, d)`` core, formed densely."""
        return self.first if self.second is None else self.first @ self.second


def _pinv_factors(m: torch.Tensor, *, hermitian: bool, rcond: float | None):
    """Factored thresholded pseudo-inverse, spectrum (descending) and kept rank (see :func:`stable_pinv`)."""
    rcond = _default_rcond(m) if rcond is None else rcond
    if hermitian:
        sym = 0.5 * (m + m.transpose(-1, -2))
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
        first = evecs * scale.unsqueeze(-2)
        return CoreFactors(first, first.transpose(-1, -2)), evals.clamp_min(0.0).flip(-1), keep.sum(-1)
    u, s, vh = torch.linalg.svd(m)
    keep = s > rcond * s[..., :1]
    scale = torch.where(keep, torch.where(keep, s, torch.ones_like(s)).rsqrt(), torch.zeros_like(s))
    first = vh.transpose(-1, -2) * scale.unsqueeze(-2)
    second = scale.unsqueeze(-1) * u.transpose(-1, -2)
    return CoreFactors(first, second), s, keep.sum(-1)


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
    """
    check_square(m, "m")
    check_bool(hermitian, "hermitian")
    if rcond is not None:
        rcond = check_rtol(rcond, "rcond", allow_zero=False)
    return _pinv_factors(m, hermitian=hermitian, rcond=rcond)[0].matrix()


def nystrom(K: torch.Tensor, columns: torch.Tensor, *, rcond: float | None = None) -> torch.Tensor:
    r"""The Nyström approximation :math:`KS(S^\top KS)^+S^\top K` of a symmetric PSD ``K``.

    Parameters
    ----------
    K : torch.Tensor
        ``(*batch, N, N)`` symmetric positive semidefinite.
    columns : torch.Tensor
        ``(d,)`` or ``(*batch, d)`` integer indices in ``[0, N)``; repeats allowed (they
        change nothing: :math:`S` and :math:`SW` span the same columns).
    rcond : float, optional
        Rank threshold of the core pseudo-inverse (:func:`stable_pinv`).

    Returns
    -------
    torch.Tensor
        ``(*batch, N, N)``, formed densely (a reference for tests and small studies).

    Raises
    ------
    NotPSDError
        If ``K`` is not symmetric (relative ``sqrt(eps)``) or the core is not PSD.

    Notes
    -----
    Eq. (5) of Skyformer with :math:`S` the 0/1 selection matrix of ``columns``. For
    :math:`K = BB^\top`, :math:`\tilde K = BP B^\top` with :math:`P` the orthogonal projector
    onto the column space of :math:`B^\top S`, hence :math:`0 \preceq \tilde K \preceq K`
    (Skyformer Appendix D) and the result is unchanged by any positive rescaling of the
    sampled columns (Definition 1's :math:`1/\sqrt d` weights included).

    References
    ----------
    Williams & Seeger (2001); Skyformer (Chen et al., 2021), Eq. (5) and Appendix D.
    """
    check_square(K, "K")
    columns = check_columns(columns, K.shape[-1], batch_shape=K.shape[:-2])
    if rcond is not None:
        rcond = check_rtol(rcond, "rcond", allow_zero=False)
    scale = K.abs().amax((-1, -2)).clamp_min(torch.finfo(K.dtype).tiny)
    asym = ((K - K.transpose(-1, -2)).abs().amax((-1, -2)) / scale).max()
    if float(asym) > math.sqrt(torch.finfo(K.dtype).eps):
        raise NotPSDError(
            f"`K` must be symmetric positive semidefinite; got max |K - K^T| / max |K| = {float(asym):.3e} "
            f"> sqrt(eps)={math.sqrt(torch.finfo(K.dtype).eps):.1e}."
        )
    rows = gather_rows(K, columns)  # S^T K: (*batch, d, N)
    core = gather_rows(rows.transpose(-1, -2), columns)  # S^T K S: (*batch, d, d)
    factors = _pinv_factors(core, hermitian=True, rcond=rcond)[0]
    half = factors.second @ rows  # Lambda^{+1/2} V^T S^T K: project, then scale
    return half.transpose(-1, -2) @ half


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
    """
    check_square(m, "m")
    gamma = check_positive_float(gamma, "gamma")
    if bool((m < 0).any()):
        raise ValueError(
            "`m` must have non-negative entries for Skyformer's scaled core (Lemma 3); "
            f"got min entry {float(m.min()):.3e}."
        )
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    w = 0.5 * (m + m.transpose(-1, -2)) + gamma * eye
    inv_sqrt = w.sum(-1).rsqrt()
    return inv_sqrt.unsqueeze(-1) * w * inv_sqrt.unsqueeze(-2), inv_sqrt


def _condition_number(spectrum: torch.Tensor) -> torch.Tensor:
    top, bottom = spectrum[..., 0], spectrum[..., -1]
    return torch.where(bottom > 0, top / torch.where(bottom > 0, bottom, torch.ones_like(bottom)),
                       torch.full_like(top, float("inf")))


def check_core_options(*, core="pinv", gamma=0.1, num_iter=6, init="identity") -> None:
    """Validate the ``core``/``gamma``/``num_iter``/``init`` options of :func:`nystrom_core`."""
    check_choice(core, "core", CORES)
    check_positive_float(gamma, "gamma")
    check_int(num_iter, "num_iter", low=0)
    if not isinstance(init, torch.Tensor):
        check_choice(init, "init", INITS)


def nystrom_core(
    block: torch.Tensor,
    *,
    core: str = "pinv",
    gamma: float = 0.1,
    num_iter: int = 6,
    init="identity",
    hermitian: bool = True,
    rcond: float | None = None,
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

    Returns
    -------
    factors : CoreFactors
        The core as ``first @ second`` (``(*batch, d, d)`` each; ``second`` is None for
        ``"schulz"``); ``factors.matrix()`` forms it.
    info : dict
        ``core_block`` (:math:`M`), ``core_condition_number`` (``(*batch,)``,
        :math:`\sigma_{\max}/\sigma_{\min}` of :math:`M`, ``inf`` if singular), ``core_rank``
        (eigenvalues kept by the threshold), and for ``"schulz"`` ``pinv_residuals`` /
        ``pinv_penrose_residuals`` (``(num_iter + 1, *batch)``, see
        :func:`approxlab.linalg.iterative_pinv`).

    Notes
    -----
    From :math:`Z_0 = I` the Schulz residual on an eigenvalue :math:`x` of the scaled core is
    :math:`(1-x)^{3^j}` after :math:`j` steps, and :math:`x \ge \gamma/(d+\gamma)` only: with
    6 steps, directions with :math:`x \lesssim 10^{-2}` are *not* inverted. The practical
    core is therefore a strongly regularised inverse, not :math:`M^+`; ``"pinv"`` is the
    default of the methods for that reason.
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

    if core == "pinv":
        factors, spectrum, rank = _pinv_factors(block, hermitian=hermitian, rcond=rcond)
    else:
        spectrum, rank = _spectrum_only(block, hermitian=hermitian, rcond=rcond)
    info = {
        "core_block": block,
        "core_condition_number": _condition_number(spectrum),
        "core_rank": rank,
    }
    if core == "schulz":
        x, inv_sqrt = scaled_core(block, gamma)
        result = iterative_pinv(x, num_iter, init=init, history=False, norm="frobenius")
        factors = CoreFactors(inv_sqrt.unsqueeze(-1) * result.inverse * inv_sqrt.unsqueeze(-2), None)
        info["gamma"] = gamma
        info["pinv_residuals"] = result.residuals
        info["pinv_penrose_residuals"] = result.penrose_residuals
    return factors, info


def _spectrum_only(block, *, hermitian, rcond):
    rcond = _default_rcond(block) if rcond is None else rcond
    if hermitian:
        s = torch.linalg.eigvalsh(0.5 * (block + block.transpose(-1, -2))).flip(-1)
        top = s.abs()[..., :1]
        return s.clamp_min(0.0), (s > rcond * top).sum(-1)
    s = torch.linalg.svdvals(block)
    return s, (s > rcond * s[..., :1]).sum(-1)


# -- skeletons of attention score matrices -------------------------------------------------


@dataclasses.dataclass
class Skeleton:
    r"""The three sampled blocks of a Nyström-type approximation ``left @ core^+ @ right``.

    Attributes
    ----------
    left : torch.Tensor
        ``(*batch, n, d)``.
    block : torch.Tensor
        ``(*batch, d, d)``, the sampled core (before any inversion).
    right : torch.Tensor
        ``(*batch, d, m)``.
    normalized : bool
        ``True`` when the blocks are the row- and key-rescaled ones of a softmax target (see
        :func:`gaussian_skeleton`); the approximation is then only meaningful after row
        normalisation.
    """

    left: torch.Tensor
    block: torch.Tensor
    right: torch.Tensor
    normalized: bool


def gaussian_skeleton(
    q: torch.Tensor,
    k: torch.Tensor,
    left_landmarks: torch.Tensor,
    right_landmarks: torch.Tensor,
    *,
    normalized: bool,
) -> Skeleton:
    r"""Blocks :math:`\kappa(Q', Y_L)`, :math:`\kappa(Y_R, Y_L)`, :math:`\kappa(Y_R, K')` of the Gaussian kernel.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` queries, ``(*batch, m, p)`` keys (raw, not scaled).
    left_landmarks : torch.Tensor
        ``(*batch, d, p)`` rows :math:`Y_L` (raw): the columns of the left block.
    right_landmarks : torch.Tensor
        ``(*batch, d, p)`` rows :math:`Y_R` (raw): the rows of the right block.
    normalized : bool
        ``False``: the exact blocks of :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer
        Eq. (3)), for a kernelized target. ``True``: blocks of the raw scores
        :math:`A = D_Q^{1/2} C D_K^{1/2}` (Lemma 1 / Section 4.1) with every factor that
        cancels in :math:`\tilde D^{-1}\tilde A` removed (see Notes), for a softmax target.

    Returns
    -------
    Skeleton
        The primes denote :math:`X' = X/p^{1/4}`; the core block is always
        :math:`\kappa(Y_R', Y_L')`.

    Notes
    -----
    With :math:`\ell(x) = \|x\|^2/(2\sqrt p)` (:func:`approxlab.kernels.log_diag_scale`),
    :math:`\log\kappa(x', y') = x^\top y/\sqrt p - \ell(x) - \ell(y)`. For
    ``normalized=True`` the approximation :math:`\tilde A = D_Q^{1/2}\,L\,M^+R\,D_K^{1/2}` is
    only used through :math:`\tilde D^{-1}\tilde A`, :math:`\tilde D = \operatorname{diag}(\tilde A\mathbf 1)`,
    which is unchanged by (i) any positive diagonal scaling of the rows of :math:`\tilde A`
    and (ii) any positive scalar factor. So we return

    * ``left`` :math:`= \exp(\log L_{is} + \ell(q_i) - \max_s(\log L_{is} + \ell(q_i)))`,
      each row's largest entry 1 (removes :math:`D_Q^{1/2}` and prevents a query far from
      every landmark from underflowing to a zero row);
    * ``right`` :math:`= R\,D_K^{1/2}/\max_j (D_K^{1/2})_{jj}`, computed as one exponent
      :math:`\exp(y^\top k_j/\sqrt p - \ell(y) - \max_j \ell(k_j)) \le 1`.

    No factor exceeds 1, so nothing overflows even for float32 logits of :math:`\pm 80`.
    """
    if normalized:
        log_left = kernels.scaled_logits(q, left_landmarks) - kernels.log_diag_scale(left_landmarks).unsqueeze(-2)
        left = torch.exp(log_left - log_left.amax(-1, keepdim=True))
        log_right = (
            kernels.scaled_logits(right_landmarks, k)
            - kernels.log_diag_scale(right_landmarks).unsqueeze(-1)
            - kernels.log_diag_scale(k).amax(-1, keepdim=True).unsqueeze(-1)
        )
        right = torch.exp(log_right.clamp_max(0.0))
    else:
        left = kernels.kernelized_matrix(q, left_landmarks)
        right = kernels.kernelized_matrix(right_landmarks, k)
    block = kernels.kernelized_matrix(right_landmarks, left_landmarks)
    return Skeleton(left, block, right, normalized)


def skeleton_attention(skeleton: Skeleton, core: CoreFactors, v: torch.Tensor):
    r"""Output, operator and row-sum diagnostics of ``left @ core @ right``, never ``n x m``.

    Parameters
    ----------
    skeleton : Skeleton
        From :func:`gaussian_skeleton`.
    core : CoreFactors
        From :func:`nystrom_core`.
    v : torch.Tensor
        ``(*batch, m, p_v)`` values.

    Returns
    -------
    output : torch.Tensor
        ``(*batch, n, p_v)``: ``(left @ first) @ ((second @ right) @ v)``, divided row-wise by
        the approximate row sums :math:`\tilde A\mathbf 1` when ``skeleton.normalized``.
    operator : LinearOperator
        ``ProductOperator(left @ first, second @ right)`` (the core folded into the two
        outer ``n x d`` / ``d x m`` factors, see :class:`CoreFactors`), preceded by
        ``DiagonalOperator(1 / row_sums)`` when normalized.
    info : dict
        When normalized: ``row_sums`` ``(*batch, n)`` (in the rescaled units of
        :func:`gaussian_skeleton`: each row of ``left`` has largest entry 1),
        ``min_abs_row_sum`` ``(*batch,)`` and ``num_nonpositive_row_sums`` ``(*batch,)``.

    Notes
    -----
    The approximate row sums :math:`\tilde D = \tilde A\mathbf 1` of a Nyström
    approximation are *not* guaranteed positive: :math:`\tilde A` has negative entries in
    general. They are used as they are, never clamped: a negative row sum flips the sign of
    that output row, and a zero row sum makes it ``inf``/``NaN``, which
    :func:`approxlab.approximate` reports as a ``FloatingPointError``. Studies read
    ``min_abs_row_sum`` and ``num_nonpositive_row_sums`` to see how close a sample came.
    """
    left = skeleton.left @ core.first
    right = skeleton.right if core.second is None else core.second @ skeleton.right
    numerator = left @ (right @ v)
    info: dict = {}
    if not skeleton.normalized:
        return numerator, ProductOperator(left, right), info
    row_sums = (left @ right.sum(-1, keepdim=True)).squeeze(-1)
    info["row_sums"] = row_sums
    info["min_abs_row_sum"] = row_sums.abs().amin(-1)
    info["num_nonpositive_row_sums"] = (row_sums <= 0).sum(-1)
    operator = ProductOperator(DiagonalOperator(1.0 / row_sums), left, right)
    return numerator / row_sums.unsqueeze(-1), operator, info
