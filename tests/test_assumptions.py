"""The theorem assumptions measured on attention matrices (approxlab.assumptions), against brute force.

Each quantity is recomputed here entry by entry, in float64, from its paper's definition: HyperAttention's
alpha (n max_j ||D^-1 A e_j||^2) and kappa (max/min row sum of A without each row's heavy entries), Alman
and Song's entry bound, the sink mass, stable and numerical rank.
"""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import gen

from approxlab.assumptions import (QUANTITIES, entry_bounds, hyperattention_alpha, hyperattention_kappa,
                                   measure_assumptions, sink_mass)


def _qk(n=40, p=8, batch=(3,), seed=0, scale=1.5):
    g = gen(seed)
    return tuple(scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))


def _dense(q, k, causal=True):
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        logits = logits.masked_fill(~torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril(), -math.inf)
    return logits, torch.softmax(logits, dim=-1)


def _brute_kappa(logits, heavy):
    sums = []
    for row in logits:
        values = sorted((math.exp(x) for x in row.tolist() if x > -math.inf), reverse=True)
        sums.append(sum(values[heavy:]))
    return max(sums) / min(sums)


def test_alpha_is_n_times_the_largest_squared_column_norm():
    q, k = _qk(seed=1)
    _, probabilities = _dense(q, k)
    for h in range(3):
        expected = 40 * max(sum(probabilities[h, i, j].item() ** 2 for i in range(40)) for j in range(40))
        assert float(hyperattention_alpha(probabilities[h])) == pytest.approx(expected, rel=1e-12)
    uniform = torch.full((2, 16, 16), 1 / 16, dtype=torch.float64)
    torch.testing.assert_close(hyperattention_alpha(uniform), torch.ones(2, dtype=torch.float64))
    # Row 0 of a causal P is e_0: alpha >= n; and alpha >= ||P||_F^2 always.
    alpha = hyperattention_alpha(probabilities)
    assert bool((alpha >= 40).all()) and bool((alpha >= probabilities.square().sum((-2, -1))).all())


@pytest.mark.parametrize("heavy", [0, 1, 5])
def test_kappa_is_the_light_row_sum_ratio(heavy):
    q, k = _qk(n=12, seed=2 + heavy)
    logits, _ = _dense(q, k, causal=False)
    for h in range(3):
        assert float(hyperattention_kappa(logits[h], heavy=heavy)) == pytest.approx(
            _brute_kappa(logits[h], heavy), rel=1e-10)
    with pytest.raises(ValueError, match=r"`heavy` must be an integer with 0 <= heavy <= 11; got 12"):
        hyperattention_kappa(logits, heavy=12)


def test_kappa_does_not_overflow_where_a_would():
    logits = torch.tensor([[800.0, 0.0], [700.0, 1.0]], dtype=torch.float64)  # e^800 overflows float64
    assert float(hyperattention_kappa(logits, heavy=0)) == pytest.approx(math.exp(100), rel=1e-12)


def test_entry_bounds():
    q, k = _qk(n=20, seed=3)
    entry, logit = entry_bounds(q, k)
    logits, _ = _dense(q, k)
    for h in range(3):
        finite = logits[h][torch.isfinite(logits[h])]
        assert float(logit[h]) == pytest.approx(float(finite.abs().max()), rel=1e-14)
        assert float(entry[h]) == pytest.approx(8**0.25 * max(float(q[h].abs().max()), float(k[h].abs().max())))
    assert bool((logit.sqrt() <= entry).all())  # |s_ij| <= B^2 whatever the split
    _, unmasked = entry_bounds(q, k, causal=False)
    assert bool((unmasked >= logit).all())


def test_sink_mass():
    _, probabilities = _dense(*_qk(seed=4))
    expected = probabilities[..., 1:, 0].mean(-1)
    torch.testing.assert_close(sink_mass(probabilities), expected, rtol=0, atol=0)
    causal_uniform = torch.ones(30, 30, dtype=torch.float64).tril()
    causal_uniform = causal_uniform / causal_uniform.sum(-1, keepdim=True)
    harmonic = sum(1 / i for i in range(1, 31))
    assert float(sink_mass(causal_uniform)) == pytest.approx((harmonic - 1) / 29, rel=1e-12)


@pytest.mark.parametrize("rank_max_n", [0, 64])  # Golub-Kahan or the dense SVD for ||P||_2
def test_measure_assumptions_against_brute_force(rank_max_n):
    q, k = _qk(n=36, seed=5)
    found = measure_assumptions(q.float(), k.float(), heavy=3, rank_max_n=rank_max_n, generator=gen(6))
    assert sorted(found) == sorted(QUANTITIES) and all(v.dtype == torch.float64 and v.shape == (3,)
                                                        for v in found.values())
    q, k = q.float().double(), k.float().double()
    logits, probabilities = _dense(q, k)
    sigma = torch.linalg.svdvals(probabilities)
    block_logits, block = _dense(q[:, 18:], k[:, :18], causal=False)
    for h in range(3):
        column_norms = probabilities[h].square().sum(0)
        expected = {
            "alpha": 36 * float(column_norms.max()), "alpha_without_first": 36 * float(column_norms[1:].max()),
            "alpha_block": 18 * float(block[h].square().sum(0).max()),
            "alpha_block_without_first": 18 * float(block[h].square().sum(0)[1:].max()),
            "kappa": _brute_kappa(block_logits[h], 3), "kappa_all_entries": _brute_kappa(block_logits[h], 0),
            "sink_mass": float(probabilities[h, 1:, 0].mean()), "sink_heaviest": float(column_norms.argmax() == 0),
            "frobenius_norm": float(probabilities[h].norm()), "spectral_norm": float(sigma[h, 0]),
            "stable_rank": float(probabilities[h].norm() ** 2 / sigma[h, 0] ** 2),
            "logit_bound": float(logits[h][torch.isfinite(logits[h])].abs().max()),
            "entry_bound": 8**0.25 * max(float(q[h].abs().max()), float(k[h].abs().max())),
        }
        for name, value in expected.items():
            assert float(found[name][h]) == pytest.approx(value, rel=1e-9), name
        if rank_max_n:
            assert float(found["numerical_rank"][h]) == float((sigma[h] > 1e-6 * sigma[h, 0]).sum())
        else:
            assert math.isnan(float(found["numerical_rank"][h]))


def test_measure_assumptions_bidirectional_and_errors():
    q, k = _qk(n=10, seed=7)
    found = measure_assumptions(q, k, causal=False, generator=gen(0))
    assert bool(found["kappa"].isnan().all()) and bool((found["alpha"] < 10 * 10).all())
    with pytest.raises(ValueError, match=r"at least 2 positions"):
        measure_assumptions(q[:, :1], k[:, :1])
    with pytest.raises(ValueError, match=r"`causal=True` needs self-attention"):
        measure_assumptions(q, k[:, :5])
    with pytest.raises(ValueError, match=r"`rtol` must satisfy 0 < rtol < 1; got 1.0"):
        measure_assumptions(q, k, rtol=1.0)
