"""approxlab.metrics on matrices with a prescribed spectrum (approxlab.synthetic)."""

import math

import pytest
import torch

from approxlab import kernels, metrics
from approxlab.errors import ConvergenceWarning
from approxlab.linalg import SpectralNormEstimate
from approxlab.methods._base import Approximation
from approxlab.metrics import (
    condition_number,
    effective_rank,
    is_numerically_singular,
    loewner_min_eig,
    numerical_rank,
    numerical_rank_lu,
    singular_value_decay_rate,
    spectral_error,
    spectral_norm,
    stable_rank,
)
from approxlab.operators import DenseOperator, ExactAttentionOperator, ProductOperator
from approxlab.synthetic import matrix_with_singular_values, psd_matrix, synthetic_qkv

SEEDS = range(20)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _with_spectrum(sigma, m=None, seed=0):
    return matrix_with_singular_values(sigma, m, generator=_gen(seed))


# -- spectral norms and errors ------------------------------------------------------------


def test_spectral_norm_dense_is_exact_and_returns_scalars_or_batches():
    sigma = torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)
    x = _with_spectrum(sigma, 5)
    assert isinstance(spectral_norm(x), float)
    assert spectral_norm(x) == pytest.approx(3.0, rel=1e-14)
    assert spectral_norm(x.float()) == pytest.approx(3.0, rel=1e-6)
    batch = _with_spectrum(sigma * torch.tensor([[1.0], [2.0]], dtype=torch.float64), 4)
    values = spectral_norm(batch)
    assert values.shape == (2,) and values.dtype == torch.float64
    torch.testing.assert_close(values, torch.tensor([3.0, 6.0], dtype=torch.float64))
    info = spectral_norm(x, return_info=True)
    assert isinstance(info, SpectralNormEstimate) and info.num_matvecs == 0 and bool(info.converged)


@pytest.mark.parametrize("seed", range(3))
def test_spectral_norm_of_a_tall_or_wide_tensor_from_its_gram_matrix_is_the_svds(seed):
    """From GRAM_ASPECT on, the tensor path takes the smaller Gram matrix's largest eigenvalue: the SVD's number to
    rounding, tall and wide, batched, on error-like matrices and on a decaying, a flat and a tiny spectrum."""
    from approxlab.metrics.norms import GRAM_ASPECT

    g = _gen(seed)
    errors = torch.randn(3, 4096, 64, generator=g, dtype=torch.float64) * torch.logspace(-3, 0, 64, dtype=torch.float64)
    shapes = [errors, errors.transpose(-1, -2), torch.randn(2, 8 * GRAM_ASPECT, 8, generator=g, dtype=torch.float64)]
    for sigma in (0.5 ** torch.arange(8.0, dtype=torch.float64), torch.ones(8, dtype=torch.float64),
                  1e-300 * (1.0 + torch.arange(8.0, dtype=torch.float64))):
        shapes.append(_with_spectrum(sigma, 8 * GRAM_ASPECT, seed=seed))
    for x in shapes:
        reference = torch.linalg.matrix_norm(x, ord=2)
        value = torch.as_tensor(spectral_norm(x), dtype=torch.float64)
        torch.testing.assert_close(value, reference, rtol=1e-14, atol=0)


def test_spectral_norm_operator_matches_dense_over_seeds():
    """Operator path (Golub--Kahan in float64) agrees with the SVD to 1e-6 relative on decaying
    and clustered spectra, batched; the certified lower bound never exceeds the true norm."""
    i = torch.arange(16, dtype=torch.float64)
    spectra = {"decaying": 2.0 * 0.7**i, "clustered": torch.where(i < 4, 1.0 - 1e-8 * i, 0.3 / (1 + i))}
    for name, sigma in spectra.items():
        for seed in range(10):
            x = _with_spectrum(sigma.expand(3, 16), 20, seed=seed).float()  # float32 operator
            exact = torch.linalg.matrix_norm(x.double(), ord=2)
            info = spectral_norm(DenseOperator(x), generator=_gen(seed), return_info=True)
            assert info.estimate.dtype == torch.float64, name
            torch.testing.assert_close(info.estimate, exact, rtol=1e-6, atol=0)
            assert bool((info.lower_bound <= exact * (1 + 1e-12)).all())


def test_spectral_norm_warns_when_not_converged():
    i = torch.arange(50, dtype=torch.float64)
    x = _with_spectrum(1.0 - 0.4 * i / 50, seed=1)
    with pytest.warns(ConvergenceWarning, match="did not converge in max_iter=2"):
        value = spectral_norm(DenseOperator(x), max_iter=2, generator=_gen(0))
    assert value < 1.0


def test_spectral_error_dense_operator_and_approximation():
    """Dense path, operator path and Approximation input agree (1e-8 relative)."""
    g = _gen(2)
    exact = torch.randn(2, 20, 20, generator=g, dtype=torch.float64)
    u = torch.randn(2, 20, 3, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, 20, generator=g, dtype=torch.float64)
    approx_dense = exact + u @ w
    truth = torch.linalg.matrix_norm(u @ w, ord=2)
    torch.testing.assert_close(spectral_error(approx_dense, exact), truth)
    low_rank_error = DenseOperator(exact) + ProductOperator(u, w)
    torch.testing.assert_close(spectral_error(low_rank_error, exact, generator=_gen(3)), truth, rtol=1e-8, atol=0)
    torch.testing.assert_close(spectral_error(exact, low_rank_error, generator=_gen(3)), truth, rtol=1e-8, atol=0)
    wrapped = Approximation("fake", "softmax", exact[..., :1], lambda: low_rank_error)
    relative = spectral_error(wrapped, DenseOperator(exact), relative=True, generator=_gen(4))
    torch.testing.assert_close(relative, truth / torch.linalg.matrix_norm(exact, ord=2), rtol=1e-8, atol=0)


def test_spectral_error_against_row_blocked_exact_attention():
    """||approx - D^-1 A||_2 via ExactAttentionOperator (never formed) equals the dense value."""
    q, k, _ = synthetic_qkv((2,), 48, 8, generator=_gen(5))
    softmax = kernels.softmax_matrix(q, k)
    g = _gen(6)
    approx = softmax + 1e-3 * torch.randn(2, 48, 48, generator=g, dtype=torch.float64)
    exact_op = ExactAttentionOperator(q.float(), k.float(), block_size=7)  # float32 in, float64 used
    dense = torch.linalg.matrix_norm(approx - kernels.softmax_matrix(q.float().double(), k.float().double()), ord=2)
    torch.testing.assert_close(spectral_error(DenseOperator(approx), exact_op, generator=_gen(7)), dense, rtol=1e-8, atol=0)


def test_spectral_error_validation():
    a = torch.zeros(2, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`approx` and `exact` must have the same shape .*got \(2, 4, 4\) and \(2, 4, 5\)"):
        spectral_error(a, torch.zeros(2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`approx` and `exact` must have the same shape .*got \(2, 4, 4\) and \(3, 4, 4\)"):
        spectral_error(a, DenseOperator(torch.zeros(3, 4, 4, dtype=torch.float64)))
    with pytest.raises(TypeError, match=r"`approx` must be a torch.Tensor, a LinearOperator or an Approximation; got str"):
        spectral_error("matrix", a)
    with pytest.raises(ValueError, match=r"`exact` has spectral norm 0 in 2 batch element\(s\)"):
        spectral_error(a + 1.0, a, relative=True)
    with pytest.raises(ValueError, match=r"`exact` must be finite"):
        spectral_error(a, a * float("nan"))
    with pytest.raises(TypeError, match=r"`relative` must be a bool; got 'yes'"):
        spectral_error(a, a, relative="yes")


def test_spectral_norm_validation():
    x = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`tol` must be a finite number > 0; got -1.0"):
        spectral_norm(x, tol=-1.0)
    with pytest.raises(ValueError, match=r"`max_iter` must be an integer with 1 <= max_iter <= inf; got 0"):
        spectral_norm(DenseOperator(x), max_iter=0)
    with pytest.raises(TypeError, match=r"`x` must be a torch.Tensor, a LinearOperator or an Approximation; got int"):
        spectral_norm(3)
    with pytest.raises(ValueError, match=r"`x` must have at least 2 dimensions"):
        spectral_norm(torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"`generator` must be a torch.Generator or None; got int"):
        spectral_norm(DenseOperator(x), generator=0)


def test_same_generator_same_estimate():
    x = DenseOperator(_with_spectrum(0.9 ** torch.arange(30, dtype=torch.float64), seed=8))
    assert spectral_norm(x, generator=_gen(1), tol=1e-6) == spectral_norm(x, generator=_gen(1), tol=1e-6)


# -- conditioning ---------------------------------------------------------------------------


def test_condition_number_of_known_spectrum_is_exact():
    """kappa_2 = sigma_max / sigma_min for U diag(sigma) V^T, over seeds, square and rectangular."""
    for seed in SEEDS:
        sigma = torch.logspace(0, -4, 12, dtype=torch.float64) * (seed + 1)
        x = _with_spectrum(sigma, 12 + seed % 3, seed=seed)
        assert condition_number(x) == pytest.approx(1e4, rel=1e-9)
        assert is_numerically_singular(x) is False


def test_condition_number_of_singular_matrix_is_inf():
    """A numerically singular matrix reports inf, never a huge noise-level ratio."""
    sigma = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    x = _with_spectrum(sigma, seed=3)
    assert condition_number(x) == math.inf
    assert is_numerically_singular(x) is True
    assert condition_number(torch.zeros(4, 4)) == math.inf
    # ones(n, n) is rank one; its computed sigma_min is rounding noise (~1e-16), not 0
    batch = torch.stack([torch.ones(5, 5, dtype=torch.float64), torch.eye(5, dtype=torch.float64)])
    kappa = condition_number(batch)
    assert kappa.shape == (2,) and kappa[0] == math.inf and kappa[1] == 1.0
    # float32: the default threshold is max(n, m) * eps(float32), so kappa 1e9 is singular there
    ill = _with_spectrum(torch.tensor([1.0, 1e-9], dtype=torch.float64), seed=4)
    assert condition_number(ill) == pytest.approx(1e9, rel=1e-5)
    assert condition_number(ill.float()) == math.inf
    assert condition_number(ill, rtol=1e-8) == math.inf
    assert condition_number(x, rtol=0.0) > 1e12  # rtol=0 flags exact zeros only


def test_conditioning_validation():
    with pytest.raises(ValueError, match=r"`rtol` must satisfy 0 <= rtol < 1; got 1.0"):
        condition_number(torch.eye(2), rtol=1.0)
    with pytest.raises(ValueError, match=r"`rtol` must be a finite number >= 0; got -0.1"):
        is_numerically_singular(torch.eye(2), rtol=-0.1)
    with pytest.raises(TypeError, match=r"`M` must be a torch.Tensor; got list"):
        condition_number([[1.0]])
    with pytest.raises(ValueError, match=r"`M` must be finite"):
        condition_number(torch.tensor([[1.0, float("inf")], [0.0, 1.0]]))


# -- ranks and decay --------------------------------------------------------------------------


def test_ranks_of_prescribed_spectrum():
    sigma = torch.tensor([1.0, 1e-3, 1e-5, 1e-7, 1e-9, 0.0], dtype=torch.float64)
    for seed in SEEDS:
        x = _with_spectrum(sigma, 8, seed=seed)
        assert numerical_rank(x) == 3  # sigma_i > 1e-6 sigma_1
        assert numerical_rank(x, rtol=1e-8) == 4
        assert stable_rank(x) == pytest.approx(float((sigma**2).sum()), rel=1e-12)
    flat = _with_spectrum(torch.tensor([2.0, 2.0, 2.0, 0.0], dtype=torch.float64), seed=1)
    assert effective_rank(flat) == pytest.approx(3.0, rel=1e-10)  # r equal singular values -> r
    assert stable_rank(flat) == pytest.approx(3.0, rel=1e-12)
    two = torch.tensor([3.0, 1.0], dtype=torch.float64)
    p = two / two.sum()
    assert effective_rank(_with_spectrum(two, seed=2)) == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    batch = _with_spectrum(torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64), seed=3)
    torch.testing.assert_close(effective_rank(batch), torch.tensor([2.0, 1.0], dtype=torch.float64))
    assert numerical_rank(batch).tolist() == [2, 1]
    assert numerical_rank(torch.zeros(3, 3)) == 0


def _geometric_with_tail(n, small, seed, *, margin=100.0):
    """n singular values from 1 down to 1e-6 (geometric), the last ``small`` of them replaced by
    values ``margin`` and more below the threshold n * eps64 * sigma_1."""
    sigma = torch.logspace(0, -6, n, dtype=torch.float64)
    if small:
        tau = n * torch.finfo(torch.float64).eps
        sigma[n - small:] = tau / margin * torch.logspace(0, -2, small, dtype=torch.float64)
    return _with_spectrum(sigma, seed=seed)


def test_numerical_rank_lu_counts_prescribed_small_singular_values():
    """Rank n - s for s singular values 100x below tau = n eps sigma_1 (and 0 to block - 2 of them):
    the LU count equals the SVD's on every seed; beyond the block (and for an exactly singular
    matrix) the SVD's count is returned."""
    n = 120
    tau_rtol = n * torch.finfo(torch.float64).eps
    for seed in range(8):
        for small in (0, 1, 3, 12):
            x = _geometric_with_tail(n, small, seed)
            rank = numerical_rank_lu(x, tau_rtol, block=16, generator=_gen(seed))
            assert rank == n - small == numerical_rank(x, tau_rtol)
    many = _geometric_with_tail(n, 40, 0)  # more than the block holds: the SVD decides
    assert numerical_rank_lu(many, tau_rtol, block=16, generator=_gen(0)) == n - 40
    repeated = torch.rand(6, n, dtype=torch.float64, generator=_gen(1))[torch.arange(n) % 6]  # rank 6
    assert numerical_rank_lu(repeated, tau_rtol, block=16, generator=_gen(1)) == numerical_rank(repeated, tau_rtol) == 6
    batch = torch.stack([_geometric_with_tail(n, 2, 3), torch.eye(n, dtype=torch.float64)])
    assert numerical_rank_lu(batch, tau_rtol, block=8, generator=_gen(2)).tolist() == [n - 2, n]
    assert numerical_rank_lu(torch.zeros(4, 4), generator=_gen(0)) == 0


def test_numerical_rank_lu_agrees_with_svd_on_attention_matrices():
    """A = exp(QK^T/sqrt p) at the SVD's rounding level (rtol = n eps64), as Figure 1's windows.csv
    counts it: the LU count equals the SVD's over seeds and scales (some with singular values below tau)."""
    for seed in range(6):
        for scale in (1.0, 3.0):
            q, k, _ = synthetic_qkv((), n=160, p=8, generator=_gen(seed))
            logits = kernels.scaled_logits(scale * q, scale * k)
            a = torch.exp(logits - logits.max())
            rtol = 160 * torch.finfo(torch.float64).eps
            assert numerical_rank_lu(a, rtol, generator=_gen(seed)) == numerical_rank(a, rtol)


def test_numerical_rank_lu_validation():
    with pytest.raises(ValueError, match=r"`M` must be square"):
        numerical_rank_lu(torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"`block` must be an integer with 2 <= block <= inf; got 1"):
        numerical_rank_lu(torch.eye(3), block=1)
    with pytest.raises(ValueError, match=r"`rtol` must satisfy 0 <= rtol < 1; got 2.0"):
        numerical_rank_lu(torch.eye(3), rtol=2.0)
    with pytest.raises(ValueError, match=r"`max_iter` must be an integer with 1 <= max_iter"):
        numerical_rank_lu(torch.eye(3), max_iter=0)


def test_decay_rate_of_exponential_spectrum():
    """sigma_i = 5 exp(-0.1 i): the fitted slope is -0.1; exact zeros are left out of the fit."""
    for seed in SEEDS:
        i = torch.arange(40, dtype=torch.float64)
        x = _with_spectrum(5.0 * torch.exp(-0.1 * i), 45, seed=seed)
        assert singular_value_decay_rate(x, num=64) == pytest.approx(-0.1, rel=1e-9)
        assert singular_value_decay_rate(x, num=10) == pytest.approx(-0.1, rel=1e-9)
    sigma = torch.cat([torch.exp(-0.3 * torch.arange(5, dtype=torch.float64)), torch.zeros(5, dtype=torch.float64)])
    batch = torch.stack([_with_spectrum(sigma, seed=1), _with_spectrum(torch.ones(10, dtype=torch.float64), seed=2)])
    torch.testing.assert_close(singular_value_decay_rate(batch), torch.tensor([-0.3, 0.0], dtype=torch.float64))


def test_rank_validation():
    with pytest.raises(ValueError, match=r"`M` must be nonzero: the stable rank of a zero matrix is undefined"):
        stable_rank(torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"`M` must be nonzero: the effective rank"):
        effective_rank(torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match=r"`num` must be an integer with 2 <= num <= inf; got 1"):
        singular_value_decay_rate(torch.eye(3), num=1)
    with pytest.raises(ValueError, match=r"at least 2 singular values above the numerical-zero level"):
        singular_value_decay_rate(torch.ones(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`rtol` must satisfy 0 <= rtol < 1; got 2.0"):
        numerical_rank(torch.eye(3), rtol=2.0)


# -- Loewner order ------------------------------------------------------------------------------


def test_loewner_min_eig_on_known_pairs():
    """A = U diag(l) U^T, B = U diag(l - delta) U^T: min eig of A - B is min(delta) exactly; the
    sign says whether A >= B (over seeds)."""
    for seed in SEEDS:
        g = _gen(seed)
        lam = torch.rand(2, 8, generator=g, dtype=torch.float64) + 1.0
        delta = torch.rand(2, 8, generator=g, dtype=torch.float64) - 0.3
        a = psd_matrix(lam, generator=_gen(100 + seed))
        b = psd_matrix(lam - delta, generator=_gen(100 + seed))  # same eigenvectors (same seed)
        value = loewner_min_eig(a, b)
        torch.testing.assert_close(value, delta.min(-1).values, rtol=0, atol=1e-12)
        assert bool((torch.sign(loewner_min_eig(b, a)) == -torch.sign(delta.max(-1).values)).all())
    k = psd_matrix(torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64), generator=_gen(1))
    assert loewner_min_eig(k, torch.zeros(3, 3, dtype=torch.float64)) == pytest.approx(0.0, abs=1e-14)
    assert loewner_min_eig(k, 2 * k) == pytest.approx(-3.0, rel=1e-12)


def test_loewner_validation():
    with pytest.raises(ValueError, match=r"`A` must be square \(\*batch, n, n\); got shape \(3, 4\)"):
        loewner_min_eig(torch.zeros(3, 4), torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"`A` and `B` must have the same shape .*got \(3, 3\) and \(4, 4\)"):
        loewner_min_eig(torch.zeros(3, 3), torch.zeros(4, 4))


# -- re-exports -------------------------------------------------------------------------------


def test_every_metric_is_found_in_metrics():
    """Ridge leverage metrics live in approxlab.leverage and are re-exported here."""
    from approxlab import leverage

    for name in ("ridge_leverage_scores", "statistical_dimension", "coherence", "approximate_ridge_leverage_scores"):
        assert getattr(metrics, name) is getattr(leverage, name)
        assert name in metrics.__all__
    for name in metrics.__all__:
        assert hasattr(metrics, name)
