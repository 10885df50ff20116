r"""What HyperAttention and KDEformer share: sortLSH blocks plus sampled columns, in the log domain.

Both approximate softmax attention by a matrix :math:`\tilde A` with a few entries per row -- the keys of
the query's sortLSH block (:mod:`approxlab.sortlsh`) and sampled keys with importance weights -- and a
row-sum estimate :math:`\tilde d_i`; the output is :math:`\tilde D^{-1}\tilde AV`. Here a *piece* holds
:math:`\log\tilde A` on a block of rows and columns (:math:`-\infty`: no entry), so nothing overflows:
an entry is only ever formed as :math:`\exp(\log\tilde A_{ij} - \log\tilde d_i)`. The causal recursion of
HyperAttention adds pieces row by row (:func:`merge`). Block entries are computed by windows of sorted
queries against the sorted keys of their blocks (dense products), so a piece costs :math:`O(n(b + s)p)`.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import sketch
from ..kernels import scaled_logits
from ..operators import RowSparseOperator
from .draws import DrawEntry, check_draw

__all__ = ["Piece", "block_logits", "logits_at", "uniform_positions", "value_weights", "piece_output", "merge",
           "operator_from_pieces", "check_uniform_draw", "uniform_entry"]


@dataclasses.dataclass
class Piece:
    r"""Entries of :math:`\log\tilde A` on rows ``row_start:row_start + n`` and columns from ``column_offset``.

    Two kinds of entries, either may be absent: the keys of each query's sortLSH block, ``blocks``
    (:class:`approxlab.sortlsh.HeavyBlocks` of the piece's own queries and keys) with ``block_logits``
    ``(*batch, n, b)`` aligned with ``blocks.keys`` (:math:`-\infty` off the block); and columns shared by
    every row, ``columns`` ``(*batch, s)`` (local indices) with ``log_weights`` ``(*batch, n, s)``
    (:math:`-\infty`: no entry). ``slot``: pieces of one slot cover disjoint rows (the operator lays out
    its columns slot by slot).
    """

    row_start: int
    column_offset: int
    blocks: object = None
    block_logits: torch.Tensor | None = None
    block_size: int = 0
    columns: torch.Tensor | None = None
    log_weights: torch.Tensor | None = None
    slot: int = 0

    def log_row_sums(self) -> torch.Tensor:
        """:math:`\\log\\sum_j\\tilde A_{ij}` of the piece's entries, ``(*batch, n)``."""
        parts = [x for x in (self.block_logits, self.log_weights) if x is not None]
        return torch.logsumexp(torch.cat(parts, -1), -1)


def _windows(blocks, block_size: int, n: int):
    """Chunks of consecutive sorted queries and the window of sorted keys that holds all their blocks:
    yields ``(rows (*b, c), keys (*b, W), offsets (*b, c))``, ``offsets`` the start of each query's block
    in the window. ``W = block_size``: the chunk's queries share one block, every offset is 0 and the window is
    that block (HyperAttention's default self-attention: chunks of 256 queries, blocks of 256 keys)."""
    sorted_blocks = torch.gather(blocks.query_block, -1, blocks.query_order)  # non-decreasing
    m = blocks.key_order.shape[-1]
    chunk = max(block_size, 128)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        first = sorted_blocks[..., start : start + 1]
        width = (int((sorted_blocks[..., stop - 1 : stop] - first).max()) + 1) * block_size
        positions = (first * block_size + torch.arange(width, device=first.device)).clamp(0, m - 1)
        yield (blocks.query_order[..., start:stop], torch.gather(blocks.key_order, -1, positions),
               (sorted_blocks[..., start:stop] - first) * block_size)


def _in_window(offsets: torch.Tensor, block_size: int, width: int) -> torch.Tensor:
    """``(*b, c, b)`` positions of each query's block in its window."""
    return (offsets.unsqueeze(-1) + torch.arange(block_size, device=offsets.device)).clamp_max(width - 1)


def block_logits(q: torch.Tensor, k: torch.Tensor, blocks, block_size: int) -> torch.Tensor:
    r""":math:`q_i^\top k_j/\sqrt p` for the keys of each query's block, ``(*batch, n, b)`` aligned with
    ``blocks.keys`` (:math:`-\infty` where ``blocks.valid`` is False), by windows (:math:`O(nbp)`)."""
    out = q.new_empty(*blocks.keys.shape)
    for rows, keys, offsets in _windows(blocks, block_size, q.shape[-2]):
        logits = scaled_logits(sketch.gather_rows(q, rows), sketch.gather_rows(k, keys))  # (*b, c, W)
        chosen = logits if keys.shape[-1] == block_size else torch.gather(  # one block: the window is it
            logits, -1, _in_window(offsets, block_size, keys.shape[-1]))
        out.scatter_(-2, rows.unsqueeze(-1).expand(chosen.shape), chosen)
    return out.masked_fill_(~blocks.valid, float("-inf"))


def _block_output(weights: torch.Tensor, v: torch.Tensor, blocks, block_size: int) -> torch.Tensor:
    """:math:`\\sum_t w_{it}v_{k_{it}}` over each query's block (``weights`` aligned with ``blocks.keys``)."""
    out = v.new_zeros(*weights.shape[:-1], v.shape[-1])
    for rows, keys, offsets in _windows(blocks, block_size, weights.shape[-2]):
        chosen = torch.gather(weights, -2, rows.unsqueeze(-1).expand(*rows.shape, weights.shape[-1]))
        dense = chosen  # one block: the window is it
        if keys.shape[-1] != block_size:
            dense = chosen.new_zeros(*chosen.shape[:-1], keys.shape[-1])
            dense.scatter_add_(-1, _in_window(offsets, block_size, keys.shape[-1]), chosen)
        part = dense @ sketch.gather_rows(v, keys)
        out.scatter_(-2, rows.unsqueeze(-1).expand(part.shape), part)
    return out


def logits_at(q: torch.Tensor, k: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Logits of every query against the keys ``keys`` ``(*batch, s)``: ``(*batch, n, s)``."""
    return scaled_logits(q, sketch.gather_rows(k, keys))


def uniform_positions(uniforms: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    r""":math:`\lfloor u\,R\rfloor` for uniforms ``(*batch, s)`` in ``[0, 1)`` and counts ``(*batch,)``: a
    uniform position among the first :math:`R`, ``(*batch, s)`` int64."""
    counts = counts.unsqueeze(-1)
    positions = (uniforms.to(torch.float64) * counts.to(torch.float64)).floor().long()
    return torch.minimum(positions, counts - 1)


def value_weights(v: torch.Tensor, key_mask: torch.Tensor | None, power: float) -> torch.Tensor:
    r""":math:`\|v_j\|^{\text{power}}` of the rows of ``v`` ``(*batch, m, p_v)``, in float64 and scaled by the
    largest entry of each batch element (so a scale of ``v`` changes nothing): ``(*batch, m)``; 0 on masked keys."""
    v = v.detach().to(torch.float64)
    v = v / v.abs().flatten(-2).amax(-1).clamp_min(torch.finfo(torch.float64).tiny)[..., None, None]
    weights = torch.linalg.vector_norm(v, dim=-1) ** power
    return weights if key_mask is None else weights * key_mask.to(weights.dtype)


def piece_output(piece: Piece, v: torch.Tensor, log_row_sums: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_j \exp(\log\tilde A_{ij} - \log\tilde d_i)\,v_j` on the piece's rows: ``(*batch, n, p_v)``.

    ``v``: the piece's own ``(*batch, m_piece, p_v)`` values; ``log_row_sums``: ``(*batch, n)``.
    """
    out = 0.0
    if piece.block_logits is not None:
        weights = (piece.block_logits - log_row_sums.unsqueeze(-1)).exp_()
        out = _block_output(weights, v, piece.blocks, piece.block_size)
    if piece.columns is not None:
        weights = (piece.log_weights - log_row_sums.unsqueeze(-1)).exp_()
        out = out + weights @ sketch.gather_rows(v, piece.columns)
    return out


def merge(out_a: torch.Tensor, log_a: torch.Tensor, out_b: torch.Tensor, log_b: torch.Tensor):
    r"""Two normalised parts of one row, :math:`o = (\tilde d_a o_a + \tilde d_b o_b)/(\tilde d_a + \tilde d_b)`,
    from :math:`\log\tilde d_a, \log\tilde d_b` (the published code's ``add_self_attentions``, without its
    ``eps`` in the log): returns ``(out, log_row_sums)``."""
    log = torch.logaddexp(log_a, log_b)
    weight_a = torch.exp(log_a - log).nan_to_num(nan=0.0).unsqueeze(-1)  # -inf - -inf: an empty part
    weight_b = torch.exp(log_b - log).nan_to_num(nan=0.0).unsqueeze(-1)
    return weight_a * out_a + weight_b * out_b, log


def _entries(piece: Piece):
    """The piece's ``(columns, log-weights)``, ``(*batch, n, T)`` each, row by row."""
    columns, logs = [], []
    if piece.block_logits is not None:
        columns.append(piece.blocks.keys)
        logs.append(piece.block_logits)
    if piece.columns is not None:
        columns.append(piece.columns.unsqueeze(-2).expand(piece.log_weights.shape))
        logs.append(piece.log_weights)
    return torch.cat(columns, -1), torch.cat(logs, -1)


def operator_from_pieces(pieces, log_row_sums: torch.Tensor, num_columns: int) -> RowSparseOperator:
    """The ``(*batch, n, m)`` matrix :math:`\\tilde D^{-1}\\tilde A` of all pieces, slot by slot."""
    batch, n = log_row_sums.shape[:-1], log_row_sums.shape[-1]
    entries = [(piece, *_entries(piece)) for piece in pieces]
    widths: dict = {}
    for piece, columns, _ in entries:
        widths[piece.slot] = max(widths.get(piece.slot, 0), columns.shape[-1])
    offsets, total = {}, 0
    for slot in sorted(widths):
        offsets[slot], total = total, total + widths[slot]
    all_columns = torch.zeros(*batch, n, total, dtype=torch.long, device=log_row_sums.device)
    all_weights = log_row_sums.new_zeros(*batch, n, total)
    for piece, columns, logs in entries:
        rows = slice(piece.row_start, piece.row_start + columns.shape[-2])
        slots = slice(offsets[piece.slot], offsets[piece.slot] + columns.shape[-1])
        all_columns[..., rows, slots] = columns + piece.column_offset
        all_weights[..., rows, slots] = torch.exp(logs - log_row_sums[..., rows].unsqueeze(-1))
    return RowSparseOperator(all_columns, all_weights, num_columns)


def check_uniform_draw(method: str, draw, layout: dict, device) -> dict:
    """:func:`~approxlab.methods.draws.check_draw`, then every entry but ``hyperplanes`` in ``[0, 1)``."""
    checked = check_draw(method, draw, layout, device=device)
    for key, value in checked.items():
        if key != "hyperplanes" and value.numel() and bool((value < 0).any() | (value >= 1).any()):
            raise ValueError(f"`draw[{key!r}]` of method {method!r} must hold uniforms in [0, 1); got values in "
                             f"[{float(value.min())}, {float(value.max())}].")
    return checked


def uniform_entry(shape, layout: str) -> DrawEntry:
    """A draw entry of real numbers (hyperplanes or uniforms) of the given shape."""
    return DrawEntry(tuple(shape), layout)
