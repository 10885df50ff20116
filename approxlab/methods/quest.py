r"""Quest (Tang et al., ICML 2024): query-aware selection of KV-cache pages by an upper bound on the logits.

The keys are cut into pages of ``page_size`` tokens; each page keeps its channel-wise minimum and maximum
key. For a query, each page's upper bound on :math:`q^\top k` is computed from those two vectors alone,
and the query attends exactly to the tokens of its top pages.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_choice, check_int
from ._base import method
from ._masking import check_key_mask
from ._selection import (DENSE_SELECTION, block_rows, gather_rows, safe_softmax, selected_weights,
                         sparse_approximation, weighted_rows)

__all__ = ["quest", "QUEST", "page_bounds", "pages_kept"]

SUB_BLOCK_ELEMENTS = 1 << 20
"""Entries of the gathered keys of one sub-block of :func:`attend_pages` (4 MiB of float32)."""

PARTIAL_SORT = 64
r"""Bounds per row from which ``torch.topk`` on CPU partial-sorts a row for its ``K`` largest (``64 K`` entries; a
narrower row is run through a selection then a sort). Measured on one thread, float32, 510 rows, ``K = 8``: a row of
480 bounds 2.18 ms, the same row padded with :math:`-\infty` to 512 entries 0.95 ms (384: 1.76 against 0.91 ms; 128:
0.66 against 0.74 ms, where the narrow row is faster; ``K = 4``: 0.59 against 0.25 ms at 128). :func:`_top_pages`
pads a row of ``16 K`` to ``64 K`` bounds to ``64 K`` entries."""

BY_PAGE_ROWS = 8
r"""Bidirectional, without gradients: from this many chosen (query, page) pairs per page on average, :func:`attend_pages`
takes the logits and the output page by page (:func:`_attend_by_page`: one product of a page's keys with the queries
that chose it), in place of a row block's gathered pages or dense logits. The whole call on one thread, float64,
12 synthetic heads (``synthetic_qkv``), n = m = 4096, p = 64, pages of 16 tokens, two calls each at a load of 8-10:
16 pages a query (256 pairs a page) 1.34-1.39 CPU s against 2.13-2.60 with the dense logits; 4 pages (64 pairs a
page) 0.40-0.45 against 1.02-1.20 with the gathered pages."""

ROUNDINGS = ("ceil", "floor")
"""``budget_rounding``: pages kept = ceil (whole pages covering the budget) or floor (the authors' code) of
``budget / page_size``."""


def pages_kept(budget: int, page_size: int, num_pages: int, *, rounding: str = "ceil", min_pages: int = 1) -> int:
    """Pages per query for a token budget: ``max(min_pages, ceil or floor(budget / page_size))``, at most every
    page.

    Examples
    --------
    >>> pages_kept(40, 16, 8), pages_kept(40, 16, 8, rounding="floor", min_pages=3)
    (3, 3)
    """
    whole = -(-budget // page_size) if rounding == "ceil" else budget // page_size
    return max(1, min(num_pages, max(min_pages, whole)))


def _extremes(pages: torch.Tensor, real: torch.Tensor, cumulative: bool):
    """Channel-wise max and min of the real keys of each page ``(*batch, P, S, p)`` (``cumulative``: of each
    page's first ``s + 1`` tokens, for every slot ``s``), 0 where there is none, and whether there is one."""
    high = pages.masked_fill(~real.unsqueeze(-1), -math.inf)
    low = pages.masked_fill(~real.unsqueeze(-1), math.inf)
    if cumulative:  # a running maximum (minimum) over the page's slots: S - 1 elementwise steps
        for slot in range(1, pages.shape[-2]):
            high[..., slot, :] = torch.maximum(high[..., slot - 1, :], high[..., slot, :])
            low[..., slot, :] = torch.minimum(low[..., slot - 1, :], low[..., slot, :])
        some = real.cumsum(-1) > 0
    else:
        high, low, some = high.amax(-2), low.amin(-2), real.any(-1)
    zero = ~some.unsqueeze(-1)
    return high.masked_fill(zero, 0.0), low.masked_fill(zero, 0.0), some


def page_bounds(q: torch.Tensor, high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    r"""Quest's upper bound :math:`U = \sum_c \max(q_c M_c, q_c m_c)` of :math:`q^\top k` over a page with
    channel-wise max :math:`M` and min :math:`m` (Section 3.4, Algorithm 1), as
    :math:`q^+ M^\top + q^- m^\top`: ``q`` ``(*batch, r, p)``, ``high``/``low`` ``(*batch, P, p)`` ->
    ``(*batch, r, P)``.

    Examples
    --------
    >>> import torch
    >>> keys = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=torch.float64)  # one page of two keys
    >>> q = torch.tensor([[-1.0, 2.0]], dtype=torch.float64)
    >>> float(page_bounds(q, keys.amax(0, keepdim=True), keys.amin(0, keepdim=True))), float((keys @ q.T).max())
    (0.0, -2.0)
    """
    return q.clamp(min=0) @ high.transpose(-1, -2) + q.clamp(max=0) @ low.transpose(-1, -2)


@method("quest", target="softmax", features="token budget per query (whole pages of page_size tokens)",
        randomized=False, causal=True)
def quest(q, k, v, *, num_features, generator=None, page_size=16, budget_rounding="ceil", min_pages=1,
          key_mask=None, causal=False):
    r"""Quest: each query attends the tokens of its top pages by the page-wise upper bound on its logits.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        The paper's token budget :math:`B` (``1 <= B <= m``): each query keeps
        :math:`K = \lceil B/S\rceil` pages of :math:`S` = ``page_size`` tokens (see ``budget_rounding``).
    generator : torch.Generator, optional
        Unused (deterministic).
    page_size : int, default 16
        :math:`S`, tokens per page (the paper's 16); pages are consecutive, the last one may be short.
    budget_rounding : {"ceil", "floor"}, default "ceil"
        ``"ceil"``: whole pages covering the budget (``num_features = m`` is exact attention); ``"floor"``:
        ``token_budget // chunk_size`` pages, as the authors' evaluation code while its cache holds at
        least ``token_budget`` tokens (Notes).
    min_pages : int, default 1
        At least this many pages per query (the authors' evaluation code: 3).
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys that may be attended: the page minimum and maximum are over
        real keys only, a page of padding is never chosen.
    causal : bool, default False
        Query :math:`i` sees the pages before its own and its own page's tokens ``j <= i``, whose minimum
        and maximum are those of the tokens inserted so far (Algorithm 1 updates them at each insertion).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (formed on request); ``info``: ``pages`` ``(*batch, n, K)`` the pages chosen per query (by
        decreasing bound; a page with no visible key is never chosen) and ``pages_per_query`` :math:`K`.

    Notes
    -----
    Section 3.4 and Algorithm 1 ("Token criticality estimation") of the paper: with :math:`M^{(P)}` and
    :math:`m^{(P)}` the channel-wise max and min of the keys of page :math:`P`,

    .. math::

        U_{iP} = \sum_{c=1}^{p} \max\bigl(q_{ic} M^{(P)}_c,\ q_{ic} m^{(P)}_c\bigr) \;\ge\;
        \max_{j\in P} q_i^\top k_j,

    and query :math:`i` attends (exact softmax) the tokens of the :math:`K` pages of largest
    :math:`U_{iP}` -- the paper's "token budget" is :math:`KS`. The bound is computed as
    :math:`q^+ M^\top + q^- m^\top` (:func:`page_bounds`).

    **Where the published code departs** (mit-han-lab/Quest, ``evaluation/quest_attention.py``, the code
    behind the paper's accuracy results): (1) it keeps ``max(3, min(kv_len, token_budget) // chunk_size)``
    pages (at most all of them) for a cache of ``kv_len`` tokens (``budget_rounding="floor", min_pages=3``
    while ``kv_len >= token_budget``); a cache of fewer than :math:`S\lfloor B/S\rfloor` tokens whose length
    is not a multiple of the page then keeps :math:`\lfloor\text{kv\_len}/S\rfloor` of its :math:`\lceil\text{kv\_len}/S\rceil` pages (once
    that is at least 3), dropping the page of lowest bound, where this method keeps every page (exact
    attention for such a query); (2) it applies Quest to decode steps only, the prompt
    (``q_len > 1``) and the first two layers attending densely; (3) it forms the bound per token
    (``sign(q) * q`` against the page's ``max(sign(q) * k)``, repeated over the page) before taking the
    page maximum -- the same number as :math:`U_{iP}`; its bound is not divided by :math:`\sqrt p`, which
    does not change the ranking. See the docs page for the comparison on shared inputs.

    **Cost**: the page extremes once per page, :math:`O(mp)` (causal: the running extremes of each page's
    prefix, :math:`O(mp)` too); the bounds :math:`O(n\lceil m/S\rceil p)` and each query's top :math:`K`
    pages, per row block (causal: only the pages up to the block's last row are scored and ranked, about
    :math:`n^2p/(2S)` in all; this part is quadratic in :math:`n` by design, as in the authors' kernel, where each
    decode step scores every page of its cache); the attention :math:`O(nKSp)` (:func:`attend_pages`: a page's
    keys are one contiguous row, gathered once per query and page, the output the weighted sum of the pages' value
    rows); memory :math:`O(mp)` plus row blocks; no :math:`n\times m` array.

    References
    ----------
    Tang, Zhao, Zhu, Xiao, Kasikci and Han, "Quest: Query-aware sparsity for efficient long-context LLM
    inference", ICML 2024 (arXiv:2406.10774).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 40, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("quest", q, k, v, num_features=40, page_size=16)  # all 3 pages
    >>> float((approx.output - approxlab.exact_attention(q, k, v)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("quest", q, k, v, num_features=16, page_size=8, causal=True)
    >>> approx.info["pages_per_query"], approx.info["pages"].shape
    (2, torch.Size([2, 40, 2]))
    """
    key_mask = check_key_mask(key_mask, k)
    size = check_int(page_size, "page_size", low=1)
    check_choice(budget_rounding, "budget_rounding", ROUNDINGS)
    min_pages = check_int(min_pages, "min_pages", low=1)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, m, p = q.shape[-2], k.shape[-2], q.shape[-1]
    num_pages = -(-m // size)
    kept = pages_kept(num_features, size, num_pages, rounding=budget_rounding, min_pages=min_pages)
    real = torch.ones(*batch, m, dtype=torch.bool, device=q.device) if key_mask is None else key_mask.expand(
        *batch, m)
    padded_real = torch.nn.functional.pad(real, (0, num_pages * size - m)).reshape(*batch, num_pages, size)
    pages = torch.nn.functional.pad(k.expand(*batch, m, p), (0, 0, 0, num_pages * size - m)).reshape(
        *batch, num_pages, size, p)
    high, low, some = _extremes(pages, padded_real, cumulative=False)
    if causal:  # each position's own page, its extremes over the page's tokens up to that position
        own_high, own_low, own_some = _extremes(pages, padded_real, cumulative=True)
        own_high, own_low = own_high.flatten(-3, -2)[..., :n, :], own_low.flatten(-3, -2)[..., :n, :]
        own_some = own_some.flatten(-2)[..., :n]
    every_page_real = bool(some.all())

    padding = {}  # _top_pages' padded rows, reused by every block

    def chosen(start, stop):  # the bounds of the top pages of rows start:stop, and those pages
        # causal: the pages up to the block's last row only (at least K, the later ones masked)
        visible = min(num_pages, max(kept, (stop - 1) // size + 1)) if causal else num_pages
        with torch.no_grad():  # the selection carries no gradient (the output's weights are recomputed)
            rows = q[..., start:stop, :].expand(*batch, stop - start, p)
            bounds = page_bounds(rows, high[..., :visible, :], low[..., :visible, :])
            if not every_page_real:
                bounds.masked_fill_(~some[..., :visible].unsqueeze(-2), -math.inf)
            if causal:
                own_page = torch.arange(start, stop, device=q.device) // size
                first = start // size  # pages left of it are before every row of the block
                later = torch.arange(first, visible, device=q.device) > own_page.unsqueeze(-1)
                own = (rows.clamp(min=0) * own_high[..., start:stop, :]
                       + rows.clamp(max=0) * own_low[..., start:stop, :]).sum(-1)
                own = own.masked_fill(~own_some[..., start:stop], -math.inf)
                bounds[..., first:].masked_fill_(later, -math.inf)
                bounds.scatter_(-1, own_page.expand(*batch, stop - start).unsqueeze(-1), own.unsqueeze(-1))
            return _top_pages(bounds, kept, padding)

    def selection(start, stop):  # the tokens of those pages (the operator's rows; 0 on an unused slot)
        values, top = chosen(start, stop)
        tokens, valid = page_tokens(top, torch.isfinite(values), padded_real.flatten(-2), size, start, causal)
        return torch.where(valid, tokens, torch.zeros_like(tokens)), valid

    output, pages = attend_pages(q, k, v, chosen, page_size=size, real=padded_real.flatten(-2), causal=causal,
                                 block=block_rows(batch, kept * size * max(p, v.shape[-1])))
    info = {"pages": pages, "pages_per_query": kept}
    record = lambda: selected_weights(q, k, v, selection, width=kept * size)  # noqa: E731
    return sparse_approximation("quest", output, m, record, info)


def _top_pages(bounds: torch.Tensor, kept: int, padding: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``bounds.topk(kept, dim=-1)`` for ``bounds`` ``(*batch, rows, w)``: the same pages and bounds where they are
    finite (an index past ``w`` is never returned); a row of ``16 kept <= w < PARTIAL_SORT * kept`` bounds is padded
    with :math:`-\infty` to ``PARTIAL_SORT * kept`` first, the width from which torch partial-sorts it
    (:data:`PARTIAL_SORT`). ``padding``: a dict that keeps the padded rows for the next call of the same shape (only
    the bounds are copied in; the padding stays :math:`-\infty`).

    Examples
    --------
    >>> import torch
    >>> bounds = torch.arange(40.0).flip(-1).view(1, 40)
    >>> [x.tolist() for x in _top_pages(bounds, 2)]
    [[[39.0, 38.0]], [[0, 1]]]
    """
    width = bounds.shape[-1]
    if not 16 * kept <= width < PARTIAL_SORT * kept:
        return bounds.topk(kept, dim=-1)
    key = (bounds.shape, bounds.dtype, bounds.device, kept)
    padded = (padding or {}).get(key)
    if padded is None:
        padded = torch.nn.functional.pad(bounds, (0, PARTIAL_SORT * kept - width), value=-math.inf)
        if padding is not None:
            padding.clear()
            padding[key] = padded
    else:
        padded[..., :width].copy_(bounds)
    values, pages = padded.topk(kept, -1)
    return values, pages.clamp_(max=width - 1)  # a padded slot (a row of fewer finite bounds than kept): no page


def attend_pages(q, k, v, chosen, *, page_size: int, real: torch.Tensor, causal: bool, block: int):
    r"""Each query's exact softmax over the tokens of its chosen pages, page by page.

    ``chosen(start, stop) -> (bounds, pages)`` gives the ``(*batch, stop - start, K)`` pages of rows
    ``start:stop`` (a non-finite bound: no page); ``real`` ``(*batch, P * S)`` says which slots of the padded
    pages hold a key that may be attended. Rows are taken ``block`` at a time from ``chosen`` (the blocks of
    the operator's :func:`~._selection.selected_weights`, so the pages are the same), and attended in sub-blocks
    that stay in cache: the keys of a page are one contiguous ``S * p`` row of the padded keys (one lookup a page,
    not one a token), the logits their product with the query, the output the weighted sum of the value rows
    (:func:`~._selection.weighted_rows`). From ``K * S >= m / DENSE_SELECTION`` tokens per query (the rule of
    :func:`~._selection.attend_selected`'s logits), a block's logits are read from its dense product with all
    ``m`` keys instead (one GEMM streams the keys once, where the gather copies ``K * S`` of them per query: on
    one thread, float64, 12 heads, n = m = 4096, p = 64, 16 pages of 16 tokens, 1.6 s against 3.0 s; at 4 pages
    0.8 s either way; ``causal``: the product with the keys of the pages up to the span's last row only, those its
    rows choose from). Bidirectional and without gradients, from :data:`BY_PAGE_ROWS` chosen pairs a page, every
    row's pages are chosen first and the output is taken page by page instead (:func:`_attend_by_page`). The same
    numbers as :func:`~._selection.attend_selected` over the pages' tokens, to rounding.
    Returns the output ``(*batch, n, p_v)`` and the pages ``(*batch, n, K)`` (-1 for no page).
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, m, p, size = q.shape[-2], k.shape[-2], q.shape[-1], page_size
    num_pages = -(-m // size)
    if not causal and not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        every_bound, every_top = (torch.cat(parts, dim=-2) for parts in zip(*(chosen(a, min(a + block, n))
                                                                              for a in range(0, n, block))))
        some = torch.isfinite(every_bound)
        if n * every_top.shape[-1] >= BY_PAGE_ROWS * num_pages:
            return (_attend_by_page(q, k, v, every_top, some, real, size),
                    torch.where(some, every_top, torch.full_like(every_top, -1)))
        chosen = lambda start, stop: (every_bound[..., start:stop, :], every_top[..., start:stop, :])  # noqa: E731
    padded = torch.nn.functional.pad(k.expand(*batch, m, p), (0, 0, 0, num_pages * size - m))
    page_keys = gather_rows(padded.reshape(*batch, num_pages, size * p), batch)
    values_of = weighted_rows(v, batch)
    outputs, all_pages, dense = [], [], (0, 0, None)  # dense: rows first:last of the dense logits
    span = block * max(1, block_rows(batch, num_pages * size) // block)  # rows per GEMM of the dense logits
    for start in range(0, n, block):
        stop = min(start + block, n)
        bounds, top = chosen(start, stop)
        some = torch.isfinite(bounds)
        all_pages.append(torch.where(some, top, torch.full_like(top, -1)))
        width = top.shape[-1] * size
        if DENSE_SELECTION * width >= m:  # many tokens per query: the pages' logits of the block's dense ones
            if stop > dense[1]:
                last = min(start + span, n)
                # causal: the span's rows choose among its visible pages (at least K: those of `chosen`)
                columns = min(num_pages, max(top.shape[-1], -(-last // size))) if causal else num_pages
                every = (q[..., start:last, :] @ padded[..., :columns * size, :].transpose(-1, -2)).div_(math.sqrt(p))
                dense = (start, last, every.expand(*batch, last - start, columns * size).view(
                    *batch, last - start, columns, size))
            every = dense[2][..., start - dense[0]:stop - dense[0], :, :]
            logits = torch.gather(every, -2, top.unsqueeze(-1).expand(*top.shape, size)).flatten(-2)
            tokens, valid = page_tokens(top, some, real, size, start, causal)
            weights = safe_softmax(logits.masked_fill(~valid, -math.inf))
            outputs.append(values_of(weights, tokens.clamp(max=m - 1)))
            continue
        sub = max(1, SUB_BLOCK_ELEMENTS // max(1, int(torch.Size(batch).numel()) * width * max(p, v.shape[-1])))
        for a in range(start, stop, sub):
            b = min(a + sub, stop)
            pages, rows = top[..., a - start:b - start, :], q[..., a:b, :].expand(*batch, b - a, p)
            keys = page_keys(pages).view(*batch, b - a, width, p)
            logits = (keys * rows.unsqueeze(-2)).sum(-1) / math.sqrt(p)
            tokens, valid = page_tokens(pages, some[..., a - start:b - start, :], real, size, a, causal)
            weights = safe_softmax(logits.masked_fill(~valid, -math.inf))
            outputs.append(values_of(weights, tokens.clamp(max=m - 1)))
    return torch.cat(outputs, dim=-2), torch.cat(all_pages, dim=-2)


def _attend_by_page(q, k, v, top, some, real, size: int) -> torch.Tensor:
    r""":func:`attend_pages`' output, bidirectional, page by page: ``(*batch, n, p_v)``.

    For each batch element the (query, page) pairs of ``top`` ``(*batch, n, K)`` are sorted by page (stably); a
    page's logits are one product of its ``size`` keys with the queries that chose it, gathered once for all pages,
    and, after each query's softmax over its ``K * size`` tokens (``some`` and ``real`` as in :func:`page_tokens`),
    its part of the output is one product of those weights with its value rows, added to the queries' rows. The
    logits are :func:`attend_pages`' to rounding, the output's sums taken page by page instead of token by token
    (the same numbers to rounding). :math:`O(nKSp)` work in ``2 P`` products a batch element, no gathered copy of
    the keys per query (:data:`BY_PAGE_ROWS`).
    """
    batch = top.shape[:-2]
    n, kept, m, p, p_v = top.shape[-2], top.shape[-1], k.shape[-2], q.shape[-1], v.shape[-1]
    groups, num_pages = int(torch.Size(batch).numel()), -(-m // size)
    pad = (0, 0, 0, num_pages * size - m)
    keys = torch.nn.functional.pad(k.expand(*batch, m, p), pad).reshape(groups, num_pages, size, p)
    values = torch.nn.functional.pad(v.expand(*batch, m, p_v), pad).reshape(groups, num_pages, size, p_v)
    queries = q.expand(*batch, n, p).reshape(groups, n, p)
    _, valid = page_tokens(top, some, real, size, 0, False)
    valid, pages = valid.reshape(groups, n, kept * size), top.reshape(groups, n * kept)
    out = v.new_zeros(groups, n, p_v)
    for g in range(groups):
        order = torch.argsort(pages[g], stable=True)
        spans = torch.bincount(pages[g], minlength=num_pages).cumsum(0).tolist()
        rows = order // kept  # the query of each sorted pair
        chosen, logits = queries[g].index_select(0, rows), q.new_empty(n * kept, size)
        for page, (start, stop) in enumerate(zip([0] + spans[:-1], spans)):
            if stop > start:
                torch.matmul(chosen[start:stop], keys[g, page].transpose(-1, -2), out=logits[start:stop])
        logits = torch.empty_like(logits).index_copy_(0, order, logits).div_(math.sqrt(p)).view(n, kept * size)
        weights = safe_softmax(logits.masked_fill_(~valid[g], -math.inf)).view(n * kept, size).index_select(0, order)
        parts = v.new_empty(n * kept, p_v)
        for page, (start, stop) in enumerate(zip([0] + spans[:-1], spans)):
            if stop > start:
                torch.matmul(weights[start:stop], values[g, page], out=parts[start:stop])
        out[g].index_add_(0, rows, parts)
    return out.view(*batch, n, p_v)


def page_tokens(pages: torch.Tensor, some: torch.Tensor, real: torch.Tensor, size: int, first_row: int,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of ``pages`` ``(*batch, rows, K)`` of ``size`` tokens, ``(*batch, rows, K * size)``, and which of
    them a row attends: its page is one (``some``, ``(*batch, rows, K)``), the slot holds a key that may be attended
    (``real`` ``(*batch, P * size)``, over the padded pages) and, ``causal``, the token is not after the row (rows
    ``first_row, first_row + 1, ...``)."""
    tokens = (pages.unsqueeze(-1) * size + torch.arange(size, device=pages.device)).flatten(-2)
    valid = some.repeat_interleave(size, dim=-1) & torch.gather(real, -1, tokens.flatten(-2)).view_as(tokens)
    if causal:
        rows = torch.arange(first_row, first_row + pages.shape[-2], device=pages.device)
        valid = valid & (tokens <= rows.unsqueeze(-1))
    return tokens, valid
QUEST = quest
__test__ = {"quest": quest.function}  # doctest skips a MethodSpec: run its function's examples
