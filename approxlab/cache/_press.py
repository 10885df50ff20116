r"""A kvpress press as an approxlab method: any object with kvpress's scorer interface, registered by name.

kvpress (NVIDIA) writes a score-based cache policy as a *press*: an object with a ``compression_ratio`` and
``score(module, hidden_states, keys, values, attentions, kwargs)`` returning ``(batch, kv_heads, n)`` scores,
the cache keeping the top ``int(n * (1 - compression_ratio))`` of them (``ScorerPress``). :func:`from_press`
registers such an object as a cache policy (:func:`approxlab.methods.register` with ``score=``), so
:func:`approxlab.approximate` (its causal form), :func:`approxlab.kv_cache_attention`,
:func:`approxlab.patch_attention` and every study's ``--plugin`` take it like a built-in -- without kvpress
installed: the press is only called.

Public API (re-exported by :mod:`approxlab.methods`)::

    from_press(press, *, name, features=..., randomized=False, attentions=False, overwrite=False) -> MethodSpec
    PressModule(num_heads, head_dim, rope_frequencies=None)   # the ``module`` a press is handed
"""

from __future__ import annotations

import math
import types

import torch

from ..kernels import causal_mask, softmax_matrix
from ._scorers import FEATURES, check_context, finish
from ..methods.registry import get, register

__all__ = ["from_press", "PressModule"]


class PressModule(torch.nn.Module):
    r"""The ``module`` argument of a press called by approxlab: a stand-in for the attention layer.

    approxlab calls a press with one context's keys and values, not inside a model's layer, so it hands over
    the attributes kvpress's presses read from the layer, and nothing else (no ``q_proj``, ``k_proj``, ...):

    - ``head_dim``: :math:`p`;
    - ``layer_idx``: None (a call is for one layer, but not told which);
    - ``config``: ``num_attention_heads`` and ``num_key_value_heads`` both the heads :math:`H` of the call (the
      keys come repeated to the query heads: a press's group pooling is then the identity, and approxlab pools
      the scores of a group itself), ``head_dim`` :math:`p` and ``hidden_size`` :math:`Hp`;
    - ``rotary_emb``: ``inv_freq`` the model's RoPE frequencies ``(p // 2,)`` when known
      (:func:`approxlab.patch_attention` supplies them for a RoPE model), else None.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import PressModule
    >>> module = PressModule(4, 16)
    >>> module.head_dim, module.config.num_key_value_heads, module.config.hidden_size, module.rotary_emb
    (16, 4, 64, None)
    """

    def __init__(self, num_heads: int, head_dim: int, rope_frequencies: torch.Tensor | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.layer_idx = None
        self.config = types.SimpleNamespace(num_attention_heads=num_heads, num_key_value_heads=num_heads,
                                            head_dim=head_dim, hidden_size=num_heads * head_dim)
        self.rotary_emb = None if rope_frequencies is None else types.SimpleNamespace(inv_freq=rope_frequencies)


def from_press(press, *, name: str, features: str = FEATURES, randomized: bool = False, attentions: bool = False,
               overwrite: bool = False):
    r"""Register a kvpress press (any object with its scorer interface) as the cache policy ``name``.

    Parameters
    ----------
    press : object
        Anything with kvpress's ``score(module, hidden_states, keys, values, attentions, kwargs)`` returning
        ``(batch, kv_heads, n)`` floating scores, higher kept (a ``ScorerPress`` subclass, or a class of one's
        own). Its ``compression_ratio`` is not read: the budget is the call's (``num_features`` or
        ``compression_ratio=press.compression_ratio``, the same kept count as kvpress's).
    name : str
        The method's name (:func:`approxlab.methods.register`'s rules).
    features : str, optional
        What ``num_features`` counts (default: the context tokens kept, the cache budget).
    randomized : bool, default False
        Whether the press draws at random (studies then run several seeds). A press draws from its own
        generator or torch's global one, not from approxlab's ``generator``: only deterministic presses are
        reproducible here.
    attentions : bool, default False
        Hand the press the context's causal attention weights ``(batch, heads, n, n)`` (what kvpress passes to
        presses that read them, e.g. ``ObservedAttentionPress``, with eager attention); otherwise None.
    overwrite : bool, default False
        Replace an earlier registration of ``name``.

    Returns
    -------
    MethodSpec
        The registered method (causal-only, its scores the press's; :func:`approxlab.methods.cache_policy`).

    Raises
    ------
    TypeError
        ``press`` without a callable ``score``; ``attentions`` not a bool.
    ValueError
        The registration's own errors (a taken ``name`` without ``overwrite``). When the method runs: a press
        whose ``score`` raises ``AttributeError`` or ``TypeError`` (e.g. one that reads ``hidden_states`` or the
        layer's projections, which approxlab does not have), with a message saying what approxlab passes; scores
        of the wrong shape, NaN, or more than the budget at :math:`+\infty` (approxlab's checks of a score).

    Notes
    -----
    **What the press is handed.** For a context of :math:`n_c` tokens of ``(*batch, n_c, p)`` queries, keys and
    values (one query head each, the keys repeated from its KV head), approxlab calls ``press.score(module,
    hidden_states, keys, values, attentions, kwargs)`` with

    - ``keys``, ``values``: ``(B, H, n_c, p)``, the batch's last dimension as the heads (``H = batch[-1]``,
      ``B`` the product of the rest; one head without a batch). In a patched model these are the layer's keys
      after RoPE, repeated to the query heads, as kvpress's hook receives them (there per KV head);
    - ``module``: a :class:`PressModule`, the layer's attributes a press reads;
    - ``hidden_states``: None -- approxlab computes attention from a layer's ``q, k, v`` and never sees the
      layer's input; a press that needs it (kvpress's SnapKV and Expected Attention recompute queries from it)
      is refused with a message when it runs, and approxlab's own ``snapkv`` and ``expected-attention``, which
      read the queries directly, are the same policies;
    - ``attentions``: with ``attentions=True``, :math:`\operatorname{softmax}(QK^\top/\sqrt p)` of the context
      under the causal mask, padded keys masked and padded queries' rows 0, in ``q``'s dtype; else None;
    - ``kwargs``: ``{}``.

    The press's ``(B, H, n_c)`` scores come back as ``(*batch, n_c)``, padded keys (``key_mask`` False) at
    :math:`-\infty`; under grouped-query attention approxlab averages a group's scores and keeps one set per KV
    head, as ``ScorerPress`` does (kvpress pools inside each press, on its query-head statistics).

    **Cost**: the press's own, plus :math:`O(n_c^2 p)` for the attention weights when ``attentions=True``.

    References
    ----------
    kvpress (NVIDIA), ``kvpress/presses/scorer_press.py`` (``ScorerPress.score`` and ``compress``).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.methods import from_press, unregister
    >>> class KnormLikePress:  # kvpress's KnormPress, written without kvpress
    ...     compression_ratio = 0.5
    ...     def score(self, module, hidden_states, keys, values, attentions, kwargs):
    ...         return -keys.norm(dim=-1)
    >>> spec = from_press(KnormLikePress(), name="my-knorm")
    >>> q = k = v = torch.randn(2, 64, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> ours = approxlab.kv_cache_attention("my-knorm", q, k, v, context_length=48, compression_ratio=0.5)
    >>> knorm = approxlab.kv_cache_attention("knorm", q, k, v, context_length=48, num_features=24)
    >>> torch.equal(ours.output, knorm.output)
    True
    >>> _ = unregister("my-knorm")
    """
    if not callable(getattr(press, "score", None)):
        raise TypeError(f"`press` must have kvpress's scorer interface, a method score(module, hidden_states, keys, "
                        f"values, attentions, kwargs); got {type(press).__name__} without a callable score.")
    if not isinstance(attentions, bool):
        raise TypeError(f"`attentions` must be a bool; got {attentions!r}.")
    label = type(press).__name__

    def press_scores(q, k, v, *, generator=None, key_mask=None, rope_frequencies=None):
        context = check_context(q, k, v, key_mask)
        heads = context.batch[-1] if context.batch else 1
        batch = (*context.batch, context.n)
        keys, values = (x.expand(*context.batch, *x.shape[-2:]).reshape(-1, heads, *x.shape[-2:]) for x in (k, v))
        weights = None
        if attentions:
            mask = causal_mask(context.n, device=q.device)
            if key_mask is not None:
                mask = mask & context.real.unsqueeze(-2)
            weights = softmax_matrix(q.expand(*context.batch, *q.shape[-2:]), keys.view(*batch, k.shape[-1]),
                                     mask=mask)
            weights = (weights.nan_to_num(0.0) * context.real.unsqueeze(-1)).reshape(-1, heads, context.n, context.n)
        module = PressModule(heads, k.shape[-1], rope_frequencies)
        try:
            scores = press.score(module, None, keys, values, weights, {})
        except (AttributeError, TypeError) as error:
            raise ValueError(f"the press {label} of method {name!r} failed in score(module, hidden_states, keys, "
                             f"values, attentions, kwargs): approxlab passes a stand-in module (head_dim, config, "
                             f"rotary_emb; no projections), hidden_states=None, attentions="
                             f"{'the causal weights' if attentions else 'None (from_press(..., attentions=True) passes them)'}"
                             f" and kwargs={{}}; a press that needs the layer's input or weights cannot run here "
                             f"({type(error).__name__}: {error}).") from error
        if not isinstance(scores, torch.Tensor) or scores.numel() != math.prod(batch):
            got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ValueError(f"the press {label} of method {name!r} must return scores (batch, kv_heads, n) = "
                             f"{(keys.shape[0], heads, context.n)}; got {got}.")
        return finish(scores.reshape(batch), context)

    press_scores.__name__ = press_scores.__qualname__ = f"{name.replace('-', '_')}_press_scores"
    press_scores.__doc__ = f"The scores of the press {label} (:func:`approxlab.methods.from_press`)."
    register(name, score=press_scores, target="softmax", features=features, randomized=randomized,
             inputs=("rope_frequencies",), overwrite=overwrite)
    return get(name)
