"""Checks every registered method inherits (GPyTorch's shared-mixin habit).

A new method is one file plus one registry line; it is picked up here automatically.
"""

import re

import pytest
import torch

import approxlab
from approxlab.methods import available, get
from approxlab.synthetic import synthetic_qkv
from _helpers import DEVICES, opposed_logits_80_qkv, rope_stated

METHODS = available()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _budget(name, n, wanted):
    return min(wanted, get(name).max_features(n))


def _approximate(name, q, k, v, **kwargs):
    """``approximate``, in causal form for the causal-only methods (decode-time cache policies); a sketched cache
    scorer with a sketch narrower than ``p`` (48 < 64 in a model; here p = 8), else every draw keeps one set."""
    if get(name).randomized and "sketch_dimension" in (get(name).options() or []):
        kwargs.setdefault("sketch_dimension", 4)
    return approxlab.approximate(name, q, k, v, causal=get(name).causal_only, **rope_stated(name), **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METHODS)
def test_batched_bert_shape_float32(name, device):
    """Issue 'Done means': every method runs batched on (2, 12, 512, 64) float32 inputs."""
    q, k, v = synthetic_qkv((2, 12), 512, 64, scale=0.7, generator=_gen(0), dtype=torch.float32)
    q, k, v = q.to(device), k.to(device), v.to(device)
    result = _approximate(name, q, k, v, num_features=64, generator=_gen(1))
    assert result.output.shape == (2, 12, 512, 64)
    assert result.output.dtype == torch.float32
    assert result.output.device.type == device
    assert bool(torch.isfinite(result.output).all())
    assert result.method == name
    assert result.target == get(name).target


@pytest.mark.parametrize("name", METHODS)
def test_operator_matches_output_and_adjoint(name):
    """The operator is the matrix behind the output: op @ v == output, op.T == dense^T."""
    q, k, v = synthetic_qkv((2, 3), 40, 8, generator=_gen(2))
    result = _approximate(name, q, k, v, num_features=_budget(name, 40, 12), generator=_gen(3))
    op = result.operator()
    assert op.shape == (2, 3, 40, 40)
    dense = result.matrix()
    torch.testing.assert_close(op.matmat(v), result.output, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dense @ v, result.output, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(op.T.to_dense(), dense.transpose(-1, -2), rtol=1e-9, atol=1e-9)
    y = torch.randn(2, 3, 40, 2, generator=_gen(4), dtype=torch.float64)
    torch.testing.assert_close(op.rmatmat(y), dense.transpose(-1, -2) @ y, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", METHODS)
def test_float32_logits_80_do_not_overflow(name):
    """Issue: float32 attention logits up to +-80 must not overflow in any method."""
    q, k, v = opposed_logits_80_qkv(64, seed=5)
    result = _approximate(name, q, k, v, num_features=_budget(name, 64, 16), generator=_gen(6))
    assert bool(torch.isfinite(result.output).all())


def _tensor_info(result):
    return {key: value for key, value in result.info.items() if isinstance(value, torch.Tensor)}


@pytest.mark.parametrize("name", METHODS)
def test_same_generator_seed_same_result(name):
    """STYLE convention 1: the generator reaches every random draw.

    The same seed gives bit-identical outputs *and* diagnostics (sampled columns, selected
    queries, hash codes, ...); another seed gives another output for a randomized method.
    """
    q, k, v = synthetic_qkv((2,), 48, 8, generator=_gen(7))
    first = _approximate(name, q, k, v, num_features=_budget(name, 48, 8), generator=_gen(11))
    second = _approximate(name, q, k, v, num_features=_budget(name, 48, 8), generator=_gen(11))
    torch.testing.assert_close(first.output, second.output, rtol=0, atol=0)
    torch.testing.assert_close(_tensor_info(first), _tensor_info(second), rtol=0, atol=0, equal_nan=True)
    if get(name).randomized:
        other = _approximate(name, q, k, v, num_features=_budget(name, 48, 8), generator=_gen(12))
        assert not torch.equal(first.output, other.output)


# Relative Frobenius distance between the float32 and float64 outputs for the same seed.
# Measured over 50 (Q/K/V, generator) seeds of this test's shape ((2,), n=48, p=8, 8 features):
# at most 1.5e-6 for every method except the two whose core is a pseudo-inverse of a
# non-PSD / unshifted landmark block, where the float32 rank threshold d*eps32 drops
# directions that float64 keeps: nystrom (median 5.0e-5, max 8.2e-3) and
# spectral-shifting (median 7.7e-6, max 9.1e-4). For this test's seed: 5.7e-6 and 2.0e-5.
FLOAT32_RTOL = {"nystrom": 2e-2, "spectral-shifting": 2e-2}
FLOAT32_RTOL_DEFAULT = 1e-5


@pytest.mark.parametrize("name", METHODS)
def test_float32_draws_the_same_sample_as_float64(name):
    """Draws happen on CPU independently of the data's dtype: a float32 run with the same seed
    samples the same columns / queries / hashes as float64 (integer diagnostics identical) and
    its output differs only by float32 rounding, amplified by the method's core
    (:data:`FLOAT32_RTOL`)."""
    q, k, v = synthetic_qkv((2,), 48, 8, generator=_gen(7))
    d = _budget(name, 48, 8)
    double = _approximate(name, q, k, v, num_features=d, generator=_gen(11))
    single = _approximate(name, q.float(), k.float(), v.float(), num_features=d, generator=_gen(11))
    assert single.output.dtype == torch.float32
    for key, value in _tensor_info(double).items():
        if not (value.is_floating_point() or value.dtype == torch.bool) and key != "core_rank":
            assert torch.equal(single.info[key].cpu(), value.cpu()), key
    rtol = FLOAT32_RTOL.get(name, FLOAT32_RTOL_DEFAULT)
    distance = float((single.output.double() - double.output).norm() / double.output.norm())
    assert distance <= rtol, (name, distance, rtol)


@pytest.mark.parametrize("name", METHODS)
def test_no_global_rng_use(name):
    """The library never touches the global RNG state."""
    q, k, v = synthetic_qkv((2,), 32, 8, generator=_gen(8))
    state = torch.get_rng_state()
    _approximate(name, q, k, v, num_features=_budget(name, 32, 8), generator=_gen(9))
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("name", METHODS)
def test_num_features_out_of_range(name):
    q, k, v = synthetic_qkv((2,), 16, 4, generator=_gen(10))
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= \d+; got 0"):
        _approximate(name, q, k, v, num_features=0)
    too_many = get(name).max_features(16) + 1
    with pytest.raises(ValueError, match=f"got {too_many}"):
        _approximate(name, q, k, v, num_features=too_many)
    with pytest.raises(TypeError, match="`num_features` must be an integer"):
        _approximate(name, q, k, v, num_features=4.5)


def test_unknown_method_lists_available():
    q, k, v = synthetic_qkv((1,), 8, 4, generator=_gen(0))
    with pytest.raises(ValueError, match=r"`method` must be one of \[.*'skyformer'.*\]; got 'bogus'"):
        approxlab.approximate("bogus", q, k, v, num_features=2)


def test_bad_qkv_messages():
    q, k, v = synthetic_qkv((1,), 8, 4, generator=_gen(0))
    with pytest.raises(ValueError, match="`q` and `k` must share the feature dimension p"):
        approxlab.approximate("exact", q, k[..., :3], v, num_features=2)
    with pytest.raises(ValueError, match=r"`v` must have shape \(\*batch, n_k, p_v\)"):
        approxlab.approximate("exact", q, k, v[..., :5, :], num_features=2)
    bad = q.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="`q` must be finite; got 1 non-finite"):
        approxlab.approximate("exact", bad, k, v, num_features=2)
    with pytest.raises(TypeError, match="`generator` must be a torch.Generator"):
        approxlab.approximate("performer", q, k, v, num_features=2, generator=0)


def test_registry_modules_declare_their_name():
    for name in METHODS:
        assert get(name).name == name
        assert get(name).features


REFUSED_SHAPES = {
    "nystrom": r"`q` and `k` must have the same length n for plain Nyström \(one index set S for rows "
                           r"and columns\); got 1 and 3\.",
}
"""The shapes a method refuses, and the one line that says why (documented in the method's docstring)."""


def _forms(name):
    """The forms of ``name`` to run: its bidirectional one unless it is causal-only, and each causal one it has."""
    causal = get(name).causal
    return ([] if causal == "only" else [False]) + ([True] if causal in (True, "only") else []) + (
        ["mask-renormalise"] if causal == "mask-renormalise" else [])


@pytest.mark.parametrize("lead", [(), (2,)], ids=["(n, p)", "(b, n, p)"])
@pytest.mark.parametrize("n, m", [(5, 5), (1, 1), (1, 3)], ids=["n=m=5", "n=m=1", "n=1,m=3"])
@pytest.mark.parametrize("name", METHODS)
def test_unbatched_inputs_and_a_single_token(name, n, m, lead):
    """Every method takes ``(n, p)`` inputs (no batch dimension) and one query (n=1, with one key or a few), in
    each of its forms (causal ones where the shapes allow: n = m), or refuses in one documented line; polynomial
    raised torch's ``tensor.mT is only supported on matrices`` on ``(n, p)`` inputs."""
    g = _gen(0)
    q, k, v = (torch.randn(*lead, rows, 4, dtype=torch.float64, generator=g) for rows in (n, m, m))
    for causal in _forms(name):
        if causal and n != m:
            continue
        try:
            result = approxlab.approximate(name, q, k, v, num_features=1, causal=causal, generator=_gen(1),
                                           **rope_stated(name))
        except ValueError as error:
            message = str(error)
            assert name in REFUSED_SHAPES and "\n" not in message, message
            assert re.fullmatch(REFUSED_SHAPES[name], message), message
            continue
        assert result.output.shape == (*lead, n, 4), (causal, result.output.shape)
        assert bool(torch.isfinite(result.output).all()), causal
