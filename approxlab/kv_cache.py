r"""The KV-cache setting: compress a context, then measure the continuation's attention.

A window of :math:`n` tokens is split into a context of :math:`n_c` tokens and a continuation of
:math:`n - n_c`. A method compresses the context's keys and values using only what it could see when it
compressed; the continuation's queries then attend the compressed context and, causally, the
continuation itself. The error is that of the continuation's rows against exact causal attention:
compare ``kv_cache_attention(...).output`` with ``exact_attention(q, k, v, causal=True)[..., n_c:, :]``.
This is how kvpress evaluates a press (a compressed context, then questions) and how a decoder serves.

Public API (re-exported by :mod:`approxlab`)::

    kv_cache_attention(method, q, k, v, *, context_length, num_features, generator=None, draw=None,
                       key_mask=None, **options) -> Approximation
"""

from __future__ import annotations

import inspect

import torch

from ._validation import check_int, check_qkv
from .attention import approximate
from .methods import registry
from .methods._base import MASK_RENORMALISE, Approximation
from .methods._masking import check_key_mask
from .methods._selection import attend_compressed, attend_selected, compressed_indices
from .operators import ProductOperator, RowSparseOperator

__all__ = ["kv_cache_attention"]


def kv_cache_attention(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, context_length: int,
                       num_features: int, generator: torch.Generator | None = None, draw: dict | None = None,
                       key_mask: torch.Tensor | None = None, **options) -> Approximation:
    r"""The continuation rows of a window whose context a method has compressed.

    Parameters
    ----------
    method : str
        A registered method with a causal form (:func:`approxlab.methods.causal_support`): a method that
        declares a compression step (``streaming-llm``, ``h2o``, ``snapkv``; ``register(..., compress=fn)``)
        is run through it; any other causal method through its causal form on the whole window.
    q, k, v : torch.Tensor
        The whole window, ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (self-attention).
    context_length : int
        :math:`n_c`, the context (``1 <= n_c <= n - 1``); the continuation is the last :math:`n - n_c` rows.
    num_features : int
        With a compression step: the cache budget :math:`b`, the context tokens kept per head
        (``1 <= b <= n_c``). Without one: the method's own ``num_features`` (its table in
        :mod:`approxlab.methods`), for its causal form on the whole window.
    generator : torch.Generator, optional
        A CPU generator for randomized methods (passed on).
    draw : dict, optional
        A randomized method's draw, instead of ``generator`` (methods without a compression step only).
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens: padded tokens are never attended, and the compression
        step gets the context's part (a policy counts and scores real tokens only).
    **options
        The compression step's options (e.g. ``sinks``, ``recent_size``, ``window``), or the method's
        options without one.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n - n_c, p_v)``, the continuation's rows; ``operator()`` their
        ``(*batch, n - n_c, n)`` rows of the approximate attention matrix (formed on request);
        ``info``: ``context_length``, ``setting`` (``"compressed"`` or the causal form used) and, with a
        compression step, ``kept`` ``(*batch, b)`` the context tokens kept; without one, the method's own
        ``info``.

    Raises
    ------
    TypeError, ValueError
        For the inputs of :func:`approxlab.approximate`; ``n != m`` (the window is self-attention);
        ``context_length`` not an integer in ``[1, n - 1]``; with a compression step, ``num_features`` not
        an integer in ``[1, context_length]``, an option the step does not take (the message lists those it
        does), a ``draw``, or a step whose result is not ``(*batch, b)`` integer indices in
        ``[0, context_length)``; a method without a causal form (the message names those with one).

    Notes
    -----
    **With a compression step** ``kept = compress(q[:n_c], k[:n_c], v[:n_c], budget=b)``, continuation row
    :math:`i \ge n_c` is the exact softmax over the kept context tokens and the continuation tokens
    :math:`n_c, \dots, i`:

    .. math::

        \tilde o_i = \sum_{j\in \mathcal K\,\cup\,\{n_c,\dots,i\}}
        \frac{e^{s_{ij}}}{\sum_{l\in \mathcal K\,\cup\,\{n_c,\dots,i\}} e^{s_{il}}}\, v_j .

    The context is compressed once and the continuation is never evicted, as kvpress presses a context
    before the questions. How each built-in policy's step-by-step rule maps onto the kept set:

    - ``streaming-llm``: ``StartRecentKVCache`` applied to the context: the first ``sinks`` tokens and the
      last :math:`b - \text{sinks}` (its rolling eviction, run over the context, leaves exactly these).
    - ``h2o``: the authors' cache after the prefill (``H2OKVCache_LayerWise``): the accumulated attention
      :math:`F_j=\sum_{i<n_c} a_{ij}` of the context's causal rows (column sums, no eviction during the
      prefill), the last ``recent_size`` tokens plus the :math:`b - r` others of largest :math:`F_j`.
      Its causal form instead evicts token by token from the start; the two differ by design.
    - ``snapkv``: its one compression after the prompt, the prompt being the context: the last ``window``
      context queries vote, the votes are pooled, the top :math:`b - w` and the window are kept. Its causal
      form with ``prompt_length = n_c`` gives the same continuation rows.

    **Without a compression step** the method's causal form runs on the whole window
    (``approximate(method, q, k, v, causal=True)``, or ``causal="mask-renormalise"`` for the methods that
    only have the evaluation variant) and its rows :math:`n_c, \dots, n-1` are returned: a per-query
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
    """
    spec = registry.get(method)
    check_qkv(q, k, v)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"`q` and `k` must be one window (self-attention, as many keys as queries); got "
                         f"{n} queries and {k.shape[-2]} keys.")
    if n < 2:
        raise ValueError(f"the window must hold a context and a continuation (n >= 2 tokens); got n = {n}.")
    context_length = check_int(context_length, "context_length", low=1, high=n - 1)
    key_mask = check_key_mask(key_mask, k)
    if spec.compress is None:
        return _through_causal_form(spec, q, k, v, context_length, num_features, generator, draw, key_mask,
                                    options)
    budget = check_int(num_features, "num_features", low=1, high=context_length)
    if draw is not None:
        raise ValueError(f"`draw` is for randomized methods; the compression step of {method!r} takes none; got a "
                         "draw.")
    allowed = spec.compress_options()
    for name, value in options.items():
        if allowed is not None and name not in allowed:
            raise TypeError(f"`{name}` is not an option of the compression step of method {method!r}; its "
                            f"options are {allowed}; got {name}={value!r}.")
    context = slice(0, context_length)
    step_options = dict(options)
    if key_mask is not None:
        if "key_mask" not in inspect.signature(spec.compress).parameters:
            raise ValueError(f"`key_mask` is not supported by the compression step of method {method!r}; got a "
                             "mask for it.")
        step_options["key_mask"] = key_mask[..., context]
    kept = spec.compress(q[..., context, :], k[..., context, :], v[..., context, :], budget=budget,
                         generator=generator, **step_options)
    kept = _checked_kept(method, kept, q, budget, context_length)
    width = budget + n - context_length

    def selection(start, stop):
        return compressed_indices(kept, context_length, n, start, stop, key_mask)

    continuation = q[..., context_length:, :]
    output = attend_compressed(q, k, v, kept, context_length, key_mask)

    def build():
        _, indices, weights = attend_selected(continuation, k, v, selection, width=width, record=True)
        return RowSparseOperator(indices, weights, n)

    info = {"context_length": context_length, "setting": "compressed", "kept": kept}
    return Approximation(method, "softmax", output, build, info)


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
