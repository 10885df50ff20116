"""magicpig: the sampling probability, its frequency over hyperplane draws, the authors' estimator, edges."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.methods import draw
from approxlab.methods.magicpig import sampling_probability
from approxlab.synthetic import synthetic_qkv
from _helpers import gen


@pytest.mark.parametrize("tables, min_collisions", [(1, 1), (10, 1), (10, 2), (75, 2), (20, 5)])
def test_sampling_probability_is_the_binomial_tail(tables, min_collisions):
    cosine = torch.linspace(-0.99, 0.99, 41, dtype=torch.float64)
    bits = 3
    u = (1 - torch.arccos(cosine) / math.pi) ** bits
    direct = sum(float(math.comb(tables, s)) * u ** s * (1 - u) ** (tables - s) for s in range(min_collisions, tables + 1))
    got = sampling_probability(cosine, bits=bits, tables=tables, min_collisions=min_collisions)
    torch.testing.assert_close(got, direct, rtol=1e-10, atol=1e-15)


def test_sampling_probability_is_accurate_when_tiny_and_one_when_parallel():
    cosine = torch.tensor([-0.999999, 1.0], dtype=torch.float64)
    u = float((1 - torch.arccos(cosine[0]) / math.pi) ** 10)
    got = sampling_probability(cosine, bits=10, tables=100, min_collisions=2)
    assert float(got[0]) == pytest.approx(math.comb(100, 2) * u * u, rel=1e-6)  # 1 - (...) would round to 0
    assert float(got[1]) == 1.0


def test_a_key_is_sampled_with_its_probability_over_hyperplane_draws():
    """P(j in S_i) = P_ij: the frequency over 600 draws is within 5 binomial standard deviations (+0.01) of
    the probability, for every (query, key) pair (a correct implementation fails with probability < 1e-4)."""
    q, k, v = synthetic_qkv((1,), 12, 4, generator=gen(0))
    counts = torch.zeros(12, 12, dtype=torch.float64)
    draws = 600
    for seed in range(draws):
        approx = approxlab.approximate("magicpig", q, k, v, num_features=6, bits=2, min_collisions=2,
                                       generator=gen(seed))
        counts += approx.matrix()[0] > 0
    centred = k[0] - k[0].mean(0)
    cosine = (q[0] @ centred.T) / (q[0].norm(dim=-1, keepdim=True) * centred.norm(dim=-1))
    probability = sampling_probability(cosine, bits=2, tables=6, min_collisions=2)
    frequency = counts / draws
    tolerance = 5 * torch.sqrt(probability * (1 - probability) / draws) + 0.01
    assert bool(((frequency - probability).abs() <= tolerance).all())


def test_matches_the_authors_decode_attention_on_shared_hyperplanes():
    """Infini-AI-Lab/MagicPIG evaluations/RULER/pred/cache_ref.py (commit ac9aa36) re-typed: keys centred by
    their mean, codes of the normalised query, mask = at least 2 equal codes, logit - log(weight); the same
    output to 1e-12 once its +1e-4 inside the log is left out."""
    q, k, v = synthetic_qkv((2,), 64, 8, scale=1.2, generator=gen(1))
    tables, bits = 40, 3
    drawn = draw("magicpig", q, k, num_features=tables, bits=bits, generator=gen(2))
    ours = approxlab.approximate("magicpig", q, k, v, num_features=tables, bits=bits, draw=drawn)
    for head in range(2):
        hash_matrix = drawn["hyperplanes"][head].reshape(tables * bits, 8).T
        centred = k[head] - k[head].mean(0, keepdim=True)
        key_code = (centred @ hash_matrix).reshape(64, tables, bits).gt(0)
        key_code = sum(key_code[..., i].long() * 2 ** i for i in range(bits))
        unit = q[head] / q[head].norm(dim=-1, keepdim=True)
        query_code = (unit @ hash_matrix).reshape(64, tables, bits).gt(0)
        query_code = sum(query_code[..., i].long() * 2 ** i for i in range(bits))
        mask = (query_code[:, None, :] == key_code[None, :, :]).int().sum(-1) >= 2
        scores = q[head] @ centred.T
        cosine = scores / (centred.norm(dim=-1)[None, :] * q[head].norm(dim=-1, keepdim=True))
        weight = 1 - torch.arccos(cosine) / math.pi
        weight = 1 - (1 - weight ** bits) ** tables - tables * ((1 - weight ** bits) ** (tables - 1)) * weight ** bits
        logits = (scores / math.sqrt(8) - torch.log(weight)).masked_fill(~mask, float("-inf"))
        rows = mask.any(-1)
        expected = torch.softmax(logits[rows], dim=-1) @ v[head]
        assert torch.equal(ours.matrix()[head][rows] > 0, mask[rows])
        torch.testing.assert_close(ours.output[head][rows], expected, rtol=1e-12, atol=1e-12)


def test_sinks_and_window_covering_every_key_are_exact_attention():
    q, k, v = synthetic_qkv((2,), 32, 8, generator=gen(3))
    full = approxlab.approximate("magicpig", q, k, v, num_features=4, sink=32, generator=gen(4))
    torch.testing.assert_close(full.output, approxlab.exact_attention(q, k, v), rtol=1e-12, atol=1e-12)
    causal = approxlab.approximate("magicpig", q, k, v, num_features=4, window=32, causal=True, generator=gen(4))
    torch.testing.assert_close(causal.output, approxlab.exact_attention(q, k, v, causal=True), rtol=1e-12,
                               atol=1e-12)


def test_bad_options():
    q, k, v = synthetic_qkv((1,), 16, 4, generator=gen(0))
    with pytest.raises(ValueError, match="`min_collisions`"):
        approxlab.approximate("magicpig", q, k, v, num_features=2, min_collisions=3)
    with pytest.raises(TypeError, match="`center` must be a bool"):
        approxlab.approximate("magicpig", q, k, v, num_features=2, center=1)


@pytest.mark.parametrize("batch, tables, queries, keys, bits", [((), 3, 5, 7, 2), ((2,), 16, 40, 33, 3),
                                                                 ((2, 3), 8, 17, 64, 1), ((1,), 64, 64, 200, 8),
                                                                 ((3,), 4, 1, 1, 4), ((2,), 5, 30, 30, 0)])
def test_collisions_by_bucket_lookup_are_the_table_by_table_comparisons(batch, tables, queries, keys, bits):
    from approxlab.methods.magicpig import collision_counts

    g = torch.Generator().manual_seed(len(batch) * 100 + tables)
    codes_q = torch.randint(2 ** bits, (*batch, tables, queries), generator=g)
    codes_k = torch.randint(2 ** bits, (*batch, tables, keys), generator=g)
    compared = sum((codes_q[..., t, :, None] == codes_k[..., t, None, :]).to(torch.int32) for t in range(tables))
    counted = collision_counts(codes_q, codes_k)
    assert counted.dtype == torch.int32 and torch.equal(counted, compared)


def test_causal_rows_never_depend_on_a_later_key():
    """Changing only the last key (and value) moves the last row only: the centring mean is the prefill's."""
    q, k, v = synthetic_qkv((2,), 128, 8, scale=1.2, generator=gen(5))
    drawn = draw("magicpig", q, k, num_features=40, bits=3, generator=gen(6))
    options = dict(num_features=40, bits=3, sink=4, window=8, causal=True, draw=drawn)
    before = approxlab.approximate("magicpig", q, k, v, **options)
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 5.0
    v2[..., -1, :] -= 3.0
    after = approxlab.approximate("magicpig", q, k2, v2, **options)
    assert torch.equal(before.output[..., :-1, :], after.output[..., :-1, :])
    assert not torch.equal(before.output[..., -1, :], after.output[..., -1, :])
    torch.testing.assert_close(before.output[..., :64, :], approxlab.exact_attention(q, k, v, causal=True)[..., :64, :],
                               rtol=1e-12, atol=1e-12)  # the prefill (prompt_length 64 = n // 2) is exact


@pytest.mark.parametrize("sink, window", [(4, 9), (0, 1), (2, 30)])
def test_the_first_decoded_row_is_the_authors_simcache_with_its_centring(sink, window):
    """Infini-AI-Lab/MagicPIG evaluations/RULER/pred/cache_ref.py (commit ac9aa36) re-typed for one decode step:
    the prefill's P keys split into sinks, its last ``window - 1`` keys and the keys between (``select_kv_cache``),
    the mean of those between subtracted from every key (``avg_key``), the new key attended exactly; the same
    sampled set and output as row P of the causal form (whose window counts the query's own key)."""
    q, k, v = synthetic_qkv((2,), 97, 8, scale=1.2, generator=gen(7))
    prompt, tables, bits = 96, 40, 3
    drawn = draw("magicpig", q, k, num_features=tables, bits=bits, generator=gen(8))
    ours = approxlab.approximate("magicpig", q, k, v, num_features=tables, bits=bits, sink=sink, window=window,
                                 causal=True, prompt_length=prompt, draw=drawn)
    kept_window = window - 1
    for head in range(2):
        keys = k[head]
        between = keys[sink:prompt - kept_window]
        average = between.mean(0, keepdim=True)
        centred = keys - average
        hash_matrix = drawn["hyperplanes"][head].reshape(tables * bits, 8).T
        key_code = (centred[sink:prompt - kept_window] @ hash_matrix).reshape(-1, tables, bits).gt(0)
        key_code = sum(key_code[..., i].long() * 2 ** i for i in range(bits))
        query = q[head, prompt]
        query_code = ((query / query.norm()) @ hash_matrix).reshape(tables, bits).gt(0)
        query_code = sum(query_code[..., i].long() * 2 ** i for i in range(bits))
        mask = (query_code[None, :] == key_code).int().sum(-1) >= 2
        unselected = query @ centred[sink:prompt - kept_window].T
        cosine = unselected / (centred[sink:prompt - kept_window].norm(dim=-1) * query.norm())
        weight = 1 - torch.arccos(cosine) / math.pi
        weight = 1 - (1 - weight ** bits) ** tables - tables * ((1 - weight ** bits) ** (tables - 1)) * weight ** bits
        unselected = (unselected / math.sqrt(8) - torch.log(weight)).masked_fill(~mask, float("-inf"))
        selected_keys = torch.cat([centred[:sink], centred[prompt - kept_window:prompt + 1]])
        selected = selected_keys @ query / math.sqrt(8)
        weights = torch.softmax(torch.cat([selected, unselected]), dim=-1)
        values = torch.cat([v[head, :sink], v[head, prompt - kept_window:prompt + 1], v[head, sink:prompt - kept_window]])
        torch.testing.assert_close(ours.output[head, prompt], weights @ values, rtol=1e-12, atol=1e-12)
        row = ours.matrix()[head, prompt] > 0
        assert torch.equal(row[sink:prompt - kept_window], mask)
        assert int(ours.info["sampled"][head, prompt]) == int(mask.sum())


def test_bidirectional_centring_is_the_mean_between_the_sinks_and_the_last_window_keys():
    """The sampled sets are those of keys hashed after subtracting the mean of keys sink..m-window-1 (by hand)."""
    q, k, v = synthetic_qkv((1,), 48, 8, scale=1.2, generator=gen(9))
    tables, bits, sink, window = 30, 3, 3, 6
    drawn = draw("magicpig", q, k, num_features=tables, bits=bits, generator=gen(10))
    ours = approxlab.approximate("magicpig", q, k, v, num_features=tables, bits=bits, sink=sink, window=window,
                                 draw=drawn)
    centred = k[0] - k[0, sink:48 - window].mean(0, keepdim=True)
    hash_matrix = drawn["hyperplanes"][0].reshape(tables * bits, 8).T
    key_code = (centred @ hash_matrix).reshape(48, tables, bits).gt(0)
    key_code = sum(key_code[..., i].long() * 2 ** i for i in range(bits))
    query_code = (q[0] @ hash_matrix).reshape(48, tables, bits).gt(0)
    query_code = sum(query_code[..., i].long() * 2 ** i for i in range(bits))
    collide = (query_code[:, None, :] == key_code[None, :, :]).int().sum(-1) >= 2
    rows, keys = torch.arange(48).unsqueeze(-1), torch.arange(48)
    fixed = (keys < sink) | ((keys <= rows) & (keys > rows - window))
    assert torch.equal(ours.matrix()[0] > 0, fixed | collide)


def test_prompt_length_is_for_the_causal_form():
    q, k, v = synthetic_qkv((1,), 16, 4, generator=gen(0))
    with pytest.raises(ValueError, match="`prompt_length` is the prefill of magicpig's causal form"):
        approxlab.approximate("magicpig", q, k, v, num_features=2, prompt_length=4)
    with pytest.raises(ValueError, match="`prompt_length`"):
        approxlab.approximate("magicpig", q, k, v, num_features=2, prompt_length=17, causal=True)


def test_in_the_kv_cache_setting_the_context_is_the_prefill():
    """kv_cache_attention runs magicpig's causal form with prompt_length = context_length: the context is exact
    and fixes the centring mean, as MagicPIG's prefill does."""
    q, k, v = synthetic_qkv((2,), 96, 8, scale=1.2, generator=gen(11))
    drawn = draw("magicpig", q, k, num_features=30, bits=3, generator=gen(12))
    cached = approxlab.kv_cache_attention("magicpig", q, k, v, context_length=64, num_features=30, bits=3, sink=2,
                                          window=8, draw=drawn)
    causal = approxlab.approximate("magicpig", q, k, v, num_features=30, bits=3, sink=2, window=8, draw=drawn,
                                   causal=True, prompt_length=64)
    assert cached.info["prompt_length"] == 64 and torch.equal(cached.output, causal.output[..., 64:, :])
