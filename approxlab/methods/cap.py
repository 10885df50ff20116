r"""CAPKV (kvpress's ``CapPress``): a log-determinant (capacity) proxy -- each token's weighted leverage in
the capacity matrix :math:`A = I + \sum_i w_i u_iu_i^\top`, with query-alignment weights :math:`w_i`.

A per-key cache scorer (:mod:`approxlab.cache._scorers`), using the query statistics of
:mod:`approxlab.methods.expected_attention`.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float, check_real
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, fit_sinks, masked_mean, unit_scale
from ..cache._shared_scores import shared
from .expected_attention import average_future_rotation, queries_before_rope, rotary_frequencies

__all__ = ["cap_scores", "REGISTRATION", "CAP"]


def cap_scores(q, k, v, *, generator=None, key_mask=None, rope_base=None, rope_frequencies=None,
               queries_pre_rope=None, tau=5.0, n_future_positions=512, n_sink=4, epsilon=1e-6, budget=None):
    r"""CAPKV's score :math:`s_i = w_i\,v_i^\top A^{-1}v_i`, :math:`A = I + \sum_j (w_j + \epsilon)v_jv_j^\top`,
    :math:`w_i = e^{\tau(\cos(k_i, \bar q) - \max_j\cos(k_j, \bar q))}`; :math:`+\infty` on the first
    ``n_sink`` tokens.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: queries and keys after the
        rotary embedding, values.
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens: padded tokens enter no sum and score :math:`-\infty`.
    rope_base, rope_frequencies, queries_pre_rope
        The model's rotary embedding and, optionally, the pre-RoPE queries, as in
        :func:`~approxlab.methods.expected_attention.expected_attention_scores` (None, None: no RoPE).
    tau : float, default 5.0
        :math:`\tau`, the temperature of the alignment weights.
    n_future_positions : int, default 512
        :math:`F`, the future positions the query rotation is averaged over.
    n_sink : int, default 4
        The first tokens kept (:math:`+\infty`) and left out of the anchor and of :math:`A`.
    budget : int, optional
        The cache budget (given by the KV-cache setting): the sinks are cut to fit within it and below the
        real tokens of the shortest context (:func:`approxlab.cache._scorers.fit_sinks`).
    epsilon : float, default 1e-6
        :math:`\epsilon \ge 0` added to the weights inside :math:`A`.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``q.dtype``; higher is kept.

    Notes
    -----
    The anchor is :math:`\bar q = \frac1m\sum_i \bar R\tilde q_i`, the mean over the context's queries after
    the sinks of their pre-RoPE forms turned by the rotation averaged over the next :math:`F` positions
    (:func:`~approxlab.methods.expected_attention.average_future_rotation`). The alignment is the cosine
    (clamped to :math:`[-1, 1]`), the weights are shifted by their maximum before the exponential, the
    output directions are the values :math:`u_i = v_i`, and the score is the weighted leverage
    :math:`w_i v_i^\top A^{-1} v_i` -- the marginal gain of token :math:`i` in :math:`\log\det A`, to first
    order. These are the four departures from the paper that kvpress's ``CapPress`` docstring lists
    (normalised alignment, max shift, averaged future RoPE, :math:`u = v`); they are kept here. kvpress
    solves :math:`A^{-1}v` in float32 and gives the sinks ``max + 1``; here float64 and :math:`+\infty`.
    The anchor, :math:`A` and the score are per query head, as in kvpress, whose group mean is the
    framework's pooling. Positions count real tokens (see ``expected-attention``).

    **Cost**: :math:`O(n_c(p + p_v^2) + p_v^3)` plus :math:`O(Fp^2)` for :math:`\bar R`.

    References
    ----------
    CAPKV, arXiv:2604.25975 (as implemented by kvpress). kvpress (NVIDIA), ``kvpress/presses/cap_press.py``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = cap_scores(q, k, v, rope_base=10000.0)
    >>> scores.shape, bool((scores[:, 4:] > 0).all())
    (torch.Size([2, 32]), True)
    """
    context = check_context(q, k, v, key_mask)
    tau = check_real(tau, "tau")
    n_future_positions = check_int(n_future_positions, "n_future_positions", low=1)
    n_sink = check_int(n_sink, "n_sink", low=0)
    epsilon = check_positive_float(epsilon, "epsilon", allow_zero=True)
    (n_sink,) = fit_sinks(context, budget, n_sink)
    return _cap_scores(q, k, v, key_mask, rope_base, rope_frequencies, queries_pre_rope, tau, n_future_positions,
                       n_sink, epsilon)


@shared
def _cap_scores(q, k, v, key_mask, rope_base, rope_frequencies, queries_pre_rope, tau, n_future_positions, n_sink,
                epsilon):
    """:func:`cap_scores` with its sinks fitted to the budget (checked inputs): the same for every budget that
    leaves ``n_sink``, computed once for them inside :func:`~approxlab.cache._shared_scores.shared_scores`."""
    context = check_context(q, k, v, key_mask)
    p = q.shape[-1]
    frequencies = rotary_frequencies(p, rope_base, rope_frequencies, device=q.device)
    queries = queries_before_rope(q, context, frequencies, queries_pre_rope).to(torch.float64)
    used = context.real & (context.ranks >= n_sink)
    rotation = average_future_rotation(context, frequencies, n_future_positions, p, torch.float64)
    anchor = masked_mean(queries @ rotation.transpose(-1, -2), used, -2)  # (*batch, 1, p)
    keys, values = k.to(torch.float64), unit_scale(v).to(torch.float64)
    unit_anchor = anchor / anchor.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    unit_keys = keys / keys.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    alignment = (unit_keys @ unit_anchor.transpose(-1, -2)).squeeze(-1).clamp(-1.0, 1.0)
    logits = (tau * alignment).masked_fill(~used, -math.inf)
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))  # 0 off `used`
    scaled = values * ((weights + epsilon) * used).sqrt().unsqueeze(-1)
    capacity = torch.eye(v.shape[-1], dtype=torch.float64, device=v.device) + scaled.transpose(-1, -2) @ scaled
    leverage = (values * torch.linalg.solve(capacity, values.transpose(-1, -2)).transpose(-1, -2)).sum(-1)
    return finish((weights * leverage).to(q.dtype), context, keep=context.ends(first=n_sink))


REGISTRATION = dict(score=cap_scores, target="softmax", features=FEATURES, randomized=False,
                    inputs=("rope_base",))
"""The keyword arguments of this policy's registration: ``register("cap", **REGISTRATION)``.
``inputs``: the options the caller must supply from the model -- ``rope_base`` (or ``rope_frequencies``) for a
RoPE model; ``queries_pre_rope`` is optional."""

CAP = cache_policy("cap", **REGISTRATION)
"""The built-in method 'cap': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"cap": CAP.function}  # doctest skips a MethodSpec: run its function's examples

