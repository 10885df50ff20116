"""Alman and Song's polynomial method: the factorisation equals the polynomial of the logits, the
Chebyshev interpolation error bound holds entrywise, signed row sums are reported and never clamped,
and the memory check names num_features."""

import math

import numpy as np
import pytest
import torch

import approxlab
from approxlab.methods.polynomial import num_polynomial_features, tensor_features
from _helpers import gen


def _qkv(n=40, p=3, scale=0.6, seed=0):
    g = gen(seed)
    return tuple(scale * torch.randn(2, n, p, generator=g, dtype=torch.float64) for _ in range(3))


def _chebyshev_polynomial(radius, degree):
    """exp on [-B, B] interpolated at the degree + 1 Chebyshev points of the first kind (numpy's chebfit
    through those points, as the reference as23_attention builds it), as a numpy Polynomial in the logit."""
    nodes = radius * np.cos((2 * np.arange(1, degree + 2) - 1) / (2 * (degree + 1)) * np.pi)
    return np.polynomial.Chebyshev.fit(nodes, np.exp(nodes), degree, domain=[-radius, radius]).convert(
        kind=np.polynomial.Polynomial)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_output_is_the_polynomial_of_the_logits_row_normalised(degree):
    q, k, v = _qkv()
    result = approxlab.approximate("polynomial", q, k, v, num_features=num_polynomial_features(3, degree))
    assert result.info["degree"] == degree
    logits = q @ k.mT / math.sqrt(3)
    for s in range(2):
        radius = float(q[s].norm(dim=-1).max() * k[s].norm(dim=-1).max()) / math.sqrt(3)
        polynomial = _chebyshev_polynomial(radius, degree)
        approx = torch.from_numpy(polynomial(logits[s].numpy()))
        torch.testing.assert_close(result.output[s], approx @ v[s] / approx.sum(-1, keepdim=True), rtol=1e-10,
                                   atol=1e-12)
        torch.testing.assert_close(result.info["radius"][s], torch.tensor(radius, dtype=torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_chebyshev_interpolation_error_bound_holds_for_every_entry(seed):
    """Alman-Song Section 3 (the polynomial method): on [-B, B] the interpolant at the g + 1 Chebyshev
    points satisfies |P(s) - e^s| <= e^B B^(g+1) / (2^g (g+1)!) (the interpolation error of
    Chebyshev nodes, max |f^(g+1)| = e^B). Checked on every entry of U_1 U_2^T e^B, degrees 1-4."""
    q, k, v = _qkv(n=30, p=3, scale=0.9, seed=seed)
    logits = q @ k.mT / math.sqrt(3)
    for degree in range(1, 5):
        result = approxlab.approximate("polynomial", q, k, v, num_features=num_polynomial_features(3, degree))
        radius = result.info["radius"]
        approx = result.operator().to_dense() * result.info["row_sums"].unsqueeze(-1)  # U_1 U_2^T, units e^-B
        error = (approx * radius.exp()[:, None, None] - logits.exp()).abs().amax((-1, -2))
        bound = radius.exp() * radius ** (degree + 1) / (2**degree * math.factorial(degree + 1))
        assert bool((error <= bound * (1 + 1e-9)).all()), (degree, error, bound)


def test_tensor_features_give_the_powers_of_the_inner_product():
    g = gen(1)
    x, y = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    for degree in range(5):
        features = tensor_features(x, degree)
        assert features.shape[-1] == math.comb(4 + degree - 1, degree)
        torch.testing.assert_close(features @ tensor_features(y, degree).T, (x @ y.T) ** degree)


def test_non_positive_row_sums_are_reported_not_clamped():
    """Logits up to ~7 and degree 3: the interpolant is negative where e^(s - B) is tiny. The row sums
    are used as they are (the reference clamps them at 1e-30), and info counts them."""
    q, k, v = _qkv(scale=1.6, seed=2)
    result = approxlab.approximate("polynomial", q, k, v, num_features=num_polynomial_features(3, 3))
    row_sums = result.info["row_sums"]
    assert int(result.info["num_nonpositive_row_sums"].sum()) == int((row_sums <= 0).sum()) > 0
    torch.testing.assert_close(result.info["min_abs_row_sum"], row_sums.abs().amin(-1))
    numerators = result.operator().to_dense() * row_sums.unsqueeze(-1) @ v
    torch.testing.assert_close(result.output, numerators / row_sums.unsqueeze(-1))


def test_padding_changes_nothing_for_real_tokens():
    q, k, v = _qkv(n=12, seed=3)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[:, 8:] = False
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:
        x[:, 8:] = 5 * torch.randn(2, 4, 3, generator=gen(4), dtype=torch.float64)
    runs = [approxlab.approximate("polynomial", *inputs, num_features=20, key_mask=mask).output[:, :8]
            for inputs in ((q, k, v), changed)]
    alone = approxlab.approximate("polynomial", q[:, :8], k[:, :8], v[:, :8], num_features=20).output
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(runs[0], alone, rtol=1e-12, atol=1e-12)


def test_budget_and_memory_errors_name_num_features():
    q, k, v = _qkv(p=3)
    assert approxlab.approximate("polynomial", q, k, v, num_features=3).info["degree"] == 0  # fewer than p + 1
    with pytest.raises(ValueError, match=r"`num_features` must be at least the 20 features of degree=3 at p=3 "
                                         r"\(C\(p \+ degree, degree\)\); got num_features=19"):
        approxlab.approximate("polynomial", q, k, v, num_features=19, degree=3)
    big = torch.zeros(2, 64, 64, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`num_features`: degree 4 at p=64 has 814385 features per token, "
                                         r"208482560 entries .* lower num_features"):
        approxlab.approximate("polynomial", big, big, big, num_features=10**6)
    with pytest.raises(ValueError, match=r"`degree` must be an integer with 0 <= degree <= inf; got -1"):
        approxlab.approximate("polynomial", q, k, v, num_features=4, degree=-1)
