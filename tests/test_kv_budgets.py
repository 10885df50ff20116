"""Adaptive cache budgets: AdaKV across heads, PyramidKV across layers, sink + window composition."""

from __future__ import annotations

import pytest
import torch

import approxlab
from approxlab.cache import adakv_keep, attend_kept, compose_scores, pyramid_budgets, with_sink_and_window
from approxlab.synthetic import synthetic_qkv
from _helpers import gen


def _scores(seed, heads=8, length=100, batch=(3,)):
    """Attention-like scores: each head's softmax over its keys, heads with very different spreads."""
    logits = torch.randn(*batch, heads, length, generator=gen(seed), dtype=torch.float64)
    spread = torch.linspace(0.2, 4.0, heads, dtype=torch.float64).unsqueeze(-1)
    return torch.softmax(spread * logits, dim=-1)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("budget, alpha", [(10, 0.2), (25, 0.5), (7, 0.0), (40, 1.0)])
def test_adakv_keeps_h_times_b_and_respects_the_safeguard(seed, budget, alpha):
    scores = _scores(seed)
    keep = adakv_keep(scores, budget, alpha_safeguard=alpha)
    assert keep.shape == scores.shape
    assert torch.equal(keep.sum((-1, -2)), torch.full((3,), 8 * budget))
    assert bool((keep.sum(-1) >= int(alpha * budget)).all())
    # each head keeps its own best keys: a kept key outranks every dropped key of the same head
    kept_min = scores.masked_fill(~keep, float("inf")).amin(-1)
    dropped_max = scores.masked_fill(keep, float("-inf")).amax(-1)
    assert bool((kept_min >= dropped_max).all())


def test_adakv_gives_heads_different_counts_and_alpha_one_is_uniform():
    scores = _scores(0)
    counts = adakv_keep(scores, 10, alpha_safeguard=0.2).sum(-1)
    assert int(counts.max() - counts.min()) > 5
    assert torch.equal(adakv_keep(scores, 10, alpha_safeguard=1.0).sum(-1), torch.full((3, 8), 10))


def test_adakv_equals_uniform_allocation_when_heads_share_their_scores_up_to_a_shift():
    """Identical heads (a constant added per head does not change the ranking within a head, and with one
    shared distribution the layer's top H*b interleaves the heads evenly): every head keeps b keys, its top b."""
    row = torch.randn(60, generator=gen(3), dtype=torch.float64)
    scores = row.expand(4, 60).clone()
    keep = adakv_keep(scores, 12, alpha_safeguard=0.0)
    uniform = torch.zeros_like(keep).scatter(-1, scores.topk(12).indices, True)
    assert torch.equal(keep, uniform)
    shifted = scores + torch.tensor([[0.0], [1e-9], [2e-9], [3e-9]], dtype=torch.float64)  # ties broken per head
    assert torch.equal(adakv_keep(shifted, 12, alpha_safeguard=0.0).sum(-1), torch.full((4,), 12))


def test_adakv_forced_and_padded_keys():
    scores = _scores(1, heads=2, length=20, batch=())
    scores[0, 5] = float("inf")
    scores[1, 3:] = float("-inf")  # head 1 has 3 real keys
    keep = adakv_keep(scores, 6, alpha_safeguard=0.5)
    assert bool(keep[0, 5]) and not bool(keep[1, 3:].any())
    assert int(keep.sum()) == 12 and int(keep[1].sum()) == 3


def test_adakv_bad_input():
    with pytest.raises(ValueError, match=r"`alpha_safeguard` must be a fraction in \[0, 1\]; got 1.5"):
        adakv_keep(_scores(0), 5, alpha_safeguard=1.5)
    with pytest.raises(ValueError, match="`budget`"):
        adakv_keep(_scores(0), 101)


def test_a_budget_covering_the_context_is_exact_attention():
    q, k, v = synthetic_qkv((2, 3), 40, 8, generator=gen(4))
    exact = approxlab.exact_attention(q, k, v, causal=True)[..., 30:, :]
    keep = adakv_keep(torch.rand(2, 3, 30, generator=gen(5), dtype=torch.float64), 30)
    assert bool(keep.all())
    torch.testing.assert_close(attend_kept(q, k, v, keep, context_length=30), exact, rtol=1e-12, atol=1e-12)


def test_attend_kept_is_the_masked_dense_softmax_per_head():
    q, k, v = synthetic_qkv((2, 4), 32, 8, generator=gen(6))
    keep = adakv_keep(torch.rand(2, 4, 20, generator=gen(7), dtype=torch.float64), 5, alpha_safeguard=0.2)
    key_mask = torch.ones(2, 32, dtype=torch.bool)
    key_mask[1, :3] = False
    out = attend_kept(q, k, v, keep, context_length=20, key_mask=key_mask.unsqueeze(1))
    logits = q[..., 20:, :] @ k.transpose(-1, -2) / 8 ** 0.5
    visible = torch.cat([keep.unsqueeze(-2).expand(2, 4, 12, 20),
                         torch.ones(12, 12, dtype=torch.bool).tril().expand(2, 4, 12, 12)], dim=-1)
    visible = visible & key_mask[:, None, None, :]
    expected = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def _kvpress_budgets(num_layers, budget, beta, context_length):
    """kvpress PyramidKVPress.get_layer_budget (commit 8bb29b9), re-derived with window_size = 0 and
    q_len * (1 - compression_ratio) = budget: the unrounded per-layer values."""
    min_num = budget / beta
    max_num = budget * 2 - min_num
    if max_num >= context_length:
        max_num = context_length
        min_num = budget * 2 - max_num
    steps = (max_num - min_num) / (num_layers - 1)
    return [max_num - layer * steps for layer in range(num_layers)]


@pytest.mark.parametrize("num_layers, budget, beta, context", [(30, 64, 20, 4096), (32, 128, 20, 200),
                                                                (12, 7, 3.5, 100), (2, 10, 1, 10)])
def test_pyramid_budgets_sum_and_match_kvpress(num_layers, budget, beta, context):
    budgets = pyramid_budgets(num_layers, budget, beta=beta, context_length=context)
    assert sum(budgets) == num_layers * budget
    assert budgets == sorted(budgets, reverse=True)
    reference = _kvpress_budgets(num_layers, budget, beta, context)
    assert max(abs(a - b) for a, b in zip(budgets, reference)) < 1
    assert max(budgets) <= context


def test_pyramid_edges_and_errors():
    assert pyramid_budgets(1, 50) == [50]
    assert pyramid_budgets(5, 8, beta=1) == [8] * 5
    with pytest.raises(ValueError, match=r"`beta` must be >= 1"):
        pyramid_budgets(4, 10, beta=0.5)


def test_compose_scores_forces_sink_and_window_and_pads():
    scores = torch.arange(10, dtype=torch.float64).flip(0)  # prefers early keys
    mask = torch.ones(10, dtype=torch.bool)
    mask[9] = False
    composed = compose_scores(scores, sink=2, window=3, key_mask=mask)
    assert composed.topk(5).indices.sort().values.tolist() == [0, 1, 2, 7, 8]
    assert composed[9] == float("-inf")


def test_with_sink_and_window_keeps_the_scorer_contract():
    q, k, v = synthetic_qkv((2,), 16, 4, generator=gen(8))

    def by_value_norm(q, k, v, *, generator=None, key_mask=None, power=1):
        return v.norm(dim=-1) ** power

    scorer = with_sink_and_window(by_value_norm, sink=1, window=2)
    scores = scorer(q, k, v, power=2)
    assert scores.shape == (2, 16)
    assert bool(torch.isinf(scores[:, [0, 14, 15]]).all())
    torch.testing.assert_close(scores[:, 1:14], v.norm(dim=-1)[:, 1:14] ** 2)


_Q, _K, _V = synthetic_qkv((2, 3), 24, 4, generator=gen(11))
_KEEP = torch.ones(2, 3, 16, dtype=torch.bool)

BUDGET_BAD_INPUTS = [
    ("adakv-nan", lambda: adakv_keep(_scores(0).index_put((torch.tensor([0]), torch.tensor([2]), torch.tensor([5])),
                                                         torch.tensor([float("nan")], dtype=torch.float64)), 10),
     ValueError, r"^`scores` must hold no NaN \(a score is finite, \+inf for a key that must be kept or -inf for "
                 r"padding\); got 1 NaN of 2400 entries\.$"),
    ("adakv-ints", lambda: adakv_keep(torch.ones(2, 5, dtype=torch.int64), 2), TypeError,
     r"^`scores` must have dtype float32 or float64; got torch\.int64\.$"),
    ("adakv-one-head-axis", lambda: adakv_keep(torch.ones(5, dtype=torch.float64), 2), ValueError,
     r"^`scores` must have at least 2 dimensions"),
    ("adakv-too-many-forced", lambda: adakv_keep(torch.full((2, 5), float("inf"), dtype=torch.float64), 2),
     ValueError, r"^`scores` must mark at most H \* budget = 4 keys of a layer \+inf \(must keep\); got 10\.$"),
    ("compose-nan", lambda: compose_scores(torch.tensor([0.5, float("nan")])), ValueError,
     r"^`scores` must hold no NaN .*; got 1 NaN of 2 entries\.$"),
    ("compose-mask-length", lambda: compose_scores(torch.rand(2, 5), key_mask=torch.ones(4, dtype=torch.bool)),
     ValueError, r"^`key_mask` must have shape \(\*batch, n_k\) with n_k=5; got \(4,\)\.$"),
    ("compose-float-mask", lambda: compose_scores(torch.rand(2, 5), key_mask=torch.ones(2, 5)), TypeError,
     r"^`key_mask` must be a bool torch\.Tensor \(True on keys to attend\); got torch\.float32\.$"),
    ("compose-wider-mask", lambda: compose_scores(torch.rand(2, 5), key_mask=torch.ones(3, 2, 5, dtype=torch.bool)),
     ValueError, r"^`key_mask` of shape \(3, 2, 5\) does not broadcast to the keys' \(\*batch, n_k\) = \(2, 5\)"),
    ("compose-empty-row", lambda: compose_scores(torch.rand(2, 5), key_mask=torch.zeros(5, dtype=torch.bool)),
     ValueError, r"^`key_mask` must keep at least one key in every sequence; got an all-False row\.$"),
    ("attend-keep-float", lambda: attend_kept(_Q, _K, _V, _KEEP.double(), context_length=16), TypeError,
     r"^`keep` must be a bool torch\.Tensor \(True on the context keys each head kept\); got torch\.float64\.$"),
    ("attend-keep-length", lambda: attend_kept(_Q, _K, _V, _KEEP[..., :15], context_length=16), ValueError,
     r"^`keep` must have shape \(\*batch, context_length\) with context_length=16; got \(2, 3, 15\)\.$"),
    ("attend-keep-batch", lambda: attend_kept(_Q, _K, _V, torch.ones(4, 16, dtype=torch.bool), context_length=16),
     ValueError, r"^`keep` of shape \(4, 16\) does not broadcast to the heads' \(\*batch, context_length\) = "
                 r"\(2, 3, 16\) without widening it: it must have at most 3 dimensions, each 1 or the heads' size\.$"),
    ("attend-keep-list", lambda: attend_kept(_Q, _K, _V, [True] * 16, context_length=16), TypeError,
     r"^`keep` must be a bool torch\.Tensor .*; got list\.$"),
]


@pytest.mark.parametrize("call, error, match", [case[1:] for case in BUDGET_BAD_INPUTS],
                         ids=[case[0] for case in BUDGET_BAD_INPUTS])
def test_budget_helpers_refuse_bad_inputs_naming_the_parameter(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_keep_mask_broadcasts_over_the_heads():
    """One keep mask for every head broadcasts, as a key mask does: the same as the mask repeated."""
    keep = torch.rand(16, generator=gen(12)) < 0.5
    assert torch.equal(attend_kept(_Q, _K, _V, keep, context_length=16),  # the same computation: bitwise
                       attend_kept(_Q, _K, _V, keep.expand(2, 3, 16), context_length=16))
