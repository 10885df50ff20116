"""``approxlab <study> [options]``: the command line of every study.

The studies come from the registry (:mod:`approxlab.studies.registry`): the built-in ones, those a
``--plugin MODULE`` registers (imported first, here and in every Dask worker) and those installed
packages declare as entry points. Only the named study is loaded, so a study that is missing or
fails to load does not break the others. Every study gets the common options
(:func:`approxlab.studies.options.add_common`) and its own (:attr:`approxlab.studies.Study.options`),
available on ``args`` with ``out`` (a ``pathlib.Path``, resolved before the run: ``--out``, else
``approxlab-results/<study>`` in the current directory), ``threads`` (``--threads``, else
``$OMP_NUM_THREADS``, else ``$MKL_NUM_THREADS``, else 1; torch runs with it here and in each local
Dask worker), ``threads_source`` (where that count came from), ``study`` and ``command`` (the
command line, recorded in ``config.json``); then :func:`approxlab.studies.driver.run` runs it.

``approxlab`` alone, like ``approxlab --help``, prints the studies, one line each, to stdout and
exits 0 (as ``pip`` does: asking what there is is not a mistake; exit status 2 stays reserved
for a command that cannot run). ``approxlab --version`` prints the installed version.

Errors a user can fix print one line on stderr and exit with status 2, in argparse's
form ``approxlab <study>: error: <what>: <what is allowed>, got <what came in>``:
bad option values (argparse, without its usage block), and every
:class:`approxlab.errors.StudyError` (mismatched saved results, CUDA requested but unavailable, a
corpus or windows too small for ``--n``/``--windows``, an unwritable or locked ``--out``, an
unreachable ``--scheduler``; see :mod:`approxlab.studies.checks`). So are damaged result files
(:class:`~approxlab.errors.CorruptResultsError`), options that contradict each other or are empty
(``--out ""``, ``--plot-only`` with ``--restart`` or with a grid option it would ignore), and the
environment refusing a write (a full disk, a read-only file system, a path too long: the
``OSError`` named, nothing half-written). A bug in approxlab itself still shows its traceback.
``SIGINT`` (Ctrl-C) and ``SIGTERM`` stop the run in order: the cells in flight are abandoned, every
finished one is already on disk, and the command exits 130 or 143 with a one-line note that
rerunning it resumes.

Before the study runs, ``--out`` is created and locked: a second run into the same folder exits 2
at once, naming the process that holds it. Progress goes to stderr: a tqdm bar on a terminal,
otherwise a line at every tenth of the cells and at least every ten minutes while cells finish; the bars of
transformers, huggingface_hub and datasets are off while a study runs (:mod:`approxlab.studies.engine.environment`).

Examples
--------
::

    approxlab figure1 --quick              # -> approxlab-results/figure1-quick/
    approxlab figure1 --workers 2          # local Dask cluster, one thread per worker
    approxlab figure1 --out figures/figure1 --plot-only   # redraw the committed figure
    approxlab figure1 --quick --plugin my_attention --methods top-k,skyformer-softmax
    approxlab toy --quick --plugin my_study              # a study the module registers
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import shlex
import signal
import sys

from . import __version__
from .errors import CorruptResultsError, StudyError
from .studies import driver, registry
from .studies.checks import check_common, check_output_dir
from .studies.engine.environment import requested_threads, study_threads, third_party_bars_off
from .studies.options import RESULTS_FOLDER, add_common, check_option_pairs, default_output_dir, with_grid_default

__all__ = ["main", "build_parser"]

_NOT_AVAILABLE = " [not available]"


class _StudyList(argparse.RawDescriptionHelpFormatter):
    """argparse's help layout with one line per study (its description is not wrapped, its name
    not put on a line of its own) and the epilog as written."""

    study_lines: frozenset = frozenset()

    def __init__(self, prog):
        width = 4 + max(map(len, registry.available()))  # a study's name, indented under "studies:"
        super().__init__(prog, max_help_position=width + 2)
        self._action_max_length = width  # argparse measures subcommands 2 columns short of where it prints them

    def _split_lines(self, text, width):
        return [text] if text in self.study_lines else super()._split_lines(text, width)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``<prog>: error: <message>``), exit status 2."""

    deprecation_notes = None

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {driver.one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, with the deprecated flags' notes (:class:`~approxlab.studies.DeprecatedAlias`) printed
        after the command line is read, so that an error is the one line a refused command prints."""
        self.deprecation_notes = []
        try:
            parsed = super().parse_known_args(args, namespace)
            for note in self.deprecation_notes:
                print(note, file=sys.stderr)
            return parsed
        finally:
            self.deprecation_notes = None


def _add_study_options(sub, study) -> None:
    if study.options:
        group = sub.add_argument_group(f"{study.name} options (defaults: the full grid, or the --quick one)")
        for option in study.options:
            with_grid_default(option, study.full, study.quick).add_to(group)


def build_parser(study: str | None = None) -> argparse.ArgumentParser:
    """The ``approxlab`` parser; only ``study`` is loaded (for its options), every study when it is None."""
    parser = _Parser(
        prog="approxlab",
        usage="approxlab <study> [options]",
        description="Spectral-error studies of attention approximations.",
        epilog=f"`approxlab <study> --help` lists a study's options.\n"
               f"Results go to ./{RESULTS_FOLDER}/<study>/ unless --out names a folder.",
        formatter_class=_StudyList,
    )
    parser.add_argument("--version", action="version", version=f"approxlab {__version__}")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): the studies it registers are listed and can run")
    subparsers = parser.add_subparsers(dest="study", metavar="<study>", title="studies", required=True)
    lines = set()
    for name in registry.available():
        if study is not None and name != study:
            subparsers.add_parser(name, prog=f"approxlab {name}")
            continue
        description = registry.describe(name) if study is None else registry.get(name).description
        help_text = description or name + _NOT_AVAILABLE
        lines.add(help_text)
        sub = subparsers.add_parser(name, prog=f"approxlab {name}", help=help_text, description=description)
        if name == study:
            add_common(sub, name)
            _add_study_options(sub, registry.get(name))
            parser.study_parser = sub
    _StudyList.study_lines = frozenset(lines)
    return parser


@contextlib.contextmanager
def _study_context(args):
    """What a study runs in: the lock of ``--out`` (a second run into it stops there), an orderly
    stop on SIGTERM, its thread count, and no progress bar but approxlab's."""
    with driver.locked_output(args), driver.orderly_stop(), third_party_bars_off(), \
            study_threads(args.threads, local_workers=args.workers is not None):
        yield


def _without_plugins(argv) -> list[str]:
    """``argv`` less its ``--plugin MODULE`` options."""
    rest, skip = [], False
    for arg in argv:
        if skip or arg == "--plugin" or arg.startswith("--plugin="):
            skip = arg == "--plugin" and not skip
            continue
        rest.append(arg)
    return rest


def main(argv=None) -> int:
    """Entry point of the ``approxlab`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = _without_plugins(argv)
    study = next((a for a in rest if not a.startswith("-")), None)
    try:
        registry.load_plugins(argv)  # first: a plugin may register the study, or methods its options list
        if not rest:  # what there is to run, as with --help (the plugins' studies included)
            build_parser().print_help()
            return 0
        parser = build_parser(study if study in registry.available() else None)
    except StudyError as error:
        print(f"approxlab{'' if study is None else ' ' + study}: error: {' '.join(str(error).split())}",
              file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the study's name, like its other option errors
        parser.exit(2, f"approxlab {args.study}: error: unrecognized arguments: {' '.join(unknown)}\n")
    args.command = shlex.join(["approxlab", *argv])
    created = None
    try:
        check_option_pairs(args, parser.study_parser)
        driver.check_device(args.device)
        declared = registry.get(args.study)
        args.out = pathlib.Path(args.out) if args.out is not None else default_output_dir(args.study, quick=args.quick)
        args.threads, args.threads_source = requested_threads(args.threads)
        created = driver.missing_ancestor(args.out)
        check_output_dir(args.out, plot_only=args.plot_only)
        with _study_context(args):
            check_common(args)
            return driver.run(declared, args)
    except (StudyError, CorruptResultsError, FileNotFoundError, OSError) as error:
        message = driver.error_line(error, plot_only=args.plot_only, out=args.out, cache_dir=args.cache_dir)
        if message is None:  # not the user's environment: a bug in approxlab shows its traceback
            raise
        if created is not None:
            driver.discard_output(args.out, created)
        print(f"approxlab {args.study}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"{chr(10) if sys.stderr.isatty() else ''}approxlab {args.study}: stopped by "
              f"{signal.Signals(signum).name}; every finished cell is saved. Rerun the same command to resume.",
              file=sys.stderr)
        return 128 + int(signum)


if __name__ == "__main__":
    raise SystemExit(main())
