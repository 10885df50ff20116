"""Nyström approximation, column sampling, stable core pseudo-inverse, and the ``nystrom`` method."""

import pytest
import torch

import approxlab
from approxlab import kernels, linalg, sketch
from approxlab.errors import NotPSDError
from approxlab.synthetic import matrix_with_singular_values, psd_matrix, synthetic_qkv

SEEDS = range(25)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _psd(seed, n=30, batch=(2,), rank=None):
    eig = 2.0 ** (-torch.arange(n, dtype=torch.float64) / 2.0)
    if rank is not None:
        eig[rank:] = 0.0
    return psd_matrix(eig.expand(*batch, n).clone(), generator=_gen(seed))


def test_nystrom_with_all_columns_is_exact():
    """Lemma 2 of the Nystromformer supplement / K K^+ K = K: all columns reproduce K, for full
    rank and rank-deficient PSD K, any column order, with repeats."""
    for seed in SEEDS:
        K = _psd(seed, rank=None if seed % 2 else 12)
        perm = torch.randperm(30, generator=_gen(50 + seed))
        cols = torch.cat([perm, perm[:5]])
        approx = sketch.nystrom(K, cols)
        torch.testing.assert_close(approx, K, rtol=0, atol=1e-11 * float(K.abs().max()))


def test_nystrom_is_below_k_in_loewner_order_and_repeat_invariant():
    """Skyformer Appendix D: K~ = B P B^T with P an orthogonal projector, so 0 <= K~ <= K; repeated
    columns (Definition 1 samples with replacement) do not change K~."""
    for seed in SEEDS:
        K = _psd(seed)
        cols = sketch.uniform_columns(30, 8, batch_shape=(2,), generator=_gen(seed))
        approx = sketch.nystrom(K, cols)
        gap = torch.linalg.eigvalsh(K - approx)
        assert float(gap.min()) >= -1e-10
        assert float(torch.linalg.eigvalsh(approx).min()) >= -1e-10
        repeated = torch.cat([cols, cols[..., :3]], -1)
        torch.testing.assert_close(sketch.nystrom(K, repeated), approx, rtol=1e-9, atol=1e-10)


def test_stable_pinv_penrose_conditions_and_threshold():
    """stable_pinv is the Moore-Penrose inverse of the numerically-rank-revealed core: the four
    Penrose conditions hold for rank-deficient PSD and general matrices, and it matches
    torch.linalg.pinv on well-conditioned ones."""
    for seed in SEEDS:
        m = _psd(seed, n=12, rank=7)
        z = linalg.stable_pinv(m)
        torch.testing.assert_close(m @ z @ m, m, rtol=0, atol=1e-12)
        torch.testing.assert_close(z @ m @ z, z, rtol=0, atol=1e-9)
        torch.testing.assert_close(m @ z, (m @ z).transpose(-1, -2), rtol=0, atol=1e-10)
        s = torch.ones(2, 10, dtype=torch.float64)
        s[:, 6:] = 0.0
        s[:, :6] = torch.linspace(1, 3, 6, dtype=torch.float64)
        a = matrix_with_singular_values(s, generator=_gen(seed))
        za = linalg.stable_pinv(a, hermitian=False)
        torch.testing.assert_close(a @ za @ a, a, rtol=0, atol=1e-12)
        torch.testing.assert_close(za @ a @ za, za, rtol=0, atol=1e-12)
        well = _psd(seed, n=8, rank=None)
        torch.testing.assert_close(linalg.stable_pinv(well), torch.linalg.pinv(well), rtol=1e-8, atol=1e-10)
    # Eigenvalues below rcond * max are dropped, not inverted (unlike flooring at 1e-12).
    tiny = torch.diag(torch.tensor([1.0, 1e-17], dtype=torch.float64))
    torch.testing.assert_close(linalg.stable_pinv(tiny), torch.diag(torch.tensor([1.0, 0.0], dtype=torch.float64)))


def test_uniform_columns_properties():
    for seed in SEEDS:
        cols = sketch.uniform_columns(20, 7, batch_shape=(3, 2), generator=_gen(seed))
        assert cols.shape == (3, 2, 7) and cols.dtype == torch.long
        assert int(cols.min()) >= 0 and int(cols.max()) < 20
        assert bool((cols.sort(-1).values.diff(dim=-1) > 0).all())  # distinct
        again = sketch.uniform_columns(20, 7, batch_shape=(3, 2), generator=_gen(seed))
        assert torch.equal(cols, again)
    with_rep = sketch.uniform_columns(5, 50, generator=_gen(0), replace=True)
    assert with_rep.shape == (50,) and int(with_rep.max()) < 5
    # Uniform: every index appears with frequency ~ 1/N (deterministic seed, 4-sigma band).
    counts = torch.bincount(sketch.uniform_columns(10, 20000, generator=_gen(1), replace=True), minlength=10)
    assert bool(((counts - 2000).abs() < 4 * (2000 * 0.9) ** 0.5).all())


def test_ridge_leverage_columns_follow_scores():
    scores = torch.tensor([[4.0, 0.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    cols = sketch.ridge_leverage_columns(scores, 20000, generator=_gen(0))
    counts = torch.bincount(cols.reshape(-1), minlength=5).double()
    expected = 20000 * scores[0] / scores.sum()
    assert counts[1] == 0
    assert bool(((counts - expected).abs() <= 4 * expected.clamp_min(1).sqrt()).all())
    distinct = sketch.ridge_leverage_columns(scores, 4, generator=_gen(1), replace=False)
    assert sorted(distinct[0].tolist()) == [0, 2, 3, 4]
    with pytest.raises(ValueError, match=r"`scores` must have at least 5 positive entries per batch element"):
        sketch.ridge_leverage_columns(scores, 5, generator=_gen(1), replace=False)
    with pytest.raises(ValueError, match=r"`scores` must be >= 0"):
        sketch.ridge_leverage_columns(-scores, 2, generator=_gen(1))


def test_nystrom_method_all_landmarks_is_exact_softmax():
    """Nystromformer supplement Lemma 2: with all n landmarks Nystrom reproduces D^{-1}A."""
    for seed in range(10):
        q, k, v = synthetic_qkv((2,), 24, 6, scale=0.8, generator=_gen(seed))
        result = approxlab.approximate("nystrom", q, k, v, num_features=24, generator=_gen(seed))
        torch.testing.assert_close(result.matrix(), kernels.softmax_matrix(q, k), rtol=0, atol=1e-9)
        torch.testing.assert_close(result.output, approxlab.exact_attention(q, k, v), rtol=0, atol=1e-9)


def test_nystrom_method_equals_direct_formula():
    """The overflow-safe route equals A_{:,S} A_SS^{-1} A_{S,:}, row-normalised (invertible core)."""
    for seed in range(15):
        q, k, v = synthetic_qkv((2,), 30, 8, scale=1.0, generator=_gen(seed))
        result = approxlab.approximate("nystrom", q, k, v, num_features=6, generator=_gen(seed))
        cols = result.info["columns"]
        a = kernels.score_matrix(q, k)
        a_cols = torch.gather(a, -1, cols.unsqueeze(-2).expand(2, 30, 6))
        a_rows = sketch.gather_rows(a, cols)
        a_core = torch.gather(a_rows, -1, cols.unsqueeze(-2).expand(2, 6, 6))
        direct = a_cols @ torch.linalg.solve(a_core, a_rows)
        direct = direct / direct.sum(-1, keepdim=True)
        torch.testing.assert_close(result.matrix(), direct, rtol=1e-7, atol=1e-9)
        assert bool((result.info["core_rank"] == 6).all())


def test_nystrom_ridge_leverage_sampling():
    """Ridge-leverage sampling draws distinct landmarks from approximate scores of kappa(K', K')."""
    q, k, v = synthetic_qkv((2, 2), 40, 8, generator=_gen(3))
    result = approxlab.approximate("nystrom", q, k, v, num_features=10, generator=_gen(4), sampling="ridge-leverage")
    cols = result.info["columns"]
    assert cols.shape == (2, 2, 10)
    assert bool((cols.sort(-1).values.diff(dim=-1) > 0).all())
    assert result.info["ridge_lambda"] == pytest.approx(4.0)
    scores = result.info["ridge_leverage_scores"]
    assert scores.shape == (2, 2, 40) and bool((scores >= 0).all())
    # Exact scores of the key kernel lower-bound the (unweighted) pilot estimate.
    from approxlab.leverage import ridge_leverage_scores

    exact = ridge_leverage_scores(kernels.kernelized_matrix(k, k), 4.0)
    assert bool((scores >= exact - 1e-10).all())
    again = approxlab.approximate("nystrom", q, k, v, num_features=10, generator=_gen(4), sampling="ridge-leverage")
    assert torch.equal(again.output, result.output)


def test_nystrom_float32_large_logits_finite():
    """float32 logits of +-80: every factor is computed bounded by 1, outputs are finite."""
    g = _gen(0)
    p = 16
    direction = torch.randn(p, generator=g)
    direction = direction / direction.norm()
    radius = (80.0 * p**0.5) ** 0.5
    signs = torch.where(torch.rand(3, 48, 1, generator=g) < 0.5, -1.0, 1.0)
    q = radius * (signs * direction + 0.02 * torch.randn(3, 48, p, generator=g))
    k = radius * (signs * direction + 0.02 * torch.randn(3, 48, p, generator=g))
    v = torch.randn(3, 48, p, generator=g)
    assert float(kernels.scaled_logits(q, k).abs().max()) > 75
    for sampling in ("uniform", "ridge-leverage"):
        result = approxlab.approximate("nystrom", q, k, v, num_features=12, generator=_gen(1), sampling=sampling)
        assert bool(torch.isfinite(result.output).all())
        assert bool(torch.isfinite(result.info["min_abs_row_sum"]).all())


def test_validation_messages():
    q, k, v = synthetic_qkv((2,), 16, 4, generator=_gen(0))
    with pytest.raises(ValueError, match=r"`sampling` must be one of \['ridge-leverage', 'rpcholesky', 'uniform'\]; got 'leverage'"):
        approxlab.approximate("nystrom", q, k, v, num_features=4, sampling="leverage")
    with pytest.raises(ValueError, match=r"`columns` must hold indices in \[0, 16\); got values in \[0, 16\]"):
        approxlab.approximate("nystrom", q, k, v, num_features=2, columns=torch.tensor([0, 16]))
    with pytest.raises(ValueError, match=r"`columns` must hold num_features=3 indices when given; got 2"):
        approxlab.approximate("nystrom", q, k, v, num_features=3, columns=torch.tensor([0, 5]))
    with pytest.raises(TypeError, match=r"`columns` must have an integer dtype"):
        approxlab.approximate("nystrom", q, k, v, num_features=2, columns=torch.tensor([0.0, 5.0]))
    with pytest.raises(ValueError, match=r"`columns` must have shape \(d,\) or \(\*batch, d\) with batch \(2,\)"):
        approxlab.approximate("nystrom", q, k, v, num_features=2, columns=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`ridge_lambda` must be a finite number > 0; got -1.0"):
        approxlab.approximate("nystrom", q, k, v, num_features=2, sampling="ridge-leverage", ridge_lambda=-1.0)
    with pytest.raises(ValueError, match=r"`q` and `k` must have the same length n for plain Nyström"):
        approxlab.methods.get("nystrom")(q[..., :8, :], k, v, num_features=2, generator=_gen(0))
    with pytest.raises(ValueError, match=r"`d` must be an integer with 1 <= d <= 5; got 6"):
        sketch.uniform_columns(5, 6, generator=_gen(0))
    with pytest.raises(NotPSDError, match=r"`K` must be symmetric positive semidefinite"):
        sketch.nystrom(torch.triu(torch.ones(4, 4, dtype=torch.float64)), torch.tensor([0, 1]))
    with pytest.raises(NotPSDError, match=r"the sampled Nyström core S\^T K S must be positive semidefinite"):
        sketch.nystrom(-torch.eye(4, dtype=torch.float64), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"`core` must be 'pinv' for a non-symmetric core block"):
        linalg.nystrom_core(torch.eye(3, dtype=torch.float64), core="schulz", hermitian=False)
    with pytest.raises(ValueError, match=r"`rcond` must be a finite number > 0"):
        linalg.stable_pinv(torch.eye(3, dtype=torch.float64), rcond=0.0)


def test_same_seed_same_output_and_operator_consistency():
    q, k, v = synthetic_qkv((2, 3), 32, 8, generator=_gen(5))
    for sampling in ("uniform", "ridge-leverage"):
        first = approxlab.approximate("nystrom", q, k, v, num_features=8, generator=_gen(6), sampling=sampling)
        second = approxlab.approximate("nystrom", q, k, v, num_features=8, generator=_gen(6), sampling=sampling)
        assert torch.equal(first.output, second.output)
        torch.testing.assert_close(first.operator().matmat(v), first.output, rtol=1e-9, atol=1e-9)
        other = approxlab.approximate("nystrom", q, k, v, num_features=8, generator=_gen(7), sampling=sampling)
        assert not torch.equal(first.output, other.output)
