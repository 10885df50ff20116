"""Causal exact attention: ``exact_attention``, ``attention_matrix`` and ``ExactAttentionOperator``
with ``causal=True``, against the masked dense definition computed here in float64.

The definition (a decoder's self-attention): with :math:`s_{ij} = q_i\\cdot k_j/\\sqrt p` and the
causal pattern :math:`j \\le i`, the softmax matrix has rows
:math:`e^{s_{ij}} / \\sum_{l \\le i} e^{s_{il}}` for :math:`j \\le i` and 0 above the diagonal;
``A`` and ``C`` are the unmasked matrices times the lower-triangular pattern. The adjoint of a
causal operator is upper triangular (anti-causal) and is checked on its own.
"""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import gen, opposed_logits_80_qkv

import approxlab
from approxlab import attention_matrix, exact_attention
from approxlab.metrics import spectral_error, spectral_norm
from approxlab.operators import ExactAttentionOperator, softmax_attention


def _masked_definition(q, k, kind):
    """The causal matrix straight from its definition, float64, one entry formula per kind."""
    q, k = q.double(), k.double()
    n, p = q.shape[-2], q.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    logits = q @ k.transpose(-1, -2) / math.sqrt(p)
    if kind == "softmax":
        shifted = (logits - logits.masked_fill(~keep, -math.inf).amax(-1, keepdim=True)).exp() * keep
        return shifted / shifted.sum(-1, keepdim=True)
    if kind == "scores":
        return logits.exp() * keep
    distances = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
    return torch.exp(-distances / (2 * math.sqrt(p))) * keep


def _qkv(n=17, p=8, p_v=8, batch=(2, 3), seed=0, scale=1.0):
    g = gen(seed)
    q, k = (scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(*batch, n, p_v, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("p_v", [8, 5, 19])  # one kernel call; value columns padded or chunked
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_exact_attention_causal_is_the_masked_softmax(p_v, dtype, rtol):
    q, k, v = _qkv(p_v=p_v, seed=p_v)
    expected = _masked_definition(q, k, "softmax") @ v
    got = exact_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True)
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=rtol)
    assert torch.equal(got, softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True))
    # The first row attends itself only; the unmasked output differs.
    torch.testing.assert_close(got[..., 0, :].double(), v[..., 0, :], rtol=rtol, atol=rtol)
    assert not torch.allclose(exact_attention(q, k, v), expected)


@pytest.mark.parametrize("kind", ["softmax", "scores", "kernelized"])
def test_attention_matrix_causal(kind):
    q, k, _ = _qkv(seed=1)
    got = attention_matrix(q, k, kind, causal=True)
    torch.testing.assert_close(got, _masked_definition(q, k, kind), rtol=1e-12, atol=1e-15)
    assert bool((got.triu(1) == 0).all())
    if kind == "softmax":
        torch.testing.assert_close(got.sum(-1), torch.ones(2, 3, 17, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["softmax", "scores", "kernelized"])
@pytest.mark.parametrize("algorithm, block_size", [("sdpa", 1024), ("blocked", 5), ("blocked", 1024)])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 3e-6)])
def test_causal_operator_products_and_adjoint(kind, algorithm, block_size, dtype, rtol):
    """matmat, rmatmat (the anti-causal transpose) and to_dense, every kind and algorithm, value
    widths 1, p and 2p + 3 (padding and column chunks of the kernel)."""
    q, k, _ = _qkv(seed=2)
    op = ExactAttentionOperator(q.to(dtype), k.to(dtype), kind, block_size, algorithm=algorithm, causal=True)
    dense = _masked_definition(q.to(dtype), k.to(dtype), kind)
    for width in (1, 8, 19):
        x = torch.randn(2, 3, 17, width, generator=gen(width), dtype=torch.float64)
        for got, want in ((op.matmat(x.to(dtype)), dense @ x), (op.rmatmat(x.to(dtype)), dense.transpose(-1, -2) @ x)):
            error = float((got.double() - want).abs().max() / want.abs().max())
            assert got.dtype == dtype and error <= rtol, (width, error)
    torch.testing.assert_close(op.to_dense().double(), dense, rtol=rtol, atol=rtol * float(dense.abs().max()))


def test_causal_adjoint_is_not_the_causal_product_of_the_transpose():
    """The adjoint really is upper triangular: e_0^T M^T picks row 0 of M^T = column 0 of M, which
    has entries in every row i >= 0 -- a causal (lower) pattern would keep only entry 0."""
    q, k, _ = _qkv(batch=(), seed=3)
    op = ExactAttentionOperator(q, k, causal=True)
    y = torch.zeros(17, dtype=torch.float64)
    y[-1] = 1.0  # the last row of M: nonzero in every column
    column = op.rmatvec(y)
    torch.testing.assert_close(column, _masked_definition(q, k, "softmax")[-1], rtol=1e-12, atol=1e-15)
    assert bool((column != 0).all())
    first = torch.zeros(17, dtype=torch.float64)
    first[0] = 1.0  # row 0 of M has one entry, 1 on the diagonal
    torch.testing.assert_close(op.rmatvec(first), first, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", ["softmax", "kernelized"])
def test_causal_products_at_logits_80(kind):
    """Logits near +80 and -80 at once in float32: finite, and equal to the float64 definition."""
    q, k, _ = opposed_logits_80_qkv(48)
    op = ExactAttentionOperator(q, k, kind, causal=True)
    dense = _masked_definition(q, k, kind)
    x = torch.randn(2, 48, 4, generator=gen(4), dtype=torch.float64)
    for got, want in ((op.matmat(x.float()), dense @ x), (op.rmatmat(x.float()), dense.transpose(-1, -2) @ x)):
        assert bool(torch.isfinite(got).all())
        assert float((got.double() - want).abs().max() / want.abs().max()) <= 5e-5


def test_the_public_fallback_is_causal_too(monkeypatch):
    """Without the private flash op: the public SDPA (is_causal) and the masked blocked logsumexp."""
    from approxlab.operators import fused_attention as operators

    q, k, v = _qkv(seed=5)
    monkeypatch.setattr(operators, "flash_attention_cpu", lambda *args: None)
    for kind in ("softmax", "scores", "kernelized"):
        op = ExactAttentionOperator(q, k, kind, causal=True)
        dense = _masked_definition(q, k, kind)
        torch.testing.assert_close(op.matmat(v), dense @ v, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(op.rmatmat(v), dense.transpose(-1, -2) @ v, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(exact_attention(q, k, v, causal=True), _masked_definition(q, k, "softmax") @ v)


def test_metrics_on_causal_operators():
    """spectral_norm and spectral_error run matrix-free on a causal operator and agree with the
    dense 2-norm of the masked definition; .to(float64) keeps the mask."""
    q, k, v = _qkv(n=64, batch=(2,), seed=6)
    exact = ExactAttentionOperator(q.float(), k.float(), causal=True)
    assert exact.to(torch.float64).causal and "causal=True" in repr(exact)
    dense = _masked_definition(q, k, "softmax")
    torch.testing.assert_close(spectral_norm(exact.to(torch.float64), generator=gen(7)),
                               torch.linalg.matrix_norm(dense, ord=2), rtol=1e-8, atol=0)
    unmasked = attention_matrix(q, k)
    want = torch.linalg.matrix_norm(unmasked - dense, ord=2) / torch.linalg.matrix_norm(dense, ord=2)
    got = spectral_error(unmasked, exact.to(torch.float64), relative=True, generator=gen(8))
    torch.testing.assert_close(got, want, rtol=1e-8, atol=0)
    # The output error of an approximation against the causal output, in float64.
    output = exact_attention(q, k, v, causal=True)
    torch.testing.assert_close(spectral_error(output, dense @ v), torch.zeros(2, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_causal_validation():
    q, k, v = _qkv(seed=9)
    with pytest.raises(TypeError, match=r"`causal` must be a bool \(True or False\); got 1 \(int\)"):
        exact_attention(q, k, v, causal=1)
    with pytest.raises(TypeError, match=r"`causal` must be a bool \(True or False\); got 'yes'"):
        attention_matrix(q, k, causal="yes")
    message = r"`causal=True` needs self-attention .*; got 17 queries and 9 keys"
    with pytest.raises(ValueError, match=message):
        exact_attention(q, k[..., :9, :], v[..., :9, :], causal=True)
    with pytest.raises(ValueError, match=message):
        ExactAttentionOperator(q, k[..., :9, :], causal=True)
    with pytest.raises(ValueError, match=message):
        attention_matrix(q, k[..., :9, :], "scores", causal=True)


@pytest.mark.parametrize("shape", [(1, 17, 17), (17, 17)])
def test_a_causal_mask_given_as_key_mask_is_refused(shape):
    """A (1, n, n) or (n, n) lower-triangular mask passed as ``key_mask`` would broadcast as an
    extra batch dimension of the output: refused, pointing to causal=True."""
    q, k, v = (x[0, 0] for x in _qkv(seed=10))
    mask = torch.ones(17, 17, dtype=torch.bool).tril().reshape(shape)
    with pytest.raises(ValueError, match=r"`key_mask` must have shape \(\*batch, n_k\).*got \(" + ", ".join(
            str(s) for s in shape) + r"\).*pass causal=True"):
        approxlab.approximate("exact", q, k, v, num_features=1, key_mask=mask)
    # A key mask of the keys' own batch shape still works.
    keep = torch.ones(17, dtype=torch.bool)
    keep[-3:] = False
    out = approxlab.approximate("exact", q, k, v, num_features=1, key_mask=keep).output
    assert out.shape == (17, 8)
