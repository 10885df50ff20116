r"""Spectral norm of (approximate - exact) softmax attention at long sequence length.

Block Lanczos on the normal matrix :math:`M^\top M`, :math:`M = \tilde S - S`, where each step
makes **one** pass over the exact softmax matrix :math:`S` in row blocks and obtains both
:math:`Mx` and :math:`M^\top Mx` (:func:`fused_normal_pass`): the :math:`O(n^2p)` logits are
formed once per step for a whole block of vectors, in ``compute_dtype``, while the Krylov
basis and the Rayleigh--Ritz step stay in float64. This is the fast path of
``approxlab bench`` at n = 32,768; the general, operator-agnostic route is
:func:`approxlab.linalg.golub_kahan` (two passes per step, float64).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .._validation import as_generator, check_int, check_positive_float, check_qkv
from .lanczos import _warn_not_converged

__all__ = ["default_row_block", "fused_normal_pass", "BlockLanczosResult", "normal_block_lanczos"]


def default_row_block(n: int, batch: int = 1, *, max_elements: int = 1 << 22) -> int:
    """Query rows per block so that one ``(batch, rows, n)`` block holds at most ``max_elements``.

    The default (``2**22`` entries, 16 MiB in float32) keeps each block below glibc's
    largest ``mmap`` threshold (32 MiB), so the buffers are reused from the heap instead of
    being mapped and page-faulted afresh; rows are a power of two in ``[8, 1024]``.

    Examples
    --------
    >>> from approxlab.linalg.normal_lanczos import default_row_block
    >>> default_row_block(4096, 12)  # 12 * 64 * 4096 <= 2**22 entries
    64
    """
    rows = max(1, max_elements // max(1, n * batch))
    rows = 1 << (rows.bit_length() - 1)
    return int(min(1024, max(8, rows), n))


def fused_normal_pass(q, k, approx_op, x, *, row_block=None, compute_dtype=torch.float32):
    r"""One pass over the exact softmax matrix: ``(M^T M x, M x)`` for :math:`M = \tilde S - S`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` queries and keys; :math:`S = \operatorname{softmax}(QK^\top/\sqrt p)`.
    approx_op : LinearOperator
        :math:`\tilde S`, ``(*batch, n, n)`` (e.g. ``approximate(...).operator()``).
    x : torch.Tensor
        ``(*batch, n, b)`` block of vectors (any float dtype; results are float64).
    row_block : int, optional
        Query rows per block (default :func:`default_row_block`).
    compute_dtype : torch.dtype
        dtype of the logits, the softmax and the per-block products (float32: twice the
        GEMM rate; the accumulation over blocks is float64).

    Returns
    -------
    normal : torch.Tensor
        ``(*batch, n, b)`` float64, :math:`M^\top M x`.
    residual : torch.Tensor
        ``(*batch, n, b)`` float64, :math:`M x`.

    Notes
    -----
    For each row block :math:`I`, :math:`S_I = \operatorname{softmax}(Q_I K^\top/\sqrt p)`
    (max-subtracted, so any logits are safe) is formed once (``rows x n``), then
    :math:`R_I = (\tilde S x)_I - S_I x` and :math:`Z \mathrel{+}= S_I^\top R_I`; finally
    :math:`M^\top M x = \tilde S^\top R - Z`. Cost :math:`O(n^2(p + 2b))` time and
    :math:`O(n \cdot \text{rows})` memory, against :math:`O(2 n^2 (p + b))` for a ``matmat``
    followed by a ``rmatmat`` of :class:`~approxlab.operators.ExactAttentionOperator`.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.kernels import softmax_matrix
    >>> from approxlab.linalg import fused_normal_pass
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> op = approxlab.approximate("nystromformer", q, k, v, num_features=8).operator()
    >>> x = torch.randn(2, 32, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    >>> normal, residual = fused_normal_pass(q, k, op, x, compute_dtype=torch.float64)
    >>> m = op.to_dense() - softmax_matrix(q, k)
    >>> bool(torch.allclose(residual, m @ x)), bool(torch.allclose(normal, m.mT @ m @ x))
    (True, True)
    """
    n = q.shape[-2]
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], x.shape[:-2]))
    rows = row_block or default_row_block(n, math.prod(batch) if batch else 1)
    scale = q.shape[-1] ** -0.5
    qs = (q * scale).to(compute_dtype)
    kt = k.to(compute_dtype).transpose(-1, -2)
    # x and Z are kept as (b, n): with b a few columns, x^T S_I^T and R_I^T S_I are GEMMs over the long
    # dimension (2-3x faster than S_I x and S_I^T R_I, measured at n = 32,768, b = 4, one thread)
    xt = x.to(compute_dtype).transpose(-1, -2).contiguous()
    approx_x = approx_op.matmat(x.to(approx_op.dtype)).to(torch.float64)
    residual = torch.empty(*batch, n, x.shape[-1], dtype=torch.float64, device=x.device)
    accumulated_t = torch.zeros(*batch, x.shape[-1], n, dtype=torch.float64, device=x.device)
    logits = torch.empty(*batch, rows, n, dtype=compute_dtype, device=x.device)
    probabilities = torch.empty_like(logits)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        block_logits = logits[..., : stop - start, :]
        block = probabilities[..., : stop - start, :]
        torch.matmul(qs[..., start:stop, :], kt, out=block_logits)
        torch.softmax(block_logits, dim=-1, out=block)
        exact_rows = (xt @ block.transpose(-1, -2)).transpose(-1, -2).to(torch.float64)
        r_block = approx_x[..., start:stop, :] - exact_rows
        residual[..., start:stop, :] = r_block
        accumulated_t += (r_block.transpose(-1, -2).to(compute_dtype) @ block).to(torch.float64)
    normal = approx_op.rmatmat(residual.to(approx_op.dtype)).to(torch.float64) - accumulated_t.transpose(-1, -2)
    return normal, residual


def _operator_normal_pass(exact_op, approx_op, x):
    r""":math:`M^\top M x` with :math:`M = \tilde S - S` from products of two operators (float64)."""
    def apply(op, y, adjoint=False):
        return (op.rmatmat if adjoint else op.matmat)(y.to(op.dtype)).to(torch.float64)

    residual = apply(approx_op, x) - apply(exact_op, x)
    return apply(approx_op, residual, True) - apply(exact_op, residual, True)


@dataclasses.dataclass
class BlockLanczosResult:
    r"""What :func:`normal_block_lanczos` returns; tensors have shape ``(*batch,)``, float64.

    Attributes
    ----------
    estimate : torch.Tensor
        :math:`\sqrt{\theta_1}`, :math:`\theta_1` the largest Ritz value of :math:`M^\top M`.
    lower_bound : torch.Tensor
        Certified lower bound on :math:`\|M\|_2` (= ``estimate``: a Ritz value of
        :math:`M^\top M` on an orthonormal basis never exceeds :math:`\|M\|_2^2`), up to the
        rounding of the products.
    residual : torch.Tensor
        :math:`\|M^\top M y - \theta_1 y\|` for the unit Ritz vector :math:`y`.
    distance_bound : torch.Tensor
        ``residual / estimate``: some singular value :math:`\sigma` of :math:`M` satisfies
        :math:`|\sigma - \text{estimate}| \le` ``distance_bound`` (Parlett, Theorem 4.5.1,
        applied to :math:`M^\top M`, and :math:`|\sigma^2-\theta| = |\sigma-\sqrt\theta|(\sigma+\sqrt\theta)`).
    probabilistic_upper_bound : torch.Tensor
        :math:`\sqrt{\theta_1/(1-\varepsilon)}` with :math:`\varepsilon` such that the
        Kuczyński--Woźniakowski bound :math:`1.648\sqrt n\, e^{-\sqrt\varepsilon(2k-1)}` equals
        ``failure_probability`` (``k`` = Krylov dimension of one start column): an upper bound
        on :math:`\|M\|_2` except with at most that probability over the random start.
    failure_probability : float
    num_passes : int
        Passes over the exact matrix (each computes all ``n^2`` logits once).
    num_matvecs : int
        Exact-operator vector products: ``2 * block`` per pass (one product and one adjoint
        product per vector of the block).
    converged : torch.Tensor
        Bool, ``(*batch,)``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.linalg import normal_block_lanczos
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("nystromformer", q, k, v, num_features=8)
    >>> result = normal_block_lanczos(q, k, approx.operator(), generator=torch.Generator().manual_seed(1))
    >>> bool((result.lower_bound <= result.probabilistic_upper_bound).all()), result.failure_probability
    (True, 0.001)
    """

    estimate: torch.Tensor
    lower_bound: torch.Tensor
    residual: torch.Tensor
    distance_bound: torch.Tensor
    probabilistic_upper_bound: torch.Tensor
    failure_probability: float
    num_passes: int
    num_matvecs: int
    converged: torch.Tensor


def _orthonormal_complement(y, basis, generator):
    """Orthonormal columns spanning the part of ``y: (*batch, n, b)`` outside ``basis`` (CGS twice + QR).

    A breakdown (an invariant subspace: a tiny diagonal entry of ``R``) is continued with
    Gaussian columns drawn on CPU from ``generator``.
    """
    for _ in range(2):
        if basis is not None:
            y = y - basis @ (basis.transpose(-1, -2) @ y)
    qmat, r = torch.linalg.qr(y)
    diagonal = torch.diagonal(r, dim1=-2, dim2=-1).abs()
    small = diagonal <= 1e-12 * diagonal.amax(-1, keepdim=True).clamp_min(1e-300)
    if bool(small.any()):  # breakdown (an invariant subspace): continue with random columns
        fresh = torch.randn(*y.shape, generator=generator, dtype=torch.float64).to(y.device)
        y = torch.where(small.unsqueeze(-2), fresh, qmat)
        for _ in range(2):
            if basis is not None:
                y = y - basis @ (basis.transpose(-1, -2) @ y)
        qmat, _ = torch.linalg.qr(y)
    return qmat


def _top_ritz_pair(basis, images):
    r"""Rayleigh--Ritz on :math:`T = \operatorname{sym}(Q^\top W)`: ``(estimate, residual, distance)``.

    ``basis`` :math:`Q` and ``images`` :math:`W = M^\top MQ` are ``(*batch, n, j)`` float64;
    returns :math:`\sqrt{\theta_1}`, :math:`\|Ws - \theta_1Qs\|` and their ratio (on CPU).
    """
    t = basis.transpose(-1, -2) @ images
    t = 0.5 * (t + t.transpose(-1, -2))
    values, vectors = torch.linalg.eigh(t.cpu())
    theta = values[..., -1].clamp_min(0.0)
    s = vectors[..., -1:].to(basis.device)
    ritz_residual = torch.linalg.vector_norm(images @ s - theta.to(basis.device)[..., None, None] * (basis @ s),
                                             dim=(-2, -1)).cpu()
    estimate = theta.sqrt()
    return estimate, ritz_residual, ritz_residual / estimate.clamp_min(torch.finfo(torch.float64).tiny)


def _probabilistic_upper_bound(estimate, dimension, n, failure_probability):
    """Kuczynski-Wozniakowski (1992), Theorem 4.2(a), for the Krylov space of one start column."""
    epsilon = (math.log(1.648 * math.sqrt(n) / failure_probability) / (2.0 * dimension - 1.0)) ** 2
    return torch.where(epsilon < 1, estimate / (1.0 - epsilon.clamp_max(0.999999)).sqrt(),
                       torch.full_like(epsilon, float("inf")))


def normal_block_lanczos(
    q,
    k,
    approx_op,
    *,
    block: int = 4,
    tol: float = 1e-6,
    max_iter: int = 300,
    generator=None,
    row_block=None,
    compute_dtype=torch.float32,
    failure_probability: float = 1e-3,
    exact_operator=None,
) -> BlockLanczosResult:
    r""":math:`\|\tilde S - S\|_2`, :math:`S = \operatorname{softmax}(QK^\top/\sqrt p)`, by block Lanczos on :math:`M^\top M`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` each.
    approx_op : LinearOperator
        :math:`\tilde S`, ``(*batch, n, n)``.
    block : int
        Vectors per block, ``>= 1``.
    tol : float
        Stop when ``distance_bound <= tol * estimate`` (certified), or when the estimate
        moved by at most ``tol * estimate`` in the last pass while
        ``distance_bound <= sqrt(tol) * estimate`` (the rule of :func:`approxlab.linalg.golub_kahan`).
    max_iter : int
        Most passes, ``>= 1``; capped where the Krylov space fills :math:`\mathbb R^n`.
    generator : torch.Generator, optional
        CPU generator of the Gaussian start block.
    row_block, compute_dtype
        See :func:`fused_normal_pass`.
    failure_probability : float
        For ``probabilistic_upper_bound``, in ``(0, 1)``.
    exact_operator : LinearOperator, optional
        :math:`S` as an operator (e.g. :class:`~approxlab.operators.ExactAttentionOperator`,
        whose products run through the fused attention kernel): each pass is then
        ``R = approx_op X - S X`` and ``approx_op^T R - S^T R`` (two kernel calls) instead of
        :func:`fused_normal_pass`; ``q``, ``k``, ``row_block`` and ``compute_dtype`` are unused.

    Returns
    -------
    BlockLanczosResult

    Warns
    -----
    ConvergenceWarning
        If some batch element has not converged in ``max_iter`` passes.

    Notes
    -----
    After ``j`` passes the basis :math:`Q_j = [X_0, \dots, X_{j-1}]` (orthonormal, float64,
    reorthogonalised twice against all previous blocks) spans the block Krylov space
    :math:`\mathcal K_j(M^\top M, X_0)`, and :math:`W_j = M^\top M Q_j` is known from the
    passes. Rayleigh--Ritz: the top eigenpair :math:`(\theta_1, s)` of
    :math:`T = \operatorname{sym}(Q_j^\top W_j)`, Ritz vector :math:`y = Q_j s`, residual
    :math:`\|W_j s - \theta_1 Q_j s\|`. The next block is the orthonormalised part of
    :math:`M^\top M X_{j-1}` outside :math:`Q_j` (random columns replace a breakdown).
    Mathematically the space of Golub--Kahan with ``block`` start vectors; it is used
    here because the normal product needs one pass over :math:`S` per block instead of two
    (:func:`fused_normal_pass`).

    References
    ----------
    Golub and Underwood (1977); Musco and Musco (2015); Kuczyński and Woźniakowski (1992),
    Theorem 4.2; Parlett (1998), Theorem 4.5.1.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.kernels import softmax_matrix
    >>> from approxlab.linalg import normal_block_lanczos
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> op = approxlab.approximate("nystromformer", q, k, v, num_features=8).operator()
    >>> result = normal_block_lanczos(q, k, op, generator=torch.Generator().manual_seed(1),
    ...                               compute_dtype=torch.float64)  # S never formed
    >>> dense = spectral_error(op.to_dense(), softmax_matrix(q, k))  # the dense SVD, for comparison
    >>> bool(result.converged.all()), bool(torch.allclose(result.estimate, dense, rtol=1e-6))
    (True, True)
    """
    check_qkv(q, k)
    block = check_int(block, "block", low=1)
    tol = check_positive_float(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", low=1)
    failure_probability = check_positive_float(failure_probability, "failure_probability")
    if failure_probability >= 1:
        raise ValueError(f"`failure_probability` must be in (0, 1); got {failure_probability}.")
    n = q.shape[-2]
    if tuple(approx_op.shape[-2:]) != (n, n):
        raise ValueError(f"`approx_op` must have shape (*batch, {n}, {n}); got {tuple(approx_op.shape)}.")
    generator = as_generator(generator)
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], approx_op.shape[:-2]))
    device = q.device
    block = min(block, n)

    start = torch.randn(*batch, n, block, generator=generator, dtype=torch.float64).to(device)
    current = _orthonormal_complement(start, None, generator)
    basis = None
    images = None
    steps = min(max_iter, max(1, n // block))
    done = torch.zeros(batch, dtype=torch.bool)
    theta_prev = None
    out = {}
    passes = 0
    for j in range(1, steps + 1):
        if exact_operator is None:
            image, _ = fused_normal_pass(q, k, approx_op, current, row_block=row_block, compute_dtype=compute_dtype)
        else:
            image = _operator_normal_pass(exact_operator, approx_op, current)
        passes += 1
        basis = current if basis is None else torch.cat([basis, current], dim=-1)
        images = image if images is None else torch.cat([images, image], dim=-1)
        estimate, ritz_residual, distance = _top_ritz_pair(basis, images)
        now = distance <= tol * estimate
        if theta_prev is not None:
            moved = (estimate - theta_prev).abs() <= tol * estimate
            now = now | (moved & (distance <= math.sqrt(tol) * estimate))
        full = basis.shape[-1] + block > n
        update = ~done
        for name, value in (("estimate", estimate), ("residual", ritz_residual), ("distance", distance)):
            out[name] = value if name not in out else torch.where(update, value, out[name])
        out.setdefault("dimension", torch.zeros(batch, dtype=torch.float64))
        out["dimension"] = torch.where(update, torch.full(batch, float(j)), out["dimension"])
        done = done | now | full
        theta_prev = estimate
        if bool(done.all()):
            break
        current = _orthonormal_complement(image, basis, generator)

    if not bool(done.all()):
        _warn_not_converged(
            out["distance"] / out["estimate"].clamp_min(1e-300), done, method="normal_block_lanczos",
            budget=f"max_iter={max_iter} passes", measure="relative distance bound", tol=tol,
            note="; `estimate` is still a certified lower bound.",
        )
    upper = _probabilistic_upper_bound(out["estimate"], out["dimension"], n, failure_probability)
    return BlockLanczosResult(
        estimate=out["estimate"],
        lower_bound=out["estimate"].clone(),
        residual=out["residual"],
        distance_bound=out["distance"],
        probabilistic_upper_bound=upper,
        failure_probability=failure_probability,
        num_passes=passes,
        num_matvecs=2 * block * passes,
        converged=done,
    )
