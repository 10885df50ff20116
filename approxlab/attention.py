r"""Exact attention and the front door to every approximation.

Shapes: ``q: (*batch, n, p)``, ``k: (*batch, m, p)``, ``v: (*batch, m, p_v)``; ``*batch``
is typically ``(sequences, heads)``. Works on any device, in float32 or float64.

Every function here refuses, with a ``TypeError``/``ValueError`` naming the parameter (see
:func:`approxlab._validation.check_qkv`): non-tensors; dtypes other than float32/float64
(float16/bfloat16 have no CPU ``eigh``/``svd`` and too few digits for spectral errors;
integer, bool and complex tensors); sparse or meta tensors; empty tensors (``p = 0``, no
keys, no queries, an empty batch: a softmax over nothing is undefined, not 0); NaN/inf
entries; ``q``, ``k`` with different batch dimensions or ``p``; a ``v`` whose ``(*batch, m)``
differs from ``k``'s; mixed dtypes or devices; and entries so large that a logit would
overflow (``p * max|q|^2 > finfo.max / 4``).
"""

from __future__ import annotations

import inspect
import math

import torch

from . import kernels
from ._validation import as_generator, check_choice, check_key_mask, check_qkv, peak_magnitude
from .cache._scores import warn_without_rope
from .errors import MethodResultError
from .methods import registry
from .methods import Approximation
from .methods.causal import check_causal_support, mask_renormalise
from .operators import check_causal, softmax_attention

__all__ = ["exact_attention", "attention_matrix", "approximate"]

_KINDS = {
    "softmax": kernels.softmax_matrix,
    "scores": kernels.score_matrix,
    "kernelized": kernels.kernelized_matrix,
}


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    r"""Softmax attention :math:`\operatorname{softmax}(QK^\top/\sqrt p)\,V`, ``(*batch, n, p_v)``.

    Through torch's fused attention kernel (:func:`approxlab.operators.softmax_attention`):
    the ``n x m`` matrix is not formed on CPU.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    causal : bool, default False
        Decoder (causal) attention, ``n == m``: row :math:`i` is the softmax over keys
        :math:`j \le i` only, :math:`\sum_{j \le i} e^{s_{ij}} v_j / \sum_{j \le i} e^{s_{ij}}`
        (the kernel's ``is_causal``). Q/K/V of a decoder from :func:`approxlab.data.get_qkv`
        say so in ``QKV.causal``.

    Raises
    ------
    TypeError, ValueError
        For the inputs listed in the module docstring (``v`` is required); a non-bool
        ``causal``; ``causal=True`` with ``n != m``.

    Examples
    --------
    >>> import torch, approxlab
    >>> q = k = v = torch.zeros(2, 3, 4, dtype=torch.float64)
    >>> approxlab.exact_attention(q, k, v).shape
    torch.Size([2, 3, 4])
    """
    check_qkv(q, k, v)
    causal = check_causal(causal, q, k)
    return softmax_attention(q, k, v, causal=causal)


def attention_matrix(q: torch.Tensor, k: torch.Tensor, kind: str = "softmax", *, causal: bool = False) -> torch.Tensor:
    r"""An exact ``(*batch, n, m)`` attention matrix.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, m, p)``.
    kind : {"softmax", "scores", "kernelized"}
        ``"softmax"``: :math:`D^{-1}A` (log domain, never overflows);
        ``"scores"``: :math:`A = \exp(QK^\top/\sqrt p)` (raises ``OverflowError`` rather than
        returning ``inf``); ``"kernelized"``: :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})`
        (Skyformer Eq. (3)).
    causal : bool, default False
        The causal (lower-triangular) matrix, ``n == m``: entries with :math:`j > i` are 0;
        for ``"softmax"`` each row is renormalised over :math:`j \le i`, so :math:`D^{-1}A` stays
        row-stochastic (:func:`approxlab.kernels.causal_mask`).

    Raises
    ------
    TypeError, ValueError
        For the inputs listed in the module docstring, a ``kind`` not among the three, a
        non-bool ``causal``, or ``causal=True`` with ``n != m``.
    OverflowError
        ``kind="scores"`` with a logit beyond ``log(finfo(q.dtype).max)``.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, _ = synthetic_qkv((2,), 6, 4, generator=torch.Generator().manual_seed(0))
    >>> a = approxlab.attention_matrix(q, k)
    >>> a.shape
    torch.Size([2, 6, 6])
    >>> bool(torch.allclose(a.sum(-1), torch.ones(2, 6, dtype=torch.float64)))
    True
    >>> causal = approxlab.attention_matrix(q, k, causal=True)
    >>> float(causal[0, 0, 0]), float(causal[0, 0, 1])
    (1.0, 0.0)
    """
    check_qkv(q, k)
    check_choice(kind, "kind", _KINDS)
    mask = kernels.causal_mask(q.shape[-2], device=q.device) if check_causal(causal, q, k) else None
    return _KINDS[kind](q, k, mask=mask)


def approximate(
    method: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_features: int,
    generator: torch.Generator | None = None,
    draw: dict | None = None,
    key_mask: torch.Tensor | None = None,
    causal: bool | str = False,
    **options,
) -> Approximation:
    """Approximate attention with a registered method.

    Parameters
    ----------
    method : str
        A name from :func:`approxlab.methods.available` (built-in, registered with
        :func:`approxlab.methods.register`, or installed as a plugin).
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        The method's budget (columns, landmarks, random features, hashes, projected
        length; see the table in :mod:`approxlab.methods`), ``1 <= num_features <= max``, where
        ``max = get(method).max_features(n, m)`` (e.g. ``n + m`` for skyformer, ``n`` queries for
        informer, ``m`` keys for most).
    generator : torch.Generator, optional
        A **CPU** generator; every random draw comes from it (then moves to ``q.device``),
        so a seed gives the same samples on CPU and GPU. ``None``: a fresh, OS-seeded one.
    draw : dict, optional
        The method's random draw as named tensors (:func:`approxlab.methods.draw`, or made by
        hand in the documented shapes), used instead of ``generator`` (exclusive with it): the
        same draw gives the same output bit for bit as the generator it came from.
    key_mask : torch.Tensor, optional
        ``(*batch, n)`` bool, True on keys that may be attended, False on padding; masked keys
        get zero weight (:mod:`approxlab.methods._masking`). Only for methods whose function
        takes ``key_mask`` (those used in training); others raise ``ValueError``.
    causal : {False, True, "mask-renormalise"}, default False
        Decoder (causal) attention, ``n == m``: query ``i`` attends keys ``j <= i``.
        ``True``: the method's own causal form from its literature (exact, kernelized, yoso-e:
        the masked dense matrix; performer: prefix-sum FAVOR+; informer: causal ProbSparse).
        ``"mask-renormalise"``: the evaluation variant of the methods without one (the Nyström
        family): their bidirectional matrix, whose landmarks have seen future tokens, masked and
        renormalised -- a measurement, not a causal method (linear in n for their factored
        matrices, :math:`O(n^2)` for a general operator). What each method supports is its
        registry entry's ``causal`` (:func:`approxlab.methods.causal_support`); see :mod:`approxlab.methods.causal`.
        Compare with ``exact_attention(q, k, v, causal=True)``.
    **options
        Method-specific keywords (see each method's docstring).

    Returns
    -------
    Approximation
        ``.output`` ``(*batch, n, p_v)``, ``.operator()``, ``.matrix()``, ``.info`` (with
        ``"mask-renormalise"``: ``info["causal"]`` and the masked row sums ``info["row_sums"]``). A method
        function that returned only its output tensor gives an ``Approximation`` whose
        ``.operator()``/``.matrix()`` raise ``NotImplementedError``.

    Raises
    ------
    TypeError, ValueError
        For the inputs listed in the module docstring; an unknown ``method``; ``num_features``
        not an integer in ``[1, max]`` (bools and floats included); a ``generator`` that is
        not a CPU ``torch.Generator``; both ``generator`` and ``draw``; a ``draw`` with a missing
        or unknown key or a wrong shape (the message names ``draw``, the key, the shape expected
        and the shape received); an option the method does not take (the message lists those it
        does); a ``causal`` the method does not support (the message names the methods that
        support each form), ``causal`` with ``n != m`` or with ``key_mask``; a ``key_mask`` that is
        not a bool ``(*batch, n_k)`` tensor holding data (a meta tensor is refused); a bad option
        value (the method's own validation).
    MethodResultError
        (a ``TypeError`` and a ``ValueError``) A method function whose result is not an
        ``Approximation`` or tensor of shape ``(*batch, n, p_v)``, ``q``'s dtype and device; whose
        operator or matrix is not ``(*batch, n, m)`` (checked at once for a matrix, on first use for
        an operator function); or that gives only its output where ``causal="mask-renormalise"``
        needs its operator. The message names the method, the expected and the received.
    FloatingPointError
        If the approximate output has non-finite entries (e.g. an approximate row sum
        of zero); the message names the method and the count.

    Warns
    -----
    RopeWarning
        Once per call, for a cache policy that reads the model's RoPE (it declares
        ``inputs=("rope_base",)``) given neither ``rope_frequencies`` nor ``rope_base`` (nor
        ``keys_pre_rope``): pass ``rope_frequencies=None`` for keys without RoPE.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 64, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("skyformer-softmax", q, k, v, num_features=32,
    ...                                generator=torch.Generator().manual_seed(1))
    >>> approx.output.shape
    torch.Size([2, 64, 8])
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> error = approxlab.metrics.spectral_error(approx.output, exact, relative=True)
    >>> [round(e, 2) for e in error.tolist()]  # relative spectral error of each batch element
    [0.32, 0.6]
    >>> exact = approxlab.exact_attention(q, k, v, causal=True)
    >>> approx = approxlab.approximate("performer", q, k, v, num_features=32, causal=True,
    ...                                generator=torch.Generator().manual_seed(1))
    >>> approx.output.shape == exact.shape
    True
    """
    spec = registry.get(method)
    check_qkv(q, k, v)
    num_features = spec.check_num_features(num_features, q.shape[-2], k.shape[-2])
    spec.check_options(options)
    causal = check_causal_support(spec, causal, q, k, key_mask)
    key_mask = check_key_mask(key_mask, k)
    if draw is not None:
        _check_draw_accepted(spec, draw, generator)
        if "draw" in inspect.signature(spec.function).parameters:
            options["draw"] = draw
    else:
        generator = as_generator(generator)
    if key_mask is not None:
        if "key_mask" not in inspect.signature(spec.function).parameters:
            raise ValueError(f"`key_mask` is not supported by method {method!r}; got a mask for it.")
        options["key_mask"] = key_mask
    if causal is True:
        options["causal"] = True
    warn_without_rope(spec, options)
    result = spec.function(q, k, v, num_features=num_features, generator=generator, **options)
    result = _checked_result(spec, result, q, k, v)
    if causal == "mask-renormalise":
        if not result.has_operator:
            raise MethodResultError(
                f"method {method!r} must return an Approximation with an operator or matrix for "
                f"causal='mask-renormalise' (which masks and renormalises that matrix), as it was registered to "
                f"support; got only its output.")
        result = mask_renormalise(result, v)
    if not math.isfinite(peak_magnitude(result.output)):
        bad = int((~torch.isfinite(result.output)).sum())
        raise FloatingPointError(
            f"method {method!r} produced {bad} non-finite output entries "
            f"(num_features={num_features}, dtype={q.dtype}); see its docstring for the failure mode."
        )
    return result


def _check_draw_accepted(spec, draw, generator) -> None:
    """A draw goes to a method that takes one (a deterministic method takes the empty draw ``{}``), never
    with a generator."""
    if generator is not None:
        raise ValueError("pass at most one of `generator` and `draw` (a draw replaces the generator); got both.")
    if spec.draw is None and (spec.randomized or not isinstance(draw, dict) or draw):
        reason = ("it draws nothing (deterministic)" if not spec.randomized
                  else "it was registered without `draw=`")
        raise ValueError(f"`draw` is not accepted by method {spec.name!r}: {reason}; got a draw with keys "
                         f"{sorted(draw) if isinstance(draw, dict) else type(draw).__name__}.")


def _checked_result(spec, result, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Approximation:
    """The method's result as an :class:`Approximation` whose output has ``q``'s batch, n, dtype, device and
    ``v``'s p_v, and whose operator (if any) is ``(*batch, n, m)``; a bare output tensor is wrapped (it then
    has no operator)."""
    name = spec.name
    if isinstance(result, torch.Tensor):
        result = Approximation(name, spec.target, result)
    elif not isinstance(result, Approximation):
        raise MethodResultError(f"method {name!r} must return an approxlab.methods.Approximation or its output "
                                f"tensor (*batch, n, p_v); got {type(result).__name__}.")
    if (result.method, result.target) != (name, spec.target):
        raise MethodResultError(f"method {name!r} must return an Approximation of method {name!r} with target "
                                f"{spec.target!r} (as registered); got method {result.method!r}, target "
                                f"{result.target!r}.")
    expected = (*q.shape[:-1], v.shape[-1])
    output = result.output
    if tuple(output.shape) != expected:
        raise MethodResultError(f"method {name!r} must return an output of shape (*batch, n, p_v) = {expected}; "
                                f"got {tuple(output.shape)}.")
    if output.dtype != q.dtype or output.device != q.device:
        raise MethodResultError(f"method {name!r} must return an output in the dtype and on the device of q "
                                f"({q.dtype}, {q.device}); got {output.dtype}, {output.device}.")
    result.require_operator_shape((*q.shape[:-1], k.shape[-2]))
    return result
