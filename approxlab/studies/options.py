"""The options of the studies: the common ones, and one shared set whose meaning is the same everywhere.

Every study gets the common options (:func:`add_common`: ``--out``, ``--quick``, ``--device``,
``--data-dir``, ``--cache-dir``, ``--restart``, ``--no-progress``, ``--plot-only``, ``--plugin``,
``--scheduler`` or ``--workers``, ``--threads``). A study's grid options come from the shared set
below wherever one fits, so that ``--n 512 1024`` and ``--n 512,1024`` mean the same in every study,
with the same ``nargs``, type and error messages (a study may only change the default and the help):

==================  ===========================================================================
``--methods``       registered method names (:func:`approxlab.methods.available`), a list
``--conditions``    ``initialized`` / ``pretrained``, a list
``--n``             sequence lengths, integers >= 1, a list
``--num-features``  the number of features d, integers >= 1, a list (a study that takes one d says so)
``--windows``       the number of WikiText-2 windows, an integer >= 1
``--seeds``         the number of seeds, an integer >= 1
``--steps``         training steps per run, an integer >= 1
``--tasks``         ``NAME:N[:...]`` task entries, a list (each study reads its own fields)
``--layers``        layer indices, ``first`` / ``middle`` / ``last``, or ``all``, a list
``--positions``     positions beyond BERT's 512-row table: ``interpolate``, ``copy`` or ``none``
``--checkpoint``    the model: a Hub id, a local folder or a ``.gguf`` file
==================  ===========================================================================

A value that fails an option's type is argparse's one-line error (``argument --n: comma-separated
integers >= 1, got '0'``); :func:`grid` applies the option's own type, in the same words, to values
given in code (:meth:`approxlab.studies.Study.arguments`).

Two rules hold for every list option of every study, shared or its own, and for values given in code:

* **a value given twice is refused** in one line (``--methods: each value at most once, got
  'performer,performer' ('performer' given more than once)``), never silently computed twice or merged:
  :func:`check_distinct`, applied by :func:`check_option_pairs` to every list option of the command line
  and by :func:`check_value` to values given in code; a study that reads entries into a canonical form
  (``listops:64:2`` and ``listops:064:2``) applies it to the parsed entries too;
* **a number a study would have to lower is refused**, never clamped: ``--num-features`` above what a
  method allows at some ``n`` (or above ``n`` where the study hands ``min(d, n)`` to its models) is a
  one-line error (:func:`approxlab.studies.checks.check_num_features`), so the d in ``config.json`` and
  the summary is the d computed.

Public API::

    add_common(parser), default_output_dir(study, quick=False), RESULTS_FOLDER
    METHODS, CONDITIONS_OPTION, N, NUM_FEATURES, WINDOWS, SEEDS, STEPS, TASKS, LAYERS, POSITIONS, CHECKPOINT
    SHARED                                    # {dest: Option} of the shared set
    grid(defaults, args, options) -> dict     # the grid with the given options put in, each checked
    check_value(option, value)                # a value given in code, checked as the command line checks it
    shown_default(value), with_grid_default(option, full, quick)  # --help's defaults, read from the grids
    check_distinct(option, values, shown=None)  # a list option's values, each at most once
    one_value(option, values) -> int          # a list option that this study takes once
    str_list, int_list, names_among, positive_int, nonnegative_int, int_at_least, positive_float, probability,
    path_option, thread_count, Flatten        # the value types (:mod:`approxlab.studies.option_types`)
    check_option_pairs(args, parser)
    REMOVED_IN                                # the version that removes a deprecated flag (the next minor)
"""

from __future__ import annotations

import argparse
import pathlib

from .. import __version__
from ..errors import UsageError
from .declaration import DeprecatedAlias, Option
from .option_types import (Flatten, check_distinct, int_at_least, int_list, layer_list, method_list, names_among,
                           nonnegative_int, number_list, path_option, positive_float, positive_int, probability,
                           ratio_list, str_list, thread_count)


def _next_minor(version: str) -> str:
    """The minor version after ``version``: ``"0.1.0"`` -> ``"0.2.0"``."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"{major}.{minor + 1}.0"


REMOVED_IN = _next_minor(__version__)
"""The version that removes an option's deprecated flags (:attr:`~approxlab.studies.Option.deprecated`): the
next minor one. ``METHODS.but(deprecated={"--approximations": REMOVED_IN})`` keeps an old flag working until
then, with one line on stderr."""

__all__ = ["RESULTS_FOLDER", "default_output_dir", "add_common", "METHODS", "CONDITIONS_OPTION", "N",
           "NUM_FEATURES", "WINDOWS", "SEEDS", "STEPS", "TASKS", "LAYERS", "POSITIONS", "CHECKPOINT", "SHARED",
           "CONDITIONS", "POSITION_MODES", "grid", "check_value", "check_distinct", "one_value", "str_list",
           "int_list", "names_among", "positive_int", "nonnegative_int", "int_at_least", "positive_float",
           "probability", "number_list", "ratio_list", "path_option", "thread_count", "Flatten", "check_option_pairs",
           "PLOT_ONLY_OPTIONS",
           "shown_default", "with_grid_default"]

RESULTS_FOLDER = "approxlab-results"
"""The folder, in the current directory, that holds every study's default output folder."""

CONDITIONS = ("initialized", "pretrained")
"""The model conditions: weights drawn from a seed, or the pretrained checkpoint."""

POSITION_MODES = ("interpolate", "copy", "none")
"""How positions beyond BERT's 512-row table enter X (:func:`approxlab.data.qkv.position_embeddings`)."""


def default_output_dir(study: str, *, quick: bool = False) -> pathlib.Path:
    """Where ``approxlab <study>`` writes unless ``--out`` is given: ``approxlab-results/<study>``.

    The path is relative to the current directory, so a run never writes inside the installed
    package or the committed ``figures/`` of a source checkout (those are written only when named
    with ``--out``); ``quick`` (``--quick``) gives ``approxlab-results/<study>-quick``, so a smoke
    run never resumes into, or is refused by, the full run's folder.

    Examples
    --------
    >>> default_output_dir("figure1").as_posix()
    'approxlab-results/figure1'
    >>> default_output_dir("sv-decay", quick=True).as_posix()
    'approxlab-results/sv-decay-quick'
    """
    return pathlib.Path(RESULTS_FOLDER) / (f"{study}-quick" if quick else study)


# ---------------------------------------------------------------- the shared set

condition_list = names_among(CONDITIONS, "conditions")
"""Model conditions among :data:`CONDITIONS` (commas or spaces)."""




def _listed(flags, dest, kind, help_text, metavar):
    return Option(flags, dest, help_text, type=kind, nargs="+", action=Flatten, metavar=metavar)


METHODS = _listed(("--methods",), "methods", method_list, "approximations to run: registered method names "
                  "(built-in or --plugin), comma-separated", "NAMES")
CONDITIONS_OPTION = _listed(("--conditions",), "conditions", condition_list,
                            "model conditions: initialized (seeded weights), pretrained", "NAMES")
N = _listed(("--n",), "n", int_list, "sequence lengths, comma-separated", "N")
NUM_FEATURES = _listed(("--num-features",), "num_features", int_list,
                       "numbers of features d (landmarks, random features, ...), comma-separated; a d above what a "
                       "method allows at some n is refused, never lowered", "D")
WINDOWS = Option(("--windows",), "windows", "number of WikiText-2 windows", type=positive_int, metavar="COUNT")
SEEDS = Option(("--seeds",), "seeds", "number of seeds", type=positive_int, metavar="COUNT")
STEPS = Option(("--steps",), "steps", "training steps per run", type=positive_int, metavar="COUNT")
TASKS = _listed(("--tasks",), "tasks", str_list, "task entries NAME:N[:...], comma-separated", "ENTRIES")
LAYERS = _listed(("--layers",), "layers", layer_list,
                 "layers: indices, first, middle, last (comma-separated), or all", "LAYERS")
POSITIONS = Option(("--positions",), "positions", "positions beyond BERT's 512-row table: interpolate (the table "
                   "resampled linearly to n rows), copy (Longformer: repeated every 512), none (no positions)",
                   choices=POSITION_MODES, default="interpolate")
CHECKPOINT = Option(("--checkpoint",), "checkpoint", "the model: a Hub id (with network), a local folder or a "
                    ".gguf file, with its tokenizer", metavar="NAME_OR_DIR")

SHARED = {option.dest: option for option in (METHODS, CONDITIONS_OPTION, N, NUM_FEATURES, WINDOWS, SEEDS, STEPS,
                                             TASKS, LAYERS, POSITIONS, CHECKPOINT)}
"""The shared options by ``dest``; a study's copy (:meth:`~approxlab.studies.Option.but`) keeps type and nargs."""

def check_value(option: Option, value) -> None:
    """``value`` given in code for ``option``, checked by the option's own type or choices: the checks of the
    command line, in its words (``--n: comma-separated integers >= 1, got [0]``); a list without repeats
    (:func:`check_distinct`)."""
    entries = list(value) if isinstance(value, (list, tuple)) else [value]
    if option.choices is not None:
        choices = list(option.choices() if callable(option.choices) else option.choices)
        if not entries or not all(entry in choices for entry in entries):
            raise UsageError(option.flags[0], f"one of {choices}", value)
    elif option.type is not None:
        try:
            option.type(",".join(map(str, entries)) if option.nargs else str(value))
        except argparse.ArgumentTypeError as error:
            raise UsageError(option.flags[0], str(error).rsplit(", got ", 1)[0], value) from None
    if isinstance(value, (list, tuple)):
        check_distinct(option.flags[0], value)


def grid(defaults: dict, args, options) -> dict:
    """``defaults`` with the values of ``options`` in ``args`` put in where given (not None), each checked
    (:func:`check_value`).

    ``options``: :class:`~approxlab.studies.Option` s, or ``dest`` names of the shared set; those whose
    ``dest`` is a key of ``defaults`` are put in (a list copied; ``n`` and ``num_features`` sorted), the
    others only checked. A list with a value given twice is refused (:func:`check_distinct`).

    Raises
    ------
    UsageError
        A value the option does not allow, or a list that holds one twice.
    """
    values = dict(defaults)
    for option in options:
        option = SHARED[option] if isinstance(option, str) else option
        value = getattr(args, option.dest, None)
        if value is None:
            continue
        check_value(option, value)
        if option.dest in defaults:
            values[option.dest] = list(value) if isinstance(value, (list, tuple)) else value
    for name in ("n", "num_features"):
        if isinstance(values.get(name), list) and name in defaults:
            values[name] = sorted(int(x) for x in values[name])
    return values


def shown_default(value) -> str:
    """A grid value as a command line writes it: ``[16, 64]`` -> ``"16,64"``, ``[]`` -> ``"none"``, a task entry
    ``{"task": "listops", "n": 64, "batch_size": 4}`` -> ``"listops:64:4"`` (its plain fields, in order), a
    mapping by n ``{"512": 12}`` -> ``"12 at 512"``.

    Examples
    --------
    >>> shown_default([{"task": "text", "n": 256, "batch_size": 8, "seeds": 40}, {"task": "listops", "n": 64}])
    'text:256:8:40,listops:64'
    >>> shown_default({"512": 12, "2048": 3}), shown_default(1e-06), shown_default([])
    ('12 at 512, 3 at 2048', '1e-06', 'none')
    """
    if isinstance(value, (list, tuple)):
        return ",".join(map(shown_default, value)) if value else "none"
    if isinstance(value, dict) and "task" in value:
        return ":".join(str(v) for v in value.values() if isinstance(v, (str, int, float)))
    if isinstance(value, dict):
        return ", ".join(f"{shown_default(v)} at {k}" for k, v in value.items())
    return str(value)


def with_grid_default(option: Option, full: dict, quick: dict) -> Option:
    """``option`` with its default read from the study's declared grids appended to its help: ``(default 16,64;
    --quick 8)``, so ``--help`` never states another grid's values. An option outside the grid, or whose grid value
    is None (resolved when the run is configured; its help says how, as ``(default: ...)``), keeps its help."""
    if option.dest not in full or full[option.dest] is None or option.help == argparse.SUPPRESS:
        return option
    default, short = shown_default(full[option.dest]), shown_default(quick.get(option.dest, full[option.dest]))
    return option.but(help=f"{option.help} (default {default}{'' if short == default else f'; --quick {short}'})")


def one_value(option: str, values) -> int:
    """The one value of a list option (``--num-features``) that a study takes once; else a :class:`UsageError`."""
    if isinstance(values, (list, tuple)):
        if len(values) != 1:
            raise UsageError(option, "one value for this study", ",".join(map(str, values)))
        values = values[0]
    return int(values)


# ---------------------------------------------------------------- the common options


def add_common(parser: argparse.ArgumentParser, study: str = "<study>") -> None:
    """Add the options every study shares to ``parser``."""
    from .engine.environment import DEFAULT_THREADS, THREADS_PER_CPU, max_threads

    group = parser.add_argument_group("common study options")
    group.add_argument("--out", type=path_option, default=None, metavar="DIR",
                       help="output directory (results.csv, config.json, figures, summary.md); default: "
                            f"{RESULTS_FOLDER}/{study} in the current directory ({RESULTS_FOLDER}/{study}-quick "
                            "with --quick). The committed figures/<study> is written only when named here")
    group.add_argument("--quick", action="store_true", help="small grid for a smoke run (minutes)")
    group.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="device for the computation (default: cpu)")
    group.add_argument("--data-dir", type=path_option, default=None, metavar="DIR",
                       help="the corpus: a folder with wikitext-2-raw/wiki.test.raw, the file itself, or 'hf:wikitext' "
                            "to download it (default: $APPROXLAB_DATA, else the copy shipped with approxlab)")
    group.add_argument("--cache-dir", type=path_option, default=None, metavar="DIR",
                       help="cache for extracted Q/K/V (default: the data module's cache)")
    group.add_argument("--restart", action="store_true", help="discard saved results in --out instead of resuming")
    group.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    group.add_argument("--plot-only", action="store_true",
                       help="do not compute: redraw the figure and summary from the saved CSV")
    group.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import MODULE (repeatable), which registers methods (approxlab.methods.register) or "
                            "studies (approxlab.studies.register), here and in every Dask worker")
    executor = group.add_mutually_exclusive_group()
    executor.add_argument("--scheduler", default=None, metavar="ADDRESS",
                          help="run cells on a Dask scheduler, e.g. tcp://host:8786")
    executor.add_argument("--workers", type=positive_int, default=None, metavar="N",
                          help="run cells on a local Dask cluster of N worker processes")
    group.add_argument("--threads", type=thread_count, default=None, metavar="N",
                       help="torch threads of this process and of each --workers process (default: "
                            f"$OMP_NUM_THREADS, else $MKL_NUM_THREADS, else {DEFAULT_THREADS}: "
                            "measured faster than a thread per core on a loaded 2-core machine); at most "
                            f"{THREADS_PER_CPU} per CPU this process may run on ({max_threads()} here): more threads "
                            "only take turns on the same cores, and a count in the thousands makes OpenMP fail to "
                            "allocate their stacks")


PLOT_ONLY_OPTIONS = ("out", "quick", "progress", "plot_only", "plugin")
"""The options that mean something with ``--plot-only``: which folder to redraw, progress, and the
plugins whose methods the figures and summary describe."""


def check_option_pairs(args, parser: argparse.ArgumentParser) -> None:
    """Options that contradict each other, repeat a value, or would be silently ignored, are a :class:`UsageError`.

    * an empty string for any option (``--checkpoint ""``: not a name; paths use :func:`path_option`);
    * a value given twice in a list option (``--methods performer,performer``, ``--parts scale scale``):
      :func:`check_distinct`, the rule of every list option of every study;
    * ``--plot-only`` with ``--restart`` (one redraws the saved results, the other discards them);
    * ``--plot-only`` with any option that only shapes the computation (``--n``, ``--workers``,
      ``--device``, ...): the figure is redrawn from the saved results and their ``config.json``.
    """
    actions = {action.dest: action for action in parser._actions
               if action.option_strings and not isinstance(action, DeprecatedAlias)}  # named by their new flag
    for dest, action in actions.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise UsageError(action.option_strings[0], "a non-empty value", repr(value))
        if action.nargs in ("+", "*") and isinstance(value, list):
            check_distinct(action.option_strings[0], value)
    if not getattr(args, "plot_only", False):
        return
    if getattr(args, "restart", False):
        raise UsageError("--restart", "not with --plot-only (it discards the saved results that --plot-only redraws; "
                                      "use one of the two)", "both")
    for dest, action in actions.items():
        if dest in PLOT_ONLY_OPTIONS or dest == "restart" or action.default == argparse.SUPPRESS:
            continue
        if getattr(args, dest, None) != action.default:
            raise UsageError(action.option_strings[0], "not with --plot-only (the figure is redrawn from the saved "
                                                       "results and their config.json; drop one of the two)",
                             repr(getattr(args, dest)))
