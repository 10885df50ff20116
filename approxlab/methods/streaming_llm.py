r"""StreamingLLM (Xiao et al., ICLR 2024): attention sinks plus a window of recent tokens.

A causal-only method: row :math:`i` sees what ``StartRecentKVCache(start_size, recent_size)`` holds
when token :math:`i` is decoded -- the first ``sinks`` tokens and the most recent ones, itself included.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int
from ._base import CAUSAL_ONLY, method
from ._masking import check_key_mask
from ..cache._scores import top_budget
from ._selection import attend_selected, real_ranks, selected_weights, sparse_approximation

__all__ = ["streaming_llm", "STREAMING_LLM", "compress_streaming_llm", "score_streaming_llm", "DEFAULT_SINKS"]

DEFAULT_SINKS = 4
"""``start_size`` of the authors' ``StartRecentKVCache`` and of the paper's experiments (Section 4)."""

_BAND_ROWS = 64
"""Queries per block of the banded form (:func:`_banded`)."""


def _ranks(q, k, key_mask):
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return real_ranks(key_mask, batch, k.shape[-2], q.device)


def score_streaming_llm(q, k, v, *, budget, generator=None, sinks=DEFAULT_SINKS, key_mask=None):
    r"""The KV-cache scores: :math:`+\infty` on the first ``min(sinks, budget)`` context tokens, the others their
    position (the most recent score highest), :math:`-\infty` on padding; ``(*batch, n_c)``. Their top ``budget``
    are the sinks and the most recent tokens; they do not depend on ``q`` and ``k``, so grouped query heads agree.

    With ``key_mask``, sinks and positions are counted among the real tokens.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((1,), 8, 4, generator=torch.Generator().manual_seed(0))
    >>> score_streaming_llm(q, k, v, budget=5, sinks=2)[0].tolist()
    [inf, inf, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    """
    sinks = check_int(sinks, "sinks", low=0)
    key_mask = check_key_mask(key_mask, k)
    ranks, _ = _ranks(q, k, key_mask)
    scores = torch.where(ranks < min(sinks, budget), math.inf, ranks.to(q.dtype))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.expand(ranks.shape), -math.inf)
    return scores


def compress_streaming_llm(q, k, v, *, budget, generator=None, sinks=DEFAULT_SINKS, key_mask=None):
    """The KV-cache compression step: the first ``min(sinks, budget)`` context tokens and the most recent
    ones, ``budget`` in all (the top of :func:`score_streaming_llm`); ``(*batch, budget)`` indices
    (:func:`approxlab.kv_cache_attention`).

    With ``key_mask``, sinks and recent tokens are counted among the real tokens; padding fills any slot
    left over (it is masked in attention).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((1,), 20, 8, generator=torch.Generator().manual_seed(0))
    >>> sorted(compress_streaming_llm(q, k, v, budget=7, sinks=4)[0].tolist())
    [0, 1, 2, 3, 17, 18, 19]
    """
    scores = score_streaming_llm(q, k, v, budget=budget, sinks=sinks, key_mask=key_mask)
    kept = torch.zeros_like(scores).scatter_(-1, top_budget(scores, budget), 1.0).masked_fill(scores == -math.inf, 0)
    return kept.topk(budget, dim=-1).indices  # the kept tokens, padding after them, in the order of earlier versions


def _banded(q, k, v, sinks: int, window: int) -> torch.Tensor:
    r"""StreamingLLM's rows without a key mask, by query blocks: rows ``r0:r1`` attend the sinks below their band
    and the band of keys ``r0 - window + 1 .. r1 - 1`` (contiguous slices, no gather), masked to each row's
    window and sinks; ``(*batch, n, p_v)``.

    Per block :math:`O(c\,(c + w + s)\,p)` for ``c`` rows, so :math:`O(n\,(c + b)\,p)` in all; the numbers are
    those of :func:`~approxlab.methods._selection.attend_selected` on the same keys up to the order of the sums
    (the softmax sums and the products with ``v`` run over the band, masked keys adding exact zeros). The mask of a
    block past the first window is built once and reused (it depends on the block's offset from its band only), and
    every row sees itself, so the softmax is torch's own: about 1.6x faster than building each block's mask and
    taking :func:`~approxlab.methods._selection.safe_softmax` (one thread, float32, 3 heads, p = 64, b = 128, CPU
    seconds: 9-10 against 15-16 ms at n = 2048, 37-42 against 63-65 ms at n = 8192).
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, p = q.shape[-2], q.shape[-1]
    rows = max(_BAND_ROWS, 1)
    outputs, hidden = [], {}  # hidden: the masks of the blocks, by (first - low, stop - first, below)
    for first in range(0, n, rows):
        stop = min(first + rows, n)
        low = max(0, first - window + 1)  # the band: keys low .. stop - 1
        below = min(sinks, low)  # sinks below the band: visible to every row of the block
        keys = torch.cat([k[..., :below, :], k[..., low:stop, :]], dim=-2) if below else k[..., low:stop, :]
        values = torch.cat([v[..., :below, :], v[..., low:stop, :]], dim=-2) if below else v[..., low:stop, :]
        logits = (q[..., first:stop, :] @ keys.transpose(-1, -2)).div_(math.sqrt(p))
        # a block's mask depends on first - low, its rows and its sinks below the band only, once no sink is in
        # the band (low >= sinks): past the first window every full block has the same one
        shape = (first - low, stop - first, below)
        mask = hidden.get(shape) if low >= sinks else None
        if mask is None:
            query = torch.arange(first, stop, device=q.device).unsqueeze(-1)
            key = torch.arange(low, stop, device=q.device)
            seen = (key <= query) & ((key > query - window) | (key < sinks))
            if below:
                seen = torch.cat([seen.new_ones(stop - first, below), seen], dim=-1)
            mask = ~seen
            if low >= sinks:
                hidden[shape] = mask
        # every row sees itself (no row all -inf): torch's softmax
        outputs.append(torch.softmax(logits.masked_fill_(mask, -math.inf), dim=-1) @ values)
    return torch.cat(outputs, dim=-2).expand(*batch, n, v.shape[-1])


@method("streaming-llm", target="softmax", features="cache size: sinks plus the most recent tokens",
        randomized=False, causal=CAUSAL_ONLY, compress=compress_streaming_llm, score=score_streaming_llm)
def streaming_llm(q, k, v, *, num_features, generator=None, sinks=DEFAULT_SINKS, key_mask=None, causal=True):
    r"""StreamingLLM's attention sinks and recent window, causal: row :math:`i` attends the first ``sinks``
    tokens and the most recent ones up to itself, ``num_features`` keys in all.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``.
    num_features : int
        The cache size ``start_size + recent_size`` of ``StartRecentKVCache``: keys per query
        (``1 <= num_features <= n``). Rows :math:`i < \text{num\_features}` see every key ``j <= i``.
    generator : torch.Generator, optional
        Unused (deterministic).
    sinks : int, default 4
        ``start_size``, the attention sinks. With ``num_features <= sinks`` the window keeps only the
        current token and the first ``num_features - 1`` tokens are the sinks.
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens: sinks and window are counted among real tokens, as if
        the padding were removed (padded keys are never attended; a padded row sees what the last real
        token before it sees).
    causal : bool, default True
        Must be True: the method is causal-only (``approximate(..., causal=True)``).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (formed on request); ``info``: ``sinks`` and ``recent`` (the window, current token included).

    Notes
    -----
    With :math:`s = \min(\text{sinks}, b - 1)` and window :math:`w = b - s` for budget :math:`b`, row
    :math:`i` attends (exact softmax) the keys

    .. math::

        S_i = \{j \le i : j < s\} \cup \{j : i - w < j \le i\}.

    This is the rolling cache with attention sinks of Section 3.2 of the paper, and the authors'
    ``StartRecentKVCache``:
    ``evict_for_space(past, 1)`` keeps the first ``start_size`` and the last ``recent_size - 1`` cached
    tokens before the new one is appended, so each decode step attends ``start_size + recent_size``
    keys, itself included (``examples/run_streaming_llama.py``).

    **Where the published code departs.** (1) ``examples/eval_long_ppl.py`` trims the cache with
    ``kv_cache(past)`` *after* each step, so each query attends ``start_size + recent_size + 1`` keys:
    that is this method with ``num_features = start_size + recent_size + 1``. (2) The paper assigns
    positions inside the cache (Section 3.2, "positional encoding within the cache", the code's
    ``pos_shift``): keys are re-rotated by their cache slot. approxlab receives Q and K with their
    positions already applied (RoPE of the original positions), so that re-rotation is not modelled;
    it changes the logits, not which tokens are kept.

    **Cost**: :math:`O(nbp)` time, memory :math:`O(\text{block}\cdot b\cdot p)`; no :math:`n\times n`
    array (the operator, when asked for, stores :math:`nb` entries). Without ``key_mask`` the rows go in blocks
    of 64 against their sinks and a contiguous band of keys (:func:`_banded`, no gathered copy per query; the
    same numbers up to the order of the sums); with one, each row's keys are gathered.

    References
    ----------
    Xiao, Tian, Chen, Han and Lewis, "Efficient streaming language models with attention sinks",
    ICLR 2024 (arXiv:2309.17453); code mit-han-lab/streaming-llm, ``streaming_llm/kv_cache.py``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("streaming-llm", q, k, v, num_features=32, causal=True)  # every key
    >>> float((approx.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("streaming-llm", q, k, v, num_features=8, causal=True)
    >>> sorted(approx.operator().columns[0, 20].tolist())  # 4 sinks, then tokens 17..20
    [0, 1, 2, 3, 17, 18, 19, 20]
    """
    if causal is not True:
        raise ValueError(f"streaming-llm is causal-only: pass causal=True; got causal={causal!r}.")
    sinks = check_int(sinks, "sinks", low=0)
    key_mask = check_key_mask(key_mask, k)
    budget = num_features
    start = min(sinks, budget - 1)
    window = budget - start
    ranks, positions = _ranks(q, k, key_mask)
    n = k.shape[-2]

    def selection(first, stop):
        current = ranks[..., first:stop].unsqueeze(-1)  # (*batch, rows, 1): rank of the latest real token
        sink_ranks = torch.arange(start, device=q.device)
        window_ranks = current - window + 1 + torch.arange(window, device=q.device)
        slot_ranks = torch.cat([sink_ranks.expand(*current.shape[:-1], start), window_ranks], dim=-1)
        valid = torch.cat([sink_ranks < current - window + 1, window_ranks >= 0], dim=-1) & (current >= 0)
        slot_ranks = torch.where(valid, slot_ranks, torch.zeros_like(slot_ranks))
        rows = positions.unsqueeze(-2).expand(*current.shape[:-1], n)
        return torch.gather(rows, -1, slot_ranks), valid

    if key_mask is None:
        output = _banded(q, k, v, start, window)
    else:
        output = attend_selected(q, k, v, selection, width=budget)
    info = {"sinks": start, "recent": window}
    record = lambda: selected_weights(q, k, v, selection, width=budget)  # noqa: E731
    return sparse_approximation("streaming-llm", output, n, record, info)


STREAMING_LLM = streaming_llm
__test__ = {"streaming_llm": streaming_llm.function}  # doctest skips a MethodSpec: run its function's examples
