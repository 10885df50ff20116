"""What identifies a run and a cell: the config hash, a cell's key, a cell's seed.

A config is hashed in a canonical JSON form (numpy scalars as Python numbers, key order ignored),
so the same grid always has the same :func:`config_hash`, whatever process or version of pandas
built it; a cell's key is its values of the key columns, and :func:`cell_seed` turns such values
into a reproducible 63-bit seed independent of run order, process and executor.

Public API::

    config_hash(config) -> str
    cell_key(cell, key_columns) -> tuple
    cell_seed(*values, base_seed=0) -> int
    canonical(value)
"""

from __future__ import annotations

import hashlib
import json
import numbers
from typing import Sequence

__all__ = ["config_hash", "cell_key", "cell_seed", "canonical"]


def canonical(value):
    """JSON-able, hash-stable form of a config or key value (numpy scalars -> Python)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def config_hash(config: dict) -> str:
    """A 16-hex-digit SHA-256 hash of a grid-defining config (key order does not matter).

    Examples
    --------
    >>> config_hash({"n": [512], "seeds": 3}) == config_hash({"seeds": 3, "n": [512]})
    True
    """
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict; got {type(config).__name__}.")
    text = json.dumps(canonical(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_key(cell: dict, key_columns: Sequence[str]) -> tuple:
    """The key of ``cell``: its values of ``key_columns``, as plain Python scalars."""
    missing = [c for c in key_columns if c not in cell]
    if missing:
        raise KeyError(f"cell {cell!r} lacks key column(s) {missing}; `key_columns`={list(key_columns)}.")
    return tuple(canonical(cell[c]) for c in key_columns)


def cell_seed(*values, base_seed: int = 0) -> int:
    """A reproducible 63-bit seed derived from ``values`` (e.g. a cell's key) and ``base_seed``.

    Independent of run order, process and executor: ``cell_seed("pretrained", 512, 3)``
    is the same integer everywhere. Use it as ``torch.Generator().manual_seed(seed)``.

    Examples
    --------
    >>> cell_seed("a", 1) == cell_seed("a", 1) != cell_seed("a", 2)
    True
    """
    text = json.dumps([canonical(base_seed), canonical(list(values))], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
