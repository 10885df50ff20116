r"""Performer as the Skyformer authors' code feeds it (their LRA attention module).

The Skyformer authors' Performer attention (``PerformerAttention`` in their LRA code, Chen et
al. 2021) divides Q and K by :math:`p^{1/4}` and passes them to performer-pytorch's
``softmax_kernel`` (lucidrains), which multiplies its input by :math:`p^{-1/4}` once more. The
random features are therefore drawn for :math:`x = q/\sqrt p`, :math:`y = k/\sqrt p`, and FAVOR+
estimates

.. math::

    \exp(x^\top y) = \exp(q^\top k/p),

the scores of :math:`\operatorname{softmax}(QK^\top/p)`, not of :math:`\operatorname{softmax}(QK^\top/\sqrt p)`.
Measured against exact :math:`\operatorname{softmax}(QK^\top/\sqrt p)V`, like every method, the
error cannot fall below :math:`\|\operatorname{softmax}(QK^\top/p)V - \operatorname{softmax}(QK^\top/\sqrt p)V\|_2`:
a floor that flattens the error-vs-features curve. This module reproduces that call, and
performer-pytorch's stabiliser, on top of :mod:`approxlab.methods.performer`'s features.
"""

from __future__ import annotations

from .._validation import check_bool, check_int, check_positive_float
from ..operators import DiagonalOperator, ProductOperator
from ._base import Approximation, method
from .performer import MAX_RANDOM_FEATURES, draw_projection, positive_random_features, resolve_projection

__all__ = ["performer_lra", "PERFORMER_LRA", "PERFORMER_PYTORCH_EPSILON"]

PERFORMER_PYTORCH_EPSILON = 1e-4
"""performer-pytorch's ``softmax_kernel(..., eps=1e-4)``: added to every stabilised feature."""


@method(
    "performer-lra",
    target="softmax",
    features="positive orthogonal random features r (Performer as the Skyformer authors' code feeds it)",
    max_features=MAX_RANDOM_FEATURES,
    randomized=True,
    draw=draw_projection,
    differentiable=True,
)
def performer_lra(q, k, v, *, num_features, generator=None, orthogonal=True, epsilon=PERFORMER_PYTORCH_EPSILON,
                  shared_key_max=True, draw=None):
    r"""FAVOR+ on :math:`Q/\sqrt p`, :math:`K/\sqrt p` with performer-pytorch's stabiliser and ``eps``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``: the model's Q and K, before any scaling.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number of random features :math:`r` (the authors' ``rp_dim``, set to the same budget as the
        other methods' ``nb_features``), ``1 <= r <= MAX_RANDOM_FEATURES``.
    generator : torch.Generator, optional
        CPU generator for the projection (each batch element gets its own draw).
    orthogonal : bool, default True
        Orthogonal random features with :math:`\chi_p` lengths (performer-pytorch's default
        ``ortho_scaling=0``); see :func:`~approxlab.methods.performer.gaussian_random_features`.
    epsilon : float, default 1e-4
        performer-pytorch's ``eps``, added to every stabilised feature before the row sums
        (``0`` leaves FAVOR+ unbiased for :math:`\exp(q^\top k/p)`).
    shared_key_max : bool, default True
        Stabilise the key features with one maximum over the whole ``(*batch, n_k, r)`` tensor, as
        performer-pytorch's ``torch.max(data_dash)`` does over all batch elements and heads of a
        call (the batch elements then interact through ``epsilon``); False: one maximum per batch
        element.
    draw : dict, optional
        ``{"projection": (*batch, r, p)}``, the same draw as ``performer``'s
        (:func:`~approxlab.methods.performer.draw_projection`), used instead of ``generator``: the
        two methods can share one draw.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` :math:`\tilde D^{-1}Q'K'^\top` as
        ``Diagonal @ Product``; ``info``: ``projection`` ``(*batch, r, p)``, ``orthogonal``,
        ``epsilon``, ``query_features`` ``(*batch, n, r)``, ``key_features`` ``(*batch, n_k, r)``,
        ``row_sums`` ``(*batch, n)`` (:math:`Q'K'^\top\mathbf 1`, in the features' units).

    Notes
    -----
    With :math:`x_i = q_i/\sqrt p`, :math:`y_j = k_j/\sqrt p`, projection rows :math:`w_l`,
    :math:`u_{il} = w_l^\top x_i`, :math:`h(x) = \|x\|^2/2` and :math:`\varepsilon` = ``epsilon``,
    performer-pytorch's features are

    .. math::

        Q'_{il} = r^{-1/2}\bigl(e^{u_{il} - h(x_i) - \max_{l'} u_{il'}} + \varepsilon\bigr), \qquad
        K'_{jl} = r^{-1/2}\bigl(e^{v_{jl} - h(y_j) - \max_{j', l'} v_{j'l'}} + \varepsilon\bigr),

    with :math:`v_{jl} = w_l^\top y_j`, and the output is :math:`\tilde D^{-1}Q'(K'^\top V)`,
    :math:`\tilde D = \operatorname{diag}(Q'K'^\top\mathbf 1)` (its ``linear_attention``). With
    :math:`\varepsilon = 0` the row and key maxima cancel in :math:`\tilde D^{-1}Q'K'^\top`, which
    is then FAVOR+ (Performer Lemma 1) for :math:`\exp(q^\top k/p)`, i.e.
    :func:`~approxlab.methods.performer.performer` applied to :math:`Q/p^{1/4}`, :math:`K/p^{1/4}`
    (identical draws, equal up to rounding). With :math:`\varepsilon > 0` every feature gets a
    floor, which pulls the attention towards uniform wherever the stabilised features are below
    :math:`\varepsilon` -- for keys in every head whose maximum is far below the call's largest.
    Every exponent is :math:`\le 0`, so no feature exceeds :math:`r^{-1/2}(1 + \varepsilon)` and,
    for :math:`\varepsilon > 0`, no row sum vanishes.

    The authors draw one projection per model, shared by all heads and batch elements and never
    redrawn (performer-pytorch's ``FastAttention`` buffer); here each batch element has its own
    draw (same per-head distribution). Their QR has no sign fix (``qr_uniform_q=False``); here
    the blocks are Haar.

    References
    ----------
    .. [1] Chen, Zeng, Ji, Yang. "Skyformer: Remodel Self-Attention with Gaussian Kernel and
       Nystrom Method." NeurIPS 2021; the authors' code, pkuzengqi/Skyformer,
       ``src/models/attention_performer.py``.
    .. [2] K. Choromanski et al. "Rethinking Attention with Performers." ICLR 2021; lucidrains,
       performer-pytorch, ``softmax_kernel`` and ``linear_attention``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, scale=0.5, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for r in (8, 4096):  # features of Q / sqrt(p): another temperature, so no convergence to softmax(QK^T / sqrt(p))
    ...     approx = approxlab.approximate("performer-lra", q, k, v, num_features=r, generator=torch.Generator().manual_seed(1))
    ...     print(r, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    8 [0.3, 0.26]
    4096 [0.18, 0.09]
    """
    num_features = check_int(num_features, "num_features", low=1, high=MAX_RANDOM_FEATURES)
    check_bool(orthogonal, "orthogonal")
    epsilon = check_positive_float(epsilon, "epsilon", allow_zero=True)
    check_bool(shared_key_max, "shared_key_max")
    p = q.shape[-1]
    projection = resolve_projection("performer-lra", q, k, num_features=num_features, generator=generator,
                                    orthogonal=orthogonal, draw=draw)
    scale = p ** -0.5  # the authors' p^(-1/4), then softmax_kernel's p^(-1/4)
    x, y = q * scale, k * scale
    # log phi = w^T x - |x|^2/2 - log(r)/2; the stabilisers below take maxima of w^T x alone
    log_q = positive_random_features(x, projection, log=True)  # (*batch, n, r)
    log_k = positive_random_features(y, projection, log=True)  # (*batch, n_k, r)
    half_sq_x = 0.5 * (x * x).sum(-1, keepdim=True)
    half_sq_y = 0.5 * (y * y).sum(-1, keepdim=True)
    ratio = num_features ** -0.5
    # query: u - h(x) - max_l u = log phi - max_l log phi - h(x)
    # exp_ acts on a fresh temporary; its result (which exp's gradient needs) is then left untouched: the
    # out-of-place add makes the tensor that mul_ scales in place
    query_features = (log_q - log_q.amax(-1, keepdim=True) - half_sq_x).exp_().add(epsilon).mul_(ratio)
    # key: v - h(y) - max v with v = log phi + h(y) + log(r)/2, i.e. log phi - max(log phi + h(y))
    key_dims = tuple(range(-log_k.dim(), 0)) if shared_key_max else (-2, -1)
    key_max = (log_k + half_sq_y).amax(dim=key_dims, keepdim=True)
    key_features = (log_k - key_max).exp_().add(epsilon).mul_(ratio)
    row_sums = query_features @ key_features.sum(-2).unsqueeze(-1)  # (*batch, n, 1)
    output = (query_features @ (key_features.transpose(-1, -2) @ v)) / row_sums

    def build_operator():
        return ProductOperator(
            DiagonalOperator(1.0 / row_sums.squeeze(-1)), query_features, key_features.transpose(-1, -2)
        )

    info = {
        "projection": projection,
        "orthogonal": orthogonal,
        "epsilon": epsilon,
        "query_features": query_features,
        "key_features": key_features,
        "row_sums": row_sums.squeeze(-1),
    }
    return Approximation("performer-lra", "softmax", output, build_operator, info)


PERFORMER_LRA = performer_lra
__test__ = {"performer_lra": performer_lra.function}  # doctest skips a MethodSpec: run its function's examples
