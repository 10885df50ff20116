r"""HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff and Zandieh, ICLR 2024).

Softmax attention from the heavy entries that sortLSH finds and a sample of columns, in time linear in
:math:`n` up to the block size and the sample. ``num_features`` is the number :math:`m` of sampled
columns (Algorithm 2's :math:`m` uniform columns and rows, Algorithm 3's :math:`m` rows of :math:`S`);
``block_size`` (:math:`b`) and ``bits`` (:math:`r`, hyperplanes per hash) set sortLSH. Two variants:
``variant="paper"`` (Algorithms 1-3, what Theorem 1 bounds) and ``variant="code"`` (insuhan/hyper-attn).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import sketch, sortlsh
from .._validation import as_generator, check_choice, check_int, check_positive_float
from ._base import Approximation, method
from ._masking import check_key_mask, query_mask
from ._sampled_blocks import (Piece, block_logits, check_uniform_draw, logits_at, merge, operator_from_pieces,
                              piece_output, uniform_entry, uniform_positions, value_weights)

__all__ = ["hyperattention", "HYPERATTENTION", "draw_hyperattention", "num_blocks", "causal_blocks", "CausalBlock",
           "VARIANTS", "DEFAULT_BLOCK_SIZE"]

VARIANTS = ("paper", "code")
DEFAULT_BLOCK_SIZE = 256
"""``block_size`` of insuhan/hyper-attn (``block_size=256``)."""

_UNIFORMS = {"paper": ("row_uniforms", "column_uniforms", "value_uniforms"), "code": ("column_uniforms",)}
"""The uniforms each variant draws per unmasked block, in the order they are drawn."""


class CausalBlock(NamedTuple):
    """One unmasked block of the causal recursion: queries ``rows``, keys ``columns``, at ``depth`` (0: the top split).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.hyperattention import causal_blocks
    >>> top = causal_blocks(8, block_size=2)[0]
    >>> top.depth, torch.arange(8)[top.rows].tolist(), torch.arange(8)[top.columns].tolist()
    (0, [4, 5, 6, 7], [0, 1, 2, 3])
    """

    depth: int
    rows: slice
    columns: slice


def _split(start: int, stop: int, threshold: int):
    """Algorithm 4's split of the causal positions ``[start, stop)``: ``start + ceil((stop - start) / 2)``, or
    None when at most ``threshold`` positions are left (computed exactly)."""
    if stop - start <= threshold:
        return None
    return start + (stop - start + 1) // 2


def causal_blocks(n: int, *, block_size: int = DEFAULT_BLOCK_SIZE, min_seq_len: int = 0) -> list[CausalBlock]:
    r"""The unmasked blocks of the causal recursion on ``n`` positions, in the order the draws use them.

    The causal recursion (Algorithm 4 and the published code) splits positions :math:`[0, n)` at
    :math:`h = \lceil n/2\rceil` into two causal halves and the unmasked block of rows :math:`[h, n)` and
    columns :math:`[0, h)`, until a half has at most :math:`\max(b, \text{min\_seq\_len})` positions (then
    computed exactly). Pre-order: a block, then the blocks of its upper half, then of its lower half.

    Examples
    --------
    >>> from approxlab.methods.hyperattention import causal_blocks
    >>> [(b.depth, b.rows.start, b.rows.stop, b.columns.stop) for b in causal_blocks(1024, block_size=256)]
    [(0, 512, 1024, 512), (1, 256, 512, 256), (1, 768, 1024, 768)]
    """
    n = check_int(n, "n", low=0)
    threshold = max(check_int(block_size, "block_size", low=1), check_int(min_seq_len, "min_seq_len", low=0))
    found = []

    def visit(start, stop, depth):
        half = _split(start, stop, threshold)
        if half is not None:
            found.append(CausalBlock(depth, slice(half, stop), slice(start, half)))
            visit(start, half, depth + 1)
            visit(half, stop, depth + 1)

    visit(0, n, 0)
    return found


def num_blocks(n: int, *, block_size: int = DEFAULT_BLOCK_SIZE, min_seq_len: int = 0, causal: bool = False) -> int:
    """How many unmasked (non-causal) problems one call solves: 1, or those of the causal recursion
    (:func:`causal_blocks`).

    Examples
    --------
    >>> from approxlab.methods.hyperattention import num_blocks
    >>> num_blocks(1024, block_size=256), num_blocks(1024, block_size=256, causal=True)
    (1, 3)
    """
    if not causal:
        return 1
    return len(causal_blocks(n, block_size=block_size, min_seq_len=min_seq_len))


def _check_options(num_features, block_size, bits, variant, min_seq_len):
    check_int(num_features, "num_features", low=1)
    check_int(block_size, "block_size", low=1)
    check_int(bits, "bits", low=1, high=30)
    check_choice(variant, "variant", VARIANTS)
    check_int(min_seq_len, "min_seq_len", low=0)


def _layout(q, num_features, block_size, bits, variant, min_seq_len, causal) -> dict:
    batch = tuple(q.shape[:-2])
    pieces = num_blocks(q.shape[-2], block_size=block_size, min_seq_len=min_seq_len, causal=causal)
    layout = {"hyperplanes": uniform_entry((*batch, bits, q.shape[-1]), "(*batch, bits, p)")}
    for key in _UNIFORMS[variant]:
        layout[key] = uniform_entry((*batch, pieces, num_features), "(*batch, blocks, m)")
    return layout


def draw_hyperattention(q, k, *, num_features, generator=None, block_size=DEFAULT_BLOCK_SIZE, bits=sortlsh.DEFAULT_BITS,
                        variant="paper", min_seq_len=0, causal=False):
    r"""The random draw of :func:`hyperattention`: sortLSH's hyperplanes and the uniforms of the samples.

    Returns
    -------
    dict
        ``hyperplanes`` ``(*batch, bits, p)`` i.i.d. :math:`\mathcal N(0, 1)` (one hash per batch element,
        shared by every block of the causal recursion, as the code shares its ``AngularLSH``), then per
        unmasked block (:func:`num_blocks`, in the recursion's pre-order: a block before the blocks of its
        upper half, then of its lower half) uniforms in ``[0, 1)``, ``(*batch, blocks, m)``:
        ``"paper"``: ``row_uniforms`` (the rows :math:`T` of Algorithm 2), ``column_uniforms`` (its
        columns :math:`\ell_j`), ``value_uniforms`` (the rows of :math:`S`, Algorithm 3); ``"code"``:
        ``column_uniforms`` (the uniformly sampled columns). All float64, drawn on the CPU in this order.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.hyperattention import draw_hyperattention
    >>> q = k = torch.zeros(2, 1024, 8, dtype=torch.float64)
    >>> drawn = draw_hyperattention(q, k, num_features=16, causal=True, generator=torch.Generator().manual_seed(0))
    >>> {key: tuple(value.shape) for key, value in drawn.items()}
    {'hyperplanes': (2, 7, 8), 'row_uniforms': (2, 3, 16), 'column_uniforms': (2, 3, 16), 'value_uniforms': (2, 3, 16)}
    """
    _check_options(num_features, block_size, bits, variant, min_seq_len)
    g = as_generator(generator)
    layout = _layout(q, num_features, block_size, bits, variant, min_seq_len, causal)
    drawn = {"hyperplanes": sortlsh.draw_hyperplanes(q.shape[:-2], bits, q.shape[-1], generator=g, device=q.device)}
    for key in _UNIFORMS[variant]:
        drawn[key] = torch.rand(layout[key].shape, generator=g, dtype=torch.float64).to(q.device)
    return drawn


class _Run:
    """One call: inputs, options and draws, shared by the recursion."""

    def __init__(self, q, k, v, options, draw, key_mask):
        self.q, self.k, self.v = q, k, v
        self.block_size, self.variant, self.kappa, self.clip, self.min_seq_len = options
        self.planes = draw["hyperplanes"]
        self.uniforms = {key: draw[key] for key in _UNIFORMS[self.variant]}
        self.key_mask = key_mask
        self.next_block = 0
        self.pieces: list = []

    def exact(self, rows, columns, causal):
        """All keys ``columns`` of the queries ``rows`` exactly: one piece (causal: keys j <= i only)."""
        q, k = self.q[..., rows, :], self.k[..., columns, :]
        every = torch.arange(k.shape[-2], device=q.device).expand(*q.shape[:-2], -1)
        logits = logits_at(q, k, every)
        if causal:
            logits = logits.masked_fill(~torch.ones_like(logits, dtype=torch.bool).tril(), float("-inf"))
        elif self.key_mask is not None:
            logits = logits.masked_fill(~self.key_mask.unsqueeze(-2), float("-inf"))
        piece = Piece(rows.start or 0, columns.start or 0, columns=every, log_weights=logits, slot=-1)
        return self.finish(piece, piece.log_row_sums(), columns)

    def finish(self, piece, log_row_sums, columns):
        self.pieces.append(piece)
        return piece_output(piece, self.v[..., columns, :], log_row_sums), log_row_sums

    def unmasked(self, rows, columns, depth=0):
        """The non-causal algorithm on queries ``rows`` and keys ``columns``: (output, log row sums)."""
        q, k, v = self.q[..., rows, :], self.k[..., columns, :], self.v[..., columns, :]
        if q.shape[-2] < self.min_seq_len:  # the published code computes short inputs exactly
            self.next_block += 1
            return self.exact(rows, columns, causal=False)
        index = self.next_block
        self.next_block += 1
        uniforms = {key: value[..., index, :] for key, value in self.uniforms.items()}
        mask = self.key_mask
        blocks = sortlsh.heavy_keys(q, k, block_size=self.block_size, hyperplanes=self.planes,
                                    order="gray" if self.variant == "paper" else "code", key_mask=mask,
                                    query_mask=query_mask(mask, q, k))
        heavy = block_logits(q, k, blocks, self.block_size)
        sampled = torch.gather(blocks.key_order, -1, uniform_positions(uniforms["column_uniforms"],
                                                                        blocks.num_real_keys))
        in_block = torch.gather(blocks.key_block, -1, sampled).unsqueeze(-2) == blocks.query_block.unsqueeze(-1)
        residual = logits_at(q, k, sampled).masked_fill_(in_block, float("-inf"))  # (*b, n, m): (1 - M^H) A
        m = residual.shape[-1]
        log_scale = torch.log(blocks.num_real_keys.to(q.dtype) / m).unsqueeze(-1)  # n / m
        if self.variant == "code":
            piece = Piece(rows.start or 0, columns.start or 0, blocks, heavy, self.block_size, sampled,
                          residual + log_scale.unsqueeze(-1), slot=depth)
            return self.finish(piece, piece.log_row_sums(), columns)
        log_row_sums = self._approx_d(q, k, blocks, heavy, residual, log_scale, uniforms["row_uniforms"])
        piece = self._sampled_product(q, k, v, rows, columns, uniforms["value_uniforms"], depth)
        return self.finish(piece, log_row_sums, columns)

    def _approx_d(self, q, k, blocks, heavy, residual, log_scale, row_uniforms):
        r"""Algorithm 2 (ApproxD): :math:`\log\tilde d_i` from the heavy row sums and clipped residual samples."""
        log_heavy = torch.logsumexp(heavy, -1)  # <M^H_i, exp(K q_i)>, exactly
        if self.clip is None:
            return torch.logaddexp(log_heavy, log_scale + torch.logsumexp(residual, -1))
        rows = torch.gather(blocks.query_order, -1, uniform_positions(row_uniforms, blocks.num_real_queries))
        row_logits = logits_at(sketch.gather_rows(q, rows), k, torch.arange(k.shape[-2], device=q.device).expand(
            *q.shape[:-2], -1))  # (*b, m, m_k): the rows T, every key
        heavy_rows = torch.gather(blocks.query_block, -1, rows).unsqueeze(-1) == blocks.key_block.unsqueeze(-2)
        light = row_logits.masked_fill_(heavy_rows | (blocks.key_block.unsqueeze(-2) < 0), float("-inf"))
        log_tau = torch.logsumexp(light, -1).amax(-1, keepdim=True)  # tau: the largest light row sum over T
        m = residual.shape[-1]
        keys = blocks.num_real_keys.to(q.dtype).unsqueeze(-1)
        log_clip = (math.log(self.clip * m) - torch.log(keys) - torch.log(torch.log(keys).clamp_min(1.0))
                    + torch.logaddexp(log_heavy, log_tau - math.log(self.kappa)))  # log C_i
        clipped = torch.minimum(residual, log_clip.unsqueeze(-1))
        return torch.logaddexp(log_heavy, log_scale + torch.logsumexp(clipped, -1))

    def _sampled_product(self, q, k, v, rows, columns, value_uniforms, depth):
        r"""Algorithm 3's :math:`AS^\top S`: ``m`` columns drawn with :math:`p_j = \|v_j\|^2/\|V\|_F^2`."""
        weights = value_weights(v, self.key_mask, 2.0)
        chosen = sketch.inverse_cdf(weights, value_uniforms).to(q.device)
        total = weights.sum(-1, keepdim=True)
        probability = torch.where(total > 0, torch.gather(weights, -1, chosen.to(weights.device)) / total,
                                  1.0 / weights.shape[-1]).to(device=q.device, dtype=q.dtype)
        log_weight = -torch.log(probability * chosen.shape[-1])  # 1 / (m p_j)
        logits = logits_at(q, k, chosen) + log_weight.unsqueeze(-2)
        return Piece(rows.start or 0, columns.start or 0, columns=chosen, log_weights=logits, slot=depth)

    def causal(self, start, stop, depth=0):
        """Causal rows ``start:stop`` (keys ``start:stop``): Algorithm 4's recursion."""
        half = _split(start, stop, max(self.block_size, self.min_seq_len))
        if half is None:
            return self.exact(slice(start, stop), slice(start, stop), causal=True)
        block = self.unmasked(slice(half, stop), slice(start, half), depth)  # pre-order: this block first
        upper, log_upper = self.causal(start, half, depth + 1)
        lower, log_lower = self.causal(half, stop, depth + 1)
        lower, log_lower = merge(lower, log_lower, *block)
        return torch.cat([upper, lower], -2), torch.cat([log_upper, log_lower], -1)


@method(
    "hyperattention",
    target="softmax",
    features="sampled columns m (Algorithms 2-3; block_size and bits set sortLSH)",
    randomized=True,
    draw=draw_hyperattention,
    causal=True,
)
def hyperattention(q, k, v, *, num_features, generator=None, block_size=DEFAULT_BLOCK_SIZE, bits=sortlsh.DEFAULT_BITS,
                   variant="paper", kappa=1.0, clip=1.0, min_seq_len=0, draw=None, key_mask=None, causal=False):
    r"""HyperAttention: sortLSH's heavy blocks and sampled columns, :math:`\tilde D^{-1}\tilde AV`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m_k, p)``, ``(*batch, m_k, p_v)``.
    num_features : int
        :math:`m`, sampled columns, ``1 <= m <= m_k`` (sampled with replacement).
    generator : torch.Generator, optional
        CPU generator for the draw (:func:`draw_hyperattention`).
    block_size : int, default 256
        :math:`b`, sortLSH's block (Algorithm 1): each query's heavy entries are the keys of its block.
    bits : int, default 7
        :math:`r`, hyperplanes of the hash (:math:`2^r` buckets; the code's ``lsh_num_projs=7``).
    variant : {"paper", "code"}
        ``"paper"``: Algorithms 1-3 (see Notes). ``"code"``: insuhan/hyper-attn's ``forward``: the heavy
        blocks exactly plus uniformly sampled residual columns of weight :math:`m_k/m`, normalised by the
        row sums of that same matrix, with the code's bucket order (:mod:`approxlab.sortlsh`).
    kappa : float, default 1.0
        :math:`\kappa` of Algorithm 2 (``"paper"``): it lowers the clipping level through :math:`\tau/\kappa`.
    clip : float or None, default 1.0
        The constant :math:`c` of Algorithm 2's :math:`C_i = c\,\frac{m}{m_k\ln m_k}(h_i + \tau/\kappa)`
        (the paper's :math:`\Theta(\varepsilon^2 m/(n\log n))` with :math:`c` standing for its
        :math:`\varepsilon^2` and constant); ``None``: no clipping (no rows :math:`T`; the plain unbiased
        estimate of the residual row sums).
    min_seq_len : int, default 0
        Inputs with fewer queries than this are computed exactly, and the causal recursion stops at
        :math:`\max(b, \text{min\_seq\_len})` positions (the code's ``min_seq_len``, 4096 there).
    draw : dict, optional
        The draw of :func:`draw_hyperattention` (``approxlab.methods.draw``), instead of ``generator``.
    key_mask : torch.Tensor, optional
        ``(*batch, m_k)`` bool, True on real keys: padded keys are in no block, never sampled, and sort
        after the real ones; the blocks, samples and row sums of real tokens are those of the unpadded input.
    causal : bool, default False
        Algorithm 4's recursion (Section 3.3, and the code's ``causal=True``), see Notes.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` the ``(*batch, n, m_k)`` matrix
        :math:`\tilde D^{-1}\tilde A` (a :class:`~approxlab.operators.RowSparseOperator`, built on request by
        recomputing from the draw); ``info``: ``hyperplanes``, ``log_row_sums`` :math:`\log\tilde d_i`.

    Notes
    -----
    With :math:`A = \exp(QK^\top/\sqrt p)` and :math:`D = \operatorname{diag}(A\mathbf 1)`, Theorem 1 finds a
    diagonal :math:`\tilde D` and a sampling matrix :math:`S` with
    :math:`\|\tilde D^{-1}AS^\top SV - D^{-1}AV\|_2 \le \varepsilon\|D^{-1}A\|_2\|V\|_2` (Eq. (1)), for
    :math:`m` polynomial in :math:`\alpha = n\max_j\|D^{-1}Ae^{(j)}\|^2` and :math:`\kappa`
    (:mod:`approxlab.assumptions`), in time :math:`O(d(nm + \operatorname{nnz}(M^H)))`.

    ``variant="paper"``:

    1. **Algorithm 1 (sortLSH)**: the mask :math:`M^H` of the sorted blocks (:func:`approxlab.sortlsh.heavy_keys`).
    2. **Algorithm 2 (ApproxD)**: :math:`h_i = \langle M^H_{i,:}, A_{i,:}\rangle` exactly; :math:`\tau` the
       largest light row sum :math:`\langle 1 - M^H_{t,:}, A_{t,:}\rangle` over :math:`m` rows :math:`t`
       drawn uniformly (with replacement here: a subset in the paper; :math:`\tau` is a maximum, so a
       repeat only shrinks :math:`T`); :math:`m` columns :math:`\ell_j` uniform; then
       :math:`\tilde d_i = h_i + \frac{m_k}{m}\sum_j\min((1 - M^H_{i\ell_j})A_{i\ell_j}, C_i)`.
    3. **Algorithm 3**: :math:`S` samples :math:`m` columns i.i.d. with :math:`p_j = \|v_j\|^2/\|V\|_F^2`
       (the approximate matrix product of Lemma 2) and weight :math:`1/(mp_j)`; the output is
       :math:`\tilde D^{-1}AS^\top SV`, every column of :math:`A` sampled (the heavy ones enter only
       :math:`\tilde D`). :math:`\mathbb E[AS^\top SV] = AV`, and
       :math:`\mathbb E\|AS^\top SV - AV\|_F^2 = (\|A\|_F^2\|V\|_F^2 - \|AV\|_F^2)/m` (tested).

    **Causal** (Section 3.3, Algorithm 4; the code's ``forward`` with ``causal=True``): positions
    :math:`[0, n)` split at :math:`h = \lceil n/2\rceil`; the two diagonal halves are causal problems of
    their own (recursively, exact at :math:`\max(b, \text{min\_seq\_len})` positions or fewer), the block
    of rows :math:`[h, n)` and columns :math:`[0, h)` is unmasked and gets the non-causal algorithm with its
    own draws; a row's parts add up, :math:`\tilde d_i = \sum\tilde d^{\text{part}}_i` and numerators
    likewise (the code's ``add_self_attentions``). Cost :math:`O(n\log(n/b)(b + m)p)`.

    **Where the published code departs from the paper** (insuhan/hyper-attn ``hyper_attn.py``,
    ``angular_lsh.py``, ``utils.py``, commit 68b91e9), each available as ``variant="code"`` unless noted:

    - the residual columns are sampled uniformly (``torch.randint``, weight :math:`n/m`), and the same
      sample gives the row sums: :math:`\tilde d_i` is the row sum of the approximate matrix
      (self-normalised); there is no clipping and no :math:`\tau`;
    - the heavy blocks are computed exactly and added (the output is
      :math:`\tilde D^{-1}(M^H\odot A + ((1 - M^H)\odot A)S^\top S)V`), so the product samples only the residual;
    - buckets are sorted by ``perm[b]`` :math:`= g(b)`, not by the Gray position :math:`g^{-1}(b)`;
    - one hash (``AngularLSH(dim=(1, 1, d))``) serves every batch element and head (here one per batch
      element; pass a draw with equal hyperplanes to share them);
    - *not reproduced*: lengths that are not a multiple of ``block_size`` are padded with zero keys, which
      enter the softmax of the last block with logit 0; odd causal lengths are padded with a zero row
      (approxlab splits at :math:`\lceil n/2\rceil` and cuts a shorter last block instead);
    - *not reproduced*: in float32 and float64 its ``exact_attention`` ignores ``bias``, the mask that keeps
      sampled keys of a query's own block out of the residual, and the ``cuda=True`` path skips that mask
      too: such keys count twice (once in the block, once with weight :math:`n/m`);
    - ``min_seq_len=4096`` by default (exact attention below it).

    References
    ----------
    Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, "HyperAttention: Long-context Attention in
    Near-Linear Time", ICLR 2024 (arXiv 2310.05869): Definition 1, Algorithms 1-4, Lemmas 1-2, Theorem 1.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 256, 8, generator=torch.Generator().manual_seed(0))
    >>> v = v + 1.0                                            # values with a common direction, as real ones have
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for variant in ("paper", "code"):
    ...     approx = approxlab.approximate("hyperattention", q, k, v, num_features=64, block_size=32, variant=variant,
    ...                                    generator=torch.Generator().manual_seed(1))
    ...     print(variant, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    paper [0.37, 0.23]
    code [0.13, 0.09]
    """
    _check_options(num_features, block_size, bits, variant, min_seq_len)
    kappa = check_positive_float(kappa, "kappa")
    if clip is not None:
        clip = check_positive_float(clip, "clip")
    key_mask = check_key_mask(key_mask, k)
    layout = _layout(q, num_features, block_size, bits, variant, min_seq_len, causal)
    if draw is None:
        draw = draw_hyperattention(q, k, num_features=num_features, generator=generator, block_size=block_size,
                                   bits=bits, variant=variant, min_seq_len=min_seq_len, causal=causal)
    else:
        draw = check_uniform_draw("hyperattention", draw, layout, q.device)
    if key_mask is not None:
        key_mask = key_mask.expand(*k.shape[:-1])
    options = (block_size, variant, kappa, clip, min_seq_len)

    state = _Run(q, k, v, options, draw, key_mask)
    output, log_row_sums = (state.causal(0, q.shape[-2]) if causal
                            else state.unmasked(slice(0, q.shape[-2]), slice(0, k.shape[-2])))
    pieces = state.pieces  # kept for the operator (O(n T), as the operator itself), not computed again

    def build_operator():
        return operator_from_pieces(pieces, log_row_sums, k.shape[-2])

    info = {"hyperplanes": draw["hyperplanes"], "log_row_sums": log_row_sums}
    return Approximation("hyperattention", "softmax", output.to(q.dtype), build_operator, info)


HYPERATTENTION = hyperattention
__test__ = {"hyperattention": hyperattention.function}  # doctest skips a MethodSpec: run its function's examples
