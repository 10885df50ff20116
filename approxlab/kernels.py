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
]


def scaled_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""Logits :math:`QK^\top/\sqrt{p}`: ``(*batch, n, p), (*batch, m, p) -> (*batch, n, m)``."""
    return (q @ k.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))  # in place: no second n x m array


def causal_mask(n: int, m: int | None = None, *, row_offset: int = 0, device=None) -> torch.Tensor:
    r"""The causal pattern, ``(n, m)`` bool: True where key :math:`j \le i + \text{row\_offset}`.

    ``row_offset`` is the global index of the first query row, so that row blocks of a
    causal matrix (``rows start:stop`` with ``row_offset=start``) are cut from the same
    lower-triangular pattern. ``m`` defaults to ``n``.
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
    """
    return torch.softmax(_masked_logits(q, k, mask), dim=-1)


def score_matrix(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Raw scores :math:`A = \exp(QK^\top/\sqrt p)`, ``(*batch, n, m)``; masked entries are 0.

    Raises
    ------
    OverflowError
        If an entry exceeds the range of ``q.dtype``; the message says how large the
        largest logit was. Use float64 (range ``exp(709)``) or :func:`softmax_matrix`.
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


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Gaussian kernel matrix :math:`\kappa(x_i, y_j) = \exp(-\|x_i-y_j\|^2/2)`, ``(*batch, n, m)``.

    Squared distances are formed as :math:`\|x\|^2 + \|y\|^2 - 2x^\top y` and clamped at 0,
    so rounding never produces an entry above 1.
    """
    # The same operations in the same order as exp(-0.5 * clamp(|x|^2 + |y|^2 - 2 x.y, 0)), done in
    # place on the two n x m arrays (each new large array costs a page-faulting allocation).
    sq = (x * x).sum(-1, keepdim=True) + (y * y).sum(-1).unsqueeze(-2)
    sq = sq.sub_((x @ y.transpose(-1, -2)).mul_(2.0))
    return sq.clamp_min_(0.0).mul_(-0.5).exp_()


def kernelized_matrix(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Kernelized attention scores :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3)).

    Masked entries (``mask`` False) are 0.
    """
    scale = q.shape[-1] ** -0.25
    c = gaussian_kernel(q * scale, k * scale)
    return c if mask is None else c.masked_fill(~mask, 0.0)  # out of place: exp_ keeps its output for autograd


def log_diag_scale(x: torch.Tensor) -> torch.Tensor:
    r"""Log of the diagonal :math:`(D_X)^{1/2}_{ii} = \exp(\|x_i\|^2 / (2\sqrt p))`, ``(*batch, n)``.

    With it, :math:`A_{ij} = \exp(\ell^Q_i)\,C_{ij}\,\exp(\ell^K_j)` (Skyformer Lemma 1).
    """
    return (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))


def row_normalize(a: torch.Tensor) -> torch.Tensor:
    r""":math:`D^{-1}A` with :math:`D = \operatorname{diag}(A\mathbf 1)`; rows that sum to 0 give ``inf``/NaN.

    Callers that can meet zero row sums check the result (see ``approxlab.methods``).
    """
    return a / a.sum(-1, keepdim=True)
