"""File I/O below every other layer: atomic writes, result-table reads, project paths.

Every file a study writes goes through one of these helpers: the bytes go to a
temporary file in the *same directory*, are flushed and ``fsync``-ed, and the
temporary file is moved over the target with :func:`os.replace` (atomic on POSIX
and Windows). A reader, or a run killed with Ctrl-C, therefore sees either the
old file or the new one, never a half-written one, and no temporary file is left
behind (it is removed when the write fails).

Public API::

    atomic_write_bytes(path, data) -> pathlib.Path
    atomic_write_text(path, text, encoding="utf-8") -> pathlib.Path
    write_csv_atomic(df, path) -> pathlib.Path
    write_json_atomic(obj, path) -> pathlib.Path
    read_results(path) -> pandas.DataFrame
    read_json(path) -> dict
    project_root() -> pathlib.Path

Used by :mod:`approxlab.data` (cache files), :mod:`approxlab.plotting` (figures) and
:mod:`approxlab.studies` (results); it imports nothing from approxlab.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import tempfile

import pandas as pd

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "write_csv_atomic",
    "write_json_atomic",
    "read_results",
    "read_json",
    "TEMP_PREFIX",
    "project_root",
]

TEMP_PREFIX = ".approxlab-tmp-"
"""Prefix of the temporary files; a directory holding one after a run is a bug."""


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_file_mode()


def _fsync_directory(directory: pathlib.Path) -> None:
    # Persist the rename itself; not possible (nor needed) on every platform.
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
    _fsync_directory(path.parent)
    return path


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> pathlib.Path:
    """Write ``text`` to ``path`` atomically; see :func:`atomic_write_bytes`."""
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
    return atomic_write_bytes(path, text.encode(encoding))


def write_csv_atomic(df: pd.DataFrame, path) -> pathlib.Path:
    """Write a tidy table as CSV (no index column) atomically.

    Floats are written with full round-trip precision so that a table re-read with
    :func:`read_results` compares equal to the one written.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"`df` must be a pandas.DataFrame; got {type(df).__name__}.")
    buffer = io.StringIO()
    df.to_csv(buffer, index=False, float_format="%.17g")
    return atomic_write_text(path, buffer.getvalue())


def write_json_atomic(obj, path) -> pathlib.Path:
    """Write ``obj`` as indented, key-sorted JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_results(path) -> pd.DataFrame:
    """Read a results table written by :func:`write_csv_atomic`.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist; the message says to run the compute step first.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"results table {str(path)!r} does not exist; run the study's compute step first "
            "(without --plot-only)."
        )
    if path.stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(path)


def read_json(path) -> dict:
    """Read a JSON file written by :func:`write_json_atomic`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist; run the study's compute step first.")
    return json.loads(path.read_text(encoding="utf-8"))


def project_root() -> pathlib.Path:
    """The source checkout holding ``approxlab`` (with ``pyproject.toml``), else the CWD.

    Default output directories are resolved against it, so a study writes to the same
    ``figures/<study>/`` wherever it is started from.
    """
    root = pathlib.Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else pathlib.Path.cwd()
