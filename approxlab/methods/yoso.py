r"""YOSO-m: attention by LSH-based Bernoulli sampling (Zeng et al., 2021).

``num_features`` is the number of hashes :math:`m`; each hash concatenates ``tau`` random
hyperplanes. The target is YOSO-E (:mod:`approxlab.methods.yoso_e`), the expectation over hashes.
"""

from __future__ import annotations

import torch

from .. import lsh
from .._validation import as_generator, check_bool, check_int
from ..linalg.scaling import unit_rows
from ..operators import DiagonalOperator, ProductOperator
from ._base import Approximation, method
from ._masking import check_key_mask
from .draws import DrawEntry, check_draw

__all__ = ["yoso", "YOSO", "MAX_HASHES", "draw_hyperplanes"]

MAX_HASHES = 4096
"""Largest number of hashes ``m`` accepted (the paper uses at most 128; Fig. 8 of YOSO)."""


def draw_hyperplanes(q, k, *, num_features, generator=None, tau=8):
    r"""The random draw of :func:`yoso`: ``m`` hashes of ``tau`` Gaussian hyperplanes each.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n_k, p)`` (only their shapes and device are used).
    num_features : int
        Number of hashes :math:`m`, ``1 <= m <= MAX_HASHES``.
    generator : torch.Generator, optional
        CPU generator (:func:`approxlab.lsh.draw_hyperplanes`: float64 on the CPU).
    tau : int, default 8
        Hyperplanes per hash.

    Returns
    -------
    dict
        ``{"hyperplanes": (*batch, m, tau, p) float64}`` on ``q.device``, i.i.d. :math:`\mathcal N(0, 1)`
        normals, one set per batch element (YOSO draws a fresh projection per sequence and head).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.yoso import draw_hyperplanes
    >>> q = k = torch.zeros(2, 3, 16, 4, dtype=torch.float64)
    >>> draw_hyperplanes(q, k, num_features=5, tau=8, generator=torch.Generator().manual_seed(0))["hyperplanes"].shape
    torch.Size([2, 3, 5, 8, 4])
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_HASHES)
    tau = check_int(tau, "tau", low=1, high=lsh.MAX_TAU)
    planes = lsh.draw_hyperplanes(q.shape[:-2], num_features, tau, q.shape[-1], generator=as_generator(generator),
                                  dtype=torch.float64, device=q.device)
    return {"hyperplanes": planes}


@method(
    "yoso",
    target="yoso",
    features="hashes m (each of tau concatenated hyperplanes)",
    max_features=MAX_HASHES,
    randomized=True,
    draw=draw_hyperplanes,
)
def yoso(q, k, v, *, num_features, generator=None, tau=8, normalize_output=False, draw=None, key_mask=None):
    r"""YOSO-m attention :math:`\frac1m\sum_{h=1}^m \mathcal B_h(\hat Q, \hat K)\,V` without an ``n x n`` matrix.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``; rows are :math:`\ell_2`-normalised first
        (YOSO Section 4: "simply applying a :math:`\ell_2` normalization on queries and keys").
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number of hashes :math:`m`, ``1 <= m <= MAX_HASHES``.
    generator : torch.Generator, optional
        CPU generator for the hyperplanes (drawn on CPU in float64, then cast and moved to
        ``q.device``); each batch element gets its own hashes.
    tau : int, default 8
        Hyperplanes concatenated per hash, ``1 <= tau <= 30``; 8 is the value of YOSO Figure 2.
        Larger ``tau`` makes the weights decay faster with the angle between query and key.
    normalize_output : bool, default False
        If True, return N-YOSO, :math:`\ell_2(\mathcal B V)`: each output row divided by its
        Euclidean norm (YOSO Section 3.1, "Normalizing Attention"); all-zero rows (a query that
        collides with no key in any hash) stay zero. This is how YOSO is used in the paper, which
        then measures errors as angles (YOSO Figure 8). The operator is :math:`\mathcal B` either way.
    draw : dict, optional
        ``{"hyperplanes": (*batch, m, tau, p)}`` (float32 or float64), the draw of
        :func:`draw_hyperplanes` (``approxlab.methods.draw``), used instead of ``generator``
        (cast to ``q``'s dtype): the same draw gives the same output bit for bit.
    key_mask : torch.Tensor, optional
        ``(*batch, n_k)`` bool, True on keys to attend: masked keys' columns of :math:`\mathcal B`
        are 0 (their values are multiplied by 0 before the accumulation; YOSO's published code
        leaves masked keys out of its hash-table cumulation, mlpen/YOSO ``yoso.py``), so padded
        rows do not reach real rows' outputs.

    Returns
    -------
    Approximation
        ``output``: ``(*batch, n, p_v)``; ``operator()``: the ``(*batch, n, n_k)`` matrix
        :math:`\frac1m\sum_h \mathcal B_h` as a :class:`approxlab.lsh.CollisionOperator` (times
        the diagonal of ``key_mask`` when given);
        ``info``: ``tau``, ``num_hashes``, ``normalize_output``, ``hyperplanes``
        ``(*batch, m, tau, p)``, ``codes_q`` ``(*batch, m, n)``, ``codes_k`` ``(*batch, m, n_k)``.

    Notes
    -----
    For a hash :math:`f` of ``tau`` concatenated hyperplanes,
    :math:`\mathcal B(Q,K)_{ij} = \mathbb 1[f(\hat Q_i) = f(\hat K_j)]` is a Bernoulli variable with
    success probability :math:`(1 - \arccos(\hat Q_i^\top\hat K_j)/\pi)^\tau` (YOSO Eqs. (1)-(2) and the
    expectation after them). Averaging ``m`` independent hashes gives an unbiased estimate of YOSO-E
    whose standard deviation falls like :math:`m^{-1/2}`.

    The product :math:`\mathcal B V` is computed by the hash-table accumulation of YOSO Section 3.2
    (:func:`approxlab.lsh.bucket_attention`): :math:`O(nmp)` time, no ``n x n`` matrix; the adjoint
    uses :math:`\mathcal B(Q,K)^\top = \mathcal B(K,Q)`. Unlike softmax attention, rows are not
    normalised to sum to 1 (the paper replaces that by the optional :math:`\ell_2` normalisation).
    Weights are in ``[0, 1]`` and the inputs are normalised, so nothing can overflow.

    The hash codes are piecewise constant in :math:`Q` and :math:`K`, so autograd reaches only
    :math:`V`: the method is registered as not differentiable (``MethodSpec.differentiable``).
    YOSO trains through its expectation instead, ``yoso-e`` with the lower-bound gradient of YOSO
    Eq. (4) (:data:`approxlab.training.TRAINING_OPTIONS`).

    **Draw.** As in YOSO's code, ``m * tau`` i.i.d. Gaussian hyperplane normals per batch element
    (sequence and head), ``{"hyperplanes": (*batch, m, tau, p)}`` (:func:`draw_hyperplanes`).

    References
    ----------
    .. [1] Z. Zeng, Y. Xiong, S. N. Ravi, S. Acharya, G. Fung, V. Singh. "You Only Sample (Almost)
       Once: Linear Cost Self-Attention Via Bernoulli Sampling." ICML 2021.
    .. [2] M. S. Charikar. "Similarity estimation techniques from rounding algorithms." STOC 2002.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> expectation = approxlab.approximate("yoso-e", q, k, v, num_features=1).output  # what YOSO-m estimates
    >>> for m in (4, 64, 512):
    ...     approx = approxlab.approximate("yoso", q, k, v, num_features=m, generator=torch.Generator().manual_seed(1))
    ...     print(m, [round(e, 2) for e in spectral_error(approx.output, expectation, relative=True).tolist()])
    4 [2.18, 1.32]
    64 [0.42, 0.38]
    512 [0.15, 0.14]
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_HASHES)
    tau = check_int(tau, "tau", low=1, high=lsh.MAX_TAU)
    check_bool(normalize_output, "normalize_output")
    if draw is None:
        draw = draw_hyperplanes(q, k, num_features=num_features, generator=generator, tau=tau)
    else:
        layout = {"hyperplanes": DrawEntry((*q.shape[:-2], num_features, tau, q.shape[-1]), "(*batch, m, tau, p)")}
        draw = check_draw("yoso", draw, layout, device=q.device)
    hyperplanes = draw["hyperplanes"].to(q.dtype)

    q_unit = unit_rows(q)  # no floor: invariant to the scale of q and k
    k_unit = unit_rows(k)
    codes_q = lsh.hash_codes(q_unit, hyperplanes)
    codes_k = lsh.hash_codes(k_unit, hyperplanes)
    operator = lsh.CollisionOperator(codes_q, codes_k, tau=tau, dtype=q.dtype)
    key_mask = check_key_mask(key_mask, k)
    if key_mask is not None:
        operator = ProductOperator(operator, DiagonalOperator(key_mask.expand(k.shape[:-1]).to(q.dtype)))
    output = operator.matmat(v)
    if normalize_output:
        output = unit_rows(output)
    info = {
        "tau": tau,
        "num_hashes": num_features,
        "normalize_output": normalize_output,
        "hyperplanes": hyperplanes,
        "codes_q": codes_q,
        "codes_k": codes_k,
    }
    return Approximation("yoso", "yoso", output, operator, info)


YOSO = yoso
__test__ = {"yoso": yoso.function}  # doctest skips a MethodSpec: run its function's examples
