"""What the assumption verdicts rest on (approxlab.assumptions): each quantity against a hand-computed case.

HyperAttention's alpha on every block of its causal recursion (Algorithm 4) and kappa with sortLSH's own mask
(Algorithm 1), the uniform-sampling cost alpha / eps^2, Alman and Song's split bounds and labels, Performer's
Lemma 2 (relative variance e^{||x+y||^2} - 1 over r) and the logit-scale control, growth exponents over windows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from _helpers import gen

import approxlab
from approxlab.assumptions import (LABELS, QUANTITIES, STRUCTURAL, attention_weighted_xy_norm, balanced_entry_bound,
                                   block_levels, bounded_entries_label, entry_bounds, entry_ratio,
                                   growth_exponent_interval, growth_exponents, hyperattention_alpha,
                                   hyperattention_kappa, kappa_with_mask, measure_assumptions,
                                   positive_feature_relative_variance, relative_error_at_scale, sortlsh_kappa,
                                   uniform_samples_needed)
from approxlab.assumptions.hyperattention import _median
from approxlab.methods.hyperattention import causal_blocks, num_blocks
from approxlab.methods.performer import gaussian_random_features, positive_random_features
from approxlab.metrics import spectral_error
from approxlab.sortlsh import sortlsh_mask
from approxlab.stats import t_interval


def _qk(n, p=8, batch=(2,), seed=0, scale=1.5):
    g = gen(seed)
    return tuple(scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))


def _light_sums(logits, mask):
    """Brute force: each row's sum of e^{s_ij} over the entries the mask keeps, as Python floats."""
    return [sum(math.exp(x) for x, heavy in zip(row, flags) if not heavy)
            for row, flags in zip(logits.tolist(), mask.tolist())]


def _ratio(sums):
    return max(sums) / min(sums)


# HyperAttention: the causal recursion and alpha

@pytest.mark.parametrize("n, block_size, min_seq_len", [(20, 3, 0), (64, 8, 0), (1000, 256, 0), (37, 4, 9), (5, 8, 0)])
def test_causal_blocks_tile_the_causal_pattern_as_the_method_splits_it(n, block_size, min_seq_len):
    blocks = causal_blocks(n, block_size=block_size, min_seq_len=min_seq_len)
    assert len(blocks) == num_blocks(n, block_size=block_size, min_seq_len=min_seq_len, causal=True)
    covered = torch.zeros(n, n, dtype=torch.int64)
    for block in blocks:
        covered[block.rows, block.columns] += 1
        width = block.columns.stop - block.columns.start
        assert block.rows.start == block.columns.stop and block.rows.stop - block.rows.start <= width  # ceil split
    leaves = covered.sum(-1) == 0  # what no block holds is the diagonal pieces, computed exactly
    strictly_lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
    assert int(covered.max()) <= 1 and bool(((covered == 1) <= strictly_lower).all())
    assert bool(leaves.any()) or n == 0
    draw = approxlab.methods.draw("hyperattention", torch.zeros(1, n, 4), torch.zeros(1, n, 4), num_features=2,
                                  causal=True, block_size=block_size, min_seq_len=min_seq_len, generator=gen(0))
    assert draw["column_uniforms"].shape[-2] == len(blocks)  # the method draws once per block listed


def test_alpha_is_structural_for_every_causal_matrix():
    """Row 0 of a causal row-stochastic P is e_0, so alpha >= n, at any logit scale."""
    assert "alpha" in STRUCTURAL and set(STRUCTURAL) <= set(QUANTITIES)
    for seed, scale in ((0, 0.0), (1, 1.0), (2, 30.0), (3, 300.0)):
        logits = scale * torch.randn(3, 17, 17, generator=gen(seed), dtype=torch.float64)
        logits = logits.masked_fill(~torch.ones(17, 17, dtype=torch.bool).tril(), -math.inf)
        assert bool((hyperattention_alpha(torch.softmax(logits, -1)) >= 17 * (1 - 1e-12)).all())
    q, k = _qk(33, seed=4, scale=10.0)
    assert bool((measure_assumptions(q, k, hashes=1, generator=gen(0))["alpha"] >= 33 * (1 - 1e-12)).all())


def test_block_levels_against_brute_force_on_every_block():
    q, k = _qk(20, p=4, batch=(2,), seed=5)
    planes = torch.randn(2, 3, 2, 4, generator=gen(6), dtype=torch.float64)  # 3 hashes of 2 bits per head
    levels = block_levels(q, k, block_size=3, heavy=2, hyperplanes=planes)
    blocks = causal_blocks(20, block_size=3)
    assert [level.depth for level in levels] == [0, 1, 2]
    assert sum(len(level.rows) for level in levels) == len(blocks)
    by_depth = {d: [b for b in blocks if b.depth == d] for d in range(3)}
    for level in levels:
        assert level.alpha.shape == (2, len(by_depth[level.depth]))
        for i, block in enumerate(by_depth[level.depth]):
            rows, columns = block.rows.stop - block.rows.start, block.columns.stop - block.columns.start
            assert (level.rows[i], level.columns[i]) == (rows, columns)
            for h in range(2):
                a, b = q[h, block.rows], k[h, block.columns]
                logits = a @ b.T / 2.0
                p = torch.softmax(logits, -1)
                alpha = rows * max(sum(p[i_, j].item() ** 2 for i_ in range(rows)) for j in range(columns))
                top = logits.topk(min(2, columns - 1), -1).indices
                oracle = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top, True)
                none = torch.zeros_like(oracle)
                sortlsh = [_ratio(_light_sums(logits, sortlsh_mask(a, b, block_size=3, hyperplanes=planes[h, t])))
                           for t in range(3)] if columns > 3 else [math.nan] * 3
                expected = {"alpha": alpha, "kappa_oracle": _ratio(_light_sums(logits, oracle)),
                            "kappa_all_entries": _ratio(_light_sums(logits, none)),
                            "kappa_sortlsh": sorted(sortlsh)[1]}
                for name, value in expected.items():
                    found = float(getattr(level, name)[h, i])
                    assert (math.isnan(found) and math.isnan(value)) or found == pytest.approx(value, rel=1e-10), name
    even = measure_assumptions(q, k, heavy=2, block_size=3, hyperplanes=planes)
    torch.testing.assert_close(levels[0].alpha[:, 0], even["alpha_block"], rtol=1e-12, atol=0)
    torch.testing.assert_close(levels[0].kappa_oracle[:, 0], even["kappa"], rtol=1e-12, atol=0)
    torch.testing.assert_close(levels[0].kappa_sortlsh[:, 0], even["kappa_sortlsh"], rtol=1e-12, atol=0)


def test_uniform_sampling_needs_alpha_over_eps_squared_samples():
    """E||Y^ - PV||_F^2 = (c sum_j ||P e_j||^2 ||v_j||^2 - ||PV||_F^2) / m <= (c/r) alpha ||V||_F^2 / m: exact
    expectation over the c equally likely columns of one sample, then m = alpha / eps^2 samples."""
    g = gen(7)
    p = torch.softmax(3 * torch.randn(6, 9, generator=g, dtype=torch.float64), -1)
    v = torch.randn(9, 3, generator=g, dtype=torch.float64)
    exact, r, c = p @ v, 6, 9
    one_sample = sum(((c * torch.outer(p[:, j], v[j]) - exact) ** 2).sum().item() for j in range(c)) / c
    formula = c * sum(p[:, j].square().sum().item() * v[j].square().sum().item() for j in range(c)) - \
        exact.square().sum().item()
    assert one_sample == pytest.approx(formula, rel=1e-12)
    assert one_sample <= c / r * float(hyperattention_alpha(p)) * v.square().sum().item() * (1 + 1e-12)
    # Nearly tight for P = I, V = I: alpha = c, and m = alpha / eps^2 samples give E <= eps^2 ||V||_F^2.
    for eps in (0.5, 0.1):
        m = math.ceil(uniform_samples_needed(10.0, epsilon=eps))
        assert (10 * 10 - 10) / m <= eps**2 * 10
    level = block_levels(*_qk(16, seed=8), block_size=4, hashes=0)[0]
    assert bool((level.samples_needed(epsilon=0.5) == level.alpha * 4).all())
    assert bool((level.sampling_saves_nothing(epsilon=0.5) == (level.alpha * 4 >= 8)).all())


# HyperAttention: kappa with sortLSH's mask

def test_sortlsh_kappa_hand_computed():
    """Two one-bit hashes of four 2-d tokens (sortlsh.HeavyBlocks' example): blocks {0, 2}, {1, 3} and {0, 1}, {2, 3}."""
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.5], [-1.0, 0.5]], dtype=torch.float64)
    planes = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)  # (hashes, bits, p)
    c = 1 / math.sqrt(2)
    first = (1 + math.exp(0.25 * c)) / 2  # rows 2, 3 keep e^{-c} + e^{-0.75 c}; rows 0, 1 keep 2 e^{-c}
    found = sortlsh_kappa(x, x, block_size=2, hyperplanes=planes, per_hash=True)
    torch.testing.assert_close(found, torch.tensor([first, 1.0], dtype=torch.float64), rtol=1e-14, atol=0)
    assert float(sortlsh_kappa(x, x, block_size=2, hyperplanes=planes)) == pytest.approx((first + 1) / 2, rel=1e-14)
    assert math.isnan(float(sortlsh_kappa(x, x, block_size=4, hyperplanes=planes)))  # one block holds every key
    assert _median(torch.tensor([3.0, math.inf, 1.0])) == 3.0 and math.isnan(float(_median(torch.tensor([1.0, math.nan]))))


def test_sortlsh_kappa_is_reproducible_and_batched_in_head_order():
    q, k = _qk(48, batch=(2, 3), seed=9)
    first = sortlsh_kappa(q, k, block_size=8, hashes=4, generator=gen(1))
    assert first.shape == (2, 3) and torch.equal(first, sortlsh_kappa(q, k, block_size=8, hashes=4, generator=gen(1)))
    alone = sortlsh_kappa(q[1, 2], k[1, 2], block_size=8, hashes=4,
                          hyperplanes=approxlab.sortlsh.draw_hyperplanes((2, 3, 4), 7, 8, generator=gen(1))[1, 2])
    assert float(alone) == float(first[1, 2])


def test_light_row_sums_are_ordered_but_kappa_is_not():
    """Per row, r_oracle <= r_sortlsh <= r_none when b <= heavy; the ratio of max to min row sum need not be."""
    q, k = _qk(64, batch=(3,), seed=10, scale=2.0)
    logits = q @ k.transpose(-1, -2) / math.sqrt(8)
    planes = approxlab.sortlsh.draw_hyperplanes((3,), 7, 8, generator=gen(11))
    mask = sortlsh_mask(q, k, block_size=8, hyperplanes=planes)
    top = torch.zeros_like(mask).scatter(-1, logits.topk(8, -1).indices, True)
    for h in range(3):
        oracle, lsh, none = (_light_sums(logits[h], m) for m in (top[h], mask[h], torch.zeros_like(mask[h])))
        assert all(a <= b * (1 + 1e-12) and b <= c * (1 + 1e-12) for a, b, c in zip(oracle, lsh, none))
    # A mask that misses the heavy entry of row 0 but removes one of row 1 raises kappa above no removal ...
    logits = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    missed = torch.tensor([[False, False, True], [True, False, False]])
    assert float(kappa_with_mask(logits, missed)) > float(hyperattention_kappa(logits, heavy=0))
    # ... and removing the heavy entry of one row only can leave kappa below the oracle's.
    logits = torch.tensor([[10.0, 5.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    partial = torch.tensor([[True, False, False], [False, False, False]])
    assert float(kappa_with_mask(logits, partial)) < float(hyperattention_kappa(logits, heavy=1))


def test_measure_assumptions_new_keys_leave_the_old_ones_unchanged():
    q, k = _qk(36, batch=(3,), seed=5)
    planes = approxlab.sortlsh.draw_hyperplanes((3, 2), 7, 8, generator=gen(2))
    base = measure_assumptions(q, k, heavy=3, rank_max_n=0, hashes=1, generator=gen(6))
    other = measure_assumptions(q, k, heavy=3, rank_max_n=0, block_size=4, hyperplanes=planes, generator=gen(6))
    assert list(base) == list(QUANTITIES)
    for name in list(QUANTITIES)[:14]:  # the columns of every earlier table: the hashes are drawn after them
        assert torch.equal(base[name], other[name]) or bool(base[name].isnan().all()), name
    torch.testing.assert_close(other["kappa_oracle"], other["kappa"], rtol=0, atol=0)
    expected = sortlsh_kappa(q[:, 18:], k[:, :18], block_size=4, hyperplanes=planes)
    torch.testing.assert_close(other["kappa_sortlsh"], expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(other["performer_xy_norm"], attention_weighted_xy_norm(q, k), rtol=0, atol=0)
    torch.testing.assert_close(other["entry_ratio"], other["logit_bound"].sqrt() / math.sqrt(math.log(36)))
    torch.testing.assert_close(other["entry_ratio_model_split"], other["entry_bound"] / math.sqrt(math.log(36)))
    torch.testing.assert_close(other["entry_bound_balanced"], balanced_entry_bound(q, k))
    bidirectional = measure_assumptions(q, k, causal=False, hashes=1, generator=gen(0))
    assert bool(bidirectional["kappa_sortlsh"].isnan().all()) and bool(bidirectional["kappa_oracle"].isnan().all())


# Alman and Song

def test_split_bounds_are_ordered_and_labelled():
    q, k = _qk(30, batch=(4,), seed=12)
    q = q * torch.tensor([0.1, 1.0, 3.0, 10.0], dtype=torch.float64).reshape(4, 1, 1)  # unequal Q, K scales
    model, logit = entry_bounds(q, k, causal=False)
    balanced = balanced_entry_bound(q, k)
    assert bool((logit.sqrt() <= balanced * (1 + 1e-12)).all()) and bool((balanced <= model * (1 + 1e-12)).all())
    x, y = torch.full((2, 4), 4.0, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
    assert float(balanced_entry_bound(x, y)) == pytest.approx(2 * math.sqrt(2.0), rel=1e-15)  # 4^(1/4) sqrt(4 * 1)
    assert entry_ratio(2.0, 512, base=2) == pytest.approx(2.0 / 3.0, rel=1e-15)
    ratios = entry_ratio(torch.tensor([1.0, 2.0]), 100)
    torch.testing.assert_close(entry_ratio(torch.tensor([1.0, 2.0]), 100, base=2), ratios * math.sqrt(math.log(2)))
    assert bounded_entries_label(1.2) == LABELS[0] == "fails for every split"
    assert bounded_entries_label(0.4) == "undetermined" and bounded_entries_label(1.0) == "undetermined"
    assert bounded_entries_label(0.4, explicit_ratio=0.9) == "holds for an explicit split"
    assert bounded_entries_label(1.2, threshold=1.5) == "undetermined"
    assert bounded_entries_label(torch.tensor([1.3, 0.3]), explicit_ratio=[2.0, 1.7]).tolist() == [
        "fails for every split", "undetermined"]


# Performer

def test_lemma2_relative_variance_of_positive_features():
    """Performer Lemma 2: with r i.i.d. Gaussian features, E[(A^ / A - 1)^2] = (e^{||x+y||^2} - 1) / r.

    2,000 independent estimates per case; the Monte Carlo mean of a squared relative error with these
    ||x+y||^2 has a relative standard error below 6%, so a 25% tolerance fails with probability < 1e-4."""
    for seed, size in ((0, 0.3), (1, 0.6), (2, 0.9)):
        g = gen(seed)
        x = torch.randn(1, 4, generator=g, dtype=torch.float64)
        x, y = size * x / x.norm(), 0.3 * torch.randn(1, 4, generator=g, dtype=torch.float64)
        z = float((x + y).square().sum())
        w = gaussian_random_features(8, 4, batch_shape=(2000,), orthogonal=False, generator=g)  # (2000, 8, 4)
        estimate = (positive_random_features(x.expand(2000, 1, 4), w)
                    @ positive_random_features(y.expand(2000, 1, 4), w).transpose(-1, -2)).reshape(-1)
        measured = float(((estimate / math.exp(float(x @ y.T)) - 1) ** 2).mean())
        assert measured == pytest.approx(positive_feature_relative_variance(z, 8), rel=0.25)
    torch.testing.assert_close(positive_feature_relative_variance(torch.tensor([0.0, 1.0]), 2),
                               torch.tensor([0.0, (math.e - 1) / 2], dtype=torch.float64))


def test_attention_weighted_xy_norm_hand_computed():
    q = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    # p = 4: x = q / sqrt(2): ||x_i + y_j||^2 = 2 (i + j)^2; causal weights / 3 on z = 0 | 2, 8 | 8, 18, 32
    found = [float(attention_weighted_xy_norm(q, q, quantile=t)) for t in (0.3, 0.5, 0.9)]
    assert found == pytest.approx([0.0, 8.0, 32.0], abs=1e-12)
    assert float(attention_weighted_xy_norm(q, q, causal=False)) == pytest.approx(18.0, abs=1e-12)


def test_relative_error_at_scale_is_the_error_of_the_rescaled_problem():
    q, k = _qk(32, batch=(2,), seed=13, scale=3.0)
    v = torch.randn(2, 32, 4, generator=gen(14), dtype=torch.float64)
    found = relative_error_at_scale("performer", q, k, v, num_features=16, scale=0.5, generator=gen(1))
    approx = approxlab.approximate("performer", q / 2, k / 2, v, num_features=16, causal=True, generator=gen(1))
    expected = spectral_error(approx.output, approxlab.exact_attention(q / 2, k / 2, v, causal=True), relative=True)
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
    assert found.shape == (2,) and float(relative_error_at_scale("exact", q, k, v, num_features=1, scale=1.0).max()) < 1e-14


# Growth exponents and their interval

def test_growth_exponents_and_their_t_interval_over_windows():
    n = [256, 512, 1024, 2048]
    assert growth_exponents(n, [[7 * m**0.25 for m in n]]).tolist() == pytest.approx([0.25], abs=1e-12)
    slopes = np.array([0.1, 0.5, 0.3])
    windows = [[2.0 * m**s for m in n] for s in slopes]
    interval = growth_exponent_interval(n, windows)
    half = scipy.stats.t.ppf(0.975, 2) * slopes.std(ddof=1) / math.sqrt(3)
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((0.3, 0.3 - half, 0.3 + half), abs=1e-12)
    one = growth_exponent_interval(n, windows[:1])
    assert one.estimate == pytest.approx(0.1) and math.isnan(one.low) and math.isnan(one.high)
    assert t_interval([2.0, 2.0]).low == 2.0


# Validation

def test_validation_names_the_parameter():
    q, k = _qk(16, seed=15)
    with pytest.raises(ValueError, match=r"`hashes` must be an integer with 1 <= hashes <= inf; got 0"):
        sortlsh_kappa(q, k, hashes=0)
    with pytest.raises(ValueError, match=r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"):
        block_levels(q, k, block_size=0)
    with pytest.raises(ValueError, match=r"`hyperplanes` must have shape \(\*batch, hashes, bits, p\)"):
        sortlsh_kappa(q, k, hyperplanes=torch.zeros(3, 1, 7, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`order` must be one of"):
        sortlsh_kappa(q, k, order="sorted")
    with pytest.raises(TypeError, match=r"`heavy_mask` must be a bool torch.Tensor"):
        kappa_with_mask(q @ k.transpose(-1, -2), torch.zeros(2, 16, 16))
    with pytest.raises(ValueError, match=r"`heavy_mask` must broadcast to the shape of `logits`"):
        kappa_with_mask(q @ k.transpose(-1, -2), torch.zeros(2, 16, 15, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"`causal=True` needs self-attention"):
        block_levels(q, k[:, :8])
    with pytest.raises(ValueError, match=r"`epsilon` must be a finite number > 0; got 0.0"):
        uniform_samples_needed(1.0, epsilon=0.0)
    with pytest.raises(ValueError, match=r"`alpha` must be non-negative"):
        uniform_samples_needed(torch.tensor([-1.0]), epsilon=0.1)
    with pytest.raises(ValueError, match=r"`n` must be an integer with n >= 2; got 1"):
        entry_ratio(1.0, 1)
    with pytest.raises(ValueError, match=r"`base` must be a number > 1; got 1.0"):
        entry_ratio(1.0, 10, base=1.0)
    with pytest.raises(ValueError, match=r"`lower_ratio` must hold finite non-negative ratios"):
        bounded_entries_label(float("nan"))
    with pytest.raises(ValueError, match=r"`explicit_ratio` must have the shape of `lower_ratio`"):
        bounded_entries_label([1.0, 2.0], explicit_ratio=[1.0])
    with pytest.raises(ValueError, match=r"`quantile` must satisfy 0 < quantile < 1; got 1.0"):
        attention_weighted_xy_norm(q, k, quantile=1.0)
    with pytest.raises(ValueError, match=r"`xy_norm` must be a finite number >= 0; got -1.0"):
        positive_feature_relative_variance(-1.0, 4)
    with pytest.raises(ValueError, match=r"`scale` must be a finite number > 0; got 0.0"):
        relative_error_at_scale("performer", q, k, k, num_features=4, scale=0.0)
    with pytest.raises(ValueError, match=r"`lengths` must hold at least 4 distinct lengths, none repeated; got"):
        growth_exponents([1, 2, 4], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"`values` must be positive and finite"):
        growth_exponents([1, 2, 4, 8], [1.0, 2.0, 0.0, 3.0])
    with pytest.raises(ValueError, match=r"`values` must have shape \(\*windows, 4\)"):
        growth_exponents([1, 2, 4, 8], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"`values` must hold at least one finite number per unit"):
        t_interval([])
    with pytest.raises(ValueError, match=r"`hashes` must be an integer with 1 <= hashes <= inf; got 0"):
        measure_assumptions(q, k, hashes=0)
