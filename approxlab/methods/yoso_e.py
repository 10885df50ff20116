r"""YOSO-E: the expectation of YOSO-m over hashes (Zeng et al., 2021), computed exactly.

The reference that YOSO-m (:mod:`approxlab.methods.yoso`) converges to as the number of hashes
grows; target ``"yoso"``. ``num_features`` is accepted and ignored.
"""

from __future__ import annotations

import math

import torch

from .. import lsh
from .._validation import check_bool, check_choice, check_int
from ..linalg.scaling import unit_rows
from ..kernels import causal_mask
from ..operators import DenseOperator, DiagonalOperator, ProductOperator
from ._base import Approximation, method
from ._masking import check_key_mask
from .yoso import MAX_HASHES

__all__ = ["GRADIENTS", "collision_probability", "yoso_e", "YOSO_E"]

GRADIENTS = ("true", "lower-bound")
"""Backward passes of the collision probability: its derivative, or YOSO's Eq. (4) lower bound."""


def _power_(x: torch.Tensor, tau: int) -> torch.Tensor:
    """``x**tau`` for an integer ``tau >= 1`` by repeated squaring, in ``x``'s storage (``x`` is
    overwritten; one more array only when ``tau`` is not a power of 2). About ``log2(tau)``
    roundings instead of ``pow``'s one, at a tenth of its time on CPU."""
    result = None
    while tau > 1:
        if tau & 1:
            result = x.clone() if result is None else result.mul_(x)
        x.mul_(x)
        tau >>= 1
    return x if result is None else x.copy_(result.mul_(x))


class _CollisionProbability(torch.autograd.Function):
    """YOSO-E weights (1 - arccos(c)/pi)^tau; backward pass chosen by ``gradient``.

    In place wherever the values allow: on CPU each new (n, n_k) array costs a page-faulting
    allocation, which for this elementwise chain costs more than the arithmetic. With
    ``overwrite`` (a cosine array nobody else reads) the lower-bound weights are computed in the
    cosine's own storage.
    """

    @staticmethod
    def forward(ctx, cosine, tau, gradient, overwrite):
        ctx.tau, ctx.gradient = tau, gradient
        if gradient == "lower-bound":  # the backward needs the weights only: one array
            if overwrite:
                ctx.mark_dirty(cosine)
            clamped = cosine.clamp_(-1.0, 1.0) if overwrite else cosine.clamp(-1.0, 1.0)
            weights = _power_(clamped.arccos_().div_(math.pi).neg_().add_(1.0), tau)  # 1 + (-x) == 1 - x
            ctx.save_for_backward(weights)
            return weights
        clamped = cosine.clamp(-1.0, 1.0)
        base = torch.arccos(clamped).div_(math.pi).neg_().add_(1.0)
        ctx.save_for_backward(clamped, base)
        return _power_(base.clone(), tau)

    @staticmethod
    def backward(ctx, grad):
        tau = ctx.tau
        if ctx.gradient == "lower-bound":
            (weights,) = ctx.saved_tensors
            return torch.mul(grad, weights).mul_(0.5 * tau), None, None, None
        clamped, base = ctx.saved_tensors
        sine = torch.sqrt((1.0 - clamped * clamped).clamp_min(torch.finfo(clamped.dtype).tiny))
        derivative = tau * base ** (tau - 1) / (math.pi * sine)
        return grad * derivative, None, None, None


def collision_probability(cosine: torch.Tensor, tau: int, *, gradient: str = "true") -> torch.Tensor:
    r"""YOSO-E's weights :math:`(1 - \arccos(c)/\pi)^\tau` with a choice of backward pass.

    Parameters
    ----------
    cosine : torch.Tensor
        Cosines :math:`c = \hat q^\top\hat k`, any shape; clamped to ``[-1, 1]`` (the forward
        value is :func:`approxlab.lsh.collision_probability`'s up to rounding: the power is taken
        by repeated squaring, :math:`\lceil\log_2\tau\rceil` products).
    tau : int
        Hyperplanes per hash, ``1 <= tau <= 30``.
    gradient : {"true", "lower-bound"}
        ``"true"``: the derivative :math:`\tau(1 - \arccos(c)/\pi)^{\tau-1}/(\pi\sqrt{1 - c^2})`
        (YOSO Eq. (3)), which grows without bound as :math:`c \to 1` (the square root is floored
        at the dtype's smallest normal number, so it stays finite but huge). ``"lower-bound"``:
        YOSO's Eq. (4), :math:`\tfrac{\tau}{2}(1 - \arccos(c)/\pi)^\tau`, bounded by
        :math:`\tau/2`, the gradient YOSO trains with ("to avoid this numerical issue, we use a
        lower bound of the actual derivative").

    Notes
    -----
    Eq. (4) is a lower bound of Eq. (3)'s factor: with :math:`\theta = \arccos c`,
    :math:`\tfrac12(1-\theta/\pi) \le 1/(\pi\sin\theta)` because
    :math:`(\pi - \theta)\sin\theta \le 2` on :math:`[0, \pi]`. Both backward passes give the
    gradient with respect to :math:`c`; autograd carries it through the normalisation of
    :math:`q, k`. For ``"true"`` at :math:`c = -1` and ``tau = 1`` the derivative is infinite too
    (floored as above).

    References
    ----------
    Zeng et al. (2021), YOSO, Section 3.3, Eqs. (3)-(4) and Figure 2.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.yoso_e import collision_probability
    >>> collision_probability(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), 2)  # (1 - angle/pi)**2
    tensor([1.0000, 0.2500, 0.0000], dtype=torch.float64)
    >>> c = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    >>> bounded, = torch.autograd.grad(collision_probability(c, 8, gradient="lower-bound").sum(), c)
    >>> bool(bounded <= 4)  # Eq. (4) of YOSO: at most tau / 2
    True
    """
    tau = check_int(tau, "tau", low=1, high=lsh.MAX_TAU)
    check_choice(gradient, "gradient", GRADIENTS)
    return _CollisionProbability.apply(cosine, tau, gradient, False)


@method(
    "yoso-e",
    target="yoso",
    features="ignored (exact expectation)",
    max_features=lambda n: MAX_HASHES,
    randomized=False,
    causal=True,
    differentiable=True,
)
def yoso_e(q, k, v, *, num_features=None, generator=None, tau=8, normalize_output=False, gradient="true",
           key_mask=None, causal=False):
    r"""YOSO-E attention :math:`\bigl(1 - \arccos(\hat Q\hat K^\top)/\pi\bigr)^{\circ\tau} V`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``; rows are :math:`\ell_2`-normalised first.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features, generator
        Accepted and ignored (deterministic), so YOSO-E runs through the same grids as YOSO-m;
        ``num_features`` may be up to the YOSO-m maximum.
    tau : int, default 8
        Hyperplanes per hash of the YOSO-m this is the expectation of, ``1 <= tau <= 30``.
    normalize_output : bool, default False
        If True, :math:`\ell_2`-normalise each output row (N-YOSO, YOSO Section 3.1); zero rows
        stay zero. The operator is the unnormalised matrix either way.
    gradient : {"true", "lower-bound"}
        Backward pass of the weights (:func:`collision_probability`): the true derivative
        (default, YOSO Eq. (3)) or YOSO's Eq. (4) lower bound, the one YOSO trains with. The
        forward value is the same.
    key_mask : torch.Tensor, optional
        ``(*batch, n_k)`` bool, True on keys to attend; masked keys' columns are 0.
    causal : bool, default False
        The causal expectation :math:`L\odot\mathbb E[\mathcal B]` (``n == n_k``): entries with key
        ``j > i`` set to 0, as a decoder masks them (no renormalisation: YOSO does not normalise rows).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a dense ``(*batch, n, n_k)`` operator (times
        the diagonal of ``key_mask`` when given);
        ``info``: ``tau``, ``normalize_output``.

    Notes
    -----
    :math:`\mathbb E[\mathcal B(Q,K)_{ij}] = (1 - \arccos(\hat Q_i^\top\hat K_j)/\pi)^\tau` is the
    collision probability of ``tau`` concatenated hyperplane hashes (YOSO Section 3.1, the display
    after Eq. (2); Charikar, 2002). The cosine is clamped to ``[-1, 1]`` before ``arccos``. This forms
    the dense ``n x n_k`` matrix: :math:`O(n n_k p)` time and :math:`O(n n_k)` memory, as the paper
    notes for YOSO-E ("directly computing the expectation involves a :math:`O(n^2)` cost", Section 4.1).
    Entries lie in ``[0, 1]``; nothing can overflow.

    References
    ----------
    .. [1] Z. Zeng, Y. Xiong, S. N. Ravi, S. Acharya, G. Fung, V. Singh. "You Only Sample (Almost)
       Once: Linear Cost Self-Attention Via Bernoulli Sampling." ICML 2021.
    .. [2] M. S. Charikar. "Similarity estimation techniques from rounding algorithms." STOC 2002.

    Examples
    --------
    >>> import math, torch, approxlab
    >>> from approxlab.linalg.scaling import unit_rows
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 16, 4, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("yoso-e", q, k, v, num_features=1, tau=8)
    >>> weights = (1 - torch.arccos((unit_rows(q) @ unit_rows(k).mT).clamp(-1, 1)) / math.pi) ** 8
    >>> bool(torch.allclose(approx.output, weights @ v))
    True
    """
    tau = check_int(tau, "tau", low=1, high=lsh.MAX_TAU)
    check_bool(normalize_output, "normalize_output")
    check_choice(gradient, "gradient", GRADIENTS)
    key_mask = check_key_mask(key_mask, k)
    cosine = unit_rows(q) @ unit_rows(k).transpose(-1, -2)  # scale-invariant; read by nothing else:
    matrix = _CollisionProbability.apply(cosine, tau, gradient, True)  # the weights overwrite it
    if causal:
        matrix = matrix * causal_mask(q.shape[-2], k.shape[-2], device=q.device).to(matrix.dtype)
    operator = DenseOperator(matrix)
    if key_mask is not None:  # masked keys' values are 0: no second (n, n_k) array
        operator = ProductOperator(operator, DiagonalOperator(key_mask.expand(k.shape[:-1]).to(q.dtype)))
    output = operator.matmat(v)
    if normalize_output:
        output = unit_rows(output)
    info = {"tau": tau, "normalize_output": normalize_output, "gradient": gradient}
    return Approximation("yoso-e", "yoso", output, operator, info)


YOSO_E = yoso_e
__test__ = {"yoso_e": yoso_e.function}  # doctest skips a MethodSpec: run its function's examples
