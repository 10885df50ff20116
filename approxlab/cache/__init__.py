r"""The KV-cache field in one place: a policy's scores, how many tokens each head and layer keeps, the selection,
the policy builder, and the cached attention a decoder computes.

**The setting.** A window of :math:`n` tokens is a context of :math:`n_c` and a continuation. A cache policy keeps
:math:`b` context tokens per (KV) head, :math:`\mathcal K = \operatorname{top}_b(\sigma)` of its per-key scores
:math:`\sigma` (:math:`+\infty` must keep, :math:`-\infty` padding), and continuation row :math:`i \ge n_c` is

.. math::

    \tilde o_i = \sum_{j\in \mathcal K\,\cup\,\{n_c,\dots,i\}}
    \frac{e^{s_{ij}}}{\sum_{l\in \mathcal K\,\cup\,\{n_c,\dots,i\}} e^{s_{il}}}\, v_j,
    \qquad s_{ij} = q_i^\top k_j/\sqrt p .

The budget is a count :math:`b` (``num_features``) or kvpress's ratio :math:`r`, :math:`b = \max(1, \lfloor n_c
(1 - r)\rfloor)` (:func:`kept_count`). Under grouped-query attention the scores of a group's :math:`g` query heads
are averaged and one set is kept per KV head (:data:`GROUPINGS`). AdaKV (``allocation="adakv"``,
:func:`adakv_keep`) keeps the top :math:`H b` of a layer's heads jointly, each head first its own
:math:`\lfloor\alpha b\rfloor`; PyramidKV (``layer_budgets="pyramid"``, :func:`pyramid_budgets`) gives layer
:math:`l` a budget linear in :math:`l` with total :math:`L b`.

**What is where**, from the top layer down (``pyproject.toml``'s import-linter contracts name each module, so the
order below is checked)::

    above approxlab.attention (where approxlab.kv_cache was)
      _kv_cache.py           kv_cache_attention: the window and its heads, the kept sets, the continuation's rows
      _budgets.py            attend_kept, compose_scores, with_sink_and_window (any scorer, any kept set)
    beside approxlab.methods (they use the method machinery, and the policies in methods/ use them)
      _press.py              from_press, PressModule: a kvpress press registered as a policy
      _policy.py             cache_policy: a score made a whole causal-only method (the prompt compressed once)
      _column_sums.py        the attention each context key received (H2O, observed attention), shared per prefill
      _scorers.py            what the built-in scorers share: the checked context, +inf/-inf, masked statistics
      _selection.py          attend_compressed: the continuation over the kept tokens, by the fused kernel
    below approxlab.methods (they import nothing of it)
      _grouping.py           GROUPINGS, kept_for_query_heads, repeated_heads: grouped-query attention's sets
      _scores.py             a score's kept set, its checks, its pooling over a group, the model's RoPE inputs
      _allocation.py         ALLOCATIONS, LAYER_BUDGETS, adakv_keep, pyramid_budgets, kept_as_indices
      _compression_ratio.py  kept_count: kvpress's ratio as a count

The built-in policies are one file each in ``approxlab/methods/`` (``knorm.py``, ``snapkv.py``, ``h2o.py``, ...),
named in the method registry like every method, so every study, the bench and :func:`approxlab.patch_attention`
take them.

**Adding a policy** is one file of scores: a function ``score(q, k, v, *, generator=None, key_mask=None,
**options) -> (*batch, n_c)`` (higher kept) and ``cache_policy(name, score=score, features=..., randomized=...)``
in ``approxlab/methods/<name>.py`` with one line in the registry's ``BUILTINS``; or, from your own code,
``approxlab.methods.register(name, score=score, ...)``. Grouped-query pooling, AdaKV and PyramidKV then wrap it
with no code of its own, as kvpress's ``AdaKVPress`` wraps any ``ScorerPress``.

Public API (re-exported by :mod:`approxlab` and :mod:`approxlab.methods` where named there)::

    kv_cache_attention(method, q, k, v, *, context_length, num_features=None, compression_ratio=None, ...)
    kept_count(compression_ratio, context_length) -> int      # kvpress's max(1, int(n_c * (1 - ratio)))
    attend_compressed(q, k, v, kept, context_length, key_mask) # the continuation over a kept set (b per head)
    attend_kept(q, k, v, keep, *, context_length)              # ... over a bool kept set of any size per head
    adakv_keep(scores, budget, *, alpha_safeguard=0.2)         # AdaKV's kept sets across a layer's heads
    pyramid_budgets(num_layers, budget, *, beta=20, ...)       # PyramidKV's per-layer budgets
    compose_scores(scores, *, sink=0, window=0), with_sink_and_window(scorer, *, sink=0, window=0)
    kept_for_query_heads(kept, heads, n, key_mask=None)        # a cache's kept sets read by the query heads
    cache_policy(name, *, score, features, randomized, ...)    # a score -> a whole policy (a MethodSpec)
    from_press(press, *, name, ...), PressModule               # a kvpress press -> a registered policy
                                                               # (PressModule: documented in approxlab.methods)
    GROUPINGS, ALLOCATIONS, LAYER_BUDGETS

The names are imported on first use (a module ``__getattr__``): the lower modules are imported by
:mod:`approxlab.methods` itself, so this package's ``__init__`` must not import the upper ones eagerly.
"""

from __future__ import annotations

__all__ = ["kv_cache_attention", "kept_count", "attend_compressed", "attend_kept", "adakv_keep", "pyramid_budgets",
           "compose_scores", "with_sink_and_window", "kept_for_query_heads", "cache_policy", "from_press",
           "GROUPINGS", "ALLOCATIONS", "LAYER_BUDGETS"]

_WHERE = {
    "kv_cache_attention": "_kv_cache",
    "kept_count": "_compression_ratio",
    "attend_compressed": "_selection",
    "attend_kept": "_budgets",
    "compose_scores": "_budgets",
    "with_sink_and_window": "_budgets",
    "adakv_keep": "_allocation",
    "pyramid_budgets": "_allocation",
    "ALLOCATIONS": "_allocation",
    "LAYER_BUDGETS": "_allocation",
    "kept_for_query_heads": "_grouping",
    "GROUPINGS": "_grouping",
    "cache_policy": "_policy",
    "from_press": "_press",
    "PressModule": "_press",
}


def __getattr__(name: str):
    """A public name of the package, imported from its module on first use (see the module docstring)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _allocation, _budgets, _compression_ratio, _grouping, _kv_cache, _policy, _press, _selection

    modules = {"_allocation": _allocation, "_budgets": _budgets, "_compression_ratio": _compression_ratio,
               "_grouping": _grouping, "_kv_cache": _kv_cache, "_policy": _policy, "_press": _press,
               "_selection": _selection}
    value = globals()[name] = getattr(modules[_WHERE[name]], name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
