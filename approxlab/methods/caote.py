r"""CAOTE (Goel et al., 2025): evict the token whose removal changes the attention output least.

A per-key cache scorer (:mod:`approxlab.cache._scorers`): with :math:`\alpha` the attention the last ``window``
context queries pay the keys (averaged over them), the score of key :math:`j` is the exact change of the output
:math:`\sum_i\alpha_i v_i` when :math:`j` alone is evicted and the others renormalised,
:math:`\frac{\alpha_j}{1-\alpha_j}\lVert \sum_i\alpha_i v_i - v_j\rVert_2`.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int
from ..linalg.scaling import safe_norm
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, fit_sinks
from ._selection import safe_softmax

__all__ = ["caote_scores", "eviction_errors", "REGISTRATION", "CAOTE"]


def eviction_errors(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r"""CAOTE's closed form, ``(*batch, n)``: :math:`\frac{\alpha_j}{1-\alpha_j}\lVert\sum_i\alpha_i v_i -
    v_j\rVert_2` for attention weights ``weights`` :math:`\alpha` ``(*batch, n)`` (a distribution over the keys)
    and values ``v`` ``(*batch, n, p_v)``; :math:`1 - \alpha_j` is floored at the dtype's machine epsilon (one
    token holding all the attention scores largest).

    Examples
    --------
    >>> import torch
    >>> weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    >>> v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    >>> eviction_errors(weights, v)  # output (0.5, 0.5): evicting token 0 moves it to (0, 1)
    tensor([0.7071, 0.2357, 0.2357], dtype=torch.float64)
    """
    output = (weights.unsqueeze(-2) @ v).squeeze(-2)  # (*batch, p_v)
    distance = safe_norm(output.unsqueeze(-2) - v)  # no overflow or underflow of the squares at any scale of v
    return weights / (1 - weights).clamp_min(torch.finfo(weights.dtype).eps) * distance


def caote_scores(q, k, v, *, generator=None, key_mask=None, budget=None, window=1):
    r"""CAOTE's eviction error of each context token, :math:`+\infty` on the last ``window`` tokens.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: the context of one query head and the
        KV head it reads.
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens: padded keys score :math:`-\infty`, take no attention, and
        "the last queries" are the last real tokens'.
    budget : int, optional
        The cache budget (given by the KV-cache setting): the kept window is cut to fit within it and below the
        real tokens of the shortest context.
    window : int, default 1
        :math:`w`, the last context queries whose attention, averaged, is :math:`\alpha`: 1 is CAOTE over TOVA's
        scores (the last query's attention), more an observation window as SnapKV's. Their tokens are kept.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``q.dtype``; higher is kept.

    Notes
    -----
    With :math:`o = \sum_i \alpha_i v_i` and the output after evicting token :math:`j` alone,
    :math:`o_{-j} = \frac{o - \alpha_j v_j}{1 - \alpha_j}`, the eviction error is

    .. math::

        c_j = \lVert o - o_{-j}\rVert_2 = \frac{\alpha_j}{1 - \alpha_j}\,\lVert o - v_j\rVert_2

    (Eq. (7) and Theorem 3.1 of Goel et al.: the CAOTE score); the policy keeps the tokens of largest
    :math:`c_j`. Here :math:`\alpha_j = \frac1w\sum_{i} a_{ij}` over the last :math:`w` real context queries
    :math:`i`, each row :math:`a_{i\cdot}` the causal softmax (a query sees the keys up to itself), so that
    :math:`\sum_j \alpha_j = 1` and :math:`o` is the mean of those queries' outputs. With :math:`w = 1`,
    :math:`c_j` is exactly how far the last query's attention output moves when :math:`j` is dropped (tested
    against recomputing it without :math:`j`); the window's tokens are kept, as TOVA keeps the last.

    **What differs from the authors.** The paper applies the same closed form to the scores of H2O, TOVA and
    SnapKV (its "meta-heuristic"), normalising H2O's accumulated scores to sum to one; this file provides the
    TOVA (``window=1``) and observation-window forms, whose :math:`\alpha` is an attention distribution without
    any normalisation choice. No public code of CAOTE was found (the paper's authors, Qualcomm; kvpress at
    8bb29b9 has no CAOTE press), so the comparison is with the paper's equation and with the output change
    recomputed by brute force (``tests/test_output_aware_scorers.py``). **Cost**: :math:`O(w n_c p + n_c p_v)`.

    References
    ----------
    Goel, Park, Gagrani, Jones, Morse, Langston, Lee, Lott, "CAOTE: KV caching through attention output error
    based token eviction" (arXiv:2504.14051).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = caote_scores(q, k, v, window=4)
    >>> scores.shape, scores[0, -4:].isinf().all().item()  # the window's 4 tokens are kept
    (torch.Size([2, 32]), True)
    """
    context = check_context(q, k, v, key_mask)
    window = check_int(window, "window", low=1)
    (kept,) = fit_sinks(context, budget, window)
    observed = max(1, kept)  # the queries averaged: the window (at least the last one)
    batch = context.batch
    positions = torch.arange(context.n, device=q.device)
    rows = context.real & (context.ranks >= context.count - observed)  # (*batch, n): the window's queries
    at = torch.where(rows, positions, -1).topk(observed, dim=-1).values  # (*batch, w) their positions
    queries = torch.gather(q.expand(*batch, *q.shape[-2:]), -2, at.unsqueeze(-1).expand(*at.shape, q.shape[-1]))
    logits = queries @ k.expand(*batch, *k.shape[-2:]).transpose(-1, -2) / math.sqrt(q.shape[-1])
    visible = (positions <= at.unsqueeze(-1)) & context.real.unsqueeze(-2)  # causal, real keys
    alpha = safe_softmax(logits.masked_fill(~visible, -math.inf)).mean(-2)  # (*batch, n)
    errors = eviction_errors(alpha, v.expand(*batch, *v.shape[-2:]))
    return finish(errors, context, keep=context.ends(last=kept))


REGISTRATION = dict(score=caote_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("caote", **REGISTRATION)``."""

CAOTE = cache_policy("caote", **REGISTRATION)
"""The built-in method 'caote': this policy's prompt compression as a causal method, its scores in the KV-cache
setting."""
__test__ = {"caote": CAOTE.function}  # doctest skips a MethodSpec: run its function's examples
