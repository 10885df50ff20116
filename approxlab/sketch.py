r"""Column sampling and the Nyström method :math:`KS(S^\top KS)^+S^\top K`.

One module, one concept: choosing columns (uniform or by ridge leverage scores) and the
Nyström approximation of a PSD matrix from them (uniform, ridge-leverage, or adaptively by
randomly pivoted Cholesky, :func:`rpcholesky_columns`). The pseudo-inverse of the sampled core
lives in :mod:`approxlab.linalg.cores`; the attention skeletons that ``skyformer``,
``skyformer-softmax`` and ``nystrom`` assemble live with those methods
(:mod:`approxlab.methods.skyformer`).

Conventions: ``(*batch)`` leading dimensions everywhere; column indices are
``LongTensor`` of shape ``(*batch, d)`` or ``(d,)`` (the same columns for every batch
element); random draws come from a CPU ``torch.Generator`` and are moved to the data's
device afterwards.

References
----------
Chen, Zeng, Ji, Yang (2021), "Skyformer: Remodel Self-Attention with Gaussian Kernel and
Nyström Method", NeurIPS: Definition 1 (uniform sub-sampling), Eq. (5), Appendix D.
Williams & Seeger (2001), "Using the Nyström method to speed up kernel machines".
Musco & Musco (2017), "Recursive sampling for the Nyström method", NeurIPS.
Chen, Epperly, Tropp & Webber (2024), "Randomly pivoted Cholesky: practical approximation of a
kernel matrix with few entry evaluations", Communications on Pure and Applied Mathematics.
"""

from __future__ import annotations

import math

import torch

from ._validation import as_generator, check_bool, check_int, check_rtol, check_shape, check_square, check_tensor
from .errors import NotPSDError
from .linalg.cores import pinv_factors

__all__ = [
    "check_columns",
    "gather_rows",
    "uniform_columns",
    "uniform_real_columns",
    "ridge_leverage_columns",
    "inverse_cdf",
    "rpcholesky_columns",
    "nystrom",
]


# -- columns -----------------------------------------------------------------------------


def check_columns(
    columns, num_columns: int, *, batch_shape=(), name: str = "columns", num_features: int | None = None
) -> torch.Tensor:
    """Validate column indices and return them as ``(*batch_shape, d)`` ``int64``.

    Parameters
    ----------
    columns : torch.Tensor
        Integer tensor ``(d,)`` (the same columns for every batch element) or
        ``(*batch_shape, d)``, entries in ``[0, num_columns)``. Repeated indices are allowed
        (sampling with replacement, Skyformer Definition 1).
    num_columns : int
        ``N``, the number of columns to choose from.
    batch_shape : tuple
        The batch dimensions the indices must broadcast to.
    num_features : int, optional
        When given, ``d`` must equal it (a method's budget passed beside explicit columns).

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import check_columns
    >>> check_columns(torch.tensor([0, 3]), 4, batch_shape=(2,)).shape
    torch.Size([2, 2])
    >>> check_columns(torch.tensor([0, 4]), 4)
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    if not isinstance(columns, torch.Tensor):
        raise TypeError(f"`{name}` must be an integer torch.Tensor; got {type(columns).__name__}.")
    if columns.dtype.is_floating_point or columns.dtype.is_complex or columns.dtype == torch.bool:
        raise TypeError(f"`{name}` must have an integer dtype (e.g. torch.long); got {columns.dtype}.")
    num_columns = check_int(num_columns, "num_columns", low=1)
    batch_shape = check_shape(batch_shape)
    if columns.ndim == 0 or columns.shape[-1] == 0:
        raise ValueError(f"`{name}` must have shape (d,) or (*batch, d) with d >= 1; got {tuple(columns.shape)}.")
    if columns.ndim > 1 and tuple(columns.shape[:-1]) != batch_shape:
        raise ValueError(
            f"`{name}` must have shape (d,) or (*batch, d) with batch {batch_shape}; "
            f"got {tuple(columns.shape)}."
        )
    low, high = int(columns.min()), int(columns.max())
    if low < 0 or high >= num_columns:
        raise ValueError(
            f"`{name}` must hold indices in [0, {num_columns}); got values in [{low}, {high}]."
        )
    if num_features is not None and columns.shape[-1] != num_features:
        raise ValueError(
            f"`{name}` must hold num_features={num_features} indices when given; got {columns.shape[-1]}."
        )
    return columns.to(torch.long).expand(*batch_shape, columns.shape[-1])


def gather_rows(x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Rows ``x[..., columns, :]`` per batch element: ``(*batch, N, p), (*batch, d) -> (*batch, d, p)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import gather_rows
    >>> x = torch.arange(12.0).reshape(1, 4, 3)
    >>> gather_rows(x, torch.tensor([[3, 0]]))
    tensor([[[ 9., 10., 11.],
             [ 0.,  1.,  2.]]])
    """
    columns = columns.to(x.device)
    index = columns.unsqueeze(-1).expand(*columns.shape, x.shape[-1])
    return torch.gather(x, -2, index)


def uniform_columns(
    num_columns: int,
    d: int,
    *,
    batch_shape=(),
    generator: torch.Generator | None = None,
    replace: bool = False,
    device=None,
) -> torch.Tensor:
    r"""``d`` column indices drawn uniformly from ``range(num_columns)``, per batch element.

    Parameters
    ----------
    num_columns : int
        ``N >= 1``.
    d : int
        Number of columns, ``1 <= d`` (``<= N`` without replacement).
    batch_shape : tuple
        Independent draws for each batch element.
    generator : torch.Generator, optional
        CPU generator; all draws come from it.
    replace : bool
        ``True``: i.i.d. uniform indices (the sub-sampling matrix of Skyformer Definition 1,
        whose columns are :math:`e_i/\sqrt d` with probability :math:`1/N`; the
        :math:`1/\sqrt d` weight does not change a Nyström approximation). ``False``: a
        uniformly random ``d``-subset (no wasted duplicate columns).
    device : torch.device, optional
        Where to put the result (drawn on CPU first).

    Returns
    -------
    torch.Tensor
        ``(*batch_shape, d)`` ``int64``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import uniform_columns
    >>> columns = uniform_columns(10, 4, batch_shape=(3,), generator=torch.Generator().manual_seed(0))
    >>> columns.shape, all(len(set(row.tolist())) == 4 for row in columns)  # distinct without replacement
    (torch.Size([3, 4]), True)
    """
    num_columns = check_int(num_columns, "num_columns", low=1)
    d = check_int(d, "d", low=1, high=None if replace else num_columns)
    check_bool(replace, "replace")
    g = as_generator(generator)
    batch_shape = check_shape(batch_shape)
    if replace:
        idx = torch.randint(0, num_columns, (*batch_shape, d), generator=g)
    else:
        idx = torch.rand(*batch_shape, num_columns, generator=g).argsort(-1)[..., :d]
    return idx if device is None else idx.to(device)


def uniform_real_columns(
    row_mask: torch.Tensor,
    d: int,
    *,
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    r"""``d`` indices drawn uniformly among the rows that ``row_mask`` keeps, per batch element.

    Parameters
    ----------
    row_mask : torch.Tensor
        ``(*batch, N)`` bool, True on the rows that may be drawn (real tokens), at least one per
        batch element.
    d : int
        Number of indices, ``d >= 1``.
    generator : torch.Generator, optional
        CPU generator; all draws come from it.
    device : torch.device, optional
        Where to put the result (drawn on CPU first).

    Returns
    -------
    torch.Tensor
        ``(*batch, d)`` ``int64``, only indices of kept rows.

    Notes
    -----
    The draw is that of :func:`uniform_columns` without replacement (one uniform number per
    row, rows taken in increasing order of it), with the numbers of masked rows set above every
    kept one: when a batch element keeps :math:`R \ge d` rows, its ``d`` indices are a
    uniformly random ``d``-subset of them, and an all-True mask gives exactly the indices of
    :func:`uniform_columns` from the same generator state. When :math:`R < d` every kept row is
    drawn and the order repeats (index ``j`` is the ``(j mod R)``-th), so no index ever lands on
    a masked row; a repeated column does not change a Nyström approximation with a
    pseudo-inverse core. (Skyformer's published code draws ``d`` indices with replacement among
    the first ``mask.sum()`` rows of each of ``Q`` and ``K``.)

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import uniform_columns, uniform_real_columns
    >>> real = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    >>> columns = uniform_real_columns(real, 2, generator=torch.Generator().manual_seed(0))
    >>> columns.shape, bool((columns[0] < 3).all())  # the first sequence has 3 real tokens
    (torch.Size([2, 2]), True)
    >>> all_real = uniform_real_columns(torch.ones(5, dtype=torch.bool), 2, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.equal(all_real, uniform_columns(5, 2, generator=torch.Generator().manual_seed(0))))
    True
    >>> uniform_real_columns(torch.tensor([True, False, False]), 3)  # fewer real rows than d: repeats
    tensor([0, 0, 0])
    """
    if not isinstance(row_mask, torch.Tensor) or row_mask.dtype != torch.bool or row_mask.ndim < 1:
        raise TypeError(f"`row_mask` must be a bool tensor (*batch, N); got {row_mask!r}.")
    d = check_int(d, "d", low=1)
    row_mask = row_mask.cpu()
    kept = row_mask.sum(-1, keepdim=True)
    if bool((kept == 0).any()):
        raise ValueError("`row_mask` must keep at least one row in every batch element; got an all-False row.")
    g = as_generator(generator)
    order = torch.rand(*row_mask.shape, generator=g).masked_fill_(~row_mask, 2.0).argsort(-1)
    idx = torch.gather(order, -1, torch.arange(d) % kept)  # j -> the (j mod R)-th kept row
    return idx if device is None else idx.to(device)


def ridge_leverage_columns(
    scores: torch.Tensor,
    d: int,
    *,
    generator: torch.Generator | None = None,
    replace: bool = True,
) -> torch.Tensor:
    r"""``d`` columns sampled with probability :math:`p_i = \ell_i / \sum_j \ell_j`.

    Parameters
    ----------
    scores : torch.Tensor
        ``(*batch, N)`` non-negative (approximate) ridge leverage scores, e.g. from
        :func:`approxlab.leverage.approximate_ridge_leverage_scores`; each batch element
        needs a positive entry (``d`` of them without replacement).
    d : int
        Number of columns, ``>= 1``.
    generator : torch.Generator, optional
        CPU generator.
    replace : bool
        ``True`` (default): i.i.d. draws, the scheme the leverage-score analyses assume
        (Musco & Musco 2017); reweight sampled column ``i`` by :math:`1/\sqrt{d p_i}` when an
        unbiased sketch is needed. ``False``: successive draws without replacement.

    Returns
    -------
    torch.Tensor
        ``(*batch, d)`` ``int64`` on ``scores.device``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import ridge_leverage_columns
    >>> scores = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)  # only columns 1 and 3 can be drawn
    >>> columns = ridge_leverage_columns(scores, 5, generator=torch.Generator().manual_seed(0))
    >>> sorted(set(columns.tolist()))
    [1, 3]
    """
    check_tensor(scores, "scores", min_ndim=1)
    d = check_int(d, "d", low=1)
    check_bool(replace, "replace")
    if bool((scores < 0).any()):
        raise ValueError(f"`scores` must be >= 0; got min {float(scores.min()):.3e}.")
    positive = (scores > 0).sum(-1)
    need = 1 if replace else d
    if bool((positive < need).any()):
        raise ValueError(
            f"`scores` must have at least {need} positive entries per batch element "
            f"(d={d}, replace={replace}); got {int(positive.min())}."
        )
    g = as_generator(generator)
    flat = scores.detach().to("cpu", torch.float64).reshape(-1, scores.shape[-1])
    idx = torch.multinomial(flat, d, replacement=replace, generator=g)
    return idx.reshape(*scores.shape[:-1], d).to(scores.device)



def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    r"""Indices drawn with probability :math:`w_i/\sum_j w_j` from given uniforms: ``(*batch, s)`` int64.

    Parameters
    ----------
    weights : torch.Tensor
        ``(*batch, N)`` non-negative, unnormalised probabilities (computed with in float64).
    uniforms : torch.Tensor
        ``(*batch, s)`` in ``[0, 1)``, one per index.

    Returns
    -------
    torch.Tensor
        Index :math:`i` for uniform :math:`u` is the first with :math:`\sum_{j\le i} w_j > u\sum_j w_j`
        (the inverse of the cumulative distribution), so an index of weight 0 is never drawn and the
        same uniforms give the same indices. A batch element whose weights are all 0 draws uniformly,
        :math:`\lfloor uN\rfloor`.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import inverse_cdf
    >>> weights = torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64)
    >>> inverse_cdf(weights, torch.tensor([0.0, 0.2, 0.25, 0.99], dtype=torch.float64)).tolist()
    [0, 0, 2, 2]
    """
    weights = weights.to(torch.float64)
    uniforms = uniforms.to(device=weights.device, dtype=torch.float64)
    cumulative = weights.cumsum(-1)
    total = cumulative[..., -1:]
    index = torch.searchsorted(cumulative.contiguous(), (uniforms * total).contiguous(), right=True)
    last = torch.searchsorted(cumulative.contiguous(), total.contiguous())  # the last index of positive weight
    index = torch.minimum(index, last)
    flat = (uniforms * weights.shape[-1]).floor().long().clamp_max(weights.shape[-1] - 1)
    return torch.where(total > 0, index, flat)


def rpcholesky_columns(diagonal: torch.Tensor, column, d: int, *, uniforms: torch.Tensor | None = None,
                       generator: torch.Generator | None = None, return_factor: bool = False):
    r"""``d`` pivot columns of a PSD kernel chosen by randomly pivoted Cholesky (RPCholesky).

    Implements Algorithm 1 of Chen, Epperly, Tropp and Webber (2024): each pivot is drawn with
    probability proportional to the diagonal of the current residual :math:`A - \hat A^{(i)}`, and the
    partial Cholesky factor is updated with the pivot's residual column, so the pivots are
    :math:`\hat A = F F^\top = A_{:,S}A_{SS}^+A_{S,:}`, the Nyström approximation of :func:`nystrom`
    with columns :math:`S`. It reads the diagonal (:math:`N` entries) and ``d`` columns (:math:`Nd`
    entries), never the whole matrix: :math:`O(Nd^2)` operations and :math:`O(Nd)` memory, plus ``d``
    calls of ``column``.

    Parameters
    ----------
    diagonal : torch.Tensor
        ``(*batch, N)``, the diagonal of the PSD kernel :math:`A` (entries :math:`< 0` are treated as 0;
        a 0 entry is never a pivot, so 0 on padded rows keeps them out).
    column : callable
        ``column(pivots)`` with ``pivots`` ``(*batch,)`` int64 returns :math:`A_{:,s}` for each batch
        element's pivot :math:`s`, ``(*batch, N)``.
    d : int
        The number of pivots, ``1 <= d <= N``.
    uniforms : torch.Tensor, optional
        ``(*batch, d)`` in ``[0, 1)``: the uniforms of the ``d`` inverse-CDF pivot choices
        (:func:`inverse_cdf`); drawn from ``generator`` (CPU, float64) when not given. The same uniforms
        give the same pivots, and the first ``d' < d`` of them give the first ``d'`` pivots (a draw for
        ``d`` serves every smaller ``d'``).
    generator : torch.Generator, optional
        CPU generator for the uniforms.
    return_factor : bool, default False
        Also return the factor :math:`F`.

    Returns
    -------
    columns : torch.Tensor
        ``(*batch, d)`` int64, the pivots in the order they were chosen. They are distinct while the
        residual is nonzero; once it vanishes (the kernel's rank is below ``d``) a further pivot is drawn
        uniformly and may repeat one, which changes no Nyström approximation.
    factor : torch.Tensor
        ``(*batch, N, d)`` float64, :math:`F` with :math:`FF^\top = \hat A` (only with ``return_factor``).

    Notes
    -----
    Algorithm 1 (RPCholesky), with :math:`d^{(0)} = \operatorname{diag}A` and :math:`F = 0`: for
    :math:`i = 1, \dots, k`, draw :math:`s_i \sim d^{(i-1)}/\sum_j d^{(i-1)}_j`, set
    :math:`g = A_{:,s_i} - F_{:,<i}F_{s_i,<i}^\top`, :math:`F_{:,i} = g/\sqrt{g_{s_i}}` and
    :math:`d^{(i)} = d^{(i-1)} - |F_{:,i}|^2` (here clamped at 0, with the pivot's own entry set to its
    exact value 0). Chen et al. prove that the expected trace-norm error
    :math:`\mathbb E\operatorname{tr}(A - \hat A)` is within a factor :math:`1 + \varepsilon` of the best
    rank-:math:`r` error once :math:`k \ge r/\varepsilon + r\log(1/(\varepsilon\eta))`, with :math:`\eta`
    the relative error of the best rank-:math:`r` approximation -- near-optimal, as for ridge-leverage
    sampling, without computing any leverage score. Computed in float64.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import nystrom, rpcholesky_columns
    >>> g = torch.Generator().manual_seed(0)
    >>> b = torch.randn(8, 3, generator=g, dtype=torch.float64)
    >>> K = b @ b.T                                           # rank 3: three pivots recover it
    >>> columns, factor = rpcholesky_columns(K.diagonal(), lambda s: K[:, s], 3, generator=g, return_factor=True)
    >>> len(set(columns.tolist())), bool(torch.allclose(factor @ factor.T, K))
    (3, True)
    >>> bool(torch.allclose(nystrom(K, columns), K))
    True
    """
    check_tensor(diagonal, "diagonal", min_ndim=1)
    n = diagonal.shape[-1]
    d = check_int(d, "d", low=1, high=n)
    check_bool(return_factor, "return_factor")
    if not callable(column):
        raise TypeError(f"`column` must be a function of the pivots (*batch,) returning (*batch, N); got "
                        f"{type(column).__name__}.")
    batch = tuple(diagonal.shape[:-1])
    if uniforms is None:
        uniforms = torch.rand(*batch, d, generator=as_generator(generator), dtype=torch.float64)
    check_tensor(uniforms, "uniforms", min_ndim=1)
    if tuple(uniforms.shape) != (*batch, d):
        raise ValueError(f"`uniforms` must have shape (*batch, d) = {(*batch, d)}; got {tuple(uniforms.shape)}.")
    if bool((uniforms < 0).any() | (uniforms >= 1).any()):
        raise ValueError(f"`uniforms` must lie in [0, 1); got values in [{float(uniforms.min())}, "
                         f"{float(uniforms.max())}].")
    device = diagonal.device
    residual = diagonal.detach().to(torch.float64).clamp_min(0.0)
    factor = residual.new_zeros(*batch, d, n)  # F^T: row i is column i of F
    columns = torch.empty(*batch, d, dtype=torch.long, device=device)
    for i in range(d):
        pivot = inverse_cdf(residual, uniforms[..., i : i + 1])  # (*batch, 1)
        columns[..., i] = pivot[..., 0]
        g = column(pivot[..., 0]).detach().to(device=device, dtype=torch.float64)
        if i:
            at_pivot = torch.gather(factor[..., :i, :], -1, pivot.unsqueeze(-2).expand(*batch, i, 1))  # (*b, i, 1)
            g = g - (at_pivot.transpose(-1, -2) @ factor[..., :i, :]).squeeze(-2)
        g_pivot = torch.gather(g, -1, pivot)
        scale = torch.where(g_pivot > 0, g_pivot.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), 0.0)
        factor[..., i, :] = g * scale
        residual = (residual - factor[..., i, :].square()).clamp_min_(0.0).scatter_(-1, pivot, 0.0)
    if return_factor:
        return columns, factor.transpose(-1, -2)
    return columns


def nystrom(K: torch.Tensor, columns: torch.Tensor, *, rcond: float | None = None) -> torch.Tensor:
    r"""The Nyström approximation :math:`KS(S^\top KS)^+S^\top K` of a symmetric PSD ``K``.

    Parameters
    ----------
    K : torch.Tensor
        ``(*batch, N, N)`` symmetric positive semidefinite.
    columns : torch.Tensor
        ``(d,)`` or ``(*batch, d)`` integer indices in ``[0, N)``; repeats allowed (they
        change nothing: :math:`S` and :math:`SW` span the same columns).
    rcond : float, optional
        Rank threshold of the core pseudo-inverse (:func:`approxlab.linalg.stable_pinv`).

    Returns
    -------
    torch.Tensor
        ``(*batch, N, N)``, formed densely (a reference for tests and small studies).

    Raises
    ------
    NotPSDError
        If ``K`` is not symmetric (relative ``sqrt(eps)``) or the core is not PSD.

    Notes
    -----
    Eq. (5) of Skyformer with :math:`S` the 0/1 selection matrix of ``columns``. For
    :math:`K = BB^\top`, :math:`\tilde K = BP B^\top` with :math:`P` the orthogonal projector
    onto the column space of :math:`B^\top S`, hence :math:`0 \preceq \tilde K \preceq K`
    (Skyformer Appendix D) and the result is unchanged by any positive rescaling of the
    sampled columns (Definition 1's :math:`1/\sqrt d` weights included).

    References
    ----------
    Williams & Seeger (2001); Skyformer (Chen et al., 2021), Eq. (5) and Appendix D.

    Examples
    --------
    >>> import torch
    >>> from approxlab.sketch import nystrom
    >>> g = torch.Generator().manual_seed(0)
    >>> b = torch.randn(6, 2, generator=g, dtype=torch.float64)
    >>> K = b @ b.T  # rank 2: two independent columns recover it
    >>> bool(torch.allclose(nystrom(K, torch.tensor([0, 1])), K))
    True
    """
    check_square(K, "K")
    columns = check_columns(columns, K.shape[-1], batch_shape=K.shape[:-2])
    if rcond is not None:
        rcond = check_rtol(rcond, "rcond", allow_zero=False)
    scale = K.abs().amax((-1, -2)).clamp_min(torch.finfo(K.dtype).tiny)
    asym = ((K - K.transpose(-1, -2)).abs().amax((-1, -2)) / scale).max()
    if float(asym) > math.sqrt(torch.finfo(K.dtype).eps):
        raise NotPSDError(
            f"`K` must be symmetric positive semidefinite; got max |K - K^T| / max |K| = {float(asym):.3e} "
            f"> sqrt(eps)={math.sqrt(torch.finfo(K.dtype).eps):.1e}."
        )
    rows = gather_rows(K, columns)  # S^T K: (*batch, d, N)
    core = gather_rows(rows.transpose(-1, -2), columns)  # S^T K S: (*batch, d, d)
    factors = pinv_factors(core, hermitian=True, rcond=rcond)[0]
    half = factors.second @ rows  # Lambda^{+1/2} V^T S^T K: project, then scale
    return half.transpose(-1, -2) @ half


