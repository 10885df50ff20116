r"""Linformer with random Johnson--Lindenstrauss projections (Wang et al., 2020).

``num_features`` is the projected length :math:`k` of keys and values.
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_bool, check_int
from ..kernels import softmax_matrix
from ..operators import ProductOperator
from ._base import Approximation, method
from .draws import DrawEntry, check_draw

__all__ = ["linformer", "LINFORMER", "gaussian_projection", "draw_projections"]


def gaussian_projection(
    num_features: int,
    n: int,
    *,
    batch_shape=(),
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device="cpu",
) -> torch.Tensor:
    r"""Random JL projection :math:`R \in \mathbb R^{k\times n}` with i.i.d. :math:`\mathcal N(0, 1/k)` entries.

    Then :math:`\mathbb E[R^\top R] = I_n` and :math:`\|Rx\| \approx \|x\|` (Linformer Theorems 1-2
    take their projections of this form).

    Parameters
    ----------
    num_features : int
        Projected length :math:`k \ge 1`.
    n : int
        Sequence length projected from.
    batch_shape : tuple of int
        Leading batch dimensions; each batch element gets its own draw.
    generator : torch.Generator, optional
        CPU generator; drawn on CPU in float64, then cast to ``dtype`` and moved to ``device``.

    Returns
    -------
    torch.Tensor
        ``(*batch_shape, k, n)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.linformer import gaussian_projection
    >>> r = gaussian_projection(2000, 3, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.allclose(r.T @ r, torch.eye(3, dtype=torch.float64), atol=0.1))  # E[R^T R] = I
    True
    """
    num_features = check_int(num_features, "num_features", low=1)
    n = check_int(n, "n", low=1)
    g = as_generator(generator)
    r = torch.randn(*tuple(batch_shape), num_features, n, generator=g, dtype=torch.float64)
    return r.div_(math.sqrt(num_features)).to(device=device, dtype=dtype)


def draw_projections(q, k, *, num_features, generator=None, share_projection=False):
    r"""The random draw of :func:`linformer`: the projections :math:`E` (keys) and :math:`F` (values).

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n_k, p)`` (only their shapes and device are used).
    num_features : int
        Projected length :math:`k`, ``1 <= k <= n_k``.
    generator : torch.Generator, optional
        CPU generator: :math:`E` is drawn first, then :math:`F` (float64 on the CPU).
    share_projection : bool, default False
        One projection for keys and values (:math:`F = E`): only :math:`E` is drawn.

    Returns
    -------
    dict
        ``{"projection_keys": E, "projection_values": F}``, each ``(*batch, k, n_k) float64`` on
        ``q.device`` with i.i.d. :math:`\mathcal N(0, 1/k)` entries (:func:`gaussian_projection`);
        only ``"projection_keys"`` with ``share_projection=True``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.linformer import draw_projections
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> draw = draw_projections(q, k, num_features=5, generator=torch.Generator().manual_seed(0))
    >>> sorted(draw), draw["projection_keys"].shape
    (['projection_keys', 'projection_values'], torch.Size([2, 5, 16]))
    """
    n_k = k.shape[-2]
    num_features = check_int(num_features, "num_features", low=1, high=n_k)
    check_bool(share_projection, "share_projection")
    generator = as_generator(generator)
    options = dict(batch_shape=q.shape[:-2], generator=generator, dtype=torch.float64, device=q.device)
    draw = {"projection_keys": gaussian_projection(num_features, n_k, **options)}
    if not share_projection:
        draw["projection_values"] = gaussian_projection(num_features, n_k, **options)
    return draw


@method(
    "linformer",
    target="softmax",
    features="projected length k of keys and values",
    randomized=True,
    draw=draw_projections,
    differentiable=True,
)
def linformer(q, k, v, *, num_features, generator=None, share_projection=False, draw=None):
    r"""Linformer attention :math:`\operatorname{softmax}\bigl(Q(EK)^\top/\sqrt p\bigr)(FV)`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features : int
        Projected length :math:`k`, ``1 <= k <= n_k``.
    generator : torch.Generator, optional
        CPU generator for :math:`E` (drawn first) and :math:`F`; each batch element gets its own.
    share_projection : bool, default False
        If True, :math:`F = E` (one projection for keys and values; Linformer's "key-value sharing",
        and the setting of its Theorem 2, where both are multiples of one JL matrix). If False, two
        independent draws.
    draw : dict, optional
        ``{"projection_keys": (*batch, k, n_k), "projection_values": (*batch, k, n_k)}`` (only the
        first with ``share_projection=True``; float32 or float64), the draw of
        :func:`draw_projections` (``approxlab.methods.draw``), used instead of ``generator`` (cast
        to ``q``'s dtype): the same draw gives the same output bit for bit.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` the ``(*batch, n, n_k)`` product
        :math:`P F` of ``P`` ``(*batch, n, k)`` and ``F`` ``(*batch, k, n_k)``; ``info``:
        ``projection_keys`` (E), ``projection_values`` (F), ``share_projection``, ``context``
        (``P``).

    Notes
    -----
    Linformer Eq. (7) with fixed random (not learned) projections :math:`E, F \in \mathbb R^{k\times n_k}`,
    entries :math:`\mathcal N(0, 1/k)`: the context mapping
    :math:`P = \operatorname{softmax}(Q(EK)^\top/\sqrt p)` is ``n x k`` and the output is
    :math:`P(FV)`, in :math:`O(n_k k p + n k p)` time. The implied ``n x n_k`` "attention matrix"
    :math:`PF` is what the operator represents; unlike softmax attention its rows do not sum to 1
    (and its entries can be negative), so it approximates :math:`D^{-1}A` only through
    :math:`\mathbb E[F^\top F] = I`. :math:`P` is a softmax computed in the log domain, so large
    logits never overflow.

    **Draw.** Linformer learns :math:`E, F`; its Theorems 1-2 take them random, as here: i.i.d.
    :math:`\mathcal N(0, 1/k)` entries, one draw per batch element, :math:`E` first
    (:func:`draw_projections`).

    References
    ----------
    .. [1] S. Wang, B. Z. Li, M. Khabsa, H. Fang, H. Ma. "Linformer: Self-Attention with Linear
       Complexity." arXiv:2006.04768, 2020.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> for length in (8, 32):  # a random projection of keys and values, even at k = n
    ...     approx = approxlab.approximate("linformer", q, k, v, num_features=length, generator=torch.Generator().manual_seed(1))
    ...     print(length, [round(e, 2) for e in spectral_error(approx.output, exact, relative=True).tolist()])
    8 [5.01, 5.38]
    32 [2.27, 1.24]
    """
    n_k = k.shape[-2]
    num_features = check_int(num_features, "num_features", low=1, high=n_k)
    check_bool(share_projection, "share_projection")
    if draw is None:
        draw = draw_projections(q, k, num_features=num_features, generator=generator,
                                share_projection=share_projection)
    else:
        entry = DrawEntry((*q.shape[:-2], num_features, n_k), "(*batch, k, n_k)")
        keys = ("projection_keys",) if share_projection else ("projection_keys", "projection_values")
        draw = check_draw("linformer", draw, dict.fromkeys(keys, entry), device=q.device)
    projection_keys = draw["projection_keys"].to(q.dtype)
    projection_values = projection_keys if share_projection else draw["projection_values"].to(q.dtype)
    context = softmax_matrix(q, projection_keys @ k)  # (*batch, n, k)
    output = context @ (projection_values @ v)
    info = {
        "projection_keys": projection_keys,
        "projection_values": projection_values,
        "share_projection": share_projection,
        "context": context,
    }
    return Approximation(
        "linformer", "softmax", output, lambda: ProductOperator(context, projection_values), info
    )


LINFORMER = linformer
__test__ = {"linformer": linformer.function}  # doctest skips a MethodSpec: run its function's examples
