r"""Explicit random draws: a randomized method's draw as named tensors, handed back to it.

``draw(method, q, k, *, num_features, generator)`` makes the draw that
``approximate(method, q, k, v, num_features=..., generator=...)`` would make, as a dict of named
tensors; ``approximate(..., draw=that)`` then uses it instead of a generator and gives the same
output bit for bit. So two methods, two values of ``d`` or a published implementation can share
one draw (common random numbers), and a draw can be made by hand.

=====================  =============================================================================
method                 its draw (shapes; index draws are ``int64``, Gaussian ones ``float64``)
=====================  =============================================================================
skyformer(-softmax)    ``columns`` ``(*batch, d)``: distinct rows of the completion ``[Q; K]``, in ``[0, n + m)``;
                       with ``key_mask=`` only real rows (the same mask must go to ``approximate``)
nystrom                ``columns`` ``(*batch, d)``: distinct tokens in ``[0, n)``; with
                       ``sampling="ridge-leverage"`` also ``pilot_columns`` ``(*batch, d)``; with
                       ``sampling="rpcholesky"`` only ``pivot_uniforms`` ``(*batch, d)`` in [0, 1), the
                       uniforms of RPCholesky's pivot choices (also for skyformer(-softmax))
yoso                   ``hyperplanes`` ``(*batch, m, tau, p)``, i.i.d. N(0, 1)
performer(-lra)        ``projection`` ``(*batch, r, p)``, rows N(0, I_p) (orthogonal blocks by default)
informer               ``key_indices`` ``(*batch, n, s)``: sampled keys per query, with replacement, in
                       ``[0, m)``; nothing with ``measure_keys="all"``
linformer              ``projection_keys`` (E) and ``projection_values`` (F) ``(*batch, k, m)``, i.i.d.
                       N(0, 1/k); only E with ``share_projection=True``
hyperattention         ``hyperplanes`` ``(*batch, bits, p)`` N(0, 1); per unmasked block uniforms in [0, 1)
                       ``(*batch, blocks, m)``: ``row_uniforms``, ``column_uniforms``, ``value_uniforms``
                       (``variant="paper"``) or ``column_uniforms`` (``"code"``); ``blocks`` is 1, or the
                       causal recursion's count with ``draw(..., causal=True)``
kdeformer              ``hyperplanes`` ``(*batch, bits, p)`` N(0, 1), ``column_uniforms`` ``(*batch, m)``
=====================  =============================================================================

Deterministic methods draw nothing: their draw is ``{}``. Each method's docstring says what its
paper draws. A draw is checked against this layout when handed back: a missing or unknown key, a
non-tensor, a wrong shape or kind, or an index out of range is a ``TypeError``/``ValueError``
naming ``draw``, the key, the shape expected and the shape received. Float draws are cast to the
data's dtype and moved to its device by the method (a float64 draw serves float32 and float64 runs
alike, as the generator's float64 CPU draw does).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

import torch

from .._validation import as_generator, check_qkv
from ..errors import MethodResultError
from .registry import get

__all__ = ["draw", "DrawEntry", "check_draw"]


@dataclasses.dataclass(frozen=True)
class DrawEntry:
    """One named tensor of a method's draw, as :func:`check_draw` expects it.

    Attributes
    ----------
    shape : tuple of int
        The exact shape.
    layout : str
        The shape in words, e.g. ``"(*batch, d)"`` (for messages).
    high : int or None
        For an index draw: entries must lie in ``[0, high)`` (integer dtype). None: a real-valued
        draw (float32 or float64, finite); one whose key ends in ``uniforms`` (``pivot_uniforms``,
        ``column_uniforms``, ...) must also lie in ``[0, 1)``.

    Examples
    --------
    >>> from approxlab.methods.draws import DrawEntry, check_draw
    >>> entry = DrawEntry((2, 3), "(*batch, d)", high=10)  # three column indices in [0, 10) per batch element
    >>> entry.shape, entry.high
    ((2, 3), 10)
    """

    shape: tuple
    layout: str
    high: int | None = None


def _check_entry(method: str, key: str, value, entry: DrawEntry, device) -> torch.Tensor:
    where = f"`draw[{key!r}]` of method {method!r}"
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} must be a torch.Tensor of shape {entry.shape} {entry.layout}; got "
                        f"{type(value).__name__}.")
    if value.is_meta:
        raise ValueError(f"{where} must hold data (a CPU or accelerator tensor); got a tensor on the meta device.")
    if tuple(value.shape) != tuple(entry.shape):
        raise ValueError(f"{where} must have shape {tuple(entry.shape)} {entry.layout}; got {tuple(value.shape)}.")
    if entry.high is not None:
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{where} must hold integer indices (e.g. torch.long); got dtype {value.dtype}.")
        low, high = (int(x) for x in torch.aminmax(value)) if value.numel() else (0, 0)
        if low < 0 or high >= entry.high:
            raise ValueError(f"{where} must hold indices in [0, {entry.high}); got values in [{low}, {high}].")
        return value.to(device=device, dtype=torch.long)
    if value.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{where} must have dtype float32 or float64; got {value.dtype}.")
    if value.numel() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{where} must be finite; got {int((~torch.isfinite(value)).sum())} non-finite entries.")
    if key.endswith("uniforms") and value.numel():  # every draw's ``*uniforms`` are uniforms in [0, 1)
        low, high = (float(x) for x in torch.aminmax(value))
        if low < 0 or high >= 1:
            raise ValueError(f"{where} must hold uniforms in [0, 1); got values in [{low}, {high}].")
    return value.to(device=device)


def check_draw(method: str, draw, expected: dict, *, device) -> dict:
    """Validate a draw handed back to ``method`` against ``expected`` (key -> :class:`DrawEntry`).

    Returns
    -------
    dict
        The draw's tensors on ``device`` (index draws as ``int64``), keyed as ``expected``.

    Raises
    ------
    TypeError, ValueError
        ``draw`` not a mapping; a key missing or unknown; a value of the wrong type, shape or kind,
        or on the meta device; an index out of range. Messages name ``draw``, the key, the expected
        and the received.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.draws import DrawEntry, check_draw
    >>> expected = {"columns": DrawEntry((2, 3), "(*batch, d)", high=10)}
    >>> check_draw("nystrom", {"columns": torch.tensor([[0, 1, 2], [3, 4, 5]])}, expected, device="cpu")["columns"].dtype
    torch.int64
    >>> check_draw("nystrom", {"columns": torch.tensor([[0, 1, 2], [3, 4, 10]])}, expected, device="cpu")
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    if not isinstance(draw, Mapping):
        raise TypeError(f"`draw` of method {method!r} must be a dict of named tensors (approxlab.methods.draw); "
                        f"got {type(draw).__name__}.")
    for key in draw:
        if key not in expected:
            raise ValueError(f"`draw` of method {method!r} must have the keys {sorted(expected)}; got an unknown "
                             f"key {key!r} (keys {sorted(draw, key=str)}).")
    for key in expected:
        if key not in draw:
            raise ValueError(f"`draw` of method {method!r} must have the keys {sorted(expected)}; the key {key!r} "
                             f"({expected[key].layout}, shape {tuple(expected[key].shape)}) is missing (got keys "
                             f"{sorted(draw, key=str)}).")
    return {key: _check_entry(method, key, draw[key], entry, device) for key, entry in expected.items()}


def draw(method: str, q: torch.Tensor, k: torch.Tensor, *, num_features: int,
         generator: torch.Generator | None = None, causal=False, **options) -> dict:
    r"""The random draw ``approximate(method, q, k, v, ..., generator=generator)`` would make.

    Parameters
    ----------
    method : str
        A name from :func:`approxlab.methods.available`.
    q, k : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``: the draw's shapes depend on them (and a
        data-dependent draw, such as ridge-leverage sampling, on their values).
    num_features : int
        The method's budget, ``1 <= num_features <= max_features``.
    generator : torch.Generator, optional
        A CPU generator; the draw consumes it exactly as the method would.
    causal : bool, default False
        The draw of ``approximate(..., causal=True)``, for a method whose causal form draws differently
        (HyperAttention: one set of samples per block of its causal recursion); ignored by the others.
    **options
        The method's options (those that shape the draw, e.g. ``tau``, ``sampling``,
        ``measure_keys``, ``share_projection``, ``orthogonal``, are used; the method's other
        options are accepted and ignored, unknown ones are an error).

    Returns
    -------
    dict of str to torch.Tensor
        The named tensors of the table in :mod:`approxlab.methods.draws` (``{}`` for a
        deterministic method), on ``q.device``. ``approximate(..., draw=that)`` reproduces
        ``approximate(..., generator=<the same generator state>)`` bit for bit.

    Raises
    ------
    TypeError, ValueError
        As :func:`approxlab.approximate` for ``method``, ``q``, ``k``, ``num_features``, the
        generator and the options; a randomized method registered without ``draw=``.
    MethodResultError
        A registered ``draw`` function that does not return a dict of named tensors.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> shared = approxlab.methods.draw("performer", q, k, num_features=16,
    ...                                 generator=torch.Generator().manual_seed(1))
    >>> shared["projection"].shape
    torch.Size([2, 16, 8])
    >>> a = approxlab.approximate("performer", q, k, v, num_features=16, draw=shared)
    >>> b = approxlab.approximate("performer", q, k, v, num_features=16, generator=torch.Generator().manual_seed(1))
    >>> bool(torch.equal(a.output, b.output))
    True
    """
    spec = get(method)
    check_qkv(q, k)
    num_features = spec.check_num_features(num_features, q.shape[-2], k.shape[-2])
    spec.check_options(options)
    if spec.draw is None:
        if not spec.randomized:
            return {}
        raise ValueError(f"`method` {method!r} does not expose its random draw (it was registered without `draw=`); "
                         "only its generator can be passed.")
    accepted = inspect.signature(spec.draw).parameters
    relevant = {name: value for name, value in options.items() if name in accepted}
    if causal is not False and "causal" in accepted:
        relevant["causal"] = causal
    made = spec.draw(q, k, num_features=num_features, generator=as_generator(generator), **relevant)
    if not isinstance(made, Mapping) or not all(isinstance(key, str) and isinstance(value, torch.Tensor)
                                                for key, value in made.items()):
        got = (type(made).__name__ if not isinstance(made, Mapping) else
               "{" + ", ".join(f"{key!r}: {type(value).__name__}" for key, value in made.items()) + "}")
        raise MethodResultError(f"the draw function of method {method!r} must return a dict of named tensors "
                                f"(str -> torch.Tensor); got {got}.")
    return dict(made)
