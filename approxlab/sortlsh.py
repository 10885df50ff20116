r"""Hamming-sorted LSH (sortLSH): the blocks of attention where the heavy entries are.

Shared by :mod:`approxlab.methods.hyperattention` and :mod:`approxlab.methods.kdeformer`; built on the
random-hyperplane hashing of :mod:`approxlab.lsh`.

**The hash.** ``r`` random hyperplanes :math:`w_0, \dots, w_{r-1} \sim \mathcal N(0, I_p)` put a vector
in one of :math:`2^r` buckets, :math:`b(x) = \sum_t 2^t\,\mathbb 1[\langle w_t, x\rangle > 0]` (SimHash,
Charikar 2002 [3]_), and two vectors at angle :math:`\theta` share a bucket with probability
:math:`(1 - \theta/\pi)^r`.

**The order.** HyperAttention's Definition 1 [1]_ (a *Hamming sorted LSH*) orders the buckets so that adjacent
buckets differ in one bit, so that near vectors land in the same or in adjacent buckets: the reflected
Gray code order :math:`g(0), g(1), \dots, g(2^r - 1)`, :math:`g(t) = t \oplus \lfloor t/2\rfloor`. The
position of bucket :math:`b` in it is the inverse Gray code :math:`g^{-1}(b)` (``order="gray"``).
KDEformer [2]_ (Section 4, Figure 6) sorts by the same "Hamming distance ordering".

Both published implementations (insuhan/hyper-attn ``angular_lsh.py``, majid-daliri/kdeformer
``KDEformer.py``) build the array ``perm`` :math:`= [g(0), \dots, g(2^r - 1)]` and sort by
``perm[b]`` :math:`= g(b)`, not by :math:`g^{-1}(b)`: adjacent positions then hold buckets that differ
in one bit except at some steps (for :math:`r = 3` the buckets come in the order 0, 1, 3, 2, 7, 6, 4, 5,
and 2 -> 7 differs in two bits). ``order="code"`` reproduces that order.

**Algorithm 1 of HyperAttention** (sortLSH for locating large entries of :math:`A`): sort the queries
and the keys by the position of their bucket (permutations :math:`P_Q`, :math:`P_K`; ties keep the token
order, a stable sort), cut both sorted orders into blocks of ``block_size`` :math:`b` and keep the
entries whose query and key share a block,

.. math::

    M^H_{ij} = \mathbb 1\big[\lfloor P_Q(i)/b\rfloor = \lfloor P_K(j)/b\rfloor\big].

With :math:`n` queries and :math:`m \ne n` keys, sorted query position :math:`r` sits at key position
:math:`r\,m/n` (block :math:`\lfloor r m/(n b)\rfloor`): the queries are cut into as many blocks as the
keys, as in both published codes (``query_block_size = n_query // num_blocks``). The mask has at most
:math:`b` entries per row; :func:`heavy_keys` lists them without forming the :math:`n \times m` mask
(:math:`O((n + m)(rp + \log n))` work), :func:`sortlsh_mask` forms it for analysis.

**Padding.** With ``key_mask`` (and ``query_mask``), padded rows sort after every real one whatever
their content, and the blocks are cut in the real rows only: the blocks of the real tokens are those of
the unpadded sequence.

Public API::

    ORDERS                                          # ("gray", "code")
    draw_hyperplanes(batch_shape, bits, p, *, generator=None, device="cpu") -> (*batch, bits, p) float64
    bucket_ranks(x, hyperplanes, *, order="gray") -> (*batch, n) int64
    sorted_order(x, hyperplanes, *, order="gray", row_mask=None) -> (*batch, n) int64
    heavy_keys(q, k, *, block_size, hyperplanes, order="gray", key_mask=None, query_mask=None) -> HeavyBlocks
    sortlsh_mask(q, k, *, block_size, hyperplanes=None, bits=7, generator=None, order="gray",
                 key_mask=None, query_mask=None) -> (*batch, n, m) bool

References
----------
.. [1] I. Han, R. Jayaram, A. Karbasi, V. Mirrokni, D. P. Woodruff, A. Zandieh. "HyperAttention:
   Long-context Attention in Near-Linear Time." ICLR 2024 (arXiv 2310.05869): Definition 1, Algorithm 1.
.. [2] A. Zandieh, I. Han, M. Daliri, A. Karbasi. "KDEformer: Accelerating Transformers via Kernel
   Density Estimation." ICML 2023 (arXiv 2302.02451): Section 4.
.. [3] M. S. Charikar. "Similarity estimation techniques from rounding algorithms." STOC 2002.
"""

from __future__ import annotations

import dataclasses

import torch

from . import lsh
from ._validation import as_generator, check_choice, check_int, check_tensor

__all__ = ["ORDERS", "DEFAULT_BITS", "draw_hyperplanes", "bucket_ranks", "sorted_order", "HeavyBlocks",
           "heavy_keys", "sortlsh_mask"]

ORDERS = ("gray", "code")
"""Bucket orders: ``"gray"`` (Definition 1 of HyperAttention: adjacent buckets differ in one bit) and
``"code"`` (the published codes' ``perm[bucket]``)."""

DEFAULT_BITS = 7
"""Hyperplanes per hash in both published codes (``lsh_num_projs=7``, ``num_projs=7``): 128 buckets."""


def draw_hyperplanes(batch_shape, bits: int, p: int, *, generator: torch.Generator | None = None,
                     device="cpu") -> torch.Tensor:
    r"""The ``bits`` hyperplane normals of one sortLSH hash per batch element: ``(*batch_shape, bits, p)``.

    Drawn as :func:`approxlab.lsh.draw_hyperplanes` draws one hash (i.i.d. :math:`\mathcal N(0, 1)`, on
    the CPU in float64, then moved to ``device``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import draw_hyperplanes
    >>> draw_hyperplanes((2, 3), 7, 16, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([2, 3, 7, 16])
    """
    bits = check_int(bits, "bits", low=1, high=lsh.MAX_TAU)
    planes = lsh.draw_hyperplanes(tuple(batch_shape), 1, bits, p, generator=as_generator(generator), device=device)
    return planes[..., 0, :, :]


def _check_hyperplanes(hyperplanes, x: torch.Tensor) -> torch.Tensor:
    check_tensor(hyperplanes, "hyperplanes", min_ndim=2)
    if hyperplanes.shape[-1] != x.shape[-1] or hyperplanes.shape[-2] > lsh.MAX_TAU:
        raise ValueError(f"`hyperplanes` must have shape (*batch, bits, {x.shape[-1]}) with bits <= {lsh.MAX_TAU}; "
                         f"got {tuple(hyperplanes.shape)}.")
    return hyperplanes


def bucket_ranks(x: torch.Tensor, hyperplanes: torch.Tensor, *, order: str = "gray") -> torch.Tensor:
    r"""The position of each row's bucket in the bucket order: ``(*batch, n)`` int64 in ``[0, 2**bits)``.

    Parameters
    ----------
    x : torch.Tensor
        ``(*batch, n, p)``. Hashed in float64 (float32 rows are cast first, so float32 and float64 inputs
        and CPU and GPU runs sort alike; signs float32 cannot certify are those of the float64 product,
        :func:`approxlab.lsh.hash_codes`).
    hyperplanes : torch.Tensor
        ``(*batch, bits, p)`` from :func:`draw_hyperplanes` (batch dimensions broadcast).
    order : {"gray", "code"}
        ``"gray"``: :math:`g^{-1}(b)`, the inverse reflected Gray code of the bucket :math:`b` (Definition 1
        of HyperAttention); ``"code"``: :math:`g(b) = b \oplus \lfloor b/2\rfloor`, the published codes'
        ``perm[b]`` (see the module docstring).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import bucket_ranks
    >>> planes = torch.eye(3, dtype=torch.float64)             # bit t: is coordinate t positive?
    >>> x = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 1.0, 1.0]], dtype=torch.float64)   # buckets 3 and 6
    >>> bucket_ranks(x, planes).tolist(), bucket_ranks(x, planes, order="code").tolist()
    ([2, 4], [2, 5])
    """
    check_tensor(x, "x")
    _check_hyperplanes(hyperplanes, x)
    check_choice(order, "order", ORDERS)
    bits = hyperplanes.shape[-2]
    codes = lsh.hash_codes(x.to(torch.float64), hyperplanes.to(device=x.device, dtype=torch.float64).unsqueeze(-3))
    codes = codes[..., 0, :]
    if order == "code":
        return codes ^ (codes >> 1)
    shift = 1
    while shift < bits:  # inverse Gray code: prefix XOR of the higher bits
        codes = codes ^ (codes >> shift)
        shift *= 2
    return codes


def sorted_order(x: torch.Tensor, hyperplanes: torch.Tensor, *, order: str = "gray",
                 row_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The permutation :math:`P^{-1}` that sorts the rows of ``x`` by bucket: ``(*batch, n)`` int64.

    Entry ``r`` is the row at sorted position ``r``. The sort is stable (rows of one bucket keep their
    order, as ``torch.sort(..., stable=True)`` in insuhan/hyper-attn). Rows where ``row_mask``
    ``(*batch, n)`` is False sort after every real row.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import sorted_order
    >>> planes = torch.eye(3, dtype=torch.float64)
    >>> x = torch.tensor([[-1.0, 1.0, 1.0], [1.0, 1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    >>> sorted_order(x, planes).tolist()                       # buckets 6, 3, 0 at Gray positions 4, 2, 0
    [2, 1, 0]
    """
    ranks = bucket_ranks(x, hyperplanes, order=order)
    if row_mask is not None:
        ranks = ranks.masked_fill(~row_mask.to(ranks.device), 1 << hyperplanes.shape[-2])
    return torch.sort(ranks, dim=-1, stable=True).indices


@dataclasses.dataclass
class HeavyBlocks:
    r"""Which keys share a sortLSH block with each query (the nonzeros of :math:`M^H`, row by row).

    Attributes
    ----------
    keys : torch.Tensor
        ``(*batch, n, b)`` int64: the keys of query ``i``'s block (entries past the block's end repeat a
        key and are invalid).
    valid : torch.Tensor
        ``(*batch, n, b)`` bool: which entries of ``keys`` are real members of the block.
    query_block, key_block : torch.Tensor
        ``(*batch, n)``, ``(*batch, m)`` int64: the block of each query and key, in token order (padded
        keys: -1, in no block).
    query_order, key_order : torch.Tensor
        ``(*batch, n)``, ``(*batch, m)``: the sorting permutations (:func:`sorted_order`), real rows first.
    num_real_keys, num_real_queries : torch.Tensor
        ``(*batch,)`` int64: the real keys and queries (all of them without masks).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import heavy_keys
    >>> q = k = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.1], [-1.0, 0.1]], dtype=torch.float64)
    >>> blocks = heavy_keys(q, k, block_size=2, hyperplanes=torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    >>> blocks.key_order.tolist(), blocks.key_block.tolist()   # bucket 0 (x < 0) first, then bucket 1
    ([1, 3, 0, 2], [1, 0, 1, 0])
    >>> blocks.keys[0].tolist()                                 # query 0 shares its block with keys 0 and 2
    [0, 2]
    """

    keys: torch.Tensor
    valid: torch.Tensor
    query_block: torch.Tensor
    key_block: torch.Tensor
    query_order: torch.Tensor
    key_order: torch.Tensor
    num_real_keys: torch.Tensor
    num_real_queries: torch.Tensor


def _real_counts(mask, batch, n, device) -> torch.Tensor:
    if mask is None:
        return torch.full(batch, n, dtype=torch.long, device=device)
    return mask.expand(*batch, n).sum(-1)


def heavy_keys(q: torch.Tensor, k: torch.Tensor, *, block_size: int, hyperplanes: torch.Tensor,
               order: str = "gray", key_mask: torch.Tensor | None = None,
               query_mask: torch.Tensor | None = None) -> HeavyBlocks:
    r"""The sortLSH blocks of Algorithm 1 of HyperAttention, listed per query (no :math:`n \times m` array).

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``.
    block_size : int
        :math:`b \ge 1`, keys per block.
    hyperplanes : torch.Tensor
        ``(*batch, bits, p)`` (:func:`draw_hyperplanes`); queries and keys are hashed with the same ones.
    order : {"gray", "code"}
        The bucket order (:func:`bucket_ranks`).
    key_mask, query_mask : torch.Tensor, optional
        ``(*batch, m)`` / ``(*batch, n)`` bool, True on real rows: padded keys are in no block, and the
        blocks are cut in the real rows only.

    Returns
    -------
    HeavyBlocks
        Query ``i``'s keys are ``keys[..., i, :][valid[..., i, :]]``: the real keys at sorted positions
        :math:`[\beta_i b, (\beta_i + 1) b)`, :math:`\beta_i = \lfloor r_i R_k/(R_q b)\rfloor` for query
        ``i`` at sorted position :math:`r_i` among :math:`R_q` real queries and :math:`R_k` real keys
        (:math:`\lfloor r_i/b\rfloor` in self-attention).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import draw_hyperplanes, heavy_keys
    >>> g = torch.Generator().manual_seed(0)
    >>> q = k = torch.randn(10, 4, generator=g, dtype=torch.float64)
    >>> blocks = heavy_keys(q, k, block_size=4, hyperplanes=draw_hyperplanes((), 3, 4, generator=g))
    >>> blocks.keys.shape, sorted(blocks.valid.sum(-1).tolist())   # blocks of 4, 4 and 2 keys
    (torch.Size([10, 4]), [2, 2, 4, 4, 4, 4, 4, 4, 4, 4])
    """
    check_tensor(q, "q")
    check_tensor(k, "k")
    block_size = check_int(block_size, "block_size", low=1)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], hyperplanes.shape[:-2])
    n, m, device = q.shape[-2], k.shape[-2], q.device
    key_order = sorted_order(k, hyperplanes, order=order, row_mask=key_mask).expand(*batch, m)
    query_order = sorted_order(q, hyperplanes, order=order, row_mask=query_mask).expand(*batch, n)
    real_k = _real_counts(key_mask, batch, m, device)
    real_q = _real_counts(query_mask, batch, n, device)
    positions_q = torch.arange(n, device=device)
    blocks_q = (positions_q * real_k.unsqueeze(-1)) // (real_q.unsqueeze(-1) * block_size)
    last = ((real_k - 1) // block_size).unsqueeze(-1)
    blocks_q = torch.where(positions_q < real_q.unsqueeze(-1), blocks_q, last)  # padded queries: any real block
    positions_k = torch.arange(m, device=device)
    blocks_k = torch.where(positions_k < real_k.unsqueeze(-1), positions_k // block_size, -1)
    query_block = torch.empty_like(blocks_q).scatter_(-1, query_order, blocks_q)
    key_block = torch.empty(*batch, m, dtype=torch.long, device=device).scatter_(-1, key_order, blocks_k)
    start = (query_block * block_size).unsqueeze(-1) + torch.arange(block_size, device=device)  # (*b, n, b)
    valid = start < real_k.reshape(*batch, 1, 1)
    keys = torch.gather(key_order.unsqueeze(-2).expand(*batch, n, m), -1, start.clamp_max(m - 1))
    return HeavyBlocks(keys, valid, query_block, key_block, query_order, key_order, real_k, real_q)


def sortlsh_mask(q: torch.Tensor, k: torch.Tensor, *, block_size: int, hyperplanes: torch.Tensor | None = None,
                 bits: int = DEFAULT_BITS, generator: torch.Generator | None = None, order: str = "gray",
                 key_mask: torch.Tensor | None = None, query_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The heavy-entry mask :math:`M^H` of sortLSH (Algorithm 1 of HyperAttention): ``(*batch, n, m)`` bool.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``.
    block_size : int
        :math:`b`, the block size (HyperAttention's ``block_size``, KDEformer's ``Bucket_size``).
    hyperplanes : torch.Tensor, optional
        ``(*batch, bits, p)``; drawn from ``generator`` (:func:`draw_hyperplanes`) when not given, e.g.
        ``approximate("hyperattention", ...).info["hyperplanes"]`` to get the mask a run used.
    bits : int, default 7
        Hyperplanes of a new draw (ignored with ``hyperplanes``).
    generator : torch.Generator, optional
        CPU generator for a new draw.
    order, key_mask, query_mask
        As for :func:`heavy_keys`.

    Returns
    -------
    torch.Tensor
        ``(*batch, n, m)`` bool, True where query and key share a block: at most ``block_size`` per row,
        exactly ``block_size`` in every row of a self-attention whose length is a multiple of it. Formed
        densely (:math:`nm` entries): for analysis, e.g. HyperAttention's :math:`\kappa` with the mask the
        algorithm finds (:mod:`approxlab.assumptions`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sortlsh import sortlsh_mask
    >>> g = torch.Generator().manual_seed(0)
    >>> q = k = torch.randn(3, 16, 8, generator=g, dtype=torch.float64)
    >>> mask = sortlsh_mask(q, k, block_size=4, generator=g)
    >>> mask.shape, mask.sum(-1).unique().tolist()
    (torch.Size([3, 16, 16]), [4])
    """
    check_tensor(q, "q")
    if hyperplanes is None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        hyperplanes = draw_hyperplanes(batch, bits, q.shape[-1], generator=generator, device=q.device)
    blocks = heavy_keys(q, k, block_size=block_size, hyperplanes=hyperplanes, order=order, key_mask=key_mask,
                        query_mask=query_mask)
    return blocks.query_block.unsqueeze(-1) == blocks.key_block.unsqueeze(-2)
