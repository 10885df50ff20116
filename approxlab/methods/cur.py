r"""CurDKV (kvpress's ``CURPress``): approximate leverage scores of the keys and values, by squared row
norms normalised within local windows, combined (by default their product).

A per-key cache scorer (:mod:`approxlab.cache._scorers`); randomized only with a sketch.
"""

from __future__ import annotations

import torch

from .._validation import check_choice, check_int
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, fit_sinks, unit_scale
from .leverage_score import check_sketch, draw_sketch

__all__ = ["cur_scores", "LEVERAGE_TYPES", "REGISTRATION", "CUR"]

LEVERAGE_TYPES = ("key", "value", "kv_avg", "kv_product")
r"""``leverage_type``: :math:`\ell^K`, :math:`\ell^V`, their mean or their product (kvpress's default)."""


def _window_normalised(x, context, window):
    """``x`` ``(*batch, n)`` divided by its sum over each window of ``window`` consecutive real tokens (0/0 -> 0)."""
    if window is None:
        return x
    groups = context.ranks.clamp_min(0) // window
    sums = torch.zeros(*context.batch, context.n, dtype=x.dtype, device=x.device).scatter_add_(
        -1, groups, x * context.real)
    total = torch.gather(sums, -1, groups)
    return torch.where(total > 0, x / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(x))


def cur_scores(q, k, v, *, generator=None, key_mask=None, num_sinks=4, leverage_type="kv_product",
               local_window_size=16, sketch_dimension=None, sketch=None, budget=None):
    r"""Leverage proxies :math:`\ell^K_j \propto \lVert k_j\rVert^2`, :math:`\ell^V_j \propto \lVert v_j\rVert^2`
    (normalised within windows), combined and normalised to sum 1; :math:`+\infty` on the first
    ``num_sinks`` tokens.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (``q`` validated, not used): the
        cache's keys (after RoPE) and values.
    generator : torch.Generator, optional
        The CPU generator of the sketch, when ``sketch_dimension`` is set and ``sketch`` is not given.
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens: windows and sinks count real tokens, padded keys score
        :math:`-\infty`.
    num_sinks : int, default 4
        The first tokens kept (kvpress sets their score to 1.0, at least every other normalised score).
    budget : int, optional
        The cache budget (given by the KV-cache setting): the sinks are cut to fit within it and below the
        real tokens of the shortest context (:func:`approxlab.cache._scorers.fit_sinks`).
    leverage_type : {"kv_product", "key", "value", "kv_avg"}, default "kv_product"
        The combination: :math:`\ell^K\ell^V`, :math:`\ell^K`, :math:`\ell^V` or :math:`(\ell^K+\ell^V)/2`.
    local_window_size : int or None, default 16
        :math:`w`: the squared norms are normalised within consecutive windows of :math:`w` tokens (kvpress's
        ``use_local_approximation``); None: not normalised before combining.
    sketch_dimension : int, optional
        :math:`r`: project keys and values by one Gaussian :math:`G\in\mathbb R^{p\times r}`,
        :math:`\mathcal N(0, 1/r)` entries, before the norms (kvpress's ``use_random_leverage``, which
        fixes :math:`r = 20`); needs ``p_v = p``. None (default): no projection, deterministic.
    sketch : torch.Tensor, optional
        ``(p, r)``, a given :math:`G` (shared by every head, as kvpress's), with ``sketch_dimension=r``.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``k.dtype``; higher is kept.

    Notes
    -----
    CUR decomposition keeps rows by their leverage; CurDKV approximates the leverage of row :math:`j` of
    :math:`K` (of :math:`V`) by its squared norm, :math:`\lVert k_j\rVert^2/\sum_l\lVert k_l\rVert^2` -- the
    length-squared sampling probabilities of Drineas, Kannan and Mahoney -- here, as in kvpress, normalised
    within local windows (windows start at the first token; the last may be short). The product rewards
    tokens strong in both. kvpress's ``CURPress.score``; the sinks score :math:`+\infty` instead of 1.0
    (the same kept sets unless another token's normalised score reaches 1). Query heads of a group see the
    same repeated keys and values, so their scores are equal and the pooling keeps kvpress's.

    **Cost**: :math:`O(n_c(p + p_v))`, :math:`O(n_c p r)` with a sketch.

    References
    ----------
    CurDKV, "Value-guided KV compression for LLMs via approximated CUR decomposition" (arXiv:2509.15038).
    kvpress (NVIDIA), ``kvpress/presses/cur_press.py``.

    Examples
    --------
    >>> import torch
    >>> k = torch.ones(1, 8, 2, dtype=torch.float64)
    >>> k[0, 6] = 3.0  # the largest key and value outside the sinks
    >>> cur_scores(k, k, k, num_sinks=2, local_window_size=None).topk(3).indices.sort().values.tolist()
    [[0, 1, 6]]
    """
    context = check_context(q, k, v, key_mask)
    (num_sinks,) = fit_sinks(context, budget, check_int(num_sinks, "num_sinks", low=0))
    check_choice(leverage_type, "leverage_type", LEVERAGE_TYPES)
    if local_window_size is not None:
        local_window_size = check_int(local_window_size, "local_window_size", low=1)
    keys, values = k, unit_scale(v)
    if sketch_dimension is not None:
        r = check_int(sketch_dimension, "sketch_dimension", low=1)
        if v.shape[-1] != k.shape[-1]:
            raise ValueError(f"`sketch_dimension` projects keys and values by one matrix: it needs p_v = p; got "
                             f"p = {k.shape[-1]} and p_v = {v.shape[-1]}.")
        G = (draw_sketch((), k.shape[-1], r, generator, k) if sketch is None
             else check_sketch(sketch, (), k.shape[-1], r, k))
        keys, values = k @ G, v @ G
    elif sketch is not None:
        raise ValueError("`sketch` needs `sketch_dimension` (its number of columns r); got sketch_dimension=None.")
    key_leverage = _window_normalised((keys * keys).sum(-1), context, local_window_size)
    value_leverage = _window_normalised((values * values).sum(-1), context, local_window_size)
    scores = {"key": key_leverage, "value": value_leverage, "kv_avg": (key_leverage + value_leverage) / 2,
              "kv_product": key_leverage * value_leverage}[leverage_type] * context.real
    total = scores.sum(-1, keepdim=True)
    scores = scores / torch.where(total > 0, total, torch.ones_like(total))
    return finish(scores, context, keep=context.ends(first=num_sinks))


REGISTRATION = dict(score=cur_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("cur", **REGISTRATION)`` (randomized only
with ``sketch_dimension``)."""

CUR = cache_policy("cur", **REGISTRATION)
"""The built-in method 'cur': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"cur": CUR.function}  # doctest skips a MethodSpec: run its function's examples

