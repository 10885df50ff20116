"""Sparse-prefill methods (MInference, XAttention, DuoAttention; FlexPrefill in test_flexprefill.py) against small
re-implementations written here.

Each reference re-derives the method's selection from the paper and the authors' code as read, by loops over
rows, blocks and diagonals on tiny tensors, then attends the kept keys by a dense masked softmax: the kept
sets must be equal and the outputs agree to rounding. Causality: changing a later key leaves earlier rows
unmoved.
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen


def _qkv(n=40, p=6, batch=(2, 3), seed=0, dtype=torch.float64):
    g = gen(seed)
    return tuple(torch.randn(*batch, n, p, generator=g, dtype=dtype) for _ in range(3))


def _masked_attention(q, k, v, keep):
    """Dense softmax over ``keep`` ``(*batch, n, n)`` bool."""
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1) @ v


def _kept(approx):
    """The kept sets ``(*batch, n, n)`` bool read from the method's operator."""
    return approx.operator().to_dense() > 0


def _top(scores, count):
    """Indices of the ``count`` largest of a 1-D list (ties: the first)."""
    return set(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:count])


def _vertical_slash_reference(q, k, vertical, slash, last, forced_vertical, forced_slash):
    n, p = q.shape
    keep = torch.zeros(n, n, dtype=torch.bool)
    L = min(last, n)
    columns, diagonals = [0.0] * n, [0.0] * n
    for r in range(n - L, n):
        logits = [float(q[r] @ k[j]) / math.sqrt(p) for j in range(r + 1)]
        top = max(logits)
        total = sum(math.exp(x - top) for x in logits)
        for j, x in enumerate(logits):
            columns[j] += math.exp(x - top) / total
            diagonals[r - j] += math.exp(x - top) / total
    columns = [math.inf if j < forced_vertical else c for j, c in enumerate(columns)]
    diagonals = [math.inf if o < forced_slash else d for o, d in enumerate(diagonals)]
    kept_columns, kept_offsets = _top(columns, vertical), _top(diagonals, slash)
    for i in range(n):
        for j in range(i + 1):
            keep[i, j] = j in kept_columns or (i - j) in kept_offsets
    return keep


@pytest.mark.parametrize("seed", range(3))
def test_minference_vertical_slash_matches_the_reference_selection(seed):
    q, k, v = _qkv(seed=seed)
    options = dict(vertical_size=5, last_queries=12, forced_vertical=2, forced_slash=3)
    approx = approxlab.approximate("minference", q, k, v, num_features=14, causal=True, **options)
    keep = torch.stack([torch.stack([_vertical_slash_reference(q[a, h], k[a, h], 5, 9, 12, 2, 3)
                                     for h in range(3)]) for a in range(2)])
    assert torch.equal(_kept(approx), keep)
    torch.testing.assert_close(approx.output, _masked_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_minference_block_sparse_matches_the_reference_selection(seed):
    q, k, v = _qkv(n=37, seed=seed)  # a last block of 5 of 8 rows, zero-padded as the authors pad
    size, budget = 8, 14  # two key blocks per query block
    approx = approxlab.approximate("minference", q, k, v, num_features=budget, causal=True, pattern="block-sparse",
                                   block_size=size)
    keep = torch.zeros(2, 3, 37, 37, dtype=torch.bool)
    for a in range(2):
        for h in range(3):
            means = lambda x: [x[a, h, s:s + size].sum(0) / size for s in range(0, 37, size)]  # noqa: E731
            qm, km = means(q), means(k)
            for block in range(len(qm)):
                chosen = _top([float(qm[block] @ km[j]) for j in range(block + 1)], 2)
                for i in range(block * size, min(37, block * size + size)):
                    for j in range(i + 1):
                        keep[a, h, i, j] = j // size in chosen
    assert torch.equal(_kept(approx), keep)
    torch.testing.assert_close(approx.output, _masked_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)


def test_minference_a_shape_is_streaming_llm_with_its_sinks():
    q, k, v = _qkv()
    approx = approxlab.approximate("minference", q, k, v, num_features=12, causal=True, pattern="a-shape", sinks=4)
    same = approxlab.approximate("streaming-llm", q, k, v, num_features=12, causal=True, sinks=4)
    torch.testing.assert_close(approx.output, same.output, rtol=1e-12, atol=1e-12)
    halved = approxlab.approximate("minference", q, k, v, num_features=6, causal=True, pattern="a-shape", sinks=100)
    assert halved.info["columns"].sum() == 3 and halved.info["offsets"].sum() == 3  # sinks capped at b // 2


METHODS = [("minference", {}), ("minference", {"pattern": "block-sparse", "block_size": 4}),
           ("minference", {"pattern": "a-shape"}), ("xattention", {"block_size": 4, "stride": 2}),
           ("flexprefill", {"block_size": 4, "min_budget": 4, "gamma": 0.8}),
           ("duo-attention", {"sinks": 2, "retrieval_heads": torch.tensor(False)})]  # every head streaming


@pytest.mark.parametrize("name, options", METHODS)
def test_rows_attend_no_later_key_and_no_later_value(name, options):
    """The kept entries are causal (``j <= i``) and a later value never moves an earlier row. (The selection
    itself reads the whole prompt, as a prefill method does: see the next test.)"""
    q, k, v = _qkv()
    before = approxlab.approximate(name, q, k, v, num_features=10, causal=True, **options)
    assert not _kept(before).triu(1).any()
    v2 = v.clone()
    v2[..., -1, :] -= 3.0
    after = approxlab.approximate(name, q, k, v2, num_features=10, causal=True, **options).output
    assert torch.equal(before.output[..., :-1, :], after[..., :-1, :])
    assert not torch.equal(before.output[..., -1, :], after[..., -1, :])


def test_block_sparse_later_key_moves_only_its_own_query_block():
    """Block-sparse pools whole blocks: a key reaches the selection of its own query block's earlier rows (the
    authors' pooling), never a row of an earlier block."""
    q, k, v = _qkv()
    options = dict(num_features=8, causal=True, pattern="block-sparse", block_size=4)
    before = approxlab.approximate("minference", q, k, v, **options).output
    k2 = k.clone()
    k2[..., -1, :] += 5.0
    after = approxlab.approximate("minference", q, k2, v, **options).output
    assert torch.equal(before[..., :36, :], after[..., :36, :])
    assert not torch.equal(before[..., 36:39, :], after[..., 36:39, :])


@pytest.mark.parametrize("name, options", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes(name, options, dtype):
    q, k, v = _qkv(n=24, batch=(2,), dtype=dtype)
    approx = approxlab.approximate(name, q, k, v[..., :3], num_features=8, causal=True, **options)
    assert approx.output.shape == (2, 24, 3) and approx.output.dtype == dtype
    single = approxlab.approximate(name, q[0], k[0], v[0, :, :3], num_features=8, causal=True, **options)
    torch.testing.assert_close(single.output, approx.output[0])


def test_minference_full_budget_is_exact_attention():
    q, k, v = _qkv()
    exact = approxlab.exact_attention(q, k, v, causal=True)
    for options in ({"vertical_size": 0}, {"pattern": "block-sparse", "block_size": 8}):
        approx = approxlab.approximate("minference", q, k, v, num_features=40, causal=True, **options)
        torch.testing.assert_close(approx.output, exact, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options, match", [
    ({"pattern": "vertical"}, r"`pattern` must be one of .*'vertical-slash'.*; got 'vertical'"),
    ({"vertical_size": 10}, r"`vertical_size` must be .*got 10"),
    ({"block_size": 0, "pattern": "block-sparse"}, r"`block_size` must be .*got 0"),
    ({"last_queries": 0}, r"`last_queries` must be .*got 0"),
    ({"causal": False}, r"'minference' is causal-only"),
])
def test_minference_refuses_bad_options_by_name(options, match):
    q, k, v = _qkv(n=16)
    causal = options.pop("causal", True)
    with pytest.raises(ValueError, match=match):
        approxlab.approximate("minference", q, k, v, num_features=10, causal=causal, **options)


def _xattention_reference(q, k, block, stride, threshold, cap):
    """XAttention's causal prefill selection from the paper and ``xattn_estimate``/``find_blocks_chunked`` as read,
    by loops, for one head ``(n, p)``: the kept key blocks per query block."""
    n, p = q.shape
    blocks = -(-n // block)
    padded = blocks * block
    qp = torch.cat([q, q.new_zeros(padded - n, p)])
    kp = torch.cat([k, k.new_zeros(padded - n, p)])
    groups = padded // stride
    real = [h * stride < n for h in range(groups)]
    mass = [[0.0] * blocks for _ in range(blocks)]
    for g in range(groups):
        if not real[g]:
            continue
        logits = [sum(float(qp[g * stride + stride - 1 - s] @ kp[h * stride + s]) for s in range(stride))
                  / (stride * math.sqrt(p)) for h in range(g + 1) if real[h]]
        top = max(logits)
        total = sum(math.exp(x - top) for x in logits)
        for h, x in enumerate(logits):
            mass[g * stride // block][h * stride // block] += math.exp(x - top) / total
    kept = []
    for I in range(blocks):
        forced = sorted({0, I})
        others = sorted((J for J in range(I + 1) if J not in forced), key=lambda J: -mass[I][J])
        chosen, sofar, need = list(forced), sum(mass[I][J] for J in forced), threshold * sum(mass[I])
        for J in others:
            if sofar >= need:
                break
            chosen.append(J)
            sofar += mass[I][J]
        kept.append(set(chosen[:cap]))
    return kept


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("threshold, budget", [(0.6, 58), (0.9, 58), (0.9, 16)])
def test_xattention_matches_the_reference_selection(seed, threshold, budget):
    q, k, v = _qkv(n=58, seed=seed)  # 8 blocks of 8, the last of 2 rows
    approx = approxlab.approximate("xattention", q, k, v, num_features=budget, causal=True, threshold=threshold,
                                   block_size=8, stride=4)
    keep = torch.zeros(2, 3, 58, 58, dtype=torch.bool)
    for a in range(2):
        for h in range(3):
            kept = _xattention_reference(q[a, h], k[a, h], 8, 4, threshold, max(2, -(-budget // 8)))
            for i in range(58):
                for j in range(i + 1):
                    keep[a, h, i, j] = j // 8 in kept[i // 8]
    assert torch.equal(_kept(approx), keep)
    torch.testing.assert_close(approx.output, _masked_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)
    if threshold == 0.6 and budget == 58:
        assert not keep.tril().all()  # the threshold drops blocks


def test_xattention_full_threshold_is_exact_and_the_cap_binds():
    q, k, v = _qkv(n=32)
    exact = approxlab.exact_attention(q, k, v, causal=True)
    full = approxlab.approximate("xattention", q, k, v, num_features=32, causal=True, threshold=1.0, block_size=8,
                                 stride=4)
    torch.testing.assert_close(full.output, exact, rtol=1e-12, atol=1e-12)
    capped = approxlab.approximate("xattention", q, k, v, num_features=16, causal=True, threshold=1.0,
                                   block_size=8, stride=4)
    assert int(capped.info["blocks"].sum(-1).max()) == 2


@pytest.mark.parametrize("options, match", [
    ({"threshold": 0.0}, r"`threshold` must be .*got 0.0"),
    ({"threshold": 1.5}, r"`threshold` must be in \(0, 1\]; got 1.5"),
    ({"block_size": 6, "stride": 4}, r"`block_size` must be a multiple of `stride` \(4\); got 6"),
    ({"stride": 0}, r"`stride` must be .*got 0"),
])
def test_xattention_refuses_bad_options_by_name(options, match):
    q, k, v = _qkv(n=16)
    with pytest.raises(ValueError, match=match):
        approxlab.approximate("xattention", q, k, v, num_features=10, causal=True, **options)


def test_duo_attention_heads_are_full_causal_or_streaming_llm():
    q, k, v = _qkv()
    split = torch.tensor([True, False, True])
    approx = approxlab.approximate("duo-attention", q, k, v, num_features=10, causal=True, sinks=3,
                                   retrieval_heads=split)
    exact = approxlab.exact_attention(q, k, v, causal=True)
    streaming = approxlab.approximate("streaming-llm", q, k, v, num_features=10, causal=True, sinks=3).output
    torch.testing.assert_close(approx.output[:, split], exact[:, split], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(approx.output[:, ~split], streaming[:, ~split], rtol=1e-12, atol=1e-12)


def _dropped_reference(q, k, sinks, window):
    """Mean over rows of the causal softmax mass outside the sinks and window, by loops, one head ``(n, p)``."""
    n, p = q.shape
    total = 0.0
    for i in range(n):
        weights = torch.softmax(torch.stack([q[i] @ k[j] for j in range(i + 1)]) / math.sqrt(p), dim=0)
        total += sum(float(weights[j]) for j in range(i + 1) if j >= sinks and i - j >= window)
    return total / n


@pytest.mark.parametrize("seed", range(3))
def test_duo_head_split_ranks_heads_by_the_mass_streaming_drops(seed):
    from approxlab.methods.duo_attention import dropped_mass, duo_head_split

    q, k, v = _qkv(n=30, batch=(2, 5), seed=seed)
    scale = torch.tensor([0.2, 3.0, 1.0, 0.5, 2.0]).view(5, 1, 1)
    q = q * scale
    reference = torch.tensor([[_dropped_reference(q[a, h], k[a, h], 2, 5) for h in range(5)] for a in range(2)],
                             dtype=torch.float64)
    torch.testing.assert_close(dropped_mass(q, k, sinks=2, window=5), reference, rtol=1e-12, atol=1e-12)
    split = duo_head_split(q, k, sinks=2, window=5, retrieval_fraction=0.4)
    expected = torch.zeros(2, 5, dtype=torch.bool)
    for a in range(2):
        expected[a, sorted(range(5), key=lambda h: -float(reference[a, h]))[:2]] = True
    assert torch.equal(split, expected)
    approx = approxlab.approximate("duo-attention", q, k, v, num_features=7, causal=True, sinks=2,
                                   retrieval_fraction=0.4)
    assert torch.equal(approx.info["retrieval_heads"], expected)  # the default split: the inputs' own


@pytest.mark.parametrize("options, error, match", [
    ({"retrieval_heads": [True, False, True]}, TypeError, r"`retrieval_heads` must be a bool tensor .*got \[True"),
    ({"retrieval_heads": torch.ones(4, dtype=torch.bool)}, ValueError, r"`retrieval_heads` must broadcast to the "
                                                                        r"batch shape \(2, 3\); got shape \(4,\)"),
    ({"retrieval_fraction": 1.5}, ValueError, r"`retrieval_fraction` must be in \[0, 1\]; got 1.5"),
    ({"sinks": -1}, ValueError, r"`sinks` must be .*got -1"),
])
def test_duo_attention_refuses_bad_options_by_name(options, error, match):
    q, k, v = _qkv(n=16)
    with pytest.raises(error, match=match):
        approxlab.approximate("duo-attention", q, k, v, num_features=10, causal=True, **options)


@pytest.mark.parametrize("name, options", [("minference", {"forced_vertical": 2, "forced_slash": 4}),
                                           ("minference", {"pattern": "block-sparse", "block_size": 8}),
                                           ("xattention", {"block_size": 8, "stride": 4}),
                                           ("flexprefill", {"block_size": 8, "min_budget": 8}),
                                           ("duo-attention", {"sinks": 2})])
def test_patch_attention_runs_them_over_the_whole_sequence(name, options):
    """Through a tiny Llama (4 query heads on 2 KV heads): the full budget gives the unpatched logits, a small one
    moves them and stays finite."""
    from _helpers import tiny_llama

    model = tiny_llama(64, 2)
    ids = torch.randint(0, 64, (2, 40), generator=gen(0))
    with torch.no_grad():
        reference = model(ids).logits
        full = {"xattention": {"threshold": 1.0}, "flexprefill": {"gamma": 1.0},
                "duo-attention": {"retrieval_heads": torch.tensor(True)},
                "minference": {"vertical_size": 0} if "pattern" not in options else {}}[name]
        with approxlab.patch_attention(model, name, num_features=40, **options, **full):
            torch.testing.assert_close(model(ids).logits, reference, rtol=1e-9, atol=1e-9)
        with approxlab.patch_attention(model, name, num_features=9, **options):
            sparse = model(ids).logits
    assert torch.isfinite(sparse).all() and not torch.allclose(sparse, reference, rtol=1e-6, atol=1e-6)
