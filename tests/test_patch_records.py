"""approxlab.patching.records.attention_measures against the definition, computed here in one piece.

The function works one sequence and head at a time in blocks of query rows; the reference below forms the
whole ``(S, H, r, m)`` exact attention matrix and its masks at once, as the measures' definitions read. They
agree to 1e-12 on random queries and keys, causal or not, with and without a key mask, for sparse and dense
approximate weights, over rows starting at 0 or later, given for those rows or for every row, and with blocks
of one row, a few rows and the whole matrix.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from approxlab.patching import records
from approxlab.patching.records import ATTENTION_MEASURES, attention_measures


class Weights:
    """A stand-in for an ``Approximation``: ``matrix()`` returns the given weights or raises."""

    def __init__(self, matrix):
        self._matrix = matrix

    def matrix(self):
        if self._matrix is None:
            raise NotImplementedError("no matrix")
        return self._matrix


def reference(approx, q, k, rows, causal, key_mask):
    """Total variation and kept mass straight from their definitions, on (S, H, r, m) arrays."""
    first, stop = rows
    q, k = q.to(torch.float64), k.to(torch.float64)
    approx = approx.to(torch.float64)
    if approx.shape[-2] != stop - first:
        approx = approx[..., first:stop, :]
    m = k.shape[-2]
    visible = torch.ones(q.shape[0], q.shape[1], stop - first, m, dtype=torch.bool)
    if causal:
        visible = visible & torch.ones(m, m, dtype=torch.bool).tril()[first:stop]
    if key_mask is not None:
        visible = visible & key_mask[:, :, None, :]
    scores = q[..., first:stop, :] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    exact = torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
    total_variation = 0.5 * (approx - exact).abs().sum(dim=-1).mean(dim=-1)
    kept = (approx != 0) & visible
    mass = torch.where(kept, exact, 0.0).sum(dim=-1).mean(dim=-1)
    sparse = (visible & ~kept).flatten(-2).any(dim=-1)
    return {"total_variation": total_variation, "kept_mass": torch.where(sparse, mass, math.nan)}


CASES = list(itertools.product([False, True], [False, True], [False, True], [0, 5], [False, True]))


@pytest.mark.parametrize("causal, masked, sparse, first, every_row", CASES)
@pytest.mark.parametrize("block_rows", [1, 3, 1000])
def test_measures_match_their_definition(monkeypatch, causal, masked, sparse, first, every_row, block_rows):
    generator = torch.Generator().manual_seed(hash((causal, masked, sparse, first, every_row)) % 2**31)
    sequences, heads, m, p = 2, 3, 17, 8
    monkeypatch.setattr(records, "_BLOCK_ELEMENTS", block_rows * m)
    q = 2 * torch.randn(sequences, heads, m, p, generator=generator)
    k = 2 * torch.randn(sequences, heads, m, p, generator=generator)
    key_mask = None
    if masked:
        key_mask = torch.rand(sequences, 1, m, generator=generator) > 0.3
        key_mask[..., 0] = True  # every row sees a key
    rows = (first, m)
    approx = torch.softmax(torch.randn(sequences, heads, m if every_row else m - first, m, generator=generator),
                           dim=-1)  # some weight on keys a causal row cannot see, as a non-causal approximant
    if sparse:
        approx = approx * (torch.rand(approx.shape, generator=generator) > 0.5)
    found = attention_measures(Weights(approx), q, k, rows, causal, key_mask)
    expected = reference(approx, q, k, rows, causal, key_mask)
    assert found.keys() == expected.keys() == set(ATTENTION_MEASURES)
    for name in ATTENTION_MEASURES:
        assert found[name].dtype == torch.float64 and found[name].shape == (sequences, heads)
        torch.testing.assert_close(found[name], expected[name], rtol=1e-12, atol=1e-12, equal_nan=True)
    assert bool(found["kept_mass"].isnan().all()) is not sparse  # a dense matrix keeps every visible key
    assert bool(found["total_variation"].gt(0).all())


def test_no_matrix_or_another_shape_gives_nan():
    q = k = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(0))
    for result in (Weights(None), Weights(torch.ones(1, 2, 4, 6) / 6), Weights(torch.ones(1, 2, 6, 5) / 5)):
        found = attention_measures(result, q, k, (1, 6), True)
        assert all(bool(found[name].isnan().all()) and found[name].shape == (1, 2) for name in ATTENTION_MEASURES)


def test_exact_weights_have_no_variation():
    q = k = torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = torch.softmax((q @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(),
                                                                       -math.inf), dim=-1)
    found = attention_measures(Weights(exact[..., 3:, :]), q, k, (3, 9), True)
    assert float(found["total_variation"].abs().max()) < 1e-15
    assert bool(found["kept_mass"].isnan().all())  # nothing visible dropped: not a sparse matrix
