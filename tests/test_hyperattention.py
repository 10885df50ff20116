"""HyperAttention: both variants and the causal recursion against their dense definitions (same draws),
the full-budget limit, and the two sampling identities its analysis rests on (Algorithms 2 and 3)."""

import math

import pytest
import torch

import approxlab
from approxlab import sortlsh
from approxlab.methods import draw
from _helpers import gen


def _qkv(n, p=4, batch=(2,), seed=0, scale=0.8):
    g = gen(seed)
    q, k = (scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*batch, n, 3, generator=g, dtype=torch.float64) * torch.exp(torch.randn(*batch, n, 1, generator=g))
    return q, k, v.double()


def _first_above(weights, uniforms):
    """Inverse CDF by counting: the first index whose cumulative weight exceeds u * total."""
    cumulative = weights.cumsum(-1)
    return (cumulative.unsqueeze(-2) <= uniforms.unsqueeze(-1) * cumulative[..., -1:, None]).sum(-1)


def _dense_block(q, k, v, planes, uniforms, *, variant, block, clip=1.0, kappa=1.0):
    """Numerators (*b, n, p_v) and row sums (*b, n) of one unmasked block, from the dense matrices:
    Algorithms 1-3 (paper) or the published code's block + uniform residual (code)."""
    n, m, s = q.shape[-2], k.shape[-2], uniforms["column_uniforms"].shape[-1]
    order = "gray" if variant == "paper" else "code"
    heavy = sortlsh.sortlsh_mask(q, k, block_size=block, hyperplanes=planes, order=order).double()
    a = torch.exp(q @ k.mT / math.sqrt(q.shape[-1]))
    key_order = sortlsh.sorted_order(k, planes, order=order)
    ell = torch.gather(key_order, -1, (uniforms["column_uniforms"] * m).floor().long())
    light = (1 - heavy) * a
    if variant == "code":
        approx = heavy * a
        for t in range(s):
            column = ell[..., t, None, None].expand(*ell.shape[:-1], n, 1)
            approx.scatter_add_(-1, column, torch.gather(light, -1, column) * m / s)
        return approx @ v, approx.sum(-1)
    h = (heavy * a).sum(-1)
    cap = torch.full_like(h, math.inf)
    if clip is not None:
        rows = torch.gather(sortlsh.sorted_order(q, planes, order=order), -1,
                            (uniforms["row_uniforms"] * n).floor().long())
        tau = torch.gather(light, -2, rows.unsqueeze(-1).expand(*rows.shape, m)).sum(-1).amax(-1, keepdim=True)
        cap = clip * s / (m * max(math.log(m), 1.0)) * (h + tau / kappa)
    sampled = torch.gather(light, -1, ell.unsqueeze(-2).expand(*ell.shape[:-1], n, s))
    d = h + torch.minimum(sampled, cap.unsqueeze(-1)).sum(-1) * m / s
    norms = v.square().sum(-1)
    chosen = _first_above(norms, uniforms["value_uniforms"])
    weight = norms.sum(-1, keepdim=True) / (s * torch.gather(norms, -1, chosen))
    sampled_a = torch.gather(a, -1, chosen.unsqueeze(-2).expand(*chosen.shape[:-1], n, s))
    numerators = (sampled_a * weight.unsqueeze(-2)) @ torch.gather(v, -2, chosen.unsqueeze(-1).expand(*chosen.shape, v.shape[-1]))
    return numerators, d


def _dense_causal(q, k, v, planes, uniforms, counter, start, stop, *, variant, block):
    """The causal recursion by its definition: halves recursively, the lower-left block unmasked."""
    if stop - start <= block:
        a = torch.exp(q[..., start:stop, :] @ k[..., start:stop, :].mT / math.sqrt(q.shape[-1])).tril()
        return a @ v[..., start:stop, :], a.sum(-1)
    half = start + (stop - start + 1) // 2
    index = counter.pop(0)
    own = {key: value[..., index, :] for key, value in uniforms.items()}
    block_num, block_den = _dense_block(q[..., half:stop, :], k[..., start:half, :], v[..., start:half, :], planes, own,
                                        variant=variant, block=block)
    upper_num, upper_den = _dense_causal(q, k, v, planes, uniforms, counter, start, half, variant=variant, block=block)
    lower_num, lower_den = _dense_causal(q, k, v, planes, uniforms, counter, half, stop, variant=variant, block=block)
    return torch.cat([upper_num, lower_num + block_num], -2), torch.cat([upper_den, lower_den + block_den], -1)


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_non_causal_is_its_dense_definition_with_the_same_draw(variant):
    q, k, v = _qkv(37)
    drawn = draw("hyperattention", q, k, num_features=6, generator=gen(1), block_size=8, variant=variant)
    result = approxlab.approximate("hyperattention", q, k, v, num_features=6, block_size=8, variant=variant, draw=drawn)
    one_block = {key: value[..., 0, :] for key, value in drawn.items() if key != "hyperplanes"}
    numerators, row_sums = _dense_block(q, k, v, drawn["hyperplanes"], one_block, variant=variant, block=8)
    torch.testing.assert_close(result.output, numerators / row_sums.unsqueeze(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.info["log_row_sums"], row_sums.log(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_causal_recursion_is_its_masked_dense_definition_with_the_same_draw(variant):
    """Algorithm 4 / the code's causal forward: two causal halves and one unmasked block per level
    (n = 37: odd splits and short last blocks), against the recursion written with dense matrices."""
    q, k, v = _qkv(37, seed=2)
    drawn = draw("hyperattention", q, k, num_features=5, generator=gen(3), block_size=8, variant=variant, causal=True)
    assert drawn["column_uniforms"].shape == (2, approxlab.methods.hyperattention.num_blocks(
        37, block_size=8, causal=True), 5)
    result = approxlab.approximate("hyperattention", q, k, v, num_features=5, block_size=8, variant=variant,
                                   draw=drawn, causal=True)
    uniforms = {key: value for key, value in drawn.items() if key != "hyperplanes"}
    counter = list(range(drawn["column_uniforms"].shape[-2]))
    numerators, row_sums = _dense_causal(q, k, v, drawn["hyperplanes"], uniforms, counter, 0, 37, variant=variant,
                                         block=8)
    torch.testing.assert_close(result.output, numerators / row_sums.unsqueeze(-1), rtol=1e-12, atol=1e-12)
    matrix = result.matrix()
    assert float(matrix.triu(1).abs().max()) == 0.0  # no key after the query
    torch.testing.assert_close(matrix @ v, result.output, rtol=1e-12, atol=1e-12)
    again = approxlab.approximate("hyperattention", q, k, v, num_features=5, block_size=8, variant=variant,
                                  generator=gen(3), causal=True)
    assert torch.equal(again.output, result.output)


@pytest.mark.parametrize("causal", [False, True])
def test_the_operator_is_formed_from_the_run_that_gave_the_output(monkeypatch, causal):
    """matrix() reuses the pieces of the call's own run (the algorithm is not run a second time), and its rows
    applied to v are that run's output."""
    from approxlab.methods import hyperattention as module

    q, k, v = _qkv(37, seed=6)
    result = approxlab.approximate("hyperattention", q, k, v, num_features=5, block_size=8, generator=gen(7),
                                   causal=causal)

    def refuse(*args, **kwargs):
        raise AssertionError("the algorithm ran again to form the operator")

    monkeypatch.setattr(module._Run, "unmasked", refuse)
    monkeypatch.setattr(module._Run, "causal", refuse)
    torch.testing.assert_close(result.matrix() @ v, result.output, rtol=1e-12, atol=1e-12)


def test_full_budget_code_variant_is_exact_attention():
    """One block holds every key: nothing is sampled (non-causal); causal, both halves are exact and
    the unmasked block is one block."""
    q, k, v = _qkv(40, seed=4)
    full = approxlab.approximate("hyperattention", q, k, v, num_features=4, block_size=40, variant="code",
                                 generator=gen(5))
    torch.testing.assert_close(full.output, approxlab.exact_attention(q, k, v), rtol=1e-12, atol=1e-13)
    causal = approxlab.approximate("hyperattention", q, k, v, num_features=4, block_size=20, variant="code",
                                   generator=gen(5), causal=True)
    torch.testing.assert_close(causal.output, approxlab.exact_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-13)
    short = approxlab.approximate("hyperattention", q, k, v, num_features=4, block_size=4, variant="code",
                                  min_seq_len=41, generator=gen(5))
    torch.testing.assert_close(short.output, approxlab.exact_attention(q, k, v), rtol=1e-12, atol=1e-13)


def test_algorithm_3_sampled_product_is_unbiased_with_its_variance():
    """Algorithm 3 / Lemma 2: with p_j = |v_j|^2 / |V|_F^2 and weight 1 / (m p_j),
    E |P S^T S V - P V|_F^2 = (|P|_F^2 |V|_F^2 - |P V|_F^2) / m exactly (P = D^-1 A). One block holding
    every key makes D~ = D, so the output error is the product's. 600 independent draws (batch
    elements); the mean is within 4 standard errors (failure probability ~1e-4 under normality)."""
    q, k, v = _qkv(24, seed=6)
    replicas = 600
    q, k, v = (x[:1].expand(replicas, *x.shape[1:]) for x in (q, k, v))
    m = 6
    result = approxlab.approximate("hyperattention", q, k, v, num_features=m, block_size=24, generator=gen(7))
    probabilities = approxlab.attention_matrix(q[:1], k[:1])[0]
    exact = probabilities @ v[0]
    torch.testing.assert_close(result.info["log_row_sums"][0], torch.logsumexp(q[0] @ k[0].T / 2, -1))
    errors = (result.output - exact).square().sum((-1, -2))
    expected = (probabilities.square().sum() * v[0].square().sum() - exact.square().sum()) / m
    standard_error = errors.std() / math.sqrt(replicas)
    assert abs(float(errors.mean() - expected)) <= 4 * float(standard_error), (errors.mean(), expected)


def test_algorithm_2_row_sums_are_unbiased_without_clipping_and_clipping_only_lowers_them():
    """Algorithm 2 with C_i = inf: E d~_i = d_i (the residual's uniform samples exclude the query's own
    block, so no entry counts twice). 800 draws; every row's mean within 4.5 standard errors (32 rows:
    failure probability ~2e-4). Clipping with the same draw lowers no estimate below the heavy part."""
    q, k, v = _qkv(32, seed=8, scale=1.0)
    replicas = 800
    q, k, v = (x[:1].expand(replicas, *x.shape[1:]) for x in (q, k, v))
    options = dict(num_features=4, block_size=8)
    unclipped = approxlab.approximate("hyperattention", q, k, v, clip=None, generator=gen(9), **options)
    d = torch.exp(q[0] @ k[0].T / 2).sum(-1)
    estimates = unclipped.info["log_row_sums"].exp()
    z = (estimates.mean(0) - d) / (estimates.std(0) / math.sqrt(replicas))
    assert float(z.abs().max()) <= 4.5, z
    clipped = approxlab.approximate("hyperattention", q, k, v, clip=0.05, generator=gen(9), **options)
    assert bool((clipped.info["log_row_sums"] <= unclipped.info["log_row_sums"] + 1e-12).all())
    assert bool((clipped.info["log_row_sums"] < unclipped.info["log_row_sums"] - 1e-3).any())


def test_padding_changes_nothing_for_real_tokens_with_the_same_draw():
    """Padded keys sort last and are never sampled: with key_mask, the real rows equal the run on the
    unpadded tokens with the same draw (uniforms map onto the real rows only)."""
    q, k, v = _qkv(20, seed=10)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[:, 14:] = False
    for method, options in (("hyperattention", {"block_size": 4}), ("hyperattention", {"block_size": 4, "variant": "code"}),
                            ("kdeformer", {})):
        drawn = draw(method, q, k, num_features=5, generator=gen(11), **options)
        padded = approxlab.approximate(method, q, k, v, num_features=5, draw=drawn, key_mask=mask, **options)
        alone = approxlab.approximate(method, q[:, :14], k[:, :14], v[:, :14], num_features=5, draw=drawn, **options)
        torch.testing.assert_close(padded.output[:, :14], alone.output, rtol=1e-12, atol=1e-12)


def test_validation_names_the_parameter():
    q, k, v = _qkv(16, seed=12)

    def run(**options):
        return approxlab.approximate("hyperattention", q, k, v, num_features=4, generator=gen(0), **options)

    with pytest.raises(ValueError, match=r"`variant` must be one of \['code', 'paper'\]; got 'cuda'"):
        run(variant="cuda")
    with pytest.raises(ValueError, match=r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"):
        run(block_size=0)
    with pytest.raises(ValueError, match=r"`kappa` must be a finite number > 0; got -1.0"):
        run(kappa=-1.0)
    with pytest.raises(ValueError, match=r"`clip` must be a finite number > 0; got 0.0"):
        run(clip=0.0)
    with pytest.raises(ValueError, match=r"`bits` must be an integer with 1 <= bits <= 30; got 0"):
        run(bits=0)
    drawn = draw("hyperattention", q, k, num_features=4, generator=gen(1))
    drawn["value_uniforms"] = drawn["value_uniforms"] + 1.0
    with pytest.raises(ValueError, match=r"`draw\['value_uniforms'\]` of method 'hyperattention' must hold uniforms "
                                         r"in \[0, 1\); got values in"):
        approxlab.approximate("hyperattention", q, k, v, num_features=4, draw=drawn)
