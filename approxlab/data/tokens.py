r"""WikiText-2 as token ids: tokenise the corpus, cut it into windows, pick windows reproducibly.

:func:`wikitext_token_ids` tokenises the corpus of :mod:`approxlab.data.wikitext` once per
(corpus, tokenizer) and caches the ids under the cache directory (``$APPROXLAB_CACHE`` or
``~/.cache/approxlab``), keyed by the corpus checksum (:func:`~approxlab.data.wikitext.corpus_sha256`)
and the tokenizer's fingerprint (:func:`tokenizer_fingerprint`: its class and serialised vocabulary,
so two tokenizers that split text alike share ids and any change of vocabulary recomputes them).
Cache files are safetensors with the key and a content checksum in their metadata
(:mod:`approxlab.data.cache_files`); a corrupt or mismatched file is reported with
:class:`~approxlab.errors.CacheWarning` and recomputed, never silently used.

:func:`windows` cuts the ids into non-overlapping length-``n`` windows, ``(num_windows, n)``;
:func:`pick_windows` draws which windows a study uses from an explicit seed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from .._validation import as_generator, check_int
from .cache_files import _short_hash, _slug, default_cache_dir, load_cache_file, save_cache_file
from .wikitext import corpus_sha256, load_wikitext

__all__ = ["tokenize", "windows", "pick_windows", "tokenizer_fingerprint", "wikitext_token_ids"]

_LINES_PER_BATCH = 1024


def tokenize(text, tokenizer) -> torch.Tensor:
    """Token ids of ``text`` without special tokens.

    Parameters
    ----------
    text : str
        The corpus (e.g. from :func:`load_wikitext`).
    tokenizer : transformers.PreTrainedTokenizerBase
        A Hugging Face tokenizer (e.g. the BERT uncased WordPiece tokenizer).

    Returns
    -------
    torch.LongTensor
        ``(num_tokens,)`` ids, line after line; no ``[CLS]``/``[SEP]``.

    Notes
    -----
    The text is encoded line by line (in batches of lines) with ``verbose=False``, so the
    tokenizer never warns that a sequence exceeds its ``model_max_length``: the corpus is one
    long stream that is cut into windows afterwards. For whitespace-splitting tokenizers such
    as BERT's WordPiece, encoding line by line gives the same ids as encoding the whole text
    at once (line breaks carry no token).

    Examples
    --------
    >>> from transformers import AutoTokenizer
    >>> from approxlab.data import minilm_path, tokenize
    >>> tokenizer = AutoTokenizer.from_pretrained(minilm_path())  # BERT uncased WordPiece
    >>> ids = tokenize("Robert Boulter is an English actor.", tokenizer)
    >>> tokenizer.convert_ids_to_tokens(ids)
    ['robert', 'bo', '##ult', '##er', 'is', 'an', 'english', 'actor', '.']
    """
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
    if not callable(tokenizer):
        raise TypeError(
            "`tokenizer` must be a Hugging Face tokenizer (callable on a list of strings); "
            f"got {type(tokenizer).__name__}."
        )
    lines = [line for line in text.split("\n") if line.strip()]
    ids: list[int] = []
    for start in range(0, len(lines), _LINES_PER_BATCH):
        encoded = tokenizer(
            lines[start : start + _LINES_PER_BATCH],
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )["input_ids"]
        for row in encoded:
            ids.extend(row)
    return torch.tensor(ids, dtype=torch.long)


def windows(ids, n) -> torch.Tensor:
    """Cut a token stream into disjoint, consecutive windows of ``n`` tokens.

    Parameters
    ----------
    ids : torch.Tensor
        ``(num_tokens,)`` integer token ids.
    n : int
        Window length (sequence length of the attention matrices), ``1 <= n <= num_tokens``.

    Returns
    -------
    torch.Tensor
        ``(num_windows, n)`` with ``num_windows = num_tokens // n``; row ``i`` is
        ``ids[i*n:(i+1)*n]``. The trailing ``num_tokens % n`` tokens are dropped. A view of ``ids``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.data import windows
    >>> windows(torch.arange(10), 4)  # the last 10 % 4 tokens are dropped
    tensor([[0, 1, 2, 3],
            [4, 5, 6, 7]])
    """
    if not isinstance(ids, torch.Tensor) or ids.ndim != 1 or ids.is_floating_point() or ids.is_complex():
        raise TypeError(
            "`ids` must be a 1-D integer torch.Tensor (num_tokens,); got "
            f"{type(ids).__name__}{tuple(ids.shape) if isinstance(ids, torch.Tensor) else ''}."
        )
    n = check_int(n, "n", low=1, high=ids.numel())
    count = ids.numel() // n
    return ids[: count * n].view(count, n)


def pick_windows(num_available, count, *, seed) -> list[int]:
    """Choose ``count`` distinct window indices out of ``range(num_available)``, reproducibly.

    Parameters
    ----------
    num_available : int
        Number of windows, e.g. ``windows(ids, n).shape[0]``.
    count : int
        How many to pick, ``1 <= count <= num_available``.
    seed : int
        Seed of a private ``torch.Generator`` (global RNG is not touched).

    Returns
    -------
    list of int
        Indices in draw order: the first ``count`` entries of a uniformly random permutation.
        Hence ``pick_windows(N, c, seed=s)`` is a prefix of ``pick_windows(N, c + 1, seed=s)``.

    Examples
    --------
    >>> from approxlab.data import pick_windows
    >>> first = pick_windows(66, 3, seed=0)
    >>> len(set(first)), all(0 <= i < 66 for i in first)
    (3, True)
    >>> pick_windows(66, 4, seed=0)[:3] == first  # one more window keeps the first ones
    True
    """
    num_available = check_int(num_available, "num_available", low=1)
    count = check_int(count, "count", low=1, high=num_available)
    seed = check_int(seed, "seed", low=0)
    generator = as_generator(seed=seed)
    return torch.randperm(num_available, generator=generator)[:count].tolist()


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of what fixes a tokenizer's ids: class, normalizer, pre-tokenizer, vocabulary.

    Transient state (truncation and padding settings, which Hugging Face changes on every call)
    and what only matters with special tokens or decoding are left out, so the fingerprint is
    the same before and after the tokenizer is used.

    Examples
    --------
    >>> from transformers import AutoTokenizer
    >>> from approxlab.data import minilm_path, tokenizer_fingerprint
    >>> tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    >>> fingerprint = tokenizer_fingerprint(tokenizer)
    >>> len(fingerprint)
    16
    >>> _ = tokenizer(["a long line"], truncation=True, max_length=4)  # use changes nothing
    >>> tokenizer_fingerprint(tokenizer) == fingerprint
    True
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        return _backend_fingerprint(type(tokenizer).__name__, backend.to_str())
    description = json.dumps(
        {
            "vocab": sorted(tokenizer.get_vocab().items()),
            "lower": getattr(tokenizer, "do_lower_case", None),
        }
    )
    return _short_hash(f"{type(tokenizer).__name__}|{description}", 16)


@functools.lru_cache(maxsize=8)
def _backend_fingerprint(class_name: str, serialized: str) -> str:
    """:func:`tokenizer_fingerprint` of a fast tokenizer from its full serialisation (memoised:
    re-encoding the vocabulary costs ~30 ms, and studies ask once per window)."""
    state = json.loads(serialized)
    kept = ("normalizer", "pre_tokenizer", "model", "added_tokens")
    description = json.dumps({name: state.get(name) for name in kept}, sort_keys=True)
    return _short_hash(f"{class_name}|{description}", 16)


def wikitext_token_ids(tokenizer, *, data_dir=None, cache_dir=None, verify=True) -> torch.Tensor:
    """Token ids of the WikiText-2 test split, cached on disk.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        Tokenizer; see :func:`tokenize`.
    data_dir, verify :
        See :func:`load_wikitext`.
    cache_dir : str or os.PathLike, optional
        Cache root (default :func:`default_cache_dir`); files go to ``<cache_dir>/tokens``.

    Returns
    -------
    torch.LongTensor
        ``(num_tokens,)``; 273,178 tokens with the BERT uncased vocabulary (66 windows of 4,096).

    Warns
    -----
    CacheWarning
        When a cache file exists but is corrupt or holds another key (it is recomputed).

    Notes
    -----
    The cache key is the sha256 of the (LF-normalised) corpus text together with the
    tokenizer's name and :func:`tokenizer_fingerprint`.

    Examples
    --------
    >>> import tempfile
    >>> from transformers import AutoTokenizer
    >>> from approxlab.data import minilm_path, wikitext_token_ids, windows
    >>> tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     ids = wikitext_token_ids(tokenizer, cache_dir=cache)  # tokenised once, then read from the cache
    >>> ids.shape, windows(ids, 4096).shape
    (torch.Size([273178]), torch.Size([66, 4096]))
    """
    text = load_wikitext(data_dir, verify=verify, cache_dir=cache_dir)
    corpus_sha = corpus_sha256(text)
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    fingerprint = tokenizer_fingerprint(tokenizer)
    key = {"kind": "wikitext2-test-token-ids", "corpus_sha256": corpus_sha, "tokenizer": fingerprint}
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = root / "tokens" / f"wikitext2-test-{corpus_sha[:12]}-{_slug(name)}-{fingerprint}.safetensors"
    cached = load_cache_file(path, key, ["input_ids"])
    if cached is not None:
        return cached["input_ids"]
    ids = tokenize(text, tokenizer)
    save_cache_file(path, {"input_ids": ids}, key)
    return ids
