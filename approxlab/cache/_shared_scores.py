r"""A policy's scores computed once for equal inputs, where asked: :func:`shared_scores`.

On one exact prefill every compression ratio of a policy scores the same context: its queries, keys and values
are the prefill's, and the budget :math:`b` enters only afterwards (the top :math:`b` of the scores,
:func:`~approxlab.cache._scores.top_budget`), unless the score function itself takes ``budget``. Inside
:func:`shared_scores`, a function wrapped by :func:`shared` returns an earlier call's result when everything
it reads is equal (:func:`~approxlab.cache._scores.scores_of` wraps the score functions that do not take the
budget; those that take it for their sinks wrap their budget-free core): the method and its score function, ``q``,
``k`` and ``v`` (``torch.equal``), every option (tensors by ``torch.equal``, e.g. the key mask or the RoPE
frequencies), the budget when the function takes it, and the generator's state (a randomized policy draws the
same stream again; the generator is left in the state the first call left it in). The sharing is exact: the same
scores, bit for bit, as computing them again.

Memory: each distinct input tensor is kept until the block ends (one ``q``, ``k``, ``v`` per layer of a prefill, and
each distinct scores tensor).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

__all__ = ["shared_scores", "shared"]

_SHARED = contextvars.ContextVar("approxlab_shared_scores", default=None)


class _Memo:
    """The distinct tensors seen (grouped by a cheap fingerprint, then told apart by ``torch.equal``) and the
    scores of each call's key."""

    def __init__(self):
        self.tensors: dict = {}  # fingerprint -> [(index, tensor)]
        self.count = 0
        self.found: dict = {}  # call key -> (scores, generator state after the call or None)

    def index(self, tensor: torch.Tensor) -> int:
        """A number for ``tensor``, the same for every equal tensor (same shape, dtype, device and values)."""
        last = tensor[..., -1, :] if tensor.dim() > 1 and tensor.shape[-2] else tensor.reshape(-1)[-1:]
        as_bytes = last.detach().to("cpu", torch.complex128 if last.is_complex() else torch.float64)
        fingerprint = (tuple(tensor.shape), tensor.dtype, str(tensor.device), as_bytes.numpy().tobytes())
        seen = self.tensors.setdefault(fingerprint, [])
        for number, held in seen:
            if torch.equal(held, tensor):
                return number
        self.count += 1
        seen.append((self.count, tensor.detach()))
        return self.count

    def key_of(self, value):
        """A hashable key equal for equal option values; None when a value cannot be compared (no sharing)."""
        if isinstance(value, torch.Tensor):
            return ("tensor", self.index(value))
        if isinstance(value, torch.Generator):
            return ("generator", value.device.type, value.get_state().numpy().tobytes())
        if isinstance(value, dict):
            items = [(name, self.key_of(item)) for name, item in sorted(value.items(), key=lambda pair: str(pair[0]))]
            return None if any(key is None for _, key in items) else ("dict", tuple(items))
        if isinstance(value, (list, tuple)):
            items = [self.key_of(item) for item in value]
            return None if any(key is None for key in items) else (type(value).__name__, tuple(items))
        if value is None or isinstance(value, (bool, int, float, str, complex)):
            return ("value", type(value).__name__, value)
        if callable(value):  # a function (a score function passed on): the same object
            return ("callable", id(value))
        return None


@contextlib.contextmanager
def shared_scores():
    """Within the block, a policy's scores of equal inputs are computed once (see the module's docstring)."""
    token = _SHARED.set(_Memo())
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared(function):
    """``function`` computed once per equal arguments inside :func:`shared_scores` (outside it, called as is): its
    result (a tensor) is kept under the key of its arguments (:meth:`_Memo.key_of`; arguments that cannot be
    compared are never shared) and a copy returned for an equal call; a generator among the arguments is left in
    the state the first call left it in. For a score function and for the budget-free core of one that takes the
    budget (e.g. :func:`approxlab.methods.cap.cap_scores`, whose budget only fits its sinks)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        memo = _SHARED.get()
        if memo is None:
            return function(*args, **kwargs)
        key = memo.key_of((args, kwargs))
        if key is None:
            return function(*args, **kwargs)
        key = (id(function), key)
        generators = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Generator)]
        if key in memo.found:
            result, after = memo.found[key]
            for generator, state in zip(generators, after):
                generator.set_state(state)
            return result.clone()
        result = function(*args, **kwargs)
        if isinstance(result, torch.Tensor):  # anything else is returned as is, for the caller's checks
            memo.found[key] = (result.detach().clone(), [generator.get_state() for generator in generators])
        return result

    return wrapper
