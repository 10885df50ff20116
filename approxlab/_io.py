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
    write_table(df, path, key_columns) -> pathlib.Path     # a results table and its cell manifest
    write_json_atomic(obj, path) -> pathlib.Path
    read_results(path, *, required=(), partial="error") -> pandas.DataFrame
    read_json(path) -> dict
    append_journal(path, record), read_journal(path), remove_journal(path), has_results(path)
    output_lock(directory, *, command=None, timeout=0.2)   # context manager
    remove_stale_temp_files(directory) -> list[pathlib.Path]
    OutputLockedError

Output-folder lock
------------------
A study run holds :func:`output_lock` on its output folder: an OS-level lock
(``filelock``, ``flock`` on POSIX) on ``<folder>/.approxlab.lock``, so a second run into
the same folder fails at once with :class:`OutputLockedError`, which names the process
holding it (its id, host, command and start time are written to
``<folder>/.approxlab.lock.json`` after the lock is taken). The operating system drops
the lock when its process dies, so a killed run never leaves a stale lock; its
half-written ``.approxlab-tmp-*`` files are removed by the next run that takes the lock.

Results journal
---------------
A study appends each finished cell to ``<table>.journal`` (one JSON line, ``fsync``-ed before
the cell is reported done: :func:`append_journal`), and rewrites the table atomically every
few seconds and at the end, after which the journal is removed. A kill of any kind therefore
loses only the cells in flight: :func:`read_results` returns the table's rows followed by the
journal's cells, and leaves out a last journal line cut short by the kill.

Damaged files are never used as results: an empty, binary or foreign ``results.csv``, a
``config.json`` that is not a JSON object, a table whose last row is cut short, or whose cells
lack rows that its manifest ``<table>.cells`` (:func:`write_table`) says were written -- each is
a :class:`~approxlab.errors.CorruptResultsError` naming the file and what is wrong (or, for the
runner, a cell to recompute).

Used by :mod:`approxlab.data` (cache files), :mod:`approxlab.plotting` (figures) and
:mod:`approxlab.studies` (results); it imports nothing from approxlab but its errors.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import json
import os
import pathlib
import socket
import tempfile
import time

import pandas as pd

from .errors import CorruptResultsError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "write_csv_atomic",
    "write_json_atomic",
    "read_results",
    "read_json",
    "write_table",
    "CELLS_SUFFIX",
    "cells_path",
    "JOURNAL_SUFFIX",
    "journal_path",
    "has_results",
    "append_journal",
    "read_journal",
    "remove_journal",
    "TEMP_PREFIX",
    "LOCK_NAME",
    "OutputLockedError",
    "output_lock",
    "remove_stale_temp_files",
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


def _read_text(path: pathlib.Path, what: str) -> str:
    """The UTF-8 text of ``path``; :class:`CorruptResultsError` for a non-file or non-text content."""
    if path.is_dir():
        raise CorruptResultsError(path, f"it is a directory, not a {what}")
    data = path.read_bytes()
    if not data:
        raise CorruptResultsError(path, "it is empty (0 bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptResultsError(path, f"it is not UTF-8 text (byte {error.start} is 0x{data[error.start]:02x})") \
            from None


def _csv_records(text: str, path) -> tuple[list[list[str]], int]:
    """The CSV lines of ``text`` and how many trailing ones are cut short.

    A file written by :func:`write_csv_atomic` ends with a newline and every record has the
    header's field count. A last record without its newline, or with too few fields, is a
    half-written row (an interrupted, non-atomic write); any other bad record means the file
    is not a CSV table.
    """
    records = list(csv.reader(io.StringIO(text, newline="")))
    if not records or not records[0] or any(not name.strip() for name in records[0]):
        raise CorruptResultsError(path, "its first line is not a CSV header of column names")
    width = len(records[0])
    cut = not text.endswith(("\n", "\r"))
    if cut and len(records) == 1:
        raise CorruptResultsError(path, "it ends inside its header line (cut short)")
    for number, record in enumerate(records[1:], start=2):
        last = number == len(records)
        if len(record) != width and not (last and (cut or len(record) < width)):
            raise CorruptResultsError(
                path, f"line {number} has {len(record)} fields where its header has {width} (not a CSV table)")
    partial = int(cut or len(records[-1]) != width) if len(records) > 1 else 0
    return records, partial


def read_results(path, *, required=(), partial: str = "error") -> pd.DataFrame:
    """Read a results table written by :func:`write_csv_atomic`, with its journal (see :func:`append_journal`).

    Parameters
    ----------
    path : str or os.PathLike
        The CSV table.
    required : sequence of str
        Columns the caller needs; a table without one of them (another study's table) is a
        :class:`~approxlab.errors.CorruptResultsError`.
    partial : {"error", "drop"}
        What to do with a half-written last row: raise (readers that must not work from a
        damaged table), or drop it and set ``attrs["dropped_partial_row"] = True`` (the
        runner, which recomputes that row's cell).

    Returns
    -------
    pandas.DataFrame
        The rows of the CSV, followed by those of the journal's cells that the CSV lacks.

    Raises
    ------
    FileNotFoundError
        If neither ``path`` nor its journal exists; the message says to run the compute step first.
    CorruptResultsError
        If ``path`` is empty, not UTF-8, not a CSV table, lacks a ``required`` column, or (with
        ``partial="error"``) ends in a half-written row.
    """
    path = pathlib.Path(path)
    if partial not in ("error", "drop"):
        raise ValueError(f"`partial` must be 'error' or 'drop'; got {partial!r}.")
    if not has_results(path):
        raise FileNotFoundError(
            f"results table {str(path)!r} does not exist; run the study's compute step first "
            "(without --plot-only)."
        )
    frame, dropped = pd.DataFrame(), False
    if path.exists():
        text = _read_text(path, "results table")
        records, cut = _csv_records(text, path)
        if cut and partial == "error":
            raise CorruptResultsError(path, "its last row is cut short (an interrupted write); rerun the compute "
                                            "step to recompute that row's cell")
        dropped = bool(cut)
        if not cut:
            frame = pd.read_csv(io.StringIO(text))
        elif len(records) > 2:
            frame = pd.read_csv(io.StringIO(_join_csv(records[:-1])))
        else:
            frame = pd.DataFrame(columns=records[0])
    frame, damaged = _check_cells(frame, path, partial)
    frame = _with_journal(frame, path)
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise CorruptResultsError(path, f"it lacks the column(s) {missing} (a table of another study or version?)")
    frame.attrs["dropped_partial_row"] = dropped
    frame.attrs["damaged_cells"] = damaged
    return frame


# ------------------------------------------------------------------ the cell manifest

CELLS_SUFFIX = ".cells"
"""A table written by :func:`write_table` has ``<table>.cells`` beside it: its rows per cell."""


def cells_path(path) -> pathlib.Path:
    """The cell manifest of results table ``path``: ``results.csv`` -> ``results.csv.cells``."""
    path = pathlib.Path(path)
    return path.with_name(path.name + CELLS_SUFFIX)


def _cell_counts(frame: pd.DataFrame, key_columns) -> dict:
    if not len(frame):
        return {}
    sizes = frame.groupby(list(key_columns), sort=False, dropna=False).size()
    return {(key if isinstance(key, tuple) else (key,)): int(count) for key, count in sizes.items()}


def write_table(df: pd.DataFrame, path, key_columns) -> pathlib.Path:
    """Write a results table atomically, after its cell manifest (the number of rows of each cell).

    The manifest is written first, so it describes the table on disk or the one about to replace
    it; either way every cell the table holds has the row count it lists. :func:`read_results`
    uses it to tell a table that lost rows (cut short at a line end, edited) from a whole one.
    """
    counts = _cell_counts(df, key_columns)
    cells = [[*(_plain(v) for v in key), count] for key, count in counts.items()]
    write_json_atomic({"key_columns": list(key_columns), "cells": cells}, cells_path(path))
    return write_csv_atomic(df, path)


def _check_cells(frame: pd.DataFrame, path: pathlib.Path, partial: str):
    """``frame`` without the cells whose row count differs from the manifest's (``partial="drop"``),
    and those cells' keys; ``partial="error"`` raises instead. No manifest: nothing to check."""
    manifest_path = cells_path(path)
    if not manifest_path.exists() or not len(frame):
        return frame, []
    manifest = read_json(manifest_path)
    try:
        columns = list(manifest["key_columns"])
        expected = {tuple(cell[:-1]): int(cell[-1]) for cell in manifest["cells"]}
    except (KeyError, TypeError, ValueError):
        raise CorruptResultsError(manifest_path, "it is not a cell manifest written by approxlab") from None
    if not set(columns) <= set(frame.columns):
        return frame, []  # a foreign table: its caller names the missing key columns
    counts = {tuple(_plain(v) for v in key): count for key, count in _cell_counts(frame, columns).items()}
    damaged = [key for key, count in counts.items() if expected.get(key) != count]
    if not damaged:
        return frame, []
    if partial == "error":
        raise CorruptResultsError(path, f"{len(damaged)} of its cells lack rows the table was written with (cut "
                                        f"short at a line end, or edited), first {dict(zip(columns, damaged[0]))}")
    keys = [tuple(_plain(v) for v in values) for values in frame[columns].itertuples(index=False, name=None)]
    keep = [key not in set(damaged) for key in keys]
    return frame[keep].reset_index(drop=True), damaged


def _join_csv(records) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(records)
    return buffer.getvalue()


def read_json(path) -> dict:
    """Read a JSON object written by :func:`write_json_atomic`.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    CorruptResultsError
        If it is a directory, empty, not UTF-8, not JSON (e.g. cut short) or not a JSON object.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist; run the study's compute step first.")
    text = _read_text(path, "JSON file")
    try:
        value = json.loads(text)
    except ValueError as error:
        raise CorruptResultsError(path, f"it is not valid JSON ({error}); cut short or overwritten?") from None
    if not isinstance(value, dict):
        raise CorruptResultsError(path, f"it holds a JSON {type(value).__name__}, not an object")
    return value


# ------------------------------------------------------------------ the results journal

JOURNAL_SUFFIX = ".journal"
"""A table's journal is ``<table>.journal`` beside it (one JSON line per finished cell)."""


def journal_path(path) -> pathlib.Path:
    """The journal of results table ``path``: ``results.csv`` -> ``results.csv.journal``."""
    path = pathlib.Path(path)
    return path.with_name(path.name + JOURNAL_SUFFIX)


def has_results(path) -> bool:
    """Whether results table ``path`` or its journal exists (a run has finished a cell there)."""
    return pathlib.Path(path).exists() or journal_path(path).exists()


def append_journal(path, record: dict) -> None:
    """Append ``record`` (one finished cell) to the journal of ``path`` and make it durable.

    One JSON line (``allow_nan``: ``inf`` errors are results), written with a single
    ``write``, flushed and ``fsync``-ed before returning, so a cell reported finished survives
    any kill, ``SIGKILL`` and power loss included. If the write fails (a full disk), the
    journal is cut back to its previous length: it never keeps a half line it wrote itself.
    ``record`` holds ``key_columns``, ``key`` and ``rows`` (see :func:`read_results`).
    """
    journal = journal_path(path)
    line = (json.dumps(record, default=_json_scalar, separators=(",", ":")) + "\n").encode("utf-8")
    new = not journal.exists()
    with open(journal, "ab") as handle:
        start = handle.tell()
        try:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            handle.truncate(start)
            raise
    if new:
        _fsync_directory(journal.parent)


def _json_scalar(value):
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def read_journal(path) -> list[dict]:
    """The records of the journal of ``path`` (``[]`` without one); a last line cut short by a
    kill is left out (its cell was not reported finished).

    Raises
    ------
    CorruptResultsError
        If a line other than the last is not a record (the journal was damaged).
    """
    journal = journal_path(path)
    if not journal.is_file():
        return []
    lines = journal.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
            if not {"key_columns", "key", "rows"} <= set(record):
                raise ValueError("not a cell record")
        except ValueError:
            if number == len(lines):  # no newline after it: cut short by a kill
                break
            raise CorruptResultsError(journal, f"line {number} is not a cell record") from None
        records.append(record)
    return records


def remove_journal(path) -> None:
    """Delete the journal of ``path`` (once its cells are in the table written atomically)."""
    journal_path(path).unlink(missing_ok=True)


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _with_journal(frame: pd.DataFrame, path) -> pd.DataFrame:
    """``frame`` followed by the rows of the journal's cells whose keys it lacks (the last record of a key wins)."""
    records = read_journal(path)
    if not records:
        return frame
    columns = list(records[0]["key_columns"])
    present = set()
    if len(frame) and set(columns) <= set(frame.columns):
        present = {tuple(_plain(v) for v in values)
                   for values in frame[columns].itertuples(index=False, name=None)}
    latest = {tuple(record["key"]): record["rows"] for record in records}
    rows = [row for key, cell_rows in latest.items() if key not in present for row in cell_rows]
    if not rows:
        return frame
    extra = pd.DataFrame.from_records(rows)
    return pd.concat([frame, extra], ignore_index=True) if len(frame.columns) else extra


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
