r"""HyperAttention's :math:`\alpha` and :math:`\kappa` (Han et al., ICLR 2024), on the blocks of its causal recursion.

With :math:`A = \exp(S)`, :math:`S = QK^\top/\sqrt p`, :math:`D = \operatorname{diag}(A\mathbf 1)` and the
row-stochastic :math:`P = D^{-1}A` of an unmasked :math:`r \times c` problem:

* :math:`\alpha = r\max_j\|Pe^{(j)}\|_2^2` (Section 1.1; Theorem 1 and Lemma 1 assume :math:`\alpha = n^{o(1)}`);
* :math:`\kappa = \max_i r_i/\min_i r_i`, :math:`r_i = \langle\mathbf 1 - M^H_{i,:}, A_{i,:}\rangle`, the light row
  sums left when the heavy-entry mask :math:`M^H` is removed (Lemma 1, "Approximating D", and Theorem 1 assume
  :math:`\kappa = n^{o(1)}`). Three masks: the **oracle** (each row's ``heavy`` largest entries,
  :func:`hyperattention_kappa`), **sortLSH** (Algorithm 1, the mask the algorithm finds,
  :func:`sortlsh_kappa`) and **none** (``heavy=0``).

**The causal recursion** (Algorithm 4, "Causal Approx D", and :mod:`approxlab.methods.hyperattention`) applies the
theorem only to unmasked blocks: positions :math:`[0, n)` split at :math:`h = \lceil n/2\rceil` into two causal
halves, recursively, and the block of rows :math:`[h, n)` and columns :math:`[0, h)`, until a half has at most
:math:`\max(b, \text{min\_seq\_len})` positions. :func:`block_levels` measures :math:`\alpha` and the three
:math:`\kappa` on every such block (:func:`approxlab.methods.hyperattention.causal_blocks`, the method's own split
rule), each with its own :math:`D_B^{-1}A_B`, grouped by depth.

**What sampling needs** (the study's operationalisation, not the paper's theorem). Sampling :math:`m` of the
:math:`c` columns of :math:`P` uniformly with replacement, weight :math:`c/m`, estimates :math:`PV` without bias, with

.. math::

    \mathbb E\|\hat Y - PV\|_F^2 = \frac1m\Big(c\sum_j\|Pe_j\|^2\|v_j\|^2 - \|PV\|_F^2\Big)
        \le \frac cm\max_j\|Pe_j\|^2\,\|V\|_F^2 = \frac cr\cdot\frac\alpha m\,\|V\|_F^2

(the approximate matrix product of Drineas, Kannan and Mahoney, SIAM J. Comput. 2006, Lemma 4, with uniform
probabilities). So :math:`m \ge (c/r)\,\alpha/\varepsilon^2` samples bound the expected squared error by
:math:`\varepsilon^2\|V\|_F^2` (:func:`uniform_samples_needed`); when that is at least the block's :math:`c`
columns, sampling saves nothing over computing the block (:meth:`BlockLevel.sampling_saves_nothing`).

Public API::

    HEAVY_PER_ROW, SORTLSH_HASHES
    hyperattention_alpha(probabilities) -> (*batch,)
    hyperattention_kappa(logits, *, heavy=HEAVY_PER_ROW) -> (*batch,)          # the oracle mask
    kappa_with_mask(logits, heavy_mask) -> (*batch,)                           # any mask M^H
    sortlsh_kappa(q, k, *, block_size=256, hashes=10, bits=7, order="gray", generator=None,
                  hyperplanes=None, per_hash=False) -> (*batch,) or (*batch, hashes)
    uniform_samples_needed(alpha, *, epsilon) -> alpha / epsilon**2
    block_levels(q, k, *, block_size=256, min_seq_len=0, heavy=HEAVY_PER_ROW, hashes=10, bits=7,
                 order="gray", generator=None, hyperplanes=None) -> list[BlockLevel]
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import sortlsh
from .._validation import as_generator, check_choice, check_int, check_positive_float, check_qkv, check_tensor
from ..kernels import scaled_logits
from ..methods.hyperattention import DEFAULT_BLOCK_SIZE, causal_blocks
from ..operators import check_causal

__all__ = ["HEAVY_PER_ROW", "SORTLSH_HASHES", "hyperattention_alpha", "hyperattention_kappa", "kappa_with_mask",
           "sortlsh_kappa", "uniform_samples_needed", "BlockLevel", "block_levels"]

HEAVY_PER_ROW = 32
"""Entries per row taken as heavy (:math:`M^H`) for the oracle :math:`\\kappa`: the largest ones."""

SORTLSH_HASHES = 10
"""Independent sortLSH hashes whose :math:`\\kappa` are summarised by their median."""


def hyperattention_alpha(probabilities: torch.Tensor) -> torch.Tensor:
    r""":math:`\alpha = n\max_j\|Pe^{(j)}\|_2^2` of a row-stochastic ``(*batch, n, m)`` matrix :math:`P = D^{-1}A`.

    HyperAttention's column-norm parameter (Han et al., ICLR 2024, Section 1.1: the analysis assumes
    :math:`\|D^{-1}Ae^{(i)}\|_2^2 \le \alpha/n` with :math:`\alpha = n^{o(1)}`); ``n`` is the number
    of rows. Returns ``(*batch,)`` float64. Row 0 of a causal :math:`P` is :math:`e_0^\top`, so a causal
    matrix has :math:`\alpha \ge n` whatever the model: see :data:`approxlab.assumptions.STRUCTURAL`.

    Examples
    --------
    >>> import torch
    >>> hyperattention_alpha(torch.full((4, 4), 0.25, dtype=torch.float64))   # uniform rows: alpha = 1
    tensor(1., dtype=torch.float64)
    >>> hyperattention_alpha(torch.ones(4, 4, dtype=torch.float64).tril() / torch.arange(1., 5.).unsqueeze(-1))
    tensor(5.6944, dtype=torch.float64)
    """
    check_tensor(probabilities, "probabilities")
    column_norms = torch.linalg.vector_norm(probabilities.to(torch.float64), dim=-2)
    return probabilities.shape[-2] * column_norms.amax(-1).square()


def _ratio(log_light: torch.Tensor) -> torch.Tensor:
    """``max r_i / min r_i`` from the log light row sums ``(*batch, n)`` (0/0: NaN; r_i = 0 in some row: inf)."""
    return torch.exp(log_light.amax(-1) - log_light.amin(-1))


def hyperattention_kappa(logits: torch.Tensor, *, heavy: int = HEAVY_PER_ROW) -> torch.Tensor:
    r"""HyperAttention's :math:`\kappa` with the oracle mask: the ``heavy`` largest entries of each row removed.

    Parameters
    ----------
    logits : torch.Tensor
        ``(*batch, n, m)``, :math:`S` (:math:`A = e^S`, unnormalised; ``-inf`` entries count as masked).
    heavy : int
        Entries removed from each row as heavy, ``0 <= heavy < m``: the ``heavy`` largest (the oracle
        version of the mask :math:`M^H` that sortLSH looks for; ``0``: nothing removed).

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64, :math:`\max_i r_i/\min_i r_i` with
        :math:`r_i = \langle\mathbf 1 - M^H_{i,:}, A_{i,:}\rangle` (Han et al., Lemma 1 and Theorem 1,
        which assume :math:`\kappa = n^{o(1)}`), computed from :math:`\log r_i` (log-sum-exp), so it
        does not overflow where :math:`A` would; ``inf`` only if the ratio itself exceeds float64.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[0.0, 0.0, 9.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    >>> hyperattention_kappa(logits, heavy=1)        # light sums 2 and 1 + e
    tensor(1.8591, dtype=torch.float64)
    """
    check_tensor(logits, "logits", finite=False)
    heavy = check_int(heavy, "heavy", low=0, high=logits.shape[-1] - 1)
    logits = logits.to(torch.float64)
    if heavy:
        kept = logits.topk(heavy, dim=-1).indices
        logits = logits.scatter(-1, kept, float("-inf"))
    return _ratio(torch.logsumexp(logits, dim=-1))


def kappa_with_mask(logits: torch.Tensor, heavy_mask: torch.Tensor) -> torch.Tensor:
    r"""HyperAttention's :math:`\kappa` with a given heavy-entry mask :math:`M^H` (e.g. sortLSH's).

    Parameters
    ----------
    logits : torch.Tensor
        ``(*batch, n, m)``, :math:`S` (``-inf`` entries count as masked).
    heavy_mask : torch.Tensor
        bool, broadcastable to ``logits``: True on the entries removed as heavy (:math:`M^H_{ij} = 1`).

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64, :math:`\max_i r_i/\min_i r_i`, :math:`r_i = \langle\mathbf 1 - M^H_{i,:},
        A_{i,:}\rangle` (Lemma 1 of HyperAttention), in the log domain. ``inf`` when some row keeps no light
        entry and others do (:math:`\min_i r_i = 0`); NaN when no row keeps one (0/0: with sortLSH, a block
        that holds every key, where nothing is left to sample).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[0.0, 0.0, 9.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    >>> kappa_with_mask(logits, torch.tensor([[False, False, True], [False, False, False]]))   # (2e + 1) / 2
    tensor(3.2183, dtype=torch.float64)
    """
    check_tensor(logits, "logits", finite=False)
    if not isinstance(heavy_mask, torch.Tensor) or heavy_mask.dtype != torch.bool:
        found = getattr(heavy_mask, "dtype", type(heavy_mask).__name__)
        raise TypeError(f"`heavy_mask` must be a bool torch.Tensor; got {found}.")
    try:
        shape = torch.broadcast_shapes(heavy_mask.shape, logits.shape)
    except RuntimeError:
        shape = None
    if shape != logits.shape:
        raise ValueError(f"`heavy_mask` must broadcast to the shape of `logits` {tuple(logits.shape)}; got "
                         f"{tuple(heavy_mask.shape)}.")
    light = logits.to(torch.float64).masked_fill(heavy_mask.to(logits.device), float("-inf"))
    return _ratio(torch.logsumexp(light, dim=-1))


def _median(values: torch.Tensor) -> torch.Tensor:
    """The median over the last dimension (the mean of the two middle values for an even count; NaN if any is)."""
    ordered = values.sort(-1).values
    middle = values.shape[-1] // 2
    median = ordered[..., middle] if values.shape[-1] % 2 else (ordered[..., middle - 1] + ordered[..., middle]) / 2
    return median.masked_fill(values.isnan().any(-1), math.nan)


def _hash_draw(q, hashes, bits, generator, hyperplanes):
    """``(*batch, hashes, bits, p)`` float64: the given ``hyperplanes`` (checked) or a new draw."""
    batch, p = tuple(q.shape[:-2]), q.shape[-1]
    if hyperplanes is None:
        return sortlsh.draw_hyperplanes((*batch, hashes), bits, p, generator=as_generator(generator),
                                        device=q.device)
    check_tensor(hyperplanes, "hyperplanes", min_ndim=3)
    if tuple(hyperplanes.shape[:-3]) != batch or hyperplanes.shape[-1] != p:
        raise ValueError(f"`hyperplanes` must have shape (*batch, hashes, bits, p) = {batch} + (hashes, bits, {p}); "
                         f"got {tuple(hyperplanes.shape)}.")
    return hyperplanes.to(device=q.device, dtype=torch.float64)


def _check_hashing(block_size, hashes, bits, order):
    check_int(block_size, "block_size", low=1)
    check_int(hashes, "hashes", low=0)
    check_int(bits, "bits", low=1, high=30)
    check_choice(order, "order", sortlsh.ORDERS)


def _sortlsh_values(q, k, logits, planes, block_size, order) -> torch.Tensor:
    """``(hashes,)``: :math:`\\kappa` of one unmasked problem ``q: (r, p)``, ``k: (c, p)``, ``logits: (r, c)``
    with the sortLSH mask of each hash ``planes: (hashes, bits, p)`` (NaN when one block holds every key)."""
    if k.shape[-2] <= block_size:
        return torch.full((planes.shape[0],), math.nan, dtype=torch.float64, device=q.device)
    return torch.stack([kappa_with_mask(logits, sortlsh.sortlsh_mask(q, k, block_size=block_size, hyperplanes=planes[h],
                                                                      order=order))
                        for h in range(planes.shape[0])])


def sortlsh_kappa(q: torch.Tensor, k: torch.Tensor, *, block_size: int = DEFAULT_BLOCK_SIZE,
                  hashes: int = SORTLSH_HASHES, bits: int = sortlsh.DEFAULT_BITS, order: str = "gray",
                  generator: torch.Generator | None = None, hyperplanes: torch.Tensor | None = None,
                  per_hash: bool = False) -> torch.Tensor:
    r"""HyperAttention's :math:`\kappa` of the unmasked :math:`A = \exp(QK^\top/\sqrt p)` with sortLSH's mask.

    The heavy entries are those the algorithm itself finds (Algorithm 1, :func:`approxlab.sortlsh.sortlsh_mask`):
    each query's sortLSH block of ``block_size`` keys. sortLSH is random, so :math:`\kappa` is measured for
    ``hashes`` independent hashes and summarised by their median.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)`` (computed in float64). For the causal recursion, pass the
        rows and columns of one unmasked block (:func:`block_levels` does).
    block_size : int, default 256
        :math:`b`, sortLSH's block (:data:`approxlab.methods.hyperattention.DEFAULT_BLOCK_SIZE`, the method's
        default and the published code's).
    hashes : int, default 10
        Independent hashes (:data:`SORTLSH_HASHES`).
    bits, order
        sortLSH's hyperplanes per hash and bucket order (:func:`approxlab.sortlsh.bucket_ranks`; ``"gray"``
        is Definition 1 and ``variant="paper"``).
    generator : torch.Generator, optional
        CPU generator of the draw: ``(*batch, hashes, bits, p)`` standard normal hyperplanes
        (:func:`approxlab.sortlsh.draw_hyperplanes`).
    hyperplanes : torch.Tensor, optional
        That draw given explicitly instead (e.g. ``approximate("hyperattention", ...).info["hyperplanes"]
        .unsqueeze(-3)`` for the one hash a run used).
    per_hash : bool, default False
        Return every hash's :math:`\kappa`, ``(*batch, hashes)``, instead of their median.

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64, the median over hashes (the mean of the middle two for an even count), in the
        batch order of ``q`` (the head order of an approximation's per-head error). NaN when ``m <= block_size``:
        one sortLSH block then holds every key, nothing is left to sample and :math:`\kappa` is not used.

    Notes
    -----
    Per row the light sums are ordered, :math:`r^{\text{oracle}}_i \le r^{\text{sortLSH}}_i \le
    r^{\text{none}}_i` when :math:`b \le` ``heavy`` (the oracle removes the largest entries, sortLSH at most
    :math:`b` of them). :math:`\kappa` itself, a ratio of a maximum and a minimum over rows, is **not** ordered:
    removing entries lowers some rows' sums far more than others', so :math:`\kappa` may rise or fall (tested
    with counterexamples). On attention with a sink the oracle removes the sink from every row, sortLSH only
    from the rows that share its block.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, _ = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> sortlsh_kappa(q, k, block_size=16, hashes=5, generator=torch.Generator().manual_seed(1)).shape
    torch.Size([2])
    >>> bool(sortlsh_kappa(q, k, block_size=64, hashes=1, generator=torch.Generator()).isnan().all())
    True
    """
    check_qkv(q, k)
    _check_hashing(block_size, hashes, bits, order)
    check_int(hashes, "hashes", low=1)
    planes = _hash_draw(q, hashes, bits, generator, hyperplanes)
    q64, k64 = (x.detach().to(torch.float64).reshape(-1, *x.shape[-2:]) for x in (q, k))
    planes = planes.reshape(-1, *planes.shape[-3:])
    values = torch.stack([_sortlsh_values(a, b, scaled_logits(a, b), h, block_size, order)
                          for a, b, h in zip(q64, k64, planes)]).reshape(*q.shape[:-2], planes.shape[-3])
    return values if per_hash else _median(values)


def uniform_samples_needed(alpha, *, epsilon: float):
    r"""Uniform samples :math:`m = \alpha/\varepsilon^2`, for :math:`\mathbb E\|\hat Y - PV\|_F^2 \le \varepsilon^2\|V\|_F^2`.

    For an :math:`r \times c` row-stochastic :math:`P` with :math:`\alpha = r\max_j\|Pe_j\|^2`, sampling
    :math:`m` columns uniformly (weight :math:`c/m`) gives
    :math:`\mathbb E\|\hat Y - PV\|_F^2 \le (c/r)(\alpha/m)\|V\|_F^2` (module docstring; the approximate
    matrix product of Drineas, Kannan and Mahoney 2006 with uniform probabilities). For a square block the
    factor :math:`c/r` is 1; pass ``alpha * c / r`` otherwise (:meth:`BlockLevel.samples_needed` does). This is the
    cost criterion of the study, standing in for HyperAttention's :math:`\alpha = n^{o(1)}` (Theorem 1): a
    bound, not the algorithm's error.

    Parameters
    ----------
    alpha : float or torch.Tensor
        :math:`\alpha`, non-negative.
    epsilon : float
        :math:`\varepsilon > 0`, the relative (Frobenius) error aimed at.

    Returns
    -------
    float or torch.Tensor
        :math:`\alpha/\varepsilon^2`, like ``alpha`` (float64 for a tensor).

    Examples
    --------
    >>> uniform_samples_needed(2.0, epsilon=0.1)
    200.0
    """
    epsilon = check_positive_float(epsilon, "epsilon")
    if isinstance(alpha, torch.Tensor):
        if bool((alpha < 0).any()) or bool(alpha.isnan().any()):
            raise ValueError("`alpha` must be non-negative and not NaN; got a tensor with negative or NaN entries.")
        return alpha.to(torch.float64) / epsilon**2
    return check_positive_float(alpha, "alpha", allow_zero=True) / epsilon**2


@dataclasses.dataclass(frozen=True)
class BlockLevel:
    r"""The unmasked blocks of one depth of the causal recursion, and :math:`\alpha`, :math:`\kappa` of each.

    Attributes
    ----------
    depth : int
        0 for the top split (rows :math:`[\lceil n/2\rceil, n)`, columns :math:`[0, \lceil n/2\rceil)`), 1 for
        the blocks of its two halves, and so on.
    rows, columns : tuple of int
        Each block's number of rows (queries) and columns (keys), in the recursion's pre-order.
    alpha : torch.Tensor
        ``(*batch, blocks)``: :math:`\alpha` of each block's own :math:`D_B^{-1}A_B`.
    kappa_oracle, kappa_sortlsh, kappa_all_entries : torch.Tensor
        ``(*batch, blocks)``: :math:`\kappa` with each row's ``heavy`` largest entries removed (at most
        ``columns - 1``), with sortLSH's mask (median over hashes; NaN where ``columns <= block_size`` or
        ``hashes=0``), and with nothing removed.

    The worst block of a depth is what the theorem's guarantee for that depth needs: ``level.alpha.amax(-1)``.

    Examples
    --------
    >>> import torch
    >>> level = BlockLevel(0, (4,), (4,), *(torch.tensor([[2.0]], dtype=torch.float64),) * 4)
    >>> level.samples_needed(epsilon=0.5), level.sampling_saves_nothing(epsilon=0.5)
    (tensor([[8.]], dtype=torch.float64), tensor([[True]]))
    """

    depth: int
    rows: tuple
    columns: tuple
    alpha: torch.Tensor
    kappa_oracle: torch.Tensor
    kappa_sortlsh: torch.Tensor
    kappa_all_entries: torch.Tensor

    def samples_needed(self, *, epsilon: float) -> torch.Tensor:
        r"""``(*batch, blocks)``: :math:`(c/r)\,\alpha/\varepsilon^2` per block (:func:`uniform_samples_needed`)."""
        ratio = torch.tensor([c / r for r, c in zip(self.rows, self.columns)], dtype=torch.float64,
                             device=self.alpha.device)
        return uniform_samples_needed(self.alpha * ratio, epsilon=epsilon)

    def sampling_saves_nothing(self, *, epsilon: float) -> torch.Tensor:
        r"""``(*batch, blocks)`` bool: the samples needed are at least the block's columns."""
        columns = torch.tensor(self.columns, dtype=torch.float64, device=self.alpha.device)
        return self.samples_needed(epsilon=epsilon) >= columns


def _block_row(q, k, planes, heavy, block_size, order) -> list:
    """``[alpha, kappa_oracle, kappa_sortlsh, kappa_all_entries]`` of one unmasked block of one head."""
    logits = scaled_logits(q, k)
    sortlsh_value = (math.nan if planes.shape[0] == 0
                     else float(_median(_sortlsh_values(q, k, logits, planes, block_size, order))))
    return [float(hyperattention_alpha(torch.softmax(logits, dim=-1))),
            float(hyperattention_kappa(logits, heavy=min(heavy, k.shape[-2] - 1))), sortlsh_value,
            float(hyperattention_kappa(logits, heavy=0))]


def block_levels(q: torch.Tensor, k: torch.Tensor, *, block_size: int = DEFAULT_BLOCK_SIZE, min_seq_len: int = 0,
                 heavy: int = HEAVY_PER_ROW, hashes: int = SORTLSH_HASHES, bits: int = sortlsh.DEFAULT_BITS,
                 order: str = "gray", generator: torch.Generator | None = None,
                 hyperplanes: torch.Tensor | None = None) -> list[BlockLevel]:
    r""":math:`\alpha` and :math:`\kappa` on every unmasked block of HyperAttention's causal recursion (Algorithm 4).

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` each (self-attention; computed in float64, one batch element at a time).
    block_size, min_seq_len : int
        The method's ``block_size`` (default 256) and ``min_seq_len`` (default 0): they set where the recursion
        stops (:func:`approxlab.methods.hyperattention.causal_blocks`) and sortLSH's block.
    heavy : int
        Entries per row removed by the oracle mask (:data:`HEAVY_PER_ROW`; at most a block's columns minus 1).
    hashes, bits, order, generator, hyperplanes
        sortLSH's draw, as in :func:`sortlsh_kappa`: one ``(*batch, hashes, bits, p)`` draw, each hash shared
        by every block of a batch element (as the method shares one hash across its recursion). ``hashes=0``:
        no sortLSH :math:`\kappa` (NaN) and no draw.

    Returns
    -------
    list of BlockLevel
        One per depth, from the top split down (empty when ``n <= max(block_size, min_seq_len)``: no block).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, _ = synthetic_qkv((3,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> levels = block_levels(q, k, block_size=8, hashes=0)
    >>> [(level.depth, level.rows, tuple(level.alpha.shape)) for level in levels]
    [(0, (32,), (3, 1)), (1, (16, 16), (3, 2)), (2, (8, 8, 8, 8), (3, 4))]
    """
    check_qkv(q, k)
    check_causal(True, q, k)
    _check_hashing(block_size, hashes, bits, order)
    heavy = check_int(heavy, "heavy", low=0)
    blocks = causal_blocks(q.shape[-2], block_size=block_size, min_seq_len=min_seq_len)
    planes = _hash_draw(q, hashes, bits, generator, hyperplanes) if hashes and blocks else None
    batch = tuple(q.shape[:-2])
    q64, k64 = (x.detach().to(torch.float64).reshape(-1, *x.shape[-2:]) for x in (q, k))
    planes = (torch.empty(q64.shape[0], 0, bits, q.shape[-1], dtype=torch.float64) if planes is None
              else planes.reshape(-1, *planes.shape[-3:]))
    found = torch.tensor([[_block_row(a[block.rows], b[block.columns], h, heavy, block_size, order)
                           for block in blocks] for a, b, h in zip(q64, k64, planes)],
                         dtype=torch.float64).reshape(*batch, len(blocks), 4)
    levels = []
    for depth in sorted({block.depth for block in blocks}):
        where = [i for i, block in enumerate(blocks) if block.depth == depth]
        sizes = [(blocks[i].rows.stop - blocks[i].rows.start, blocks[i].columns.stop - blocks[i].columns.start)
                 for i in where]
        values = found[..., where, :].to(q.device)
        levels.append(BlockLevel(depth, tuple(r for r, _ in sizes), tuple(c for _, c in sizes),
                                 *(values[..., j] for j in range(4))))
    return levels
