"""Theorem tests for Skyformer (Chen et al., 2021): Lemma 1, the completion inequality,
Theorem 2 with Lemma C.2's constant, Lemma 3, and the identity behind ``skyformer-softmax``."""

import math

import pytest
import torch

import approxlab
from approxlab import kernels, linalg, sketch
from approxlab.leverage import ridge_leverage_scores
from approxlab.synthetic import synthetic_qkv

SEEDS = range(30)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _completion(q, k):
    """C_bar = kappa(X', X') for X = [Q; K] (Skyformer Eq. (4) with the Gaussian kernel)."""
    x = torch.cat([q, k], -2)
    return kernels.kernelized_matrix(x, x)


def _spec(x):
    return torch.linalg.matrix_norm(x, ord=2)


def test_lemma1_softmax_kernel_is_psd():
    """Skyformer Lemma 1 / Eq. (1): SM(Q, Q) = D_Q^{1/2} kappa(Q/p^{1/4}, Q/p^{1/4}) D_Q^{1/2} is PSD."""
    for seed in SEEDS:
        q, _, _ = synthetic_qkv((2,), 40, 8, scale=1.0 + 0.05 * seed, generator=_gen(seed))
        sm = kernels.score_matrix(q, q)
        half = torch.exp(kernels.log_diag_scale(q))
        factored = half.unsqueeze(-1) * kernels.kernelized_matrix(q, q) * half.unsqueeze(-2)
        torch.testing.assert_close(factored, sm, rtol=1e-10, atol=0)
        evals = torch.linalg.eigvalsh(sm)
        assert bool((evals[..., 0] >= -1e-12 * evals[..., -1]).all())


def test_completion_inequality_and_loewner_order():
    """Skyformer Sec. 4.2 and Appendix D: for every column sample, ||B - B~|| <= ||B_bar - B~_bar||
    (B~ is the (1,2) block of B~_bar, Eq. (6)) and B~_bar <= B_bar in Loewner order; the
    ``skyformer`` method's matrix is exactly that block."""
    for seed in SEEDS:
        q, k, v = synthetic_qkv((2,), 24, 4, scale=0.8, generator=_gen(seed))
        n = 24
        c_bar = _completion(q, k)
        d = 3 + seed % 20
        result = approxlab.approximate("skyformer", q, k, v, num_features=d, generator=_gen(100 + seed))
        cols = result.info["columns"]
        c_bar_tilde = sketch.nystrom(c_bar, cols)
        block = c_bar_tilde[..., :n, n:]
        torch.testing.assert_close(result.matrix(), block, rtol=1e-8, atol=1e-10)
        c = kernels.kernelized_matrix(q, k)
        assert bool((_spec(c - block) <= _spec(c_bar - c_bar_tilde) + 1e-10).all())
        assert float(torch.linalg.eigvalsh(c_bar - c_bar_tilde).min()) >= -1e-10


def test_theorem2_sample_size_with_lemma_c2_constant():
    """Skyformer Theorem 2 with Lemma C.2's constant (stable rank s <= 2 d_stat, N = 2n):
    lambda = eps ||C||, d >= (28/3)(2 d_stat / beta) log(4n / delta) i.i.d. uniform columns
    (Definition 1, with replacement) give C~_bar <= C_bar <= C~_bar + lambda I and
    ||C~ - C|| <= lambda with probability >= 1 - delta. delta = 0.1, 50 independent column
    samples, at most 5 may fail (the lemma bounds each sample's failure probability by delta;
    the bound is loose, so in practice none fails). Q, K: 2n jittered points on a circle in
    R^2 (interleaved), so d_stat is small, beta ~ 1 and the required d fits in 2n."""
    n, p, eps, delta, trials = 100, 2, 0.5, 0.1, 50
    g = _gen(0)
    t = 2 * math.pi * (torch.arange(2 * n, dtype=torch.float64) + 0.3 * torch.rand(2 * n, generator=g, dtype=torch.float64)) / (2 * n)
    radius = 0.3 * p**0.25  # radius 0.3 after the p^{1/4} scaling of Eq. (3)
    x = torch.stack([radius * torch.cos(t), radius * torch.sin(t)], -1)
    q, k = x[0::2], x[1::2]
    c_bar, c = _completion(q, k), kernels.kernelized_matrix(q, k)
    lam = eps * float(_spec(c))
    assert lam < float(_spec(c_bar))
    scores = ridge_leverage_scores(c_bar, lam)
    d_stat = float(scores.sum())
    beta = d_stat / (2 * n * float(scores.max()))
    d = math.ceil(28 / 3 * 2 * d_stat / beta * math.log(4 * n / delta))
    assert d <= 2 * n, (d, d_stat, beta)
    failures, worst = 0, 0.0
    for seed in range(trials):
        cols = sketch.uniform_columns(2 * n, d, generator=_gen(seed), replace=True)
        holds, ratio = _theorem2_conclusions(c_bar, c, cols, lam)
        failures += int(not holds)
        worst = max(worst, ratio)
    assert failures <= delta * trials, (failures, worst)
    # Control: the same checks do detect violations (lambda = 0.01 ||C||, 2 columns, far
    # below any sample-size bound), so the assertion above is not vacuous.
    for seed in range(5):
        cols = sketch.uniform_columns(2 * n, 2, generator=_gen(1000 + seed), replace=True)
        assert not _theorem2_conclusions(c_bar, c, cols, 0.01 * float(_spec(c)))[0]


def _theorem2_conclusions(c_bar, c, cols, lam):
    """(C~_bar <= C_bar <= C~_bar + lam I and ||C~ - C|| <= lam, ||C~ - C|| / lam)."""
    n = c.shape[-1]
    c_bar_tilde = sketch.nystrom(c_bar, cols)
    lower = float(torch.linalg.eigvalsh(c_bar - c_bar_tilde)[0])
    upper = float(torch.linalg.eigvalsh(c_bar_tilde + lam * torch.eye(2 * n, dtype=c.dtype) - c_bar)[0])
    error = float(torch.linalg.svdvals(c_bar_tilde[:n, n:] - c)[0])
    return lower >= -1e-10 and upper >= -1e-10 and error <= lam, error / lam


def test_lemma3_scaled_core_singular_values_in_unit_interval():
    """Skyformer Lemma 3: every singular value of D_M^{-1/2}(M + gamma I)D_M^{-1/2} lies in (0, 1],
    M = S^T C_bar S (the value 1 is attained by D_M^{1/2} 1; the paper's "(0, 1)" is a typo)."""
    for seed in SEEDS:
        q, k, _ = synthetic_qkv((3,), 20, 4, scale=0.5 + 0.1 * seed, generator=_gen(seed))
        c_bar = _completion(q, k)
        cols = sketch.uniform_columns(40, 4 + seed % 30, batch_shape=(3,), generator=_gen(seed), replace=True)
        m = torch.gather(sketch.gather_rows(c_bar, cols), -1, cols.unsqueeze(-2).expand(3, cols.shape[-1], cols.shape[-1]))
        for gamma in (1e-6, 1e-3, 0.1, 1.0, 10.0):
            scaled, _ = linalg.scaled_core(m, gamma)
            sv = torch.linalg.svdvals(scaled)
            assert bool((sv > 0).all())
            assert bool((sv <= 1 + 1e-12).all())
            torch.testing.assert_close(sv[..., 0], torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
            ident = torch.eye(m.shape[-1], dtype=torch.float64)
            assert bool((_spec(ident - scaled) < 1).all())


def test_schulz_core_converges_to_regularized_inverse():
    """Skyformer Sec. 4.4 + Lemma 3: Schulz from Z_0 = I on the scaled core converges, and the
    ``schulz`` core then equals (M + gamma I)^{-1}; with few steps it is a damped inverse."""
    for seed in range(10):
        q, k, v = synthetic_qkv((2,), 16, 4, generator=_gen(seed))
        gamma = 0.5
        res = approxlab.approximate("skyformer", q, k, v, num_features=8, generator=_gen(seed), core="schulz", gamma=gamma, num_iter=40)
        m = res.info["core_block"]
        residuals = res.info["pinv_residuals"]
        assert bool((residuals[-1] < 1e-10).all())
        assert bool((residuals[1:] <= residuals[:-1] + 1e-12).all())
        landmarks = sketch.gather_rows(torch.cat([q, k], -2), res.info["columns"])
        left, right = kernels.kernelized_matrix(q, landmarks), kernels.kernelized_matrix(landmarks, k)
        reference = left @ torch.linalg.solve(m + gamma * torch.eye(8, dtype=torch.float64), right)
        torch.testing.assert_close(res.matrix(), reference, rtol=1e-8, atol=1e-10)


def test_skyformer_softmax_equals_nystrom_of_score_completion():
    """Skyformer Eqs. (4)-(6) on A_bar = exp(XX^T/sqrt p) (Figure 1's Skyformer): the overflow-safe
    route through C and the diagonal scalings equals the direct Nystrom of A_bar with the same
    columns (rescaling sampled columns leaves a PSD Nystrom unchanged), row-normalised."""
    for seed in SEEDS:
        q, k, v = synthetic_qkv((2,), 20, 8, scale=0.9, generator=_gen(seed))
        n = 20
        d = 4 + seed % 8
        result = approxlab.approximate("skyformer-softmax", q, k, v, num_features=d, generator=_gen(seed))
        x = torch.cat([q, k], -2)
        a_bar = kernels.score_matrix(x, x)
        a_tilde = sketch.nystrom(a_bar, result.info["columns"])[..., :n, n:]
        direct = a_tilde / a_tilde.sum(-1, keepdim=True)
        scale = float(direct.abs().max())
        torch.testing.assert_close(result.matrix(), direct, rtol=0, atol=1e-8 * scale)
        torch.testing.assert_close(result.output, direct @ v, rtol=0, atol=1e-8 * scale * float(v.abs().max()) * n)


def test_all_columns_are_exact():
    """With every column of the completion (d = 2n), C~ = C and D~^{-1}A~ = D^{-1}A."""
    for seed in range(10):
        q, k, v = synthetic_qkv((2,), 16, 4, scale=0.8, generator=_gen(seed))
        sky = approxlab.approximate("skyformer", q, k, v, num_features=32, generator=_gen(seed))
        torch.testing.assert_close(sky.matrix(), kernels.kernelized_matrix(q, k), rtol=0, atol=1e-10)
        soft = approxlab.approximate("skyformer-softmax", q, k, v, num_features=32, generator=_gen(seed))
        torch.testing.assert_close(soft.matrix(), kernels.softmax_matrix(q, k), rtol=0, atol=1e-9)
        torch.testing.assert_close(soft.output, approxlab.exact_attention(q, k, v), rtol=0, atol=1e-9)


def test_explicit_columns_and_info():
    q, k, v = synthetic_qkv((2, 3), 16, 4, generator=_gen(0))
    cols = torch.tensor([0, 5, 16, 31])
    for name in ("skyformer", "skyformer-softmax"):
        res = approxlab.approximate(name, q, k, v, num_features=4, columns=cols)
        assert res.info["columns"].shape == (2, 3, 4)
        assert bool((res.info["columns"] == cols).all())
        assert res.info["core_block"].shape == (2, 3, 4, 4)
        assert res.info["core_condition_number"].shape == (2, 3)
        assert bool((res.info["core_condition_number"] >= 1).all())


@pytest.mark.parametrize("name", ["skyformer", "skyformer-softmax"])
@pytest.mark.parametrize("core", ["pinv", "schulz"])
def test_float32_large_logits_finite_and_reproducible(name, core):
    """float32 logits of +-80 give finite outputs; the same generator seed gives the same output."""
    g = _gen(0)
    p = 16
    direction = torch.randn(p, generator=g)
    direction = direction / direction.norm()
    radius = (80.0 * p**0.5) ** 0.5
    signs = torch.where(torch.rand(2, 48, 1, generator=g) < 0.5, -1.0, 1.0)
    q = radius * (signs * direction + 0.02 * torch.randn(2, 48, p, generator=g))
    k = radius * (-signs * direction + 0.02 * torch.randn(2, 48, p, generator=g))
    v = torch.randn(2, 48, p, generator=g)
    assert float(kernels.scaled_logits(q, k).abs().max()) > 75
    first = approxlab.approximate(name, q, k, v, num_features=16, generator=_gen(1), core=core)
    second = approxlab.approximate(name, q, k, v, num_features=16, generator=_gen(1), core=core)
    assert first.output.dtype == torch.float32
    assert bool(torch.isfinite(first.output).all())
    assert torch.equal(first.output, second.output)
    other = approxlab.approximate(name, q, k, v, num_features=16, generator=_gen(2), core=core)
    assert not torch.equal(first.output, other.output)


def test_validation_messages():
    q, k, v = synthetic_qkv((2,), 16, 4, generator=_gen(0))
    for name in ("skyformer", "skyformer-softmax"):
        with pytest.raises(ValueError, match=r"`core` must be one of \['pinv', 'schulz'\]; got 'inverse'"):
            approxlab.approximate(name, q, k, v, num_features=4, core="inverse")
        with pytest.raises(ValueError, match=r"`gamma` must be a finite number > 0; got 0.0"):
            approxlab.approximate(name, q, k, v, num_features=4, core="schulz", gamma=0.0)
        with pytest.raises(ValueError, match=r"`num_iter` must be an integer with 0 <= num_iter <= inf; got -1"):
            approxlab.approximate(name, q, k, v, num_features=4, core="schulz", num_iter=-1)
        with pytest.raises(ValueError, match=r"`init` must be one of \['identity', 'nystromformer', 'official'\]; got 'zeros'"):
            approxlab.approximate(name, q, k, v, num_features=4, core="schulz", init="zeros")
        with pytest.raises(ValueError, match=r"`columns` must hold indices in \[0, 32\); got values in \[-1, 3\]"):
            approxlab.approximate(name, q, k, v, num_features=2, columns=torch.tensor([-1, 3]))
        with pytest.raises(ValueError, match=r"`columns` must hold num_features=4 indices when given; got 2"):
            approxlab.approximate(name, q, k, v, num_features=4, columns=torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"`m` must have non-negative entries for Skyformer's scaled core"):
        linalg.scaled_core(-torch.eye(3, dtype=torch.float64), 0.1)
