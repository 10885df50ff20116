r"""MInference (Jiang et al., NeurIPS 2024): sparse prefill by three patterns -- A-shape, vertical-slash and block-sparse.

Each head's causal attention over the whole sequence is restricted to one pattern, whose indices are fixed
(A-shape) or estimated online from the inputs (vertical-slash: from the last queries; block-sparse: from pooled
blocks), and the kept entries are attended exactly, sparsely (:mod:`~approxlab.methods._sparse_attention`).
"""

from __future__ import annotations

import math

import torch

from .._validation import check_choice, check_int
from ._base import CAUSAL_ONLY, method
from ._mask_attention import block_visible, mask_approximation
from ._sparse_attention import attend_blocks, attend_vertical_slash

__all__ = ["minference", "MINFERENCE", "PATTERNS", "vertical_slash_indices", "last_query_masses", "pooled_block_scores"]

PATTERNS = ("vertical-slash", "a-shape", "block-sparse")
"""The three patterns of the paper (Section 3, Figure 3)."""

DEFAULT_PAIR = (1000, 6096)
"""The authors' default ``(vertical_size, slash_size)`` (``minference_forward.py``): how ``num_features`` is split
between columns and diagonals unless ``vertical_size`` is given."""


VERTICAL_SLASH_BLOCK = 64
"""Query rows per block of the vertical-slash and A-shape attention (the authors' kernel's ``BLOCK_M``)."""


def _split(budget: int, vertical_size) -> tuple[int, int]:
    """``(columns, diagonals)`` of a vertical-slash budget: ``vertical_size`` or the authors' default proportion."""
    if vertical_size is None:
        vertical_size = max(1, budget * DEFAULT_PAIR[0] // sum(DEFAULT_PAIR)) if budget > 1 else 0
    vertical_size = check_int(vertical_size, "vertical_size", low=0, high=budget - 1)
    return vertical_size, budget - vertical_size


def vertical_slash_indices(q, k, *, vertical_size: int, slash_size: int, last_queries: int = 64,
                           forced_vertical: int = 30, forced_slash: int = 100):
    r"""MInference's online estimate of the vertical-slash pattern from the last queries (Algorithm 2).

    With :math:`L` = ``min(last_queries, n)`` and :math:`A = \operatorname{softmax}(Q_{[n-L:]}K^\top/\sqrt p)`
    under the causal mask (``(*batch, L, n)``), a column's score is its mass :math:`\sum_r A_{rj}` and a
    diagonal's (offset :math:`o = i - j \ge 0`) the mass along it, :math:`\sum_r A_{r,\,n-L+r-o}`. The first
    ``forced_vertical`` columns and the ``forced_slash`` diagonals nearest the main one score :math:`+\infty`
    (the authors' 30 and 100); the top ``vertical_size`` columns and top ``slash_size`` diagonals are kept.

    Returns ``(columns, offsets)``, bool ``(*batch, n)`` each: True on kept columns and kept diagonal offsets.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 6, 2, dtype=torch.float64)
    >>> columns, offsets = vertical_slash_indices(q, k, vertical_size=1, slash_size=2, forced_vertical=1,
    ...                                           forced_slash=2)
    >>> columns[0].tolist(), offsets[0].tolist()
    ([True, False, False, False, False, False], [True, True, False, False, False, False])
    """
    n = k.shape[-2]
    columns, diagonals = last_query_masses(q, k, last_queries)
    columns[..., :forced_vertical] = math.inf
    diagonals[..., :forced_slash] = math.inf
    return (_top_mask(columns, min(vertical_size, n)), _top_mask(diagonals, min(slash_size, n)))


def last_query_masses(q, k, last_queries: int):
    r"""The causal attention of the last queries summed down each column and along each diagonal.

    With :math:`L` = ``min(last_queries, n)`` and :math:`A = \operatorname{softmax}(Q_{[n-L:]}K^\top/\sqrt p)`
    under the causal mask (``(*batch, L, n)``), returns ``(columns, diagonals)``, ``(*batch, n)`` each:
    :math:`\sum_r A_{rj}` for every key :math:`j` and :math:`\sum_r A_{r,\,n-L+r-o}` for every offset
    :math:`o = i - j \ge 0` (each sums to :math:`L`). The statistics MInference's vertical-slash estimate
    (:func:`vertical_slash_indices`) and FlexPrefill's (:mod:`~approxlab.methods.flexprefill`) rank.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 3, 2, dtype=torch.float64)
    >>> columns, diagonals = last_query_masses(q, k, 2)  # rows 1 and 2: weights 1/2 and 1/3 each
    >>> [round(x, 4) for x in columns[0].tolist()], [round(x, 4) for x in diagonals[0].tolist()]
    ([0.8333, 0.8333, 0.3333], [0.8333, 0.8333, 0.3333])
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n, p = k.shape[-2], q.shape[-1]
    last = min(last_queries, n)
    rows = torch.arange(n - last, n, device=q.device).unsqueeze(-1)
    offset = rows - torch.arange(n, device=q.device)  # (L, n): i - j
    logits = (q[..., n - last:, :] @ k.transpose(-1, -2)) / math.sqrt(p)
    weights = torch.softmax(logits.masked_fill(offset < 0, -math.inf), dim=-1).expand(*batch, last, n)
    diagonals = torch.zeros(*batch, n, dtype=weights.dtype, device=q.device).scatter_add_(
        -1, offset.clamp(min=0).expand(*batch, last, n).reshape(*batch, -1), weights.reshape(*batch, -1))
    return weights.sum(-2), diagonals


def _top_mask(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Bool mask of the ``count`` largest ``scores`` along the last dimension."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    return keep.scatter_(-1, scores.topk(count, dim=-1).indices, True) if count else keep


def pooled_block_scores(q, k, block_size: int) -> torch.Tensor:
    r"""MInference's block-sparse scores: :math:`\bar q_I^\top \bar k_J` of the block means of ``q`` and ``k``
    (zero-padded to whole blocks, means over ``block_size`` rows, as the authors' code pads), :math:`-\infty`
    for :math:`J > I`; ``(*batch, N, N)`` for :math:`N = \lceil n/\text{block\_size}\rceil` blocks.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.ones(1, 4, 2, dtype=torch.float64)
    >>> pooled_block_scores(q, k, 2)[0].tolist()
    [[2.0, -inf], [2.0, 2.0]]
    """
    n, p = k.shape[-2], k.shape[-1]
    blocks = -(-n // block_size)

    def pool(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, blocks * block_size - n))
        return x.reshape(*x.shape[:-2], blocks, block_size, p).mean(-2)

    scores = pool(q) @ pool(k).transpose(-1, -2)
    later = torch.ones(blocks, blocks, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(later, -math.inf)


def _diagonal_mask(columns: torch.Tensor, offsets: torch.Tensor):
    """``visible(start, stop)`` of the keys ``j <= i`` in a kept column or on a kept diagonal."""
    def visible(start, stop):
        offset = (torch.arange(start, stop, device=columns.device).unsqueeze(-1)
                  - torch.arange(stop, device=columns.device))  # (rows, stop): i - j
        batch = offsets.shape[:-1]
        on_slash = torch.gather(offsets.unsqueeze(-2).expand(*batch, stop - start, offsets.shape[-1]), -1,
                                offset.clamp(min=0).expand(*batch, stop - start, stop))
        return (on_slash | columns[..., None, :stop]) & (offset >= 0)

    return visible


@method("minference", target="softmax", features="keys per query: columns plus diagonals, sinks plus window, or "
        "whole blocks", randomized=False, causal=CAUSAL_ONLY)
def minference(q, k, v, *, num_features, generator=None, pattern="vertical-slash", vertical_size=None,
               last_queries=64, forced_vertical=30, forced_slash=100, sinks=100, block_size=64, causal=True):
    r"""MInference's sparse causal prefill: every query attends the keys of one pattern, exactly.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (self-attention over the whole sequence).
    num_features : int
        The budget :math:`b` of keys per query (``1 <= b <= n``), by ``pattern``: vertical-slash keeps
        ``vertical_size`` columns and :math:`b -` ``vertical_size`` diagonals (at most :math:`b` keys a row);
        A-shape :math:`s = \min(\text{sinks}, \lfloor b/2\rfloor)` first tokens and a window of :math:`b - s`;
        block-sparse :math:`\lceil b/\text{block\_size}\rceil` key blocks per query block.
    generator : torch.Generator, optional
        Unused (deterministic).
    pattern : {"vertical-slash", "a-shape", "block-sparse"}, default "vertical-slash"
        The pattern (the authors' default for every head: vertical-slash with their ``(1000, 6096)``).
    vertical_size : int, optional
        Vertical-slash: the columns kept (``0 <= vertical_size < b``); default the authors' proportion,
        :math:`\lfloor 1000\,b/7096\rfloor` (at least 1 from :math:`b = 2`).
    last_queries : int, default 64
        Vertical-slash: the last queries the pattern is estimated from (the authors' ``last_q``).
    forced_vertical, forced_slash : int, default 30, 100
        Vertical-slash: the first columns and the nearest diagonals always kept (within the sizes).
    sinks : int, default 100
        A-shape: the initial tokens (the authors' pattern search uses ``n_init = 100``, ``n_local = 800``).
    block_size : int, default 64
        Block-sparse: rows per query block and key block (the authors' 64).
    causal : bool, default True
        Must be True: a prefill method, causal only (``approximate(..., causal=True)``).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (formed on request); ``info``: ``pattern`` and its kept indices -- ``columns`` and ``offsets``
        (bool ``(*batch, n)``, vertical-slash and A-shape) or ``blocks`` (bool ``(*batch, N, N)``).

    Notes
    -----
    Row :math:`i` attends (exact softmax over) :math:`S_i \subseteq \{j \le i\}`:

    * **vertical-slash**: :math:`S_i = \{j \le i : j \in C\} \cup \{j \le i : i - j \in D\}` for the kept
      columns :math:`C` and diagonal offsets :math:`D` of :func:`vertical_slash_indices` (Algorithm 2,
      ``vertical_and_slash_kernel``);
    * **A-shape**: :math:`C = \{0..s-1\}`, :math:`D = \{0..b-s-1\}`, static -- the sinks and window of
      StreamingLLM with :math:`s` sinks (``approximate("streaming-llm", ..., sinks=s)``, tested equal);
    * **block-sparse**: the query block :math:`I` keeps the :math:`\lceil b/B\rceil` key blocks
      :math:`J \le I` of largest :func:`pooled_block_scores` (Algorithm 3), row :math:`i` their keys
      :math:`j \le i`.

    **Where the published code departs** (microsoft/MInference ``minference/modules/minference_forward.py``):
    (1) its kernel covers the kept diagonals by 64-wide ranges of whole blocks, so a row may attend a few
    keys next to a diagonal that this method leaves out; (2) it floors the sizes at 30 columns and 50
    diagonals (``max(vertical_size, 30)``), which budgets below 80 cannot hold: here ``forced_vertical``
    and ``forced_slash`` are capped by the sizes instead; (3) the pattern of each head is chosen offline by
    the authors' search on calibration data, here by ``pattern`` for all heads; (4) its last-query
    estimate runs in float32, here in the inputs' dtype.

    **Cost**: the estimate :math:`O(Lnp)` (vertical-slash) or :math:`O(np + N^2 p)` (block-sparse); the
    attention :math:`O(nWp)`, the logits of each query block of 64 rows formed against its gathered keys only
    (:func:`~approxlab.methods._sparse_attention.attend_vertical_slash`: the kept columns, the key ranges its runs
    of kept diagonals cross (:math:`L + 63` keys for a run of :math:`L`), and each row's one key on an isolated
    kept diagonal;
    :func:`~approxlab.methods._sparse_attention.attend_blocks`:
    :math:`W = B\lceil b/B\rceil`), as the authors' kernels skip the rest; the same outputs as the dense mask
    route (:func:`~approxlab.methods._mask_attention.attend_mask`) to rounding.

    References
    ----------
    Jiang, Li, Zhang, Wu, Luo, Ahn, Han, Abdi, Li, Lin, Yang and Qiu, "MInference 1.0: Accelerating
    pre-filling for long-context LLMs via dynamic sparse attention", NeurIPS 2024 (arXiv:2407.02490);
    code microsoft/MInference.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("minference", q, k, v, num_features=32, causal=True, vertical_size=0)
    >>> float((approx.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("minference", q, k, v, num_features=8, causal=True, pattern="block-sparse",
    ...                                block_size=4)
    >>> approx.info["blocks"].shape, int(approx.info["blocks"][0, 7].sum())
    (torch.Size([2, 8, 8]), 2)
    """
    if causal is not True:
        raise ValueError(f"minference is causal-only: pass causal=True; got causal={causal!r}.")
    pattern = check_choice(pattern, "pattern", PATTERNS)
    budget = num_features
    if pattern == "block-sparse":
        size = check_int(block_size, "block_size", low=1)
        scores = pooled_block_scores(q, k, size)
        kept = min(-(-budget // size), scores.shape[-1])
        chosen = _top_mask(scores, kept) & torch.isfinite(scores)
        return mask_approximation("minference", q, k, v, block_visible(chosen, size),
                                  {"pattern": pattern, "blocks": chosen}, attend_blocks(q, k, v, chosen, size))
    if pattern == "a-shape":
        first = min(check_int(sinks, "sinks", low=0), budget // 2)
        n = k.shape[-2]
        positions = torch.arange(n, device=q.device)
        columns, offsets = positions < first, positions < budget - first
    else:
        columns_kept, diagonals_kept = _split(budget, vertical_size)
        columns, offsets = vertical_slash_indices(
            q, k, vertical_size=columns_kept, slash_size=diagonals_kept,
            last_queries=check_int(last_queries, "last_queries", low=1),
            forced_vertical=min(check_int(forced_vertical, "forced_vertical", low=0), columns_kept),
            forced_slash=min(check_int(forced_slash, "forced_slash", low=0), diagonals_kept))
    return mask_approximation("minference", q, k, v, _diagonal_mask(columns, offsets),
                              {"pattern": pattern, "columns": columns, "offsets": offsets},
                              attend_vertical_slash(q, k, v, columns, offsets, block_size=VERTICAL_SLASH_BLOCK))


MINFERENCE = minference
__test__ = {"minference": minference.function}  # doctest skips a MethodSpec: run its function's examples
