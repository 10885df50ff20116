r"""A model's rotary embedding (RoPE): the frequencies :math:`\theta_i` its attention rotates queries and keys by.

Cache policies that undo or average the rotation (expected attention, CAP, the leverage scores, Compactor) need
them (:func:`approxlab.cache._scores.model_inputs`). They are read from the rotary module's ``inv_freq`` buffer,
which transformers computes from the config for every RoPE type (the default :math:`\beta^{-2i/p}`, Llama 3's
scaled RoPE, YaRN), so a scaled RoPE is covered; a model without RoPE (BERT, GPT-2) has none.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["rotary_frequencies_of_module", "rotary_frequencies_of_config"]


def _layer_type(config, layer: int):
    types = getattr(config, "layer_types", None)
    return None if not types else types[layer]


def _read(rotary, config, layer: int):
    """``inv_freq`` of ``rotary`` for ``layer`` (Gemma 3 keeps one per layer type: ``{type}_inv_freq``)."""
    layer_type = _layer_type(config, layer)
    frequencies = getattr(rotary, f"{layer_type}_inv_freq", None) if layer_type else None
    frequencies = getattr(rotary, "inv_freq", None) if frequencies is None else frequencies
    return None if frequencies is None else frequencies.detach().clone()


def rotary_frequencies_of_module(base: torch.nn.Module, layer: int):
    """The RoPE frequencies ``(p // 2,)`` of ``layer`` in a bare transformers model ``base`` (its ``rotary_emb``),
    or None without a rotary embedding.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaModel
    >>> config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32,
    ...                      vocab_size=32, rope_theta=10000.0)
    >>> frequencies = rotary_frequencies_of_module(LlamaModel(config), 0)
    >>> frequencies.shape, bool(torch.allclose(frequencies.double(), 10000.0 ** -(torch.arange(0, 8, 2) / 8).double()))
    (torch.Size([4]), True)
    """
    rotary = getattr(base, "rotary_emb", None)
    return None if rotary is None else _read(rotary, base.config, layer)


def rotary_frequencies_of_config(config, layer: int):
    """The RoPE frequencies ``(p // 2,)`` of ``layer`` of a model of ``config`` (its rotary module built from the
    config alone, no weights), or None for a family without one.

    Examples
    --------
    >>> from transformers import BertConfig, LlamaConfig
    >>> config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32,
    ...                      vocab_size=32, rope_theta=10000.0)
    >>> rotary_frequencies_of_config(config, 0).shape, rotary_frequencies_of_config(BertConfig(), 0)
    (torch.Size([4]), None)
    """
    config = getattr(config, "get_text_config", lambda: config)()
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    prefix = type(config).__name__.removesuffix("Config")
    names = [f"{prefix}RotaryEmbedding"] + sorted(n for n in dir(module) if n.endswith("RotaryEmbedding"))
    found = next((getattr(module, n) for n in names if hasattr(module, n)), None)
    return None if found is None else _read(found(config=config), config, layer)
