r"""Nyströmformer: segment-means landmarks and an iterative pseudo-inverse (Xiong et al., 2021).

The softmax matrix :math:`S = \operatorname{softmax}(QK^\top/\sqrt p)` is approximated by the
Nyström form of its supplement, Eqs. (9)-(10),

.. math::

    \hat S = \underbrace{\operatorname{softmax}(Q\tilde K^\top/\sqrt p)}_{F,\ n\times m}\;
             Z^\star\;
             \underbrace{\operatorname{softmax}(\tilde Q K^\top/\sqrt p)}_{B,\ m\times n},
    \qquad Z^\star \approx A_S^+,\quad
    A_S = \operatorname{softmax}(\tilde Q\tilde K^\top/\sqrt p)\ (m\times m),

where :math:`\tilde Q, \tilde K` are the segment means of :math:`Q, K` and :math:`Z^\star` is
six steps of Eq. (5) (:func:`approxlab.linalg.iterative_pinv`). The output
:math:`F(Z^\star(BV))` costs :math:`O(nmp + m^3)`; no :math:`n\times n` matrix is formed.
"""

from __future__ import annotations

import torch

from .._validation import check_bool, check_choice, check_int, check_qkv, check_tensor
from ..kernels import softmax_matrix
from ..linalg.conditioning import condition_number
from ..linalg.pinv import INITS, iterative_pinv
from ..operators import ProductOperator
from ._base import Approximation, method
from ._masking import check_key_mask, masked_softmax_matrix, query_mask

__all__ = ["segment_sizes", "segment_means", "landmark_kernels", "nystromformer", "NYSTROMFORMER"]

PINV_CHOICES = ("iterative", "exact")


def segment_sizes(n: int, num_landmarks: int) -> tuple[int, ...]:
    r"""Lengths of the ``num_landmarks`` contiguous segments that split ``n`` tokens.

    Rule: with :math:`n = m\ell + r`, :math:`\ell = \lfloor n/m\rfloor`, :math:`0 \le r < m`, the
    **first** :math:`r` segments hold :math:`\ell + 1` tokens and the remaining :math:`m - r`
    hold :math:`\ell` (the split of ``numpy.array_split``). Sizes differ by at most one and
    sum to ``n``; when ``m`` divides ``n`` every segment has :math:`n/m` tokens, as in
    Nyströmformer (which pads ``n`` to a multiple of ``m`` instead).

    Parameters
    ----------
    n : int
        Number of tokens, ``>= 1``.
    num_landmarks : int
        Number of segments ``m`` with ``1 <= m <= n``.

    Returns
    -------
    tuple of int
        ``(m,)`` segment lengths, in token order.

    Examples
    --------
    >>> segment_sizes(37, 5)
    (8, 8, 7, 7, 7)
    """
    n = check_int(n, "n", low=1)
    num_landmarks = check_int(num_landmarks, "num_landmarks", low=1, high=n)
    length, remainder = divmod(n, num_landmarks)
    return (length + 1,) * remainder + (length,) * (num_landmarks - remainder)


def segment_means(x: torch.Tensor, num_landmarks: int, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Segment-means landmarks (Nyströmformer Section "Landmark selection"; spectral shifting Eq. (1)).

    .. math::

        \tilde x_j = \frac{1}{|I_j|}\sum_{i\in I_j} x_i, \qquad j = 1, \dots, m,

    with contiguous segments :math:`I_1, \dots, I_m` of the lengths :func:`segment_sizes`
    gives (first ``n mod m`` segments one token longer).

    Parameters
    ----------
    x : torch.Tensor
        ``(*batch, n, p)`` queries or keys.
    num_landmarks : int
        ``m`` with ``1 <= m <= n``.
    token_mask : torch.Tensor, optional
        ``(*batch, n)`` bool (broadcastable against ``x``'s batch), True on real tokens: the
        segments split each sequence's real tokens only (see Notes).

    Returns
    -------
    torch.Tensor
        ``(*batch, m, p)`` landmarks. Each is an exact mean of its segment (two reshapes, no
        cumulative sums, so no cancellation for long sequences; with ``token_mask``, one product
        with the ``(*batch, m, n)`` averaging weights).

    Notes
    -----
    **Padding.** With ``token_mask``, a sequence with :math:`L` real tokens (in any positions)
    gets the landmarks it would get with its padding removed: its real tokens, in order, are
    split by the rule of :func:`segment_sizes` for :math:`L` tokens, so padded rows never enter
    a landmark and sequences of different real lengths in one batch each get their own
    segments. When :math:`L < m` there are too few tokens for :math:`m` segments; landmark
    :math:`j` is then the real token of rank :math:`\lfloor jL/m\rfloor` (every real token a
    landmark, some repeated). Nyströmformer's published code instead multiplies padded
    :math:`Q, K` by 0 and averages fixed segments of the padded length (mlpen/Nystromformer,
    ``LRA/code/attention_nystrom.py``): padded contents do not leak there either, but a
    segment's mean is shrunk by its padded share and depends on the padded length.

    References
    ----------
    Xiong et al. (2021), Nyströmformer, supplement, "Landmark selection"; Verma, *Beyond
    Nyströmformer*, Eq. (1).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.nystromformer import segment_means
    >>> segment_means(torch.arange(5.0).reshape(5, 1), 2)  # segments [0, 1, 2] and [3, 4]
    tensor([[1.0000],
            [3.5000]])
    """
    check_tensor(x, "x")
    n = x.shape[-2]
    num_landmarks = check_int(num_landmarks, "num_landmarks", low=1, high=n)
    if token_mask is not None:
        return _real_segment_weights(token_mask, num_landmarks, x.dtype) @ x

    length, remainder = divmod(n, num_landmarks)
    batch, p = x.shape[:-2], x.shape[-1]
    split = remainder * (length + 1)
    long_means = x[..., :split, :].reshape(*batch, remainder, length + 1, p).mean(-2)
    short_means = x[..., split:, :].reshape(*batch, num_landmarks - remainder, length, p).mean(-2)
    return torch.cat([long_means, short_means], dim=-2)


def _real_segment_weights(token_mask: torch.Tensor, num_landmarks: int, dtype) -> torch.Tensor:
    """``(*batch, m, n)`` weights of the segment means over each sequence's real tokens (see
    :func:`segment_means`): row ``j`` is ``1/|I_j|`` on the real tokens of segment ``j``, else 0."""
    rank = token_mask.cumsum(-1) - 1  # (*batch, n): rank of each token among the real ones
    real = token_mask.sum(-1, keepdim=True)  # (*batch, 1): L
    j = torch.arange(num_landmarks + 1, device=token_mask.device)
    length, remainder = real // num_landmarks, real % num_landmarks
    bounds = torch.where(real >= num_landmarks, j * length + torch.minimum(j, remainder),  # segment_sizes(L, m)
                         j * real // num_landmarks)  # L < m: one real token per landmark
    start = bounds[..., :-1]
    end = torch.where(real >= num_landmarks, bounds[..., 1:], start + 1)
    inside = (rank.unsqueeze(-2) >= start.unsqueeze(-1)) & (rank.unsqueeze(-2) < end.unsqueeze(-1))
    inside &= token_mask.unsqueeze(-2)
    return inside.to(dtype) / (end - start).unsqueeze(-1).to(dtype)


def landmark_kernels(q: torch.Tensor, k: torch.Tensor, num_landmarks: int, key_mask=None):
    r"""The three softmax kernels of Nyströmformer Eq. (9) from segment-means landmarks.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    num_landmarks : int
        ``m`` with ``1 <= m <= min(n, n_k)``.
    key_mask : torch.Tensor, optional
        ``(*batch, n_k)`` bool, True on keys to attend: :math:`B` is the softmax over kept keys
        only (as the official code's :math:`-10^9` on padded keys), so masked keys get zero
        weight, and the landmarks are segment means over real tokens only
        (:func:`segment_means`; queries too in self-attention,
        :func:`approxlab.methods._masking.query_mask`), so real rows' outputs do not depend on
        padded rows.

    Returns
    -------
    F : torch.Tensor
        ``(*batch, n, m)``, :math:`\operatorname{softmax}(Q\tilde K^\top/\sqrt p)`.
    A_S : torch.Tensor
        ``(*batch, m, m)``, :math:`\operatorname{softmax}(\tilde Q\tilde K^\top/\sqrt p)`.
    B : torch.Tensor
        ``(*batch, m, n_k)``, :math:`\operatorname{softmax}(\tilde Q K^\top/\sqrt p)`.

    Notes
    -----
    All three are row-stochastic and computed in the log domain
    (:func:`approxlab.kernels.softmax_matrix`), so logits of any size give finite kernels.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.nystromformer import landmark_kernels
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 12, 4, generator=g, dtype=torch.float64), torch.randn(2, 10, 4, generator=g, dtype=torch.float64)
    >>> f, a_s, b = landmark_kernels(q, k, 3)
    >>> f.shape, a_s.shape, b.shape
    (torch.Size([2, 12, 3]), torch.Size([2, 3, 3]), torch.Size([2, 3, 10]))
    >>> bool(torch.allclose(b.sum(-1), torch.ones(2, 3, dtype=torch.float64)))  # row-stochastic
    True
    """
    check_qkv(q, k)
    n = min(q.shape[-2], k.shape[-2])
    num_landmarks = check_int(num_landmarks, "num_landmarks", low=1, high=n)
    key_mask = check_key_mask(key_mask, k)
    q_landmarks = segment_means(q, num_landmarks, query_mask(key_mask, q, k))
    k_landmarks = segment_means(k, num_landmarks, key_mask)
    return (
        softmax_matrix(q, k_landmarks),
        softmax_matrix(q_landmarks, k_landmarks),
        masked_softmax_matrix(q_landmarks, k, key_mask),
    )


@method(
    "nystromformer",
    target="softmax",
    features="segment-means landmarks m",
    max_features=lambda n: n,
    randomized=False,
    causal="mask-renormalise",
    differentiable=True,
)
def nystromformer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_features: int,
    generator: torch.Generator | None = None,
    pinv: str = "iterative",
    num_iter: int = 6,
    init="nystromformer",
    residual_history: bool = False,
    residual_norm: str = "frobenius",
    key_mask: torch.Tensor | None = None,
    diagnostics: bool = True,
) -> Approximation:
    r"""Nyströmformer attention with ``num_features`` segment-means landmarks.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Number of landmarks ``m`` with ``1 <= m <= min(n, n_k)``; the segments are those of
        :func:`segment_sizes` (first ``n mod m`` segments one token longer).
    generator : torch.Generator, optional
        Unused (the method is deterministic); accepted for the common interface.
    pinv : {"iterative", "exact"}
        ``"iterative"`` (default): :math:`Z^\star` = ``num_iter`` steps of Nyströmformer Eq. (5);
        ``"exact"``: :math:`Z^\star = A_S^+` by ``torch.linalg.pinv`` (SVD, default cut-off).
    num_iter : int
        Iterations of Eq. (5), ``>= 0`` (Nyströmformer uses 6). Used with ``pinv="iterative"``.
    init : {"nystromformer", "official", "identity"} or torch.Tensor
        :math:`Z_0` of the iteration, passed to :func:`approxlab.linalg.iterative_pinv`.
        ``"nystromformer"`` (default): :math:`A_S^\top/(\|A_S\|_1\|A_S\|_\infty)` **per matrix**,
        the published choice, which satisfies Lemma 1's condition
        :math:`\|A_SA_S^+ - A_SZ_0\| < 1` for every matrix of the batch. ``"official"``: the
        released code's :math:`A_S^\top/\max_j\sum_i (A_S)_{ij}` with the maximum taken over the
        **whole batch** (so a head's result depends on the other heads in the batch). Used with
        ``pinv="iterative"``.
    residual_history : bool
        Record the pseudo-inverse residuals of every iterate (``True``) or only of
        :math:`Z_0` and the last one (``False``, default).
    residual_norm : {"frobenius", "spectral"}
        Norm of those residuals (``"spectral"``: the 2-norm of Lemma 1, one SVD each;
        ``"frobenius"``, default: cheap, within a factor :math:`\sqrt m` of it).
    key_mask : torch.Tensor, optional
        ``(*batch, n_k)`` bool, True on keys to attend; landmarks over real tokens only (see
        :func:`landmark_kernels`). ``info["segment_sizes_*"]`` stay those of the unmasked split.
    diagnostics : bool
        ``False``: leave out ``core_condition_number`` (an SVD of every core the approximation
        does not need; how training calls it).

    Returns
    -------
    Approximation
        ``output = F @ (Z @ (B @ v))``, ``(*batch, n, p_v)``; ``operator()`` is
        ``ProductOperator(F, Z, B)``. ``info`` holds ``"num_landmarks"``,
        ``"segment_sizes_q"``, ``"segment_sizes_k"`` (tuples of int), ``"core"`` (:math:`A_S`,
        ``(*batch, m, m)``), ``"core_condition_number"`` (``(*batch,)``, ``inf`` if singular),
        ``"pinv_inverse"`` (:math:`Z^\star`) and, for ``pinv="iterative"``,
        ``"pinv_residuals"`` :math:`\|I - A_SZ_j\|` and ``"penrose_residuals"``
        :math:`\|A_SZ_jA_S - A_S\|/\|A_S\|` (in the norm ``residual_norm``), each ``(num_iter + 1, *batch)`` with
        ``residual_history=True``, else ``(2, *batch)`` (first and last iterate).

    Warns
    -----
    ConvergenceWarning
        From :func:`~approxlab.linalg.iterative_pinv` if the iteration diverges.

    Notes
    -----
    :math:`\hat S = F Z^\star B` (supplement Eqs. (9)-(10)), with
    :math:`F = \operatorname{softmax}(Q\tilde K^\top/\sqrt p)`,
    :math:`A_S = \operatorname{softmax}(\tilde Q\tilde K^\top/\sqrt p)`,
    :math:`B = \operatorname{softmax}(\tilde Q K^\top/\sqrt p)` and
    :math:`Z_{j+1} = \tfrac14 Z_j(13I - A_SZ_j(15I - A_SZ_j(7I - A_SZ_j)))` (Eq. (5)), which
    converges in third order to :math:`A_S^+` (Lemma 1). With ``m = n`` the landmarks are the
    tokens themselves and :math:`\hat S = SS^+S = S` for the exact pseudo-inverse (Lemma 2).
    For any :math:`Z^\star` the error obeys Proposition 1,
    :math:`\|SV - \hat SV\|_\infty \le (1 + \|A_S^+\|_\infty + \|A_S^+ - Z^\star\|_\infty)\|V\|_\infty`.
    :math:`\hat S` is not row-stochastic in general.

    References
    ----------
    Xiong, Zeng, Chakraborty, Tan, Fung, Li, Singh (2021), "Nyströmformer: A Nyström-based
    Algorithm for Approximating Self-Attention", AAAI; supplement Eqs. (5), (9)-(10), Lemmas 1-2,
    Proposition 1. Razavi et al. (2014) for the iteration.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for m in (8, 32):
    ...     approx = approxlab.approximate("nystromformer", q, k, v, num_features=m)  # deterministic landmarks
    ...     print(m, [round(e, 3) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    8 [0.621, 0.43]
    32 [0.027, 0.022]
    >>> approx = approxlab.approximate("nystromformer", q, k, v, num_features=32, pinv="exact")  # m = n, exact pinv
    >>> bool((spectral_error(approx.output, exact, relative=True) < 1e-12).all())
    True
    """
    check_qkv(q, k, v)
    n = min(q.shape[-2], k.shape[-2])
    num_features = check_int(num_features, "num_features", low=1, high=n)
    check_choice(pinv, "pinv", PINV_CHOICES)
    num_iter = check_int(num_iter, "num_iter", low=0)
    check_bool(residual_history, "residual_history")
    check_choice(residual_norm, "residual_norm", ("frobenius", "spectral"))
    if isinstance(init, str):
        check_choice(init, "init", INITS)
    elif not isinstance(init, torch.Tensor):
        raise TypeError(f"`init` must be one of {sorted(INITS)} or a torch.Tensor; got {type(init).__name__}.")

    f, core, b = landmark_kernels(q, k, num_features, key_mask)
    info = {
        "num_landmarks": num_features,
        "segment_sizes_q": segment_sizes(q.shape[-2], num_features),
        "segment_sizes_k": segment_sizes(k.shape[-2], num_features),
        "core": core,
        "pinv": pinv,
    }
    if check_bool(diagnostics, "diagnostics"):
        info["core_condition_number"] = torch.as_tensor(condition_number(core.detach()), dtype=torch.float64)
    if pinv == "iterative":
        result = iterative_pinv(core, num_iter, init=init, history=residual_history, norm=residual_norm)
        z = result.inverse
        info["pinv_residuals"] = result.residuals
        info["penrose_residuals"] = result.penrose_residuals
    else:
        z = torch.linalg.pinv(core)
    info["pinv_inverse"] = z

    output = f @ (z @ (b @ v))
    return Approximation("nystromformer", "softmax", output, ProductOperator(f, z, b), info)


NYSTROMFORMER = nystromformer
__test__ = {"nystromformer": nystromformer.function}  # doctest skips a MethodSpec: run its function's examples
