"""The SciPy-like front door: exact attention, attention matrices, operators, pinv, synthetic."""

import math

import pytest
import torch

import approxlab
from approxlab import kernels
from approxlab.errors import ConvergenceWarning
from approxlab.linalg import iterative_pinv
from approxlab.operators import DenseOperator, DiagonalOperator, ProductOperator
from approxlab.synthetic import matrix_with_singular_values, psd_matrix, synthetic_qkv


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_exact_attention_matches_torch_sdpa():
    q, k, v = synthetic_qkv((2, 3), 33, 8, generator=_gen(0))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(approxlab.exact_attention(q, k, v), expected)


def test_attention_matrix_kinds_are_consistent():
    """Skyformer Sec. 4.1: A = D_Q^{1/2} C D_K^{1/2} and softmax = D^{-1} A."""
    q, k, _ = synthetic_qkv((2,), 20, 6, generator=_gen(1))
    a = approxlab.attention_matrix(q, k, "scores")
    c = approxlab.attention_matrix(q, k, "kernelized")
    s = approxlab.attention_matrix(q, k, "softmax")
    dq = torch.exp(kernels.log_diag_scale(q))
    dk = torch.exp(kernels.log_diag_scale(k))
    torch.testing.assert_close(a, dq[..., :, None] * c * dk[..., None, :])
    torch.testing.assert_close(s, a / a.sum(-1, keepdim=True))
    assert float(c.max()) <= 1.0


def test_scores_overflow_is_an_error_not_inf():
    q = torch.full((4, 16), 10.0)
    with pytest.raises(OverflowError, match="overflows torch.float32: the largest logit is 400.0"):
        approxlab.attention_matrix(q, q, "scores")
    s = approxlab.attention_matrix(q, q, "softmax")
    assert bool(torch.isfinite(s).all())


def test_attention_matrix_bad_kind():
    q, k, _ = synthetic_qkv((1,), 4, 2, generator=_gen(2))
    with pytest.raises(ValueError, match=r"`kind` must be one of \['kernelized', 'scores', 'softmax'\]; got 'relu'"):
        approxlab.attention_matrix(q, k, "relu")


def test_operator_algebra_matches_dense():
    g = _gen(3)
    a = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    b = torch.randn(2, 7, 4, generator=g, dtype=torch.float64)
    d = torch.rand(2, 5, generator=g, dtype=torch.float64)
    op = DiagonalOperator(d) @ ProductOperator(a, b)
    dense = d[..., None] * (a @ b)
    torch.testing.assert_close(op.to_dense(), dense)
    torch.testing.assert_close(op.T.to_dense(), dense.mT)
    torch.testing.assert_close((op - DenseOperator(dense)).to_dense(), torch.zeros_like(dense))
    torch.testing.assert_close((2.0 * op).to_dense(), 2 * dense)
    x = torch.randn(2, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(op.matvec(x), (dense @ x[..., None])[..., 0])
    with pytest.raises(ValueError, match=r"`x` must have shape \(\*batch, 4, k\)"):
        op.matmat(torch.zeros(2, 5, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="`factors` have incompatible shapes"):
        ProductOperator(a, a)


@pytest.mark.parametrize("seed", range(10))
def test_iterative_pinv_converges_to_moore_penrose(seed):
    """Nystromformer Lemma 1 (convergence part), singular and nonsingular PSD matrices."""
    g = _gen(seed)
    eig = torch.logspace(0, -2, 12, dtype=torch.float64)
    eig[-3:] = 0.0  # rank 9: the pseudo-inverse, not the inverse
    m = psd_matrix(eig.expand(2, 12), generator=g)
    # 12 steps: converged on range(M) (min nonzero eigenvalue 0.035), while round-off in the
    # null space has grown by only (13/4)**12 ~ 1e6 (see iterative_pinv's Notes).
    result = iterative_pinv(m, num_iter=12)
    torch.testing.assert_close(result.inverse, torch.linalg.pinv(m, hermitian=True), rtol=1e-6, atol=1e-6)
    assert float(result.penrose_residuals[-1].max()) < 1e-10
    assert float(result.inverse_residuals[-1].max()) < 1e-5
    # ||I - M Z|| -> ||I - M M^+|| = 1 for a singular M: the Penrose residual is the one to watch.
    torch.testing.assert_close(result.residuals[-1], torch.ones(2, dtype=torch.float64), rtol=1e-8, atol=1e-8)


def test_iterative_pinv_drift_past_convergence_is_caught_by_tol():
    """Singular M: iterating long after convergence inverts round-off (pinv Notes)."""
    eig = torch.logspace(0, -2, 12, dtype=torch.float64)
    eig[-3:] = 0.0
    m = psd_matrix(eig, generator=_gen(0))
    long_run = iterative_pinv(m, num_iter=40)
    assert float(long_run.penrose_residuals[-1]) < 1e-8  # the first Penrose condition is blind
    assert float(long_run.inverse_residuals[-1]) > 1e3 * float(long_run.inverse_residuals.min())
    with pytest.warns(ConvergenceWarning, match="did not converge in num_iter=40"):
        iterative_pinv(m, num_iter=40, tol=1e-6)


def test_iterative_pinv_warns_when_not_converged():
    m = matrix_with_singular_values(torch.logspace(0, -6, 10, dtype=torch.float64), generator=_gen(0))
    with pytest.warns(ConvergenceWarning, match=r"did not converge in num_iter=2 iterations.*> tol=1.0e-08") as record:
        iterative_pinv(m, num_iter=2, tol=1e-8)
    assert record[0].message.residual > 1e-8


def test_iterative_pinv_validation():
    with pytest.raises(ValueError, match=r"`m` must be square"):
        iterative_pinv(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"`init` must be one of"):
        iterative_pinv(torch.eye(3), init="zeros")
    with pytest.raises(ValueError, match=r"`num_iter` must be an integer with 0 <= num_iter <= inf; got -1"):
        iterative_pinv(torch.eye(3), num_iter=-1)


def test_psd_matrix_has_the_prescribed_spectrum():
    eig = torch.tensor([5.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    m = psd_matrix(eig, generator=_gen(4))
    torch.testing.assert_close(torch.linalg.eigvalsh(m).flip(-1), eig, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="`eigenvalues` must be >= 0"):
        psd_matrix(torch.tensor([1.0, -1.0]))


def test_synthetic_qkv_logit_scale():
    q, k, _ = synthetic_qkv((4,), 256, 64, scale=1.0, generator=_gen(5))
    std = float(kernels.scaled_logits(q, k).std())
    assert math.isclose(std, 1.0, rel_tol=0.1)
