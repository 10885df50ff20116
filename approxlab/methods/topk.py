r"""Oracle top-k attention: each query keeps the keys of its ``k`` largest logits and renormalises.

The oracle against which the sparse-attention literature measures itself (MagicPIG's exact top-k
cache, sparse-attention-hub's ``oracle_top_k`` masker). It needs every logit, so it costs as much as
exact attention; here the logits are formed in row blocks, so memory is :math:`O(n\cdot\text{block})`,
never :math:`n\times m` at once.
"""

from __future__ import annotations

import torch

from ._base import method
from ._masking import check_key_mask
from ._selection import oracle_selection, sparse_approximation

__all__ = ["topk", "TOPK"]


@method("topk", target="softmax", features="kept keys k per query (the k largest logits)", randomized=False,
        causal=True)
def topk(q, k, v, *, num_features, generator=None, key_mask=None, causal=False, ranking=None):
    r"""Oracle top-k attention: softmax over each query's ``num_features`` largest logits.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        ``k``, the keys kept per query (``1 <= k <= m``). A row with fewer visible keys (causal rows
        :math:`i < k`, or few unmasked keys) keeps them all.
    generator : torch.Generator, optional
        Unused (the oracle is deterministic).
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys that may be attended; masked keys are never kept.
    causal : bool, default False
        Query :math:`i` selects among keys :math:`j \le i` (the same oracle on the causal row).
    ranking : KeyRanking, optional
        :func:`approxlab.methods.rank_keys` of these ``q`` and ``k`` at budgets that include this one
        (bidirectional, no ``key_mask``): its ranked logits are read instead of forming them, the same numbers;
        one ranking serves ``topk`` and ``topp`` at all its budgets (what ``approxlab figure1`` shares per window).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (``k`` entries per row); ``info``: ``indices`` ``(*batch, n, k)`` of the kept keys (by decreasing
        logit), ``kept_mass`` and ``dropped_mass`` ``(*batch, n)``, the exact softmax mass
        :math:`1-\delta_i` of the kept keys and :math:`\delta_i` of the dropped ones.

    Notes
    -----
    With :math:`a_{ij} = e^{s_{ij}}/\sum_l e^{s_{il}}`, :math:`s_{ij} = q_i^\top k_j/\sqrt p`, and
    :math:`S_i` the keys of the :math:`k` largest :math:`s_{ij}` (ties broken by ``torch.topk``),

    .. math::

        \tilde o_i = \sum_{j\in S_i} \tilde a_{ij} v_j, \qquad
        \tilde a_{ij} = \frac{a_{ij}}{1-\delta_i}, \qquad \delta_i = \sum_{j\notin S_i} a_{ij}.

    **The error bound** (tested over many seeds, ``tests/test_sparse_attention.py``): for *any* kept
    set, :math:`\|o_i - \tilde o_i\|_2 \le 2\,\delta_i \max_j \|v_j\|_2`. Proof: write
    :math:`o_i - \tilde o_i = \sum_{j\in S_i}(a_{ij} - \tilde a_{ij}) v_j + \sum_{j\notin S_i} a_{ij} v_j`.
    The first sum's coefficients are :math:`a_{ij} - a_{ij}/(1-\delta_i) = -a_{ij}\delta_i/(1-\delta_i)`,
    whose absolute values add up to :math:`\delta_i/(1-\delta_i)\cdot(1-\delta_i) = \delta_i`; the second
    sum's add up to :math:`\delta_i`. By the triangle inequality each sum has norm at most
    :math:`\delta_i\max_j\|v_j\|_2`. Top-k is the kept set of size :math:`k` that minimises
    :math:`\delta_i`, hence the bound's smallest value at that budget. Summed over rows,
    :math:`\|O-\tilde O\|_F \le 2\max_j\|v_j\|\,\|\delta\|_2`.

    **Cost**: all :math:`n m` logits (:math:`O(nmp)` time, as exact attention), formed in row blocks
    of at most :math:`2^{22}` entries, so memory is :math:`O(n\cdot\text{block} + nk)`, never
    :math:`n\times m`; the selection per row block keeps a threshold per row, the :math:`(k+1)`-th largest of
    the maxima of groups of the row's logits, and sorts only the logits of the chosen groups that reach it
    (:func:`~approxlab.methods._row_topk.row_topk`: ``torch.topk``'s result bit for bit, tied rows broken by
    ``torch.topk`` itself), :math:`O(nm)` elementwise; the output, the weighted sum of the :math:`k` value rows
    of each query, :math:`O(nkp_v)`. Causal, a row block forms the logits of the keys its rows can see only
    (half of them in all). Against torch's fused causal SDPA on the same tensors see ``approxlab bench``
    (its causal part).

    **Published code**: MagicPIG (Infini-AI-Lab/MagicPIG, ``evaluations/RULER/pred/topk_cache.py``)
    and sparse-attention-hub's ``oracle_top_k`` masker compute the same oracle on the model's own
    logits; sparse-attention-hub composes it with sink and local-window maskers (not done here: that
    composition is a different method). See the docs page for the comparison on shared inputs.

    References
    ----------
    Chen et al., "MagicPIG: LSH sampling for efficient LLM generation" (2024), whose evaluation keeps this
    oracle as its exact top-k baseline (``topk_cache.py``).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("topk", q, k, v, num_features=64)  # every key: exact
    >>> float((approx.output - approxlab.exact_attention(q, k, v)).abs().max()) < 1e-12
    True
    >>> approx = approxlab.approximate("topk", q, k, v, num_features=8, causal=True)
    >>> approx.info["indices"].shape, bool((approx.info["dropped_mass"][:, :8] < 1e-15).all())
    (torch.Size([2, 64, 8]), True)
    """
    key_mask = check_key_mask(key_mask, k)
    budget = min(num_features, k.shape[-2])

    def keep(values, log_normaliser):
        return torch.isfinite(values)

    output, indices, weights, kept, dropped, _ = oracle_selection(q, k, v, causal=bool(causal),
                                                               key_mask=key_mask, budget=budget, keep=keep,
                                                               ranking=ranking)
    info = {"indices": indices, "kept_mass": kept, "dropped_mass": dropped}
    return sparse_approximation("topk", output, k.shape[-2], lambda: (indices, weights), info)


TOPK = topk
__test__ = {"topk": topk.function}  # doctest skips a MethodSpec: run its function's examples
