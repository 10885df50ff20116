r"""Test and study matrices with a prescribed spectrum, and synthetic Q/K/V.

Shared by the theorem tests and the studies (matfree's habit: build the matrix whose
answer you know). All randomness comes from a CPU ``torch.Generator``.
"""

from __future__ import annotations

import torch

from ._validation import as_generator, check_dtype, check_int, check_positive_float, check_shape, check_tensor

__all__ = [
    "random_orthogonal",
    "psd_matrix",
    "synthetic_qkv",
    "large_logit_qkv",
    "matrix_with_singular_values",
]


def random_orthogonal(n: int, *, batch_shape=(), generator=None, dtype=torch.float64) -> torch.Tensor:
    """Haar-distributed orthogonal matrices ``(*batch_shape, n, n)`` (QR with sign fix).

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import random_orthogonal
    >>> u = random_orthogonal(4, batch_shape=(2,), generator=torch.Generator().manual_seed(0))
    >>> u.shape
    torch.Size([2, 4, 4])
    >>> torch.allclose(u @ u.mT, torch.eye(4, dtype=torch.float64).expand(2, 4, 4))
    True
    """
    n = check_int(n, "n", low=1)
    batch_shape, dtype = check_shape(batch_shape), check_dtype(dtype)
    g = as_generator(generator)
    x = torch.randn(*batch_shape, n, n, generator=g, dtype=torch.float64)
    qmat, r = torch.linalg.qr(x)
    qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return qmat.to(dtype)


def psd_matrix(eigenvalues: torch.Tensor, *, generator=None) -> torch.Tensor:
    r"""Symmetric PSD :math:`U\operatorname{diag}(\lambda)U^\top` with Haar :math:`U`.

    Parameters
    ----------
    eigenvalues : torch.Tensor
        ``(*batch, n)``, non-negative.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import psd_matrix
    >>> eigenvalues = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    >>> k = psd_matrix(eigenvalues, generator=torch.Generator().manual_seed(0))
    >>> torch.linalg.eigvalsh(k).flip(-1).round(decimals=6).tolist()
    [3.0, 2.0, 1.0, 0.0]
    """
    check_tensor(eigenvalues, "eigenvalues", min_ndim=1)
    if bool((eigenvalues < 0).any()):
        raise ValueError(
            f"`eigenvalues` must be >= 0 for a PSD matrix; got min {float(eigenvalues.min()):.3e}."
        )
    n = eigenvalues.shape[-1]
    u = random_orthogonal(n, batch_shape=eigenvalues.shape[:-1], generator=generator, dtype=eigenvalues.dtype)
    k = (u * eigenvalues.unsqueeze(-2)) @ u.transpose(-1, -2)
    return 0.5 * (k + k.transpose(-1, -2))


def matrix_with_singular_values(singular_values: torch.Tensor, m: int | None = None, *, generator=None):
    r""":math:`U\operatorname{diag}(\sigma)V^\top`, ``(*batch, n, m)`` with ``n = len(sigma)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import matrix_with_singular_values
    >>> sigma = torch.tensor([1.0, 0.1, 0.01], dtype=torch.float64)
    >>> a = matrix_with_singular_values(sigma, 5, generator=torch.Generator().manual_seed(0))
    >>> a.shape
    torch.Size([3, 5])
    >>> torch.linalg.svdvals(a).round(decimals=6).tolist()
    [1.0, 0.1, 0.01]
    """
    n = check_tensor(singular_values, "singular_values", min_ndim=1).shape[-1]
    m = n if m is None else check_int(m, "m", low=n)
    g = as_generator(generator)
    batch = singular_values.shape[:-1]
    u = random_orthogonal(n, batch_shape=batch, generator=g, dtype=singular_values.dtype)
    v = random_orthogonal(m, batch_shape=batch, generator=g, dtype=singular_values.dtype)[..., :n]
    return (u * singular_values.unsqueeze(-2)) @ v.transpose(-1, -2)


def synthetic_qkv(
    batch_shape=(2, 3),
    n: int = 64,
    p: int = 16,
    *,
    scale: float = 1.0,
    generator=None,
    dtype=torch.float64,
):
    r"""Gaussian ``q, k, v`` of shape ``(*batch_shape, n, p)``.

    Entries are :math:`\mathcal N(0, \text{scale}^2)`, so logits :math:`q^\top k/\sqrt p` have
    standard deviation about ``scale**2``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2, 3), n=8, p=4, generator=torch.Generator().manual_seed(0))
    >>> q.shape, q.dtype
    (torch.Size([2, 3, 8, 4]), torch.float64)
    """
    n, p = check_int(n, "n", low=1), check_int(p, "p", low=1)
    scale, dtype = check_positive_float(scale, "scale", allow_zero=True), check_dtype(dtype)
    g = as_generator(generator)
    shape = (*check_shape(batch_shape), n, p)
    q, k, v = (scale * torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def large_logit_qkv(batch_shape=(2, 3), n: int = 24, p: int = 16, *, max_logit: float = 80.0, generator=None):
    r"""float32 ``q, k, v`` whose logits :math:`|q^\top k|/\sqrt p` reach exactly ``max_logit``.

    The overflow check: every method must return finite outputs for
    float32 logits up to :math:`\pm 80` (``exp(80)`` is within float32, sums of it are not).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import scaled_logits
    >>> from approxlab.synthetic import large_logit_qkv
    >>> q, k, v = large_logit_qkv((1,), n=8, p=4, max_logit=80.0, generator=torch.Generator().manual_seed(0))
    >>> q.dtype
    torch.float32
    >>> round(float(scaled_logits(q.double(), k.double()).abs().max()), 3)
    80.0
    """
    from .kernels import scaled_logits

    max_logit = check_positive_float(max_logit, "max_logit")
    q, k, v = synthetic_qkv(batch_shape, n, p, generator=generator)
    scale = (max_logit / float(scaled_logits(q, k).abs().max())) ** 0.5
    return (q * scale).float(), (k * scale).float(), v.float()
