r"""Attention score kernels, computed overflow-safe.

Notation follows Skyformer (Chen et al., 2021), Section 4.1. For queries
``q: (*batch, n, p)`` and keys ``k: (*batch, m, p)``:

* raw scores       :math:`A = \exp(QK^\top/\sqrt{p})`                  (the softmax kernel, "SM")
* softmax matrix   :math:`D^{-1}A`, :math:`D = \operatorname{diag}(A\mathbf 1)`
* kernelized       :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})`,
  :math:`\kappa(x, y) = \exp(-\|x-y\|^2/2)`                            (Skyformer Eq. (3))

They are linked by :math:`A = D_Q^{1/2} C D_K^{1/2}` with
:math:`(D_Q)_{ii} = \exp(\|q_i\|^2/\sqrt{p})` (Skyformer Section 4.1, Lemma 1).

The softmax matrix is computed in the log domain (max-subtracted), so it never
overflows; the Gaussian kernel is bounded by 1 by construction. Only the raw scores
``A`` can exceed the floating range; :func:`score_matrix` refuses to return ``inf``.

Masks. Each matrix takes an optional bool ``mask: (*, n, m)`` (True where query i may attend
key j), applied as the attention of a decoder applies it: masked logits become
:math:`-\infty` before the softmax (so each softmax row renormalises over its kept keys), and
masked entries of ``A`` and ``C`` are exactly 0. :func:`causal_mask` is the causal (lower
triangular) pattern :math:`j \le i`.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "scaled_logits",
    "causal_mask",
    "softmax_matrix",
    "score_matrix",
    "gaussian_kernel",
    "kernelized_matrix",
    "log_diag_scale",
    "row_normalize",
    "CANCELLATION_TOLERANCE",
]


def scaled_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""Logits :math:`QK^\top/\sqrt{p}`: ``(*batch, n, p), (*batch, m, p) -> (*batch, n, m)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import scaled_logits
    >>> q = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    >>> scaled_logits(q, 2 * q)
    tensor([[4.]], dtype=torch.float64)
    """
    return (q @ k.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))  # in place: no second n x m array


def causal_mask(n: int, m: int | None = None, *, row_offset: int = 0, device=None) -> torch.Tensor:
    r"""The causal pattern, ``(n, m)`` bool: True where key :math:`j \le i + \text{row\_offset}`.

    ``row_offset`` is the global index of the first query row, so that row blocks of a
    causal matrix (``rows start:stop`` with ``row_offset=start``) are cut from the same
    lower-triangular pattern. ``m`` defaults to ``n``.

    Examples
    --------
    >>> from approxlab.kernels import causal_mask
    >>> causal_mask(3)
    tensor([[ True, False, False],
            [ True,  True, False],
            [ True,  True,  True]])
    >>> causal_mask(1, 3, row_offset=1)  # the second row of the 3 x 3 pattern
    tensor([[ True,  True, False]])
    """
    m = n if m is None else m
    rows = torch.arange(row_offset, row_offset + n, device=device).unsqueeze(-1)
    return torch.arange(m, device=device) <= rows


def _masked_logits(q: torch.Tensor, k: torch.Tensor, mask) -> torch.Tensor:
    logits = scaled_logits(q, k)
    return logits if mask is None else logits.masked_fill_(~mask, float("-inf"))


def softmax_matrix(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Row-stochastic :math:`D^{-1}A = \operatorname{softmax}(QK^\top/\sqrt p)`, ``(*batch, n, m)``.

    With ``mask`` (True: attended), each row is the softmax over its kept keys; a row with
    no kept key is NaN (callers keep at least one, e.g. the diagonal of :func:`causal_mask`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import softmax_matrix
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 5, 4, generator=g, dtype=torch.float64), torch.randn(2, 7, 4, generator=g, dtype=torch.float64)
    >>> a = softmax_matrix(q, k)
    >>> a.shape, bool(torch.allclose(a.sum(-1), torch.ones(2, 5, dtype=torch.float64)))
    (torch.Size([2, 5, 7]), True)
    """
    return torch.softmax(_masked_logits(q, k, mask), dim=-1)


def score_matrix(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Raw scores :math:`A = \exp(QK^\top/\sqrt p)`, ``(*batch, n, m)``; masked entries are 0.

    Raises
    ------
    OverflowError
        If an entry exceeds the range of ``q.dtype``; the message says how large the
        largest logit was. Use float64 (range ``exp(709)``) or :func:`softmax_matrix`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import score_matrix, softmax_matrix, row_normalize
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    >>> a = score_matrix(q, k)
    >>> bool(torch.allclose(row_normalize(a), softmax_matrix(q, k)))
    True
    >>> score_matrix(100 * q, 100 * k)
    Traceback (most recent call last):
    ...
    OverflowError: ...
    """
    logits = _masked_logits(q, k, mask)
    a = torch.exp(logits)
    if not bool(torch.isfinite(a).all()):
        raise OverflowError(
            f"`attention_matrix(kind='scores')` overflows {q.dtype}: the largest logit is "
            f"{float(logits.max()):.1f}, above log(finfo.max)={math.log(torch.finfo(q.dtype).max):.1f}. "
            "Pass float64 inputs or use kind='softmax' (computed in the log domain)."
        )
    return a


CANCELLATION_TOLERANCE = 2.0**-10
r"""Largest rounding error of a squared distance :math:`\|x-y\|^2` that :func:`gaussian_kernel`
accepts from the expanded form: beyond it the doubtful entries are recomputed exactly."""


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Gaussian kernel matrix :math:`\kappa(x_i, y_j) = \exp(-\|x_i-y_j\|^2/2)`, ``(*batch, n, m)``.

    Squared distances are formed as :math:`\|x\|^2 + \|y\|^2 - 2x^\top y` and clamped at 0,
    so rounding never produces an entry above 1. That form cancels: its rounding error is up to
    :math:`\delta_{ij} = (p+2)\,\varepsilon\,(\|x_i\|^2 + \|y_j\|^2)` (Higham (3.5)), and an
    entry whose computed distance is below :math:`\delta_{ij}` may hold no correct digit (rows of
    norm ``1e9`` three apart give 1.0 instead of 0.04). Wherever :math:`\delta_{ij}` exceeds
    :data:`CANCELLATION_TOLERANCE` (an error of more than ~0.05 % in the kernel), such entries are
    recomputed as :math:`\|x_i - y_j\|^2`; inputs of ordinary size (BERT's Q/K in float32 or
    float64) never reach it, and keep the expanded form bit for bit.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import gaussian_kernel
    >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    >>> gaussian_kernel(x, x)  # exp(-25/2) off the diagonal
    tensor([[1.0000e+00, 3.7267e-06],
            [3.7267e-06, 1.0000e+00]], dtype=torch.float64)
    """
    # The same operations in the same order as exp(-0.5 * clamp(|x|^2 + |y|^2 - 2 x.y, 0)), done in
    # place on the two n x m arrays (each new large array costs a page-faulting allocation).
    x_sq, y_sq = (x * x).sum(-1, keepdim=True), (y * y).sum(-1).unsqueeze(-2)
    sq = x_sq + y_sq
    sq = sq.sub_((x @ y.transpose(-1, -2)).mul_(2.0))
    level = (x.shape[-1] + 2) * torch.finfo(x.dtype).eps
    if level * (float(x_sq.detach().max()) + float(y_sq.detach().max())) > CANCELLATION_TOLERANCE:
        _recompute_cancelled(sq, x, y, level * (x_sq + y_sq))
    return sq.clamp_min_(0.0).mul_(-0.5).exp_()


def _recompute_cancelled(sq: torch.Tensor, x: torch.Tensor, y: torch.Tensor, doubt: torch.Tensor) -> None:
    """Entries of ``sq`` below their rounding bound ``doubt`` (and above the tolerance) set to
    ``||x_i - y_j||^2``, in place (only those entries: the rest keep the expanded form)."""
    where = torch.nonzero((sq <= doubt) & (doubt > CANCELLATION_TOLERANCE), as_tuple=True)
    if where[0].numel():
        shape = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
        rows = x.expand(*shape, *x.shape[-2:])[where[:-1]]
        cols = y.expand(*shape, *y.shape[-2:])[(*where[:-2], where[-1])]
        sq[where] = ((rows - cols) ** 2).sum(-1).to(sq.dtype)


def kernelized_matrix(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Kernelized attention scores :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3)).

    Masked entries (``mask`` False) are 0.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import gaussian_kernel, kernelized_matrix
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    >>> c = kernelized_matrix(q, k)
    >>> bool(torch.allclose(c, gaussian_kernel(q / 4 ** 0.25, k / 4 ** 0.25)))
    True
    """
    scale = q.shape[-1] ** -0.25
    c = gaussian_kernel(q * scale, k * scale)
    return c if mask is None else c.masked_fill(~mask, 0.0)  # out of place: exp_ keeps its output for autograd


def log_diag_scale(x: torch.Tensor) -> torch.Tensor:
    r"""Log of the diagonal :math:`(D_X)^{1/2}_{ii} = \exp(\|x_i\|^2 / (2\sqrt p))`, ``(*batch, n)``.

    With it, :math:`A_{ij} = \exp(\ell^Q_i)\,C_{ij}\,\exp(\ell^K_j)` (Skyformer Lemma 1).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import kernelized_matrix, log_diag_scale, score_matrix
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    >>> lq, lk = log_diag_scale(q), log_diag_scale(k)
    >>> a = lq.exp()[:, None] * kernelized_matrix(q, k) * lk.exp()[None, :]  # Lemma 1 of Skyformer
    >>> bool(torch.allclose(a, score_matrix(q, k)))
    True
    """
    return (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))


def row_normalize(a: torch.Tensor) -> torch.Tensor:
    r""":math:`D^{-1}A` with :math:`D = \operatorname{diag}(A\mathbf 1)`; rows that sum to 0 give ``inf``/NaN.

    Callers that can meet zero row sums check the result (see ``approxlab.methods``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import row_normalize
    >>> row_normalize(torch.tensor([[1.0, 3.0], [2.0, 2.0]], dtype=torch.float64))
    tensor([[0.2500, 0.7500],
            [0.5000, 0.5000]], dtype=torch.float64)
    """
    return a / a.sum(-1, keepdim=True)
