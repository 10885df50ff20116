"""Every registered method that declares itself differentiable trains: backpropagating through
``approximate(...)`` gives finite gradients, and ``torch.autograd.gradcheck`` (float64, small n,
one fixed draw) confirms they are the derivative of the output with respect to Q, K and V -- for
the bidirectional form and, where the method has one, its own causal form.

gradcheck runs in its fast mode (``u^T J v`` for random vectors ``u``, ``v`` instead of every
Jacobian entry: 0.5 s for all methods here, against 5 s); the attentions
the instability study trains are checked entry by entry, with their training options and at harder
inputs, in ``tests/test_training_gradients.py``.

Methods declare the claim in their registry entry (``MethodSpec.differentiable``:
``@method(..., differentiable=True)`` or ``register(..., differentiable=True)``); a new or installed
method that makes it is checked here without any edit.
"""

from __future__ import annotations

import pytest
import torch

import approxlab
from approxlab.methods import available, get, register
from _helpers import gen

N, P = 6, 3
DIFFERENTIABLE = [name for name in available() if get(name).differentiable]


def _inputs(seed=0):
    g = gen(seed)
    return tuple(torch.randn(1, N, P, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))


def _attention(name, **options):
    spec = get(name)
    budget = min(3, spec.max_features(N))

    def f(q, k, v):  # the same draw at every evaluation: gradcheck differentiates one fixed function
        return approxlab.approximate(name, q, k, v, num_features=budget, generator=gen(7), **options).output

    return f


def test_the_declared_methods_include_every_trained_built_in():
    assert {"exact", "kernelized", "skyformer", "nystromformer", "spectral-shifting", "yoso-e",
            "performer", "performer-lra"} <= set(DIFFERENTIABLE)
    assert not get("yoso").differentiable  # hash codes: piecewise constant in Q and K


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_backward_through_approximate_is_the_derivative(name):
    forms = [{}] + ([{"causal": True}] if get(name).causal is True else [])
    for options in forms:
        q, k, v = _inputs()
        f = _attention(name, **options)
        f(q, k, v).square().sum().backward()
        for label, x in zip("qkv", (q, k, v)):
            assert x.grad is not None and bool(torch.isfinite(x.grad).all()), (name, options, label)
        assert torch.autograd.gradcheck(f, _inputs(), atol=1e-6, rtol=1e-4, fast_mode=True), (name, options)


def test_gradcheck_catches_a_false_claim(fresh_registry):
    """The check can fail: a method that claims to be differentiable but cuts Q out of the graph."""

    @register("detached-q", target="softmax", features="ignored", randomized=False, differentiable=True)
    def detached_q(q, k, v, *, num_features, generator=None):
        return approxlab.exact_attention(q.detach(), k, v)

    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(_attention("detached-q"), _inputs(), atol=1e-6, rtol=1e-4, fast_mode=True)


def test_differentiable_is_a_declared_bool():
    with pytest.raises(TypeError, match=r"^`differentiable` must be a bool; got 'yes'\.$"):
        register("claims", lambda q, k, v, *, num_features, generator=None: v, target="softmax", features="x",
                 differentiable="yes")
