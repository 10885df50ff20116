"""What every approximation returns, and how a method declares itself."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..operators import LinearOperator

__all__ = ["Approximation", "MethodSpec", "method"]

TARGETS = ("softmax", "kernelized", "yoso")


@dataclasses.dataclass
class Approximation:
    """The result of :func:`approxlab.approximate`.

    Attributes
    ----------
    method : str
        Registry name of the method.
    target : str
        Which exact attention it approximates: ``"softmax"`` (``D^{-1}A V``),
        ``"kernelized"`` (``C V``, Skyformer Eq. (3)) or ``"yoso"`` (YOSO-E's expectation).
    output : torch.Tensor
        ``(*batch, n, p_v)``, the approximate attention output.
    info : dict
        Method diagnostics (sampled columns, core condition number, residual history, ...).
    """

    method: str
    target: str
    output: torch.Tensor
    _operator: LinearOperator | Callable[[], LinearOperator]
    info: dict = dataclasses.field(default_factory=dict)

    def operator(self) -> LinearOperator:
        """The approximate ``n x n`` attention matrix as an operator (``matmat``/``rmatmat``)."""
        if not isinstance(self._operator, LinearOperator):
            self._operator = self._operator()
        return self._operator

    def matrix(self) -> torch.Tensor:
        """The approximate attention matrix, formed densely: ``(*batch, n, n)``."""
        return self.operator().to_dense()


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """How a method is called and what its ``num_features`` means.

    Attributes
    ----------
    name : str
        Registry name.
    function : callable
        ``function(q, k, v, *, num_features, generator, **options) -> Approximation``.
    target : str
        One of ``"softmax"``, ``"kernelized"``, ``"yoso"``.
    features : str
        What ``num_features`` counts (one row of the table in :mod:`approxlab.methods`).
    max_features : callable
        ``max_features(n) -> int``: the largest allowed ``num_features`` for ``n`` tokens.
    randomized : bool
        Whether the method draws from ``generator``.
    """

    name: str
    function: Callable[..., Approximation]
    target: str
    features: str
    max_features: Callable[[int], int]
    randomized: bool

    def __call__(self, *args: Any, **kwargs: Any) -> Approximation:
        return self.function(*args, **kwargs)


def method(
    name: str,
    *,
    target: str,
    features: str,
    max_features: Callable[[int], int] = lambda n: n,
    randomized: bool = True,
):
    """Decorator that turns a method function into a :class:`MethodSpec`."""
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {TARGETS}; got {target!r}.")

    def wrap(function):
        return MethodSpec(name, function, target, features, max_features, randomized)

    return wrap
