"""The fast paths of the selection oracles and of Quest against their references, on the same inputs.

* :func:`approxlab.methods._row_topk.row_topk` is ``torch.topk`` bit for bit (values and indices), in float32, float64
  (their sort keys differ) and bfloat16, ties, -inf, NaN (in a group or past the last one) and +inf included (those
  rows go to ``torch.topk`` itself);
* ``topk`` and ``topp`` give the same outputs, indices and masses with their selection done by ``torch.topk`` (the
  former code path), and equal the dense definition (every logit, ``torch.topk`` on each whole row, the softmax over
  the kept keys) to rounding, float32 and float64, causal and not, batched;
* Quest's output (its pages attended page by page) equals the product of its operator (the tokens of the same pages,
  :func:`~approxlab.methods._selection.selected_weights`) with ``v`` to rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen
from approxlab.methods._row_topk import GROUP_COLUMNS, row_topk

TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.float64: {"rtol": 1e-12, "atol": 1e-13}}


def _assert_same_topk(x, k):
    values, indices = row_topk(x, k)
    reference = x.topk(k, dim=-1)
    torch.testing.assert_close(values, reference.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices, reference.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_topk_is_torch_topk_bit_for_bit(dtype):
    g = gen(0)
    # whole rows to torch.topk (150, 64), groups of c / 4 (250 with a tail), of c / 2 (403 with a tail, 611), of c
    # (612, 300 with k = 4, 1000, 1037 with a tail): c halves while 4 w < 9 c (k + 1)
    for width, k in ((150, 16), (64, 8), (250, 16), (403, 16), (9 * GROUP_COLUMNS * 17 // 4 - 1, 16),
                     (9 * GROUP_COLUMNS * 17 // 4, 16), (300, 4), (1000, 16), (1037, 16)):
        _assert_same_topk(torch.randn(2, 3, 7, width, generator=g, dtype=dtype), k)
    _assert_same_topk(-torch.randn(2, 3, 7, 1037, generator=g, dtype=dtype).abs(), 16)  # negative: their sort keys
    x = torch.randn(5, 600, generator=g, dtype=dtype)
    _assert_same_topk(x.unsqueeze(0).expand(3, 5, 600), 6)  # a broadcast batch (stride 0)
    _assert_same_topk(x[:, ::2], 6)  # strided rows


@pytest.mark.parametrize("sorted_", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_topk_answers_rows_without_ties_itself(dtype, sorted_):
    """On rows of distinct values (of either sign) every row is answered by the selection, none handed to
    ``torch.topk``: a fault in the sort keys or the clean test would still give the right result through the
    reference, only slower, so this checks the fast path is the one taken."""
    from approxlab.methods._row_topk import _candidates, _largest

    g = gen(3)
    x = torch.randn(2, 3, 40, 1037, generator=g, dtype=dtype) - 2.5  # the largest about 0: both signs
    decades = 0.9 * math.log10(torch.finfo(dtype).max)  # every exponent: the sort keys' whole range
    spread = torch.randn(2, 3, 40, 1037, generator=g, dtype=dtype) * 10 ** torch.empty(
        2, 3, 40, 1037, dtype=dtype).uniform_(-decades, decades, generator=g)
    for x in (x, spread):
        row, values, columns, unsafe = _candidates(x, 17, GROUP_COLUMNS)
        top, indices, clean = _largest(row, values, columns, 240, 17, sorted=sorted_)
        assert bool(clean.all()) and not bool(unsafe.any())
        reference = x.reshape(240, 1037).topk(16, dim=-1)
        assert torch.equal(top, reference.values) and torch.equal(indices, reference.indices)


def test_row_topk_float64_keys_that_tie_after_truncation_go_to_the_reference():
    """float64 sort keys keep their leading bits only (row bits above them): they order (row, decreasing value)
    over the floats' whole range; values one or two ulps apart share a key, and the sort may list them in any order.
    Three such values at a row's k-th and (k+1)-th place, listed in
    every order: the row is answered only where its answer is right (the last two picked differ in their keys),
    else handed to ``torch.topk``; and ``row_topk`` on rows of such clusters is ``torch.topk``'s."""
    import itertools

    from approxlab.methods._row_topk import _largest, _row_order

    k = 4
    close = [3.0, math.nextafter(3.0, math.inf), math.nextafter(math.nextafter(3.0, math.inf), math.inf)]
    for order in itertools.permutations(range(3)):
        # one row: k - 1 large values, the three close ones, then smaller ones; listed in this order
        values = torch.tensor([10.0, 9.0, 8.0] + [close[i] for i in order] + [1.0, 0.5], dtype=torch.float64)
        columns = torch.arange(values.numel())
        top, indices, clean = _largest(torch.zeros_like(columns), values, columns, 3, k + 1, sorted=True)
        reference = values.topk(k)
        assert not bool(clean[0]) or (torch.equal(top[0], reference.values)
                                      and torch.equal(indices[0], reference.indices))
    g = gen(4)
    rows = 240  # the keys order (row, decreasing value) over every row and the floats' whole range, both signs
    row = torch.randint(0, rows, (5000,), generator=g)
    values = torch.randn(5000, generator=g, dtype=torch.float64) * 10 ** torch.empty(
        5000, dtype=torch.float64).uniform_(-300, 300, generator=g)
    by_key = _row_order(row, values, rows).argsort()
    by_row_and_value = sorted(range(5000), key=lambda i: (int(row[i]), -float(values[i])))
    assert by_key.tolist() == by_row_and_value
    x = torch.randn(3, 40, 1037, generator=g, dtype=torch.float64).mul_(1e-14).add_(2.0)  # a few ulps apart
    x[1] = torch.randn(40, 1037, generator=g, dtype=torch.float64)
    x[1, :, 500:540] = (x[1, :, 0:1] + 1.0) + torch.arange(40, dtype=torch.float64) * 4.4e-16
    _assert_same_topk(x, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_topk_breaks_ties_and_handles_infinities_as_torch_topk(dtype):
    g = gen(1)
    ties = torch.randint(-4, 5, (4, 9, 700), generator=g).to(dtype)  # nine values: every row ties
    _assert_same_topk(ties, 12)
    some = torch.randn(4, 9, 700, generator=g, dtype=dtype)
    some[0, :, 50:60] = some[0, :, 0:1] + 9.0  # ten equal largest entries
    some[1, :, 100:] = -math.inf  # a causal row: fewer visible keys than k in some rows
    some[1, 3, 5:] = -math.inf
    some[2, 0] = -math.inf  # nothing visible
    some[2, 1, 17] = math.nan
    some[2, 2, 33] = math.inf
    some[2, 3, 699] = math.nan  # past the last whole group (700 = 43 groups of 16 and 12 columns)
    some[3, :, ::2] = some[3, :, 1::2]  # every value twice
    _assert_same_topk(some, 12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_topk_unsorted_gives_torch_topks_entries_as_a_set(dtype):
    """``sorted=False`` (vAttention's fixed keys): each row's values and indices are ``torch.topk``'s, in another
    order -- on Gaussian rows (the unsorted selection), on ties inside and at the boundary of the k, infinities and
    NaN (``torch.topk`` on those rows), and on rows too narrow for the groups."""
    g = gen(2)
    some = torch.randn(4, 9, 1100, generator=g, dtype=dtype)
    some[0, :, 50:55] = some[0, :, 0:1] + 9.0  # five equal largest entries: inside the k, the set is one
    some[1, :, 100:] = -math.inf
    some[2, 1, 17] = math.nan
    some[2, 2, 1099] = math.nan  # past the last whole group (1100 = 68 groups of 16 and 12 columns)
    some[3, :, ::2] = some[3, :, 1::2]  # every value twice: ties at the boundary
    for x, k in ((some, 12), (torch.randint(-4, 5, (2, 5, 700), generator=g).to(dtype), 12),
                 (torch.randn(2, 3, 150, generator=g, dtype=dtype), 16)):
        values, indices = row_topk(x, k, sorted=False)
        reference = x.topk(k, dim=-1)
        order = indices.argsort(-1)
        assert torch.equal(indices.gather(-1, order), reference.indices.sort(-1).values)
        torch.testing.assert_close(values.gather(-1, order), reference.values.gather(-1, reference.indices.argsort(-1)),
                                   rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(row_topk(some, 12, sorted=False)[1], some.topk(12, dim=-1).indices)  # not sorted


def _former_selection(monkeypatch):
    """The selection done by ``torch.topk`` on each row block, as before the fast path."""
    monkeypatch.setattr("approxlab.methods._selection.row_topk", lambda x, k: x.topk(k, dim=-1))


def _qkv(n, dtype, seed, *, batch=(2, 3), p=8, ties=False):
    g = gen(seed)
    q, k, v = (torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(3))
    if ties:  # few distinct logits: many ties at each row's k-th largest
        q, k = q.sign(), k.round().clamp(-1, 1)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["topk", "topp"])
def test_oracles_equal_their_former_selection(monkeypatch, name, causal, dtype, ties):
    q, k, v = _qkv(320, dtype, 2, ties=ties)
    options = {"p": 0.8} if name == "topp" else {}
    fast = approxlab.approximate(name, q, k, v, num_features=6, causal=causal, **options)
    _former_selection(monkeypatch)
    former = approxlab.approximate(name, q, k, v, num_features=6, causal=causal, **options)
    assert torch.equal(fast.info["indices"], former.info["indices"])
    torch.testing.assert_close(fast.output, former.output, rtol=0, atol=0)
    for key in ("kept_mass", "dropped_mass"):
        torch.testing.assert_close(fast.info[key], former.info[key], rtol=0, atol=0)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_topk_equals_the_dense_definition(causal, dtype, ties):
    """Every logit at once, ``torch.topk`` on each whole row (-inf on the keys a causal row cannot see), the softmax
    over the kept keys: the same kept keys and, to rounding, the same output and dropped mass."""
    q, k, v = _qkv(320, dtype, 3, ties=ties)
    budget = 6
    logits = (q @ k.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))
    if causal:
        logits = logits.masked_fill(~torch.ones(320, 320, dtype=torch.bool).tril(), -math.inf)
    top = logits.topk(budget, dim=-1)
    keep = torch.isfinite(top.values)
    weights = torch.softmax(top.values.masked_fill(~keep, -math.inf), dim=-1)
    expected = (weights.unsqueeze(-1) * torch.gather(v.unsqueeze(-3).expand(2, 3, 320, 320, 8), -2,
                                                     top.indices.unsqueeze(-1).expand(2, 3, 320, budget, 8))).sum(-2)
    dropped = 1 - torch.exp(torch.logsumexp(top.values, -1) - torch.logsumexp(logits, -1))
    result = approxlab.approximate("topk", q, k, v, num_features=budget, causal=causal)
    assert torch.equal(result.info["indices"], top.indices)
    torch.testing.assert_close(result.output, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(result.info["dropped_mass"], dropped.clamp(min=0), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("size", "budget", "ties", "masked"), [(16, 40, False, False), (7, 20, True, False),
                                                                   (5, 12, False, True)])
def test_quest_output_equals_its_operator_on_the_pages_tokens(causal, dtype, size, budget, ties, masked):
    q, k, v = _qkv(203, dtype, 4, ties=ties)
    key_mask = (torch.rand(2, 3, 203, generator=gen(5)) > 0.3) if masked else None
    if masked and causal:
        key_mask[..., 0] = True
    result = approxlab.approximate("quest", q, k, v, num_features=budget, page_size=size, causal=causal,
                                   key_mask=key_mask)
    torch.testing.assert_close(result.output, result.matrix() @ v, **TOLERANCES[dtype])
    pages = result.info["pages"]
    assert pages.shape == (2, 3, 203, -(-budget // size)) and int(pages.max()) < -(-203 // size)


@pytest.mark.parametrize("block_elements", [None, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("size", "budget", "masked"), [(16, 40, False), (7, 20, False), (5, 12, True)])
def test_quest_reads_the_same_logits_from_the_dense_products_as_from_the_gathered_pages(monkeypatch, dtype, causal,
                                                                                     size, budget, masked,
                                                                                     block_elements):
    """Quest's ways to a block's logits (the pages' keys gathered, or the pages' entries of the dense logits of
    a span of blocks: ``DENSE_SELECTION``; bidirectional, page by page: ``BY_PAGE_ROWS``) give the same pages and
    outputs to rounding, ties, masks and causal included; ``block_elements`` 5000: blocks of 1-3 rows, several to a
    span."""
    from approxlab.methods import _selection, quest as quest_module

    if block_elements is not None:
        monkeypatch.setattr(_selection, "BLOCK_ELEMENTS", block_elements)

    q, k, v = _qkv(203, dtype, 4, ties=True)
    key_mask = (torch.rand(2, 3, 203, generator=gen(6)) > 0.3) if masked else None
    if masked:
        key_mask[..., 0] = True
    results = []
    for rule, by_page in ((0, 10 ** 9), (10 ** 9, 10 ** 9), (0, 0)):  # gathered, dense, page by page (bidirectional)
        monkeypatch.setattr(quest_module, "DENSE_SELECTION", rule)
        monkeypatch.setattr(quest_module, "BY_PAGE_ROWS", by_page)
        results.append(approxlab.approximate("quest", q, k, v, num_features=budget, page_size=size, causal=causal,
                                             key_mask=key_mask))
    gathered, dense, by_page = results
    for other in (dense, by_page):
        assert torch.equal(gathered.info["pages"], other.info["pages"])
        torch.testing.assert_close(other.output, gathered.output, **TOLERANCES[dtype])
    if not causal:  # the page-by-page output: the operator's product too
        torch.testing.assert_close(by_page.output, by_page.matrix() @ v, **TOLERANCES[dtype])


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_flow_as_through_the_reference(monkeypatch, causal):
    """With inputs that require gradients the fast paths record a graph (no buffer, nothing in place): the
    gradients of ``topk``/``topp`` equal those with the former selection, Quest's those of its operator's product."""

    def gradients(name, through_operator=False, **options):
        q, k, v = (x.clone().requires_grad_(True) for x in _qkv(300, torch.float64, 6, batch=(2,)))
        result = approxlab.approximate(name, q, k, v, num_features=6, causal=causal, **options)
        out = result.matrix() @ v if through_operator else result.output
        out.square().sum().backward()
        return [x.grad for x in (q, k, v)]

    for name, options in (("topk", {}), ("topp", {"p": 0.7})):
        fast = gradients(name, **options)
        with monkeypatch.context() as patch:
            _former_selection(patch)
            former = gradients(name, **options)
        for a, b in zip(fast, former):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    for a, b in zip(gradients("quest", page_size=4), gradients("quest", through_operator=True, page_size=4)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
