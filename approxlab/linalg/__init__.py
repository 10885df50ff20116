"""Linear algebra kernels: iterative pseudo-inverse, Golub--Kahan spectral norms, conditioning."""

from .pinv import PinvResult, iterative_pinv

__all__ = ["PinvResult", "iterative_pinv"]
