r"""Informer's ProbSparse self-attention (Zhou et al., 2021).

``num_features`` is the number :math:`u` of "active" queries that get exact softmax rows; the
other ("lazy") queries output the mean of the values, as in Informer's encoder (no mask).
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_bool, check_choice, check_int
from ..kernels import scaled_logits, softmax_matrix
from ..operators import LinearOperator
from ._base import Approximation, method
from .draws import DrawEntry, check_draw

__all__ = ["informer", "INFORMER", "ProbSparseOperator", "sparsity_measurement", "default_sample_size",
           "draw_key_samples", "LAZY_ROWS", "CAUSAL_LAZY"]

MEASURE_KEYS = ("sampled", "all")
LAZY_ROWS = ("mean", "cumulative-mean", "cumulative-sum")
CAUSAL_LAZY = {"mean": "cumulative-mean", "sum": "cumulative-sum"}
"""``causal_lazy`` of :func:`informer` -> the lazy rows of :class:`ProbSparseOperator`."""

SAMPLING_FACTOR = 5
"""Informer's constant ``c`` (``factor`` in the official code): ``c * ceil(ln n_k)`` sampled keys."""


def default_sample_size(n_k: int) -> int:
    r"""Informer's key-sample size :math:`\min(n_k, c\lceil\ln n_k\rceil)` with :math:`c = 5` (at least 1).

    Examples
    --------
    >>> from approxlab.methods.informer import default_sample_size
    >>> default_sample_size(1024), default_sample_size(10)  # 5 * ceil(ln 1024) = 35; capped at n_k
    (35, 10)
    """
    n_k = check_int(n_k, "n_k", low=1)
    return max(1, min(n_k, SAMPLING_FACTOR * math.ceil(math.log(n_k))))


def sparsity_measurement(q, k, *, key_indices=None):
    r"""Max-mean query sparsity measurement :math:`\bar M(q_i, K) = \max_j s_{ij} - \frac1{n_k}\sum_j s_{ij}`.

    Informer Eq. (4) (the bound of Lemma 1 on the KL-based measurement of Eq. (2)), with
    :math:`s_{ij} = q_i^\top k_j/\sqrt p`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    key_indices : torch.Tensor, optional
        ``(*batch, n, s)`` int64: for each query, the keys (with repetition) on which the max and the
        mean are taken -- the sampled estimate used in practice. ``None``: all keys (cost
        :math:`O(n n_k p)`).

    Returns
    -------
    torch.Tensor
        ``(*batch, n)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.informer import sparsity_measurement
    >>> q = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    >>> k = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    >>> sparsity_measurement(q, k)  # max - mean of the logits: the zero query attends uniformly
    tensor([1.4142, 0.0000], dtype=torch.float64)
    """
    if key_indices is None:
        logits = scaled_logits(q, k)
    else:
        logits = _sampled_logits(q, k, key_indices)
    return logits.amax(-1) - logits.mean(-1)


_CHUNK_ELEMENTS = 1 << 22
"""Sampled key rows ``(*batch, chunk, s, p)`` gathered at once by :func:`_sampled_logits`."""


def _sampled_logits(q, k, key_indices):
    r""":math:`s_{i,j} = q_i^\top k_{I_{ij}}/\sqrt p`, ``(*batch, n, s)``, for ``key_indices`` :math:`I`.

    Queries go in chunks, so the gathered key rows stay within :data:`_CHUNK_ELEMENTS` whatever
    ``n`` (gathering all ``n * s`` rows at once moved 1.1 GB at n = 4096, 12 heads, s = 45).
    """
    *batch, n, s = key_indices.shape
    n_k, p = k.shape[-2:]
    groups = math.prod(batch)
    keys = k.expand(*batch, n_k, p).reshape(groups * n_k, p)
    rows = key_indices + (torch.arange(groups, device=k.device) * n_k).reshape(*batch, 1, 1)
    q = q.expand(*batch, n, p)
    chunk = max(1, _CHUNK_ELEMENTS // max(groups * s * p, 1))
    logits = [torch.einsum("...csp,...cp->...cs", _gather_rows(keys, rows[..., i : i + chunk, :]),
                           q[..., i : i + chunk, :])
              for i in range(0, n, chunk)]
    return torch.cat(logits, dim=-2) / math.sqrt(p)


def _gather_rows(table, index):
    """``table[index]`` for a 2-D ``table`` and an int64 ``index`` of any shape, by ``index_select``
    on the flattened index (twice as fast as advanced indexing for (12, 113, 45) rows of 64)."""
    return table.index_select(0, index.reshape(-1)).reshape(*index.shape, table.shape[-1])


class ProbSparseOperator(LinearOperator):
    r"""Row-blocked ProbSparse attention matrix, ``(*batch, n, n_k)``, never formed densely.

    Rows ``selected`` are the dense softmax rows ``rows``; every other ("lazy") row is, by ``lazy``:
    ``"mean"`` :math:`\mathbf 1^\top/n_k` (mean of the values; Informer's encoder),
    ``"cumulative-mean"`` :math:`1/(i+1)` on keys :math:`j \le i` (the causal mean), or
    ``"cumulative-sum"`` 1 on keys :math:`j \le i` (the official code's masked ``V.cumsum``).

    Parameters
    ----------
    rows : torch.Tensor
        ``(*batch, u, n_k)``, the exact (causal: masked) softmax rows of the selected queries.
    selected : torch.Tensor
        ``(*batch, u)`` int64 distinct row indices in ``[0, n)``.
    n : int
        Number of queries (rows).
    lazy : {"mean", "cumulative-mean", "cumulative-sum"}, default "mean"
        The lazy rows (the cumulative ones need ``n == n_k``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.informer import ProbSparseOperator
    >>> rows = torch.tensor([[[1.0, 0.0, 0.0]]], dtype=torch.float64)  # query 2 is active, attends key 0
    >>> ProbSparseOperator(rows, torch.tensor([[2]]), 3).to_dense()
    tensor([[[0.3333, 0.3333, 0.3333],
             [0.3333, 0.3333, 0.3333],
             [1.0000, 0.0000, 0.0000]]], dtype=torch.float64)
    """

    def __init__(self, rows: torch.Tensor, selected: torch.Tensor, n: int, lazy: str = "mean"):
        self.rows = rows
        self.selected = selected
        self.lazy = check_choice(lazy, "lazy", LAZY_ROWS)
        self.shape = (*rows.shape[:-2], n, rows.shape[-1])
        self.dtype = rows.dtype
        self.device = rows.device
        lazy_rows = torch.ones(*selected.shape[:-1], n, dtype=rows.dtype, device=rows.device)
        self._lazy = lazy_rows.scatter(-1, selected, 0.0)  # (*batch, n): 1 for lazy rows
        positions = torch.arange(1, n + 1, dtype=rows.dtype, device=rows.device)
        self._weights = 1.0 / positions if lazy == "cumulative-mean" else torch.ones_like(positions)

    def _index(self, c):
        return self.selected.unsqueeze(-1).expand(*self.selected.shape, c)

    def _matmat(self, x):
        n, n_k = self.shape[-2:]
        c = x.shape[-1]
        batch = torch.broadcast_shapes(self.shape[:-2], x.shape[:-2])
        if self.lazy == "mean":
            out = x.mean(-2, keepdim=True).expand(*batch, n, c).clone()
        else:
            out = (x.cumsum(-2) * self._weights.unsqueeze(-1)).expand(*batch, n, c).clone()
        return out.scatter(-2, self._index(c).expand(*batch, -1, c), self.rows @ x)

    def _rmatmat(self, y):
        c = y.shape[-1]
        n_k = self.shape[-1]
        batch = torch.broadcast_shapes(self.shape[:-2], y.shape[:-2])
        y_selected = y.gather(-2, self._index(c).expand(*batch, -1, c))
        lazy = self._lazy.unsqueeze(-1) * y
        if self.lazy == "mean":
            lazy_part = lazy.sum(-2, keepdim=True) / n_k  # (*batch, 1, c)
        else:  # row i reaches keys j <= i: a reverse cumulative sum over i >= j
            lazy_part = (lazy * self._weights.unsqueeze(-1)).flip(-2).cumsum(-2).flip(-2)
        return self.rows.transpose(-1, -2) @ y_selected + lazy_part

    def to(self, dtype):
        return ProbSparseOperator(self.rows.to(dtype), self.selected, self.shape[-2], self.lazy)


def _lazy_rows(causal: bool, causal_lazy, n: int, n_k: int) -> str:
    """The :class:`ProbSparseOperator` lazy rows of :func:`informer`'s ``causal``/``causal_lazy``."""
    check_choice(causal_lazy, "causal_lazy", CAUSAL_LAZY)
    if not causal:
        if causal_lazy != "mean":
            raise ValueError(f"`causal_lazy` must be 'mean' without causal=True (the lazy rows are then mean(V)); "
                             f"got {causal_lazy!r}.")
        return "mean"
    if n != n_k:
        raise ValueError(f"`causal` needs self-attention (n == n_k); got {n} queries and {n_k} keys.")
    return CAUSAL_LAZY[causal_lazy]


def _sample_size(n_k, measure_keys, sample_size):
    """``sample_size`` checked against ``measure_keys`` (None with "all"), defaulted, in ``[1, n_k]``."""
    check_choice(measure_keys, "measure_keys", MEASURE_KEYS)
    if measure_keys == "all":
        if sample_size is not None:
            raise ValueError(
                f"`sample_size` must be None when measure_keys='all' (no keys are sampled); got {sample_size!r}."
            )
        return None
    sample_size = default_sample_size(n_k) if sample_size is None else sample_size
    return check_int(sample_size, "sample_size", low=1, high=n_k)


def draw_key_samples(q, k, *, num_features=None, generator=None, measure_keys="sampled", sample_size=None):
    r"""The random draw of :func:`informer`: the keys each query's sparsity measurement is taken on.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n_k, p)`` (only their shapes and device are used).
    num_features : int, optional
        :math:`u` (it does not shape the draw).
    generator : torch.Generator, optional
        CPU generator.
    measure_keys, sample_size
        As for :func:`informer`.

    Returns
    -------
    dict
        ``{"key_indices": (*batch, n, s) int64}`` in ``[0, n_k)`` on ``q.device``: ``s`` keys per
        query drawn uniformly **with** replacement, independently per query and batch element
        (Informer's ProbSparse sampling, as its official code draws it); ``{}`` with
        ``measure_keys="all"`` (nothing is drawn).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.informer import draw_key_samples
    >>> q = k = torch.zeros(2, 64, 4, dtype=torch.float64)
    >>> draw_key_samples(q, k, generator=torch.Generator().manual_seed(0))["key_indices"].shape  # 5 * ceil(ln 64) keys per query
    torch.Size([2, 64, 25])
    """
    n, n_k = q.shape[-2], k.shape[-2]
    sample_size = _sample_size(n_k, measure_keys, sample_size)
    if sample_size is None:
        return {}
    indices = torch.randint(n_k, (*q.shape[:-2], n, sample_size), generator=as_generator(generator))
    return {"key_indices": indices.to(q.device)}


@method(
    "informer",
    target="softmax",
    features='selected "active" queries u',
    max_features=lambda n, m: n,
    randomized=True,
    draw=draw_key_samples,
    causal=True,
    differentiable=True,
)
def informer(q, k, v, *, num_features, generator=None, measure_keys="sampled", sample_size=None, draw=None,
             causal=False, causal_lazy="mean"):
    r"""ProbSparse self-attention: exact softmax rows for the top-:math:`u` queries, mean of V elsewhere.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number :math:`u` of active queries, ``1 <= u <= n`` (Informer uses :math:`c\ln n`);
        ``u = n`` gives exact softmax attention.
    generator : torch.Generator, optional
        CPU generator for the key samples (only used with ``measure_keys="sampled"``).
    measure_keys : {"sampled", "all"}, default "sampled"
        Keys on which the sparsity measurement :math:`\bar M` is evaluated. ``"sampled"``: for each
        query, ``sample_size`` keys drawn uniformly with replacement, independently per query and per
        batch element (Informer's ProbSparse sampling, as in its official code), cost :math:`O(n\,s\,p)`.
        ``"all"``: every key, exact :math:`\bar M` (cost :math:`O(n n_k p)`; isolates the effect of
        the top-:math:`u` selection from that of the sampling).
    sample_size : int, optional
        Keys sampled per query, ``1 <= sample_size <= n_k``. Default :func:`default_sample_size`,
        :math:`\min(n_k, 5\lceil\ln n_k\rceil)` (Informer's ``factor = 5``). Only valid with
        ``measure_keys="sampled"``.
    draw : dict, optional
        ``{"key_indices": (*batch, n, s)}`` int64 in ``[0, n_k)`` (``{}`` with
        ``measure_keys="all"``), the draw of :func:`draw_key_samples` (``approxlab.methods.draw``),
        used instead of ``generator``: the same draw gives the same output bit for bit.
    causal : bool, default False
        Causal ProbSparse self-attention (``n == n_k``), Informer's masked decoder self-attention
        (Section 3.3: masked dot-products set to :math:`-\infty`): each selected query gets its
        causal softmax row (keys :math:`j \le i`; the official code's ``ProbMask``), each lazy
        query the causal counterpart of mean(V) (``causal_lazy``). The queries are selected as
        without the mask, by :math:`\bar M` over the sampled (or all) keys, future ones included --
        as the official code does (its ``_prob_QK`` samples from all keys).
    causal_lazy : {"mean", "sum"}, default "mean"
        The lazy rows under ``causal=True``: ``"mean"`` the cumulative mean
        :math:`\frac1{i+1}\sum_{j\le i}v_j` (row-stochastic, the masked and renormalised uniform
        row); ``"sum"`` the cumulative sum :math:`\sum_{j\le i}v_j`, as the official code's
        ``_get_initial_context`` (``V.cumsum(dim=-2)``) -- not row-stochastic: it grows with
        :math:`i`. Only ``"mean"`` without ``causal``.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`ProbSparseOperator`
        ``(*batch, n, n_k)``; ``info``: ``selected`` ``(*batch, u)`` sorted indices of the active
        queries, ``sparsity`` ``(*batch, n)`` the measurement used, ``measure_keys``, ``sample_size``
        (``None`` with ``"all"``), ``causal``, ``lazy`` (the operator's lazy rows).

    Notes
    -----
    ProbSparse attention (Informer Eq. (3)) is :math:`\operatorname{softmax}(\bar Q K^\top/\sqrt p)V`
    where :math:`\bar Q` keeps the :math:`u` queries with the largest max-mean measurement
    :math:`\bar M(q_i, K) = \max_j s_{ij} - \operatorname{mean}_j s_{ij}` (Informer Eq. (4)), and the
    remaining queries output :math:`\operatorname{mean}(V)` (self-attention in the encoder). The
    approximate matrix therefore has :math:`u` exact softmax rows and :math:`n-u` uniform rows
    :math:`\mathbf 1^\top/n_k`; it is row-stochastic.

    Two deliberate deviations from the official code, both documented choices: the mean in
    :math:`\bar M` is over the sampled keys (the official code divides the sampled sum by
    :math:`n_k`), and the measurement includes the :math:`1/\sqrt p` scale (a common positive factor
    that does not change the ranking). Softmax rows are computed in the log domain, so large logits
    never overflow.

    ``num_features`` counts queries, so it is bounded by ``n`` (not ``n_k``): cross-attention with
    more active queries than keys is allowed.

    **Draw.** ``s`` keys per query, uniformly with replacement (Informer's sampling,
    ``torch.randint`` in its code), ``{"key_indices": (*batch, n, s)}`` (:func:`draw_key_samples`).

    References
    ----------
    .. [1] H. Zhou, S. Zhang, J. Peng, S. Zhang, J. Li, H. Xiong, W. Zhang. "Informer: Beyond
       Efficient Transformer for Long Sequence Time-Series Forecasting." AAAI 2021.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> approx = approxlab.approximate("informer", q, k, v, num_features=8, generator=torch.Generator().manual_seed(1))
    >>> [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()]
    [0.55, 0.5]
    >>> approx = approxlab.approximate("informer", q, k, v, num_features=32)  # every query active: exact
    >>> bool((spectral_error(approx.output, exact, relative=True) < 1e-12).all())
    True
    """
    n, n_k = q.shape[-2], k.shape[-2]
    num_features = check_int(num_features, "num_features", low=1, high=n)
    sample_size = _sample_size(n_k, measure_keys, sample_size)
    lazy = _lazy_rows(check_bool(causal, "causal"), causal_lazy, n, n_k)
    if draw is None:
        draw = draw_key_samples(q, k, generator=generator, measure_keys=measure_keys, sample_size=sample_size)
    else:
        layout = ({} if sample_size is None else
                  {"key_indices": DrawEntry((*q.shape[:-2], n, sample_size), "(*batch, n, s)", high=n_k)})
        draw = check_draw("informer", draw, layout, device=q.device)
    key_indices = draw.get("key_indices")

    sparsity = sparsity_measurement(q, k, key_indices=key_indices)
    selected = torch.topk(sparsity, num_features, dim=-1).indices.sort(dim=-1).values  # (*batch, u)
    p = q.shape[-1]
    q_selected = q.gather(-2, selected.unsqueeze(-1).expand(*selected.shape, p))
    mask = (torch.arange(n_k, device=q.device) <= selected.unsqueeze(-1)) if causal else None  # ProbMask
    rows = softmax_matrix(q_selected, k, mask=mask)  # (*batch, u, n_k)
    operator = ProbSparseOperator(rows, selected, n, lazy)
    output = operator.matmat(v)
    info = {
        "selected": selected,
        "sparsity": sparsity,
        "measure_keys": measure_keys,
        "sample_size": sample_size,
        "causal": causal,
        "lazy": lazy,
    }
    return Approximation("informer", "softmax", output, operator, info)


INFORMER = informer
__test__ = {"informer": informer.function}  # doctest skips a MethodSpec: run its function's examples
