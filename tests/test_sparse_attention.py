"""The per-query selection methods (topk, topp, quest) against their definitions, built here by hand in
float64: a key mask per row, then the dense softmax over the kept keys. Also the error bound of the top-k
oracle (a theorem test, with its mutation row in tests/mutation_check.py) and Quest's upper bound."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen
from approxlab.methods.quest import page_bounds


def _qkv(n=24, m=None, p=6, p_v=5, batch=(2, 3), seed=0, scale=1.0):
    g = gen(seed)
    m = n if m is None else m
    q = scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*batch, m, p, generator=g, dtype=torch.float64)
    return q, k, torch.randn(*batch, m, p_v, generator=g, dtype=torch.float64)


def _logits(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _masked_softmax(logits, keep):
    """Dense softmax over the kept entries of each row (rows keep at least one)."""
    return torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)


def _visible(n, m, causal):
    return torch.ones(n, m, dtype=torch.bool).tril() if causal else torch.ones(n, m, dtype=torch.bool)


def _small_blocks(monkeypatch, elements):
    """Row blocks of ``elements`` logits (a few rows each), so a causal oracle forms the keys of each block only."""
    if elements:
        monkeypatch.setattr("approxlab.methods._selection.BLOCK_ELEMENTS", elements)


@pytest.mark.parametrize("elements", [0, 300])
@pytest.mark.parametrize("causal", [False, True])
def test_topk_is_the_softmax_over_each_rows_k_largest_logits(monkeypatch, causal, elements):
    _small_blocks(monkeypatch, elements)
    q, k, v = _qkv(seed=1)
    logits = _logits(q, k)
    visible = _visible(24, 24, causal)
    shown = logits.masked_fill(~visible, -math.inf)
    larger = (shown.unsqueeze(-1) < shown.unsqueeze(-2)).sum(-1)  # keys with a larger logit, per entry
    for budget in (1, 5, 24):
        keep = visible & (larger < budget)
        expected = _masked_softmax(logits, keep)
        result = approxlab.approximate("topk", q, k, v, num_features=budget, causal=causal)
        torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)
        dropped = (torch.softmax(shown, -1) * ~keep).sum(-1)
        torch.testing.assert_close(result.info["dropped_mass"], dropped, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("elements", [0, 100])
@pytest.mark.parametrize("causal", [False, True])
def test_topp_keeps_the_smallest_nucleus_of_mass_p_under_the_cap(monkeypatch, causal, elements):
    _small_blocks(monkeypatch, elements)
    q, k, v = _qkv(n=16, batch=(2,), seed=2, scale=1.5)
    logits = _logits(q, k)
    visible = _visible(16, 16, causal)
    weights = torch.softmax(logits.masked_fill(~visible, -math.inf), -1)
    for p, cap in ((0.5, 16), (0.9, 16), (0.9, 3), (1.0, 16)):
        keep = torch.zeros(2, 16, 16, dtype=torch.bool)
        for b in range(2):
            for i in range(16):
                order = sorted(range(16), key=lambda j: -float(weights[b, i, j]))
                mass = 0.0
                for j in order[:cap]:
                    if not visible[i, j] or mass >= p:
                        break
                    keep[b, i, j] = True
                    mass += float(weights[b, i, j])
        result = approxlab.approximate("topp", q, k, v, num_features=cap, p=p, causal=causal)
        torch.testing.assert_close(result.matrix(), _masked_softmax(logits, keep), rtol=1e-12, atol=1e-14)
        assert torch.equal(result.info["kept"], keep.sum(-1))


def _quest_pages(q, k, size, pages, causal):
    """Quest's selection by hand: per query, the bound of every visible page from its channel-wise extremes
    over the page's visible keys, the ``pages`` best kept; returns the keep mask ``(*batch, n, m)``."""
    n, m = q.shape[-2], k.shape[-2]
    keep = torch.zeros(*q.shape[:-2], n, m, dtype=torch.bool)
    for index in torch.cartesian_prod(*[torch.arange(s) for s in q.shape[:-2]]).reshape(-1, len(q.shape[:-2])):
        index = tuple(index.tolist())
        for i in range(n):
            bounds = []
            for start in range(0, m, size):
                keys = [j for j in range(start, min(start + size, m)) if not causal or j <= i]
                if keys:
                    high, low = k[index][keys].amax(0), k[index][keys].amin(0)
                    bound = sum(max(float(q[index][i, c] * high[c]), float(q[index][i, c] * low[c]))
                                for c in range(q.shape[-1]))
                    bounds.append((bound, keys))
            for _, keys in sorted(bounds, key=lambda b: -b[0])[:pages]:
                keep[index][i, keys] = True
    return keep


@pytest.mark.parametrize("elements", [0, 300])
@pytest.mark.parametrize("causal", [False, True])
def test_quest_attends_the_pages_of_largest_upper_bound(monkeypatch, causal, elements):
    """Also in row blocks of a few rows (``elements`` 300), where a causal block scores only the pages up to its
    last row, and its output (the pages' logits read from the dense products of those pages' keys only)."""
    _small_blocks(monkeypatch, elements)
    q, k, v = _qkv(n=21, batch=(2,), seed=3)
    for budget, size in ((8, 4), (5, 3), (21, 4), (4, 2)):
        pages = -(-budget // size)
        keep = _quest_pages(q, k, size, pages, causal)
        result = approxlab.approximate("quest", q, k, v, num_features=budget, page_size=size, causal=causal)
        expected = _masked_softmax(_logits(q, k), keep)
        torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_quest_ranks_rows_of_many_pages_as_topk_does(causal):
    """Rows of 16 K to 64 K bounds are padded for torch's partial sort (``_top_pages``): the same pages as
    ``torch.topk`` where the bound is finite, never an index past the row; and Quest on 35 pages of 2 tokens, K = 2
    (padded), attends its hand-built pages, the first causal rows (one visible page) included."""
    from approxlab.methods.quest import _top_pages

    bounds = torch.randn(2, 9, 40, generator=gen(9), dtype=torch.float64)
    bounds[0, :4, 1:] = -math.inf  # rows with one finite bound: a padded slot is no page
    values, pages = _top_pages(bounds, 2)
    reference = bounds.topk(2, dim=-1)
    finite = torch.isfinite(reference.values)
    assert torch.equal(values, reference.values) and torch.equal(pages[finite], reference.indices[finite])
    assert int(pages.max()) < 40 and int(finite.sum()) == 2 * 18 - 4
    padding = {}  # the padded rows kept for the next call: only the bounds change
    for again in (bounds, bounds.flip(-1), torch.randn(2, 9, 40, generator=gen(8), dtype=torch.float64)):
        values, pages = _top_pages(again, 2, padding)
        reference = again.topk(2, dim=-1)
        finite = torch.isfinite(reference.values)
        assert torch.equal(values, reference.values) and torch.equal(pages[finite], reference.indices[finite])
    assert len(padding) == 1
    q, k, v = _qkv(n=70, batch=(2,), seed=10)
    keep = _quest_pages(q, k, 2, 2, causal)
    result = approxlab.approximate("quest", q, k, v, num_features=4, page_size=2, causal=causal)
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)


def test_quest_code_page_rule_floor_with_three_pages_at_least():
    q, k, v = _qkv(n=40, batch=(1,), seed=4)
    code = approxlab.approximate("quest", q, k, v, num_features=20, page_size=8, budget_rounding="floor",
                                 min_pages=3)
    paper = approxlab.approximate("quest", q, k, v, num_features=20, page_size=8)
    assert code.info["pages_per_query"] == 3 and paper.info["pages_per_query"] == 3
    assert approxlab.approximate("quest", q, k, v, num_features=20, page_size=8,
                                 budget_rounding="floor").info["pages_per_query"] == 2


def test_quest_bound_is_an_upper_bound_on_every_logit_of_the_page():
    """Section 3.4 of Quest: sum_c max(q_c M_c, q_c m_c) >= q . k_j for every key j of the page, whatever
    the signs of q (checked on 200 random pages)."""
    g = gen(5)
    for _ in range(200):
        keys = torch.randn(7, 5, generator=g, dtype=torch.float64) * 3
        q = torch.randn(4, 5, generator=g, dtype=torch.float64)
        bound = page_bounds(q, keys.amax(0, keepdim=True), keys.amin(0, keepdim=True)).squeeze(-1)
        assert bool((bound >= (q @ keys.T).amax(-1) - 1e-12).all())


@pytest.mark.parametrize("causal", [False, True])
def test_full_budget_topk_and_quest_equal_exact_attention(causal):
    """Every key kept: exact attention to 1e-10 in float64 (quest with pages that do not divide n)."""
    q, k, v = _qkv(n=37, seed=6, scale=2.0)
    exact = approxlab.exact_attention(q, k, v, causal=causal)
    for name, options in (("topk", {}), ("quest", {"page_size": 16}), ("quest", {"page_size": 5})):
        out = approxlab.approximate(name, q, k, v, num_features=37, causal=causal, **options).output
        assert float((out - exact).abs().max()) <= 1e-10, name


def test_rectangular_attention_and_masked_keys():
    """More keys than queries (bidirectional); masked keys are never kept, so a key mask equals removing them."""
    q, k, v = _qkv(n=9, m=30, seed=7)
    keep = torch.arange(30) % 3 != 1
    for name, options in (("topk", {}), ("topp", {"p": 0.8}), ("quest", {"page_size": 2})):
        masked = approxlab.approximate(name, q, k, v, num_features=6, key_mask=keep, **options)
        assert float(masked.matrix()[..., ~keep].abs().max()) == 0.0
    masked = approxlab.approximate("topk", q, k, v, num_features=6, key_mask=keep).output
    removed = approxlab.approximate("topk", q, k[..., keep, :], v[..., keep, :], num_features=6).output
    torch.testing.assert_close(masked, removed, rtol=1e-12, atol=1e-13)


def test_topk_theorem_dropped_mass_bounds_each_rows_error():
    """Theorem (derived in topk's Notes): if top-k drops softmax mass delta_i in row i, then
    ||o_i - o~_i|| <= 2 delta_i max_j ||v_j||. Deterministic, so it must hold for every one of 60 seeds
    (shapes, budgets, logit scales and causality drawn per seed); delta_i comes from the dense exact matrix,
    not from the method. Also: the method's own dropped mass equals delta_i."""
    for seed in range(60):
        g = gen(1000 + seed)
        n = int(torch.randint(2, 40, (1,), generator=g))
        budget = int(torch.randint(1, n + 1, (1,), generator=g))
        scale = float(torch.empty(1).uniform_(0.2, 3.0, generator=g))
        causal = bool(seed % 2)
        q, k, v = _qkv(n=n, batch=(3,), seed=2000 + seed, scale=scale)
        exact = approxlab.attention_matrix(q, k, causal=causal)
        delta = 1.0 - exact.sort(-1, descending=True).values[..., :budget].sum(-1)
        result = approxlab.approximate("topk", q, k, v, num_features=budget, causal=causal)
        error = torch.linalg.vector_norm(result.output - exact @ v, dim=-1)
        bound = 2 * delta.clamp(min=0) * torch.linalg.vector_norm(v, dim=-1).amax(-1, keepdim=True)
        assert bool((error <= bound + 1e-12).all()), (seed, float((error - bound).max()))
        torch.testing.assert_close(result.info["dropped_mass"], delta.clamp(min=0), rtol=1e-8, atol=1e-14)


def test_topp_validation_and_dropped_mass_at_most_one_minus_p():
    q, k, v = _qkv(seed=8)
    result = approxlab.approximate("topp", q, k, v, num_features=24, p=0.75)
    assert bool((result.info["dropped_mass"] <= 0.25 + 1e-12).all())
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"`p` must be"):
            approxlab.approximate("topp", q, k, v, num_features=4, p=bad)
    with pytest.raises(ValueError, match=r"`budget_rounding` must be one of"):
        approxlab.approximate("quest", q, k, v, num_features=4, budget_rounding="round")
    with pytest.raises(ValueError, match=r"`page_size` must be an integer"):
        approxlab.approximate("quest", q, k, v, num_features=4, page_size=0)


@pytest.mark.parametrize("elements", [0, 200])
def test_selected_weights_are_those_attend_selected_applies(monkeypatch, elements):
    """The operator's entries (selected_weights) without the output: the softmax over each row's valid slots,
    the weights whose product with the gathered values is attend_selected's output, block for block."""
    from approxlab.methods._selection import attend_selected, selected_weights

    _small_blocks(monkeypatch, elements)
    q, k, v = _qkv(n=20, m=9, seed=7)
    g = gen(8)
    indices = torch.randint(9, (2, 3, 20, 4), generator=g)
    valid = torch.rand(2, 3, 20, 4, generator=g) > 0.3
    valid[..., 0] = True

    def selection(start, stop):
        return indices[..., start:stop, :], valid[..., start:stop, :]

    found_indices, weights = selected_weights(q, k, v, selection, width=4)
    assert torch.equal(found_indices, indices)
    logits = torch.gather(_logits(q, k), -1, indices)
    torch.testing.assert_close(weights, _masked_softmax(logits, valid), rtol=1e-12, atol=1e-15)
    assert bool((weights[~valid] == 0).all())
    values = torch.gather(v.unsqueeze(-3).expand(2, 3, 20, 9, 5), -2, indices.unsqueeze(-1).expand(2, 3, 20, 4, 5))
    expected = (weights.unsqueeze(-2) @ values).squeeze(-2)
    torch.testing.assert_close(attend_selected(q, k, v, selection, width=4), expected, rtol=1e-13, atol=1e-15)
