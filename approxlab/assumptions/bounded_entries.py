r"""Alman and Song's bounded-entries condition, "Fast Attention Requires Bounded Entries" (NeurIPS 2023).

Their attention is :math:`D^{-1}\exp(QK^\top/d)V` with :math:`\|Q\|_\infty, \|K\|_\infty \le B` and
:math:`d = O(\log n)`: for :math:`B = o(\sqrt{\log n})` it can be approximated in :math:`n^{1+o(1)}` time
(Theorem 1.4); for :math:`B = \Theta(\sqrt{\log n})` no truly subquadratic algorithm exists under SETH
(Theorem 1.3). In approxlab's convention :math:`s = QK^\top/\sqrt p = (p^{1/4}Q)(p^{1/4}K)^\top/p`, so:

* the **model's own split** has :math:`B = p^{1/4}\max(\|Q\|_{\max}, \|K\|_{\max})` (``entry_bound``);
* the **balanced split** :math:`(cQ, K/c)` with the best scalar :math:`c` has
  :math:`B = p^{1/4}\sqrt{\|Q\|_{\max}\|K\|_{\max}}` (:func:`balanced_entry_bound`), never more;
* **every split** of the logits has :math:`B^2 \ge \max_{ij}|s_{ij}|`, so
  :math:`\sqrt{\max|s_{ij}|}` is a lower bound on :math:`B` over all of them (:func:`entry_bounds`).

Each is compared with :math:`\sqrt{\log n}` (:func:`entry_ratio`). The theorems are asymptotic: at one
:math:`n` no ratio can show :math:`B = o(\sqrt{\log n})`, and the threshold 1 is a **convention** of the
study (so is the base of the logarithm: with :math:`\log_2` every ratio is :math:`\sqrt{\ln 2} \approx 0.83`
times its value with :math:`\ln`). Under that convention, :func:`bounded_entries_label` says what the ratios
can say: a lower bound above 1 means the condition **fails for every split**; below 1 it shows nothing
(**undetermined**), unless an explicit split itself stays below 1 (**holds for an explicit split**).

Public API::

    LABELS
    entry_bounds(q, k, *, causal=True) -> (entry_bound, logit_bound)        # (*batch,) each
    balanced_entry_bound(q, k) -> (*batch,)
    entry_ratio(bound, n, *, base=math.e) -> bound / sqrt(log_base n)
    bounded_entries_label(lower_ratio, *, explicit_ratio=None, threshold=1.0) -> str or ndarray of str
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .._validation import check_positive_float, check_qkv
from ..kernels import causal_mask, scaled_logits
from ..operators import check_causal

__all__ = ["LABELS", "FAILS_FOR_EVERY_SPLIT", "UNDETERMINED", "HOLDS_FOR_AN_EXPLICIT_SPLIT", "entry_bounds",
           "balanced_entry_bound", "entry_ratio", "bounded_entries_label"]

FAILS_FOR_EVERY_SPLIT = "fails for every split"
UNDETERMINED = "undetermined"
HOLDS_FOR_AN_EXPLICIT_SPLIT = "holds for an explicit split"
LABELS = (FAILS_FOR_EVERY_SPLIT, UNDETERMINED, HOLDS_FOR_AN_EXPLICIT_SPLIT)
"""What :func:`bounded_entries_label` can say."""


def entry_bounds(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True):
    r"""Alman and Song's entry bound :math:`B` and the logit bound :math:`\max|s_{ij}|`, ``(*batch,)`` float64 each.

    ``entry_bound`` :math:`= p^{1/4}\max(\|Q\|_{\max}, \|K\|_{\max})` is their :math:`B` for the
    logits written as :math:`(p^{1/4}Q)(p^{1/4}K)^\top/p` (their :math:`\exp(QK^\top/d)`, "Fast
    Attention Requires Bounded Entries", NeurIPS 2023, Theorems 1.3-1.4: near-linear time for
    :math:`B = o(\sqrt{\log n})`, none truly subquadratic for :math:`B = \Theta(\sqrt{\log n})` under
    SETH). ``logit_bound`` :math:`= \max|s_{ij}|` over the (causal, if ``causal``) entries; since
    :math:`|s_{ij}| \le B^2` however the logits are split between :math:`Q` and :math:`K`,
    :math:`\sqrt{\text{logit\_bound}}` is a lower bound on every such :math:`B`.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.eye(4, dtype=torch.float64)              # p = 4, logits in {0, 1/2}
    >>> [float(x) for x in entry_bounds(q, k)]
    [1.4142135623730951, 0.5]
    """
    check_qkv(q, k)
    check_causal(causal, q, k)
    q, k = q.to(torch.float64), k.to(torch.float64)
    logits = scaled_logits(q, k)
    if causal:
        logits = logits.masked_fill_(~causal_mask(q.shape[-2], device=q.device), 0.0)  # |0| never raises a max
    return _entry_bound(q, k), logits.abs().flatten(-2).amax(-1)


def _largest(x: torch.Tensor) -> torch.Tensor:
    return x.abs().flatten(-2).amax(-1).to(torch.float64)


def _entry_bound(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """:math:`p^{1/4}\\max(\\|Q\\|_{\\max}, \\|K\\|_{\\max})` per batch element, float64."""
    largest = torch.maximum(_largest(q), _largest(k))
    return q.shape[-1] ** 0.25 * largest.to(torch.float64)


def balanced_entry_bound(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""Alman and Song's :math:`B` of the best split :math:`(cQ, K/c)`, :math:`p^{1/4}\sqrt{\|Q\|_{\max}\|K\|_{\max}}`.

    :math:`\max(c\|Q\|_{\max}, \|K\|_{\max}/c)` is least at :math:`c^2 = \|K\|_{\max}/\|Q\|_{\max}`, so this
    explicit split's :math:`B` is at most the model's own (``entry_bound``) and at least the split-invariant
    :math:`\sqrt{\max|s_{ij}|}` (:func:`entry_bounds`; Cauchy--Schwarz entrywise:
    :math:`|q_i^\top k_j| \le p\|Q\|_{\max}\|K\|_{\max}`). Returns ``(*batch,)`` float64 (Theorems 1.3-1.4 of
    "Fast Attention Requires Bounded Entries").

    Examples
    --------
    >>> import torch
    >>> q, k = torch.full((2, 4), 4.0, dtype=torch.float64), torch.full((2, 4), 0.25, dtype=torch.float64)
    >>> float(balanced_entry_bound(q, k)), float(entry_bounds(q, k, causal=False)[0])   # sqrt(2) * 1 vs sqrt(2) * 4
    (1.4142135623730951, 5.656854249492381)
    """
    check_qkv(q, k)
    return q.shape[-1] ** 0.25 * torch.sqrt(_largest(q) * _largest(k))


def entry_ratio(bound, n: int, *, base: float = math.e):
    r"""A bound on :math:`B` over :math:`\sqrt{\log_{\text{base}} n}`: Alman and Song's scale, as a ratio.

    Pass ``sqrt(logit_bound)`` for the split-invariant lower bound (the ``entry_ratio`` of
    :func:`approxlab.assumptions.measure_assumptions`), ``entry_bound`` or :func:`balanced_entry_bound` for an
    explicit split. ``base`` :math:`e` (default) or 2: the theorems leave the base open, and the ratio with
    base 2 is :math:`\sqrt{\ln 2}` times the ratio with :math:`e`.

    Parameters
    ----------
    bound : float or torch.Tensor
        :math:`B` or a bound on it, non-negative.
    n : int
        Sequence length, ``n >= 2``.
    base : float
        Base of the logarithm, ``> 1``.

    Examples
    --------
    >>> round(entry_ratio(2.0, 512), 4), round(entry_ratio(2.0, 512, base=2), 4)
    (0.8008, 0.6667)
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"`n` must be an integer with n >= 2; got {n!r}.")
    base = check_positive_float(base, "base")
    if base <= 1:
        raise ValueError(f"`base` must be a number > 1; got {base}.")
    scale = math.sqrt(math.log(n) / math.log(base))
    if isinstance(bound, torch.Tensor):
        if bool((bound < 0).any()) or bool(bound.isnan().any()):
            raise ValueError("`bound` must be non-negative and not NaN; got a tensor with negative or NaN entries.")
        return bound.to(torch.float64) / scale
    return check_positive_float(bound, "bound", allow_zero=True) / scale


def _ratios(value, name):
    array = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=float)
    if array.size == 0 or not np.isfinite(array).all() or (array < 0).any():
        raise ValueError(f"`{name}` must hold finite non-negative ratios; got {value!r}.")
    return array


def bounded_entries_label(lower_ratio, *, explicit_ratio=None, threshold: float = 1.0):
    r"""What the ratios can say about Alman and Song's condition :math:`B = o(\sqrt{\log n})`, under a threshold.

    Parameters
    ----------
    lower_ratio : float, array-like or torch.Tensor
        The split-invariant lower bound over :math:`\sqrt{\log n}` (:func:`entry_ratio` of
        ``sqrt(logit_bound)``).
    explicit_ratio : same shape, optional
        The ratio of an explicit split (the model's own or :func:`balanced_entry_bound`): an upper bound on
        the least :math:`B` over splits.
    threshold : float, default 1.0
        The study's convention for "at the scale of :math:`\sqrt{\log n}`"; the theorems give none.

    Returns
    -------
    str or numpy.ndarray of str
        Elementwise (:data:`LABELS`): ``"fails for every split"`` where ``lower_ratio > threshold`` (no
        split of the logits has a smaller :math:`B`); otherwise ``"holds for an explicit split"`` where
        ``explicit_ratio < threshold``, else ``"undetermined"`` (a lower bound below the threshold shows
        nothing about the best split). A str for a scalar input.

    Examples
    --------
    >>> bounded_entries_label([1.34, 0.35, 0.35], explicit_ratio=[2.0, 2.1, 0.9]).tolist()
    ['fails for every split', 'undetermined', 'holds for an explicit split']
    """
    threshold = check_positive_float(threshold, "threshold")
    lower = _ratios(lower_ratio, "lower_ratio")
    labels = np.where(lower > threshold, FAILS_FOR_EVERY_SPLIT, UNDETERMINED).astype(object)
    if explicit_ratio is not None:
        explicit = _ratios(explicit_ratio, "explicit_ratio")
        if explicit.shape != lower.shape:
            raise ValueError(f"`explicit_ratio` must have the shape of `lower_ratio` {lower.shape}; got "
                             f"{explicit.shape}.")
        labels = np.where((lower <= threshold) & (explicit < threshold), HOLDS_FOR_AN_EXPLICIT_SPLIT, labels)
    return labels.item() if labels.ndim == 0 else labels.astype(str)
