r"""What one layer's attention does with its queries and keys, read from the model's own module.

transformers' attention modules carry the facts an attention function is called with: the logit
``scaling``, ``is_causal``, a ``sliding_window`` where the layer has one, and the head geometry.
:func:`layout_of` reads them from a loaded model; :func:`config_layout` from a model built on
PyTorch's ``meta`` device (no memory, no weights), so they are known before anything is loaded
and for Q/K/V that come from the cache. :mod:`approxlab.data.capture` checks, when it records a
layer, that what transformers passes to the attention function agrees with them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch

__all__ = ["AttentionLayout", "get_attribute", "attention_module", "layout_of", "config_layout",
           "output_projection_of"]


@dataclass(frozen=True)
class AttentionLayout:
    """What one layer's attention does with its Q/K/V (read from the model's own module).

    Attributes
    ----------
    causal : bool
        Query :math:`i` attends keys :math:`j \\le i` only (a decoder).
    scaling : float
        The model's logit scale :math:`s` in :math:`\\operatorname{softmax}(s\\,QK^\\top)`.
    sliding_window : int or None
        Keys further back than this many positions are masked (Gemma 3's local layers).
    num_heads, num_kv_heads, head_dim : int
        Query heads, key/value heads (fewer with grouped-query attention) and their width.

    Examples
    --------
    >>> from transformers import BertConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.layout import config_layout
    >>> layout = config_layout(BertConfig(hidden_size=64, num_attention_heads=4), ARCHITECTURES["bert"], 0)
    >>> layout.causal, layout.scaling, layout.num_heads, layout.num_kv_heads, layout.head_dim
    (False, 0.25, 4, 4, 16)
    """

    causal: bool
    scaling: float
    sliding_window: int | None
    num_heads: int
    num_kv_heads: int
    head_dim: int


def get_attribute(root, dotted: str):
    """The attribute at the dotted path ``dotted`` below ``root`` (``"encoder.layer"``: ``root.encoder.layer``).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from approxlab.data.layout import get_attribute
    >>> model = SimpleNamespace(encoder=SimpleNamespace(layer=["layer 0", "layer 1"]))
    >>> get_attribute(model, "encoder.layer")
    ['layer 0', 'layer 1']
    """
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def attention_module(model, architecture, layer: int):
    """The module of layer ``layer`` that calls the attention function.

    Examples
    --------
    >>> from transformers import BertConfig, BertModel
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.layout import attention_module
    >>> config = BertConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)
    >>> type(attention_module(BertModel(config), ARCHITECTURES["bert"], 1)).__name__
    'BertSelfAttention'
    """
    return get_attribute(get_attribute(model, architecture.layers)[layer], architecture.attention)


def layout_of(module, config) -> AttentionLayout:
    """The :class:`AttentionLayout` of an attention module of a model with ``config``.

    Examples
    --------
    >>> from transformers import BertConfig, BertModel
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.layout import attention_module, layout_of
    >>> config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    >>> module = attention_module(BertModel(config), ARCHITECTURES["bert"], 0)
    >>> layout = layout_of(module, config)
    >>> layout.causal, layout.num_heads, layout.head_dim, round(layout.scaling, 4)  # 1 / sqrt(4)
    (False, 2, 4, 0.5)
    """
    heads = int(config.num_attention_heads)
    head_dim = getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)
    return AttentionLayout(
        causal=bool(getattr(module, "is_causal", False)),
        scaling=float(module.scaling),
        sliding_window=getattr(module, "sliding_window", None),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
    )


def output_projection_of(module, layout: AttentionLayout) -> torch.Tensor:
    r"""The attention module's output projection per query head, ``(H, p_v, d)``: head :math:`h`'s block of
    :math:`W_O^\top` (the rows of ``o_proj.weight.T`` -- Llama, Qwen, Gemma -- or of GPT-2's ``c_proj.weight``, a
    ``Conv1D`` stored transposed, that multiply head :math:`h`'s output), detached.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from approxlab.data.layout import AttentionLayout, output_projection_of
    >>> module = SimpleNamespace(o_proj=torch.nn.Linear(6, 5, bias=False))  # 2 heads of width 3 -> d = 5
    >>> layout = AttentionLayout(True, 1.0, None, num_heads=2, num_kv_heads=1, head_dim=3)
    >>> blocks = output_projection_of(module, layout)
    >>> blocks.shape, torch.equal(blocks[1], module.o_proj.weight.T[3:])
    (torch.Size([2, 3, 5]), True)
    """
    if getattr(module, "o_proj", None) is not None:
        weight = module.o_proj.weight.T  # nn.Linear stores (d, H p_v)
    elif getattr(module, "c_proj", None) is not None:
        weight = module.c_proj.weight  # GPT-2's Conv1D stores (H p_v, d)
    else:
        raise ValueError(f"the attention module {type(module).__name__} has no output projection approxlab knows "
                         "(o_proj or c_proj); pass output_projection=... yourself.")
    return weight.detach().reshape(layout.num_heads, layout.head_dim, -1)


def config_layout(config, architecture, layer: int) -> AttentionLayout:
    """:func:`layout_of` layer ``layer`` of a model built from ``config`` without weights (meta device).

    Examples
    --------
    >>> from transformers import BertConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.layout import config_layout
    >>> config = BertConfig(hidden_size=384, num_attention_heads=12, num_hidden_layers=6)  # MiniLM's shape
    >>> config_layout(config, ARCHITECTURES["bert"], 5).head_dim  # no weights allocated (meta device)
    32
    """
    return _config_layout(config.to_json_string(use_diff=False), architecture, layer)


@functools.lru_cache(maxsize=64)
def _config_layout(config_json: str, architecture, layer: int) -> AttentionLayout:
    import transformers

    config_class = transformers.AutoConfig.for_model(json.loads(config_json)["model_type"]).__class__
    config = config_class.from_dict(json.loads(config_json))
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = getattr(transformers, architecture.model_class)(config)
    return layout_of(attention_module(model, architecture, layer), config)
