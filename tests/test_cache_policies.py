"""The decode-time cache policies (streaming-llm, h2o, snapkv) against their causal definitions, built here
by hand in float64: which tokens the cache holds when token i is decoded, then the dense softmax over them."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import approxlab
from _helpers import gen


def _qkv(n=30, p=6, p_v=5, batch=(2, 3), seed=0, scale=1.0):
    g = gen(seed)
    q, k = (scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(*batch, n, p_v, generator=g, dtype=torch.float64)


def _logits(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _masked_softmax(logits, keep):
    return torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)


def _heads(x):
    """Every (*batch) index of a tensor, as tuples."""
    return [tuple(i) for i in torch.cartesian_prod(*[torch.arange(s) for s in x.shape[:-2]]).reshape(
        -1, x.ndim - 2).tolist()]


@pytest.mark.parametrize("budget,sinks", [(8, 4), (5, 4), (3, 4), (1, 4), (6, 0), (30, 4)])
def test_streaming_llm_is_sinks_plus_recent_window(budget, sinks):
    q, k, v = _qkv(seed=1)
    start = min(sinks, budget - 1)
    window = budget - start
    i, j = torch.arange(30).unsqueeze(-1), torch.arange(30)
    keep = (j <= i) & ((j < start) | (j > i - window))
    result = approxlab.approximate("streaming-llm", q, k, v, num_features=budget, sinks=sinks, causal=True)
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(result.matrix(), expected.expand(2, 3, 30, 30), rtol=1e-12, atol=1e-14)
    assert int(keep.sum(-1).max()) == min(budget, 30)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("budget,sinks", [(12, 4), (5, 0), (40, 2)])
def test_streaming_llm_bands_of_queries_are_the_window(monkeypatch, rows, budget, sinks):
    """The banded form (query blocks against their sinks and a band of keys) is the sinks-plus-window rule on
    every row, whatever the block length, past several blocks."""
    monkeypatch.setattr(importlib.import_module("approxlab.methods.streaming_llm"), "_BAND_ROWS", rows)
    q, k, v = _qkv(n=150, batch=(2,), seed=8, scale=1.5)
    start = min(sinks, budget - 1)
    i, j = torch.arange(150).unsqueeze(-1), torch.arange(150)
    keep = (j <= i) & ((j < start) | (j > i - (budget - start)))
    result = approxlab.approximate("streaming-llm", q, k, v, num_features=budget, sinks=sinks, causal=True)
    torch.testing.assert_close(result.output, _masked_softmax(_logits(q, k), keep) @ v, rtol=1e-12, atol=1e-13)


def _h2o_cache_by_hand(q, k, budget, recent, scores):
    """Algorithm 1 of H2O with a recent window, one head: the keep mask (n, n)."""
    n = q.shape[0]
    cache, accumulated = [], {}
    keep = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        cache.append(i)
        accumulated[i] = 0.0
        if len(cache) > budget:
            victim = min((j for j in cache if j <= i - recent), key=lambda j: (accumulated[j], j))
            cache.remove(victim)
        keep[i, cache] = True
        paid = torch.softmax(q[i] @ k[cache].T / math.sqrt(q.shape[-1]), -1)
        if scores == "dense":
            row = torch.softmax(q[i] @ k[: i + 1].T / math.sqrt(q.shape[-1]), -1)
            paid = row[cache]
        for j, weight in zip(cache, paid.tolist()):
            accumulated[j] += weight
    return keep


@pytest.mark.parametrize("budget,recent,scores", [(8, 4, "cache"), (8, 1, "cache"), (7, None, "cache"),
                                                  (6, 6, "cache"), (1, None, "cache"), (8, 3, "dense")])
def test_h2o_is_algorithm_1_token_by_token(budget, recent, scores):
    q, k, v = _qkv(n=26, batch=(2,), seed=2, scale=1.5)
    result = approxlab.approximate("h2o", q, k, v, num_features=budget, recent_size=recent, scores=scores,
                                   causal=True)
    window = max(1, budget // 2) if recent is None else recent
    keep = torch.stack([_h2o_cache_by_hand(q[b], k[b], budget, window, scores) for b in range(2)])
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)
    assert result.info == {"recent": window, "heavy": budget - window}


@pytest.mark.parametrize("steps", [1, 5, 64])
@pytest.mark.parametrize("scores", ["cache", "dense"])
def test_h2o_blocks_of_steps_keep_algorithm_1(monkeypatch, steps, scores):
    """The decode in blocks of steps keeps the token-by-token caches of Algorithm 1 at every block length,
    over several blocks."""
    monkeypatch.setattr(importlib.import_module("approxlab.methods.h2o"), "_STEPS", steps)
    q, k, v = _qkv(n=150, batch=(2,), seed=7, scale=1.5)
    result = approxlab.approximate("h2o", q, k, v, num_features=12, recent_size=3, scores=scores, causal=True)
    keep = torch.stack([_h2o_cache_by_hand(q[b], k[b], 12, 3, scores) for b in range(2)])
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)


def _snapkv_kept_by_hand(q, k, prompt, budget, window, kernel, pooling):
    """SnapKV's kept prompt tokens for one head (Listing 1 of the paper), by loops."""
    if budget >= prompt:
        return list(range(prompt))
    observed = min(window, budget)
    prefix = prompt - observed
    weights = _masked_softmax(_logits(q[:prompt], k[:prompt]), torch.ones(prompt, prompt, dtype=torch.bool).tril())
    votes = weights[prefix:, :prefix].sum(0).tolist()
    half = kernel // 2
    pooled = []
    for j in range(prefix):
        around = [votes[t] for t in range(j - half, j + half + 1) if 0 <= t < prefix]
        pooled.append(max(around) if pooling == "max" else sum(around) / kernel)  # avg: zero padding counted
    chosen = sorted(range(prefix), key=lambda j: -pooled[j])[: budget - observed]
    return chosen + list(range(prefix, prompt))


@pytest.mark.parametrize("budget,prompt,window,kernel,pooling", [(10, 20, 4, 3, "max"), (10, 20, 4, 5, "avg"),
                                                                 (6, 20, 8, 3, "max"), (20, 20, 4, 3, "max"),
                                                                 (9, 29, 32, 5, "max")])
def test_snapkv_compresses_the_prompt_once_by_pooled_window_votes(budget, prompt, window, kernel, pooling):
    q, k, v = _qkv(seed=3, batch=(2,), scale=1.5)
    n = 30
    result = approxlab.approximate("snapkv", q, k, v, num_features=budget, prompt_length=prompt, window=window,
                                   kernel_size=kernel, pooling=pooling, causal=True)
    keep = torch.zeros(2, n, n, dtype=torch.bool)
    for b in range(2):
        kept = _snapkv_kept_by_hand(q[b], k[b], prompt, budget, window, kernel, pooling)
        assert sorted(result.info["kept"][b].tolist()) == sorted(kept)
        keep[b] = torch.ones(n, n, dtype=torch.bool).tril()
        keep[b, prompt:, :prompt] = False
        keep[b, prompt:, kept] = True
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)


def test_full_budget_cache_policies_equal_exact_causal_attention():
    """Every token kept: exact causal attention to 1e-10 in float64."""
    q, k, v = _qkv(n=33, seed=4, scale=2.0)
    exact = approxlab.exact_attention(q, k, v, causal=True)
    for name, options in (("streaming-llm", {}), ("h2o", {}), ("h2o", {"scores": "dense"}), ("snapkv", {}),
                          ("snapkv", {"prompt_length": 20})):
        out = approxlab.approximate(name, q, k, v, num_features=33, causal=True, **options).output
        assert float((out - exact).abs().max()) <= 1e-10, (name, options)


@pytest.mark.parametrize("steps", [3, 64])
@pytest.mark.parametrize("name,options", [("streaming-llm", {"sinks": 2}), ("h2o", {"recent_size": 2}),
                                          ("h2o", {"recent_size": 2, "scores": "dense"})])
def test_padding_is_removed_from_the_cache(monkeypatch, name, options, steps):
    """With a key mask, the real rows are what the policy gives on the sequence with its padding removed
    (padding at the start, in the middle and at the end), also when H2O's blocks of steps cut the padding."""
    monkeypatch.setattr(importlib.import_module("approxlab.methods.h2o"), "_STEPS", steps)
    q, k, v = _qkv(n=20, batch=(3, 2), seed=5)
    mask = torch.ones(3, 1, 20, dtype=torch.bool)
    mask[0, 0, :5] = False
    mask[1, 0, 7:11] = False
    mask[2, 0, 14:] = False
    masked = approxlab.approximate(name, q, k, v, num_features=6, key_mask=mask, causal=True, **options).output
    for s in range(3):
        real = mask[s, 0]
        alone = approxlab.approximate(name, *(x[s][..., real, :] for x in (q, k, v)), num_features=6, causal=True,
                                      **options).output
        torch.testing.assert_close(masked[s][..., real, :], alone, rtol=1e-12, atol=1e-13)
    assert bool(torch.isfinite(masked).all())


def test_policy_options_are_validated():
    q, k, v = _qkv(n=12, seed=6)
    with pytest.raises(ValueError, match=r"`recent_size` must be an integer with 1 <= recent_size <= 4; got 5"):
        approxlab.approximate("h2o", q, k, v, num_features=4, recent_size=5, causal=True)
    with pytest.raises(ValueError, match=r"`scores` must be one of"):
        approxlab.approximate("h2o", q, k, v, num_features=4, scores="full", causal=True)
    with pytest.raises(ValueError, match=r"`kernel_size` must be odd"):
        approxlab.approximate("snapkv", q, k, v, num_features=4, kernel_size=4, causal=True)
    with pytest.raises(ValueError, match=r"`prompt_length` must be an integer with 1 <= prompt_length <= 12"):
        approxlab.approximate("snapkv", q, k, v, num_features=4, prompt_length=13, causal=True)
    with pytest.raises(ValueError, match=r"`pooling` must be one of"):
        approxlab.approximate("snapkv", q, k, v, num_features=4, pooling="sum", causal=True)
    with pytest.raises(ValueError, match=r"`sinks` must be an integer"):
        approxlab.approximate("streaming-llm", q, k, v, num_features=4, sinks=-1, causal=True)
