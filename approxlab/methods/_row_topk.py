r"""The ``k`` largest entries of each row, as ``torch.topk`` returns them, by a threshold from group maxima.

``torch.topk(x, k, dim=-1)`` on CPU copies each row of width :math:`w` into (value, index) pairs and partially
sorts them: the cost of the selection oracles (top-k, top-p), several times that of the logits' GEMM. Here a row is
cut into :math:`g` interleaved groups of :math:`c` columns (column :math:`j < gc` in group :math:`j \bmod g`), and

1. the group maxima :math:`G` come from :math:`c-1` elementwise maxima of contiguous slices (one pass over the row);
2. the threshold :math:`t` is the :math:`(k+1)`-th largest group maximum, and its :math:`k+1` groups (``torch.topk``
   over :math:`g` entries): the :math:`k+1` group maxima are distinct entries at least :math:`t`, so the row's
   :math:`k+1` largest entries are at least :math:`t`, and every entry at least :math:`t` lies in a group whose
   maximum is at least :math:`t` -- one of the :math:`k+1` groups, or a group whose maximum ties with :math:`t`;
3. the entries of those groups (and the :math:`w - gc < c` columns past the groups) that reach :math:`t` are
   compacted into a few columns per row (expected about :math:`k + k/c` on exchangeable entries), whose
   ``torch.topk`` gives :math:`k+1` values :math:`u_0 \ge \dots \ge u_k \ge t`.

A row whose :math:`u_0 > u_1 > \dots > u_k` are finite has one answer: every entry outside the candidates is at most
:math:`t \le u_k < u_{k-1}`, so the :math:`k` largest entries and their order are those found, as ``torch.topk``
gives them. Any other row (tied values, fewer than :math:`k` finite entries, NaN, :math:`\pm\infty`) is handed to
``torch.topk`` itself, so ties are broken exactly as the reference breaks them. The result equals ``x.topk(k,
dim=-1)`` bit for bit, values and indices (``tests/test_selection_fast_paths.py``).

**Cost**: one pass over the row for :math:`G`, one ``torch.topk`` over the :math:`g = w/c` group maxima, elementwise
work on the :math:`(k+1)c` entries of the chosen groups and one ``torch.topk`` over those that reach :math:`t`, in
place of one ``torch.topk`` over :math:`w` (:data:`GROUP_COLUMNS` for the measured times).
"""

from __future__ import annotations

import torch

__all__ = ["GROUP_COLUMNS", "row_topk"]

GROUP_COLUMNS = 8
""":math:`c`, the columns per group from ``w >= 4 * GROUP_COLUMNS * (k + 1)``; half as many from ``w >= 12 * (k + 1)``;
narrower rows go to ``torch.topk`` whole (the groups would not pay for themselves). Measured on one thread, float32,
510 rows, ``k = 128``: ``torch.topk`` 11.4, 19.5, 25.5 ms at ``w`` = 2048, 4096, 8192, here 9.3 (c = 4), 11.5 and
15.1 ms (c = 8)."""


def row_topk(x: torch.Tensor, k: int, *, sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` (largest, sorted) for ``x`` ``(*batch, rows, w)``: ``(values, indices)`` ``(*batch,
    rows, k)``, the same tensors bit for bit (see the module docstring).

    ``sorted=False``: the same ``k`` entries of each row, values and indices, in an unspecified order (a caller
    that needs the set, not its order): the candidates' ``k + 1`` largest are selected without sorting them, and a
    row is answered here when its ``k``-th and ``(k+1)``-th largest differ (ties inside the ``k`` leave the set
    unique), else by ``torch.topk``.

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
    c = GROUP_COLUMNS if w >= 4 * GROUP_COLUMNS * (k + 1) else GROUP_COLUMNS // 2
    if w < 12 * (k + 1) or c < 2 or x.numel() == 0:
        return x.topk(k, dim=-1, sorted=sorted)
    groups = w // c
    maxima = torch.maximum(x[..., :groups], x[..., groups:2 * groups])
    for r in range(2, c):
        torch.maximum(maxima, x[..., r * groups:(r + 1) * groups], out=maxima)
    bounds, chosen = maxima.topk(k + 1, dim=-1, sorted=False)
    # the chosen groups' entries, (*batch, rows, c, k + 1): entry (r, s) is column chosen[s] + r * groups
    slices = x[..., :groups * c].unflatten(-1, (c, groups))
    candidates = torch.gather(slices, -1, chosen.unsqueeze(-2).expand(*chosen.shape[:-1], c, k + 1)).flatten(-2)
    if w > groups * c:  # the columns past the last whole group are candidates too (at the end)
        candidates = torch.cat([candidates, x[..., groups * c:]], dim=-1)
    top, where = _packed_topk(candidates, bounds.amin(-1, keepdim=True), k + 1, sorted=sorted)
    if sorted:
        clean = torch.isfinite(top).all(-1) & (top[..., 1:] < top[..., :-1]).all(-1)
        top, where = top[..., :k], where[..., :k]
    else:  # drop each row's smallest of the k + 1; clean where it is below all k others
        low, lowest = top.min(-1, keepdim=True)
        clean = torch.isfinite(top).all(-1) & ((top > low).sum(-1) == k)
        slots = torch.arange(k, device=x.device)
        slots = slots + (slots >= lowest)  # every position of the k + 1 but the smallest's
        top, where = top.gather(-1, slots), where.gather(-1, slots)
    inside = where < c * (k + 1)
    slot = torch.where(inside, where, torch.zeros_like(where))
    indices = torch.where(inside, torch.gather(chosen, -1, slot % (k + 1)) + groups * (slot // (k + 1)),
                          where - c * (k + 1) + groups * c)
    values = top
    if not bool(clean.all()):  # ties, too few finite entries, NaN: the reference on those rows
        rows = (~clean).nonzero(as_tuple=True)
        reference = x[rows].topk(k, dim=-1)
        values, indices = values.clone(), indices.clone()
        values[rows], indices[rows] = reference.values, reference.indices
    return values, indices


def _packed_topk(candidates: torch.Tensor, threshold: torch.Tensor, k: int,
                 sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``candidates.topk(k, dim=-1, sorted=sorted)`` for rows with at least ``k`` entries at least ``threshold``
    ``(..., 1)``: those entries are packed to the left of a narrower block (-inf after them) before ``torch.topk``;
    the positions returned are the candidates' own. A row with fewer gets -inf values (then not clean)."""
    reach = candidates >= threshold
    slot = reach.cumsum(-1)
    width = max(k, int(slot[..., -1].amax()))  # the most entries of a row that reach the threshold
    slot.mul_(reach)  # 1, 2, ... on the entries that reach the threshold; 0 (a spare) elsewhere
    shape = (*candidates.shape[:-1], width + 1)
    packed = torch.full(shape, float("-inf"), dtype=candidates.dtype, device=candidates.device)
    packed.scatter_(-1, slot, candidates)
    positions = torch.zeros(shape, dtype=torch.long, device=candidates.device)
    positions.scatter_(-1, slot, torch.arange(candidates.shape[-1], device=candidates.device).expand_as(slot))
    top, where = packed[..., 1:].topk(k, dim=-1, sorted=sorted)
    return top, torch.gather(positions[..., 1:], -1, where)
