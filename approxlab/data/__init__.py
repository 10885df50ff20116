"""Data for the real-data studies: WikiText-2 and BERT queries/keys/values.

- :mod:`approxlab.data.wikitext`: find and verify the corpus (WikiText-2 raw test split, shipped
  with approxlab under CC BY-SA 3.0: :func:`wikitext_attribution`), tokenise it (cached), cut it
  into disjoint windows, pick windows reproducibly.
- :mod:`approxlab.data.qkv`: the ``"initialized"`` / ``"pretrained"`` BERT conditions, Q/K/V
  extraction (``"embedding"`` or ``"hidden"`` mode) and a safetensors cache; :func:`get_qkv` is
  the entry point the studies use.

Typical use::

    from approxlab.data import get_qkv, pick_windows
    qkv = get_qkv("pretrained", 4096, pick_windows(66, 4, seed=0))
    qkv.q.shape   # (4, 12, 4096, 32)
"""

from .qkv import (
    CONDITIONS,
    MINILM_CHECKPOINT,
    MODES,
    QKV,
    LoadedModel,
    QKVCache,
    QKVKey,
    clear_model_memo,
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
    pick_windows,
    tokenize,
    tokenizer_fingerprint,
    wikitext_attribution,
    wikitext_token_ids,
    windows,
)

__all__ = [
    "CONDITIONS",
    "MINILM_CHECKPOINT",
    "MODES",
    "QKV",
    "LoadedModel",
    "QKVCache",
    "QKVKey",
    "clear_model_memo",
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
