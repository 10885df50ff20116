r"""The quantities the fast-attention theorems assume, measured on real attention matrices.

With :math:`s_{ij} = q_i^\top k_j/\sqrt p`, :math:`A = \exp(S)` (the causal pattern :math:`j \le i`
applied when ``causal``) and the row-stochastic :math:`P = D^{-1}A`, :math:`D = \operatorname{diag}(A\mathbf 1)`:

HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, ICLR 2024)
    **alpha** -- the largest squared column norm of :math:`P`, times :math:`n`:
    :math:`\alpha = n\max_j\|D^{-1}Ae^{(j)}\|_2^2`; their analysis assumes
    :math:`\|D^{-1}Ae^{(j)}\|_2^2 \le \alpha/n` for every column with :math:`\alpha = n^{o(1)}`
    (Section 1.1 and Theorem 1). It lies in :math:`[\|P\|_F^2, n^2]`.
    **kappa** -- the ratio of the largest to the smallest row sum of the *unnormalised* :math:`A`
    after its heavy entries are removed: :math:`\kappa = \max_i\langle\mathbf 1 - M^H_{i,:}, A_{i,:}\rangle
    / \min_j\langle\mathbf 1 - M^H_{j,:}, A_{j,:}\rangle` with the heavy-entry mask :math:`M^H`
    (found by sortLSH in their algorithm; Lemma 1, "Approximating D", and Theorem 1 assume
    :math:`\kappa = n^{o(1)}`). Here :math:`M^H` is the oracle one: the ``heavy`` largest entries
    of each row (what sortLSH looks for).

    *Causal masking.* Row 0 of a causal :math:`P` is :math:`e_0^\top`, so :math:`\|Pe_0\|^2 \ge 1`
    and :math:`\alpha \ge n` for **every** causal attention matrix; and the masked rows have
    :math:`1, 2, \dots, n` entries, so their row sums differ by a factor of order :math:`n` before any
    heavy entry is removed. HyperAttention therefore does not apply its theorem to the causal matrix:
    its causal algorithm (Section 3, Algorithm 4) splits :math:`A` into the two causal diagonal
    blocks, handled recursively, and the unmasked lower-left block :math:`A_{[n/2, n), [0, n/2)}`,
    handled by the non-causal algorithm. :func:`measure_assumptions` reports :math:`\alpha` of the
    whole causal :math:`P` (as defined) and :math:`\alpha`, :math:`\kappa` of that top-level block
    (``alpha_block``, ``kappa``; the block's own :math:`D_B^{-1}A_B`), which is where the theorem's
    assumptions are used.

Alman and Song, "Fast Attention Requires Bounded Entries" (NeurIPS 2023)
    Their attention is :math:`D^{-1}\exp(QK^\top/d)V` with :math:`\|Q\|_\infty, \|K\|_\infty \le B`
    and :math:`d = O(\log n)`: for :math:`B = o(\sqrt{\log n})` it can be approximated in
    :math:`n^{1+o(1)}` time (Theorem 1.4); for :math:`B = \Theta(\sqrt{\log n})` no truly
    subquadratic algorithm exists under SETH (Theorem 1.3). In approxlab's convention
    :math:`s = QK^\top/\sqrt p = (p^{1/4}Q)(p^{1/4}K)^\top/p`, so their :math:`B` of the model's
    own :math:`Q, K` is ``entry_bound`` :math:`= p^{1/4}\max(\|Q\|_{\max}, \|K\|_{\max})`. Since
    :math:`|s_{ij}| \le B^2` for every way of splitting the logits between :math:`Q` and :math:`K`,
    ``sqrt(logit_bound)`` :math:`= \sqrt{\max_{j\le i}|s_{ij}|}` is the split-invariant lower bound
    on :math:`B`; both are compared with :math:`\sqrt{\ln n}`.

Attention sinks and rank
    ``sink_mass``: the mean over rows :math:`i \ge 1` of :math:`P_{i0}`, the share of row :math:`i`
    on the first token (Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
    ICLR 2024); ``sink_heaviest``: whether column 0 has the largest norm. ``stable_rank``
    :math:`\|P\|_F^2/\|P\|_2^2` (Rudelson and Vershynin 2007), with :math:`\|P\|_2` from a dense SVD
    up to ``rank_max_n`` and from Golub--Kahan bidiagonalisation of the dense matrix above it;
    ``numerical_rank`` :math:`\#\{i: \sigma_i > \text{rtol}\,\sigma_1\}` (dense SVD, only up to
    ``rank_max_n``: :math:`O(n^3)`).

Everything is computed head by head in float64 from the dense :math:`n\times n` matrix (one at a
time: 0.5 GB at n = 8192).

Public API::

    measure_assumptions(q, k, *, causal=True, heavy=HEAVY_PER_ROW, rank_max_n=RANK_MAX_N, rtol=1e-6,
                        generator=None) -> dict[str, Tensor]     # every quantity, (*batch,) float64
    hyperattention_alpha(probabilities) -> Tensor
    hyperattention_kappa(logits, *, heavy=HEAVY_PER_ROW) -> Tensor
    entry_bounds(q, k, *, causal=True) -> (entry_bound, logit_bound)
    sink_mass(probabilities) -> Tensor
    QUANTITIES                                                   # name -> what it is, in words
"""

from __future__ import annotations

import math

import torch

from ._validation import as_generator, check_bool, check_int, check_qkv, check_rtol, check_tensor
from .kernels import causal_mask, scaled_logits
from .linalg import golub_kahan
from .operators import DenseOperator, check_causal

__all__ = ["measure_assumptions", "hyperattention_alpha", "hyperattention_kappa", "entry_bounds", "sink_mass",
           "QUANTITIES", "HEAVY_PER_ROW", "RANK_MAX_N"]

HEAVY_PER_ROW = 32
"""Entries per row taken as heavy (:math:`M^H`) for :math:`\\kappa`: the largest ones (an oracle sortLSH)."""

RANK_MAX_N = 1024
"""Largest n at which the numerical rank (a dense SVD, :math:`O(n^3)` per head) is computed."""

QUANTITIES = {
    "alpha": "n max_j ||P e_j||^2 of the causal P = D^-1 A (HyperAttention; >= n for any causal P)",
    "alpha_without_first": "the same over columns j >= 1 (the first token's column left out)",
    "alpha_block": "alpha of the unmasked block A[n/2:, :n/2] of HyperAttention's causal recursion (its D_B^-1 A_B)",
    "alpha_block_without_first": "alpha_block over the block's columns j >= 1 (the first token's column left out)",
    "kappa": "max/min row sum of that block's A after removing each row's heavy entries (HyperAttention)",
    "kappa_all_entries": "the same ratio with no entry removed",
    "entry_bound": "Alman-Song B of the model's Q, K: p^(1/4) max(|Q|_max, |K|_max)",
    "logit_bound": "max |q_i.k_j| / sqrt(p) over the causal entries (B^2 >= it for any split)",
    "sink_mass": "mean over rows i >= 1 of P_i0, the share of each row on the first token",
    "sink_heaviest": "1 if column 0 has the largest norm of P",
    "frobenius_norm": "||P||_F",
    "spectral_norm": "||P||_2",
    "stable_rank": "||P||_F^2 / ||P||_2^2",
    "numerical_rank": "#{sigma_i > rtol sigma_1} of P (dense SVD; NaN above rank_max_n)",
}
"""The columns :func:`measure_assumptions` returns, in words."""


def hyperattention_alpha(probabilities: torch.Tensor) -> torch.Tensor:
    r""":math:`\alpha = n\max_j\|Pe^{(j)}\|_2^2` of a row-stochastic ``(*batch, n, m)`` matrix :math:`P = D^{-1}A`.

    HyperAttention's column-norm parameter (Han et al., ICLR 2024, Section 1.1: the analysis assumes
    :math:`\|D^{-1}Ae^{(i)}\|_2^2 \le \alpha/n` with :math:`\alpha = n^{o(1)}`); ``n`` is the number
    of rows. Returns ``(*batch,)`` float64.

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


def hyperattention_kappa(logits: torch.Tensor, *, heavy: int = HEAVY_PER_ROW) -> torch.Tensor:
    r"""HyperAttention's :math:`\kappa`: the ratio of the largest to the smallest light row sum of :math:`A = e^S`.

    Parameters
    ----------
    logits : torch.Tensor
        ``(*batch, n, m)``, :math:`S` (:math:`A = e^S`, unnormalised; ``-inf`` entries count as masked).
    heavy : int
        Entries removed from each row as heavy, ``0 <= heavy < m``: the ``heavy`` largest (the oracle
        version of the mask :math:`M^H` that sortLSH finds).

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
    light = torch.logsumexp(logits, dim=-1)
    return torch.exp(light.amax(-1) - light.amin(-1))


def entry_bounds(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True):
    r"""Alman and Song's entry bound :math:`B` and the logit bound :math:`\max|s_{ij}|`, ``(*batch,)`` float64 each.

    ``entry_bound`` :math:`= p^{1/4}\max(\|Q\|_{\max}, \|K\|_{\max})` is their :math:`B` for the
    logits written as :math:`(p^{1/4}Q)(p^{1/4}K)^\top/p` (their :math:`\exp(QK^\top/d)`, "Fast
    Attention Requires Bounded Entries", NeurIPS 2023, Theorems 1.3-1.4: near-linear time for
    :math:`B = o(\sqrt{\log n})`, none truly subquadratic for :math:`B = \Theta(\sqrt{\log n})` under
    SETH). ``logit_bound`` :math:`= \max|s_{ij}|` over the (causal, if ``causal``) entries; since
    :math:`|s_{ij}| \le B^2` however the logits are split between :math:`Q` and :math:`K`,
    :math:`\sqrt{\text{logit\_bound}}` is a lower bound on every such :math:`B`.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.eye(4, dtype=torch.float64)              # p = 4, logits in {0, 1/2}
    >>> [float(x) for x in entry_bounds(q, k)]
    [1.4142135623730951, 0.5]
    """
    check_qkv(q, k)
    check_causal(causal, q, k)
    q, k = q.to(torch.float64), k.to(torch.float64)
    logits = scaled_logits(q, k)
    if causal:
        logits = logits.masked_fill_(~causal_mask(q.shape[-2], device=q.device), 0.0)  # |0| never raises a max
    return _entry_bound(q, k), logits.abs().flatten(-2).amax(-1)


def _entry_bound(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """:math:`p^{1/4}\\max(\\|Q\\|_{\\max}, \\|K\\|_{\\max})` per batch element, float64."""
    largest = torch.maximum(q.abs().flatten(-2).amax(-1), k.abs().flatten(-2).amax(-1))
    return q.shape[-1] ** 0.25 * largest.to(torch.float64)


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
    """Every quantity of one head ``q, k: (n, p)`` (float64)."""
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
    return row


def measure_assumptions(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True, heavy: int = HEAVY_PER_ROW,
                        rank_max_n: int = RANK_MAX_N, rtol: float = 1e-6,
                        generator: torch.Generator | None = None) -> dict:
    r"""Every quantity of :data:`QUANTITIES` for each attention matrix of ``q, k``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` each (float32 or float64; computed in float64), ``n >= 2``.
    causal : bool, default True
        Measure the causal matrix (a decoder's); ``False``: the bidirectional one (then the block
        quantities ``alpha_block``, ``alpha_block_without_first``, ``kappa``, ``kappa_all_entries`` are
        NaN: they belong to the causal recursion).
    heavy : int
        Heavy entries per row removed for :math:`\kappa` (:data:`HEAVY_PER_ROW`; at most half the
        block's columns minus one).
    rank_max_n : int
        The numerical rank (a dense SVD) only for ``n <= rank_max_n``; above, NaN, and
        :math:`\|P\|_2` from Golub--Kahan (tolerance 1e-8, certified).
    rtol : float
        Relative threshold of the numerical rank.
    generator : torch.Generator, optional
        Start vectors of Golub--Kahan.

    Returns
    -------
    dict of str to torch.Tensor
        :data:`QUANTITIES` -> ``(*batch,)`` float64 (see the module docstring for each definition and
        the paper it comes from).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, _ = synthetic_qkv((3,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> found = measure_assumptions(q, k, heavy=4, generator=torch.Generator().manual_seed(1))
    >>> bool((found["alpha"] >= 64).all())                      # row 0 of a causal P is e_0
    True
    >>> sorted(found) == sorted(QUANTITIES)
    True
    """
    check_qkv(q, k)
    check_causal(causal, q, k)
    check_bool(causal, "causal")
    heavy = check_int(heavy, "heavy", low=0)
    rank_max_n = check_int(rank_max_n, "rank_max_n", low=0)
    rtol = check_rtol(rtol, allow_zero=False)
    if q.shape[-2] < 2:
        raise ValueError(f"`q` must have at least 2 positions (n >= 2); got shape {tuple(q.shape)}.")
    generator = as_generator(generator)
    batch = q.shape[:-2]
    q64, k64 = (x.detach().to(torch.float64).reshape(-1, *x.shape[-2:]) for x in (q, k))
    entry = _entry_bound(q64, k64)
    rows = [_head(a, b, causal=causal, heavy=heavy, rank_max_n=rank_max_n, rtol=rtol, generator=generator)
            for a, b in zip(q64, k64)]
    found = {name: torch.tensor([row.get(name, math.nan) for row in rows], dtype=torch.float64).reshape(batch)
             for name in QUANTITIES if name != "entry_bound"}
    return {**found, "entry_bound": entry.reshape(batch)}
