r"""Random-hyperplane locality-sensitive hashing and LSH-based Bernoulli sampling (YOSO).

Shared by :mod:`approxlab.methods.yoso` (YOSO-m) and :mod:`approxlab.methods.yoso_e`
(YOSO-E). Notation follows YOSO (Zeng et al., 2021) [1]_, Section 3:

* a hash :math:`f` concatenates :math:`\tau` random-hyperplane (SimHash) bits,
  :math:`f(x) = \sum_{t=0}^{\tau-1} 2^t\,\mathbb 1[\langle w_t, x\rangle > 0]`,
  :math:`w_t \sim \mathcal N(0, I_p)` i.i.d., so :math:`f(x) \in \{0, \dots, 2^\tau - 1\}`;
* the Bernoulli matrix of one hash is :math:`\mathcal B(Q, K)_{ij} = \mathbb 1[f(Q_i) = f(K_j)]`
  (the display after YOSO Eq. (2)); YOSO-m averages it over :math:`m` independent hashes;
* its expectation is the collision probability
  :math:`\mathbb E[\mathcal B(Q,K)_{ij}] = (1 - \arccos(\hat Q_i^\top \hat K_j)/\pi)^\tau`
  (Charikar, 2002 [2]_; YOSO Section 3.1), with :math:`\hat x = x/\|x\|`.

:func:`bucket_attention` computes :math:`\mathcal B(Q,K)V` by the hash-table accumulation of
YOSO Section 3.2 (Figure 3): values are summed into :math:`2^\tau` buckets per hash and read back
by the query's code, in :math:`O(nmd)` time, never forming the :math:`n \times n` matrix.

References
----------
.. [1] Z. Zeng, Y. Xiong, S. N. Ravi, S. Acharya, G. Fung, V. Singh. "You Only Sample (Almost)
   Once: Linear Cost Self-Attention Via Bernoulli Sampling." ICML 2021.
.. [2] M. S. Charikar. "Similarity estimation techniques from rounding algorithms." STOC 2002.
"""

from __future__ import annotations

import math
import warnings

import torch

from ._validation import as_generator, check_int, check_tensor
from .operators import LinearOperator

__all__ = [
    "MAX_TAU",
    "draw_hyperplanes",
    "hash_codes",
    "collision_probability",
    "collision_matrix",
    "bucket_attention",
    "CollisionOperator",
]

MAX_TAU = 30
"""Largest number of concatenated hyperplanes per hash (codes must fit below ``2**30``)."""

# Elements (of the batch x hashes x buckets x value-dimension work arrays) processed per chunk
# of hashes in :func:`bucket_attention`; bounds its memory independently of ``m``.
_CHUNK_ELEMENTS = 1 << 23


def draw_hyperplanes(
    batch_shape,
    num_hashes: int,
    tau: int,
    p: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device="cpu",
) -> torch.Tensor:
    r"""Independent Gaussian hyperplane normals for ``num_hashes`` hashes of ``tau`` bits each.

    Parameters
    ----------
    batch_shape : tuple of int
        Leading batch dimensions; every batch element gets its own hyperplanes (as in the
        official YOSO code, which draws one projection per sequence and head).
    num_hashes : int
        :math:`m \ge 1`.
    tau : int
        Hyperplanes concatenated per hash, ``1 <= tau <= MAX_TAU``.
    p : int
        Feature dimension.
    generator : torch.Generator, optional
        CPU generator; draws are made on CPU in float64, then cast to ``dtype`` and moved to
        ``device``, so a seed gives the same hyperplanes in every dtype and on every device.

    Returns
    -------
    torch.Tensor
        ``(*batch_shape, num_hashes, tau, p)`` with i.i.d. :math:`\mathcal N(0, 1)` entries.

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import draw_hyperplanes
    >>> planes = draw_hyperplanes((2,), num_hashes=16, tau=4, p=8, generator=torch.Generator().manual_seed(0))
    >>> planes.shape, planes.dtype
    (torch.Size([2, 16, 4, 8]), torch.float64)
    """
    num_hashes = check_int(num_hashes, "num_hashes", low=1)
    tau = check_int(tau, "tau", low=1, high=MAX_TAU)
    p = check_int(p, "p", low=1)
    g = as_generator(generator)
    planes = torch.randn(*batch_shape, num_hashes, tau, p, generator=g, dtype=torch.float64)
    return planes.to(device=device, dtype=dtype)


def hash_codes(x: torch.Tensor, hyperplanes: torch.Tensor) -> torch.Tensor:
    r"""Hash codes :math:`f_h(x_i) = \sum_t 2^t\,\mathbb 1[\langle w_{h,t}, x_i\rangle > 0]` of ``tau`` hyperplanes.

    Parameters
    ----------
    x : torch.Tensor
        ``(*batch, n, p)``. The codes are invariant to positive rescaling of the rows, so
        hashing ``x`` and its row-wise :math:`\ell_2` normalisation gives the same codes. A zero row
        gets code 0 (every bit is ``0 > 0 = False``), which collides with any vector with probability
        :math:`2^{-\tau}` -- the collision probability of an angle of :math:`\pi/2`.
    hyperplanes : torch.Tensor
        ``(*batch, m, tau, p)`` from :func:`draw_hyperplanes`.

    Returns
    -------
    torch.Tensor
        ``(*batch, m, n)`` int64 codes in ``[0, 2**tau)``.

    Notes
    -----
    In float64 on CPU the projections are float32 products and every sign that float32 cannot
    certify is redone in float64 (:func:`_certified_signs`): the codes are float64's, and
    hashing takes 0.56 s instead of 0.85 s at ``(12, 4096, 64)``, m = 256, tau = 8, one thread. The
    products are taken hyperplanes by rows, ``(*batch, chunk * tau, n)``, into buffers reused by every chunk, so
    the ``tau`` bits of a hash are contiguous rows packed straight into the ``(*batch, m, n)`` codes
    (:func:`_pack_bits`; 0.36 s in place of 0.59 s there, the same codes).

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import draw_hyperplanes, hash_codes
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(2, 10, 8, generator=g, dtype=torch.float64)
    >>> planes = draw_hyperplanes((2,), num_hashes=16, tau=4, p=8, generator=g)
    >>> codes = hash_codes(x, planes)
    >>> codes.shape, int(codes.min()) >= 0, int(codes.max()) < 2**4
    (torch.Size([2, 16, 10]), True, True)
    >>> torch.equal(hash_codes(3.0 * x, planes), codes)  # invariant to positive rescaling of the rows
    True
    """
    check_tensor(x, "x")
    check_tensor(hyperplanes, "hyperplanes", min_ndim=3)
    if hyperplanes.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"`hyperplanes` must have shape (*batch, m, tau, {x.shape[-1]}) to hash `x` of shape "
            f"{tuple(x.shape)}; got {tuple(hyperplanes.shape)}."
        )
    m, tau, p = hyperplanes.shape[-3:]
    if tau > MAX_TAU:
        raise ValueError(f"`hyperplanes` must have tau <= {MAX_TAU} bits per hash; got tau={tau}.")
    planes = hyperplanes.to(x.dtype)
    batch = torch.broadcast_shapes(x.shape[:-2], planes.shape[:-3])
    n = x.shape[-2]
    # Hashes go in chunks so the (*batch, chunk * tau, n) projections stay within _CHUNK_ELEMENTS; every chunk's
    # projections and bits are written into the same two buffers (no fresh pages per chunk).
    chunk = min(m, max(1, _CHUNK_ELEMENTS // max(math.prod(batch) * n * tau, 1)))
    # float64 on CPU: signs from float32 products (3x faster than float64's), the doubtful ones
    # redone in float64; only while float32 matmuls are plain IEEE float32 (precision "highest")
    certify = (x.dtype == torch.float64 and x.device.type == "cpu"
               and torch.get_float32_matmul_precision() == "highest")
    if certify:
        x32 = _unit_rows(x).float()
        planes32 = _unit_rows(planes.reshape(*planes.shape[:-3], m * tau, p)).float()
    buffers = _Buffers(math.prod(batch) * chunk * tau * n, x.device, torch.float32 if certify else x.dtype)
    codes = torch.empty(*batch, m, n, dtype=torch.int64, device=x.device)
    for start in range(0, m, chunk):
        block = planes[..., start : start + chunk, :, :]
        h = block.shape[-3]
        flat = block.reshape(*block.shape[:-3], h * tau, p)
        shape = (*batch, h * tau, n)
        if certify:
            bits = _certified_signs(x, flat, x32, planes32[..., start * tau : (start + h) * tau, :], buffers)
        else:
            proj = torch.matmul(flat, x.transpose(-1, -2), out=buffers.view("proj", shape))
            bits = torch.gt(proj, 0, out=buffers.view("bits", shape))
        _pack_bits(bits.view(*batch, h, tau, n), codes[..., start : start + h, :])
    return codes


class _Buffers:
    """Work arrays that every chunk of :func:`hash_codes` reuses: ``view(name, shape)`` is the first ``prod(shape)``
    entries of the buffer ``name`` (the products ``"proj"``, of ``dtype``, or the signs ``"bits"``), contiguous."""

    def __init__(self, size: int, device, dtype):
        self.storage = {"proj": torch.empty(size, device=device, dtype=dtype),
                        "bits": torch.empty(size, device=device, dtype=torch.bool)}

    def view(self, name: str, shape) -> torch.Tensor:
        return self.storage[name][: math.prod(shape)].view(shape)


def _pack_bits(bits: torch.Tensor, out: torch.Tensor) -> None:
    r"""Write :math:`\sum_t 2^t b_t` of the bool ``bits`` ``(..., h, tau, n)`` into the int64 ``out`` ``(..., h, n)``.

    The bits of one hyperplane are a contiguous row of ``n``: the sum is ``tau`` scaled adds of those rows in the
    narrowest integer type that holds :math:`2^\tau - 1` (uint8 up to 8 bits, int32 up to :data:`MAX_TAU`), then one
    copy into ``out``: the integers of the product with the powers of two, without a float copy of the bits.
    """
    tau = bits.shape[-2]
    small = torch.uint8 if tau <= 8 else torch.int32
    data = bits.view(torch.uint8)
    acc = data[..., 0, :].to(small, copy=True)
    for t in range(1, tau):
        acc.add_(data[..., t, :].to(small), alpha=2**t)
    out.copy_(acc)


def _certified_signs(x: torch.Tensor, w: torch.Tensor, x32: torch.Tensor, w32: torch.Tensor,
                     buffers: _Buffers | None = None) -> torch.Tensor:
    r"""Exact signs :math:`\langle x_i, w_j\rangle > 0`, ``(*batch, k, n)`` bool (hyperplane ``j``, row ``i``), from
    float32 products.

    ``x: (*batch, n, p)`` and ``w: (*batch, k, p)`` are float64; ``x32`` and ``w32`` are their
    rows scaled to unit norm (:func:`_unit_rows`) and rounded to float32 (signs are invariant to
    positive scaling). ``buffers``: where the products and the signs are written (:class:`_Buffers`; new
    ones if None).

    Notes
    -----
    Rounding unit rows to float32 and any float32 dot product of length ``p`` (any summation
    order, with or without FMA) is off by at most :math:`\gamma_p(1+u)^2 + 2u + u^2 \le
    1.01\,(p+2)u`, :math:`u = 2^{-24}`, since :math:`|\hat x|^\top|\hat w| \le 1` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Eq. (3.5)), plus at most
    :math:`3p \cdot 2^{-150}` from entries or products below float32's normal range. A float32
    product larger than that radius in magnitude has the exact sign. The rest (about
    :math:`3 \cdot 10^{-5}` of them for unit rows and Gaussian hyperplanes, ``p = 64``) are
    recomputed from ``x`` and ``w`` in float64, so the result is float64's sign wherever float32
    cannot tell it -- what the float64 product gives, at float32's cost.
    """
    shape = torch.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    out = (*shape, w.shape[-2], x.shape[-2])
    buffers = buffers or _Buffers(math.prod(out), x.device, torch.float32)
    proj = torch.matmul(w32, x32.transpose(-1, -2), out=buffers.view("proj", out))
    bits = torch.gt(proj, 0, out=buffers.view("bits", out))
    radius = 1.01 * (x.shape[-1] + 2) * 2.0**-24 + x.shape[-1] * 2.0**-140
    magnitude = proj.abs_()
    planes = torch.nonzero(magnitude.amin(-1) <= radius, as_tuple=True)  # few hyperplanes hold a doubtful sign
    if planes[0].numel():
        doubtful, rows = torch.nonzero(magnitude[planes] <= radius, as_tuple=True)
        where = tuple(index[doubtful] for index in planes)  # (*batch, hyperplane) of each doubtful sign
        ws = w.expand(*shape, *w.shape[-2:])[where]
        xs = x.expand(*shape, *x.shape[-2:])[(*where[:-1], rows)]
        bits[(*where, rows)] = (xs * ws).sum(-1) > 0
    return bits


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` scaled to unit 2-norm (zero rows stay zero); scaled by their largest entry
    first, so the norm neither overflows nor underflows."""
    x = x / x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1.0)


def collision_probability(cosine: torch.Tensor, tau: int) -> torch.Tensor:
    r"""Collision probability of ``tau`` concatenated hyperplane hashes, :math:`(1 - \arccos(c)/\pi)^\tau`.

    The expectation of the Bernoulli matrix (YOSO Section 3.1, the display after Eq. (2);
    Charikar, 2002). ``cosine`` is clamped to ``[-1, 1]`` first, so rounding in
    :math:`\hat q^\top \hat k` never produces NaN.

    Parameters
    ----------
    cosine : torch.Tensor
        Cosines of the angles between unit vectors, any shape.
    tau : int
        ``1 <= tau <= MAX_TAU``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import collision_probability
    >>> cosine = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    >>> collision_probability(cosine, tau=2)  # (1 - angle / pi) ** tau
    tensor([1.0000, 0.2500, 0.0000], dtype=torch.float64)
    """
    check_tensor(cosine, "cosine", min_ndim=0)
    tau = check_int(tau, "tau", low=1, high=MAX_TAU)
    return (1.0 - torch.arccos(cosine.clamp(-1.0, 1.0)) / math.pi) ** tau


def collision_matrix(codes_q: torch.Tensor, codes_k: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    r"""Dense YOSO-m matrix :math:`\frac1m\sum_{h=1}^m \mathbb 1[f_h(Q_i) = f_h(K_j)]`, ``(*batch, n, n_k)``.

    A reference for tests: :math:`O(mn n_k)` time and memory. :func:`bucket_attention` applies the
    same matrix without forming it.

    Parameters
    ----------
    codes_q, codes_k : torch.Tensor
        ``(*batch, m, n)`` and ``(*batch, m, n_k)`` from :func:`hash_codes` (same hashes).
    dtype : torch.dtype, default float64
        Dtype of the returned matrix.

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import collision_matrix
    >>> codes_q = torch.tensor([[0, 1], [2, 2]])  # m = 2 hashes of n = 2 queries
    >>> codes_k = torch.tensor([[0, 0, 1], [2, 3, 2]])  # ... and of n_k = 3 keys
    >>> collision_matrix(codes_q, codes_k)  # the fraction of hashes in which query i and key j collide
    tensor([[1.0000, 0.5000, 0.5000],
            [0.5000, 0.0000, 1.0000]], dtype=torch.float64)
    """
    _check_codes(codes_q, codes_k)
    hits = codes_q.unsqueeze(-1) == codes_k.unsqueeze(-2)  # (*batch, m, n, n_k)
    return hits.to(dtype).mean(-3)


def bucket_attention(codes_q: torch.Tensor, codes_k: torch.Tensor, v: torch.Tensor, *, tau: int) -> torch.Tensor:
    r"""YOSO-m output :math:`\frac1m\sum_h \mathcal B_h(Q,K)V` by hash-table accumulation.

    Implements YOSO Section 3.2 (Figure 3): for each hash :math:`h`, a table
    :math:`H \in \mathbb R^{2^\tau \times d}` receives :math:`H_{f_h(K_j)} \mathrel{+}= V_j`, and query
    :math:`i` reads :math:`H_{f_h(Q_i)} = \sum_j \mathbb 1[f_h(Q_i) = f_h(K_j)]V_j` (YOSO Eq. (1)-(2)).

    Parameters
    ----------
    codes_q, codes_k : torch.Tensor
        ``(*batch, m, n)`` and ``(*batch, m, n_k)`` int64 codes in ``[0, 2**tau)``.
    v : torch.Tensor
        ``(*batch, n_k, d)``.
    tau : int
        Bits per hash.

    Returns
    -------
    torch.Tensor
        ``(*batch, n, d)``.

    Notes
    -----
    Time :math:`O(m(n + n_k)d)`; memory per chunk of hashes :math:`O(2^\tau d)` per hash (YOSO
    Remark 3). Hashes are processed in chunks so memory stays bounded for any ``m``. When
    :math:`2^\tau > n + n_k` the table would be mostly empty, so the occupied buckets are first
    renumbered (``torch.unique``) and the table has one row per occupied bucket instead; the
    result is the same sum. The tables of a chunk are filled by ``index_add_`` (one sparse-dense product for
    few keys) and read out by one sparse CSR product (:func:`_bucket_sums`): 0.29 s in place of 0.48 s for one
    sparse product and one ``embedding_bag`` a chunk (themselves 4.1-4.5x faster than a ``scatter_add_``/``gather``
    per hash), at n = 4096, 12 heads, m = 64, d = 64, float64, the same numbers bit for bit.

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import bucket_attention, collision_matrix, draw_hyperplanes, hash_codes
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    >>> planes = draw_hyperplanes((), num_hashes=32, tau=3, p=8, generator=g)
    >>> codes_q, codes_k = hash_codes(q, planes), hash_codes(k, planes)
    >>> out = bucket_attention(codes_q, codes_k, v, tau=3)
    >>> out.shape
    torch.Size([12, 8])
    >>> torch.allclose(out, collision_matrix(codes_q, codes_k) @ v)  # the matrix is never formed
    True
    """
    _check_codes(codes_q, codes_k)
    check_tensor(v, "v")
    tau = check_int(tau, "tau", low=1, high=MAX_TAU)
    if v.shape[-2] != codes_k.shape[-1]:
        raise ValueError(
            f"`v` must have shape (*batch, {codes_k.shape[-1]}, d) to match `codes_k`; got {tuple(v.shape)}."
        )
    batch = torch.broadcast_shapes(codes_q.shape[:-2], codes_k.shape[:-2], v.shape[:-2])
    m, n = codes_q.shape[-2:]
    n_k, d = v.shape[-2:]
    codes_q = codes_q.expand(*batch, m, n)
    codes_k = codes_k.expand(*batch, m, n_k)
    v = v.expand(*batch, n_k, d)
    num_buckets = 2**tau
    direct = num_buckets <= n + n_k
    # per hash: a table of 2**tau (or, renumbered, at most n + n_k) rows of d, and ~4 int64 per code
    per_hash = math.prod(batch) * ((num_buckets if direct else n + n_k) * max(d, 1) + 4 * (n + n_k))
    chunk = max(1, _CHUNK_ELEMENTS // max(per_hash, 1))
    groups = math.prod(batch)
    v_flat = v.reshape(groups * n_k, d)
    out = v.new_zeros(groups * n, d)
    for start in range(0, m, chunk):
        cq = codes_q[..., start : start + chunk, :].reshape(groups, -1, n)
        ck = codes_k[..., start : start + chunk, :].reshape(groups, -1, n_k)
        h = cq.shape[-2]
        # One table row per (batch element, hash, code): offsets keep groups apart (< 2**63 for tau <= 30).
        offset = torch.arange(groups * h, device=v.device, dtype=torch.int64).reshape(groups, h, 1) * num_buckets
        rows_k, rows_q, num_rows = ck + offset, cq + offset, groups * h * num_buckets
        if not direct:  # renumber the occupied buckets only
            _, inverse = torch.unique(torch.cat([rows_k.reshape(-1), rows_q.reshape(-1)]), return_inverse=True)
            rows_k, rows_q = inverse[: ck.numel()].reshape(ck.shape), inverse[ck.numel() :].reshape(cq.shape)
            num_rows = int(inverse.max()) + 1
        out.add_(_bucket_sums(rows_k, rows_q, v_flat, num_rows))
    return out.reshape(*batch, n, d) / m


def _bucket_sums(rows_k: torch.Tensor, rows_q: torch.Tensor, v_flat: torch.Tensor, num_rows: int) -> torch.Tensor:
    r""":math:`\sum_h H^{(h)}_{r_q(i,h)}` for every query, with tables :math:`H = S V`.

    ``rows_k: (G, h, n_k)`` and ``rows_q: (G, h, n)`` are table rows (distinct across the
    ``G`` batch elements and ``h`` hashes), ``v_flat: (G * n_k, d)``; returns ``(G * n, d)``.
    The tables, :math:`S_{r_k(g,h,j),\,(g,j)} = 1` (each value read once, never copied per hash), by
    :func:`_tables`; the read-out sums each query's ``h`` rows as the product of the tables with the
    query's incidence, a CSR matrix of ``h`` ones per row (the rows' sum in the order of the hashes, as
    ``embedding_bag(mode="sum")``, 1.9x faster at n = 4096, 12 heads, 14 hashes, d = 64, float64), so
    no ``(G, h, n, d)`` array is formed.
    """
    groups, h, n = rows_q.shape
    table = _tables(rows_k, v_flat, num_rows)
    with warnings.catch_warnings():  # valid by construction (columns < num_rows); CSR is "beta" to torch
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled", category=UserWarning)
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        incidence = torch.sparse_csr_tensor(
            torch.arange(0, groups * n * h + 1, h, device=v_flat.device), rows_q.permute(0, 2, 1).reshape(-1),
            torch.ones(groups * n * h, dtype=v_flat.dtype, device=v_flat.device), (groups * n, num_rows),
            check_invariants=False,
        )
    return incidence @ table


TABLE_LOOP_KEYS = 512
"""From this many keys per batch element, :func:`_tables` fills the table of each batch element and hash by its own
``index_add_`` (a table of ``2**tau`` rows stays in cache while it fills: 1.3-1.9x faster than the sparse product
in three runs at n_k = 4096, 12 heads, 14 hashes, d = 64, float64, one thread); below it, one sparse product for the
chunk (fewer calls)."""


def _tables(rows_k: torch.Tensor, v_flat: torch.Tensor, num_rows: int) -> torch.Tensor:
    r"""The hash tables :math:`H_r = \sum_{(g, j):\, r_k(g,h,j) = r} V_{g,j}`, ``(num_rows, d)``, for ``rows_k``
    ``(G, h, n_k)`` and ``v_flat`` ``(G * n_k, d)``: each row's keys summed in their order, by a sparse product
    with the incidence :math:`S` or, from :data:`TABLE_LOOP_KEYS` keys, one ``index_add_`` per batch element and
    hash (the same sums, bit for bit)."""
    groups, h, n_k = rows_k.shape
    if n_k >= TABLE_LOOP_KEYS:
        table = v_flat.new_zeros(num_rows, v_flat.shape[-1])
        values = v_flat.view(groups, n_k, -1)
        for g in range(groups):
            for hash_ in range(h):
                table.index_add_(0, rows_k[g, hash_], values[g])
        return table
    columns = (torch.arange(groups, device=v_flat.device).reshape(groups, 1, 1) * n_k
               + torch.arange(n_k, device=v_flat.device)).expand(groups, h, n_k)
    with warnings.catch_warnings():  # valid by construction: rows < num_rows, columns < G * n_k (CUDA builds warn)
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled", category=UserWarning)
        incidence = torch.sparse_coo_tensor(
            torch.stack([rows_k.reshape(-1), columns.reshape(-1)]),
            torch.ones(rows_k.numel(), dtype=v_flat.dtype, device=v_flat.device),
            (num_rows, v_flat.shape[0]), check_invariants=False,
        )
    return torch.sparse.mm(incidence, v_flat)


class CollisionOperator(LinearOperator):
    r"""The YOSO-m matrix :math:`\frac1m\sum_h \mathcal B_h(Q,K)`, ``(*batch, n, n_k)``, as an operator.

    ``matmat`` is :func:`bucket_attention`; ``rmatmat`` is the same accumulation with the roles of
    queries and keys swapped, since :math:`\mathcal B(Q,K)^\top = \mathcal B(K,Q)` (YOSO Section 3.3).

    Parameters
    ----------
    codes_q, codes_k : torch.Tensor
        ``(*batch, m, n)`` and ``(*batch, m, n_k)`` codes of the same hashes.
    tau : int
        Bits per hash.
    dtype : torch.dtype
        Dtype of the vectors it acts on.

    Examples
    --------
    >>> import torch
    >>> from approxlab.lsh import CollisionOperator, collision_matrix, draw_hyperplanes, hash_codes
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = (torch.randn(12, 8, generator=g, dtype=torch.float64) for _ in range(2))
    >>> planes = draw_hyperplanes((), num_hashes=32, tau=3, p=8, generator=g)
    >>> codes_q, codes_k = hash_codes(q, planes), hash_codes(k, planes)
    >>> B = CollisionOperator(codes_q, codes_k, tau=3, dtype=torch.float64)
    >>> B.shape, B.num_hashes
    ((12, 12), 32)
    >>> y = torch.randn(12, 2, generator=g, dtype=torch.float64)
    >>> torch.allclose(B.rmatmat(y), collision_matrix(codes_q, codes_k).mT @ y)
    True
    """

    def __init__(self, codes_q: torch.Tensor, codes_k: torch.Tensor, *, tau: int, dtype: torch.dtype):
        _check_codes(codes_q, codes_k)
        self.codes_q = codes_q
        self.codes_k = codes_k
        self.tau = check_int(tau, "tau", low=1, high=MAX_TAU)
        batch = torch.broadcast_shapes(codes_q.shape[:-2], codes_k.shape[:-2])
        self.shape = (*batch, codes_q.shape[-1], codes_k.shape[-1])
        self.dtype = dtype
        self.device = codes_q.device

    @property
    def num_hashes(self) -> int:
        return self.codes_q.shape[-2]

    def _matmat(self, x):
        return bucket_attention(self.codes_q, self.codes_k, x, tau=self.tau)

    def _rmatmat(self, y):
        return bucket_attention(self.codes_k, self.codes_q, y, tau=self.tau)

    def to(self, dtype):
        return CollisionOperator(self.codes_q, self.codes_k, tau=self.tau, dtype=dtype)


def _check_codes(codes_q, codes_k):
    for name, codes in (("codes_q", codes_q), ("codes_k", codes_k)):
        if not isinstance(codes, torch.Tensor) or codes.dtype != torch.int64 or codes.ndim < 2:
            if isinstance(codes, torch.Tensor):
                got = f"{codes.dtype} tensor of shape {tuple(codes.shape)}"
            else:
                got = type(codes).__name__
            raise TypeError(f"`{name}` must be an int64 tensor (*batch, m, n) from hash_codes; got {got}.")
    if codes_q.shape[-2] != codes_k.shape[-2]:
        raise ValueError(
            f"`codes_q` and `codes_k` must come from the same m hashes; got m={codes_q.shape[-2]} and "
            f"m={codes_k.shape[-2]}."
        )
