r"""Grid -> cells -> tidy table: the driver every study runs through.

A study declares its grid as a ``config`` dict, expands it into a list of *cells*
(dicts) and hands :func:`run_cells` a module-level ``compute(cell) -> list[dict]``
that turns one cell into result rows. The runner

* writes ``config.json`` next to the results table: the config, its hash, the
  approxlab version, timestamps and (unhashed) run information;
* **resumes**: when the table exists and was made with the same config hash, cells
  whose key (the values of ``key_columns``) already appear in it are skipped; when
  the hash differs it refuses (:class:`StudyError`) and tells the user to pass a new
  ``--out`` directory or ``--restart``;
* makes every finished cell durable before it counts as done: its rows are appended to the
  table's journal (``results.csv.journal``, one JSON line, ``fsync``-ed:
  :func:`approxlab._io.append_journal`), and the CSV is rewritten atomically with its cell
  manifest (``results.csv.cells``: the rows of each cell, :func:`approxlab._io.write_table`) at
  most every ``flush_every_seconds`` and always on exit, after which the journal is dropped. A
  kill of any kind (``SIGKILL`` and power loss included) therefore loses only the cells in
  flight; resuming reads the table and its journal;
* recomputes what an interrupted or damaged write left (a last row cut short, cells missing
  rows that the manifest lists), with a note on stderr, and refuses in one line a table it
  cannot read as one (empty, binary, another study's, a ``config.json`` that is not JSON);
* runs cells in-process (default) or on Dask (``scheduler="tcp://..."`` or a local
  cluster of ``workers`` single-threaded processes: :mod:`approxlab.studies.dask_executor`);
  only the driver writes files, and
  rows are ordered by the cell list, so both executors produce the same CSV;
* holds the lock of the output folder while it runs (:func:`approxlab._io.output_lock`,
  reentrant, so the CLI's lock around the whole study covers it) and removes the
  temporary files a killed run left there;
* reports progress on stderr: a tqdm bar on a terminal, otherwise (a log file, a batch
  job) a line at every tenth of the cells with done/total, elapsed and estimated
  remaining time (:class:`ProgressLog`).

Cell granularity and shared intermediates
-----------------------------------------
A cell is the unit of resume and of scheduling: ``compute`` must return *all* rows for
its cell (at least one), and the runner stamps every row with the cell's key columns.
Work shared by several cells (e.g. the exact attention output of one window) is best
kept in a small per-process ``functools.lru_cache`` inside the study module, with the
cells ordered so that cells sharing it are adjacent (in-process runs then compute it
once; each Dask worker computes it at most once per group it sees). Alternatively a
cell may be a whole group (e.g. one window) returning rows for many settings.

Randomness
----------
Seeds must come from the cell, never from run order: :func:`cell_seed` hashes a
cell's key values (and an optional base seed) into a 63-bit integer, so a cell gets
the same stream in-process, on any Dask worker, and after a resume.

Public API::

    run_cells(cells, compute, *, results_path, key_columns, config, run_info=None,
              config_path=None, scheduler=None, workers=None, progress=True,
              flush_every_seconds=5.0, restart=False) -> pandas.DataFrame
    cell_key(cell, key_columns) -> tuple
    cell_seed(*values, base_seed=0) -> int
    config_hash(config) -> str
    StudyError
"""

from __future__ import annotations

import datetime
import hashlib
import json
import numbers
import pathlib
import sys
import time
from typing import Callable, Iterable, Sequence

import pandas as pd

from .._io import (
    append_journal,
    cells_path,
    has_results,
    journal_path,
    output_lock,
    read_json,
    read_results,
    remove_journal,
    write_json_atomic,
    write_table,
)
from ..errors import CorruptResultsError
from .dask_executor import run_dask as _run_dask
from .dask_executor import with_plugins as _with_plugins

__all__ = ["run_cells", "cell_key", "cell_seed", "config_hash", "saved_config", "StudyError", "ProgressLog"]


class StudyError(RuntimeError):
    """A study cannot run as asked (mismatched saved results, missing device, ...).

    The CLI prints its message without a traceback and exits with status 2.
    """


def _canonical(value):
    """JSON-able, hash-stable form of a config/key value (numpy scalars -> Python)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def config_hash(config: dict) -> str:
    """A 16-hex-digit SHA-256 hash of a grid-defining config (key order does not matter)."""
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict; got {type(config).__name__}.")
    text = json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_key(cell: dict, key_columns: Sequence[str]) -> tuple:
    """The key of ``cell``: its values of ``key_columns``, as plain Python scalars."""
    missing = [c for c in key_columns if c not in cell]
    if missing:
        raise KeyError(f"cell {cell!r} lacks key column(s) {missing}; `key_columns`={list(key_columns)}.")
    return tuple(_canonical(cell[c]) for c in key_columns)


def cell_seed(*values, base_seed: int = 0) -> int:
    """A reproducible 63-bit seed derived from ``values`` (e.g. a cell's key) and ``base_seed``.

    Independent of run order, process and executor: ``cell_seed("pretrained", 512, 3)``
    is the same integer everywhere. Use it as ``torch.Generator().manual_seed(seed)``.

    Examples
    --------
    >>> cell_seed("a", 1) == cell_seed("a", 1) != cell_seed("a", 2)
    True
    """
    text = json.dumps([_canonical(base_seed), _canonical(list(values))], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _version() -> str:
    from .. import __version__

    return __version__


_REMEDY = "pass --restart to discard the saved results, or a new --out directory"


def _saved_record(config_path, restart):
    """The saved ``config.json`` record, None when there is none (or it is damaged and ``restart``)."""
    if config_path.is_dir():
        raise StudyError(f"{str(config_path)!r} is a directory where the study's config.json must go; "
                         "remove it or pass a new --out directory.")
    if not config_path.exists():
        return None
    try:
        saved = read_json(config_path)
    except CorruptResultsError as error:
        if restart:
            return None
        raise StudyError(f"{error}, so the results beside it cannot be resumed safely; {_REMEDY}.") from None
    if not isinstance(saved.get("config_hash"), str) and not restart:
        raise StudyError(f"{str(config_path)!r} is not a config.json written by approxlab (it has no config_hash), "
                         f"so the results beside it cannot be resumed safely; {_REMEDY}.")
    return saved


def _prepare_config(config_path, results_path, config, run_info, restart) -> dict:
    """Check the saved config against ``config``; return the ``config.json`` record to write
    (once the saved table, too, has been checked: a refused run changes nothing)."""
    digest = config_hash(config)
    saved = _saved_record(config_path, restart)
    if results_path.is_dir():
        raise StudyError(f"{str(results_path)!r} is a directory where the results table must go; remove it or "
                         "pass a new --out directory.")
    if restart:
        results_path.unlink(missing_ok=True)
        cells_path(results_path).unlink(missing_ok=True)
        remove_journal(results_path)
    if saved is not None and saved.get("config_hash") != digest and not restart:
        raise StudyError(
            f"{str(config_path.parent)!r} holds results of a different configuration "
            f"(config hash {saved.get('config_hash')!r}, this run {digest!r}); pass a new --out "
            "directory, or --restart to discard the saved results."
        )
    if saved is None and has_results(results_path) and not restart:
        raise StudyError(
            f"{str(results_path)!r} exists but {str(config_path)!r} does not, so it cannot be "
            "resumed safely; pass a new --out directory, or --restart to discard it."
        )
    same = saved is not None and saved.get("config_hash") == digest
    tables = sorted(set(saved.get("tables", []) if same else []) | {results_path.name})
    record = {
        "config": _canonical(config),
        "config_hash": digest,
        "approxlab_version": _version(),
        "created": saved.get("created", _now()) if same else _now(),
        "updated": _now(),
        "tables": tables,
        "run": _canonical(run_info or {}),
    }
    return record


def saved_config(config_path, table: str = "results.csv") -> dict:
    """The ``config`` of a study's saved ``config.json``, for its plot step.

    Raises
    ------
    StudyError
        If the file is missing (``table`` then has no config beside it), damaged, or not written
        by approxlab; the message names the file.
    """
    config_path = pathlib.Path(config_path)
    if not config_path.exists():
        raise StudyError(f"{str(config_path)!r} does not exist, so {table} beside it cannot be read as a run of "
                         "this study; rerun without --plot-only.")
    try:
        record = read_json(config_path)
    except CorruptResultsError as error:
        raise StudyError(f"{error}; rerun without --plot-only (with --restart to start over).") from None
    if not isinstance(record.get("config"), dict):
        raise StudyError(f"{str(config_path)!r} is not a config.json written by approxlab (no `config` object); "
                         "rerun without --plot-only (with --restart to start over).")
    return record["config"]


class _Table:
    """Rows of a results table, grouped by cell key, written in cell-list order.

    Each finished cell is appended to the table's journal (:func:`approxlab._io.append_journal`,
    fsync-ed) before it counts as done; :meth:`flush` rewrites the CSV atomically and then drops
    the journal, whose cells it now holds.
    """

    def __init__(self, path, key_columns, order):
        self.path = path
        self.key_columns = list(key_columns)
        self.order = order  # key -> position in the cell list
        self.existing = self._read_existing()
        self.done = set()
        if len(self.existing):
            for values in self.existing[self.key_columns].itertuples(index=False, name=None):
                self.done.add(tuple(_canonical(v) for v in values))
        self.new = {}
        self.dirty = False

    def _read_existing(self) -> pd.DataFrame:
        if not has_results(self.path):
            return pd.DataFrame()
        try:
            existing = read_results(self.path, partial="drop")
        except CorruptResultsError as error:
            raise StudyError(f"{error}; {_REMEDY}.") from None
        if len(existing) and not set(self.key_columns) <= set(existing.columns):
            raise StudyError(
                f"{str(self.path)!r} lacks key columns {self.key_columns} (a table of another study?); {_REMEDY}."
            )
        damaged = [tuple(_canonical(v) for v in key) for key in existing.attrs.get("damaged_cells", [])]
        if existing.attrs.get("dropped_partial_row") and len(existing):
            last = tuple(_canonical(v) for v in existing[self.key_columns].iloc[-1])  # the cell it belonged to
            damaged = damaged or [last]
            self._note("its last row was cut short (an interrupted write)", damaged)
        elif damaged:
            self._note("cells lack rows the table was written with (cut short at a line end, or edited)", damaged)
        if damaged:
            keys = [tuple(_canonical(v) for v in values)
                    for values in existing[self.key_columns].itertuples(index=False, name=None)]
            existing = existing[[key not in set(damaged) for key in keys]].reset_index(drop=True)
            self.dirty = True
        return existing

    def _note(self, what: str, keys) -> None:
        cells = "; ".join(", ".join(f"{c}={v!r}" for c, v in zip(self.key_columns, key)) for key in keys[:3])
        more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
        print(f"approxlab: {self.path}: {what}; recomputing {len(keys)} cell(s) ({cells}{more})", file=sys.stderr)

    def add(self, key, rows):
        append_journal(self.path, {"key_columns": self.key_columns, "key": list(key), "rows": rows})
        self.new[key] = rows
        self.done.add(key)
        self.dirty = True

    def frame(self) -> pd.DataFrame:
        frames = []
        if len(self.existing):
            frames.append(self.existing)
        rows = [row for key in self.new for row in self.new[key]]
        if rows:
            frames.append(pd.DataFrame.from_records(rows))
        if not frames:
            return pd.DataFrame(columns=self.key_columns)
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        position = [
            self.order.get(tuple(_canonical(v) for v in values), -1)
            for values in df[self.key_columns].itertuples(index=False, name=None)
        ]
        df = df.assign(_position=position).sort_values("_position", kind="stable")
        df = df.drop(columns="_position").reset_index(drop=True)
        others = [c for c in df.columns if c not in self.key_columns]
        return df[self.key_columns + others]

    def flush(self):
        if self.dirty or journal_path(self.path).exists():
            write_table(self.frame(), self.path, self.key_columns)
            remove_journal(self.path)
            self.dirty = False


def _stamp(cell, key, key_columns, rows):
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise TypeError(
            f"`compute` must return a non-empty list of dicts (one per result row); for cell "
            f"{dict(zip(key_columns, key))} it returned {type(rows).__name__}"
            f"{'' if not isinstance(rows, list) else f' of length {len(rows)}'}."
        )
    stamped = []
    for row in rows:
        for column, value in zip(key_columns, key):
            if column in row and _canonical(row[column]) != value:
                raise ValueError(
                    f"`compute` returned a row with {column}={row[column]!r} for the cell with "
                    f"{column}={value!r}; rows must belong to their cell."
                )
        stamped.append({**dict(zip(key_columns, key)), **row})
    return stamped


def run_cells(
    cells: Iterable[dict],
    compute: Callable[[dict], list],
    *,
    results_path,
    key_columns: Sequence[str],
    config: dict,
    run_info: dict | None = None,
    config_path=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    flush_every_seconds: float = 5.0,
    restart: bool = False,
) -> pd.DataFrame:
    """Compute every cell not yet in ``results_path`` and return the whole table.

    Parameters
    ----------
    cells : iterable of dict
        The grid, one dict per cell, in the order rows should appear in the table. Each
        holds at least ``key_columns``; any other (picklable) entries are passed to
        ``compute`` too (e.g. data directories).
    compute : callable
        ``compute(cell) -> list[dict]``: the rows of one cell (at least one). Must be a
        module-level function (picklable) for the Dask executor, must not write result
        files, and must take its randomness from the cell (see :func:`cell_seed`).
    results_path : str or os.PathLike
        The tidy CSV table; created, resumed or (``restart``) replaced.
    key_columns : sequence of str
        Columns identifying a cell; every row gets them from its cell.
    config : dict
        The grid-defining configuration; hashed (:func:`config_hash`) and saved.
    run_info : dict, optional
        Saved in ``config.json`` but not hashed (command line, device, executor).
    config_path : str or os.PathLike, optional
        Default ``results_path.parent / "config.json"``. Several tables of one study may
        share it (same ``config``).
    scheduler : str, optional
        Address of a running Dask scheduler (``"tcp://host:8786"``).
    workers : int, optional
        Start a local Dask cluster with this many single-threaded worker processes.
    progress : bool
        Report progress on stderr: a tqdm bar when stderr is a terminal, else a
        :class:`ProgressLog` line at every tenth of the cells.
    flush_every_seconds : float
        Rewrite the CSV after a finished cell when at least this long has passed since
        the last write (``0``: after every cell). It is always written on exit. Finished
        cells are durable in the journal in between, whatever this is.
    restart : bool
        Discard ``results_path`` (and accept a changed config) instead of resuming.

    Returns
    -------
    pandas.DataFrame
        The full table as re-read from ``results_path`` (so it equals the file).

    Raises
    ------
    StudyError
        If ``results_path`` was made with a different config (pass a new output directory
        or ``restart=True``), exists without its ``config.json``, or either of them cannot be
        read as approxlab's (see :class:`approxlab.errors.CorruptResultsError`).
    approxlab._io.OutputLockedError
        If another process holds the lock of ``results_path``'s folder.
    """
    cells = list(cells)
    key_columns = list(key_columns)
    if not key_columns or not all(isinstance(c, str) for c in key_columns):
        raise ValueError(f"`key_columns` must be a non-empty list of column names; got {key_columns!r}.")
    if not callable(compute):
        raise TypeError(f"`compute` must be callable; got {type(compute).__name__}.")
    if scheduler is not None and workers is not None:
        raise ValueError(
            f"pass at most one of `scheduler` and `workers`; got scheduler={scheduler!r}, workers={workers!r}."
        )
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"`workers` must be an integer >= 1 or None; got {workers!r}.")
    if scheduler is not None and not (isinstance(scheduler, str) and "://" in scheduler):
        raise ValueError(f"`scheduler` must be an address like 'tcp://host:8786'; got {scheduler!r}.")
    if flush_every_seconds < 0:
        raise ValueError(f"`flush_every_seconds` must be >= 0; got {flush_every_seconds!r}.")
    keys = [cell_key(cell, key_columns) for cell in cells]
    if len(set(keys)) != len(keys):
        seen, dup = set(), None
        for key in keys:
            if key in seen:
                dup = key
                break
            seen.add(key)
        raise ValueError(f"two cells share the key {dict(zip(key_columns, dup))}; cell keys must be unique.")

    results_path = pathlib.Path(results_path)
    config_path = pathlib.Path(config_path) if config_path is not None else results_path.parent / "config.json"
    with output_lock(results_path.parent, command=(run_info or {}).get("command")):
        record = _prepare_config(config_path, results_path, config, run_info, restart)
        table = _Table(results_path, key_columns, {key: i for i, key in enumerate(keys)})
        write_json_atomic(record, config_path)
        todo = [(key, cell) for key, cell in zip(keys, cells) if key not in table.done]
        bar = _progress_bar(len(cells), len(cells) - len(todo), progress,
                            f"{results_path.parent.name}/{results_path.name}")
        _run_todo(todo, compute, table, key_columns, bar, scheduler, workers, flush_every_seconds)
        if not results_path.exists():
            write_table(table.frame(), results_path, key_columns)
        return read_results(results_path)


def _run_todo(todo, compute, table, key_columns, bar, scheduler, workers, flush_every_seconds):
    """Compute the cells of ``todo`` into ``table``; flush it every so often and always at the end."""
    last_flush = time.monotonic()

    def finished(key, cell, rows):
        nonlocal last_flush
        table.add(key, _stamp(cell, key, key_columns, rows))
        bar.update(1)
        if time.monotonic() - last_flush >= flush_every_seconds:
            table.flush()
            last_flush = time.monotonic()

    try:
        if todo and (scheduler is not None or workers is not None):
            _run_dask(todo, _with_plugins(compute), finished, scheduler, workers)
        else:
            for key, cell in todo:
                finished(key, cell, compute(cell))
    finally:
        bar.close()
        table.flush()


def _progress_bar(total, initial, progress, description):
    """A tqdm bar on a terminal, a :class:`ProgressLog` otherwise, nothing without ``progress``."""
    from tqdm.auto import tqdm

    if progress and not sys.stderr.isatty():
        return ProgressLog(total, initial, description)
    return tqdm(total=total, initial=initial, disable=not progress, desc=description, unit="cell")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLog:
    """Progress for a stderr that is not a terminal: one line at every tenth of the cells.

    ``figure1/results.csv: 12/120 cells (10%), elapsed 0:00:31, remaining ~0:04:39``: the remaining
    time extrapolates the mean time of the cells finished in this run. A line is written
    when the run starts, whenever the count of finished cells crosses a multiple of
    ``ceil(total / 10)``, and at the end. Same ``update``/``close`` interface as tqdm.

    Parameters
    ----------
    total : int
        Cells of the grid.
    initial : int
        Cells already done (resumed).
    description : str
        Prefix of every line (``<output folder>/<table>``).
    stream : file, optional
        Where to write (default ``sys.stderr`` at the time of each line).
    """

    def __init__(self, total: int, initial: int = 0, description: str = "", stream=None):
        self.total, self.initial, self.done = int(total), int(initial), int(initial)
        self.description = description
        self.stream = stream
        self.step = max(1, -(-self.total // 10))
        self.start = time.monotonic()
        self.closed = False
        resumed = f" ({self.initial} already done)" if self.initial else ""
        self._write(f"{self.done}/{self.total} cells to compute{resumed}")

    def _write(self, text: str) -> None:
        print(f"{self.description}: {text}" if self.description else text, file=self.stream or sys.stderr,
              flush=True)

    def line(self) -> str:
        """The current state: done/total, percentage, elapsed and estimated remaining time."""
        elapsed = time.monotonic() - self.start
        percent = 100 * self.done // self.total if self.total else 100
        text = f"{self.done}/{self.total} cells ({percent}%), elapsed {_clock(elapsed)}"
        if self.done > self.initial and self.done < self.total:
            remaining = elapsed / (self.done - self.initial) * (self.total - self.done)
            text += f", remaining ~{_clock(remaining)}"
        return text

    def update(self, count: int = 1) -> None:
        before, self.done = self.done, self.done + count
        if self.done // self.step > before // self.step or self.done == self.total:
            self._write(self.line())

    def close(self) -> None:
        if not self.closed and self.done < self.total and self.done > self.initial:
            self._write(self.line() + " (stopped)")
        self.closed = True
