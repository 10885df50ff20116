"""Adaptive cache budgets wired end to end: ``allocation="adakv"`` in the KV-cache setting and the cache policies'
causal form (any policy with ``score``), ``layer_budgets="pyramid"`` in patched models, and the built-ins
``ada-snapkv`` and ``pyramidkv``, on SmolLM2's grouping (9 query heads on 3 KV heads)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

import approxlab
from _helpers import gen, rope_stated
from approxlab.cache import adakv_keep, pyramid_budgets
from approxlab.methods import available, get, register
from approxlab.cache._scores import pool_group, scores_of

N, CONTEXT, HEADS, KV_HEADS, P = 40, 28, 9, 3, 6  # SmolLM2's 9 query heads on 3 KV heads
GROUP = HEADS // KV_HEADS
SCORED = [name for name in available() if get(name).score is not None]
SNAPKV_OPTIONS = {"window": 4, "kernel_size": 3}
OPTIONS = {"snapkv": SNAPKV_OPTIONS, "ada-snapkv": SNAPKV_OPTIONS, "pyramidkv": SNAPKV_OPTIONS}


def _options(name):
    return {**OPTIONS.get(name, {}), **({"generator": gen(7)} if get(name).randomized else {}), **rope_stated(name)}


def _smollm2_shaped(seed=0, batch=(2,)):
    g = gen(seed)
    q = 2.0 * torch.randn(*batch, HEADS, N, P, generator=g, dtype=torch.float64)
    k = 2.0 * torch.randn(*batch, KV_HEADS, N, P, generator=g, dtype=torch.float64)
    return q, k, torch.randn(*batch, KV_HEADS, N, 5, generator=g, dtype=torch.float64)


def _repeat(x):
    return x.repeat_interleave(GROUP, dim=-3)


def _masked_reference(q, k, v, keep):
    """The continuation rows by a dense masked softmax: each query head sees its KV head's kept context tokens
    (``keep`` ``(*batch, H_kv, n_c)``) and the continuation causally."""
    k, v = _repeat(k), _repeat(v)
    logits = q[..., CONTEXT:, :] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    rows = torch.arange(CONTEXT, N).unsqueeze(-1)
    visible = torch.cat([_repeat(keep.unsqueeze(-1)).squeeze(-1).unsqueeze(-2).expand(*keep.shape[:-2], HEADS,
                                                                                       N - CONTEXT, CONTEXT),
                         (torch.arange(CONTEXT, N) <= rows).expand(*keep.shape[:-2], HEADS, N - CONTEXT,
                                                                   N - CONTEXT)], dim=-1)
    return torch.softmax(logits.masked_fill(~visible, -math.inf), dim=-1) @ v


def _kvpress_adakv(scores, n_kept, alpha_safeguard=0.2):
    """A re-derivation of kvpress's ``AdaKVPress.compress`` (commit 8bb29b9) on ``(bsz, H_kv, k_len)`` scores: the
    top ``int(n_kept * alpha)`` of each head raised to the dtype's max, then the bottom ``H_kv * (k_len - n_kept)``
    of the flattened scores pruned; returns the kept set ``(bsz, H_kv, k_len)`` bool."""
    bsz, heads, k_len = scores.shape
    scores = scores.clone()
    n_safe = int(n_kept * alpha_safeguard)
    scores.scatter_(-1, torch.topk(scores, n_safe, dim=-1).indices, torch.finfo(scores.dtype).max)
    n_pruned = heads * (k_len - n_kept)
    pruned = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices
    keep = torch.ones(bsz, heads * k_len, dtype=torch.bool)
    keep[torch.arange(bsz).repeat_interleave(n_pruned), pruned.flatten()] = False
    return keep.view(bsz, heads, k_len)


def test_the_builtins_are_registered_with_their_schedules():
    assert {"ada-snapkv", "pyramidkv"} <= set(approxlab.methods.causal_support("only"))
    assert (get("ada-snapkv").allocation, get("ada-snapkv").layer_budgets) == ("adakv", "uniform")
    assert (get("pyramidkv").allocation, get("pyramidkv").layer_budgets) == ("uniform", "pyramid")
    assert get("ada-snapkv").score is get("snapkv").score is get("pyramidkv").score


@pytest.mark.parametrize("name", SCORED)
@pytest.mark.parametrize("budget", [4, 10])
def test_adakv_keeps_h_kv_times_b_per_layer_for_every_scored_policy(name, budget):
    q, k, v = _smollm2_shaped(seed=1)
    result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=budget,
                                          allocation="adakv", **_options(name))
    keep = result.info["kept"]
    assert keep.dtype == torch.bool and keep.shape == (2, KV_HEADS, CONTEXT)
    assert keep.sum((-1, -2)).tolist() == [KV_HEADS * budget] * 2  # the layer's total: b per KV head on average
    assert int(keep.sum(-1).min()) >= int(0.2 * budget)  # the safeguard
    torch.testing.assert_close(result.output, _masked_reference(q, k, v, keep), rtol=0, atol=1e-12)
    torch.testing.assert_close(result.matrix()[..., CONTEXT:].sum(-1) + result.matrix()[..., :CONTEXT].sum(-1),
                               torch.ones(2, HEADS, N - CONTEXT, dtype=torch.float64), rtol=0, atol=1e-12)
    attended = (result.matrix()[..., :CONTEXT] != 0).any(-2)
    assert not bool((attended & ~_repeat(keep.unsqueeze(-1)).squeeze(-1)).any())  # nothing outside the kept set


def test_adakv_gives_heads_different_counts_and_equals_kvpress_on_the_pooled_scores():
    q, k, v = _smollm2_shaped(seed=2)
    budget = 8
    result = approxlab.kv_cache_attention("ada-snapkv", q, k, v, context_length=CONTEXT, num_features=budget,
                                          **SNAPKV_OPTIONS)
    keep = result.info["kept"]
    assert len(set(keep.sum(-1).flatten().tolist())) > 1  # the heads' shares differ
    context = slice(0, CONTEXT)
    scores = scores_of("snapkv", get("snapkv").score, q[..., context, :], _repeat(k)[..., context, :],
                       _repeat(v)[..., context, :], budget=budget, **SNAPKV_OPTIONS)
    pooled = pool_group(scores, GROUP)
    # kvpress pads SnapKV's window with max + 1 (finite): the same ranking as +inf here
    finite = pooled.masked_fill(pooled == math.inf, float(pooled[pooled < math.inf].max()) + 1)
    assert torch.equal(keep, _kvpress_adakv(finite, budget))
    same = approxlab.kv_cache_attention("snapkv", q, k, v, context_length=CONTEXT, num_features=budget,
                                        allocation="adakv", **SNAPKV_OPTIONS)
    assert torch.equal(same.output, result.output)  # ada-snapkv is snapkv with allocation="adakv"


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 1.0])
def test_adakv_keeps_kvpress_sets_on_random_scores(seed, alpha):
    scales = torch.tensor([[0.1], [1.0], [3.0]])  # heads on different scales: their shares differ
    scores = torch.randn(3, KV_HEADS, 50, generator=gen(seed), dtype=torch.float64) * scales
    for budget in (1, 7, 25, 50):
        assert torch.equal(adakv_keep(scores, budget, alpha_safeguard=alpha), _kvpress_adakv(scores, budget, alpha))


@pytest.mark.parametrize("grouping", ["kv-head", "query-head"])
def test_adakv_with_a_budget_covering_the_context_is_exact(grouping):
    q, k, v = _smollm2_shaped(seed=3)
    exact = approxlab.exact_attention(q, _repeat(k), _repeat(v), causal=True)
    result = approxlab.kv_cache_attention("ada-snapkv", q, k, v, context_length=CONTEXT, num_features=CONTEXT,
                                          grouping=grouping, **SNAPKV_OPTIONS)
    assert float((result.output - exact[..., CONTEXT:, :]).abs().max()) <= 1e-12
    causal = approxlab.approximate("ada-snapkv", q, _repeat(k), _repeat(v), num_features=CONTEXT,
                                   prompt_length=CONTEXT, causal=True, **SNAPKV_OPTIONS)
    assert float((causal.output - exact).abs().max()) <= 1e-12


def test_adakv_causal_form_is_the_kv_cache_setting_per_query_head():
    q, k, v = _smollm2_shaped(seed=4)
    k, v = _repeat(k), _repeat(v)
    mask = torch.ones(2, 1, N, dtype=torch.bool)
    mask[1, 0, 3:6] = False
    causal = approxlab.approximate("ada-snapkv", q, k, v, num_features=6, prompt_length=CONTEXT, causal=True,
                                   key_mask=mask, alpha_safeguard=0.5, **SNAPKV_OPTIONS)
    cached = approxlab.kv_cache_attention("ada-snapkv", q, k, v, context_length=CONTEXT, num_features=6,
                                          key_mask=mask, alpha_safeguard=0.5, grouping="query-head", **SNAPKV_OPTIONS)
    assert torch.equal(causal.info["kept"], cached.info["kept"])
    assert int(cached.info["kept"].sum(-1).min()) >= 3 and not bool(cached.info["kept"][1, :, 3:6].any())
    torch.testing.assert_close(causal.output[..., CONTEXT:, :], cached.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(causal.matrix()[..., CONTEXT:, :], cached.matrix(), rtol=0, atol=1e-12)
    logits = q[..., :CONTEXT, :] @ k[..., :CONTEXT, :].transpose(-1, -2) / math.sqrt(P)  # the prompt: exact
    visible = (torch.arange(CONTEXT) <= torch.arange(CONTEXT).unsqueeze(-1)) & mask[..., None, :CONTEXT]
    prompt = torch.softmax(logits.masked_fill(~visible, -math.inf), dim=-1) @ v[..., :CONTEXT, :]
    torch.testing.assert_close(causal.output[..., :CONTEXT, :], prompt, rtol=0, atol=1e-12)


def test_streaming_llm_scores_agree_across_heads_so_adakv_is_uniform():
    q, k, v = _smollm2_shaped(seed=5)
    uniform = approxlab.kv_cache_attention("streaming-llm", q, k, v, context_length=CONTEXT, num_features=8)
    adaptive = approxlab.kv_cache_attention("streaming-llm", q, k, v, context_length=CONTEXT, num_features=8,
                                            allocation="adakv")
    assert adaptive.info["kept"].sum(-1).unique().tolist() == [8]
    torch.testing.assert_close(adaptive.output, uniform.output, rtol=0, atol=1e-12)


def _one_line(error):
    assert "\n" not in str(error.value)


def test_bad_allocations_are_refused_in_one_line(fresh_registry):
    q, k, v = _smollm2_shaped(seed=6)
    run = lambda name, **kw: approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT,  # noqa: E731
                                                          num_features=4, **kw)
    with pytest.raises(ValueError, match=r"`allocation` must be one of \['adakv', 'uniform'\]; got 'ada'") as error:
        run("snapkv", allocation="ada")
    _one_line(error)
    with pytest.raises(ValueError, match=r"`allocation` 'adakv' .* method 'topk' declares none: allowed for it is "
                                         r"'uniform' .*; got allocation='adakv'") as error:
        run("topk", allocation="adakv")
    _one_line(error)

    def first(q, k, v, *, budget, generator=None):
        return torch.arange(budget).expand(*q.shape[:-2], budget)

    register("first-tokens", lambda q, k, v, *, num_features, generator=None, causal=True: v, target="softmax",
             features="x", randomized=False, causal="only", compress=first)
    with pytest.raises(ValueError, match=r"method 'first-tokens' declares none.*got allocation='adakv'") as error:
        run("first-tokens", allocation="adakv", grouping="query-head")
    _one_line(error)
    with pytest.raises(ValueError, match=r"`alpha_safeguard` is AdaKV's per-head minimum, allowed with "
                                         r"allocation='adakv' only; got alpha_safeguard=0.3 with "
                                         r"allocation='uniform'") as error:
        run("snapkv", alpha_safeguard=0.3)
    _one_line(error)
    with pytest.raises(ValueError, match=r"`alpha_safeguard` must be a fraction in \[0, 1\]; got 1.5"):
        run("ada-snapkv", alpha_safeguard=1.5)
    with pytest.raises(ValueError, match=r"dimension -3 of q .*got q of shape \(40, 6\) and allocation='adakv'"):
        approxlab.kv_cache_attention("ada-snapkv", q[0, 0], k[0, 0], v[0, 0], context_length=CONTEXT, num_features=4)
    with pytest.raises(ValueError, match=r"`allocation` 'adakv' spreads a budget by per-key scores: it needs score=; "
                                         r"allowed without one is 'uniform'; got allocation='adakv' and no score"):
        register("ada-first", lambda q, k, v, *, num_features, generator=None, causal=True: v, target="softmax",
                 features="x", randomized=False, causal="only", compress=first, allocation="adakv")
    with pytest.raises(ValueError, match=r"`layer_budgets` must be one of \['pyramid', 'uniform'\]; got 'linear'"):
        register("pyramid-knorm", lambda q, k, v, *, num_features, generator=None, causal=True: v, target="softmax",
                 features="x", randomized=False, causal="only", score=get("knorm").score, layer_budgets="linear")


# --- PyramidKV's layer schedule in a patched model -------------------------------------------------------------

LAYERS, SEQ = 4, 32


@pytest.fixture(scope="module")
def smollm2_shaped_model():
    torch.manual_seed(0)  # transformers initialises from the global stream; restored below
    state = torch.random.get_rng_state()
    config = LlamaConfig(vocab_size=128, hidden_size=36, intermediate_size=48, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64)
    model = LlamaModel(config).eval()
    torch.random.set_rng_state(state)
    ids = torch.randint(128, (2, SEQ), generator=gen(0))
    return model, ids


def _run(model, ids, method, **kwargs):
    with torch.no_grad(), approxlab.patch_attention(model, method, context_length=24, **kwargs) as patch:
        model(input_ids=ids)
    return patch


def test_pyramidkv_keeps_each_layers_budget_per_kv_head(smollm2_shaped_model):
    model, ids = smollm2_shaped_model
    patch = _run(model, ids, "pyramidkv", num_features=8, window=2, kernel_size=3)
    expected = pyramid_budgets(LAYERS, 8, context_length=24, window=2)
    assert patch.layer_budgets == "pyramid" and patch.budgets == dict(enumerate(expected))
    assert sum(expected) == LAYERS * 8 and expected == sorted(expected, reverse=True) and expected[0] > expected[-1]
    for call in patch.calls:
        kept = call.info["kept"]  # (S, H_kv, b_l): b_l distinct tokens per KV head, its window among them
        assert kept.shape == (2, KV_HEADS, expected[call.layer])
        assert all(len(set(row)) == expected[call.layer] for row in kept.flatten(0, -2).tolist())
        assert bool((kept >= 22).sum(-1).eq(2).all())  # the observation window of 2 at every layer
    uniform = _run(model, ids, "pyramidkv", num_features=8, window=2, kernel_size=3, layer_budgets="uniform")
    assert uniform.budgets == dict.fromkeys(range(LAYERS), 8)


def test_pyramid_and_adakv_compose_and_a_whole_context_budget_is_exact(smollm2_shaped_model):
    model, ids = smollm2_shaped_model
    patch = _run(model, ids, "snapkv", num_features=8, window=2, layer_budgets="pyramid", allocation="adakv",
                 pyramid_beta=4)
    expected = pyramid_budgets(LAYERS, 8, beta=4, context_length=24, window=2)
    assert patch.allocation == "adakv" and patch.alpha_safeguard == 0.2
    for call in patch.calls:
        assert call.info["kept"].sum((-1, -2)).tolist() == [KV_HEADS * expected[call.layer]] * 2
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
    full = _run(model, ids, "pyramidkv", num_features=24, record_inputs=False)
    assert set(full.budgets.values()) == {24}
    with torch.no_grad(), approxlab.patch_attention(model, "ada-snapkv", context_length=24, num_features=24):
        after = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_bad_layer_budgets_are_refused_in_one_line(smollm2_shaped_model):
    model, _ = smollm2_shaped_model
    cases = [
        (dict(num_features=8, layer_budgets="pyramid"), r"`layer_budgets` spreads the cache budget of the KV-cache "
                                                        r"setting: pass it with context_length; got "
                                                        r"layer_budgets='pyramid' without a context_length"),
        (dict(num_features=8, context_length=24, layer_budgets="steep"), r"`layer_budgets` must be one of "
                                                                         r"\['pyramid', 'uniform'\]; got 'steep'"),
        (dict(num_features=8, context_length=24, pyramid_beta=4), r"`pyramid_beta` shapes PyramidKV's schedule, "
                                                                  r"allowed with layer_budgets='pyramid' only"),
        (dict(num_features=8, context_length=24, layer_budgets="pyramid", pyramid_beta=0.5), r"`beta` must be >= 1"),
        (dict(num_features=8, context_length=24, allocation="adakv", method="topk"), r"method 'topk' declares none"),
        (dict(num_features=8, context_length=24, layer_budgets="pyramid", method="topk"),
         r"`layer_budgets` 'pyramid' .* method 'topk' compresses no cache .*got layer_budgets='pyramid'"),
    ]
    for kwargs, message in cases:
        method = kwargs.pop("method", "snapkv")
        with pytest.raises(ValueError, match=message) as error:
            approxlab.patch_attention(model, method, **kwargs)
        _one_line(error)


def test_pyramid_window_keeps_the_window_and_the_total():
    for layers, budget, window, context in [(30, 64, 32, 1024), (30, 256, 32, 1024), (4, 8, 2, 24), (7, 9, 9, 30)]:
        budgets = pyramid_budgets(layers, budget, window=window, context_length=context)
        assert sum(budgets) == layers * budget and min(budgets) >= window and max(budgets) <= context
    assert pyramid_budgets(3, 10, window=10) == [10, 10, 10]
    with pytest.raises(ValueError, match=r"`window` must be an integer with 0 <= window <= 10; got 11"):
        pyramid_budgets(3, 10, window=11)


def test_whole_windows_pass_alpha_safeguard_to_ada_snapkvs_causal_form(smollm2_shaped_model):
    model, ids = smollm2_shaped_model
    with torch.no_grad(), approxlab.patch_attention(model, "ada-snapkv", layers=[0], num_features=6, window=2,
                                                    alpha_safeguard=1.0) as patch:
        model(input_ids=ids)
    assert patch.options["alpha_safeguard"] == 1.0 and patch.allocation is None
    assert patch.calls[0].info["kept"].sum(-1).unique().tolist() == [6]  # alpha = 1: every head keeps b
