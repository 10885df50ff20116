"""The layers of a continuation on an exact prefill (:mod:`approxlab.patching.prefill`): the handlers that take a
layer's attention over while a continuation runs, and the rows they read from a compressed cache."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..data.capture import check_call, query_factor
from ..kernels import causal_mask
from ..cache._grouping import kept_for_query_heads
from ..cache._selection import attend_compressed_rows
from ._layer import check_layer_call, kv_cache_call, padding_mask
from .decoding import DecodingCache

def _exact_rows(queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r"""Exact causal attention of the continuation's queries ``(S, H, t, p)`` (positions :math:`m - t, \dots, m - 1`)
    over the window's keys and values per KV head ``(S, H_kv, m, p)``, in float64: :math:`O(t\,m\,p)` work, not
    the :math:`m^2` of the whole window."""
    t, m = queries.shape[-2], k.shape[-2]
    visible = causal_mask(t, m, row_offset=m - t, device=queries.device)
    return torch.nn.functional.scaled_dot_product_attention(
        queries.to(torch.float64), k.to(torch.float64), v.to(torch.float64), attn_mask=visible,
        enable_gqa=queries.shape[-3] != k.shape[-3])


def _read_cache(queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor,
                context_length: int) -> torch.Tensor:
    """The continuation's rows ``(S, H, t, p_v)`` from the compressed cache: ``queries`` ``(S, H, t, p)`` every
    continuation query so far, ``k, v`` per KV head over the window, ``kept`` as ``info["kept"]`` of
    :func:`approxlab.kv_cache_attention`; the query heads of a KV head read it as views (no repeated K/V)."""
    heads, kv_heads = queries.shape[-3], k.shape[-3]
    indices, key_mask = kept_for_query_heads(kept, heads, k.shape[-2])
    def split(x, dim):  # the query heads (dimension dim) as (H_kv, g)
        return x.unflatten(dim, (kv_heads, heads // kv_heads))

    rows = attend_compressed_rows(split(queries, -3), k.unsqueeze(-3), v.unsqueeze(-3), split(indices, -2),
                                  context_length, None if key_mask is None else split(key_mask, -2))
    return rows.flatten(-4, -3)


class _Layer:
    """One layer's attention during a continuation: SDPA on the exact cache (unpatched), or the policy."""

    def __init__(self, prefill, layer: int, policy=None, generator=None):
        self.prefill, self.layer, self.policy, self.generator = prefill, layer, policy, generator
        self.layout = prefill._target.layouts[layer]
        self.factor = query_factor(self.layout)
        self.queries = None  # the continuation's queries so far (S, H, T, p)
        self.kept = None  # the compressed cache, once compressed: info["kept"] of kv_cache_attention
        self.kept_keys = self.kept_values = None  # (S, H or H_kv, b, p): the kept set (without a key mask) per head
        self.first = None  # the teacher-forced call's (continuation queries, k, v of the continuation, rows or None)
        self.decoding = None if policy is None or policy.decoding is None else decoding_cache(policy, layer, generator)
        self.done = 0  # continuation rows the decoding cache has computed

    def __call__(self, module, query, key, value, attention_mask, kwargs: dict):
        n_q, m = query.shape[-2], key.shape[-2]
        check_layer_call(module, self.layout, self.layer, kwargs)
        padding_mask(attention_mask, n_q, m, True, self.layer)  # causality only (refuses anything else)
        dtype = self.prefill.compute_dtype
        q = query.to(dtype) if self.factor is None else query.to(dtype) * self.factor
        k, v = key.to(dtype), value.to(dtype)
        seen = m - n_q - self.prefill.context_length  # continuation tokens already in the cache
        self.queries = q if seen == 0 else torch.cat([self.queries[..., :seen, :], q], dim=-2)
        if self.policy is None:
            output, rows = _sdpa(module, query, key, value, attention_mask, kwargs), None
        else:
            if self.decoding is not None:
                rows = self._decoding_rows(k, v, seen)
            elif n_q == 1 and self.kept_keys is not None:  # a generated token: one row on the kept keys
                rows = self._step_row(q, k, v)
            else:
                rows = self._policy_rows(k, v)[..., seen:, :]
            output = (rows.to(query.dtype).transpose(1, 2).contiguous(), None)
        if self.first is None:  # the continuation's keys copied off a reserved cache (later tokens overwrite them)
            context = self.prefill.context_length
            self.first = (self.queries, k[..., context:, :].clone(), v[..., context:, :].clone(), rows)
        return output

    def first_window(self) -> tuple:
        """The teacher-forced call's continuation queries ``(S, H, t, p)`` and the window's keys and values per KV
        head ``(S, H_kv, n_c + t, p)``: the prefill's context (the same in every copy of the cache), then the
        continuation's own."""
        queries, k, v, _ = self.first
        layer = self.layer
        return (queries, torch.cat([self.prefill.keys[layer].expand(k.shape[0], -1, -1, -1), k], dim=-2),
                torch.cat([self.prefill.values[layer].expand(v.shape[0], -1, -1, -1), v], dim=-2))

    def _policy_rows(self, k, v):
        """Every continuation row so far from the compressed cache: compressed on the first call (by
        :func:`approxlab.kv_cache_attention` on the window, exactly as a patched layer does), read again later."""
        policy, context = self.policy, self.prefill.context_length
        if self.kept is not None:
            return _read_cache(self.queries, k, v, self.kept, context)
        window = torch.cat([self.prefill.queries[self.layer], self.queries], dim=-2)
        result = kv_cache_call(policy.method, window, k, v, context_length=context,
                               num_features=policy.budgets[self.layer], generator=self.generator, **policy.options)
        if result.info.get("setting") == "compressed":
            self.kept = result.info["kept"]
            indices, key_mask = kept_for_query_heads(self.kept, self.queries.shape[-3], k.shape[-2])
            if key_mask is None:  # the kept keys and values, gathered once for the generated rows
                if self.kept.dtype != torch.bool and self.kept.shape[-2] == k.shape[-3]:
                    indices = self.kept  # one set per KV head: kept per KV head (1/g of the memory)

                def gather(x):
                    x = x.repeat_interleave(indices.shape[-2] // x.shape[-3], dim=-3)
                    return torch.gather(x, -2, indices.unsqueeze(-1).expand(*indices.shape, x.shape[-1]))

                self.kept_keys, self.kept_values = gather(k[..., :context, :]), gather(v[..., :context, :])
        return result.output

    def _step_row(self, q, k, v):
        """The one new row ``(S, H, 1, p_v)`` of a generated token: the kept keys and every continuation key so far
        (itself the last), the rows before it not computed again; :func:`_read_cache`'s last row, to rounding."""
        context, heads, kept = self.prefill.context_length, q.shape[-3], self.kept_keys.shape[-3]

        def window(held, x):  # the kept set and the continuation's tokens, per query head
            x = torch.cat([held, x[..., context:, :].repeat_interleave(kept // x.shape[-3], dim=-3)], dim=-2)
            return x.repeat_interleave(heads // kept, dim=-3) if heads > kept else x

        return torch.nn.functional.scaled_dot_product_attention(q, window(self.kept_keys, k),
                                                                window(self.kept_values, v))

    def _decoding_rows(self, k, v, seen: int):
        """The new rows under decoding-time compression (:class:`~approxlab.patching.decoding.DecodingCache`). When
        the cache was cut back (the answer generated after the teacher-forced pass), its compressions are replayed
        from the context up to the rows asked: they fall at the same positions, so the rows are those of one pass."""
        context = self.prefill.context_length
        window = torch.cat([self.prefill.queries[self.layer], self.queries], dim=-2)
        first = context + seen
        if seen != self.done:
            self.decoding.reset()
            first = context
        rows = self.decoding.rows(window, k, v, context, first).output
        self.done = self.queries.shape[-2]
        return rows[..., rows.shape[-2] - (self.done - seen):, :]


def decoding_cache(policy, layer: int, generator) -> DecodingCache:
    """A layer's :class:`~approxlab.patching.decoding.DecodingCache` for a policy compressed again every
    ``policy.decoding`` tokens (its budget options stripped: the cache keeps the layer's budget per head)."""
    options = {key: value for key, value in policy.options.items()
               if key not in ("grouping", "allocation", "alpha_safeguard")}
    return DecodingCache(policy.method, policy.budgets[layer], policy.decoding, policy.options["grouping"], generator,
                         options)


class _Together:
    """One layer's attention for a batch of ``copies`` policies (:meth:`ExactPrefill.continue_together`): batch row
    ``s * copies + c`` is handed to handler ``c`` (a :class:`_Layer`), and their outputs are put back in order."""

    def __init__(self, handlers, copies: int):
        self.handlers, self.copies = handlers, copies

    def __call__(self, module, query, key, value, attention_mask, kwargs: dict):
        copies, outputs = self.copies, []
        for index, handler in enumerate(self.handlers):
            rows = slice(index, None, copies)
            mask = attention_mask if attention_mask is None or attention_mask.shape[0] == 1 else attention_mask[rows]
            outputs.append(handler(module, query[rows], key[rows], value[rows], mask, kwargs)[0])
        return torch.stack(outputs, dim=1).flatten(0, 1), None


def _sdpa(module, query, key, value, attention_mask, kwargs):
    """The unpatched layer: transformers' SDPA attention, as ``attn_implementation="sdpa"`` runs it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@dataclass
class _Policy:
    method: str
    budgets: dict
    options: dict
    seeds: dict
    decoding: int | None = None  # tokens between two compressions after the context (None: the context's only)


class _Recorder:
    """A layer's attention during the prefill: SDPA (the unpatched model), the context's q, k, v kept."""

    def __init__(self, layout, dtype):
        self.layout, self.factor, self.dtype = layout, query_factor(layout), dtype
        self.queries = self.first_keys = self.first_values = None

    def __call__(self, module, query, key, value, attention_mask, kwargs: dict):
        check_call(module, self.layout, kwargs)
        q = query.detach().to(self.dtype)
        self.queries = q if self.factor is None else q * self.factor
        self.first_keys, self.first_values = key.detach().to(self.dtype), value.detach().to(self.dtype)
        return _sdpa(module, query, key, value, attention_mask, kwargs)


_REQUEST_OPTIONS = ("layers", "generator", "grouping", "allocation", "alpha_safeguard", "layer_budgets",
                    "pyramid_beta", "decoding_interval")


@dataclass
class _Prepared:
    method: str
    num_features: int
    chosen: tuple
    policy: _Policy
    handlers: dict
    original: dict  # continue_with's arguments, to run the policy alone


def _originals(prepared) -> list[dict]:
    return [dict(one.original) for one in prepared]


def _cut(cache, length: int) -> None:
    """The cache cut back to its first ``length`` tokens, layer by layer (a pass that failed part-way leaves the
    layers it reached longer than the others; transformers' ``crop`` removes a count from each)."""
    for held in cache.layers:
        extra = held.keys.shape[-2] - length if held.is_initialized else 0
        if extra > 0:
            held.crop(-extra)


def _copied(cache, copies: int, config):
    """A new ``DynamicCache`` holding each sequence of ``cache`` ``copies`` times (row ``s * copies + c``)."""
    from transformers import DynamicCache

    copied = DynamicCache(config=config)
    for layer, held in enumerate(cache.layers):
        copied.update(held.keys.repeat_interleave(copies, dim=0), held.values.repeat_interleave(copies, dim=0), layer)
    return copied


def reserved(cache, copies: int, capacity: int, config):
    """A cache holding each sequence of ``cache`` ``copies`` times (row ``s * copies + c``) in buffers of
    ``capacity`` tokens reserved up front (:func:`_reserved_layer`): a continuation's tokens are written in place,
    not concatenated onto the whole cache at every step. A model whose cache has other layers than transformers'
    plain ``DynamicLayer`` (a sliding window) gets :func:`_copied` (or ``cache`` itself for one copy)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if not all(type(held) is DynamicLayer and held.is_initialized for held in cache.layers):
        return cache if copies == 1 else _copied(cache, copies, config)
    copied = DynamicCache(config=config)
    layer = _reserved_layer()
    copied.layers = [layer(held.keys.repeat_interleave(copies, dim=0), held.values.repeat_interleave(copies, dim=0),
                           capacity) for held in cache.layers]
    return copied


def first_copies(cache, copies: int, config):
    """The first ``copies`` rows of a :func:`reserved` cache of one sequence, in the same buffers (no copy): the
    context's tokens are the same in every row and never overwritten, so a continuation of fewer copies writes its
    tokens after them in place; ``None`` for a cache of other layers."""
    from transformers import DynamicCache

    layer = _reserved_layer()
    if not all(type(held) is layer for held in cache.layers):
        return None
    narrowed = DynamicCache(config=config)
    narrowed.layers = [layer.sharing(held, copies) for held in cache.layers]
    return narrowed


@functools.cache
def _reserved_layer():
    """The class of a :func:`reserved` cache's layers (made on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class Reserved(DynamicLayer):
        """transformers' ``DynamicLayer`` over buffers of ``capacity`` tokens: ``keys`` and ``values`` are views
        of the buffers' first tokens; ``update`` writes the new tokens after them (a longer update moves the
        buffers to twice the size), and ``crop`` shortens the views. A view handed out earlier sees the tokens
        written later at its positions: a reader that keeps keys past the step copies them."""

        def __init__(self, keys, values, capacity: int):
            super().__init__()
            self.device, self.is_initialized = keys.device, True
            size = max(capacity, keys.shape[-2])
            self._buffers = [x.new_empty(*x.shape[:-2], size, x.shape[-1]) for x in (keys, values)]
            self._write(keys, values, 0)

        @classmethod
        def sharing(cls, other, rows: int):
            """A layer over the first ``rows`` rows of ``other``'s buffers, as long as ``other`` now is."""
            layer = cls.__new__(cls)
            DynamicLayer.__init__(layer)
            layer.device, layer.is_initialized = other.device, True
            layer._buffers = [buffer[:rows] for buffer in other._buffers]
            layer.keys, layer.values = (b[..., :other.keys.shape[-2], :] for b in layer._buffers)
            return layer

        def _write(self, keys, values, start: int) -> None:
            stop = start + keys.shape[-2]
            if stop > self._buffers[0].shape[-2]:  # moved to buffers twice as long (or as long as needed)
                size = max(stop, 2 * self._buffers[0].shape[-2])
                grown = [b.new_empty(*b.shape[:-2], size, b.shape[-1]) for b in self._buffers]
                for old, new in zip(self._buffers, grown):
                    new[..., :start, :] = old[..., :start, :]
                self._buffers = grown
            for buffer, new in zip(self._buffers, (keys, values)):
                buffer[..., start:stop, :] = new
            self.keys, self.values = (b[..., :stop, :] for b in self._buffers)

        def update(self, key_states, value_states, *args, **kwargs):
            self._write(key_states, value_states, self.keys.shape[-2])
            return self.keys, self.values

    return Reserved
