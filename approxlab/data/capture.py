r"""Queries, keys and values as a model's own attention code computes them.

approxlab registers one attention function with transformers' ``AttentionInterface`` (and
transformers' SDPA mask builder under the same name, so masks, sliding windows included, are
built exactly as for ``attn_implementation="sdpa"``). While a model runs with it, every
attention call goes to SDPA as usual -- except the call of the requested layer, whose
``query``, ``key``, ``value`` are recorded and the forward pass stopped. They are what the
model's attention receives: after rotary embeddings (RoPE) and per-head norms (Qwen3,
Gemma 3), with the key/value heads before grouped-query repetition, together with the
``scaling``, any ``sliding_window`` and the module's ``is_causal``. No layer is re-implemented
here, so any model of :data:`~approxlab.data.models.ARCHITECTURES` reads the same way.

Two extraction modes:

``"hidden"`` (default)
    The model's real input to layer ``layer``: the whole model runs up to that layer.
``"embedding"``
    Layer ``layer``'s attention applied to the *input embeddings* (the input of layer 0): a
    shortcut that must be asked for. At ``layer=0`` the two modes coincide. For BERT it is
    :math:`X = \mathrm{LayerNorm}(E_{word} + E_{position} + E_{type})` projected by that
    layer's :math:`W_Q, W_K, W_V` -- Skyformer's Figure 1 setting at layer 0.

Outputs follow the conventions of the rest of approxlab: ``q, k, v: (S, H, n, p)`` with the
key/value heads repeated to the ``H`` query heads (query head ``h`` uses key/value head
``h // (H / H_kv)``, as transformers' ``repeat_kv``), and ``q`` multiplied by
:math:`\text{scaling}\cdot\sqrt p` when the model's scaling is not :math:`1/\sqrt p` (Gemma 3's
``query_pre_attn_scalar``, GPT-2's per-layer scaling), so that
:math:`\operatorname{softmax}(QK^\top/\sqrt p)V` -- :func:`approxlab.exact_attention`, with
``causal=True`` for a decoder -- is the model's attention output.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import threading
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_int
from .layout import AttentionLayout, attention_module, get_attribute, layout_of
from .models import LoadedModel, check_device
from .positions import check_positions, position_ids, positions_for

__all__ = ["MODES", "DTYPES", "capture_attention", "repeat_kv_heads", "query_factor", "captured_qkv",
           "extract_qkv", "check_dtype"]

MODES = ("embedding", "hidden")
DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_TOKENS_PER_CHUNK = 16384
_IMPLEMENTATION = "approxlab_capture"
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("approxlab_capture", default=None)
_LOCK = threading.RLock()  # one extraction at a time mutates a model's attention setting


def query_factor(layout: AttentionLayout) -> float | None:
    r""":math:`s\sqrt p`, the factor that makes ``q`` work with approxlab's :math:`1/\sqrt p` (None: 1).

    Examples
    --------
    >>> from approxlab.data.capture import query_factor
    >>> from approxlab.data.layout import AttentionLayout
    >>> bert = AttentionLayout(causal=False, scaling=0.125, sliding_window=None, num_heads=12, num_kv_heads=12, head_dim=64)
    >>> print(query_factor(bert))  # 1/sqrt(64): nothing to rescale
    None
    >>> gemma = AttentionLayout(causal=True, scaling=1 / 16, sliding_window=512, num_heads=4, num_kv_heads=1, head_dim=64)
    >>> query_factor(gemma)  # (1/16) * sqrt(64)
    0.5
    """
    factor = layout.scaling * math.sqrt(layout.head_dim)
    return None if abs(factor - 1.0) <= 1e-12 else factor


def repeat_kv_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(S, H_kv, n, p) -> (S, H, n, p)``: key/value head ``h // (H / H_kv)`` for query head ``h``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.data.capture import repeat_kv_heads
    >>> k = torch.arange(2.0).reshape(1, 2, 1, 1)  # 2 key/value heads
    >>> repeat_kv_heads(k, 6).flatten().tolist()  # query head h uses key/value head h // 3
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    """
    group = num_heads // x.shape[-3]
    return x if group == 1 else x.repeat_interleave(group, dim=-3)


# -- the capturing attention function --------------------------------------------------


class _Stop(Exception):
    """Ends the forward pass once the requested layer's Q/K/V are recorded."""


@dataclass
class _Capture:
    target: object
    layout: AttentionLayout
    tensors: tuple | None = None


def check_call(module, layout: AttentionLayout, kwargs: dict) -> None:
    """What transformers passes to an attention function agrees with the module's ``layout`` (else
    approxlab misreads the model): a ``RuntimeError`` naming the module otherwise."""
    passed = {
        "scaling": kwargs.get("scaling", layout.scaling),
        "sliding_window": kwargs.get("sliding_window", layout.sliding_window),
        "is_causal": kwargs.get("is_causal", layout.causal),
    }
    expected = {"scaling": layout.scaling, "sliding_window": layout.sliding_window, "is_causal": layout.causal}
    extra = {name: kwargs[name] for name in ("softcap", "s_aux", "position_bias") if kwargs.get(name) is not None}
    if passed != expected or extra:
        raise RuntimeError(
            f"{type(module).__name__} called attention with {passed | extra}, which its module's "
            f"attributes {expected} do not describe; approxlab cannot read this model's attention as "
            "softmax(scaling q k^T) v."
        )


def _capturing_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA attention, except for the captured module: record its inputs and stop."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    capture = _ACTIVE.get()
    if capture is not None and module is capture.target:
        check_call(module, capture.layout, kwargs)
        capture.tensors = (query, key, value)
        raise _Stop
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@functools.cache
def _register() -> str:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(_IMPLEMENTATION, _capturing_attention)
    AttentionMaskInterface.register(_IMPLEMENTATION, sdpa_mask)
    return _IMPLEMENTATION


def _hidden_states(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _embedding_shortcut(model, architecture, layer: int):
    """Forward pre-hooks that give layer ``layer`` the input of layer 0 (embedding mode)."""
    layers = get_attribute(model, architecture.layers)
    seen = {}

    def remember(module, args, kwargs):
        seen["x"] = _hidden_states(args, kwargs)

    def replace(module, args, kwargs):
        if args:
            return (seen["x"], *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": seen["x"]}

    return [layers[0].register_forward_pre_hook(remember, with_kwargs=True),
            layers[layer].register_forward_pre_hook(replace, with_kwargs=True)]


def _model_inputs(model, architecture, ids: torch.Tensor) -> dict:
    config = model.config
    inputs = {"input_ids": ids, "position_ids": position_ids(architecture, config, *ids.shape, ids.device)}
    if architecture.token_types:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    if "use_cache" in inspect.signature(model.forward).parameters:
        inputs["use_cache"] = False
    return inputs


def capture_attention(loaded, ids: torch.Tensor, *, layer: int, mode: str, positions: str):
    """``(query, key, value)`` as layer ``layer``'s attention receives them for ``ids: (S, n)``.

    ``(S, H, n, p)``, ``(S, H_kv, n, p)``, ``(S, H_kv, n, p_v)`` in the model's dtype and device
    (no repetition, no rescaling). Runs under ``torch.no_grad()`` with the model in eval mode,
    its attention implementation and position table restored afterwards.

    Examples
    --------
    >>> import torch
    >>> from transformers import BertConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.data.capture import capture_attention
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> loaded = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    >>> query, key, value = capture_attention(loaded, ids, layer=1, mode="hidden", positions="interpolate")
    >>> query.shape, query.dtype  # (S, H, n, p) in the model's dtype
    (torch.Size([2, 4, 16, 8]), torch.float32)
    """
    check_choice(mode, "mode", MODES)
    model, architecture = loaded.model.base_model, loaded.architecture  # a causal LM's bare model (lm_head=True)
    target = attention_module(model, architecture, layer)
    capture = _Capture(target, layout_of(target, model.config))
    with _LOCK:
        previous, was_training = model.config._attn_implementation, model.training
        hooks = _embedding_shortcut(model, architecture, layer) if mode == "embedding" and layer > 0 else []
        token = _ACTIVE.set(capture)
        try:
            model.set_attn_implementation(_register())
            model.eval()
            with torch.no_grad(), positions_for(model, architecture, model.config, ids.shape[1], positions):
                model(**_model_inputs(model, architecture, ids))
        except _Stop:
            pass
        finally:
            _ACTIVE.reset(token)
            for hook in hooks:
                hook.remove()
            model.set_attn_implementation(previous)
            model.train(was_training)
    if capture.tensors is None:
        raise RuntimeError(f"layer {layer}'s attention was never called by {type(model).__name__}.forward.")
    return capture.tensors


def check_dtype(dtype) -> str:
    """The name of ``dtype``, which must be torch.float32 or torch.float64.

    Examples
    --------
    >>> import torch
    >>> from approxlab.data.capture import check_dtype
    >>> check_dtype(torch.float64)
    'float64'
    >>> try:
    ...     check_dtype(torch.float16)
    ... except ValueError as error:
    ...     print(error)
    `dtype` must be one of torch.float32, torch.float64; got torch.float16.
    """
    try:
        return DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"`dtype` must be one of torch.float32, torch.float64; got {dtype!r}.") from None


def _check_input_ids(input_ids, vocab_size: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex():
        received = f"tensor of dtype {input_ids.dtype}" if isinstance(input_ids, torch.Tensor) else (
            type(input_ids).__name__
        )
        raise TypeError(f"`input_ids` must be an integer torch.Tensor (S, n); got {received}.")
    if input_ids.ndim != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"`input_ids` must have shape (S, n) with S, n >= 1; got {tuple(input_ids.shape)}.")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`input_ids` must lie in [0, {vocab_size - 1}] (the model's vocabulary); "
            f"got values in [{low}, {high}]."
        )


def captured_qkv(loaded, input_ids, *, mode, layer, dtype, chunk_size, positions, device=None):
    """``(q, k, v, layout)``: :func:`capture_attention` in chunks, cast, ``q`` rescaled; ``k, v``
    keep their ``H_kv`` heads (:func:`extract_qkv` repeats them).

    Examples
    --------
    >>> import torch
    >>> from transformers import BertConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.data.capture import captured_qkv
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> loaded = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(1000, 2000, (3, 16), generator=torch.Generator().manual_seed(0))
    >>> q, k, v, layout = captured_qkv(loaded, ids, mode="hidden", layer=0, dtype=torch.float64, chunk_size=2,
    ...                                positions="interpolate")
    >>> q.shape, k.dtype, layout.num_kv_heads  # two forward passes (chunks of 2 and 1 sequences)
    (torch.Size([3, 4, 16, 8]), torch.float64, 4)
    """
    n = input_ids.shape[1]
    layer = check_int(layer, "layer", low=0, high=loaded.num_layers - 1)
    check_positions(positions, loaded.model.config, loaded.architecture, n, loaded.max_positions)
    if chunk_size is None:
        chunk_size = max(1, _TOKENS_PER_CHUNK // n)
    chunk_size = check_int(chunk_size, "chunk_size", low=1)
    model_device = next(loaded.model.parameters()).device
    out_device = model_device if device is None else device
    layout = loaded.attention(layer)
    factor = query_factor(layout)
    outputs = ([], [], [])
    for start in range(0, input_ids.shape[0], chunk_size):
        ids = input_ids[start : start + chunk_size].to(model_device)
        for tensor, out in zip(capture_attention(loaded, ids, layer=layer, mode=mode, positions=positions), outputs):
            out.append(tensor.to(device=out_device, dtype=dtype).contiguous())
    q, k, v = (torch.cat(out, dim=0) for out in outputs)
    return (q if factor is None else q * factor), k, v, layout


def extract_qkv(
    loaded, input_ids, *, mode="hidden", layer=0, device=None, dtype=torch.float32, chunk_size=None,
    positions="interpolate",
):
    r"""Queries, keys and values of one attention layer, as the model computes them, per head.

    Parameters
    ----------
    loaded : LoadedModel
        From :func:`approxlab.data.load_model`.
    input_ids : torch.Tensor
        ``(S, n)`` integer token ids, one sequence per row (no special tokens needed).
    mode : {"hidden", "embedding"}, default "hidden"
        ``"hidden"``: the model's real input to ``layer``; ``"embedding"``: ``layer``'s attention
        applied to the input embeddings (see the module docstring). Equal at ``layer=0``.
    layer : int, default 0
        ``0 <= layer < num_layers``.
    device : str or torch.device, optional
        Where the results are placed (default: the model's device). The computation runs where
        the model lives.
    dtype : torch.float32 or torch.float64, default torch.float32
        dtype of the results (computed in the model's dtype, then cast).
    chunk_size : int, optional
        Sequences per forward pass (default ``max(1, 16384 // n)``), bounding memory.
    positions : {"interpolate", "copy", "none"}, default "interpolate"
        Learned position tables: how positions enter beyond the table
        (:mod:`approxlab.data.positions`); rotary models take only ``"interpolate"`` (their own).

    Returns
    -------
    q, k, v : torch.Tensor
        Each ``(S, num_heads, n, head_dim)``: ``k`` and ``v`` repeated to the query heads, ``q``
        rescaled to the :math:`1/\sqrt p` convention, so that
        ``approxlab.exact_attention(q, k, v, causal=loaded.causal)`` is the layer's attention
        output before its output projection. :meth:`LoadedModel.attention` gives the layer's
        :class:`AttentionLayout` (scaling, causal, sliding window, key/value heads).

    References
    ----------
    .. [1] Devlin et al., "BERT", NAACL 2019, Section 3 (input representation).
    .. [2] Chen et al., "Skyformer", NeurIPS 2021, Section 5.
    .. [3] Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from
       Multi-Head Checkpoints", EMNLP 2023 (grouped-query attention).

    Examples
    --------
    >>> import torch
    >>> from transformers import BertConfig
    >>> import approxlab
    >>> from approxlab.data import extract_qkv, load_model
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> loaded = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(1000, 2000, (2, 40), generator=torch.Generator().manual_seed(0))  # beyond 32 positions
    >>> q, k, v = extract_qkv(loaded, ids, layer=1, dtype=torch.float64)
    >>> q.shape
    torch.Size([2, 4, 40, 8])
    >>> approxlab.exact_attention(q, k, v, causal=loaded.causal).shape  # the layer's attention output, per head
    torch.Size([2, 4, 40, 8])
    """
    if not isinstance(loaded, LoadedModel):
        raise TypeError(f"`loaded` must be a LoadedModel (from load_model); got {type(loaded).__name__}.")
    _check_input_ids(input_ids, int(loaded.model.config.vocab_size))
    check_choice(mode, "mode", MODES)
    check_dtype(dtype)
    device = None if device is None else check_device(device)
    q, k, v, layout = captured_qkv(loaded, input_ids, mode=mode, layer=layer, dtype=dtype, chunk_size=chunk_size,
                                   positions=positions, device=device)
    return q, repeat_kv_heads(k, layout.num_heads), repeat_kv_heads(v, layout.num_heads)
