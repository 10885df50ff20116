"""Cache policies' per-key scores and grouped-query attention in the KV-cache setting, for every policy that
declares ``score`` (those registered later included): a whole-context budget is exact, ``grouping="kv-head"``
keeps one set of at most b tokens per KV head from the group's mean score (kvpress), ``"query-head"`` is K/V
repeated by hand, and without grouping both are today's computation."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen, rope_stated
from approxlab.methods import available, get, register
from approxlab.cache._scores import scores_of

N, CONTEXT, HEADS, KV_HEADS = 40, 28, 6, 2
GROUP = HEADS // KV_HEADS
SCORED = [name for name in available() if get(name).score is not None]
UNIFORM = [name for name in SCORED if get(name).allocation == "uniform"]  # b tokens per head (AdaKV's: its test file)
SNAPKV_OPTIONS = {"window": 6, "kernel_size": 3}  # a window below the budgets, so the votes decide
OPTIONS = {"snapkv": SNAPKV_OPTIONS, "ada-snapkv": SNAPKV_OPTIONS, "pyramidkv": SNAPKV_OPTIONS}


def _options(name):
    """The policy's options, with a fresh generator of one seed for a randomized one (the same draw each call), and
    ``rope_frequencies=None`` for a RoPE-aware one (synthetic keys carry no RoPE)."""
    return {**OPTIONS.get(name, {}), **rope_stated(name), **({"generator": gen(7)} if get(name).randomized else {})}


def _grouped(seed=0, batch=(2,), scale=1.5):
    g = gen(seed)
    q = scale * torch.randn(*batch, HEADS, N, 6, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*batch, KV_HEADS, N, 6, generator=g, dtype=torch.float64)
    return q, k, torch.randn(*batch, KV_HEADS, N, 5, generator=g, dtype=torch.float64)


def _repeat(x):
    return x.repeat_interleave(GROUP, dim=-3)  # query head h reads KV head h // g (transformers' repeat_kv)


def _kept_by_head(result):
    """``info["kept"]`` as ``(*batch, heads, n_c)`` bool: indices (uniform) or AdaKV's mask as it is."""
    kept = result.info["kept"]
    if kept.dtype == torch.bool:
        return kept
    return torch.zeros(*kept.shape[:-1], CONTEXT, dtype=torch.bool).scatter_(-1, kept, True)


def _context_columns(result):
    """Per query head, the context columns its continuation rows attend: ``(*batch, H, n_c)`` bool."""
    return (result.matrix()[..., :CONTEXT] != 0).any(-2)


def test_the_builtin_policies_declare_scores():
    assert {"streaming-llm", "h2o", "snapkv"} <= set(SCORED)


@pytest.mark.parametrize("name", SCORED)
@pytest.mark.parametrize("grouping", ["kv-head", "query-head"])
def test_a_budget_covering_the_context_is_exact_causal_attention(name, grouping):
    q, k, v = _grouped(seed=1)
    exact = approxlab.exact_attention(q, _repeat(k), _repeat(v), causal=True)[..., CONTEXT:, :]
    result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=CONTEXT,
                                          grouping=grouping, **_options(name))
    assert float((result.output - exact).abs().max()) <= 1e-12, name


@pytest.mark.parametrize("name", UNIFORM)
@pytest.mark.parametrize("budget", [3, 9])
def test_kv_head_grouping_keeps_one_set_per_kv_head_from_the_groups_mean_score(name, budget):
    q, k, v = _grouped(seed=2)
    options = _options(name)
    result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=budget, **options)
    kept = result.info["kept"]
    assert kept.shape == (2, KV_HEADS, budget)
    assert all(len(set(row)) == budget for row in kept.flatten(0, -2).tolist())  # b distinct tokens per KV head
    attended = _context_columns(result)  # every query head of a group attends its KV head's set, nothing else
    by_kv_head = torch.zeros(2, KV_HEADS, CONTEXT, dtype=torch.bool).scatter_(-1, kept, True)
    assert torch.equal(attended, _repeat(by_kv_head.unsqueeze(-1)).squeeze(-1))
    assert int(attended.unflatten(-2, (KV_HEADS, GROUP)).any(-2).sum(-1).max()) <= budget
    # the set is the top b of the mean over the group of each query head's score (kvpress's pooling)
    context = slice(0, CONTEXT)
    scores = scores_of(name, get(name).score, q[..., context, :], _repeat(k)[..., context, :],
                       _repeat(v)[..., context, :], budget=budget, **_options(name))
    mean = scores.view(2, KV_HEADS, GROUP, CONTEXT).mean(2)
    assert torch.equal(kept.sort(-1).values, mean.topk(budget, dim=-1).indices.sort(-1).values)


@pytest.mark.parametrize("name", SCORED)
def test_query_head_grouping_is_kv_repeated_by_hand(name):
    q, k, v = _grouped(seed=3)
    options = _options(name)
    grouped = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=7,
                                           grouping="query-head", **options)
    with pytest.warns(approxlab.errors.RepeatedKVWarning):  # a set per query head, as asked, with its warning
        by_hand = approxlab.kv_cache_attention(name, q, _repeat(k), _repeat(v), context_length=CONTEXT,
                                               num_features=7, **_options(name))
    assert torch.equal(grouped.output, by_hand.output) and torch.equal(grouped.info["kept"], by_hand.info["kept"])
    assert torch.equal(grouped.matrix(), by_hand.matrix())
    assert _kept_by_head(grouped).shape == (2, HEADS, CONTEXT) and int(_kept_by_head(grouped).sum()) == 2 * HEADS * 7


@pytest.mark.parametrize("name", UNIFORM)
def test_without_grouping_both_forms_are_the_compression_step(name):
    g = gen(4)
    q, k = (1.5 * torch.randn(2, 3, N, 6, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, N, 5, generator=g, dtype=torch.float64)
    options = _options(name)
    results = [approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=7,
                                            grouping=grouping, **_options(name)) for grouping in ("kv-head", "query-head")]
    context = slice(0, CONTEXT)
    kept = get(name).compress(q[..., context, :], k[..., context, :], v[..., context, :], budget=7, **_options(name))
    for result in results:
        assert torch.equal(result.info["kept"], kept)
    assert torch.equal(results[0].output, results[1].output)


def test_padding_with_grouping_is_never_kept():
    q, k, v = _grouped(seed=5)
    mask = torch.ones(2, 1, N, dtype=torch.bool)
    mask[0, 0, :5] = False
    for name in SCORED:
        result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=8, key_mask=mask,
                                              **_options(name))
        assert not bool((_kept_by_head(result) & ~mask[..., :CONTEXT]).any()), name
        assert float(result.matrix()[0, ..., :5].abs().max()) == 0, name


def _key_norm(q, k, v, *, generator=None, key_mask=None):
    """kvpress's KnormPress: keys of small norm are kept."""
    scores = -k.norm(dim=-1).expand(*q.shape[:-2], k.shape[-2])
    return scores if key_mask is None else scores.masked_fill(~key_mask, -math.inf)


def _never(q, k, v, *, num_features, generator=None, causal=True):
    raise AssertionError("the KV-cache setting runs the policy's compression step only")


def test_a_registered_score_derives_its_compression_step_and_groups(fresh_registry):
    register("key-norm", _never, target="softmax", features="kept keys", randomized=False, causal="only",
             score=_key_norm)
    q, k, v = _grouped(seed=6)
    assert "key-norm" in [name for name in available() if get(name).score is not None]
    context = slice(0, CONTEXT)
    kept = get("key-norm").compress(k[..., context, :], k[..., context, :], v[..., context, :], budget=5)
    assert torch.equal(kept, (-k[..., context, :].norm(dim=-1)).topk(5, dim=-1).indices)
    result = approxlab.kv_cache_attention("key-norm", q, k, v, context_length=CONTEXT, num_features=5)
    assert torch.equal(result.info["kept"], kept)  # the group's heads agree: their mean is each head's score
    with pytest.raises(TypeError, match=r"`window` is not an option of the compression step of method 'key-norm'; "
                                        r"its options are \[\]"):
        approxlab.kv_cache_attention("key-norm", q, k, v, context_length=CONTEXT, num_features=5, window=3)


def test_a_policy_with_only_a_compression_step_groups_per_query_head(fresh_registry):
    def first(q, k, v, *, budget, generator=None):
        return torch.arange(budget).expand(*q.shape[:-2], budget)

    register("first-tokens", _never, target="softmax", features="x", randomized=False, causal="only", compress=first)
    q, k, v = _grouped(seed=7)
    with pytest.raises(ValueError, match=r"method 'first-tokens' declares a compression step but no per-key scores.*"
                                         r"6 query heads, 2 KV heads.*register the policy with score=, or pass "
                                         r"grouping='query-head'"):
        approxlab.kv_cache_attention("first-tokens", q, k, v, context_length=CONTEXT, num_features=5)
    result = approxlab.kv_cache_attention("first-tokens", q, k, v, context_length=CONTEXT, num_features=5,
                                          grouping="query-head")
    assert result.info["kept"].shape == (2, HEADS, 5)


def test_scores_and_grouping_are_validated(fresh_registry):
    q, k, v = _grouped(seed=8)
    with pytest.raises(ValueError, match=r"`grouping` must be one of \['kv-head', 'query-head'\]"):
        approxlab.kv_cache_attention("h2o", q, k, v, context_length=CONTEXT, num_features=5, grouping="head")
    with pytest.raises(ValueError, match=r"H a multiple of H_kv; got H = 6 query heads and H_kv = 4 KV heads"):
        approxlab.kv_cache_attention("h2o", q, torch.cat([k, k], -3), torch.cat([v, v], -3), context_length=CONTEXT,
                                     num_features=5)
    bad = {"nan": lambda q, k, v, **_: torch.full(k.shape[:-1], math.nan, dtype=k.dtype),
           "all-inf": lambda q, k, v, **_: torch.full(k.shape[:-1], math.inf, dtype=k.dtype),
           "shape": lambda q, k, v, **_: torch.zeros(k.shape[:-1] + (2,), dtype=k.dtype),
           "ints": lambda q, k, v, **_: torch.zeros(k.shape[:-1], dtype=torch.long)}
    for name, score in bad.items():
        register(name, _never, target="softmax", features="x", randomized=False, causal="only", score=score)
    messages = {"nan": "returned NaN scores", "all-inf": r"more context tokens than the budget allows: 28 > "
                "num_features = 5", "shape": r"must return scores of shape \(\*batch, n_c\) = \(2, 6, 28\)",
                "ints": "must return floating scores"}
    for name, message in messages.items():
        for grouping in ("kv-head", "query-head"):
            with pytest.raises((TypeError, ValueError), match=message):
                approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=5, grouping=grouping)
    with pytest.raises(ValueError, match="`score` is a step of the KV-cache setting, which is causal"):
        register("bidirectional", _never, target="softmax", features="x", randomized=False, score=_key_norm)
    with pytest.raises(TypeError, match="must accept score"):
        register("bad-score", _never, target="softmax", features="x", randomized=False, causal="only",
                 score=lambda q, k: None)
