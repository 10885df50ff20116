"""Whatever a user hands approxlab -- a method's result, its draw, its feature limit, an operator, a
registry name -- is checked against what it must be, with approxlab's message naming the method or
parameter, the expected and the received: never an error from inside torch or Python, never a
silently wrong shape.

Two rules, one parameterised test each: a user-supplied *result* (output, matrix, operator, draw,
``max_features``) is checked when it comes back (:class:`~approxlab.errors.MethodResultError`);
a user-supplied *argument* (registry name, meta tensor, operator batch) is refused before use.
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab import metrics
from approxlab.errors import MethodResultError
from approxlab.methods import Approximation, draw, register, unregister
from approxlab.operators import DenseOperator, LinearOperator, ProductOperator
from approxlab.synthetic import synthetic_qkv
from _helpers import gen

Q, K, V = synthetic_qkv((2,), 6, 4, generator=gen(0))  # float64 (2, 6, 4): a 6 x 6 attention per batch element


def _output(q, k, v):
    return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])


def _run(result, *, causal=False, max_features=None, draw_result=None, call="approximate"):
    """Register a method whose function returns ``result(q, k, v)`` (and whose draw returns
    ``draw_result``), then call it."""
    randomized = draw_result is not None

    def function(q, k, v, *, num_features, generator=None, draw=None):
        return result(q, k, v)

    register("user", function, target="softmax", features="ignored", randomized=randomized, causal=causal,
             max_features=max_features, draw=(lambda q, k, *, num_features, generator: draw_result) if randomized
             else None)
    try:
        if call == "draw":
            return draw("user", Q, K, num_features=1, generator=gen(1))
        mode = "mask-renormalise" if causal else False
        return approxlab.approximate("user", Q, K, V, num_features=1, causal=mode).operator()
    finally:
        unregister("user")


def _approximation(**kw):
    return lambda q, k, v: Approximation("user", "softmax", _output(q, k, v), **kw)


class _WrongRows(LinearOperator):
    """A user operator (6 x 6 per batch element) whose matmat returns one row too few."""

    def __init__(self):
        self.shape, self.dtype, self.device = (2, 6, 6), torch.float64, torch.device("cpu")

    def _matmat(self, x):
        return x[..., :5, :]

    _rmatmat = _matmat


SHAPE = r"^method 'user' must give an operator \(or matrix\) of shape \(\*batch, n, m\) = \(2, 6, 6\); got "
RESULTS = [
    ("matrix-one-column-too-many", lambda: _run(_approximation(matrix=torch.zeros(2, 6, 7, dtype=torch.float64))),
     SHAPE + r"\(2, 6, 7\)\.$"),
    ("matrix-without-batch", lambda: _run(_approximation(matrix=torch.zeros(6, 6, dtype=torch.float64))),
     SHAPE + r"\(6, 6\)\.$"),
    ("operator-wrong-shape", lambda: _run(_approximation(operator=DenseOperator(torch.zeros(2, 5, 6,
                                                                                            dtype=torch.float64)))),
     SHAPE + r"\(2, 5, 6\)\.$"),
    ("lazy-operator-wrong-shape", lambda: _run(_approximation(operator=lambda: DenseOperator(
        torch.zeros(3, 6, 6, dtype=torch.float64)))), SHAPE + r"\(3, 6, 6\)\.$"),
    ("lazy-operator-not-an-operator", lambda: _run(_approximation(operator=lambda: torch.zeros(2, 6, 6))),
     r"^the operator function of method 'user' must return a LinearOperator; got Tensor\.$"),
    ("output-wrong-shape", lambda: _run(lambda q, k, v: v[..., :5, :]),
     r"^method 'user' must return an output of shape \(\*batch, n, p_v\) = \(2, 6, 4\); got \(2, 5, 4\)\.$"),
    ("output-not-a-tensor", lambda: _run(lambda q, k, v: v.tolist()),
     r"^method 'user' must return an approxlab\.methods\.Approximation or its output tensor \(\*batch, n, p_v\); "
     r"got list\.$"),
    ("mask-renormalise-output-only", lambda: _run(_output, causal="mask-renormalise"),
     r"^method 'user' must return an Approximation with an operator or matrix for causal='mask-renormalise' "
     r"\(which masks and renormalises that matrix\), as it was registered to support; got only its output\.$"),
    ("max-features-none", lambda: _run(_output, max_features=lambda m: None),
     r"^`max_features` of method 'user' must return an integer >= 1 \(the largest num_features for n=6 queries and "
     r"m=6 keys\); got None \(NoneType\)\.$"),
    ("max-features-float", lambda: _run(_output, max_features=lambda n, m: m / 2),
     r"^`max_features` of method 'user' must return an integer >= 1 .*; got 3\.0 \(float\)\.$"),
    ("max-features-zero", lambda: _run(_output, max_features=lambda m: m - 6),
     r"^`max_features` of method 'user' must return an integer >= 1 .*; got 0 \(int\)\.$"),
    ("draw-a-tensor", lambda: _run(_output, draw_result=torch.zeros(3), call="draw"),
     r"^the draw function of method 'user' must return a dict of named tensors \(str -> torch\.Tensor\); got "
     r"Tensor\.$"),
    ("draw-a-dict-of-lists", lambda: _run(_output, draw_result={"columns": [0, 1]}, call="draw"),
     r"^the draw function of method 'user' must return a dict of named tensors .*; got \{'columns': list\}\.$"),
    ("user-operator-matmat-rows", lambda: _WrongRows().matmat(torch.ones(2, 6, 1, dtype=torch.float64)),
     r"^_WrongRows\._matmat must return a tensor of shape \(2, 6, 1\) for an operator of shape \(2, 6, 6\) and a "
     r"block of shape \(2, 6, 1\); got \(2, 5, 1\)\.$"),
    ("user-operator-in-a-product", lambda: ProductOperator(_WrongRows(), torch.eye(6, dtype=torch.float64)).to_dense(),
     r"^_WrongRows\._matmat must return a tensor of shape \(2, 6, 6\) .*; got \(5, 6\)\.$"),  # the product's
    # matrix starts from its last factor's (unbatched eye), so the user's factor is given a (6, 6) block
]


@pytest.mark.parametrize("call, match", [case[1:] for case in RESULTS], ids=[case[0] for case in RESULTS])
def test_a_user_supplied_result_is_checked_against_what_it_must_be(call, match, fresh_registry):
    with pytest.raises((MethodResultError, ValueError), match=match) as caught:
        call()
    assert isinstance(caught.value, (TypeError, ValueError))


def test_a_draw_function_returning_none_is_a_method_result_error(fresh_registry):
    with pytest.raises(MethodResultError, match=r"must return a dict of named tensors .*; got NoneType\.$"):
        register("user-draw", lambda q, k, v, *, num_features, generator=None, draw=None: _output(q, k, v),
                 target="softmax", features="ignored", draw=lambda q, k, *, num_features, generator: None)
        draw("user-draw", Q, K, num_features=1)


def test_a_well_formed_user_result_passes(fresh_registry):
    weights = torch.full((2, 6, 6), 1 / 6, dtype=torch.float64)
    operator = _run(_approximation(matrix=weights))
    torch.testing.assert_close(operator.to_dense(), weights)
    lazy = _run(_approximation(operator=lambda: DenseOperator(weights)))
    torch.testing.assert_close(lazy.to_dense(), weights)


META = torch.device("meta")
ARGUMENTS = [
    ("unregister-a-list", lambda: unregister(["x"]), TypeError,
     r"^`name` must be the name of one registered method \(a str\); got \['x'\] \(list\)\.$"),
    ("unregister-none", lambda: unregister(None), TypeError,
     r"^`name` must be the name of one registered method \(a str\); got None \(NoneType\)\.$"),
    ("draw-on-meta", lambda: approxlab.approximate("nystrom", Q, K, V, num_features=2, draw={
        "columns": torch.zeros(2, 2, dtype=torch.long, device=META)}), ValueError,
     r"^`draw\['columns'\]` of method 'nystrom' must hold data \(a CPU or accelerator tensor\); got a tensor on the "
     r"meta device\.$"),
    ("float-draw-on-meta", lambda: approxlab.approximate("performer", Q, K, V, num_features=2, draw={
        "projection": torch.zeros(2, 2, 4, device=META)}), ValueError,
     r"^`draw\['projection'\]` of method 'performer' must hold data .*; got a tensor on the meta device\.$"),
    ("key-mask-on-meta", lambda: approxlab.approximate("skyformer", Q, K, V, num_features=2, generator=gen(1),
                                                       key_mask=torch.ones(2, 6, dtype=torch.bool, device=META)),
     ValueError, r"^`key_mask` must hold data \(a CPU or accelerator tensor\); got a tensor on the meta device\.$"),
    ("key-mask-on-meta-exact", lambda: approxlab.approximate(
        "exact", Q, K, V, num_features=1, key_mask=torch.ones(6, dtype=torch.bool, device=META)), ValueError,
     r"^`key_mask` must hold data"),
    ("dense-sum-batch-mismatch", lambda: DenseOperator(torch.eye(3).expand(2, 3, 3)) + DenseOperator(
        torch.eye(3).expand(3, 3, 3)), ValueError,
     r"^`operators` must have batch dimensions that broadcast \(\*batch, n, m\); got shapes \[\(2, 3, 3\), "
     r"\(3, 3, 3\)\]\.$"),
    ("dense-product-batch-mismatch", lambda: DenseOperator(torch.eye(3).expand(2, 3, 3)) @ DenseOperator(
        torch.eye(3).expand(3, 3, 3)), ValueError,
     r"^`factors` must have batch dimensions that broadcast \(\*batch, n, m\); got shapes \[\(2, 3, 3\), "
     r"\(3, 3, 3\)\]\.$"),
    ("dense-matmat-batch-mismatch", lambda: DenseOperator(torch.eye(3).expand(2, 3, 3)).matmat(torch.ones(3, 3, 1)),
     ValueError, r"^`x` must have shape \(\*batch, 3, k\), its batch broadcasting with the operator's \(2,\), to "
                 r"multiply an operator of shape \(2, 3, 3\); got \(3, 3, 1\)\.$"),
    ("dense-rmatmat-rows", lambda: DenseOperator(torch.ones(2, 3, 4)).rmatmat(torch.ones(2, 4, 1)), ValueError,
     r"^`y` must have shape \(\*batch, 3, k\), its batch broadcasting with the operator's \(2,\), for the adjoint of "
     r"an operator of shape \(2, 3, 4\); got \(2, 4, 1\)\.$"),
    ("relative-error-against-a-subnormal-reference", lambda: metrics.spectral_error(
        torch.eye(3, dtype=torch.float64), torch.full((3, 3), 1e-310, dtype=torch.float64), relative=True),
     OverflowError, r"^the relative error \|\|approx - exact\|\|_2 / \|\|exact\|\|_2 is about 1e\+310, beyond the "
                    r"largest float64 \(1\.798e\+308\): the spectral norm of `exact` is too small against the error "
                    r"\(e\.g\. a subnormal reference\); use relative=False\.$"),
    ("relative-error-operator-subnormal-reference", lambda: metrics.spectral_error(
        DenseOperator(torch.eye(3, dtype=torch.float64)), DenseOperator(torch.full((3, 3), 1e-310, dtype=torch.float64)),
        relative=True, generator=gen(0)), OverflowError, r"^the relative error .* is about 1e\+310, beyond"),
]


@pytest.mark.parametrize("call, error, match", [case[1:] for case in ARGUMENTS], ids=[case[0] for case in ARGUMENTS])
def test_a_bad_argument_is_refused_with_approxlabs_message(call, error, match, fresh_registry):
    with pytest.raises(error, match=match):
        call()


def test_a_subnormal_reference_still_gives_its_exact_relative_error():
    """The decided case: a tiny (subnormal) reference is a reference like any other where the ratio is
    representable (one power of two scales both norms); only a ratio beyond float64 is refused."""
    reference = torch.full((3, 3), 1e-310, dtype=torch.float64)
    assert metrics.spectral_error(2 * reference, reference, relative=True) == 1.0
    assert math.isclose(metrics.spectral_error(reference + 1e-300 * torch.eye(3, dtype=torch.float64), reference,
                                               relative=True), 1e-300 / 3e-310, rel_tol=1e-3)
