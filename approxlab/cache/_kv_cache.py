r"""The KV-cache setting: compress a context, then measure the continuation's attention.

A window of :math:`n` tokens is split into a context of :math:`n_c` tokens and a continuation of
:math:`n - n_c`. A method compresses the context's keys and values using only what it could see when it
compressed; the continuation's queries then attend the compressed context and, causally, the
continuation itself. The error is that of the continuation's rows against exact causal attention:
compare ``kv_cache_attention(...).output`` with ``exact_attention(q, k, v, causal=True)[..., n_c:, :]``.
This is how kvpress evaluates a press (a compressed context, then questions) and how a decoder serves.

:func:`kv_cache_attention` reads in steps, each a function here: the window and its heads (:func:`_window`), the
budget and the compression step's options (:func:`_step_options`), the kept sets (:func:`_kept_sets`: a policy's
own ``compress``, the top of its scores pooled per KV head, or AdaKV's sets), and the continuation attending them
(:func:`_compressed`); a method without a compression step runs its causal form (:func:`_through_causal_form`).
"""

from __future__ import annotations

import inspect

import torch

from .._validation import check_choice, check_int, check_qkv
from ..attention import approximate
from ..methods import registry
from ..methods._base import MASK_RENORMALISE, Approximation
from ..methods._masking import check_key_mask
from ..methods._selection import selected_weights
from ..operators import ProductOperator, RowSparseOperator
from ._allocation import adakv_keep, check_allocation
from ._compression_ratio import cache_budget
from ._grouping import GROUPINGS, group_size, kept_for_query_heads, repeat_heads, warn_if_repeated
from ._scores import checked_scores, pool_group, score_options, scores_of, top_budget, warn_without_rope
from ._selection import attend_compressed, compressed_indices

__all__ = ["kv_cache_attention"]


def kv_cache_attention(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, context_length: int,
                       num_features: int | None = None, compression_ratio: float | None = None,
                       generator: torch.Generator | None = None, draw: dict | None = None,
                       key_mask: torch.Tensor | None = None, grouping: str = "kv-head", allocation: str | None = None,
                       alpha_safeguard: float | None = None, **options) -> Approximation:
    r"""The continuation rows of a window whose context a method has compressed.

    Parameters
    ----------
    method : str
        A registered method with a causal form (:func:`approxlab.methods.causal_support`): a method that
        declares per-key scores or a compression step (``streaming-llm``, ``h2o``, ``snapkv``;
        ``register(..., score=fn)`` or ``compress=fn``) is run through them; any other causal method through
        its causal form on the whole window.
    q, k, v : torch.Tensor
        The whole window, ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (self-attention); or
        grouped-query attention, ``q`` ``(*batch, H, n, p)`` with ``k, v`` ``(*batch, H_kv, n, p)``,
        ``(*batch, H_kv, n, p_v)``, :math:`H` a multiple of :math:`H_{kv}`, query head :math:`h` reading KV
        head :math:`\lfloor h/g\rfloor`, :math:`g = H/H_{kv}` (transformers' ``repeat_kv``).
    context_length : int
        :math:`n_c`, the context (``1 <= n_c <= n - 1``); the continuation is the last :math:`n - n_c` rows.
    num_features : int
        With a compression step: the cache budget :math:`b`, the context tokens kept per head (per KV head
        with ``grouping="kv-head"``; ``1 <= b <= n_c``). Without one: the method's own ``num_features`` (its table in
        :mod:`approxlab.methods`), for its causal form on the whole window. Exactly one of ``num_features`` and
        ``compression_ratio`` is given.
    compression_ratio : float, optional
        The budget as kvpress states it (a method with a compression step only): the fraction :math:`r \in [0, 1)`
        of the context removed, :math:`b = \max(1, \lfloor n_c (1 - r)\rfloor)` kept per head in Python's float
        arithmetic, kvpress's ``ScorerPress`` rounding (:func:`~approxlab.cache.kept_count`; e.g. :math:`n_c = 20,
        r = 0.9` keeps 1 token, :math:`20 \times 0.1` being 1.9999999999999996 in floats).
    generator : torch.Generator, optional
        A CPU generator for randomized methods (passed on).
    draw : dict, optional
        A randomized method's draw, instead of ``generator`` (methods without a compression step only).
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens: padded tokens are never attended, and the compression
        step gets the context's part (a policy counts and scores real tokens only). It broadcasts to the
        keys' ``(*batch, H_kv, n)``.
    grouping : {"kv-head", "query-head"}, default "kv-head"
        Grouped-query attention only (:math:`g > 1`): ``"kv-head"`` keeps one set of at most :math:`b` tokens
        per KV head, the top :math:`b` of its query heads' scores averaged (kvpress's ``ScorerPress``: each
        query head's score, then the mean over the group), and every query head of the group attends it --
        the cache a decoder holds; it needs a policy with ``score``. ``"query-head"`` repeats K/V to the
        query heads and keeps a set per query head (SnapKV's published code, ``repeat_kv`` before
        ``update_kv``): up to :math:`g b` distinct tokens per KV head. Without grouping both are the same
        computation; methods without a compression step attend the repeated K/V either way.
    allocation : {"uniform", "adakv"}, optional
        How a layer's budget is spread over its heads (:data:`~approxlab.cache.ALLOCATIONS`); default: the method's own
        (``"adakv"`` for ``ada-snapkv``, else ``"uniform"``). ``"uniform"``: every head keeps :math:`b`.
        ``"adakv"`` (a policy with ``score`` only): AdaKV's head-adaptive allocation, the layer's :math:`H b`
        tokens (:math:`H_{kv} b` with ``grouping="kv-head"``) going to the largest scores of all its heads
        jointly (:func:`approxlab.cache.adakv_keep`); heads are dimension -3 of ``q`` (``(*batch, H, n,
        p)``), the KV heads under ``"kv-head"``, the query heads otherwise.
    alpha_safeguard : float, optional
        With ``allocation="adakv"`` only: the fraction of :math:`b` each head keeps for sure, in ``[0, 1]``;
        default 0.2 (kvpress's ``AdaKVPress.alpha_safeguard``).
    **options
        The compression step's options (e.g. ``sinks``, ``recent_size``, ``window``), or the method's
        options without one.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n - n_c, p_v)``, the continuation's rows; ``operator()`` their
        ``(*batch, n - n_c, n)`` rows of the approximate attention matrix (formed on request);
        ``info``: ``context_length``, ``setting`` (``"compressed"`` or the causal form used) and, with a
        compression step, ``num_features`` the budget :math:`b` and ``compression_ratio`` (the one given, or
        :math:`1 - b / n_c`), ``kept`` the context tokens kept, ``(*batch, b)`` (``(*batch, H_kv, b)`` with
        ``grouping="kv-head"``, ``(*batch, H, b)`` with ``"query-head"``) -- with ``allocation="adakv"`` the
        bool ``(*batch, H_kv, n_c)`` (or ``(*batch, H, n_c)``) of the tokens each head kept, in numbers that
        differ by head; without one, the method's own ``info``.

    Raises
    ------
    TypeError, ValueError
        For the inputs of :func:`approxlab.approximate`; both or neither of ``num_features`` and
        ``compression_ratio``, a ratio not a real number in ``[0, 1)`` or for a method without a compression
        step; ``n != m`` (the window is self-attention);
        ``context_length`` not an integer in ``[1, n - 1]``; with a compression step, ``num_features`` not
        an integer in ``[1, context_length]``, an option the step does not take (the message lists those it
        does), a ``draw``, or a step whose result is not ``(*batch, b)`` integer indices in
        ``[0, context_length)`` (scores: not ``(*batch, n_c)`` floating, NaN, or :math:`+\infty` on more than
        :math:`b` tokens); a method without a causal form (the message names those with one); query heads not
        a multiple of the KV heads; a ``grouping`` not in :data:`~approxlab.cache.GROUPINGS`;
        ``grouping="kv-head"`` with grouped K/V for a policy that declares only ``compress`` (the message says to
        declare ``score=`` or pass ``grouping="query-head"``); an ``allocation`` not in
        :data:`~approxlab.cache.ALLOCATIONS`, ``"adakv"`` for a method without ``score`` or a ``q`` without a head
        dimension, ``alpha_safeguard`` without ``"adakv"`` or outside ``[0, 1]``.

    Warns
    -----
    RepeatedKVWarning
        Once per call, for a method with a compression step, the default ``grouping``, and ``k``, ``v`` whose
        heads repeat in groups of :math:`g > 1` (K/V repeated to the query heads, as
        ``approxlab.data.get_qkv`` returns them by default): each query head keeps its own set, up to
        :math:`g b` tokens per KV head. Pass the KV heads (``get_qkv(..., grouped=True)``), or
        ``grouping="query-head"`` to keep a set per query head on purpose.
    RopeWarning
        Once per call, for a policy that reads the model's RoPE (``inputs=("rope_base",)``) given neither
        ``rope_frequencies`` nor ``rope_base`` (nor ``keys_pre_rope``); ``rope_frequencies=None`` states keys
        without RoPE.

    Notes
    -----
    **With a compression step** ``kept = compress(q[:n_c], k[:n_c], v[:n_c], budget=b)``, continuation row
    :math:`i \ge n_c` is the exact softmax over the kept context tokens and the continuation tokens
    :math:`n_c, \dots, i`:

    .. math::

        \tilde o_i = \sum_{j\in \mathcal K\,\cup\,\{n_c,\dots,i\}}
        \frac{e^{s_{ij}}}{\sum_{l\in \mathcal K\,\cup\,\{n_c,\dots,i\}} e^{s_{il}}}\, v_j .

    The context is compressed once and the continuation is never evicted, as kvpress presses a context
    before the questions. A policy declaring ``score`` keeps ``scores.topk(b).indices`` (its own
    ``compress``, when it declares one too, without grouping).

    **Grouped-query attention** (``grouping="kv-head"``, :math:`g > 1`): with :math:`\sigma_h` the scores of
    query head :math:`h` against its KV head, KV head :math:`c` keeps the top :math:`b` of
    :math:`\bar\sigma_c = \frac1g\sum_{h:\lfloor h/g\rfloor = c}\sigma_h` (:math:`+\infty` if one head must
    keep the token, :math:`-\infty` on padding), the mean kvpress takes of each query head's final score
    (``ScorerPress`` subclasses: ``scores.view(bsz, num_key_value_heads, num_key_value_groups, k_len).mean(2)``,
    after SnapKV's pooling, after H2O-like column sums); the :math:`g` query heads attend that one set, so the
    cache holds :math:`b` context tokens per KV head, as the budget says. ``grouping="query-head"`` gives each
    query head its own set, as SnapKV's code does after ``repeat_kv``. How each built-in policy's step-by-step rule maps onto the kept set:

    - ``streaming-llm``: ``StartRecentKVCache`` applied to the context: the first ``sinks`` tokens and the
      last :math:`b - \text{sinks}` (its rolling eviction, run over the context, leaves exactly these).
    - ``h2o``: the authors' cache after the prefill (``H2OKVCache_LayerWise``): the accumulated attention
      :math:`F_j=\sum_{i<n_c} a_{ij}` of the context's causal rows (column sums, no eviction during the
      prefill), the last ``recent_size`` tokens plus the :math:`b - r` others of largest :math:`F_j`.
      Its causal form instead evicts token by token from the start; the two differ by design.
    - ``snapkv``: its one compression after the prompt, the prompt being the context: the last ``window``
      context queries vote, the votes are pooled, the top :math:`b - w` and the window are kept. Its causal
      form with ``prompt_length = n_c`` gives the same continuation rows.

    **Head-adaptive budgets** (``allocation="adakv"``, AdaKV, Feng et al. 2024, arXiv:2407.11550, Algorithm 1):
    with :math:`\sigma_{hj}` the (pooled) scores of the :math:`H` heads, each head's top
    :math:`\lfloor\alpha b\rfloor` are raised to the largest finite float and the layer keeps the top :math:`H b`
    of all :math:`H n_c` scores (:func:`approxlab.cache.adakv_keep`; kvpress's ``AdaKVPress``): the heads'
    kept sets differ in size, and each continuation row attends its head's. The layer schedule (PyramidKV) needs
    the layer's index: :func:`approxlab.patch_attention`'s ``layer_budgets``.

    **Without a compression step** the method's causal form runs on the whole window
    (``approximate(method, q, k, v, causal=True)``, or ``causal="mask-renormalise"`` for the methods that
    only have the evaluation variant) and its rows :math:`n_c, \dots, n-1` are returned (a causal form with a
    prefill, ``prompt_length``, e.g. ``magicpig``'s, gets ``prompt_length = n_c`` unless given: the context is
    the prefill): a per-query
    method (``topk``, ``quest``, ``performer``, ...) then selects from the full context, as it would when
    serving with the whole cache.

    **Cost** with a compression step: the step's own (e.g. H2O's column sums, :math:`O(n_c^2 p)` in row
    blocks; SnapKV's :math:`O(w n_c p)`), then :math:`O((n-n_c)(b + n - n_c)p)` for the continuation.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 96, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v, causal=True)[..., 64:, :]
    >>> approx = approxlab.kv_cache_attention("snapkv", q, k, v, context_length=64, num_features=16, window=8)
    >>> approx.output.shape, approx.info["kept"].shape
    (torch.Size([2, 32, 8]), torch.Size([2, 16]))
    >>> errors = approxlab.metrics.spectral_error(approx.output, exact, relative=True)
    >>> full = approxlab.kv_cache_attention("h2o", q, k, v, context_length=64, num_features=64)
    >>> float((full.output - exact).abs().max()) < 1e-12  # every context token kept: exact
    True
    >>> topk = approxlab.kv_cache_attention("topk", q, k, v, context_length=64, num_features=16)
    >>> topk.info["setting"]
    'causal'
    >>> g = torch.Generator().manual_seed(1)
    >>> q = torch.randn(1, 6, 96, 8, generator=g, dtype=torch.float64)  # 6 query heads ...
    >>> k, v = (torch.randn(1, 2, 96, 8, generator=g, dtype=torch.float64) for _ in range(2))  # ... on 2 KV heads
    >>> grouped = approxlab.kv_cache_attention("h2o", q, k, v, context_length=64, num_features=16)
    >>> grouped.output.shape, grouped.info["kept"].shape  # one set of 16 context tokens per KV head
    (torch.Size([1, 6, 32, 8]), torch.Size([1, 2, 16]))
    >>> ada = approxlab.kv_cache_attention("h2o", q, k, v, context_length=64, num_features=16, allocation="adakv")
    >>> ada.info["kept"].shape, int(ada.info["kept"].sum())  # the 2 KV heads share 2 * 16 tokens (AdaKV)
    (torch.Size([1, 2, 64]), 32)
    >>> ratio = approxlab.kv_cache_attention("h2o", q, k, v, context_length=64, compression_ratio=0.75)
    >>> ratio.info["num_features"], ratio.info["compression_ratio"]  # kvpress's int(64 * (1 - 0.75)) kept
    (16, 0.75)
    """
    spec = registry.get(method)
    grouping_default = grouping == "kv-head"  # a set per KV head asked for (the default)
    grouping = check_choice(grouping, "grouping", GROUPINGS)
    allocation, alpha_safeguard = check_allocation(spec, allocation, alpha_safeguard)
    adaptive = allocation == "adakv"
    if adaptive and (not isinstance(q, torch.Tensor) or q.ndim < 3):
        raise ValueError(f"`allocation` 'adakv' spreads a layer's budget over its heads, dimension -3 of q (*batch, "
                         f"H, n, p); allowed for a q without one is 'uniform'; got q of shape "
                         f"{tuple(getattr(q, 'shape', ()))} and allocation='adakv'.")
    k, v, key_mask, groups, context_length = _window(q, k, v, key_mask, context_length)
    num_features = cache_budget(spec, num_features, compression_ratio, context_length)
    if spec.compress is None:
        return _through_causal_form(spec, q, k, v, context_length, num_features, generator, draw, key_mask,
                                    options)
    budget = check_int(num_features, "num_features", low=1, high=context_length)
    if draw is not None:
        raise ValueError(f"`draw` is for randomized methods; the compression step of {method!r} takes none; got one.")
    pooled = groups > 1 and grouping == "kv-head"
    if pooled and spec.score is None:
        raise ValueError(f"method {method!r} declares a compression step but no per-key scores, so it keeps a set "
                         f"per query head; grouped K/V ({q.shape[-3]} query heads, {q.shape[-3] // groups} KV heads) "
                         "with grouping='kv-head' needs one set per KV head: register the policy with score=, or "
                         "pass grouping='query-head'.")
    scored = pooled or adaptive
    step_options = _step_options(spec, scored, options, key_mask, context_length)
    if groups == 1 and grouping_default:
        warn_if_repeated(method, k, v, budget)
    warn_without_rope(spec, options)
    inputs = tuple(x[..., :context_length, :] for x in (q, k, v))
    kept, kept_by_head, key_mask = _kept_sets(spec, inputs, q, budget, groups, pooled, adaptive, alpha_safeguard,
                                              generator, step_options, key_mask)
    ratio = 1 - budget / context_length if compression_ratio is None else compression_ratio
    info = {"context_length": context_length, "setting": "compressed", "kept": kept_by_head, "num_features": budget,
            "compression_ratio": ratio}
    return _compressed(method, q, k, v, kept, key_mask, info)


def _window(q, k, v, key_mask, context_length) -> tuple:
    """``(k, v, key_mask, groups, context_length)`` of a checked window: grouped K/V (and their key mask) repeated
    to the query heads, :math:`g` = ``groups`` (1 without grouping), ``context_length`` in ``[1, n - 1]``."""
    groups = group_size(q, k, v)
    if groups > 1:  # the mask is checked against the KV heads, then everything is read per query head
        key_mask = check_key_mask(key_mask, k)
        if key_mask is not None:
            key_mask = repeat_heads(key_mask.expand(k.shape[:-1]).unsqueeze(-1), groups).squeeze(-1)
        k, v = repeat_heads(k, groups), repeat_heads(v, groups)
    check_qkv(q, k, v)
    _, context_length = _check_window(q, k, context_length)
    return k, v, check_key_mask(key_mask, k), groups, context_length


def _step_options(spec, scored: bool, options: dict, key_mask, context_length: int) -> dict:
    """The options of method ``spec``'s compression step (its ``score`` when ``scored``, else its ``compress``),
    checked against those the step takes, with the context's part of ``key_mask`` added."""
    step = spec.score if scored else spec.compress
    allowed = score_options(step) if scored else spec.compress_options()
    for name, value in options.items():
        if allowed is not None and name not in allowed:
            raise TypeError(f"`{name}` is not an option of the compression step of method {spec.name!r}; its "
                            f"options are {allowed}; got {name}={value!r}.")
    step_options = dict(options)
    if key_mask is not None:
        if "key_mask" not in inspect.signature(step).parameters:
            raise ValueError(f"`key_mask` is not supported by the compression step of method {spec.name!r}; got a "
                             "mask for it.")
        step_options["key_mask"] = key_mask[..., :context_length]
    return step_options


def _kept_sets(spec, inputs, q, budget, groups, pooled, adaptive, alpha_safeguard, generator, step_options,
               key_mask) -> tuple:
    """``(kept, kept_by_head, key_mask)``: the context tokens each query head attends (indices), the sets as the
    cache holds them (``info["kept"]``), and the key mask (AdaKV's: the slots a head left over hidden)."""
    method, context_length, n = spec.name, inputs[1].shape[-2], q.shape[-2]
    if pooled or adaptive:
        scores = scores_of(method, spec.score, *inputs, budget=budget, generator=generator, **step_options)
        if pooled:  # the group's mean score per KV head, one kept set for the group's query heads
            scores = checked_scores(method, pool_group(scores, groups), (*q.shape[:-3], q.shape[-3] // groups,
                                                                         context_length), budget)
    if adaptive:  # AdaKV: the layer's heads share their total, each head a kept set of its own size
        kept_by_head = adakv_keep(scores, budget, alpha_safeguard=alpha_safeguard)
        kept, key_mask = kept_for_query_heads(kept_by_head, q.shape[-3], n, key_mask)  # slots left over: masked
        return kept.to(q.device), kept_by_head, key_mask
    if pooled:
        kept_by_head = top_budget(scores, budget)
        return (_checked_kept(method, kept_by_head.repeat_interleave(groups, dim=-2), q, budget, context_length),
                kept_by_head, key_mask)
    kept = _checked_kept(method, spec.compress(*inputs, budget=budget, generator=generator, **step_options), q,
                         budget, context_length)
    return kept, kept, key_mask


def _compressed(method: str, q, k, v, kept, key_mask, info: dict) -> Approximation:
    """The continuation's rows over the ``kept`` context tokens and, causally, the continuation; the row-sparse
    operator formed on request."""
    n, context_length = q.shape[-2], info["context_length"]
    width = kept.shape[-1] + n - context_length

    def selection(start, stop):
        return compressed_indices(kept, context_length, n, start, stop, key_mask)

    continuation = q[..., context_length:, :]
    output = attend_compressed(q, k, v, kept, context_length, key_mask)

    def build():
        indices, weights = selected_weights(continuation, k, v, selection, width=width)
        return RowSparseOperator(indices, weights, n)

    return Approximation(method, "softmax", output, build, info)


def _check_window(q, k, context_length) -> tuple[int, int]:
    """``(n, context_length)`` of one self-attention window that holds a context and a continuation."""
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"`q` and `k` must be one window (self-attention, as many keys as queries); got "
                         f"{n} queries and {k.shape[-2]} keys.")
    if n < 2:
        raise ValueError(f"the window must hold a context and a continuation (n >= 2 tokens); got n = {n}.")
    return n, check_int(context_length, "context_length", low=1, high=n - 1)


def _checked_kept(method: str, kept, q: torch.Tensor, budget: int, context_length: int) -> torch.Tensor:
    """The compression step's result as ``(*batch, budget)`` long indices in ``[0, context_length)``."""
    expected = (*q.shape[:-2], budget)
    if not isinstance(kept, torch.Tensor) or kept.dtype not in (torch.int32, torch.int64):
        got = kept.dtype if isinstance(kept, torch.Tensor) else type(kept).__name__
        raise TypeError(f"the compression step of method {method!r} must return integer indices (*batch, budget); "
                        f"got {got}.")
    if tuple(kept.shape) != expected:
        raise ValueError(f"the compression step of method {method!r} must return indices of shape (*batch, budget) "
                         f"= {expected}; got {tuple(kept.shape)}.")
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= context_length):
        raise ValueError(f"the compression step of method {method!r} must keep context tokens, indices in [0, "
                         f"{context_length}); got values in [{int(kept.min())}, {int(kept.max())}].")
    return kept.long().to(q.device)


def _through_causal_form(spec, q, k, v, context_length, num_features, generator, draw, key_mask, options):
    """A method without a compression step: its causal form on the whole window, continuation rows kept."""
    if spec.causal is True or spec.causal_only:
        causal = True
    elif spec.causal == MASK_RENORMALISE:
        causal = MASK_RENORMALISE
    else:
        usable = registry.causal_support(True) + registry.causal_support(MASK_RENORMALISE)
        raise ValueError(f"method {spec.name!r} has no causal form, which the KV-cache setting needs; methods "
                         f"with one: {usable}; got {spec.name!r}.")
    if causal is True and "prompt_length" in (spec.options() or ()) and "prompt_length" not in options:
        options = {**options, "prompt_length": context_length}  # a causal form with a prefill: the context is it
    result = approximate(spec.name, q, k, v, num_features=num_features, generator=generator, draw=draw,
                         key_mask=key_mask, causal=causal, **options)
    n = q.shape[-2]

    def build():  # the continuation rows of the whole window's operator
        rows = torch.arange(context_length, n, device=q.device)
        batch = result.operator().shape[:-2]
        select = RowSparseOperator(rows.expand(*batch, n - context_length).unsqueeze(-1),
                                    torch.ones(*batch, n - context_length, 1, dtype=q.dtype, device=q.device), n)
        return ProductOperator(select, result.operator())

    info = {**result.info, "context_length": context_length, "setting": "causal" if causal is True else causal}
    return Approximation(spec.name, result.target, result.output[..., context_length:, :], build, info)
