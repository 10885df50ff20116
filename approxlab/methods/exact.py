r"""Exact softmax attention, :math:`D^{-1}AV` (Skyformer Section 4.1), as a method.

``num_features`` is accepted and ignored, so ``exact`` runs through every study grid
as the zero-error reference.
"""

from __future__ import annotations

from ..kernels import softmax_matrix
from ..operators import DenseOperator
from ._base import Approximation, method


@method("exact", target="softmax", features="ignored (reference)", randomized=False)
def exact(q, k, v, *, num_features=None, generator=None):
    """Exact softmax attention; ``q, k: (*batch, n, p)``, ``v: (*batch, n, p_v)``."""
    matrix = softmax_matrix(q, k)
    return Approximation("exact", "softmax", matrix @ v, DenseOperator(matrix))


EXACT = exact
