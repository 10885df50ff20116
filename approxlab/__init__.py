"""approxlab: spectral-error studies of attention approximations.

Public API::

    approxlab.exact_attention(q, k, v)                      # softmax(QK^T/sqrt p) V
    approxlab.attention_matrix(q, k, kind)                  # "softmax" | "scores" | "kernelized"
    approxlab.approximate(method, q, k, v, *, num_features, generator=None, **options)
    approxlab.kv_cache_attention(method, q, k, v, *, context_length, num_features, ...)  # compressed context
    approxlab.methods.available()                           # registered method names
    approxlab.methods.register(name, f, *, target, features, ...)   # your own method, in every study
    approxlab.methods.draw(method, q, k, *, num_features, generator)  # a method's random draw, named tensors
    approxlab.patch_attention(model, method, *, layers=None, num_features, generator=None, ...)
                                                            # the method inside a transformers model
    approxlab.metrics      spectral_norm, spectral_error, ridge_leverage_scores, ...
    approxlab.linalg       iterative_pinv, stable_pinv, nystrom_core, golub_kahan, condition_number
    approxlab.sketch       nystrom(K, columns), column sampling
    approxlab.operators    LinearOperator, ExactAttentionOperator, ...
    approxlab.synthetic    matrices with a prescribed spectrum, synthetic Q/K/V
    approxlab.cache        the KV-cache field: kept_count, adakv_keep, pyramid_budgets, cache_policy, ...
    approxlab.errors       NotPSDError, NumericalWarning, ConvergenceWarning, ...
    approxlab.stats        describe, bootstrap, verdict, win_rate, t_test_power, ... (the studies' statistics)

Shapes are ``(*batch, n, p)`` with ``*batch`` = (sequences, heads); randomness only
through a keyword ``generator`` (a CPU ``torch.Generator``).
"""

from importlib import metadata as _metadata

from . import cache, errors, kernels, linalg, methods, metrics, operators, sketch, stats, synthetic
from .attention import approximate, attention_matrix, exact_attention
from .cache import kv_cache_attention
from .patching import patch_attention

__all__ = [
    "approximate",
    "attention_matrix",
    "exact_attention",
    "kv_cache_attention",
    "patch_attention",
    "cache",
    "errors",
    "kernels",
    "linalg",
    "methods",
    "metrics",
    "operators",
    "sketch",
    "stats",
    "synthetic",
]

try:  # one source of truth: the version in pyproject.toml, as installed
    __version__ = _metadata.version("approxlab")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
