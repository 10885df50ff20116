r"""KeyDiff (Park et al., 2025): keep the keys least similar to the mean key direction.

A per-key cache scorer (:mod:`approxlab.cache._scorers`), from the keys alone (kvpress's
``KeyDiffPress``).
"""

from __future__ import annotations

import torch

from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish, masked_mean

__all__ = ["keydiff_scores", "REGISTRATION", "KEYDIFF"]


def keydiff_scores(q, k, v, *, generator=None, key_mask=None):
    r"""Minus the cosine similarity to the anchor, :math:`s_j = -\cos(k_j, \bar u)`,
    :math:`\bar u = \frac1{n_c}\sum_l k_l/\lVert k_l\rVert_2`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (``q``, ``v`` validated, not
        used).
    generator : torch.Generator, optional
        Unused (deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; the anchor is the mean over real keys, padded keys
        score :math:`-\infty`.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``k.dtype``; higher is kept.

    Notes
    -----
    The anchor :math:`\bar u` is the mean of the normalised keys (not itself normalised; the cosine does
    not care). A zero key (or a zero anchor) has cosine 0. The paper evicts block by block as the prompt
    streams in; kvpress's ``KeyDiffPress`` scores the whole context at once (its ``BlockPress`` wraps it
    for the paper's block-wise form), as here: ``-cosine_similarity(keys, normalize(keys).mean(2))``.
    **Cost**: :math:`O(n_c p)`.

    References
    ----------
    Park, Jones, Morse, Goel, Lee and Lott, "KeyDiff: Key similarity-based KV cache eviction for
    long-context LLM inference in resource-constrained environments" (arXiv:2504.15364). kvpress (NVIDIA),
    ``kvpress/presses/keydiff_press.py``.

    Examples
    --------
    >>> import torch
    >>> k = torch.tensor([[1.0, 0.0], [1.0, 0.1], [1.0, -0.1], [0.0, 1.0]], dtype=torch.float64)
    >>> keydiff_scores(k, k, k).topk(1).indices.tolist()  # the outlying direction
    [3]
    """
    context = check_context(q, k, v, key_mask)
    norms = k.norm(dim=-1, keepdim=True)
    unit = k / torch.where(norms > 0, norms, torch.ones_like(norms))
    anchor = masked_mean(unit, context.real, -2)  # (*batch, 1, p)
    dot = (k * anchor).sum(-1)
    scale = norms.squeeze(-1) * anchor.norm(dim=-1)
    cosine = dot / torch.where(scale > 0, scale, torch.ones_like(scale))
    return finish(-cosine, context)


REGISTRATION = dict(score=keydiff_scores, target="softmax", features=FEATURES, randomized=False, inputs=())
"""The keyword arguments of this policy's registration: ``register("keydiff", **REGISTRATION)``."""

KEYDIFF = cache_policy("keydiff", **REGISTRATION)
"""The built-in method 'keydiff': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"keydiff": KEYDIFF.function}  # doctest skips a MethodSpec: run its function's examples

