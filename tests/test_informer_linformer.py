"""Informer ProbSparse attention (Zhou et al., 2021) and Linformer (Wang et al., 2020)."""

import math

import pytest
import torch

import approxlab
from approxlab.kernels import scaled_logits, softmax_matrix
from approxlab.methods.informer import default_sample_size, sparsity_measurement
from approxlab.methods.linformer import gaussian_projection
from approxlab.synthetic import synthetic_qkv
from _helpers import gen as _gen, logits_80_qkv as _large_logit_qkv




def _operator_checks(result, n, n_k, p_v, g):
    operator = result.operator()
    assert tuple(operator.shape) == (2, 3, n, n_k)
    assert result.output.shape == (2, 3, n, p_v)
    dense = operator.to_dense()
    x = torch.randn(2, 3, n_k, 4, generator=g, dtype=torch.float64)
    y = torch.randn(2, 3, n, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(operator.matmat(x), dense @ x)
    torch.testing.assert_close(operator.rmatmat(y), dense.transpose(-1, -2) @ y)
    return dense


# ====================================================================== Informer


@pytest.mark.parametrize("measure_keys", ["sampled", "all"])
def test_informer_with_all_queries_is_exact_softmax(measure_keys):
    """ProbSparse attention (Informer Eq. (3)) with u = n keeps every query: exact softmax attention."""
    q, k, v = synthetic_qkv((2, 3), 20, 8, generator=_gen(1))
    result = approxlab.approximate(
        "informer", q, k, v, num_features=20, generator=_gen(2), measure_keys=measure_keys
    )
    torch.testing.assert_close(result.output, approxlab.exact_attention(q, k, v))
    torch.testing.assert_close(result.matrix(), softmax_matrix(q, k))
    assert torch.equal(result.info["selected"], torch.arange(20).expand(2, 3, 20))


@pytest.mark.parametrize("measure_keys", ["sampled", "all"])
def test_informer_lazy_rows_are_mean_of_values_active_rows_exact(measure_keys):
    """Lazy queries output mean(V) (uniform rows 1/n_k); the u active queries get exact softmax rows."""
    q, k, v = synthetic_qkv((2, 3), 24, 8, generator=_gen(3))
    result = approxlab.approximate(
        "informer", q, k, v, num_features=5, generator=_gen(4), measure_keys=measure_keys
    )
    selected = result.info["selected"]
    assert selected.shape == (2, 3, 5)
    active = torch.zeros(2, 3, 24, dtype=torch.bool).scatter(-1, selected, True)
    exact = approxlab.exact_attention(q, k, v)
    mean_v = v.mean(-2, keepdim=True).expand_as(exact)
    torch.testing.assert_close(result.output[active], exact[active])
    torch.testing.assert_close(result.output[~active], mean_v[~active])
    matrix = result.matrix()
    torch.testing.assert_close(matrix[~active], torch.full_like(matrix[~active], 1 / 24))
    torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 3, 24, dtype=torch.float64))


def test_informer_all_keys_selects_top_u_of_max_mean_measurement():
    """measure_keys='all': the active queries are the top-u of the max-mean measurement
    M(q_i, K) = max_j s_ij - mean_j s_ij (Informer Eq. (4))."""
    q, k, v = synthetic_qkv((2, 3), 30, 8, generator=_gen(5))
    result = approxlab.approximate("informer", q, k, v, num_features=7, generator=_gen(6), measure_keys="all")
    logits = scaled_logits(q, k)
    measurement = logits.amax(-1) - logits.mean(-1)
    torch.testing.assert_close(result.info["sparsity"], measurement)
    expected = torch.topk(measurement, 7, dim=-1).indices.sort(-1).values
    assert torch.equal(result.info["selected"], expected)
    assert result.info["sample_size"] is None


def test_sampled_measurement_with_every_key_equals_full_measurement():
    """sparsity_measurement on key_indices listing every key equals the all-keys measurement."""
    q, k, _ = synthetic_qkv((2,), 9, 4, generator=_gen(7))
    k = k[..., :6, :]
    every_key = torch.arange(6).expand(2, 9, 6)
    torch.testing.assert_close(sparsity_measurement(q, k, key_indices=every_key), sparsity_measurement(q, k))


def test_informer_default_sample_size_and_info():
    """Default key sample c * ceil(ln n_k), c = 5, capped at n_k (Informer's ProbSparse sampling)."""
    assert default_sample_size(1) == 1
    assert default_sample_size(16) == 15
    assert default_sample_size(100) == 25
    assert default_sample_size(512) == 35
    q, k, v = synthetic_qkv((2,), 40, 4, generator=_gen(8))
    result = approxlab.approximate("informer", q, k, v, num_features=6, generator=_gen(9))
    assert result.info["sample_size"] == 20 and result.info["measure_keys"] == "sampled"
    result = approxlab.approximate("informer", q, k, v, num_features=6, generator=_gen(9), sample_size=3)
    assert result.info["sample_size"] == 3


def test_informer_validation_messages():
    q, k, v = synthetic_qkv((2,), 8, 4, generator=_gen(10))
    with pytest.raises(ValueError, match=r"`measure_keys` must be one of \['all', 'sampled'\]; got 'some'"):
        approxlab.approximate("informer", q, k, v, num_features=2, measure_keys="some")
    with pytest.raises(ValueError, match=r"`sample_size` must be an integer with 1 <= sample_size <= 8; got 9"):
        approxlab.approximate("informer", q, k, v, num_features=2, sample_size=9)
    with pytest.raises(ValueError, match=r"`sample_size` must be an integer with 1 <= sample_size <= 8; got 0"):
        approxlab.approximate("informer", q, k, v, num_features=2, sample_size=0)
    with pytest.raises(TypeError, match=r"`sample_size` must be an integer; got 2.0"):
        approxlab.approximate("informer", q, k, v, num_features=2, sample_size=2.0)
    with pytest.raises(ValueError, match=r"`sample_size` must be None when measure_keys='all'"):
        approxlab.approximate("informer", q, k, v, num_features=2, measure_keys="all", sample_size=3)
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 8; got 9"):
        approxlab.approximate("informer", q, k, v, num_features=9)


def test_informer_float32_large_logits_finite():
    """Logits +-80 in float32: softmax rows in the log domain, finite row-stochastic operator."""
    q, k, v = _large_logit_qkv()
    result = approxlab.approximate("informer", q, k, v, num_features=6, generator=_gen(11))
    assert result.output.dtype == torch.float32 and bool(torch.isfinite(result.output).all())
    matrix = result.matrix()
    assert bool(torch.isfinite(matrix).all())
    torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 3, 24), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("measure_keys", ["sampled", "all"])
def test_informer_batched_shapes_and_operator_consistency(measure_keys):
    """(2, 3, n, p) inputs with n != n_k; matmat / rmatmat agree with the dense matrix."""
    g = _gen(15)
    q = torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 10, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 10, 5, generator=g, dtype=torch.float64)
    result = approxlab.approximate("informer", q, k, v, num_features=4, generator=g, measure_keys=measure_keys)
    assert result.method == "informer" and result.target == "softmax"
    dense = _operator_checks(result, 12, 10, 5, g)
    torch.testing.assert_close(result.output, dense @ v)


# ====================================================================== Linformer


def test_linformer_projection_is_isotropic_in_expectation():
    r"""JL property behind Linformer Theorems 1-2: with i.i.d. N(0, 1/k) entries, E[E^T E] = I_n.

    Mean of E^T E over N = 2000 independent draws (k = 4, n = 6): each entry has standard error at
    most sqrt(2/(kN)); all 36 entries must lie within 5 standard errors of I (false-alarm
    probability about 36 * 6e-7 = 2e-5). Also E|Ex|^2 = |x|^2 within 5 standard errors.
    """
    draws, k, n = 2000, 4, 6
    for seed in range(3):
        e = gaussian_projection(k, n, batch_shape=(draws,), generator=_gen(seed))
        assert e.shape == (draws, k, n)
        mean_gram = (e.transpose(-1, -2) @ e).mean(0)
        assert float((mean_gram - torch.eye(n, dtype=torch.float64)).abs().max()) <= 5 * math.sqrt(2 / (k * draws))
        x = torch.arange(1.0, n + 1, dtype=torch.float64)
        squared = (e @ x).square().sum(-1)  # |Ex|^2 ~ |x|^2 chi^2_k / k, variance 2|x|^4 / k
        assert abs(float(squared.mean()) - float(x @ x)) <= 5 * float(x @ x) * math.sqrt(2 / (k * draws))


@pytest.mark.parametrize("share_projection", [False, True])
def test_linformer_shapes_and_output_equals_operator_applied_to_v(share_projection):
    """Output softmax(Q (E K)^T / sqrt p) (F V) (Linformer Eq. (7)) equals the operator P F applied to V."""
    g = _gen(20)
    q = torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 10, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 10, 5, generator=g, dtype=torch.float64)
    result = approxlab.approximate(
        "linformer", q, k, v, num_features=4, generator=g, share_projection=share_projection
    )
    assert result.method == "linformer" and result.target == "softmax"
    e, f = result.info["projection_keys"], result.info["projection_values"]
    assert e.shape == f.shape == (2, 3, 4, 10)
    assert (e is f) == share_projection
    context = softmax_matrix(q, e @ k)
    assert context.shape == (2, 3, 12, 4)
    torch.testing.assert_close(result.info["context"], context)
    torch.testing.assert_close(result.output, context @ (f @ v))
    dense = _operator_checks(result, 12, 10, 5, g)
    torch.testing.assert_close(dense, context @ f)
    torch.testing.assert_close(result.output, result.operator().matmat(v))


def test_linformer_float32_large_logits_finite():
    """Logits +-80 in float32 (and larger after projection): the softmax is computed in the log domain."""
    q, k, v = _large_logit_qkv()
    result = approxlab.approximate("linformer", q, k, v, num_features=8, generator=_gen(24))
    assert result.output.dtype == torch.float32 and bool(torch.isfinite(result.output).all())
    assert bool(torch.isfinite(result.matrix()).all())
    torch.testing.assert_close(result.info["context"].sum(-1), torch.ones(2, 3, 24), rtol=1e-5, atol=1e-5)


def test_linformer_validation_messages():
    q, k, v = synthetic_qkv((2,), 8, 4, generator=_gen(25))
    with pytest.raises(TypeError, match=r"`share_projection` must be a bool \(True or False\); got 'no'"):
        approxlab.approximate("linformer", q, k, v, num_features=2, share_projection="no")
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 8; got 9"):
        approxlab.approximate("linformer", q, k, v, num_features=9)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'projection'"):
        approxlab.approximate("linformer", q, k, v, num_features=2, projection="learned")
    with pytest.raises(ValueError, match=r"`n` must be an integer with 1 <= n <= inf; got 0"):
        gaussian_projection(2, 0)
