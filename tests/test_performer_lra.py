"""``performer-lra``: Performer as the Skyformer authors' LRA code feeds it (Q, K / p^(1/4), then
performer-pytorch's softmax_kernel, which scales by p^(-1/4) again and adds eps = 1e-4)."""

import math

import pytest
import torch

import approxlab
from approxlab.synthetic import synthetic_qkv
from _helpers import gen as _gen


def _softmax_output(q, k, v, temperature):
    """softmax(Q K^T / temperature) V, dense (small test sizes)."""
    return torch.softmax(q @ k.transpose(-1, -2) / temperature, dim=-1) @ v


def test_without_epsilon_it_is_performer_on_q_k_divided_by_p_to_the_quarter():
    """The authors divide Q and K by p^(1/4) before a FAVOR+ kernel that scales by p^(-1/4) itself:
    with eps = 0, performer-lra(Q, K) is approxlab's performer(Q / p^(1/4), K / p^(1/4)), same draw."""
    q, k, v = synthetic_qkv((2, 3), 40, 8, generator=_gen(0))
    p = q.shape[-1]
    variant = approxlab.approximate("performer-lra", q, k, v, num_features=24, generator=_gen(1), epsilon=0.0)
    reference = approxlab.approximate("performer", q * p**-0.25, k * p**-0.25, v, num_features=24,
                                      generator=_gen(1))
    torch.testing.assert_close(variant.info["projection"], reference.info["projection"], rtol=0, atol=0)
    torch.testing.assert_close(variant.output, reference.output, rtol=1e-12, atol=1e-12)


def test_it_estimates_softmax_of_qk_over_p_not_over_sqrt_p():
    """With many features FAVOR+ converges to its target: here softmax(QK^T/p) V, a different matrix
    from the exact softmax(QK^T/sqrt p) V that every method is measured against (the error floor)."""
    q, k, v = synthetic_qkv((4,), 32, 16, scale=1.0, generator=_gen(2))
    p = q.shape[-1]
    approx = approxlab.approximate("performer-lra", q, k, v, num_features=4096, generator=_gen(3), epsilon=0.0)
    to_its_target = float((approx.output - _softmax_output(q, k, v, p)).norm())
    floor = float((_softmax_output(q, k, v, p) - _softmax_output(q, k, v, math.sqrt(p))).norm())
    to_exact = float((approx.output - _softmax_output(q, k, v, math.sqrt(p))).norm())
    assert floor > 0.1 * float(_softmax_output(q, k, v, math.sqrt(p)).norm())  # the two targets differ
    assert to_its_target < 0.1 * floor
    assert to_exact > 0.9 * floor


def _performer_pytorch(q, k, v, projection, epsilon, shared_key_max):
    """performer-pytorch's softmax_kernel + linear_attention written from their formulas, on Q, K
    already divided by p^(1/4) as the authors' attention module does."""
    p, r = q.shape[-1], projection.shape[-2]
    x, y = q * p**-0.25 * p**-0.25, k * p**-0.25 * p**-0.25
    dash_q, dash_k = x @ projection.transpose(-1, -2), y @ projection.transpose(-1, -2)
    diag_q, diag_k = (x * x).sum(-1, keepdim=True) / 2, (y * y).sum(-1, keepdim=True) / 2
    query = r**-0.5 * (torch.exp(dash_q - diag_q - dash_q.amax(-1, keepdim=True)) + epsilon)
    key_max = dash_k.max() if shared_key_max else dash_k.amax((-2, -1), keepdim=True)
    key = r**-0.5 * (torch.exp(dash_k - diag_k - key_max) + epsilon)
    normaliser = query @ key.sum(-2).unsqueeze(-1)
    return (query @ (key.transpose(-1, -2) @ v)) / normaliser


@pytest.mark.parametrize("shared_key_max", [True, False])
def test_matches_the_performer_pytorch_formulas(shared_key_max):
    """Stabilisers and eps = 1e-4 as in performer-pytorch: query rows shifted by their own maximum,
    keys by one maximum over the whole call (or per batch element); the projection is the method's."""
    q, k, v = synthetic_qkv((2, 3), 48, 8, scale=2.0, generator=_gen(4))
    approx = approxlab.approximate("performer-lra", q, k, v, num_features=20, generator=_gen(5),
                                   shared_key_max=shared_key_max)
    expected = _performer_pytorch(q, k, v, approx.info["projection"], 1e-4, shared_key_max)
    torch.testing.assert_close(approx.output, expected, rtol=1e-10, atol=1e-12)
    assert approx.info["epsilon"] == 1e-4
    torch.testing.assert_close(approx.matrix() @ v, approx.output, rtol=1e-10, atol=1e-12)


def test_shared_key_max_couples_the_batch_elements():
    """performer-pytorch's key stabiliser is one maximum over every head of a call, so with eps > 0 a
    head's output depends on the other heads; one maximum per head removes that."""
    q, k, v = synthetic_qkv((2,), 32, 8, generator=_gen(6))
    k = torch.stack([k[0], 4.0 * k[1]])  # the second head has much larger keys
    for shared, coupled in [(True, True), (False, False)]:
        both = approxlab.approximate("performer-lra", q, k, v, num_features=16, generator=_gen(7),
                                     shared_key_max=shared)
        projection = both.info["projection"]
        alone = _performer_pytorch(q[:1], k[:1], v[:1], projection[:1], 1e-4, shared)
        differs = not torch.allclose(both.output[:1], alone, rtol=1e-9, atol=1e-12)
        assert differs == coupled


def test_epsilon_pulls_rows_towards_the_mean_of_v():
    """eps is added to every feature: a large eps makes every row's weights nearly uniform."""
    q, k, v = synthetic_qkv((2,), 32, 8, scale=2.0, generator=_gen(8))
    approx = approxlab.approximate("performer-lra", q, k, v, num_features=16, generator=_gen(9), epsilon=1e6)
    torch.testing.assert_close(approx.output, v.mean(-2, keepdim=True).expand_as(v), rtol=1e-4, atol=1e-5)
