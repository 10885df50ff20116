r"""How many context tokens each head and each layer of a cache keeps: AdaKV across heads, PyramidKV across layers.

A score-based cache policy (``register(..., score=fn)``) keeps, with a budget :math:`b`, the top :math:`b` scores
of every head (``allocation="uniform"``). The two schedules here spread the same total differently:

* ``allocation="adakv"`` (:func:`adakv_keep`): a layer's :math:`H b` tokens go to the largest scores of *all* its
  heads jointly, each head first keeping ``int(alpha_safeguard * b)`` of its own (AdaKV);
* ``layer_budgets="pyramid"`` (:func:`pyramid_budgets`): layer :math:`l` of :math:`L` keeps :math:`b_l`, linear
  from the bottom layer to the top, :math:`\sum_l b_l = L b` (PyramidKV).

Heads then keep different numbers of tokens: :func:`kept_as_indices` writes such a kept set as the fixed-width
indices and key mask that :func:`~approxlab.cache.attend_compressed` reads.
"""

from __future__ import annotations

import torch

from .._validation import check_choice, check_int, check_positive_float, check_tensor

__all__ = ["ALLOCATIONS", "LAYER_BUDGETS", "ALPHA_SAFEGUARD", "PYRAMID_BETA", "adakv_keep", "pyramid_budgets",
           "kept_as_indices", "check_allocation", "check_schedule", "check_alpha_safeguard", "check_scores"]

ALLOCATIONS = ("uniform", "adakv")
"""``allocation``: every head keeps the budget (``"uniform"``), or a layer shares its heads' total by the scores
(``"adakv"``, AdaKV)."""

LAYER_BUDGETS = ("uniform", "pyramid")
"""``layer_budgets``: every layer keeps the budget (``"uniform"``), or a linear schedule from the bottom layer to
the top with the same total (``"pyramid"``, PyramidKV)."""

ALPHA_SAFEGUARD = 0.20
"""AdaKV's per-head minimum share, kvpress's ``AdaKVPress.alpha_safeguard`` default."""

PYRAMID_BETA = 20
"""PyramidKV's top-layer ratio :math:`\\beta` (the top layer keeps :math:`b/\\beta`), kvpress's and the authors'
default."""


def check_alpha_safeguard(alpha_safeguard) -> float:
    """``alpha_safeguard`` as a float in ``[0, 1]``."""
    alpha_safeguard = check_positive_float(alpha_safeguard, "alpha_safeguard", allow_zero=True)
    if alpha_safeguard > 1:
        raise ValueError(f"`alpha_safeguard` must be a fraction in [0, 1]; got {alpha_safeguard!r}.")
    return alpha_safeguard


def check_scores(scores, *, min_ndim: int) -> torch.Tensor:
    r"""``scores`` as a cache scorer gives them: a float32/float64 tensor with at least ``min_ndim`` dimensions,
    finite, :math:`+\infty` (must keep) or :math:`-\infty` (padding), never NaN (a NaN is neither kept nor
    dropped by ``topk``: it would silently shrink the kept set)."""
    check_tensor(scores, "scores", min_ndim=min_ndim, finite=False)
    missing = int(torch.isnan(scores).sum())
    if missing:
        raise ValueError(f"`scores` must hold no NaN (a score is finite, +inf for a key that must be kept or -inf "
                         f"for padding); got {missing} NaN of {scores.numel()} entries.")
    return scores


def adakv_keep(scores: torch.Tensor, budget: int, *, alpha_safeguard: float = ALPHA_SAFEGUARD) -> torch.Tensor:
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

    Raises
    ------
    TypeError, ValueError
        ``scores`` not a float32/float64 tensor ``(*batch, H, n_c)``, holding NaN (which ``topk`` would neither
        keep nor drop: the layer would keep fewer than ``H * b`` keys), or marking more than ``H * b`` keys of a
        layer :math:`+\infty`; ``budget`` not an integer in ``[1, n_c]``; ``alpha_safeguard`` outside ``[0, 1]``.

    Notes
    -----
    AdaKV (Feng et al., 2024, Algorithm 1) bounds the layer's output error by a sum over heads of the attention
    mass each head drops, and minimises that bound at a fixed layer total by keeping the largest scores
    *across* heads rather than per head; a safeguard fraction :math:`\alpha` of each head's budget is kept
    first so that no head is starved. As in kvpress's ``AdaKVPress`` (commit 8bb29b9), the safeguard keys get
    the largest finite score and the layer keeps its top :math:`Hb` of the ``(H n_c)`` flattened scores
    (kvpress prunes the bottom :math:`H(n_c - b)`: the same set). Scores of different heads must be comparable
    (e.g. attention weights, which sum to 1 per head).

    References
    ----------
    Y. Feng, J. Lv, Y. Cao, X. Xie, S. K. Zhou, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
    Allocation for Efficient LLM Inference" (2024), arXiv:2407.11550.

    Examples
    --------
    >>> import torch
    >>> from approxlab.cache import adakv_keep
    >>> scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.1, 0.0, -0.1, -0.2]])  # head 0 dominates
    >>> adakv_keep(scores, 2, alpha_safeguard=0.5).sum(-1)  # 4 keys: 3 to head 0, the safeguard 1 to head 1
    tensor([3, 1])
    """
    check_scores(scores, min_ndim=2)
    heads, length = scores.shape[-2:]
    budget = check_int(budget, "budget", low=1, high=length)
    forced = int((scores == float("inf")).sum((-2, -1)).max())
    if forced > heads * budget:
        raise ValueError(f"`scores` must mark at most H * budget = {heads * budget} keys of a layer +inf (must keep); "
                         f"got {forced}.")
    alpha_safeguard = check_alpha_safeguard(alpha_safeguard)
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


def pyramid_budgets(num_layers: int, budget: int, *, beta: float = PYRAMID_BETA, context_length: int | None = None,
                    window: int = 0) -> list[int]:
    r"""PyramidKV's per-layer budgets: linear from the bottom layer to the top, averaging ``budget``.

    Parameters
    ----------
    num_layers : int
        ``L >= 1``.
    budget : int
        ``b >= 1``, the keys kept per head and layer on average, ``window`` included.
    beta : float, default 20
        The top layer keeps :math:`(b - w)/\beta` besides its window (``beta >= 1``; 1 is uniform).
    context_length : int, optional
        The keys a layer can keep at most (``>= budget``); the bottom layer is capped there and the top raised
        to keep the total.
    window : int, default 0
        :math:`w`, ``0 <= w <= b``: keys every layer keeps besides its share (SnapKV's observation window); the
        pyramid spreads the other :math:`b - w`.

    Returns
    -------
    list of int
        ``L`` budgets, non-increasing from layer 0, each ``>= window`` and ``<= context_length``, summing to
        exactly ``L * b``.

    Notes
    -----
    PyramidKV (Cai et al., 2024, Sec. 3; the authors' ``PyramidKVCluster.update_kv`` in KVCache-Factory's
    ``pyramidkv_utils.py``): with :math:`s = b - w` the share outside the window, the top layer keeps
    :math:`s_{\min} = s/\beta`, the bottom :math:`s_{\max} = 2s - s_{\min}` (capped at :math:`n_c - w`, then
    :math:`s_{\min} = 2s - s_{\max}`), and layer :math:`l` keeps :math:`w + s_{\max} - l\,(s_{\max} -
    s_{\min})/(L-1)`, so the mean is :math:`b`. The shares are rounded by largest remainders so the total is
    exactly :math:`Lb` (each differs from the unrounded value by less than 1; kvpress rounds each layer,
    the authors floor the step).

    **Where the published codes fall back.** kvpress's ``PyramidKVPress`` (commit 8bb29b9) schedules the total
    :math:`b` (window inside) and keeps the uniform :math:`b` unless :math:`n_c \ge b_{\max} \ge b_{\min} \ge w`,
    i.e. unless :math:`b/\beta \ge w` or the bottom layer is capped; with its defaults (:math:`\beta = 20`,
    :math:`w = 64`) that is :math:`b \ge 1280` or :math:`b \ge n_c/2`. The authors' code keeps the uniform
    SnapKV cache when :math:`n_c < 2(b - w)`. Here the pyramid applies at every budget.

    References
    ----------
    Z. Cai, Y. Zhang, B. Gao, Y. Liu, T. Liu, K. Lu, W. Xiong, Y. Dong, B. Chang, J. Hu, W. Xiao, "PyramidKV:
    Dynamic KV Cache Compression based on Pyramidal Information Funneling" (2024), arXiv:2406.02069.

    Examples
    --------
    >>> from approxlab.cache import pyramid_budgets
    >>> pyramid_budgets(4, 100, beta=4)
    [175, 125, 75, 25]
    >>> pyramid_budgets(4, 100, beta=4, window=20)  # every layer keeps its window of 20
    [160, 120, 80, 40]
    >>> sum(pyramid_budgets(30, 64)) == 30 * 64
    True
    """
    num_layers = check_int(num_layers, "num_layers", low=1)
    budget = check_int(budget, "budget", low=1)
    beta = check_positive_float(beta, "beta")
    if beta < 1:
        raise ValueError(f"`beta` must be >= 1 (the bottom-to-top ratio); got {beta!r}.")
    window = check_int(window, "window", low=0, high=budget)
    if context_length is not None:
        context_length = check_int(context_length, "context_length", low=budget)
    share = budget - window
    if num_layers == 1 or share == 0:
        return [budget] * num_layers
    low = share / beta
    high = 2 * share - low
    if context_length is not None and high > context_length - window:
        high = float(context_length - window)
        low = 2 * share - high
    step = (high - low) / (num_layers - 1)
    exact = [high - layer * step for layer in range(num_layers)]
    floors = [int(value) for value in exact]
    short = num_layers * share - sum(floors)
    for layer in sorted(range(num_layers), key=lambda l: (floors[l] - exact[l], l))[:short]:
        floors[layer] += 1
    return [window + value for value in floors]


def kept_as_indices(keep: torch.Tensor, key_mask: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""A per-head kept set of any size as fixed-width indices and the key mask that hides the slots left over.

    ``keep`` ``(*batch, n_c)`` bool (heads may keep different numbers); ``key_mask`` ``(*batch, n)`` bool or None.
    Returns ``indices`` ``(*batch, w)``, ``w`` the largest count (at least 1): each head's kept positions first,
    in order, then positions it did not keep; and ``mask`` ``(*batch, n)``: ``key_mask`` and, on the context,
    ``keep``. Attending ``indices`` under ``mask`` attends exactly the kept set.

    Examples
    --------
    >>> import torch
    >>> keep = torch.tensor([[True, False, True, False], [False, False, False, True]])
    >>> indices, mask = kept_as_indices(keep, None, 6)
    >>> indices.tolist(), mask.int().tolist()
    ([[0, 2], [3, 0]], [[1, 0, 1, 0, 1, 1], [0, 0, 0, 1, 1, 1]])
    """
    batch, context_length = keep.shape[:-1], keep.shape[-1]
    width = max(1, int(keep.sum(-1).max())) if keep.numel() else 1
    indices = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :width]
    later = torch.ones(*batch, n - context_length, dtype=torch.bool, device=keep.device)
    mask = torch.cat([keep, later], dim=-1)
    if key_mask is not None:
        mask = mask & key_mask.expand(*batch, n)
    return indices, mask


def check_allocation(spec, allocation, alpha_safeguard) -> tuple[str, float | None]:
    """``allocation`` (None: ``spec``'s own) and ``alpha_safeguard`` (None: :data:`ALPHA_SAFEGUARD`) for method
    ``spec``: ``"adakv"`` needs per-key scores, ``alpha_safeguard`` needs ``"adakv"``."""
    own = getattr(spec, "allocation", "uniform")
    allocation = own if allocation is None else check_choice(allocation, "allocation", ALLOCATIONS)
    if allocation == "adakv" and getattr(spec, "score", None) is None:
        raise ValueError(f"`allocation` 'adakv' shares a layer's budget across heads by per-key scores, and method "
                         f"{spec.name!r} declares none: allowed for it is 'uniform' (or a policy registered with "
                         f"score=); got allocation='adakv'.")
    if allocation != "adakv":
        if alpha_safeguard is not None:
            raise ValueError(f"`alpha_safeguard` is AdaKV's per-head minimum, allowed with allocation='adakv' only; "
                             f"got alpha_safeguard={alpha_safeguard!r} with allocation={allocation!r}.")
        return allocation, None
    return allocation, check_alpha_safeguard(ALPHA_SAFEGUARD if alpha_safeguard is None else alpha_safeguard)


def check_schedule(value, name: str, choices, spec=None) -> str:
    """A registration's ``allocation`` or ``layer_budgets``: one of ``choices``; a non-uniform one needs ``score``."""
    value = check_choice(value, name, choices)
    if value != "uniform" and spec is not None and spec.get("score") is None:
        raise ValueError(f"`{name}` {value!r} spreads a budget by per-key scores: it needs score=; allowed without "
                         f"one is 'uniform'; got {name}={value!r} and no score.")
    return value
