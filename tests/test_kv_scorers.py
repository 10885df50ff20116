"""kvpress's scorers as approxlab cache policies (approxlab/methods/<name>.py), against kvpress's formulas.

Each ``kvpress_*`` function below re-derives a press's ``score`` from kvpress's code (NVIDIA/kvpress at commit
8bb29b9, ``kvpress/presses/<press>.py``) in float64 torch on kvpress's layout -- ``(B, H_kv, S, d)`` keys and
values, ``(B, H, S, d)`` queries, pooling over the group of query heads inside the press -- independently of
the implementations. The approxlab scorers run per query head on the repeated KV heads and their scores are
averaged over each group here, as the framework does. Compared: the kept sets of several budgets (identical)
and the largest difference of the scores (finite entries; ``+inf`` where kvpress writes ``max + 1``).
"""

from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch

import approxlab
from approxlab.cache import attend_compressed
from approxlab.methods.cap import cap_scores
from approxlab.methods.caote import caote_scores
from approxlab.methods.compactor import compactor_scores
from approxlab.methods.cur import cur_scores
from approxlab.methods.criticalkv import criticalkv_scores
from approxlab.methods.expected_attention import expected_attention_scores
from approxlab.methods.keydiff import keydiff_scores
from approxlab.methods.knorm import knorm_scores
from approxlab.methods.leverage_score import key_leverage_scores
from approxlab.leverage import ridge_leverage_scores
from approxlab.methods.observed_attention import observed_attention_scores
from approxlab.methods.random import random_scores
from approxlab.methods.tova import tova_scores
from _helpers import gen, rounding_bound

B, H, H_KV, S, D = 1, 4, 2, 40, 8
GROUP = H // H_KV


def _layer(seed=0, s=S, d=D, scale=1.0):
    """kvpress's layout: queries (B, H, S, d), keys and values (B, H_kv, S, d), float64."""
    g = gen(seed)
    queries = scale * torch.randn(B, H, s, d, generator=g, dtype=torch.float64)
    keys = scale * torch.randn(B, H_KV, s, d, generator=g, dtype=torch.float64)
    values = torch.randn(B, H_KV, s, d, generator=g, dtype=torch.float64)
    return queries, keys, values


def repeat_kv(x):
    """(B, H_kv, S, d) -> (B, H, S, d), each KV head repeated for its group (transformers' ``repeat_kv``)."""
    return x.repeat_interleave(GROUP, dim=1)


def pooled(scores):
    """(B, H, S) per query head -> (B, H_kv, S): the mean over each group (the framework's pooling)."""
    return scores.view(B, H_KV, GROUP, -1).mean(2)


def causal_attention(queries, keys):
    """``attentions`` of an eager forward: (B, H, S, S) causal softmax."""
    s = queries.shape[-2]
    logits = queries @ keys.transpose(-1, -2) / math.sqrt(queries.shape[-1])
    logits = logits.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(logits, dim=-1)


# ---- kvpress's formulas, re-derived from its code --------------------------------------------------------


def kvpress_knorm(keys):
    return -keys.norm(dim=-1)


def kvpress_observed_attention(attentions, keys):
    n = keys.shape[2]
    scores = attentions.sum(2) / torch.arange(n, 0, -1, dtype=attentions.dtype)
    return scores.view(keys.shape[0], keys.shape[1], -1, n).mean(2)


def kvpress_tova(attentions, keys):
    scores = attentions[..., -1:, :-1].mean(1).repeat(1, keys.shape[1], 1)
    return torch.nn.functional.pad(scores, (0, 1), value=scores.max().item() + 1)


def kvpress_keydiff(keys):
    anchor = torch.nn.functional.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
    return -torch.nn.functional.cosine_similarity(keys, anchor, dim=-1)


BASE = 10000.0


def hf_cos_sin(positions, d, base=BASE):
    """transformers' default rotary ``cos, sin`` (S, d) at ``positions``."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    emb = torch.cat([positions.double()[:, None] * inv_freq] * 2, dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1)


def apply_rope(x):
    cos, sin = hf_cos_sin(torch.arange(x.shape[-2]), x.shape[-1])
    return x * cos + rotate_half(x) * sin


def kvpress_average_rope(d, q_len, n_future_positions, base=BASE):
    cos, sin = hf_cos_sin(torch.arange(q_len, q_len + n_future_positions), d, base)
    identity, P = torch.eye(d, dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64)
    P[d // 2:, : d // 2], P[: d // 2, d // 2:] = torch.eye(d // 2), -torch.eye(d // 2)
    return (cos.unsqueeze(1) * identity + sin.unsqueeze(1) * P).mean(dim=0)


def kvpress_expected_attention(queries_pre, keys, values, n_sink=4, n_future_positions=512, epsilon=0.0):
    """``queries_pre`` (B, H, S, d) stands for ``get_prerope_query_states(module, hidden_states)``."""
    q_len = queries_pre.shape[2]
    query_states = queries_pre[:, :, n_sink:]
    mu = query_states.mean(dim=2, keepdim=True)
    centered = query_states - mu
    cov = torch.einsum("bnsi,bnsj->bnij", centered, centered) / (q_len - n_sink)
    R = kvpress_average_rope(queries_pre.shape[-1], q_len, n_future_positions)
    mu, cov = mu.squeeze(2) @ R.T, R @ cov @ R.T
    keys, values = keys[:, :, n_sink:], values[:, :, n_sink:]
    bsz, h_kv, n, d = keys.shape
    keys = repeat_kv(keys).transpose(2, 3)
    scores = (mu.unsqueeze(2) @ keys).squeeze(2) / math.sqrt(d)
    scores = scores + torch.einsum("bhin, bhij, bhjn->bhn", keys, cov, keys) / d / 2
    scores = torch.softmax(scores, dim=-1).view(bsz, h_kv, GROUP, n).mean(dim=2)
    scores = (scores + epsilon) * values.norm(dim=-1)
    return torch.nn.functional.pad(scores, (n_sink, 0), value=scores.max().item() + 1)


def kvpress_leverage(pre_rope_keys, Phi, zscore=True):
    """``LeverageScorePress``: ``Phi`` (B, H_kv, d, k) stands for its ``torch.randn(...) / sqrt(k)``; float64
    where kvpress casts the sketched keys to float32."""
    X = (pre_rope_keys - pre_rope_keys.mean(dim=-2, keepdim=True)) @ Phi
    XT = X.transpose(-2, -1)
    G = XT @ X
    L = torch.linalg.cholesky(0.5 * (G + G.transpose(-2, -1)) + 1e-2 * torch.eye(G.shape[-1], dtype=G.dtype))
    scores = (X * torch.cholesky_solve(XT, L, upper=False).transpose(-2, -1)).sum(dim=-1).clamp_min(0)
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6) if zscore else scores


def kvpress_cap(queries_pre, keys, values, tau=5.0, n_sink=4, n_future_positions=512, epsilon=1e-6):
    """``CapPress`` (its ``torch.linalg.solve`` in float64 where kvpress casts to float32)."""
    normalize = torch.nn.functional.normalize
    R = kvpress_average_rope(queries_pre.shape[-1], queries_pre.shape[2], n_future_positions)
    anchor = (queries_pre[:, :, n_sink:] @ R.T).mean(dim=2)
    keys_rep, values_rep = repeat_kv(keys[:, :, n_sink:]), repeat_kv(values[:, :, n_sink:])
    statistic = torch.einsum("bhd,bhtd->bht", normalize(anchor, p=2, dim=-1), normalize(keys_rep, p=2, dim=-1))
    logits = tau * statistic.clamp(-1.0, 1.0)
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    scaled = values_rep * torch.sqrt(weights + epsilon).unsqueeze(-1)
    d = keys.shape[-1]
    capacity = torch.eye(d, dtype=torch.float64).view(1, 1, d, d) + torch.einsum("bhtd,bhte->bhde", scaled, scaled)
    values_t = values_rep.transpose(2, 3)
    scores = weights * (values_t * torch.linalg.solve(capacity, values_t)).sum(dim=2)
    scores = scores.view(B, keys.shape[1], GROUP, -1).mean(dim=2)
    return torch.nn.functional.pad(scores, (n_sink, 0), value=scores.max().item() + 1)


def kvpress_cur(keys, values, num_sinks=4, leverage_type="kv_product", use_local_approximation=True, w=16, G=None):
    """``CURPress``; ``G`` (d, r) stands for its ``torch.randn(d, 20) / sqrt(20)``."""
    if G is not None:
        keys, values = keys @ G, values @ G
    k2, v2 = (keys**2).sum(dim=-1), (values**2).sum(dim=-1)
    if use_local_approximation:
        b, h, n = k2.shape
        pad = (w - n % w) % w
        k2 = torch.nn.functional.pad(k2, (0, pad)).reshape(b, h, -1, w)
        k2 = (k2 / k2.sum(dim=-1, keepdim=True)).reshape(b, h, -1)[:, :, :n]
        v2 = torch.nn.functional.pad(v2, (0, pad)).reshape(b, h, -1, w)
        v2 = (v2 / v2.sum(dim=-1, keepdim=True)).reshape(b, h, -1)[:, :, :n]
    scores = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[leverage_type]
    scores = scores / scores.sum(dim=-1, keepdim=True)
    scores[:, :, :num_sinks] = 1.0
    return scores


def kvpress_non_causal_chunked_attn(q, k, chunk_size):
    """``NonCausalAttnPress.non_causal_chunked_attn``."""
    b, h, s, d = k.shape
    s_pad = math.ceil(s / chunk_size) * chunk_size
    pad = s_pad - s
    zeros = torch.zeros(b, h, pad, d, dtype=q.dtype)
    q, k = torch.cat([q, zeros], dim=2), torch.cat([k, zeros], dim=2)
    last_start = (s // chunk_size) * chunk_size if pad > 0 else ((s - 1) // chunk_size) * chunk_size
    invalid = (torch.arange(last_start, s_pad) >= s).view(1, 1, chunk_size).expand(b, h, chunk_size)
    q, k = q.view(b, h, -1, chunk_size, d), k.view(b, h, -1, chunk_size, d)
    dots = q @ k.transpose(-2, -1)
    dots[:, :, -1].masked_fill_(invalid.unsqueeze(-1), 0)
    dots[:, :, -1].masked_fill_(invalid.unsqueeze(-2), -1e-9)
    return torch.softmax(dots, dim=-1).sum(dim=-2).view(b, h, s_pad)[..., :s]


def kvpress_compactor(queries, keys_pre, keys, values, Phi, start=8, end=4, chunk_size=8, blending=0.35):
    """``CompactorPress.score`` with ``queries`` the post-RoPE queries ``NonCausalAttnPress`` forms."""
    n = keys.shape[-2]
    left = min(start, n)
    right = min(end, max(0, n - left))
    middle = slice(left, n - right)
    leverage = kvpress_leverage(keys_pre[..., middle, :], Phi)
    received = kvpress_non_causal_chunked_attn(queries[..., middle, :], repeat_kv(keys[..., middle, :]), chunk_size)
    received = received.view(B, keys.shape[1], -1, received.shape[-1]).mean(dim=-2)
    scores = torch.nn.functional.avg_pool1d(received * values[..., middle, :].norm(dim=-1), kernel_size=3,
                                            padding=1, stride=1)
    scores = blending * leverage + (scores - scores.mean()) / scores.std().clamp_min(1e-6)
    return torch.nn.functional.pad(scores, (left, right), value=scores.max())


# ---- comparison ------------------------------------------------------------------------------------------


def compare(ours, theirs, budgets=(1, 5, 12, 20, 39)):
    """Kept sets identical for every budget; returns the largest difference of the finite scores."""
    assert ours.shape == theirs.shape
    for b in budgets:
        kept = ours.topk(b, dim=-1).indices.sort(-1).values
        reference = theirs.topk(b, dim=-1).indices.sort(-1).values
        assert torch.equal(kept, reference), b
    finite = torch.isfinite(ours)  # +inf where kvpress writes max + 1 (compactor: max): no other score above
    protected = torch.where(finite, torch.full_like(theirs, math.inf), theirs).amin(-1)
    assert (protected >= torch.where(finite, theirs, torch.full_like(theirs, -math.inf)).amax(-1)).all()
    return float((ours[finite] - theirs[finite]).abs().max())


def per_head(score, queries, keys, values, **options):
    """Run a scorer per query head on the repeated KV heads and pool over the group."""
    return pooled(score(queries, repeat_kv(keys), repeat_kv(values), **options))


@pytest.mark.parametrize("seed", range(3))
def test_knorm_matches_kvpress(seed):
    queries, keys, values = _layer(seed)
    assert compare(per_head(knorm_scores, queries, keys, values), kvpress_knorm(keys)) < 1e-14


@pytest.mark.parametrize("seed", range(3))
def test_observed_attention_matches_kvpress(seed):
    queries, keys, values = _layer(seed)
    theirs = kvpress_observed_attention(causal_attention(queries, repeat_kv(keys)), keys)
    assert compare(per_head(observed_attention_scores, queries, keys, values), theirs) < 1e-14


@pytest.mark.parametrize("seed", range(3))
def test_tova_with_the_layer_average_matches_kvpress(seed):
    queries, keys, values = _layer(seed)
    theirs = kvpress_tova(causal_attention(queries, repeat_kv(keys)), keys)
    ours = per_head(tova_scores, queries, keys, values, average_heads=True)
    assert torch.isinf(ours[..., -1]).all() and torch.isfinite(ours[..., :-1]).all()
    assert compare(ours, theirs) < 1e-15


def test_tova_per_head_is_each_heads_last_row():
    queries, keys, values = _layer(4)
    attentions = causal_attention(queries, repeat_kv(keys))
    ours = tova_scores(queries, repeat_kv(keys), repeat_kv(values))
    assert torch.allclose(ours[..., :-1], attentions[..., -1, :-1], rtol=0, atol=1e-15)
    assert not torch.allclose(ours[..., :-1], attentions[..., -1, :-1].mean(1, keepdim=True), atol=1e-3)


@pytest.mark.parametrize("seed", range(3))
def test_keydiff_matches_kvpress(seed):
    queries, keys, values = _layer(seed)
    assert compare(per_head(keydiff_scores, queries, keys, values), kvpress_keydiff(keys)) < 1e-14


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("given", ["rope_base", "queries_pre_rope"])
def test_expected_attention_matches_kvpress(seed, given):
    queries_pre, keys_pre, values = _layer(seed)
    keys = apply_rope(keys_pre)  # the cache holds post-RoPE keys
    theirs = kvpress_expected_attention(queries_pre, keys, values, epsilon=0.01)
    options = dict(rope_base=BASE) if given == "rope_base" else dict(
        queries_pre_rope=queries_pre, rope_frequencies=1.0 / BASE ** (torch.arange(0, D, 2).double() / D))
    ours = per_head(expected_attention_scores, apply_rope(queries_pre), keys, values, epsilon=0.01, **options)
    assert compare(ours, theirs) < 1e-15


def test_expected_attention_needs_the_models_rope():
    queries_pre, keys_pre, values = _layer(0)
    keys = apply_rope(keys_pre)
    theirs = kvpress_expected_attention(queries_pre, keys, values)
    ours = per_head(expected_attention_scores, apply_rope(queries_pre), keys, values)  # RoPE not declared
    assert float((ours - theirs)[..., 4:].abs().max()) > 1e-3


def _sketch(seed, h_kv=H_KV, r=6):
    return torch.randn(B, h_kv, D, r, generator=gen(100 + seed), dtype=torch.float64) / math.sqrt(r)


@pytest.mark.parametrize("seed", range(3))
def test_leverage_score_matches_kvpress_on_one_kv_head(seed):
    _, keys_pre, values = _layer(seed)
    queries = torch.randn(B, GROUP, S, D, generator=gen(seed), dtype=torch.float64)
    keys_pre, values, Phi = keys_pre[:, :1], values[:, :1], _sketch(seed, 1)  # one KV head, its group
    theirs = kvpress_leverage(keys_pre, Phi)
    rep = (lambda x: x.expand(B, GROUP, *x.shape[2:]))
    k = apply_rope(keys_pre)
    ours = key_leverage_scores(queries, rep(k), rep(values), keys_pre_rope=rep(keys_pre), sketch=rep(Phi),
                               sketch_dimension=6).mean(1, keepdim=True)
    assert compare(ours, theirs) < 1e-13
    rotated_back = key_leverage_scores(queries, rep(k), rep(values), rope_base=BASE, sketch=rep(Phi),
                                       sketch_dimension=6).mean(1, keepdim=True)
    assert float((rotated_back - ours).abs().max()) < 1e-12


def test_leverage_score_keeps_kvpress_sets_on_a_layer_and_is_ridge_leverage():
    queries, keys_pre, values = _layer(7)
    Phi = _sketch(7)
    theirs = kvpress_leverage(keys_pre, Phi)  # one z-score over both KV heads
    ours = per_head(key_leverage_scores, queries, keys_pre, values, keys_pre_rope=repeat_kv(keys_pre),
                    sketch=repeat_kv(Phi), sketch_dimension=6)
    compare(ours, theirs)  # the same kept sets; the scores differ by each head's affine map
    raw = key_leverage_scores(queries[:, :1], keys_pre[:, :1], values[:, :1], keys_pre_rope=keys_pre[:, :1],
                              sketch=Phi[:, :1], sketch_dimension=6, zscore=False)
    X = (keys_pre[:, :1] - keys_pre[:, :1].mean(-2, keepdim=True)) @ Phi[:, :1]
    # The n x n eigendecomposition of the rank-6 X X^T and the 6 x 6 one of X^T X agree to the rounding of a
    # system of condition (lambda_max + ridge) / ridge (about 1e4 here): n eps cond ~ 1e-10, where this CPU gives
    # 2.5e-12 and another BLAS more; a wrong ridge or centring moves the scores by ~1e-2.
    condition = float((torch.linalg.eigvalsh(X.mT @ X).amax() + 1e-2) / 1e-2)
    bound = rounding_bound(X.shape[-2], condition)
    assert float((raw - ridge_leverage_scores(X @ X.mT, 1e-2)).abs().max()) < bound
    assert float((raw - kvpress_leverage(keys_pre[:, :1], Phi[:, :1], zscore=False)).abs().max()) < bound


def test_leverage_score_is_reproducible_and_takes_k_as_pre_rope_without_a_declared_rope():
    q, k, v = _layer(0)[0], repeat_kv(_layer(0)[1]), repeat_kv(_layer(0)[2])
    first = key_leverage_scores(q, k, v, keys_pre_rope=k, generator=gen(3))
    assert torch.equal(first, key_leverage_scores(q, k, v, keys_pre_rope=k, generator=gen(3)))
    assert not torch.equal(first, key_leverage_scores(q, k, v, keys_pre_rope=k, generator=gen(4)))
    assert torch.equal(key_leverage_scores(q, k, v, generator=gen(3)), first)  # no RoPE declared: k as it is
    with pytest.raises(ValueError, match="`sketch` must have shape"):
        key_leverage_scores(q, k, v, keys_pre_rope=k, sketch=_sketch(0))


@pytest.mark.parametrize("seed", range(3))
def test_cap_matches_kvpress(seed):
    queries_pre, keys_pre, values = _layer(seed)
    keys = apply_rope(keys_pre)
    theirs = kvpress_cap(queries_pre, keys, values)
    ours = per_head(cap_scores, apply_rope(queries_pre), keys, values, rope_base=BASE)
    assert compare(ours, theirs) < 1e-15


@pytest.mark.parametrize("leverage_type", ["kv_product", "key", "value", "kv_avg"])
@pytest.mark.parametrize("local", [True, False])
def test_cur_matches_kvpress(leverage_type, local):
    queries, keys, values = _layer(2)
    theirs = kvpress_cur(keys, values, leverage_type=leverage_type, use_local_approximation=local)
    ours = per_head(cur_scores, queries, keys, values, leverage_type=leverage_type,
                    local_window_size=16 if local else None)
    assert compare(ours, theirs) < 1e-15


def test_cur_with_a_random_projection_matches_kvpress_and_is_reproducible():
    queries, keys, values = _layer(5)
    G = torch.randn(D, 3, generator=gen(9), dtype=torch.float64) / math.sqrt(3)
    ours = per_head(cur_scores, queries, keys, values, sketch_dimension=3, sketch=G)
    assert compare(ours, kvpress_cur(keys, values, G=G)) < 1e-15
    k, v = repeat_kv(keys), repeat_kv(values)
    first = cur_scores(queries, k, v, sketch_dimension=3, generator=gen(1))
    assert torch.equal(first, cur_scores(queries, k, v, sketch_dimension=3, generator=gen(1)))
    assert not torch.equal(first, cur_scores(queries, k, v, sketch_dimension=3, generator=gen(2)))


@pytest.mark.parametrize("seed", range(3))
def test_compactor_matches_kvpress_on_one_head(seed):
    queries_pre, keys_pre, values = (x[:, :1] for x in _layer(seed, s=44))  # 32 middle tokens: 4 whole chunks
    global GROUP
    Phi = _sketch(seed, 1)
    keys, queries = apply_rope(keys_pre), apply_rope(queries_pre)
    group, GROUP = GROUP, 1
    try:
        theirs = kvpress_compactor(queries, keys_pre, keys, values, Phi, blending=0.6)
    finally:
        GROUP = group
    ours = compactor_scores(queries, keys, values, keys_pre_rope=keys_pre, sketch=Phi, sketch_dimension=6,
                            chunk_size=8, blending=0.6)
    assert compare(ours, theirs, budgets=(13, 20, 30, 43)) < 1e-13
    rotated_back = compactor_scores(queries, keys, values, rope_base=BASE, sketch=Phi, sketch_dimension=6,
                                    chunk_size=8, blending=0.6)
    assert torch.allclose(rotated_back, ours, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_compactor_on_a_layer_with_its_groups_matches_kvpress(seed):
    queries_pre, keys_pre, values = _layer(seed, s=44)
    Phi = _sketch(seed)
    keys, queries = apply_rope(keys_pre), apply_rope(queries_pre)
    theirs = kvpress_compactor(queries, keys_pre, keys, values, Phi, blending=0.6)
    options = dict(keys_pre_rope=repeat_kv(keys_pre), sketch=repeat_kv(Phi), sketch_dimension=6, chunk_size=8,
                   blending=0.6)
    ours = per_head(compactor_scores, queries, keys, values, num_key_value_groups=GROUP, **options)
    assert compare(ours, theirs, budgets=(13, 20, 30, 43)) < 1e-13
    per_query_head = per_head(compactor_scores, queries, keys, values, **options)  # z-scores per query head
    assert float((per_query_head - ours)[torch.isfinite(ours)].abs().max()) > 0.1
    with pytest.raises(ValueError, match="`num_key_value_groups` must divide"):
        compactor_scores(queries, repeat_kv(keys), repeat_kv(values), num_key_value_groups=3, **options)


def test_random_is_reproducible_and_uniform():
    queries, keys, values = _layer(0)
    k = repeat_kv(keys)
    first = random_scores(queries, k, k, generator=gen(5))
    assert torch.equal(first, random_scores(queries, k, k, generator=gen(5)))
    assert not torch.equal(first, random_scores(queries, k, k, generator=gen(6)))
    assert ((first >= 0) & (first < 1)).all()
    # a uniform kept set: every token is kept with probability b/n (here 10/40) over many draws
    q1, k1 = queries[0, 0], keys[0, 0]
    hits = torch.zeros(S)
    for seed in range(400):
        hits[random_scores(q1, k1, k1, generator=gen(seed)).topk(10).indices] += 1
    assert (hits / 400 - 0.25).abs().max() < 0.1


# ---- the contract, for every scorer ------------------------------------------------------------------------

SCORERS = {
    "knorm": (knorm_scores, {}),
    "random": (random_scores, {}),
    "observed-attention": (observed_attention_scores, {}),
    "tova": (tova_scores, {}),
    "keydiff": (keydiff_scores, {}),
    "expected-attention": (expected_attention_scores, {"rope_base": BASE}),
    "leverage-score": (key_leverage_scores, {"keys_pre_rope": lambda q, k, v: k}),
    "cur": (cur_scores, {}),
    "cur-sketched": (cur_scores, {"sketch_dimension": 3}),
    "cap": (cap_scores, {"rope_base": BASE}),
    "compactor": (compactor_scores, {"keys_pre_rope": lambda q, k, v: k, "chunk_size": 5}),
    "criticalkv": (criticalkv_scores, {"base_options": {"window": 4}, "budget": 8}),
    "caote": (caote_scores, {"window": 3}),
}


def _context(dtype=torch.float64, n=24, seed=3, batch=(2, 3)):
    g = gen(seed)
    q, k, v = (torch.randn(*batch, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    mask = torch.ones(batch[0], 1, n, dtype=torch.bool)
    mask[0, :, :5] = False  # left padding
    mask[1, :, 17:] = False  # right padding
    return q, k, v, mask


def _options(name, q, k, v):
    score, options = SCORERS[name]
    return score, {key: (value(q, k, v) if callable(value) else value) for key, value in options.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", SCORERS)
def test_scores_have_the_contracts_shape_dtype_and_infinities(name, dtype):
    q, k, v, mask = _context(dtype)
    score, options = _options(name, q, k, v)
    scores = score(q, k, v, key_mask=mask, generator=gen(0), **options)
    assert scores.shape == (2, 3, 24) and scores.dtype == dtype
    padded = ~mask.expand(2, 3, 24)
    assert (scores[padded] == -math.inf).all()
    assert not torch.isnan(scores).any() and (scores[~padded] > -math.inf).all()
    # padding cannot leak: the real tokens' scores do not depend on what the padded slots hold
    garbage = [torch.where(padded.unsqueeze(-1), 7 * torch.ones_like(x), x) for x in (q, k, v)]
    again = score(*garbage, key_mask=mask, generator=gen(0), **_options(name, *garbage)[1])
    assert torch.allclose(again[~padded], scores[~padded], rtol=1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("name", SCORERS)
def test_a_full_budget_keeps_every_token_and_gives_exact_attention(name):
    n, context_length = 30, 22
    g = gen(11)
    q, k, v = (torch.randn(2, 3, n, D, generator=g, dtype=torch.float64) for _ in range(3))
    c = slice(0, context_length)
    score, options = _options(name, q[..., c, :], k[..., c, :], v[..., c, :])
    scores = score(q[..., c, :], k[..., c, :], v[..., c, :], generator=gen(0), **options)
    kept = scores.topk(context_length, dim=-1).indices
    assert torch.equal(kept.sort(-1).values, torch.arange(context_length).expand(2, 3, context_length))
    continuation = attend_compressed(q, k, v, kept, context_length, None)
    exact = approxlab.exact_attention(q, k, v, causal=True)[..., context_length:, :]
    assert float((continuation - exact).abs().max()) < 1e-12


@pytest.mark.parametrize("name", SCORERS)
def test_bad_inputs_are_refused_with_their_names(name):
    q, k, v, mask = _context()
    score, options = _options(name, q, k, v)
    with pytest.raises(ValueError, match="`q` and `k` must be the same context"):
        score(q[..., :-1, :], k, v, **options)
    with pytest.raises(ValueError, match="key_mask"):
        score(q, k, v, key_mask=mask[..., :-1], **options)


MODULES = ("knorm", "random", "observed_attention", "tova", "keydiff", "expected_attention", "leverage_score", "cur",
           "compactor", "cap", "criticalkv", "caote")


@pytest.mark.parametrize("module", MODULES)
def test_registration_declares_the_contract(module):
    registration = importlib.import_module(f"approxlab.methods.{module}").REGISTRATION
    score = registration["score"]
    assert {"score", "target", "features", "randomized", "inputs"} <= set(registration) <= {
        "score", "target", "features", "randomized", "inputs", "draws"}
    assert ("draws" in registration) == registration["randomized"]  # a randomized policy exposes its draw
    assert registration["target"] == "softmax"
    assert registration["features"] == "context tokens kept (the cache budget b)"
    parameters = inspect.signature(score).parameters
    assert list(parameters)[:3] == ["q", "k", "v"]
    assert {"generator", "key_mask"} <= {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert all(name in parameters for name in registration["inputs"])
    assert registration["randomized"] == (module in ("random", "leverage_score", "compactor"))


@pytest.mark.parametrize("name", ["random", "leverage-score", "cur-sketched", "compactor"])
def test_randomized_scorers_are_reproducible_from_their_generator(name):
    q, k, v, mask = _context()
    score, options = _options(name, q, k, v)
    first = score(q, k, v, key_mask=mask, generator=gen(21), **options)
    assert torch.equal(first, score(q, k, v, key_mask=mask, generator=gen(21), **options))
    assert not torch.equal(first, score(q, k, v, key_mask=mask, generator=gen(22), **options))
