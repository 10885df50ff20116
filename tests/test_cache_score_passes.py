"""The blockwise passes behind the attention-based cache scores against their former, full-width forms.

H2O's and observed attention's column sums (:func:`approxlab.cache._column_sums.column_sums`) form only the
causal triangle and never the softmax weights; Compactor's chunked attention
(:func:`approxlab.methods.compactor.chunked_attention_received`) forms only the columns of each row block's
chunks. Each is compared here with the row-normalised, full-width pass it replaced (written out below), on the
same inputs, with padding at either end and broadcast batches: equal to rounding (the order of the sums).
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.cache._column_sums import column_sums
from approxlab.methods._selection import logit_blocks, safe_softmax
from approxlab.methods.compactor import chunked_attention_received
from _helpers import gen


def _former_column_sums(q, k, key_mask):
    """Every row's causal softmax over all ``n`` columns, normalised, times its real-query weight, summed."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = k.shape[-2]
    total = q.new_zeros(*batch, n)
    real = None if key_mask is None else key_mask.expand(*batch, n)
    for start, stop, logits in logit_blocks(q, k, causal=True, key_mask=key_mask):
        weights = safe_softmax(logits)
        if real is not None:
            weights = weights * real[..., start:stop].unsqueeze(-1).to(weights.dtype)
        total += weights.sum(-2)
    return total


def _former_chunked(q, k, used, chunk):
    """Every row's softmax over all ``n`` columns, the other chunks' and the unused ones at -inf."""
    logits = (q @ k.transpose(-1, -2)).expand(*used.shape, used.shape[-1])
    visible = (chunk[..., :, None] == chunk[..., None, :]) & used[..., None, :]
    return (safe_softmax(logits.masked_fill(~visible, -math.inf)) * used[..., :, None]).sum(-2)


def _padded(n, generator):
    """``(2, 3, n)`` key masks: none padded, the first sequence left-padded, one head's right-padded, and one
    sequence with a single real token."""
    mask = torch.ones(2, 3, n, dtype=torch.bool)
    mask[0, :, : n // 5] = False
    mask[1, 1, -n // 4:] = False
    mask[1, 2, :-1] = False
    return mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n", [1, 37, 700])
def test_column_sums_equal_the_normalised_rows_summed(monkeypatch, dtype, masked, n):
    monkeypatch.setattr("approxlab.cache._column_sums.block_rows", lambda batch, width: 64)  # several blocks
    g = gen(n)
    q = 3 * torch.randn(2, 3, n, 16, generator=g, dtype=dtype)
    k = 3 * torch.randn(3, n, 16, generator=g, dtype=dtype)  # broadcast over the first dimension
    key_mask = _padded(n, g) if masked else None
    fast, former = column_sums(q, k, key_mask), _former_column_sums(q, k, key_mask)
    assert fast.shape == former.shape == (2, 3, n) and fast.dtype == dtype
    scale = float(former.abs().max())
    assert float((fast - former).abs().max()) <= 64 * n * torch.finfo(dtype).eps * max(scale, 1.0)
    if masked:
        assert bool((fast.masked_select(~key_mask) == 0).all())  # padding receives nothing


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 5000])
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_attention_equals_the_full_width_softmax(dtype, chunk_size, masked):
    n = 600
    g = gen(chunk_size)
    q = torch.randn(2, 3, n, 16, generator=g, dtype=dtype)
    k = torch.randn(3, n, 16, generator=g, dtype=dtype)
    used = _padded(n, g) if masked else torch.ones(2, 3, n, dtype=torch.bool)
    used[..., :8] = False  # the sinks at both ends
    used[..., -4:] = False
    ranks = used.long().cumsum(-1) - 1
    chunk = torch.where(used, ranks.clamp_min(0) // chunk_size, torch.full_like(ranks, -1))
    fast, former = chunked_attention_received(q, k, used, chunk), _former_chunked(q, k, used, chunk)
    scale = float(former.abs().max())
    assert float((fast - former).abs().max()) <= 64 * n * torch.finfo(dtype).eps * max(scale, 1.0)
    assert bool((fast.masked_select(~used) == 0).all())


@pytest.mark.parametrize("scores", ["cache", "dense"])
def test_h2o_steps_keep_algorithm_1_through_exact_ties(scores):
    """Keys far below the query's direction get weight exactly 0 (the exponential underflows): their accumulated
    attention ties at 0, and the step evicts the oldest of them, as Algorithm 1 (by hand) does."""
    from test_cache_policies import _h2o_cache_by_hand, _logits, _masked_softmax

    g = gen(11)
    n, p = 80, 6
    direction = torch.randn(p, generator=g, dtype=torch.float64)
    q = direction.expand(2, n, p).clone()
    low = torch.rand(2, n, generator=g) < 0.6  # tokens whose weight underflows to 0 beside any other token
    low[:, 0] = False
    k = torch.where(low.unsqueeze(-1), -400.0 * direction, 400.0 * direction) + 1e-3 * torch.randn(
        2, n, p, generator=g, dtype=torch.float64)
    v = torch.randn(2, n, 3, generator=g, dtype=torch.float64)
    result = approxlab.approximate("h2o", q, k, v, num_features=9, recent_size=3, scores=scores, causal=True)
    keep = torch.stack([_h2o_cache_by_hand(q[b], k[b], 9, 3, scores) for b in range(2)])
    columns = result.operator().columns  # (2, n, 9): the cache of every row, full from row 9 on
    held = torch.zeros_like(keep).scatter_(-1, columns, True)
    assert torch.equal(held[:, 9:], keep[:, 9:])  # the same tokens held, those of weight 0 included
    expected = _masked_softmax(_logits(q, k), keep)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)


def test_column_sums_differentiate_as_the_former_pass():
    g = gen(5)
    q, k = (torch.randn(2, 40, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    key_mask = torch.ones(2, 40, dtype=torch.bool)
    key_mask[1, :7] = False
    weights = torch.randn(2, 40, generator=g, dtype=torch.float64)
    grads = [torch.autograd.grad((f(q, k, key_mask) * weights).sum(), (q, k))
             for f in (column_sums, _former_column_sums)]
    for fast, former in zip(*grads):
        assert bool(torch.isfinite(fast).all())
        torch.testing.assert_close(fast, former, rtol=1e-10, atol=1e-12)


def test_h2o_output_differentiates_as_before_the_steps_changed():
    """The decode steps' in-place updates leave the output's gradient finite and equal to that of the softmax
    over the same caches."""
    from test_cache_policies import _h2o_cache_by_hand, _logits, _masked_softmax

    g = gen(6)
    q, k, v = (torch.randn(2, 70, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    output = approxlab.approximate("h2o", q, k, v, num_features=9, recent_size=3, causal=True).output
    keep = torch.stack([_h2o_cache_by_hand(q[b].detach(), k[b].detach(), 9, 3, "cache") for b in range(2)])
    expected = _masked_softmax(_logits(q, k), keep) @ v
    weights = torch.randn(2, 70, 6, generator=g, dtype=torch.float64)
    ours = torch.autograd.grad((output * weights).sum(), (q, k, v))
    theirs = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        assert bool(torch.isfinite(a).all())
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
