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
from ..kernels import causal_mask
from ..cache._scores import top_budget
from ..cache._column_sums import column_sums
from ._selection import gather_rows, real_ranks, safe_softmax, sparse_approximation

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
    accumulated = column_sums(q, k, key_mask)  # shared by every budget inside shared_column_sums()
    real = None if key_mask is None else key_mask.expand(*batch, n)
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


_STEPS = 64
"""Decode steps per block of :func:`_run_cache` (its candidates are the cache and the block's tokens)."""


def _steps(logits, penalty, score, step_penalty, real, dense, big, record):
    r"""The steps of one block of :func:`_run_cache`, in order: ``(weights, held, score)``, the rows' softmax weights
    over the cache ``(*batch, c, w)``, with ``record`` the cache after each step (a list of ``(*batch, w)`` bool),
    and the accumulated scores after the block ``(*batch, w)``; ``penalty`` is updated in place.

    One step is an add, an ``argmin``, two ``scatter_``, a subtraction, a softmax and an add: the eviction key is
    kept as one tensor, :math:`F + \pi` (``score`` plus ``penalty``), equal to :math:`F` on the cached tokens, and
    an evicted token's key is set to ``big`` (:math:`F + \text{big}` rounds to ``big``: :math:`F \le n`), so the
    keys, the argmins, the weights and :math:`F` are those of the step-by-step update bit for bit; the step's
    slices are views taken once per block (``unbind``); without padding the row is added as it is (the step-by-step
    update multiplied it by 1).
    """
    width = logits.shape[-1]
    key = torch.add(score, penalty)
    visible_penalty, visible_key = penalty[..., :width], key[..., :width]
    rows, held = [], [] if record else None
    every_real = bool(real.all())
    paid_rows = dense.unbind(-2) if dense is not None else [None] * logits.shape[-2]
    for step, step_logits, paid, extra in zip(step_penalty.unbind(-2), logits.unbind(-2), paid_rows, real.unbind(-1)):
        evicted = torch.add(key, step).argmin(-1, keepdim=True)
        penalty.scatter_(-1, evicted, big)
        key.scatter_(-1, evicted, big)
        row = torch.softmax(step_logits - visible_penalty, dim=-1)
        rows.append(row)
        paid = row if paid is None else paid
        if every_real:
            visible_key.add_(paid)
        else:
            visible_key.addcmul_(paid, extra.unsqueeze(-1).to(paid.dtype))
        if record:
            held.append(visible_penalty == 0)
    kept = visible_penalty == 0
    return torch.stack(rows, dim=-2), held, torch.where(kept, visible_key, score[..., :width])


def _run_cache(q, k, v, *, budget, recent, scores, key_mask, record):
    """Decode token by token through the H2O cache, in blocks of :data:`_STEPS` steps; returns the output and,
    with ``record``, the ``(*batch, n, budget)`` positions (-1 on unused slots) and attention weights of every
    step.

    A block of steps ``i0 .. i1 - 1`` can only attend the cache it starts with and its own tokens: those
    ``budget + i1 - i0`` candidates, ordered by position, carry a penalty (0 for a cached token, a huge
    number otherwise) and the block's logits against them are one product. A step (:func:`_steps`) is then a
    few tensor operations on ``(*batch, candidates)``: the eviction key (accumulated score plus penalties, the
    recent window's penalty precomputed per step), its ``argmin`` (the first minimum: the oldest token among
    ties), the penalty put on the evicted token, the softmax of the row over the cached tokens, and the
    accumulation of the attention paid. A step with nothing to evict (cache not full, padded token) evicts a
    spare column instead. The block's outputs are one product of its weights with the candidates' values.

    The step itself is not vectorised across rows: whom step ``i`` evicts depends on the scores accumulated
    with the softmax over the cache of every earlier step, a normaliser that depends on the earlier evictions
    (no associative scan exists for it). A batched form that is exact was tried and measured: guess a block's
    evictions, compute every step of the block at once from the guess (caches, softmax rows, an exclusive
    prefix sum of the paid attention, the argmins), take the argmins as the next guess, stop when a pass
    reproduces its guess (exact by induction over the steps: each pass makes at least one more step right). It
    kept the same caches, bit for bit, but needed 8.6 passes per block of 64 steps (random float32 Q, K, V, 9
    heads of width 64, n = 1,024, b = 128; 13.7 with logits three times larger, 6.5 per block of 16 steps),
    each pass a dozen operations on ``(heads, 64, b + 64)`` tensors: more work than the 64 steps it replaces,
    and no faster at n = 2,048 (1.49 s against 1.51 s; 2.29 s against 0.44 s with the larger logits).
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, p, p_v = q.shape[-2], q.shape[-1], v.shape[-1]
    q, k, v = (x.expand(*batch, *x.shape[-2:]) for x in (q, k, v))
    device, dtype = q.device, q.dtype
    real = torch.ones(*batch, n, dtype=torch.bool, device=device) if key_mask is None else key_mask.expand(*batch, n)
    ranks, _ = real_ranks(key_mask, batch, n, device)
    before = ranks + 1 - real.long()  # real tokens before step i: the paper's cache has min(before, budget) of them
    big = torch.finfo(dtype).max / 16  # penalties: 0, big; the spare column -4 big (nothing to evict) or 4 big
    big_ = torch.tensor(big, dtype=dtype, device=device)
    position = torch.full((*batch, budget), -1, dtype=torch.long, device=device)
    rank = torch.full_like(position, -1)
    accumulated = q.new_zeros(*batch, budget)
    cached = torch.zeros(*batch, budget, dtype=torch.bool, device=device)
    keys, values = q.new_zeros(*batch, budget, p), q.new_zeros(*batch, budget, p_v)
    outputs, positions, all_weights = [], [], []
    for first in range(0, n, _STEPS):
        stop = min(first + _STEPS, n)
        steps = stop - first
        width = budget + steps
        candidate_position = torch.cat([position, torch.arange(first, stop, device=device).expand(*batch, steps)], -1)
        candidate_rank = torch.cat([rank, ranks[..., first:stop]], dim=-1)
        member = torch.cat([cached, real[..., first:stop]], dim=-1)  # the block's real tokens, inserted ahead
        candidate_keys = torch.cat([keys, k[..., first:stop, :]], dim=-2)
        candidate_values = torch.cat([values, v[..., first:stop, :]], dim=-2)
        penalty = q.new_zeros(*batch, width + 1)
        penalty[..., :width].masked_fill_(~member, big)
        score = torch.cat([accumulated, q.new_zeros(*batch, steps + 1)], dim=-1)
        logits = (q[..., first:stop, :] @ candidate_keys.transpose(-1, -2)) / math.sqrt(p)
        ahead = ~torch.ones(steps, steps, dtype=torch.bool, device=device).tril()  # tokens inserted ahead of time
        logits[..., budget:].masked_fill_(ahead, -math.inf)
        threshold = (before[..., first:stop] - recent).unsqueeze(-1)  # eviction candidates: rank <= threshold
        evicting = real[..., first:stop] & (before[..., first:stop] >= budget)
        step_penalty = torch.cat([torch.where(candidate_rank.unsqueeze(-2) <= threshold, 0, big_),
                                  torch.where(evicting, 4 * big_, -4 * big_).unsqueeze(-1)], dim=-1)
        if scores == "dense":  # the query's softmax over its whole causal row, read at the candidates
            row = (q[..., first:stop, :] @ k[..., :stop, :].transpose(-1, -2)) / math.sqrt(p)
            row = row.masked_fill(~causal_mask(steps, stop, row_offset=first, device=device), -math.inf)
            if key_mask is not None:
                row = row.masked_fill(~real[..., :stop].unsqueeze(-2), -math.inf)
            dense = torch.gather(safe_softmax(row), -1,
                                 candidate_position.clamp(min=0).unsqueeze(-2).expand(*batch, steps, width))
        weights, held, visible_score = _steps(logits, penalty, score, step_penalty, real[..., first:stop],
                                              dense if scores == "dense" else None, big, record)
        visible_penalty = penalty[..., :width]
        weights.masked_fill_((ranks[..., first:stop] < 0).unsqueeze(-1), 0.0)  # no real token yet: output 0
        outputs.append(weights @ candidate_values)
        if record:
            visible = torch.stack(held, dim=-2)
            visible[..., budget:] &= ~ahead
            slots = visible.to(dtype).topk(budget, dim=-1).indices  # every visible candidate (at most budget)
            visible = torch.gather(visible, -1, slots)
            positions.append(torch.where(visible, torch.gather(candidate_position.unsqueeze(-2).expand(
                *batch, steps, width), -1, slots), -1))
            all_weights.append(torch.gather(weights, -1, slots))
        # the cache after the block: its tokens by position (empty slots last)
        kept = visible_penalty == 0
        order = torch.sort(torch.where(kept, candidate_position, n), dim=-1, stable=True).indices[..., :budget]
        cached = torch.gather(kept, -1, order)
        position = torch.where(cached, torch.gather(candidate_position, -1, order), -1)
        rank = torch.gather(candidate_rank, -1, order)
        accumulated = torch.gather(visible_score, -1, order)
        keys = gather_rows(candidate_keys, batch)(order)
        values = gather_rows(candidate_values, batch)(order)
    output = torch.cat(outputs, dim=-2)
    if record:
        return output, torch.cat(positions, dim=-2), torch.cat(all_weights, dim=-2)
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

    **Cost**: :math:`n` sequential steps, taken in blocks of :math:`c` = 64 (``_run_cache``): per block one
    product of its :math:`c` queries with the :math:`b + c` candidate keys (the cache it starts with and its
    own tokens) and one with their values, per step seven tensor operations on the :math:`b + c` candidates
    (no product); :math:`O(n(b + c)p)` in all, memory :math:`O(c(b + c) + bp)` per head; no :math:`n\times n`
    array (``scores="dense"``: :math:`O(n^2p)` time). The steps stay sequential: which token step :math:`i`
    evicts depends on :math:`F`, accumulated with the softmax over the cache of every earlier step, whose
    normaliser depends on the earlier evictions, so no scan over the rows computes it. The numbers are those
    of the token-by-token cache up to the order of the softmax sums (a few ulps).

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
