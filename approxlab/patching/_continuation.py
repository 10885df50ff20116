"""The layers of a continuation on an exact prefill (:mod:`approxlab.patching.prefill`): the handlers that take a
layer's attention over while a continuation runs, and the rows they read from a compressed cache."""

from __future__ import annotations

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
        self.kept_keys = self.kept_values = None  # (S, H, b, p): the kept set per query head, without a key mask
        self.first = None  # the teacher-forced call's (continuation queries, k, v per KV head, output rows or None)
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
        if self.first is None:
            self.first = (self.queries, k, v, rows)
        return output

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
            if key_mask is None:  # the kept keys and values per query head, gathered once for the generated rows
                def gather(x):
                    x = x.repeat_interleave(indices.shape[-2] // x.shape[-3], dim=-3)
                    return torch.gather(x, -2, indices.unsqueeze(-1).expand(*indices.shape, x.shape[-1]))

                self.kept_keys, self.kept_values = gather(k[..., :context, :]), gather(v[..., :context, :])
        return result.output

    def _step_row(self, q, k, v):
        """The one new row ``(S, H, 1, p_v)`` of a generated token: the kept keys and every continuation key so far
        (itself the last), the rows before it not computed again; :func:`_read_cache`'s last row, to rounding."""
        context, heads = self.prefill.context_length, q.shape[-3]
        keys = torch.cat([self.kept_keys, k[..., context:, :].repeat_interleave(heads // k.shape[-3], dim=-3)], dim=-2)
        values = torch.cat([self.kept_values, v[..., context:, :].repeat_interleave(heads // v.shape[-3], dim=-3)],
                           dim=-2)
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values)

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
