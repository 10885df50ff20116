"""Nyströmformer: segment means, Lemma 1 (Eq. (5)), Lemma 2, Proposition 1 of its supplement."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import approxlab
from approxlab.kernels import scaled_logits, softmax_matrix
from approxlab.linalg import iterative_pinv
from approxlab.methods.nystromformer import (
    landmark_kernels,
    nystromformer,
    segment_means,
    segment_sizes,
)
from approxlab.synthetic import matrix_with_singular_values, synthetic_qkv
from _helpers import DEVICES, opposed_logits_80_qkv

SEEDS = range(30)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _inf_norm(x):
    """Induced infinity norm (largest absolute row sum), per matrix of the batch."""
    return x.abs().sum(-1).amax(-1)


def _reference_segment_means(x, sizes):
    return torch.stack([chunk.mean(-2) for chunk in torch.split(x, list(sizes), dim=-2)], dim=-2)


# ---------------------------------------------------------------------------- segment means


def test_segment_sizes_37_tokens_5_landmarks():
    """Documented rule: n = m*l + r -> the first r segments have l + 1 tokens, the rest l."""
    assert segment_sizes(37, 5) == (8, 8, 7, 7, 7)
    assert segment_sizes(40, 5) == (8,) * 5
    assert segment_sizes(5, 5) == (1,) * 5
    assert segment_sizes(7, 1) == (7,)


def test_segment_means_37_tokens_5_landmarks_are_exact_means():
    x = torch.randn(2, 3, 37, 4, generator=_gen(0), dtype=torch.float64)
    means = segment_means(x, 5)
    assert means.shape == (2, 3, 5, 4)
    expected = torch.stack(
        [x[..., 0:8, :].mean(-2), x[..., 8:16, :].mean(-2), x[..., 16:23, :].mean(-2),
         x[..., 23:30, :].mean(-2), x[..., 30:37, :].mean(-2)],
        dim=-2,
    )
    torch.testing.assert_close(means, expected, rtol=1e-15, atol=0)


@given(n=st.integers(1, 80), data=st.data())
def test_segment_sizes_property(n, data):
    """Sizes sum to n, differ by at most one, longer segments first; means match a split."""
    m = data.draw(st.integers(1, n))
    sizes = segment_sizes(n, m)
    assert len(sizes) == m and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)
    x = torch.randn(2, n, 3, generator=_gen(n * 101 + m), dtype=torch.float64)
    torch.testing.assert_close(segment_means(x, m), _reference_segment_means(x, sizes), rtol=1e-14, atol=1e-15)


def test_segment_means_with_all_tokens_are_the_tokens():
    x = torch.randn(3, 11, 5, generator=_gen(1), dtype=torch.float64)
    assert torch.equal(segment_means(x, 11), x)


# ---------------------------------------------------------------------------- Lemma 1


def _lemma1_errors(a, num_iter, init):
    """||A E_j||_2 and ||E_j||_2 for E_j = Z_j - A^+, j = 0..num_iter (Z_j from Eq. (5))."""
    reference = torch.linalg.pinv(a)
    errors, distances = [], []
    for j in range(num_iter + 1):
        z = iterative_pinv(a, j, init=init).inverse
        errors.append(float(torch.linalg.matrix_norm(a @ (z - reference), ord=2)))
        distances.append(float(torch.linalg.matrix_norm(z - reference, ord=2)))
    return errors, distances, reference


@pytest.mark.parametrize("seed", SEEDS)
def test_lemma1_third_order_convergence_to_moore_penrose(seed):
    """Lemma 1 of the Nyströmformer supplement (deterministic, checked for 30 seeds).

    For Z_0 with ||A A^+ - A Z_0|| < 1 (the "nystromformer" init guarantees it), the iterates of
    Eq. (5) satisfy ||A E_{j+1}|| <= (3||A E_j||^3 + ||A E_j||^4)/4 <= ||A E_j||^3 (Eq. (8)) and
    Z_j -> A^+. Checked on square non-symmetric matrices of full and deficient rank
    (singular values in [0.4, 1.5] plus exact zeros), up to rounding slack 1e-12.
    """
    g = _gen(seed)
    m = 8
    rank = int(torch.randint(4, m + 1, (1,), generator=g))
    singular_values = torch.zeros(m, dtype=torch.float64)
    singular_values[:rank] = 0.4 + 1.1 * torch.rand(rank, generator=g, dtype=torch.float64)
    a = matrix_with_singular_values(singular_values, generator=g)
    errors, distances, reference = _lemma1_errors(a, 16, "nystromformer")
    assert errors[0] < 1.0  # the lemma's hypothesis
    for before, after in zip(errors[:-1], errors[1:]):
        assert after <= 0.25 * (3 * before**3 + before**4) + 1e-12
        assert after <= before**3 + 1e-12
    # Z_j -> A^+. For singular A, rounding puts components in ker(A) into Z_j that Eq. (5)
    # multiplies by 13/4 per step (A E_j does not see them), so after convergence ||E_j|| grows
    # again; the lemma's ||E_j|| <= ||A^+|| ||A E_j|| assumes they are absent. Check the best iterate,
    # and the last one at full rank.
    tol = 1e-10 * float(torch.linalg.matrix_norm(reference, ord=2))
    assert min(distances) <= tol
    if rank == m:
        assert distances[-1] <= tol


@pytest.mark.parametrize("seed", range(10))
def test_lemma1_initial_scaling_on_column_heavy_cores(seed):
    """Lemma 1's hypothesis ||A A^+ - A Z_0|| < 1 needs Eq. (5)'s initial scaling
    Z_0 = A^T / (||A||_1 ||A||_inf): since sigma_max^2 <= ||A||_1 ||A||_inf, every eigenvalue of
    A Z_0 on range(A) lies in (0, 1]. Checked on well-conditioned row-stochastic cores where every
    landmark query puts 60% of its weight on one landmark key (an "attention sink"):
    ||A||_inf = 1 but ||A||_1 > 4 and sigma_max^2 > 2, so any scaling by ||A||_inf alone (e.g. ||A||_inf^2) breaks the hypothesis
    and the iteration diverges. Then the cubic decrease of Eq. (8) and Z_j -> A^+ (10 seeds)."""
    g = _gen(400 + seed)
    m = 8
    local = torch.softmax(4 * torch.eye(m, dtype=torch.float64) + 0.5 * torch.randn(m, m, generator=g, dtype=torch.float64), -1)
    a = 0.4 * local
    a[:, int(torch.randint(m, (1,), generator=g))] += 0.6  # row-stochastic, 60% on one key
    assert float(a.abs().sum(-2).amax()) > 4 * float(a.abs().sum(-1).amax())  # ||A||_1 >> ||A||_inf
    assert float(torch.linalg.matrix_norm(a, ord=2)) ** 2 > 2.0  # so A^T / ||A||_inf^2 overshoots
    errors, distances, reference = _lemma1_errors(a, 12, "nystromformer")
    assert errors[0] < 1.0  # the lemma's hypothesis
    for before, after in zip(errors[:-1], errors[1:]):
        assert after <= before**3 + 1e-12
    assert distances[-1] <= 1e-10 * float(torch.linalg.matrix_norm(reference, ord=2))


@pytest.mark.parametrize("seed", range(10))
def test_lemma1_softmax_cores_official_init(seed):
    """Lemma 1 on landmark softmax cores A_S with the released code's init (deterministic).

    For a row-stochastic A_S, sigma_max^2 <= ||A_S||_1 ||A_S||_inf = max column sum, so
    Z_0 = A_S^T / max column sum satisfies the hypothesis; the cubic decrease then holds.
    """
    q, k, _ = synthetic_qkv((), 24, 4, scale=1.2, generator=_gen(100 + seed))
    _, core, _ = landmark_kernels(q, k, 6)
    errors, distances, reference = _lemma1_errors(core, 20, "official")
    assert errors[0] < 1.0
    for before, after in zip(errors[:-1], errors[1:]):
        assert after <= before**3 + 1e-11
    assert distances[-1] <= 1e-8 * float(torch.linalg.matrix_norm(reference, ord=2))


def test_official_init_is_batch_wide_nystromformer_init_is_per_matrix():
    """init="official": Z_0 = A^T / (largest column sum over the whole batch); "nystromformer": per matrix."""
    q, k, v = synthetic_qkv((3,), 20, 4, scale=1.5, generator=_gen(7))
    official = nystromformer(q, k, v, num_features=5, num_iter=0, init="official")
    core = official.info["core"]
    torch.testing.assert_close(official.info["pinv_inverse"], core.transpose(-1, -2) / core.sum(-2).amax())
    batched = nystromformer(q, k, v, num_features=5)
    single = nystromformer(q[1], k[1], v[1], num_features=5)
    torch.testing.assert_close(batched.output[1], single.output, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- Lemma 2


@pytest.mark.parametrize("seed", range(15))
def test_lemma2_all_landmarks_recover_softmax_attention(seed):
    """Lemma 2 of the supplement (deterministic, 15 seeds): with m = n landmarks (each token its
    own segment) Q~ = Q, K~ = K and S^ = S S^+ S = S: exact pinv gives softmax attention to
    rounding, and Eq. (5) with enough iterations converges to it."""
    n = 10
    q, k, v = synthetic_qkv((2,), n, 4, scale=1.5, generator=_gen(200 + seed))
    exact = approxlab.exact_attention(q, k, v)
    s = softmax_matrix(q, k)
    kappa = float(torch.linalg.cond(s).max())
    tol = 1e-13 * kappa
    result = approxlab.approximate("nystromformer", q, k, v, num_features=n, pinv="exact")
    torch.testing.assert_close(result.output, exact, rtol=0, atol=tol)
    torch.testing.assert_close(result.matrix(), s, rtol=0, atol=tol)
    iterative = approxlab.approximate("nystromformer", q, k, v, num_features=n, num_iter=40)
    torch.testing.assert_close(iterative.output, exact, rtol=0, atol=10 * tol)


# ---------------------------------------------------------------------------- Proposition 1


@pytest.mark.parametrize("seed", SEEDS)
def test_proposition1_linf_error_bound(seed):
    """Proposition 1 of the supplement (deterministic, 30 seeds, several Z*):
    ||SV - S^V||_inf <= (1 + ||A_S^+||_inf + ||A_S^+ - Z*||_inf) ||V||_inf (induced inf-norms,
    and therefore also for the largest entry of the output). Its proof uses that F, B and S are
    row-stochastic, checked too."""
    g = _gen(300 + seed)
    n = int(torch.randint(12, 40, (1,), generator=g))
    m = int(torch.randint(2, 9, (1,), generator=g))
    scale = float(0.5 + 1.5 * torch.rand(1, generator=g))
    q, k, v = synthetic_qkv((2,), n, 6, scale=scale, generator=g)
    exact = approxlab.exact_attention(q, k, v)
    f, core, b = landmark_kernels(q, k, m)
    for factor in (f, b):
        torch.testing.assert_close(factor.sum(-1), torch.ones_like(factor.sum(-1)))
    pinv = torch.linalg.pinv(core)
    for options in ({"num_iter": 0}, {"num_iter": 2}, {"num_iter": 6}, {"pinv": "exact"}):
        result = approxlab.approximate("nystromformer", q, k, v, num_features=m, **options)
        z = result.info["pinv_inverse"]
        bound = (1 + _inf_norm(pinv) + _inf_norm(pinv - z)) * _inf_norm(v)
        error = _inf_norm(exact - result.output)
        assert bool((error <= bound * (1 + 1e-10)).all()), (options, error, bound)
        entry_error = (exact - result.output).abs().amax((-2, -1))
        assert bool((entry_error <= (1 + _inf_norm(pinv) + _inf_norm(pinv - z)) * v.abs().amax((-2, -1)) * (1 + 1e-10)).all())


# ---------------------------------------------------------------------------- the method


def _dense_reference(q, k, v, m):
    """F pinv(A_S) B from the definitions, with explicit segment means."""
    sizes = segment_sizes(q.shape[-2], m)
    q_tilde = _reference_segment_means(q, sizes)
    k_tilde = _reference_segment_means(k, sizes)
    f = torch.softmax(scaled_logits(q, k_tilde), -1)
    a_s = torch.softmax(scaled_logits(q_tilde, k_tilde), -1)
    b = torch.softmax(scaled_logits(q_tilde, k), -1)
    return f @ torch.linalg.pinv(a_s) @ b


def test_exact_pinv_matches_dense_reference_n_not_divisible():
    q, k, v = synthetic_qkv((2, 2), 37, 4, generator=_gen(11))
    result = approxlab.approximate("nystromformer", q, k, v, num_features=5, pinv="exact")
    reference = _dense_reference(q, k, v, 5)
    torch.testing.assert_close(result.matrix(), reference, rtol=1e-9, atol=1e-9)
    assert result.info["segment_sizes_q"] == (8, 8, 7, 7, 7)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3, 2)])
def test_output_equals_operator_and_batched_shapes(batch):
    q, k, v = synthetic_qkv(batch, 23, 5, generator=_gen(12))
    v = v[..., :3]
    result = approxlab.approximate("nystromformer", q, k, v, num_features=4)
    op = result.operator()
    assert op.shape == (*batch, 23, 23)
    assert result.output.shape == (*batch, 23, 3)
    torch.testing.assert_close(op.matmat(v), result.output, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.matrix() @ v, result.output, rtol=1e-10, atol=1e-10)
    assert result.info["pinv_residuals"].shape == (2, *batch)  # first and last iterate
    assert result.info["penrose_residuals"].shape == (2, *batch)
    full = approxlab.approximate("nystromformer", q, k, v, num_features=4, residual_history=True)
    assert full.info["penrose_residuals"].shape == (7, *batch)
    assert result.info["core"].shape == (*batch, 4, 4)
    assert result.info["core_condition_number"].shape == batch


def test_penrose_residuals_decrease_over_six_iterations():
    """Supplement Fig. 3: six iterations of Eq. (5) already approximate A_S^+ well."""
    q, k, v = synthetic_qkv((4,), 64, 8, generator=_gen(13))
    result = approxlab.approximate("nystromformer", q, k, v, num_features=8, residual_history=True)
    pen = result.info["penrose_residuals"]
    assert bool((pen[-1] < pen[0]).all())
    assert bool((pen[1:] <= pen[:-1] + 1e-12).all())


@pytest.mark.parametrize("device", DEVICES)
def test_float32_logits_80_finite(device):
    """Overflow safety: float32 logits up to +-80 give finite kernels and output."""
    q, k, v = opposed_logits_80_qkv(48, seed=14)
    q, k, v = q.to(device), k.to(device), v.to(device)
    for m in (4, 7, 16):
        for options in ({}, {"init": "official"}, {"pinv": "exact"}):
            result = approxlab.approximate("nystromformer", q, k, v, num_features=m, **options)
            assert result.output.dtype == torch.float32
            assert result.output.device.type == device
            assert bool(torch.isfinite(result.output).all())


def test_validation_messages():
    q, k, v = synthetic_qkv((2,), 12, 4, generator=_gen(15))
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 12; got 13"):
        nystromformer(q, k, v, num_features=13)
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 12; got 0"):
        nystromformer(q, k, v, num_features=0)
    with pytest.raises(ValueError, match=r"`pinv` must be one of \['exact', 'iterative'\]; got 'svd'"):
        nystromformer(q, k, v, num_features=4, pinv="svd")
    with pytest.raises(ValueError, match=r"`num_iter` must be an integer with 0 <= num_iter <= inf; got -1"):
        nystromformer(q, k, v, num_features=4, num_iter=-1)
    with pytest.raises(TypeError, match=r"`num_iter` must be an integer; got 2.5"):
        nystromformer(q, k, v, num_features=4, num_iter=2.5)
    with pytest.raises(ValueError, match=r"`init` must be one of \['identity', 'nystromformer', 'official'\]; got 'zeros'"):
        nystromformer(q, k, v, num_features=4, init="zeros")
    with pytest.raises(TypeError, match=r"`init` must be one of .* or a torch.Tensor; got int"):
        nystromformer(q, k, v, num_features=4, init=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'landmarks'"):
        approxlab.approximate("nystromformer", q, k, v, num_features=4, landmarks=3)
    with pytest.raises(ValueError, match=r"`num_landmarks` must be an integer with 1 <= num_landmarks <= 12; got 20"):
        segment_means(q, 20)
    with pytest.raises(ValueError, match=r"`num_landmarks` must be an integer with 1 <= num_landmarks <= 3; got 4"):
        segment_sizes(3, 4)
    with pytest.raises(ValueError, match="`x` must be finite"):
        segment_means(torch.full((4, 2), float("nan")), 2)
