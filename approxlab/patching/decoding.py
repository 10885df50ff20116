r"""Decoding-time compression: a layer's cache compressed again every ``k`` generated tokens (kvpress's
``DecodingPress``), for :func:`approxlab.patch_attention`'s ``decoding_interval``.

After the context (``context_length`` tokens) the cache is compressed to the budget :math:`b` by the policy, as in the
KV-cache setting. Every token after it joins the cache; when :math:`k` tokens have joined since the last compression,
the cache -- the :math:`b` tokens kept and those :math:`k` -- is compressed to :math:`b` again by the same policy,
scored as a context of its own (its tokens' queries, keys and values in position order), before the next token is
attended. A row therefore attends at most :math:`b + k` keys (itself included), and the cache never holds more.

kvpress's ``DecodingPress(base_press, compression_interval=k, target_size=b)`` counts the decoding steps of each
layer and, after the step that makes the count :math:`k`, compresses the cache (prompt included) to ``target_size``
with its scorer press, the queries taken from the hidden states of the last steps (a buffer of up to 256). The
differences: kvpress leaves the prompt whole until the first decoding compression (``PrefillDecodingPress`` compresses
it first, as here); here the scorer sees the queries of every cached token (kvpress: of the buffered steps); the
cache is simulated by masking, as in the KV-cache setting (no memory is saved).

**H2O while decoding.** With ``h2o`` and :math:`k = 1` the cache loses one token per generated token, as H2O's
(Zhang et al., 2023) decode-time eviction does, and its heavy hitters are the largest column sums of attention. They
are not H2O's accumulated scores: H2O adds each step's attention to running sums that keep the attention paid by
queries whose tokens were since evicted; here the sums are recomputed at each compression from the cached tokens'
own queries (causal rows among the cache), which needs no state besides the kept positions.
"""

from __future__ import annotations

import torch

from ..cache import kv_cache_attention
from ..cache._selection import attend_compressed_rows
from ..methods._base import Approximation

__all__ = ["DecodingCache"]


def _gather(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rows ``positions`` ``(S, h, c)`` of ``x`` ``(S, h, m, d)`` per head."""
    return torch.gather(x, -2, positions.unsqueeze(-1).expand(*positions.shape, x.shape[-1]))


def _no_operator():
    raise NotImplementedError("decoding-time compression forms no attention matrix: its rows attend caches that "
                              "change every decoding_interval tokens.")


class DecodingCache:
    """One layer's cache under decoding-time compression: the positions kept per head at the last compression
    (``kept``, ``(S, heads, c)``, increasing) and the position it happened before (``mark``).

    ``heads`` are the KV heads with ``grouping="kv-head"`` (one cache per KV head, as a decoder holds it), the query
    heads with ``"query-head"``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.patching.decoding import DecodingCache
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 4, 40, 8, generator=g, dtype=torch.float64)  # 4 query heads ...
    >>> k, v = (torch.randn(1, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(2))  # ... on 2 KV heads
    >>> cache = DecodingCache("h2o", budget=8, interval=4, grouping="kv-head", generator=None, options={})
    >>> rows = cache.rows(q, k, v, context=16, first=16)  # rows 16..39: compressed at 16, 20, ..., 36
    >>> rows.output.shape, rows.info["largest_cache"], rows.info["compressed_at"], cache.kept.shape
    (torch.Size([1, 4, 24, 8]), 12, 36, torch.Size([1, 2, 8]))
    """

    def __init__(self, method: str, budget: int, interval: int, grouping: str, generator, options: dict):
        self.method, self.budget, self.interval = method, budget, interval
        self.grouping, self.generator, self.options = grouping, generator, options
        self.kept = None
        self.mark = None
        self.largest = 0  # the most keys any row attended so far (the cache plus the row itself)

    def reset(self) -> None:
        """A new sequence: nothing cached."""
        self.kept, self.mark, self.largest = None, None, 0

    def rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, first: int) -> Approximation:
        """Rows ``first .. m - 1`` (all after the context) of ``q`` ``(S, H, m, p)`` against ``k, v`` ``(S, H_kv, m,
        *)``, compressing the cache whenever ``interval`` tokens joined it; ``info`` holds the kept positions."""
        m, heads = k.shape[-2], q.shape[-3]
        if self.grouping == "query-head" and k.shape[-3] != heads:
            k, v = (x.repeat_interleave(heads // x.shape[-3], dim=-3) for x in (k, v))
        groups = heads // k.shape[-3]
        parts, t = [], first
        while t < m:
            compress = self.mark is None or t >= self.mark + self.interval
            held = self._held(k, context, t)
            stop = min(m, t + self.interval) if compress else min(m, self.mark + self.interval)
            window = torch.cat([held, self._span(k, t, stop)], dim=-1)
            queries = _gather(q, window.repeat_interleave(groups, dim=-2))
            keys, values = _gather(k, window), _gather(v, window)
            if compress:
                result = kv_cache_attention(self.method, queries, keys, values, context_length=held.shape[-1],
                                            num_features=min(self.budget, held.shape[-1]), generator=self.generator,
                                            grouping=self.grouping, **self.options)
                self.kept = torch.gather(held, -1, result.info["kept"]).sort(-1).values
                self.mark = t
                parts.append(result.output)
                self.largest = max(self.largest, self.kept.shape[-1] + stop - t)
            else:
                keys, values = (x.repeat_interleave(groups, dim=-3) for x in (keys, values))
                cached = torch.arange(held.shape[-1], device=k.device).expand(*queries.shape[:-2], held.shape[-1])
                parts.append(attend_compressed_rows(queries[..., held.shape[-1]:, :], keys, values, cached,
                                                    held.shape[-1], None))  # every cached token, then causally
                self.largest = max(self.largest, window.shape[-1])
            t = stop
        output = torch.cat(parts, dim=-2)
        info = {"kept_positions": self.kept, "compressed_at": self.mark, "largest_cache": self.largest,
                "decoding_interval": self.interval, "num_features": self.budget}
        return Approximation(self.method, "softmax", output, _no_operator, info)

    def _held(self, k: torch.Tensor, context: int, t: int) -> torch.Tensor:
        """What the cache holds before row ``t``: the context (nothing compressed yet), or the tokens kept at the
        last compression and those that joined since."""
        if self.mark is None:
            return self._span(k, 0, context)
        return torch.cat([self.kept, self._span(k, self.mark, t)], dim=-1)

    @staticmethod
    def _span(k: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Positions ``start .. stop - 1`` for every sequence and head of ``k``, ``(S, h, stop - start)``."""
        return torch.arange(start, stop, device=k.device).expand(*k.shape[:-2], stop - start)
