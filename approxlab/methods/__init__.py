"""Attention approximations, one per file, behind one registry.

``num_features`` is one budget with one meaning per method:

===================  ==========================================================
method               ``num_features`` counts
===================  ==========================================================
exact, kernelized    ignored (exact references)
skyformer            sampled columns ``d`` of the 2n x 2n completion (Eq. (5))
skyformer-softmax    sampled columns ``d`` of the completion of [Q; K]
nystrom              sampled columns (landmarks) ``d``
nystromformer        segment-means landmarks ``m``
spectral-shifting    segment-means landmarks ``c``
yoso                 hashes ``m`` (each of ``tau`` concatenated hyperplanes)
yoso-e               ignored (exact expectation)
performer            positive orthogonal random features ``r``
informer             selected "active" queries ``u``
linformer            projected length ``k`` of keys and values
===================  ==========================================================
"""

from .registry import available, get

__all__ = ["available", "get"]
