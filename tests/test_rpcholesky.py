"""RPCholesky (Chen, Epperly, Tropp and Webber, Algorithm 1): its factor is the Nyström approximation
of its pivots, it reads d columns, its trace error obeys the paper's bound, and the three methods
that sample landmark columns accept sampling="rpcholesky"."""

import math

import pytest
import torch

import approxlab
from approxlab import sketch
from approxlab.kernels import kernelized_matrix
from approxlab.synthetic import psd_matrix, synthetic_qkv
from _helpers import gen


def test_factor_is_the_nystrom_approximation_of_the_pivots_from_d_columns():
    kernel = psd_matrix(torch.exp(-0.5 * torch.arange(30.0, dtype=torch.float64)), generator=gen(0)).expand(3, 30, 30)
    calls = []

    def column(pivots):
        calls.append(pivots.clone())
        return torch.gather(kernel, -1, pivots[:, None, None].expand(3, 30, 1)).squeeze(-1)

    columns, factor = sketch.rpcholesky_columns(kernel.diagonal(dim1=-2, dim2=-1), column, 8, generator=gen(1),
                                                return_factor=True)
    assert len(calls) == 8 and torch.equal(torch.stack(calls, -1), columns)  # d columns, nothing else
    assert all(len(set(row.tolist())) == 8 for row in columns)
    torch.testing.assert_close(factor @ factor.mT, sketch.nystrom(kernel, columns), rtol=1e-9, atol=1e-12)
    uniforms = torch.rand(3, 8, generator=gen(1), dtype=torch.float64)
    again = sketch.rpcholesky_columns(kernel.diagonal(dim1=-2, dim2=-1), column, 8, uniforms=uniforms)
    assert torch.equal(again, columns)  # the uniforms are the draw
    prefix = sketch.rpcholesky_columns(kernel.diagonal(dim1=-2, dim2=-1), column, 5, uniforms=uniforms[:, :5])
    assert torch.equal(prefix, columns[:, :5])


def test_pivot_probabilities_are_the_residual_diagonal():
    """Each pivot is drawn with probability proportional to the residual diagonal: on a diagonal
    kernel the first pivot is i with probability A_ii / tr A (4000 draws, 4.5 standard errors)."""
    diagonal = torch.tensor([4.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64).expand(4000, 5)
    first = sketch.rpcholesky_columns(diagonal, lambda s: torch.nn.functional.one_hot(s, 5).double() * diagonal, 1,
                                      generator=gen(2))[:, 0]
    frequencies = torch.bincount(first, minlength=5).double() / 4000
    expected = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0], dtype=torch.float64)
    assert bool(((frequencies - expected).abs() <= 4.5 * (expected * (1 - expected) / 4000).sqrt() + 1e-12).all())


def test_theorem_trace_error_bound():
    """Chen, Epperly, Tropp and Webber's trace-norm guarantee: with k >= r/eps + r log(1/(eps eta)),
    eta = tr(A - [[A]]_r) / tr A, E tr(A - A^) <= (1 + eps) tr(A - [[A]]_r). On a coherent kernel (a
    geometric diagonal, slightly coupled) where uniform pivots would miss the large entries: the mean
    over 300 draws (batch elements) stays below the bound."""
    n, r, eps = 40, 3, 1.0
    eigenvalues = 0.5 ** torch.arange(n, dtype=torch.float64)
    coupling = torch.randn(n, n, generator=gen(3), dtype=torch.float64) / n
    kernel = torch.diag(eigenvalues) + 1e-3 * coupling @ coupling.T
    spectrum = torch.linalg.eigvalsh(kernel).flip(-1)
    tail = float(spectrum[r:].sum())
    eta = tail / float(spectrum.sum())
    k = math.ceil(r / eps + r * math.log(1 / (eps * eta)))
    batch = kernel.expand(300, n, n)
    columns = sketch.rpcholesky_columns(batch.diagonal(dim1=-2, dim2=-1),
                                        lambda s: torch.gather(batch, -1, s[:, None, None].expand(300, n, 1))[..., 0],
                                        k, generator=gen(4))
    errors = (batch - sketch.nystrom(batch, columns)).diagonal(dim1=-2, dim2=-1).sum(-1)
    assert float(errors.mean()) <= (1 + eps) * tail, (float(errors.mean()), (1 + eps) * tail)


@pytest.mark.parametrize("name, full", [("skyformer", 64), ("skyformer-softmax", 64), ("nystrom", 32)])
def test_methods_with_rpcholesky_landmarks(name, full):
    """sampling="rpcholesky" on the kernel each method samples: every column (distinct pivots) is the
    method's exact limit; fewer columns come from a draw that reproduces the generator bit for bit."""
    q, k, v = synthetic_qkv((2,), 32, 8, generator=gen(5))
    exact = kernelized_matrix(q, k) @ v if name == "skyformer" else approxlab.exact_attention(q, k, v)
    result = approxlab.approximate(name, q, k, v, num_features=full, sampling="rpcholesky", generator=gen(6))
    assert all(len(set(row.tolist())) == full for row in result.info["columns"])
    torch.testing.assert_close(result.output, exact, rtol=1e-8, atol=1e-10)
    drawn = approxlab.methods.draw(name, q, k, num_features=8, sampling="rpcholesky", generator=gen(7))
    assert set(drawn) == {"pivot_uniforms"}
    by_draw = approxlab.approximate(name, q, k, v, num_features=8, sampling="rpcholesky", draw=drawn)
    by_generator = approxlab.approximate(name, q, k, v, num_features=8, sampling="rpcholesky", generator=gen(7))
    assert torch.equal(by_draw.output, by_generator.output)
    assert torch.equal(by_draw.info["columns"], by_generator.info["columns"])


def test_skyformer_softmax_pivots_on_the_score_completion_and_skip_padding():
    """skyformer-softmax's kernel is the completion of the scores, diag exp(|x|^2 / sqrt p): with one row
    of much larger norm the first pivot is that row; with a key mask, padded rows are never pivots."""
    q, k, v = synthetic_qkv((1,), 16, 4, generator=gen(8))
    k[0, 3] *= 6
    uniforms = torch.full((1, 1), 0.5, dtype=torch.float64)
    first = approxlab.methods.skyformer.rpcholesky_completion_columns(q, k, uniforms, normalized=True)
    assert int(first[0, 0]) == 16 + 3
    mask = torch.ones(1, 16, dtype=torch.bool)
    mask[0, 10:] = False
    result = approxlab.approximate("skyformer-softmax", q, k, v, num_features=12, sampling="rpcholesky",
                                   key_mask=mask, generator=gen(9))
    rows = torch.cat([mask, mask], -1)[0]
    assert bool(rows[result.info["columns"][0]].all())


def test_validation_names_the_parameter():
    diagonal = torch.ones(5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`d` must be an integer with 1 <= d <= 5; got 6"):
        sketch.rpcholesky_columns(diagonal, lambda s: diagonal, 6)
    with pytest.raises(ValueError, match=r"`uniforms` must lie in \[0, 1\); got values in \[0.0, 1.0\]"):
        sketch.rpcholesky_columns(diagonal, lambda s: diagonal, 2, uniforms=torch.tensor([0.0, 1.0],
                                                                                          dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`uniforms` must have shape \(\*batch, d\) = \(3,\); got \(2,\)"):
        sketch.rpcholesky_columns(diagonal, lambda s: diagonal, 3, uniforms=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"`column` must be a function"):
        sketch.rpcholesky_columns(diagonal, diagonal, 3)
