r"""Ridge leverage scores, statistical dimension and coherence (Skyformer Theorem 2).

For a symmetric PSD ``K: (*batch, N, N)`` and a ridge :math:`\lambda > 0`:

* ridge leverage scores :math:`\ell_i = [K(K+\lambda I)^{-1}]_{ii} \in [0, 1)`;
* statistical dimension :math:`d_{stat} = \operatorname{Tr} K(K+\lambda I)^{-1} = \sum_i \ell_i`;
* coherence :math:`\beta = \min_i d_{stat}/(N\ell_i) \in (0, 1]`, the largest constant with
  :math:`\beta \le d_{stat}/(N\ell_i)` for all ``i`` (Theorem 2 of Skyformer, where
  :math:`N = 2n` for the completion :math:`\bar C`).

Theorem 2 with Lemma C.2's constant says :math:`d \ge \tfrac{28}{3}\,\tfrac{2 d_{stat}}{\beta}\log\tfrac{2N}{\delta}`
uniform columns give :math:`\tilde{\bar C} \preceq \bar C \preceq \tilde{\bar C} + \lambda I` with
probability :math:`1-\delta`.

Exact quantities are computed from an eigendecomposition in float64 (a float32 ``eigh``
loses the small eigenvalues that decide :math:`\ell_i`). The scalar metrics
(:func:`statistical_dimension`, :func:`coherence`) follow the rule of :mod:`approxlab.metrics`:
a ``float`` for one matrix, a float64 tensor ``(*batch,)`` for a batch; the per-row leverage
scores are tensors ``(*batch, N)`` in ``K.dtype`` (they are sampling probabilities for the
methods). ``K`` and :math:`\lambda` are scaled together by a power of two when ``K`` is near
the ends of the float range (the quantities depend only on :math:`K/\lambda`), so
``1e-310 * K`` with ``1e-310 * lam`` gives the same answers as ``K`` with ``lam``.

The quantities of a matrix live in :mod:`approxlab.leverage.dense`, the matrix-free estimates at any
N (:func:`completion_operator`, :func:`estimate_ridge_quantities`) in :mod:`approxlab.leverage.matrix_free`.

References
----------
Chen et al. (2021), Skyformer, Theorem 2 and Appendix C-D. Alaoui & Mahoney (2015), "Fast
randomized kernel ridge regression with statistical guarantees", NeurIPS. Musco & Musco
(2017), "Recursive sampling for the Nyström method", NeurIPS.
"""

from .dense import approximate_ridge_leverage_scores, coherence, ridge_leverage_scores, statistical_dimension
from .matrix_free import RidgeEstimate, completion_operator, estimate_ridge_quantities

__all__ = [
    "ridge_leverage_scores",
    "statistical_dimension",
    "coherence",
    "approximate_ridge_leverage_scores",
    "completion_operator",
    "RidgeEstimate",
    "estimate_ridge_quantities",
]
