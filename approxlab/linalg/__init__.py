"""Linear algebra kernels: iterative pseudo-inverse, Golub--Kahan spectral norms, conditioning."""

from .conditioning import condition_number, default_rtol, is_numerically_singular, singular_values
from .lanczos import SpectralNormEstimate, golub_kahan
from .pinv import PinvResult, iterative_pinv

__all__ = [
    "PinvResult",
    "iterative_pinv",
    "SpectralNormEstimate",
    "golub_kahan",
    "condition_number",
    "is_numerically_singular",
    "singular_values",
    "default_rtol",
]
