"""The on-disk cache of per-window Q/K/V: one safetensors file per :class:`QKVKey`."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheWarning
from .capture import DTYPES
from .cache_files import _short_hash, _slug, default_cache_dir, load_cache_file, save_cache_file

__all__ = ["QKVKey", "QKVCache"]


@dataclass(frozen=True)
class QKVKey:
    """Identity of one cached window's Q/K/V.

    ``seed`` is None for pretrained weights; ``dtype`` is ``"float32"`` or ``"float64"``;
    ``corpus`` is the sha256 of the corpus text and ``tokenizer`` the
    :func:`~approxlab.data.tokens.tokenizer_fingerprint` (together they fix the token
    windows); ``init_versions`` records the transformers/torch versions for initialised weights
    (their random initialisation may change between versions) and is ``""`` otherwise;
    ``positions`` is the :data:`~approxlab.data.positions.POSITIONS` choice.

    Examples
    --------
    >>> from approxlab.data import QKVKey
    >>> key = QKVKey(checkpoint="sentence-transformers/all-MiniLM-L6-v2", condition="pretrained", seed=None,
    ...              mode="layer", layer=0, n=512, window=3, dtype="float64", corpus="0123abcd")
    >>> key.as_dict()["window"], key.positions
    (3, 'interpolate')
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

    Each file holds ``q: (num_heads, n, head_dim)`` and ``k, v: (num_kv_heads, n, head_dim)``
    (the key/value heads of a grouped-query model are stored once, not repeated) and, in its
    metadata, the key and a sha256 of the tensors. :meth:`load` detects unreadable or truncated
    files, checksum mismatches and files holding another key, warns with
    :class:`~approxlab.data.wikitext.CacheWarning` and returns None (the caller recomputes).
    :meth:`save` writes atomically (temporary file + ``os.replace``).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Cache root (default ``$APPROXLAB_CACHE`` or ``~/.cache/approxlab``); files go to
        ``root/qkv``.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from approxlab.data import QKVCache, QKVKey
    >>> key = QKVKey(checkpoint="tiny", condition="initialized", seed=0, mode="layer", layer=0, n=8, window=0,
    ...              dtype="float64", corpus="0123abcd")
    >>> q, k, v = (torch.randn(2, 8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    >>> with tempfile.TemporaryDirectory() as root:
    ...     cache = QKVCache(root)
    ...     print(cache.load(key))  # nothing stored yet
    ...     path = cache.save(key, q, k, v)
    ...     q2, k2, v2 = cache.load(key)
    None
    >>> path.name, torch.equal(q2, q) and torch.equal(v2, v)
    ('window00000.safetensors', True)
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
        """``(q, k, v)`` on CPU (shapes as stored, see the class docstring), or None (absent or invalid)."""
        path = self.path(key)
        tensors = load_cache_file(path, key.as_dict(), ("q", "k", "v"))
        if tensors is None:
            return None
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        ok = (
            q.ndim == k.ndim == v.ndim == 3
            and q.shape[1] == k.shape[1] == v.shape[1] == key.n
            and q.shape[2] == k.shape[2] and k.shape[0] == v.shape[0] and q.shape[0] % k.shape[0] == 0
            and all(DTYPES.get(t.dtype) == key.dtype for t in (q, k, v))
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
        """Store ``q: (H, n, p)``, ``k, v: (H_kv, n, p)`` under ``key`` atomically; returns the path."""
        return save_cache_file(self.path(key), {"q": q, "k": k, "v": v}, key.as_dict())
