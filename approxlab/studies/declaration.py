"""What a study declares: its tables, cells, options, claims, figures and summary.

A study is one :class:`Study` object. It says *what* is computed and reported; the engine, the
driver and the reporting of :mod:`approxlab.studies` own *how* (resume, journal, lock, Dask,
timing, markdown, verdicts), once for every study. The types here hold data and functions only:
they import nothing from approxlab, so every layer of the studies may use them.

Public API::

    Study(name, description, full, quick, configure, steps, options=(), check=None, settings=None,
          run_info=None, claims=(), products=(), figures=(), summary=None, devices=("cpu", "cuda"),
          executors=("process", "local", "scheduler"), executor_note="", flush_every_seconds=5.0, grows=())
    Step(tables, compute, cells, group=(), cost=None)  # one kind of cell and the tables its rows go to
    Table(name, key, required=(), optional=False, split=None)
    Option(flags, dest, help, type=None, nargs=None, action=None, choices=None, default=None, metavar=None,
           grid=True, deprecated={})   # deprecated: {old flag: the approxlab version that removes it}
    DeprecatedAlias                     # the argparse action of an old flag (both from :mod:`.option_declaration`)
    Claim(id, text, statistic, side, threshold, unit="window", interval="bootstrap", aggregations=("median",),
          power_goal=None, min_units=None, labels={}, quantity=None, strict=False, scale="linear",
          paper_value=None)
    Product(name, make)                 # a table derived from the saved ones by the report step
    Figure(name, draw)                  # a figure drawn from the saved tables
    Summary(title, sections, file="summary.md", generated=True)

See ``docs/studies/writing.rst`` ("Writing a study") for a whole study declared in about 150 lines.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Mapping

from .._io import TABLE_SUFFIXES
from .option_declaration import DeprecatedAlias, Option

__all__ = ["Study", "Step", "Table", "Claim", "Product", "Figure", "Summary", "EXECUTORS"]
# Option and DeprecatedAlias are imported here too (from .option_declaration, where they are documented)

EXECUTORS = ("process", "local", "scheduler")
"""Where a study's cells may run: in this process, on a local Dask cluster (``--workers``), on a
running Dask scheduler (``--scheduler``)."""


@dataclasses.dataclass(frozen=True)
class Table:
    """A results table of a study: a tidy CSV in the output folder, one or more rows per cell.

    Attributes
    ----------
    name : str
        File name, e.g. ``"results.csv"``; ``.csv.gz`` or ``.csv.bz2`` for a table stored compressed (one too
        large to commit as text).
    key : tuple of str
        The columns that identify a cell (the runner stamps them on every row and resumes by them).
    required : tuple of str
        Columns the report step reads (a table without them, e.g. another study's, is refused).
    optional : bool
        The report step does without this table (a run made before it existed), and in a step with a table that
        is not optional a run resumes by that one: a cell it holds is not computed again to fill this one. In a
        step whose tables are all optional, the first one decides.
    split : str, optional
        A key column to store the table by: one file per value (``results.length=2048.csv.gz``, ...), each with its
        manifest, so that no file of a growing run outgrows what a repository takes
        (:func:`~approxlab.studies.engine.parts.part_path`). Readers still name the table (``results.csv.gz``). A
        folder saved whole before is split at the next run's first write. Best the outermost column of the cell
        order: the parts are read one after the other.
    """

    name: str
    key: tuple
    required: tuple = ()
    optional: bool = False
    split: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.endswith(TABLE_SUFFIXES) or "/" in self.name:
            raise ValueError(f"`name` must be a file name ending in {', '.join(TABLE_SUFFIXES)}; got {self.name!r}.")
        if not self.key or not all(isinstance(column, str) for column in self.key):
            raise ValueError(f"`key` must be a non-empty tuple of column names; got {self.key!r}.")
        if self.split is not None and self.split not in self.key:
            raise ValueError(f"`split` must be one of the key columns {tuple(self.key)} or None; got {self.split!r}.")
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "required", tuple(self.required))


@dataclasses.dataclass(frozen=True)
class Step:
    """One kind of cell of a study: how a config becomes cells, and what one cell computes.

    Attributes
    ----------
    tables : tuple of Table
        The tables the cells' rows go to; they share one key (the cell's key).
    compute : callable
        ``compute(cell) -> rows``: a module-level function (Dask pickles it) that returns the rows of
        one cell -- a list of dicts for a single table, or ``{table name: list of dicts}`` for several.
        Every table gets at least one row, but an optional one may get none (the per-layer rows of a method
        that failed before it reached a layer). It must take its randomness from the cell
        (:func:`~approxlab.studies.engine.cell_seed`) and write no file.
    cells : callable
        ``cells(config, settings) -> list of dict``: the cells, in the order their rows appear in
        the tables. ``settings`` holds what is not part of the grid (``data_dir``, ``cache_dir``,
        ``device`` and the study's own :attr:`Study.settings`); it may travel in the cells.
    group : tuple of str
        Key columns of cells that share work (one sequence's exact prefill): the cells still to compute that
        agree on them are computed in one call, ``compute(cells) -> list of results`` (one result per cell, in
        order, each what ``compute(cell)`` returns without a group), on one worker; each is then saved as a cell
        of its own. A kill loses the group in flight. Empty (the default): ``compute(cell)`` per cell.
    cost : callable, optional
        ``cost(cell) -> float``: the cell's expected time relative to the step's other cells, used only by the
        progress bar's and log's remaining time (a long-context sequence's tokens: a cell at 8,192 tokens takes
        about four of one at 2,048). None (the default): every cell alike.
    """

    tables: tuple
    compute: Callable
    cells: Callable | None = None
    group: tuple = ()
    cost: Callable | None = None

    def __post_init__(self):
        tables = tuple(self.tables)
        if not tables or not all(isinstance(table, Table) for table in tables):
            raise ValueError(f"`tables` must be a non-empty tuple of Table; got {self.tables!r}.")
        if len({table.key for table in tables}) != 1:
            raise ValueError(f"the tables of one step must share their key; got {[t.key for t in tables]}.")
        if not callable(self.compute):
            raise TypeError(f"`compute` must be callable; got {type(self.compute).__name__}.")
        if self.cost is not None and not callable(self.cost):
            raise TypeError(f"`cost` must be callable or None; got {type(self.cost).__name__}.")
        if isinstance(self.group, str) or not set(self.group) <= set(tables[0].key):
            raise ValueError(f"`group` must be a tuple of the key columns {tables[0].key}; got {self.group!r}.")
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "group", tuple(self.group))

    @property
    def key(self) -> tuple:
        """The key columns of the step's cells (those of its tables)."""
        return self.tables[0].key

    def cell_cost(self, cell: dict) -> float:
        """The cell's relative expected time by :attr:`cost` (one a cell without)."""
        return 1.0 if self.cost is None else float(self.cost(cell))


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of a paper, as a study tests it: a statistic, a threshold and how to decide.

    Attributes
    ----------
    id : str
        Short name (``"a"``, ``"kappa"``); a row of the verdict table.
    text : str
        The claim in words (may hold ``{placeholders}`` the study fills in).
    statistic : str
        What is computed (in words).
    side : {"at least", "above", "at most", "below"}
        The side of ``threshold`` on which the claim holds (:data:`approxlab.stats.SIDES`).
    threshold : float
        Fixed in code before the run.
    unit : str
        The resampling unit (windows, seeds): the independent draws an interval is over.
    interval : {"bootstrap", "bootstrap-se", "t", "welch"}
        Percentile bootstrap over units; the bootstrap's standard error with Student-t quantiles
        (reaches beyond the range of a few units, where a percentile interval cannot); Student t on the
        units' values; Welch t on two groups. The summary states how often the chosen interval covers a
        known truth at the run's unit count (:func:`approxlab.studies.reporting.claims.coverage`).
    aggregations : tuple of str
        Statistics over the units the claim is judged under (``"median"``, ``"mean"``, ...).
    power_goal : float, optional
        When set, an undecided verdict whose power (at the effect the study sizes for, declared
        before the run) is below it is "not confirmed (underpowered)".
    min_units : int, optional
        Fewer units than this: no verdict is given (labelled as ``labels["too few units"]``). Fewer
        than 2 never give one, whatever this says.
    labels : mapping
        The study's words for the outcomes ``"reproduced"``, ``"not reproduced"``,
        ``"inconclusive"``, ``"rejects paper"``, ``"underpowered"`` and ``"too few units"``
        (:data:`approxlab.studies.reporting.claims.LABELS` where not given).
    quantity : str, optional
        The column the statistic is computed from, where it is one.
    strict : bool
        A verdict either way needs the interval to exclude the threshold (a bound equal to it
        decides nothing); otherwise the threshold itself counts as on the side ``side`` names
        (:func:`approxlab.stats.verdict`).
    scale : {"linear", "log"}
        The scale of a ``"bootstrap-se"`` interval: ``"log"`` for a positive statistic such as a ratio.
    paper_value : float, optional
        The paper's own value of the statistic, where one value serves every row: an undecided
        interval that excludes it "rejects the paper's value" (a study with one paper value per
        row passes it to :func:`~approxlab.studies.reporting.claims.judge` instead).
    varies : str
        The level at which the claim's units vary, in words (``"window"``, ``"seed"``, ``"head within layer x
        window"``, ``"method"``): what an interval's units are draws of. Default: ``unit``.
    within : str, optional
        The clusters the statistic is computed within (stratified: ranks within each layer x window, then
        pooled), where units nest in clusters that differ systematically; None: the units are pooled.
    family : str, optional
        The family of claims it is judged with (a Holm-adjusted p-value within the family is stated beside
        each per-comparison verdict, :func:`~approxlab.studies.reporting.measured.holm_column`).
    """

    id: str
    text: str
    statistic: str
    side: str
    threshold: float
    unit: str = "window"
    interval: str = "bootstrap"
    aggregations: tuple = ("median",)
    power_goal: float | None = None
    min_units: int | None = None
    labels: Mapping = dataclasses.field(default_factory=dict)
    quantity: str | None = None
    strict: bool = False
    scale: str = "linear"
    paper_value: float | None = None
    varies: str | None = None
    within: str | None = None
    family: str | None = None

    def __post_init__(self):
        if self.varies is None:
            object.__setattr__(self, "varies", self.unit)
        if self.side not in ("at least", "above", "at most", "below"):
            raise ValueError(f"`side` must be 'at least', 'above', 'at most' or 'below'; got {self.side!r}.")
        if self.interval not in ("bootstrap", "bootstrap-se", "t", "welch"):
            raise ValueError(f"`interval` must be 'bootstrap', 'bootstrap-se', 't' or 'welch'; got {self.interval!r}.")
        if self.scale not in ("linear", "log"):
            raise ValueError(f"`scale` must be 'linear' or 'log'; got {self.scale!r}.")


@dataclasses.dataclass(frozen=True)
class Product:
    """A table the report step derives from the saved ones: ``make(saved) -> DataFrame``, written as ``name``."""

    name: str
    make: Callable


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure drawn from the saved tables: ``draw(saved) -> list of paths written``."""

    name: str
    draw: Callable


@dataclasses.dataclass(frozen=True)
class Summary:
    """The markdown summary: a title, then each section's lines (``section(saved) -> list of str``).

    ``generated``: a line under the title says the file is generated by ``approxlab <study>
    --plot-only``. The file ends with a newline.
    """

    title: str
    sections: tuple
    file: str = "summary.md"
    generated: bool = True


@dataclasses.dataclass(frozen=True)
class Study:
    """A study: its name and grid, its cells and tables, its claims, figures and summary.

    Attributes
    ----------
    name : str
        The command (``approxlab <name>``): lowercase letters, digits and ``-``.
    description : str
        One line, listed by ``approxlab``.
    full, quick : mapping
        The full grid and the ``--quick`` one (what :attr:`configure` starts from).
    configure : callable
        ``configure(args) -> config``: the grid-defining config from the parsed options (``args``:
        the common options and :attr:`options`), checked; saved and hashed in ``config.json``. Raises
        :class:`~approxlab.errors.UsageError` naming the option for a value it cannot use.
    steps : tuple of Step
        Run in order; each step's cells resume independently.
    options : tuple of Option
        The study's options, most from the shared set of :mod:`approxlab.studies.options`.
    check : callable, optional
        ``check(args, config)``: the checks against the data and models, before any cell runs.
    settings : callable, optional
        ``settings(args) -> dict``: run settings (not hashed) that the cells need.
    run_info : callable, optional
        ``run_info(args, config) -> dict``: what ``config.json`` records of the run beside the
        command, device, executor, torch version and threads.
    claims : tuple of Claim
        The claims its summary decides.
    products, figures : tuple
        Derived tables (:class:`Product`) and figures (:class:`Figure`) of the report step.
    summary : Summary, optional
        The markdown summary of the report step.
    devices : tuple of str
        The ``--device`` values it runs on.
    executors : tuple of str
        Where its cells may run (:data:`EXECUTORS`); ``executor_note`` says why not elsewhere.
    flush_every_seconds : float
        How often the tables are rewritten while cells finish (they are journaled in between).
    grows : tuple of str
        Config entries along which a saved run may be extended (``--windows 8`` after a run with 4):
        a config that only grows these resumes the saved run and computes the new cells. Name only
        entries whose growth adds cells and changes none (a window id list drawn as a prefix of one
        permutation, a list of methods), never one a cell computes all of at once.
    """

    name: str
    description: str
    full: Mapping
    quick: Mapping
    configure: Callable
    steps: tuple
    options: tuple = ()
    check: Callable | None = None
    settings: Callable | None = None
    run_info: Callable | None = None
    claims: tuple = ()
    products: tuple = ()
    figures: tuple = ()
    summary: Summary | None = None
    devices: tuple = ("cpu", "cuda")
    executors: tuple = EXECUTORS
    executor_note: str = ""
    flush_every_seconds: float = 5.0
    grows: tuple = ()

    def __post_init__(self):
        name = self.name
        if not (isinstance(name, str) and name and name[0].isalpha() and name == name.lower()
                and all(c.isalnum() or c == "-" for c in name)):
            raise ValueError(f"`name` must be lowercase letters, digits and '-', starting with a letter; got {name!r}.")
        if not isinstance(self.description, str) or not self.description.strip() or "\n" in self.description:
            raise ValueError(f"`description` must be one non-empty line; got {self.description!r}.")
        if not self.steps or not all(isinstance(step, Step) for step in self.steps):
            raise ValueError(f"`steps` must be a non-empty tuple of Step; got {self.steps!r}.")
        for field in ("steps", "options", "claims", "products", "figures", "devices", "executors", "grows"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        unknown = set(self.executors) - set(EXECUTORS)
        if unknown:
            raise ValueError(f"`executors` must be among {EXECUTORS}; got {sorted(unknown)}.")
        self._check_unique()

    def _check_unique(self) -> None:
        """Each option flag and destination declared once, each table written by one step: one line naming the
        study, the field and the values that clash (argparse would raise ``ArgumentError`` while it builds the
        command line, and two steps writing one table would overwrite each other's rows)."""
        if not all(isinstance(option, Option) for option in self.options):
            raise ValueError(f"study {self.name!r}: `options` must be a tuple of Option; got "
                             f"{[type(option).__name__ for option in self.options]}.")
        seen = {}
        for option in self.options:
            for what in (*option.flags, *option.deprecated, f"dest={option.dest!r}"):
                if what in seen:
                    raise ValueError(f"study {self.name!r}: `options` declares {what} twice (in the options with "
                                     f"flags {seen[what]} and {list(option.flags)}); declare each option once.")
                seen[what] = list(option.flags)
        writers = {}
        for index, step in enumerate(self.steps):
            for table in step.tables:
                if table.name in writers:
                    raise ValueError(f"study {self.name!r}: `steps` {writers[table.name]} and {index} both write "
                                     f"{table.name!r}; each table is written by one step.")
                writers[table.name] = index

    @property
    def tables(self) -> tuple:
        """Every table its steps write, in step order."""
        return tuple(table for step in self.steps for table in step.tables)

    def arguments(self, quick: bool = False, **values) -> argparse.Namespace:
        """The parsed options as the command line would give them: defaults, then ``values``.

        ``config = study.configure(study.arguments(n=[512]))`` builds a config without a command line.
        """
        args = argparse.Namespace(quick=quick, data_dir=None, cache_dir=None, device="cpu", plot_only=False)
        for option in self.options:
            setattr(args, option.dest, option.default)
        unknown = set(values) - set(vars(args))
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)} of study {self.name!r}; known: "
                            f"{sorted(vars(args))}.")
        for name, value in values.items():
            setattr(args, name, value)
        return args
