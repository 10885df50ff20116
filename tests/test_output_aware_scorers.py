"""The output-aware cache policies: CriticalKV against kvpress's ``CriticalKVPress``, CAOTE against its equation.

``kvpress_criticalkv`` re-derives ``CriticalKVPress.score`` and ``vwl1norm`` (NVIDIA/kvpress at commit 8bb29b9,
``kvpress/presses/criticalkv_press.py``) in float64 on kvpress's layout, from the code as read, over the base
presses' scores re-derived in ``test_kv_scorers.py``. CAOTE has no public code; its score is checked against the
output change recomputed by brute force (evict one token, renormalise, compare the outputs).
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.methods.caote import caote_scores, eviction_errors
from approxlab.methods.criticalkv import criticalkv_scores
from _helpers import gen, tiny_llama
from test_kv_scorers import (B, GROUP, H, H_KV, S, _layer, causal_attention, kvpress_knorm, kvpress_observed_attention,
                             kvpress_tova, repeat_kv)

D_MODEL = 12


def kvpress_vwl1norm(values, Wo):
    """``CriticalKVPress.vwl1norm``: ``Wo`` (H, head_dim, hidden) is ``o_proj.weight.T.view(...)``; per query head
    ``|V_h Wo_h|_1`` over the hidden dimension, then the mean over each group of query heads."""
    V = repeat_kv(values)
    norms = torch.stack([(V[:, h] @ Wo[h].unsqueeze(0)).abs().sum(-1) for h in range(V.shape[1])], dim=1)
    return norms.view(B, H_KV, GROUP, -1).mean(dim=2)


def kvpress_criticalkv(scores, values, Wo, kept, first_stage_ratio=0.5, epsilon=1e-4):
    """``CriticalKVPress.score`` with ``(1 - compression_ratio) * k_len`` = ``kept`` tokens."""
    selection_budget = int(kept * first_stage_ratio)
    top_k_index = torch.topk(scores, selection_budget, sorted=True, dim=-1).indices
    scores = (scores + epsilon) * kvpress_vwl1norm(values, Wo)
    return scores.scatter(-1, top_k_index, torch.finfo(scores.dtype).max)


def _projection(seed):
    return torch.randn(H, 8, D_MODEL, generator=gen(100 + seed), dtype=torch.float64)


def _ours(base, queries, keys, values, Wo, budget, **options):
    scores = criticalkv_scores(queries, repeat_kv(keys), repeat_kv(values), budget=budget, base=base,
                               output_projection=Wo, **options)
    return scores.view(B, H_KV, GROUP, -1).mean(2)  # the framework's pooling


def _same_kept(ours, theirs, budget):
    kept = ours.topk(budget, dim=-1).indices.sort(-1).values
    return torch.equal(kept, theirs.topk(budget, dim=-1).indices.sort(-1).values)


def _kvpress_base(base, queries, keys):
    """kvpress's scores of the base press and the options that make approxlab's base score the same."""
    if base == "knorm":
        return kvpress_knorm(keys), {}
    attentions = causal_attention(queries, repeat_kv(keys))
    if base == "observed-attention":
        return kvpress_observed_attention(attentions, keys), {}
    # TOVA as kvpress scores it: the layer's mean of the last row, the last token max + 1
    return kvpress_tova(attentions, keys), {"base_options": {"average_heads": True}}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("base", ["knorm", "observed-attention", "tova"])
def test_criticalkv_with_kvpress_grouping_matches_kvpress(seed, base):
    queries, keys, values = _layer(seed)
    Wo = _projection(seed)
    base_scores, options = _kvpress_base(base, queries, keys)
    for budget in (2, 5, 12, 20, 39):
        theirs = kvpress_criticalkv(base_scores, values, Wo, budget)
        ours = _ours(base, queries, keys, values, Wo, budget, group_size=GROUP, **options)
        assert _same_kept(ours, theirs, budget), budget
        second = (theirs < torch.finfo(theirs.dtype).max) & torch.isfinite(ours)  # kvpress's second stage
        assert float((ours[second] - theirs[second]).abs().max()) < 1e-13


def test_criticalkv_per_head_differs_from_kvpress_under_grouping_only():
    queries, keys, values = _layer(7)
    Wo = _projection(7)
    base_scores, _ = _kvpress_base("observed-attention", queries, keys)
    differs = 0
    for budget in range(2, 40):
        theirs = kvpress_criticalkv(base_scores, values, Wo, budget)
        differs += not _same_kept(_ours("observed-attention", queries, keys, values, Wo, budget), theirs, budget)
    assert differs > 0  # the per-head default averages each head's two stages: other sets under grouping
    single = criticalkv_scores(queries[:, :1], keys[:, :1], values[:, :1], budget=9, base="knorm",
                               output_projection=Wo[:1])  # one head: the two rules are one
    assert torch.equal(single, criticalkv_scores(queries[:, :1], keys[:, :1], values[:, :1], budget=9, base="knorm",
                                                 output_projection=Wo[:1], group_size=1))


def test_criticalkv_first_stage_is_the_base_top_and_the_rest_the_weighted_scores():
    q, k, v = (torch.randn(2, 30, 8, generator=gen(s), dtype=torch.float64) for s in range(3))
    for ratio in (0.0, 0.5, 1.0):
        scores = criticalkv_scores(q, k, v, budget=10, base="knorm", first_stage_ratio=ratio)
        first = (-k.norm(dim=-1)).topk(int(10 * ratio)).indices
        weighted = (-k.norm(dim=-1) + 1e-4) * v.abs().sum(-1)  # no projection: W_O = I
        top = scores.topk(10).indices
        assert torch.equal(top[:, :int(10 * ratio)].sort(-1).values, first.sort(-1).values)
        rest = weighted.scatter(-1, first, -math.inf).topk(10 - int(10 * ratio)).indices
        assert torch.equal(top[:, int(10 * ratio):].sort(-1).values, rest.sort(-1).values)


def test_criticalkv_refuses_bad_options_by_name():
    q, k, v = (torch.randn(2, 12, 8, generator=gen(s), dtype=torch.float64) for s in range(3))
    with pytest.raises(ValueError, match=r"`base` must be a policy with per-key scores .*got 'topk'"):
        criticalkv_scores(q, k, v, base="topk")
    with pytest.raises(TypeError, match="`base_options` must be a dict"):
        criticalkv_scores(q, k, v, base_options=[("window", 4)])
    with pytest.raises(ValueError, match=r"`first_stage_ratio` must be in \[0, 1\]; got 1.5"):
        criticalkv_scores(q, k, v, first_stage_ratio=1.5)
    with pytest.raises(ValueError, match="`group_size` needs the layer's heads .* group_size=3"):
        criticalkv_scores(q, k, v, group_size=3)
    with pytest.raises(ValueError, match=r"`output_projection` must be \(\.\.\., p_v, d\) with p_v = 8"):
        criticalkv_scores(q, k, v, output_projection=torch.ones(4, 5, dtype=torch.float64))


def test_patch_attention_supplies_each_layers_output_projection():
    model = tiny_llama(64, 2)
    ids = torch.randint(0, 64, (1, 30), generator=gen(5))
    with torch.no_grad(), approxlab.patch_attention(model, "criticalkv", num_features=6, context_length=20,
                                                    base="knorm") as patch:
        supplied = model(ids).logits
    assert patch.supplied == ("output_projection",) and sorted(patch.layer_options) == [0, 1]
    for layer in (0, 1):
        weight = model.model.layers[layer].self_attn.o_proj.weight  # (hidden 32, 4 heads x 8)
        assert torch.equal(patch.layer_options[layer]["output_projection"], weight.T.reshape(4, 8, 32))
    with torch.no_grad(), approxlab.patch_attention(model, "criticalkv", num_features=6, context_length=20,
                                                    base="knorm", output_projection=None) as identity:
        unprojected = model(ids).logits
    assert identity.supplied == () and identity.layer_options == {}
    assert not torch.allclose(supplied, unprojected)  # the projection changes the kept sets


@pytest.mark.parametrize("seed", range(3))
def test_caote_is_the_output_change_of_evicting_one_token(seed):
    q, k, v = (torch.randn(3, 25, 8, generator=gen(10 * seed + s), dtype=torch.float64) for s in range(3))
    scores = caote_scores(q, k, v)
    last = q[:, -1:, :]
    full = approxlab.exact_attention(last, k, v)  # the last query sees every context key
    for j in range(24):
        others = [i for i in range(25) if i != j]
        evicted = approxlab.exact_attention(last, k[:, others], v[:, others])
        assert torch.allclose(scores[:, j], (full - evicted).norm(dim=-1).squeeze(-1), rtol=1e-10, atol=1e-14)
    assert torch.isinf(scores[:, -1]).all()


def test_caote_with_a_window_is_the_change_of_the_mean_output():
    q, k, v = (torch.randn(2, 20, 8, generator=gen(40 + s), dtype=torch.float64) for s in range(3))
    window = 5
    attention = causal_attention(q.unsqueeze(0), k.unsqueeze(0)).squeeze(0)[:, -window:]  # (2, w, 20)
    alpha = attention.mean(-2)
    output = alpha.unsqueeze(-2) @ v
    scores = caote_scores(q, k, v, window=window)
    for j in range(20 - window):
        renormalised = alpha.clone()
        renormalised[:, j] = 0
        renormalised = renormalised / renormalised.sum(-1, keepdim=True)
        change = (output - renormalised.unsqueeze(-2) @ v).norm(dim=-1).squeeze(-1)
        assert torch.allclose(scores[:, j], change, rtol=1e-10, atol=1e-14)
    assert torch.isinf(scores[:, -window:]).all()


def test_caote_with_padding_scores_the_sequence_without_it():
    q, k, v = (torch.randn(1, 30, 8, generator=gen(60 + s), dtype=torch.float64) for s in range(3))
    mask = torch.ones(1, 30, dtype=torch.bool)
    mask[:, :4], mask[:, 26:] = False, False
    padded = caote_scores(q, k, v, key_mask=mask, window=3)
    alone = caote_scores(q[:, 4:26], k[:, 4:26], v[:, 4:26], window=3)
    assert torch.allclose(padded[:, 4:26], alone, rtol=1e-12, atol=0)
    assert (padded[~mask] == -math.inf).all()


def test_eviction_errors_score_one_token_holding_all_attention_highest():
    weights = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    v = torch.eye(3, dtype=torch.float64)
    errors = eviction_errors(weights, v)
    assert torch.isfinite(errors).all() and errors.argmax() == 0 and (errors[1:] == 0).all()


def test_caote_and_criticalkv_in_the_kv_cache_setting_keep_their_budget_per_kv_head():
    g = gen(3)
    q = torch.randn(1, H, S, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, H_KV, S, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for method in ("caote", "criticalkv"):
        result = approxlab.kv_cache_attention(method, q, k, v, context_length=30, num_features=7)
        assert result.info["kept"].shape == (1, H_KV, 7)
        full = approxlab.kv_cache_attention(method, q, k, v, context_length=30, num_features=30)
        exact = approxlab.exact_attention(q, repeat_kv(k), repeat_kv(v), causal=True)[..., 30:, :]
        assert float((full.output - exact).abs().max()) < 1e-12


def test_the_decoder_bench_and_perplexity_grids_list_them():
    from approxlab.studies.bench import causal as bench_causal, grid as bench_grid
    from approxlab.studies.decoder import grid as decoder_grid
    from approxlab.studies.perplexity import grid as perplexity_grid

    new = {"criticalkv", "caote"}
    assert new <= set(decoder_grid.METHODS) and new <= set(bench_grid.FULL_GRID["patch_methods"])
    assert {("kv-cache", m) for m in new} <= set(bench_causal.policies())
    assert new <= set(perplexity_grid.METHODS) and new <= set(perplexity_grid.FULL_GRID["methods"])
