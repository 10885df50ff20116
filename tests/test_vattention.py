"""vattention: the (epsilon, delta) guarantee over many draws, its sample size, and its edges."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.methods.vattention import sample_size
from approxlab.synthetic import synthetic_qkv
from _helpers import gen

FAILURE_PROBABILITY = 1e-6
"""The probability that a correct implementation fails one (epsilon, delta, input) case of the theorem test."""


def _binomial_quantile(trials: int, probability: float, tail: float) -> int:
    """The smallest ``c`` with ``P(Binomial(trials, probability) > c) <= tail`` (exact, in the log domain)."""
    log_p, log_q = math.log(probability), math.log1p(-probability)
    terms = [math.lgamma(trials + 1) - math.lgamma(s + 1) - math.lgamma(trials - s + 1) + s * log_p
             + (trials - s) * log_q for s in range(trials + 1)]
    upper = 0.0
    for c in range(trials, -1, -1):  # upper = P(X > c - 1) after adding term c
        upper += math.exp(terms[c])
        if upper > tail:
            return c
    return 0


def _inputs(kind: str):
    """Peaked (logit std about 2.6) or flat (about 0.16) attention over 256 keys; values with mean 1, so
    that :math:`\\|o_i\\|` is of order 1 and the relative error is a demanding but reachable target."""
    scale = {"peaked": 1.6, "flat": 0.4}[kind]
    q, k, v = synthetic_qkv((2,), 256, 16, scale=scale, generator=gen(0))
    return q, k, v + 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["peaked", "flat"])
@pytest.mark.parametrize("epsilon, delta", [(0.1, 0.1), (0.2, 0.05), (0.3, 0.2)])
def test_theorem_fraction_of_queries_beyond_epsilon_is_at_most_delta(kind, epsilon, delta):
    """The (epsilon, delta) statement, per query, over draws seeded 0..19.

    Each query's sample is independent of the others' (its own uniforms), and each exceeds epsilon with
    probability at most delta if the statement holds, so the number of failures among the sampled queries is
    stochastically below Binomial(T, delta): the test fails when it exceeds that binomial's upper
    ``FAILURE_PROBABILITY`` quantile (a correct implementation fails with probability at most 1e-6 per case).
    Queries whose tail is attended exactly have no error and are left out, and enough queries must
    sample: at least 1,000 query draws of the 10,240 (otherwise the statement would be checked on
    nothing)."""
    q, k, v = _inputs(kind)
    exact = approxlab.exact_attention(q, k, v)
    failures, trials = 0, 0
    for seed in range(20):
        approx = approxlab.approximate("vattention", q, k, v, num_features=16, epsilon=epsilon, delta=delta,
                                       generator=gen(seed))
        relative = (approx.output - exact).norm(dim=-1) / exact.norm(dim=-1)
        sampled = approx.info["samples"] > 0
        failures += int((relative > epsilon)[sampled].sum())
        assert not bool((relative[~sampled] > 1e-9).any())
        trials += int(sampled.sum())
    assert trials >= 1000, trials
    limit = _binomial_quantile(trials, delta, FAILURE_PROBABILITY)
    assert failures <= limit, (failures, trials, limit)


def test_binomial_quantile_matches_a_direct_sum():
    assert _binomial_quantile(10, 0.5, 0.5) == 5  # P(X > 5) = 0.377 <= 0.5 < P(X > 4) = 0.623
    assert _binomial_quantile(1000, 0.1, 1e-6) > 100


def test_sample_size_formula():
    """b = ceil((1 + sqrt(2 ln(1/delta)))^2 tr(Sigma) / (epsilon D |o|)^2), and it scales as epsilon^-2."""
    trace = torch.tensor([2.0, 0.0], dtype=torch.float64)
    one = torch.ones(2, dtype=torch.float64)
    z = 1 + math.sqrt(2 * math.log(1 / 0.05))
    assert sample_size(trace, one, one, epsilon=0.2, delta=0.05).tolist() == [math.ceil(z * z * 2 / 0.04), 0.0]
    assert float(sample_size(trace, one, one, epsilon=0.1, delta=0.05)[0]) == pytest.approx(
        4 * z * z * 2 / 0.04, abs=1)


def test_statistics_are_the_tails_true_covariance():
    """tr(Sigma) used by the budget is the variance of Z = N_T w_J (v_J - o) over a uniform tail key J."""
    q, k, v = synthetic_qkv((1,), 24, 4, generator=gen(3))
    approx = approxlab.approximate("vattention", q, k, v, num_features=4, epsilon=1.0, delta=0.5,
                                   generator=gen(4))
    logits = q @ k.transpose(-1, -2) / 2.0
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    output = approxlab.exact_attention(q, k, v)
    row = 5
    tail = torch.ones(24, dtype=torch.bool)
    tail[logits[0, row].topk(4).indices] = False
    z = tail.sum() * weights[0, row, tail, None] * (v[0, tail] - output[0, row])
    trace = float(((z - z.mean(0)) ** 2).sum(-1).mean())
    expected = sample_size(torch.tensor([trace], dtype=torch.float64), weights[0, row].sum().reshape(1),
                           output[0, row].norm().reshape(1), epsilon=1.0, delta=0.5)
    assert float(approx.info["required"][0, row]) == float(expected[0])


def test_tiny_epsilon_attends_every_tail_exactly_and_is_exact():
    q, k, v = synthetic_qkv((2,), 64, 8, generator=gen(5))
    for causal in (False, True):
        approx = approxlab.approximate("vattention", q, k, v, num_features=4, epsilon=1e-9, causal=causal,
                                       generator=gen(6))
        assert bool((approx.info["samples"] == 0).all())
        torch.testing.assert_close(approx.output, approxlab.exact_attention(q, k, v, causal=causal),
                                   rtol=1e-10, atol=1e-12)


def test_sinks_window_and_top_keys_are_fixed_and_the_rest_is_the_tail():
    q, k, v = synthetic_qkv((1,), 40, 8, generator=gen(7))
    approx = approxlab.approximate("vattention", q, k, v, num_features=3, sink=2, window=4, causal=True,
                                   generator=gen(8))
    expected = []
    for i in range(40):
        exact = {j for j in range(i + 1) if j < 2 or j > i - 4}
        expected.append(len(exact) + min(3, i + 1 - len(exact)))
    assert approx.info["fixed"][0].tolist() == expected
    assert torch.equal(approx.info["fixed"][0] + approx.info["tail"][0], torch.arange(1, 41))


def test_sampling_is_what_the_estimator_says():
    """The output is (sum_F w v + N_T/b sum_r w_J v_J) / (same with v = 1), with the keys the draw names."""
    q, k, v = synthetic_qkv((1,), 48, 4, generator=gen(9))
    v = v + 1.0
    drawn = approxlab.methods.draw("vattention", q, k, num_features=4, generator=gen(10))
    approx = approxlab.approximate("vattention", q, k, v, num_features=4, epsilon=0.5, delta=0.3, draw=drawn)
    logits = q[0] @ k[0].T / 2.0
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    checked = 0
    for row in range(48):
        samples = int(approx.info["samples"][0, row])
        if samples == 0:
            continue
        fixed = logits[row].topk(4).indices
        tail = torch.tensor([j for j in range(48) if j not in fixed.tolist()])
        keys = tail[(drawn["uniform"][0, row, :samples] * len(tail)).long()]
        numerator = weights[row, fixed] @ v[0, fixed] + len(tail) / samples * weights[row, keys] @ v[0, keys]
        denominator = weights[row, fixed].sum() + len(tail) / samples * weights[row, keys].sum()
        torch.testing.assert_close(approx.output[0, row], numerator / denominator, rtol=1e-12, atol=1e-12)
        checked += 1
    assert checked > 10


def test_bad_options():
    q, k, v = synthetic_qkv((1,), 16, 4, generator=gen(0))
    with pytest.raises(ValueError, match=r"`delta` must be a probability in \(0, 1\); got 1.0"):
        approxlab.approximate("vattention", q, k, v, num_features=2, delta=1.0)
    with pytest.raises(ValueError, match="`epsilon`"):
        approxlab.approximate("vattention", q, k, v, num_features=2, epsilon=0.0)
    with pytest.raises(ValueError, match="`sink`"):
        approxlab.approximate("vattention", q, k, v, num_features=2, sink=-1)


def test_an_uncapped_draw_handed_over_under_the_default_is_read_as_made():
    """A draw of m > 512 variates per query (``max_samples=None``) passed with the default cap gives what it gives
    with ``max_samples=None``; an explicit smaller cap still refuses it, naming the shape."""
    from approxlab.methods.vattention import draw_uniforms, vattention

    q, k, v = (torch.randn(2, 600, 8, generator=gen(seed), dtype=torch.float64) for seed in (1, 2, 3))
    k = 3 * k  # peaked rows: sample sizes below the tail's size
    draw = draw_uniforms(q, k, num_features=16, generator=gen(4), max_samples=None)
    assert draw["uniform"].shape[-1] == 600
    made = vattention(q, k, v, num_features=16, draw=draw, max_samples=None, causal=True)
    handed = vattention(q, k, v, num_features=16, draw=draw, causal=True)
    assert torch.equal(made.output, handed.output)
    with pytest.raises(ValueError, match=r"must have shape \(2, 600, 100\)"):
        vattention(q, k, v, num_features=16, draw=draw, max_samples=100)
