r"""Every metric of the spectral-error studies, in one place.

* spectral norms and errors: :func:`spectral_norm`, :func:`spectral_error` (dense: exact SVD;
  operators: Golub--Kahan bidiagonalisation, :func:`approxlab.linalg.golub_kahan`);
* conditioning: :func:`condition_number` (``inf`` when numerically singular),
  :func:`is_numerically_singular`;
* the singular-value study (Skyformer Appendix B): :func:`stable_rank`,
  :func:`numerical_rank` (:func:`numerical_rank_lu`: the same count from an LU factorisation, for
  square matrices with few small singular values), :func:`effective_rank`,
  :func:`singular_value_decay_rate`;
* Loewner order: :func:`loewner_min_eig`;
* ridge leverage (Skyformer Theorem 2), re-exported from :mod:`approxlab.leverage`:
  ``ridge_leverage_scores``, ``statistical_dimension``, ``coherence``,
  ``approximate_ridge_leverage_scores``.

Conventions
-----------
Inputs are batched ``(*batch, n, m)``; computations are in float64. **One return rule** for
every scalar metric here and in :mod:`approxlab.leverage` (that of NumPy's ``linalg.cond`` and
``matrix_rank``): for a single matrix ``(n, m)`` a Python scalar -- ``float``, ``int`` for
:func:`numerical_rank`, ``bool`` for :func:`is_numerically_singular`; for a batch a tensor of
shape ``(*batch,)`` -- float64, int64 or bool. Per-row quantities (leverage scores) are tensors
``(*batch, N)``; ``return_info=True`` returns the :class:`SpectralNormEstimate` of tensors.

Scale: the scale-invariant metrics (condition number, ranks, decay rate, relative errors) are
computed from the input balanced by a power of two (:mod:`approxlab.linalg.scaling`), so
``1e-310 * M`` and ``1e308 * M`` give the same answer as ``M``; a scale-dependent result
(a norm, an error, :math:`\lambda_{\min}`) that lies beyond the float64 range is an
``OverflowError``, never ``inf`` presented as a value.

The norms, errors and :func:`loewner_min_eig` live in :mod:`approxlab.metrics.norms`, the
spectrum measures in :mod:`approxlab.metrics.spectrum`.
"""

from ..leverage import (
    approximate_ridge_leverage_scores,
    coherence,
    ridge_leverage_scores,
    statistical_dimension,
)
from ..linalg.conditioning import condition_number, is_numerically_singular
from ..linalg.lanczos import SpectralNormEstimate
from .norms import loewner_min_eig, spectral_error, spectral_norm
from .spectrum import (effective_rank, numerical_rank, numerical_rank_lu, singular_value_decay_rate, spectrum_measures,
                       stable_rank)

__all__ = [
    "spectral_norm",
    "spectral_error",
    "SpectralNormEstimate",
    "condition_number",
    "is_numerically_singular",
    "stable_rank",
    "numerical_rank",
    "numerical_rank_lu",
    "effective_rank",
    "singular_value_decay_rate",
    "spectrum_measures",
    "loewner_min_eig",
    "ridge_leverage_scores",
    "statistical_dimension",
    "coherence",
    "approximate_ridge_leverage_scores",
]
