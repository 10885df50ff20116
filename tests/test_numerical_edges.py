"""Numerical edges: subnormal and near-overflow inputs, scale invariance, broadcasting.

Every scale-invariant quantity must give the same answer for ``c * M`` as for ``M`` whatever
the power of ten ``c`` (``1e-310``: subnormal entries; ``1e308``: entries next to overflow); a
scale-dependent result beyond the float range is an ``OverflowError`` naming the input, never
``inf`` (or 0, or NaN) returned as if it were the answer; methods that are invariant to the scale
of ``q``/``k`` (YOSO) or linear in ``v`` (all) stay so at every scale; a key mask never widens
the output. The expected values are computed from the unscaled input (or by hand).
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab import kernels, leverage, linalg, metrics, operators, sketch, synthetic
from approxlab.linalg.scaling import balance, safe_norm, times_power_of_two, unit_rows
from _helpers import rope_stated

F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


I4 = torch.eye(4, dtype=F64)
ONES = torch.ones(3, 3, dtype=F64)
A = torch.randn(5, 4, dtype=F64, generator=_gen(1))
SIGMA = torch.linalg.svdvals(A)
KAPPA = float(SIGMA[0] / SIGMA[-1])
STABLE = float((SIGMA**2).sum() / SIGMA[0] ** 2)
NORM_A = float(SIGMA[0])
DECAY = torch.exp(-torch.arange(5.0, dtype=F64))
_BASIS = torch.linalg.qr(torch.randn(5, 5, dtype=F64, generator=_gen(2)))[0]
DECAYING = _BASIS @ torch.diag(DECAY) @ _BASIS.T  # PSD with eigenvalues exp(-i): decay rate -1
PSD = synthetic.psd_matrix(torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=F64), generator=_gen(1))
PSD_INV = torch.linalg.inv(PSD)
DSTAT = leverage.statistical_dimension(PSD, 0.7)
BETA = leverage.coherence(PSD, 0.7)
LEVERAGE = leverage.ridge_leverage_scores(PSD, 0.7)
COLUMNS = torch.tensor([0, 2])
NYSTROM = sketch.nystrom(PSD, COLUMNS)
APPROX_LEVERAGE = leverage.approximate_ridge_leverage_scores(PSD[:, COLUMNS], PSD.diagonal(), COLUMNS, 0.7)
KAPPA_PSD = float(torch.linalg.cond(PSD))


def _value(name, call, expected, rel=1e-9):
    return pytest.param(call, expected, rel, id=name)


VALUES = [
    # condition numbers and singularity (scale-invariant)
    _value("cond-1e-310-I", lambda: metrics.condition_number(1e-310 * I4), 1.0),
    _value("cond-1e-200-A", lambda: metrics.condition_number(1e-200 * A), KAPPA),
    _value("cond-1e300-A", lambda: metrics.condition_number(1e300 * A), KAPPA),
    _value("cond-2^-1040-diag", lambda: metrics.condition_number(2.0**-1040 * torch.diag(torch.tensor([1.0, 0.5],
                                                                 dtype=F64))), 2.0),
    _value("cond-rtol0-1e-310-I", lambda: linalg.condition_number(1e-310 * I4, rtol=0.0), 1.0),
    _value("cond-float32-subnormal", lambda: metrics.condition_number(1e-40 * torch.eye(3)), 1.0),
    _value("singular-1e-310-I", lambda: metrics.is_numerically_singular(1e-310 * I4), False),
    _value("singular-1e300-I", lambda: metrics.is_numerically_singular(1e300 * I4), False),
    # ranks and decay (scale-invariant)
    _value("stable-rank-1e-310-I", lambda: metrics.stable_rank(1e-310 * I4), 4.0),
    _value("stable-rank-1e307-A", lambda: metrics.stable_rank(1e307 * A), STABLE),
    _value("stable-rank-1e308-ones", lambda: metrics.stable_rank(1e308 * ONES), 1.0),
    _value("stable-rank-float32-3e38", lambda: metrics.stable_rank(torch.full((3, 3), 3e38)), 1.0, 1e-6),
    _value("effective-rank-1e-310-I", lambda: metrics.effective_rank(1e-310 * I4), 4.0),
    _value("effective-rank-1e308-ones", lambda: metrics.effective_rank(1e308 * ONES), 1.0, 1e-6),
    _value("numerical-rank-1e-310", lambda: metrics.numerical_rank(
        1e-310 * torch.diag(torch.tensor([1.0, 1e-3, 1e-9], dtype=F64))), 2),
    _value("numerical-rank-1e308-ones", lambda: metrics.numerical_rank(1e308 * ONES), 1),
    _value("decay-1e-300", lambda: metrics.singular_value_decay_rate(1e-300 * DECAYING), -1.0, 1e-6),
    _value("decay-1e305", lambda: metrics.singular_value_decay_rate(1e305 * DECAYING), -1.0, 1e-6),
    _value("spectrum-measures-stable-rank-1e-310", lambda: float(metrics.spectrum_measures(
        1e-310 * torch.tensor([1.0, 0.5], dtype=F64), (2, 2))["stable_rank"]), 1.25),
    _value("spectrum-measures-kappa-1e-310", lambda: float(metrics.spectrum_measures(
        1e-310 * torch.tensor([1.0, 0.5], dtype=F64), (2, 2))["condition_number"]), 2.0),
    # norms and errors (scale-dependent, representable)
    _value("spectral-norm-1e307-ones", lambda: metrics.spectral_norm(1e307 * ONES), 3e307),
    _value("spectral-norm-1e-310-I", lambda: metrics.spectral_norm(1e-310 * I4), 1e-310, 1e-3),
    _value("spectral-norm-float32-3e38", lambda: metrics.spectral_norm(torch.full((3, 3), 3e38)), 9e38, 1e-6),
    _value("spectral-norm-operator-1e307", lambda: metrics.spectral_norm(
        operators.DenseOperator(1e307 * ONES), generator=_gen()), 3e307, 1e-8),
    _value("spectral-norm-operator-1e-310", lambda: metrics.spectral_norm(
        operators.DenseOperator(1e-310 * I4), generator=_gen()), 1e-310, 1e-3),
    _value("golub-kahan-float32-1e37", lambda: float(linalg.golub_kahan((1e37 * A).float(), generator=_gen()).estimate),
           1e37 * NORM_A, 1e-5),
    _value("golub-kahan-float32-1e-38", lambda: float(linalg.golub_kahan((1e-38 * A).float(),
                                                                        generator=_gen()).estimate), 1e-38 * NORM_A, 1e-4),
    _value("spectral-error-relative-1e307", lambda: metrics.spectral_error(1e307 * A, -1e307 * A, relative=True), 2.0),
    _value("spectral-error-relative-1e308", lambda: metrics.spectral_error(1e308 * I4, -1e308 * I4, relative=True),
           2.0),
    _value("spectral-error-relative-1e-310", lambda: metrics.spectral_error(1e-310 * I4, 2e-310 * I4, relative=True),
           0.5, 1e-3),
    _value("spectral-error-operator-1e-310", lambda: metrics.spectral_error(
        operators.DenseOperator(1e-310 * A), operators.DenseOperator(0 * A), generator=_gen()), 1e-310 * NORM_A, 1e-6),
    _value("spectral-error-operator-relative-1e300", lambda: metrics.spectral_error(
        operators.DenseOperator(1e300 * A), operators.DenseOperator(2e300 * A), relative=True, generator=_gen()), 0.5),
    _value("loewner-1e-310", lambda: metrics.loewner_min_eig(3e-310 * I4, 1e-310 * I4), 2e-310, 1e-3),
    _value("loewner-1e-320", lambda: metrics.loewner_min_eig(3e-320 * torch.eye(2, dtype=F64),
                                                             torch.zeros(2, 2, dtype=F64)), 3e-320, 1e-2),
    # ridge leverage (depends on K / lambda only)
    _value("dstat-1e-310", lambda: leverage.statistical_dimension(1e-310 * PSD, 0.7e-310), DSTAT, 1e-3),
    _value("dstat-1e307", lambda: leverage.statistical_dimension(1e307 * PSD, 0.7e307), DSTAT),
    _value("dstat-lam-1e-320", lambda: leverage.statistical_dimension(PSD, 1e-320), 4.0, 1e-12),
    _value("dstat-lam-huge", lambda: leverage.statistical_dimension(1e-300 * PSD, 1e300), 0.0, 0.0),
    _value("coherence-1e-305", lambda: leverage.coherence(1e-305 * PSD, 0.7e-305), BETA, 1e-6),
    _value("coherence-near-overflow", lambda: leverage.coherence(1e308 / 3 * PSD, 0.7e308 / 3), BETA),
    _value("leverage-1e307", lambda: leverage.ridge_leverage_scores(1e307 * PSD, 0.7e307), LEVERAGE),
    _value("approximate-leverage-1e-305", lambda: leverage.approximate_ridge_leverage_scores(
        1e-305 * PSD[:, COLUMNS], 1e-305 * PSD.diagonal(), COLUMNS, 0.7e-305), APPROX_LEVERAGE, 1e-6),
    _value("approximate-leverage-1e305", lambda: leverage.approximate_ridge_leverage_scores(
        1e305 * PSD[:, COLUMNS], 1e305 * PSD.diagonal(), COLUMNS, 0.7e305), APPROX_LEVERAGE),
    _value("nystrom-1e-305", lambda: sketch.nystrom(1e-305 * PSD, COLUMNS) * 1e305, NYSTROM),
    # pseudo-inverses (pinv(c M) = pinv(M) / c, when representable)
    _value("stable-pinv-1e-300-I", lambda: linalg.stable_pinv(1e-300 * I4), 1e300 * I4, 1e-12),
    _value("stable-pinv-1e306", lambda: linalg.stable_pinv(1e306 * PSD), 1e-306 * PSD_INV),
    _value("stable-pinv-svd-1e-300", lambda: linalg.stable_pinv(1e-300 * PSD, hermitian=False), 1e300 * PSD_INV),
    _value("stable-pinv-1e308-ones", lambda: linalg.stable_pinv(1e308 * ONES) * 1e308, ONES / 9, 1e-6),
    _value("iterative-pinv-1e-200", lambda: linalg.iterative_pinv(1e-200 * PSD, 20).inverse, 1e200 * PSD_INV),
    _value("iterative-pinv-1e300", lambda: linalg.iterative_pinv(1e300 * PSD, 20).inverse, 1e-300 * PSD_INV),
    _value("iterative-pinv-official-1e-300", lambda: linalg.iterative_pinv(1e-300 * PSD.abs(), 30, init="official")
           .inverse * 1e-300, torch.linalg.inv(PSD.abs()), 1e-6),
    _value("nystrom-core-kappa-1e-310", lambda: float(linalg.nystrom_core(1e-310 * PSD)[1]["core_condition_number"]),
           KAPPA_PSD, 1e-6),
    _value("nystrom-core-kappa-1e300", lambda: float(linalg.nystrom_core(1e300 * PSD)[1]["core_condition_number"]),
           KAPPA_PSD),
    # the Gaussian kernel's expanded distance cancels for large rows close together
    _value("gaussian-kernel-cancellation-1e9", lambda: float(kernels.gaussian_kernel(
        torch.tensor([[1e9, 0.0]], dtype=F64), torch.tensor([[1e9, 3.0]], dtype=F64))), math.exp(-4.5)),
    _value("gaussian-kernel-cancellation-float32", lambda: float(kernels.gaussian_kernel(
        torch.tensor([[1e5, 0.0]]), torch.tensor([[1e5, 1.0]]))), math.exp(-0.5), 1e-6),
]


@pytest.mark.parametrize(("call", "expected", "rel"), VALUES)
def test_right_answer_at_the_ends_of_the_float_range(call, expected, rel):
    result = call()
    if isinstance(expected, torch.Tensor):
        assert isinstance(result, torch.Tensor) and bool(torch.isfinite(result).all())
        torch.testing.assert_close(result.to(F64), expected.to(F64), rtol=rel, atol=0)
    elif isinstance(expected, bool):
        assert result is expected
    elif isinstance(expected, int) and not isinstance(expected, bool):
        assert type(result) is int and result == expected
    else:
        assert isinstance(result, float), type(result)
        assert result == pytest.approx(expected, rel=rel, abs=0)


def _error(name, call, error, match):
    return pytest.param(call, error, match, id=name)


ERRORS = [
    _error("spectral-norm-beyond-float64", lambda: metrics.spectral_norm(1e308 * ONES), OverflowError,
           r"the spectral norm of `x` is about 1e\+308, beyond the largest float64"),
    _error("spectral-norm-batch-beyond-float64", lambda: metrics.spectral_norm(torch.stack([1e308 * ONES, ONES])),
           OverflowError, r"the spectral norm of `x` is about 1e\+308"),
    _error("spectral-error-beyond-float64", lambda: metrics.spectral_error(1e308 * I4, -1e308 * I4), OverflowError,
           r"the spectral norm of `approx - exact` is about 1e\+308"),
    _error("loewner-beyond-float64", lambda: metrics.loewner_min_eig(1e308 * I4, -1e308 * I4), OverflowError,
           r"lambda_min of `A - B` is about 1e\+308"),
    _error("golub-kahan-beyond-float64", lambda: linalg.golub_kahan(1e308 * ONES, generator=_gen()), OverflowError,
           r"`op` has a spectral norm beyond the largest torch.float64"),
    _error("golub-kahan-float32-beyond", lambda: linalg.golub_kahan(torch.full((3, 3), 3e38), generator=_gen()),
           FloatingPointError, r"`op` produced non-finite values .* entries beyond the range of torch.float32"),
    _error("stable-pinv-beyond-float64", lambda: linalg.stable_pinv(1e-310 * I4), OverflowError,
           r"`m` has a pseudo-inverse beyond the largest torch.float64 .* smallest kept eigenvalue is 1.000e-310"),
    _error("stable-pinv-svd-beyond-float64", lambda: linalg.stable_pinv(1e-310 * I4, hermitian=False), OverflowError,
           r"smallest kept singular value is 1.000e-310"),
    _error("iterative-pinv-beyond-float64", lambda: linalg.iterative_pinv(1e-310 * I4, 20), OverflowError,
           r"`m` has a pseudo-inverse beyond the largest torch.float64"),
    _error("scaled-core-row-sums-overflow", lambda: linalg.scaled_core(1e308 * ONES, 0.1), OverflowError,
           r"`m` must have row sums within the range of torch.float64"),
    _error("key-mask-more-batch-dimensions", lambda: _approximate("yoso-e", key_mask=torch.ones(3, 2, 12,
                                                                                               dtype=torch.bool)),
           ValueError, r"`key_mask` of shape \(3, 2, 12\) does not broadcast to the keys' \(\*batch, n_k\) = \(2, 12\) "
                       r"without widening it: it must have at most 2 dimensions"),
    _error("key-mask-size-1-extra-dimension", lambda: _approximate("exact", key_mask=torch.ones(1, 1, 12,
                                                                                               dtype=torch.bool)),
           ValueError, r"`key_mask` of shape \(1, 1, 12\) does not broadcast to the keys'"),
    _error("key-mask-wrong-batch-size", lambda: _approximate("exact", key_mask=torch.ones(3, 12, dtype=torch.bool)),
           ValueError, r"each 1 or the keys' size"),
]


@pytest.mark.parametrize(("call", "error", "match"), ERRORS)
def test_beyond_the_float_range_is_an_error_naming_the_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


Q, K, V = synthetic.synthetic_qkv((2,), 12, 4, generator=_gen(0))


def _approximate(method, q=Q, k=K, v=V, **options):
    options.setdefault("causal", approxlab.methods.get(method).causal_only)  # the cache policies are causal-only
    options = {**rope_stated(method), **options}  # synthetic Q/K/V: no RoPE
    return approxlab.approximate(method, q, k, v, num_features=4, generator=_gen(5), **options).output


@pytest.mark.parametrize("method", ["yoso", "yoso-e"])
@pytest.mark.parametrize("scale", [1e-14, 1e-170, 1e-310, 1e100])
def test_yoso_is_invariant_to_the_scale_of_q_and_k(method, scale):
    """YOSO hashes and YOSO-E's cosines see only directions: q*1e-14 was 87 % off under the
    1e-12 floor of F.normalize."""
    reference = _approximate(method)
    torch.testing.assert_close(_approximate(method, q=Q * scale), reference, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(_approximate(method, k=K * scale), reference, rtol=1e-9, atol=1e-12)


def test_normalized_yoso_output_is_invariant_to_the_scale_of_v():
    reference = _approximate("yoso-e", normalize_output=True)
    torch.testing.assert_close(_approximate("yoso-e", v=V * 1e-14, normalize_output=True), reference)


@pytest.mark.parametrize("method", approxlab.methods.available())
@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_every_method_is_linear_in_v_at_every_scale(method, scale):
    reference = _approximate(method)
    torch.testing.assert_close(_approximate(method, v=V * scale) / scale, reference, rtol=1e-9, atol=1e-12)


def test_a_key_mask_that_fits_still_broadcasts_over_heads():
    q, k, v = synthetic.synthetic_qkv((2, 3), 6, 4, generator=_gen(1))
    mask = torch.ones(2, 1, 6, dtype=torch.bool)
    mask[0, 0, -1] = False
    out = approxlab.approximate("exact", q, k, v, num_features=1, key_mask=mask).output
    assert out.shape == (2, 3, 6, 4)


def test_scaling_helpers_are_exact_and_leave_ordinary_inputs_alone():
    x = torch.randn(4, 5, dtype=F64, generator=_gen(3))
    assert balance(x)[0] is x and torch.equal(balance(x)[1], torch.zeros(1, 1, dtype=F64))
    assert torch.equal(safe_norm(x), torch.linalg.vector_norm(x, dim=-1))
    assert torch.equal(unit_rows(x), torch.nn.functional.normalize(x, dim=-1))
    small, exponent = balance(x * 2.0**-1000)
    assert torch.equal(small, times_power_of_two(x, -exponent - 1000))  # a power of two: no digit lost
    assert 0.5 <= float(small.abs().max()) < 1.0
    assert torch.equal(times_power_of_two(torch.tensor([2.0**-1000], dtype=F64), 2000.0),
                       torch.tensor([2.0**1000], dtype=F64))
    assert torch.equal(unit_rows(torch.zeros(2, 3, dtype=F64)), torch.zeros(2, 3, dtype=F64))


@pytest.mark.parametrize("call", [
    lambda: metrics.spectral_norm(A), lambda: metrics.condition_number(A), lambda: metrics.stable_rank(A),
    lambda: metrics.effective_rank(A), lambda: metrics.singular_value_decay_rate(A),
    lambda: metrics.spectral_error(A, 2 * A), lambda: metrics.loewner_min_eig(PSD, 0.5 * PSD),
    lambda: leverage.statistical_dimension(PSD, 0.7), lambda: leverage.coherence(PSD, 0.7),
], ids=["spectral_norm", "condition_number", "stable_rank", "effective_rank", "decay_rate", "spectral_error",
        "loewner_min_eig", "statistical_dimension", "coherence"])
def test_scalar_metrics_return_a_float_for_one_matrix_and_float64_for_a_batch(call):
    """The one return rule of approxlab.metrics (and leverage): float / tensor (*batch,) float64."""
    assert type(call()) is float


def test_batched_metrics_are_float64_tensors_of_the_batch_shape():
    stack = torch.stack([PSD, 2 * PSD, 3 * PSD]).float()
    for value in (metrics.spectral_norm(stack), metrics.condition_number(stack), metrics.stable_rank(stack),
                  leverage.statistical_dimension(stack, 0.7), leverage.coherence(stack, 0.7),
                  metrics.loewner_min_eig(stack, stack)):
        assert isinstance(value, torch.Tensor) and value.dtype == F64 and value.shape == (3,)
    assert metrics.numerical_rank(stack).dtype == torch.int64
    assert metrics.is_numerically_singular(stack).dtype == torch.bool
    assert type(metrics.numerical_rank(PSD)) is int and type(metrics.is_numerically_singular(PSD)) is bool


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e200, 1e300])
@pytest.mark.parametrize("ridge", ["lam", "lambda_scale"])
def test_matrix_free_ridge_estimates_depend_on_k_over_lambda_only(scale, ridge):
    """Conjugate gradients squared residuals of K's size: at 1e+-200 they overflowed or underflowed and
    the tail correction was skipped (13.34 became 9.96)."""
    kernel = synthetic.psd_matrix(torch.exp(-torch.arange(40.0, dtype=F64) / 4), generator=_gen(0))

    def estimate(c):
        option = {"lam": 0.1 * c} if ridge == "lam" else {"lambda_scale": 0.1}
        return leverage.estimate_ridge_quantities(operators.DenseOperator(c * kernel), diagonal=c * kernel.diagonal(),
                                                  generator=_gen(1), **option)

    reference, scaled = estimate(1.0), estimate(scale)
    assert float(scaled.statistical_dimension) == pytest.approx(float(reference.statistical_dimension), rel=1e-12)
    torch.testing.assert_close(scaled.leverage_scores, reference.leverage_scores, rtol=1e-10, atol=1e-14)
    assert float(scaled.lam) == pytest.approx(scale * float(reference.lam), rel=1e-12)
