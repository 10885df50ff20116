"""The files of a results table split by a key column: one per value (``results.length=2048.csv.gz``, ...).

A table declared with a ``split`` column (:class:`~approxlab.studies.declaration.Table`) is written by
:func:`~approxlab.studies.engine.store.write_table` one file per value of that column, each with its own cell
manifest, so that no file of a growing run passes the size a repository takes. This module names those files and
finds them; the store reads and writes them.

Public API::

    part_path(path, column, value) -> pathlib.Path
    part_paths(path) -> list[pathlib.Path]
    base_and_suffix(path) -> (str, str)
"""

from __future__ import annotations

import pathlib

from .keys import canonical

__all__ = ["part_path", "part_paths", "base_and_suffix"]


def base_and_suffix(path: pathlib.Path) -> tuple[str, str]:
    """``("results", ".csv.gz")`` for ``results.csv.gz``: the name before its table suffix, and the suffix."""
    base = path.name[:path.name.rindex(".csv")]  # every table suffix begins with ".csv"
    return base, path.name[len(base):]


def part_path(path, column: str, value) -> pathlib.Path:
    """The file of the rows of table ``path`` whose ``column`` is ``value``: ``results.length=2048.csv.gz``.

    Examples
    --------
    >>> part_path("out/results.csv.gz", "length", 2048).as_posix()
    'out/results.length=2048.csv.gz'
    """
    path = pathlib.Path(path)
    text = str(canonical(value))
    if not text or any(char in text for char in "/\\\0") or text in (".", ".."):
        raise ValueError(f"a value of the split column {column!r} must make a file name; got {value!r}.")
    base, suffix = base_and_suffix(path)
    return path.with_name(f"{base}.{column}={text}{suffix}")


def part_paths(path) -> list[pathlib.Path]:
    """The saved parts of table ``path`` split by a column (:func:`part_path`), in the order of their values: numbers
    by size, then text; ``[]`` for a table saved whole or not at all."""
    path = pathlib.Path(path)
    base, suffix = base_and_suffix(path)
    if not path.parent.is_dir():
        return []
    prefix = f"{base}."
    found = [file for file in path.parent.iterdir() if file.name.startswith(prefix) and file.name.endswith(suffix)
             and "=" in file.name[len(prefix):-len(suffix)] and file.is_file()]
    return sorted(found, key=lambda file: _value_order(file.name[len(prefix):-len(suffix)].split("=", 1)[1]))


def _value_order(text: str):
    try:
        return 0, float(text), text
    except ValueError:
        return 1, 0.0, text
