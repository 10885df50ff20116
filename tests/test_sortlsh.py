"""sortLSH (HyperAttention Definition 1, Algorithm 1): the bucket orders and the heavy-entry mask,
each against its definition computed by hand."""

import pytest
import torch

from approxlab import sortlsh
from _helpers import gen


def _reflected_gray(bits):
    """The reflected binary Gray code sequence g(0), ..., g(2^bits - 1), built from its definition:
    the sequence for r bits, then its reverse with the top bit set."""
    sequence = [0, 1]
    for r in range(1, bits):
        sequence = sequence + [(1 << r) + x for x in reversed(sequence)]
    return sequence


def _points_in_buckets(bits):
    """One point per bucket b (bit t of b: the sign of coordinate t) and the identity hyperplanes."""
    buckets = torch.arange(2**bits)
    signs = ((buckets.unsqueeze(-1) >> torch.arange(bits)) & 1) * 2.0 - 1.0
    return signs.double(), torch.eye(bits, dtype=torch.float64), buckets


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 7])
def test_gray_order_puts_adjacent_buckets_one_bit_apart(bits):
    """Definition 1: in the sorted bucket order adjacent buckets differ in exactly one bit (cyclically)."""
    x, planes, buckets = _points_in_buckets(bits)
    ranks = sortlsh.bucket_ranks(x, planes)
    assert sorted(ranks.tolist()) == list(range(2**bits))
    in_order = buckets[torch.argsort(ranks)].tolist()
    assert in_order == _reflected_gray(bits)
    for a, b in zip(in_order, in_order[1:] + in_order[:1]):
        assert bin(a ^ b).count("1") == 1


def test_code_order_is_the_published_perm_of_the_bucket():
    """The published codes sort by perm[bucket], perm = [g(0), ..., g(2^r - 1)]: for r = 3 the buckets
    come in the order 0, 1, 3, 2, 7, 6, 4, 5, and 2 -> 7 differs in two bits."""
    x, planes, buckets = _points_in_buckets(3)
    perm = _reflected_gray(3)
    assert sortlsh.bucket_ranks(x, planes, order="code").tolist() == [perm[b] for b in buckets.tolist()]
    assert buckets[torch.argsort(sortlsh.bucket_ranks(x, planes, order="code"))].tolist() == [0, 1, 3, 2, 7, 6, 4, 5]


@pytest.mark.parametrize("n, m, block", [(16, 16, 4), (13, 13, 5), (12, 20, 5), (20, 9, 3)])
def test_mask_is_algorithm_1_of_the_sorted_positions(n, m, block):
    """M^H_ij = 1[floor(P_Q(i) / b) = floor(P_K(j) / b)] (queries scaled onto the keys when n != m),
    with the permutations of a stable sort by Gray position."""
    g = gen(0)
    q, k = torch.randn(2, n, 6, generator=g, dtype=torch.float64), torch.randn(2, m, 6, generator=g, dtype=torch.float64)
    planes = sortlsh.draw_hyperplanes((2,), 3, 6, generator=g)
    mask = sortlsh.sortlsh_mask(q, k, block_size=block, hyperplanes=planes)
    for s in range(2):
        rank_q, rank_k = sortlsh.bucket_ranks(q[s], planes[s]), sortlsh.bucket_ranks(k[s], planes[s])
        position_q = {i: r for r, i in enumerate(sorted(range(n), key=lambda i: (int(rank_q[i]), i)))}
        position_k = {j: r for r, j in enumerate(sorted(range(m), key=lambda j: (int(rank_k[j]), j)))}
        expected = torch.tensor([[position_q[i] * m // (n * block) == position_k[j] // block for j in range(m)]
                                 for i in range(n)])
        assert torch.equal(mask[s], expected)
    assert int(mask.sum(-1).max()) <= block


def test_padding_sorts_last_and_the_real_blocks_are_those_of_the_unpadded_rows():
    g = gen(1)
    q, k = (torch.randn(1, 11, 4, generator=g, dtype=torch.float64) for _ in range(2))
    planes = sortlsh.draw_hyperplanes((1,), 4, 4, generator=g)
    mask = torch.ones(1, 11, dtype=torch.bool)
    mask[0, 7:] = False
    padded = sortlsh.heavy_keys(q, k, block_size=3, hyperplanes=planes, key_mask=mask, query_mask=mask)
    alone = sortlsh.heavy_keys(q[:, :7], k[:, :7], block_size=3, hyperplanes=planes)
    assert torch.equal(padded.query_block[:, :7], alone.query_block)
    assert torch.equal(padded.key_block[:, :7], alone.key_block)
    assert bool((padded.key_block[:, 7:] == -1).all())
    assert set(padded.key_order[0, 7:].tolist()) == {7, 8, 9, 10}
    changed = k.clone()
    changed[0, 7:] = 100 * torch.randn(4, 4, generator=g, dtype=torch.float64)
    again = sortlsh.heavy_keys(q, changed, block_size=3, hyperplanes=planes, key_mask=mask, query_mask=mask)
    assert torch.equal(again.keys[:, :7][again.valid[:, :7]], padded.keys[:, :7][padded.valid[:, :7]])


def test_ties_keep_the_token_order_and_float32_hashes_like_float64():
    x = torch.ones(6, 3, dtype=torch.float64)
    planes = torch.randn(5, 3, generator=gen(2), dtype=torch.float64)
    assert sortlsh.sorted_order(x, planes).tolist() == list(range(6))
    y = torch.randn(3, 50, 8, generator=gen(3), dtype=torch.float64)
    planes = sortlsh.draw_hyperplanes((3,), 7, 8, generator=gen(4))
    assert torch.equal(sortlsh.bucket_ranks(y.float(), planes), sortlsh.bucket_ranks(y.float().double(), planes))


def test_validation_names_the_parameter():
    q = torch.randn(8, 4, generator=gen(5), dtype=torch.float64)
    planes = sortlsh.draw_hyperplanes((), 3, 4, generator=gen(6))
    with pytest.raises(ValueError, match=r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"):
        sortlsh.sortlsh_mask(q, q, block_size=0, hyperplanes=planes)
    with pytest.raises(ValueError, match=r"`order` must be one of \['code', 'gray'\]; got 'hamming'"):
        sortlsh.bucket_ranks(q, planes, order="hamming")
    with pytest.raises(ValueError, match=r"`hyperplanes` must have shape \(\*batch, bits, 4\) .*; got \(3, 5\)"):
        sortlsh.bucket_ranks(q, torch.zeros(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`bits` must be an integer with 1 <= bits <= 30; got 31"):
        sortlsh.draw_hyperplanes((), 31, 4)
