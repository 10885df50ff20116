r"""MagicPIG: attention sinks and a local window exactly, the rest sampled by SimHash collisions and
importance-weighted by the collision probability (Chen et al., 2024); the keys hashed after subtracting the mean
of the keys between the sinks and the window, fixed at prefill, as the authors' code does. The hash tables are
built once per sequence (as bitsets of keys per bucket) and read by every query; logits in row blocks, in the
inputs' dtype.
"""

from __future__ import annotations

import math

import torch

from .. import lsh
from .._validation import as_generator, check_int
from ._base import method
from ..cache._policy import prompt_length_of
from ._masking import check_key_mask
from ._collision_sets import WORD_BITS, below, colliding_keys, pack_bits, unpack_bits
from ._selection import logit_blocks, safe_softmax, sparse_approximation
from ._weighted_keys import BlockLogits, row_block, stack_rows, weighted_output
from .draws import DrawEntry, check_draw

__all__ = ["magicpig", "MAGICPIG", "MAX_TABLES", "draw_tables", "sampling_probability", "collision_counts",
           "sorted_buckets", "centring_keys"]

MAX_TABLES = 4096
"""Largest number of hash tables ``L`` accepted (MagicPIG's configurations use 75 to 300)."""


def sampling_probability(cosine: torch.Tensor, *, bits: int, tables: int, min_collisions: int) -> torch.Tensor:
    r"""The probability that a key collides with the query in at least ``min_collisions`` of ``tables`` tables.

    One table concatenates ``bits`` SimHash bits, so it collides with probability
    :math:`u = (1-\theta/\pi)^K` (:func:`approxlab.lsh.collision_probability`), independently across tables:

    .. math::

        P = 1 - \sum_{s < t}\binom{L}{s} u^s (1-u)^{L-s}
          = -\operatorname{expm1}\Big(L\log(1-u) + \log\sum_{s<t}\binom{L}{s}\big(\tfrac{u}{1-u}\big)^s\Big),

    the second form accurate when :math:`P` is tiny. For :math:`t = 2` this is MagicPIG's
    ``1 - (1-u)^L - L(1-u)^{L-1}u`` (``evaluations/RULER/pred/cache_ref.py``); for :math:`t = 1`,
    sparse-attention-hub's ``1 - (1-u)^L`` (``magic_pig.py``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.magicpig import sampling_probability
    >>> cosine = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    >>> sampling_probability(cosine, bits=1, tables=2, min_collisions=1)  # u = 1, 1/2, 0
    tensor([1.0000, 0.7500, 0.0000], dtype=torch.float64)
    """
    u = lsh.collision_probability(cosine, bits)
    certain = u >= 1
    u = torch.where(certain, torch.full_like(u, 0.5), u)
    ratio = u / (1 - u)
    series = torch.zeros_like(u)
    for s in range(1, min_collisions):  # binomial coefficients through lgamma: no integer overflow
        log_binomial = math.lgamma(tables + 1) - math.lgamma(s + 1) - math.lgamma(tables - s + 1)
        series = series + torch.exp(log_binomial + s * torch.log(ratio))
    log_below = tables * torch.log1p(-u) + torch.log1p(series)
    return torch.where(certain, torch.ones_like(u), -torch.expm1(log_below))


def _log_sampling_probability(cosine: torch.Tensor, *, bits: int, tables: int, min_collisions: int) -> torch.Tensor:
    r""":math:`\log P` of :func:`sampling_probability` in ``cosine``'s dtype, in place on fresh intermediates
    (``-inf`` where :math:`P = 0`): the sampled pairs' weights in :class:`_Decode`. For :math:`t \le 2` the closed
    forms :math:`\log(1 - P) = L\log(1-u)` (:math:`t = 1`) and :math:`(L-1)\log(1-u) + \log(1 + (L-1)u)`
    (:math:`t = 2`, the same sum as :func:`sampling_probability`'s, :math:`1 + Lu/(1-u)` times :math:`(1-u)`), in
    a third of its passes over the pairs; :math:`u = 1` gives :math:`\log(1 - P) = -\infty`, :math:`P = 1`."""
    if min_collisions > 2:
        return torch.log(sampling_probability(cosine, bits=bits, tables=tables, min_collisions=min_collisions))
    u = torch.arccos(cosine.clamp(-1.0, 1.0)).mul_(-1.0 / math.pi).add_(1.0).pow_(bits)  # lsh.collision_probability
    log_below = torch.log1p(u.neg()).mul_(tables - min_collisions + 1)
    if min_collisions == 2:
        log_below.add_(u.mul_(tables - 1).log1p_())
    return log_below.expm1_().neg_().log_()


def draw_tables(q, k, *, num_features, generator=None, bits=8, **options):
    r"""The random draw of :func:`magicpig`: ``L`` tables of ``bits`` Gaussian hyperplanes each.

    Returns ``{"hyperplanes": (*batch, L, bits, p) float64}`` on ``q.device``, one set per batch element
    (:func:`approxlab.lsh.draw_hyperplanes`); ``options`` (MagicPIG's other keywords) are ignored.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.magicpig import draw_tables
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> draw_tables(q, k, num_features=5, bits=3, generator=torch.Generator().manual_seed(0))["hyperplanes"].shape
    torch.Size([2, 5, 3, 4])
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_TABLES)
    bits = check_int(bits, "bits", low=1, high=lsh.MAX_TAU)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    planes = lsh.draw_hyperplanes(batch, num_features, bits, q.shape[-1], generator=as_generator(generator),
                                  dtype=torch.float64, device=q.device)
    return {"hyperplanes": planes}


@method("magicpig", target="softmax", features="hash tables L (each of `bits` concatenated SimHash bits)",
        max_features=MAX_TABLES, randomized=True, draw=draw_tables, causal=True)
def magicpig(q, k, v, *, num_features, generator=None, bits=8, min_collisions=None, sink=0, window=0,
             center=True, draw=None, key_mask=None, causal=False, prompt_length=None):
    r"""MagicPIG: softmax over the sinks, the window and the keys that collide with the query in enough tables,
    each sampled key's weight divided by its probability of being sampled.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        ``L``, the hash tables (``1 <= L <= MAX_TABLES``).
    generator : torch.Generator, optional
        CPU generator for the hyperplanes (:func:`draw_tables`).
    bits : int, default 8
        ``K``, SimHash bits per table (MagicPIG's configurations: K = 8 to 11).
    min_collisions : int, optional
        A key is sampled when it collides with the query in at least this many tables (MagicPIG's 2;
        sparse-attention-hub's masker uses 1). ``1 <= min_collisions <= L``; default ``min(2, L)`` (MagicPIG's
        2, or 1 with a single table).
    sink, window : int, default 0
        Attention sinks (keys ``j < sink``) and the local window (:math:`i - \text{window} < j \le i`),
        attended exactly and never sampled (MagicPIG keeps 4 sinks and a window of 64).
    center : bool, default True
        Hash the keys minus :math:`\bar k`, the mean of the keys between the sinks and the local window fixed at
        prefill (:func:`centring_keys`), as MagicPIG's code does; the query is hashed as it is. Centring shifts
        every logit of a query by the same amount, so it changes which keys collide, not the softmax.
    draw : dict, optional
        ``{"hyperplanes": (*batch, L, bits, p)}`` from :func:`draw_tables`, used instead of ``generator``.
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys that may be attended.
    causal : bool, default False
        Query :math:`i` attends keys :math:`j \le i` only; the rows of the prompt (the prefill) are exact causal
        attention, as MagicPIG's prefill is, and the rows after it decode (see Notes).
    prompt_length : int, optional
        Causal form only: :math:`P`, the prefill (``1 <= P <= n``; default ``n // 2``, as the cache policies'),
        whose keys fix :math:`\bar k`.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`;
        ``info``: ``fixed`` and ``sampled`` ``(*batch, n)`` the keys attended exactly and the keys sampled,
        ``hyperplanes`` the draw.

    Notes
    -----
    **Centring** (``center=True``). MagicPIG's ``SimCache.select_kv_cache`` (``evaluations/RULER/pred/cache_ref.py``)
    splits the prefilled cache into the attended part (the sinks and the last ``window`` tokens) and the sampled
    part between them, subtracts the sampled part's mean :math:`\bar k` from every key before hashing, and keeps
    that mean for the rest of the generation (each generated key is centred by it too). Here
    :math:`\bar k` is the mean of those keys (:func:`centring_keys`): the real keys between the sinks and the
    window, :math:`\text{sink} \le j < m - \text{window}` bidirectionally (the ``m`` keys are the cache) and
    :math:`\text{sink} \le j < \min(P, P - \text{window} + 1)` in the causal form (the prefill's keys that the
    first decoded row samples); with no key there, :math:`\bar k = 0`. In the causal form no row depends on
    a later key: rows :math:`i < P` are the prefill's exact causal attention, and every row :math:`i \ge P`
    reads only keys :math:`j \le i` and :math:`\bar k`, a function of keys before :math:`P`.

    Let :math:`\theta_{ij}` be the angle between :math:`q_i` and the centred key :math:`k_j - \bar k`,
    :math:`P_{ij}` the probability of :func:`sampling_probability`, :math:`F_i` the fixed keys and
    :math:`S_i` the keys colliding with :math:`q_i` in at least ``min_collisions`` of the ``L`` tables. Then
    (MagicPIG, Sec. 4, the self-normalised importance sampling estimator; ``cache_ref.py`` subtracts
    :math:`\log P_{ij}` from the logit before the softmax)

    .. math::

        \tilde o_i = \frac{\sum_{j\in F_i} e^{s_{ij}} v_j + \sum_{j\in S_i\setminus F_i} e^{s_{ij}} v_j / P_{ij}}
                          {\sum_{j\in F_i} e^{s_{ij}} + \sum_{j\in S_i\setminus F_i} e^{s_{ij}} / P_{ij}}.

    Numerator and denominator are each unbiased for the exact ones (:math:`P(j\in S_i) = P_{ij}`), so the ratio
    is consistent; keys whose :math:`P_{ij}` is tiny but which collide get large weights (MagicPIG adds
    :math:`10^{-4}` to :math:`P`, which biases; not done here). A query that collides with nothing and has
    no fixed key gets output 0.

    **Differences from the published code.** MagicPIG draws one projection per layer group, shared across
    heads; here each batch element (sequence and head) gets its own. In the causal form the window slides with
    the query (keys :math:`i - \text{window} < j \le i`) and the keys that leave it are sampled, centred by the
    prefill's :math:`\bar k`; MagicPIG's code attends every generated token exactly and samples only among
    the prefill's keys between the sinks and its last ``window`` tokens. sparse-attention-hub's masker also maps
    keys and queries through the Neyshabur--Srebro transform (keys scaled by the largest key norm and
    augmented, the query normalised) before hashing and centres the query too; here MagicPIG's own choice
    (centred keys, raw query). See the docs page for the comparison on shared hyperplanes.

    **The algorithm** (one pass, in the inputs' dtype: float32 unless they are float64). The keys are centred and
    hashed once (:func:`approxlab.lsh.hash_codes`, float64's codes), and the tables built once per sequence as
    bitsets, one per bucket, of the keys hashed there (:mod:`approxlab.methods._collision_sets`); each query
    that samples reads its :math:`L` buckets into the bitset of keys met in at least ``min_collisions`` of them
    (:math:`O(L\,t\,nm/64)` word operations). In the causal form the prefill's rows are exact attention by
    torch's fused kernel (or, with a key mask, the row-blocked softmax). For each row block of the other rows the
    logits against the keys the block can see come from one product; the cosine of each sampled pair from its
    logit, :math:`\langle q_i, k_j - \bar k\rangle = \sqrt p\, s_{ij} - \langle q_i, \bar k\rangle`; the
    logarithms of the sampled pairs' sampling probabilities only (closed forms for ``min_collisions`` <= 2:
    :func:`_log_sampling_probability`); and the output from one product of the block's coefficients with the
    values. The operator is formed on request, from the same blocks. The float64
    implementation that formed every cosine and probability densely is kept as the reference of
    ``tests/test_sampling_fast_paths.py``: the same sampled sets and outputs to float32 rounding (to 1e-12 in
    float64). ``benchmarks/sampling_methods.py`` times the causal form against torch's fused causal SDPA (its
    results in ``benchmarks/results/sampling_methods.md``).

    References
    ----------
    Z. Chen, R. Sadhukhan, Z. Ye, Y. Zhou, J. Zhang, N. Nolte, Y. Tian, M. Douze, L. Bottou, Z. Jia, B. Chen,
    "MagicPIG: LSH Sampling for Efficient LLM Generation" (2024), arXiv:2410.16179.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 128, 16, scale=1.5, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("magicpig", q, k, v, num_features=150, bits=4, sink=4, window=16,
    ...                                generator=torch.Generator().manual_seed(1))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> bool((approx.output - exact).norm() < 0.5 * exact.norm())
    True
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_TABLES)
    bits = check_int(bits, "bits", low=1, high=lsh.MAX_TAU)
    min_collisions = (min(2, num_features) if min_collisions is None
                      else check_int(min_collisions, "min_collisions", low=1, high=num_features))
    sink = check_int(sink, "sink", low=0)
    window = check_int(window, "window", low=0)
    if not isinstance(center, bool):
        raise TypeError(f"`center` must be a bool; got {type(center).__name__}.")
    key_mask = check_key_mask(key_mask, k)
    if prompt_length is not None and causal is not True:
        raise ValueError(f"`prompt_length` is the prefill of magicpig's causal form: pass causal=True with it; got "
                         f"prompt_length={prompt_length!r} and causal={causal!r}.")
    prompt = prompt_length_of(prompt_length, k.shape[-2]) if causal is True else None
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if draw is None:
        draw = draw_tables(q, k, num_features=num_features, generator=generator, bits=bits)
    else:
        layout = {"hyperplanes": DrawEntry((*batch, num_features, bits, q.shape[-1]),
                                           "(*batch, L, bits, p)")}
        draw = check_draw("magicpig", draw, layout, device=q.device)
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (x.to(compute).expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    mask = None if key_mask is None else key_mask.expand(*batch, k.shape[-2]).reshape(-1, k.shape[-2])
    centre = torch.zeros_like(k[..., :1, :], dtype=torch.float64)  # the mean subtracted before hashing
    if center:
        middle = centring_keys(k.shape[-2], sink=sink, window=window, prompt_length=prompt, key_mask=mask,
                               device=k.device).expand(k.shape[:-1])
        counts = middle.sum(-1, keepdim=True).clamp(min=1).unsqueeze(-1)
        centre = (k.double() * middle.unsqueeze(-1)).sum(-2, keepdim=True) / counts
    hashed = k.double() - centre if center else k.double()
    hyperplanes = draw["hyperplanes"].double().expand(*batch, *draw["hyperplanes"].shape[-3:])
    hyperplanes = hyperplanes.reshape(-1, *hyperplanes.shape[-3:])
    first = 0 if prompt is None else min(prompt, q.shape[-2])  # rows before it: the prefill, exact
    rows = q[..., first:, :].double()
    found = None if not rows.shape[-2] else colliding_keys(  # None: every row is the prefill's
        lsh.hash_codes(rows, hyperplanes), lsh.hash_codes(hashed, hyperplanes), buckets=2 ** bits,
        min_collisions=min_collisions, offset=first if causal else None)
    plan = _Decode(q, k, mask, found, first, centre, hashed, rows, bits=bits, tables=num_features,
                   min_collisions=min_collisions, sink=sink, window=window, causal=bool(causal))
    outputs, fixed_counts, sampled_counts = [], [], []
    if first:
        outputs.append(_exact_rows(q[..., :first, :], k[..., :first, :], v[..., :first, :], mask))
        visible = torch.ones_like(k[..., :first, 0], dtype=torch.long) if mask is None else mask[..., :first].long()
        fixed_counts.append(visible.cumsum(-1))
        sampled_counts.append(torch.zeros_like(fixed_counts[0]))
    for start, stop in plan.blocks():
        coefficients, fixed, sampled = plan.coefficients(start, stop)
        sums = coefficients.sum(-1, keepdim=True)
        outputs.append((coefficients @ v[..., :coefficients.shape[-1], :]) / torch.where(sums > 0, sums,
                                                                                        torch.ones_like(sums)))
        fixed_counts.append(fixed)
        sampled_counts.append(sampled)

    def record():
        prefill = None if mask is None else mask[..., :first]
        blocks = [safe_softmax(logits) for _, _, logits in logit_blocks(q[..., :first, :], k[..., :first, :],
                                                                         causal=True, key_mask=prefill)] if first else []
        blocks += [plan.coefficients(start, stop, keep=True)[0] for start, stop in plan.blocks()]
        indices, weights = stack_rows([weighted_output(block, v[..., :block.shape[-1], :])[1:] for block in blocks],
                                      dtype)
        return indices.view(*batch, *indices.shape[-2:]), weights.view(*batch, *weights.shape[-2:])

    def unflatten(parts):
        joined = torch.cat(parts, dim=-1)
        return joined.view(*batch, joined.shape[-1])

    info = {"fixed": unflatten(fixed_counts), "sampled": unflatten(sampled_counts),
            "hyperplanes": draw["hyperplanes"]}
    if prompt is not None:
        info["prompt_length"] = prompt
    output = torch.cat(outputs, dim=-2)
    return sparse_approximation("magicpig", output.view(*batch, *output.shape[-2:]).to(dtype), k.shape[-2], record,
                                info)


def _exact_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask) -> torch.Tensor:
    r"""Exact causal attention of the prefill ``(B, P, p)``, ``(B, P, p)``, ``(B, P, p_v)`` (keys ``key_mask``
    ``(B, m)`` or None): torch's fused kernel without a mask, else the row-blocked softmax (a row that sees no key
    gets 0, where the kernel would give NaN)."""
    if key_mask is None:
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                                                is_causal=True).squeeze(0)
    return torch.cat([safe_softmax(logits) @ v for _, _, logits in logit_blocks(q, k, causal=True,
                                                                                key_mask=key_mask[..., :q.shape[-2]])],
                     dim=-2)


class _Decode:
    """The rows of MagicPIG that sample (all rows, or those after the prefill), in row blocks: each block's
    coefficients :math:`c_{ij}` over its visible keys from the bitsets of colliding keys (``found``
    ``(B, n - first, W)``, :mod:`._collision_sets`) and the block's logits."""

    def __init__(self, q, k, mask, found, first, centre, hashed, rows, *, bits, tables, min_collisions, sink, window,
                 causal):
        self.q, self.k, self.mask, self.found, self.first = q, k, mask, found, first
        self.options = dict(bits=bits, tables=tables, min_collisions=min_collisions)
        self.sink, self.window, self.causal = sink, window, causal
        tiny = torch.finfo(q.dtype).tiny
        self.mask_words = None if mask is None else pack_bits(mask)
        self.query_centre = (rows @ centre.transpose(-1, -2)).squeeze(-1).to(q.dtype)  # q_i . k_bar
        self.query_norms = rows.norm(dim=-1).to(q.dtype)
        self.key_norms = hashed.norm(dim=-1).to(q.dtype)
        self.tiny = tiny
        self.rows = row_block(q.shape[0], k.shape[-2])
        self.logits = {keep: BlockLogits(q, k, self.rows, reuse=not keep) for keep in (False, True)}

    def blocks(self):
        n = self.q.shape[-2]
        return [(start, min(start + self.rows, n)) for start in range(self.first, n, self.rows)]

    def coefficients(self, start: int, stop: int, *, keep: bool = False):
        """``(coefficients (B, r, w), fixed (B, r), sampled (B, r))`` of rows ``start:stop``: :math:`c_{ij}` on the
        ``w`` keys the block can see (``w = stop`` causally, else ``m``), and the keys fixed and sampled per row.
        The coefficients are written into the buffer of every block unless ``keep``."""
        q, k, p = self.q, self.k, self.q.shape[-1]
        heads, rows, m = q.shape[0], stop - start, k.shape[-2]
        columns = min(stop, m) if self.causal else m
        logits = self.logits[keep](start, stop, columns)
        words = self.found[..., start - self.first:stop - self.first, :-(-columns // WORD_BITS)]
        width = words.shape[-1] * WORD_BITS
        found = unpack_bits(words & self._samplable(start, stop, words.shape[-1]), width)
        # the colliding keys that may be sampled, row-major; row: head * rows + local row
        row, key = found.view(-1, width).nonzero(as_tuple=True)
        flat = row * columns + key
        logit = logits.view(-1).index_select(0, flat)
        centre = self.query_centre[..., start - self.first:stop - self.first].reshape(-1).index_select(0, row)
        norms = self.query_norms[..., start - self.first:stop - self.first].reshape(-1).index_select(0, row)
        norms = norms * self.key_norms.view(-1).index_select(0, (row // rows) * m + key)
        cosine = (logit * math.sqrt(p) - centre) / norms.clamp(min=self.tiny)
        log_probability = _log_sampling_probability(cosine, **self.options)
        drawn = log_probability > -math.inf
        if not bool(drawn.all()):  # a probability that rounds to 0: never sampled
            row, flat, logit, log_probability = row[drawn], flat[drawn], logit[drawn], log_probability[drawn]
        weighted = logit - log_probability.clamp_(min=math.log(self.tiny))
        fixed_row, fixed_flat, fixed = self._fixed_keys(start, stop, columns)
        values, every_row, every_flat = weighted, row, flat
        if fixed_row.numel():  # sinks or a window: their entries first (no copy of the sampled ones without)
            values = torch.cat([logits.view(-1).index_select(0, fixed_flat), weighted])
            every_row, every_flat = torch.cat([fixed_row, row]), torch.cat([fixed_flat, flat])
        peak = torch.zeros(heads * rows, dtype=q.dtype, device=q.device).scatter_reduce_(
            0, every_row, values, "amax", include_self=False)
        coefficients = logits.zero_()
        coefficients.view(-1).index_put_((every_flat,), torch.exp(values - peak.index_select(0, every_row)))
        sampled = torch.bincount(row, minlength=heads * rows).view(heads, rows)
        return coefficients, fixed, sampled

    def _samplable(self, start: int, stop: int, words: int) -> torch.Tensor:
        """``(B or 1, r, words)`` int64 bitsets of the keys row ``i`` may sample: visible (``j <= i`` causally, and
        in the key mask), neither a sink nor in the window."""
        positions = torch.arange(start, stop, device=self.q.device)
        above_sinks = ~below(torch.full_like(positions, self.sink), words)
        if self.causal:
            allowed = above_sinks & below(positions + 1 - self.window, words)
        else:
            allowed = above_sinks & ~(below(positions + 1, words) & ~below(positions + 1 - self.window, words))
        return allowed if self.mask_words is None else allowed & self.mask_words[..., :words].unsqueeze(-2)

    def _fixed_keys(self, start: int, stop: int, columns: int):
        """The sinks and the window of rows ``start:stop`` where visible: ``(row, flat, counts)``, ``row`` and
        ``flat`` their entries' head * rows + row and index in the ``(B, r, columns)`` block, ``counts`` ``(B, r)``."""
        heads, rows = self.q.shape[0], stop - start
        offsets = torch.arange(self.sink + self.window, device=self.q.device)
        positions = torch.arange(start, stop, device=self.q.device).unsqueeze(-1)
        keys = torch.where(offsets < self.sink, offsets, positions - (offsets - self.sink))  # (r, sink + window)
        valid = (keys >= 0) & (keys < columns) & ((offsets < self.sink) | (keys >= self.sink))
        if self.causal:
            valid = valid & (keys <= positions)
        valid = valid.expand(heads, *valid.shape)
        keys = keys.clamp(0, columns - 1).expand_as(valid)
        if self.mask is not None:
            valid = valid & torch.gather(self.mask[..., :columns], -1, keys.flatten(1)).view_as(valid)
        head, row, slot = valid.nonzero(as_tuple=True)
        entry = head * rows + row
        return entry, entry * columns + keys[head, row, slot], valid.sum(-1)


def centring_keys(m: int, *, sink: int, window: int, prompt_length: int | None = None, key_mask=None,
                  device=None) -> torch.Tensor:
    r"""The keys whose mean MagicPIG subtracts before hashing: ``(*batch, m)`` bool (``(m,)`` without a mask).

    The real keys of the prefilled cache that are neither sinks nor in the window of the query reading it
    (MagicPIG's ``select_kv_cache``: ``k_cache[..., num_activate_tokens:-window_size, :]``, whose mean is its
    ``avg_key``). Bidirectionally the cache is the ``m`` keys and the query the last one (position
    :math:`m - 1`, window :math:`m - \text{window} \le j`): :math:`\text{sink} \le j < m - \text{window}`. In the
    causal form the cache is the prefill's :math:`P` keys (``prompt_length``) and the query the first decoded
    one (position :math:`P`, window :math:`P - \text{window} < j \le P`):
    :math:`\text{sink} \le j < \min(P, P - \text{window} + 1)` -- MagicPIG's cache with its window of
    ``window - 1`` prefill tokens, the query's own key attended exactly besides.

    Examples
    --------
    >>> from approxlab.methods.magicpig import centring_keys
    >>> centring_keys(8, sink=2, window=3).int().tolist()  # between the 2 sinks and the last 3 keys
    [0, 0, 1, 1, 1, 0, 0, 0]
    >>> centring_keys(8, sink=1, window=2, prompt_length=4).int().tolist()  # the prefill's 4 keys; row 4's window
    [0, 1, 1, 0, 0, 0, 0, 0]
    """
    end = m - window if prompt_length is None else min(prompt_length, prompt_length - window + 1)
    positions = torch.arange(m, device=device)
    middle = (positions >= sink) & (positions < end)
    return middle if key_mask is None else middle & key_mask


PAIRS_PER_ENTRY = 4
""":func:`collision_counts` gathers the colliding (query, table, key) triples bucket by bucket while they number at
most this many times the (query, key) pairs of the block; beyond (codes crowded into few buckets) it compares the
tables one by one, in the same memory as the block's logits."""


def collision_counts(codes_q: torch.Tensor, codes_k: torch.Tensor, buckets=None) -> torch.Tensor:
    r"""In how many of the ``L`` tables query :math:`i` and key :math:`j` share a code: ``(*batch, r, m)`` int32.

    The counts themselves, where :func:`magicpig` needs only whether they reach ``min_collisions`` (its bitsets,
    :func:`approxlab.methods._collision_sets.colliding_keys`, are checked against these counts).

    ``codes_q`` ``(*batch, L, r)`` and ``codes_k`` ``(*batch, L, m)`` (:func:`approxlab.lsh.hash_codes`);
    ``buckets``: :func:`sorted_buckets` of ``codes_k``, given when the keys serve several blocks of queries.
    Each query's bucket in each table is a run of the sorted keys (two ``searchsorted``), and the collisions are
    the counts of the (query, key) pairs over those runs (``bincount``): :math:`O(L\,r\,m / 2^K)` work for codes
    spread over :math:`2^K` buckets, as MagicPIG's tables are looked up, instead of the :math:`O(L\,r\,m)` code
    comparisons. The counts are the comparisons' exactly.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.magicpig import collision_counts
    >>> codes_q = torch.tensor([[[0, 1], [2, 2]]])  # 1 sequence, 2 tables, 2 queries
    >>> codes_k = torch.tensor([[[0, 0, 1], [2, 3, 2]]])  # 3 keys
    >>> collision_counts(codes_q, codes_k).tolist()
    [[[2, 1, 1], [1, 0, 2]]]
    """
    batch, (tables, r), m = codes_q.shape[:-2], codes_q.shape[-2:], codes_k.shape[-1]
    codes_k = codes_k.expand(*batch, tables, m)
    if buckets is None:
        buckets = sorted_buckets(codes_k)
    sorted_codes, order = (x.expand(*batch, tables, m) for x in buckets)
    if not sorted_codes.is_contiguous():
        sorted_codes = sorted_codes.contiguous()
    codes_q = codes_q.contiguous()
    first = torch.searchsorted(sorted_codes, codes_q)  # (*batch, L, r): each query's run in each table
    counts = (torch.searchsorted(sorted_codes, codes_q, right=True) - first).flatten()
    sequences = int(torch.Size(batch).numel())
    total = int(counts.sum())
    if total > PAIRS_PER_ENTRY * sequences * r * m:  # crowded buckets: compare the codes table by table
        collisions = torch.zeros(*batch, r, m, dtype=torch.int32, device=codes_q.device)
        for table in range(tables):
            collisions += codes_q[..., table, :, None] == codes_k[..., table, None, :]
        return collisions
    # per (sequence, table, query) entry: where its run starts in the flattened order, and its row of the counts
    device = counts.device
    entries = torch.arange(counts.numel(), device=device)
    run_start = (entries // r) * m + first.flatten() - (counts.cumsum(0) - counts)
    row = ((entries // (tables * r)) * r + entries % r) * m
    keys = order.reshape(-1).index_select(0, torch.arange(total, device=device).add_(
        torch.repeat_interleave(run_start, counts)))
    pairs = torch.repeat_interleave(row, counts).add_(keys)
    return torch.bincount(pairs, minlength=sequences * r * m).view(*batch, r, m).to(torch.int32)


def sorted_buckets(codes_k: torch.Tensor) -> tuple:
    """``(codes, order)``: each table's key codes sorted (stable) and the keys in that order, contiguous: the
    buckets of :func:`collision_counts`, formed once for every block of queries.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.magicpig import sorted_buckets
    >>> codes, order = sorted_buckets(torch.tensor([[[3, 1, 3, 0]]]))  # 1 sequence, 1 table, 4 keys
    >>> codes.tolist(), order.tolist()
    ([[[0, 1, 3, 3]]], [[[3, 1, 0, 2]]])
    """
    codes, order = codes_k.sort(dim=-1, stable=True)
    return codes.contiguous(), order.contiguous()


MAGICPIG = magicpig
__test__ = {"magicpig": magicpig.function}  # doctest skips a MethodSpec: run its function's examples
