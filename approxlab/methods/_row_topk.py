r"""The ``k`` largest entries of each row, as ``torch.topk`` returns them, by a threshold from group maxima.

``torch.topk(x, k, dim=-1)`` on CPU copies each row of width :math:`w` into (value, index) pairs and partially
sorts them: the cost of the selection oracles (top-k, top-p), several times that of the logits' GEMM. Here a row is
cut into :math:`g` interleaved groups of :math:`c` columns (column :math:`j < gc` in group :math:`j \bmod g`), and

1. the group maxima :math:`G` come from one ``amax`` over the row seen as :math:`c \times g` (one pass over the row);
2. the threshold :math:`t` is the :math:`(k+1)`-th largest group maximum, and its :math:`k+1` groups (``torch.topk``
   over :math:`g` entries): the :math:`k+1` group maxima are distinct entries at least :math:`t`, so the row's
   :math:`k+1` largest entries are at least :math:`t`, and every entry at least :math:`t` lies in a group whose
   maximum is at least :math:`t` -- one of the :math:`k+1` groups, or a group whose maximum ties with :math:`t`;
3. the entries of those groups (and the :math:`w - gc < c` columns past the groups) that reach :math:`t` are listed,
   every row's in one flat list (expected about :math:`k + k/c` a row on exchangeable entries), and sorted once by
   (row, decreasing value) as integers (:func:`_row_order`: torch sorts 1-D integers by radix); the first
   :math:`k+1` of a row's run are its values :math:`u_0 \ge \dots \ge u_k \ge t`.

A row whose :math:`u_0 > u_1 > \dots > u_k` are finite has one answer: every entry outside the candidates is at most
:math:`t \le u_k < u_{k-1}`, so the :math:`k` largest entries and their order are those found, as ``torch.topk``
gives them (for 8-byte values, whose sort keys are truncated, :math:`u_{k-1}` and :math:`u_k` must also differ
in their keys: :func:`_largest`). Any other row (tied values, fewer than :math:`k` finite entries, NaN,
:math:`\pm\infty`) is handed to ``torch.topk`` itself, so ties are broken exactly as the reference breaks them.
The result equals ``x.topk(k, dim=-1)`` bit for bit, values and indices (``tests/test_selection_fast_paths.py``).

**Cost**: one pass over the row for :math:`G`, one ``torch.topk`` over the :math:`g = w/c` group maxima, elementwise
work on the :math:`(k+1)c` entries of the chosen groups and one integer sort of those that reach :math:`t` (all
rows at once), in place of one ``torch.topk`` over :math:`w` (:data:`GROUP_COLUMNS` for the measured times).
The group maxima by one ``amax`` (``c - 1`` elementwise maxima before), one sort of 8-byte keys (two stable sorts
before) and 1-D ``index_select`` on flat positions (2-D advanced indexing before): on one thread, 8 row blocks
``(12, 85, 4096)`` of the Figure-1 window's float64 logits, ``k = 256``, the least of 5 passes 36.5 ms a block
against 51.3 ms before and 46.0 ms for ``torch.topk`` (one process, in turn); float32 ``(3, 170, w)``, ``k = 128``:
8.3 / 9.6 / 12.3 ms at w = 2048 / 4096 / 8192 against 8.7 / 9.9 / 13.7 before.
"""

from __future__ import annotations

import torch

__all__ = ["GROUP_COLUMNS", "row_topk"]

GROUP_COLUMNS = 16
""":math:`c`, the columns per group at most: the largest of 16, 8, 4 that leaves at least :math:`9(k+1)/4` groups
(``4 * w >= 9 * c * (k + 1)``); narrower rows (fewer than :math:`9(k+1)` columns) go to ``torch.topk`` whole (the
groups would not pay for themselves). Wider groups make the ``torch.topk`` over the group maxima shorter and the
candidates more (:math:`(k+1)c`); on one thread, float32, 510 rows, ``k = 128``, this balance was measured best
(``benchmarks/results/selection_oracles.md`` for the times against ``torch.topk``)."""


def row_topk(x: torch.Tensor, k: int, *, sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` (largest, sorted) for ``x`` ``(*batch, rows, w)``: ``(values, indices)`` ``(*batch,
    rows, k)``, the same tensors bit for bit (see the module docstring).

    ``sorted=False``: the same ``k`` entries of each row, values and indices, in an unspecified order (a caller
    that needs the set, not its order): a row is answered here when its ``k``-th and ``(k+1)``-th largest differ
    (in float64, also in their sort keys; ties inside the ``k`` leave the set unique; they come in decreasing
    order, equal values and float64 values equal in their sort keys in any), else by ``torch.topk``.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(2, 3, 4096, generator=torch.Generator().manual_seed(0))
    >>> values, indices = row_topk(x, 16)
    >>> reference = x.topk(16, dim=-1)
    >>> torch.equal(values, reference.values) and torch.equal(indices, reference.indices)
    True
    """
    if x.requires_grad and torch.is_grad_enabled():  # select without a graph; the values gathered with one
        with torch.no_grad():
            indices = row_topk(x.detach(), k, sorted=sorted)[1]
        return torch.gather(x, -1, indices), indices
    w = x.shape[-1]
    c = GROUP_COLUMNS
    while c >= 4 and 4 * w < 9 * c * (k + 1):
        c //= 2
    if c < 4 or x.numel() == 0:
        return x.topk(k, dim=-1, sorted=sorted)
    rows = x.shape[:-1].numel()
    row, values, columns, unsafe = _candidates(x, k + 1, c)
    if row.numel() == 0:  # nothing reaches a threshold (NaN in every row): the reference
        return x.topk(k, dim=-1, sorted=sorted)
    values, indices, clean = _largest(row, values, columns, rows, k + 1, sorted=sorted)
    clean &= ~unsafe
    values, indices, clean = values.view(*x.shape[:-1], k), indices.view(*x.shape[:-1], k), clean.view(x.shape[:-1])
    if not bool(clean.all()):  # ties, too few finite entries, NaN: the reference on those rows
        rows = (~clean).nonzero(as_tuple=True)
        reference = x[rows].topk(k, dim=-1)
        values[rows], indices[rows] = reference.values, reference.indices
    return values, indices


def _candidates(x: torch.Tensor, count: int, c: int) -> tuple[torch.Tensor, ...]:
    """Steps 1-3 of the module docstring for ``x`` ``(*batch, rows, w)``: ``(row, values, columns, unsafe)``, the
    entries that reach their row's threshold, one each (``row`` in ``[0, rows)`` over the flattened batch, in
    ``[0, w)`` its column), and ``unsafe`` ``(rows,)``, True where a NaN lies past the last whole group (it reaches
    no threshold, while ``torch.topk`` ranks it first)."""
    w = x.shape[-1]
    groups = w // c
    slices = x[..., :groups * c].unflatten(-1, (c, groups))
    maxima = slices.amax(-2)
    bounds, chosen = maxima.topk(count, dim=-1, sorted=False)
    # the chosen groups' entries, (*batch, rows, c, count): entry (r, s) is column chosen[s] + r * groups
    candidates = torch.gather(slices, -1, chosen.unsqueeze(-2).expand(*chosen.shape[:-1], c, count))
    rows = chosen.shape[:-1].numel()
    candidates, chosen = candidates.reshape(rows, c * count), chosen.reshape(rows, count)
    threshold = bounds.amin(-1).reshape(rows, 1)  # NaN where a group holds one: then nothing reaches it
    listed = (candidates >= threshold).view(-1).nonzero().squeeze(-1)  # flat positions: 1-D indexing is the fast one
    row = torch.div(listed, c * count, rounding_mode="floor")
    where = listed - row * (c * count)
    values = candidates.view(-1).index_select(0, listed)
    shift = torch.div(where, count, rounding_mode="floor")  # r of entry (r, s)
    columns = chosen.view(-1).index_select(0, listed - shift * count - row * ((c - 1) * count)) + shift * groups
    if w == groups * c:
        return row, values, columns, torch.zeros(rows, dtype=torch.bool, device=x.device)
    tail = x[..., groups * c:].reshape(rows, w - groups * c)  # the columns past the last whole group
    tail_row, tail_column = (tail >= threshold).nonzero(as_tuple=True)
    return (torch.cat([row, tail_row]), torch.cat([values, tail[tail_row, tail_column]]),
            torch.cat([columns, tail_column + groups * c]), tail.isnan().any(-1))


def _largest(row: torch.Tensor, values: torch.Tensor, columns: torch.Tensor, rows: int, count: int, *,
             sorted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``count`` largest of the listed entries (``row``, ``values``, ``columns``, one entry each, rows in
    ``[0, rows)``), by decreasing value: ``(values, columns)`` ``(rows, count - 1)`` of the first ``count - 1`` and
    ``clean`` ``(rows,)``, True where they are the row's answer (see the module docstring): the row lists at least
    ``count`` entries, all ``count`` are finite, the last two differ in their sort keys and in value, and (``sorted``)
    all ``count`` decrease strictly.

    One sort of every listed entry by (row, decreasing value) (:func:`_row_order`); a row's entries are then a run
    of the sorted list, and its ``count`` largest the first ``count`` of its run. The keys of 8-byte values are
    truncated (:func:`_row_order`): two that differ only in their last bits may come in either order, so the last
    two must differ in their keys for the first ``count - 1`` to be the row's largest (then every entry sorted after
    them is smaller than each), and their order is checked on the values."""
    key = _row_order(row, values, rows)
    order = key.argsort()
    listed = torch.bincount(row, minlength=rows)
    first = listed.cumsum(0) - listed
    take = (first.unsqueeze(1) + torch.arange(count, device=row.device)).clamp_(max=row.numel() - 1).view(-1)
    picked = order.index_select(0, take)
    top, where, keys = (t.index_select(0, picked).view(rows, count) for t in (values, columns, key))
    clean = (listed >= count) & torch.isfinite(top).all(-1) & (keys[:, -1] > keys[:, -2]) & (top[:, -2] > top[:, -1])
    if sorted:
        clean &= (top[:, 1:] < top[:, :-1]).all(-1)
    return top[:, :-1], where[:, :-1], clean


def _row_order(row: torch.Tensor, values: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 sort keys of the entries, ordered by ``row`` (in ``[0, rows)``), then by decreasing value: one
    ``argsort`` of them sorts the list (torch sorts 1-D integers by radix, several times faster than floats or than
    a sort of each row).

    The row in the high bits, below it the value's key (:func:`_descending_key`): for values of at most 4 bytes,
    ``row * 2**32 + key``, exact; for 8-byte values the key shifted right by ``b + 1`` bits (``b`` the bits of
    ``rows - 1``) and offset into ``[0, 2**(63 - b))``, under ``row * 2**(63 - b)``: it orders the values, with
    ties only between values equal in all but their last ``b + 1`` bits (relative ``2**(b - 51)`` at most), which
    :func:`_largest`'s clean test sees. One sort of int64 keys instead of the two stable sorts (by value, then by
    row) of an exact 8-byte key."""
    key = _descending_key(values)
    if values.element_size() <= 4:
        return (row << 32) + key
    bits = max(1, int(rows - 1).bit_length())
    return (row << (63 - bits)) + (key >> (bits + 1)) + (1 << (62 - bits))


def _descending_key(values: torch.Tensor) -> torch.Tensor:
    """int64 keys that decrease as ``values`` (floats) increase: the bits as a signed integer, those of negative
    values with all but the sign flipped (then ordered like the values), subtracted from the largest such integer;
    in ``[0, 2**(8 * size))`` for values of ``size <= 4`` bytes (for 8 bytes, their complement, of either sign).
    -0.0 and 0.0 get two keys (the clean test sees the tie)."""
    size = values.element_size()
    bits = values.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size]).long()
    largest = (1 << (8 * size - 1)) - 1
    ordered = torch.where(bits >= 0, bits, bits ^ largest)
    return ~ordered if size == 8 else largest - ordered
