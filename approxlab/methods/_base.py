"""What every approximation returns, and how a method declares itself.

Public API (re-exported by :mod:`approxlab.methods`)::

    Approximation(method, target, output, operator=None, info=None, *, matrix=None)
    MethodSpec                     # what the registry holds for a name (built by method() / register())
    TARGETS                        # ("softmax", "kernelized", "yoso")
    CAUSAL_SUPPORT                 # (False, True, "mask-renormalise", "only"): what causal=... a method accepts
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import re
from typing import Any, Callable

import torch

from .._validation import check_int
from ..errors import MethodResultError
from ..operators import DenseOperator, LinearOperator
from ..cache._allocation import ALLOCATIONS, LAYER_BUDGETS, check_schedule
from ..cache._scores import scored_compress

__all__ = ["Approximation", "MethodSpec", "method", "make_spec", "TARGETS", "CAUSAL_SUPPORT", "MASK_RENORMALISE",
           "CAUSAL_ONLY"]

TARGETS = ("softmax", "kernelized", "yoso")
"""What a method approximates: softmax attention ``D^{-1}AV``, kernelized attention ``CV``
(Skyformer Eq. (3)) or YOSO-E's expectation (YOSO Section 3)."""

TARGET_NAMES = {"softmax": "softmax attention", "kernelized": "kernelized attention CV", "yoso": "YOSO-E"}
"""How figures and summaries name each target."""

MASK_RENORMALISE = "mask-renormalise"
"""The evaluation variant ``approximate(..., causal="mask-renormalise")`` (:mod:`approxlab.methods.causal`)."""

CAUSAL_ONLY = "only"
"""The declaration ``causal="only"``: a method that exists only in causal form (a decode-time cache policy
such as H2O), so ``approximate(..., causal=True)`` is required."""

CAUSAL_SUPPORT = (False, True, MASK_RENORMALISE, CAUSAL_ONLY)
"""What ``causal=`` a method declares (:func:`approxlab.methods.register`): ``False`` no causal form;
``True`` its own causal form from its literature (its function takes ``causal``); ``"mask-renormalise"``
none of its own, but it can be evaluated by masking and renormalising its bidirectional matrix;
``"only"`` its causal form is all it has (its function takes ``causal`` and is called with ``True``)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_COMMON = ("q", "k", "v", "num_features", "generator", "draw", "causal")
_COMPRESS_COMMON = ("q", "k", "v", "budget", "generator", "key_mask")


class Approximation:
    r"""The result of :func:`approxlab.approximate`: an output and, when known, the matrix behind it.

    Parameters
    ----------
    method : str
        Registry name of the method.
    target : {"softmax", "kernelized", "yoso"}
        Which exact attention it approximates: ``"softmax"`` (``D^{-1}A V``),
        ``"kernelized"`` (``C V``, Skyformer Eq. (3)) or ``"yoso"`` (YOSO-E's expectation).
    output : torch.Tensor
        ``(*batch, n, p_v)``, the approximate attention output.
    operator : LinearOperator or callable, optional
        The approximate ``(*batch, n, m)`` attention matrix as an operator, or a function of no
        argument that builds it on first use (:meth:`operator` calls it once).
    info : dict, optional
        Method diagnostics (sampled columns, core condition number, residual history, ...).
    matrix : torch.Tensor, optional
        The approximate attention matrix ``(*batch, n, m)`` formed densely, instead of ``operator``
        (a float32/float64 tensor of at least 2 dimensions).

    Without ``operator`` and ``matrix`` only the output is known (:attr:`has_operator` is False):
    :meth:`operator` and :meth:`matrix` then raise ``NotImplementedError``. A registered method
    function may return an ``Approximation`` built with this constructor or just its output tensor
    (:func:`approxlab.methods.register`); :func:`approxlab.approximate` checks the output's shape
    and the operator's (``(*batch, n, m)`` for ``n`` queries and ``m`` keys: at once for a
    ``matrix`` or an operator, on first use for a function that builds one) and raises
    :class:`~approxlab.errors.MethodResultError` when they are not the shapes they must be.

    Examples
    --------
    >>> import torch
    >>> weights = torch.full((1, 2, 2), 0.5, dtype=torch.float64)
    >>> v = torch.eye(2, dtype=torch.float64).unsqueeze(0)
    >>> result = Approximation("uniform", "softmax", weights @ v, matrix=weights)
    >>> result.matrix().shape
    torch.Size([1, 2, 2])
    """

    def __init__(self, method: str, target: str, output: torch.Tensor, operator=None, info: dict | None = None,
                 *, matrix: torch.Tensor | None = None):
        if not isinstance(method, str):
            raise TypeError(f"`method` must be a method name (str); got {type(method).__name__}.")
        if target not in TARGETS:
            raise ValueError(f"`target` must be one of {list(TARGETS)}; got {target!r}.")
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"`output` must be a torch.Tensor (*batch, n, p_v); got {type(output).__name__}.")
        if operator is not None and matrix is not None:
            raise ValueError("pass at most one of `operator` and `matrix`; got both.")
        if operator is not None and not (isinstance(operator, LinearOperator) or callable(operator)):
            raise TypeError(f"`operator` must be a LinearOperator or a function returning one; got "
                            f"{type(operator).__name__}.")
        if matrix is not None and not isinstance(matrix, torch.Tensor):
            raise TypeError(f"`matrix` must be a torch.Tensor (*batch, n, m); got {type(matrix).__name__}.")
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"`info` must be a dict or None; got {type(info).__name__}.")
        self.method = method
        self.target = target
        self.output = output
        self.info = {} if info is None else info
        self._operator = operator if matrix is None else DenseOperator(matrix)
        self._required_shape = None  # (*batch, n, m), set by approxlab.approximate

    def __repr__(self) -> str:
        shape = tuple(self.output.shape)
        return (f"Approximation(method={self.method!r}, target={self.target!r}, output={shape} "
                f"{self.output.dtype}, operator={'yes' if self._operator is not None else 'no'}, "
                f"info={sorted(self.info)})")

    @property
    def has_operator(self) -> bool:
        """Whether the method gave an operator or a matrix (else :meth:`operator` raises)."""
        return self._operator is not None

    def require_operator_shape(self, shape: tuple) -> None:
        """Check the operator against ``shape`` = ``(*batch, n, m)``: now when it is built (a matrix or
        an operator), else when :meth:`operator` builds it; :class:`~approxlab.errors.MethodResultError`
        when it has another shape. :func:`approxlab.approximate` calls this with ``q``'s batch, ``n``
        queries and ``m`` keys."""
        self._required_shape = tuple(shape)
        if isinstance(self._operator, LinearOperator):
            self._check_shape(self._operator)

    def _check_shape(self, operator: LinearOperator) -> None:
        if self._required_shape is not None and tuple(operator.shape) != self._required_shape:
            raise MethodResultError(
                f"method {self.method!r} must give an operator (or matrix) of shape (*batch, n, m) = "
                f"{self._required_shape}; got {tuple(operator.shape)}.")

    def operator(self) -> LinearOperator:
        """The approximate ``(*batch, n, m)`` attention matrix as an operator (``matmat``/``rmatmat``).

        Raises
        ------
        NotImplementedError
            If the method gave only its output (no ``operator`` and no ``matrix``).
        MethodResultError
            If the operator function does not return a ``LinearOperator``, or one of another shape
            than :meth:`require_operator_shape` asked for.
        """
        if self._operator is None:
            raise NotImplementedError(
                f"method {self.method!r} gave only its output: it has no operator and no matrix. Its function "
                "can return approxlab.methods.Approximation(method, target, output, operator=...) or "
                "(..., matrix=...) to provide one."
            )
        if not isinstance(self._operator, LinearOperator):
            built = self._operator()
            if not isinstance(built, LinearOperator):
                raise MethodResultError(f"the operator function of method {self.method!r} must return a "
                                        f"LinearOperator; got {type(built).__name__}.")
            self._check_shape(built)
            self._operator = built
        return self._operator

    def matrix(self) -> torch.Tensor:
        """The approximate attention matrix, formed densely: ``(*batch, n, m)`` (see :meth:`operator`)."""
        return self.operator().to_dense()


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """How a method is called, what its ``num_features`` means and how it draws.

    Built by :func:`method` (built-ins) and :func:`approxlab.methods.register` (everyone else);
    :func:`approxlab.methods.get` returns it.

    Attributes
    ----------
    name : str
        Registry name.
    function : callable
        ``function(q, k, v, *, num_features, generator=None, **options)``, returning an
        :class:`Approximation` or the output tensor ``(*batch, n, p_v)``.
    target : str
        One of :data:`TARGETS`.
    features : str
        What ``num_features`` counts (one row of the table in :mod:`approxlab.methods`).
    feature_limit : callable
        ``feature_limit(n, m) -> int``: the largest allowed ``num_features`` for ``n`` queries and
        ``m`` keys (use :meth:`max_features`).
    randomized : bool
        Whether the method draws from ``generator``.
    draw : callable or None
        ``draw(q, k, *, num_features, generator, **options) -> dict`` of named tensors: the
        method's random draw, which ``function(..., draw=...)`` accepts back
        (:func:`approxlab.methods.draw`). ``None``: the draw is not exposed.
    causal : {False, True, "mask-renormalise", "only"}
        Its causal support (:data:`CAUSAL_SUPPORT`): ``True`` -- ``function(..., causal=True)`` is
        its own causal form; ``"only"`` -- the same, and it has no other (``causal=True`` is required);
        ``"mask-renormalise"`` -- :func:`approxlab.approximate` can evaluate it with
        ``causal="mask-renormalise"`` (:mod:`approxlab.methods.causal`); ``False`` -- neither.
    compress : callable or None
        Its compression step in the KV-cache setting (:func:`approxlab.kv_cache_attention`):
        ``compress(q_context, k_context, v_context, *, budget, generator=None, key_mask=None, **options)``
        returns the ``(*batch, budget)`` indices of the context tokens it keeps, computed only from the
        context; for a policy that declares only ``score``, the top ``budget`` of its scores. ``None``: the
        method is measured there by its causal form on the whole window.
    differentiable : bool
        Whether backpropagating through its output gives the derivative of that output with
        respect to ``q``, ``k`` and ``v`` for a fixed draw (the same generator state): the
        method can be trained by autograd. ``tests/test_gradients.py`` gradchecks every method
        that declares it.
    score : callable or None
        A cache policy's per-key score (:func:`approxlab.methods.register`, ``score=``):
        ``score(q_context, k_context, v_context, *, generator=None, key_mask=None, **options)`` gives
        ``(*batch, n_c)`` floating scores, the kept set being their top ``budget``; with grouped K/V the
        KV-cache setting pools them over each group of query heads. ``None``: no scores (a policy with only
        ``compress`` keeps a set per query head).
    inputs : tuple of str
        The options a cache policy needs from the model.
    allocation : {"uniform", "adakv"}
        How the KV-cache setting spreads a layer's budget over its heads by ``score``: the same :math:`b` per
        head, or AdaKV's shared top :math:`H b` (:mod:`approxlab.cache._allocation`); the default of
        ``allocation=`` in :func:`approxlab.kv_cache_attention` and :func:`approxlab.patch_attention`.
    layer_budgets : {"uniform", "pyramid"}
        How :func:`approxlab.patch_attention`'s KV-cache setting spreads the budget over the model's layers: the
        same :math:`b` per layer, or PyramidKV's linear schedule (its default of ``layer_budgets=``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import get
    >>> spec = get("skyformer")
    >>> spec.name, spec.target, spec.max_features(100), spec.randomized  # d <= n + m columns of the completion
    ('skyformer', 'kernelized', 200, True)
    >>> "core" in spec.options()
    True
    """

    name: str
    function: Callable[..., Any]
    target: str
    features: str
    feature_limit: Callable[[int, int], int]
    randomized: bool
    draw: Callable[..., dict] | None = None
    causal: bool | str = False
    compress: Callable[..., Any] | None = None
    differentiable: bool = False
    score: Callable[..., Any] | None = None
    inputs: tuple = ()
    allocation: str = "uniform"
    layer_budgets: str = "uniform"

    def __call__(self, *args: Any, **kwargs: Any):
        return self.function(*args, **kwargs)

    def max_features(self, n: int, m: int | None = None) -> int:
        """The largest ``num_features`` for ``n`` queries and ``m`` keys (``m = n``: self-attention).

        A registered ``max_features`` function must give an integer ``>= 1``; anything else (None,
        a float, 0) is a :class:`~approxlab.errors.MethodResultError` naming the method.
        """
        m = n if m is None else m
        limit = self.feature_limit(n, m)
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
            raise MethodResultError(f"`max_features` of method {self.name!r} must return an integer >= 1 (the "
                                    f"largest num_features for n={n} queries and m={m} keys); got {limit!r} "
                                    f"({type(limit).__name__}).")
        return int(limit)

    def options(self) -> list[str] | None:
        """The method's own keywords (besides q, k, v, num_features, generator, draw); None if it takes ``**kwargs``."""
        parameters = inspect.signature(self.function).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return None
        return sorted(name for name, p in parameters.items() if name not in _COMMON
                      and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))

    @property
    def causal_only(self) -> bool:
        """Whether the method exists only in causal form (declared ``causal="only"``)."""
        return isinstance(self.causal, str) and self.causal == CAUSAL_ONLY

    def compress_options(self) -> list[str] | None:
        """The compression step's own keywords (besides q, k, v, budget, generator, key_mask); None if it takes
        ``**kwargs`` or the method has no compression step."""
        if self.compress is None:
            return None
        parameters = inspect.signature(self.compress).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return None
        return sorted(name for name, p in parameters.items() if name not in _COMPRESS_COMMON
                      and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))

    def check_options(self, options: dict) -> None:
        """Every key of ``options`` is one of :meth:`options`; a ``TypeError`` naming it otherwise."""
        allowed = self.options()
        if allowed is None:
            return
        for name, value in options.items():
            if name not in allowed:
                raise TypeError(
                    f"`{name}` is not an option of method {self.name!r} (unexpected keyword argument "
                    f"{name!r}); its options are {allowed}; got {name}={value!r}."
                )

    def check_num_features(self, num_features, n: int, m: int) -> int:
        """``num_features`` as an int in ``[1, max_features(n, m)]``, else the usual ``TypeError``/``ValueError``."""
        return check_int(num_features, "num_features", low=1, high=self.max_features(n, m))


def _feature_limit(max_features) -> Callable[[int, int], int]:
    """``max_features`` as a function of (queries n, keys m): None -> m; an int -> that constant;
    ``f(n)`` of one argument -> ``f(m)`` (the number of keys); ``f(n, m)`` as given."""
    if max_features is None:
        return lambda n, m: m
    if isinstance(max_features, numbers.Integral) and not isinstance(max_features, bool):
        limit = check_int(max_features, "max_features", low=1)
        return lambda n, m: limit
    if not callable(max_features):
        raise TypeError("`max_features` must be None, an integer >= 1, or a function of the number of keys "
                        f"(f(m)) or of queries and keys (f(n, m)); got {type(max_features).__name__}.")
    required = [p for p in inspect.signature(max_features).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(required) == 1:
        return lambda n, m: max_features(m)
    if len(required) == 2:
        return max_features
    raise TypeError("`max_features` must take one argument (the number of keys m) or two (queries n, keys m); "
                    f"got a function of {len(required)} required arguments.")


def _check_signature(name: str, function, draw, causal=False) -> None:
    """``function`` can be called as ``function(q, k, v, num_features=..., generator=...)`` (and ``draw=``,
    ``causal=`` when it declares its own causal form)."""
    own_form = causal is True or causal == CAUSAL_ONLY
    extra = {**({"draw": None} if draw else {}), **({"causal": False} if own_form else {})}
    needs = ("function(q, k, v, *, num_features, generator=None"
             + "".join(f", {key}={value!r}" for key, value in extra.items()))
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    try:
        signature.bind(None, None, None, num_features=1, generator=None, **extra)
    except TypeError as error:
        raise TypeError(f"the function of method {name!r} must accept {needs}, **options); got a function with "
                        f"signature {signature} ({error}).") from None


def _check_step(name: str, step, what: str, keyword: str, role: str) -> None:
    """``step`` (a policy's ``compress`` or ``score``) is None or callable as ``step(q, k, v, *, generator=None,
    ...)``, with ``keyword`` (``budget``) too where ``step`` takes it; ``role`` names it in messages."""
    if step is None:
        return
    call = f"{what}(q_context, k_context, v_context, *, {keyword}generator=None, **options)"
    if not callable(step):
        raise TypeError(f"`{what}` must be None or a function {call}; got {type(step).__name__}.")
    try:
        signature = inspect.signature(step)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    budget = {"budget": 1} if keyword or "budget" in signature.parameters else {}
    try:
        signature.bind(None, None, None, generator=None, **budget)
    except TypeError as error:
        raise TypeError(f"the {role} of method {name!r} must accept {call}; got a function with signature "
                        f"{signature} ({error}).") from None


def make_spec(name, function, *, target, features, max_features=None, randomized=True, draw=None,
              causal=False, compress=None, differentiable=False, score=None, inputs=(), allocation="uniform",
              layer_budgets="uniform") -> MethodSpec:
    """A validated :class:`MethodSpec` (the one validation block of :func:`method` and ``register``).

    Raises
    ------
    TypeError, ValueError
        A ``name`` that is not a word of letters, digits and ``_.+-`` (it goes into CSV tables and
        comma-separated ``--methods`` lists); a ``function`` that is not callable as
        ``function(q, k, v, *, num_features, generator=None, **options)``; a ``target`` not in
        :data:`TARGETS`; an empty ``features``; a bad ``max_features``; a non-bool ``randomized``;
        a ``draw`` that is not callable, or given for a method that is not randomized; a
        ``causal`` not in :data:`CAUSAL_SUPPORT`, ``causal=True`` for a function without a
        ``causal`` keyword, ``"mask-renormalise"`` for a target other than softmax attention;
        a ``compress`` that is not callable as ``compress(q, k, v, *, budget, generator=None)`` or a
        ``score`` not callable as ``score(q, k, v, *, generator=None)``, either given for a method without
        a causal form (``causal`` False or ``"mask-renormalise"``) or a target other than softmax
        attention; a
        non-bool ``differentiable``; an ``allocation`` not in ``("uniform", "adakv")`` or a ``layer_budgets``
        not in ``("uniform", "pyramid")``, or either non-uniform without ``score``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("`name` must be a non-empty word of letters, digits and _.+- (no spaces or commas: it "
                         f"names the method in tables and in --methods lists); got {name!r}.")
    if not callable(function):
        raise TypeError(f"`function` must be callable; got {type(function).__name__}.")
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {list(TARGETS)}; got {target!r}.")
    if not isinstance(features, str) or not features.strip():
        raise ValueError(f"`features` must say what num_features counts (a non-empty str); got {features!r}.")
    if not isinstance(randomized, bool):
        raise TypeError(f"`randomized` must be a bool; got {randomized!r}.")
    if not isinstance(differentiable, bool):
        raise TypeError(f"`differentiable` must be a bool; got {differentiable!r}.")
    if draw is not None and not callable(draw):
        raise TypeError(f"`draw` must be None or a function(q, k, *, num_features, generator, **options); got "
                        f"{type(draw).__name__}.")
    if draw is not None and not randomized:
        raise ValueError(f"`draw` is only for randomized methods; got a draw for {name!r} with randomized=False.")
    if not (causal is False or causal is True or (isinstance(causal, str) and causal in CAUSAL_SUPPORT[2:])):
        raise ValueError(f"`causal` must be one of {list(CAUSAL_SUPPORT)}; got {causal!r}.")
    if causal == MASK_RENORMALISE and target != "softmax":
        raise ValueError(f"`causal={MASK_RENORMALISE!r}` renormalises rows, so it needs target='softmax' (a "
                         f"row-stochastic target); got target={target!r}.")
    _check_signature(name, function, draw, causal)
    _check_step(name, compress, "compress", "budget, ", "compression step")
    _check_step(name, score, "score", "", "score function")
    for keyword, step in (("compress", compress), ("score", score)):
        if step is not None and not (causal is True or causal == CAUSAL_ONLY):
            raise ValueError(f"`{keyword}` is a step of the KV-cache setting, which is causal: it needs causal=True "
                             f"or causal={CAUSAL_ONLY!r}; got causal={causal!r}.")
        if step is not None and target != "softmax":
            raise ValueError(f"`{keyword}` keeps context tokens for exact softmax attention, so it needs "
                             f"target='softmax'; got target={target!r}.")
    if not isinstance(inputs, tuple) or not all(isinstance(i, str) for i in inputs):
        raise TypeError(f"`inputs` must be a tuple of option names (what the policy needs from the model); got "
                        f"{inputs!r}.")
    allocation = check_schedule(allocation, "allocation", ALLOCATIONS, {"score": score})
    layer_budgets = check_schedule(layer_budgets, "layer_budgets", LAYER_BUDGETS, {"score": score})
    if score is not None and compress is None:
        compress = scored_compress(name, score)
    return MethodSpec(name, function, target, features, _feature_limit(max_features), randomized, draw, causal,
                      compress, differentiable, score, inputs, allocation, layer_budgets)


def method(name: str, *, target: str, features: str, max_features=None, randomized: bool = True, draw=None,
           causal=False, compress=None, differentiable=False, score=None, inputs=(), allocation="uniform",
           layer_budgets="uniform"):
    """Decorator that turns a built-in method function into a :class:`MethodSpec` (see :func:`make_spec`)."""

    def wrap(function):
        return make_spec(name, function, target=target, features=features, max_features=max_features,
                         randomized=randomized, draw=draw, causal=causal, compress=compress,
                         differentiable=differentiable, score=score, inputs=inputs, allocation=allocation,
                         layer_budgets=layer_budgets)

    return wrap
