"""Explicit random draws: draw -> approximate(draw=...) reproduces approximate(generator=...) bit for bit;
hand-made draws of the documented shape are accepted, wrong ones refused with a message naming the key."""

from __future__ import annotations

import re

import pytest
import torch

import approxlab
from approxlab.methods import available, draw, get
from approxlab.methods.registry import BUILTINS
from approxlab.synthetic import synthetic_qkv
from _helpers import gen, rope_stated

RANDOMIZED = [name for name in BUILTINS if get(name).randomized]
"""Every randomized built-in (``MethodSpec.randomized``)."""

OPTIONS = {  # the options that change what a method draws
    "nystrom": [{}, {"sampling": "ridge-leverage"}, {"sampling": "rpcholesky"}],
    "skyformer": [{}, {"sampling": "rpcholesky"}],
    "skyformer-softmax": [{}, {"sampling": "rpcholesky"}],
    "hyperattention": [{"block_size": 8}, {"block_size": 8, "variant": "code"}],
    "yoso": [{}, {"tau": 3}],
    "performer": [{}, {"orthogonal": False}],
    "performer-lra": [{}, {"orthogonal": False}],
    "informer": [{}, {"measure_keys": "all"}, {"sample_size": 3}],
    "linformer": [{}, {"share_projection": True}],
    "magicpig": [{}, {"bits": 3, "min_collisions": 1}],
}
CASES = [(name, {**options, **({"causal": True} if get(name).causal_only else {}), **rope_stated(name)})
         for name in RANDOMIZED for options in OPTIONS.get(name, [{}])]  # cache policies: causal only, no RoPE here


def test_every_randomized_builtin_exposes_its_draw():
    assert set(RANDOMIZED) == {"skyformer", "skyformer-softmax", "nystrom", "yoso", "performer", "performer-lra",
                               "informer", "linformer", "vattention", "magicpig", "hyperattention",
                               "kdeformer", "random", "leverage-score", "compactor"}
    assert all(get(name).draw is not None for name in RANDOMIZED)
    assert all(draw(name, *synthetic_qkv((1,), 8, 4, generator=gen(0))[:2], num_features=2) == {}
               for name in available() if not get(name).randomized)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name, options", CASES)
def test_draw_then_approximate_is_bit_identical_to_the_generator(name, options, dtype):
    q, k, v = (x.to(dtype) for x in synthetic_qkv((2, 3), 40, 8, generator=gen(0)))
    drawn = draw(name, q, k, num_features=6, generator=gen(7), **options)
    from_generator = approxlab.approximate(name, q, k, v, num_features=6, generator=gen(7), **options)
    from_draw = approxlab.approximate(name, q, k, v, num_features=6, draw=drawn, **options)
    assert torch.equal(from_generator.output, from_draw.output)
    for key, value in from_generator.info.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, from_draw.info[key]), key
    # The draw is the method's random input: another seed, another draw and output.
    other = draw(name, q, k, num_features=6, generator=gen(8), **options)
    assert other.keys() == drawn.keys()
    if drawn:
        assert not all(torch.equal(drawn[key], other[key]) for key in drawn)


def test_one_draw_serves_float32_and_float64():
    q, k, v = synthetic_qkv((2,), 32, 8, generator=gen(1))
    for name in ("performer", "yoso", "linformer"):
        drawn = draw(name, q, k, num_features=5, generator=gen(2))
        assert all(t.dtype == torch.float64 for t in drawn.values())
        single = approxlab.approximate(name, q.float(), k.float(), v.float(), num_features=5, draw=drawn)
        assert torch.equal(single.output, approxlab.approximate(name, q.float(), k.float(), v.float(),
                                                                num_features=5, generator=gen(2)).output)


def test_hand_made_draws_of_the_documented_shape_are_accepted():
    """Draws made by hand in the documented layout (module docstring of approxlab.methods.draws)."""
    q, k, v = synthetic_qkv((2,), 30, 8, generator=gen(3))
    g = gen(4)
    columns = torch.stack([torch.randperm(60, generator=g)[:7] for _ in range(2)])
    by_draw = approxlab.approximate("skyformer-softmax", q, k, v, num_features=7, draw={"columns": columns})
    by_option = approxlab.approximate("skyformer-softmax", q, k, v, num_features=7, columns=columns)
    assert torch.equal(by_draw.output, by_option.output)
    tokens = torch.stack([torch.randperm(30, generator=g)[:7] for _ in range(2)])
    by_draw = approxlab.approximate("nystrom", q, k, v, num_features=7, draw={"columns": tokens})
    assert torch.equal(by_draw.output, approxlab.approximate("nystrom", q, k, v, num_features=7, columns=tokens).output)
    # Performer with the identity projection (r = p): phi(x)_l = exp(x_l - |x|^2/2)/sqrt(r).
    identity = torch.eye(8, dtype=torch.float64).expand(2, 8, 8)
    performer = approxlab.approximate("performer", q, k, v, num_features=8, draw={"projection": identity})
    assert torch.equal(performer.info["projection"], identity)
    hyperplanes = torch.randn(2, 4, 2, 8, generator=g, dtype=torch.float32)
    yoso = approxlab.approximate("yoso", q, k, v, num_features=4, tau=2, draw={"hyperplanes": hyperplanes})
    assert torch.equal(yoso.info["hyperplanes"], hyperplanes.double())
    # Informer whose sampled keys are all keys, in order: the exact sparsity measurement.
    every_key = torch.arange(30).expand(2, 30, 30)
    sampled = approxlab.approximate("informer", q, k, v, num_features=5, sample_size=30, draw={"key_indices": every_key})
    exact = approxlab.approximate("informer", q, k, v, num_features=5, measure_keys="all")
    assert torch.equal(sampled.info["selected"], exact.info["selected"])
    share = torch.randn(2, 4, 30, generator=g, dtype=torch.float64) / 2
    linformer = approxlab.approximate("linformer", q, k, v, num_features=4, share_projection=True,
                                      draw={"projection_keys": share})
    assert linformer.info["projection_values"] is linformer.info["projection_keys"]


@pytest.mark.parametrize("name, options", CASES)
def test_a_draw_of_the_wrong_shape_is_refused_naming_the_key(name, options):
    q, k, v = synthetic_qkv((2,), 24, 8, generator=gen(5))
    drawn = draw(name, q, k, num_features=4, generator=gen(6), **options)
    for key, value in drawn.items():
        wrong = {**drawn, key: value[..., :-1]}
        expected = re.escape(f"`draw[{key!r}]` of method {name!r} must have shape {tuple(value.shape)}")
        received = re.escape(f"got {tuple(wrong[key].shape)}.")
        with pytest.raises(ValueError, match=f"{expected} .*; {received}"):
            approxlab.approximate(name, q, k, v, num_features=4, draw=wrong, **options)
        missing = {other: t for other, t in drawn.items() if other != key}
        with pytest.raises(ValueError, match=re.escape(f"the key {key!r} (")):
            approxlab.approximate(name, q, k, v, num_features=4, draw=missing, **options)
    with pytest.raises(ValueError, match=f"`draw` of method {name!r} must have the keys .*got an unknown key 'bogus'"):
        approxlab.approximate(name, q, k, v, num_features=4, draw={**drawn, "bogus": torch.zeros(1)}, **options)


def test_draw_checks_kinds_ranges_and_exclusions():
    q, k, v = synthetic_qkv((2,), 24, 8, generator=gen(5))
    columns = draw("skyformer", q, k, num_features=4, generator=gen(1))["columns"]
    with pytest.raises(TypeError, match=r"`draw\['columns'\]` of method 'skyformer' must hold integer indices"):
        approxlab.approximate("skyformer", q, k, v, num_features=4, draw={"columns": columns.double()})
    with pytest.raises(ValueError, match=r"must hold indices in \[0, 48\); got values in \[.*, 48\]"):
        approxlab.approximate("skyformer", q, k, v, num_features=4, draw={"columns": columns * 0 + 48})
    with pytest.raises(TypeError, match=r"`draw\['projection'\]` of method 'performer' must be a torch.Tensor"):
        approxlab.approximate("performer", q, k, v, num_features=4, draw={"projection": [[0.0]]})
    nan = torch.full((2, 4, 8), float("nan"), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`draw\['projection'\]` of method 'performer' must be finite"):
        approxlab.approximate("performer", q, k, v, num_features=4, draw={"projection": nan})
    with pytest.raises(TypeError, match="`draw` of method 'yoso' must be a dict of named tensors"):
        approxlab.approximate("yoso", q, k, v, num_features=4, draw=torch.zeros(3))
    with pytest.raises(ValueError, match="pass at most one of `generator` and `draw`"):
        approxlab.approximate("skyformer", q, k, v, num_features=4, draw={"columns": columns}, generator=gen(1))
    with pytest.raises(ValueError, match="pass at most one of `columns` and `draw`"):
        approxlab.approximate("skyformer", q, k, v, num_features=4, draw={"columns": columns}, columns=columns)
    with pytest.raises(ValueError, match=r"`draw` is not accepted by method 'exact': it draws nothing"):
        approxlab.approximate("exact", q, k, v, num_features=4, draw={"columns": columns})
    assert approxlab.approximate("exact", q, k, v, num_features=4, draw={}).output.shape == v.shape
    # The method's other options are accepted and ignored by draw(); unknown ones are refused.
    assert draw("skyformer", q, k, num_features=4, core="schulz", generator=gen(1)).keys() == {"columns"}
    with pytest.raises(TypeError, match="`bogus` is not an option of method 'skyformer'"):
        draw("skyformer", q, k, num_features=4, core="pinv", bogus=1)


def test_draw_of_a_user_method(fresh_registry):
    def noise(q, k, *, num_features, generator=None):
        return {"noise": torch.randn(*q.shape[:-1], num_features, generator=generator, dtype=torch.float64)}

    @approxlab.methods.register("noisy", target="softmax", features="noise columns", draw=noise)
    def noisy(q, k, v, *, num_features, generator=None, draw=None):
        draw = noise(q, k, num_features=num_features, generator=generator) if draw is None else draw
        return approxlab.exact_attention(q, k, v) + draw["noise"].mean(-1, keepdim=True).to(q.dtype)

    @approxlab.methods.register("no-draw", target="softmax", features="noise")
    def no_draw(q, k, v, *, num_features, generator=None):
        return approxlab.exact_attention(q, k, v)

    q, k, v = synthetic_qkv((2,), 16, 4, generator=gen(0))
    shared = draw("noisy", q, k, num_features=3, generator=gen(1))
    assert torch.equal(approxlab.approximate("noisy", q, k, v, num_features=3, draw=shared).output,
                       approxlab.approximate("noisy", q, k, v, num_features=3, generator=gen(1)).output)
    with pytest.raises(ValueError, match="`method` 'no-draw' does not expose its random draw"):
        draw("no-draw", q, k, num_features=3)
    with pytest.raises(ValueError, match="`draw` is not accepted by method 'no-draw': it was registered without"):
        approxlab.approximate("no-draw", q, k, v, num_features=3, draw={})


def test_informer_counts_queries_and_skyformer_rows_of_the_completion():
    """num_features is bounded by what it counts: informer's u by the queries n (cross-attention with
    u > m is allowed), skyformer's d by the n + m rows of [Q; K]."""
    q = synthetic_qkv((2,), 40, 8, generator=gen(0))[0]
    _, k, v = synthetic_qkv((2,), 10, 8, generator=gen(1))
    assert get("informer").max_features(40, 10) == 40 and get("skyformer").max_features(40, 10) == 50
    result = approxlab.approximate("informer", q, k, v, num_features=30, generator=gen(2))
    assert result.info["selected"].shape == (2, 30)
    with pytest.raises(ValueError, match="1 <= num_features <= 40; got 41"):
        approxlab.approximate("informer", q, k, v, num_features=41, generator=gen(2))
    approxlab.approximate("skyformer", q, k, v, num_features=45, generator=gen(2))
    with pytest.raises(ValueError, match="1 <= num_features <= 50; got 51"):
        approxlab.approximate("skyformer", q, k, v, num_features=51, generator=gen(2))


@pytest.mark.parametrize("name", ["skyformer", "skyformer-softmax"])
def test_unknown_option_is_approxlabs_message(name):
    q, k, v = synthetic_qkv((1,), 8, 4, generator=gen(0))
    with pytest.raises(TypeError, match=rf"`colums` is not an option of method '{name}' \(unexpected keyword "
                                        r"argument 'colums'\); its options are \['columns', 'core', "):
        approxlab.approximate(name, q, k, v, num_features=2, colums=None)


@pytest.mark.parametrize("name", ["nystrom", "skyformer"])
@pytest.mark.parametrize("value", [1.0, -0.25])
def test_pivot_uniforms_out_of_range_are_refused_naming_the_draw(name, value):
    """An RPCholesky draw holding 1.0 was refused as "`uniforms` must lie in [0, 1)", naming no ``draw``."""
    q, k, v = (torch.randn(2, 16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    made = draw(name, q, k, num_features=4, generator=torch.Generator().manual_seed(0),
                          sampling="rpcholesky")
    made["pivot_uniforms"][0, 0] = value
    with pytest.raises(ValueError, match=rf"^`draw\['pivot_uniforms'\]` of method '{name}' must hold uniforms in "
                                         rf"\[0, 1\); got values in \[.*{value}"):
        approxlab.approximate(name, q, k, v, num_features=4, draw=made, sampling="rpcholesky")
