"""One loader of a run's saved files, for every study's report step (``--plot-only``).

:func:`load` reads a study's tables and its ``config.json`` from an output folder, refusing in one
line a folder without them (the message says to run the compute step first); the report step then
reads only this :class:`Saved` -- never the data or a model -- so a figure and a summary can always
be redrawn from the saved results.

Public API::

    load(study, out) -> Saved
    Saved.config, Saved.record, Saved.run, Saved.command, Saved.table(name), Saved.product(name)
"""

from __future__ import annotations

import pathlib

import pandas as pd

from ...errors import StudyError
from ..engine.record import read_timing, saved_config
from ..engine.store import has_results, read_json, read_results, stored_as

__all__ = ["Saved", "load"]


class Saved:
    """A run's saved files: its config, its record, its tables and (computed once) its derived tables.

    Attributes
    ----------
    study : approxlab.studies.Study
    out : pathlib.Path
        The output folder.
    config : dict
        The grid-defining config of ``config.json``.
    record : dict
        The whole ``config.json`` (the config, its hash, the tables, the run).
    """

    def __init__(self, study, out, config: dict, record: dict, tables: dict):
        self.study, self.out, self.config, self.record = study, pathlib.Path(out), config, record
        self._tables, self._products = tables, {}

    @property
    def run(self) -> dict:
        """What ``config.json`` records of the run (command, device, executor, threads, ...)."""
        return self.record.get("run", {}) or {}

    @property
    def command(self) -> str:
        """The command line of the run (``approxlab <study>`` when it was not recorded)."""
        return self.run.get("command", f"approxlab {self.study.name}")

    @property
    def timing(self) -> list[dict]:
        """The compute runs made into the folder (``timing.json``)."""
        return read_timing(self.out)

    def table(self, name: str) -> pd.DataFrame:
        """A saved table (empty for an optional table the run did not write)."""
        return self._tables[name]

    def product(self, name: str) -> pd.DataFrame:
        """A derived table of the study (:class:`~approxlab.studies.Product`), computed once."""
        if name not in self._products:
            products = {product.name: product for product in self.study.products}
            if name not in products:
                raise KeyError(f"study {self.study.name!r} derives no table {name!r}; it derives {sorted(products)}.")
            self._products[name] = products[name].make(self)
        return self._products[name]


def load(study, out) -> Saved:
    """The saved files of ``study`` in ``out``.

    Raises
    ------
    StudyError
        A table the report needs is missing, holds no rows, or ``config.json`` is missing or damaged;
        the message names the file and says to run the compute step.
    approxlab.errors.CorruptResultsError
        A table cannot be read as one.
    """
    out = pathlib.Path(out)
    tables = study.tables
    for table in tables:
        if not table.optional and not has_results(stored_as(out / table.name)):
            raise StudyError(f"no {table.name} in {str(out)!r}: run the study's compute step first (without "
                             "--plot-only).")
    main = next(table for table in tables if not table.optional)
    config = saved_config(out / "config.json", main.name)
    record = read_json(out / "config.json")
    frames = {}
    for table in tables:
        path = stored_as(out / table.name)  # a folder saved before the table's name changed compression too
        frames[table.name] = read_results(path, required=table.required) if has_results(path) else pd.DataFrame()
    if frames[main.name].empty:
        raise StudyError(f"{str(out / main.name)!r} holds no rows yet: nothing to plot; rerun without "
                         "--plot-only.")
    return Saved(study, out, config, record, frames)
