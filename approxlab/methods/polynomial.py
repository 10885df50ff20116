r"""Polynomial attention (Alman and Song, "Fast Attention Requires Bounded Entries", NeurIPS 2023).

:math:`\exp` is replaced on the range of the logits by a polynomial :math:`P` of degree :math:`g`, so
:math:`P(QK^\top/\sqrt p) = U_1U_2^\top` factors through explicit tensor features and attention costs
:math:`O(nrp_v)` with :math:`r = \binom{p+g}{g}` features. ``num_features`` is that feature budget
:math:`r`: the degree is the largest whose features fit (or ``degree=``). A small-:math:`p`, small-:math:`n`
probe: degree 3 at :math:`p = 64` needs 47,905 features per token.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch

from .._validation import check_int
from ..operators import DiagonalOperator, ProductOperator
from ._base import Approximation, method
from ._masking import check_key_mask, query_mask

__all__ = ["polynomial", "POLYNOMIAL", "num_polynomial_features", "chebyshev_exp_coefficients",
           "tensor_features", "MAX_FEATURES", "MAX_FEATURE_ENTRIES"]

MAX_FEATURES = 1 << 20
"""Largest ``num_features`` accepted (a feature budget; the memory check below is what binds)."""

MAX_FEATURE_ENTRIES = 1 << 27
"""Largest number of feature entries, ``(*batch) x (n + m_k) x r`` (1 GiB in float64)."""


def num_polynomial_features(p: int, degree: int) -> int:
    r"""The features of all monomials of degree :math:`\le g` in :math:`p` variables, :math:`\binom{p+g}{g}`.

    Examples
    --------
    >>> from approxlab.methods.polynomial import num_polynomial_features
    >>> [num_polynomial_features(64, g) for g in range(4)]
    [1, 65, 2145, 47905]
    """
    return math.comb(p + degree, degree)


def _degree(num_features: int, p: int, degree) -> int:
    if degree is None:
        degree = 0
        while num_polynomial_features(p, degree + 1) <= num_features:
            degree += 1
        return degree
    degree = check_int(degree, "degree", low=0)
    needed = num_polynomial_features(p, degree)
    if needed > num_features:
        raise ValueError(f"`num_features` must be at least the {needed} features of degree={degree} at p={p} "
                         f"(C(p + degree, degree)); got num_features={num_features}.")
    return degree


def chebyshev_exp_coefficients(radius: torch.Tensor, degree: int) -> torch.Tensor:
    r"""Monomial coefficients of the Chebyshev interpolant of :math:`e^{B(u-1)}` on :math:`u \in [-1, 1]`.

    Parameters
    ----------
    radius : torch.Tensor
        ``(*batch,)``, :math:`B > 0`, the half-width of the interval of the logits.
    degree : int
        :math:`g \ge 0`.

    Returns
    -------
    torch.Tensor
        ``(*batch, g + 1)`` float64 :math:`c_0, \dots, c_g` with
        :math:`\sum_j c_ju^j \approx e^{B(u-1)} = e^{-B}e^{Bu}`: the interpolant at the :math:`g + 1`
        Chebyshev points of the first kind (what the reference's ``chebfit`` of exp at those points
        gives), for the logit :math:`s = Bu`, divided by :math:`e^B` so that nothing overflows (a factor
        the row normalisation cancels).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.polynomial import chebyshev_exp_coefficients
    >>> c = chebyshev_exp_coefficients(torch.tensor([1.0], dtype=torch.float64), 3)[0]
    >>> u = torch.linspace(-1, 1, 5, dtype=torch.float64)
    >>> float(((c * u[:, None] ** torch.arange(4)).sum(-1) - torch.exp(u - 1)).abs().max()) < 3e-3
    True
    """
    nodes = np.cos((2 * np.arange(degree + 1) + 1) * np.pi / (2 * (degree + 1)))
    basis = np.polynomial.chebyshev.chebvander(nodes, degree)  # T_j at the nodes, orthogonal columns
    to_monomial = np.zeros((degree + 1, degree + 1))  # row j: T_j in the monomial basis
    for j in range(degree + 1):
        to_monomial[j, : j + 1] = np.polynomial.chebyshev.cheb2poly(np.eye(degree + 1)[j])[: j + 1]
    nodes_t = torch.as_tensor(nodes, dtype=torch.float64, device=radius.device)
    values = torch.exp(radius.to(torch.float64).unsqueeze(-1) * (nodes_t - 1.0))  # (*batch, g + 1), <= 1
    basis_t = torch.as_tensor(basis, dtype=torch.float64, device=radius.device)
    chebyshev = torch.linalg.solve(basis_t, values.unsqueeze(-1)).squeeze(-1)  # (*batch, g + 1), batch () too
    return chebyshev @ torch.as_tensor(to_monomial, dtype=torch.float64, device=radius.device)


@functools.lru_cache(maxsize=16)
def _monomials(p: int, degree: int):
    r"""The multisets of ``degree`` coordinates of ``p`` and their weights :math:`\sqrt{g!/\prod\alpha!}`."""
    combos = list(itertools.combinations_with_replacement(range(p), degree))
    weights = [math.sqrt(math.factorial(degree) / math.prod(math.factorial(combo.count(i)) for i in set(combo)))
               for combo in combos]
    return combos, weights


def tensor_features(x: torch.Tensor, degree: int) -> torch.Tensor:
    r"""Symmetric tensor features :math:`\phi_g(x)` with :math:`\langle\phi_g(x), \phi_g(y)\rangle = (x^\top y)^g`.

    One feature per multiset :math:`\{i_1 \le \dots \le i_g\}` of coordinates,
    :math:`\sqrt{g!/\prod_a\alpha_a!}\,x_{i_1}\cdots x_{i_g}` with :math:`\alpha_a` the multiplicities (the
    multinomial theorem): :math:`\binom{p+g-1}{g}` features, ``(*batch, n, C)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.polynomial import tensor_features
    >>> x, y = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, -1.0], dtype=torch.float64)
    >>> float(tensor_features(x, 3) @ tensor_features(y, 3)), float((x @ y) ** 3)
    (1.0, 1.0)
    """
    if degree == 0:
        return x.new_ones(*x.shape[:-1], 1)
    combos, weights = _monomials(x.shape[-1], degree)
    index = torch.tensor(combos, dtype=torch.long, device=x.device)  # (C, g)
    features = x[..., index[:, 0]]
    for position in range(1, degree):
        features = features * x[..., index[:, position]]
    return features * torch.tensor(weights, dtype=x.dtype, device=x.device)


def _factors(x: torch.Tensor, coefficients: torch.Tensor, degree: int, left: bool) -> torch.Tensor:
    """``[c_0, c_1 phi_1(x), ..., c_g phi_g(x)]`` (left) or ``[1, phi_1(x), ..., phi_g(x)]`` (right)."""
    blocks = []
    for g in range(degree + 1):
        features = tensor_features(x, g)
        if left:
            features = features * coefficients[..., g, None, None].to(x.dtype)
        blocks.append(features)
    return torch.cat(blocks, -1)


@method(
    "polynomial",
    target="softmax",
    features="polynomial features r = C(p + g, g); the degree g is the largest that fits",
    max_features=MAX_FEATURES,
    randomized=False,
)
def polynomial(q, k, v, *, num_features, generator=None, degree=None, key_mask=None):
    r"""Alman and Song's polynomial method: :math:`\tilde D^{-1}U_1(U_2^\top V)`, :math:`U_1U_2^\top \approx A`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m_k, p)``, ``(*batch, m_k, p_v)``.
    num_features : int
        :math:`r`, the feature budget, ``1 <= r <= MAX_FEATURES``; the degree is the largest :math:`g`
        with :math:`\binom{p+g}{g} \le r` (:func:`num_polynomial_features`): :math:`r < p + 1` gives degree 0.
    generator : torch.Generator, optional
        Unused (deterministic).
    degree : int, optional
        :math:`g` itself (its :math:`\binom{p+g}{g}` features must fit in ``num_features``).
    key_mask : torch.Tensor, optional
        ``(*batch, m_k)`` bool, True on keys to attend: masked keys' features are 0, and neither they nor
        (in self-attention) the padded queries widen the interval.

    Returns
    -------
    Approximation
        ``output``; ``operator()`` ``Diagonal(1/row_sums) @ U_1 @ U_2^T``; ``info``: ``degree``,
        ``coefficients`` ``(*batch, g + 1)``, ``radius`` :math:`B`, ``row_sums`` :math:`\tilde D_{ii}` (in
        units of :math:`e^{-B}`), ``min_abs_row_sum``, ``num_nonpositive_row_sums``.

    Raises
    ------
    ValueError
        The features would exceed :data:`MAX_FEATURE_ENTRIES` entries (the message names
        ``num_features`` and the degree, :math:`p` and :math:`n` that make them).

    Notes
    -----
    Theorem 1.4 of Alman and Song: for :math:`\|Q\|_\infty, \|K\|_\infty \le B` with
    :math:`B = o(\sqrt{\log n})` and :math:`d = O(\log n)`, attention can be approximated entrywise to
    :math:`1/\operatorname{poly}(n)` in :math:`n^{1+o(1)}` time, by a polynomial :math:`P` of degree
    :math:`g` approximating :math:`\exp` on the bounded logits (their Section 3, from Aggarwal and Alman
    2022) and the low-rank factorisation :math:`P(QK^\top) = U_1U_2^\top` with :math:`r = \binom{2(g+d)}{2g}`
    columns; Theorem 1.3: for :math:`B = \Theta(\sqrt{\log n})` no truly subquadratic algorithm exists
    under SETH. They publish no code. Here, as in the reference ``as23_attention`` of yinj66/support_basis:

    - the interval is :math:`[-B, B]`, :math:`B = \max_i\|q_i\|\max_j\|k_j\|/\sqrt p`, which holds every
      logit (Cauchy-Schwarz); :math:`P` interpolates :math:`\exp` at :math:`g + 1` Chebyshev points of it
      (:func:`chebyshev_exp_coefficients`);
    - :math:`(q^\top k)^j` is expanded with the symmetric tensor features of :func:`tensor_features`
      (:math:`\binom{p+j-1}{j}` of them), so :math:`r = \binom{p+g}{g}` for all degrees up to :math:`g`;
    - :math:`\tilde D = \operatorname{diag}(U_1U_2^\top\mathbf 1)`, output :math:`\tilde D^{-1}U_1(U_2^\top V)`.

    Where the reference differs: it scales :math:`q, k` by :math:`\sqrt{\text{scale}}` and splits each
    coefficient as :math:`\pm\sqrt{|a_j|}` between the factors (here :math:`c_j` goes to :math:`U_1` and
    the features are those of unit-scaled rows, :math:`q/\max\|q\|`, :math:`k/\max\|k\|`, so no entry
    exceeds 1); it fits :math:`e^s` itself (here :math:`e^{s-B}`, equal after normalisation, without
    overflow); it supports degree :math:`\le 3`; and it **clamps the row sums at** :math:`10^{-30}`
    (``d1.clamp_min(1e-30)``), so a non-positive row sum becomes :math:`10^{-30}` and its row is
    multiplied by :math:`10^{30}`. :math:`P` is not positive on the interval in general, so
    :math:`\tilde D_{ii}` can be near zero or negative: here it is used as it is, never clamped, as for the
    other methods with signed row sums (``skyformer-softmax``): a negative row sum flips that row's sign,
    a zero one makes it non-finite and :func:`approxlab.approximate` raises ``FloatingPointError``;
    ``info`` reports the smallest :math:`|\tilde D_{ii}|` and the count of non-positive ones.

    Cost: :math:`O((n + m_k)\,r\,p_v)` time and :math:`O((n + m_k)r)` memory; never :math:`n \times m_k`.

    References
    ----------
    J. Alman, Z. Song, "Fast Attention Requires Bounded Entries", NeurIPS 2023 (arXiv 2302.13214):
    Theorems 1.3-1.4, Section 3.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (0.5 * torch.randn(2, 128, 4, generator=g, dtype=torch.float64) for _ in range(3))
    >>> v = v + 1.0                                            # values with a common direction, as real ones have
    >>> exact = approxlab.exact_attention(q, k, v)           # logits in [-1.75, 1.75]: bounded entries
    >>> for r in (5, 15, 35, 70):                                # degrees 1, 2, 3, 4 at p = 4
    ...     approx = approxlab.approximate("polynomial", q, k, v, num_features=r)
    ...     print(approx.info["degree"], [round(e, 4) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    1 [0.0027, 0.0027]
    2 [0.0027, 0.0029]
    3 [0.0005, 0.0004]
    4 [0.0001, 0.0001]
    >>> approx = approxlab.approximate("polynomial", 2 * q, 2 * k, v, num_features=35)   # logits up to 7: degree 3
    >>> approx.info["num_nonpositive_row_sums"].tolist()       # is not positive there: every row sum is negative
    [128, 128]
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_FEATURES)
    p = q.shape[-1]
    degree = _degree(num_features, p, degree)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    r = num_polynomial_features(p, degree)
    entries = math.prod(batch) * (q.shape[-2] + k.shape[-2]) * r
    if entries > MAX_FEATURE_ENTRIES:
        raise ValueError(f"`num_features`: degree {degree} at p={p} has {r} features per token, "
                         f"{entries} entries for {q.shape[-2]} queries and {k.shape[-2]} keys over batch {tuple(batch)}, "
                         f"more than {MAX_FEATURE_ENTRIES}; lower num_features (or degree), n or the batch; "
                         f"got num_features={num_features}.")
    key_mask = check_key_mask(key_mask, k)
    keys = k if key_mask is None else k * key_mask.unsqueeze(-1).to(k.dtype)
    real_queries = query_mask(key_mask, q, k)  # padded queries widen no interval
    q_norm = torch.linalg.vector_norm(q if real_queries is None else q * real_queries.unsqueeze(-1).to(q.dtype),
                                      dim=-1).amax(-1)
    k_norm = torch.linalg.vector_norm(keys, dim=-1).amax(-1)
    radius = (q_norm * k_norm / math.sqrt(p)).to(torch.float64)
    radius = torch.where(radius > 0, radius, 1.0)  # all logits 0: any interval holds them
    coefficients = chebyshev_exp_coefficients(radius, degree)
    unit_q = q / q_norm.clamp_min(torch.finfo(q.dtype).tiny)[..., None, None]
    unit_k = keys / k_norm.clamp_min(torch.finfo(k.dtype).tiny)[..., None, None]
    left = _factors(unit_q, coefficients, degree, left=True)  # s / B = <unit q, unit k>
    right = _factors(unit_k, coefficients, degree, left=False)
    if key_mask is not None:
        right = right * key_mask.unsqueeze(-1).to(right.dtype)
    right_t = right.transpose(-1, -2)
    row_sums = (left @ right_t.sum(-1, keepdim=True)).squeeze(-1)
    output = (left @ (right_t @ v)) / row_sums.unsqueeze(-1)
    info = {"degree": degree, "coefficients": coefficients, "radius": radius, "row_sums": row_sums,
            "min_abs_row_sum": row_sums.abs().amin(-1), "num_nonpositive_row_sums": (row_sums <= 0).sum(-1)}
    operator = ProductOperator(DiagonalOperator(1.0 / row_sums), left, right_t)
    return Approximation("polynomial", "softmax", output, operator, info)


POLYNOMIAL = polynomial
__test__ = {"polynomial": polynomial.function}  # doctest skips a MethodSpec: run its function's examples
