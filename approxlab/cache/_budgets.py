r"""Budgets over any per-key cache scorer: a per-head kept set of any size attended, and the sink + window + scorer
composition of sparse-attention-hub.

A *cache scorer* gives each context key of each (query) head a score, higher kept:
``score(q, k, v, *, generator=None, key_mask=None, **options) -> (*batch, n_c)`` for ``q, k, v``
``(*batch, n_c, p)``; :math:`+\infty` marks a key that must be kept, :math:`-\infty` a padded one, and a head
with a budget ``b`` keeps ``scores.topk(b).indices``. How many keys each head and each layer keeps is
:mod:`approxlab.cache._allocation`'s (:func:`~approxlab.cache.adakv_keep`, AdaKV across heads;
:func:`~approxlab.cache.pyramid_budgets`, PyramidKV across layers; :func:`approxlab.kv_cache_attention` and
:func:`approxlab.patch_attention` take them as ``allocation="adakv"`` and ``layer_budgets="pyramid"``). Here:

* :func:`attend_kept`: the continuation's exact attention over a per-head kept set of any size (e.g. AdaKV's);
* :func:`compose_scores` and :func:`with_sink_and_window`: attention sinks and a local window forced into any
  scorer's choice (sparse-attention-hub's sink, local and top-k maskers).
"""

from __future__ import annotations

import torch

from .._validation import check_int, check_mask_shape, check_qkv
from ..methods._masking import check_key_mask
from ._allocation import check_scores, kept_as_indices
from ._selection import attend_compressed

__all__ = ["attend_kept", "compose_scores", "with_sink_and_window"]


def attend_kept(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, *, context_length: int,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The continuation's exact attention over a per-head kept context of any size, and causally itself.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``: context (``context_length`` tokens) then
        continuation, one batch entry per head.
    keep : torch.Tensor
        ``(*batch, context_length)`` bool, True on the context keys each head kept (e.g.
        :func:`~approxlab.cache.adakv_keep`); heads may keep different numbers.
    context_length : int
        ``1 <= context_length < n``.
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens (padding is never attended).

    Raises
    ------
    TypeError, ValueError
        As :func:`approxlab.kv_cache_attention` for ``q, k, v``, ``context_length`` and ``key_mask``; a ``keep``
        that is not a bool tensor, or whose shape is not ``(*batch, context_length)`` or does not broadcast to it
        without widening the heads' batch.

    Returns
    -------
    torch.Tensor
        ``(*batch, n - context_length, p_v)``: rows ``context_length .. n-1``, each the softmax over its head's
        kept context keys and the continuation keys ``j <= i``; compare with
        ``approxlab.exact_attention(q, k, v, causal=True)[..., context_length:, :]``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.cache import attend_kept
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 24, 4, generator=torch.Generator().manual_seed(0))
    >>> everything = torch.ones(2, 16, dtype=torch.bool)
    >>> out = attend_kept(q, k, v, everything, context_length=16)
    >>> float((out - approxlab.exact_attention(q, k, v, causal=True)[..., 16:, :]).abs().max()) < 1e-12
    True
    """
    check_qkv(q, k, v)
    n = k.shape[-2]
    context_length = check_int(context_length, "context_length", low=1, high=n - 1)
    key_mask = check_key_mask(key_mask, k)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        got = keep.dtype if isinstance(keep, torch.Tensor) else type(keep).__name__
        raise TypeError(f"`keep` must be a bool torch.Tensor (True on the context keys each head kept); got {got}.")
    check_mask_shape(keep, "keep", (*batch, context_length), length="context_length", whose="the heads'")
    keep = keep.to(q.device)
    indices, mask = kept_as_indices(keep.expand(*batch, context_length), key_mask, n)
    return attend_compressed(q, k, v, indices, context_length, mask)


def compose_scores(scores: torch.Tensor, *, sink: int = 0, window: int = 0,
                   key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""One score from parts: ``+inf`` on the first ``sink`` and the last ``window`` context keys, the scorer's
    score elsewhere, ``-inf`` on padding.

    sparse-attention-hub composes a sink masker, a local-window masker and a top-k masker by taking the union
    of their keys; under the scorer contract that union is ``scores.topk(b)`` of this composed score (the
    forced keys count towards ``b``).

    Parameters
    ----------
    scores : torch.Tensor
        ``(*batch, n_c)`` from any cache scorer.
    sink, window : int, default 0
        Keys ``j < sink`` and ``j >= n_c - window`` are forced.
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; padding gets ``-inf`` even where forced. Sink and window
        count positions, padding included. Checked as :func:`approxlab.kv_cache_attention` checks its own: a bool
        tensor whose last dimension is ``n_c`` and that broadcasts to ``scores`` without widening it, with a real
        token in every row.

    Raises
    ------
    TypeError, ValueError
        ``scores`` not a float32/float64 tensor with a key dimension, or holding NaN (scores are finite,
        :math:`+\infty` or :math:`-\infty`); ``sink`` or ``window`` not an integer ``>= 0``; a ``key_mask`` as above.

    Examples
    --------
    >>> import torch
    >>> from approxlab.cache import compose_scores
    >>> compose_scores(torch.tensor([0.5, 0.1, 0.9, 0.2, 0.3]), sink=1, window=1)
    tensor([   inf, 0.1000, 0.9000, 0.2000,    inf])
    """
    check_scores(scores, min_ndim=1)
    sink = check_int(sink, "sink", low=0)
    window = check_int(window, "window", low=0)
    key_mask = check_key_mask(key_mask, scores.unsqueeze(-1))  # the mask of the keys scored
    length = scores.shape[-1]
    position = torch.arange(length, device=scores.device)
    forced = (position < sink) | (position >= length - window)
    scores = scores.masked_fill(forced, float("inf"))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.expand(scores.shape), float("-inf"))
    return scores


def with_sink_and_window(scorer, *, sink: int = 0, window: int = 0):
    r"""The cache scorer that forces ``sink`` attention sinks and a ``window`` of recent keys into ``scorer``'s choice.

    Returns ``score(q, k, v, *, generator=None, key_mask=None, **options)`` with the scorer contract (see the
    module docstring): ``compose_scores(scorer(...), sink=sink, window=window, key_mask=key_mask)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.cache import with_sink_and_window
    >>> def norms(q, k, v, *, generator=None, key_mask=None):
    ...     return -k.norm(dim=-1)  # keep small-norm keys
    >>> k = torch.tensor([[3.0], [1.0], [2.0], [5.0]])
    >>> with_sink_and_window(norms, sink=1)(k, k, k).topk(2).indices.tolist()
    [0, 1]
    """
    if not callable(scorer):
        raise TypeError(f"`scorer` must be a function score(q, k, v, *, generator, key_mask, **options); got "
                        f"{type(scorer).__name__}.")
    sink = check_int(sink, "sink", low=0)
    window = check_int(window, "window", low=0)

    def score(q, k, v, *, generator=None, key_mask=None, **options):
        scores = scorer(q, k, v, generator=generator, key_mask=key_mask, **options)
        return compose_scores(scores, sink=sink, window=window, key_mask=key_mask)

    return score
