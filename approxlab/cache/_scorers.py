r"""What the per-key cache scorers (kvpress's presses as approxlab cache policies) share.

A scorer maps the context of one query head and the KV head it reads, ``q, k, v: (*batch, n_c, p)``, to
``(*batch, n_c)`` floating scores; higher is kept, the kept set of a budget :math:`b` being
``scores.topk(b, dim=-1).indices``. Tokens a policy must keep (sinks, the last token) score
:math:`+\infty`; padded keys (``key_mask`` False) score :math:`-\infty`. Under grouped-query attention the
scores of a group's query heads are averaged before one set per KV head is kept (kvpress's pooling); the
scorers do not do it themselves.

With a ``key_mask`` every scorer scores the sequence with its padding removed: statistics (means, sums,
z-scores) run over the real tokens only, and "the first ``s`` tokens" or "the last token" count real tokens
(their ranks, :func:`approxlab.methods._selection.real_ranks`).
"""

from __future__ import annotations

import math

import torch

from .._validation import check_qkv, check_tensor
from ..linalg.scaling import balance
from ..methods._masking import check_key_mask
from ..methods._selection import real_ranks

__all__ = ["FEATURES", "Context", "check_context", "check_extra_input", "finish", "masked_mean", "masked_zscore",
           "last_real_query", "fit_sinks", "unit_scale"]

FEATURES = "context tokens kept (the cache budget b)"
"""What a scorer's budget counts (its ``features`` in the registry)."""


class Context:
    """The validated context: ``batch`` shape, ``n`` tokens, ``real`` ``(*batch, n)`` bool (all True without a
    mask), ``ranks`` ``(*batch, n)`` of the real tokens and ``count`` ``(*batch, 1)`` real tokens per sequence."""

    def __init__(self, q, k, key_mask):
        self.batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        self.n = k.shape[-2]
        self.key_mask = key_mask
        self.ranks, _ = real_ranks(key_mask, self.batch, self.n, k.device)
        self.count = self.ranks[..., -1:] + 1
        self.real = (torch.ones(*self.batch, self.n, dtype=torch.bool, device=k.device) if key_mask is None
                     else key_mask.expand(*self.batch, self.n))

    def ends(self, first: int = 0, last: int = 0) -> torch.Tensor:
        """``(*batch, n)`` bool: the first ``first`` and the last ``last`` real tokens."""
        return self.real & ((self.ranks < first) | (self.ranks >= self.count - last))


def check_context(q, k, v, key_mask) -> Context:
    """Validate a scorer's inputs (``q``, ``k``, ``v`` of one context length ``n_c``) and its ``key_mask``."""
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"`q` and `k` must be the same context (n_c queries and n_c keys); got q.shape="
                         f"{tuple(q.shape)} and k.shape={tuple(k.shape)}.")
    return Context(q, k, check_key_mask(key_mask, k))


def check_extra_input(x, name: str, policy: str, like: torch.Tensor, how: str) -> torch.Tensor:
    """An input a policy needs besides ``q, k, v`` (e.g. ``keys_pre_rope``): ``(*batch, n_c, p)`` like ``like``.

    Missing, the error names the policy, the input and ``how`` to obtain it."""
    if x is None:
        raise ValueError(f"{policy} needs `{name}`: {how}; got None.")
    check_tensor(x, name)
    if tuple(x.shape) != tuple(like.shape):
        raise ValueError(f"`{name}` must have the shape of the context's keys (*batch, n_c, p) = "
                         f"{tuple(like.shape)}; got {tuple(x.shape)}.")
    if x.dtype != like.dtype or x.device != like.device:
        raise ValueError(f"`{name}` must share dtype and device with `k` ({like.dtype}/{like.device}); got "
                         f"{x.dtype}/{x.device}.")
    return x


def finish(scores: torch.Tensor, context: Context, keep: torch.Tensor | None = None) -> torch.Tensor:
    r"""``scores`` ``(*batch, n)`` with :math:`+\infty` on ``keep`` and :math:`-\infty` on padded keys."""
    scores = scores.expand(*context.batch, context.n)
    if keep is not None:
        scores = scores.masked_fill(keep, math.inf)
    return scores.masked_fill(~context.real, -math.inf)


def masked_mean(x: torch.Tensor, real: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of ``x`` over ``dim`` (a token dimension) counting the ``real`` positions only; keeps ``dim``.

    ``real`` is ``x``'s shape without its trailing dimensions after ``dim`` (e.g. ``(*batch, n)`` for
    ``x: (*batch, n, p)`` and ``dim=-2``)."""
    weights = real.to(x.dtype)
    while weights.ndim < x.ndim:
        weights = weights.unsqueeze(-1)
    return (x * weights).sum(dim, keepdim=True) / weights.sum(dim, keepdim=True).clamp_min(1)


def masked_zscore(x: torch.Tensor, real: torch.Tensor, floor: float = 1e-6) -> torch.Tensor:
    r""":math:`(x - \bar x)/\max(s, \text{floor})` per sequence over the real tokens, ``s`` the sample standard
    deviation (:math:`n - 1`, torch's ``std``); a sequence of one real token gives 0."""
    mean = masked_mean(x, real, -1)
    count = real.sum(-1, keepdim=True)
    centered = torch.where(real, x - mean, torch.zeros_like(x))
    variance = (centered * centered).sum(-1, keepdim=True) / (count - 1).clamp_min(1)
    return centered / variance.sqrt().clamp_min(floor)


def last_real_query(q: torch.Tensor, context: Context) -> torch.Tensor:
    """``(*batch, 1, p)``: the query of each sequence's last real token."""
    positions = torch.arange(context.n, device=q.device)
    last = torch.where(context.real, positions, torch.full_like(positions, -1)).amax(-1)  # (*batch,)
    q = q.expand(*context.batch, *q.shape[-2:])
    return torch.gather(q, -2, last.view(*context.batch, 1, 1).expand(*context.batch, 1, q.shape[-1]))


def fit_sinks(context: Context, budget, *sizes: int) -> tuple[int, ...]:
    """Sink sizes (e.g. ``n_sink``, or the first and last sinks) that fit: their sum at most ``budget`` (when
    given: the tokens a policy forces stay within what it may keep) and below the real tokens of the shortest
    context (some token is scored). A size is shrunk from the last one backwards; sizes that fit are kept."""
    limit = int(context.count.min()) - 1
    if budget is not None:
        limit = min(limit, int(budget))
    fitted, excess = list(sizes), max(0, sum(sizes) - max(0, limit))
    for at in reversed(range(len(fitted))):
        cut = min(fitted[at], excess)
        fitted[at], excess = fitted[at] - cut, excess - cut
    return tuple(fitted)


def unit_scale(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(*batch, n_c, p)`` times the power of two that brings each head's largest entry into [0.5, 1):
    exact, so a scorer that squares or sums values neither overflows nor underflows, and a global scale of the
    values (which leaves attention's output linear in them) leaves the kept set alone."""
    return balance(x)[0]
