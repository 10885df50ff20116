r"""Scale-safe arithmetic: power-of-two balancing, norms and unit rows without floors.

Floating-point quantities that are invariant to a scaling of their input (condition numbers,
stable ranks, relative errors, cosines) must not depend on where the input sits in the
exponent range. Two things break that: *floors* (``clamp_min(tiny)``, ``eps=1e-12``), which
replace a small but valid value by another number, and *intermediate overflow or
underflow* (a square of ``1e200``, a sum of ``1e308 + 1e308``, a subnormal ``1e-310`` that
has lost digits). The helpers here avoid both:

* :func:`balance` multiplies a matrix (or vector) by a power of two :math:`2^{-e}` chosen so
  that its largest magnitude lies in :math:`[1/2, 1)` -- exact in binary floating point
  (no digit changes) -- whenever that magnitude is outside the safe range
  :math:`[2^{-256}, 2^{256}]` (:math:`[2^{-32}, 2^{32}]` in float32, :data:`SAFE_EXPONENT`);
  inputs inside it are returned unchanged, bit for bit, so results on ordinary data do not move. :func:`times_power_of_two` undoes it.
* :func:`safe_norm` is the Euclidean norm of LAPACK's ``dnrm2``: equal to
  ``torch.linalg.vector_norm`` inside the safe range, computed from the balanced vector
  outside it, so it neither overflows to ``inf`` nor underflows to 0 when the norm itself
  is representable.
* :func:`unit_rows` scales rows to unit norm with zero rows left zero -- no ``eps`` floor, so
  ``unit_rows(c * x) == unit_rows(x)`` for every positive ``c`` whose product stays finite
  and nonzero.

References
----------
J. Demmel, "Underflow and the reliability of numerical software", SIAM J. Sci. Stat.
Comput. 5 (1984); LAPACK Working Note 148 (scaled norms, ``dlascl``); N. J. Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed. (2002), Section 27.8.
"""

from __future__ import annotations

import math

import torch

__all__ = ["SAFE_EXPONENT", "balance", "balancing_exponent", "times_power_of_two", "safe_norm", "unit_rows",
           "log10_magnitude"]

SAFE_EXPONENT = {torch.float64: 256, torch.float32: 32}
r"""Inputs whose largest magnitude lies in :math:`[2^{-s}, 2^{s}]` (a quarter of the dtype's
exponent range: :math:`s = 256` in float64, 32 in float32) are used as given: their squares,
sums of squares over any realistic dimension and products of two of them are normal numbers
of the dtype."""


def _safe_exponent(dtype: torch.dtype) -> int:
    return SAFE_EXPONENT.get(dtype, math.frexp(torch.finfo(dtype).max)[1] // 4)


def balancing_exponent(x: torch.Tensor, dim=(-2, -1), *, even: bool = False) -> torch.Tensor:
    r"""The exponent :math:`e` with :math:`\max|x 2^{-e}| \in [1/2, 1)`, reduced over ``dim``.

    0 where the largest magnitude is inside the safe range (:data:`SAFE_EXPONENT`), is 0, or is not
    finite (so ordinary, zero and already-refused inputs are untouched). ``even``: round
    :math:`e` up to an even number, so that :math:`2^{-e/2}` -- the scaling of a square root,
    e.g. of an eigenvalue -- is exact too. Returns a float64 tensor of integers with ``x``'s
    shape reduced over ``dim`` (kept as size-1 dimensions).

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.scaling import balancing_exponent
    >>> balancing_exponent(torch.tensor([[3.0, 1e100]], dtype=torch.float64))  # 1e100 is about 2**332.2
    tensor([[333.]], dtype=torch.float64)
    >>> balancing_exponent(torch.tensor([[3.0, 4.0]], dtype=torch.float64))  # inside the safe range
    tensor([[0.]], dtype=torch.float64)
    """
    safe = _safe_exponent(x.dtype)
    peak = x.detach().abs().amax(dim=dim, keepdim=True).to(torch.float64)
    _, exponent = torch.frexp(peak)
    exponent = exponent.to(torch.float64)
    outside = (peak > 0) & torch.isfinite(peak) & ((peak < 2.0**-safe) | (peak > 2.0**safe))
    exponent = torch.where(outside, exponent, torch.zeros_like(exponent))
    if even:
        exponent = exponent + exponent.remainder(2)
    return exponent


def times_power_of_two(x: torch.Tensor, exponent) -> torch.Tensor:
    r""":math:`x \cdot 2^{e}` without forming :math:`2^{e}` when it overflows (``|e|`` up to 3000).

    ``exponent``: a float64 tensor of integers broadcasting against ``x`` (or a Python int).
    Computed in float64 by three factors :math:`2^{e/3}` of the same sign (none overflows,
    and an intermediate underflows only if the result does), then cast back to ``x.dtype``:
    exact unless the result overflows (``inf``) or lands in the subnormal range. ``x`` itself
    is returned when every exponent is 0.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.scaling import times_power_of_two
    >>> times_power_of_two(torch.tensor([1e-300], dtype=torch.float64), 1100)  # 2**1100 itself overflows
    tensor([1.3583e+31], dtype=torch.float64)
    """
    exponent = torch.as_tensor(exponent, dtype=torch.float64, device=x.device)
    if not bool((exponent != 0).any()):
        return x
    work = x.to(torch.float64)
    first = torch.trunc(exponent / 3)
    second = torch.trunc((exponent - first) / 2)
    for part in (first, second, exponent - first - second):
        work = work * torch.exp2(part)
    return work.to(x.dtype)


def balance(x: torch.Tensor, dim=(-2, -1), *, even: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(x * 2**-e, e)`` with :func:`balancing_exponent` ``e`` (size-1 dimensions over ``dim``).

    Exact (a power of two); ``x`` itself is returned where every ``e`` is 0.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.scaling import balance
    >>> x = torch.tensor([[1e-300, 2e-300]], dtype=torch.float64)
    >>> balanced, e = balance(x)
    >>> balanced.abs().max().item() < 1 <= 2 * balanced.abs().max().item(), bool(torch.equal(balanced * 2 ** e, x))
    (True, True)
    """
    exponent = balancing_exponent(x, dim, even=even)
    return times_power_of_two(x, -exponent), exponent


def safe_norm(x: torch.Tensor, dim=-1, keepdim: bool = False) -> torch.Tensor:
    r"""Euclidean norm over ``dim`` that neither overflows nor underflows when the norm is representable.

    Equal to ``torch.linalg.vector_norm(x, dim=dim)`` (bit for bit) where the largest
    magnitude is inside the safe range (:data:`SAFE_EXPONENT`); elsewhere
    :math:`2^{e}\,\|x 2^{-e}\|_2` (the scaled sum of squares of LAPACK's ``dnrm2``). A norm
    beyond the dtype's range is ``inf``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.scaling import safe_norm
    >>> safe_norm(torch.tensor([3e200, 4e200], dtype=torch.float64))  # its squares overflow
    tensor(5.0000e+200, dtype=torch.float64)
    """
    scaled, exponent = balance(x, dim)
    norm = torch.linalg.vector_norm(scaled, dim=dim, keepdim=True)
    norm = times_power_of_two(norm, exponent)
    if keepdim:
        return norm
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return norm.squeeze(dims) if dims else norm


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    r"""Rows of ``x: (..., p)`` divided by their Euclidean norm; zero rows stay zero.

    No floor: unlike ``torch.nn.functional.normalize`` (``x / max(||x||, 1e-12)``), a row of
    norm ``1e-14`` is normalised too, so the result is invariant to any positive scaling of a
    row. Rows whose largest entry is in the safe range (:data:`SAFE_EXPONENT`) give exactly
    ``F.normalize``'s value.

    Examples
    --------
    >>> import torch
    >>> from approxlab.linalg.scaling import unit_rows
    >>> unit_rows(torch.tensor([[3e-20, 4e-20], [0.0, 0.0]], dtype=torch.float64))
    tensor([[0.6000, 0.8000],
            [0.0000, 0.0000]], dtype=torch.float64)
    """
    scaled, _ = balance(x, dim=-1)
    norm = torch.linalg.vector_norm(scaled, dim=-1, keepdim=True)
    return scaled / torch.where(norm > 0, norm, torch.ones_like(norm))


def log10_magnitude(mantissa: float, exponent: float) -> float:
    r""":math:`\log_{10}(m\,2^{e})` for messages about values beyond the float range.

    Examples
    --------
    >>> from approxlab.linalg.scaling import log10_magnitude
    >>> round(log10_magnitude(0.5, 2000), 2)  # 0.5 * 2**2000, beyond float64
    601.76
    """
    return math.log10(abs(mantissa)) + exponent * math.log10(2.0) if mantissa else -math.inf
