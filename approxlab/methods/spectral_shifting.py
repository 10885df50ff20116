r"""Spectral shifting: Wang, Luo & Zhang (2016) for PSD matrices, and Verma's landmark version.

Two things live here.

* :func:`spectral_shifting_psd` — the original spectral-shifting model of Wang, Luo and Zhang
  (JMLR 2016) for an explicit symmetric PSD matrix :math:`K`,
  :math:`K \approx \bar C U^{ss}\bar C^\top + \delta^{ss} I_n` with the closed-form minimiser of
  the Frobenius objective (Eq. (2) of Verma). It needs the whole matrix (:math:`O(n^2c)`).
* :func:`spectral_shifting` (registry name ``"spectral-shifting"``) — the landmark version for
  softmax attention, Eq. (10) of Verma, *Beyond Nyströmformer*, with segment-means landmarks
  (shared with :mod:`approxlab.methods.nystromformer`) and the core of
  :func:`modified_spectral_shifting_core` (Section 4, Eq. (3)).

A remark that shapes the landmark version: Verma's shift
:math:`\delta^{SS} = (\operatorname{tr}A_s - \operatorname{tr}(A_s^+A_s^2))/(c - \operatorname{rank}A_s)`
has a numerator that is **identically zero** in exact arithmetic, because
:math:`\operatorname{tr}(A_s^+A_s^2) = \operatorname{tr}(A_sA_s^+A_s) = \operatorname{tr}A_s`.
So the formula is :math:`0/0` for full-rank :math:`A_s` and :math:`0` otherwise; a non-zero shift
appears only through a *numerical* rank. See :func:`modified_spectral_shifting_core` for the
rule implemented.
"""

from __future__ import annotations

import dataclasses
import numbers

import torch

from .._validation import check_choice, check_int, check_positive_float, check_qkv, check_rtol, check_square
from ..linalg.conditioning import default_rtol_for_shape as _default_rtol
from ..linalg.pinv import iterative_pinv
from ..linalg.pinv_autograd import pinv_and_rank, truncated_svd
from ..operators import DiagonalOperator, LinearOperator, ProductOperator, SumOperator
from ._base import Approximation, method
from .nystromformer import landmark_kernels, segment_sizes

__all__ = [
    "SpectralShiftingResult",
    "spectral_shifting_psd",
    "modified_spectral_shifting_core",
    "spectral_shifting",
    "SPECTRAL_SHIFTING",
]

CORE_FORMS = ("eq8", "section4")
PINV_CHOICES = ("exact", "iterative")


def _trace(matrix: torch.Tensor) -> torch.Tensor:
    return torch.diagonal(matrix, dim1=-2, dim2=-1).sum(-1)


# --------------------------------------------------------------------------------------------
# Wang, Luo & Zhang (2016): the spectral-shifting model for an explicit SPSD matrix
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SpectralShiftingResult:
    r"""The spectral-shifting approximation :math:`\bar C U^{ss}\bar C^\top + \delta^{ss}I_n`.

    Attributes
    ----------
    columns_matrix : torch.Tensor
        ``(*batch, n, c)``, :math:`\bar C = (K - \bar\delta I_n)P`.
    core : torch.Tensor
        ``(*batch, c, c)``, :math:`U^{ss}`.
    delta : torch.Tensor
        ``(*batch,)``, :math:`\delta^{ss}`.
    rank : torch.Tensor
        ``(*batch,)`` int64, numerical rank of :math:`\bar C` used in :math:`\delta^{ss}`.
    initial_shift : torch.Tensor
        ``(*batch,)``, :math:`\bar\delta` subtracted before the columns are taken.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.spectral_shifting import spectral_shifting_psd
    >>> result = spectral_shifting_psd(torch.eye(4, dtype=torch.float64), [0, 1])
    >>> result.columns_matrix.shape, result.core.shape, round(float(result.delta), 6)
    (torch.Size([4, 2]), torch.Size([2, 2]), 1.0)
    """

    columns_matrix: torch.Tensor
    core: torch.Tensor
    delta: torch.Tensor
    rank: torch.Tensor
    initial_shift: torch.Tensor

    def operator(self) -> LinearOperator:
        r""":math:`\bar CU^{ss}\bar C^\top + \delta^{ss}I_n` as an operator, ``(*batch, n, n)``."""
        c = self.columns_matrix
        low_rank = ProductOperator(c, self.core, c.transpose(-1, -2))
        shift = DiagonalOperator(self.delta.unsqueeze(-1).expand(*self.delta.shape, c.shape[-2]))
        return SumOperator([low_rank, shift], [1.0, 1.0])

    def matrix(self) -> torch.Tensor:
        """The approximation formed densely, ``(*batch, n, n)``."""
        c = self.columns_matrix
        eye = torch.eye(c.shape[-2], dtype=c.dtype, device=c.device)
        return c @ self.core @ c.transpose(-1, -2) + self.delta[..., None, None] * eye


def _check_columns(columns, n: int, batch_shape, device) -> torch.Tensor:
    if isinstance(columns, torch.Tensor):
        if columns.dtype in (torch.bool,) or columns.is_floating_point() or columns.is_complex():
            raise TypeError(f"`columns` must hold integer indices; got dtype {columns.dtype}.")
        index = columns.to(device=device, dtype=torch.long)
    else:
        try:
            values = list(columns)
        except TypeError:
            raise TypeError(
                f"`columns` must be a sequence or tensor of integer indices; got {type(columns).__name__}."
            ) from None
        if not all(isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in values):
            raise TypeError(f"`columns` must hold integer indices; got {values!r}.")
        index = torch.tensor(values, dtype=torch.long, device=device)
    if index.ndim == 0 or index.shape[-1] == 0:
        raise ValueError(
            f"`columns` must hold at least one index, shape (c,) or (*batch, c); got shape {tuple(index.shape)}."
        )
    if index.ndim > 1 and tuple(index.shape[:-1]) != tuple(batch_shape):
        raise ValueError(
            f"`columns` must have shape (c,) or (*batch, c) with *batch={tuple(batch_shape)}; "
            f"got shape {tuple(index.shape)}."
        )
    if bool((index < 0).any()) or bool((index >= n).any()):
        raise ValueError(
            f"`columns` must be indices with 0 <= index < n={n}; got min {int(index.min())}, max {int(index.max())}."
        )
    sorted_index = index.sort(-1).values
    if bool((sorted_index[..., 1:] == sorted_index[..., :-1]).any()):
        raise ValueError("`columns` must not repeat an index; got duplicates.")
    return index


def spectral_shifting_psd(
    K: torch.Tensor,
    columns,
    *,
    initial_shift: float | None = None,
    target_rank: int | None = None,
    rtol: float | None = None,
) -> SpectralShiftingResult:
    r"""Spectral-shifting approximation of a symmetric PSD matrix (Wang, Luo & Zhang, 2016).

    Approximates :math:`K \approx \bar CU^{ss}\bar C^\top + \delta^{ss}I_n` with
    :math:`\bar C = (K - \bar\delta I_n)P` (the selected columns of the pre-shifted matrix) and
    the closed-form minimiser of the Frobenius objective (Eq. (2) of Verma)

    .. math::

        (U^{ss}, \delta^{ss}) = \arg\min_{U,\delta}\ \|K - \bar CU\bar C^\top - \delta I_n\|_F .

    Parameters
    ----------
    K : torch.Tensor
        ``(*batch, n, n)`` symmetric (checked) and PSD (assumed, not checked).
    columns : sequence of int or torch.Tensor
        Column indices, ``(c,)`` shared by the batch or ``(*batch, c)``; distinct, in ``[0, n)``.
    initial_shift : float, optional
        :math:`\bar\delta \ge 0`, subtracted from the diagonal before the columns are taken.
    target_rank : int, optional
        ``k`` with ``1 <= k < n``: set :math:`\bar\delta = (\operatorname{tr}K - \sum_{i\le k}\lambda_i(K))/(n-k)`,
        the mean of the bottom :math:`n-k` eigenvalues (Wang et al.'s choice; computed exactly
        with ``eigvalsh`` here, where they use a randomized SVD). Exclusive with
        ``initial_shift``. With neither, :math:`\bar\delta = 0` and :math:`\bar C = KP`.
    rtol : float, optional
        Relative cut-off on the singular values of :math:`\bar C` defining its numerical rank
        and pseudo-inverse; default ``max(n, c) * eps`` (as ``torch.linalg.pinv``).

    Returns
    -------
    SpectralShiftingResult
        ``columns_matrix`` :math:`\bar C`, ``core`` :math:`U^{ss}`, ``delta`` :math:`\delta^{ss}`,
        ``rank``, ``initial_shift``; ``.operator()`` and ``.matrix()`` give the approximation.

    Notes
    -----
    With :math:`r = \operatorname{rank}\bar C` and :math:`P_C = \bar C\bar C^+`, minimising
    over :math:`U` for fixed :math:`\delta` gives
    :math:`U = \bar C^+(K - \delta I)(\bar C^+)^\top`, leaving
    :math:`\|K-\delta I\|_F^2 - \|P_C(K-\delta I)P_C\|_F^2`, a quadratic in :math:`\delta` whose
    minimiser is (Section 3 of Verma, after Wang et al.)

    .. math::

        \delta^{ss} = \frac{\operatorname{tr}K - \operatorname{tr}(\bar C^+K\bar C)}{n - r},
        \qquad
        U^{ss} = \bar C^+K(\bar C^+)^\top - \delta^{ss}(\bar C^\top\bar C)^+ .

    When :math:`r = n` the objective is 0 for every :math:`\delta` (0/0 in the formula); then
    :math:`\delta^{ss} = 0`. With :math:`\bar C = W\Sigma R^\top` (reduced SVD, cut at ``rtol``):
    :math:`\operatorname{tr}(\bar C^+K\bar C) = \operatorname{tr}(W_r^\top KW_r)` and
    :math:`U^{ss} = R\Sigma^+(W^\top KW - \delta^{ss}I)\Sigma^+R^\top`.

    If :math:`K = L + \theta I_n` with :math:`L` PSD of rank :math:`k` and the columns of
    :math:`L` indexed by ``columns`` span its range, then :math:`\bar\delta = \theta`
    (e.g. ``target_rank=k``) gives :math:`\delta^{ss} = \theta` and zero error (Lemma 1 of Verma,
    after Wang et al.), while the Nyström/prototype error is at least :math:`\theta` in the
    spectral norm.

    References
    ----------
    Wang, Luo, Zhang (2016), "SPSD Matrix Approximation via Column Selection: Theories,
    Algorithms, and Extensions", JMLR 17, Section 5 (spectral shifting). Verma, *Beyond
    Nyströmformer*, Section 3, Eq. (2) and Lemma 1.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.spectral_shifting import spectral_shifting_psd
    >>> from approxlab.synthetic import psd_matrix
    >>> K = psd_matrix(torch.tensor([5.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    >>> result = spectral_shifting_psd(K, [0], target_rank=1)  # one column for the spike, the shift for the floor
    >>> round(float(result.delta), 6), bool(torch.allclose(result.matrix(), K))
    (1.0, True)
    >>> bool(torch.allclose(spectral_shifting_psd(K, [0]).matrix(), K))  # without the pre-shift the column mixes both
    False
    """
    check_square(K, "K")
    n = K.shape[-1]
    asym = float((K - K.transpose(-1, -2)).abs().max()) if K.numel() else 0.0
    scale = float(K.abs().max()) if K.numel() else 0.0
    if asym > 1e3 * torch.finfo(K.dtype).eps * max(scale, torch.finfo(K.dtype).tiny):
        raise ValueError(f"`K` must be symmetric (*batch, n, n); got max |K - K^T| = {asym:.3e}.")
    index = _check_columns(columns, n, K.shape[:-2], K.device)
    if initial_shift is not None and target_rank is not None:
        raise ValueError(
            f"`initial_shift` and `target_rank` are exclusive; got initial_shift={initial_shift!r} "
            f"and target_rank={target_rank!r}."
        )
    if initial_shift is not None:
        initial_shift = check_positive_float(initial_shift, "initial_shift", allow_zero=True)
    if target_rank is not None:
        target_rank = check_int(target_rank, "target_rank", low=1, high=n - 1)
    c = index.shape[-1]
    rtol = _default_rtol(n, c, K.dtype) if rtol is None else check_rtol(rtol, "rtol", allow_zero=False)

    trace_k = _trace(K)
    if target_rank is not None:
        top = torch.linalg.eigvalsh(K)[..., n - target_rank :].sum(-1)
        shift = (trace_k - top) / (n - target_rank)
    else:
        shift = torch.full_like(trace_k, 0.0 if initial_shift is None else initial_shift)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)
    shifted = K - shift[..., None, None] * eye
    if index.ndim == 1:
        c_bar = shifted.index_select(-1, index)
    else:
        c_bar = torch.take_along_dim(shifted, index.unsqueeze(-2), dim=-1)

    w, sigma_pinv, r, rank = truncated_svd(c_bar, rtol)
    projected = w.transpose(-1, -2) @ K @ w  # (*batch, c, c) = W^T K W
    kept = (sigma_pinv > 0).to(K.dtype)
    trace_projected = (torch.diagonal(projected, dim1=-2, dim2=-1) * kept).sum(-1)  # tr(C^+ K C)
    deficiency = (n - rank).to(K.dtype)
    delta = torch.where(
        rank < n, (trace_k - trace_projected) / deficiency.clamp_min(1.0), torch.zeros_like(trace_k)
    )
    inner = projected - delta[..., None, None] * torch.eye(c, dtype=K.dtype, device=K.device)
    core = r @ (sigma_pinv.unsqueeze(-1) * inner * sigma_pinv.unsqueeze(-2)) @ r.transpose(-1, -2)
    core = 0.5 * (core + core.transpose(-1, -2))
    return SpectralShiftingResult(c_bar, core, delta, rank, shift)


# --------------------------------------------------------------------------------------------
# Verma: modified spectral shifting on the landmark core, and its attention method (Eq. (10))
# --------------------------------------------------------------------------------------------


def modified_spectral_shifting_core(
    core: torch.Tensor,
    *,
    rtol: float | None = None,
    form: str = "eq8",
    pinv: str = "exact",
    num_iter: int = 6,
):
    r"""Core :math:`U^{SS}` and shift :math:`\delta^{SS}` of Verma's modified spectral shifting (Section 4).

    Parameters
    ----------
    core : torch.Tensor
        ``(*batch, c, c)``, :math:`A_s` (the landmark softmax kernel).
    rtol : float, optional
        Relative cut-off on the singular values of :math:`A_s`: those :math:`\le`
        ``rtol`` :math:`\sigma_1` are treated as zero, defining the numerical rank :math:`r`
        and the pseudo-inverse :math:`A_s^+` (truncated SVD). Default ``c * eps`` (as
        ``torch.linalg.pinv``). A larger value discards more of the spectrum into the shift.
    form : {"eq8", "section4"}
        ``"eq8"`` (default): :math:`U^{SS} = A_s^+(I_c - \delta^{SS}A_s^+)` (Eqs. (7)-(8) and (10),
        with the README's correction of the Eq. (4) typo); ``"section4"``:
        :math:`U^{SS} = A_s^+ - \delta^{SS}(A_s^2)^+` (Section 4's closed form, derived for
        symmetric :math:`A_s`). They agree when :math:`\delta^{SS} = 0`, when :math:`A_s` is
        invertible, or when it is normal (e.g. symmetric).
    pinv : {"exact", "iterative"}
        ``"exact"`` (default): the truncated :math:`A_s^+` of
        :func:`approxlab.linalg.pinv_autograd.pinv_and_rank`, whose backward pass (the
        Golub--Pereyra formula) stays finite at repeated and zero singular values.
        ``"iterative"``: Verma's :math:`Z^\star` (Section 7), ``num_iter`` steps of Nyströmformer's
        Eq. (5) (:func:`approxlab.linalg.iterative_pinv`, per-matrix initialisation) in place of
        :math:`A_s^+`; differentiated through its matrix products. The rank :math:`r` is the
        numerical rank at ``rtol`` either way.
    num_iter : int
        Iterations for ``pinv="iterative"`` (default 6, as Nyströmformer).

    Returns
    -------
    U : torch.Tensor
        ``(*batch, c, c)``.
    delta : torch.Tensor
        ``(*batch,)``.
    rank : torch.Tensor
        ``(*batch,)`` int64, the numerical rank :math:`r`.
    pinv : torch.Tensor
        ``(*batch, c, c)``, the truncated :math:`A_s^+`.

    Notes
    -----
    Verma's closed form is

    .. math::

        \delta^{SS} = \frac{\operatorname{tr}A_s - \operatorname{tr}(A_s^+A_s^2)}{c - \operatorname{rank}A_s} .

    **The 0/0 rule.** For the exact pseudo-inverse the numerator vanishes identically,
    :math:`\operatorname{tr}(A_s^+A_s^2) = \operatorname{tr}(A_sA_s^+A_s) = \operatorname{tr}A_s`,
    so the formula is 0/0 at full rank and 0 below it. Implemented rule: the rank is the
    numerical rank :math:`r` at ``rtol`` and :math:`A_s^+` is the rank-:math:`r` truncated
    pseudo-inverse; then

    * :math:`r = c` (full numerical rank): :math:`\delta^{SS} = 0`. The objective (Eq. (3))
      restricted to the landmark block, :math:`\|A_s - A_sUA_s - \delta I_c\|_F`, is 0 for every
      :math:`\delta` (take :math:`U = A_s^{-1}(A_s - \delta I)A_s^{-1}`), so :math:`\delta` is not
      identified; :math:`\delta = 0` makes the method Nyströmformer with the exact pseudo-inverse.
    * :math:`r < c`: the formula as written. With :math:`A_s = W\Sigma R^\top`,
      :math:`A_s^+A_s = R_rR_r^\top` and
      :math:`\delta^{SS} = \operatorname{tr}((I - R_rR_r^\top)A_s)/(c - r)`: the discarded part of
      the spectrum averaged over the discarded dimensions — for symmetric PSD :math:`A_s`, the
      mean of the :math:`c - r` discarded eigenvalues, i.e. Wang et al.'s shift. It is of the
      order of ``rtol`` :math:`\sigma_1`, and 0 up to rounding for exactly singular :math:`A_s`.
      For a non-symmetric :math:`A_s` it can be negative.

    For ``form="eq8"``, :math:`U = A_r^+ - \delta A_r^+A_r^+` (:math:`A_r` the rank-:math:`r`
    truncation, :math:`A_r^+` the returned ``pinv``) is the minimiser over :math:`U` of
    :math:`\|A_r - A_rUA_r - \delta I_c\|_F` for the given :math:`\delta` (any square
    :math:`A_s`, symmetric or not), which is why it is the default for the non-symmetric
    softmax core. ``form="section4"`` uses ``torch.linalg.pinv(A_s @ A_s, rtol=rtol)``.

    References
    ----------
    Verma, *Beyond Nyströmformer – Approximation of self-attention by Spectral Shifting*,
    Section 4 (Eq. (3) and its closed form), Eqs. (7)-(8), (10). Wang, Luo, Zhang (2016), JMLR 17.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.spectral_shifting import modified_spectral_shifting_core
    >>> a_s = torch.tensor([[0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)  # full rank: no shift
    >>> core, delta = modified_spectral_shifting_core(a_s)[:2]
    >>> float(delta), bool(torch.allclose(core, torch.linalg.inv(a_s)))
    (0.0, True)
    """
    check_square(core, "core")
    c = core.shape[-1]
    rtol = _default_rtol(c, c, core.dtype) if rtol is None else check_rtol(rtol, "rtol", allow_zero=False)
    check_choice(form, "form", CORE_FORMS)
    check_choice(pinv, "pinv", PINV_CHOICES)
    num_iter = check_int(num_iter, "num_iter", low=0)

    inverse, rank = pinv_and_rank(core, rtol=rtol)
    if pinv == "iterative":
        inverse = iterative_pinv(core, num_iter, history=False, norm="frobenius").inverse
    numerator = _trace(core) - _trace(inverse @ core @ core)
    delta = torch.where(
        rank < c, numerator / (c - rank).to(core.dtype).clamp_min(1.0), torch.zeros_like(numerator)
    )
    if form == "eq8":
        squared_inverse = inverse @ inverse
    else:
        squared_inverse = pinv_and_rank(core @ core, rtol=rtol)[0]
    u = inverse - delta[..., None, None] * squared_inverse
    return u, delta, rank, inverse


@method(
    "spectral-shifting",
    target="softmax",
    features="segment-means landmarks c",
    max_features=lambda n: n,
    randomized=False,
    causal="mask-renormalise",
    differentiable=True,
)
def spectral_shifting(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_features: int,
    generator: torch.Generator | None = None,
    rtol: float | None = None,
    form: str = "eq8",
    identity_shift: bool = False,
    pinv: str = "exact",
    num_iter: int = 6,
    key_mask: torch.Tensor | None = None,
) -> Approximation:
    r"""Spectral-shifting attention with ``num_features`` segment-means landmarks (Verma, Eq. (10)).

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number of landmarks ``c`` with ``1 <= c <= min(n, n_k)``; segments as in
        :func:`approxlab.methods.nystromformer.segment_sizes`.
    generator : torch.Generator, optional
        Unused (deterministic); accepted for the common interface.
    rtol : float, optional
        Numerical-rank cut-off for :math:`A_s` (default ``c * eps``); see
        :func:`modified_spectral_shifting_core` for the 0/0 rule it drives.
    form : {"eq8", "section4"}
        Which core, :math:`A_s^+(I - \delta A_s^+)` (default) or :math:`A_s^+ - \delta(A_s^2)^+`.
    identity_shift : bool
        Add the :math:`\delta^{SS}I_n` term of the spectral-shifting model (Eqs. (2)-(3)), which
        Eq. (10) omits. Default ``False`` (Eq. (10) as published).
    pinv, num_iter
        :math:`A_s^+` exact (truncated SVD with a gap-free backward, default) or Verma's
        iterative :math:`Z^\star` (Section 7); see :func:`modified_spectral_shifting_core`.
    key_mask : torch.Tensor, optional
        ``(*batch, n_k)`` bool, True on keys to attend (:mod:`approxlab.methods._masking`):
        :math:`B` is the softmax over kept keys only, so masked keys get zero weight (values
        enter only through :math:`B`), and the landmarks are segment means over real tokens
        only (:func:`approxlab.methods.nystromformer.landmark_kernels`).

    Returns
    -------
    Approximation
        ``output = F @ (U @ (B @ v))`` (``+ delta * v`` with ``identity_shift``); ``operator()`` is
        ``ProductOperator(F, U, B)`` (plus ``DiagonalOperator(delta)``), so
        ``operator() @ v == output``. ``info``: ``"num_landmarks"``, ``"segment_sizes_q"``,
        ``"segment_sizes_k"``, ``"core"`` (:math:`A_s`), ``"core_rank"`` (numerical rank,
        ``(*batch,)``), ``"delta"`` (``(*batch,)``), ``"shift_core"`` (:math:`U^{SS}`),
        ``"pinv_inverse"`` (truncated :math:`A_s^+`).

    Notes
    -----
    Eq. (10) with the README's correction of the middle factor:

    .. math::

        \tilde S = F\,U^{SS}B = FA_s^+B - \delta^{SS}FA_s^+A_s^+B,

    :math:`F = \operatorname{softmax}(Q\tilde K^\top/\sqrt p)`,
    :math:`A_s = \operatorname{softmax}(\tilde Q\tilde K^\top/\sqrt p)`,
    :math:`B = \operatorname{softmax}(\tilde QK^\top/\sqrt p)`. The first term is Nyströmformer
    with the exact pseudo-inverse; the second is the shift term. Since the numerator of
    :math:`\delta^{SS}` vanishes identically in exact arithmetic
    (:func:`modified_spectral_shifting_core`), with the default ``rtol`` and a numerically
    full-rank :math:`A_s` the method *is* Nyströmformer with ``pinv="exact"``; a non-zero shift
    needs ``rtol`` large enough to cut part of the spectrum of :math:`A_s`.

    References
    ----------
    Verma, *Beyond Nyströmformer – Approximation of self-attention by Spectral Shifting*,
    Eqs. (1), (3), (7)-(10). Wang, Luo, Zhang (2016), JMLR 17.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> approx = approxlab.approximate("spectral-shifting", q, k, v, num_features=32)  # c = n: exact
    >>> bool((spectral_error(approx.output, exact, relative=True) < 1e-12).all())
    True
    >>> approx = approxlab.approximate("spectral-shifting", q, k, v, num_features=8)
    >>> [e > 1 for e in spectral_error(approx.output, exact, relative=True).tolist()]  # it can exceed 1
    [True, False]
    """
    check_qkv(q, k, v)
    n = min(q.shape[-2], k.shape[-2])
    num_features = check_int(num_features, "num_features", low=1, high=n)
    if rtol is not None:
        rtol = check_rtol(rtol, "rtol", allow_zero=False)
    check_choice(form, "form", CORE_FORMS)
    if not isinstance(identity_shift, bool):
        raise TypeError(f"`identity_shift` must be a bool; got {identity_shift!r} ({type(identity_shift).__name__}).")
    if identity_shift and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"`identity_shift=True` needs a square attention matrix (n == n_k); got n={q.shape[-2]}, "
            f"n_k={k.shape[-2]}."
        )

    f, core, b = landmark_kernels(q, k, num_features, key_mask)
    u, delta, rank, inverse = modified_spectral_shifting_core(
        core, rtol=rtol, form=form, pinv=pinv, num_iter=num_iter
    )
    output = f @ (u @ (b @ v))
    operator: LinearOperator = ProductOperator(f, u, b)
    if identity_shift:
        output = output + delta[..., None, None] * v
        diagonal = DiagonalOperator(delta.unsqueeze(-1).expand(*delta.shape, q.shape[-2]))
        operator = SumOperator([operator, diagonal], [1.0, 1.0])
    info = {
        "num_landmarks": num_features,
        "segment_sizes_q": segment_sizes(q.shape[-2], num_features),
        "segment_sizes_k": segment_sizes(k.shape[-2], num_features),
        "core": core,
        "core_rank": rank,
        "delta": delta,
        "shift_core": u,
        "pinv_inverse": inverse,
        "pinv": pinv,
        "identity_shift": identity_shift,
    }
    return Approximation("spectral-shifting", "softmax", output, operator, info)


SPECTRAL_SHIFTING = spectral_shifting
__test__ = {"spectral_shifting": spectral_shifting.function}  # doctest skips a MethodSpec: run its function's examples
