r"""SnapKV (Li et al., 2024): the prompt's KV cache compressed once, per head, by the votes of an
observation window.

A causal-only method: the prompt is processed with full causal attention; then the last ``window``
prompt queries vote for prefix tokens with their attention, the votes are pooled, the top tokens per
head plus the window are kept, and every later token attends the compressed prompt and the tokens
after it.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_choice, check_int
from ._base import CAUSAL_ONLY, method
from ._masking import check_key_mask
from ..cache._policy import prompt_compressed, prompt_length_of
from ._selection import safe_softmax

__all__ = ["snapkv", "SNAPKV", "compress_snapkv", "score_snapkv", "POOLINGS"]

POOLINGS = ("max", "avg")
"""``pooling`` of the votes: ``"max"`` (``max_pool1d``, the authors' LongBench configurations) or ``"avg"``
(``avg_pool1d``, zero padding counted, the default of their ``SnapKVCluster``)."""


def _observed(window: int, budget: int) -> int:
    """The observation window kept with a budget: ``min(window, budget)``."""
    return min(window, budget)


def score_snapkv(q, k, v, *, budget, generator=None, window=32, kernel_size=5, pooling="max", key_mask=None):
    r"""SnapKV's scores of a prompt ``q, k, v`` ``(*batch, n_c, p)``: the pooled votes of the observation window
    on the prefix, :math:`+\infty` on the window :math:`w = \min(\text{window}, b)` (every token with
    ``budget >= n_c``), :math:`-\infty` on padding; ``(*batch, n_c)``.

    The votes :math:`C_j = \sum_{i \ge n_c - w} a_{ij}` pooled over ``kernel_size`` neighbours (see
    :func:`snapkv`). With grouped K/V, :func:`approxlab.kv_cache_attention` averages these pooled scores over a
    group's query heads, as kvpress's ``SnapKVPress.score`` does (its votes are means over the window, ours
    sums: the same ranking). With ``budget == w`` the prefix is not voted on (score 0).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> scores = score_snapkv(q, k, v, budget=12, window=8)
    >>> scores.shape, scores[0, -9:].isinf().tolist()  # the window of 8 is kept for sure
    (torch.Size([2, 64]), [False, True, True, True, True, True, True, True, True])
    """
    window = check_int(window, "window", low=1)
    kernel_size = check_int(kernel_size, "kernel_size", low=1)
    if kernel_size % 2 == 0:
        raise ValueError(f"`kernel_size` must be odd (the pooled votes keep the prompt's length with padding "
                         f"kernel_size // 2); got {kernel_size}.")
    check_choice(pooling, "pooling", POOLINGS)
    key_mask = check_key_mask(key_mask, k)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = k.shape[-2]
    observed = n if budget >= n else _observed(window, budget)
    prefix = n - observed
    pooled = q.new_zeros(*batch, prefix)
    if budget > observed:
        logits = (q[..., prefix:, :] @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        observation = torch.arange(prefix, n, device=q.device)
        visible = torch.arange(n, device=q.device) <= observation.unsqueeze(-1)
        if key_mask is not None:
            visible = visible & key_mask.unsqueeze(-2)
        weights = safe_softmax(logits.expand(*batch, observed, n).masked_fill(~visible, -math.inf))
        if key_mask is not None:  # padded queries in the window do not vote
            weights = weights * key_mask.expand(*batch, n)[..., prefix:].unsqueeze(-1).to(weights.dtype)
        votes = weights[..., :prefix].sum(-2).reshape(-1, 1, prefix)
        pool = torch.nn.functional.max_pool1d if pooling == "max" else torch.nn.functional.avg_pool1d
        pooled = pool(votes, kernel_size, stride=1, padding=kernel_size // 2).reshape(*batch, prefix)
    scores = torch.cat([pooled, q.new_full((*batch, observed), math.inf)], dim=-1)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.expand(*batch, n), -math.inf)
    return scores


def compress_snapkv(q, k, v, *, budget, generator=None, window=32, kernel_size=5, pooling="max", key_mask=None):
    r"""SnapKV's compression of a prompt ``q, k, v`` ``(*batch, n_c, p)`` to ``budget`` tokens per head.

    Returns the ``(*batch, budget)`` indices kept: the :math:`b - w` prefix tokens with the largest pooled
    votes (:func:`score_snapkv`; ties go to the earlier token), then the observation window
    :math:`w = \min(\text{window}, b)`, the last :math:`w` prompt tokens (with ``budget >= n_c`` every token).
    See :func:`snapkv` for the rule.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> kept = compress_snapkv(q, k, v, budget=12, window=8)
    >>> kept.shape, kept[0, -8:].tolist()  # 4 tokens by pooled votes, then the window
    (torch.Size([2, 12]), [56, 57, 58, 59, 60, 61, 62, 63])
    """
    scores = score_snapkv(q, k, v, budget=budget, window=window, kernel_size=kernel_size, pooling=pooling,
                          key_mask=key_mask)
    batch, n = scores.shape[:-1], scores.shape[-1]
    if budget >= n:
        return torch.arange(n, device=q.device).expand(*batch, n)
    observed = _observed(window, budget)
    prefix = n - observed
    observation = torch.arange(prefix, n, device=q.device).expand(*batch, observed)
    if budget == observed:
        return observation
    # max pooling ties neighbours of a peak: the earlier token wins (a stable sort), a rule torch.topk leaves open
    chosen = torch.sort(scores[..., :prefix], dim=-1, descending=True, stable=True).indices[..., : budget - observed]
    return torch.cat([chosen, observation], dim=-1)


@method("snapkv", target="softmax", features="kept prompt tokens per head (observation window included)",
        randomized=False, causal=CAUSAL_ONLY, compress=compress_snapkv, score=score_snapkv)
def snapkv(q, k, v, *, num_features, generator=None, prompt_length=None, window=32, kernel_size=5, pooling="max",
           key_mask=None, causal=True):
    r"""SnapKV, causal: the prompt rows attend causally; the rows after the prompt attend the compressed
    prompt (``num_features`` tokens per head) and, causally, the tokens after it.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``.
    num_features : int
        :math:`b`, the prompt tokens kept per head, window included: the authors' ``max_capacity_prompt``.
        :math:`b \ge` ``prompt_length`` keeps the whole prompt (exact causal attention), as the authors'
        code does for a prompt shorter than its capacity.
    generator : torch.Generator, optional
        Unused (deterministic).
    prompt_length : int, optional
        :math:`P`, the prompt (``1 <= P <= n``); default ``n // 2`` (at least 1). Rows ``i < P`` are the
        prompt, compressed once after it.
    window : int, default 32
        The observation window :math:`w` (the authors' ``window_size``); a budget :math:`b < w` keeps the
        last :math:`b` prompt tokens only.
    kernel_size : int, default 5
        The pooling kernel (odd).
    pooling : {"max", "avg"}, default "max"
        ``"max"`` as in the authors' LongBench configurations (``config/ablation_c*_w32_k7_maxpool.json``),
        ``"avg"`` as in the default of their ``SnapKVCluster``.
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on real tokens: padded keys are never attended nor kept (their pooled
        vote is :math:`-\infty`) and padded window queries do not vote.
    causal : bool, default True
        Must be True: the method is causal-only (``approximate(..., causal=True)``).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (formed on request); ``info``: ``kept`` ``(*batch, b)`` the prompt tokens kept per head and
        ``prompt_length``.

    Notes
    -----
    Section 4 of the paper (Listing 1, "Implementation of SnapKV in pseudo PyTorch style"): with
    :math:`a_{ij}` the causal softmax rows of the prompt, the last :math:`w` prompt queries vote

    .. math::

        C_j = \sum_{i = P-w}^{P-1} a_{ij}, \qquad j < P - w,

    the votes are pooled (``pool1d(C, kernel_size, padding=kernel_size // 2, stride=1)``, the clustering
    of Section 4.2), and each head keeps the :math:`b - w` prefix tokens of the largest pooled votes and
    the window (ties between pooled votes, which max pooling makes common, go to the earlier token). Each
    row :math:`i \ge P` is then the exact softmax over the kept prompt tokens and the
    tokens :math:`P, \dots, i`: the prompt is compressed once and the tokens after it are not evicted.
    The rows after the prompt are :func:`approxlab.kv_cache_attention` with ``context_length = P``.

    **Published code** (FasterDecoding/SnapKV, ``snapkv/monkeypatch/snapkv_utils.py``,
    ``SnapKVCluster.update_kv``): the same rule, with ``pooling="avg"`` by default in the class and
    ``"max"`` in the LongBench configurations (``init_snapkv`` defaults: window 32, kernel 5, capacity
    2048); it skips compression when ``q_len < max_capacity_prompt`` (the paper: ``<=``, the same
    result), and runs after ``repeat_kv`` (one kept set per query head, as here).

    **Cost**: the prompt's causal attention (:math:`O(P^2p)`, the prefill's own, in row blocks), the votes
    :math:`O(wPp)`, and :math:`O((n-P)(b + n - P)p)` for the rows after the prompt.

    References
    ----------
    Li, Huang, Yang, Venkitesh, Locatelli, Ye, Cai, Lewis and Chen, "SnapKV: LLM knows what you are
    looking for before generation", NeurIPS 2024 (arXiv:2404.14469).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("snapkv", q, k, v, num_features=32, causal=True)  # the whole prompt
    >>> float((approx.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("snapkv", q, k, v, num_features=12, prompt_length=40, window=8,
    ...                                causal=True)
    >>> approx.info["kept"].shape, approx.info["kept"][0, -8:].tolist()  # 4 voted tokens, then the window
    (torch.Size([2, 12]), [32, 33, 34, 35, 36, 37, 38, 39])
    """
    if causal is not True:
        raise ValueError(f"snapkv is causal-only: pass causal=True; got causal={causal!r}.")
    key_mask = check_key_mask(key_mask, k)
    prompt = prompt_length_of(prompt_length, k.shape[-2])
    options = dict(window=window, kernel_size=kernel_size, pooling=pooling)
    context_mask = None if key_mask is None else key_mask[..., :prompt]
    kept = compress_snapkv(q[..., :prompt, :], k[..., :prompt, :], v[..., :prompt, :],
                           budget=min(num_features, prompt), key_mask=context_mask, **options)
    return prompt_compressed("snapkv", q, k, v, kept, prompt, key_mask, {"kept": kept})


SNAPKV = snapkv
__test__ = {"snapkv": snapkv.function}  # doctest skips a MethodSpec: run its function's examples
