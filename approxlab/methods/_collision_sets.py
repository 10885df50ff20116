r"""The keys that share a hash code with a query in at least :math:`t` of :math:`L` tables, as bitsets.

MagicPIG (Chen et al., 2024) samples key :math:`j` for query :math:`i` when their SimHash codes agree in at least
:math:`t` of the :math:`L` tables. Here the tables are built once per sequence: table :math:`l`'s bucket
:math:`c` is the bitset :math:`E_{lc}` of the keys whose code is :math:`c` (one bit per key, 64 keys a word, so
a bucket is :math:`\lceil m/64\rceil` words). A query reads its :math:`L` buckets and keeps :math:`t` bitsets
:math:`S_1 \supseteq \dots \supseteq S_t` of the keys met in at least :math:`1, \dots, t` of the tables read so
far -- a saturating counter in unary:

.. math::

    S_s \leftarrow S_s \lor (S_{s-1} \land E_{l c_l(q)}),\ s = t, \dots, 2, \qquad
    S_1 \leftarrow S_1 \lor E_{l c_l(q)},

after which :math:`S_t` is the set. Each step is a word-wise AND and OR over the :math:`\lceil m/64\rceil` words
of a block of queries: :math:`O(L\,t\,n\,m/64)` word operations in all, whatever the buckets' occupancy, in place
of one (query, table, key) triple per collision -- about :math:`nmL/2^K` of them, each a scattered memory access.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["WORD_BITS", "bucket_bitsets", "colliding_keys", "unpack_bits", "pack_bits", "below"]

WORD_BITS = 64
"""Keys per word of a bitset (int64)."""

TABLE_WORDS = 1 << 23
"""Words of the bucket bitsets built at once (64 MiB): the tables are read in groups of this size."""

BLOCK_WORDS = 1 << 17
"""Words of one block of queries' counters (1 MiB, cache resident while the tables of a group are read)."""

_BYTE_BITS = ((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1).bool()
"""Bit ``b`` of byte ``x`` at ``[x, b]``: the little-endian bytes of a word unpacked in order."""


def bucket_bitsets(codes_k: torch.Tensor, buckets: int) -> torch.Tensor:
    r"""``(*tables, buckets, W)`` int64: bit :math:`j \bmod 64` of word :math:`\lfloor j/64\rfloor` of row ``c`` set
    when key ``j`` has code ``c`` in that table; ``codes_k`` ``(*tables, m)`` integers in ``[0, buckets)``,
    :math:`W = \lceil m/64\rceil`.

    A word is the sum of its keys' distinct powers of two, which is their OR (no carries; the key of bit 63 adds
    :math:`-2^{63}`, the two's complement of the same bit pattern).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods._collision_sets import bucket_bitsets
    >>> bucket_bitsets(torch.tensor([[1, 0, 1]]), 2).tolist()  # one table; keys 0 and 2 in bucket 1
    [[[2], [5]]]
    """
    m = codes_k.shape[-1]
    words = -(-m // WORD_BITS)
    keys = torch.arange(m, device=codes_k.device)
    bit = torch.bitwise_left_shift(torch.ones_like(keys), keys % WORD_BITS)
    flat = codes_k.reshape(-1, m)
    table = torch.zeros(flat.shape[0], buckets * words, dtype=torch.int64, device=codes_k.device)
    table.scatter_add_(1, flat * words + keys // WORD_BITS, bit.expand_as(flat))
    return table.view(*codes_k.shape[:-1], buckets, words)


def colliding_keys(codes_q: torch.Tensor, codes_k: torch.Tensor, *, buckets: int, min_collisions: int,
                   offset: int | None = None) -> torch.Tensor:
    r"""``(*batch, r, W)`` int64 bitsets: the keys that share a code with each query in at least ``min_collisions``
    tables (module docstring).

    ``codes_q`` ``(*batch, L, r)`` and ``codes_k`` ``(*batch, L, m)`` (:func:`approxlab.lsh.hash_codes`), integers
    in ``[0, buckets)``; :math:`W = \lceil m/64\rceil` (:func:`unpack_bits` gives the ``(*batch, r, m)`` bool).
    ``offset``: query ``i`` is at position ``offset + i`` and only the words of keys up to the last query of its
    block are read (causal attention: the bits of later keys may be left unset); None: every key.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods._collision_sets import colliding_keys, unpack_bits
    >>> codes_q = torch.tensor([[[0, 1], [2, 2]]])  # 1 sequence, 2 tables, 2 queries
    >>> codes_k = torch.tensor([[[0, 0, 1], [2, 3, 2]]])  # 3 keys
    >>> unpack_bits(colliding_keys(codes_q, codes_k, buckets=4, min_collisions=2), 3).tolist()
    [[[True, False, False], [False, False, True]]]
    """
    batch, (tables, r), m = codes_q.shape[:-2], codes_q.shape[-2:], codes_k.shape[-1]
    codes_q = codes_q.expand(*batch, tables, r).reshape(-1, tables, r)
    codes_k = codes_k.expand(*batch, tables, m).reshape(-1, tables, m)
    words = -(-m // WORD_BITS)
    found = torch.zeros(codes_q.shape[0], min_collisions, r, words, dtype=torch.int64, device=codes_q.device)
    group = max(1, TABLE_WORDS // (buckets * words))
    block = max(1, BLOCK_WORDS // words)
    for sequence in range(codes_q.shape[0]):
        for first in range(0, tables, group):
            table = bucket_bitsets(codes_k[sequence, first:first + group], buckets)
            for start in range(0, r, block):
                stop = min(start + block, r)
                used = words if offset is None else min(words, -(-(offset + stop) // WORD_BITS))
                _count(found[sequence, :, start:stop, :used], table[..., :used],
                       codes_q[sequence, first:first + group, start:stop])
    return found[:, -1].view(*batch, r, words)


def _count(found: torch.Tensor, table: torch.Tensor, codes: torch.Tensor) -> None:
    """Read the buckets ``table`` ``(G, buckets, W)`` of the queries' ``codes`` ``(G, r)`` into ``found``
    ``(t, r, W)`` (in place): ``found[s]`` the keys met in at least ``s + 1`` of the tables so far."""
    scratch = torch.empty_like(found[0])
    for index in range(codes.shape[0]):
        met = table[index].index_select(0, codes[index])
        for level in range(found.shape[0] - 1, 0, -1):
            found[level].bitwise_or_(torch.bitwise_and(found[level - 1], met, out=scratch))
        found[0].bitwise_or_(met)


def unpack_bits(words: torch.Tensor, m: int) -> torch.Tensor:
    """``(*, m)`` bool from ``(*, W)`` int64 bitsets (bit ``j % 64`` of word ``j // 64`` is entry ``j``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods._collision_sets import unpack_bits
    >>> unpack_bits(torch.tensor([[5]]), 4).tolist()
    [[True, False, True, False]]
    """
    shape = words.shape[:-1]
    if sys.byteorder == "little":
        data = words.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
        bits = _BYTE_BITS.to(words.device).index_select(0, data)
    else:  # pragma: no cover - big-endian machines: the shifts, in the words' own order
        bits = (words.unsqueeze(-1) >> torch.arange(WORD_BITS, device=words.device)) & 1
    return bits.view(*shape, -1)[..., :m].bool()


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """``(*, W)`` int64 bitsets of ``(*, m)`` bool ``flags`` (:func:`unpack_bits`'s inverse).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods._collision_sets import pack_bits
    >>> pack_bits(torch.tensor([[True, False, True, False]])).tolist()
    [[5]]
    """
    m = flags.shape[-1]
    keys = torch.arange(m, device=flags.device)
    bits = torch.bitwise_left_shift(torch.ones_like(keys), keys % WORD_BITS) * flags
    words = torch.zeros(*flags.shape[:-1], -(-m // WORD_BITS), dtype=torch.int64, device=flags.device)
    return words.scatter_add_(-1, (keys // WORD_BITS).expand_as(bits), bits)


def below(limits: torch.Tensor, words: int) -> torch.Tensor:
    """``(*, words)`` int64 bitsets of the entries ``j < limit`` for each of the integer ``limits`` ``(*)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods._collision_sets import below, unpack_bits
    >>> unpack_bits(below(torch.tensor([0, 3, 70]), 2), 72).sum(-1).tolist()
    [0, 3, 70]
    """
    count = (limits.unsqueeze(-1) - WORD_BITS * torch.arange(words, device=limits.device)).clamp(0, WORD_BITS)
    ones = torch.bitwise_left_shift(torch.ones_like(count), count.clamp(max=WORD_BITS - 1)) - 1
    return torch.where(count == WORD_BITS, torch.full_like(count, -1), ones)
