r"""kvpress's compression ratio as a cache budget: the one rule from a ratio to the count of kept tokens.

kvpress states a budget as the fraction of the context a press removes, ``compression_ratio`` in
:math:`[0, 1)`; approxlab as the count :math:`b` of context tokens kept per head (``num_features``). A press
over :math:`n_c` context tokens keeps

.. math::

    b = \max\big(1, \lfloor n_c\,(1 - r)\rfloor\big),

in Python's float arithmetic, exactly as ``ScorerPress.compress`` computes it (kvpress, read at commit 0603dec,
``kvpress/presses/scorer_press.py``: ``n_kept = max(1, int(k_len * (1 - self.compression_ratio)))``, ``int``
truncating toward zero, so a product that rounds just below an integer keeps one token fewer:
:math:`n_c = 20, r = 0.9` gives :math:`20 \times 0.1 = 1.9999999999999996` in floats, hence 1 token, not 2).
"""

from __future__ import annotations

import math
import numbers

from .._validation import check_int

__all__ = ["check_compression_ratio", "kept_count", "cache_budget"]


def check_compression_ratio(compression_ratio) -> float:
    """``compression_ratio`` as a float in ``[0, 1)`` (kvpress's range), or the error naming it."""
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, numbers.Real):
        raise TypeError(f"`compression_ratio` must be a real number in [0, 1) (the fraction of the context removed, "
                        f"as kvpress states it); got {compression_ratio!r} ({type(compression_ratio).__name__}).")
    ratio = float(compression_ratio)
    if not (math.isfinite(ratio) and 0 <= ratio < 1):
        raise ValueError(f"`compression_ratio` must be in [0, 1) (the fraction of the context removed, as kvpress "
                         f"states it); got {compression_ratio!r}.")
    return ratio


def kept_count(compression_ratio, context_length: int) -> int:
    r"""The context tokens kept per head at ``compression_ratio``: kvpress's :math:`\max(1, \lfloor n_c (1 - r)\rfloor)`.

    Examples
    --------
    >>> from approxlab.cache import kept_count
    >>> [kept_count(r, 4096) for r in (0.25, 0.5, 0.75, 0.875)]  # kvpress's leaderboard ratios at 4k tokens
    [3072, 2048, 1024, 512]
    >>> kept_count(0.9, 20), kept_count(0.999, 100)  # int() truncates 1.9999999999999996; at least one token
    (1, 1)
    """
    ratio = check_compression_ratio(compression_ratio)
    context_length = check_int(context_length, "context_length", low=1)
    return max(1, int(context_length * (1 - ratio)))


def cache_budget(spec, num_features, compression_ratio, context_length: int) -> int:
    """The budget of method ``spec`` (a :class:`~approxlab.methods.MethodSpec`) given as exactly one of
    ``num_features`` (a count, checked by the caller) and ``compression_ratio`` (kvpress's ratio, through
    :func:`kept_count` of ``context_length``; only for a method with a compression step)."""
    if (num_features is None) == (compression_ratio is None):
        got = "both" if num_features is not None else "neither"
        raise ValueError(f"exactly one of `num_features` (the context tokens kept per head) and `compression_ratio` "
                         f"(the fraction removed, kvpress's way) must be given; got {got} (num_features="
                         f"{num_features!r}, compression_ratio={compression_ratio!r}).")
    if compression_ratio is None:
        return num_features
    if spec.compress is None:
        raise ValueError(f"`compression_ratio` states a cache budget, for a method with a compression step (a "
                         f"cache policy); method {spec.name!r} has none (its num_features is its own budget): pass "
                         f"num_features; got compression_ratio={compression_ratio!r}.")
    return kept_count(compression_ratio, context_length)
