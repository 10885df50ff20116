r"""Grouped-query attention in the KV-cache setting: whose heads read which keys, and one kept set per KV head.

With :math:`H` query heads reading :math:`H_{kv}` key/value heads, :math:`g = H/H_{kv}`, query head :math:`h` reads KV
head :math:`\lfloor h/g\rfloor` (transformers' ``repeat_kv``). A cache holds one kept set per KV head; the query
heads of a group attend it (:func:`kept_for_query_heads`). K/V already repeated to the query heads (as
``approxlab.data.get_qkv`` returns them by default) are recognised (:func:`repeated_heads`), and a policy that would
then keep a set per query head is warned about (:class:`~approxlab.errors.RepeatedKVWarning`).
"""

from __future__ import annotations

import warnings

import torch

from ..errors import RepeatedKVWarning
from ._allocation import kept_as_indices

__all__ = ["GROUPINGS", "group_size", "repeat_heads", "repeated_heads", "warn_if_repeated", "kept_for_query_heads"]

GROUPINGS = ("kv-head", "query-head")
"""``grouping`` with grouped-query attention: one kept set per KV head, the scores of its query heads averaged
(kvpress), or one per query head after repeating the KV heads (SnapKV's published code)."""


def group_size(q, k, v) -> int:
    """:math:`g = H / H_{kv}` for grouped-query attention (``q`` ``(*batch, H, n, p)``, ``k, v``
    ``(*batch, H_kv, n, *)``), else 1 (then :func:`~approxlab._validation.check_qkv` judges the shapes)."""
    tensors = all(isinstance(x, torch.Tensor) for x in (q, k, v))
    if not tensors or q.ndim < 3 or not (q.ndim == k.ndim == v.ndim) or q.shape[:-3] != k.shape[:-3]:
        return 1
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads == kv_heads or v.shape[:-1] != k.shape[:-1]:
        return 1
    if heads % kv_heads:
        raise ValueError(f"`q` and `k` must share batch dimensions, or be grouped-query attention, q (*batch, H, n, "
                         f"p) with k, v (*batch, H_kv, n, p) and H a multiple of H_kv; got H = {heads} query heads "
                         f"and H_kv = {kv_heads} KV heads (q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}).")
    return heads // kv_heads


def warn_if_repeated(method: str, k: torch.Tensor, v: torch.Tensor, budget: int) -> None:
    """Warn (:class:`~approxlab.errors.RepeatedKVWarning`, at the caller's caller) when ``k`` and ``v`` repeat their
    heads in groups (:func:`repeated_heads`): K/V repeated to the query heads reaching a per-KV-head policy."""
    if (repeats := repeated_heads(k, v)) <= 1:
        return
    warnings.warn(RepeatedKVWarning(
        f"`k` and `v` repeat each of their heads {repeats} times (dimension -3: {k.shape[-3]} heads, "
        f"{k.shape[-3] // repeats} distinct), as K/V repeated to the query heads do (transformers' repeat_kv; "
        f"approxlab.data.get_qkv by default): method {method!r} keeps {budget} tokens per query head, up to "
        f"{repeats * budget} per KV head, not the {budget} per KV head a decoder's cache holds. Pass the KV heads "
        f"(get_qkv(..., grouped=True), or k[..., ::{repeats}, :, :] and v[..., ::{repeats}, :, :]) for one set "
        "per KV head, or grouping='query-head' to keep a set per query head on purpose."), stacklevel=3)


def repeated_heads(k: torch.Tensor, v: torch.Tensor) -> int:
    r"""The :math:`g > 1` with which ``k`` and ``v`` ``(*batch, H, n, *)`` repeat each of their heads in turn --
    heads :math:`c g, \dots, c g + g - 1` exact copies of one another (transformers' ``repeat_kv``), for every
    :math:`c` -- else 1 (a ``k`` without a head dimension, or distinct heads).

    Examples
    --------
    >>> import torch
    >>> k = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(0)).repeat_interleave(3, dim=-3)
    >>> repeated_heads(k, k), repeated_heads(k[:, :4], k[:, :4]), repeated_heads(k[:, 2:4], k[:, 2:4])
    (3, 1, 1)
    """
    if k.ndim < 3 or k.shape[-3] < 2:
        return 1
    heads = k.shape[-3]

    def same(h):  # head h a copy of head h - 1, in k and in v
        return torch.equal(k[..., h, :, :], k[..., h - 1, :, :]) and torch.equal(v[..., h, :, :], v[..., h - 1, :, :])

    group = 1
    while group < heads and same(group):
        group += 1
    if group == 1 or heads % group:
        return 1
    return group if all(same(h) == bool(h % group) for h in range(group, heads)) else 1


def repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``(*batch, H_kv, n, d)`` -> ``(*batch, H_kv * groups, n, d)``, head :math:`h` a copy of :math:`h // g`."""
    return x.unsqueeze(-3).expand(*x.shape[:-2], groups, *x.shape[-2:]).flatten(-4, -3)


def kept_for_query_heads(kept: torch.Tensor, heads: int, n: int,
                         key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""``info["kept"]`` of :func:`~approxlab.kv_cache_attention` as what each of the ``heads`` query heads attends
    in a window of ``n`` tokens: ``(indices, key_mask)`` for :func:`~approxlab.cache.attend_compressed`.

    ``kept`` is ``(*batch, H_kv, b)`` indices (one set per KV head, repeated to its :math:`g = H / H_{kv}` query
    heads), ``(*batch, H, b)`` (one per query head), or AdaKV's bool ``(*batch, H_kv, n_c)`` (or ``(*batch, H,
    n_c)``), whose sets of different sizes become fixed-width indices with the slots left over hidden by the
    returned mask (:func:`~approxlab.cache._allocation.kept_as_indices`, combined with ``key_mask``
    ``(*batch, n)``). The compressed cache is thereby read again, by later queries, without compressing again.

    Examples
    --------
    >>> import torch
    >>> from approxlab.cache import kept_for_query_heads
    >>> kept = torch.tensor([[[0, 2], [1, 3]]])  # 2 KV heads keep 2 context tokens each
    >>> indices, mask = kept_for_query_heads(kept, 4, 6)  # 4 query heads, a window of 6
    >>> indices.tolist(), mask
    ([[[0, 2], [0, 2], [1, 3], [1, 3]]], None)
    """
    groups = heads // kept.shape[-2]
    keep = kept.repeat_interleave(groups, dim=-2) if groups > 1 else kept
    if keep.dtype == torch.bool:
        return kept_as_indices(keep, key_mask, n)
    return keep, key_mask
