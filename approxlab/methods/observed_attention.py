r"""Observed attention (kvpress's ``ObservedAttentionPress``): H2O's statistic, the attention each context
key received from the context's queries, averaged over the queries that see it.

A per-key cache scorer (:mod:`approxlab.cache._scorers`).
"""

from __future__ import annotations

from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish
from ..cache._column_sums import column_sums

__all__ = ["observed_attention_scores", "REGISTRATION", "OBSERVED_ATTENTION"]


def observed_attention_scores(q, k, v, *, generator=None, key_mask=None):
    r"""The causal attention key :math:`j` received, averaged over the queries that see it:
    :math:`s_j = \frac{1}{n_c - j}\sum_{i \ge j} a_{ij}`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (``v`` validated, not used).
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens. Padded keys get no attention and score
        :math:`-\infty`; padded queries pay none; the divisor counts the real queries at or after key
        :math:`j` (the sequence with its padding removed).

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``q.dtype``; higher is kept.

    Notes
    -----
    :math:`a_{ij} = e^{q_i^\top k_j/\sqrt p}/\sum_{l\le i} e^{q_i^\top k_l/\sqrt p}` is the context's causal
    attention (the prefill's), and :math:`n_c - j` is the number of queries :math:`i \ge j` that see key
    :math:`j` (0-based). This is kvpress's ``ObservedAttentionPress.score``: ``attentions.sum(2)`` divided
    by ``arange(n_tokens, 0, -1)``, then averaged over a group's query heads (the pooling that the
    framework does here). H2O (Zhang et al., 2023) accumulates the same column sums *without* the divisor
    (:func:`approxlab.methods.h2o.compress_h2o`), which favours early keys; the divisor makes the score the
    mean attention a key received. kvpress keeps no recent window; H2O does.

    **Cost**: the prefill's attention, :math:`O(n_c^2 p)`: the causal triangle of the logits in row blocks,
    summed without forming the softmax weights (:func:`approxlab.cache._column_sums.column_sums`), memory
    :math:`O(n_c\cdot\text{block})`.

    References
    ----------
    Zhang et al., "H2O: Heavy-hitter oracle for efficient generative inference of large language
    models", NeurIPS 2023 (arXiv:2306.14048). kvpress (NVIDIA),
    ``kvpress/presses/observed_attention_press.py``.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 4, 2, dtype=torch.float64)  # equal logits: row i spreads 1/(i+1)
    >>> [round(s, 4) for s in observed_attention_scores(q, k, k)[0].tolist()]  # (1+1/2+1/3+1/4)/4, ...
    [0.5208, 0.3611, 0.2917, 0.25]
    """
    context = check_context(q, k, v, key_mask)
    received = column_sums(q, k, context.key_mask)  # H2O's column sums, shared inside shared_column_sums()
    seen_by = (context.count - context.ranks).clamp_min(1).to(q.dtype)  # real queries i >= j
    return finish(received / seen_by, context)


REGISTRATION = dict(score=observed_attention_scores, target="softmax", features=FEATURES, randomized=False,
                    inputs=())
"""The keyword arguments of this policy's registration: ``register("observed-attention", **REGISTRATION)``."""

OBSERVED_ATTENTION = cache_policy("observed-attention", **REGISTRATION)
"""The built-in method 'observed-attention': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"observed_attention": OBSERVED_ATTENTION.function}  # doctest skips a MethodSpec: run its function's examples

