r"""A cache policy's per-key scores: the kept set they define, and its pooling over a group of query heads.

A policy that declares ``score=`` (:func:`approxlab.methods.register`) gives each context key of one query head a
score; the kept set of a budget :math:`b` is ``scores.topk(b, dim=-1).indices``. Tokens the policy must keep score
:math:`+\infty`, padded keys :math:`-\infty`. With grouped-query attention (:math:`H` query heads reading
:math:`H_{kv}` key/value heads, :math:`g = H/H_{kv}`), :func:`pool_group` pools the :math:`g` query heads' scores of
a group into one score per key and KV head, as kvpress does (``ScorerPress`` subclasses, e.g. ``SnapKVPress.score``:
each query head's final score, then ``scores.view(bsz, num_key_value_heads, num_key_value_groups, k_len).mean(2)``).
"""

from __future__ import annotations

import inspect
import math
import warnings

import torch

from ..errors import RopeWarning
from ._shared_scores import shared

__all__ = ["scored_compress", "scores_of", "checked_scores", "pool_group", "top_budget", "score_options",
           "MODEL_INPUTS", "model_inputs", "warn_without_rope"]

_PASSED = ("q", "k", "v", "generator", "key_mask")


def checked_scores(method: str, scores, shape: tuple, budget: int) -> torch.Tensor:
    r"""A score function's result as a floating ``shape`` = ``(*batch, n_c)`` tensor with at most ``budget``
    :math:`+\infty` entries per row (the tokens it must keep), else an error naming ``method``."""
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        got = scores.dtype if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise TypeError(f"the score function of method {method!r} must return floating scores (*batch, n_c); got "
                        f"{got}.")
    if tuple(scores.shape) != tuple(shape):
        raise ValueError(f"the score function of method {method!r} must return scores of shape (*batch, n_c) = "
                         f"{tuple(shape)}; got {tuple(scores.shape)}.")
    if bool(torch.isnan(scores).any()):
        raise ValueError(f"the score function of method {method!r} returned NaN scores; scores are finite, +inf "
                         "(must keep) or -inf (padding).")
    kept_for_sure = int((scores == math.inf).sum(-1).max()) if scores.numel() else 0
    if kept_for_sure > budget:
        raise ValueError(f"the score function of method {method!r} scores +inf (must keep) more context tokens "
                         f"than the budget allows: {kept_for_sure} > num_features = {budget}.")
    return scores


def scores_of(name: str, score, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, budget: int,
              **options) -> torch.Tensor:
    """``score(q, k, v, **options)`` (with ``budget=`` when it declares that keyword), checked: ``(*batch, n_c)``;
    inside :func:`~approxlab.cache._shared_scores.shared_scores`, a score function without ``budget`` is computed
    once for every budget."""
    takes_budget = "budget" in inspect.signature(score).parameters
    if takes_budget:
        scores = score(q, k, v, budget=budget, **options)
    else:  # inside shared_scores(): computed once for every budget
        scores = _shared_score(score, q, k, v, **options)
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), k.shape[-2])
    return checked_scores(name, scores, shape, budget)


@shared
def _shared_score(score, q, k, v, **options):
    """``score(q, k, v, **options)``, shared inside :func:`~approxlab.cache._shared_scores.shared_scores`."""
    return score(q, k, v, **options)


def top_budget(scores: torch.Tensor, budget: int) -> torch.Tensor:
    """The kept set of ``scores`` ``(*batch, n_c)``: ``scores.topk(budget, dim=-1).indices``, ``(*batch, budget)``."""
    return scores.topk(budget, dim=-1).indices


def pool_group(scores: torch.Tensor, groups: int) -> torch.Tensor:
    r"""Pool the scores ``(*batch, H, n_c)`` of each group of ``groups`` consecutive query heads into
    ``(*batch, H / groups, n_c)``: their mean (kvpress's ``scores.view(..., H_kv, g, n).mean(2)``).

    Query head :math:`h` reads KV head :math:`\lfloor h / g\rfloor` (transformers' ``repeat_kv``). A token one head
    must keep (:math:`+\infty`) is kept by the group; a padded one (:math:`-\infty`, padding is per sequence) stays
    padded, also where another head of the group would keep it.
    """
    pooled = scores.unflatten(-2, (scores.shape[-2] // groups, groups)).mean(-2)
    return pooled.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)


def scored_compress(name: str, score):
    r"""The compression step of a policy that declares only ``score``: the top ``budget`` of its scores.

    The function returned takes ``compress(q, k, v, *, budget, generator=None, key_mask=None, **options)`` (its
    signature is the score function's, with ``budget``) and returns :func:`top_budget` of :func:`scores_of`.
    """
    signature = inspect.signature(score)
    takes_budget = "budget" in signature.parameters
    parameters = list(signature.parameters.values())
    if not takes_budget:
        at = next((i for i, p in enumerate(parameters) if p.kind is inspect.Parameter.VAR_KEYWORD), len(parameters))
        parameters.insert(at, inspect.Parameter("budget", inspect.Parameter.KEYWORD_ONLY))

    def compress(q, k, v, *, budget, **options):
        return top_budget(scores_of(name, score, q, k, v, budget=budget, **options), budget)

    compress.__signature__ = signature.replace(parameters=parameters)
    compress.__name__ = compress.__qualname__ = f"top_budget_of_{getattr(score, '__name__', 'score')}"
    compress.__doc__ = f"The top ``budget`` context tokens of the scores of method {name!r} (derived from them)."
    return compress


def score_options(score) -> list[str] | None:
    """The score function's own keywords (besides q, k, v, budget, generator, key_mask); None if it takes
    ``**kwargs``."""
    parameters = inspect.signature(score).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return sorted(name for name, p in parameters.items() if name not in (*_PASSED, "budget")
                  and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


MODEL_INPUTS = ("rope_base", "rope_frequencies")
"""The options a model supplies to a cache policy (:func:`model_inputs`): its rotary embedding."""


def model_inputs(spec, options: dict, *, rope_frequencies=None) -> dict:
    r"""The options a model supplies to ``spec``'s compression step, beside the caller's ``options``.

    A step (``spec.score``, else ``spec.compress``) that takes ``rope_base`` or ``rope_frequencies`` gets
    ``rope_frequencies`` -- the model's ``inv_freq`` ``(p // 2,)``, which covers a scaled RoPE -- unless the caller
    passed either; a model without a rotary embedding supplies ``rope_frequencies=None``, and the policy reads its
    keys as un-rotated (stated, so :func:`warn_without_rope` stays silent). An input the policy declares (``spec.inputs``, :func:`approxlab.methods.register`)
    that is none of :data:`MODEL_INPUTS` and that the caller did not pass is refused, before anything runs.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import get
    >>> sorted(model_inputs(get("cap"), {}, rope_frequencies=torch.ones(4)))
    ['rope_frequencies']
    >>> model_inputs(get("cap"), {})  # a model without RoPE
    {'rope_frequencies': None}
    >>> model_inputs(get("cap"), {"rope_base": 1e4}, rope_frequencies=torch.ones(4)), model_inputs(get("knorm"), {})
    ({}, {})
    """
    step = spec.score if spec.score is not None else spec.compress
    if step is None:
        return {}
    parameters = inspect.signature(step).parameters
    supplied = {}
    if any(name in parameters for name in MODEL_INPUTS) and not any(name in options for name in MODEL_INPUTS):
        supplied["rope_frequencies"] = rope_frequencies
    missing = [name for name in getattr(spec, "inputs", ()) if name not in MODEL_INPUTS and name not in options]
    if missing:
        model = "a rotary embedding" if rope_frequencies is not None else "no rotary embedding"
        raise ValueError(f"method {spec.name!r} needs `{missing[0]}`, which the model ({model}) cannot supply: the "
                         f"model supplies only {' or '.join(MODEL_INPUTS)} from its RoPE; pass {missing[0]}=... "
                         f"yourself; got no {missing[0]}.")
    return supplied


ROPE_STATED = (*MODEL_INPUTS, "keys_pre_rope")
"""The options that tell a RoPE-aware policy how the keys were rotated: the frequencies (``None``: no RoPE), or
the keys before the rotation."""


def warn_without_rope(spec, options: dict) -> None:
    r"""Warn (:class:`~approxlab.errors.RopeWarning`, once per call of the caller's caller) when ``spec`` declares
    that it un-rotates keys with the model's RoPE (``"rope_base"`` in ``spec.inputs``: expected-attention, CAP,
    leverage-score, Compactor) and ``options`` state none of :data:`ROPE_STATED`: the policy would read post-RoPE
    keys as un-rotated without a word. ``rope_frequencies=None`` states a model without RoPE. A policy that declares
    only ``"rope_frequencies"`` (a press of :func:`~approxlab.methods.from_press`, handed the frequencies on its
    stand-in module) takes the keys as they come and is not warned."""
    declared = [name for name in getattr(spec, "inputs", ()) if name == "rope_base"]
    if not declared or any(name in options for name in ROPE_STATED):
        return
    warnings.warn(RopeWarning(
        f"method {spec.name!r} reads the rotary embedding (it declares inputs={tuple(spec.inputs)!r}) but got no "
        "rope_frequencies or rope_base: it takes the keys and queries as un-rotated, which is right only for a "
        "model without RoPE. Pass rope_frequencies= (the layer's inv_freq, (p // 2,)) or rope_base= (the model's "
        "rope_theta), or rope_frequencies=None for keys without RoPE; approxlab.patch_attention supplies the "
        "model's own."), stacklevel=3)
