r"""H2O (Zhang et al., NeurIPS 2023): a KV cache of heavy hitters, by accumulated attention, and recent tokens.

A causal-only method: row :math:`i` attends what the H2O cache holds when token :math:`i` is decoded,
the cache being updated token by token as in the paper's Algorithm 1.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_choice, check_int
from ._base import CAUSAL_ONLY, method
from ._masking import check_key_mask
from ._scores import top_budget
from ._selection import logit_blocks, real_ranks, safe_softmax, sparse_approximation

__all__ = ["h2o", "H2O", "compress_h2o", "score_h2o"]

SCORES = ("cache", "dense")
"""``scores``: accumulate the attention the query pays over the cache (the paper, the authors' cache code) or
over its whole causal row (the authors' simulation ``local_heavy_hitter_mask``)."""


def _recent_tokens(budget: int, recent_size) -> int:
    """The recent window of a budget: ``recent_size`` if given (``1 <= recent_size <= budget``), else half of it
    (at least 1); the rest of the budget holds heavy hitters."""
    if recent_size is None:
        return max(1, budget // 2)
    return check_int(recent_size, "recent_size", low=1, high=budget)


def score_h2o(q, k, v, *, budget, generator=None, recent_size=None, key_mask=None):
    r"""The KV-cache scores: the attention accumulated over the context, :math:`F_j = \sum_{i} a_{ij}` summed over
    the context's queries (causal softmax rows, real queries only), :math:`+\infty` on the ``recent`` most recent
    context tokens (real ones), :math:`-\infty` on padding; ``(*batch, n_c)``.

    The top ``budget`` of these (:func:`compress_h2o`) is what the authors' cache (``h2o_hf/utils_real_drop``,
    ``H2OKVCache_LayerWise``) keeps after the prefill: ``hh_score`` is the column sum of the prompt's attention,
    then ``topk(hh_score[:-recent], hh_size)`` plus the last ``recent_size`` tokens. With grouped K/V,
    :func:`approxlab.kv_cache_attention` averages them over a group's query heads, as kvpress's
    ``ObservedAttentionPress`` averages its per-head scores. The column sums are formed in row blocks:
    :math:`O(n_c^2 p)` time (the prefill's own attention), memory :math:`O(n_c\cdot\text{block})`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = score_h2o(q, k, v, budget=8, recent_size=3)
    >>> scores.shape, scores[0, -4:].isinf().tolist()  # the last 3 tokens are kept for sure
    (torch.Size([2, 32]), [False, True, True, True])
    """
    key_mask = check_key_mask(key_mask, k)
    recent = _recent_tokens(budget, recent_size)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = k.shape[-2]
    accumulated = q.new_zeros(*batch, n)
    real = None if key_mask is None else key_mask.expand(*batch, n)
    for start, stop, logits in logit_blocks(q, k, causal=True, key_mask=key_mask):
        weights = safe_softmax(logits)
        if real is not None:
            weights = weights * real[..., start:stop].unsqueeze(-1).to(weights.dtype)
        accumulated += weights.sum(-2)
    ranks, _ = real_ranks(key_mask, batch, n, q.device)
    count = ranks[..., -1:] + 1
    score = torch.where(ranks >= count - recent, torch.full_like(accumulated, math.inf), accumulated)
    if real is not None:
        score = score.masked_fill(~real, -math.inf)
    return score


def compress_h2o(q, k, v, *, budget, generator=None, recent_size=None, key_mask=None):
    r"""The KV-cache compression step: the top ``budget`` of :func:`score_h2o`, the ``recent`` most recent context
    tokens and the ``budget - recent`` others with the largest accumulated attention; ``(*batch, budget)`` indices.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> kept = compress_h2o(q, k, v, budget=8, recent_size=3)
    >>> kept.shape, sorted(kept[0].tolist())[-3:]  # 5 heavy hitters, then the last 3 tokens
    (torch.Size([2, 8]), [29, 30, 31])
    """
    scores = score_h2o(q, k, v, budget=budget, recent_size=recent_size, key_mask=key_mask)
    return top_budget(scores, budget)


def _run_cache(q, k, v, *, budget, recent, scores, key_mask, record):
    """Decode token by token through the H2O cache; returns the output and, with ``record``, the ``(*batch, n,
    budget)`` cache positions (-1 on empty slots) and attention weights of every step."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, p, p_v = q.shape[-2], q.shape[-1], v.shape[-1]
    q, k, v = (x.expand(*batch, *x.shape[-2:]) for x in (q, k, v))
    real = None if key_mask is None else key_mask.expand(*batch, n)
    position = torch.full((*batch, budget), -1, dtype=torch.long, device=q.device)  # -1: empty slot
    rank = torch.full_like(position, -1)
    keys, values = q.new_zeros(*batch, budget, p), q.new_zeros(*batch, budget, p_v)
    accumulated = q.new_zeros(*batch, budget)  # F of the paper, per cache slot
    inserted = torch.zeros(batch, dtype=torch.long, device=q.device)  # real tokens so far
    slots = torch.arange(budget, device=q.device)
    outputs, positions, all_weights = [], [], []
    for i in range(n):
        is_real = torch.ones(batch, dtype=torch.bool, device=q.device) if real is None else real[..., i]
        filled = (position >= 0).sum(-1)
        full = filled >= budget
        # evict the lowest accumulated score outside the recent window (ties: the oldest token)
        candidate = (position >= 0) & (rank <= (inserted - recent).unsqueeze(-1))
        key = torch.where(candidate, accumulated, torch.full_like(accumulated, math.inf))
        tied = candidate & (key == key.amin(-1, keepdim=True))
        oldest = torch.where(tied, position, torch.full_like(position, n)).argmin(-1)
        slot = torch.where(full, oldest, filled.clamp(max=budget - 1))
        write = (slots == slot.unsqueeze(-1)) & is_real.unsqueeze(-1)  # (*batch, budget)
        keys = torch.where(write.unsqueeze(-1), k[..., i, :].unsqueeze(-2), keys)
        values = torch.where(write.unsqueeze(-1), v[..., i, :].unsqueeze(-2), values)
        position = torch.where(write, torch.full_like(position, i), position)
        rank = torch.where(write, inserted.unsqueeze(-1), rank)
        accumulated = accumulated.masked_fill(write, 0.0)
        inserted = inserted + is_real.long()
        logits = (keys @ q[..., i, :].unsqueeze(-1)).squeeze(-1) / math.sqrt(p)
        weights = safe_softmax(logits.masked_fill(position < 0, -math.inf))
        outputs.append((weights.unsqueeze(-2) @ values).squeeze(-2))
        if scores == "cache":
            paid = weights
        else:  # the simulation: the query's softmax over its whole causal row, read at the cached tokens
            row = (k[..., : i + 1, :] @ q[..., i, :].unsqueeze(-1)).squeeze(-1) / math.sqrt(p)
            if real is not None:
                row = row.masked_fill(~real[..., : i + 1], -math.inf)
            full_row = torch.cat([safe_softmax(row), row.new_zeros(*batch, 1)], dim=-1)
            paid = torch.gather(full_row, -1, torch.where(position >= 0, position, torch.full_like(position, i + 1)))
        accumulated = accumulated + paid * is_real.unsqueeze(-1).to(paid.dtype)
        if record:
            positions.append(position.clone())
            all_weights.append(weights)
    output = torch.stack(outputs, dim=-2)
    if record:
        return output, torch.stack(positions, dim=-2), torch.stack(all_weights, dim=-2)
    return output


@method("h2o", target="softmax", features="cache size: heavy hitters plus recent tokens", randomized=False,
        causal=CAUSAL_ONLY, score=score_h2o)
def h2o(q, k, v, *, num_features, generator=None, recent_size=None, scores="cache", key_mask=None, causal=True):
    r"""H2O's heavy-hitter cache, causal: row :math:`i` attends the ``num_features`` tokens the cache holds
    when token :math:`i` is decoded.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``.
    num_features : int
        The cache size :math:`b` = heavy hitters + recent tokens (``1 <= b <= n``); rows
        :math:`i < b` see every key ``j <= i``. The authors' ``heavy_ratio`` and ``recent_ratio`` are
        fractions of the sequence length: :math:`b = (\text{heavy\_ratio} + \text{recent\_ratio})\,n`.
    generator : torch.Generator, optional
        Unused (deterministic).
    recent_size : int, optional
        :math:`r`, the recent window, the current token included (``1 <= r <= b``); default
        :math:`\max(1, \lfloor b/2\rfloor)`, the paper's equal split. :math:`r = b` is a sliding window.
    scores : {"cache", "dense"}, default "cache"
        What is accumulated: ``"cache"`` the attention the query pays over the cache it attends (the
        paper's Algorithm 1, the authors' cache ``H2OKVCache_LayerWise``); ``"dense"`` its softmax over
        the whole causal row, as the authors' simulation ``local_heavy_hitter_mask`` accumulates it
        (:math:`O(n^2p)` time).
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens. Padded tokens never enter the cache and padded queries
        accumulate nothing (the cache is that of the sequence with its padding removed); a padded row
        attends the current cache.
    causal : bool, default True
        Must be True: the method is causal-only (``approximate(..., causal=True)``).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (recomputed on request, :math:`nb` entries); ``info``: ``recent`` and ``heavy``.

    Notes
    -----
    The cache :math:`\mathcal S` and the accumulated attention :math:`F` evolve per token (Algorithm 1
    of the paper, the greedy H2 eviction, with the recent tokens the paper keeps beside the heavy hitters). At step :math:`i` token
    :math:`i` enters; if :math:`|\mathcal S| > b` the cached token :math:`u` outside the recent window
    :math:`\{i-r+1, \dots, i\}` with the smallest :math:`F_u` is evicted (the greedy
    :math:`\arg\max_{v} F(\mathcal S\setminus\{v\})`; ties go to the oldest). Row :math:`i` is the exact
    softmax over :math:`\mathcal S_i`, and each :math:`j \in \mathcal S_i` accumulates
    :math:`F_j \mathrel{+}= a_{ij} = e^{s_{ij}}/\sum_{l\in\mathcal S_i} e^{s_{il}}` (its score restarts at
    0 when it enters). The heavy hitters are the :math:`b - r` tokens kept for their :math:`F`.

    **Where the published code departs.** (1) The simulation used for the paper's accuracy tables
    (``h2o_hf/utils_lm_eval/modify_opt.py``, ``local_heavy_hitter_mask``) accumulates each query's
    softmax over its *whole* causal row, not over the cache (``scores="dense"``); (2) it keeps
    ``heavy_budget - 1`` heavy tokens plus the current one in its heavy set and takes the union with a
    window of ``recent_budget + 1`` tokens (``triu(diagonal=-recent_budget)``), so rows attend up to
    ``heavy + recent + 1`` keys, fewer where the two sets overlap, and its budgets are fractions of the
    sequence length; (3) its Llama file selects heavy hitters once, from column sums over all queries
    (future ones included). The cache code (``utils_real_drop``) appends the new token before trimming,
    so a decode step attends ``hh_size + recent_size + 1`` keys: this method with ``num_features =
    hh_size + recent_size + 1`` and ``recent_size = recent + 1``. See the docs page for the comparison.

    **Cost**: :math:`n` sequential steps of :math:`O(bp)` each per head, :math:`O(nbp)` in all, memory
    :math:`O(bp)` per head; no :math:`n\times n` array (``scores="dense"``: :math:`O(n^2p)` time).

    References
    ----------
    Zhang, Sheng, Zhou, Chen, Zheng, Cai, Song, Tian, Ré, Barrett, Wang and Chen, "H2O: Heavy-hitter
    oracle for efficient generative inference of large language models", NeurIPS 2023
    (arXiv:2306.14048); code FMInference/H2O.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("h2o", q, k, v, num_features=32, causal=True)  # every key
    >>> float((approx.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("h2o", q, k, v, num_features=8, recent_size=4, causal=True)
    >>> kept = sorted(approx.operator().columns[0, 31].tolist())
    >>> len(kept), kept[-4:]  # 4 heavy hitters, then the 4 most recent tokens
    (8, [28, 29, 30, 31])
    """
    if causal is not True:
        raise ValueError(f"h2o is causal-only: pass causal=True; got causal={causal!r}.")
    key_mask = check_key_mask(key_mask, k)
    check_choice(scores, "scores", SCORES)
    recent = _recent_tokens(num_features, recent_size)
    run = dict(budget=num_features, recent=recent, scores=scores, key_mask=key_mask)
    output = _run_cache(q, k, v, record=False, **run)

    def record():
        _, position, weights = _run_cache(q, k, v, record=True, **run)
        return position.clamp(min=0), weights  # empty slots have weight 0

    info = {"recent": recent, "heavy": num_features - recent}
    return sparse_approximation("h2o", output, k.shape[-2], record, info)


H2O = h2o
__test__ = {"h2o": h2o.function}  # doctest skips a MethodSpec: run its function's examples
