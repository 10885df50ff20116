r"""Compactor (Chari and Van Durme, 2025; kvpress's ``CompactorPress``): the keys' approximate leverage
blended with non-causal, chunked attention, sinks at both ends kept.

A per-key cache scorer (:mod:`approxlab.cache._scorers`), randomized through the leverage's sketch.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float, check_real
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, fit_sinks, masked_zscore, unit_scale
from ..cache._shared_scores import shared
from ._selection import block_rows, safe_softmax
from .leverage_score import sketch_draws, check_sketch, draw_sketch, keys_before_rope, sketched_ridge_leverage

__all__ = ["compactor_scores", "REGISTRATION", "COMPACTOR"]


def chunked_attention_received(q, k, used, chunk):
    r"""The attention each key receives within its chunk, :math:`A_j = \sum_{i \in c(j)} \operatorname{softmax}_{l
    \in c(i)}(q_i^\top k_l)_j`, ``(*batch, n)``: non-causal softmax over the ``used`` tokens of the same
    ``chunk`` (``(*batch, n)`` ids, -1 off the used tokens, nondecreasing along the used ones), logits
    :math:`q^\top k` *unscaled* (kvpress's), in row blocks.

    Row blocks are runs of whole chunks (:func:`_chunk_blocks`), each attending only the columns its chunks
    cover (:func:`_chunk_columns`), the others being :math:`-\infty` in every one of its rows:
    :math:`O(n\cdot\text{chunk}\cdot p)` work where the chunks are aligned across the batch (at most
    :math:`O(n\,(\text{block} + 2\,\text{chunk})\,p)`), not :math:`O(n^2p)`; the same sums to rounding
    (their order)."""
    batch, n = used.shape[:-1], used.shape[-1]
    received = q.new_zeros(*batch, n)
    for start, stop in _chunk_blocks(chunk, min(block_rows(batch, n), _CHUNK_BLOCK)):
        first, last = _chunk_columns(chunk, used, start, stop)
        if first >= last:
            continue  # no used row in the block: it pays no attention
        logits = (q[..., start:stop, :] @ k[..., first:last, :].transpose(-1, -2)).expand(*batch, stop - start,
                                                                                        last - first)
        visible = (chunk[..., start:stop, None] == chunk[..., None, first:last]) & used[..., None, first:last]
        weights = safe_softmax(logits.masked_fill(~visible, -math.inf))
        received[..., first:last] += (weights * used[..., start:stop, None]).sum(-2)
    return received


_CHUNK_BLOCK = 256
"""Most rows of a block of :func:`chunked_attention_received` (fewer where ``BLOCK_ELEMENTS`` asks)."""


def _chunk_blocks(chunk, limit: int) -> list[tuple[int, int]]:
    """Row blocks ``(start, stop)`` covering ``0:n``, cut where a chunk begins in any sequence of the batch: whole
    chunks merged up to ``limit`` rows, a longer chunk cut into pieces of ``limit`` rows."""
    n = chunk.shape[-1]
    flat = chunk.reshape(-1, n)
    changes = torch.ones_like(flat, dtype=torch.bool)
    changes[:, 1:] = flat[:, 1:] != flat[:, :-1]
    edges = sorted({0, n, *torch.nonzero(((flat >= 0) & changes).any(0)).flatten().tolist()})
    blocks, low = [], 0
    for begin, end in zip(edges, edges[1:]):
        if end - low > limit and begin > low:
            blocks.append((low, begin))
            low = begin
        while end - low > limit:
            blocks.append((low, low + limit))
            low += limit
    return blocks + ([(low, n)] if low < n else [])


def _chunk_columns(chunk, used, start, stop) -> tuple[int, int]:
    """``(first, last)``: the columns ``first:last`` holding every used token whose chunk is one of the used rows
    ``start:stop``'s, over the whole batch (``first >= last`` when no row of the block is used)."""
    rows, row_used = chunk[..., start:stop], used[..., start:stop]
    if not bool(row_used.any()):
        return 0, 0
    low = torch.where(row_used, rows, torch.full_like(rows, chunk.shape[-1])).amin(-1, keepdim=True)
    high = torch.where(row_used, rows, torch.full_like(rows, -1)).amax(-1, keepdim=True)
    columns = (used & (chunk >= low) & (chunk <= high)).flatten(0, -2).any(0) if chunk.dim() > 1 else (
        used & (chunk >= low) & (chunk <= high))
    found = torch.nonzero(columns).flatten()
    return int(found[0]), int(found[-1]) + 1


def _layer_groups(groups, batch, shape):
    """``groups`` checked against the layer's ``H`` heads at dimension -3; None stays None."""
    if groups is None:
        return None
    groups = check_int(groups, "num_key_value_groups", low=1)
    if len(batch) < 1 or batch[-1] % groups:
        raise ValueError(f"`num_key_value_groups` must divide the layer's heads H at dimension -3 of (*batch, H, n_c, "
                         f"p); got {groups} and q.shape={tuple(shape)}.")
    return groups


def _group_mean(x, groups):
    """``(*batch, H, n)`` -> ``(*batch, H / g, n)``: the mean over each group of ``g`` consecutive heads."""
    return x.unflatten(-2, (x.shape[-2] // groups, groups)).mean(-2)


def _zscore(x, used, groups):
    """z-scores over each head's ``used`` tokens, or (``groups``) over all heads of a sequence at once."""
    if groups is None:
        return masked_zscore(x, used)
    return masked_zscore(x.flatten(-2), used.flatten(-2)).unflatten(-1, x.shape[-2:])


def compactor_scores(q, k, v, *, generator=None, key_mask=None, keys_pre_rope=None, rope_base=None,
                     rope_frequencies=None, sink_size_start=8, sink_size_end=4, chunk_size=256, sketch_dimension=48,
                     blending=0.35, ridge=1e-2, sketch=None, num_key_value_groups=None, budget=None):
    r"""Compactor's blend :math:`s_j = \beta\,z(\ell_j) + z\big(\operatorname{pool}_3(A_j\lVert v_j\rVert_2)\big)`
    over the middle tokens, :math:`+\infty` on ``sink_size_start`` first and ``sink_size_end`` last tokens.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: queries and keys after the
        rotary embedding (the attention term reads them), values.
    generator : torch.Generator, optional
        The CPU generator of the leverage's sketch (unless ``sketch`` is given).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens, padding at either end: sinks, chunks and the pooling
        count real tokens; padded keys score :math:`-\infty`.
    keys_pre_rope, rope_base, rope_frequencies
        The pre-RoPE keys of the leverage term, **required** as in
        :func:`~approxlab.methods.leverage_score.key_leverage_scores` (``keys_pre_rope=k`` without RoPE).
    sink_size_start, sink_size_end : int, default 8 and 4
        The first and last tokens kept.
    budget : int, optional
        The cache budget (given by the KV-cache setting): the sinks are cut (the last ones first) to fit within it and below the
        real tokens of the shortest context (:func:`approxlab.cache._scorers.fit_sinks`).
    chunk_size : int, default 256
        The chunks of the non-causal attention, consecutive middle tokens from the first one.
    sketch_dimension : int, default 48
        :math:`r` of the leverage's Gaussian sketch.
    blending : float, default 0.35
        :math:`\beta`. kvpress sets it to its ``compression_ratio``, :math:`1 - b/n_c` at budget :math:`b`
        (0.35 is its fallback); the per-key contract does not see the budget: pass
        ``blending=1 - b / n_c`` to reproduce kvpress at budget :math:`b`.
    ridge : float, default 1e-2
        :math:`\lambda` of the leverage scores.
    sketch : torch.Tensor, optional
        ``(*batch, p, r)``, a given sketch.
    num_key_value_groups : int, optional
        :math:`g`: the inputs are a whole layer, ``(*batch, H, n_c, p)`` with the KV heads repeated over
        groups of :math:`g` consecutive query heads; both terms are averaged over each group and z-scored
        over all the layer's heads at once, the group's score returned for each of its heads -- kvpress's
        rule (see below). None (default): per head.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` (``(*batch, H, n_c)`` with ``num_key_value_groups``) scores in ``q.dtype``; higher
        is kept.

    Notes
    -----
    On the middle tokens (the sinks removed): :math:`\ell_j` are the leverage scores of the sketched,
    centred pre-RoPE middle keys (``leverage-score``); :math:`A_j` the attention key :math:`j` receives from
    the queries of its chunk under a non-causal softmax within the chunk
    (:func:`chunked_attention_received`); :math:`\operatorname{pool}_3` the mean over the token and its two
    neighbours with zeros beyond the middle (``avg_pool1d(kernel_size=3, padding=1)``); :math:`z` the
    z-score over the middle tokens (sample standard deviation floored at :math:`10^{-6}`). This is
    kvpress's ``CompactorPress.score`` (``LeverageScorePress`` and ``NonCausalAttnPress`` on the middle
    tokens); its attention logits are :math:`q^\top k` without the :math:`1/\sqrt p`, kept here.

    **What differs from kvpress.** (1) Its z-scores run over the whole ``(batch, KV heads, tokens)``
    tensor and, for the attention term, after averaging :math:`A` over a group's query heads; per head
    (the default) they run over each head's middle tokens, before the group pooling: equal scores for one
    query head reading one KV head, different weights of the two terms otherwise. With
    ``num_key_value_groups`` and the layer's heads passed together, kvpress's order is followed (z-scores
    per sequence of the batch, over all its heads). (2) In a last, partial chunk kvpress pads with zero
    vectors whose keys get logit :math:`-10^{-9}` (not :math:`-\infty`): they take attention from the
    real queries, and the padding queries spread :math:`1/\text{chunk}` to every key of the chunk; here
    the partial chunk is a softmax over its real tokens only (equal when the middle length is a multiple
    of ``chunk_size``). (3) One sketch per query head (pass ``sketch`` repeated over the group for
    kvpress's one per KV head); float64 leverage; :math:`+\infty` sinks where kvpress pads with the
    maximum score.

    **Cost**: :math:`O(n_c\cdot\text{chunk}\cdot p)` for the attention term (row blocks of whole chunks, each
    against the columns of its chunks only), :math:`O(n_c p r + n_c r^2 + r^3)` for the leverage.

    References
    ----------
    Chari and Van Durme, "Compactor: Calibrated query-agnostic KV cache compression with approximate
    leverage scores" (arXiv:2507.08143). kvpress (NVIDIA), ``kvpress/presses/compactor_press.py``,
    ``leverage_press.py``, ``non_causal_attention_press.py``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 40, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = compactor_scores(q, k, v, keys_pre_rope=k, chunk_size=8, generator=torch.Generator().manual_seed(0))
    >>> scores[:, :8].isinf().all().item(), scores[:, -4:].isinf().all().item()
    (True, True)
    """
    context = check_context(q, k, v, key_mask)
    start = check_int(sink_size_start, "sink_size_start", low=0)
    end = check_int(sink_size_end, "sink_size_end", low=0)
    chunk_size = check_int(chunk_size, "chunk_size", low=1)
    sketch_dimension = check_int(sketch_dimension, "sketch_dimension", low=1)
    blending, ridge = check_real(blending, "blending"), check_positive_float(ridge, "ridge")
    group = _layer_groups(num_key_value_groups, context.batch, q.shape)
    start, end = fit_sinks(context, budget, start, end)
    return _compactor_scores(q, k, v, key_mask, generator, keys_pre_rope, rope_base, rope_frequencies, start, end,
                             chunk_size, sketch_dimension, blending, ridge, sketch, group)


@shared
def _compactor_scores(q, k, v, key_mask, generator, keys_pre_rope, rope_base, rope_frequencies, start, end,
                      chunk_size, sketch_dimension, blending, ridge, sketch, group):
    """:func:`compactor_scores` with its sinks fitted to the budget (checked inputs): the same for every budget
    that leaves ``start`` and ``end``, computed once for them inside
    :func:`~approxlab.cache._shared_scores.shared_scores` (the sketch drawn once, the generator left as after)."""
    context = check_context(q, k, v, key_mask)
    v = unit_scale(v)  # the values' norms below: overflow-safe, the kept set blind to their global scale
    keys = keys_before_rope(k, context, "compactor", keys_pre_rope, rope_base, rope_frequencies)
    sinks = context.ends(first=start, last=end)
    middle = context.real & ~sinks
    sketch = (draw_sketch(context.batch, k.shape[-1], sketch_dimension, generator, k) if sketch is None
              else check_sketch(sketch, context.batch, k.shape[-1], sketch_dimension, k))
    leverage = sketched_ridge_leverage(keys, middle, sketch, ridge)
    chunk = torch.where(middle, (context.ranks - start).clamp_min(0) // chunk_size, torch.full_like(context.ranks, -1))
    received = chunked_attention_received(q, k, middle, chunk)
    if group is not None:  # kvpress: the group's mean, then z-scores over the layer's heads
        leverage, received, norms, used = (_group_mean(x, group) for x in (leverage, received, v.norm(dim=-1),
                                                                            middle.to(q.dtype)))
        used = used > 0.5
    else:
        norms, used = v.norm(dim=-1), middle
    padded = torch.nn.functional.pad(received * norms * used, (1, 1))
    pooled = (padded[..., :-2] + padded[..., 1:-1] + padded[..., 2:]) / 3
    scores = blending * _zscore(leverage, used, group) + _zscore(pooled, used, group)
    if group is not None:
        scores = scores.repeat_interleave(group, dim=-2)
    scores = scores.to(q.dtype)
    return finish(scores.masked_fill(~middle, 0.0), context, keep=sinks)


REGISTRATION = dict(score=compactor_scores, target="softmax", features=FEATURES, randomized=True,
                    inputs=("rope_base",), draws=sketch_draws)
"""The keyword arguments of this policy's registration: ``register("compactor", **REGISTRATION)``.
``inputs``: the options the caller must supply -- ``keys_pre_rope`` (or ``rope_base``/``rope_frequencies``
to rotate ``k`` back); missing, the scorer raises a one-line error naming it."""

COMPACTOR = cache_policy("compactor", **REGISTRATION)
"""The built-in method 'compactor': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"compactor": COMPACTOR.function}  # doctest skips a MethodSpec: run its function's examples

