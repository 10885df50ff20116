r"""One patched layer: from what transformers hands an attention function to one call of the method.

transformers calls the attention function with ``query (S, H, n_q, p)``, ``key (S, H_kv, m, p)``, ``value
(S, H_kv, m, p_v)`` (RoPE applied, key/value heads before grouped-query repetition), the 4-d mask its mask
builder made (``(S, 1, n_q, m)`` bool, or ``None`` when causality alone or nothing is masked), and the
module's ``scaling``; it expects ``(S, n_q, H, p_v)`` back. A :class:`PatchedLayer` converts the inputs to
approxlab's conventions (:func:`~approxlab.data.capture.query_factor`,
:func:`~approxlab.data.capture.repeat_kv_heads`), reads the padding out of the mask, runs the method and
records what it did.
"""

from __future__ import annotations

import torch

from ..attention import approximate, exact_attention
from ..cache import kv_cache_attention
from ..data.capture import check_call, query_factor, repeat_kv_heads
from ..kernels import causal_mask
from .decoding import DecodingCache
from .records import LayerCall, attention_measures


def kv_cache_call(method, q, k, v, *, context_length, num_features, generator, grouping="kv-head", allocation=None,
                  alpha_safeguard=None, **options):
    """The KV-cache setting's one call: :func:`approxlab.kv_cache_attention` on the layer's window so far (``k, v``
    per KV head), with the layer's own ``num_features``."""
    return kv_cache_attention(method, q, k, v, context_length=context_length, num_features=num_features,
                              generator=generator, grouping=grouping, allocation=allocation,
                              alpha_safeguard=alpha_safeguard, **options)


def check_layer_call(module, layout, layer: int, kwargs: dict) -> None:
    """What transformers passes agrees with the module's layout (:func:`~approxlab.data.capture.check_call`) and
    asks for no attention dropout, which approxlab's attention does not apply."""
    check_call(module, layout, kwargs)
    if kwargs.get("dropout"):
        raise RuntimeError(f"layer {layer} asked for attention dropout {kwargs['dropout']}, which patched "
                           "attention does not apply: call model.eval() before the forward pass.")


def padding_mask(attention_mask, n_q: int, m: int, causal: bool, layer: int):
    """The keys' padding ``(S, h, m)`` bool (True: attend) read from a 4-d attention mask, or None.

    The mask must be padding (and causality for a causal layer) and nothing else. For a causal layer,
    padding after every sequence's tokens (right padding) gives ``None`` too: no row of a real token
    ever sees a key after it. Padding before the tokens is refused there (the causal methods take no
    key mask).
    """
    if attention_mask is None:
        return None
    mask = attention_mask
    if mask.dtype != torch.bool:  # an additive float mask: 0 where attended, the dtype's minimum elsewhere
        mask = mask > torch.finfo(mask.dtype).min / 2
    if mask.ndim != 4 or tuple(mask.shape[-2:]) != (n_q, m):
        raise RuntimeError(f"layer {layer} received an attention mask of shape {tuple(mask.shape)}; patched "
                           f"attention reads padding from a 4-d mask (S, 1, {n_q}, {m}).")
    keys = mask.any(dim=-2)
    expected = keys.unsqueeze(-2)
    if causal:
        expected = expected & causal_mask(n_q, m, row_offset=m - n_q, device=mask.device)
    real_rows = keys[..., m - n_q:].unsqueeze(-1)  # a padded query's row is never used
    if bool(((mask != expected) & real_rows).any()):
        raise ValueError(f"the attention mask of layer {layer} must be a padding mask (with causality in a "
                         "causal model): patched attention passes padding to the method as `key_mask`; got a "
                         "mask that hides other keys too (packed sequences, a sliding window or a custom mask).")
    if bool(keys.all()):
        return None
    if causal:
        if bool((keys.int().cummin(dim=-1).values.bool() == keys).all()):
            return None
        raise ValueError("`attention_mask` of a causal model must pad after the tokens (right padding) in patched "
                         "layers: approxlab's causal methods take no key mask, and a causal row never sees a key "
                         f"after it; got padding before or between the tokens in layer {layer}.")
    return keys


class PatchedLayer:
    """A layer's share of a patch: its method call, its random stream and its records."""

    def __init__(self, patch, layer: int, layout, generator: torch.Generator):
        self.patch = patch
        self.layer = layer
        self.layout = layout
        self.factor = query_factor(layout)
        self.generator = generator
        self.runs = 0
        self.queries = None  # the KV-cache setting: this layer's queries of the current sequence so far
        own = {name: value.to(patch.compute_dtype) for name, value in patch.layer_options.get(layer, {}).items()}
        self.options = {**patch.options, **own}  # the patch's options and what this layer supplies
        self.decoding = None if getattr(patch, "decoding_interval", None) is None else DecodingCache(
            patch.method, patch.budgets[layer], patch.decoding_interval, patch.grouping, generator, self.options)

    def _inputs(self, query, key, value):
        """``q`` rescaled, ``k, v`` per KV head, in the compute dtype."""
        dtype = self.patch.compute_dtype
        q = query.to(dtype)
        return q if self.factor is None else q * self.factor, key.to(dtype), value.to(dtype)

    def __call__(self, module, query, key, value, attention_mask, kwargs: dict):
        check_layer_call(module, self.layout, self.layer, kwargs)
        n_q, m = query.shape[-2], key.shape[-2]
        key_mask = padding_mask(attention_mask, n_q, m, self.layout.causal, self.layer)
        q, k, v = self._inputs(query, key, value)
        if self.patch.context_length is None:
            heads = q.shape[-3]
            output = self._whole_window(q, repeat_kv_heads(k, heads), repeat_kv_heads(v, heads), key_mask)
        else:
            output = self._kv_cache(q, k, v)
        return output.to(query.dtype).transpose(1, 2).contiguous(), None

    def _record(self, result, rows, q, k, v, key_mask, output) -> None:
        patch = self.patch
        keep = patch.record_inputs
        info = {name: value.detach() if isinstance(value, torch.Tensor) else value
                for name, value in result.info.items()}
        patch.calls.append(LayerCall(
            layer=self.layer, call=self.runs, rows=rows, info=info, causal=patch.causal,
            inputs=tuple(x.detach() for x in (q, k, v)) if keep else None,
            output=output.detach() if keep else None, key_mask=key_mask,
            attention=attention_measures(result, q, k, rows, patch.causal, key_mask)
            if patch.record_attention else None,
        ))
        self.runs += 1

    def _whole_window(self, q, k, v, key_mask):
        patch = self.patch
        n_q, m = q.shape[-2], k.shape[-2]
        if n_q != m:
            raise RuntimeError(
                f"layer {self.layer} received {n_q} queries and {m} keys (a cache holding earlier tokens): "
                "patched attention runs on a whole window in one forward pass; for a continuation processed "
                "with the cache, use the KV-cache setting, patch_attention(..., context_length=...)."
            )
        result = approximate(patch.method, q, k, v, num_features=patch.num_features, generator=self.generator,
                             key_mask=key_mask, causal=patch.causal, **self.options)
        self._record(result, (0, n_q), q, k, v, key_mask, result.output)
        return result.output

    def _kv_cache(self, q, k, v, context_rows: bool = True):
        r"""Rows ``start = m - n_q`` to ``m`` of the KV-cache setting: context rows (before ``n_c``) exact, the
        continuation's from the method on this layer's whole window so far (queries recorded call by call);
        ``k, v`` per KV head, compressed per KV head or per query head as ``patch.grouping`` says. Without
        ``context_rows`` (a replay, which reads only the records) the context's exact rows are not computed."""
        patch = self.patch
        n_q, m = q.shape[-2], k.shape[-2]
        start = m - n_q
        seen = 0 if start == 0 or self.queries is None else self.queries.shape[-2]
        if seen != start:
            raise RuntimeError(f"layer {self.layer}'s cache holds {start} earlier tokens, but this layer computed "
                               f"{seen} queries of the sequence so far: run the context and the continuation "
                               "through one cache, inside one patch_attention block.")
        q_all = q if start == 0 else torch.cat([self.queries, q], dim=-2)
        self.queries = q_all
        if start == 0 and self.decoding is not None:
            self.decoding.reset()  # a new sequence
        context = patch.context_length
        heads = q.shape[-3]
        k_heads, v_heads = repeat_kv_heads(k, heads), repeat_kv_heads(v, heads)
        parts = []
        if start < context and context_rows:
            stop = min(m, context)
            parts.append(exact_attention(q_all[..., :stop, :], k_heads[..., :stop, :], v_heads[..., :stop, :],
                                         causal=True)[..., start:, :])
        if m > context:
            first = max(start, context)
            # The KV-cache setting: the method compresses the context's keys and values (per layer and
            # head, from what it could see at compression time) and the continuation attends to them.
            if self.decoding is not None:  # compressed again every decoding_interval tokens (.decoding)
                result = self.decoding.rows(q_all, k, v, context, first)
                rows = result.output
            else:
                result = kv_cache_call(patch.method, q_all, k, v, context_length=context,
                                       num_features=patch.budgets[self.layer], generator=self.generator,
                                       grouping=patch.grouping, allocation=patch.allocation,
                                       alpha_safeguard=patch.alpha_safeguard, **self.options)
                rows = result.output[..., first - context:, :]
            parts.append(rows)
            self._record(result, (first, m), q_all, k_heads, v_heads, None, rows)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2) if parts else None
