"""Operators against their dense references (GPyTorch's shared-check habit), and the
row-blocked ExactAttentionOperator against approxlab.kernels."""

import math

import pytest
import torch

from approxlab import kernels
from approxlab.operators import (
    AdjointOperator,
    DenseOperator,
    DiagonalOperator,
    ExactAttentionOperator,
    LinearOperator,
    ProductOperator,
    RowSparseOperator,
    SumOperator,
    aslinearoperator,
)
from approxlab.synthetic import synthetic_qkv

from _helpers import logits_80_qkv, opposed_logits_80_qkv

REFERENCE = {
    "softmax": kernels.softmax_matrix,
    "scores": kernels.score_matrix,
    "kernelized": kernels.kernelized_matrix,
}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64)


def _qk(n=23, m=17, p=8, batch=(2, 3), seed=0, scale=1.0):
    g = _gen(seed)
    q = scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*batch, m, p, generator=g, dtype=torch.float64)
    return q, k


def _cases():
    """(operator, dense reference) pairs; every operator inherits the same checks."""
    a, b = _randn(2, 5, 7, seed=1), _randn(2, 7, 4, seed=2)
    d = _randn(2, 5, seed=3)
    q, k = _qk(n=5, m=7, batch=(2,), seed=4)
    return {
        "dense": (DenseOperator(a), a),
        "diagonal": (DiagonalOperator(d), torch.diag_embed(d)),
        "product": (ProductOperator(a, b), a @ b),
        "sum": (SumOperator([a, DenseOperator(2 * a)], [1.0, -0.5]), a - a),
        "difference": (DenseOperator(a) - 3.0 * DenseOperator(a), -2 * a),
        "adjoint": (DenseOperator(a).T, a.transpose(-1, -2)),
        "exact-softmax": (ExactAttentionOperator(q, k, block_size=2), kernels.softmax_matrix(q, k)),
        "exact-kernelized": (ExactAttentionOperator(q, k, "kernelized", 3), kernels.kernelized_matrix(q, k)),
        "exact-scores": (ExactAttentionOperator(q, k, "scores", 4), kernels.score_matrix(q, k)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_operator_matches_dense_reference(name):
    """matmat, rmatmat, matvec, rmatvec, to_dense and the adjoint identity <Ax, y> = <x, A^T y>."""
    op, dense = _cases()[name]
    assert isinstance(op, LinearOperator)
    assert tuple(op.shape) == tuple(dense.shape)
    n, m = dense.shape[-2:]
    x, y = _randn(*dense.shape[:-2], m, 3, seed=10), _randn(*dense.shape[:-2], n, 3, seed=11)
    torch.testing.assert_close(op.matmat(x), dense @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.rmatmat(y), dense.transpose(-1, -2) @ y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.matvec(x[..., 0]), (dense @ x)[..., 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.rmatvec(y[..., 0]), (dense.transpose(-1, -2) @ y)[..., 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.to_dense(), dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.T.to_dense(), dense.transpose(-1, -2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((op.matmat(x) * y).sum(), (x * op.rmatmat(y)).sum(), rtol=1e-12, atol=1e-12)
    op32 = op.to(torch.float32)
    assert op32.dtype == torch.float32
    torch.testing.assert_close(op32.matmat(x.float()), (dense @ x).float(), rtol=1e-4, atol=1e-4)


def test_a_products_dense_matrix_starts_from_its_last_factors():
    """to_dense of a product applies the other factors to the last one's dense matrix: a sparse last factor is
    formed from its entries, not multiplied by an m x m identity (which costs O(n T m) for a row-sparse one)."""
    columns = torch.randint(6, (7, 3), generator=_gen(5))
    sparse = RowSparseOperator(columns, _randn(7, 3, seed=6), 6)

    def refuse(x):
        raise AssertionError("the last factor's product was used to form the dense matrix")

    sparse._matmat = refuse
    a, c = _randn(2, 5, 4, seed=7), _randn(4, 7, seed=8)
    for factors, dense in (((a, c, sparse), a @ c @ sparse.to_dense()), ((c, sparse), c @ sparse.to_dense())):
        product = ProductOperator(*factors)
        found = product.to_dense()
        assert found.shape == dense.shape == product.shape
        torch.testing.assert_close(found, dense, rtol=1e-12, atol=1e-12)


def test_operator_shape_errors():
    op = DenseOperator(_randn(4, 3))
    with pytest.raises(ValueError, match=r"`x` must have shape \(\*batch, 3, k\)"):
        op.matmat(_randn(4, 1))
    with pytest.raises(ValueError, match=r"`y` must have shape \(\*batch, 4, k\)"):
        op.rmatmat(_randn(3, 1))
    with pytest.raises(TypeError, match=r"expected a LinearOperator or torch.Tensor; got list"):
        aslinearoperator([1.0])
    assert isinstance(AdjointOperator(op), LinearOperator)


@pytest.mark.parametrize("kind", ["softmax", "scores", "kernelized"])
@pytest.mark.parametrize("block_size", [1, 5, 8, 24, 1000])
def test_exact_attention_operator_blocks(kind, block_size):
    """Block sizes that divide n = 24 (1, 8, 24), that do not (5), and larger than n (1000):
    every product equals the dense matrix of approxlab.kernels."""
    q, k = _qk(n=24, m=19, seed=block_size)
    dense = REFERENCE[kind](q, k)
    op = ExactAttentionOperator(q, k, kind=kind, block_size=block_size)
    assert op.shape == (2, 3, 24, 19)
    x, y = _randn(2, 3, 19, 4, seed=1), _randn(2, 3, 24, 4, seed=2)
    torch.testing.assert_close(op.to_dense(), dense, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(op.matmat(x), dense @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.rmatmat(y), dense.transpose(-1, -2) @ y, rtol=1e-12, atol=1e-12)
    # the base class's to_dense (m products with unit vectors) agrees with the blocked one
    torch.testing.assert_close(LinearOperator.to_dense(op), dense, rtol=1e-12, atol=1e-12)


def test_exact_attention_float32_logits_80():
    """Issue: float32 logits reaching +-80 give finite softmax / kernelized operators equal to the
    float64 reference; kind='scores' refuses to return inf (OverflowError names the fix)."""
    p = 16
    g = _gen(5)
    direction = torch.randn(p, generator=g, dtype=torch.float64)
    direction = direction / direction.norm()
    # logits q_i . k_j / sqrt(p) = +-80 for aligned / anti-aligned rows
    scale = math.sqrt(80 * math.sqrt(p))
    q = torch.stack([scale * direction, -scale * direction, torch.zeros(p, dtype=torch.float64)])
    k = torch.stack([scale * direction, torch.randn(p, generator=g, dtype=torch.float64)])
    assert float(kernels.scaled_logits(q, k).abs().max()) == pytest.approx(80.0)
    x = torch.randn(2, 3, generator=g, dtype=torch.float64)
    for kind in ("softmax", "kernelized"):
        op32 = ExactAttentionOperator(q.float(), k.float(), kind=kind, block_size=2)
        out = op32.matmat(x.float())
        assert bool(torch.isfinite(out).all())
        reference = REFERENCE[kind](q.float().double(), k.float().double()) @ x
        torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-5)
    # exp(80) ~ 5.5e34 still fits float32 (log finfo.max = 88.7); logits of 95 do not.
    q95 = q * math.sqrt(95 / 80)
    k95 = k * math.sqrt(95 / 80)
    op32 = ExactAttentionOperator(q95.float(), k95.float(), kind="scores", block_size=2, algorithm="blocked")
    with pytest.raises(OverflowError, match=r"kind='scores'\) overflows torch.float32.*rows 0:2 is 95.0"):
        op32.matmat(x.float())
    with pytest.raises(OverflowError, match=r"overflows"):
        op32.rmatmat(torch.ones(3, 1))
    sdpa32 = ExactAttentionOperator(q95.float(), k95.float(), kind="scores")
    with pytest.raises(OverflowError, match=r"kind='scores'\) overflows torch.float32: the largest row sum of A is exp\(95"):
        sdpa32.matmat(x.float())
    with pytest.raises(OverflowError, match=r"largest column sum of A is exp\(95"):
        sdpa32.rmatmat(torch.ones(3, 1))
    finite = op32.to(torch.float64).matmat(x)  # float64 range exp(709) suffices
    torch.testing.assert_close(finite, kernels.score_matrix(q95.float().double(), k95.float().double()) @ x)
    for kind in ("softmax", "kernelized"):  # and the log-domain kinds stay finite at 95 too
        assert bool(torch.isfinite(ExactAttentionOperator(q95.float(), k95.float(), kind).to_dense()).all())


def test_exact_attention_to_recomputes_in_the_new_dtype():
    """`to(float64)` recomputes from q, k (cast), not a cast of the float32 matrix: it equals the
    float64 reference of the rounded inputs to float64 precision."""
    q, k, _ = synthetic_qkv((2,), 16, 8, scale=1.5, generator=_gen(6), dtype=torch.float32)
    op = ExactAttentionOperator(q, k, "softmax", 5).to(torch.float64)
    assert op.dtype == torch.float64 and isinstance(op, ExactAttentionOperator)
    torch.testing.assert_close(op.to_dense(), kernels.softmax_matrix(q.double(), k.double()), rtol=1e-14, atol=1e-16)


def test_exact_attention_memory_is_row_blocked():
    """The n x m matrix is never materialised by matmat/rmatmat: each block is (block, m)."""
    q, k = _qk(n=10, m=12, batch=(), seed=7)
    seen = []

    class Spy(ExactAttentionOperator):
        def _block(self, start, stop):
            block = super()._block(start, stop)
            seen.append(tuple(block.shape))
            return block

    op = Spy(q, k, block_size=4, algorithm="blocked")
    op.matmat(_randn(12, 2))
    op.rmatmat(_randn(10, 2))
    assert seen == [(4, 12), (4, 12), (2, 12)] * 2


def test_exact_attention_validation():
    q, k = _qk()
    with pytest.raises(ValueError, match=r"`kind` must be one of \['kernelized', 'scores', 'softmax'\]; got 'yoso'"):
        ExactAttentionOperator(q, k, kind="yoso")
    with pytest.raises(ValueError, match=r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"):
        ExactAttentionOperator(q, k, block_size=0)
    with pytest.raises(TypeError, match=r"`block_size` must be an integer; got 2.5"):
        ExactAttentionOperator(q, k, block_size=2.5)
    with pytest.raises(ValueError, match=r"`q` and `k` must share the feature dimension p"):
        ExactAttentionOperator(q, k[..., :3])
    with pytest.raises(ValueError, match=r"`q` must be finite"):
        ExactAttentionOperator(q * float("nan"), k)
    with pytest.raises(TypeError, match=r"`k` must be a torch.Tensor; got list"):
        ExactAttentionOperator(q, [1.0])
    with pytest.raises(ValueError, match=r"`algorithm` must be one of \['blocked', 'sdpa'\]; got 'dense'"):
        ExactAttentionOperator(q, k, algorithm="dense")


# -- the fused-kernel (SDPA) products against the blocked reference ------------------------


def _sdpa_vs_blocked(q, k, kind, widths, rtol):
    """matmat/rmatmat of algorithm='sdpa' equal the blocked reference, relative to the result's size."""
    fast = ExactAttentionOperator(q, k, kind)
    reference = ExactAttentionOperator(q.double(), k.double(), kind, block_size=7, algorithm="blocked")
    n, m = fast.shape[-2:]
    for width in widths:  # below, at and above the head size p (padding and column chunks)
        x = _randn(*fast.batch_shape, m, width, seed=width)
        y = _randn(*fast.batch_shape, n, width, seed=width + 100)
        for got, want in ((fast.matmat(x.to(q.dtype)), reference.matmat(x)),
                          (fast.rmatmat(y.to(q.dtype)), reference.rmatmat(y))):
            assert got.dtype == q.dtype
            error = float((got.double() - want).abs().max() / want.abs().max())
            assert error <= rtol, (kind, width, error)


@pytest.mark.parametrize("kind", ["softmax", "scores", "kernelized"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-13), (torch.float32, 2e-6)])
def test_sdpa_products_match_blocked(kind, dtype, rtol):
    """Both algorithms, float32 and float64, n != m, batch (2, 3), value widths 1, p, 2p + 3."""
    q, k = _qk(n=37, m=29, p=8, seed=11)
    _sdpa_vs_blocked(q.to(dtype), k.to(dtype), kind, widths=(1, 8, 19), rtol=rtol)


@pytest.mark.parametrize("kind", ["softmax", "kernelized"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 5e-5)])
def test_sdpa_products_at_logits_80(kind, dtype, rtol):
    """Logits near +80 and -80 at once (the harshest case for the log-domain rescaling):
    finite, and equal to the float64 blocked reference of the same rounded inputs. In float32 a
    logit of 80 carries a relative rounding of 80 * eps = 5e-6 into exp; the float32 blocked
    algorithm is off by 1.6e-5 here, the fused kernel by 1.9e-5."""
    q, k, _ = opposed_logits_80_qkv(64)
    _sdpa_vs_blocked(q.to(dtype), k.to(dtype), kind, widths=(3, 16), rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sdpa_scores_at_logits_80(dtype):
    """A = exp(logits) itself at logits up to 80 (5.5e34 fits float32): sdpa equals blocked."""
    q, k, _ = logits_80_qkv(n=24)
    _sdpa_vs_blocked(q.to(dtype), k.to(dtype), "scores", widths=(2, 16), rtol=1e-5 if dtype == torch.float32 else 1e-12)


def test_sdpa_broadcasts_and_caches_the_row_normalisers():
    """x with fewer batch dims broadcasts; the adjoint's row log-sum-exps are computed once."""
    q, k = _qk(n=12, m=12, p=4, batch=(3,), seed=12)
    op = ExactAttentionOperator(q, k)
    dense = kernels.softmax_matrix(q, k)
    x = _randn(12, 2, seed=13)
    torch.testing.assert_close(op.matmat(x), dense @ x, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(op.rmatmat(x), dense.transpose(-1, -2) @ x, rtol=1e-12, atol=1e-14)
    cached = op._row_lse[1]
    op.rmatmat(x)
    assert op._row_lse[1] is cached
    torch.testing.assert_close(cached.reshape(3, 12), torch.logsumexp(kernels.scaled_logits(q, k), -1))


def test_softmax_attention_and_exact_attention_use_the_kernel():
    """approxlab.exact_attention = operators.softmax_attention = softmax(QK^T/sqrt p) V, any p_v."""
    from approxlab import exact_attention
    from approxlab.operators import softmax_attention

    q, k = _qk(n=9, m=11, p=4, batch=(2,), seed=14)
    for width in (4, 3, 9):
        v = _randn(2, 11, width, seed=width)
        expected = kernels.softmax_matrix(q, k) @ v
        torch.testing.assert_close(softmax_attention(q, k, v), expected, rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(exact_attention(q, k, v), expected, rtol=1e-13, atol=1e-15)


def test_the_public_fallback_matches_the_flash_kernel(monkeypatch):
    """Without the private op (another torch, another device) the public SDPA and a blocked
    logsumexp give the same products."""
    from approxlab.operators import fused_attention as operators

    q, k = _qk(n=20, m=16, p=4, batch=(2,), seed=15)
    x, y = _randn(2, 16, 3, seed=16), _randn(2, 20, 3, seed=17)
    results = {}
    for name in ("flash", "public"):
        if name == "public":
            monkeypatch.setattr(operators, "flash_attention_cpu", lambda *args: None)
        for kind in ("softmax", "scores", "kernelized"):
            op = ExactAttentionOperator(q, k, kind)
            results[name, kind] = (op.matmat(x), op.rmatmat(y))
    for kind in ("softmax", "scores", "kernelized"):
        for a, b in zip(results["flash", kind], results["public", kind]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_block_lanczos_on_the_sdpa_operator_matches_dense():
    """normal_block_lanczos(exact_operator=ExactAttentionOperator) (two kernel calls per pass)
    gives the dense float64 spectral error, like the fused blocked pass."""
    from approxlab import approximate
    from approxlab.linalg.normal_lanczos import normal_block_lanczos

    q, k, v = synthetic_qkv((1,), 256, 16, scale=0.8, generator=_gen(20), dtype=torch.float32)
    approx = approximate("nystromformer", q, k, v, num_features=16, generator=_gen(21)).operator()
    dense = torch.linalg.matrix_norm(approx.to(torch.float64).to_dense() - kernels.softmax_matrix(q.double(), k.double()), ord=2)
    result = normal_block_lanczos(q, k, approx, block=16, exact_operator=ExactAttentionOperator(q, k),
                                  generator=_gen(22))
    torch.testing.assert_close(result.estimate, dense, rtol=1e-5, atol=0)
