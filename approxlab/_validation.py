"""Shared input checks and their messages.

Each public function opens with one validation block built from these helpers.
Messages name the parameter, what is allowed and what was received, e.g.
``"`num_features` must be an integer with 1 <= num_features <= 512; got 0."``
"""

from __future__ import annotations

import numbers

import torch

__all__ = [
    "as_generator",
    "check_tensor",
    "check_qkv",
    "check_square",
    "check_int",
    "check_positive_float",
    "check_choice",
    "check_bool",
]


def as_generator(generator=None, *, seed=None, device="cpu") -> torch.Generator:
    """Return a ``torch.Generator``; the library never touches global RNG state.

    Parameters
    ----------
    generator : torch.Generator or None
        Used as is when given.
    seed : int or None
        Seed for a fresh generator when ``generator`` is None. With neither, a fresh
        generator is seeded from OS entropy (non-reproducible, but still not global).
    device : str or torch.device
        Device of a freshly made generator.
    """
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"`generator` must be a torch.Generator or None; got {type(generator).__name__}."
            )
        return generator
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def check_tensor(x, name: str, *, min_ndim: int = 2, finite: bool = True) -> torch.Tensor:
    """Check that ``x`` is a floating tensor with at least ``min_ndim`` dims and finite entries."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor; got {type(x).__name__}.")
    if not x.is_floating_point():
        raise TypeError(f"`{name}` must have a floating dtype (float32 or float64); got {x.dtype}.")
    if x.ndim < min_ndim:
        raise ValueError(
            f"`{name}` must have at least {min_ndim} dimensions (*batch, n, p); got shape {tuple(x.shape)}."
        )
    if finite and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"`{name}` must be finite; got {bad} non-finite entries (NaN or inf).")
    return x


def check_qkv(q, k, v=None):
    """Validate ``q: (*batch, n, p)``, ``k: (*batch, n_k, p)``, ``v: (*batch, n_k, p_v)``."""
    check_tensor(q, "q")
    check_tensor(k, "k")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"`q` and `k` must share the feature dimension p; got q.shape={tuple(q.shape)} and "
            f"k.shape={tuple(k.shape)}."
        )
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"`q` and `k` must share batch dimensions; got {tuple(q.shape[:-2])} and {tuple(k.shape[:-2])}."
        )
    if q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"`q` and `k` must share dtype and device; got {q.dtype}/{q.device} and {k.dtype}/{k.device}."
        )
    if v is not None:
        check_tensor(v, "v")
        if v.shape[:-1] != k.shape[:-1]:
            raise ValueError(
                f"`v` must have shape (*batch, n_k, p_v) matching k.shape[:-1]={tuple(k.shape[:-1])}; "
                f"got v.shape={tuple(v.shape)}."
            )
        if v.dtype != q.dtype or v.device != q.device:
            raise ValueError(f"`v` must share dtype and device with `q`; got {v.dtype}/{v.device}.")
    return q, k, v


def check_square(x, name: str, *, finite: bool = True) -> torch.Tensor:
    """Check that ``x`` is a batch of square matrices ``(*batch, n, n)``."""
    check_tensor(x, name, finite=finite)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"`{name}` must be square (*batch, n, n); got shape {tuple(x.shape)}.")
    return x


def check_int(value, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Check ``low <= value <= high`` for an integer (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer; got {value!r} ({type(value).__name__}).")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(f"`{name}` must be an integer with {lo} <= {name} <= {hi}; got {value}.")
    return value


def check_positive_float(value, name: str, *, allow_zero: bool = False) -> float:
    """Check that ``value`` is a finite real number > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number; got {value!r} ({type(value).__name__}).")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not ok or value != value or value == float("inf"):
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be a finite number {rel}; got {value}.")
    return value


def check_choice(value, name: str, choices) -> str:
    """Check that ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}; got {value!r}.")
    return value


def check_bool(value, name: str) -> bool:
    """Check that ``value`` is a real ``bool`` (``0``/``1`` are rejected, unlike ``check_choice``)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"`{name}` must be a bool (True or False); got {value!r} ({type(value).__name__})."
        )
    return value
