"""The sparse route of the sparse-prefill methods (methods/_sparse_attention.py) against the dense mask route.

Each query block attends only the keys its pattern shows (kept key blocks; kept columns and the key ranges of kept
diagonals); the dense route (:func:`attend_mask`) forms every block's logits against every earlier key. Both must
agree to rounding in float64 -- with a last block shorter than the others, blocks only partly visible, columns that
lie on kept diagonals, heads whose pattern is dense (the fused kernel) and rows that see no key (output 0) -- and
so must every method's output and the dense route on the pattern it reports.
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from _helpers import gen
from approxlab.methods import duo_attention as duo_module
from approxlab.methods import _sparse_attention as sparse_module
from approxlab.methods import minference as minference_module
from approxlab.methods._mask_attention import attend_mask, block_visible
from approxlab.methods._sparse_attention import attend_blocks, attend_vertical_slash, diagonal_template
from approxlab.methods.minference import _diagonal_mask


def _qkv(n, batch=(2, 3), seed=0, p=5):
    g = gen(seed)
    return tuple(torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(3))


def _dense_lse(q, k, visible):
    """Each row's log-normaliser over its visible keys (-inf where it sees none), from the whole logits."""
    n = q.shape[-2]
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.logsumexp(logits.masked_fill(~visible(0, n), -math.inf), dim=-1)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, size", [(37, 8), (64, 16), (23, 7), (5, 8)])
@pytest.mark.parametrize("fused_width", [0, 10**9])  # each query block through the fused kernel; gathered
def test_attend_blocks_equals_the_dense_mask_route(seed, n, size, fused_width, monkeypatch):
    monkeypatch.setattr(sparse_module, "FUSED_WIDTH", fused_width)
    q, k, v = _qkv(n, seed=seed)
    blocks = -(-n // size)
    chosen = torch.rand(2, 3, blocks, blocks, generator=gen(seed + 10)) < 0.4
    chosen[0, 0] = True  # a dense head: the fused kernel
    chosen[1, 2, :, 0] = False  # rows of block 0 see nothing there unless the diagonal is kept
    chosen[1, 1] = torch.eye(blocks, dtype=torch.bool) | (torch.arange(blocks) < blocks // 2)  # contiguous runs
    visible = block_visible(chosen, size)
    out, lse = attend_blocks(q, k, v, chosen, size, return_lse=True)
    _close(out, attend_mask(q, k, v, visible))
    _close(lse, _dense_lse(q, k, visible))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, size", [(37, 8), (64, 16), (23, 7), (5, 8)])
def test_attend_vertical_slash_equals_the_dense_mask_route(seed, n, size):
    q, k, v = _qkv(n, seed=seed)
    g = gen(seed + 20)
    columns, offsets = torch.rand(2, 3, n, generator=g) < 0.25, torch.rand(2, 3, n, generator=g) < 0.25
    offsets[..., 0] = False  # the rows that see no kept column see nothing: output 0
    columns[0, 1] = True  # a dense head: the fused kernel
    columns[1, 0, : n // 2] = offsets[1, 0, : n // 2] = True  # columns on kept diagonals are counted once
    visible = _diagonal_mask(columns, offsets)
    out, lse = attend_vertical_slash(q, k, v, columns, offsets, block_size=size, return_lse=True)
    _close(out, attend_mask(q, k, v, visible))
    _close(lse, _dense_lse(q, k, visible))
    assert bool((out.abs().sum(-1) == 0).any())  # some row saw no key


def test_diagonal_template_is_the_union_of_the_kept_diagonals_ranges():
    g = gen(3)
    offsets = torch.rand(4, 50, generator=g) < 0.1
    relative, valid = diagonal_template(offsets, 6)
    for head in range(4):
        expected = sorted({-o + t for o in offsets[head].nonzero().flatten().tolist() for t in range(6)})
        assert relative[head][valid[head]].tolist() == expected


def _minference_visible(approx, size):
    info = approx.info
    return block_visible(info["blocks"], size) if "blocks" in info else _diagonal_mask(info["columns"],
                                                                                       info["offsets"])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("options", [{}, {"pattern": "a-shape", "sinks": 3}, {"vertical_size": 4},
                                     {"pattern": "block-sparse", "block_size": 4},
                                     {"pattern": "block-sparse", "block_size": 6}])
def test_minference_sparse_output_is_the_dense_mask_route(seed, options, monkeypatch):
    monkeypatch.setattr(minference_module, "VERTICAL_SLASH_BLOCK", 8)  # several query blocks, the last partial
    q, k, v = _qkv(45, seed=seed)
    options = {"last_queries": 9, "forced_vertical": 2, "forced_slash": 3} | options
    approx = approxlab.approximate("minference", q, k, v, num_features=14, causal=True, **options)
    visible = _minference_visible(approx, options.get("block_size", 8))
    _close(approx.output, attend_mask(q, k, v, visible))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("threshold, budget", [(0.9, 45), (0.5, 45), (0.9, 12), (1.0, 45)])
def test_xattention_sparse_output_is_the_dense_mask_route(seed, threshold, budget):
    q, k, v = _qkv(45, seed=seed)
    approx = approxlab.approximate("xattention", q, k, v, num_features=budget, causal=True, threshold=threshold,
                                   block_size=8, stride=4)
    _close(approx.output, attend_mask(q, k, v, block_visible(approx.info["blocks"], 8)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("tau, gamma", [(0.5, 0.8), (0.0, 0.8), (0.1, 0.95)])
def test_flexprefill_sparse_output_is_the_dense_mask_route(seed, tau, gamma):
    q, k, v = _qkv(45, seed=seed)
    approx = approxlab.approximate("flexprefill", q, k, v, num_features=20, causal=True, tau=tau, gamma=gamma,
                                   block_size=6, min_budget=6)
    _close(approx.output, attend_mask(q, k, v, block_visible(approx.info["blocks"], 6)))


def _duo_visible(split, sinks, window):
    def visible(start, stop):
        rows = torch.arange(start, stop).unsqueeze(-1)
        offset = rows - torch.arange(stop)
        streaming = (offset >= 0) & ((offset < window) | (torch.arange(stop) < sinks))
        return streaming | (split[..., None, None] & (offset >= 0))

    return visible


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("given", [True, False])
def test_duo_attention_sparse_output_is_the_dense_mask_route(seed, given, monkeypatch):
    monkeypatch.setattr(duo_module, "STREAMING_BLOCK", 8)  # several query blocks, the last partial
    q, k, v = _qkv(45, seed=seed)
    split = torch.tensor([True, False, False]) if given else None
    approx = approxlab.approximate("duo-attention", q, k, v, num_features=9, causal=True, sinks=3,
                                   retrieval_heads=split)
    used = approx.info["retrieval_heads"]
    assert bool(used.any()) and not bool(used.all())
    _close(approx.output, attend_mask(q, k, v, _duo_visible(used, 3, 6)))


def test_dropped_mass_from_the_log_normalisers_equals_the_dense_sum():
    q, k, _ = _qkv(45, seed=4)
    visible = _duo_visible(torch.tensor(False), 3, 6)
    weights = torch.softmax(((q @ k.transpose(-1, -2)) / math.sqrt(5)).masked_fill(
        ~torch.ones(45, 45, dtype=torch.bool).tril(), -math.inf), dim=-1)
    expected = weights.masked_fill(visible(0, 45), 0.0).sum((-1, -2)) / 45
    _close(duo_module.dropped_mass(q, k, sinks=3, window=6), expected)


@pytest.mark.parametrize("fused_width", [0, 10**9])
def test_gradients_through_the_sparse_route_equal_the_dense_route(fused_width, monkeypatch):
    monkeypatch.setattr(sparse_module, "FUSED_WIDTH", fused_width)
    n, size = 29, 6
    g = gen(7)
    chosen = torch.rand(2, 3, 5, 5, generator=g) < 0.5
    columns, offsets = torch.rand(2, 3, n, generator=g) < 0.2, torch.rand(2, 3, n, generator=g) < 0.2
    columns[0, 0] = True  # a dense head
    for sparse, dense in ((lambda q, k, v: attend_blocks(q, k, v, chosen, size), block_visible(chosen, size)),
                          (lambda q, k, v: attend_vertical_slash(q, k, v, columns, offsets, block_size=size),
                           _diagonal_mask(columns, offsets))):
        grads = []
        for route in (sparse, lambda q, k, v: attend_mask(q, k, v, dense)):
            q, k, v = (x.requires_grad_() for x in _qkv(n, seed=8))
            route(q, k, v).pow(2).sum().backward()
            grads.append([q.grad, k.grad, v.grad])
        for a, b in zip(*grads):
            _close(a, b)
