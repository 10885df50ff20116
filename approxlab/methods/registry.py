r"""The method registry: names -> :class:`~approxlab.methods.MethodSpec`, built-in and registered.

Three ways a method gets a name:

1. **Built-in**: one file in ``approxlab/methods/`` and one line in :data:`BUILTINS`
   (``name: "module:attribute"`` of its :class:`MethodSpec`, imported on first use).
2. **Registered**: :func:`register` (a call or a decorator), from any code, e.g. a module named
   with ``approxlab <study> --plugin MODULE`` (:func:`load_plugin`; imported in the main process
   and in every Dask worker).
3. **Installed**: a distribution that declares entry points in the group ``approxlab.methods``
   (:data:`ENTRY_POINT_GROUP`) is loaded on first use of the registry, without any import by
   the user. Each entry point names a module (or a ``module:attribute`` in it) whose import
   registers its methods with :func:`register`::

       # pyproject.toml of the distribution that ships the method
       [project.entry-points."approxlab.methods"]
       topk = "my_package.attention"

   An entry point that fails to load -- it raises, or calls ``sys.exit`` -- gives a
   :class:`~approxlab.errors.PluginWarning` naming it; every other method stays available.

Every registered name is accepted by :func:`approxlab.approximate` and :func:`approxlab.methods.draw`,
listed by :func:`available` and run by the studies that take ``--methods`` (``figure1`` draws it in
its companion figure); the shared tests of every method (``tests/test_methods_common.py``) check
every name available when they are collected, installed plugins included.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import threading
import warnings
from types import ModuleType

from ..errors import PluginWarning
from ._base import MethodSpec, make_spec

__all__ = ["available", "get", "register", "unregister", "load_plugin", "plugin_modules", "causal_support",
           "BUILTINS", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "approxlab.methods"
"""The ``importlib.metadata`` entry-point group that installed distributions declare methods in."""

BUILTINS = {
    "exact": "softmax_reference:EXACT",
    "kernelized": "kernelized:KERNELIZED",
    "skyformer": "skyformer:SKYFORMER",
    "skyformer-softmax": "skyformer_softmax:SKYFORMER_SOFTMAX",
    "nystrom": "nystrom:NYSTROM",
    "nystromformer": "nystromformer:NYSTROMFORMER",
    "spectral-shifting": "spectral_shifting:SPECTRAL_SHIFTING",
    "yoso": "yoso:YOSO",
    "yoso-e": "yoso_e:YOSO_E",
    "performer": "performer:PERFORMER",
    "performer-lra": "performer_lra:PERFORMER_LRA",
    "informer": "informer:INFORMER",
    "linformer": "linformer:LINFORMER",
    "topk": "topk:TOPK",
    "topp": "topp:TOPP",
    "vattention": "vattention:VATTENTION",
    "magicpig": "magicpig:MAGICPIG",
    "streaming-llm": "streaming_llm:STREAMING_LLM",
    "h2o": "h2o:H2O",
    "snapkv": "snapkv:SNAPKV",
    "quest": "quest:QUEST",
    "hyperattention": "hyperattention:HYPERATTENTION",
    "kdeformer": "kdeformer:KDEFORMER",
    "polynomial": "polynomial:POLYNOMIAL",
    "knorm": "knorm:KNORM",
    "random": "random:RANDOM",
    "observed-attention": "observed_attention:OBSERVED_ATTENTION",
    "tova": "tova:TOVA",
    "keydiff": "keydiff:KEYDIFF",
    "expected-attention": "expected_attention:EXPECTED_ATTENTION",
    "leverage-score": "leverage_score:LEVERAGE_SCORE",
    "cur": "cur:CUR",
    "compactor": "compactor:COMPACTOR",
    "cap": "cap:CAP",
    "criticalkv": "criticalkv:CRITICALKV",
    "caote": "caote:CAOTE",
    "ada-snapkv": "ada_snapkv:ADA_SNAPKV",
    "pyramidkv": "pyramidkv:PYRAMIDKV",
    "minference": "minference:MINFERENCE",
    "xattention": "xattention:XATTENTION",
    "flexprefill": "flexprefill:FLEXPREFILL",
    "duo-attention": "duo_attention:DUO_ATTENTION",
}
"""The built-in methods: name -> ``module:attribute`` in this package (one line per method)."""


@dataclasses.dataclass
class _State:
    """What was registered in this process (a fresh ``_State`` is a fresh registry)."""

    registered: dict = dataclasses.field(default_factory=dict)  # name -> MethodSpec, in registration order
    plugins: list = dataclasses.field(default_factory=list)  # modules loaded by load_plugin, in order
    entry_points_loaded: bool = False
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)


_STATE = _State()


def _load_entry_points() -> None:
    """Load the :data:`ENTRY_POINT_GROUP` entry points, once per process (a broken one warns)."""
    state = _STATE
    with state.lock:
        if state.entry_points_loaded:
            return
        state.entry_points_loaded = True  # first: a plugin that uses the registry while loading must not recurse
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry.load()  # importing the module registers its methods
            except (Exception, SystemExit) as error:  # noqa: BLE001 - third-party code (sys.exit included) must
                # not break unrelated use: its methods are missing, the warning says why
                warnings.warn(PluginWarning.failed(entry, ENTRY_POINT_GROUP, error, "its methods are not available, "
                                                   "every other method is"), stacklevel=3)


def _names() -> list[str]:
    return list(BUILTINS) + [name for name in _STATE.registered if name not in BUILTINS]


def available() -> list[str]:
    """Names accepted by :func:`approxlab.approximate`: the built-ins in :data:`BUILTINS` order, then
    registered and installed methods in the order they were registered.

    Examples
    --------
    >>> from approxlab.methods import available
    >>> available()[:4]
    ['exact', 'kernelized', 'skyformer', 'skyformer-softmax']
    """
    _load_entry_points()
    return _names()


def get(name: str) -> MethodSpec:
    """The :class:`MethodSpec` registered as ``name`` (a registration shadows a built-in of that name).

    Examples
    --------
    >>> from approxlab.methods import get
    >>> spec = get("nystromformer")
    >>> spec.target, spec.randomized, spec.max_features(1024)
    ('softmax', False, 1024)
    """
    names = available()
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"`method` must be one of {names}; got {name!r}.")
    if name in _STATE.registered:
        return _STATE.registered[name]
    module, attribute = BUILTINS[name].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attribute)


def causal_support(support) -> list[str]:
    """The available methods that declare ``causal=support``, in :func:`available` order.

    ``True``: the methods that accept ``approximate(..., causal=True)`` (their own causal form), the
    causal-only ones included; ``"only"``: the causal-only methods (decode-time cache policies);
    ``"mask-renormalise"``: the evaluation variant; ``False``: no causal form.

    Examples
    --------
    >>> from approxlab.methods import causal_support
    >>> causal_support(True)[:5]
    ['exact', 'kernelized', 'yoso-e', 'performer', 'informer']
    >>> causal_support("only")[:4]
    ['streaming-llm', 'h2o', 'snapkv', 'knorm']
    """
    def declares(spec) -> bool:
        if support is True:
            return spec.causal is True or spec.causal_only
        return spec.causal is support or (isinstance(support, str) and spec.causal == support)

    return [name for name in available() if declares(get(name))]


def register(name: str, function=None, *, target: str, features: str, max_features=None, randomized: bool = True,
             draw=None, causal=False, compress=None, differentiable: bool = False, overwrite: bool = False,
             score=None, inputs=(), allocation="uniform", layer_budgets="uniform"):
    r"""Register ``function`` as method ``name``; usable as a decorator.

    Parameters
    ----------
    name : str
        The method's name in :func:`available`, tables and ``--methods``: letters, digits and
        ``_.+-``.
    function : callable, optional
        ``function(q, k, v, *, num_features, generator=None, **options)`` with ``q: (*batch, n, p)``,
        ``k: (*batch, m, p)``, ``v: (*batch, m, p_v)``. It returns the output tensor
        ``(*batch, n, p_v)`` or an :class:`~approxlab.methods.Approximation` (which can carry an
        operator or the dense matrix). :func:`approxlab.approximate` validates the inputs and the
        budget before the call and the result after it (shape, dtype, device, finite), as for a
        built-in. Omitted with ``score`` given: the policy is registered at once, whole, by
        :func:`approxlab.methods.cache_policy` (its causal form the prompt compressed once to the top of its
        scores, then decoded; causal-only), and ``register`` returns that causal form's function; ``draw``,
        ``compress``, ``max_features``, ``differentiable`` and a ``causal`` other than False or ``"only"`` are
        then refused. Omitted without ``score``: ``register(...)`` returns a decorator.
    target : {"softmax", "kernelized", "yoso"}
        The exact attention the method approximates.
    features : str
        What ``num_features`` counts (e.g. ``"kept keys k per query"``).
    max_features : None, int or callable, optional
        The largest ``num_features``: None (default) the number of keys ``m``; an int; ``f(m)``
        of the number of keys; or ``f(n, m)`` of the numbers of queries and keys.
    randomized : bool, default True
        Whether the method draws from ``generator`` (studies then run several seeds).
    draw : callable, optional
        ``draw(q, k, *, num_features, generator, **options) -> dict`` of named tensors, the
        method's random draw; ``function`` must then accept ``draw=`` (None or such a dict) and
        give the same output for a draw as for the generator it came from
        (:func:`approxlab.methods.draw`).
    causal : {False, True, "mask-renormalise", "only"}, default False
        Its causal (decoder) support, which ``approximate(..., causal=...)`` checks and names in its
        refusals: ``True`` when ``function`` takes a keyword ``causal`` and, given ``causal=True``,
        computes its own causal form (query ``i`` sees keys ``j <= i`` only); ``"only"`` when that causal
        form is all the method has (a decode-time cache policy: ``causal=False`` is refused);
        ``"mask-renormalise"``
        when it has none but may be evaluated by masking and renormalising its matrix (it must
        return an ``Approximation`` with an operator or matrix, else ``approximate`` raises
        :class:`~approxlab.errors.MethodResultError`; target ``"softmax"``;
        :mod:`approxlab.methods.causal`); ``False`` for neither.
    compress : callable, optional
        The method's compression step in the KV-cache setting (:func:`approxlab.kv_cache_attention`):
        ``compress(q_context, k_context, v_context, *, budget, generator=None, key_mask=None, **options)``
        returns the ``(*batch, budget)`` indices of the context tokens kept, computed from the context
        only; the continuation then attends exactly to them and causally to itself. Only with
        ``causal=True`` or ``"only"`` and target ``"softmax"``. Without it (and without ``score``), a causal
        method is measured in that setting by its causal form on the whole window. A policy with only
        ``compress`` keeps a set per query head: with grouped K/V it runs with ``grouping="query-head"``
        only (``score`` is what lets it keep one set per KV head).
    score : callable, optional
        A cache policy's per-key score in the KV-cache setting: ``score(q, k, v, *, generator=None,
        key_mask=None, **options) -> scores`` with ``q, k, v`` ``(*batch, n_c, p)`` the context of one query
        head and the (repeated) KV head it reads, ``scores`` ``(*batch, n_c)`` floating. Higher is kept:
        the kept set is ``scores.topk(budget, dim=-1).indices``. Tokens the policy must keep (sinks, a
        recent or observation window) score :math:`+\infty` (at most ``budget`` of them), padded keys
        (``key_mask`` False) :math:`-\infty`. A score function that declares a keyword ``budget`` gets
        the budget too (e.g. a recent window that defaults to half of it). Declaring ``score`` derives
        ``compress`` (the top ``budget`` per head) unless ``compress`` is given as well (then ``compress``
        runs without grouping and per query head, the scores per KV head). With grouped-query attention
        (:func:`approxlab.kv_cache_attention`, ``grouping="kv-head"``) the scores of a group's query heads
        are averaged, as kvpress averages them, and one set is kept per KV head. Only with ``causal=True``
        or ``"only"`` and target ``"softmax"``.
    inputs : tuple of str, default ()
        The options a cache policy needs from the model. ``"rope_base"`` (or ``"rope_frequencies"``): the model
        path supplies the model's RoPE frequencies, nothing for a model without RoPE
        (:func:`approxlab.patch_attention`); any other name must be passed by the caller, and a patch without
        it is refused before anything runs.
    allocation : {"uniform", "adakv"}, default "uniform"
        With ``score``: how the KV-cache setting spreads a layer's budget over its heads -- the same :math:`b`
        per head, or AdaKV's top :math:`H b` scores of the layer's heads jointly
        (:func:`approxlab.kv_cache_attention`, whose ``allocation=`` it sets by default).
    layer_budgets : {"uniform", "pyramid"}, default "uniform"
        With ``score``: how :func:`approxlab.patch_attention`'s KV-cache setting spreads the budget over the
        model's layers -- the same :math:`b` per layer, or PyramidKV's linear schedule.
    differentiable : bool, default False
        Whether autograd through ``function``'s output gives its derivative with respect to ``q``,
        ``k`` and ``v`` (for a fixed draw): a claim the shared gradient test checks.
    overwrite : bool, default False
        Replace an earlier registration of ``name`` (or shadow the built-in of that name); without
        it a taken name is an error.

    Returns
    -------
    callable
        ``function`` itself (so the decorator leaves it callable as before); for a policy registered by its
        ``score`` alone, the causal form built for it.

    Raises
    ------
    TypeError, ValueError
        For the arguments listed in :func:`approxlab.methods._base.make_spec`; a ``name`` already
        taken without ``overwrite=True`` (the message names the method holding it).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.methods import register, unregister
    >>> @register("uniform", target="softmax", features="ignored", randomized=False)
    ... def uniform(q, k, v, *, num_features, generator=None):
    ...     return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
    >>> q = k = v = torch.ones(1, 4, 2, dtype=torch.float64)
    >>> approxlab.approximate("uniform", q, k, v, num_features=1).output.shape
    torch.Size([1, 4, 2])
    >>> _ = unregister("uniform")

    A cache policy by its score alone (kvpress's Knorm, the keys of smallest norm kept) is a whole method:

    >>> def small_keys(q, k, v, *, generator=None, key_mask=None):
    ...     scores = -k.norm(dim=-1)
    ...     return scores if key_mask is None else scores.masked_fill(~key_mask, float("-inf"))
    >>> _ = register("small-keys", score=small_keys, target="softmax", features="kept context tokens",
    ...              randomized=False)
    >>> q = k = v = torch.randn(1, 32, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> approxlab.approximate("small-keys", q, k, v, num_features=4, causal=True).info["kept"].shape
    torch.Size([1, 4])
    >>> approxlab.kv_cache_attention("small-keys", q, k, v, context_length=24, num_features=4).output.shape
    torch.Size([1, 8, 4])
    >>> _ = unregister("small-keys")
    """
    if not isinstance(overwrite, bool):
        raise TypeError(f"`overwrite` must be a bool; got {overwrite!r}.")
    if function is None and score is not None:  # a score alone: the whole policy, registered now
        _check_score_only(name, causal=causal, draw=draw, compress=compress, max_features=max_features,
                          differentiable=differentiable)
        from ..cache._policy import cache_policy  # here: the policy builder imports draws, which imports this module

        spec = cache_policy(name, score=score, target=target, features=features, randomized=randomized,
                            inputs=tuple(inputs), allocation=allocation, layer_budgets=layer_budgets)
        _store(name, spec, overwrite)
        return spec.function

    def add(function):
        spec = make_spec(name, function, target=target, features=features, max_features=max_features,
                         randomized=randomized, draw=draw, causal=causal, compress=compress,
                         differentiable=differentiable, score=score, inputs=tuple(inputs), allocation=allocation,
                         layer_budgets=layer_budgets)
        _store(name, spec, overwrite)
        return function

    return add if function is None else add(function)


def _check_score_only(name, *, causal, draw, compress, max_features, differentiable) -> None:
    """Refuse what a policy registered by its ``score`` alone cannot have (its causal form is built for it)."""
    if not (causal is False or causal == "only"):
        raise ValueError(f"a policy registered by its `score` alone is causal-only (its causal form is built from "
                         f"the score: the prompt compressed once, then decoded); allowed `causal` are False or "
                         f"'only'; got causal={causal!r} for {name!r}. Pass `function` for a causal form of its own.")
    given = {"draw": draw, "compress": compress, "max_features": max_features}
    given = [key for key, value in given.items() if value is not None] + (["differentiable"] if differentiable
                                                                           else [])
    if given:
        raise ValueError(f"a policy registered by its `score` alone gets its causal form, compression step and "
                         f"budget limit from the score (approxlab.methods.cache_policy); pass `function` as well to "
                         f"give {', '.join(f'`{key}`' for key in given)}; got {', '.join(given)} for {name!r}.")


def _store(name: str, spec: MethodSpec, overwrite: bool) -> None:
    """Put ``spec`` in the registry as ``name`` (a taken name only with ``overwrite``)."""
    with _STATE.lock:
        taken = name in available()
        if taken and not overwrite:
            holder = get(name).function
            where = f"{getattr(holder, '__module__', '?')}.{getattr(holder, '__qualname__', holder)}"
            raise ValueError(f"`name` {name!r} is already registered (by {where}); pass overwrite=True to "
                             "replace it, or choose another name.")
        _STATE.registered.pop(name, None)
        _STATE.registered[name] = spec


def unregister(name: str) -> MethodSpec:
    """Remove the registration of ``name`` and return its :class:`MethodSpec`.

    A built-in that a registration shadowed comes back; a built-in itself cannot be removed.

    Raises
    ------
    TypeError
        ``name`` is not a str (e.g. a list of names).
    ValueError
        ``name`` is a built-in that is not shadowed, or not registered at all.

    Examples
    --------
    >>> from approxlab.methods import available, register, unregister
    >>> @register("mean-of-values", target="softmax", features="ignored", randomized=False)
    ... def mean_of_values(q, k, v, *, num_features, generator=None):  # every query gets the mean of V
    ...     return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
    >>> "mean-of-values" in available()
    True
    >>> unregister("mean-of-values").function is mean_of_values, "mean-of-values" in available()
    (True, False)
    >>> unregister("exact")  # a built-in cannot be removed
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    if not isinstance(name, str):
        raise TypeError(f"`name` must be the name of one registered method (a str); got {name!r} "
                        f"({type(name).__name__}).")
    with _STATE.lock:
        _load_entry_points()
        if name in _STATE.registered:
            return _STATE.registered.pop(name)
    if name in BUILTINS:
        raise ValueError(f"`name` {name!r} is a built-in method: it can be shadowed (register(..., overwrite=True)) "
                         "but not unregistered.")
    registered = [n for n in _STATE.registered]
    raise ValueError(f"`name` must be a registered (not built-in) method, one of {registered}; got {name!r}.")


def load_plugin(module: str) -> ModuleType:
    """Import ``module`` (which registers methods when imported) and remember it for Dask workers.

    The CLI's ``--plugin MODULE`` calls this in the main process, and the study runner again in
    every Dask worker before its first cell (:func:`plugin_modules` lists what to import there).
    Importing is idempotent: a module is executed once per process.

    Raises
    ------
    TypeError
        ``module`` is not a str.
    ImportError
        ``module`` cannot be imported (not on ``sys.path``: set ``PYTHONPATH``); errors raised while
        the module runs propagate unchanged.
    RuntimeError
        The module called ``sys.exit`` while it was imported (chained to the ``SystemExit``): an
        error of the plugin, which must register its methods and return, never an exit of the
        program that loads it.

    Examples
    --------
    >>> import sys
    >>> from approxlab.methods import available, load_plugin
    >>> module = load_plugin("approxlab.methods.yoso")  # any importable module; a plugin registers methods
    >>> module.__name__, "approxlab.methods.yoso" in sys.modules
    ('approxlab.methods.yoso', True)
    """
    if not isinstance(module, str) or not module:
        raise TypeError(f"`module` must be a module name (str), e.g. 'my_package.attention'; got {module!r}.")
    _load_entry_points()
    try:
        loaded = importlib.import_module(module)
    except SystemExit as exit_:
        raise RuntimeError(f"the plugin module {module!r} called sys.exit({exit_.code!r}) while it was imported; a "
                           "plugin registers its methods or studies and returns") from exit_
    with _STATE.lock:
        if module not in _STATE.plugins:
            _STATE.plugins.append(module)
    return loaded


def plugin_modules() -> tuple[str, ...]:
    """The modules loaded by :func:`load_plugin` in this process, in order.

    Examples
    --------
    >>> from approxlab.methods import load_plugin, plugin_modules
    >>> _ = load_plugin("approxlab.methods.yoso")  # imported again in every Dask worker
    >>> "approxlab.methods.yoso" in plugin_modules()
    True
    """
    return tuple(_STATE.plugins)
