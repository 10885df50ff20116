r"""Oracle top-p attention: each query keeps the smallest set of keys whose softmax mass reaches ``p``.

The nucleus rule of sampling applied to an attention row (sparse-attention-hub's ``oracle_top_p``
masker; the oracle that Twilight and MagicPIG's analyses use to show how unevenly mass spreads over
heads). Like the top-k oracle it needs every logit: row blocks, memory :math:`O(n\cdot\text{block})`.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_float
from ._base import method
from ._masking import check_key_mask
from ._selection import oracle_selection, sparse_approximation

__all__ = ["topp", "TOPP"]


@method("topp", target="softmax", features="the most keys kept per query (a cap on the nucleus of mass p)",
        randomized=False, causal=True)
def topp(q, k, v, *, num_features, generator=None, p=0.9, key_mask=None, causal=False, ranking=None):
    r"""Oracle top-p attention: softmax over the smallest set of keys whose mass reaches ``p``, capped.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p_q)``, ``(*batch, m, p_q)``, ``(*batch, m, p_v)``.
    num_features : int
        The cap: at most this many keys per query (``1 <= num_features <= m``). A row whose nucleus is
        larger keeps its ``num_features`` largest logits (then it is top-k); ``num_features = m`` is the
        uncapped rule.
    generator : torch.Generator, optional
        Unused (deterministic).
    p : float, default 0.9
        The mass to reach, ``0 < p <= 1``.
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys that may be attended.
    causal : bool, default False
        Query :math:`i` selects among keys :math:`j \le i` (mass of the causal row).
    ranking : KeyRanking, optional
        :func:`approxlab.methods.rank_keys` of these ``q`` and ``k`` at budgets that include this one
        (bidirectional, no ``key_mask``): its ranked logits are read instead of forming them, the same numbers;
        one ranking serves ``topk`` and ``topp`` at all its budgets (what ``approxlab figure1`` shares per window).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`;
        ``info``: ``indices`` ``(*batch, n, num_features)`` (by decreasing logit), ``kept`` ``(*batch, n)``
        the number of keys kept per query, ``kept_mass`` and ``dropped_mass`` ``(*batch, n)``.

    Notes
    -----
    Sort row :math:`i`'s softmax weights :math:`a_{i(1)} \ge a_{i(2)} \ge \dots`; keep the first
    :math:`c_i = \min(\text{num\_features}, \min\{c : \sum_{r\le c} a_{i(r)} \ge p\})` keys and
    renormalise over them. The dropped mass is then :math:`\delta_i \le 1-p` whenever the cap does not
    bind, so the bound of :func:`~approxlab.methods.topk.topk`'s Notes gives
    :math:`\|o_i-\tilde o_i\| \le 2(1-p)\max_j\|v_j\|`. Only the ``num_features`` largest logits are
    ever sorted (the top-k oracle's selection per row block, ``torch.topk``'s result), so the cost is that of
    the top-k oracle: all :math:`nm` logits in row blocks of at most :math:`2^{22}` entries.

    **Published code**: sparse-attention-hub's ``OracleTopPMasker`` keeps every key whose weight is at
    least the threshold weight found by ``searchsorted(cumsum, p, side="right")``, i.e. the smallest
    set whose mass *exceeds* ``p`` (here: *reaches*), with ties at the threshold all kept, and no cap;
    it also switches to full attention when ``int(p * m) >= m``. These differ from the rule here only
    when a cumulative mass equals ``p`` exactly or logits tie (see the docs page for the comparison).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("topp", q, k, v, num_features=64, p=0.9)
    >>> bool((approx.info["dropped_mass"] <= 0.1 + 1e-12).all())
    True
    >>> capped = approxlab.approximate("topp", q, k, v, num_features=4, p=0.9)
    >>> int(capped.info["kept"].max())
    4
    """
    key_mask = check_key_mask(key_mask, k)
    p = check_positive_float(p, "p")
    if p > 1:
        raise ValueError(f"`p` must be a mass in (0, 1]; got {p!r}.")
    budget = min(num_features, k.shape[-2])

    def keep(values, log_normaliser):
        mass = torch.exp(values - log_normaliser.unsqueeze(-1))
        before = torch.cumsum(mass, dim=-1) - mass  # the mass of the keys ranked above each one
        return torch.isfinite(values) & (before < p)

    output, indices, weights, kept, dropped, counts = oracle_selection(q, k, v, causal=bool(causal),
                                                               key_mask=key_mask, budget=budget, keep=keep,
                                                               ranking=ranking)
    info = {"indices": indices, "kept": counts, "kept_mass": kept, "dropped_mass": dropped}
    return sparse_approximation("topp", output, k.shape[-2], lambda: (indices, weights), info)


TOPP = topp
__test__ = {"topp": topp.function}  # doctest skips a MethodSpec: run its function's examples
