"""KDEformer: the practical algorithm (exact sortLSH blocks plus value-norm sampled residual columns)
against its dense definition with the same draw, its sampling rule, and its full-budget limit."""

import math

import pytest
import torch

import approxlab
from approxlab import sortlsh
from approxlab.methods import draw
from approxlab.methods.kdeformer import sampling_weights
from _helpers import gen


def _qkv(n, seed=0):
    g = gen(seed)
    q, k = (0.8 * torch.randn(2, n, 4, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, n, 3, generator=g, dtype=torch.float64) * torch.exp(torch.randn(2, n, 1, generator=g))
    return q, k, v.double()


@pytest.mark.parametrize("options", [{}, {"sampling": "augmented", "order": "code", "block_size": 5},
                                     {"sampling": "augmented", "weights": "code"}])
def test_is_its_dense_definition_with_the_same_draw(options):
    """A~ = M^H . A + ((1 - M^H) . A) Pi^T Pi with p_j from sampling_weights and weight 1 / (m p_j);
    output A~ V / A~ 1 (n = 26: a short last block)."""
    q, k, v = _qkv(26)
    m = 7
    drawn = draw("kdeformer", q, k, num_features=m, generator=gen(1))
    result = approxlab.approximate("kdeformer", q, k, v, num_features=m, draw=drawn, **options)
    block = options.get("block_size", m // 2)
    heavy = sortlsh.sortlsh_mask(q, k, block_size=block, hyperplanes=drawn["hyperplanes"],
                                 order=options.get("order", "gray")).double()
    a = torch.exp(q @ k.mT / 2)
    weights = sampling_weights(v, sampling=options.get("sampling", "value-norms"), weights=options.get("weights", "norm"))
    cumulative = weights.cumsum(-1)
    chosen = (cumulative.unsqueeze(-2) <= drawn["column_uniforms"].unsqueeze(-1) * cumulative[..., -1:, None]).sum(-1)
    assert torch.equal(result.info["columns"], chosen)
    approx = heavy * a
    for t in range(m):
        column = chosen[..., t, None, None].expand(2, 26, 1)
        probability = torch.gather(weights, -1, chosen[..., t : t + 1]) / weights.sum(-1, keepdim=True)
        approx.scatter_add_(-1, column, torch.gather((1 - heavy) * a, -1, column) / (m * probability.unsqueeze(-1)))
    expected = approx @ v / approx.sum(-1, keepdim=True)
    torch.testing.assert_close(result.output, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.matrix() @ v, result.output, rtol=1e-12, atol=1e-12)


def test_sampling_weights_by_hand():
    """p_j proportional to |v_j| / |V|_2 + 1/n; 'augmented' uses [V, 1] (the code's value_aug)."""
    v = torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    norm = float(torch.linalg.matrix_norm(v, ord=2))
    expected = torch.linalg.vector_norm(v, dim=-1) / norm + 0.25
    torch.testing.assert_close(sampling_weights(v), expected)
    augmented = torch.cat([v, torch.ones(4, 1, dtype=torch.float64)], -1)
    torch.testing.assert_close(sampling_weights(v, sampling="augmented"),
                               torch.linalg.vector_norm(augmented, dim=-1) / torch.linalg.matrix_norm(augmented, ord=2)
                               + 0.25)
    mask = torch.tensor([True, True, False, True])
    masked = sampling_weights(v, mask)
    assert float(masked[2]) == 0.0
    torch.testing.assert_close(masked, sampling_weights(v) * 0 + torch.tensor(
        [3 / norm + 1 / 3, 4 / norm + 1 / 3, 0.0, math.sqrt(2) / norm + 1 / 3], dtype=torch.float64))
    torch.testing.assert_close(sampling_weights(1e-300 * v), sampling_weights(v))  # scale-free
    assert bool((sampling_weights(torch.zeros(3, 2, dtype=torch.float64)) == 1 / 3).all())  # V = 0: uniform


def test_the_codes_weights_divide_by_the_squared_norm_its_power_method_estimates():
    """KDEformer.py's power_method iterates on the Gram matrix V^T V: it converges to ||V||_2^2, and the code's
    weights are ||v_j|| / ||V||_2^2 + 1/n, which (unlike the default's) change with the scale of V."""
    g = gen(5)
    v = torch.randn(40, 3, generator=g, dtype=torch.float64) + 2.0
    gram = v.mT @ v
    x = torch.randn(3, generator=g, dtype=torch.float64)
    for _ in range(200):  # the code's iteration, run to convergence: ||Gram x|| for a unit x
        y = gram @ (x / x.norm())
        x = y
    estimate = float(y.norm())
    assert estimate == pytest.approx(float(torch.linalg.matrix_norm(v, ord=2)) ** 2, rel=1e-12)
    code = sampling_weights(v, weights="code")
    torch.testing.assert_close(code, torch.linalg.vector_norm(v, dim=-1) / estimate + 1 / 40, rtol=1e-12, atol=0)
    torch.testing.assert_close(sampling_weights(3.0 * v), sampling_weights(v))  # the default is scale-free
    torch.testing.assert_close(sampling_weights(3.0 * v, weights="code") - 1 / 40, (code - 1 / 40) / 3.0)
    mask = torch.arange(40) < 30
    torch.testing.assert_close(sampling_weights(v, mask, weights="code")[:30],
                               sampling_weights(v[:30], weights="code"))
    q, k, _ = _qkv(40, seed=6)
    drawn = draw("kdeformer", q, k, num_features=6, generator=gen(7))
    norm, coded = (approxlab.approximate("kdeformer", q, k, v.expand(2, 40, 3), num_features=6, draw=drawn,
                                         weights=w) for w in ("norm", "code"))
    assert not torch.equal(norm.info["columns"], coded.info["columns"])
    with pytest.raises(ValueError, match=r"`weights` must be one of \['code', 'norm'\]; got 'paper'"):
        approxlab.approximate("kdeformer", q, k, v.expand(2, 40, 3), num_features=6, weights="paper")


def test_one_block_holding_every_key_is_exact_attention():
    q, k, v = _qkv(30, seed=2)
    result = approxlab.approximate("kdeformer", q, k, v, num_features=5, block_size=30, generator=gen(3))
    torch.testing.assert_close(result.output, approxlab.exact_attention(q, k, v), rtol=1e-12, atol=1e-13)


def test_validation_names_the_parameter():
    q, k, v = _qkv(16, seed=4)
    with pytest.raises(ValueError, match=r"`sampling` must be one of \['augmented', 'value-norms'\]; got 'kde'"):
        approxlab.approximate("kdeformer", q, k, v, num_features=4, sampling="kde")
    with pytest.raises(ValueError, match=r"`order` must be one of \['code', 'gray'\]; got 'hamming'"):
        approxlab.approximate("kdeformer", q, k, v, num_features=4, order="hamming")
    with pytest.raises(ValueError, match=r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"):
        approxlab.approximate("kdeformer", q, k, v, num_features=4, block_size=0)
    with pytest.raises(ValueError, match=r"`draw\['column_uniforms'\]` of method 'kdeformer' must hold uniforms"):
        approxlab.approximate("kdeformer", q, k, v, num_features=4,
                              draw={**draw("kdeformer", q, k, num_features=4), "column_uniforms": torch.ones(2, 4,
                                                                                              dtype=torch.float64)})
