r"""PyramidKV (Cai et al., 2024): SnapKV's observation-window votes, with budgets decreasing from the bottom layer
to the top.

A score-based cache policy with ``layer_budgets="pyramid"`` (:mod:`approxlab.cache._allocation`): the scores
are SnapKV's (:func:`approxlab.methods.snapkv.score_snapkv`), and in :func:`approxlab.patch_attention`'s KV-cache
setting layer :math:`l` of :math:`L` keeps :math:`b_l` tokens per head (its observation window included), a
linear schedule with :math:`\sum_l b_l = L b` (:func:`approxlab.cache.pyramid_budgets`). On one layer
alone (:func:`approxlab.kv_cache_attention`, ``approximate(..., causal=True)``) there is no schedule: it is
SnapKV with the budget :math:`b`.
"""

from __future__ import annotations

from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES
from .snapkv import score_snapkv

__all__ = ["REGISTRATION", "PYRAMIDKV"]

REGISTRATION = dict(score=score_snapkv, target="softmax", features=FEATURES, randomized=False, inputs=(),
                    layer_budgets="pyramid")
r"""The keyword arguments of this policy's registration: ``register("pyramidkv", **REGISTRATION)``.

Notes
-----
PyramidKV (Cai et al., 2024, Sec. 3.2; the authors' ``PyramidKVCluster`` in KVCache-Factory) observes attention
spreading widely in the bottom layers and concentrating on few tokens in the top ones ("pyramidal information
funneling"), and gives the bottom layers more cache. With :math:`w = \min(\text{window}, b)` the observation
window every layer keeps and :math:`s = b - w`, layer :math:`l` keeps

.. math::

    b_l = w + s_{\max} - l\,\frac{s_{\max} - s_{\min}}{L - 1}, \qquad s_{\min} = \frac{s}{\beta},\quad
    s_{\max} = 2s - s_{\min},

:math:`s_{\max}` capped at :math:`n_c - w` (then :math:`s_{\min} = 2s - s_{\max}`), :math:`\beta = 20`
(``pyramid_beta``), rounded so that :math:`\sum_l b_l = Lb`: the model's cache holds as many tokens as SnapKV's
at budget :math:`b`. Each layer then keeps SnapKV's top :math:`b_l` (its window and the :math:`b_l - w` tokens of
largest pooled votes), per KV head under ``grouping="kv-head"``.

References
----------
Z. Cai, Y. Zhang, B. Gao, Y. Liu, T. Liu, K. Lu, W. Xiong, Y. Dong, B. Chang, J. Hu, W. Xiao, "PyramidKV: Dynamic
KV Cache Compression based on Pyramidal Information Funneling" (2024), arXiv:2406.02069. NVIDIA kvpress,
``kvpress/presses/pyramidkv_press.py``.
"""

PYRAMIDKV = cache_policy("pyramidkv", **REGISTRATION)
"""The built-in method 'pyramidkv': SnapKV's scores with PyramidKV's layer schedule in a patched model."""
PYRAMIDKV.function.__module__ = __name__
__test__ = {"pyramidkv": PYRAMIDKV.function}  # doctest skips a MethodSpec: run its function's examples
