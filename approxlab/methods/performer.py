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
from ..operators import DiagonalOperator, LinearOperator, ProductOperator
from ._base import Approximation, method
from .draws import DrawEntry, check_draw

__all__ = [
    "performer",
    "PERFORMER",
    "MAX_RANDOM_FEATURES",
    "CAUSAL_CHUNK",
    "draw_projection",
    "resolve_projection",
    "gaussian_random_features",
    "positive_random_features",
    "causal_feature_products",
    "CausalFeatureOperator",
]

MAX_RANDOM_FEATURES = 4096
"""Largest number of random features ``r`` accepted."""

CAUSAL_CHUNK = 64
"""Positions per chunk of the causal prefix sums (:func:`causal_feature_products`)."""


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


def causal_feature_products(log_left, log_right, x, *, chunk: int = CAUSAL_CHUNK):
    r"""Causal products of a positive feature matrix, by chunked prefix sums, in the log domain.

    With :math:`a = ` ``log_left`` and :math:`b = ` ``log_right``, :math:`W_{ij} = \sum_l e^{a_{il} + b_{jl}}`
    (e.g. :math:`\phi(Q)\phi(K)^\top`, Performer Lemma 1). Returns ``(numerator, normaliser, log_scale)``:

    .. math::

        \text{numerator}_i = e^{-c_i}\sum_{j\le i} W_{ij} x_j, \qquad
        \text{normaliser}_i = e^{-c_i}\sum_{j\le i} W_{ij}, \qquad \text{log\_scale}_i = c_i,

    so ``numerator / normaliser`` is the causal, row-normalised product (unidirectional FAVOR+,
    Performer Section 2.6: prefix sums of :math:`\phi(k_j)x_j^\top` and :math:`\phi(k_j)`).

    Parameters
    ----------
    log_left, log_right : torch.Tensor
        ``(*batch, n, r)``, finite.
    x : torch.Tensor
        ``(*batch, n, c)``.
    chunk : int
        Positions per chunk.

    Returns
    -------
    tuple of torch.Tensor
        ``(*batch, n, c)``, ``(*batch, n)``, ``(*batch, n)``.

    Notes
    -----
    Chunk :math:`[s, e)` keeps the per-feature reference :math:`M_l = \log\sum_{j<e} e^{b_{jl}}`, the
    prefix log-sum-exp through the chunk's end. Keys enter as :math:`e^{b_{jl} - M_l} \le 1`, queries as
    :math:`e^{a_{il} + M_l - c_i} \le 1` with :math:`c_i = \max_l(a_{il} + M_l)`, and the carried state
    :math:`\sum_{j<s} e^{b_{jl} - M_l}x_j^\top` (``r x c``) is rescaled by :math:`e^{M^{old}_l - M_l} \le 1`
    when the reference moves: nothing overflows, and the last row of every chunk has normaliser
    :math:`\ge 1`. Only a feature mass that grows by more than the dtype's range (:math:`e^{88}` in
    float32) *within one chunk* can underflow an earlier row's normaliser; it then is 0 and the output
    non-finite (:func:`approxlab.approximate` raises), never silently wrong. Memory
    :math:`O(\text{chunk}^2 + rc)` per batch element -- no ``n x n`` and no ``n x r x c`` array --, time
    :math:`O(n\,r\,c + n\,\text{chunk}\,(r + c))`. Gradients flow through every step (no in-place
    update of a saved tensor).

    Examples
    --------
    >>> import torch
    >>> a = b = torch.zeros(1, 3, 2, dtype=torch.float64)            # W = 2 everywhere
    >>> x = torch.tensor([[[3.0], [6.0], [9.0]]], dtype=torch.float64)
    >>> numerator, normaliser, _ = causal_feature_products(a, b, x)
    >>> (numerator / normaliser.unsqueeze(-1)).flatten()              # the cumulative means
    tensor([3.0000, 4.5000, 6.0000], dtype=torch.float64)
    """
    n = log_left.shape[-2]
    state = x.new_zeros(*x.shape[:-2], log_left.shape[-1], x.shape[-1])  # sum_{j<s} e^{b_j - M} x_j^T
    mass = x.new_zeros(*x.shape[:-2], log_left.shape[-1])  # sum_{j<s} e^{b_j - M}
    reference = None
    numerators, normalisers, scales = [], [], []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        keys = log_right[..., start:stop, :]
        chunk_lse = torch.logsumexp(keys, dim=-2)  # (*batch, r)
        if reference is None:
            new_reference = chunk_lse
        else:
            new_reference = torch.logaddexp(reference, chunk_lse)
            decay = torch.exp(reference - new_reference)
            state, mass = state * decay.unsqueeze(-1), mass * decay
        key_features = torch.exp(keys - new_reference.unsqueeze(-2))  # (*batch, C, r), <= 1
        logits = log_left[..., start:stop, :] + new_reference.unsqueeze(-2)
        scale = logits.amax(-1, keepdim=True)
        query_features = torch.exp(logits - scale)  # (*batch, C, r), <= 1
        local = (query_features @ key_features.transpose(-1, -2)).tril()  # (*batch, C, C)
        numerators.append(query_features @ state + local @ x[..., start:stop, :])
        normalisers.append((query_features * mass.unsqueeze(-2)).sum(-1) + local.sum(-1))
        scales.append(scale.squeeze(-1))
        state = state + key_features.transpose(-1, -2) @ x[..., start:stop, :]
        mass = mass + key_features.sum(-2)
        reference = new_reference
    return torch.cat(numerators, dim=-2), torch.cat(normalisers, dim=-1), torch.cat(scales, dim=-1)


class CausalFeatureOperator(LinearOperator):
    r"""The causal FAVOR+ matrix :math:`\tilde D^{-1}(L\odot\phi(Q)\phi(K)^\top)`, ``(*batch, n, n)``.

    Applied by :func:`causal_feature_products` (never formed unless :meth:`to_dense` is called).
    The adjoint :math:`(L\odot W)^\top\tilde D^{-1}Y` is upper triangular: it is the causal product on
    both sequences reversed (index :math:`n-1-i`) with the roles of the two feature maps swapped and
    :math:`-\log\tilde D_i` added to the query side (log domain).

    Parameters
    ----------
    log_query, log_key : torch.Tensor
        ``(*batch, n, r)``: :math:`\log\phi(Q)`, :math:`\log\phi(K)`.
    log_normaliser : torch.Tensor
        ``(*batch, n)``: :math:`\log\tilde D_{ii} = \log\sum_{j\le i}\phi(q_i)^\top\phi(k_j)`.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 16, 4, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("performer", q, k, v, num_features=8, causal=True,
    ...                                generator=torch.Generator().manual_seed(1))
    >>> op = approx.operator()  # a CausalFeatureOperator: lower triangular, rows summing to 1
    >>> matrix = op.to_dense()
    >>> bool((matrix.triu(1) == 0).all()), bool(torch.allclose(matrix.sum(-1), torch.ones(2, 16, dtype=torch.float64)))
    (True, True)
    >>> bool(torch.allclose(op.rmatmat(v), matrix.mT @ v))
    True
    """

    def __init__(self, log_query, log_key, log_normaliser):
        self.log_query, self.log_key, self.log_normaliser = log_query, log_key, log_normaliser
        n = log_query.shape[-2]
        self.shape = (*log_query.shape[:-2], n, n)
        self.dtype, self.device = log_query.dtype, log_query.device

    def _matmat(self, x):
        numerator, normaliser, _ = causal_feature_products(self.log_query, self.log_key, x)
        return numerator / normaliser.unsqueeze(-1)

    def _rmatmat(self, y):
        flip = (lambda t: t.flip(-2))
        scaled = self.log_query - self.log_normaliser.unsqueeze(-1)
        numerator, _, scale = causal_feature_products(flip(self.log_key), flip(scaled), flip(y))
        return flip(numerator * torch.exp(scale).unsqueeze(-1))

    def to(self, dtype):
        return CausalFeatureOperator(self.log_query.to(dtype), self.log_key.to(dtype), self.log_normaliser.to(dtype))


@method(
    "performer",
    target="softmax",
    features="positive orthogonal random features r",
    max_features=MAX_RANDOM_FEATURES,
    randomized=True,
    draw=draw_projection,
    causal=True,
    differentiable=True,
)
def performer(q, k, v, *, num_features, generator=None, orthogonal=True, draw=None, causal=False):
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
    causal : bool, default False
        Unidirectional FAVOR+ (``n == n_k``; Performer Section 2.6): row :math:`i` is
        :math:`\sum_{j\le i}\phi(q_i)^\top\phi(k_j)v_j / \sum_{j\le i}\phi(q_i)^\top\phi(k_j)`, computed
        by prefix sums in chunks of :data:`CAUSAL_CHUNK` positions (:func:`causal_feature_products`),
        never an ``n x n`` array. With the same draw it equals the masked, renormalised dense
        FAVOR+ matrix times V to rounding.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` the ``(*batch, n, n_k)`` matrix
        :math:`\tilde D^{-1}\phi(Q)\phi(K)^\top` as ``Diagonal @ Product`` of its factors;
        ``info``: ``projection`` ``(*batch, r, p)``, ``orthogonal``, ``query_features``
        ``(*batch, n, r)``, ``key_features`` ``(*batch, n_k, r)`` (the rescaled factors below).
        With ``causal=True``: ``operator()`` a :class:`CausalFeatureOperator`, ``info`` ``projection``,
        ``orthogonal``, ``causal``.

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
    if check_bool(causal, "causal"):
        numerator, normaliser, log_scale = causal_feature_products(log_q, log_k, v)
        operator = CausalFeatureOperator(log_q, log_k, log_scale + torch.log(normaliser))
        info = {"projection": projection, "orthogonal": orthogonal, "causal": True}
        return Approximation("performer", "softmax", numerator / normaliser.unsqueeze(-1), operator, info)
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
