r"""The quantities the fast-attention theorems assume, measured on real attention matrices.

With :math:`s_{ij} = q_i^\top k_j/\sqrt p`, :math:`A = \exp(S)` (the causal pattern :math:`j \le i`
applied when ``causal``) and the row-stochastic :math:`P = D^{-1}A`, :math:`D = \operatorname{diag}(A\mathbf 1)`:

HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, ICLR 2024; :mod:`.hyperattention`)
    **alpha** -- the largest squared column norm of :math:`P`, times :math:`n`:
    :math:`\alpha = n\max_j\|D^{-1}Ae^{(j)}\|_2^2`; their analysis assumes
    :math:`\|D^{-1}Ae^{(j)}\|_2^2 \le \alpha/n` for every column with :math:`\alpha = n^{o(1)}`
    (Section 1.1 and Theorem 1). It lies in :math:`[\|P\|_F^2, n^2]`.
    **kappa** -- the ratio of the largest to the smallest row sum of the *unnormalised* :math:`A`
    after its heavy entries are removed: :math:`\kappa = \max_i\langle\mathbf 1 - M^H_{i,:}, A_{i,:}\rangle
    / \min_j\langle\mathbf 1 - M^H_{j,:}, A_{j,:}\rangle` with the heavy-entry mask :math:`M^H`
    (found by sortLSH in their algorithm; Lemma 1, "Approximating D", and Theorem 1 assume
    :math:`\kappa = n^{o(1)}`). Three masks: the oracle (each row's ``heavy`` largest entries;
    ``kappa``, also ``kappa_oracle``), sortLSH's own at the method's block size (``kappa_sortlsh``,
    the median over ``hashes`` hashes) and none (``kappa_all_entries``).

    *Causal masking.* Row 0 of a causal :math:`P` is :math:`e_0^\top`, so :math:`\|Pe_0\|^2 \ge 1`
    and :math:`\alpha \ge n` for **every** causal attention matrix (:data:`STRUCTURAL`); and the masked
    rows have :math:`1, 2, \dots, n` entries, so their row sums differ by a factor of order :math:`n`
    before any heavy entry is removed. HyperAttention therefore does not apply its theorem to the causal
    matrix: its causal algorithm (Algorithm 4, "Causal Approx D") splits :math:`A` into the two causal
    diagonal blocks, handled recursively, and the unmasked lower-left block, handled by the non-causal
    algorithm. :func:`measure_assumptions` reports :math:`\alpha` of the whole causal :math:`P` (as defined;
    structural) and :math:`\alpha`, :math:`\kappa` of the top-level block :math:`A_{[\lfloor n/2\rfloor, n),
    [0, \lfloor n/2\rfloor)}` (``alpha_block``, ``kappa*``; the block's own :math:`D_B^{-1}A_B`), where the
    theorem's assumptions are used; :func:`block_levels` measures every block of every depth of the
    recursion (split at :math:`\lceil n/2\rceil` as the method does; the same block for even :math:`n`),
    and what uniform sampling of each would need (:func:`uniform_samples_needed`).

Alman and Song, "Fast Attention Requires Bounded Entries" (NeurIPS 2023; :mod:`.bounded_entries`)
    Their :math:`B` for the model's own split (``entry_bound``), for the best rescaled split
    (``entry_bound_balanced``), and the split-invariant lower bound :math:`\sqrt{\max_{j\le i}|s_{ij}|}`
    (from ``logit_bound``), each over :math:`\sqrt{\ln n}` (``entry_ratio``, ``entry_ratio_model_split``,
    ``entry_ratio_balanced_split``), and :func:`bounded_entries_label`: "fails for every split" where the
    lower bound exceeds the (conventional) threshold 1, else "undetermined".

Performer (Choromanski et al., ICLR 2021; :mod:`.performer`)
    ``performer_xy_norm``: the attention-weighted median of :math:`\|x_i + y_j\|^2`,
    :math:`x = q/p^{1/4}`, :math:`y = k/p^{1/4}`; Lemma 2 puts an entry's relative variance with :math:`r`
    positive features at :math:`(e^{\|x+y\|^2} - 1)/r`. :func:`relative_error_at_scale` is the control.

Attention sinks and rank
    ``sink_mass``: the mean over rows :math:`i \ge 1` of :math:`P_{i0}`, the share of row :math:`i`
    on the first token (Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
    ICLR 2024); ``sink_heaviest``: whether column 0 has the largest norm (always, for near-uniform causal
    rows: column :math:`j` then has :math:`\|Pe_j\|^2 \approx \sum_{i \ge j}(i+1)^{-2}`, decreasing in
    :math:`j`). ``stable_rank`` :math:`\|P\|_F^2/\|P\|_2^2` (Rudelson and Vershynin 2007), with
    :math:`\|P\|_2` from a dense SVD up to ``rank_max_n`` and from Golub--Kahan bidiagonalisation of the
    dense matrix above it; ``numerical_rank`` :math:`\#\{i: \sigma_i > \text{rtol}\,\sigma_1\}` (dense SVD,
    only up to ``rank_max_n``: :math:`O(n^3)`).

Growth in n (:mod:`.growth`)
    :func:`growth_exponents` per window over at least 4 lengths, :func:`growth_exponent_interval` over windows.

Everything is computed head by head in float64 from the dense :math:`n\times n` matrix (one at a
time: 0.5 GB at n = 8192).

Public API::

    measure_assumptions(q, k, *, causal=True, heavy=HEAVY_PER_ROW, rank_max_n=RANK_MAX_N, rtol=1e-6,
                        block_size=256, hashes=SORTLSH_HASHES, generator=None, hyperplanes=None)
        -> dict[str, Tensor]                                    # QUANTITIES -> (*batch,) float64
    QUANTITIES, STRUCTURAL                                       # name -> what it is / why it is structural
    sink_mass(probabilities) -> Tensor
    hyperattention_alpha, hyperattention_kappa, kappa_with_mask, sortlsh_kappa, block_levels, BlockLevel,
    uniform_samples_needed                                      # approxlab.assumptions.hyperattention
    entry_bounds, balanced_entry_bound, entry_ratio, bounded_entries_label, LABELS   # .bounded_entries
    attention_weighted_xy_norm, positive_feature_relative_variance, relative_error_at_scale   # .performer
    growth_exponents, growth_exponent_interval                   # .growth
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_bool, check_int, check_qkv, check_rtol, check_tensor
from ..kernels import causal_mask, scaled_logits
from ..linalg import golub_kahan
from ..methods.hyperattention import DEFAULT_BLOCK_SIZE
from ..operators import DenseOperator, check_causal
from ..sortlsh import DEFAULT_BITS
from .bounded_entries import (LABELS, _entry_bound, balanced_entry_bound, bounded_entries_label, entry_bounds,
                              entry_ratio)
from .growth import MIN_LENGTHS, growth_exponent_interval, growth_exponents
from .hyperattention import (HEAVY_PER_ROW, SORTLSH_HASHES, BlockLevel, _hash_draw, _median, _sortlsh_values,
                             block_levels, hyperattention_alpha, hyperattention_kappa, kappa_with_mask,
                             sortlsh_kappa, uniform_samples_needed)
from .performer import attention_weighted_xy_norm, positive_feature_relative_variance, relative_error_at_scale

__all__ = ["measure_assumptions", "sink_mass", "QUANTITIES", "STRUCTURAL", "HEAVY_PER_ROW", "RANK_MAX_N",
           "SORTLSH_HASHES", "hyperattention_alpha", "hyperattention_kappa", "kappa_with_mask", "sortlsh_kappa",
           "block_levels", "BlockLevel", "uniform_samples_needed", "entry_bounds", "balanced_entry_bound",
           "entry_ratio", "bounded_entries_label", "LABELS", "attention_weighted_xy_norm",
           "positive_feature_relative_variance", "relative_error_at_scale", "growth_exponents",
           "growth_exponent_interval", "MIN_LENGTHS"]

RANK_MAX_N = 1024
"""Largest n at which the numerical rank (a dense SVD, :math:`O(n^3)` per head) is computed."""

QUANTITIES = {
    "alpha": "n max_j ||P e_j||^2 of the causal P = D^-1 A (HyperAttention; >= n for any causal P)",
    "alpha_without_first": "the same over columns j >= 1 (the first token's column left out)",
    "alpha_block": "alpha of the unmasked block A[n/2:, :n/2] of HyperAttention's causal recursion (its D_B^-1 A_B)",
    "alpha_block_without_first": "alpha_block over the block's columns j >= 1 (the first token's column left out)",
    "kappa": "max/min row sum of that block's A after removing each row's heavy entries (HyperAttention)",
    "kappa_all_entries": "the same ratio with no entry removed",
    "logit_bound": "max |q_i.k_j| / sqrt(p) over the causal entries (B^2 >= it for any split)",
    "sink_mass": "mean over rows i >= 1 of P_i0, the share of each row on the first token",
    "sink_heaviest": "1 if column 0 has the largest norm of P",
    "frobenius_norm": "||P||_F",
    "spectral_norm": "||P||_2",
    "stable_rank": "||P||_F^2 / ||P||_2^2",
    "numerical_rank": "#{sigma_i > rtol sigma_1} of P (dense SVD; NaN above rank_max_n)",
    "entry_bound": "Alman-Song B of the model's Q, K: p^(1/4) max(|Q|_max, |K|_max)",
    "kappa_oracle": "kappa (the same values): the heavy entries are each row's `heavy` largest, an oracle",
    "kappa_sortlsh": "kappa of that block with sortLSH's mask at block_size (the algorithm's own), median over hashes; "
                     "NaN when the block has at most block_size columns (nothing is sampled)",
    "entry_bound_balanced": "Alman-Song B of the best rescaled split (cQ, K/c): p^(1/4) sqrt(|Q|_max |K|_max)",
    "entry_ratio": "sqrt(logit_bound) / sqrt(ln n): the lower bound on B over every split, over sqrt(ln n)",
    "entry_ratio_model_split": "entry_bound / sqrt(ln n)",
    "entry_ratio_balanced_split": "entry_bound_balanced / sqrt(ln n)",
    "performer_xy_norm": "attention-weighted median of ||x_i + y_j||^2, x = q / p^(1/4), y = k / p^(1/4) "
                         "(Performer Lemma 2: relative variance (e^that - 1) / r)",
}
"""The columns :func:`measure_assumptions` returns, in words (the first 14 as in every earlier table)."""

STRUCTURAL = {
    "alpha": "row 0 of a causal P is e_0, so ||P e_0||^2 >= 1 and alpha >= n for every causal matrix: its value "
             "and its growth exponent (1 wherever attention is near uniform) describe the mask, not the model",
}
"""Quantities fixed by the causal mask rather than by the model, and why: report them, judge nothing by them."""


def sink_mass(probabilities: torch.Tensor) -> torch.Tensor:
    r"""The mean share of rows :math:`i \ge 1` on the first token, :math:`\frac1{n-1}\sum_{i\ge1}P_{i0}`.

    ``probabilities``: ``(*batch, n, m)`` row-stochastic, ``n >= 2``. Row 0 is left out (in a causal
    matrix it is :math:`e_0^\top`). Uniform causal rows give :math:`(H_n - 1)/(n-1) \approx \ln n / n`;
    an attention sink (Xiao et al., ICLR 2024) gives a share of order one. Returns ``(*batch,)`` float64.

    Examples
    --------
    >>> import torch
    >>> sink_mass(torch.tensor([[1.0, 0.0], [0.9, 0.1]], dtype=torch.float64))
    tensor(0.9000, dtype=torch.float64)
    """
    check_tensor(probabilities, "probabilities")
    if probabilities.shape[-2] < 2:
        raise ValueError(f"`probabilities` must have at least 2 rows; got shape {tuple(probabilities.shape)}.")
    return probabilities[..., 1:, 0].to(torch.float64).mean(-1)


def _probabilities(q: torch.Tensor, k: torch.Tensor, causal: bool):
    """``(P, logit bound)`` of one head, ``q, k: (n, p)`` float64, in place on one ``n x n`` buffer."""
    logits = scaled_logits(q, k)
    if causal:
        hidden = ~causal_mask(q.shape[-2], device=q.device)
        top = float(logits.masked_fill_(hidden, -math.inf).amax())
        low = float(logits.masked_fill_(hidden, math.inf).amin())
        logits.masked_fill_(hidden, -math.inf)
    else:
        low, top = (float(x) for x in torch.aminmax(logits))
    logits.sub_(logits.amax(-1, keepdim=True)).exp_()
    return logits.div_(logits.sum(-1, keepdim=True)), max(top, -low)


def _block_quantities(q: torch.Tensor, k: torch.Tensor, heavy: int) -> dict:
    """``alpha_block`` (with and without column 0), ``kappa``, ``kappa_all_entries`` of the lower-left block
    of the causal recursion."""
    half = q.shape[-2] // 2
    logits = scaled_logits(q[half:], k[:half])
    heavy = min(heavy, half - 1)
    probabilities = torch.softmax(logits, dim=-1)
    return {"kappa": float(hyperattention_kappa(logits, heavy=heavy)),
            "kappa_all_entries": float(hyperattention_kappa(logits, heavy=0)),
            "alpha_block": float(hyperattention_alpha(probabilities)),
            "alpha_block_without_first": half * float(torch.linalg.vector_norm(probabilities[:, 1:], dim=-2).amax()) ** 2}


def _head(q, k, *, causal, heavy, rank_max_n, rtol, generator) -> dict:
    """Every quantity of one head ``q, k: (n, p)`` (float64) but the sortLSH one."""
    n = q.shape[-2]
    probabilities, logit_bound = _probabilities(q, k, causal)
    column_norms = torch.linalg.vector_norm(probabilities, dim=-2)
    frobenius = float(torch.linalg.vector_norm(probabilities))
    row = {"alpha": n * float(column_norms.max()) ** 2,
           "alpha_without_first": n * float(column_norms[1:].max()) ** 2,
           "sink_mass": float(sink_mass(probabilities)), "sink_heaviest": float(int(column_norms.argmax()) == 0),
           "logit_bound": logit_bound, "frobenius_norm": frobenius, "numerical_rank": math.nan}
    if n <= rank_max_n:
        sigma = torch.linalg.svdvals(probabilities)
        row["spectral_norm"] = float(sigma[0])
        row["numerical_rank"] = float((sigma > rtol * sigma[0]).sum())
    else:
        row["spectral_norm"] = float(golub_kahan(DenseOperator(probabilities), tol=1e-8, generator=generator).estimate)
    row["stable_rank"] = frobenius**2 / row["spectral_norm"] ** 2
    del probabilities
    if causal and n >= 4:
        row.update(_block_quantities(q, k, heavy))
        row["kappa_oracle"] = row["kappa"]
    row["performer_xy_norm"] = float(attention_weighted_xy_norm(q, k, causal=causal))
    return row


def _sortlsh_block(q, k, planes, block_size) -> float:
    """``kappa_sortlsh`` of one head: the median over ``planes: (hashes, bits, p)`` on the block of ``kappa``."""
    half = q.shape[-2] // 2
    rows, columns = q[half:], k[:half]
    return float(_median(_sortlsh_values(rows, columns, scaled_logits(rows, columns), planes, block_size, "gray")))


def measure_assumptions(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True, heavy: int = HEAVY_PER_ROW,
                        rank_max_n: int = RANK_MAX_N, rtol: float = 1e-6, block_size: int = DEFAULT_BLOCK_SIZE,
                        hashes: int = SORTLSH_HASHES, generator: torch.Generator | None = None,
                        hyperplanes: torch.Tensor | None = None) -> dict:
    r"""Every quantity of :data:`QUANTITIES` for each attention matrix of ``q, k``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` each (float32 or float64; computed in float64), ``n >= 2``.
    causal : bool, default True
        Measure the causal matrix (a decoder's); ``False``: the bidirectional one (then the block
        quantities ``alpha_block``, ``alpha_block_without_first`` and every ``kappa*`` are NaN: they
        belong to the causal recursion).
    heavy : int
        Heavy entries per row removed for the oracle :math:`\kappa` (:data:`HEAVY_PER_ROW`; at most half the
        block's columns minus one).
    rank_max_n : int
        The numerical rank (a dense SVD) only for ``n <= rank_max_n``; above, NaN, and
        :math:`\|P\|_2` from Golub--Kahan (tolerance 1e-8, certified).
    rtol : float
        Relative threshold of the numerical rank.
    block_size : int, default 256
        sortLSH's block for ``kappa_sortlsh`` (the hyperattention method's default).
    hashes : int, default 10
        sortLSH hashes whose :math:`\kappa` give ``kappa_sortlsh`` (their median).
    generator : torch.Generator, optional
        Start vectors of Golub--Kahan, then (after every head's other quantities, so that those are what they
        were without sortLSH) the ``(*batch, hashes, 7, p)`` hyperplanes of the hashes.
    hyperplanes : torch.Tensor, optional
        Those hyperplanes given explicitly, ``(*batch, hashes, bits, p)`` (:func:`sortlsh_kappa`); their shape
        then sets the hashes and bits.

    Returns
    -------
    dict of str to torch.Tensor
        :data:`QUANTITIES` -> ``(*batch,)`` float64, in the batch (head) order of ``q`` (see the module
        docstring for each definition and the paper it comes from). :data:`STRUCTURAL` names the ones fixed
        by the causal mask.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, _ = synthetic_qkv((3,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> found = measure_assumptions(q, k, heavy=4, block_size=8, hashes=3, generator=torch.Generator().manual_seed(1))
    >>> bool((found["alpha"] >= 64).all())                      # row 0 of a causal P is e_0
    True
    >>> sorted(found) == sorted(QUANTITIES), tuple(found["kappa_sortlsh"].shape)
    (True, (3,))
    """
    check_qkv(q, k)
    check_causal(causal, q, k)
    check_bool(causal, "causal")
    heavy = check_int(heavy, "heavy", low=0)
    rank_max_n = check_int(rank_max_n, "rank_max_n", low=0)
    rtol = check_rtol(rtol, allow_zero=False)
    block_size = check_int(block_size, "block_size", low=1)
    hashes = check_int(hashes, "hashes", low=1)
    if q.shape[-2] < 2:
        raise ValueError(f"`q` must have at least 2 positions (n >= 2); got shape {tuple(q.shape)}.")
    generator = as_generator(generator)
    batch, n = q.shape[:-2], q.shape[-2]
    q64, k64 = (x.detach().to(torch.float64).reshape(-1, *x.shape[-2:]) for x in (q, k))
    rows = [_head(a, b, causal=causal, heavy=heavy, rank_max_n=rank_max_n, rtol=rtol, generator=generator)
            for a, b in zip(q64, k64)]
    if causal and n >= 4:
        planes = _hash_draw(q, hashes, DEFAULT_BITS, generator, hyperplanes)
        for row, a, b, h in zip(rows, q64, k64, planes.reshape(-1, *planes.shape[-3:])):
            row["kappa_sortlsh"] = _sortlsh_block(a, b, h, block_size)
    found = {name: torch.tensor([row.get(name, math.nan) for row in rows], dtype=torch.float64).reshape(batch)
             for name in QUANTITIES if not name.startswith("entry_")}
    found["entry_bound"] = _entry_bound(q64, k64).reshape(batch)
    found["entry_bound_balanced"] = balanced_entry_bound(q64, k64).reshape(batch)
    found["entry_ratio"] = entry_ratio(found["logit_bound"].sqrt(), n)
    found["entry_ratio_model_split"] = entry_ratio(found["entry_bound"], n)
    found["entry_ratio_balanced_split"] = entry_ratio(found["entry_bound_balanced"], n)
    return {name: found[name] for name in QUANTITIES}
