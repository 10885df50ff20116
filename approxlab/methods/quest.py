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
from ._selection import attend_selected, selected_weights, sparse_approximation

__all__ = ["quest", "QUEST", "page_bounds", "pages_kept"]

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
    if cumulative:
        high, low, some = high.cummax(-2).values, low.cummin(-2).values, real.cumsum(-1) > 0
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

    **Cost**: the bounds :math:`O(n\lceil m/S\rceil p)`, the attention :math:`O(nKSp)`, memory
    :math:`O(mp)` for the page extremes plus row blocks; no :math:`n\times m` array.

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
    chosen_pages = []
    offsets = torch.arange(size, device=q.device)

    def selection(start, stop):
        rows = q[..., start:stop, :].expand(*batch, stop - start, p)
        bounds = page_bounds(rows, high, low).masked_fill(~some.unsqueeze(-2), -math.inf)
        if causal:
            own_page = torch.arange(start, stop, device=q.device) // size
            later = torch.arange(num_pages, device=q.device) > own_page.unsqueeze(-1)
            own = (rows.clamp(min=0) * own_high[..., start:stop, :]
                   + rows.clamp(max=0) * own_low[..., start:stop, :]).sum(-1)
            own = own.masked_fill(~own_some[..., start:stop], -math.inf)
            bounds = bounds.masked_fill(later, -math.inf)
            bounds = bounds.scatter(-1, own_page.expand(*batch, stop - start).unsqueeze(-1), own.unsqueeze(-1))
        values, top = bounds.topk(kept, dim=-1)
        chosen_pages.append(torch.where(torch.isfinite(values), top, torch.full_like(top, -1)))
        tokens = (top.unsqueeze(-1) * size + offsets).flatten(-2)
        valid = torch.isfinite(values).repeat_interleave(size, dim=-1) & (tokens < m)
        tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
        valid = valid & torch.gather(real, -1, tokens.flatten(-2)).view_as(valid)
        if causal:
            valid = valid & (tokens <= torch.arange(start, stop, device=q.device).unsqueeze(-1))
        return tokens, valid

    output = attend_selected(q, k, v, selection, width=kept * size)
    info = {"pages": torch.cat(chosen_pages, dim=-2), "pages_per_query": kept}
    record = lambda: selected_weights(q, k, v, selection, width=kept * size)  # noqa: E731
    return sparse_approximation("quest", output, m, record, info)


QUEST = quest
__test__ = {"quest": quest.function}  # doctest skips a MethodSpec: run its function's examples
