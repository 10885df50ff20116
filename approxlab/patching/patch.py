r"""Run a transformers model with an approximation in its attention: :func:`patch_attention`.

approxlab registers one attention function with transformers' ``AttentionInterface`` (its masks built by
transformers' SDPA mask builder, as in :mod:`approxlab.data.capture`) while a patch is active, and removes it
when the last block is left (normally or on an exception). Inside ``with
patch_attention(...)`` the model's attention implementation is that function: the patched layers call
:func:`approxlab.approximate` on their own q, k, v, every other layer runs PyTorch's fused SDPA kernel
as ``attn_implementation="sdpa"`` does. On exit the model's implementation is set back; nothing else of
the model is ever changed.
"""

from __future__ import annotations

import inspect
import threading
import weakref

import torch

from .._validation import as_generator, check_bool
from ..methods import registry
from ..cache._compression_ratio import cache_budget
from . import _model
from ._layer import PatchedLayer

__all__ = ["patch_attention", "AttentionPatch"]

IMPLEMENTATION = "approxlab_patch"
"""The name of patched attention in transformers' ``AttentionInterface``."""

_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # attention module -> its PatchedLayer
_LOCK = threading.Lock()  # entering and leaving a patch (mutating a model's attention setting)


def _patched_attention(module, query, key, value, attention_mask, **kwargs):
    """A patched layer's approximation; SDPA for every other module."""
    layer = _LAYERS.get(module)
    if layer is not None:
        return layer(module, query, key, value, attention_mask, kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


_ACTIVE = [0]  # patches entered and not yet left (under _LOCK): the registration lives as long as one does


def _register() -> str:
    """Register patched attention (and its mask builder) with transformers, for the first active patch."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if _ACTIVE[0] == 0:
        AttentionInterface.register(IMPLEMENTATION, _patched_attention)
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    _ACTIVE[0] += 1
    return IMPLEMENTATION


def _unregister() -> None:
    """Undo :func:`_register` when the last active patch leaves: transformers' interfaces hold no approxlab
    function after every block (transformers has no public call to remove one: its class-wide mapping)."""
    from transformers import AttentionInterface, AttentionMaskInterface

    _ACTIVE[0] -= 1
    if _ACTIVE[0] == 0:
        for interface in (AttentionInterface, AttentionMaskInterface):
            interface._global_mapping.pop(IMPLEMENTATION, None)


def take_over(target, handlers: dict) -> bool:
    """Make ``handlers`` (``{layer: callable}``, each called as ``handler(module, query, key, value,
    attention_mask, kwargs)``) the attention of their layers of ``target``'s model, every other layer SDPA; the
    caller holds :data:`_LOCK` and later calls :func:`give_back`. Returns True (approxlab's function registered);
    on a failure everything is given back before the error propagates."""
    model = target.model
    if model.config._attn_implementation == IMPLEMENTATION or any(m in _LAYERS for m in target.modules):
        raise RuntimeError("`model` is already patched by another patch_attention block: one patch per "
                           "model at a time (patch every layer you need in one call, or leave the other "
                           f"block first); got a model whose attention implementation is {IMPLEMENTATION!r}.")
    previous, registered = model.config._attn_implementation, False
    try:
        for layer, handler in handlers.items():
            _LAYERS[target.modules[layer]] = handler
        registered = bool(_register())
        model.set_attn_implementation(IMPLEMENTATION)
        if model.config._attn_implementation != IMPLEMENTATION:
            raise RuntimeError(f"{type(model).__name__} did not take approxlab's attention function "
                               "(transformers' set_attn_implementation left it unchanged).")
    except BaseException:
        mine = set(map(id, handlers.values()))
        give_back(target, previous, lambda handler: id(handler) in mine, registered)
        raise
    return registered


def give_back(target, previous: str, owned, registered: bool) -> None:
    """Undo :func:`take_over`: the model's attention implementation ``previous`` again, the handlers for which
    ``owned(handler)`` is true removed, approxlab's function unregistered if ``registered``."""
    try:
        if target.model.config._attn_implementation != previous:
            target.model.set_attn_implementation(previous)
    finally:
        for module in target.modules:
            handler = _LAYERS.get(module)
            if handler is not None and owned(handler):
                del _LAYERS[module]
        if registered:
            _unregister()


def takes_key_mask(spec) -> bool:
    """Whether the registered method ``spec`` takes a ``key_mask`` (the padding of an encoder's batch)."""
    return "key_mask" in inspect.signature(spec.function).parameters


def key_mask_methods() -> list[str]:
    """The registered methods an encoder with padding can be patched with (they take a ``key_mask``)."""
    from ..methods import available, get

    return [name for name in available() if get(name).causal != "only" and takes_key_mask(get(name))]


class AttentionPatch:
    """What :func:`patch_attention` returns: a context manager that patches the model while it is entered,
    and afterwards the records of every run of the method.

    Attributes
    ----------
    method : str
    layers : tuple of int
        The patched layers (every layer of the model for ``layers=None``).
    num_features : int
    compression_ratio : float or None
        The budget as given in kvpress's way (``num_features`` then its kept count); ``None`` when
        ``num_features`` was given.
    options : dict
        The method's own keywords: the caller's and those the model supplied.
    supplied : tuple of str
        The options the model supplied (``("rope_frequencies",)`` for a RoPE-aware cache policy: the model's
        frequencies, or ``None`` for a model without RoPE; ``"output_projection"`` for CriticalKV, each layer's own,
        in :attr:`layer_options`; see :func:`patch_attention`'s Notes); empty otherwise.
    layer_options : dict
        ``{layer: {option: value}}``, what each patched layer supplies from its own weights (empty for most
        methods).
    causal : bool or str
        What ``approximate(..., causal=...)`` gets: ``False`` (an encoder), ``True`` (the method's own
        causal form) or ``"mask-renormalise"``.
    context_length : int or None
        The KV-cache setting's context length (``None``: whole windows).
    grouping : str or None
        The KV-cache setting's kept sets with grouped K/V (``"kv-head"`` or ``"query-head"``,
        :func:`approxlab.kv_cache_attention`); ``None`` outside it.
    allocation : str or None
        The KV-cache setting's spread of a layer's budget over its heads (``"uniform"`` or ``"adakv"``); ``None``
        outside it.
    alpha_safeguard : float or None
        AdaKV's per-head minimum share with ``allocation="adakv"``; ``None`` otherwise.
    layer_budgets : str or None
        The KV-cache setting's spread of the budget over the layers (``"uniform"`` or ``"pyramid"``); ``None``
        outside it.
    budgets : dict of int to int, or None
        The ``num_features`` each patched layer runs with in the KV-cache setting (``num_features`` itself, or
        its PyramidKV share); ``None`` outside it.
    seeds : dict of int to int
        The seed of each patched layer's random stream.
    calls : list of LayerCall
        One record per run of the method, in the order they ran.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> import approxlab
    >>> from approxlab.data import load_model
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2)  # a tiny random decoder
    >>> model = load_model("initialized", config=config, seed=0).model
    >>> ids = torch.randint(30522, (1, 24), generator=torch.Generator().manual_seed(0))
    >>> with approxlab.patch_attention(model, "performer", layers=[1], num_features=8,
    ...                                generator=torch.Generator().manual_seed(0)) as patch:
    ...     hidden = model(ids).last_hidden_state
    >>> patch.layers, patch.causal, len(patch.info[1])  # performer's own causal form, one forward pass
    ((1,), True, 1)
    """

    def __init__(self, target, layers, spec, num_features, causal, options, seeds, context_length,
                 record_inputs, grouping=None, supplied=(), record_attention=False, budgets=(None, None, None, None),
                 layer_options=None):
        self._target = target
        self.method = spec.name
        self.layers = layers
        self.num_features = num_features
        self.compression_ratio = None
        self.decoding_interval = None  # tokens between two compressions while decoding (None: the context's only)
        self.options = options
        self.supplied = supplied
        self.layer_options = layer_options or {}  # {layer: options that layer supplies from its own weights}
        self.causal = causal
        self.context_length = context_length
        self.grouping = grouping
        self.allocation, self.alpha_safeguard, self.layer_budgets, per_layer = budgets
        self.budgets = None if per_layer is None else {layer: per_layer[layer] for layer in layers}
        self.record_inputs = record_inputs
        self.record_attention = record_attention
        self.seeds = {layer: seeds[layer] for layer in layers}
        self.calls: list = []
        dtype = target.dtype
        self.compute_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        self._state = "new"
        self._previous = None
        self._padding_check = None
        self._registered = False
        self._takes_key_mask = takes_key_mask(spec)

    def __repr__(self) -> str:
        return (f"AttentionPatch(method={self.method!r}, layers={self.layers}, num_features={self.num_features}, "
                f"context_length={self.context_length}, {self._state}, {len(self.calls)} calls)")

    @property
    def info(self) -> dict[int, list[dict]]:
        """``{layer: [info of each run]}``: the method's ``Approximation.info`` per patched layer."""
        return {layer: [call.info for call in self.calls if call.layer == layer] for layer in self.layers}

    def errors(self) -> list[dict]:
        """One row per run, sequence and head: ``layer``, ``call``, ``sequence``, ``head`` and the relative
        ``spectral``, ``frobenius`` and ``worst_query`` errors of the layer's output against exact attention
        on the inputs it received (:meth:`LayerCall.errors`; needs ``record_inputs=True``).

        Examples
        --------
        >>> import torch
        >>> from transformers import GPT2Config
        >>> import approxlab
        >>> from approxlab.data import load_model
        >>> config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=32)
        >>> model = load_model("initialized", config=config, seed=0).model
        >>> ids = torch.randint(30522, (1, 32), generator=torch.Generator().manual_seed(0))
        >>> with approxlab.patch_attention(model, "exact", num_features=1, record_inputs=True) as patch:
        ...     _ = model(ids)
        >>> rows = patch.errors()  # 2 layers x 1 sequence x 4 heads
        >>> len(rows), max(row["spectral"] for row in rows) < 1e-6
        (8, True)
        """
        rows = []
        for call in self.calls:
            errors = call.errors()
            sequences, heads = errors["spectral"].shape
            for s in range(sequences):
                for h in range(heads):
                    rows.append({"layer": call.layer, "call": call.call, "sequence": s, "head": h,
                                 **{name: float(value[s, h]) for name, value in errors.items()}})
        return rows

    def __enter__(self) -> "AttentionPatch":
        if self._state != "new":
            raise RuntimeError(f"an AttentionPatch is entered once; got one that is {self._state}: call "
                               "patch_attention again for another block.")
        target = self._target
        with _LOCK:
            self._previous = target.model.config._attn_implementation
            generators = {layer: torch.Generator().manual_seed(seed) for layer, seed in self.seeds.items()}
            handlers = {layer: PatchedLayer(self, layer, target.layouts[layer], generators[layer])
                        for layer in self.layers}
            self._registered = take_over(target, handlers)
            try:
                if not target.causal and not self._takes_key_mask:
                    self._padding_check = target.model.register_forward_pre_hook(self._refuse_padding,
                                                                                 with_kwargs=True)
            except BaseException:
                self._restore()
                raise
            self._state = "active"
        return self

    def _refuse_padding(self, model, args, kwargs) -> None:
        """Before any layer runs: an encoder's padding reaches the method as ``key_mask``; a method without one
        is refused here, in one line, rather than in the first patched layer."""
        try:
            bound = inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments
        except TypeError:
            return  # the model's own forward refuses these arguments
        mask = bound.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or bool((mask != 0).all()):
            return
        padded = int((mask == 0).any(dim=-1).sum())
        raise ValueError(f"`attention_mask` pads {padded} of the {mask.shape[0]} sequences of this forward pass: "
                         f"patched attention passes an encoder's padding to the method as `key_mask`, and method "
                         f"{self.method!r} takes none; patch with one that does ({', '.join(key_mask_methods())}) "
                         "or run sequences of one length without padding.")

    def _restore(self) -> None:
        target = self._target
        if self._padding_check is not None:
            self._padding_check.remove()
            self._padding_check = None
        registered, self._registered = self._registered, False
        give_back(target, self._previous, lambda handler: handler.patch is self, registered)

    def __exit__(self, *exc_info) -> None:
        with _LOCK:
            try:
                self._restore()
            finally:
                self._state = "finished"
                self._target = None  # the records outlive the block; the model is not held


def patch_attention(model, method: str, *, layers=None, num_features: int | None = None,
                    compression_ratio: float | None = None, generator: torch.Generator | None = None,
                    context_length: int | None = None, record_inputs: bool = False, grouping: str | None = None,
                    record_attention: bool = False, allocation: str | None = None,
                    alpha_safeguard: float | None = None, layer_budgets: str | None = None,
                    pyramid_beta: float | None = None, decoding_interval: int | None = None,
                    **options) -> AttentionPatch:
    r"""Compute the attention of chosen layers of a transformers model with an approximation.

    ``with patch_attention(model, method, ...) as patch:`` -- inside the block, every forward pass of
    ``model`` computes the attention of ``layers`` with ``approxlab.approximate(method, q, k, v, ...)`` on
    the layer's own queries, keys and values; afterwards ``patch`` holds what the method reported.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A model of a family approxlab reads (:data:`approxlab.data.ARCHITECTURES`: BERT, RoBERTa,
        DistilBERT, GPT-2, Llama/SmolLM2, Qwen2, Qwen3, Gemma 3), bare (``LlamaModel``) or with a task
        head (``LlamaForCausalLM``, ``BertForMaskedLM``), or a :class:`~approxlab.data.LoadedModel`.
    method : str
        A name from :func:`approxlab.methods.available`: built-in, registered
        (:func:`approxlab.methods.register`) or a plugin. In a causal model it must have a causal form
        (``causal=True`` or ``"mask-renormalise"`` in its registration).
    layers : int or sequence of int, optional
        The layers to patch (indices from 0); ``None`` (default): every layer.
    num_features : int
        The method's budget (see :mod:`approxlab.methods`), checked against each window's length when
        the method runs. Exactly one of ``num_features`` and ``compression_ratio`` is given.
    compression_ratio : float, optional
        The KV-cache setting's budget as kvpress states it (with ``context_length``, for a method with a
        compression step): the fraction :math:`r \in [0, 1)` of the context removed; every layer keeps
        :math:`\max(1, \lfloor n_c (1 - r)\rfloor)` context tokens per head, kvpress's rounding
        (:func:`approxlab.cache.kept_count`), which becomes ``num_features`` (PyramidKV's schedule spreads it
        over the layers as it does a count).
    generator : torch.Generator, optional
        A CPU generator; ``None``: a fresh, OS-seeded one. The random streams of the layers come from
        it (Notes).
    context_length : int, optional
        The KV-cache setting (causal models): the first ``context_length`` tokens of each sequence are the
        context, whose cache the method compresses; the tokens after it, the continuation (Notes).
    record_inputs : bool, default False
        Keep each run's q, k, v and output in :attr:`AttentionPatch.calls`, so that
        :meth:`AttentionPatch.errors` can compare the layer's output with exact attention on the same
        inputs (memory: three ``(S, H, n, p)`` tensors per patched layer and forward pass).
    grouping : {"kv-head", "query-head"}, optional
        The KV-cache setting in a model with grouped-query attention (SmolLM2: 9 query heads on 3 KV
        heads): ``"kv-head"`` (the default there) keeps one set of ``num_features`` context tokens per
        layer and KV head, from the mean score of its query heads (kvpress; the cache a decoder holds);
        ``"query-head"`` one set per query head after repeating the KV heads (SnapKV's published code;
        up to ``H / H_kv`` times the tokens). Only with ``context_length``
        (:func:`approxlab.kv_cache_attention`).
    allocation : {"uniform", "adakv"}, optional
        The KV-cache setting only: a layer's budget over its heads, as in :func:`approxlab.kv_cache_attention`
        (default: the method's own; ``"adakv"`` for a policy with per-key scores: the layer's ``H_kv *
        num_features`` tokens go to the largest scores of its heads jointly).
    alpha_safeguard : float, optional
        With ``allocation="adakv"`` only: each head's minimum share of ``num_features``, in ``[0, 1]``; default
        0.2 (kvpress's). Outside the KV-cache setting, the option of a method whose causal form takes it
        (``ada-snapkv``).
    layer_budgets : {"uniform", "pyramid"}, optional
        The KV-cache setting only, a cache policy's budget over the model's layers (default: the method's own;
        ``"pyramid"`` for ``pyramidkv``): ``"uniform"`` keeps ``num_features`` per head in every layer;
        ``"pyramid"`` gives layer :math:`l` of the model's :math:`L` layers PyramidKV's
        :math:`b_l` (:func:`approxlab.cache.pyramid_budgets`, with the policy's observation window, its
        option ``window`` if it has one, kept at every layer), :math:`\sum_l b_l = L\,` ``num_features``;
        :attr:`AttentionPatch.budgets` holds them.
    pyramid_beta : float, optional
        With ``layer_budgets="pyramid"`` only: PyramidKV's :math:`\beta \ge 1`, the top layer keeping
        :math:`1/\beta` of the bottom-to-top mean share; default 20 (the authors' and kvpress's ``beta``).
    decoding_interval : int, optional
        The KV-cache setting only, with a cache policy: :math:`k \ge 1`, compress the cache again every :math:`k`
        tokens after the context, back to the budget (kvpress's ``DecodingPress`` after a compressed prefill, its
        ``PrefillDecodingPress``; :mod:`approxlab.patching.decoding` states the semantics and the differences), so
        that under ``generate()`` no row attends more than ``num_features`` :math:`+ k` keys. Default None: the
        context compressed once, every later token kept. Not with ``allocation="adakv"``, ``record_attention``, or a
        policy that reads the rotary embedding (it would read the cache's ranks as positions).
    record_attention : bool, default False
        Measure each run's attention weights against exact attention on the same inputs
        (:func:`~approxlab.patching.records.attention_measures`: the rows' total variation distance and the
        exact attention mass on the keys the method kept), kept per run as ``LayerCall.attention``; NaN for a
        method whose ``Approximation`` gives no matrix. Costs an ``(S, H, n, m)`` float64 matrix per run.
    **options
        The method's own keywords, passed to every call.

    Returns
    -------
    AttentionPatch
        A context manager (entered once); after the block: :attr:`~AttentionPatch.calls` (one
        :class:`~approxlab.patching.LayerCall` per run), :attr:`~AttentionPatch.info` (``{layer: [info,
        ...]}``) and :meth:`~AttentionPatch.errors`.

    Raises
    ------
    TypeError, ValueError
        Before anything runs, naming the parameter: a ``model`` that is not of a supported family (the
        message lists them and names what came in); ``layers`` of the wrong type, out of range, repeated,
        empty, or naming a layer with a sliding window (Gemma 3's local layers; the message lists the
        layers without one); an unknown ``method``, one without a causal form in a causal model, an
        option it does not take or one patched attention sets itself (``key_mask``, ``causal``,
        ``draw``), or a keyword the method requires that neither the caller nor the model supplies;
        ``num_features`` not an integer >= 1; both or neither of ``num_features`` and ``compression_ratio``, a
        ratio outside ``[0, 1)``, without ``context_length`` or for a method without a compression step; a bad
        ``generator``; ``context_length`` not an
        integer >= 1 or given for an encoder; a non-bool ``record_inputs``; a ``grouping`` not in
        ``("kv-head", "query-head")`` or given without ``context_length``; ``allocation``, ``alpha_safeguard``,
        ``layer_budgets`` or ``pyramid_beta`` without ``context_length``, outside their values, ``"adakv"`` for
        a method without scores, ``"pyramid"`` for one without a compression step, or ``alpha_safeguard`` /
        ``pyramid_beta`` without ``"adakv"`` / ``"pyramid"``.
    RuntimeError
        On entering a model that is already patched (nesting is refused), or re-entering a patch; during
        a forward pass: a cache that holds earlier tokens outside the KV-cache setting, or attention dropout
        (a model in training mode).
    ValueError
        At a forward pass of an encoder, before any layer runs: an ``attention_mask`` with padding when the
        method takes no ``key_mask`` (the message lists those that do). During a forward pass:
        ``num_features`` above the method's maximum for the window, padding before the tokens in a causal
        model, a mask that is not padding, or the method's own errors.

    Notes
    -----
    **What replaces what.** A layer's attention receives ``query (S, H, n, p)``, ``key`` and ``value``
    ``(S, H_kv, n, p)`` after RoPE and per-head norms (:mod:`approxlab.data.capture`). The patched layer
    computes :math:`\tilde O = \texttt{approximate}(\mathrm{method}, sQ\sqrt p, K, V)` with the key/value
    heads repeated to the ``H`` query heads (query head :math:`h` uses :math:`h // (H/H_{kv})`), ``q``
    rescaled by :math:`s\sqrt p` for the model's scaling :math:`s` (Gemma 3's ``query_pre_attn_scalar``,
    GPT-2's per-layer scaling; :func:`~approxlab.data.capture.query_factor`), ``causal`` as the model is
    (see :attr:`AttentionPatch.causal`), and the padding of ``attention_mask`` as ``key_mask`` (an encoder's
    padded batch needs a method that takes one: checked when the forward pass starts). In a causal
    model padding must follow the tokens (right padding: a real token never attends it, so no mask is
    passed); the causal methods take no ``key_mask``. The method runs in the model's dtype (float32 or
    float64; half-precision models in float32, the output cast back). With ``exact``, the patched model
    is the unpatched one up to rounding. A ``"mask-renormalise"`` method (the Nyström family) is not a
    causal method: its landmarks pool every position, so each token's output depends on later tokens,
    and a causal language model scored with it sees the future.

    **What the model supplies.** A cache policy whose score (or compression step) takes ``rope_base`` or
    ``rope_frequencies`` -- expected-attention, CAP, leverage-score, Compactor: they rotate the keys or queries
    back, or average the rotation over future positions -- gets ``rope_frequencies``, the patched layers' rotary
    ``inv_freq`` (so a scaled RoPE, Llama 3's or YaRN's, is the model's own), unless the caller passed
    ``rope_base`` or ``rope_frequencies``. A model without RoPE (BERT, GPT-2) supplies ``rope_frequencies=None``
    and the policy reads its keys as un-rotated, as they are (called directly without either, such a policy
    warns: :class:`~approxlab.errors.RopeWarning`). A policy whose score takes ``output_projection`` (CriticalKV)
    gets each patched layer's own :math:`W_O` per query head, ``(H, p_v, d)``
    (:func:`approxlab.data.layout.output_projection_of`), unless the caller passed one.
    :attr:`AttentionPatch.supplied` names what was supplied.

    **Random streams.** When ``patch_attention`` is called it draws one seed per layer of the model,
    ``torch.randint(2**63 - 1, (num_layers,), generator=generator)``; layer :math:`\ell` draws from a
    CPU generator seeded with the :math:`\ell`-th, whichever layers are patched (layer 5 gets the same
    draws alone or with others: common random numbers), each forward pass continuing its stream. The
    same ``generator`` state gives the same outputs.

    **Restoration.** On leaving the block -- normally, on an exception or on ``KeyboardInterrupt`` --
    the model's attention implementation is set back and nothing else of it was touched, so its outputs
    after the block equal those before bit for bit; when no other block is active, approxlab's function is
    removed from transformers' ``AttentionInterface`` too. The layers' other computations run inside the block
    through PyTorch's SDPA kernel, whatever the model's own implementation (``"eager"`` gives the same
    values up to rounding).

    **Nesting and threads.** One patch per model at a time: entering a second one on the same model
    is a ``RuntimeError``. Different models may be patched at once, also from several threads; one
    patched model should run in one thread (the layers' streams and records are shared).
    :func:`approxlab.data.extract_qkv` replaces the attention function while it runs, so inside a block
    it reads the unpatched model.

    **The KV-cache setting** (``context_length``). A window of ``n`` tokens is a context of
    :math:`n_c` tokens and a continuation. The context is processed exactly (it fills the cache); the
    method compresses the context's cache per layer and head, from what it could see at compression
    time, and the continuation's queries attend to the compressed context and causally to themselves:
    each patched layer returns ``approxlab.kv_cache_attention(method, q, k, v, context_length=n_c, ...)``
    on its whole window for the continuation's rows, and exact causal attention for the context's rows.
    With grouped-query attention the layer's K/V go to it per KV head, with ``grouping`` (``"kv-head"``
    unless given): a policy keeps ``num_features`` context tokens per KV head, not per query head.
    This is how kvpress evaluates a press. The window may be run in one forward pass (the context's rows
    are exact either way, so it is the same computation) or as a prefill of the context followed by the
    continuation with the model's cache (``cache=``, ``past_key_values=`` in older transformers), even
    token by token: each layer keeps
    the queries it has seen, and a forward pass without earlier tokens in the cache starts a new
    sequence. Every causal method runs this way.

    References
    ----------
    .. [1] Hugging Face transformers, "Attention interface" (``AttentionInterface.register``).
    .. [2] NVIDIA kvpress: a press compresses the context's KV cache, the questions follow.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> import approxlab
    >>> from approxlab.data import load_model
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2)  # a tiny random decoder
    >>> model = load_model("initialized", config=config, seed=0).model
    >>> ids = torch.randint(30522, (1, 48), generator=torch.Generator().manual_seed(0))
    >>> before = model(ids).last_hidden_state
    >>> with approxlab.patch_attention(model, "exact", num_features=1):
    ...     exact = model(ids).last_hidden_state
    >>> bool(torch.allclose(exact, before, atol=1e-5))  # exact attention in every layer (a tiny model)
    True
    >>> with approxlab.patch_attention(model, "performer", layers=[0], num_features=4,
    ...                                generator=torch.Generator().manual_seed(0)):
    ...     changed = model(ids).last_hidden_state
    >>> bool(torch.allclose(changed, before, atol=1e-3))  # 4 random features in layer 0
    False
    >>> torch.equal(model(ids).last_hidden_state, before)  # the model is as it was
    True
    """
    target = _model.resolve_model(model)
    chosen = _model.check_layers(layers, target)
    if compression_ratio is not None or num_features is None:
        num_features = _ratio_budget(method, num_features, compression_ratio,
                                     _model.check_context_length(context_length, target))
    spec, num_features, causal = _model.check_method(method, num_features, options, target)
    generator = as_generator(generator)
    context_length = _model.check_context_length(context_length, target)
    grouping = _model.check_grouping(grouping, context_length)
    if context_length is None and alpha_safeguard is not None and "alpha_safeguard" in (spec.options() or ()):
        options, alpha_safeguard = {**options, "alpha_safeguard": alpha_safeguard}, None  # its causal form's option
    budgets = _model.check_budgets(spec, num_features, options, len(target.modules), context_length,
                                   allocation=allocation, alpha_safeguard=alpha_safeguard,
                                   layer_budgets=layer_budgets, pyramid_beta=pyramid_beta)
    record_inputs = check_bool(record_inputs, "record_inputs")
    record_attention = check_bool(record_attention, "record_attention")
    supplied = _model.supplied_inputs(spec, options, target, chosen)
    decoding_interval = _model.check_decoding(spec, decoding_interval, context_length, budgets[0], record_attention)
    per_layer = _model.layer_inputs(spec, options, target, chosen)
    seeds = _model.layer_seeds(generator, len(target.modules))
    patch = AttentionPatch(target, chosen, spec, num_features, causal, {**supplied, **options}, seeds, context_length,
                           record_inputs, grouping, supplied=tuple(supplied) + _model.LAYER_INPUTS * bool(per_layer),
                           record_attention=record_attention, budgets=budgets, layer_options=per_layer)
    patch.compression_ratio = None if compression_ratio is None else float(compression_ratio)
    patch.decoding_interval = decoding_interval
    return patch


def _ratio_budget(method, num_features, compression_ratio, context_length) -> int:
    """``num_features`` from exactly one of it and kvpress's ``compression_ratio`` (the KV-cache setting's)."""
    if compression_ratio is not None:
        if context_length is None:
            raise ValueError(f"`compression_ratio` is a fraction of the context, the KV-cache setting's: pass it with "
                             f"context_length; got compression_ratio={compression_ratio!r} without a context_length.")
    return cache_budget(registry.get(method), num_features, compression_ratio,
                        1 if context_length is None else context_length)
