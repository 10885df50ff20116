r"""Expected attention (Devoto et al., 2025): the attention future queries are expected to pay each key,
under a Gaussian model of the queries (kvpress's ``ExpectedAttentionPress``, its leaderboard default).

A per-key cache scorer (:mod:`approxlab.cache._scorers`). It also holds what kvpress's query-statistics
presses share: the context's queries before the rotary embedding (:func:`queries_before_rope`) and the
rotation averaged over future positions (:func:`average_future_rotation`).
"""

from __future__ import annotations

import math

import torch

from .._validation import check_bool, check_int, check_positive_float, check_tensor
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, check_extra_input, finish, fit_sinks, masked_mean, unit_scale
from ..cache._shared_scores import shared

__all__ = ["expected_attention_scores", "REGISTRATION", "EXPECTED_ATTENTION"]


def rotary_frequencies(p: int, rope_base=None, frequencies=None, *, dtype=torch.float64, device=None):
    r"""The ``p // 2`` rotary frequencies :math:`\theta_i = \text{base}^{-2i/p}` (transformers' default
    ``inv_freq``), or ``frequencies`` as given (a scaled RoPE, e.g. Llama 3's); None without RoPE."""
    if frequencies is not None:
        check_tensor(frequencies, "rope_frequencies", min_ndim=1)
        if tuple(frequencies.shape) != (p // 2,) or p % 2:
            raise ValueError(f"`rope_frequencies` must have shape (p // 2,) = ({p // 2},) for an even p = {p}; got "
                             f"{tuple(frequencies.shape)}.")
        return frequencies.to(dtype=dtype, device=device)
    if rope_base is None:
        return None
    base = check_positive_float(rope_base, "rope_base")
    if p % 2:
        raise ValueError(f"`rope_base` needs an even head dimension p (RoPE rotates pairs); got p = {p}.")
    return base ** (-torch.arange(0, p, 2, dtype=torch.float64, device=device) / p)


def _turn(x, cos, sin):
    r""":math:`\cos\odot x + \sin\odot\operatorname{rotate\_half}(x)` (transformers' layout: the two halves of
    ``x`` are the pairs), ``cos``, ``sin`` ``(..., p // 2)``, one per pair."""
    cos, sin = torch.cat([cos] * 2, -1).to(x.dtype), torch.cat([sin] * 2, -1).to(x.dtype)
    half = x.shape[-1] // 2
    return cos * x + sin * torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotate(x, angles, sign=1.0):
    r""":math:`R_t x`, ``angles`` :math:`t\theta` ``(..., p // 2)``; ``sign=-1`` applies :math:`R_t^\top = R_{-t}`."""
    return _turn(x, angles.cos(), sign * angles.sin())


def before_rope(x, context, frequencies):
    r""":math:`R_{t_i}^\top x_i`, ``(*batch, n_c, p)``: the rows of ``x`` (queries or keys after the rotary
    embedding) rotated back, :math:`t_i` the rank of token :math:`i` among the real tokens (its position in
    the sequence without padding); ``x`` itself without RoPE (``frequencies`` None)."""
    if frequencies is None:
        return x
    positions = context.ranks.clamp_min(0).to(torch.float64)
    return _rotate(x, positions.unsqueeze(-1) * frequencies, sign=-1.0)


def queries_before_rope(q, context, frequencies, queries_pre_rope=None):
    """The context's queries before the rotary embedding, ``(*batch, n_c, p)``: ``queries_pre_rope`` when
    given, else ``q`` rotated back (:func:`before_rope`)."""
    if queries_pre_rope is not None:
        return check_extra_input(queries_pre_rope, "queries_pre_rope", "this policy", q, "")
    return before_rope(q, context, frequencies)


def average_future_rotation(context, frequencies, n_future_positions, p, dtype):
    r""":math:`\bar R = \frac1F\sum_{t=c}^{c+F-1} R_t`, ``(*batch, p, p)``, :math:`c` the real tokens of the
    context and :math:`F` = ``n_future_positions``; the identity without RoPE."""
    if frequencies is None:
        return torch.eye(p, dtype=dtype, device=context.real.device).expand(*context.batch, p, p)
    future = context.count.to(torch.float64) + torch.arange(n_future_positions, dtype=torch.float64,
                                                            device=context.real.device)
    angles = future.unsqueeze(-1) * frequencies  # (*batch, F, p/2)
    # R_t is linear in (cos t theta, sin t theta): its mean is the rotation formula at the mean cosines and sines
    cos, sin = angles.cos().mean(-2).unsqueeze(-2), angles.sin().mean(-2).unsqueeze(-2)
    rows = _turn(torch.eye(p, dtype=torch.float64, device=context.real.device), cos, sin)  # row b: R e_b
    return rows.transpose(-1, -2).to(dtype)


def expected_attention_scores(q, k, v, *, generator=None, key_mask=None, rope_base=None, rope_frequencies=None,
                              queries_pre_rope=None, n_future_positions=512, n_sink=4, use_covariance=True, budget=None,
                              use_vnorm=True, epsilon=0.0):
    r"""Expected attention of future queries, :math:`s_j = \operatorname{softmax}_j\big(\bar\mu^\top k_j/\sqrt p +
    k_j^\top\bar\Sigma k_j/(2p)\big)\,\lVert v_j\rVert_2`, :math:`+\infty` on the first ``n_sink`` tokens.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: the context's queries and keys
        *after* the rotary embedding (as attention reads them) and its values.
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens: padded tokens enter no statistic and score
        :math:`-\infty`; positions count real tokens.
    rope_base : float, optional
        The model's RoPE base :math:`\beta` (``rope_theta``; frequencies :math:`\beta^{-2i/p}`, transformers'
        half-split layout). None with ``rope_frequencies`` None: the model has **no rotary embedding**, ``q``
        is the query itself and :math:`\bar R = I`.
    rope_frequencies : torch.Tensor, optional
        ``(p // 2,)``, the frequencies themselves (a scaled RoPE: Llama 3, YaRN's ``inv_freq``); overrides
        ``rope_base``.
    queries_pre_rope : torch.Tensor, optional
        ``(*batch, n_c, p)``, the queries before the rotary embedding (kvpress's ``q_proj`` of the hidden
        states, after a QK-norm); default: ``q`` rotated back by :math:`R_{t_i}^\top`, which is the same
        tensor in exact arithmetic.
    n_future_positions : int, default 512
        :math:`F`, the future positions the rotation is averaged over.
    n_sink : int, default 4
        The first tokens kept (:math:`+\infty`) and left out of the statistics and the softmax.
    budget : int, optional
        The cache budget (given by the KV-cache setting): the sinks are cut to fit within it and below the
        real tokens of the shortest context (:func:`approxlab.cache._scorers.fit_sinks`).
    use_covariance, use_vnorm : bool, default True
        Include the covariance term; multiply by :math:`\lVert v_j\rVert_2`.
    epsilon : float, default 0.0
        Added to the softmax before the value norm: :math:`(\cdot + \varepsilon)\lVert v_j\rVert_2`.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``q.dtype``; higher is kept.

    Notes
    -----
    Model the pre-RoPE query of a future position :math:`t` as :math:`\tilde q \sim \mathcal N(\mu, \Sigma)`,
    :math:`\mu, \Sigma` the mean and (biased) covariance of the context's pre-RoPE queries after the sinks,
    and its post-RoPE query as :math:`\bar R\tilde q`, :math:`\bar R` the rotation averaged over the next
    :math:`F` positions. Then :math:`\bar\mu = \bar R\mu`, :math:`\bar\Sigma = \bar R\Sigma\bar R^\top` and,
    by the Gaussian moment generating function, :math:`\mathbb E\,e^{\bar q^\top k_j/\sqrt p} =
    e^{\bar\mu^\top k_j/\sqrt p + k_j^\top\bar\Sigma k_j/(2p)}` -- normalised over the (non-sink) keys, the
    expected attention (the paper's Eq. for the expected unnormalised score and its softmax; kvpress's
    ``ExpectedAttentionPress.score``, steps 1-5 of its docstring).

    **What differs from kvpress.** kvpress projects the layer's hidden states with ``q_proj`` to get the
    pre-RoPE queries; here they are the given post-RoPE queries rotated back (or ``queries_pre_rope``): the
    rotation is orthogonal, so the two agree to rounding when ``rope_base``/``rope_frequencies`` is the
    model's and positions are ``0 .. n_c - 1`` (tested against kvpress's formula in float64). kvpress
    gives the sinks ``max + 1``; here :math:`+\infty` (the same kept sets). Everything else -- the group
    mean of the per-head softmaxes (done by the framework's pooling; the value norm is common to a group,
    so pooling before or after it is the same), the biased covariance, the average of the rotation
    matrices -- is kvpress's.

    **Cost**: :math:`O(n_c p^2)` (covariance and quadratic forms) plus :math:`O(Fp^2)` for :math:`\bar R`.

    References
    ----------
    Devoto, Jeblick, Jégou, "Expected attention: KV cache compression by estimating attention from future
    queries distribution" (arXiv:2510.00636). kvpress (NVIDIA),
    ``kvpress/presses/expected_attention_press.py``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = expected_attention_scores(q, k, v, rope_base=10000.0)
    >>> scores.shape, scores[:, :4].isinf().all().item()  # the 4 sinks are kept
    (torch.Size([2, 32]), True)
    """
    context = check_context(q, k, v, key_mask)
    n_future_positions = check_int(n_future_positions, "n_future_positions", low=1)
    n_sink = check_int(n_sink, "n_sink", low=0)
    use_covariance, use_vnorm = check_bool(use_covariance, "use_covariance"), check_bool(use_vnorm, "use_vnorm")
    epsilon = check_positive_float(epsilon, "epsilon", allow_zero=True)
    (n_sink,) = fit_sinks(context, budget, n_sink)
    return _expected_attention_scores(q, k, v, key_mask, rope_base, rope_frequencies, queries_pre_rope,
                                      n_future_positions, n_sink, use_covariance, use_vnorm, epsilon)


@shared
def _expected_attention_scores(q, k, v, key_mask, rope_base, rope_frequencies, queries_pre_rope, n_future_positions,
                               n_sink, use_covariance, use_vnorm, epsilon):
    """:func:`expected_attention_scores` with its sinks fitted to the budget (checked inputs): the same for every
    budget that leaves ``n_sink``, computed once for them inside
    :func:`~approxlab.cache._shared_scores.shared_scores`."""
    context = check_context(q, k, v, key_mask)
    p = q.shape[-1]
    frequencies = rotary_frequencies(p, rope_base, rope_frequencies, device=q.device)
    queries = queries_before_rope(q, context, frequencies, queries_pre_rope)
    used = context.real & (context.ranks >= n_sink)  # the statistics' queries and the softmax's keys
    mean = masked_mean(queries, used, -2)  # (*batch, 1, p)
    rotation = average_future_rotation(context, frequencies, n_future_positions, p, q.dtype)
    logits = (k @ (mean @ rotation.transpose(-1, -2)).transpose(-1, -2)).squeeze(-1) / math.sqrt(p)
    if use_covariance:
        centered = (queries - mean) * used.unsqueeze(-1).to(q.dtype)
        covariance = centered.transpose(-1, -2) @ centered / used.sum(-1).to(q.dtype)[..., None, None]
        covariance = rotation @ covariance @ rotation.transpose(-1, -2)
        logits = logits + ((k @ covariance) * k).sum(-1) / (2 * p)
    scores = torch.softmax(logits.masked_fill(~used, -math.inf), dim=-1)
    if use_vnorm:
        scores = (scores + epsilon) * unit_scale(v).norm(dim=-1)  # overflow-safe; blind to v's global scale
    return finish(scores, context, keep=context.ends(first=n_sink))


REGISTRATION = dict(score=expected_attention_scores, target="softmax", features=FEATURES, randomized=False,
                    inputs=("rope_base",))
"""The keyword arguments of this policy's registration: ``register("expected-attention", **REGISTRATION)``.
``inputs``: the options the caller must supply from the model -- ``rope_base`` (or ``rope_frequencies``) for a
RoPE model; ``queries_pre_rope`` is optional."""

EXPECTED_ATTENTION = cache_policy("expected-attention", **REGISTRATION)
"""The built-in method 'expected-attention': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"expected_attention": EXPECTED_ATTENTION.function}  # doctest skips a MethodSpec: run its function's examples

