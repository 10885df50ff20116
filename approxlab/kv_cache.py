"""The KV-cache setting's earlier import path, kept: the code is in :mod:`approxlab.cache` (its docstring is the
field's map), and :func:`approxlab.kv_cache_attention` is the name to use."""

from .cache import ALLOCATIONS, GROUPINGS, kept_count, kept_for_query_heads, kv_cache_attention

__all__ = ["kv_cache_attention", "kept_count", "kept_for_query_heads", "GROUPINGS", "ALLOCATIONS"]
