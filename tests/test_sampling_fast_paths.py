"""magicpig and vattention as algorithms: the same outputs and diagnostics as their float64 implementations of
commit 96e67b3 (``tests/_sampling_reference.py``) on the same draws -- to 1e-12 in float64, to float32 rounding in
float32 -- with sinks, windows, key masks, a prefill, both forms and two batch dimensions; and the bitsets of
colliding keys against the pairwise counts."""

from __future__ import annotations

import pytest
import torch

import approxlab
from approxlab.methods import draw
from approxlab.methods._collision_sets import below, colliding_keys, pack_bits, unpack_bits
from approxlab.methods.magicpig import collision_counts
from approxlab.synthetic import synthetic_qkv
from _helpers import gen
from _sampling_reference import magicpig_reference, vattention_reference

TOLERANCE = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-5)}


def _key_mask(batch, m, seed):
    mask = torch.rand(*batch, m, generator=gen(seed)) > 0.2
    mask[..., 0] = True
    return mask


MAGICPIG_CASES = [
    dict(causal=True),
    dict(causal=True, sink=4, window=8),
    dict(causal=True, sink=1, window=3, prompt_length=40, bits=3, min_collisions=3),
    dict(causal=True, window=5, prompt_length=100, center=False),
    dict(causal=True, sink=2, window=6, masked=True),
    dict(sink=2, window=5),
    dict(bits=5, min_collisions=1),
    dict(sink=3, window=4, masked=True),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", MAGICPIG_CASES, ids=str)
def test_magicpig_is_its_float64_implementation_on_the_same_draw(case, dtype):
    options = {"bits": 4, **case}
    masked = options.pop("masked", False)
    q, k, v = (x.to(dtype) for x in synthetic_qkv((2, 3), 128, 16, scale=1.2, generator=gen(0)))
    options["key_mask"] = _key_mask((2, 3), 128, 1) if masked else None
    drawn = draw("magicpig", q, k, num_features=40, generator=gen(2), bits=options["bits"])
    ours = approxlab.approximate("magicpig", q, k, v, num_features=40, draw=drawn, **options)
    output, info = magicpig_reference(q, k, v, drawn, **options)
    assert ours.output.dtype == dtype
    torch.testing.assert_close(ours.output.double(), output, **TOLERANCE[dtype])
    assert torch.equal(ours.info["fixed"], info["fixed"]) and torch.equal(ours.info["sampled"], info["sampled"])
    assert int(info["sampled"].sum()) > 0
    # the operator (formed on request) is the output's: S~ V = output, each row summing to 1 or 0
    torch.testing.assert_close(ours.matrix().double() @ v.double(), ours.output.double(), **TOLERANCE[dtype])


VATTENTION_CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, sink=4, window=8),
    dict(sink=2, window=5, epsilon=0.1),
    dict(causal=True, epsilon=0.05, delta=0.3),
    dict(causal=True, sink=1, window=3, masked=True),
    dict(masked=True, epsilon=0.2),
]


@pytest.mark.parametrize("route", ["gathered", "dense"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", VATTENTION_CASES, ids=str)
def test_vattention_is_its_float64_implementation_on_the_same_draw(case, dtype, route, monkeypatch):
    """Every draw of today's layout ``(*batch, n, m)`` (``max_samples=None``) gives the former outputs and
    diagnostics, with the samples read out either way (their values gathered, or their weights summed per key and
    multiplied with V: :data:`approxlab.methods.vattention.DENSE_SAMPLES`); ``required`` agrees to rounding where
    the tail has two keys or more (for one key :math:`\\operatorname{tr}\\Sigma` is 0 up to rounding, and either
    way one draw covers the tail)."""
    from approxlab.methods import vattention

    monkeypatch.setattr(vattention, "DENSE_SAMPLES", 10 ** 9 if route == "dense" else 10 ** -9)
    options = dict(case)
    masked = options.pop("masked", False)
    q, k, v = (x.to(dtype) for x in synthetic_qkv((2,), 256, 16, scale=1.6, generator=gen(5)))
    v = v + 1.0
    options["key_mask"] = _key_mask((2,), 256, 6) if masked else None
    drawn = draw("vattention", q, k, num_features=16, generator=gen(7), max_samples=None)
    assert drawn["uniform"].shape == (2, 256, 256)
    ours = approxlab.approximate("vattention", q, k, v, num_features=16, draw=drawn, max_samples=None, **options)
    output, info = vattention_reference(q, k, v, drawn, num_features=16, **options)
    torch.testing.assert_close(ours.output.double(), output, **TOLERANCE[dtype])
    for key in ("fixed", "tail", "samples", "exact_tail"):
        assert torch.equal(ours.info[key], info[key]), key
    assert int((info["samples"] > 0).sum()) > 50
    several = info["tail"] > 1
    torch.testing.assert_close(ours.info["required"][several], info["required"][several],
                               rtol=1e-9 if dtype == torch.float64 else 1e-3, atol=0)
    torch.testing.assert_close(ours.matrix().double() @ v.double(), ours.output.double(), **TOLERANCE[dtype])


def test_vattention_draws_at_most_max_samples_per_query():
    """The draw has ``min(m, max_samples)`` variates per query; a query whose sample size exceeds them attends its
    tail exactly; with ``m <= max_samples`` the generator draws what it drew before (the same variates)."""
    q, k, v = synthetic_qkv((2,), 256, 16, scale=1.6, generator=gen(8))
    v = v + 1.0
    assert torch.equal(draw("vattention", q, k, num_features=8, generator=gen(9))["uniform"],
                       torch.rand(2, 256, 256, generator=gen(9), dtype=torch.float64))
    capped = approxlab.approximate("vattention", q, k, v, num_features=8, epsilon=0.1, max_samples=40,
                                   generator=gen(9))
    assert draw("vattention", q, k, num_features=8, generator=gen(9), max_samples=40)["uniform"].shape == (2, 256, 40)
    info = capped.info
    assert int(info["samples"].max()) <= 40 and int((info["samples"] > 0).sum()) > 0
    over = info["required"] > 40
    assert int(over.sum()) > 0 and bool(info["exact_tail"][over & (info["tail"] > 0)].all())
    uncapped = approxlab.approximate("vattention", q, k, v, num_features=8, epsilon=0.1, generator=gen(9))
    exact = approxlab.exact_attention(q, k, v)
    torch.testing.assert_close(capped.output[over], exact[over], rtol=1e-12, atol=1e-12)
    assert not torch.equal(uncapped.output[over], exact[over])
    with pytest.raises(ValueError, match="`max_samples`"):
        approxlab.approximate("vattention", q, k, v, num_features=8, max_samples=0, generator=gen(9))


@pytest.mark.parametrize("batch, tables, queries, keys, bits, least", [
    ((), 3, 5, 7, 2, 1), ((2,), 16, 40, 33, 3, 2), ((2, 3), 8, 17, 130, 1, 4), ((1,), 64, 64, 200, 8, 2),
    ((3,), 4, 1, 1, 4, 2)])
def test_colliding_key_bitsets_are_the_pairwise_counts(batch, tables, queries, keys, bits, least):
    g = gen(len(batch) * 100 + tables)
    codes_q = torch.randint(2 ** bits, (*batch, tables, queries), generator=g)
    codes_k = torch.randint(2 ** bits, (*batch, tables, keys), generator=g)
    found = unpack_bits(colliding_keys(codes_q, codes_k, buckets=2 ** bits, min_collisions=least), keys)
    assert torch.equal(found, collision_counts(codes_q, codes_k) >= least)
    # causally (query i at position keys - queries + i) the bits of keys up to each query are the same
    offset = keys - queries
    causal = unpack_bits(colliding_keys(codes_q, codes_k, buckets=2 ** bits, min_collisions=least,
                                        offset=offset), keys)
    visible = torch.arange(keys) <= offset + torch.arange(queries).unsqueeze(-1)
    assert torch.equal(causal & visible, found & visible)


def test_bitset_helpers_round_trip():
    flags = torch.rand(3, 2, 200, generator=gen(10)) > 0.5
    assert torch.equal(unpack_bits(pack_bits(flags), 200), flags)
    limits = torch.tensor([0, 1, 63, 64, 65, 128, 200])
    assert torch.equal(unpack_bits(below(limits, 4), 200), torch.arange(200) < limits.unsqueeze(-1))
