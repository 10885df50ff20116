"""Every attention the instability study trains is differentiable wherever its forward pass is.

``torch.autograd.gradcheck`` in float64 on small inputs -- generic ones, inputs with repeated
rows (repeated tokens: repeated and zero singular values of the landmark cores), and
rank-deficient cores -- for each method of ``approxlab.training.ATTENTIONS`` with the options
it trains with. YOSO trains with the lower bound of YOSO Eq. (4), which is by design not the
derivative of its forward pass: it is checked against Eq. (4) written out, and its true
gradient (an option) is gradchecked.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from approxlab import approximate
from approxlab.linalg.pinv_autograd import pinv, pinv_and_rank, pinv_backward
from approxlab.methods.spectral_shifting import modified_spectral_shifting_core
from approxlab.methods.yoso_e import collision_probability
from approxlab.training import ATTENTIONS, TRAINING_OPTIONS

N, P, LANDMARKS = 8, 3, 4


def _inputs(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, N, P, dtype=torch.float64, generator=g) for _ in range(3))
    if kind == "repeated":  # the first two segments (of two tokens each) are identical tokens
        for x in (q, k):
            x[..., :4, :] = x[..., :1, :]
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_()


def _attention(name, **extra):
    options = {**TRAINING_OPTIONS.get(name, {}), **extra}

    def f(q, k, v):
        g = torch.Generator().manual_seed(7)  # the same landmarks at every evaluation
        return approximate(ATTENTIONS[name], q, k, v, num_features=LANDMARKS, generator=g, **options).output

    return f


# spectral shifting at a repeated-rows input has a rank-deficient core: the cut-off must sit
# above gradcheck's perturbations (eps=1e-6), else the numerical rank jumps between the
# finite-difference evaluations (the pseudo-inverse is discontinuous there, not its formula).
_EXTRA = {"spectral-shifting": {"rtol": 1e-4}}
_TRAINED_BY_AUTOGRAD = [a for a in ATTENTIONS if a != "yoso"]


@pytest.mark.parametrize("kind", ["generic", "repeated"])
@pytest.mark.parametrize("name", _TRAINED_BY_AUTOGRAD)
def test_gradcheck_trained_attentions(name, kind):
    extra = _EXTRA.get(name, {}) if kind == "repeated" else {}
    assert torch.autograd.gradcheck(_attention(name, **extra), _inputs(kind), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", _TRAINED_BY_AUTOGRAD)
def test_gradcheck_trained_attentions_with_padding(name):
    """The masked path the study trains (landmarks over real tokens only): two sequences of 8 and
    5 real tokens of 8, the second with fewer real tokens than 2 * LANDMARKS completion rows."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, N, P, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    key_mask = torch.arange(N) < torch.tensor([N, 5])[:, None]
    options = TRAINING_OPTIONS.get(name, {})

    def f(q, k, v):
        return approximate(ATTENTIONS[name], q, k, v, num_features=LANDMARKS, key_mask=key_mask,
                           generator=torch.Generator().manual_seed(7), **options).output

    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-6, rtol=1e-4)


def test_repeated_rows_make_the_spectral_shifting_core_rank_deficient():
    q, k, v = _inputs("repeated")
    result = approximate("spectral-shifting", q, k, v, num_features=LANDMARKS)
    assert int(result.info["core_rank"].min()) < LANDMARKS


@pytest.mark.parametrize("pinv_option", ["exact", "iterative"])
def test_spectral_shifting_gradient_finite_at_repeated_rows_default_cutoff(pinv_option):
    """The training setting (default cut-off) where the SVD backward gave NaN: finite now."""
    q, k, v = _inputs("repeated")
    out = approximate("spectral-shifting", q.float(), k.float(), v.float(), num_features=LANDMARKS,
                      pinv=pinv_option).output
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_svd_backward_is_not_finite_there():
    """Why the custom backward exists: through ``torch.linalg.svd`` the same core gives NaN."""
    # sigma = (3, 0, 0) exactly: a rank-1 core whose repeated zero singular values no LAPACK rounds apart
    # (torch.ones(3, 3) has sigma (3, ~1e-17, ~1e-48) on some LAPACK builds, and a finite SVD backward)
    core = torch.diag(torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)).requires_grad_(True)
    u, s, vh = torch.linalg.svd(core)
    inverse = vh.transpose(-1, -2)[:, :1] @ u[:, :1].T / s[0]
    (grad,) = torch.autograd.grad(inverse.sum(), core)
    assert not bool(torch.isfinite(grad).all())
    (grad,) = torch.autograd.grad(pinv(core).sum(), core)
    assert bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("pinv_option", ["exact", "iterative"])
def test_gradcheck_spectral_shifting_core_rank_deficient(pinv_option):
    g = torch.Generator().manual_seed(1)
    low = torch.rand(2, 5, 2, dtype=torch.float64, generator=g) @ torch.rand(2, 2, 5, dtype=torch.float64, generator=g)
    low.requires_grad_()

    def f(a):
        u, delta, rank, _ = modified_spectral_shifting_core(a, rtol=1e-4, pinv=pinv_option, num_iter=3)
        assert rank.tolist() == [2, 2]
        return u, delta

    assert torch.autograd.gradcheck(f, (low,))


@pytest.mark.parametrize("shape,rank", [((5, 4), 4), ((4, 4), 2), ((3, 5), 1), ((2, 3, 3), 1)])
def test_pinv_gradcheck_full_and_rank_deficient(shape, rank):
    g = torch.Generator().manual_seed(2)
    m, n = shape[-2:]
    a = torch.randn(*shape[:-2], m, rank, dtype=torch.float64, generator=g) @ torch.randn(
        *shape[:-2], rank, n, dtype=torch.float64, generator=g)
    a.requires_grad_()
    x, r = pinv_and_rank(a, rtol=1e-4)
    assert bool((r == rank).all())
    assert torch.allclose(x, torch.linalg.pinv(a.detach(), rtol=1e-4), atol=1e-10)
    assert torch.autograd.gradcheck(lambda a: pinv(a, rtol=1e-4), (a,))


def test_pinv_of_zero_matrix_has_finite_gradient():
    """Rank 0 (all singular values zero and repeated): pseudo-inverse 0, gradient finite."""
    a = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    x, r = pinv_and_rank(a)
    (grad,) = torch.autograd.grad(x.sum(), a)
    assert int(r) == 0 and bool((x == 0).all()) and bool(torch.isfinite(grad).all())


def test_pinv_backward_matches_torch_pinv_backward():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 3, dtype=torch.float64, generator=g) @ torch.randn(3, 6, dtype=torch.float64, generator=g)
    grad = torch.randn(6, 6, dtype=torch.float64, generator=g)
    a_ = a.clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.linalg.pinv(a_, rtol=1e-6), a_, grad)
    got = pinv_backward(grad, a, torch.linalg.pinv(a, rtol=1e-6))
    assert torch.allclose(got, expected, atol=1e-9)


def test_pinv_rejects_bad_rtol():
    with pytest.raises(ValueError, match="rtol"):
        pinv(torch.eye(2), rtol=1.5)


# ----------------------------------------------------------------------------------- YOSO


def test_gradcheck_yoso_true_gradient():
    f = _attention("yoso", gradient="true")
    assert torch.autograd.gradcheck(f, _inputs("generic"), atol=1e-6, rtol=1e-4)


def test_yoso_trains_with_eq4_lower_bound():
    """The backward pass the study uses is YOSO Eq. (4): [(dL/dO V^T) * tau/2 W] K w.r.t. q-hat."""
    assert TRAINING_OPTIONS["yoso"] == {"gradient": "lower-bound"}
    tau = 8
    q, k, v = _inputs("generic")
    q_unit = F.normalize(q.detach(), dim=-1).requires_grad_()
    k_unit = F.normalize(k.detach(), dim=-1)
    weights = collision_probability(q_unit @ k_unit.transpose(-1, -2), tau, gradient="lower-bound")
    upstream = torch.randn(1, N, P, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    (got,) = torch.autograd.grad(weights @ v.detach(), q_unit, upstream)
    expected = ((upstream @ v.detach().transpose(-1, -2)) * (tau / 2) * weights.detach()) @ k_unit
    assert torch.allclose(got, expected, atol=1e-12)


def test_yoso_lower_bound_is_below_the_true_derivative():
    cosine = torch.linspace(-0.999, 0.999, 401, dtype=torch.float64, requires_grad=True)
    for tau in (1, 2, 8, 30):
        (low,) = torch.autograd.grad(collision_probability(cosine, tau, gradient="lower-bound").sum(), cosine)
        (true,) = torch.autograd.grad(collision_probability(cosine, tau, gradient="true").sum(), cosine)
        assert bool((low <= true + 1e-12).all())
        assert float(low.max()) <= tau / 2
    near_one = torch.tensor([1 - 1e-12], dtype=torch.float64, requires_grad=True)
    (true,) = torch.autograd.grad(collision_probability(near_one, 8, gradient="true").sum(), near_one)
    (low,) = torch.autograd.grad(collision_probability(near_one, 8, gradient="lower-bound").sum(), near_one)
    assert float(true) > 1e6 and float(low) <= 4.0  # Eq. (3) blows up near cosine 1; Eq. (4) does not


def test_yoso_true_gradient_matches_autograd_of_the_formula():
    cosine = torch.linspace(-0.99, 0.99, 11, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(collision_probability(cosine, 5).sum(), cosine)
    (expected,) = torch.autograd.grad(((1 - torch.arccos(cosine) / math.pi) ** 5).sum(), cosine)
    assert torch.allclose(got, expected)


@pytest.mark.parametrize("gradient", ["true", "lower-bound"])
def test_collision_probability_matches_lsh_and_leaves_its_input_alone(gradient):
    """The power by repeated squaring agrees with ``lsh.collision_probability`` to a few roundings,
    for every tau, and the public function never writes into the caller's cosines."""
    from approxlab import lsh

    cosine = torch.linspace(-1.1, 1.1, 2001, dtype=torch.float64)
    before = cosine.clone()
    for tau in range(1, 31):
        got = collision_probability(cosine, tau, gradient=gradient)
        expected = lsh.collision_probability(cosine, tau)
        assert bool(((got - expected).abs() <= 4 * tau * 2.0**-52 * expected).all())
    assert torch.equal(cosine, before)
