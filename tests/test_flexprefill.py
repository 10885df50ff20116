"""FlexPrefill against a small re-derivation of the authors' selection (``get_active_blocks`` of
bytedance/FlexPrefill, read, not run: its kernels need Triton), written here by loops on tiny tensors.

The reference follows the code as read -- the last block of queries, the diagonal masses indexed by the
authors' ``sum_all_diagonal_matrix`` (from the longest diagonal's end) and pooled in that order, counts
``#(cumsum <= gamma) + 1`` turned into blocks, the Jensen-Shannon test, the forced first column and
diagonal blocks, the query-aware blocks of the flattened block-mean attention -- with the documented
differences applied where they are choices (blocks of ``block_size``, not 128, from a count; the query-aware
set the fewest reaching gamma). Kept blocks must be equal and outputs agree to 1e-12 in float64.
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen
from approxlab.methods.flexprefill import mass_cover, pattern_distance


def _qkv(n=75, p=6, batch=(2, 3), seed=0, dtype=torch.float64):
    g = gen(seed)
    return tuple(torch.randn(*batch, n, p, generator=g, dtype=dtype) for _ in range(3))


def _softmax(xs):
    top = max(xs)
    total = sum(math.exp(x - top) for x in xs)
    return [math.exp(x - top) / total for x in xs]


def _count(masses, gamma):
    """The authors' ``score_cover_topk``: #(sorted cumulative mass <= gamma) + 1."""
    running, count = 0.0, 0
    for m in sorted(masses, reverse=True):
        running += m
        count += running <= gamma
    return count + 1


def _top(scores, count):
    return set(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:count])


def _means(x, size):
    return [x[s:s + size].mean(0) for s in range(0, x.shape[0], size)]


def _reference(q, k, *, size, gamma, tau, min_budget, cap, authors_cover=False):
    """``(kept blocks (N, N) bool, query-aware, distance)`` of one head ``(n, p)``."""
    n, p = q.shape
    blocks = -(-n // size)
    least, most = -(-min_budget // size), min(-(-cap // size), blocks)
    L = size
    rows = [_softmax([float(q[n - L + r] @ k[j]) / math.sqrt(p) for j in range(n - L + r + 1)]) for r in range(L)]
    vertical = [sum(row[j] for row in rows if j < len(row)) / L for j in range(n)]
    # sum_all_diagonal_matrix: slash[t] = sum_r qk[r, t + r - (L - 1)], t = n - 1 the main diagonal
    slash = [sum(rows[r][t + r - L + 1] for r in range(L) if 0 <= t + r - L + 1 < len(rows[r])) / L for t in range(n)]
    pooled_vertical = [sum(vertical[s:s + size]) for s in range(0, n, size)]
    pooled_slash = [sum(slash[s:s + size]) for s in range(0, n, size)]  # t-blocks; block offset N - 1 - s
    last_query = q[n - L:].mean(0)
    estimate = _softmax([float(last_query @ kb) / math.sqrt(p) for kb in _means(k, size)])
    middle = [(a + b) / 2 for a, b in zip(estimate, pooled_vertical)]
    distance = math.sqrt(0.5 * sum(a * math.log(a / m) for a, m in zip(estimate, middle))
                         + 0.5 * sum(b * math.log(b / m) for b, m in zip(pooled_vertical, middle)))
    query_aware = distance < tau
    counts = [least if query_aware else min(max(_count(x, gamma) // size + 1, least), most) for x in (vertical, slash)]
    pooled_vertical[0], pooled_slash[-1] = math.inf, math.inf
    columns = _top(pooled_vertical, counts[0])
    offsets = {blocks - 1 - s for s in _top(pooled_slash, counts[1])}
    kept = torch.zeros(blocks, blocks, dtype=torch.bool)
    for I in range(blocks):
        for J in range(I + 1):
            kept[I, J] = J in columns or I - J in offsets
    if query_aware:
        qm, km = _means(q, size), _means(k, size)
        flat = []
        for I in range(blocks):
            weights = _softmax([float(qm[I] @ km[J]) / math.sqrt(p) for J in range(I + 1)])
            flat += [(w, I * blocks + J) for J, w in enumerate(weights)]
        flat.sort(key=lambda item: (-item[0], item[1]))
        running = 0.0
        for w, index in flat:
            if (running + w > gamma * blocks) if authors_cover else (running >= gamma * blocks):
                break
            kept[index // blocks, index % blocks] = True
            running += w
        kept[0, 0] = True
    return kept, query_aware, distance


def _expand(blocks, size, n):
    """Token-level kept sets ``(*batch, n, n)`` of block sets ``(*batch, N, N)``."""
    index = torch.arange(n) // size
    return blocks[..., index, :][..., index] & torch.ones(n, n, dtype=torch.bool).tril()


def _masked_attention(q, k, v, keep):
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma, cap", [(0.6, 75), (0.9, 75), (0.9, 24)])
def test_flexprefill_matches_the_reference_selection(seed, gamma, cap):
    q, k, v = _qkv(seed=seed)  # 10 blocks of 8, the last of 3 rows
    options = dict(size=8, gamma=gamma, min_budget=8, cap=cap)
    distances = [_reference(q[a, h], k[a, h], tau=0.0, **options)[2] for a in range(2) for h in range(3)]
    tau = sorted(distances)[2] + 1e-9  # three heads query-aware, three vertical-slash
    approx = approxlab.approximate("flexprefill", q, k, v, num_features=cap, causal=True, gamma=gamma, tau=tau,
                                   block_size=8, min_budget=8)
    expected = [[_reference(q[a, h], k[a, h], tau=tau, **options) for h in range(3)] for a in range(2)]
    blocks = torch.stack([torch.stack([kept for kept, _, _ in row]) for row in expected])
    assert approx.info["query_aware"].tolist() == [[aware for _, aware, _ in row] for row in expected]
    assert int(approx.info["query_aware"].sum()) == 3
    torch.testing.assert_close(approx.info["distance"], torch.tensor(distances, dtype=torch.float64).view(2, 3),
                               rtol=1e-12, atol=1e-12)
    assert torch.equal(approx.info["blocks"], blocks)
    keep = _expand(blocks, 8, 75)
    assert torch.equal(approx.operator().to_dense() > 0, keep)
    torch.testing.assert_close(approx.output, _masked_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)
    assert not keep.all(-1).all()  # blocks were dropped


@pytest.mark.parametrize("seed", range(3))
def test_the_authors_query_aware_prefix_keeps_at_most_the_crossing_block_fewer(seed):
    """Documented difference (2): the authors keep the sorted prefix whose cumulative mass stays <= gamma N; here
    the fewest blocks reaching gamma N -- the same set plus at most the block that crosses."""
    q, k, _ = _qkv(seed=seed)
    for a in range(2):
        for h in range(3):
            ours, aware, _ = _reference(q[a, h], k[a, h], size=8, gamma=0.7, tau=1.0, min_budget=8, cap=75)
            theirs, _, _ = _reference(q[a, h], k[a, h], size=8, gamma=0.7, tau=1.0, min_budget=8, cap=75,
                                      authors_cover=True)
            assert aware and bool((theirs <= ours).all()) and int((ours & ~theirs).sum()) <= 1


def test_gamma_one_and_short_inputs_are_exact_causal_attention():
    q, k, v = _qkv()
    exact = approxlab.exact_attention(q, k, v, causal=True)
    for tau in (0.0, 1.0):  # every head vertical-slash, every head query-aware
        full = approxlab.approximate("flexprefill", q, k, v, num_features=75, causal=True, gamma=1.0, tau=tau,
                                     block_size=8, min_budget=8)
        torch.testing.assert_close(full.output, exact, rtol=1e-12, atol=1e-12)
    short = approxlab.approximate("flexprefill", q, k, v, num_features=75, causal=True, gamma=0.5, block_size=8,
                                  min_budget=80)  # m >= N: the authors' dense path
    torch.testing.assert_close(short.output, exact, rtol=1e-12, atol=1e-12)
    sparse = approxlab.approximate("flexprefill", q, k, v, num_features=75, causal=True, gamma=0.5, block_size=8,
                                   min_budget=8)
    assert (sparse.output - exact).abs().max() > 1e-3


def test_the_cap_binds_the_vertical_and_slash_counts():
    q, k, v = _qkv()
    capped = approxlab.approximate("flexprefill", q, k, v, num_features=16, causal=True, gamma=1.0, tau=0.0,
                                   block_size=8, min_budget=8)
    assert capped.info["vertical_blocks"].max() == 2 and capped.info["slash_blocks"].max() == 2
    assert int(capped.info["blocks"].sum(-1).max()) <= 4


def test_a_later_key_reaches_earlier_rows_only_through_the_selection():
    """Rows attend keys j <= i only; the selection reads the last block of queries against every key (as the
    authors' prefill does), so a later key can move earlier rows only by changing the kept blocks: where the
    blocks are the same, the earlier rows are bit for bit the same."""
    q, k, v = _qkv()
    options = dict(num_features=75, causal=True, gamma=0.8, tau=0.15, block_size=8, min_budget=8)
    before = approxlab.approximate("flexprefill", q, k, v, **options)
    assert not (before.operator().to_dense() > 0).triu(1).any()
    k2 = k.clone()
    k2[..., -1, :] += 0.01
    after = approxlab.approximate("flexprefill", q, k2, v, **options)
    same = (before.info["blocks"] == after.info["blocks"]).flatten(-2).all(-1)
    assert same.any()
    assert torch.equal(before.output[same][..., :-1, :], after.output[same][..., :-1, :])
    k3 = k.clone()
    k3[..., -1, :] = 6.0 * q[..., -1, :]  # the last key now draws the last queries' attention
    moved = approxlab.approximate("flexprefill", q, k3, v, **options)
    assert not torch.equal(before.info["blocks"], moved.info["blocks"])


def test_mass_cover_and_the_distance_by_hand():
    masses = torch.tensor([[0.05, 0.4, 0.25, 0.3]], dtype=torch.float64)
    assert mass_cover(masses, 0.6).tolist() == [[False, True, False, True]]  # 0.4 + 0.3 >= 0.6
    assert mass_cover(masses, 1.0).tolist() == [[True, True, True, True]]
    halves = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert mass_cover(halves, 0.75).tolist() == [True, True, False]  # reached exactly: no third
    q = torch.zeros(1, 4, 2, dtype=torch.float64)  # estimate (1/2, 1/2)
    true = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    expected = math.sqrt(0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)) + 0.5 * math.log(1 / 0.75))
    assert float(pattern_distance(q, q, true, block_size=2)[0]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_dtypes_and_batches(dtype):
    q, k, v = _qkv(n=40, dtype=dtype)
    options = dict(num_features=16, causal=True, gamma=0.8, block_size=8, min_budget=8)
    approx = approxlab.approximate("flexprefill", q, k, v[..., :3], **options)
    assert approx.output.shape == (2, 3, 40, 3) and approx.output.dtype == dtype
    assert approx.info["blocks"].shape == (2, 3, 5, 5) and approx.info["query_aware"].shape == (2, 3)
    single = approxlab.approximate("flexprefill", q[1, 2], k[1, 2], v[1, 2, :, :3], **options)
    torch.testing.assert_close(single.output, approx.output[1, 2])


@pytest.mark.parametrize("options, error, match", [
    ({"gamma": 0.0}, ValueError, r"`gamma` must be .*got 0.0"),
    ({"gamma": 1.5}, ValueError, r"`gamma` must be in \(0, 1\]; got 1.5"),
    ({"tau": -0.1}, ValueError, r"`tau` must be in \[0, 1\]; got -0.1"),
    ({"tau": "0.1"}, TypeError, r"`tau` must be a real number; got '0.1'"),
    ({"block_size": 0}, ValueError, r"`block_size` must be .*got 0"),
    ({"min_budget": 0}, ValueError, r"`min_budget` must be .*got 0"),
    ({"causal": False}, ValueError, r"'flexprefill' is causal-only"),
])
def test_flexprefill_refuses_bad_options_by_name(options, error, match):
    q, k, v = _qkv(n=16)
    causal = options.pop("causal", True)
    with pytest.raises(error, match=match):
        approxlab.approximate("flexprefill", q, k, v, num_features=10, causal=causal, **options)
