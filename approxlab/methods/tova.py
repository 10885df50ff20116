r"""TOVA (Oren et al., 2024): keep the tokens the last query attends most (kvpress's ``TOVAPress``).

A per-key cache scorer (:mod:`approxlab.cache._scorers`): the score of key :math:`j` is the attention
the context's last query pays it; the last token itself is always kept.
"""

from __future__ import annotations

import math

from .._validation import check_bool
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, last_real_query
from ._selection import safe_softmax

__all__ = ["tova_scores", "REGISTRATION", "TOVA"]


def tova_scores(q, k, v, *, generator=None, key_mask=None, average_heads=False):
    r"""The last query's attention, :math:`s_j = a_{n_c-1,\,j}`, :math:`+\infty` for the last token.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (``v`` validated, not used);
        with ``average_heads``, ``(*batch, H, n_c, p)``: every query head of a layer and, repeated, the KV
        head each reads.
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; padded keys score :math:`-\infty` and "the last
        query" is the last real token's.
    average_heads : bool, default False
        False: each head's own weights (one query head, the per-head contract). True: the weights
        averaged over dimension -3, the ``H`` heads of a layer, the same scores returned for every head
        -- kvpress's rule.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` (``(*batch, H, n_c)`` with ``average_heads``) scores in ``q.dtype``; higher is
        kept.

    Notes
    -----
    With :math:`t` the last (real) token, :math:`a_{tj} = e^{q_t^\top k_j/\sqrt p}/\sum_{l}
    e^{q_t^\top k_l/\sqrt p}` over every context key (the last query sees all of them). TOVA evicts the
    token of lowest such weight when the cache is full; as a one-shot compression of the context that is
    keeping the top :math:`b` of them.

    **Heads.** kvpress's ``TOVAPress.score`` takes ``attentions[..., -1:, :-1]`` and averages it over
    *all* :math:`H` query heads of the layer (``mean(1)``), then gives every KV head that same score: one
    kept set per layer. The per-head contract averages only a group's query heads (grouped-query
    pooling), so by default each KV head keeps its own set, which is per-head TOVA. To reproduce kvpress,
    pass the layer's heads together at dimension -3 with ``average_heads=True``: every head then holds
    the layer mean, the group pooling leaves it unchanged, and every KV head keeps kvpress's set.

    kvpress gives the last token the score ``max + 1``; here :math:`+\infty`: the same kept set for any
    budget :math:`b \ge 1`. **Cost**: :math:`O(n_c p)` (one query row).

    References
    ----------
    Oren, Hassid, Yarden, Adi and Schwartz, "Transformers are multi-state RNNs", EMNLP 2024
    (arXiv:2401.06104). kvpress (NVIDIA), ``kvpress/presses/tova_press.py``.

    Examples
    --------
    >>> import torch
    >>> k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    >>> q = torch.zeros_like(k)
    >>> q[..., -1, :] = torch.tensor([0.0, 1.0])  # the last query looks along the second axis
    >>> tova_scores(q, k, k).topk(2).indices.tolist()  # the last token, then key 1
    [[3, 1]]
    """
    context = check_context(q, k, v, key_mask)
    check_bool(average_heads, "average_heads")
    if average_heads and len(context.batch) < 1:
        raise ValueError(f"`average_heads=True` needs the layer's heads at dimension -3, (*batch, H, n_c, p); got "
                         f"q.shape={tuple(q.shape)}.")
    last = last_real_query(q, context)  # (*batch, 1, p)
    logits = (last @ k.transpose(-1, -2)).squeeze(-2) / math.sqrt(q.shape[-1])
    weights = safe_softmax(logits.masked_fill(~context.real, -math.inf))
    if average_heads:
        weights = weights.mean(-2, keepdim=True).expand_as(weights)
    return finish(weights, context, keep=context.ends(last=1))


REGISTRATION = dict(score=tova_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("tova", **REGISTRATION)``."""

TOVA = cache_policy("tova", **REGISTRATION)
"""The built-in method 'tova': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"tova": TOVA.function}  # doctest skips a MethodSpec: run its function's examples

