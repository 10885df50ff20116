"""Linear algebra kernels: iterative pseudo-inverse, Golub--Kahan and normal-matrix block
Lanczos spectral norms, conditioning."""

from .conditioning import condition_number, default_rtol, is_numerically_singular, singular_values
from .lanczos import SpectralNormEstimate, golub_kahan
from .normal_lanczos import BlockLanczosResult, fused_normal_pass, normal_block_lanczos
from .pinv import PinvResult, iterative_pinv

__all__ = [
    "PinvResult",
    "iterative_pinv",
    "SpectralNormEstimate",
    "golub_kahan",
    "BlockLanczosResult",
    "normal_block_lanczos",
    "fused_normal_pass",
    "condition_number",
    "is_numerically_singular",
    "singular_values",
    "default_rtol",
]
