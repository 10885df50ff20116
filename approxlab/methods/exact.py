r"""Exact softmax attention, :math:`D^{-1}AV` (Skyformer Section 4.1), as a method.

``num_features`` is accepted and ignored, so ``exact`` runs through every study grid
as the zero-error reference.
"""

from __future__ import annotations

from ..operators import DenseOperator
from ._base import Approximation, method
from ._masking import check_key_mask, masked_softmax_matrix


@method("exact", target="softmax", features="ignored (reference)", randomized=False)
def exact(q, k, v, *, num_features=None, generator=None, key_mask=None):
    """Exact softmax attention; ``q, k: (*batch, n, p)``, ``v: (*batch, n, p_v)``.

    ``key_mask`` ``(*batch, n_k)`` bool (True on keys to attend): softmax over kept keys only.
    """
    matrix = masked_softmax_matrix(q, k, check_key_mask(key_mask, k))
    return Approximation("exact", "softmax", matrix @ v, DenseOperator(matrix))


EXACT = exact
