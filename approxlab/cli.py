"""``approxlab <study> [options]``: the command line of every study.

Subcommands are dispatched lazily from :data:`approxlab.studies.STUDIES`: only the
chosen study's module is imported, so a study that is missing (not written yet) or
fails to import does not break the others. A study module exposes

* ``add_arguments(parser)``: its own options (grid overrides, ...);
* ``run(args) -> int``: compute (resumable) and/or plot; the exit status.

Every study also gets the common options below (added here, before the study's own),
available on ``args`` as ``out`` (a ``pathlib.Path``, resolved before ``run``: ``--out``, else
``approxlab-results/<study>`` in the current directory, see
:func:`approxlab.studies.default_output_dir`), ``quick``, ``device``, ``data_dir``,
``cache_dir``, ``restart``, ``progress`` (False with ``--no-progress``), ``scheduler``,
``workers``, ``threads`` (resolved before ``run``: ``--threads``, else ``$OMP_NUM_THREADS``, else
``$MKL_NUM_THREADS``, else 1; torch runs with it here and in each local Dask worker, see
:mod:`approxlab.studies._threads`), ``threads_source`` (where that count came from:
``"--threads"``, ``"$OMP_NUM_THREADS"``, ``"$MKL_NUM_THREADS"`` or ``"default"``), ``plot_only``,
``plugin`` (modules imported before the study's options are built, here and in every Dask worker:
:func:`approxlab.methods.load_plugin`), plus ``study`` and ``command`` (the command line, for the
record in ``config.json``/``summary.md``).

``approxlab`` alone, like ``approxlab --help``, prints the studies, one line each, to stdout and
exits 0 (as ``pip`` does: asking what there is is not a mistake; exit status 2 stays reserved
for a command that cannot run). ``approxlab --version`` prints the installed version.

Errors a user can fix print one line on stderr and exit with status 2, in argparse's
form ``approxlab <study>: error: <what>: <what is allowed>, got <what came in>``:
bad option values (argparse, without its usage block), and every
:class:`approxlab.studies.runner.StudyError` (mismatched saved results, CUDA requested
but unavailable, a corpus or windows too small for ``--n``/``--windows``, an unwritable
or locked ``--out``, an unreachable ``--scheduler``; see :mod:`approxlab.studies._cli`).
So are damaged result files (:class:`~approxlab.errors.CorruptResultsError`), options that
contradict each other or are empty (``--out ""``, ``--plot-only`` with ``--restart`` or with a
grid option it would ignore), and the environment refusing a write (a full disk, a read-only
file system, a path too long: the ``OSError`` named, nothing half-written). A bug in approxlab
itself still shows its traceback. ``SIGINT`` (Ctrl-C) and ``SIGTERM`` stop the run in order:
the cells in flight are abandoned, every finished one is already on disk (see
:mod:`approxlab.studies.runner`), and the command exits 130 or 143 with a one-line note that
rerunning it resumes.

Before the study runs, ``--out`` (default: the study's folder) is created and locked
(:func:`approxlab._io.output_lock`): a second run into the same folder exits 2 at once,
naming the process that holds it. Progress goes to stderr: a tqdm bar on a terminal,
otherwise a line at every tenth of the cells (done/total, elapsed, estimated remaining); the bars
of transformers, huggingface_hub and datasets are off while a study runs
(:mod:`approxlab.studies._quiet`).

Examples
--------
::

    approxlab figure1 --quick              # -> approxlab-results/figure1-quick/
    approxlab figure1 --workers 2          # local Dask cluster, one thread per worker
    approxlab figure1 --out figures/figure1 --plot-only   # redraw the committed figure
    approxlab figure1 --quick --plugin my_attention --methods top-k,skyformer-softmax
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import shlex
import signal
import sys

from . import __version__
from .studies import RESULTS_FOLDER, STUDIES
from .studies import _cli, _quiet, _threads
from .errors import CorruptResultsError
from .studies.runner import StudyError

__all__ = ["main", "build_parser", "add_common_arguments", "check_device", "load_study"]

_DESCRIPTIONS = {
    "figure1": "Skyformer Figure 1: spectral-norm error of approximate attention outputs (BERT Q/K/V, Wikitext-2).",
    "sv-decay": "Singular-value decay of BERT attention matrices on Wikitext-2 (companion to Skyformer Appendix B).",
    "instability": "Instability score of the approximations (Skyformer Appendix F / Table 3).",
    "bench": "Time and memory benchmark of the approximations.",
    "lra-svd": "Singular values of a trained 2-layer model's attention output on generated LRA tasks (Skyformer Appendix B, Figure 4).",
    "decoder": "Causal approximations and the theorems' assumptions (HyperAttention alpha, kappa; Alman-Song B; sinks, rank) on SmolLM2.",
}
_NOT_AVAILABLE = " [not available]"


def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(STUDIES[name]) is not None
    except ModuleNotFoundError:
        return False


def load_study(name: str):
    """Import the module of study ``name``; :class:`StudyError` if it does not exist."""
    if name not in STUDIES:
        raise StudyError(f"unknown study {name!r}; available: {sorted(STUDIES)}.")
    module = STUDIES[name]
    if not _available(name):
        raise StudyError(f"study {name!r} is not available: module {module!r} does not exist (yet).")
    return importlib.import_module(module)


class _StudyList(argparse.RawDescriptionHelpFormatter):
    """argparse's help layout with one line per study (its description is not wrapped, its name
    not put on a line of its own) and the epilog as written."""

    def __init__(self, prog):
        width = 4 + max(map(len, STUDIES))  # a study's name, indented under "studies:"
        super().__init__(prog, max_help_position=width + 2)
        self._action_max_length = width  # argparse measures subcommands 2 columns short of where it prints them

    def _split_lines(self, text, width):
        study = text.removesuffix(_NOT_AVAILABLE) in _DESCRIPTIONS.values()
        return [text] if study else super()._split_lines(text, width)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``<prog>: error: <message>``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_cli.one_line(message)}\n")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options every study shares (see the module docstring)."""
    group = parser.add_argument_group("common study options")
    group.add_argument("--out", type=_cli.path_option, default=None, metavar="DIR",
                       help="output directory (results.csv, config.json, figures, summary.md); default: "
                            f"{RESULTS_FOLDER}/<study> in the current directory ({RESULTS_FOLDER}/<study>-quick "
                            "with --quick). The committed figures/<study> is written only when named here")
    group.add_argument("--quick", action="store_true", help="small grid for a smoke run (minutes)")
    group.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="device for the computation (default: cpu)")
    group.add_argument("--data-dir", type=_cli.path_option, default=None, metavar="DIR",
                       help="the corpus: a folder with wikitext-2-raw/wiki.test.raw, the file itself, or 'hf:wikitext' "
                            "to download it (default: $APPROXLAB_DATA, else the copy shipped with approxlab)")
    group.add_argument("--cache-dir", type=_cli.path_option, default=None, metavar="DIR",
                       help="cache for extracted Q/K/V (default: the data module's cache)")
    group.add_argument("--restart", action="store_true",
                       help="discard saved results in --out instead of resuming")
    group.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    group.add_argument("--plot-only", action="store_true",
                       help="do not compute: redraw the figure and summary from the saved CSV")
    group.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import MODULE (repeatable), which registers methods with approxlab.methods.register, "
                            "here and in every Dask worker; its methods can then be named in --methods")
    executor = group.add_mutually_exclusive_group()
    executor.add_argument("--scheduler", default=None, metavar="ADDRESS",
                          help="run cells on a Dask scheduler, e.g. tcp://host:8786")
    executor.add_argument("--workers", type=_cli.positive_int, default=None, metavar="N",
                          help="run cells on a local Dask cluster of N worker processes")
    group.add_argument("--threads", type=_cli.positive_int, default=None, metavar="N",
                       help="torch threads of this process and of each --workers process (default: "
                            f"$OMP_NUM_THREADS, else $MKL_NUM_THREADS, else {_threads.DEFAULT_THREADS}: "
                            "measured faster than a thread per core on a loaded 2-core machine)")


def build_parser(study: str | None = None) -> argparse.ArgumentParser:
    """The ``approxlab`` parser; only ``study``'s module is imported (for its options)."""
    parser = _Parser(
        prog="approxlab",
        usage="approxlab <study> [options]",
        description="Spectral-error studies of attention approximations.",
        epilog=f"`approxlab <study> --help` lists a study's options.\n"
               f"Results go to ./{RESULTS_FOLDER}/<study>/ unless --out names a folder.",
        formatter_class=_StudyList,
    )
    parser.add_argument("--version", action="version", version=f"approxlab {__version__}")
    subparsers = parser.add_subparsers(dest="study", metavar="<study>", title="studies", required=True)
    for name in STUDIES:
        available = name == study or _available(name)
        help_text = _DESCRIPTIONS.get(name, name) + ("" if available else _NOT_AVAILABLE)
        sub = subparsers.add_parser(name, prog=f"approxlab {name}", help=help_text,
                                    description=_DESCRIPTIONS.get(name))
        if name == study:
            add_common_arguments(sub)
            load_study(name).add_arguments(sub)
            parser.study_parser = sub
    return parser


def check_device(device: str) -> str:
    """Return ``device`` if usable; :class:`StudyError` (clear message) if CUDA is missing."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise StudyError(
                "--device cuda was requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}); use --device cpu."
            )
    return device


@contextlib.contextmanager
def _study_context(args):
    """What a study runs in: the lock of ``--out`` (a second run into it stops there), an orderly
    stop on SIGTERM, its thread count, and no progress bar but approxlab's."""
    with _cli.locked_output(args), _cli.orderly_stop(), _quiet.third_party_bars_off(), \
            _threads.study_threads(args.threads, local_workers=args.workers is not None):
        yield


def main(argv=None) -> int:
    """Entry point of the ``approxlab`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # what there is to run, as with --help
        build_parser().print_help()
        return 0
    study = next((a for a in argv if not a.startswith("-")), None)
    if study not in STUDIES:
        study = None
    try:
        _cli.load_plugins(argv)  # first: the study's options may list the plugins' methods
        parser = build_parser(study)
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
        _cli.check_option_pairs(args, parser.study_parser)
        check_device(args.device)
        module = load_study(args.study)
        args.out = _cli.output_dir(args)
        args.threads, args.threads_source = _threads.requested_threads(args.threads)
        created = _cli.missing_ancestor(args.out)
        _cli.check_output_dir(args.out, plot_only=args.plot_only)
        with _study_context(args):
            _cli.check_common(args)
            return int(module.run(args) or 0)
    except (StudyError, CorruptResultsError, FileNotFoundError, OSError) as error:
        message = _cli.error_line(error, plot_only=args.plot_only)
        if message is None:  # not the user's environment: a bug in approxlab shows its traceback
            raise
        if created is not None:
            _cli.discard_output(args.out, created)
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
