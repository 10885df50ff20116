r"""Cells -> tables: the one runner every study goes through.

A study's :class:`~approxlab.studies.declaration.Step`\ s turn its config into *cells* (dicts), and
each step's ``compute(cell)`` turns one cell into result rows, for one table or several (a dict of
table name -> rows). :func:`run_steps` runs the steps in order into an output folder and

* writes ``config.json`` next to the tables: the config, its hash, the approxlab version,
  timestamps, the tables and (unhashed) run information (:mod:`~approxlab.studies.engine.record`);
* **resumes**: a cell whose key (its values of the step's key columns) is in every table of its
  step is skipped; a saved config of another hash is refused (:class:`~approxlab.errors.StudyError`:
  pass a new ``--out`` directory or ``--restart``), unless it only grows along ``grows`` (more windows,
  more methods): then the run is extended by the new cells;
* makes every finished cell durable before it counts as done: its rows are appended to each
  table's journal (``results.csv.journal``, one JSON line, ``fsync``-ed), and each table is rewritten
  atomically with its cell manifest at most every ``flush_every_seconds`` and always at the end of
  its step, after which its journal is dropped (:mod:`~approxlab.studies.engine.store`). A kill of
  any kind (``SIGKILL`` and power loss included) therefore loses only the cells in flight;
* recomputes what an interrupted or damaged write left (a last row cut short, cells missing rows
  that the manifest lists), with a note on stderr, and refuses in one line a table it cannot read as
  one (empty, binary, another study's, a ``config.json`` that is not JSON);
* runs cells in-process (default) or on Dask (``scheduler="tcp://..."`` or a local cluster of
  ``workers`` single-threaded processes, started once for all steps:
  :mod:`~approxlab.studies.engine.executors`); only this process writes files, and rows are
  ordered by the cell list, so both executors produce the same tables;
* holds the lock of the output folder while it runs (reentrant, so the CLI's lock around the whole
  study covers it) and removes the temporary files a killed run left there;
* reports progress on stderr per step (``<folder>/<table>: done/total``).

Cell granularity and shared intermediates
-----------------------------------------
A cell is the unit of resume and of scheduling. Work shared by several cells (the exact attention
output of one window) is kept in the per-process caches of :mod:`approxlab.studies.inputs`, with the
cells ordered so that those sharing it are adjacent; or, where a step declares a ``group``, the cells
still to compute that share it are computed in one call on one worker (one sequence's prefill for
its policies), each then saved as its own cell. Seeds come from the cell, never from run order:
:func:`~approxlab.studies.engine.keys.cell_seed`.

Public API::

    run_steps(steps, out, *, config, run_info=None, scheduler=None, workers=None, progress=True,
              flush_every_seconds=5.0, restart=False, grows=()) -> {table name: pandas.DataFrame}
    run_cells(cells, compute, *, results_path, key_columns, config, ...) -> pandas.DataFrame
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Callable, Iterable, Sequence

import pandas as pd

from ..._io import write_json_atomic
from ...errors import CorruptResultsError, StudyError
from ..declaration import Step, Table
from .executors import Executor
from .keys import canonical, cell_key
from .lock import output_lock
from .progress import advance, progress_bar
from .record import REMEDY, prepare_record
from .store import (append_journal, has_results, journal_path, read_results, remove_journal, remove_table, stored_as,
                    write_table)

__all__ = ["run_steps", "run_cells", "CellResultError"]


class CellResultError(TypeError, ValueError):
    """A step's ``cells`` or ``compute`` returned what the runner cannot use: rows that are not a non-empty
    list of dicts, rows of another cell or table, two different cells under one key.

    A bug of the study that declared the step; the message says what it must return and what it returned.
    ``approxlab <study>`` prints it as one line for a study defined outside approxlab (a plugin's) and keeps
    the traceback for a built-in one. Both a ``TypeError`` and a ``ValueError``.
    """


class _Table:
    """Rows of a results table, grouped by cell key, written in cell-list order.

    Each finished cell is appended to the table's journal before it counts as done; :meth:`flush`
    rewrites the CSV atomically and then drops the journal, whose cells it now holds. A cell computed
    again replaces its saved rows.
    """

    def __init__(self, path, key_columns, order, split=None):
        self.path, self.split = path, split
        self.key_columns = list(key_columns)
        self.order = order  # key -> position in the cell list
        self.dirty = False
        self.existing = self._read_existing()
        self.done = set()
        if len(self.existing):
            for values in self.existing[self.key_columns].itertuples(index=False, name=None):
                self.done.add(tuple(canonical(v) for v in values))
        self.new = {}
        self.dirty |= split is not None and path.exists() and len(self.existing) > 0  # saved whole: split it

    def _keys(self, frame) -> list:
        return [tuple(canonical(v) for v in values) for values in frame[self.key_columns].itertuples(index=False,
                                                                                                       name=None)]

    def _read_existing(self) -> pd.DataFrame:
        source = stored_as(self.path)
        if not has_results(source):
            return pd.DataFrame()
        try:
            existing = read_results(source, partial="drop")
        except CorruptResultsError as error:
            raise StudyError(f"{error}; {REMEDY}.") from None
        if len(existing) and not set(self.key_columns) <= set(existing.columns):
            raise StudyError(
                f"{str(source)!r} lacks key columns {self.key_columns} (a table of another study?); {REMEDY}."
            )
        damaged = [tuple(canonical(v) for v in key) for key in existing.attrs.get("damaged_cells", [])]
        if existing.attrs.get("dropped_partial_row") and len(existing):
            last = tuple(canonical(v) for v in existing[self.key_columns].iloc[-1])  # the cell it belonged to
            damaged = damaged or [last]
            self._note("its last row was cut short (an interrupted write)", damaged)
        elif damaged:
            self._note("cells lack rows the table was written with (cut short at a line end, or edited)", damaged)
        if damaged:
            existing = existing[[key not in set(damaged) for key in self._keys(existing)]].reset_index(drop=True)
            self.dirty = True
        if source != self.path:
            existing = self._adopt(existing, source)
        return existing

    def _adopt(self, existing: pd.DataFrame, source) -> pd.DataFrame:
        """Rewrite a table saved under another compression (``results.csv`` for ``results.csv.gz``) as this one, then
        remove the old table, manifest and journal: a kill in between leaves both, and the next run reads this one."""
        write_table(existing, self.path, self.key_columns, self.split)
        remove_table(source)
        print(f"approxlab: {source} is now {self.path.name} (the name this version stores the table under); its "
              f"{len(existing)} rows are kept", file=sys.stderr)
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
            kept = self.existing
            if self.new:  # a cell computed again replaces its saved rows
                kept = kept[[key not in self.new for key in self._keys(kept)]]
            frames.append(kept)
        rows = [row for key in self.new for row in self.new[key]]
        if rows:
            frames.append(pd.DataFrame.from_records(rows))
        if not frames:
            return pd.DataFrame(columns=self.key_columns)
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        position = [self.order.get(key, -1) for key in self._keys(df)]
        df = df.assign(_position=position).sort_values("_position", kind="stable")
        df = df.drop(columns="_position").reset_index(drop=True)
        others = [c for c in df.columns if c not in self.key_columns]
        return df[self.key_columns + others]

    def flush(self):
        if self.dirty or journal_path(self.path).exists():
            write_table(self.frame(), self.path, self.key_columns, self.split)
            remove_journal(self.path)
            self.dirty = False


def _stamp(cell, key, key_columns, rows, table, optional=False):
    """The rows of ``cell`` for ``table``, each stamped with the cell's key: a list of dicts, empty only for an
    ``optional`` table (per-layer rows of a method that failed before it reached a layer)."""
    if not isinstance(rows, list) or not (rows or optional) or not all(isinstance(r, dict) for r in rows):
        raise CellResultError(
            f"`compute` must return a {'' if optional else 'non-empty '}list of dicts (one per result row) for "
            f"table {table}; for cell "
            f"{dict(zip(key_columns, key))} it returned {type(rows).__name__}"
            f"{'' if not isinstance(rows, list) else f' of length {len(rows)}'}."
        )
    stamped = []
    for row in rows:
        for column, value in zip(key_columns, key):
            if column in row and canonical(row[column]) != value:
                raise CellResultError(
                    f"`compute` returned a row with {column}={row[column]!r} for the cell with "
                    f"{column}={value!r}; rows must belong to their cell."
                )
        stamped.append({**dict(zip(key_columns, key)), **row})
    return stamped


def _by_table(step: Step, result) -> dict:
    """A cell's result as ``{table name: rows}``: a list is the rows of the step's only table."""
    names = [table.name for table in step.tables]
    if isinstance(result, dict):
        if set(result) != set(names):
            raise CellResultError(f"`compute` must return rows for the tables {names}; it returned {sorted(result)}.")
        return result
    if len(names) != 1:
        raise CellResultError(f"`compute` must return a dict {{table name: rows}} for the tables {names}; it returned "
                        f"{type(result).__name__}.")
    return {names[0]: result}


def _unique_keys(cells, key_columns) -> list:
    """The cells' keys, each once. Two equal cells are a grid value given twice (two spellings of one task,
    ``listops:64:2`` and ``listops:064:2``, that only the study's parsing makes equal): a one-line
    :class:`StudyError`. Two different cells under one key are a bug of the study's ``cells``."""
    keys = [cell_key(cell, key_columns) for cell in cells]
    first = {}
    for key, cell in zip(keys, cells):
        if key in first:
            where = ", ".join(f"{column}={value!r}" for column, value in zip(key_columns, key))
            if canonical(cell) == canonical(first[key]):
                raise StudyError(f"the grid holds the cell ({where}) twice: a value of a list option is given "
                                 "twice, perhaps written two ways; give each value once.")
            raise CellResultError(f"two cells share the key {dict(zip(key_columns, key))}; cell keys must be unique.")
        first[key] = cell
    return keys


def _check(steps, scheduler, workers, flush_every_seconds) -> None:
    if not all(isinstance(step, Step) and isinstance(cells, list) for step, cells in steps):
        raise TypeError("`steps` must be a sequence of (Step, list of cells) pairs.")
    names = [table.name for step, _ in steps for table in step.tables]
    if len(set(names)) != len(names):
        raise ValueError(f"two steps write the same table; tables: {names}.")
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


def run_steps(steps: Sequence, out, *, config: dict, run_info: dict | None = None, config_path=None,
              scheduler: str | None = None, workers: int | None = None, progress: bool = True,
              flush_every_seconds: float = 5.0, restart: bool = False, grows=()) -> dict:
    """Compute every cell not yet in its tables, step by step; return every table.

    Parameters
    ----------
    steps : sequence of (Step, list of dict)
        Each step with its cells, in the order their rows appear in its tables. A cell holds at least
        the step's key columns; its other (picklable) entries are passed to ``compute`` too.
    out : str or os.PathLike
        The output folder: the tables and ``config.json`` go there.
    config : dict
        The grid-defining configuration; hashed and saved.
    run_info : dict, optional
        Saved in ``config.json`` but not hashed (command line, device, executor).
    config_path : str or os.PathLike, optional
        Default ``out / "config.json"``.
    scheduler, workers
        A running Dask scheduler's address, or the size of a local Dask cluster; neither: in-process.
    progress : bool
        Report progress on stderr (a tqdm bar on a terminal, else a line at every tenth of the cells and
        at least every ten minutes while cells finish).
    flush_every_seconds : float
        Rewrite a table after a finished cell when at least this long has passed since the last write
        (``0``: after every cell); always at the end of its step. Finished cells are durable in the
        journal in between, whatever this is.
    restart : bool
        Discard the tables (and accept a changed config) instead of resuming.
    grows : sequence of str
        Config entries along which a saved run may be extended (more windows, more methods): a config
        that differs from the saved one only by growing these resumes it, computing the new cells
        (:func:`~approxlab.studies.engine.record.extension`). Each must only add cells, never change one.

    Returns
    -------
    dict of str -> pandas.DataFrame
        Every table of the steps as re-read from its file (so it equals the file).

    Raises
    ------
    StudyError
        A saved config of another hash, tables without their ``config.json``, or files that cannot
        be read as approxlab's.
    approxlab.studies.engine.OutputLockedError
        Another process holds the lock of ``out``.
    """
    steps = [(step, list(cells)) for step, cells in steps]
    _check(steps, scheduler, workers, flush_every_seconds)
    keys = [_unique_keys(cells, step.key) for step, cells in steps]
    out = pathlib.Path(out)
    config_path = pathlib.Path(config_path) if config_path is not None else out / "config.json"
    paths = [out / table.name for step, _ in steps for table in step.tables]
    with output_lock(out, command=(run_info or {}).get("command")):
        record = prepare_record(config_path, paths, config, run_info, restart, grows)
        tables = [[_Table(out / table.name, step.key, {key: i for i, key in enumerate(step_keys)}, table.split)
                   for table in step.tables] for (step, _), step_keys in zip(steps, keys)]
        write_json_atomic(record, config_path)
        with Executor(scheduler, workers) as executor:
            for (step, cells), step_keys, step_tables in zip(steps, keys, tables):
                done = set.intersection(*(table.done for table in _deciding(step, step_tables)))
                todo = [(key, cell) for key, cell in zip(step_keys, cells) if key not in done]
                bar = progress_bar(len(cells), len(cells) - len(todo), progress, f"{out.name}/{step.tables[0].name}",
                                   work=sum(step.cell_cost(cell) for _, cell in todo))
                _run_todo(executor, todo, step, step_tables, bar, flush_every_seconds)
        for table in (table for step_tables in tables for table in step_tables):
            if not has_results(table.path):
                write_table(table.frame(), table.path, table.key_columns)
        return {path.name: read_results(path) for path in paths}


def _deciding(step, tables):
    """The tables whose cells say which of a step's cells are done: its tables that are not optional (an optional
    one -- per-layer rows kept out of the repository, a table added after the run was made -- is filled by the
    cells computed from now on, and a cell the others hold is not computed again for it); its first table when
    every one is optional (a step the report does without, whose per-layer table beside it may be absent from a
    clone)."""
    required = [table for table, declared in zip(tables, step.tables) if not declared.optional]
    return required or tables[:1]


def _run_todo(executor, todo, step, tables, bar, flush_every_seconds):
    """Compute the cells of ``todo`` into ``tables``; flush them every so often and always at the end."""
    last_flush = time.monotonic()
    by_name = {table.path.name: table for table in tables}
    optional = {declared.name: declared.optional for declared in step.tables}

    def finished(key, cell, result):
        nonlocal last_flush
        rows = _by_table(step, result)
        for name, table in by_name.items():  # check every table's rows before journaling any
            rows[name] = _stamp(cell, key, table.key_columns, rows[name], name, optional[name])
        for name, table in by_name.items():
            table.add(key, rows[name])
        advance(bar, step.cell_cost(cell))
        if time.monotonic() - last_flush >= flush_every_seconds:
            for table in tables:
                table.flush()
            last_flush = time.monotonic()

    try:
        if step.group:
            executor.run(_groups(todo, step.group), step.compute, _each(finished))
        else:
            executor.run(todo, step.compute, finished)
    finally:
        bar.close()
        for table in tables:
            table.flush()


def _groups(todo, columns) -> list:
    """``todo``'s cells gathered by their values of ``columns`` (a step's ``group``), in the order each group first
    appears: ``[(keys, cells)]``, each computed by one call of the step's ``compute``."""
    groups = {}
    for key, cell in todo:
        keys, cells = groups.setdefault(cell_key(cell, columns), ([], []))
        keys.append(key)
        cells.append(cell)
    return [(tuple(keys), cells) for keys, cells in groups.values()]


def _each(finished):
    """``finished`` for a group's cells (:func:`_groups`): its results, one per cell, reported cell by cell."""

    def finished_group(keys, cells, results):
        if not isinstance(results, list) or len(results) != len(cells):
            raise CellResultError(f"`compute` of a step with a `group` must return a list of one result per cell "
                                  f"({len(cells)}); it returned {type(results).__name__}"
                                  f"{f' of length {len(results)}' if isinstance(results, list) else ''}.")
        for key, cell, result in zip(keys, cells, results):
            finished(key, cell, result)

    return finished_group


def run_cells(cells: Iterable[dict], compute: Callable[[dict], list], *, results_path, key_columns: Sequence[str],
              config: dict, run_info: dict | None = None, config_path=None, scheduler: str | None = None,
              workers: int | None = None, progress: bool = True, flush_every_seconds: float = 5.0,
              restart: bool = False, grows=()) -> pd.DataFrame:
    """:func:`run_steps` for one table: compute every cell not yet in ``results_path``; return the table.

    ``compute(cell) -> list[dict]``; ``key_columns`` identify a cell; the other parameters are those of
    :func:`run_steps` (``config.json`` goes beside ``results_path`` unless ``config_path`` says otherwise).
    """
    key_columns = list(key_columns)
    if not key_columns or not all(isinstance(c, str) for c in key_columns):
        raise ValueError(f"`key_columns` must be a non-empty list of column names; got {key_columns!r}.")
    if not callable(compute):
        raise TypeError(f"`compute` must be callable; got {type(compute).__name__}.")
    results_path = pathlib.Path(results_path)
    step = Step(tables=(Table(results_path.name, tuple(key_columns)),), compute=compute)
    tables = run_steps([(step, list(cells))], results_path.parent, config=config, run_info=run_info,
                       config_path=config_path, scheduler=scheduler, workers=workers, progress=progress,
                       flush_every_seconds=flush_every_seconds, restart=restart, grows=grows)
    return tables[results_path.name]
