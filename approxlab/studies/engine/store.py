"""The results tables of a study on disk: the CSV, its cell manifest and its journal.

A table is a tidy CSV (compressed when its name ends in ``.csv.gz`` or ``.csv.bz2``) written atomically
(:func:`approxlab._io.write_csv_atomic`) after its cell manifest ``<table>.cells`` (the rows of each cell,
:func:`write_table`), so that a table that lost rows (cut short at a line end, edited) is told from a whole one.
Between two writes, each finished cell is appended to the table's journal ``<table>.journal`` (one JSON line,
``fsync``-ed before the cell counts as done: :func:`append_journal`); :func:`read_results` returns the table's rows
followed by the journal's cells, and leaves out a last journal line cut short by a kill.

A table split by a key column is stored one file per value, each with its manifest (:mod:`.parts`); its journal
stays one. :func:`read_results` reads the parts one after the other; a table saved whole (before it was split, or
with no rows) wins over parts beside it, which only a write cut short between the two can leave.

Damaged files are never used as results: an empty, binary or foreign table, a ``config.json`` that
is not a JSON object, a table whose last row is cut short, or whose cells lack rows that its
manifest says were written -- each is a :class:`~approxlab.errors.CorruptResultsError` naming the
file and what is wrong (or, for the runner, a cell to recompute).

Public API::

    read_results(path, *, required=(), partial="error") -> pandas.DataFrame
    write_table(df, path, key_columns, split=None) -> pathlib.Path
    remove_table(path)                  # the parts' names: part_path, part_paths (from .parts)
    read_json(path) -> dict
    append_journal(path, record), read_journal(path), remove_journal(path)
    has_results(path), journal_path(path), cells_path(path), JOURNAL_SUFFIX, CELLS_SUFFIX
    stored_as(path) -> pathlib.Path
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import zlib

import pandas as pd

from ..._io import TABLE_SUFFIXES, compression, fsync_directory, naming, write_csv_atomic, write_json_atomic
from ...errors import CorruptResultsError
from .parts import base_and_suffix, part_path, part_paths

__all__ = ["read_results", "write_table", "read_json", "append_journal", "read_journal", "remove_journal",
           "has_results", "journal_path", "cells_path", "JOURNAL_SUFFIX", "CELLS_SUFFIX", "stored_as", "remove_table"]


def _read_text(path: pathlib.Path, what: str) -> str:
    """The UTF-8 text of ``path`` (decompressed for a name ending in ``.gz`` or ``.bz2``); :class:`CorruptResultsError`
    for a non-file, a ``.gz`` or ``.bz2`` file that is not whole data of its format, or non-text content."""
    if path.is_dir():
        raise CorruptResultsError(path, f"it is a directory, not a {what}")
    data = path.read_bytes()
    codec = compression(path)
    if data and codec:
        try:
            data = codec[2](data)
        except (OSError, EOFError, ValueError, zlib.error) as error:
            raise CorruptResultsError(path, f"it is not whole {codec[0]} data ({error})") from None
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
        The CSV table; for a table split by a column, the name its parts are named from (``results.csv.gz`` for
        ``results.length=2048.csv.gz``, ...: :func:`part_path`).
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
        The rows of the CSV (of its parts, one after the other), followed by those of the journal's cells that the
        CSV lacks.

    Raises
    ------
    FileNotFoundError
        If neither ``path``, its parts nor its journal exist; the message says to run the compute step first.
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
    files = [path] if path.exists() else part_paths(path)
    frames, dropped, damaged = [], False, []
    for file in files:
        frame, cut = _read_file(file, partial)
        frame, bad = _check_cells(frame, file, partial)  # a part's row cut short: its cell lacks rows
        frames.append(frame)
        dropped, damaged = dropped or cut, damaged + bad
    frames = [frame for frame in frames if len(frame.columns)]
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames[0] if frames else pd.DataFrame())
    frame = _with_journal(frame, path)
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise CorruptResultsError(path, f"it lacks the column(s) {missing} (a table of another study or version?)")
    frame.attrs["dropped_partial_row"] = dropped
    frame.attrs["damaged_cells"] = damaged
    return frame


def _read_file(path: pathlib.Path, partial: str) -> tuple[pd.DataFrame, bool]:
    """The rows of one file of a table (the table, or one part of a split one), and whether a last row cut short was
    dropped (``partial="drop"``; ``"error"`` raises)."""
    text = _read_text(path, "results table")
    records, cut = _csv_records(text, path)
    if cut and partial == "error":
        raise CorruptResultsError(path, "its last row is cut short (an interrupted write); rerun the compute "
                                        "step to recompute that row's cell")
    if not cut:
        return pd.read_csv(io.StringIO(text)), False
    if len(records) > 2:
        return pd.read_csv(io.StringIO(_join_csv(records[:-1]))), True
    return pd.DataFrame(columns=records[0]), True


def remove_table(path) -> None:
    """Delete table ``path``: its file or parts, their manifests, and its journal."""
    path = pathlib.Path(path)
    _remove_files([path, *part_paths(path)])
    remove_journal(path)


def _remove_files(files) -> None:
    """Delete each file of a table (the table, or parts of it) with its manifest."""
    for file in files:
        file.unlink(missing_ok=True)
        cells_path(file).unlink(missing_ok=True)


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


def write_table(df: pd.DataFrame, path, key_columns, split: str | None = None) -> pathlib.Path:
    """Write a results table atomically, after its cell manifest (the number of rows of each cell).

    The manifest is written first, so it describes the table on disk or the one about to replace
    it; either way every cell the table holds has the row count it lists. :func:`read_results`
    uses it to tell a table that lost rows (cut short at a line end, edited) from a whole one.

    With ``split`` (a key column), each value's rows go to a part of their own (:func:`part_path`), each written
    so; then the parts of values no longer in ``df`` and the table saved whole are removed (a kill in between leaves
    the whole table, which :func:`read_results` then reads). A table without rows is saved whole.
    """
    path = pathlib.Path(path)
    if split is None or not len(df):
        _write_file(df, path, key_columns)
        _remove_files(part_paths(path))
        return path
    if split not in key_columns:
        raise ValueError(f"`split` must be one of the key columns {list(key_columns)}; got {split!r}.")
    written = set()
    for value, rows in df.groupby(split, sort=False, dropna=False):
        written.add(_write_file(rows, part_path(path, split, value), key_columns))
    _remove_files([file for file in part_paths(path) if file not in written] + [path])
    return path


def _write_file(df: pd.DataFrame, path: pathlib.Path, key_columns) -> pathlib.Path:
    counts = _cell_counts(df, key_columns)
    cells = [[*(_plain(v) for v in key), count] for key, count in counts.items()]
    write_json_atomic({"key_columns": list(key_columns), "cells": cells}, cells_path(path))
    return write_csv_atomic(df, path)


def _check_cells(frame: pd.DataFrame, path: pathlib.Path, partial: str):
    """``frame`` without the cells whose row count differs from the manifest's (``partial="drop"``), and those cells'
    keys; ``partial="error"`` raises instead. No manifest: nothing to check."""
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
    """Whether results table ``path``, its parts or its journal exist (a run has finished a cell there)."""
    return pathlib.Path(path).exists() or journal_path(path).exists() or bool(part_paths(path))


def stored_as(path) -> pathlib.Path:
    """Where the rows of results table ``path`` are: ``path`` itself, or -- when neither it nor its journal exists --
    the one table beside it with the same name stored with another compression (``results.csv`` for
    ``results.csv.gz``: a folder saved before its study compressed the table), else ``path``."""
    path = pathlib.Path(path)
    if has_results(path):
        return path
    base = base_and_suffix(path)[0]
    others = [path.with_name(base + suffix) for suffix in TABLE_SUFFIXES if base + suffix != path.name]
    found = [other for other in others if has_results(other)]
    return found[0] if len(found) == 1 else path


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
    with naming(journal), open(journal, "ab") as handle:
        start = handle.tell()
        try:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            handle.truncate(start)
            raise
    if new:
        with naming(journal.parent):
            fsync_directory(journal.parent)


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
