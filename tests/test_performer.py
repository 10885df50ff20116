"""Performer / FAVOR+ (Choromanski et al., 2021): positive orthogonal random features."""

import math

import pytest
import torch

import approxlab
from approxlab.methods.performer import gaussian_random_features, positive_random_features
from approxlab.synthetic import synthetic_qkv
from _helpers import gen as _gen, logits_80_qkv as _large_logit_qkv




@pytest.mark.parametrize("orthogonal,num_features", [(True, 4), (True, 6), (False, 4)])
def test_random_features_are_unbiased_for_the_softmax_kernel(orthogonal, num_features):
    r"""Performer Lemma 1: E[phi(x)^T phi(y)] = exp(x^T y) for phi(x)_l = exp(w_l^T x - |x|^2/2)/sqrt(r),
    also with orthogonal blocks (each row is still exactly N(0, I)).

    x = q / p^(1/4), y = k / p^(1/4), so exp(x^T y) = exp(q^T k / sqrt(p)). The mean over N = 4000
    independent draws must lie within 4 standard errors (estimated from the sample) of the truth,
    for 4 pairs x 3 seeds; false-alarm probability about 6e-5 per check (normal approximation;
    |x|, |y| <= 1.2 keeps the lognormal tails light), about 1e-3 over the 36 checks of this test.
    """
    p, draws = 4, 4000
    pairs = torch.tensor(
        [
            [[0.5, 0.0, 0.3, -0.2], [0.4, 0.1, 0.2, 0.0]],
            [[1.0, 0.0, 0.0, 0.0], [-0.8, 0.3, 0.0, 0.1]],
            [[0.3, 0.6, -0.4, 0.2], [0.2, -0.5, 0.6, 0.3]],
            [[0.8, 0.5, 0.2, 0.4], [0.7, 0.4, 0.3, 0.5]],
        ],
        dtype=torch.float64,
    ) * p**0.5  # scaled logits q^T k / sqrt(p) = x^T y
    for seed in range(3):
        projection = gaussian_random_features(
            num_features, p, batch_shape=(draws,), orthogonal=orthogonal, generator=_gen(seed)
        )
        for q, k in pairs:
            x = (q * p**-0.25).expand(draws, 1, p)
            y = (k * p**-0.25).expand(draws, 1, p)
            estimates = (positive_random_features(x, projection) * positive_random_features(y, projection)).sum(-1)
            truth = math.exp(float(q @ k) / math.sqrt(p))
            standard_error = float(estimates.std()) / math.sqrt(draws)
            mean = float(estimates.mean())
            assert abs(mean - truth) <= 4 * standard_error, (seed, mean, truth)


def test_orthogonal_features_block_structure():
    """Performer Section 2.4 (ORFs): rows come in blocks of p mutually orthogonal directions with
    independent chi_p lengths; the last block is truncated to r mod p rows."""
    p, r = 5, 13
    w = gaussian_random_features(r, p, batch_shape=(3,), generator=_gen(1))
    assert w.shape == (3, r, p)
    lengths = w.norm(dim=-1)
    for start in range(0, r, p):
        block = w[:, start : start + p]
        directions = block / block.norm(dim=-1, keepdim=True)
        gram = directions @ directions.transpose(-1, -2)
        torch.testing.assert_close(gram, torch.eye(block.shape[1], dtype=torch.float64).expand_as(gram))
    assert float(lengths.std()) > 0.1  # lengths are random, not all sqrt(p)
    # rows of consecutive blocks are not orthogonal (independent blocks)
    assert float((w[:, 0] * w[:, p]).sum(-1).abs().max()) > 1e-3
    iid = gaussian_random_features(r, p, batch_shape=(3,), orthogonal=False, generator=_gen(1))
    gram = iid[:, :p] @ iid[:, :p].transpose(-1, -2)
    assert float((gram - torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))).abs().max()) > 1e-3


def test_orthogonal_feature_rows_are_standard_gaussian():
    """Each ORF row is marginally N(0, I_p): E|w|^2 = p and E[w w^T] = I.

    One row per independent draw (N = 4000) so the checks use i.i.d. samples; 4-standard-error
    tolerance (Var |w|^2 = 2p, Var(w_a w_b) <= 2), false-alarm probability below 1e-3 overall.
    """
    p, draws = 5, 4000
    w = gaussian_random_features(7, p, batch_shape=(draws,), generator=_gen(2))
    for row in (0, 6):  # a full block's row and the truncated block's row
        sample = w[:, row]
        squared = sample.square().sum(-1)
        assert abs(float(squared.mean()) - p) <= 4 * math.sqrt(2 * p / draws)
        second_moment = (sample.unsqueeze(-1) * sample.unsqueeze(-2)).mean(0)
        assert float((second_moment - torch.eye(p, dtype=torch.float64)).abs().max()) <= 4 * math.sqrt(2 / draws)


def test_output_equals_favor_definition_with_unstabilised_features():
    r"""The log-domain stabilisation is exact: the output is D~^{-1} phi(Q) (phi(K)^T V) with
    D~ = diag(phi(Q) phi(K)^T 1), computed here from the unstabilised features."""
    q, k, v = synthetic_qkv((2, 3), 20, 8, scale=0.8, generator=_gen(3))
    result = approxlab.approximate("performer", q, k, v, num_features=24, generator=_gen(4))
    projection = result.info["projection"]
    assert projection.shape == (2, 3, 24, 8)
    phi_q = positive_random_features(q * 8**-0.25, projection)
    phi_k = positive_random_features(k * 8**-0.25, projection)
    scores = phi_q @ phi_k.transpose(-1, -2)
    expected = scores / scores.sum(-1, keepdim=True)
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_error_falls_like_r_to_the_minus_half(orthogonal):
    r"""FAVOR+ is consistent: D~^{-1} A^ is a ratio of unbiased r-sample means (Performer Lemma 1), so
    by the delta method its root-mean-square error falls like r^{-1/2}.

    Moderate logits (entries N(0, 0.16)) keep the lognormal variance small. RMS relative error of
    the matrix over 12 seeds at r = 16, 64, 256, 1024: log-log slope -1/2 within 0.1 and
    error * sqrt(r) within a factor 1.3 (over other seed sets: slopes -0.48 to -0.50, spreads <= 1.11).
    """
    q, k, v = synthetic_qkv((2,), 16, 4, scale=0.4, generator=_gen(5))
    exact = approxlab.attention_matrix(q, k)
    features = [16, 64, 256, 1024]

    def favor(**kwargs):
        return approxlab.approximate("performer", q, k, v, orthogonal=orthogonal, **kwargs)

    rms = []
    for r in features:
        squared = [
            (favor(num_features=r, generator=_gen(1000 * r + s)).matrix() - exact).square().sum()
            for s in range(12)
        ]
        rms.append(math.sqrt(float(torch.stack(squared).mean())) / float(exact.norm()))
    x = torch.log(torch.tensor(features, dtype=torch.float64))
    y = torch.log(torch.tensor(rms, dtype=torch.float64))
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    assert abs(slope + 0.5) <= 0.1, (slope, rms)
    scaled = [e * math.sqrt(r) for e, r in zip(rms, features)]
    assert max(scaled) / min(scaled) <= 1.3, scaled
    assert rms[-1] < 0.05


def test_float32_large_logits_give_finite_row_stochastic_operator():
    """Logits +-80 in float32: no overflow, output finite, matrix rows nonnegative and summing to 1."""
    q, k, v = _large_logit_qkv()
    result = approxlab.approximate("performer", q, k, v, num_features=32, generator=_gen(6))
    assert result.output.dtype == torch.float32
    assert bool(torch.isfinite(result.output).all())
    matrix = result.matrix()
    assert bool(torch.isfinite(matrix).all()) and float(matrix.min()) >= 0
    torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 3, 24), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_batched_shapes_and_operator_consistency(orthogonal):
    """(2, 3, n, p) inputs with n != n_k; matmat / rmatmat agree with the dense matrix."""
    g = _gen(10)
    q = torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 10, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 10, 5, generator=g, dtype=torch.float64)
    result = approxlab.approximate("performer", q, k, v, num_features=20, generator=g, orthogonal=orthogonal)
    assert result.output.shape == (2, 3, 12, 5)
    assert result.method == "performer" and result.target == "softmax"
    operator = result.operator()
    assert tuple(operator.shape) == (2, 3, 12, 10)
    dense = operator.to_dense()
    x = torch.randn(2, 3, 10, 4, generator=g, dtype=torch.float64)
    y = torch.randn(2, 3, 12, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(operator.matmat(x), dense @ x)
    torch.testing.assert_close(operator.rmatmat(y), dense.transpose(-1, -2) @ y)
    torch.testing.assert_close(result.output, operator.matmat(v))


def test_validation_messages():
    q, k, v = synthetic_qkv((2,), 8, 4, generator=_gen(11))
    with pytest.raises(TypeError, match=r"`orthogonal` must be a bool \(True or False\); got 1"):
        approxlab.approximate("performer", q, k, v, num_features=4, orthogonal=1)
    with pytest.raises(ValueError, match=r"`num_features` must be .* 1 <= num_features <= 4096; got 0"):
        approxlab.approximate("performer", q, k, v, num_features=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'kernel'"):
        approxlab.approximate("performer", q, k, v, num_features=4, kernel="relu")
    with pytest.raises(ValueError, match=r"`projection` must have shape \(\*batch, r, 4\)"):
        positive_random_features(q, torch.zeros(2, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`num_features` must be .* 1 <= num_features <= inf; got 0"):
        gaussian_random_features(0, 4)
