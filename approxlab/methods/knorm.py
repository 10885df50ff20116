r"""Knorm (Devoto et al., EMNLP 2024): keep the keys of smallest :math:`\ell_2` norm.

A per-key cache scorer (:mod:`approxlab.cache._scorers`): the score of key :math:`j` is
:math:`-\lVert k_j\rVert_2`, computed from the keys alone.
"""

from __future__ import annotations

from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish

__all__ = ["knorm_scores", "REGISTRATION", "KNORM"]


def knorm_scores(q, k, v, *, generator=None, key_mask=None):
    r"""Minus the key norm, :math:`s_j = -\lVert k_j\rVert_2`: the keys of low norm are kept.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)``: the context of one query head
        and the KV head it reads (``q`` and ``v`` are validated, not used).
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; padded keys score :math:`-\infty`.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``k.dtype``; higher is kept.

    Notes
    -----
    The paper (Section 3) finds a low :math:`\ell_2` norm of a cached key correlated with a high attention
    score to it, and compresses the cache by keeping the keys of lowest norm. kvpress's ``KnormPress``
    scores ``-keys.norm(dim=-1)``; this is the same number. **Cost**: :math:`O(n_c p)`.

    References
    ----------
    Devoto, Zhao, Scardapane and Minervini, "A simple and effective :math:`L_2` norm-based strategy for KV
    cache compression", EMNLP 2024 (arXiv:2406.11430). kvpress (NVIDIA), ``kvpress/presses/knorm_press.py``.

    Examples
    --------
    >>> import torch
    >>> k = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    >>> knorm_scores(k, k, k).tolist()
    [-5.0, -1.0, -2.0]
    >>> knorm_scores(k, k, k).topk(2).indices.tolist()  # the two keys of smallest norm
    [1, 2]
    """
    context = check_context(q, k, v, key_mask)
    return finish(-k.norm(dim=-1), context)


REGISTRATION = dict(score=knorm_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("knorm", **REGISTRATION)``."""

KNORM = cache_policy("knorm", **REGISTRATION)
"""The built-in method 'knorm': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"knorm": KNORM.function}  # doctest skips a MethodSpec: run its function's examples

