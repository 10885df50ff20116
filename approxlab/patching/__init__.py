"""Approximations inside a real model: patch the attention of a transformers model and see what it costs.

- :func:`patch_attention` (:mod:`approxlab.patching.patch`): a context manager inside which chosen layers
  of a model compute their attention with :func:`approxlab.approximate` on their own q, k, v, in the
  whole-window or the KV-cache setting; :class:`AttentionPatch`, its handle, keeps what each run reported.
- :class:`LayerCall`, :func:`output_errors` (:mod:`approxlab.patching.records`): one run's record, and the
  relative spectral, Frobenius and worst-query errors of a layer's output against exact attention on the
  same inputs.
- :func:`exact_prefill` (:mod:`approxlab.patching.prefill`): the KV-cache setting at long context, one exact
  prefill shared by every policy and budget; :meth:`ExactPrefill.continue_with` compresses its cache and runs a
  continuation (per-token NLL, greedy answer, per-layer errors on clean and on patched inputs).
- :func:`replay` (:mod:`approxlab.patching.replaying`): a patch's layers on recorded inputs (the unpatched model's,
  from :func:`exact_prefill`) without a model run: each layer's error on clean inputs.
- :func:`sweep_policies` (:mod:`approxlab.patching.sweep`): every cache policy and compression ratio on one
  sequence over one shared prefill, one tidy row each (exact match, answer log-probability, key-token change).
- :func:`sweep_methods` (:mod:`approxlab.patching.whole_sweep`): the whole-sequence setting on one sequence, each
  method that is not a cache policy replacing every layer over all tokens, with the same rows as
  :func:`sweep_policies` (the unpatched reference, key tokens and clean inputs shared).
- :func:`key_tokens` (:mod:`approxlab.patching.key_tokens`): LongPPL's key tokens, those whose prediction needs
  distant context, and the change in NLL on them (:meth:`KeyTokens.delta`).
- :class:`~approxlab.patching.decoding.DecodingCache` (:mod:`approxlab.patching.decoding`): decoding-time
  compression, ``patch_attention(..., decoding_interval=k)``: the cache compressed back to the budget every ``k``
  tokens after the context (kvpress's ``DecodingPress``).
- :func:`~approxlab.patching.prefix.layer_inputs`, :func:`~approxlab.patching.prefix.token_nll_from`
  (:mod:`approxlab.patching.prefix`): with one layer K patched, the unpatched hidden states entering K captured
  once and only layers K .. run from them (the prefix shared by every method and budget).
- :func:`token_nll` (:mod:`approxlab.patching.likelihood`): per-token negative log-likelihood of a causal
  language model, in float64: the change in log-perplexity a patch causes.

Typical use::

    import approxlab
    from approxlab.patching import token_nll

    before = token_nll(model, ids)
    with approxlab.patch_attention(model, "performer", layers=[15], num_features=64,
                                   record_inputs=True) as patch:
        after = token_nll(model, ids)
    float(after.mean() - before.mean())   # change in log-perplexity, nats per token
    patch.errors()                        # the layer's relative errors, per sequence and head
"""

from .continuation import ERROR_INPUTS, Continuation
from .key_tokens import KeyTokens, key_tokens
from .likelihood import token_nll
from .patch import AttentionPatch, patch_attention
from .prefill import ExactPrefill, exact_prefill
from .records import ERROR_MEASURES, LayerCall, output_errors
from .replaying import replay
from .sweep import sweep_policies
from .whole_sweep import WholeSequence, sweep_methods

__all__ = ["patch_attention", "AttentionPatch", "LayerCall", "output_errors", "ERROR_MEASURES", "token_nll",
           "exact_prefill", "ExactPrefill", "Continuation", "ERROR_INPUTS", "key_tokens", "KeyTokens", "replay",
           "sweep_policies", "sweep_methods", "WholeSequence"]
