"""File I/O below every other layer: atomic writes, output-folder locks, result reads, project paths.

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
    output_lock(directory, *, command=None, timeout=0.2)   # context manager
    remove_stale_temp_files(directory) -> list[pathlib.Path]
    OutputLockedError
    project_root() -> pathlib.Path

Output-folder lock
------------------
A study run holds :func:`output_lock` on its output folder: an OS-level lock
(``filelock``, ``flock`` on POSIX) on ``<folder>/.approxlab.lock``, so a second run into
the same folder fails at once with :class:`OutputLockedError`, which names the process
holding it (its id, host, command and start time are written to
``<folder>/.approxlab.lock.json`` after the lock is taken). The operating system drops
the lock when its process dies, so a killed run never leaves a stale lock; its
half-written ``.approxlab-tmp-*`` files are removed by the next run that takes the lock.

Used by :mod:`approxlab.data` (cache files), :mod:`approxlab.plotting` (figures) and
:mod:`approxlab.studies` (results); it imports nothing from approxlab.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import pathlib
import socket
import tempfile
import time

import pandas as pd

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "write_csv_atomic",
    "write_json_atomic",
    "read_results",
    "read_json",
    "TEMP_PREFIX",
    "LOCK_NAME",
    "OutputLockedError",
    "output_lock",
    "remove_stale_temp_files",
    "project_root",
]

TEMP_PREFIX = ".approxlab-tmp-"
"""Prefix of the temporary files; a directory holding one after a run is a bug."""

LOCK_NAME = ".approxlab.lock"
"""Lock file of an output folder (see :func:`output_lock`); ``LOCK_NAME + ".json"`` names its holder."""


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

    Floats are written as their shortest round-trip representation (``repr``), so a table
    re-read with :func:`read_results` compares equal to the one written, and a value the
    study rounded (e.g. to 6 decimals) is written with those digits only.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"`df` must be a pandas.DataFrame; got {type(df).__name__}.")
    buffer = io.StringIO()
    df.to_csv(buffer, index=False)
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


class OutputLockedError(RuntimeError):
    """Another process holds the lock of an output folder (see :func:`output_lock`).

    Attributes
    ----------
    directory : pathlib.Path
        The locked folder.
    owner : dict
        What the holder wrote about itself: ``pid``, ``host``, ``command``, ``started``
        (empty when it could not be read, e.g. written by an older approxlab).
    """

    def __init__(self, directory, owner: dict):
        self.directory = pathlib.Path(directory)
        self.owner = dict(owner)
        super().__init__(f"{str(self.directory)!r} is in use by {self.describe_owner()}")

    def describe_owner(self) -> str:
        """``"process 1234 on host (`approxlab figure1 ...`, since 2026-01-01T00:00:00+00:00)"``."""
        owner = self.owner
        if "pid" not in owner:
            return "another process (its id could not be read)"
        details = [f"`{owner['command']}`" if owner.get("command") else None,
                   f"since {owner['started']}" if owner.get("started") else None]
        details = ", ".join(d for d in details if d)
        return f"process {owner['pid']} on {owner.get('host', '?')}" + (f" ({details})" if details else "")


_HELD: dict[pathlib.Path, list] = {}
"""Output locks this process holds: resolved folder -> [FileLock, depth] (the lock is reentrant)."""


def _read_owner(path: pathlib.Path, wait: float) -> dict:
    # The holder writes its record just after taking the lock; give it a moment.
    deadline = time.monotonic() + wait
    while True:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.05)


def remove_stale_temp_files(directory) -> list[pathlib.Path]:
    """Delete the ``.approxlab-tmp-*`` files in ``directory`` (left by a killed writer).

    Call it only while holding :func:`output_lock` on ``directory`` (a live writer's
    temporary file must not be removed); :func:`output_lock` does so itself.

    Returns
    -------
    list of pathlib.Path
        The files removed.
    """
    removed = []
    for path in sorted(pathlib.Path(directory).glob(TEMP_PREFIX + "*")):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def output_lock(directory, *, command: str | None = None, timeout: float = 0.2):
    """Hold the lock of output folder ``directory`` for the duration of a ``with`` block.

    Creates ``directory`` (and parents), takes the lock within ``timeout`` seconds, writes
    the holder record (process id, host, ``command``, start time) beside it and removes
    stale temporary files (:func:`remove_stale_temp_files`). Reentrant within a process:
    a nested ``output_lock`` on the same folder only counts.

    Parameters
    ----------
    directory : str or os.PathLike
        The output folder.
    command : str, optional
        The command line of this run, shown to a run that finds the folder locked.
    timeout : float
        Seconds to wait for a lock held by another process (``>= 0``).

    Yields
    ------
    list of pathlib.Path
        The stale temporary files removed when the lock was taken (empty when nested).

    Raises
    ------
    OutputLockedError
        If another process holds the lock after ``timeout`` seconds.
    OSError
        If the folder cannot be created or the lock file cannot be written.
    """
    from filelock import FileLock, Timeout

    if not timeout >= 0:
        raise ValueError(f"`timeout` must be >= 0 seconds; got {timeout!r}.")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield []
        finally:
            _HELD[key][1] -= 1
        return
    lock = FileLock(str(key / LOCK_NAME))
    owner_path = key / (LOCK_NAME + ".json")
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise OutputLockedError(directory, _read_owner(owner_path, wait=1.0)) from None
    _HELD[key] = [lock, 1]
    try:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        write_json_atomic({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                           "started": started}, owner_path)
        yield remove_stale_temp_files(key)
    finally:
        del _HELD[key]
        try:
            owner_path.unlink(missing_ok=True)
        finally:
            lock.release()
