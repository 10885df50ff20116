r"""Performer (FAVOR+): softmax attention by positive orthogonal random features.

Choromanski et al. (2021). ``num_features`` is the number of random features :math:`r`.
The softmax kernel :math:`\mathrm{SM}(x, y) = \exp(x^\top y)` with :math:`x = q/p^{1/4}`,
:math:`y = k/p^{1/4}` (so :math:`\mathrm{SM} = \exp(q^\top k/\sqrt p) = A_{ij}`) is written as an
expectation over Gaussian :math:`w` (Performer Lemma 1)

.. math::

    \exp(x^\top y) = \mathbb E_{w\sim\mathcal N(0, I_p)}
        \bigl[e^{w^\top x - \|x\|^2/2}\, e^{w^\top y - \|y\|^2/2}\bigr],

and estimated with :math:`r` features :math:`\phi(x)_l = e^{w_l^\top x - \|x\|^2/2}/\sqrt r`.
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_bool, check_int, check_tensor
from ..operators import DiagonalOperator, ProductOperator
from ._base import Approximation, method
from .draws import DrawEntry, check_draw

__all__ = [
    "performer",
    "PERFORMER",
    "MAX_RANDOM_FEATURES",
    "draw_projection",
    "resolve_projection",
    "gaussian_random_features",
    "positive_random_features",
]

MAX_RANDOM_FEATURES = 4096
"""Largest number of random features ``r`` accepted."""


def gaussian_random_features(
    num_features: int,
    p: int,
    *,
    batch_shape=(),
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device="cpu",
) -> torch.Tensor:
    r"""Projection :math:`W \in \mathbb R^{r\times p}` whose rows are marginally :math:`\mathcal N(0, I_p)`.

    Parameters
    ----------
    num_features : int
        :math:`r \ge 1` rows.
    p : int
        Feature dimension.
    batch_shape : tuple of int
        Leading batch dimensions; each batch element gets its own independent draw.
    orthogonal : bool, default True
        If True, orthogonal random features (ORFs, Performer Section 2.4): rows come in blocks of
        ``p`` exactly orthogonal directions (QR of a Gaussian ``p x p`` matrix, with the sign fix that
        makes it Haar), the last block truncated to ``r mod p`` rows, and each row is rescaled by an
        independent :math:`\chi_p` length (the norm of a fresh Gaussian vector), as in the official
        implementation (``scaling=0``). Each row is then exactly :math:`\mathcal N(0, I_p)`, so the
        estimator stays unbiased. If False, i.i.d. Gaussian rows.
    generator : torch.Generator, optional
        CPU generator; draws are made on CPU in float64 and then cast to ``dtype`` and moved to
        ``device``.

    Returns
    -------
    torch.Tensor
        ``(*batch_shape, r, p)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.performer import gaussian_random_features
    >>> w = gaussian_random_features(8, 4, generator=torch.Generator().manual_seed(0))
    >>> w.shape  # two blocks of 4 orthogonal rows
    torch.Size([8, 4])
    >>> gram = w[:4] @ w[:4].T
    >>> bool(torch.allclose(gram, torch.diag(gram.diagonal())))
    True
    """
    num_features = check_int(num_features, "num_features", low=1)
    p = check_int(p, "p", low=1)
    check_bool(orthogonal, "orthogonal")
    g = as_generator(generator)
    batch_shape = tuple(batch_shape)
    if orthogonal:
        num_blocks = -(-num_features // p)
        gaussian = torch.randn(*batch_shape, num_blocks, p, p, generator=g, dtype=torch.float64)
        basis, r = torch.linalg.qr(gaussian)
        basis = basis * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
        # rows of each block = columns of a Haar orthogonal matrix
        rows = basis.transpose(-1, -2).reshape(*batch_shape, num_blocks * p, p)[..., :num_features, :]
        lengths = torch.randn(*batch_shape, num_features, p, generator=g, dtype=torch.float64).norm(dim=-1)
        projection = rows * lengths.unsqueeze(-1)
    else:
        projection = torch.randn(*batch_shape, num_features, p, generator=g, dtype=torch.float64)
    return projection.to(device=device, dtype=dtype)


def positive_random_features(x: torch.Tensor, projection: torch.Tensor, *, log: bool = False) -> torch.Tensor:
    r"""Positive random features :math:`\phi(x)_l = \exp(w_l^\top x - \|x\|^2/2)/\sqrt r` (Performer Lemma 1).

    Parameters
    ----------
    x : torch.Tensor
        ``(*batch, n, p)``, already scaled (Performer uses :math:`x = q/p^{1/4}`).
    projection : torch.Tensor
        ``(*batch, r, p)`` from :func:`gaussian_random_features`.
    log : bool, default False
        Return :math:`\log\phi(x)` instead, which never overflows.

    Returns
    -------
    torch.Tensor
        ``(*batch, n, r)``. With ``log=False`` this can overflow for large :math:`\|x\|` -- the
        method itself works in the log domain; this form is for checking Lemma 1
        (:math:`\mathbb E[\phi(x)^\top\phi(y)] = \exp(x^\top y)`).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.performer import gaussian_random_features, positive_random_features
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = 0.5 * torch.randn(3, 4, generator=g, dtype=torch.float64), 0.5 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    >>> w = gaussian_random_features(20000, 4, generator=g)
    >>> estimate = positive_random_features(x, w) @ positive_random_features(y, w).T  # Lemma 1: E = exp(x^T y)
    >>> bool(torch.allclose(estimate, torch.exp(x @ y.T), atol=0.1))
    True
    """
    check_tensor(x, "x")
    check_tensor(projection, "projection")
    if projection.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"`projection` must have shape (*batch, r, {x.shape[-1]}) to match `x` of shape "
            f"{tuple(x.shape)}; got {tuple(projection.shape)}."
        )
    r = projection.shape[-2]
    logits = (x @ projection.to(x.dtype).transpose(-1, -2)).sub_(0.5 * (x * x).sum(-1, keepdim=True))
    logits = logits.sub_(0.5 * math.log(r))  # in place: no further (n, r) arrays
    return logits if log else logits.exp_()


def draw_projection(q, k, *, num_features, generator=None, orthogonal=True):
    r"""The random draw of :func:`performer`: the projection :math:`W` of its random features.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n_k, p)`` (only their shapes and device are used).
    num_features : int
        :math:`r`, ``1 <= r <= MAX_RANDOM_FEATURES``.
    generator : torch.Generator, optional
        CPU generator (draws in float64 on the CPU).
    orthogonal : bool, default True
        Orthogonal random features or i.i.d. Gaussian rows (:func:`gaussian_random_features`).

    Returns
    -------
    dict
        ``{"projection": (*batch, r, p) float64}`` on ``q.device``, one draw per batch element.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.performer import draw_projection
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> draw_projection(q, k, num_features=6, generator=torch.Generator().manual_seed(0))["projection"].shape
    torch.Size([2, 6, 4])
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_RANDOM_FEATURES)
    projection = gaussian_random_features(num_features, q.shape[-1], batch_shape=q.shape[:-2], orthogonal=orthogonal,
                                          generator=generator, dtype=torch.float64, device=q.device)
    return {"projection": projection}


def resolve_projection(name, q, k, *, num_features, generator, orthogonal, draw) -> torch.Tensor:
    """The projection a FAVOR+ method uses: ``draw["projection"]`` checked against its layout
    (:func:`approxlab.methods.draws.check_draw`, messages naming method ``name``), or a fresh
    :func:`draw_projection` from ``generator`` when ``draw`` is None; cast to ``q``'s dtype.

    Returns
    -------
    torch.Tensor
        ``(*batch, r, p)`` on ``q.device``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.performer import draw_projection, resolve_projection
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> shared = draw_projection(q, k, num_features=6, generator=torch.Generator().manual_seed(0))
    >>> w = resolve_projection("performer", q, k, num_features=6, generator=None, orthogonal=True, draw=shared)
    >>> bool(torch.equal(w, shared["projection"]))
    True
    """
    if draw is None:
        draw = draw_projection(q, k, num_features=num_features, generator=generator, orthogonal=orthogonal)
    else:
        layout = {"projection": DrawEntry((*q.shape[:-2], num_features, q.shape[-1]), "(*batch, r, p)")}
        draw = check_draw(name, draw, layout, device=q.device)
    return draw["projection"].to(q.dtype)


@method(
    "performer",
    target="softmax",
    features="positive orthogonal random features r",
    max_features=MAX_RANDOM_FEATURES,
    randomized=True,
    draw=draw_projection,
)
def performer(q, k, v, *, num_features, generator=None, orthogonal=True, draw=None):
    r"""FAVOR+ attention :math:`\tilde D^{-1}\phi(Q)\bigl(\phi(K)^\top V\bigr)`, overflow-safe.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number of random features :math:`r`, ``1 <= r <= MAX_RANDOM_FEATURES`` (may exceed ``p``:
        then several orthogonal blocks).
    generator : torch.Generator, optional
        CPU generator for the projection (each batch element gets its own draw).
    orthogonal : bool, default True
        Orthogonal random features (FAVOR+) or i.i.d. Gaussian ones; see
        :func:`gaussian_random_features`.
    draw : dict, optional
        ``{"projection": (*batch, r, p)}`` (float32 or float64), the draw of
        :func:`draw_projection` (``approxlab.methods.draw``), used instead of ``generator`` (cast
        to ``q``'s dtype): the same draw gives the same output bit for bit.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` the ``(*batch, n, n_k)`` matrix
        :math:`\tilde D^{-1}\phi(Q)\phi(K)^\top` as ``Diagonal @ Product`` of its factors;
        ``info``: ``projection`` ``(*batch, r, p)``, ``orthogonal``, ``query_features``
        ``(*batch, n, r)``, ``key_features`` ``(*batch, n_k, r)`` (the rescaled factors below).

    Notes
    -----
    With :math:`x_i = q_i/p^{1/4}`, :math:`y_j = k_j/p^{1/4}`, Performer approximates the raw scores
    :math:`A_{ij} = \exp(q_i^\top k_j/\sqrt p)` by :math:`\hat A = \phi(X)\phi(Y)^\top` (unbiased,
    Lemma 1) and normalises with the approximate row sums :math:`\tilde D = \operatorname{diag}(\hat A\mathbf 1)`
    (bidirectional FAVOR+, Performer Section 2.2), in :math:`O((n + n_k)rp)` time.

    Overflow safety. :math:`\log\phi` is formed first. Any positive factor per query row, and any
    positive factor per feature column moved from the keys to the queries, leaves
    :math:`\tilde D^{-1}\hat A` unchanged. With :math:`a_{il} = \log\phi(x_i)_l`,
    :math:`b_{jl} = \log\phi(y_j)_l` and :math:`\beta_l = \log\sum_j e^{b_{jl}}` (logsumexp):

    * key features :math:`K'_{jl} = e^{b_{jl} - \beta_l}` (each column sums to 1),
    * query features :math:`Q'_{il} = e^{a_{il} + \beta_l - c_i}`, :math:`c_i = \max_l(a_{il} + \beta_l)`,

    so :math:`\hat A = \operatorname{diag}(e^{c})\,Q'K'^\top`, all entries lie in ``[0, 1]``, and the
    normaliser :math:`Q'K'^\top\mathbf 1 = Q'\mathbf 1 \ge 1` never vanishes. This refines the
    official implementation's stabiliser (row maxima for queries, one global maximum for keys), whose
    normaliser can underflow to zero at large logits; the two agree exactly in exact arithmetic.

    **Draw.** As Performer's FAVOR+: one projection per batch element (sequence and head),
    ``{"projection": (*batch, r, p)}``: blocks of ``p`` orthogonal rows (QR of a Gaussian matrix)
    with independent :math:`\chi_p` lengths, or i.i.d. Gaussian rows (:func:`draw_projection`).

    References
    ----------
    .. [1] K. Choromanski, V. Likhosherstov, D. Dohan, X. Song, A. Gane, T. Sarlos, P. Hawkins,
       J. Davis, A. Mohiuddin, L. Kaiser, D. Belanger, L. Colwell, A. Weller. "Rethinking Attention
       with Performers." ICLR 2021.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, scale=0.5, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for r in (8, 512, 4096):  # the error falls like 1/sqrt(r)
    ...     approx = approxlab.approximate("performer", q, k, v, num_features=r, generator=torch.Generator().manual_seed(1))
    ...     print(r, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    8 [0.61, 0.55]
    512 [0.07, 0.03]
    4096 [0.02, 0.02]
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_RANDOM_FEATURES)
    check_bool(orthogonal, "orthogonal")
    p = q.shape[-1]
    projection = resolve_projection("performer", q, k, num_features=num_features, generator=generator,
                                    orthogonal=orthogonal, draw=draw)
    scale = p ** -0.25
    log_q = positive_random_features(q * scale, projection, log=True)  # (*batch, n, r)
    log_k = positive_random_features(k * scale, projection, log=True)  # (*batch, n_k, r)
    column_log_sums = torch.logsumexp(log_k, dim=-2, keepdim=True)  # (*batch, 1, r)
    key_features = (log_k - column_log_sums).exp_()  # logsumexp keeps log_k for its gradient
    shifted = log_q.add_(column_log_sums)
    query_features = (shifted - shifted.amax(-1, keepdim=True)).exp_()
    normalizer = query_features.sum(-1)  # = Q' K'^T 1, since K'^T 1 = 1; >= 1
    output = (query_features @ (key_features.transpose(-1, -2) @ v)) / normalizer.unsqueeze(-1)

    def build_operator():
        return ProductOperator(
            DiagonalOperator(1.0 / normalizer), query_features, key_features.transpose(-1, -2)
        )

    info = {
        "projection": projection,
        "orthogonal": orthogonal,
        "query_features": query_features,
        "key_features": key_features,
    }
    return Approximation("performer", "softmax", output, build_operator, info)


PERFORMER = performer
__test__ = {"performer": performer.function}  # doctest skips a MethodSpec: run its function's examples
