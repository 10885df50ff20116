r"""Exact softmax over a selected set of keys per query: what top-k, top-p, StreamingLLM, H2O, SnapKV and
Quest have in common.

Each of those methods decides, for query :math:`i`, a set :math:`S_i` of keys, and computes

.. math::

    \tilde o_i = \sum_{j\in S_i} \frac{e^{s_{ij}}}{\sum_{l\in S_i} e^{s_{il}}}\, v_j,
    \qquad s_{ij} = q_i^\top k_j/\sqrt p,

in the log domain. A row whose set is empty (a padded query before the first real token) gets weight 0
everywhere and output 0 instead of 0/0. The selection is given as ``indices`` ``(*batch, n, s)`` with a
``valid`` mask of the same shape; outputs are computed in row blocks (:func:`attend_selected`), so memory
is :math:`O(\text{block}\cdot s\cdot p)`; the sparse matrix :math:`\tilde S` is a
:class:`~approxlab.operators.RowSparseOperator`.

Helpers for the oracles, which need every logit: :func:`logit_blocks` yields the ``(*batch, block, m)``
logits of consecutive row blocks (causal and key masks applied as :math:`-\infty`), memory
:math:`O(\text{block}\cdot m)`.

The attention of a compressed cache (the kept context tokens, then the continuation causally) is
:mod:`approxlab.cache._selection`'s, over these blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .._validation import check_int, check_qkv
from ..kernels import causal_mask
from ..operators.sparse import RowSparseOperator
from ._base import Approximation
from ._row_topk import row_topk

__all__ = ["BLOCK_ELEMENTS", "DENSE_SELECTION", "weighted_values", "block_rows", "safe_softmax", "logit_blocks",
           "attend_selected", "selected_weights", "gather_rows", "weighted_rows", "real_ranks", "oracle_selection",
           "KeyRanking", "rank_keys", "sparse_approximation"]

BLOCK_ELEMENTS = 1 << 22
"""Entries of one row block (``(*batch, block, m)`` logits or ``(*batch, block, s, p)`` gathered keys)."""


DENSE_SELECTION = 32
r"""From ``s >= m / DENSE_SELECTION`` selected keys per row (of ``m``), a block's selected logits are read from
dense products against all ``m`` keys instead of gathering ``s`` rows of ``k`` per query (the weighted sums of the
values: :func:`weighted_values`, its own rule). One ``(block, m)`` GEMM streams ``k`` once, while the gather copies
``s`` rows per query. Measured (keys and values both gathered then) on one thread, 12 heads, ``p = 64``, float64:
the dense products 1.5x (s = 16) to 15x (s = 256) faster at m = 1024, and from s = 128 (2.8x; 5x at s = 256) at
m = 4096, where the gather was faster below s = 64. The two agree to rounding (the order of the sums)."""


def weighted_values(weights: torch.Tensor, indices: torch.Tensor, v: torch.Tensor, combine: Callable) -> torch.Tensor:
    r""":math:`\sum_s w_{is}\, v_{j_{is}}` for each row: ``weights`` and ``indices`` ``(*batch, rows, s)``, ``v``
    ``(*batch, m, p_v)`` (its batch broadcasts), ``combine`` its :func:`weighted_rows`; ``(*batch, rows, p_v)``.

    Up to ``s = m / 2`` the weighted sum of the ``s`` rows of ``v`` (:func:`weighted_rows`, without gathering
    them); above, the weights are scattered (added: a repeated index sums its weights, as the sum does) into a
    dense ``(*batch, rows, m)`` block and multiplied by ``v``. Measured on one thread, float32, 510 rows,
    ``p_v = 64``: at m = 4096, 0.23 ms against 3.7 ms for the dense product at s = 128, 4.5 ms against 4.7 ms at
    s = 2048, 8.4 ms against 7.0 ms at s = m (m = 1024: 0.7 against 0.9 ms at s = 512, 1.5 against 1.1 at s = m).
    """
    m = v.shape[-2]
    if 2 * indices.shape[-1] <= m:
        return combine(weights, indices)
    dense = torch.zeros((*indices.shape[:-1], m), dtype=weights.dtype, device=weights.device)
    return dense.scatter_add_(-1, indices, weights) @ v


def block_rows(batch: tuple, width: int) -> int:
    """Rows per block so that ``prod(batch) * rows * width <= BLOCK_ELEMENTS`` (at least 1)."""
    return max(1, BLOCK_ELEMENTS // max(1, int(torch.Size(batch).numel()) * max(1, width)))


def safe_softmax(logits: torch.Tensor) -> torch.Tensor:
    r"""Softmax over the last dimension with :math:`-\infty` entries weighted 0; an all :math:`-\infty` row is 0."""
    peak = logits.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(logits - peak)
    sums = weights.sum(-1, keepdim=True)
    return weights / torch.where(sums > 0, sums, torch.ones_like(sums))


def logit_blocks(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False,
                 key_mask: torch.Tensor | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
    r"""``(start, stop, logits)`` for consecutive row blocks: ``logits`` ``(*batch, stop - start, m)`` is
    :math:`QK^\top/\sqrt p` on rows ``start:stop`` with :math:`-\infty` on keys ``j > i`` (``causal``) and
    on masked keys."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n, m = q.shape[-2], k.shape[-2]
    block = block_rows(batch, m)
    keep_keys = None if key_mask is None else key_mask.unsqueeze(-2)
    for start in range(0, n, block):
        stop = min(start + block, n)
        logits = (q[..., start:stop, :] @ k.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))
        logits = logits.expand(*batch, stop - start, m)
        if causal:
            logits = logits.masked_fill(~causal_mask(stop - start, m, row_offset=start, device=q.device),
                                        float("-inf"))
        if keep_keys is not None:
            logits = logits.masked_fill(~keep_keys, float("-inf"))
        yield start, stop, logits


def attend_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    selection: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]], *,
                    width: int) -> torch.Tensor:
    r"""Exact softmax of each query over its selected keys, in row blocks.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    selection : callable
        ``selection(start, stop) -> (indices, valid)``, both ``(*batch, stop - start, width)``: the keys of
        rows ``start:stop`` (indices in ``[0, m)``; ``valid`` False on unused slots).
    width : int
        ``s``, the slots per row.

    Returns
    -------
    torch.Tensor
        ``(*batch, n, p_v)``. :func:`selected_weights` gives the weights of the same blocks (for the operator).
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    value_rows = weighted_rows(v, batch)
    return torch.cat([weighted_values(weights, indices, v, value_rows)
                      for indices, weights in _weighted_blocks(q, k, v, selection, width)], dim=-2)


def selected_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     selection: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]], *,
                     width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(*batch, n, s)`` indices and softmax weights (0 on unused slots) of :func:`attend_selected` -- the
    same row blocks, the same numbers -- without gathering the values or forming the output."""
    indices, weights = zip(*_weighted_blocks(q, k, v, selection, width))
    return torch.cat(indices, dim=-2), torch.cat(weights, dim=-2)


def _weighted_blocks(q, k, v, selection, width: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(indices, weights)`` of each row block of :func:`attend_selected` (``v`` sets the blocks' size)."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, p, p_v = q.shape[-2], q.shape[-1], v.shape[-1]
    block = block_rows(batch, width * max(p, p_v))
    key_rows = gather_rows(k, batch)
    for start in range(0, n, block):
        stop = min(start + block, n)
        indices, valid = selection(start, stop)
        rows = stop - start
        if DENSE_SELECTION * indices.shape[-1] < k.shape[-2]:
            keys = key_rows(indices)
            logits = (keys @ q[..., start:stop, :].expand(*batch, rows, p).unsqueeze(-1)).squeeze(-1) / math.sqrt(p)
        else:  # many keys per row: the selected logits of the block's dense logits (DENSE_SELECTION)
            every = (q[..., start:stop, :] @ k.transpose(-1, -2)).div_(math.sqrt(p))
            logits = torch.gather(every.expand(*batch, rows, k.shape[-2]), -1, indices)
        yield indices, safe_softmax(logits.masked_fill(~valid, float("-inf")))


def gather_rows(x: torch.Tensor, batch: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
    """``take(indices)``: rows ``x[..., indices[..., r, s], :]`` of ``x`` ``(*batch, m, c)`` for indices
    ``(*batch, *shape)`` in ``[0, m)``, ``(*batch, *shape, c)``.

    The same tensor as ``torch.gather`` over ``x`` expanded to the indices' shape, by one row lookup into ``x``
    flattened to ``(prod(batch) * m, c)`` (a copy of whole rows, not one index per entry).
    """
    flat, rows_of = _flat_rows(x, batch)

    def take(indices: torch.Tensor) -> torch.Tensor:
        return torch.index_select(flat, 0, rows_of(indices).reshape(-1)).view(*indices.shape, x.shape[-1])

    return take


def weighted_rows(x: torch.Tensor, batch: tuple) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    r"""``combine(weights, indices)``: :math:`\sum_s w_{rs}\, x_{j_{rs}}` for ``weights`` and ``indices``
    ``(*batch, rows, s)`` (indices in ``[0, m)``) and ``x`` ``(*batch, m, c)``; ``(*batch, rows, c)``.

    The product of the weights with :func:`gather_rows`'s rows (to rounding: the sum's order), by torch's
    ``embedding_bag`` (``mode="sum"`` with per-sample weights) over ``x`` flattened to ``(prod(batch) * m, c)``:
    each row's sum is accumulated from ``x`` itself, without a ``(*batch, rows, s, c)`` copy of the rows (on one
    thread, float32, 510 rows of ``s = 128`` of ``c = 64``: 0.25 ms against 2.3 ms for the gather and product).
    """
    flat, rows_of = _flat_rows(x, batch)

    def combine(weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        s = indices.shape[-1]
        out = torch.nn.functional.embedding_bag(rows_of(indices).reshape(-1, s), flat, mode="sum",
                                                per_sample_weights=weights.reshape(-1, s).to(flat.dtype))
        return out.view(*indices.shape[:-1], x.shape[-1])

    return combine


def _flat_rows(x: torch.Tensor, batch: tuple) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """``x`` ``(*batch, m, c)`` flattened to ``(prod(batch) * m, c)``, and ``rows_of(indices)``: indices ``(*batch,
    *shape)`` into ``[0, m)`` made rows of the flattened ``x`` (the same shape)."""
    m, c = x.shape[-2], x.shape[-1]
    flat = x.expand(*batch, m, c).reshape(-1, c)
    offsets = (torch.arange(int(torch.Size(batch).numel()), device=x.device) * m).view(*batch, 1) if batch else None

    def rows_of(indices: torch.Tensor) -> torch.Tensor:
        if offsets is None:
            return indices
        return (indices.reshape(*batch, -1) + offsets).view(indices.shape)

    return flat, rows_of


def real_ranks(key_mask: torch.Tensor | None, batch: tuple, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rank, position)`` of the real tokens, ``(*batch, n)`` each.

    ``rank[..., i]`` is the number of real tokens at positions ``<= i`` minus 1 (the rank of token ``i``
    among the real ones when it is real; the rank of the last real token before it when it is padding,
    -1 if none); ``position[..., r]`` is the position of the real token of rank ``r`` (``n`` past the last
    one). Without a mask every token is real: both are ``arange(n)``.
    """
    if key_mask is None:
        ranks = torch.arange(n, device=device).expand(*batch, n)
        return ranks, ranks
    real = key_mask.expand(*batch, n)
    ranks = real.long().cumsum(-1) - 1
    positions = torch.full((*batch, n + 1), n, dtype=torch.long, device=device)
    target = torch.where(real, ranks, torch.full_like(ranks, n))  # padding goes to the spare slot n
    positions.scatter_(-1, target, torch.arange(n, device=device).expand(*batch, n))
    return ranks, positions[..., :n]


def oracle_selection(q, k, v, *, causal: bool, key_mask, budget: int, keep, ranking=None) -> tuple:
    r"""Run an oracle row block by row block: each row's ``budget`` largest logits (:func:`~._row_topk.row_topk`,
    the same as ``torch.topk``), then ``keep(values, log_normaliser) -> valid`` says which of them are kept from
    their values ``(*batch, block, budget)`` (by decreasing logit; :math:`-\infty` on invisible keys) and the log
    of each row's softmax normaliser.

    Without ``causal`` the logits are those of every key, ``w = m``; with ``causal`` only the keys a block's rows
    can see are formed, ``w = min(m, max(stop, budget))`` for rows ``start:stop``, so the causal oracle costs half
    the logits. The causal mask is written on the block's diagonal columns only (those left of ``start`` are
    visible to every row), and the normaliser is ``torch.logsumexp``'s sum, taken in place once the kept logits
    are read, from the largest of them (:func:`_logsumexp_`: the same numbers in float64, to rounding in float32,
    without a copy of the block or a pass for the maximum). Every block's logits are written into one buffer
    (with a graph to record, for gradients, fresh logits and ``torch.logsumexp`` itself). ``ranking``: a
    :class:`KeyRanking` of these ``q`` and ``k`` at ``budget`` (:func:`rank_keys`, bidirectional and unmasked
    only), whose values, indices and normalisers are used instead of forming the logits: the same numbers.

    Returns ``(output, indices, weights, kept_mass, dropped_mass, counts)``; ``indices``/``weights``
    ``(*batch, n, budget)`` with the softmax over the kept keys (0 on unused slots), ``kept_mass`` and
    ``dropped_mass`` ``(*batch, n)`` the exact softmax mass of the kept and of the dropped keys
    (:math:`1-\delta_i` and :math:`\delta_i`, the second computed as :math:`-\operatorname{expm1}` of the
    log ratio, accurate when tiny); ``counts`` ``(*batch, n)`` the keys kept per row. Shared by ``topk`` and
    ``topp``.
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    values_of = weighted_rows(v, torch.broadcast_shapes(batch, v.shape[:-2]))
    if ranking is not None:
        chosen, indices = ranking.check(q, k, budget=budget, causal=causal, key_mask=key_mask)
        return _selected(chosen, indices, ranking.log_normaliser, keep, v, values_of,
                         ranking.whole.setdefault(budget, {}))
    graph = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)  # then no buffer, nothing in place
    parts = [_selected(chosen, indices, log_normaliser, keep, v, values_of) for chosen, indices, log_normaliser
             in _ranked_blocks(q, k, causal=causal, key_mask=key_mask, budgets=(budget,), graph=graph)]
    return tuple(torch.cat(part, dim=-2 if i < 3 else -1) for i, part in enumerate(zip(*parts)))


def _ranked_blocks(q, k, *, causal: bool, key_mask, budgets: tuple, graph: bool, v=None) -> Iterator[tuple]:
    """Row block by row block (of :func:`oracle_selection`): ``(*chosen, *indices, log_normaliser)``, each row's
    ``budgets[i]`` largest logits and their keys (``torch.topk``'s result at each budget: a smaller budget is
    the largest one's prefix, except in a block with a tie at its boundary, where it is taken again) and the log of
    its softmax normaliser; with one budget, ``(chosen, indices, log_normaliser)``. Given ``v`` (``graph`` False),
    each block's exact softmax output follows, ``(..., log_normaliser, output)`` (:func:`_softmax_output_`)."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n, m, p = q.shape[-2], k.shape[-2], q.shape[-1]
    block, budget = block_rows(batch, m), max(budgets)
    # one buffer for every block's logits (a fresh block of this size costs its page faults each time)
    heads = int(torch.Size(batch).numel())
    exact_scale = math.log2(p) % 2 == 0  # sqrt(p) a power of two: dividing q by it rounds nothing
    buffer = None if graph else torch.empty(heads * min(block, n) * m, dtype=torch.result_type(q, k),
                                            device=q.device)
    values_t = None if v is None else v.transpose(-1, -2).contiguous()  # (*batch, p_v, m): _softmax_output_
    for start in range(0, n, block):
        stop = min(start + block, n)
        columns = min(m, max(stop, budget)) if causal else m
        keys = k[..., :columns, :].transpose(-1, -2)
        if graph:
            logits = (q[..., start:stop, :] @ keys).div_(math.sqrt(p)).expand(*batch, stop - start, columns)
        else:
            logits = buffer[:heads * (stop - start) * columns].view(*batch, stop - start, columns)
            if exact_scale:  # q / sqrt(p) then the product: the same numbers as the product / sqrt(p)
                torch.matmul(q[..., start:stop, :] / math.sqrt(p), keys, out=logits)
            else:
                torch.matmul(q[..., start:stop, :], keys, out=logits).div_(math.sqrt(p))
        if causal and start < columns:  # keys j > i: on the columns start.. only
            logits[..., start:].masked_fill_(~causal_mask(stop - start, columns - start, device=q.device),
                                             float("-inf"))
        if key_mask is not None:
            logits = logits.masked_fill(~key_mask[..., :columns].unsqueeze(-2), float("-inf"))
        top, top_indices = row_topk(logits, budget)
        ranked = []
        for b in budgets:  # a tie at a smaller budget's boundary: torch.topk may keep another of the tied keys
            tied = b < budget and bool((top[..., b - 1] == top[..., b]).any())
            ranked.append(row_topk(logits, b) if tied else (top[..., :b], top_indices[..., :b]))
        if v is not None:
            yield (*(c for c, _ in ranked), *(i for _, i in ranked),
                   *_softmax_output_(logits, top[..., :1], values_t))
            continue
        log_normaliser = torch.logsumexp(logits, dim=-1) if graph else _logsumexp_(logits, top[..., :1])
        yield (*(c for c, _ in ranked), *(i for _, i in ranked), log_normaliser)


def _selected(chosen, indices, log_normaliser, keep, v, values_of, whole: dict | None = None) -> tuple:
    """What :func:`oracle_selection` returns for the rows of ``chosen`` and ``indices`` ``(*batch, rows, budget)``
    (each row's largest logits and their keys) and ``log_normaliser`` ``(*batch, rows)``.

    ``whole`` (a :class:`KeyRanking`'s ``whole[budget]``): where ``keep`` keeps every slot of every row, the result
    depends on the ranking and ``v`` alone, so it is kept there with its ``v`` and handed back, not recomputed, to
    the next call that keeps every slot with the same ``v`` (``topp`` whose cap binds on every row after ``topk``
    at the same budget: the same tensors)."""
    empty = ~torch.isfinite(log_normaliser)  # a padded causal row before the first real key sees none
    log_normaliser = log_normaliser.masked_fill(empty, 0.0)
    valid = keep(chosen, log_normaliser) & ~empty.unsqueeze(-1)
    every = whole is not None and bool(valid.all())
    if every and whole.get("v") is v:
        return whole["result"]
    chosen = chosen.masked_fill(~valid, float("-inf"))
    log_kept = torch.logsumexp(chosen, dim=-1).masked_fill(empty, 0.0)
    weights = torch.exp(chosen - log_kept.unsqueeze(-1))
    result = (weighted_values(weights, indices, v, values_of), indices, weights, torch.exp(log_kept - log_normaliser),
              -torch.expm1(log_kept - log_normaliser), valid.sum(-1))
    if every:
        whole.update(v=v, result=result)
    return result


@dataclass(frozen=True)
class KeyRanking:
    r"""Each query's largest logits :math:`s_{ij} = q_i^\top k_j/\sqrt p` at several budgets, and the log of its
    softmax normaliser: what the oracles (``topk``, ``topp``) read of the logits, from :func:`rank_keys`.

    ``ranked``: ``{budget: (values, indices)}``, each ``(*batch, n, budget)`` by decreasing logit;
    ``log_normaliser``: ``(*batch, n)``, :math:`\log\sum_j e^{s_{ij}}`; ``shape``: ``(q.shape, k.shape)``;
    ``output``: the exact softmax attention :math:`\operatorname{softmax}(s)\,V` ``(*batch, n, p_v)`` of the ``v``
    given to :func:`rank_keys`, else None; ``whole``: ``{budget: {"v", "result"}}``, what an oracle that kept every
    ranked key at that budget returned, for the next one that keeps them all (``_selected``; its ``weights`` are
    :math:`8 n b` bytes a batch element in float64).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import rank_keys
    >>> q = k = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
    >>> ranking = rank_keys(q, k, [1, 2])
    >>> ranking.ranked[1][1][0].flatten().tolist()  # each query's own key first
    [0, 1, 2, 3]
    >>> ranking.check(q, k, budget=2, causal=False, key_mask=None)[0].shape
    torch.Size([2, 4, 2])
    """

    ranked: dict
    log_normaliser: torch.Tensor
    shape: tuple
    output: torch.Tensor | None = None
    whole: dict = field(default_factory=dict, repr=False, compare=False)

    def check(self, q, k, *, budget: int, causal: bool, key_mask) -> tuple:
        """``(values, indices)`` at ``budget`` for these ``q`` and ``k``, or a ``ValueError`` naming ``ranking``."""
        if causal or key_mask is not None:
            raise ValueError("`ranking` is for bidirectional attention without a key mask; got "
                             f"causal={bool(causal)}, key_mask {'given' if key_mask is not None else 'None'}.")
        if self.shape != (tuple(q.shape), tuple(k.shape)) or budget not in self.ranked:
            raise ValueError(f"`ranking` must be rank_keys(q, k, budgets) of q {tuple(q.shape)}, k {tuple(k.shape)} "
                             f"with budget {budget} among its budgets; got one of q {self.shape[0]}, k "
                             f"{self.shape[1]} at budgets {sorted(self.ranked)}.")
        return self.ranked[budget]


def rank_keys(q: torch.Tensor, k: torch.Tensor, budgets, *, v: torch.Tensor | None = None) -> KeyRanking:
    r"""Each query's ``b`` largest logits and their keys for every ``b`` in ``budgets``, from one pass over the logits.

    The logits :math:`s_{ij} = q_i^\top k_j/\sqrt p` are formed once, in the row blocks of the oracles
    (:func:`oracle_selection`), and each block is ranked once at the largest budget; a smaller budget is its
    prefix (``torch.topk`` of the same logits at that budget, taken again in a block where two logits tie at
    its boundary). ``topk`` and ``topp`` given the result (their ``ranking``) then give the same numbers as
    without it, at every budget of ``budgets``, without forming the logits again: one pass instead of one per
    method and budget.

    Given ``v``, the same pass also gives the exact attention output
    :math:`O = \operatorname{diag}(P\mathbf 1)^{-1} P V` with :math:`P = e^{S - \max_j S}` (the row maximum
    subtracted, as the log-sum-exp already forms it): one ``(block, m) x (m, p_v)`` product per row block beside
    the log-sum-exp's exponentials (:func:`_softmax_output_`); the fused kernel's output to rounding (the order of
    the sums), at the cost of that product instead of a second pass over the logits.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, m, p)``.
    budgets : sequence of int
        Keys per query, each ``1 <= b <= m``.
    v : torch.Tensor, optional
        ``(*batch, m, p_v)``: also form the exact output (``KeyRanking.output``).

    Returns
    -------
    KeyRanking
        Its ``ranked[b]``: ``(values, indices)`` ``(*batch, n, b)``; memory :math:`16\,n\sum_b b` bytes a batch
        element in float64.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.methods import rank_keys
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> ranking = rank_keys(q, k, [8, 32])
    >>> shared = approxlab.approximate("topp", q, k, v, num_features=8, ranking=ranking).output
    >>> torch.equal(shared, approxlab.approximate("topp", q, k, v, num_features=8).output)
    True
    """
    check_qkv(q, k) if v is None else check_qkv(q, k, v)
    m = k.shape[-2]
    budgets = [check_int(b, "budgets", low=1, high=m) for b in budgets]
    if not budgets:
        raise ValueError("`budgets` must hold at least one budget; got none.")
    unique = tuple(sorted(set(budgets)))
    with torch.no_grad():
        blocks = list(_ranked_blocks(q, k, causal=False, key_mask=None, budgets=unique, graph=False, v=v))
    columns = [torch.cat(part, dim=-1 if i == 2 * len(unique) else -2) for i, part in enumerate(zip(*blocks))]
    ranked = {b: (columns[i], columns[len(unique) + i]) for i, b in enumerate(unique)}
    output = None if v is None else columns[-1]
    return KeyRanking(ranked, columns[2 * len(unique)], (tuple(q.shape), tuple(k.shape)), output)


def _logsumexp_(logits: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    r"""``torch.logsumexp(logits, dim=-1)`` by its own steps (the row maximum, 0 where infinite, subtracted; exp;
    sum; log; the maximum added back), in place, ``logits`` overwritten. The row maximum is given, ``largest``
    ``(..., 1)`` (the first of ``torch.topk``'s values: NaN where the row has one, as ``amax`` gives it).

    float64: torch's steps, the same numbers. Narrower floats: :math:`e^{x} = 2^{x\log_2 e}`, the exponent scaled
    in place and ``exp2``, the same to rounding (the scaling rounds once, relative error of each term at most
    :math:`|x| \cdot 2^{-24}`, below the float32 sum's own), torch's float32 ``exp`` being the slower (on one thread,
    ``(3, 170, 8192)`` logits: ``benchmarks/results/selection_oracles.md``)."""
    terms, peak = _exp_shifted_(logits, largest)
    return terms.sum(-1).log_().add_(peak.squeeze(-1))


def _softmax_output_(logits: torch.Tensor, largest: torch.Tensor, values_t: torch.Tensor) -> tuple:
    r"""``(log_normaliser, output)`` of a block: :func:`_logsumexp_`'s result (the same steps, the same numbers)
    and :math:`(P V) / (P\mathbf 1)` with :math:`P = e^{s - \max}` the exponentials it forms in place,
    ``(..., rows)`` and ``(..., rows, p_v)``; ``logits`` overwritten; ``values_t`` is :math:`V^\top`
    ``(..., p_v, m)``, contiguous.

    The product is taken as :math:`(V^\top P^\top)^\top`: on one thread, float64, 12 heads, 85 rows of
    ``m = 4096``, ``p_v = 64`` (the blocks of ``n = 4096``), 14.5 ms against 20.6 ms for :math:`P V`."""
    terms, peak = _exp_shifted_(logits, largest)
    sums = terms.sum(-1)
    output = torch.matmul(values_t, terms.transpose(-1, -2)).transpose(-1, -2).div_(sums.unsqueeze(-1))
    return sums.log_().add_(peak.squeeze(-1)), output


def _exp_shifted_(logits: torch.Tensor, largest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exp(logits - peak), peak)`` with ``peak`` ``largest`` made 0 where infinite; ``logits`` overwritten."""
    peak = largest.clone()
    peak.masked_fill_(peak.abs() == math.inf, 0.0)
    shifted = logits.sub_(peak)
    terms = shifted.exp_() if logits.dtype == torch.float64 else shifted.mul_(1 / math.log(2)).exp2_()
    return terms, peak


def sparse_approximation(name: str, output: torch.Tensor, m: int, record: Callable[[], tuple], info: dict):
    """An :class:`Approximation` whose operator, built on first use by ``record() -> (indices, weights)``, is a
    :class:`~approxlab.operators.RowSparseOperator` with ``m`` columns."""

    def build():
        indices, weights = record()
        return RowSparseOperator(indices, weights, m)

    return Approximation(name, "softmax", output, build, info)

