r"""Exact causal softmax over a sparse pattern, computed sparsely: each query block against the keys its pattern shows.

The sparse-prefill methods (MInference, XAttention, FlexPrefill, DuoAttention) keep, for every query :math:`i`, a
set :math:`S_i \subseteq \{0, \dots, i\}` and compute
:math:`\tilde o_i = \sum_{j\in S_i} e^{s_{ij}} v_j / \sum_{l\in S_i} e^{s_{il}}`, :math:`s_{ij} = q_i^\top k_j/\sqrt p`
(:mod:`~approxlab.methods._mask_attention` evaluates the same from a boolean mask, densely). Here the pattern comes
in the two forms the authors' kernels take:

* :func:`attend_blocks`: the kept key blocks of each query block (MInference's block-sparse pattern, XAttention,
  FlexPrefill; the ``block_sparse_attention`` kernels), the element mask :math:`j \le i` inside the diagonal block;
* :func:`attend_vertical_slash`: kept columns and kept diagonal offsets :math:`o = i - j` (MInference's
  vertical-slash and A-shape, DuoAttention's streaming heads; ``vertical_slash_sparse_attention``): each query block
  gathers the kept columns and the key ranges its kept diagonals cross, with the element mask inside.

Each query block of :math:`B` rows forms its logits against one gathered set of :math:`W` keys only, takes the
softmax over the visible entries in the log domain (the row maximum subtracted; a row with no visible key gets
output 0 and log-normaliser :math:`-\infty`) and the weighted sum of the gathered values: time :math:`O(nWp)`,
memory :math:`O(\text{chunk}\cdot BW)`, never an :math:`n \times n` or :math:`B \times n` tensor. A head whose
pattern is the whole causal triangle goes to torch's fused causal kernel instead (the dense route, kept where a
pattern is dense), and a head of :func:`attend_blocks` that keeps many blocks runs each query block through the
same kernel over its kept blocks only (:data:`FUSED_WIDTH`). The outputs equal
:func:`~approxlab.methods._mask_attention.attend_mask`'s to rounding (the order of the sums; tests compare both).
"""

from __future__ import annotations

import math

import torch

from ..operators.fused_attention import attend_with_lse, flash_attention_cpu
from ._selection import BLOCK_ELEMENTS, gather_rows

__all__ = ["attend_blocks", "attend_vertical_slash", "diagonal_template", "causal_attention_with_lse"]


def causal_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact causal attention and each row's :math:`\log\sum_{j\le i} e^{s_{ij}}` through torch's fused kernel.

    ``q, k, v`` ``(H, n, p)``, ``(H, n, p)``, ``(H, n, p_v)``; returns ``(H, n, p_v)`` and ``(H, n)``.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 2, 2, dtype=torch.float64)
    >>> out, lse = causal_attention_with_lse(q, k, torch.tensor([[[1.0], [3.0]]], dtype=torch.float64))
    >>> out.flatten().tolist(), [round(x, 4) for x in lse.flatten().tolist()]
    ([1.0, 2.0], [0.0, 0.6931])
    """
    return attend_with_lse(q, k, v, 1 / math.sqrt(q.shape[-1]), need_lse=True, mask="causal")


def _gathered(q, k, v, chunk_of, width: int, block_size: int):
    r"""``(out, lse)`` of the query blocks of ``q`` ``(H, N*B, p)`` (rows padded to whole blocks) against their
    gathered keys: ``chunk_of(first, last)`` gives the ``(H, c, W)`` key indices (rows of ``k``/``v`` ``(H, m, .)``)
    of the blocks ``first:last``, ``W <= width``, ``hide(logits)``, which writes :math:`-\infty` in place on the
    entries of their ``(H, c, B, W)`` logits that the pattern does not show, and ``None`` or ``(row_keys, shown)``,
    ``(H, c, B, D)`` each: keys of each row's own (its isolated diagonals') and which of them it sees. ``out``
    ``(H, N*B, p_v)``, ``lse`` ``(H, N*B)``."""
    heads, rows, p = q.shape
    blocks = rows // block_size
    key_rows, value_rows = gather_rows(k, (heads,)), gather_rows(v, (heads,))
    chunk = max(1, BLOCK_ELEMENTS // max(1, heads * block_size * max(width, p)))
    outputs, normalisers = [], []
    for first in range(0, blocks, chunk):
        last = min(first + chunk, blocks)
        chosen, hide, own = chunk_of(first, last)
        queries = q[:, first * block_size:last * block_size].reshape(heads, last - first, block_size, p)
        logits = (queries @ key_rows(chosen).transpose(-1, -2)).div_(math.sqrt(p))
        hide(logits)
        if own is not None:  # each row's own keys: one dot product each
            single = (key_rows(own[0]) @ queries.unsqueeze(-1)).squeeze(-1).div_(math.sqrt(p))
            logits = torch.cat([logits, single.masked_fill_(~own[1], -math.inf)], dim=-1)
        peak = logits.detach().amax(-1, keepdim=True)  # a constant shift (no gradient: the softmax ignores it)
        peak.masked_fill_(~torch.isfinite(peak), 0.0)
        weights = logits.sub_(peak).exp_()
        sums = weights.sum(-1, keepdim=True)
        out = weights[..., :chosen.shape[-1]] @ value_rows(chosen)
        if own is not None:
            out = out + (weights[..., chosen.shape[-1]:].unsqueeze(-2) @ value_rows(own[0])).squeeze(-2)
        out = out / torch.where(sums > 0, sums, torch.ones_like(sums))
        outputs.append(out.flatten(1, 2))
        normalisers.append((sums.log() + peak).flatten(1, 3))
    return torch.cat(outputs, dim=1), torch.cat(normalisers, dim=1)


FUSED_WIDTH = 1024
r"""From this many kept keys per query block on average (a head's kept blocks times :math:`B`), :func:`attend_blocks`
runs each query block of the head through torch's fused kernel -- its kept earlier blocks unmasked (one slice when
they are contiguous), its diagonal block in the kernel's causal form, the two merged by their log-normalisers --
instead of gathering the blocks of many query blocks into one padded product. The fused kernel never writes the
block's logits out, which pays for its per-call overhead once a query block reads many keys (FlexPrefill's
near-dense patterns on random inputs); below, the batched gathered product is faster."""


def _merge(first, second):
    """``(out, lse)`` of attention over two disjoint key sets from each set's ``(out, lse)``."""
    lse = torch.logaddexp(first[1], second[1])
    return (first[0] * torch.exp(first[1] - lse).unsqueeze(-1)
            + second[0] * torch.exp(second[1] - lse).unsqueeze(-1)), lse


def _fused(q, k, v, scale: float, causal: bool = False):
    """``(out, lse)`` ``(1, T, .)``, ``(1, T)`` of ``q, k, v`` ``(1, T, .)`` through the fused kernel: its CPU
    op on views of the inputs where it takes them (no copy), else
    :func:`~approxlab.operators.fused_attention.attend_with_lse`."""
    if q.shape[-1] == v.shape[-1]:
        fused = flash_attention_cpu(q[None], k[None], v[None], scale, causal)
        if fused is not None:
            return fused[0][0], fused[1][0]
    return attend_with_lse(q, k, v, scale, mask="causal" if causal else None)


def _fused_blocks(q, k, v, pattern, block_size: int):
    """``(out, lse)`` ``(h, n, .)`` of :func:`attend_blocks` for ``pattern`` ``(h, N, N)`` (no block after the
    diagonal), each head and query block through the fused kernel (:data:`FUSED_WIDTH`)."""
    heads, n, p = q.shape
    scale = 1 / math.sqrt(p)
    out, lse = q.new_zeros(heads, n, v.shape[-1]), q.new_full((heads, n), -math.inf)
    offsets = torch.arange(block_size, device=q.device)
    for head in range(heads):
        for block, kept in enumerate(pattern[head]):
            start, stop = block * block_size, min(n, (block + 1) * block_size)
            rows = q[head:head + 1, start:stop]
            earlier = kept[:block].nonzero().flatten()
            parts = []
            if len(earlier) and int(earlier[-1] - earlier[0]) + 1 == len(earlier):  # one contiguous range
                keys = slice(int(earlier[0]) * block_size, (int(earlier[-1]) + 1) * block_size)
                parts.append(_fused(rows, k[head:head + 1, keys], v[head:head + 1, keys], scale))
            elif len(earlier):
                keys = (earlier.unsqueeze(-1) * block_size + offsets).flatten()
                parts.append(_fused(rows, k[head:head + 1, keys], v[head:head + 1, keys], scale))
            if bool(kept[block]):
                parts.append(_fused(rows, k[head:head + 1, start:stop], v[head:head + 1, start:stop], scale, True))
            if parts:
                part = parts[0] if len(parts) == 1 else _merge(*parts)
                out[head, start:stop], lse[head, start:stop] = part[0][0], part[1][0]
    return out, lse


def _by_heads(q, k, v, dense: torch.Tensor, sparse):
    """``(out, lse)`` over the heads ``(H, n, .)``: the fused causal kernel on the ``dense`` ``(H,)`` heads,
    ``sparse(heads)`` (a ``(h,)`` index tensor -> ``(out, lse)`` of those heads) on the others."""
    if bool(dense.all()):
        return causal_attention_with_lse(q, k, v)
    if not bool(dense.any()):
        return sparse(torch.arange(q.shape[0], device=q.device))
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = q.new_empty(q.shape[:-1])
    full, rest = dense.nonzero().flatten(), (~dense).nonzero().flatten()
    out[full], lse[full] = causal_attention_with_lse(q[full], k[full], v[full])
    out[rest], lse[rest] = sparse(rest)
    return out, lse


def _heads(q, k, v, *patterns):
    """``q, k, v`` and ``patterns`` expanded to their common batch and flattened to ``(H, ...)``; the batch."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                   *(x.shape[:-t] for x, t in patterns))
    flat = [x.expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v)]
    flat += [x.expand(*batch, *x.shape[-t:]).reshape(-1, *x.shape[-t:]) for x, t in patterns]
    return batch, flat


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[-2]))


def attend_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chosen: torch.Tensor, block_size: int, *,
                  return_lse: bool = False):
    r"""Exact causal attention over the kept key blocks of each query block, computed block-sparsely.

    ``q, k, v`` ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; ``chosen`` bool ``(*batch, N, N)``,
    :math:`N = \lceil n/B\rceil` for :math:`B` = ``block_size``: row :math:`i` of query block :math:`I` attends the
    keys :math:`j \le i` of the key blocks :math:`J` with ``chosen[..., I, J]`` (the pattern of
    :func:`~approxlab.methods._mask_attention.block_visible`). Each query block gathers its :math:`c_I` kept blocks
    (padded to the most any block keeps, :math:`W = B\max_I c_I`): time :math:`O(nWp)`. Returns ``(*batch, n,
    p_v)`` (0 on a row with no visible key), and with ``return_lse`` also the ``(*batch, n)`` log-normalisers
    (without a gradient on a dense head's rows: the fused kernel's). With a gradient to record, every sparse head
    takes the gathered route, whose log-normalisers the merge of :data:`FUSED_WIDTH`'s route would need.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> v = torch.tensor([[[1.0], [3.0], [5.0], [7.0]]], dtype=torch.float64)
    >>> chosen = torch.tensor([[[True, False], [True, False]]])  # block 1 keeps key block 0 only
    >>> attend_blocks(q, k, v, chosen, 2)[0, :, 0].tolist()
    [1.0, 2.0, 2.0, 2.0]
    """
    batch, (q, k, v, chosen) = _heads(q, k, v, (chosen, 2))
    n = q.shape[-2]
    blocks = chosen.shape[-1]
    later = torch.ones(blocks, blocks, dtype=torch.bool, device=q.device).triu(1)
    chosen = chosen & ~later
    dense = (chosen | later).flatten(1).all(-1)

    def sparse(heads):
        pattern = chosen[heads]
        counts = pattern.sum(-1)  # (h, N)
        graph = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))  # the kernel's lse has none
        if not graph and float(counts.float().mean()) * block_size >= FUSED_WIDTH:
            return _fused_blocks(q[heads], k[heads], v[heads], pattern, block_size)
        rank = pattern.to(torch.uint8) * (1 + torch.eye(blocks, dtype=torch.uint8, device=q.device))
        offsets = torch.arange(block_size, device=q.device)
        later = torch.ones(block_size, block_size, dtype=torch.bool, device=q.device).triu(1)

        def chunk_of(first, last):  # each chunk padded to its own most kept blocks
            widest = max(1, int(counts[:, first:last].max()))
            slots, order = rank[:, first:last].topk(widest, dim=-1)  # the diagonal block (2), the other kept (1)
            keys = (order.unsqueeze(-1) * block_size + offsets).flatten(-2)  # (h, c, c_I * B)
            padding = (slots == 0).repeat_interleave(block_size, dim=-1)[:, :, None, :]
            diagonal = later & (slots[..., :1, None] == 2)  # (h, c, B, B): j > i in a kept diagonal block

            def hide(logits):
                logits.masked_fill_(padding, -math.inf)
                logits[..., :block_size].masked_fill_(diagonal, -math.inf)

            return keys, hide, None

        padded = blocks * block_size
        out, lse = _gathered(_pad_rows(q[heads], padded), _pad_rows(k[heads], padded), _pad_rows(v[heads], padded),
                             chunk_of, max(1, int(counts.max())) * block_size, block_size)
        return out[:, :n], lse[:, :n]

    out, lse = _by_heads(q, k, v, dense, sparse)
    out, lse = out.reshape(*batch, n, -1), lse.reshape(*batch, n)
    return (out, lse) if return_lse else out


def diagonal_template(offsets: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The key positions relative to a query block's first row that its kept diagonals cross.

    Rows :math:`s, \dots, s + B - 1` meet diagonal :math:`o` at keys :math:`s - o, \dots, s - o + B - 1`, so the
    keys of every kept offset are :math:`s + r` for :math:`r` in the union of :math:`[-o, -o + B - 1]` -- the
    same for every block (the runs of kept offsets closer than :math:`B` merged, as MInference's kernel merges its
    diagonal ranges). ``offsets`` bool ``(H, n)`` (True on kept :math:`o = i - j`); returns ``(relative, valid)``,
    ``(H, W)`` each (``relative`` ascending, ``valid`` False on padding), :math:`W` the widest union.

    Examples
    --------
    >>> import torch
    >>> relative, valid = diagonal_template(torch.tensor([[True, True, False, False, False, True]]), 2)
    >>> relative[valid].tolist()  # offsets 0, 1 (keys s-1..s+1) and 5 (keys s-5, s-4)
    [-5, -4, -1, 0, 1]
    """
    heads, n = offsets.shape
    reach = torch.nn.functional.pad(offsets.long().cumsum(-1), (1, 0))  # reach[o] = kept offsets below o
    r = torch.arange(-(n - 1), block_size, device=offsets.device)  # every relative key position
    low, high = (-r).clamp(0, n), (block_size - r).clamp(0, n)  # offsets -r .. -r + B - 1 cover position r
    covered = (reach[:, high] - reach[:, low]) > 0  # (H, n + B - 1)
    width = max(1, int(covered.sum(-1).max()))
    slots, order = covered.to(torch.uint8).topk(width, dim=-1, sorted=False)
    order, sort = order.sort(-1)
    return r[order], torch.gather(slots, -1, sort).bool()


def _diagonal_runs(offsets: torch.Tensor, shortest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(long, isolated)``, bool ``(H, n)``: the kept ``offsets`` in runs of at least ``shortest`` consecutive
    ones, and the others."""
    starts = offsets & ~torch.nn.functional.pad(offsets[..., :-1], (1, 0))
    run = starts.long().cumsum(-1) * offsets  # 1, 2, ... on each run's offsets; 0 off them
    lengths = torch.zeros(offsets.shape[0], offsets.shape[-1] + 1, dtype=torch.long, device=offsets.device)
    lengths.scatter_add_(-1, run, offsets.long())
    long = offsets & (torch.gather(lengths, -1, run) >= shortest)
    return long, offsets & ~long


def attend_vertical_slash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, columns: torch.Tensor,
                          offsets: torch.Tensor, *, block_size: int = 64, return_lse: bool = False):
    r"""Exact causal attention over kept columns and kept diagonals, computed sparsely.

    ``q, k, v`` ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; ``columns`` and ``offsets`` bool
    ``(*batch, n)``: row :math:`i` attends the keys :math:`j \le i` with ``columns[j]`` or ``offsets[i - j]`` (the
    vertical-slash pattern, MInference's Algorithm 2; sinks and a window when both are prefixes). Each query block
    of :math:`B` = ``block_size`` rows gathers the kept columns (each counted there only) and the keys of
    :func:`diagonal_template` for the kept diagonals in runs of at least :math:`\lfloor B/4\rfloor` (:math:`W =
    |C| + W_s` in all), the element mask inside; a diagonal in a shorter run, which would widen every block's set
    by :math:`B` keys for one a row, is read row by row instead (one dot product and one value a row):
    time :math:`O(n(W + D)p)` for :math:`D` such diagonals.
    Returns ``(*batch, n, p_v)`` (0 on a row with no visible key), and with ``return_lse`` also the ``(*batch,
    n)`` log-normalisers.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> v = torch.tensor([[[1.0], [3.0], [5.0], [7.0]]], dtype=torch.float64)
    >>> first = torch.tensor([[True, False, False, False]])  # column 0 and the main diagonal
    >>> attend_vertical_slash(q, k, v, first, first, block_size=2)[0, :, 0].tolist()
    [1.0, 2.0, 3.0, 4.0]
    """
    batch, (q, k, v, columns, offsets) = _heads(q, k, v, (columns, 1), (offsets, 1))
    n = q.shape[-2]
    dense = columns.all(-1) | offsets.all(-1)

    def sparse(heads):
        kept_columns, kept_offsets = columns[heads], offsets[heads]
        widest = max(1, int(kept_columns.sum(-1).max()))
        column_slots, column_keys = kept_columns.to(torch.uint8).topk(widest, dim=-1, sorted=False)
        long, isolated = _diagonal_runs(kept_offsets, max(1, block_size // 4))
        relative, diagonal_slots = diagonal_template(long, block_size)
        lone = int(isolated.sum(-1).max())
        lone_slots, lone_offsets = isolated.to(torch.uint8).topk(max(1, lone), dim=-1, sorted=False)
        blocks = -(-n // block_size)
        starts = torch.arange(blocks, device=q.device).unsqueeze(-1) * block_size
        slash_keys = starts + relative.unsqueeze(-2)  # (h, N, W_s)
        keys = torch.cat([column_keys.unsqueeze(-2).expand(-1, blocks, -1), slash_keys.clamp(0, n - 1)], dim=-1)
        rows = torch.arange(blocks * block_size, device=q.device).view(blocks, block_size, 1)
        on_column = column_slots.bool()[:, None, None, :]
        on_slash = (slash_keys >= 0) & ~torch.gather(kept_columns, -1, keys[..., widest:].flatten(1)).view_as(
            slash_keys)  # (h, N, W_s): a kept column is counted among the columns only
        # row t of any block meets template key r on offset t - r: the diagonals' mask is the same in every block
        offset = torch.arange(block_size, device=q.device).view(block_size, 1) - relative.unsqueeze(-2)  # (h, B, W_s)
        diagonal = torch.gather(long, -1, offset.clamp(0, n - 1).flatten(1)).view_as(offset)
        diagonal &= (offset >= 0) & diagonal_slots.unsqueeze(-2)

        def chunk_of(first, last):
            vertical = on_column & (column_keys[:, None, None, :] <= rows[first:last])
            slash = diagonal.unsqueeze(1) & on_slash[:, first:last, None, :]
            shown = torch.cat([vertical.expand(-1, last - first, -1, -1), slash], dim=-1)
            own = None
            if lone:
                row_keys = rows[first:last] - lone_offsets[:, None, None, :]  # (h, c, B, D)
                own_shown = lone_slots.bool()[:, None, None, :] & (row_keys >= 0)
                row_keys = row_keys.clamp(0, n - 1)
                own = row_keys, own_shown & ~torch.gather(kept_columns, -1, row_keys.flatten(1)).view_as(row_keys)
            return keys[:, first:last], lambda logits: logits.masked_fill_(~shown, -math.inf), own

        out, lse = _gathered(_pad_rows(q[heads], blocks * block_size), k[heads], v[heads], chunk_of,
                             keys.shape[-1] + lone, block_size)
        return out[:, :n], lse[:, :n]

    out, lse = _by_heads(q, k, v, dense, sparse)
    out, lse = out.reshape(*batch, n, -1), lse.reshape(*batch, n)
    return (out, lse) if return_lse else out
