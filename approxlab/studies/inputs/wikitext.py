"""The WikiText-2 inputs the studies share: windows, seeds, Q/K/V and exact references, cached per process.

* :func:`draw_windows` -- which windows of the corpus a run uses: ``count`` ids drawn without
  replacement from ``range(pool)`` by a generator seeded with ``seed``, sorted (the same ids for
  every length whose windows the pool holds);
* :func:`method_seeds` -- the seeds a method runs with: ``0 .. seeds-1`` when it is randomized,
  ``[0]`` when it is deterministic;
* :class:`Window` and :func:`qkv` -- the Q/K/V of one window (:func:`approxlab.data.get_qkv`,
  cached on disk by the data layer and here, per process, for the two windows last used);
* :func:`reference` -- Q/K/V in a working precision, their exact softmax attention (causal or not,
  its first ``n`` rows of a longer window when asked: in a causal model the first ``n`` positions
  of a window see only each other) and the output's spectral norm per head, cached per process;
  cells that share a window are adjacent, so an in-process run computes each once and a Dask
  worker at most once per window it sees.

Tests replace :func:`load_qkv` (the one place the data layer is called) with synthetic Q/K/V.

Public API::

    Window(condition, n, window, mode="embedding", layer=0, model_seed=0, data_dir=None, cache_dir=None,
           device="cpu", positions="interpolate", checkpoint=None, dtype="float32")
    draw_windows(pool, count, seed) -> list[int]
    method_seeds(seeds, method) -> list[int]
    load_qkv(window), qkv(window)             # a record with q, k, v (1, heads, n, p), input_ids, checkpoint
    reference(window, n=None, dtype="float64", causal=False, dense_max_n=DENSE_MAX_N) -> dict
    num_layers(condition, checkpoint=None) -> int
    clear_caches()
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ...metrics import spectral_norm

__all__ = ["Window", "DENSE_MAX_N", "draw_windows", "method_seeds", "load_qkv", "qkv", "reference", "num_layers",
           "clear_caches"]

DENSE_MAX_N = 4096
"""Above this n, :func:`reference` applies exact attention in row blocks (never n x n in memory)."""


@dataclasses.dataclass(frozen=True)
class Window:
    """What identifies one window's Q/K/V: the model condition, length, window id and how X is built.

    ``mode``: ``"embedding"`` (BERT's input embedding through ``layer``'s projections) or ``"hidden"``
    (the hidden states entering ``layer``); ``dtype``: the precision the Q/K/V are extracted in.
    See :func:`approxlab.data.get_qkv`.
    """

    condition: str
    n: int
    window: int
    mode: str = "embedding"
    layer: int = 0
    model_seed: int = 0
    data_dir: str | None = None
    cache_dir: str | None = None
    device: str = "cpu"
    positions: str = "interpolate"
    checkpoint: str | None = None
    dtype: str = "float32"


def draw_windows(pool: int, count: int, seed: int) -> list[int]:
    """``count`` window ids drawn without replacement from ``range(pool)`` (generator seeded by ``seed``), sorted.

    Examples
    --------
    >>> draw_windows(64, 4, 0) == draw_windows(64, 4, 0)
    True
    >>> len(set(draw_windows(64, 4, 0))), all(0 <= i < 64 for i in draw_windows(64, 4, 0))
    (4, True)
    """
    generator = torch.Generator().manual_seed(int(seed))
    return sorted(int(i) for i in torch.randperm(int(pool), generator=generator)[: int(count)])


def method_seeds(seeds: int, method: str) -> list[int]:
    """The seeds ``method`` runs with: ``range(seeds)`` if it is randomized, else ``[0]``."""
    from ...methods import get

    return list(range(int(seeds))) if get(method).randomized else [0]


def load_qkv(window: Window):
    """Q/K/V of ``window`` from the data layer (:func:`approxlab.data.get_qkv`; tests replace this)."""
    from ...data import get_qkv

    return get_qkv(window.condition, window.n, [window.window], mode=window.mode, layer=window.layer,
                   seed=window.model_seed, data_dir=window.data_dir, cache_dir=window.cache_dir,
                   device=window.device, dtype=getattr(torch, window.dtype), positions=window.positions,
                   checkpoint=window.checkpoint)


@functools.lru_cache(maxsize=2)
def qkv(window: Window):
    """:func:`load_qkv`, cached per process for the two windows last used."""
    return load_qkv(window)


@functools.lru_cache(maxsize=4)
def rotary_frequencies(window: Window):
    """The RoPE frequencies ``(p // 2,)`` of ``window``'s layer (the rotary ``inv_freq`` transformers builds from the
    model's config, no weights read), or None for a model without RoPE: its captured ``q``, ``k`` are after RoPE."""
    from ...data.checkpoints import load_config
    from ...data.rope import rotary_frequencies_of_config

    if not qkv(window).rotary:
        return None
    config = load_config(window.checkpoint, None, window.cache_dir)[3]
    return rotary_frequencies_of_config(config, window.layer)


@functools.lru_cache(maxsize=2)
def reference(window: Window, n: int | None = None, dtype: str = "float64", causal: bool = False,
              dense_max_n: int = DENSE_MAX_N) -> dict:
    """Q, K, V ``(heads, n, p)`` of ``window`` in ``dtype`` (its first ``n`` positions), their exact
    attention output ``(heads, n, p_v)`` and its spectral norm per head (float64).

    All heads go through the fused kernel in one call (:func:`approxlab.exact_attention`); above
    ``dense_max_n`` (non-causal) each head is applied as an
    :class:`~approxlab.operators.ExactAttentionOperator` in row blocks, so memory stays O(n * block)
    instead of O(n^2) (the same numbers up to rounding).

    Returns
    -------
    dict
        ``q``, ``k``, ``v``, ``output``, ``output_norm`` and ``checkpoint`` (the model's name).
    """
    from ...attention import exact_attention
    from ...operators import ExactAttentionOperator

    record = qkv(window)
    n = window.n if n is None else int(n)
    q, k, v = (x[0, :, :n].to(getattr(torch, dtype)).contiguous() for x in (record.q, record.k, record.v))
    if n > dense_max_n and not causal:
        output = torch.stack([ExactAttentionOperator(q[h], k[h], "softmax").matmat(v[h]) for h in range(q.shape[0])])
    else:
        output = exact_attention(q, k, v, causal=causal)
    return {"q": q, "k": k, "v": v, "output": output, "output_norm": spectral_norm(output.detach().cpu()),
            "checkpoint": str(record.checkpoint)}


@functools.lru_cache(maxsize=4)
def num_layers(condition: str, checkpoint=None) -> int:
    """Layers of the condition's model, read from its config (no weights are built)."""
    from transformers import AutoConfig, BertConfig

    if condition == "initialized" and checkpoint is None:
        return int(BertConfig().num_hidden_layers)
    from ...data import minilm_path

    return int(AutoConfig.from_pretrained(str(checkpoint or minilm_path())).num_hidden_layers)


def clear_caches() -> None:
    """Empty the per-process caches (:func:`qkv`, :func:`reference`)."""
    qkv.cache_clear()
    reference.cache_clear()
