r"""Ada-SnapKV (Feng et al., 2024): SnapKV's observation-window votes, with AdaKV's head-adaptive budgets.

A score-based cache policy with ``allocation="adakv"`` (:mod:`approxlab.cache._allocation`): the scores are
SnapKV's (:func:`approxlab.methods.snapkv.score_snapkv`), and a layer's :math:`H b` kept tokens go to the largest
scores of its :math:`H` heads jointly, each head first keeping :math:`\lfloor \alpha b\rfloor` of its own -- the
pairing the AdaKV paper evaluates (Ada-SnapKV, Sec. 4) and kvpress's ``AdaKVPress(SnapKVPress())``.
"""

from __future__ import annotations

from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES
from .snapkv import score_snapkv

__all__ = ["REGISTRATION", "ADA_SNAPKV"]

REGISTRATION = dict(score=score_snapkv, target="softmax", features=FEATURES, randomized=False, inputs=(),
                    allocation="adakv")
r"""The keyword arguments of this policy's registration: ``register("ada-snapkv", **REGISTRATION)``.

Notes
-----
With :math:`\sigma_{hj}` SnapKV's pooled vote of head :math:`h` (a KV head, its query heads' votes averaged,
under ``grouping="kv-head"``) for context token :math:`j` (:math:`+\infty` on the observation window
:math:`w = \min(\text{window}, b)`), AdaKV (Feng et al., 2024, Algorithm 1) keeps

.. math::

    \mathcal K = \operatorname{top}_{Hb}\{\hat\sigma_{hj}\}_{h, j}, \qquad
    \hat\sigma_{hj} = \begin{cases} \sigma_{\max} & j \in \operatorname{top}_{\lfloor \alpha b\rfloor}
    (\sigma_{h\cdot}) \\ \sigma_{hj} & \text{otherwise,} \end{cases}

:math:`\sigma_{\max}` the largest finite float and :math:`\alpha` = ``alpha_safeguard`` (0.2, kvpress's
default): :math:`H b` tokens per layer in all, :math:`|\mathcal K_h| \ge \lfloor \alpha b\rfloor` per head.
The paper's motivation (its Theorem 1): the :math:`\ell_1` error of a layer's output after eviction is at most
:math:`2 C \sum_h (1 - \sum_{j\in\mathcal K_h} a_{hj})`, so keeping the largest weights across heads minimises
the bound at a fixed total. SnapKV's votes are sums of attention weights over the window (kvpress: means), so
heads' scores are on one scale.

References
----------
Y. Feng, J. Lv, Y. Cao, X. Xie, S. K. Zhou, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation
for Efficient LLM Inference" (2024), arXiv:2407.11550. NVIDIA kvpress, ``kvpress/presses/adakv_press.py``.
"""

ADA_SNAPKV = cache_policy("ada-snapkv", **REGISTRATION)
"""The built-in method 'ada-snapkv': SnapKV's scores with AdaKV's allocation, as a causal method and in the
KV-cache setting."""
ADA_SNAPKV.function.__module__ = __name__
__test__ = {"ada_snapkv": ADA_SNAPKV.function}  # doctest skips a MethodSpec: run its function's examples
