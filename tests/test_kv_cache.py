"""The KV-cache setting, approxlab.kv_cache_attention, against dense references built here by hand:
the kept context tokens per policy, then each continuation row's dense softmax over them and the
continuation up to itself."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen
from approxlab.methods import register
from approxlab.synthetic import synthetic_qkv

N, CONTEXT = 40, 28


def _qkv(n=N, batch=(2, 3), seed=0, scale=1.5):
    g = gen(seed)
    q, k = (scale * torch.randn(*batch, n, 6, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(*batch, n, 5, generator=g, dtype=torch.float64)


def _continuation_reference(q, k, v, kept, context):
    """Rows context..n-1 of the dense softmax over the kept context tokens and the continuation up to i."""
    n = q.shape[-2]
    keep = torch.zeros(*q.shape[:-2], n - context, n, dtype=torch.bool)
    keep.scatter_(-1, kept.unsqueeze(-2).expand(*kept.shape[:-1], n - context, kept.shape[-1]), True)
    keep[..., :, context:] = torch.ones(n - context, n - context, dtype=torch.bool).tril()
    logits = q[..., context:, :] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    matrix = torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)
    return matrix, matrix @ v


def _h2o_kept_by_hand(q, k, budget, recent):
    """Column sums of the context's dense causal softmax; the last ``recent`` plus the top of the others."""
    context = q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    weights = torch.softmax(logits.masked_fill(~torch.ones(context, context, dtype=torch.bool).tril(), -math.inf), -1)
    scores = weights.sum(-2)
    earlier = scores[..., : context - recent].topk(budget - recent, dim=-1).indices
    return torch.cat([earlier, torch.arange(context - recent, context).expand(*q.shape[:-2], recent)], dim=-1)


@pytest.mark.parametrize("budget", [1, 7, 12, CONTEXT])
def test_policies_compress_the_context_then_the_continuation_attends_exactly(budget):
    q, k, v = _qkv(seed=1)
    context = slice(0, CONTEXT)
    sinks = min(4, budget)
    by_hand = {
        "streaming-llm": torch.cat([torch.arange(sinks), torch.arange(CONTEXT - (budget - sinks), CONTEXT)]).expand(
            2, 3, budget),
        "h2o": _h2o_kept_by_hand(q[..., context, :], k[..., context, :], budget, max(1, budget // 2)),
    }
    for name, kept in by_hand.items():
        result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=budget)
        assert sorted(result.info["kept"][1, 2].tolist()) == sorted(kept[1, 2].tolist()), name
        matrix, output = _continuation_reference(q, k, v, kept, CONTEXT)
        torch.testing.assert_close(result.output, output, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(result.matrix(), matrix, rtol=1e-12, atol=1e-14)
    if budget == CONTEXT:  # every context token kept: the exact continuation rows
        exact = approxlab.exact_attention(q, k, v, causal=True)[..., CONTEXT:, :]
        for name in ("streaming-llm", "h2o", "snapkv"):
            out = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=budget).output
            assert float((out - exact).abs().max()) <= 1e-10, name


def test_snapkv_in_the_kv_cache_setting_is_its_causal_form_after_the_prompt():
    q, k, v = _qkv(seed=2)
    options = dict(window=6, kernel_size=3, pooling="avg")
    cached = approxlab.kv_cache_attention("snapkv", q, k, v, context_length=CONTEXT, num_features=10, **options)
    causal = approxlab.approximate("snapkv", q, k, v, num_features=10, prompt_length=CONTEXT, causal=True, **options)
    torch.testing.assert_close(cached.output, causal.output[..., CONTEXT:, :], rtol=0, atol=1e-14)
    assert torch.equal(cached.info["kept"], causal.info["kept"])
    matrix, output = _continuation_reference(q, k, v, cached.info["kept"], CONTEXT)
    torch.testing.assert_close(cached.output, output, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name,options,causal", [("topk", {}, True), ("quest", {"page_size": 4}, True),
                                                 ("exact", {}, True), ("nystromformer", {}, "mask-renormalise")])


def test_methods_without_a_compression_step_run_their_causal_form_on_the_window(name, options, causal):
    q, k, v = _qkv(seed=3)
    result = approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=8, **options)
    whole = approxlab.approximate(name, q, k, v, num_features=8, causal=causal, **options)
    torch.testing.assert_close(result.output, whole.output[..., CONTEXT:, :], rtol=0, atol=0)
    torch.testing.assert_close(result.matrix(), whole.matrix()[..., CONTEXT:, :], rtol=1e-12, atol=1e-14)
    assert result.info["setting"] == ("causal" if causal is True else causal)
    performer = approxlab.kv_cache_attention("performer", q, k, v, context_length=CONTEXT, num_features=8,
                                             generator=gen(4))
    again = approxlab.approximate("performer", q, k, v, num_features=8, causal=True, generator=gen(4))
    torch.testing.assert_close(performer.output, again.output[..., CONTEXT:, :], rtol=0, atol=0)


def test_a_registered_method_declares_its_own_compression_step(fresh_registry):
    q, k, v = _qkv(seed=5)

    def keep_the_first(q, k, v, *, budget, generator=None):
        return torch.arange(budget).expand(*q.shape[:-2], budget)

    @register("first-tokens", target="softmax", features="cache size", randomized=False, causal="only",
              compress=keep_the_first)
    def first_tokens(q, k, v, *, num_features, generator=None, causal=True):
        keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        keep[:, num_features:] = keep[:, num_features:] & torch.eye(q.shape[-2], dtype=torch.bool)[:, num_features:]
        logits = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
        return torch.softmax(logits, -1) @ v

    result = approxlab.kv_cache_attention("first-tokens", q, k, v, context_length=CONTEXT, num_features=5)
    _, output = _continuation_reference(q, k, v, torch.arange(5).expand(2, 3, 5), CONTEXT)
    torch.testing.assert_close(result.output, output, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match=r"`key_mask` is not supported by the compression step of method"):
        approxlab.kv_cache_attention("first-tokens", q, k, v, context_length=CONTEXT, num_features=5,
                                     key_mask=torch.ones(N, dtype=torch.bool))

    def wrong_shape(q, k, v, *, budget, generator=None):
        return torch.arange(budget + 1).expand(*q.shape[:-2], budget + 1)

    register("wrong-shape", first_tokens,
             target="softmax", features="cache size", randomized=False, causal="only", compress=wrong_shape)
    with pytest.raises(ValueError, match=r"must return indices of shape \(\*batch, budget\) = \(2, 3, 5\); got "
                                         r"\(2, 3, 6\)"):
        approxlab.kv_cache_attention("wrong-shape", q, k, v, context_length=CONTEXT, num_features=5)
    with pytest.raises(ValueError, match="`compress` is a step of the KV-cache setting, which is causal"):
        register("bidirectional", first_tokens, target="softmax", features="x", randomized=False,
                 compress=keep_the_first)
    with pytest.raises(TypeError, match="must accept compress"):
        register("bad-step", first_tokens, target="softmax", features="x", randomized=False, causal="only",
                 compress=lambda q, k: None)


def test_padding_never_enters_the_compressed_cache_nor_leaks():
    q, k, v = _qkv(seed=6)
    mask = torch.ones(2, 1, N, dtype=torch.bool)
    mask[0, 0, :6] = False  # left padding
    mask[1, 0, 10:14] = False
    for name, options in (("streaming-llm", {}), ("h2o", {}), ("snapkv", {"window": 4}), ("topk", {})):
        def run(q, k, v):
            return approxlab.kv_cache_attention(name, q, k, v, context_length=CONTEXT, num_features=8,
                                                key_mask=mask, **options)

        result = run(q, k, v)
        changed = [x.clone() for x in (q, k, v)]
        for x in changed:
            x[~mask.expand(*x.shape[:-1])] = 7.0
        torch.testing.assert_close(run(*changed).output, result.output, rtol=0, atol=1e-12)
        assert float(result.matrix()[~mask.expand(2, 3, N)[..., None, :].expand(2, 3, N - CONTEXT, N)].abs().max()) == 0
        if "kept" in result.info:  # the sequence with padding keeps only real context tokens
            kept = result.info["kept"]
            assert bool(torch.gather(mask.expand(2, 3, N), -1, kept).all()), name


def test_kv_cache_validation():
    q, k, v = _qkv(seed=7)
    with pytest.raises(ValueError, match=r"`context_length` must be an integer with 1 <= context_length <= 39; "
                                         r"got 40"):
        approxlab.kv_cache_attention("h2o", q, k, v, context_length=N, num_features=4)
    with pytest.raises(ValueError, match=r"`context_length` must be an integer .* got 0"):
        approxlab.kv_cache_attention("topk", q, k, v, context_length=0, num_features=4)
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 28; got 29"):
        approxlab.kv_cache_attention("snapkv", q, k, v, context_length=CONTEXT, num_features=29)
    with pytest.raises(TypeError, match=r"`prompt_length` is not an option of the compression step of method "
                                        r"'snapkv'; its options are \['kernel_size', 'pooling', 'window'\]"):
        approxlab.kv_cache_attention("snapkv", q, k, v, context_length=CONTEXT, num_features=8, prompt_length=9)
    with pytest.raises(ValueError, match=r"method 'skyformer' has no causal form, which the KV-cache setting needs"):
        approxlab.kv_cache_attention("skyformer", q, k, v, context_length=CONTEXT, num_features=8)
    with pytest.raises(ValueError, match=r"must be one window \(self-attention"):
        approxlab.kv_cache_attention("h2o", q, k[..., :30, :], v[..., :30, :], context_length=CONTEXT,
                                     num_features=8)
    with pytest.raises(ValueError, match=r"`draw` is for randomized methods"):
        approxlab.kv_cache_attention("h2o", q, k, v, context_length=CONTEXT, num_features=8, draw={})


@pytest.mark.parametrize("masking", ["none", "padding", "rows that see no key"])
def test_the_compressed_cache_attended_through_the_fused_kernel_equals_the_selection(masking):
    """``attend_compressed`` (torch's fused SDPA on blocks whose rows each see a key, the explicit softmax on the
    others) gives the rows :func:`attend_selected` gives for the same selection, to rounding; a row that sees no
    key is 0."""
    from approxlab.cache._selection import attend_compressed, compressed_indices
    from approxlab.methods._selection import attend_selected

    g = torch.Generator().manual_seed(["none", "padding", "rows that see no key"].index(masking))
    for _ in range(8):
        n = int(torch.randint(8, 60, (1,), generator=g))
        context = int(torch.randint(1, n, (1,), generator=g))
        budget = int(torch.randint(1, context + 1, (1,), generator=g))
        q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
        kept = torch.stack([torch.randperm(context, generator=g)[:budget] for _ in range(6)]).view(2, 3, budget)
        mask = None if masking == "none" else torch.rand(2, 1, n, generator=g) > 0.3
        if masking == "rows that see no key":
            mask[..., :context + 2] = False
        out = attend_compressed(q, k, v, kept, context, mask)
        ref = attend_selected(q[..., context:, :], k, v, lambda s, e: compressed_indices(kept, context, n, s, e, mask),
                              width=budget + n - context)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)
        if masking == "rows that see no key":
            assert (out[..., :2, :] == 0).all()


# -- traps that used to run without a word: repeated K/V, a RoPE-aware policy without the RoPE ----------------------


def _grouped_layer(seed=0, heads=6, kv_heads=2, n=40, p=8):
    g = gen(seed)
    q = torch.randn(1, heads, n, p, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, kv_heads, n, p, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v


def test_repeated_kv_reaching_a_cache_policy_warns_and_says_how_to_keep_b_per_kv_head():
    """K/V repeated to the query heads (get_qkv's default) keep a set per query head: g * b per KV head, with a
    RepeatedKVWarning naming g and the way out; the KV heads themselves keep b per KV head, silently."""
    q, k, v = _grouped_layer()
    repeated = k.repeat_interleave(3, dim=-3), v.repeat_interleave(3, dim=-3)
    with pytest.warns(approxlab.errors.RepeatedKVWarning) as caught:
        per_query_head = approxlab.kv_cache_attention("snapkv", q, *repeated, context_length=24, num_features=6,
                                                      window=2)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "repeat each of their heads 3 times (dimension -3: 6 heads, 2 distinct)" in message
    assert "up to 18 per KV head" in message and "k[..., ::3, :, :]" in message and "grouped=True" in message
    kept = per_query_head.info["kept"]
    assert kept.shape == (1, 6, 6) and len({tuple(s.tolist()) for s in kept.sort(-1).values[0, :3]}) > 1
    per_kv_head = approxlab.kv_cache_attention("snapkv", q, k, v, context_length=24, num_features=6, window=2)
    assert per_kv_head.info["kept"].shape == (1, 2, 6)
    # Said on purpose, or nothing to keep per head: no warning (warnings fail the tests).
    approxlab.kv_cache_attention("snapkv", q, *repeated, context_length=24, num_features=6, window=2,
                                 grouping="query-head")
    approxlab.kv_cache_attention("topk", q, *repeated, context_length=24, num_features=6)
    approxlab.kv_cache_attention("snapkv", q, *(x.repeat(1, 3, 1, 1) for x in (k, v)), context_length=24,
                                 num_features=6, window=2)  # heads 0, 1, 0, 1, ...: not a repeat in groups


def test_repeated_heads_finds_the_group_size_only_for_whole_groups():
    from approxlab.cache._grouping import repeated_heads

    k = torch.randn(2, 3, 5, 4, generator=gen(1), dtype=torch.float64)
    assert [repeated_heads(k.repeat_interleave(g, dim=-3), k.repeat_interleave(g, dim=-3)) for g in (1, 2, 4)] == [1, 2, 4]
    assert repeated_heads(k[:, :1].expand(2, 5, 5, 4), k[:, :1].expand(2, 5, 5, 4)) == 5  # one KV head (MQA)
    uneven = torch.cat([k[:, :1], k[:, :1], k[:, 1:2], k[:, 1:2], k[:, 1:2], k[:, 2:]], dim=-3)  # 2, 3, 1
    assert repeated_heads(uneven, uneven) == 1
    v = torch.randn(2, 6, 5, 4, generator=gen(2), dtype=torch.float64)
    assert repeated_heads(k.repeat_interleave(2, dim=-3), v) == 1  # the values differ: not a repeat
    assert repeated_heads(k[0, 0], k[0, 0]) == 1  # no head dimension


@pytest.mark.parametrize("method", ["expected-attention", "cap", "leverage-score", "compactor"])
def test_a_rope_aware_policy_without_the_rope_warns_once_per_call(method):
    """Without rope_frequencies/rope_base a RoPE-aware policy reads post-RoPE keys as un-rotated: one RopeWarning
    per call, naming how to pass them; rope_frequencies=None (no RoPE) or the frequencies silence it."""
    q, k, v = _grouped_layer(3)
    generator = gen(4)
    call = lambda **options: approxlab.kv_cache_attention(method, q, k, v, context_length=24,  # noqa: E731
                                                          num_features=6, generator=generator, **options)
    with pytest.warns(approxlab.errors.RopeWarning) as caught:
        call()
    assert len(caught) == 1
    assert f"method {method!r} reads the rotary embedding" in str(caught[0].message)
    assert "Pass rope_frequencies= (the layer's inv_freq, (p // 2,)) or rope_base=" in str(caught[0].message)
    with pytest.warns(approxlab.errors.RopeWarning) as caught:  # the causal form too
        approxlab.approximate(method, q, k.repeat_interleave(3, dim=-3), v.repeat_interleave(3, dim=-3),
                              num_features=6, causal=True, generator=gen(4))
    assert len(caught) == 1
    call(rope_frequencies=None)
    call(rope_base=10_000.0)
    call(rope_frequencies=torch.ones(4, dtype=torch.float64))


def test_a_randomized_rope_aware_policy_takes_a_draw_beside_its_rope():
    """leverage-score's draw ignores the options that do not shape it (rope_base raised a TypeError)."""
    from approxlab.methods import draw

    q, k, v = _grouped_layer(5, heads=2)
    drawn = draw("leverage-score", q, k, num_features=6, generator=gen(6), causal=True, rope_base=10_000.0)
    by_draw = approxlab.approximate("leverage-score", q, k, v, num_features=6, causal=True, draw=drawn,
                                    rope_base=10_000.0)
    by_generator = approxlab.approximate("leverage-score", q, k, v, num_features=6, causal=True, generator=gen(6),
                                         rope_base=10_000.0)
    assert torch.equal(by_draw.output, by_generator.output)


def test_a_compression_ratio_keeps_kvpress_count():
    """compression_ratio r keeps max(1, int(n_c * (1 - r))) per head (kvpress's ScorerPress), floats included."""
    from approxlab.cache import kept_count

    assert [kept_count(r, 4096) for r in (0.25, 0.5, 0.75, 0.875)] == [3072, 2048, 1024, 512]
    assert kept_count(0.9, 20) == 1  # 20 * (1 - 0.9) is 1.9999999999999996: int() gives 1, as kvpress keeps
    assert kept_count(0.0, 7) == 7 and kept_count(0.99, 10) == 1
    q, k, v = synthetic_qkv((2,), 60, 8, generator=torch.Generator().manual_seed(0))
    for ratio in (0.25, 0.5, 0.9):
        budget = max(1, int(40 * (1 - ratio)))
        by_ratio = approxlab.kv_cache_attention("h2o", q, k, v, context_length=40, compression_ratio=ratio)
        by_count = approxlab.kv_cache_attention("h2o", q, k, v, context_length=40, num_features=budget)
        assert torch.equal(by_ratio.output, by_count.output) and by_ratio.info["kept"].shape[-1] == budget
        assert (by_ratio.info["num_features"], by_ratio.info["compression_ratio"]) == (budget, ratio)
    assert by_count.info["num_features"] == 3 and by_count.info["compression_ratio"] == 1 - 3 / 40  # 40 * 0.1 < 4


@pytest.mark.parametrize("arguments, error, match", [
    ({"num_features": 4, "compression_ratio": 0.5}, ValueError, r"exactly one of `num_features` .* got both"),
    ({}, ValueError, r"exactly one of `num_features` .* got neither"),
    ({"compression_ratio": 1.0}, ValueError, r"`compression_ratio` must be in \[0, 1\) .* got 1.0"),
    ({"compression_ratio": -0.1}, ValueError, r"`compression_ratio` must be in \[0, 1\)"),
    ({"compression_ratio": float("nan")}, ValueError, r"`compression_ratio` must be in \[0, 1\)"),
    ({"compression_ratio": True}, TypeError, r"`compression_ratio` must be a real number .* got True"),
    ({"compression_ratio": "0.5"}, TypeError, r"`compression_ratio` must be a real number"),
])


def test_compression_ratio_errors(arguments, error, match):
    q, k, v = synthetic_qkv((1,), 20, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match=match):
        approxlab.kv_cache_attention("h2o", q, k, v, context_length=10, **arguments)
    with pytest.raises(ValueError, match=r"`compression_ratio` states a cache budget, for a method with a compression "
                                         r"step .* method 'topk' has none"):
        approxlab.kv_cache_attention("topk", q, k, v, context_length=10, compression_ratio=0.5)
