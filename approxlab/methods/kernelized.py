r"""Kernelized attention :math:`CV`, :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3)).

Exact (no approximation): the target that ``skyformer`` approximates.
``num_features`` is accepted and ignored.
"""

from __future__ import annotations

from ..kernels import kernelized_matrix
from ..operators import DenseOperator
from ._base import Approximation, method
from ._masking import check_key_mask, mask_columns


@method("kernelized", target="kernelized", features="ignored (exact)", randomized=False)
def kernelized(q, k, v, *, num_features=None, generator=None, key_mask=None):
    """Kernelized attention; ``q, k: (*batch, n, p)``, ``v: (*batch, n, p_v)``.

    ``key_mask`` ``(*batch, n_k)`` bool (True on keys to attend): masked keys' columns are 0.
    """
    matrix = mask_columns(kernelized_matrix(q, k), check_key_mask(key_mask, k))
    return Approximation("kernelized", "kernelized", matrix @ v, DenseOperator(matrix))


KERNELIZED = kernelized
