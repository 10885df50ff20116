"""Linear algebra kernels: iterative and thresholded pseudo-inverses, Nyström cores,
Golub--Kahan and normal-matrix block Lanczos spectral norms, conditioning and the one
default tolerance rule (:func:`default_rtol`)."""

from .conditioning import (
    condition_number,
    default_rtol,
    default_rtol_for_shape,
    is_numerically_singular,
    singular_values,
)
from .cores import CoreFactors, nystrom_core, pinv_factors, scaled_core, stable_pinv
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
    "default_rtol_for_shape",
    "CoreFactors",
    "pinv_factors",
    "stable_pinv",
    "scaled_core",
    "nystrom_core",
]
