r"""FlexPrefill (Lai et al., ICLR 2025): sparse prefill whose pattern and budget each head chooses from its inputs.

Per head, the last block of queries decides between two patterns: *query-aware* (the key blocks each query
block needs, estimated from block means) when the block means predict the last queries' attention over key
blocks well (a Jensen-Shannon distance below :math:`\tau`), *vertical-slash* (columns and diagonals read from
the last queries) otherwise. Either pattern keeps the fewest entries whose estimated attention mass reaches
:math:`\gamma`, in whole blocks, and the kept blocks are attended exactly
(:func:`~approxlab.methods._sparse_attention.attend_blocks`: the logits of the kept blocks only).
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float, check_real
from ._base import CAUSAL_ONLY, method
from ._mask_attention import block_visible, mask_approximation
from ._sparse_attention import attend_blocks
from .minference import last_query_masses

__all__ = ["flexprefill", "FLEXPREFILL", "DEFAULT_MIN_BUDGET", "mass_cover", "block_means", "pattern_distance",
           "vertical_slash_blocks", "query_aware_blocks"]

DEFAULT_MIN_BUDGET = 1024
"""The authors' ``flex_prefill_min_budget`` (``flex_prefill/modules/patch.py``): tokens, rounded up to blocks."""


def mass_cover(masses: torch.Tensor, gamma: float) -> torch.Tensor:
    r"""The fewest largest entries whose mass reaches :math:`\gamma` of the total, along the last dimension.

    Sorted in decreasing order (ties: the earlier index first), an entry is kept while the mass of the entries
    before it is below :math:`\gamma \sum_t m_t`: the smallest set :math:`S` with
    :math:`\sum_{t\in S} m_t \ge \gamma\sum_t m_t` (FlexPrefill's cumulative-attention threshold, Section 3.3).
    ``masses`` ``(*batch, T)`` (non-negative) -> bool ``(*batch, T)``.

    Examples
    --------
    >>> import torch
    >>> mass_cover(torch.tensor([1.0, 5.0, 3.0, 1.0]), 0.8).tolist()
    [False, True, True, False]
    >>> mass_cover(torch.tensor([1.0, 5.0, 3.0, 1.0]), 0.81).tolist()  # one more, the earlier of the ties
    [True, True, True, False]
    """
    ordered, order = masses.sort(dim=-1, descending=True, stable=True)
    before = ordered.cumsum(-1) - ordered
    keep = before < gamma * masses.sum(-1, keepdim=True)
    return torch.zeros_like(keep).scatter_(-1, order, keep)


def block_means(x: torch.Tensor, block_size: int) -> torch.Tensor:
    r"""The mean of each block of ``block_size`` rows, over the rows it has (a last block may be partial), as
    the authors' ``avgpool`` (``triton_bnhd_pool``): ``(*batch, n, p)`` -> ``(*batch, N, p)``,
    :math:`N = \lceil n/B\rceil`.

    Examples
    --------
    >>> import torch
    >>> block_means(torch.arange(5.0).unsqueeze(-1), 2).flatten().tolist()
    [0.5, 2.5, 4.0]
    """
    n = x.shape[-2]
    blocks = -(-n // block_size)
    padded = torch.nn.functional.pad(x, (0, 0, 0, blocks * block_size - n))
    counts = (n - torch.arange(blocks, device=x.device) * block_size).clamp(max=block_size)
    return padded.reshape(*x.shape[:-2], blocks, block_size, x.shape[-1]).sum(-2) / counts.to(x.dtype).unsqueeze(-1)


def _block_sums(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Sums of consecutive ``block_size`` entries of the last dimension (zero-padded): ``(*batch, N)``."""
    blocks = -(-x.shape[-1] // block_size)
    padded = torch.nn.functional.pad(x, (0, blocks * block_size - x.shape[-1]))
    return padded.unflatten(-1, (blocks, block_size)).sum(-1)


def pattern_distance(q: torch.Tensor, k: torch.Tensor, true_blocks: torch.Tensor, *, block_size: int):
    r"""The Jensen-Shannon distance between the estimated and the true attention of the last queries over key
    blocks (FlexPrefill's sparse pattern determination, Section 3.2 and Algorithm 2).

    With :math:`\hat Q` the last :math:`L = \min(B, n)` queries, the estimate is
    :math:`\bar a = \operatorname{softmax}_J(\operatorname{mean}(\hat Q)\,\bar k_J^\top/\sqrt p)` over the key
    block means :math:`\bar k_J` (:func:`block_means`), and the truth ``true_blocks`` :math:`\hat a`
    ``(*batch, N)``, the block sums of :math:`\hat Q`'s causal attention averaged over its rows. Returns
    :math:`\sqrt{\mathrm{JSD}(\bar a\,\|\,\hat a)}` in nats (:math:`0 \le d \le \sqrt{\ln 2}`), ``(*batch,)``,
    with :math:`0\log 0 = 0`.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> float(pattern_distance(q, k, torch.tensor([[0.5, 0.5]], dtype=torch.float64), block_size=2)[0])
    0.0
    """
    last = min(block_size, q.shape[-2])
    pooled = q[..., -last:, :].mean(-2, keepdim=True)
    estimate = torch.softmax((pooled @ block_means(k, block_size).transpose(-1, -2)).squeeze(-2)
                             / math.sqrt(q.shape[-1]), dim=-1)
    true = true_blocks / true_blocks.sum(-1, keepdim=True)
    middle = (estimate + true) / 2
    divergence = (torch.xlogy(estimate, estimate / middle) + torch.xlogy(true, true / middle)).sum(-1) / 2
    return divergence.clamp(min=0).sqrt()


def _ranked_keep(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Bool ``(*batch, T)``: the ``counts`` ``(*batch,)`` largest ``scores`` of each row (ties: the earlier)."""
    order = scores.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device)
                                             .expand_as(order))
    return ranks < counts.unsqueeze(-1)


def vertical_slash_blocks(columns, offsets, vertical_blocks, slash_blocks, *, block_size: int) -> torch.Tensor:
    r"""FlexPrefill's vertical-slash blocks (Algorithm 3): the top key blocks by column mass and the top block
    diagonals by diagonal mass, key block 0 and the block diagonal always.

    ``columns`` ``(*batch, n)``: the last queries' attention mass of each key; ``offsets`` ``(*batch, n)``: their
    mass along each diagonal offset :math:`o = i - j` (:func:`~approxlab.methods.minference.last_query_masses`).
    A key block's score is the sum of its columns; offset :math:`o` joins block diagonal
    :math:`\lfloor(o + NB - n)/B\rfloor` (the authors' pooling: blocks of :math:`B` offsets counted from the
    longest diagonal's end). Query block :math:`I` keeps key block :math:`J \le I` when :math:`J` is among the
    ``vertical_blocks`` ``(*batch,)`` top key blocks or :math:`I - J` among the ``slash_blocks`` top diagonals.
    Returns bool ``(*batch, N, N)``.

    Examples
    --------
    >>> import torch
    >>> columns = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.5, 0.5])
    >>> offsets = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.2, 0.2])
    >>> vertical_slash_blocks(columns, offsets, torch.tensor(2), torch.tensor(1), block_size=2).int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    """
    n = columns.shape[-1]
    blocks = -(-n // block_size)
    vertical = _block_sums(columns, block_size)
    shift = blocks * block_size - n
    slash = torch.nn.functional.pad(offsets, (shift, 0))
    slash = _block_sums(slash, block_size)
    vertical[..., 0] = math.inf
    slash[..., 0] = math.inf
    kept_columns = _ranked_keep(vertical, vertical_blocks)
    kept_offsets = _ranked_keep(slash, slash_blocks)
    index = torch.arange(blocks, device=columns.device)
    offset = index.unsqueeze(-1) - index  # (N, N): I - J
    on_slash = torch.gather(kept_offsets.unsqueeze(-2).expand(*kept_offsets.shape[:-1], blocks, blocks), -1,
                            offset.clamp(min=0).expand(*kept_offsets.shape[:-1], blocks, blocks))
    return (on_slash | kept_columns.unsqueeze(-2)) & (offset >= 0)


def query_aware_blocks(q: torch.Tensor, k: torch.Tensor, gamma: float, *, block_size: int) -> torch.Tensor:
    r"""FlexPrefill's query-aware blocks (Algorithm 4): the fewest blocks whose estimated mass reaches
    :math:`\gamma`.

    With the block means :math:`\bar q_I, \bar k_J` (:func:`block_means`), :math:`\bar A_{IJ} =
    \operatorname{softmax}_{J \le I}(\bar q_I \bar k_J^\top/\sqrt p)`; flattened over all :math:`N(N+1)/2`
    causal blocks (total mass :math:`N`), the fewest largest reaching :math:`\gamma N` are kept
    (:func:`mass_cover`). Returns bool ``(*batch, N, N)``. (The authors' code also keeps block :math:`(0, 0)`,
    its padding index; :func:`flexprefill` keeps it anyway, as the forced first key block.)

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 4, 2, dtype=torch.float64)  # rows of blocks: (1,), (1/2, 1/2)
    >>> query_aware_blocks(q, k, 0.5, block_size=2)[0].int().tolist()
    [[1, 0], [0, 0]]
    >>> query_aware_blocks(q, k, 0.51, block_size=2)[0].int().tolist()
    [[1, 0], [1, 0]]
    """
    logits = block_means(q, block_size) @ block_means(k, block_size).transpose(-1, -2) / math.sqrt(q.shape[-1])
    blocks = logits.shape[-1]
    later = torch.ones(blocks, blocks, dtype=torch.bool, device=q.device).triu(1)
    weights = torch.softmax(logits.masked_fill(later, -math.inf), dim=-1)
    return mass_cover(weights.flatten(-2), gamma).unflatten(-1, (blocks, blocks)) & ~later


def _check(gamma, tau, block_size, min_budget, causal):
    """The options of :func:`flexprefill`, checked: ``(gamma, tau, block_size, min_blocks)``."""
    if causal is not True:
        raise ValueError(f"flexprefill is causal-only: pass causal=True; got causal={causal!r}.")
    gamma = check_positive_float(gamma, "gamma")
    if gamma > 1:
        raise ValueError(f"`gamma` must be in (0, 1]; got {gamma!r}.")
    tau = check_real(tau, "tau")
    if not 0 <= tau <= 1:
        raise ValueError(f"`tau` must be in [0, 1]; got {tau!r}.")
    size = check_int(block_size, "block_size", low=1)
    return gamma, tau, size, -(-check_int(min_budget, "min_budget", low=1) // size)


@method("flexprefill", target="softmax", features="cap on the vertical and on the slash blocks per head (whole "
        "blocks, fewer when the mass reaches gamma)", randomized=False, causal=CAUSAL_ONLY)
def flexprefill(q, k, v, *, num_features, generator=None, gamma=0.9, tau=0.1, block_size=128,
                min_budget=DEFAULT_MIN_BUDGET, causal=True):
    r"""FlexPrefill's sparse causal prefill: each head's query-aware or vertical-slash blocks, attended exactly.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)`` (self-attention over the whole sequence;
        each batch element, a head, chooses its own pattern).
    num_features : int
        The authors' ``max_budget`` :math:`b` in tokens (``1 <= b <= n``): a vertical-slash head keeps at most
        :math:`\min(\lceil b/B\rceil, N)` key blocks by column mass and as many block diagonals. ``num_features
        = n`` leaves :math:`\gamma` alone to decide, as the authors' default ``max_budget=None`` does. The
        query-aware blocks are not capped (nor in the authors' code).
    generator : torch.Generator, optional
        Unused (deterministic).
    gamma : float, default 0.9
        :math:`\gamma \in (0, 1]`, the cumulative attention the kept entries reach (the authors' 0.9).
    tau : float, default 0.1
        :math:`\tau \in [0, 1]`: a head is query-aware when the Jensen-Shannon distance of
        :func:`pattern_distance` is below it (the authors' 0.1; 0 makes every head vertical-slash).
    block_size : int, default 128
        :math:`B`, rows per query and key block (the authors' 128).
    min_budget : int, default 1024
        Tokens (rounded up to :math:`m = \lceil\text{min\_budget}/B\rceil` blocks) of the fewest vertical and
        slash blocks a head keeps; a query-aware head keeps exactly :math:`m` of each beside its own blocks (the
        authors' default 1024).
    causal : bool, default True
        Must be True (a prefill method: causal only).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator` (formed
        on request); ``info``: ``blocks`` (bool ``(*batch, N, N)``),
        ``query_aware`` (bool ``(*batch,)``), ``distance`` (``(*batch,)``, :func:`pattern_distance`),
        ``vertical_blocks`` and ``slash_blocks`` (``(*batch,)``, the counts kept).

    Notes
    -----
    Algorithm 1 of the paper, per head, on the last :math:`L = \min(B, n)` queries :math:`\hat Q`:

    1. *Pattern* (Section 3.2, Algorithm 2): :math:`\hat A = \operatorname{softmax}(\hat Q K^\top/\sqrt p)`
       under the causal mask; the head is query-aware iff
       :math:`\sqrt{\mathrm{JSD}(\bar a\,\|\,\hat a)} < \tau` for the block-mean estimate :math:`\bar a` and the
       true block attention :math:`\hat a` of :math:`\hat Q` (:func:`pattern_distance`).
    2. *Vertical-slash budget* (Section 3.3, Algorithm 3): with the column masses
       :math:`a_v = \frac1L\sum_r \hat A_{r\cdot}` and the diagonal masses :math:`a_s` of :math:`\hat A`
       (:func:`~approxlab.methods.minference.last_query_masses`), :math:`c_v` = the fewest columns whose mass
       reaches :math:`\gamma` (:func:`mass_cover`) and :math:`K_v = \operatorname{clip}(\lfloor c_v/B\rfloor + 1,
       m, \min(\lceil b/B\rceil, N))` key blocks; :math:`K_s` likewise from the diagonals. A query-aware head
       takes :math:`K_v = K_s = m`.
    3. *Blocks*: :func:`vertical_slash_blocks` with :math:`K_v, K_s`; for a query-aware head also
       :func:`query_aware_blocks` (Algorithm 4: the fewest blocks of the block-mean attention reaching
       :math:`\gamma`).
    4. Row :math:`i` of query block :math:`I` attends (exact softmax over) the keys :math:`j \le i` of the kept
       blocks of row :math:`I`.

    With :math:`m \ge N` (short inputs: :math:`n \le` ``min_budget``) every block is kept, as the authors'
    dense path for :math:`n \le \max(2B, mB)`; :math:`\gamma = 1` keeps every block whose estimated mass is
    positive, i.e. exact causal attention.

    **Where the published code departs** (bytedance/FlexPrefill, ``flex_prefill/ops/flex_prefill_attention.py``,
    ``get_active_blocks``): (1) it converts the column and diagonal counts to blocks by
    :math:`\lfloor c/128\rfloor + 1` whatever ``block_size`` is, here by :math:`B` (the same at the default
    128); (2) its counts are :math:`\#\{t : \sum_{u \le t} a_{(u)} \le \gamma\} + 1`, the fewest reaching
    :math:`\gamma` taken here unless a cumulative mass equals :math:`\gamma` exactly, and its query-aware set the
    sorted prefix whose cumulative mass stays :math:`\le \gamma N`: the set taken here less the block that
    crosses :math:`\gamma N` (the paper's rule is the fewest reaching :math:`\gamma`); (3) its
    :math:`0\log 0` is NaN (then no head is query-aware), here 0; (4) its softmaxes run in float32, here in
    the inputs' dtype; (5) for :math:`n \le \max(2B, mB)` it attends densely whatever ``max_budget``, here the
    cap still binds where it is below :math:`m`; (6) it takes one sequence at a time (batch size 1), here any
    ``(*batch)``.

    **Cost**: the estimate :math:`O(Bnp + N^2 p)`; the attention :math:`O(n\bar c B p)` for :math:`\bar c` kept
    blocks per query block (:func:`~approxlab.methods._sparse_attention.attend_blocks`: the kept blocks' logits
    only, as the authors' block-sparse kernel), the same outputs as the dense mask route to rounding. A
    query-aware head on inputs whose block means predict flat attention keeps most blocks (on the standard normal
    Q, K of ``benchmarks/results/causal_prefill.md``, 85% of the causal blocks at n = 8,192), and costs then about
    dense causal attention.

    References
    ----------
    Lai, Lu, Luo, Ma and Zhou, "FlexPrefill: A context-aware sparse attention mechanism for efficient
    long-sequence inference", ICLR 2025 (arXiv:2502.20766); code bytedance/FlexPrefill.

    Examples
    --------
    >>> import torch, approxlab
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    >>> approx = approxlab.approximate("flexprefill", q, k, v, num_features=40, causal=True, gamma=0.8, tau=0.5,
    ...                                block_size=8, min_budget=8)
    >>> approx.info["blocks"].shape, approx.info["query_aware"].tolist()  # 5 blocks of 8; every head query-aware
    (torch.Size([3, 5, 5]), [True, True, True])
    >>> exact = approxlab.approximate("flexprefill", q, k, v, num_features=40, causal=True, gamma=1.0, block_size=8,
    ...                               min_budget=8).output  # every block kept
    >>> torch.allclose(exact, approxlab.exact_attention(q, k, v, causal=True), rtol=0, atol=1e-12)
    True
    """
    gamma, tau, size, least = _check(gamma, tau, block_size, min_budget, causal)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = q.expand(*batch, *q.shape[-2:]), k.expand(*batch, *k.shape[-2:])
    n = k.shape[-2]
    blocks = -(-n // size)
    columns, offsets = last_query_masses(q, k, size)
    distance = pattern_distance(q, k, _block_sums(columns, size), block_size=size)
    query_aware = distance < tau
    most = min(-(-num_features // size), blocks)

    def counts(masses):
        fewest = mass_cover(masses, gamma).sum(-1)
        return torch.where(query_aware, least, (fewest // size + 1).clamp(min=least).clamp(max=most))

    vertical, slash = counts(columns), counts(offsets)
    chosen = vertical_slash_blocks(columns, offsets, vertical, slash, block_size=size)
    if bool(query_aware.any()):
        chosen = chosen | (query_aware_blocks(q, k, gamma, block_size=size) & query_aware[..., None, None])
    info = {"blocks": chosen, "query_aware": query_aware, "distance": distance, "vertical_blocks": vertical,
            "slash_blocks": slash}
    return mask_approximation("flexprefill", q, k, v, block_visible(chosen, size), info,
                              attend_blocks(q, k, v, chosen, size))


FLEXPREFILL = flexprefill
__test__ = {"flexprefill": flexprefill.function}  # doctest skips a MethodSpec: run its function's examples
