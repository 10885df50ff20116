r"""Budgets that adapt, over any per-key cache scorer: AdaKV across heads, PyramidKV across layers, and the
sink + window + scorer composition of sparse-attention-hub.

A *cache scorer* gives each context key of each (query) head a score, higher kept:
``score(q, k, v, *, generator=None, key_mask=None, **options) -> (*batch, n_c)`` for ``q, k, v``
``(*batch, n_c, p)``; :math:`+\infty` marks a key that must be kept, :math:`-\infty` a padded one, and a head
with a budget ``b`` keeps ``scores.topk(b).indices``. The functions here take such scores (or a scorer) and
decide *how many* keys each head and each layer keeps:

* :func:`adakv_keep`: a layer's ``H * b`` keys spread over its ``H`` heads by the scores themselves, with a
  per-head safeguard (AdaKV); heads then keep different numbers, so the result is a boolean mask;
* :func:`attend_kept`: the continuation's exact attention over a per-head kept set of any size;
* :func:`pyramid_budgets`: per-layer budgets decreasing linearly from the bottom layer to the top with the same
  total (PyramidKV);
* :func:`compose_scores` and :func:`with_sink_and_window`: attention sinks and a local window forced into any
  scorer's choice (sparse-attention-hub's sink, local and top-k maskers).
"""

from __future__ import annotations

import torch

from ._validation import check_int, check_positive_float, check_qkv, check_tensor
from .methods._masking import check_key_mask
from .methods._selection import attend_selected, compressed_indices

__all__ = ["adakv_keep", "attend_kept", "pyramid_budgets", "compose_scores", "with_sink_and_window"]


def adakv_keep(scores: torch.Tensor, budget: int, *, alpha_safeguard: float = 0.2) -> torch.Tensor:
    r"""AdaKV's head-adaptive allocation: keep the ``H * budget`` largest scores of a layer across its heads.

    Parameters
    ----------
    scores : torch.Tensor
        ``(*batch, H, n_c)``: the scores of all ``H`` (query or key-value) heads of one layer, higher kept,
        :math:`+\infty` forced, :math:`-\infty` padded.
    budget : int
        ``b``, the keys kept per head *on average*, ``1 <= b <= n_c``.
    alpha_safeguard : float, default 0.2
        Each head first keeps its own ``int(alpha_safeguard * b)`` best keys (kvpress's ``alpha_safeguard``),
        ``0 <= alpha_safeguard <= 1``; ``1`` gives every head ``b`` keys (uniform allocation).

    Returns
    -------
    torch.Tensor
        ``(*batch, H, n_c)`` bool, True on the kept keys: ``H * b`` per layer (fewer only where fewer keys are
        not padded), at least ``int(alpha_safeguard * b)`` per head.

    Notes
    -----
    AdaKV (Feng et al., 2024, Algorithm 1) bounds the layer's output error by a sum over heads of the attention
    mass each head drops, and minimises that bound at a fixed layer total by keeping the largest scores
    *across* heads rather than per head; a safeguard fraction :math:`\alpha` of each head's budget is kept
    first so that no head is starved. As in kvpress's ``AdaKVPress`` (commit 8bb29b9), the safeguard keys get
    the largest finite score and the layer keeps its top :math:`Hb` of the ``(H n_c)`` flattened scores.
    Scores of different heads must be comparable (e.g. attention weights, which sum to 1 per head).

    References
    ----------
    Y. Feng, J. Lv, Y. Cao, X. Xie, S. K. Zhou, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
    Allocation for Efficient LLM Inference" (2024), arXiv:2407.11550.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kv_budgets import adakv_keep
    >>> scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.1, 0.0, -0.1, -0.2]])  # head 0 dominates
    >>> adakv_keep(scores, 2, alpha_safeguard=0.5).sum(-1)  # 4 keys: 3 to head 0, the safeguard 1 to head 1
    tensor([3, 1])
    """
    check_tensor(scores, "scores", min_ndim=2, finite=False)
    heads, length = scores.shape[-2:]
    budget = check_int(budget, "budget", low=1, high=length)
    alpha_safeguard = check_positive_float(alpha_safeguard, "alpha_safeguard", allow_zero=True)
    if alpha_safeguard > 1:
        raise ValueError(f"`alpha_safeguard` must be a fraction in [0, 1]; got {alpha_safeguard!r}.")
    safe = int(budget * alpha_safeguard)
    scores = scores.double()
    if safe:
        values, indices = scores.topk(safe, dim=-1)
        top = torch.finfo(torch.float64).max
        scores = scores.scatter(-1, indices, torch.where(values > float("-inf"), torch.full_like(values, top), values))
    flat = scores.flatten(-2)
    values, indices = flat.topk(heads * budget, dim=-1)
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter(-1, indices, values > float("-inf"))
    return keep.view(scores.shape)


def attend_kept(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, *, context_length: int,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The continuation's exact attention over a per-head kept context of any size, and causally itself.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``: context (``context_length`` tokens) then
        continuation, one batch entry per head.
    keep : torch.Tensor
        ``(*batch, context_length)`` bool, True on the context keys each head kept (e.g. :func:`adakv_keep`);
        heads may keep different numbers.
    context_length : int
        ``1 <= context_length < n``.
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens (padding is never attended).

    Returns
    -------
    torch.Tensor
        ``(*batch, n - context_length, p_v)``: rows ``context_length .. n-1``, each the softmax over its head's
        kept context keys and the continuation keys ``j <= i``; compare with
        ``approxlab.exact_attention(q, k, v, causal=True)[..., context_length:, :]``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.kv_budgets import attend_kept
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
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.shape[-1] != context_length:
        raise ValueError(f"`keep` must be a bool tensor (*batch, context_length={context_length}); got "
                         f"{getattr(keep, 'dtype', type(keep).__name__)} {tuple(getattr(keep, 'shape', ()))}.")
    keep = keep.expand(*batch, context_length)
    width = max(1, int(keep.sum(-1).max()))
    # kept keys first (in position order), padded with unused slots
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :width]
    used = torch.gather(keep, -1, order)

    def selection(start, stop):
        indices, valid = compressed_indices(order, context_length, n, start, stop, key_mask)
        valid[..., :width] &= used.unsqueeze(-2)
        return indices, valid

    return attend_selected(q[..., context_length:, :], k, v, selection, width=width + n - context_length)


def pyramid_budgets(num_layers: int, budget: int, *, beta: float = 20, context_length: int | None = None
                    ) -> list[int]:
    r"""PyramidKV's per-layer budgets: linear from the bottom layer to the top, averaging ``budget``.

    Parameters
    ----------
    num_layers : int
        ``L >= 1``.
    budget : int
        ``b >= 1``, the keys kept per layer on average (besides any observation window).
    beta : float, default 20
        The top layer keeps :math:`b/\beta` (``beta >= 1``; 1 is uniform).
    context_length : int, optional
        The keys a layer can keep at most (kvpress: the prompt length minus the window); the bottom layer is
        capped there and the top raised to keep the total.

    Returns
    -------
    list of int
        ``L`` budgets, non-increasing from layer 0, summing to exactly ``L * b``.

    Notes
    -----
    PyramidKV (Cai et al., 2024, Sec. 3; kvpress ``pyramidkv_press.py``, KVCache-Factory
    ``pyramidkv_utils.py``): the top layer keeps :math:`b_{\min} = b/\beta`, the bottom
    :math:`b_{\max} = 2b - b_{\min}` (capped at ``context_length``, then :math:`b_{\min} = 2b - b_{\max}`),
    and layer :math:`l` keeps :math:`b_{\max} - l\,(b_{\max} - b_{\min})/(L-1)`, so the mean is :math:`b`.
    kvpress rounds each layer's value; here they are rounded by largest remainders so the total is exactly
    :math:`Lb` (each differs from kvpress's by less than 1).

    References
    ----------
    Z. Cai, Y. Zhang, B. Gao, Y. Liu, T. Liu, K. Lu, W. Xiong, Y. Dong, B. Chang, J. Hu, W. Xiao, "PyramidKV:
    Dynamic KV Cache Compression based on Pyramidal Information Funneling" (2024), arXiv:2406.02069.

    Examples
    --------
    >>> from approxlab.kv_budgets import pyramid_budgets
    >>> pyramid_budgets(4, 100, beta=4)
    [175, 125, 75, 25]
    >>> sum(pyramid_budgets(30, 64)) == 30 * 64
    True
    """
    num_layers = check_int(num_layers, "num_layers", low=1)
    budget = check_int(budget, "budget", low=1)
    beta = check_positive_float(beta, "beta")
    if beta < 1:
        raise ValueError(f"`beta` must be >= 1 (the bottom-to-top ratio); got {beta!r}.")
    if context_length is not None:
        context_length = check_int(context_length, "context_length", low=budget)
    if num_layers == 1:
        return [budget]
    low = budget / beta
    high = 2 * budget - low
    if context_length is not None and high > context_length:
        high = float(context_length)
        low = 2 * budget - high
    step = (high - low) / (num_layers - 1)
    exact = [high - layer * step for layer in range(num_layers)]
    floors = [int(value) for value in exact]
    short = num_layers * budget - sum(floors)
    for layer in sorted(range(num_layers), key=lambda l: (floors[l] - exact[l], l))[:short]:
        floors[layer] += 1
    return floors


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
        count positions, padding included.

    Examples
    --------
    >>> import torch
    >>> from approxlab.kv_budgets import compose_scores
    >>> compose_scores(torch.tensor([0.5, 0.1, 0.9, 0.2, 0.3]), sink=1, window=1)
    tensor([   inf, 0.1000, 0.9000, 0.2000,    inf])
    """
    check_tensor(scores, "scores", min_ndim=1, finite=False)
    sink = check_int(sink, "sink", low=0)
    window = check_int(window, "window", low=0)
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
    >>> from approxlab.kv_budgets import with_sink_and_window
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
