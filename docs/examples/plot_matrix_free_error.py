"""
Matrix-free spectral error at n = 32,768
========================================

At :math:`n = 32{,}768` one attention matrix in float64 would take 8 GiB. The output error needs
no matrix at all (the outputs are :math:`n\\times p`); the matrix error uses
:class:`~approxlab.operators.ExactAttentionOperator`, whose products go through torch's fused
attention kernel, and the approximation's own operator, in a Golub--Kahan iteration that reports
a certified lower bound and a distance bound (:doc:`/error`).
"""

import time

import torch

import approxlab
from approxlab.metrics import spectral_error
from approxlab.operators import ExactAttentionOperator
from approxlab.synthetic import synthetic_qkv

n, p = 32_768, 32
q, k, v = synthetic_qkv((), n, p, scale=1.0, generator=torch.Generator().manual_seed(0), dtype=torch.float32)

start = time.perf_counter()
exact_output = approxlab.exact_attention(q, k, v)                     # (n, p), fused kernel
approx = approxlab.approximate("nystromformer", q, k, v, num_features=64)
output_error = spectral_error(approx.output, exact_output, relative=True)
print(f"relative output error ||O~ - O||_2 / ||O||_2 = {output_error:.4f}"
      f"  ({time.perf_counter() - start:.1f} s)")

# %%
# The matrix error :math:`\|\tilde S - D^{-1}A\|_2`, never forming either matrix. At this size the
# products run in float32 (:func:`approxlab.linalg.golub_kahan` works in the operator's dtype;
# :func:`approxlab.metrics.spectral_norm` would promote to float64 at about twice the cost), so the
# relative tolerance stays well above float32's rounding: ``tol=1e-3`` (a singular value within 0.1 %).

from approxlab.linalg import golub_kahan

start = time.perf_counter()
difference = approx.operator() - ExactAttentionOperator(q, k, "softmax")
info = golub_kahan(difference, tol=1e-3, generator=torch.Generator().manual_seed(1))
print(f"||S~ - S||_2 >= {float(info.lower_bound):.5f} (certified lower bound)")
print(f"a singular value lies within {float(info.distance_bound):.1e} of it; "
      f"{info.num_matvecs} products, converged: {bool(info.converged)}"
      f"  ({time.perf_counter() - start:.1f} s)")
