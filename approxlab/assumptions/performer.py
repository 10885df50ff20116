r"""Why Performer's positive random features fail at large logits: Lemma 2 of Performer, measured.

Performer (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021) estimates
:math:`A_{ij} = \mathrm{SM}(x_i, y_j) = \exp(x_i^\top y_j)` with :math:`x_i = q_i/p^{1/4}`,
:math:`y_j = k_j/p^{1/4}` by :math:`r` positive random features (Lemma 1). Lemma 2 gives the mean squared
error of that estimate for i.i.d. Gaussian features,

.. math::

    \mathrm{MSE}\big(\widehat{\mathrm{SM}}^+_r(x, y)\big)
        = \frac1r\exp(\|x+y\|^2)\,\mathrm{SM}^2(x, y)\big(1 - \exp(-\|x+y\|^2)\big),

so an entry's **relative variance** is :math:`(e^{\|x+y\|^2} - 1)/r` (:func:`positive_feature_relative_variance`):
it grows exponentially in :math:`\|x+y\|^2`, and the entries that matter are those attention weighs. The
**attention-weighted** quantile of :math:`\|x_i + y_j\|^2` (:func:`attention_weighted_xy_norm`) weighs entry
:math:`(i, j)` by its exact probability :math:`P_{ij}/n` (each query counts once). Orthogonal features
(Performer's default, Theorem 2) lower the variance, but not its exponential growth.

The **control** (:func:`relative_error_at_scale`): multiplying :math:`Q` and :math:`K` by a factor ``scale``
multiplies every logit by ``scale**2`` and :math:`\|x+y\|^2` by ``scale**2``; if the error falls with it,
the logit scale explains the failure.

Public API::

    attention_weighted_xy_norm(q, k, *, causal=True, quantile=0.5) -> (*batch,)
    positive_feature_relative_variance(xy_norm, num_features) -> (e^xy_norm - 1) / num_features
    relative_error_at_scale(method, q, k, v, *, num_features, scale, generator=None, draw=None,
                            causal=True, **options) -> (*batch,)
"""

from __future__ import annotations

import torch

from .._validation import check_int, check_positive_float, check_qkv, check_rtol
from ..attention import approximate, exact_attention
from ..kernels import causal_mask, scaled_logits
from ..metrics import spectral_error
from ..operators import check_causal

__all__ = ["attention_weighted_xy_norm", "positive_feature_relative_variance", "relative_error_at_scale"]


_BINS = 4096
"""Bins of the first pass of :func:`_weighted_quantile` (only the entries of one bin are sorted)."""


def _weighted_quantile(values: torch.Tensor, weights: torch.Tensor, quantile: float) -> torch.Tensor:
    """The smallest value whose cumulative weight, values ascending, reaches ``quantile`` of the total.

    Exact, in two passes: the weights are summed in equal-width bins of the values (a monotone map, so bins
    follow the order of the values), and only the bin holding the quantile is sorted.
    """
    values, weights = values.flatten(), weights.flatten()
    low, high = (float(x) for x in torch.aminmax(values))
    if high <= low:
        return values.new_tensor(low)
    bins = values.sub(low).mul_(_BINS / (high - low)).to(torch.int32).clamp_(0, _BINS - 1)  # 4 bytes an entry
    cumulative = torch.cumsum(torch.bincount(bins, weights=weights, minlength=_BINS), 0)
    target = cumulative.new_tensor(quantile * float(cumulative[-1]))
    where = int(torch.searchsorted(cumulative, target).clamp_max(_BINS - 1))
    chosen = (bins == where) & (weights > 0)
    inside, inside_weights = values[chosen], weights[chosen]
    order = torch.argsort(inside)
    running = torch.cumsum(inside_weights[order], 0) + (float(cumulative[where - 1]) if where else 0.0)
    return inside[order][torch.searchsorted(running, target).clamp_max(inside.numel() - 1)]


def _xy_quantile(q: torch.Tensor, k: torch.Tensor, causal: bool, quantile: float) -> torch.Tensor:
    """One head ``q, k: (n, p)`` float64."""
    scale = q.shape[-1] ** -0.25
    logits = scaled_logits(q, k)  # x_i^T y_j
    squares = (q * scale).square().sum(-1).unsqueeze(-1) + (k * scale).square().sum(-1).unsqueeze(-2)
    xy = squares.add_(logits, alpha=2.0).clamp_min_(0.0)  # ||x_i + y_j||^2, >= 0 up to rounding
    if causal:
        logits.masked_fill_(~causal_mask(q.shape[-2], device=q.device), float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    del logits
    return _weighted_quantile(xy, weights, quantile)


def attention_weighted_xy_norm(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True,
                               quantile: float = 0.5) -> torch.Tensor:
    r"""The attention-weighted quantile of :math:`\|x_i + y_j\|^2`, :math:`x = q/p^{1/4}`, :math:`y = k/p^{1/4}`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)`` (computed in float64, one batch element at a time, with
        about 28 bytes per entry at once: 0.45 GB at :math:`n = m = 4096`, 1.9 GB at 8192).
    causal : bool, default True
        Weigh by the causal attention (entries :math:`j \le i` only; ``n == m``).
    quantile : float, default 0.5
        In :math:`(0, 1)`; 0.5 is the weighted median.

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64: the smallest :math:`z = \|x_i + y_j\|^2` such that the entries with
        :math:`\|x_i + y_j\|^2 \le z` carry at least ``quantile`` of the attention, each entry weighted by
        :math:`P_{ij}/n`, the exact (causal) softmax probability (every row weighs 1). Performer's Lemma 2
        puts that entry's relative variance at :math:`(e^z - 1)/r` (:func:`positive_feature_relative_variance`).

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)    # p = 1: x = q, y = k
    >>> float(attention_weighted_xy_norm(q, q))            # row 0: z = 0 (weight 1/3), row 2 mostly on z = 16
    4.0
    """
    check_qkv(q, k)
    check_causal(causal, q, k)
    quantile = check_rtol(quantile, "quantile", allow_zero=False)
    q64, k64 = (x.detach().to(torch.float64).reshape(-1, *x.shape[-2:]) for x in (q, k))
    found = [_xy_quantile(a, b, causal, quantile) for a, b in zip(q64, k64)]
    return torch.stack(found).reshape(q.shape[:-2])


def positive_feature_relative_variance(xy_norm, num_features: int):
    r"""Performer's Lemma 2 for positive random features: an entry's relative variance :math:`(e^{\|x+y\|^2} - 1)/r`.

    :math:`\mathrm{MSE}/\mathrm{SM}^2(x, y)` of the estimate :math:`\widehat{\mathrm{SM}}^+_r(x, y)` with
    :math:`r` i.i.d. Gaussian features (Choromanski et al., ICLR 2021, Lemma 2); ``xy_norm`` is
    :math:`\|x+y\|^2 \ge 0` (float or tensor), ``num_features`` is :math:`r \ge 1`.

    Examples
    --------
    >>> round(positive_feature_relative_variance(15.0, 256))     # ||x+y||^2 = 15 at r = 256: relative std 113
    12770
    """
    num_features = check_int(num_features, "num_features", low=1)
    if isinstance(xy_norm, torch.Tensor):
        if bool((xy_norm < 0).any()) or bool(xy_norm.isnan().any()):
            raise ValueError("`xy_norm` must be non-negative and not NaN; got a tensor with negative or NaN entries.")
        return torch.expm1(xy_norm.to(torch.float64)) / num_features
    xy_norm = check_positive_float(xy_norm, "xy_norm", allow_zero=True)
    return float(torch.expm1(torch.tensor(xy_norm, dtype=torch.float64))) / num_features


def relative_error_at_scale(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_features: int,
                            scale: float, generator: torch.Generator | None = None, draw: dict | None = None,
                            causal=True, **options) -> torch.Tensor:
    r"""A method's relative spectral error on :math:`(sQ, sK, V)`: the logit-scale control.

    Parameters
    ----------
    method : str
        A registered method (:func:`approxlab.approximate`).
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``; computed in float64.
    num_features : int
        The method's budget (e.g. Performer's :math:`r`).
    scale : float
        :math:`s > 0`, multiplying :math:`Q` and :math:`K` (logits by :math:`s^2`): ``1.0`` the model's own
        scale, ``0.25`` "divided by 4".
    generator, draw
        The method's randomness (:func:`approxlab.approximate`). The same seed (or draw) at two scales gives
        the same projection to a method whose draw depends only on shapes (Performer): common random numbers.
    causal : {True, False, "mask-renormalise"}, default True
        The method's form; the reference is ``exact_attention(sQ, sK, V, causal=bool(causal))``.
    **options
        The method's own keywords.

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64, :math:`\|\tilde O - O\|_2/\|O\|_2` per batch element
        (:func:`approxlab.metrics.spectral_error` of the ``(n, p_v)`` outputs), in the batch order of ``q``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, scale=4.0, generator=torch.Generator().manual_seed(0))
    >>> errors = [relative_error_at_scale("performer", q, k, v, num_features=64, scale=s,
    ...                                   generator=torch.Generator().manual_seed(1)) for s in (1.0, 0.25)]
    >>> bool((errors[1] < errors[0]).all())
    True
    """
    scale = check_positive_float(scale, "scale")
    check_qkv(q, k, v)
    q, k, v = (x.detach().to(torch.float64) for x in (q, k, v))
    approx = approximate(method, q * scale, k * scale, v, num_features=num_features, generator=generator, draw=draw,
                         causal=causal, **options)
    exact = exact_attention(q * scale, k * scale, v, causal=causal is not False)
    return torch.as_tensor(spectral_error(approx.output, exact, relative=True), dtype=torch.float64)
