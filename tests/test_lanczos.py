"""Lanczos spectral norms against the dense SVD: Golub--Kahan bidiagonalisation
(approxlab.linalg.lanczos) and the normal-matrix block Lanczos of an attention error
(approxlab.linalg.normal_lanczos)."""

import math

import pytest
import torch

from approxlab import approximate
from approxlab.errors import ConvergenceWarning
from approxlab.kernels import softmax_matrix
from approxlab.linalg import SpectralNormEstimate, fused_normal_pass, golub_kahan, normal_block_lanczos
from approxlab.operators import DenseOperator, ProductOperator
from approxlab.synthetic import matrix_with_singular_values, synthetic_qkv

SEEDS = range(20)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _spectrum(kind, n):
    i = torch.arange(n, dtype=torch.float64)
    if kind == "decaying":
        return 0.8**i
    if kind == "clustered":  # top five within 1e-6 of each other, then a gap
        return torch.where(i < 5, 1.0 - 1e-7 * i, 0.5 * 0.9**i)
    if kind == "flat":  # slowly decaying: hardest for Krylov methods
        return 1.0 - 0.5 * i / n
    raise ValueError(kind)


def _matrix(kind, n, m, batch, seed):
    sigma = _spectrum(kind, n).expand(*batch, n)
    x = matrix_with_singular_values(sigma, m, generator=_gen(seed))
    return x


@pytest.mark.parametrize("kind", ["decaying", "clustered", "flat"])
def test_agrees_with_dense_svd(kind):
    """Converged GK estimates ||A||_2 to 1e-6 relative (deterministic given the seed; a random
    start orthogonal to the top singular vector has probability 0), batched, tall and wide."""
    for seed in SEEDS:
        x = _matrix(kind, 20, 28, (2, 3), seed)
        if seed % 2:
            x = x.transpose(-1, -2)  # wide and tall operators
        exact = torch.linalg.matrix_norm(x, ord=2)
        info = golub_kahan(DenseOperator(x), generator=_gen(100 + seed))
        assert info.estimate.shape == (2, 3)
        assert bool(info.converged.all())
        torch.testing.assert_close(info.estimate, exact, rtol=1e-6, atol=0)


def test_lower_bound_is_certified_even_when_stopped_early():
    """theta_1 = ||U^T A V||_2 <= ||A||_2 for orthonormal U, V (deterministic; rounding slack 1e-12)."""
    for seed in SEEDS:
        x = _matrix("flat", 40, 40, (3,), seed)
        exact = torch.linalg.matrix_norm(x, ord=2)
        with pytest.warns(ConvergenceWarning):
            info = golub_kahan(x, max_iter=3, generator=_gen(seed))
        assert bool((info.lower_bound <= exact * (1 + 1e-12)).all())
        assert bool((info.estimate < exact).all())  # genuinely not converged in 3 steps


def test_distance_bound_contains_a_singular_value():
    """Krylov--Weinstein bound on the Jordan--Wielandt matrix: some singular value of A (or 0 when
    n != m) lies within residual/sqrt(2) of the Ritz value, at every step (deterministic)."""
    for seed in SEEDS:
        x = _matrix("flat", 25, 35, (), seed)
        sigma = torch.cat([torch.linalg.svdvals(x), torch.zeros(1, dtype=torch.float64)])
        for steps in (2, 4, 8):
            with pytest.warns(ConvergenceWarning):
                info = golub_kahan(x, max_iter=steps, generator=_gen(seed))
            nearest = (sigma - info.estimate).abs().min()
            assert float(nearest) <= float(info.distance_bound) * (1 + 1e-9) + 1e-14
            assert float(info.distance_bound) == pytest.approx(float(info.residual) / math.sqrt(2))


def test_convergence_warning_carries_the_residual():
    """max_iter too small on a flat spectrum: ConvergenceWarning with the relative residual."""
    x = _matrix("flat", 60, 60, (2,), 0)
    with pytest.warns(ConvergenceWarning, match=r"did not converge in max_iter=2 .*relative residual") as record:
        info = golub_kahan(x, max_iter=2, generator=_gen(1))
    warning = record[0].message
    assert not bool(info.converged.any())
    expected = float((info.residual / info.estimate).max())
    assert warning.residual == pytest.approx(expected)
    assert warning.residual > 1e-3
    assert info.num_matvecs == 4


def test_exhausting_the_space_is_exact():
    """After min(n, m) steps V spans R^m, B = U^T A V has the singular values of A: exact."""
    for seed in SEEDS:
        x = _matrix("flat", 4, 7, (), seed)
        info = golub_kahan(x.T, tol=1e-300, max_iter=50, generator=_gen(seed))
        assert bool(info.converged)
        assert info.num_matvecs == 2 * 4
        assert float(info.estimate) == pytest.approx(float(torch.linalg.matrix_norm(x, ord=2)), rel=1e-13)


def test_zero_and_rank_one_operators():
    """Breakdowns (invariant subspaces) are handled: zero -> 0; rank one -> its norm, exactly."""
    zero = torch.zeros(2, 6, 5, dtype=torch.float64)
    info = golub_kahan(zero, generator=_gen(0))
    assert bool((info.estimate == 0).all()) and bool(info.converged.all())
    g = _gen(1)
    u, v = torch.randn(6, 1, generator=g, dtype=torch.float64), torch.randn(1, 5, generator=g, dtype=torch.float64)
    info = golub_kahan(ProductOperator(u, v), generator=_gen(2))
    assert float(info.estimate) == pytest.approx(float(u.norm() * v.norm()), rel=1e-12)
    assert info.num_matvecs <= 4


def test_low_rank_operator_never_formed_and_float32():
    """A ProductOperator U W V^T (never formed); float32 works in float32 to ~1e-5."""
    g = _gen(3)
    u = torch.randn(2, 300, 8, generator=g, dtype=torch.float64)
    w = torch.randn(2, 8, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 200, 8, generator=g, dtype=torch.float64)
    op = ProductOperator(u, w, v.transpose(-1, -2))
    exact = torch.linalg.matrix_norm(u @ w @ v.transpose(-1, -2), ord=2)
    torch.testing.assert_close(golub_kahan(op, generator=_gen(4)).estimate, exact, rtol=1e-10, atol=0)
    info32 = golub_kahan(op.to(torch.float32), tol=1e-5, generator=_gen(4))
    assert info32.estimate.dtype == torch.float32
    torch.testing.assert_close(info32.estimate.double(), exact, rtol=1e-5, atol=0)


def test_same_generator_same_result():
    x = _matrix("decaying", 20, 20, (2,), 5)
    a = golub_kahan(x, tol=1e-8, generator=_gen(7))
    b = golub_kahan(x, tol=1e-8, generator=_gen(7))
    assert isinstance(a, SpectralNormEstimate)
    assert torch.equal(a.estimate, b.estimate) and torch.equal(a.residual, b.residual)


def test_validation_messages():
    x = torch.eye(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"`op` must be a LinearOperator or torch.Tensor; got list"):
        golub_kahan([[1.0]])
    with pytest.raises(ValueError, match=r"`tol` must be a finite number > 0; got 0.0"):
        golub_kahan(x, tol=0.0)
    with pytest.raises(ValueError, match=r"`max_iter` must be an integer with 1 <= max_iter <= inf; got 0"):
        golub_kahan(x, max_iter=0)
    with pytest.raises(TypeError, match=r"`generator` must be a torch.Generator or None; got int"):
        golub_kahan(x, generator=3)
    with pytest.raises(ValueError, match=r"`op` must be finite"):
        golub_kahan(torch.full((3, 3), float("nan")))


# -- normal-matrix block Lanczos of an attention error (approxlab.linalg.normal_lanczos) ------


def _problem(n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = synthetic_qkv((1,), n, 16, scale=scale, generator=g, dtype=torch.float64)
    approx = approximate("nystromformer", q, k, v, num_features=8)
    return q, k, approx.operator()


def _dense_error(q, k, op):
    return float(torch.linalg.matrix_norm(op.to_dense() - softmax_matrix(q, k), ord=2).max())


def test_fused_normal_pass_matches_dense():
    """One fused pass returns ``M x`` and ``M^T M x`` for ``M = S~ - S`` (float64, rounding-level)."""
    q, k, op = _problem(96, 0, scale=2.0)
    x = torch.randn(1, 96, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    m = op.to_dense() - softmax_matrix(q, k)
    normal, residual = fused_normal_pass(q, k, op, x, row_block=10, compute_dtype=torch.float64)
    torch.testing.assert_close(residual, m @ x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(normal, m.transpose(-1, -2) @ (m @ x), rtol=1e-10, atol=1e-12)


def test_fused_normal_pass_is_overflow_safe_in_float32():
    """Logits of size ~ +-80 in float32 give finite products (max-subtracted softmax per row block)."""
    q, k, _ = _problem(64, 2)
    q = (q * 9.0).float()
    k = (k * 9.0).float()
    assert float((q @ k.transpose(-1, -2)).abs().max()) / 4.0 > 80.0
    op = approximate("nystromformer", q, k, k, num_features=8).operator()
    x = torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    normal, residual = fused_normal_pass(q, k, op, x)
    assert bool(torch.isfinite(normal).all()) and bool(torch.isfinite(residual).all())


@pytest.mark.parametrize("block", [1, 3])
def test_block_lanczos_agrees_with_dense_svd(block):
    """Over 6 seeds the estimate matches the dense SVD to 1e-7 relative, never exceeds it beyond
    rounding (Ritz values are lower bounds), and lies within its certified distance bound
    (Parlett Theorem 4.5.1 on M^T M). Deterministic given the seeds; a failure is a bug."""
    for seed in range(6):
        q, k, op = _problem(96, seed, scale=1.5)
        reference = _dense_error(q, k, op)
        result = normal_block_lanczos(q, k, op, block=block, tol=1e-9,
                                      generator=torch.Generator().manual_seed(seed), compute_dtype=torch.float64)
        estimate = float(result.estimate)
        assert bool(result.converged.all())
        assert abs(estimate - reference) <= 1e-7 * reference, (seed, estimate, reference)
        assert estimate <= reference * (1 + 1e-12)
        assert abs(estimate - reference) <= float(result.distance_bound) + 1e-12 * reference
        assert result.num_matvecs == 2 * block * result.num_passes


def test_block_lanczos_float32_logits_agree_to_1e5():
    """float32 logits/softmax (the benchmark's default) stay within 1e-5 relative of float64 dense."""
    q, k, op = _problem(128, 3, scale=1.5)
    reference = _dense_error(q, k, op)
    result = normal_block_lanczos(q.float(), k.float(), op, tol=1e-8, generator=torch.Generator().manual_seed(0))
    assert abs(float(result.estimate) - reference) <= 1e-5 * reference


def test_block_lanczos_is_reproducible_and_batched():
    """The same generator gives the same result; a batch of heads equals the heads one at a time."""
    g = torch.Generator().manual_seed(5)
    q, k, v = synthetic_qkv((3,), 64, 8, generator=g, dtype=torch.float64)
    op = approximate("nystromformer", q, k, v, num_features=4).operator()
    first = normal_block_lanczos(q, k, op, tol=1e-10, generator=torch.Generator().manual_seed(0),
                                 compute_dtype=torch.float64)
    second = normal_block_lanczos(q, k, op, tol=1e-10, generator=torch.Generator().manual_seed(0),
                                  compute_dtype=torch.float64)
    torch.testing.assert_close(first.estimate, second.estimate, rtol=0, atol=0)
    dense = torch.linalg.matrix_norm(op.to_dense() - softmax_matrix(q, k), ord=2)
    torch.testing.assert_close(first.estimate, dense, rtol=1e-8, atol=0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"block": 0}, ValueError, "`block` must be an integer with 1 <= block"),
        ({"tol": -1.0}, ValueError, "`tol` must be a finite number > 0"),
        ({"max_iter": 1.5}, TypeError, "`max_iter` must be an integer"),
        ({"failure_probability": 2.0}, ValueError, "`failure_probability` must be in"),
    ],
)
def test_block_lanczos_validation(kwargs, error, match):
    q, k, op = _problem(32, 0)
    with pytest.raises(error, match=match):
        normal_block_lanczos(q, k, op, **kwargs)


def test_block_lanczos_rejects_mismatched_operator():
    q, k, _ = _problem(32, 0)
    _, _, other = _problem(48, 0)
    with pytest.raises(ValueError, match=r"`approx_op` must have shape \(\*batch, 32, 32\)"):
        normal_block_lanczos(q, k, other)
