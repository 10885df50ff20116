"""approxlab: spectral-error studies of attention approximations.

Public API::

    approxlab.exact_attention(q, k, v)
    approxlab.attention_matrix(q, k, kind)
    approxlab.approximate(method, q, k, v, *, num_features, generator=None, **options)
    approxlab.methods.available()
    approxlab.metrics, approxlab.linalg, approxlab.sketch, approxlab.errors
"""

from . import errors, methods
from .attention import approximate, attention_matrix, exact_attention

__all__ = ["approximate", "attention_matrix", "exact_attention", "errors", "methods"]
__version__ = "0.1.0"
