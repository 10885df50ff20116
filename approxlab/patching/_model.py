"""Which model, which layers, which method: everything :func:`~approxlab.patching.patch_attention` checks
before anything runs."""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_int
from ..cache._allocation import LAYER_BUDGETS, PYRAMID_BETA, check_allocation, pyramid_budgets
from ..cache._grouping import GROUPINGS
from ..cache._scores import model_inputs
from ..data.checkpoints import ARCHITECTURES, SUPPORTED, Architecture
from ..data.layout import AttentionLayout, attention_module, get_attribute, layout_of, output_projection_of
from ..data.models import LoadedModel
from ..methods import registry
from ..data.rope import rotary_frequencies_of_module
from ..methods._base import MASK_RENORMALISE, MethodSpec

_RESERVED = ("q", "k", "v", "generator", "draw", "key_mask", "causal")
"""Keywords that patched attention sets itself, per layer and call."""


@dataclass(frozen=True)
class Target:
    """A model whose attention can be taken over: the object to mutate and what each layer does."""

    model: torch.nn.Module
    architecture: Architecture
    modules: tuple
    layouts: tuple[AttentionLayout, ...]

    @property
    def causal(self) -> bool:
        return self.layouts[0].causal

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def _described(model) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return type(model).__name__ + ("" if model_type is None else f" (model_type {model_type!r})")


def resolve_model(model) -> Target:
    """The :class:`Target` of a transformers model or a :class:`~approxlab.data.LoadedModel`.

    A task model (``LlamaForCausalLM``, ``BertForMaskedLM``, ...) is reached through its bare model
    (``model.base_model``), whose layers approxlab knows (:data:`~approxlab.data.ARCHITECTURES`).
    """
    if isinstance(model, LoadedModel):
        model = model.model
    allowed = (f"a transformers model of a supported family ({SUPPORTED}, or a task model built on one) "
               "or a LoadedModel from approxlab.data.load_model")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` must be {allowed}; got {type(model).__name__}.")
    architecture = ARCHITECTURES.get(getattr(getattr(model, "config", None), "model_type", None))
    base = getattr(model, "base_model", None)
    if architecture is None or type(base).__name__ != architecture.model_class:
        inside = "" if base is None or base is model else f" built on {type(base).__name__}"
        raise ValueError(f"`model` must be {allowed}; got a {_described(model)}{inside}.")
    if not any(True for _ in model.parameters()):
        raise ValueError(f"`model` must have weights; got a {_described(model)} without parameters.")
    layers = get_attribute(base, architecture.layers)
    modules = tuple(attention_module(base, architecture, index) for index in range(len(layers)))
    layouts = tuple(layout_of(module, model.config) for module in modules)
    return Target(model, architecture, modules, layouts)


def check_layers(layers, target: Target) -> tuple[int, ...]:
    """``layers`` as a tuple of distinct layer indices (``None``: every layer; an int: that one)."""
    count = len(target.modules)
    allowed = f"None (every layer), a layer index or a sequence of distinct layer indices 0 <= layer <= {count - 1}"
    if layers is None:
        chosen = tuple(range(count))
    elif isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
        chosen = (int(layers),)
    elif isinstance(layers, (list, tuple, range)):
        chosen = tuple(layers)
        if not chosen:
            raise ValueError(f"`layers` must be {allowed}; got an empty {type(layers).__name__}.")
        bad = [layer for layer in chosen if isinstance(layer, bool) or not isinstance(layer, numbers.Integral)]
        if bad:
            raise TypeError(f"`layers` must be {allowed}; got {layers!r}, with {bad[0]!r} "
                            f"({type(bad[0]).__name__}).")
        chosen = tuple(int(layer) for layer in chosen)
    else:
        raise TypeError(f"`layers` must be {allowed}; got {layers!r} ({type(layers).__name__}).")
    outside = [layer for layer in chosen if not 0 <= layer < count]
    if outside:
        raise ValueError(f"`layers` must be {allowed} (this model has {count} layers); got {layers!r}, with "
                         f"{outside[0]} out of range.")
    repeated = sorted({layer for layer in chosen if chosen.count(layer) > 1})
    if repeated:
        raise ValueError(f"`layers` must be {allowed}; got {layers!r}, with layer {repeated[0]} more than once.")
    windowed = [layer for layer in chosen if target.layouts[layer].sliding_window is not None]
    if windowed:
        full = [layer for layer, layout in enumerate(target.layouts) if layout.sliding_window is None]
        window = target.layouts[windowed[0]].sliding_window
        raise ValueError(
            f"`layers` must name layers without a sliding window: patched attention attends every earlier "
            f"key, which no method can restrict to a window. In this {target.architecture.model_type} model "
            f"the layers {full} attend every key; layers {windowed} attend only the last {window} keys; "
            f"got layers={layers!r}."
        )
    return chosen


def causal_form(spec: MethodSpec, target: Target):
    """What ``approximate(..., causal=...)`` gets in this model: ``False`` for an encoder; for a decoder the
    method's own causal form (``True``) or the evaluation variant ``"mask-renormalise"``."""
    if not target.causal:
        if spec.causal_only:
            raise ValueError(
                f"`method` {spec.name!r} is causal only (a decode-time cache policy) and cannot patch the "
                f"bidirectional attention of this {target.architecture.model_type} model; the methods for an "
                f"encoder are those not in {registry.causal_support('only')}.")
        return False
    if spec.causal_only:
        return True
    if spec.causal is True or spec.causal == MASK_RENORMALISE:
        return spec.causal
    raise ValueError(
        f"`method` must have a causal form to patch a causal model ({target.architecture.model_type}): one of "
        f"{registry.causal_support(True)} (their own causal form) or {registry.causal_support(MASK_RENORMALISE)} "
        f"(masked and renormalised, see approxlab.methods.causal); got {spec.name!r}."
    )


def check_method(method, num_features, options: dict, target: Target):
    """``(spec, num_features, causal form)`` of a patch, or the error naming the parameter."""
    spec = registry.get(method)
    num_features = check_int(num_features, "num_features", low=1)
    reserved = sorted(set(options) & set(_RESERVED))
    if reserved:
        raise TypeError(f"`{reserved[0]}` cannot be passed to patch_attention: each patched layer sets it (its "
                        f"own q, k, v, random stream, padding mask and causality); got {reserved[0]}=...")
    spec.check_options(options)
    return spec, num_features, causal_form(spec, target)


def check_context_length(context_length, target: Target):
    """``None`` or the context length of the KV-cache setting (a causal model only)."""
    if context_length is None:
        return None
    context_length = check_int(context_length, "context_length", low=1)
    if not target.causal:
        raise ValueError(f"`context_length` (the KV-cache setting) needs a causal model; got a "
                         f"{target.architecture.model_type} model, which attends in both directions, and "
                         f"context_length={context_length}.")
    return context_length


def layer_seeds(generator: torch.Generator, count: int) -> tuple[int, ...]:
    """One seed per model layer, drawn from ``generator``: ``torch.randint(2**63 - 1, (count,))``."""
    return tuple(int(seed) for seed in torch.randint(2**63 - 1, (count,), generator=generator))


def check_grouping(grouping, context_length):
    """The KV-cache setting's ``grouping`` (default ``"kv-head"``); ``None`` outside it, where it is refused."""
    if context_length is None:
        if grouping is not None:
            raise ValueError(f"`grouping` chooses the kept sets of the KV-cache setting: pass it with context_length; "
                             f"got grouping={grouping!r} without a context_length.")
        return None
    return check_choice("kv-head" if grouping is None else grouping, "grouping", GROUPINGS)


def supplied_inputs(spec: MethodSpec, options: dict, target: Target, layers) -> dict:
    """The options the model supplies to the method (:func:`approxlab.cache._scores.model_inputs`): the RoPE
    frequencies of the patched layers (``inv_freq``) to a policy that takes ``rope_base``/``rope_frequencies``
    and got neither; nothing from a model without RoPE. A required input it cannot supply is refused."""
    base = getattr(target.model, "base_model", target.model)
    found = [rotary_frequencies_of_module(base, layer) for layer in layers]
    frequencies = found[0]
    if any((f is None) != (frequencies is None) or (f is not None and not torch.equal(f, frequencies)) for f in found):
        raise ValueError(f"`layers` must share one rotary embedding for method {spec.name!r}, which reads the "
                         f"model's RoPE frequencies; got layers {list(layers)} with different ones: patch them in "
                         "separate blocks or pass rope_frequencies yourself.")
    return model_inputs(spec, options, rope_frequencies=frequencies)


LAYER_INPUTS = ("output_projection",)
"""The options a patched layer supplies from its own weights (:func:`layer_inputs`)."""


def layer_inputs(spec: MethodSpec, options: dict, target: Target, layers) -> dict:
    """``{layer: {option: value}}``: what each patched layer supplies to a policy whose step takes one of
    :data:`LAYER_INPUTS` the caller did not pass -- ``output_projection``, the layer's :math:`W_O` per query head
    ``(H, p_v, d)`` (:func:`approxlab.data.layout.output_projection_of`; CriticalKV's); empty otherwise."""
    step = spec.score if spec.score is not None else spec.compress
    wanted = [name for name in LAYER_INPUTS if step is not None and name in inspect.signature(step).parameters
              and name not in options]
    if not wanted:
        return {}
    return {layer: {"output_projection": output_projection_of(target.modules[layer], target.layouts[layer])}
            for layer in layers}


def check_decoding(spec: MethodSpec, decoding_interval, context_length, allocation, record_attention):
    """``decoding_interval`` (None, or an integer >= 1 for a cache policy of the KV-cache setting), checked."""
    if decoding_interval is None:
        return None
    interval = check_int(decoding_interval, "decoding_interval", low=1)
    if context_length is None:
        raise ValueError(f"`decoding_interval` compresses the KV-cache setting's cache again while decoding: pass it "
                         f"with context_length; got decoding_interval={interval} without a context_length.")
    if spec.compress is None:
        raise ValueError(f"`decoding_interval` needs a cache policy (a method with score= or compress=); got method "
                         f"{spec.name!r}, which compresses no cache.")
    if "rope_base" in getattr(spec, "inputs", ()):
        raise ValueError(f"`decoding_interval` rescoring a cache of kept tokens reads their ranks as positions, which a "
                         f"policy that reads the rotary embedding cannot; got method {spec.name!r} (inputs "
                         f"{tuple(spec.inputs)!r}).")
    if allocation == "adakv" or record_attention:
        got = "allocation='adakv'" if allocation == "adakv" else "record_attention=True"
        raise ValueError(f"`decoding_interval` keeps b tokens per head at every compression and forms no attention "
                         f"matrix: allowed with allocation='uniform' and record_attention=False; got {got}.")
    return interval


def kept_window(spec: MethodSpec, options: dict, budget: int) -> int:
    """The keys a policy keeps at every layer besides its share: ``min(window, budget)`` for a step that takes
    ``window`` (SnapKV's observation window; the caller's value, else the step's default), else 0."""
    step = spec.score if spec.score is not None else spec.compress
    parameter = inspect.signature(step).parameters.get("window")
    if parameter is None:
        return 0
    window = options.get("window", parameter.default)
    return min(window, budget) if isinstance(window, numbers.Integral) and window >= 0 else 0


def check_budgets(spec: MethodSpec, num_features: int, options: dict, num_layers: int, context_length, *,
                  allocation=None, alpha_safeguard=None, layer_budgets=None, pyramid_beta=None) -> tuple:
    """The KV-cache setting's budgets: ``(allocation, alpha_safeguard, layer_budgets, budgets)``, ``budgets`` the
    ``num_features`` of each of the model's ``num_layers`` layers (PyramidKV's schedule or ``num_features``
    throughout); ``(None, None, None, None)`` outside the setting, where every one of them is refused."""
    given = {"allocation": allocation, "alpha_safeguard": alpha_safeguard, "layer_budgets": layer_budgets,
             "pyramid_beta": pyramid_beta}
    if context_length is None:
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"`{name}` spreads the cache budget of the KV-cache setting: pass it with "
                                 f"context_length; got {name}={value!r} without a context_length.")
        return None, None, None, None
    allocation, alpha_safeguard = check_allocation(spec, allocation, alpha_safeguard)
    schedule = spec.layer_budgets if layer_budgets is None else check_choice(layer_budgets, "layer_budgets",
                                                                             LAYER_BUDGETS)
    if schedule == "uniform":
        if pyramid_beta is not None:
            raise ValueError(f"`pyramid_beta` shapes PyramidKV's schedule, allowed with layer_budgets='pyramid' only; "
                             f"got pyramid_beta={pyramid_beta!r} with layer_budgets='uniform'.")
        return allocation, alpha_safeguard, schedule, (num_features,) * num_layers
    if spec.compress is None:
        raise ValueError(f"`layer_budgets` 'pyramid' spreads a cache policy's budget over the layers, and method "
                         f"{spec.name!r} compresses no cache (no score= or compress=): allowed for it is 'uniform'; "
                         "got layer_budgets='pyramid'.")
    beta = PYRAMID_BETA if pyramid_beta is None else pyramid_beta
    budgets = pyramid_budgets(num_layers, num_features, beta=beta, context_length=context_length,
                              window=kept_window(spec, options, num_features))
    return allocation, alpha_safeguard, schedule, tuple(budgets)
