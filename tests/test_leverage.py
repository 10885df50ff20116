"""Ridge leverage scores, statistical dimension and coherence (Skyformer Theorem 2 quantities)."""

import math

import pytest
import torch

from approxlab import kernels
from approxlab.errors import NotPSDError
from approxlab.leverage import (
    approximate_ridge_leverage_scores,
    coherence,
    ridge_leverage_scores,
    statistical_dimension,
)
from approxlab.sketch import gather_rows, uniform_columns
from approxlab.synthetic import psd_matrix

SEEDS = range(30)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _decaying_psd(seed, n=40, batch=(2,), rank=None):
    """Symmetric PSD with eigenvalues 2^{-i/3} (and exact zeros past ``rank``)."""
    eig = 2.0 ** (-torch.arange(n, dtype=torch.float64) / 3.0)
    if rank is not None:
        eig[rank:] = 0.0
    return psd_matrix(eig.expand(*batch, n).clone(), generator=_gen(seed))


def _circle_kernel(n, radius, generator):
    """Gaussian kernel of 2n jittered points on a circle in R^2: low d_stat, coherence near 1."""
    t = 2 * math.pi * (torch.arange(2 * n, dtype=torch.float64) + 0.3 * torch.rand(2 * n, generator=generator, dtype=torch.float64)) / (2 * n)
    x = torch.stack([radius * torch.cos(t), radius * torch.sin(t)], -1)
    return kernels.gaussian_kernel(x, x)


def test_exact_scores_in_unit_interval_and_sum_to_statistical_dimension():
    """Theorem 2 of Skyformer: l_i = [K(K+lam I)^{-1}]_ii in [0, 1), sum_i l_i = d_stat."""
    for seed in SEEDS:
        K = _decaying_psd(seed, rank=25 if seed % 2 else None)
        lam = 10.0 ** (-(seed % 5))
        scores = ridge_leverage_scores(K, lam)
        direct = torch.diagonal(torch.linalg.solve(K + lam * torch.eye(40, dtype=K.dtype), K), dim1=-2, dim2=-1)
        torch.testing.assert_close(scores, direct, rtol=1e-8, atol=1e-10)
        assert bool((scores >= 0).all()) and bool((scores < 1).all())
        d_stat = statistical_dimension(K, lam)
        torch.testing.assert_close(scores.sum(-1), d_stat, rtol=1e-10, atol=1e-12)
        evals = torch.linalg.eigvalsh(K).clamp_min(0)
        torch.testing.assert_close(d_stat, (evals / (evals + lam)).sum(-1), rtol=1e-8, atol=1e-10)


def test_coherence_definition_and_range():
    """Theorem 2 of Skyformer: beta = min_i d_stat / (N l_i) lies in (0, 1]; = 1 for equal scores."""
    for seed in SEEDS:
        K = _decaying_psd(seed)
        lam = 10.0 ** (-(seed % 4))
        beta = coherence(K, lam)
        scores = ridge_leverage_scores(K, lam)
        expected = (statistical_dimension(K, lam).unsqueeze(-1) / (40 * scores)).amin(-1)
        torch.testing.assert_close(beta, expected, rtol=1e-10, atol=0)
        assert bool((beta > 0).all()) and bool((beta <= 1).all())
    eye = 3.0 * torch.eye(16, dtype=torch.float64)
    assert float(coherence(eye, 0.5)) == pytest.approx(1.0, abs=1e-12)
    assert float(coherence(torch.zeros(5, 5, dtype=torch.float64), 1.0)) == 1.0
    # One dominant isolated point: its leverage is ~1, the others share little -> small beta.
    spiky = torch.block_diag(torch.ones(15, 15, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    assert float(coherence(spiky, 0.1)) < 0.2


def test_unweighted_estimate_brackets_exact_scores():
    """Alaoui & Mahoney / Musco & Musco estimator, plain selection (Pi Pi^T <= I):
    deterministically l_i <= l~_i <= K_ii/lam, l~_i <= 1 on sampled columns, and l~ = l with
    every column (see approximate_ridge_leverage_scores, Notes)."""
    for seed in SEEDS:
        K = _decaying_psd(seed)
        lam = 10.0 ** (-(seed % 4))
        exact = ridge_leverage_scores(K, lam)
        d = 5 + seed % 20
        cols = uniform_columns(40, d, batch_shape=(2,), generator=_gen(100 + seed))
        k_columns = torch.gather(K, -1, cols.unsqueeze(-2).expand(2, 40, d))
        approx = approximate_ridge_leverage_scores(k_columns, torch.diagonal(K, dim1=-2, dim2=-1), cols, lam)
        assert bool((approx >= exact - 1e-10).all())
        assert bool((approx <= torch.diagonal(K, dim1=-2, dim2=-1) / lam + 1e-10).all())
        assert bool((torch.gather(approx, -1, cols) <= 1 + 1e-10).all())
    all_cols = torch.arange(40)
    approx = approximate_ridge_leverage_scores(K, torch.diagonal(K, dim1=-2, dim2=-1), all_cols, lam)
    torch.testing.assert_close(approx, exact, rtol=1e-8, atol=1e-10)


def test_weighted_uniform_estimate_within_constant_factor():
    """Lemma C.2 + Eq. (7) of Skyformer: with d >= (28/3)(2 d_stat/beta) log(2N/delta) i.i.d.
    uniform columns weighted N/d, (2/3) l_i <= l~_i <= 2 l_i for all i with probability >= 1 - delta.
    delta = 0.1: we require the bracket in at least 90% of 40 trials (failure probability of
    each trial <= delta by the lemma; the bound is loose and no trial fails in practice)."""
    delta, trials, failures = 0.1, 40, 0
    for seed in range(trials):
        g = _gen(seed)
        K = _circle_kernel(60, 0.6, g)
        N = K.shape[-1]
        lam = 0.5 * float(torch.linalg.matrix_norm(K, 2))
        exact = ridge_leverage_scores(K, lam)
        d_stat, beta = float(exact.sum()), float(exact.sum() / (N * exact.max()))
        d = math.ceil(28 / 3 * 2 * d_stat / beta * math.log(2 * N / delta))
        cols = uniform_columns(N, d, generator=g, replace=True)
        weights = torch.full((d,), N / d, dtype=torch.float64)
        approx = approximate_ridge_leverage_scores(K[:, cols], torch.diagonal(K), cols, lam, weights=weights)
        ratio = approx / exact
        failures += int(not (bool((ratio >= 2 / 3).all()) and bool((ratio <= 2).all())))
    assert failures <= delta * trials


def test_float32_input_is_computed_in_float64():
    K = _decaying_psd(0, batch=()).to(torch.float32)
    scores = ridge_leverage_scores(K, 1e-3)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), ridge_leverage_scores(K.double(), 1e-3), rtol=1e-6, atol=1e-6)


def test_validation_messages():
    K = _decaying_psd(1, batch=())
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"`lam` must be a finite number > 0; got"):
            ridge_leverage_scores(K, bad)
    with pytest.raises(TypeError, match="`lam` must be a real number"):
        statistical_dimension(K, "1")
    not_psd = K - 2.0 * torch.eye(40, dtype=torch.float64)
    with pytest.raises(NotPSDError, match=r"`K` must be positive semidefinite: its smallest eigenvalue is -2\.000e\+00, below -tol"):
        ridge_leverage_scores(not_psd, 0.1)
    with pytest.raises(NotPSDError, match="`K` must be symmetric positive semidefinite"):
        coherence(K + torch.triu(torch.ones_like(K)), 0.1)
    with pytest.raises(ValueError, match="`K` must be square"):
        statistical_dimension(K[:, :5], 0.1)
    cols = torch.tensor([0, 3, 7])
    with pytest.raises(ValueError, match=r"`k_diag` must have shape \(\*batch, N\)"):
        approximate_ridge_leverage_scores(K[:, cols], torch.ones(39, dtype=torch.float64), cols, 0.1)
    with pytest.raises(ValueError, match=r"`columns` must hold indices in \[0, 40\); got values in \[0, 40\]"):
        approximate_ridge_leverage_scores(K[:, cols], torch.diagonal(K), torch.tensor([0, 3, 40]), 0.1)
    with pytest.raises(ValueError, match=r"`columns` must hold one index per sampled column \(d=3\)"):
        approximate_ridge_leverage_scores(K[:, cols], torch.diagonal(K), torch.tensor([0, 3]), 0.1)
    with pytest.raises(ValueError, match=r"`weights` must be > 0"):
        approximate_ridge_leverage_scores(K[:, cols], torch.diagonal(K), cols, 0.1, weights=torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`lam` must be a finite number > 0"):
        approximate_ridge_leverage_scores(K[:, cols], torch.diagonal(K), cols, 0.0)
    bad_core = K[:, cols].clone()
    bad_core[cols] = -torch.eye(3, dtype=torch.float64) * 100
    with pytest.raises(NotPSDError, match="`k_columns` must be columns of a symmetric PSD matrix"):
        approximate_ridge_leverage_scores(bad_core, torch.diagonal(K), cols, 0.1)
    assert gather_rows(K, cols).shape == (3, 40)


# -- matrix-free estimates (block Krylov + deflated Hutchinson) ---------------------------


def _exact_dstat(q, k, scale=0.1):
    from approxlab.leverage import completion_operator

    dense = completion_operator(q, k).to_dense()
    lams = [scale * float(torch.linalg.eigvalsh(c).max()) for c in dense]
    return dense, lams, torch.tensor([statistical_dimension(c, lam) for c, lam in zip(dense, lams)], dtype=torch.float64)


@pytest.mark.parametrize("n, p, scale, seed", [(256, 16, 0.6, 0), (256, 16, 1.0, 1), (512, 32, 0.8, 2),
                                               (1024, 32, 0.7, 3)])
def test_estimated_dstat_within_one_percent(n, p, scale, seed):
    """Skyformer's completion of synthetic Q, K (N = 2n up to 2048): the estimate of
    d_stat at lambda = 0.1 ||C_bar|| is within 1 % of the eigendecomposition's, and its
    standard error is honest (the error is within 4 standard errors plus the Krylov bias)."""
    from approxlab.leverage import completion_operator, estimate_ridge_quantities
    from approxlab.synthetic import synthetic_qkv

    q, k, _ = synthetic_qkv((2,), n, p, scale=scale, generator=_gen(seed))
    _, _, exact = _exact_dstat(q, k)
    est = estimate_ridge_quantities(completion_operator(q, k), lambda_scale=0.1, generator=_gen(seed))
    relative = (est.statistical_dimension - exact).abs() / exact
    assert float(relative.max()) <= 0.01, (relative, exact)
    assert est.rank == 256 and bool((est.standard_error < 0.01 * exact).all())


def test_estimated_leverage_scores_and_reproducibility():
    """Leverage estimates track the exact scores (l1 error <= 5 % of d_stat); the same
    generator gives the same numbers; a float32 operator gives the float64 answer to 1e-4."""
    from approxlab.leverage import completion_operator, estimate_ridge_quantities
    from approxlab.synthetic import synthetic_qkv

    q, k, _ = synthetic_qkv((2,), 256, 16, scale=0.7, generator=_gen(7))
    dense, lams, exact = _exact_dstat(q, k)
    scores = torch.stack([ridge_leverage_scores(c, lam) for c, lam in zip(dense, lams)])
    op = completion_operator(q, k)
    first = estimate_ridge_quantities(op, lambda_scale=0.1, generator=_gen(8))
    again = estimate_ridge_quantities(op, lambda_scale=0.1, generator=_gen(8))
    assert torch.equal(first.statistical_dimension, again.statistical_dimension)
    assert torch.equal(first.leverage_scores, again.leverage_scores)
    assert float(((first.leverage_scores - scores).abs().sum(-1) / exact).max()) <= 0.05
    torch.testing.assert_close(first.lam, torch.tensor(lams, dtype=torch.float64), rtol=1e-9, atol=0)
    fixed = estimate_ridge_quantities(op, lam=lams[0], generator=_gen(8))
    torch.testing.assert_close(fixed.statistical_dimension[0], first.statistical_dimension[0], rtol=1e-9, atol=0)
    single = estimate_ridge_quantities(op.to(torch.float32), lambda_scale=0.1, generator=_gen(8))
    torch.testing.assert_close(single.statistical_dimension, first.statistical_dimension, rtol=1e-4, atol=0)


def test_estimate_ridge_quantities_validation():
    from approxlab.leverage import completion_operator, estimate_ridge_quantities
    from approxlab.operators import DenseOperator

    q = torch.randn(8, 4, generator=_gen(0), dtype=torch.float64)
    op = completion_operator(q, q)
    with pytest.raises(ValueError, match=r"give exactly one of `lam` and `lambda_scale`; got lam=None"):
        estimate_ridge_quantities(op)
    small = estimate_ridge_quantities(op, lam=1.0)  # block * depth > N: the whole space, exact
    assert small.rank == 16
    torch.testing.assert_close(small.statistical_dimension,
                               torch.tensor(statistical_dimension(op.to_dense(), 1.0), dtype=torch.float64),
                               rtol=1e-10, atol=0)
    with pytest.raises(ValueError, match=r"`diagonal` must be a number or have shape \(\*batch, N\) = \(16,\); got \(3,\)"):
        estimate_ridge_quantities(op, lam=1.0, block=2, depth=2, diagonal=torch.ones(3))
    with pytest.raises(ValueError, match=r"`operator` must be a square LinearOperator"):
        estimate_ridge_quantities(DenseOperator(torch.ones(3, 4)), lam=1.0)
    with pytest.raises(ValueError, match=r"`lambda_scale` must be"):
        estimate_ridge_quantities(op, lambda_scale=-1.0)


def test_the_formed_completion_is_the_fused_one_to_rounding():
    """``completion_operator(dense=True)`` forms the matrix the fused products apply: the same matrix and products to
    rounding, and the same d_stat estimate (same generator) to float32 rounding."""
    from approxlab.leverage import completion_operator, estimate_ridge_quantities
    from approxlab.operators import DenseOperator
    from approxlab.synthetic import synthetic_qkv

    q, k, _ = synthetic_qkv((2,), 300, 16, scale=0.7, generator=_gen(4))
    fused, formed = completion_operator(q, k), completion_operator(q, k, dense=True)
    assert formed.shape == fused.shape == (2, 600, 600)
    torch.testing.assert_close(formed.to_dense(), fused.to_dense(), rtol=0, atol=1e-12)
    x = torch.randn(2, 600, 5, generator=_gen(5), dtype=torch.float64)
    torch.testing.assert_close(formed.matmat(x), fused.matmat(x), rtol=1e-10, atol=1e-10)
    # its products from the three blocks are those of the whole matrix (and it is its own adjoint)
    whole = DenseOperator(formed.to_dense())
    torch.testing.assert_close(formed.matmat(x), whole.matmat(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(formed.rmatmat(x), whole.rmatmat(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(formed.to(torch.float32).matmat(x.float()), whole.matmat(x).float(), rtol=1e-5,
                               atol=1e-5)
    q, k = q.float(), k.float()
    single = [estimate_ridge_quantities(op, lambda_scale=0.1, generator=_gen(6))
              for op in (completion_operator(q, k), completion_operator(q, k, dense=True))]
    torch.testing.assert_close(single[1].statistical_dimension, single[0].statistical_dimension, rtol=1e-5, atol=0)
    torch.testing.assert_close(single[1].lam, single[0].lam, rtol=1e-5, atol=0)
    with pytest.raises(TypeError, match=r"`dense` must be a bool \(True or False\); got 1"):
        completion_operator(q, k, dense=1)


def test_the_tail_diagonal_from_the_ritz_vectors_is_that_of_the_projected_matrix():
    """``_tail_diagonal`` reads :math:`\\operatorname{diag}(UTU^\\top)` from the Ritz vectors: the diagonal of
    :math:`(I-P)K(I-P)` formed densely, for a PSD ``K`` and an orthonormal ``U`` that spans no invariant subspace."""
    from approxlab.leverage.matrix_free import _tail_diagonal

    g = _gen(11)
    x = torch.randn(2, 40, 60, generator=g, dtype=torch.float64)
    K = x @ x.transpose(-1, -2)
    basis = torch.linalg.qr(torch.randn(2, 40, 7, generator=g, dtype=torch.float64)).Q
    images = K @ basis
    t = basis.transpose(-1, -2) @ images
    eigenvalues, vectors = torch.linalg.eigh(0.5 * (t + t.transpose(-1, -2)))
    complement = torch.eye(40, dtype=torch.float64) - basis @ basis.transpose(-1, -2)
    dense = torch.diagonal(complement @ K @ complement, dim1=-2, dim2=-1)
    diagonal = torch.diagonal(K, dim1=-2, dim2=-1)
    torch.testing.assert_close(_tail_diagonal(diagonal, basis, images, basis @ vectors, eigenvalues), dense,
                               rtol=1e-10, atol=1e-10 * float(diagonal.max()))


def test_the_conjugate_gradients_skip_the_input_projection_with_the_same_estimate(monkeypatch):
    """The tail operator's ``complement=True`` (inputs already in the range of I - P) gives the products and the
    estimate of the operator that projects every input, to rounding."""
    from approxlab.leverage import completion_operator, estimate_ridge_quantities
    from approxlab.leverage import matrix_free
    from approxlab.synthetic import synthetic_qkv

    q, k, _ = synthetic_qkv((2,), 200, 16, scale=0.7, generator=_gen(12))
    op = completion_operator(q, k, dense=True)
    basis, _ = matrix_free._block_krylov(op, torch.randn(2, 400, 8, generator=_gen(13), dtype=torch.float64), 3)
    apply = matrix_free._tail_operator(op, basis, torch.zeros(2, dtype=torch.float64))
    x = torch.randn(2, 400, 5, generator=_gen(14), dtype=torch.float64)
    inside = x - basis @ (basis.transpose(-1, -2) @ x)
    torch.testing.assert_close(apply(inside, complement=True), apply(inside), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(apply(x, complement=True), apply(x), rtol=1e-3, atol=1e-3)  # the skip matters off it
    fast = estimate_ridge_quantities(op, lambda_scale=0.1, block=8, depth=3, generator=_gen(15))
    always = matrix_free._tail_operator

    def projecting(*args):
        inner = always(*args)
        return lambda x, complement=False: inner(x)

    monkeypatch.setattr(matrix_free, "_tail_operator", projecting)
    reference = estimate_ridge_quantities(op, lambda_scale=0.1, block=8, depth=3, generator=_gen(15))
    torch.testing.assert_close(fast.statistical_dimension, reference.statistical_dimension, rtol=1e-12, atol=0)
    torch.testing.assert_close(fast.leverage_scores, reference.leverage_scores, rtol=1e-9, atol=1e-12)
