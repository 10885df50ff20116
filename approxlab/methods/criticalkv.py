r"""CriticalKV (Feng et al., 2025): a base policy's scores, then a second stage weighted by how much each
value moves the layer's output (kvpress's ``CriticalKVPress``).

A per-key cache scorer (:mod:`approxlab.cache._scorers`) over another registered policy's scores (``base``,
default SnapKV's): the top half of the budget by the base scores, the rest by the base score times
:math:`\lVert W_O^{h} v_j\rVert_1`, the :math:`\ell_1` norm of the value projected by the head's block of the
output projection.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float, check_tensor
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish
from ..cache._scores import scores_of

__all__ = ["criticalkv_scores", "projected_value_norms", "REGISTRATION", "CRITICALKV"]


def projected_value_norms(v: torch.Tensor, output_projection=None) -> torch.Tensor:
    r""":math:`\lVert W_O^{h} v_j\rVert_1`, ``(*batch, n_c)``: the :math:`\ell_1` norm of each value row of ``v``
    ``(*batch, n_c, p_v)`` times ``output_projection`` ``(..., p_v, d)`` (the head's block of :math:`W_O^\top`,
    broadcast over the batch); :math:`\lVert v_j\rVert_1` without one (:math:`W_O = I`).

    Examples
    --------
    >>> import torch
    >>> v = torch.tensor([[1.0, -2.0], [0.5, 0.5]], dtype=torch.float64)
    >>> projected_value_norms(v).tolist(), projected_value_norms(v, 2 * torch.eye(2, dtype=torch.float64)).tolist()
    ([3.0, 1.0], [6.0, 2.0])
    """
    if output_projection is None:
        return v.abs().sum(-1)
    check_tensor(output_projection, "output_projection")
    if output_projection.shape[-2] != v.shape[-1] or output_projection.dtype != v.dtype:
        raise ValueError(f"`output_projection` must be (..., p_v, d) with p_v = {v.shape[-1]} (the head's block of "
                         f"W_O transposed) in the values' dtype {v.dtype}; got shape {tuple(output_projection.shape)}"
                         f" and dtype {output_projection.dtype}.")
    try:
        return (v @ output_projection.to(v.device)).abs().sum(-1)
    except RuntimeError as error:
        raise ValueError(f"`output_projection` {tuple(output_projection.shape)} must broadcast with the values' batch "
                         f"{tuple(v.shape[:-2])}; got: {error}") from None


def _group_mean(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """``x`` ``(*batch, H, n)`` with each group of ``group_size`` consecutive heads replaced by its mean."""
    pooled = x.unflatten(-2, (x.shape[-2] // group_size, group_size)).mean(-2, keepdim=True)
    return pooled.expand(*pooled.shape[:-2], group_size, x.shape[-1]).flatten(-3, -2)


def _base_scores(base, base_options, q, k, v, budget, generator, key_mask):
    """The registered policy ``base``'s checked scores of the context (its ``budget``: the caller's, else n_c)."""
    from . import registry  # the registry imports the built-in policies lazily, this one among them

    spec = registry.get(base)
    if spec.score is None or base == "criticalkv":
        with_scores = [name for name in registry.available() if registry.get(name).score is not None
                       and name != "criticalkv"]
        raise ValueError(f"`base` must be a policy with per-key scores other than criticalkv, one of {with_scores}; "
                         f"got {base!r}.")
    if base_options is not None and not isinstance(base_options, dict):
        raise TypeError(f"`base_options` must be a dict of the base policy's options or None; got "
                        f"{type(base_options).__name__}.")
    return scores_of(base, spec.score, q, k, v, budget=budget, generator=generator, key_mask=key_mask,
                     **(base_options or {}))


def criticalkv_scores(q, k, v, *, generator=None, key_mask=None, budget=None, base="snapkv", base_options=None,
                      output_projection=None, first_stage_ratio=0.5, epsilon=1e-4, group_size=None):
    r"""CriticalKV's two-stage scores: the base policy's top :math:`\lfloor b\rho\rfloor` first, then
    :math:`(s_j + \epsilon)\,\lVert W_O^{h} v_j\rVert_1`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: the context of one query head and the
        KV head it reads; with ``group_size``, ``(*batch, H, n_c, p)``: every query head of a layer at dimension
        -3 and, repeated, the KV head each reads.
    generator : torch.Generator, optional
        Passed to the base policy (a randomized base draws from it).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; padded keys score :math:`-\infty` (and are passed to the base).
    budget : int, optional
        The cache budget :math:`b` (given by the KV-cache setting); the first stage keeps
        :math:`\lfloor b\rho\rfloor`. None: :math:`b = n_c`.
    base : str, default "snapkv"
        A registered policy with per-key scores (``snapkv``, ``expected-attention``, ``knorm``, ...): the first
        stage and :math:`s_j`. kvpress warns when its ``ExpectedAttentionPress`` keeps ``use_vnorm``; here too the
        caller chooses (``base_options={"use_vnorm": False}``).
    base_options : dict, optional
        The base policy's options (e.g. ``{"window": 16}``, ``{"rope_base": 1e4, "use_vnorm": False}``).
    output_projection : torch.Tensor, optional
        ``(..., p_v, d)``, broadcast over the batch: the head's block of the output projection, transposed
        (:math:`W_O^{h\top}`, kvpress's ``o_proj.weight.T.view(H, head_dim, hidden)[h]``);
        :func:`approxlab.patch_attention` supplies the patched layer's. None: :math:`W_O = I`, the values' own
        :math:`\ell_1` norms.
    first_stage_ratio : float, default 0.5
        :math:`\rho \in [0, 1]`, the share of the budget chosen by the base scores alone.
    epsilon : float, default 1e-4
        :math:`\epsilon \ge 0` added to the base scores before the weighting.
    group_size : int, optional
        None (default): each head's own scores (the per-head contract; the framework averages a group's
        scores). An integer :math:`g`: kvpress's rule for grouped-query attention, the heads at dimension -3
        taken in groups of :math:`g` (one KV head's query heads), the base scores and the projected norms
        averaged over each group before the two stages, every head of a group returned its group's scores.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``q.dtype``; higher is kept.

    Notes
    -----
    The paper bounds the change of the attention output :math:`\sum_j a_j W_O v_j` when tokens are evicted by
    the attention weights times :math:`\lVert W_O v_j\rVert_1` (Theorem 1 and Eq. (8) of Feng et al.) and
    selects in two stages (their Algorithm 1): with the base scores :math:`s`, the set :math:`\mathcal S_1` of
    the top :math:`\lfloor b\rho\rfloor` of :math:`s`, then the top of

    .. math::

        \sigma_j = (s_j + \epsilon)\,\lVert W_O^{h} v_j\rVert_1

    for the rest of the budget. The returned score is :math:`\sigma_j` on tokens outside :math:`\mathcal S_1`
    and :math:`\sigma_j + \Delta` on :math:`\mathcal S_1`, :math:`\Delta` one more than the spread of the row's
    finite :math:`\sigma`: every first-stage token outranks every other, so ``scores.topk(b)`` is the two
    stages' set. Tokens the base must keep (:math:`+\infty`: sinks, SnapKV's window) stay :math:`+\infty`.

    **What differs from kvpress** (``CriticalKVPress.score``). kvpress writes the largest float on
    :math:`\mathcal S_1`; here :math:`\sigma_j + \Delta` (the same kept set for every :math:`b \ge
    \lfloor b\rho\rfloor`, and a defined order inside :math:`\mathcal S_1`). kvpress counts the first stage as
    ``int((1 - compression_ratio) * n_c * first_stage_ratio)``; here :math:`\lfloor b\rho\rfloor` -- the same
    number whenever :math:`n_c(1 - r)` is an integer, and for :math:`\rho = 1/2` always. kvpress's sinks and
    SnapKV window score ``max + 1``, fill the first stage before any other token and then enter
    :math:`\sigma` like any token; here they fill the first stage too and stay kept (:math:`+\infty`): the
    same set when :math:`\lfloor b\rho\rfloor` is at least their number. Under grouped-query attention kvpress pools the base scores and the
    norms over each group before the stages; the per-head default runs the stages per query head and the
    framework averages the results, which can keep other tokens -- ``group_size`` reproduces kvpress.

    **Cost**: the base policy's, plus :math:`O(n_c p_v d)` for the projected norms (:math:`O(n_c p_v)` without
    ``output_projection``).

    References
    ----------
    Feng, Lv, Cao, Xie, Zhou, "Identify critical KV cache in LLM inference from an output perturbation
    perspective" (arXiv:2502.03805). kvpress (NVIDIA), ``kvpress/presses/criticalkv_press.py``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = criticalkv_scores(q, k, v, budget=12, base_options={"window": 4})
    >>> scores.shape, int(scores[0].isinf().sum())  # SnapKV's window of 4 kept for sure
    (torch.Size([2, 32]), 4)
    """
    context = check_context(q, k, v, key_mask)
    budget = context.n if budget is None else check_int(budget, "budget", low=1)
    ratio = check_positive_float(first_stage_ratio, "first_stage_ratio", allow_zero=True)
    if ratio > 1:
        raise ValueError(f"`first_stage_ratio` must be in [0, 1]; got {first_stage_ratio!r}.")
    epsilon = check_positive_float(epsilon, "epsilon", allow_zero=True)
    if group_size is not None:
        group_size = check_int(group_size, "group_size", low=1)
        if len(context.batch) < 1 or context.batch[-1] % group_size:
            raise ValueError(f"`group_size` needs the layer's heads at dimension -3, (*batch, H, n_c, p), H a multiple "
                             f"of group_size; got q.shape={tuple(q.shape)} and group_size={group_size}.")
    scores = _base_scores(base, base_options, q, k, v, budget, generator, key_mask)
    norms = projected_value_norms(v, output_projection).expand(*context.batch, context.n)
    if group_size is not None:  # kvpress: base scores and norms pooled per KV head before the stages
        scores, norms = _group_mean(scores, group_size), _group_mean(norms, group_size)
    kept = scores == math.inf
    finite = context.real & ~kept
    weighted = torch.where(finite, (scores + epsilon) * norms, torch.zeros_like(norms))
    first = min(int(budget * ratio), context.n)
    if first:
        chosen = scores.masked_fill(~context.real, -math.inf).topk(first, dim=-1).indices  # kept ones count
        in_first = torch.zeros_like(finite).scatter(-1, chosen, True) & finite
        high = weighted.masked_fill(~finite, -math.inf).amax(-1, keepdim=True)
        low = weighted.masked_fill(~finite, math.inf).amin(-1, keepdim=True)
        spread = (high - low).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
        weighted = torch.where(in_first, weighted + spread + 1, weighted)
    return finish(weighted.to(q.dtype), context, keep=kept & context.real)


REGISTRATION = dict(score=criticalkv_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("criticalkv", **REGISTRATION)``.
``output_projection`` is optional (:func:`approxlab.patch_attention` supplies the model's)."""

CRITICALKV = cache_policy("criticalkv", **REGISTRATION)
"""The built-in method 'criticalkv': this policy's prompt compression as a causal method, its scores in the KV-cache
setting."""
__test__ = {"criticalkv": CRITICALKV.function}  # doctest skips a MethodSpec: run its function's examples
