"""Atomic writes, below every other layer: a file is replaced whole or not at all.

Every file approxlab writes (results, figures, cache files) goes through one of these helpers:
the bytes go to a temporary file in the *same directory*, are flushed and ``fsync``-ed, and the
temporary file is moved over the target with :func:`os.replace` (atomic on POSIX and Windows). A
reader, or a run killed with Ctrl-C, therefore sees either the old file or the new one, never a
half-written one, and no temporary file is left behind (it is removed when the write fails). An
``OSError`` of the write that names no file (a full disk at ``write`` or ``fsync``) is raised
again naming the target, so that whoever reports it can say which file and folder.

Public API::

    atomic_write_bytes(path, data) -> pathlib.Path
    atomic_write_text(path, text, encoding="utf-8") -> pathlib.Path
    write_csv_atomic(df, path) -> pathlib.Path
    write_json_atomic(obj, path) -> pathlib.Path
    fsync_directory(directory)
    naming(path)                      # an OSError of a write, raised again with the file named
    TEMP_PREFIX

Used by :mod:`approxlab.data` (cache files), :mod:`approxlab.plotting` (figures) and
:mod:`approxlab.studies` (whose engine keeps the results tables, their journals and the
output-folder lock); it imports nothing from approxlab.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import os
import pathlib
import tempfile

import pandas as pd

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_csv_atomic", "write_json_atomic", "fsync_directory",
           "naming", "compression", "TABLE_SUFFIXES", "TEMP_PREFIX"]

_COMPRESSIONS = {".gz": ("gzip", lambda data: gzip.compress(data, mtime=0), gzip.decompress),
                 ".bz2": ("bzip2", lambda data: bz2.compress(data, 9), bz2.decompress)}

TABLE_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2")
"""The names a table may end in: plain CSV, or CSV compressed with gzip or bzip2 (one too large to commit as text;
bzip2 packs the long float columns of a table about 10% smaller than gzip, at about the same speed)."""


def compression(path):
    """``(format, compress, decompress)`` of a table at ``path``, by its suffix (``.gz``: gzip, with no file name and a
    zero time stamp in its header; ``.bz2``: bzip2, level 9, which has neither), so that the same table always gives the
    same bytes; ``None`` for plain text."""
    return _COMPRESSIONS.get(pathlib.PurePath(path).suffix)


TEMP_PREFIX = ".approxlab-tmp-"
"""Prefix of the temporary files; a directory holding one after a run is a bug (the engine of
:mod:`approxlab.studies` removes those a killed run left when it takes the folder's lock)."""


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_file_mode()


@contextlib.contextmanager
def naming(path):
    """An ``OSError`` of the block that names no file (``ENOSPC`` at ``write`` or ``fsync``) is raised again
    with ``path`` as its ``filename`` (same type, ``errno`` and message), chained to the original."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise type(error)(error.errno, error.strerror or str(error), str(path)) from error


def fsync_directory(directory: pathlib.Path) -> None:
    """Make a rename or a new file in ``directory`` durable (``fsync`` of the folder; POSIX only)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, data: bytes) -> pathlib.Path:
    """Write ``data`` to ``path`` atomically (temp file in the same dir, fsync, ``os.replace``).

    Parameters
    ----------
    path : str or os.PathLike
        Target file; its parent directories are created.
    data : bytes
        The full new content.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"`data` must be bytes; got {type(data).__name__}.")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=path.suffix, dir=path.parent)
    try:
        with naming(path):
            os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; results are ordinary shared files
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    except BaseException:
        # Includes KeyboardInterrupt: never leave a temporary file behind.
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    with naming(path.parent):
        fsync_directory(path.parent)
    return path


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> pathlib.Path:
    """Write ``text`` to ``path`` atomically; see :func:`atomic_write_bytes`."""
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
    return atomic_write_bytes(path, text.encode(encoding))


def write_csv_atomic(df: pd.DataFrame, path) -> pathlib.Path:
    """Write a tidy table as CSV (no index column) atomically.

    Floats are written as their shortest round-trip representation (``repr``), so a table
    re-read with :func:`approxlab.studies.engine.read_results` compares equal to the one written, and a value the
    study rounded (e.g. to 6 decimals) is written with those digits only. A ``path`` ending in ``.gz``
    or ``.bz2`` gets the CSV compressed (:func:`compression`), so the same table always gives the same bytes (a table
    too large to commit as text: ``spectra.csv.gz``, Figure 1's ``results.csv.bz2``).
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"`df` must be a pandas.DataFrame; got {type(df).__name__}.")
    buffer = io.StringIO()
    df.to_csv(buffer, index=False)
    codec = compression(path)
    if codec:
        return atomic_write_bytes(path, codec[1](buffer.getvalue().encode("utf-8")))
    return atomic_write_text(path, buffer.getvalue())


def write_json_atomic(obj, path) -> pathlib.Path:
    """Write ``obj`` as indented, key-sorted JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
