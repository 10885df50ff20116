"""The one run path of every study: config, checks, run record and timing, compute, report.

:func:`run` is what ``approxlab <study>`` does once the command line is parsed and checked
(:mod:`approxlab.cli`): unless ``--plot-only``, it builds the study's config from the options
(:attr:`~approxlab.studies.Study.configure`), runs the study's checks against the data and models,
computes every cell not yet saved (:func:`compute`, on :func:`~approxlab.studies.engine.run_steps`)
and records the run's wall time in ``timing.json``; then it writes the report from the saved files
only (:func:`~approxlab.studies.reporting.write_report`). A study declares none of this.

The command line around it: the lock of ``--out`` (:func:`locked_output`), an orderly stop on
``SIGINT``/``SIGTERM`` (:func:`orderly_stop`: the first signal unwinds through the runner, which
writes its tables; rerunning resumes), and one error line for what the user can fix (:func:`error_line`).

Public API::

    run(study, args) -> int
    compute(study, config, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None,
            workers=None, progress=True, restart=False, run_info=None, **settings) -> {table: DataFrame}
    report(study, out) -> list[pathlib.Path]
    locked_output(args), orderly_stop(), Stopped, error_line(error, plot_only=False, out=None, cache_dir=None)
    one_line(text), missing_ancestor(path), discard_output(out, created=None), check_device(device)
    saved_study(out) -> str | None, check_folder_study(study, out)
"""

from __future__ import annotations

import contextlib
import errno
import pathlib
import re
import sys
import time

from ..errors import CachePathError, CheckpointError, CorruptResultsError, StudyError, UsageError
from .checks import exists
from .engine import runner
from .engine.clock import Stopwatch
from .engine.keys import canonical, cell_key
from .engine.failures import failure_lines
from .engine.lock import LOCK_NAME, OutputLockedError, output_lock
from .engine.record import append_timing
from .engine.stopping import Stopped, orderly_stop
from .reporting.summary import write_report

__all__ = ["run", "compute", "report", "locked_output", "orderly_stop", "Stopped", "error_line", "one_line",
           "missing_ancestor", "discard_output", "check_device", "saved_study", "check_folder_study"]


def compute(study, config: dict, out, *, data_dir=None, cache_dir=None, device: str = "cpu", scheduler=None,
            workers=None, progress: bool = True, restart: bool = False, run_info: dict | None = None,
            **settings) -> dict:
    """Run (or resume) the cells of ``study`` for ``config`` into ``out``; return every table.

    ``settings``: the study's run settings (:attr:`~approxlab.studies.Study.settings`), handed with the
    data location and device to its steps' ``cells`` builders. See
    :func:`~approxlab.studies.engine.run_steps` for the rest.
    """
    settings = {"data_dir": None if data_dir is None else str(data_dir),
                "cache_dir": None if cache_dir is None else str(cache_dir), "device": device, **settings}
    steps = [(step, _checked_cells(study, step, step.cells(config, settings))) for step in study.steps]
    return runner.run_steps(steps, out, config=config, run_info=run_info, scheduler=scheduler, workers=workers,
                            progress=progress, flush_every_seconds=study.flush_every_seconds, restart=restart,
                            grows=study.grows)


def _who(study) -> str:
    return f"study {study.name!r} (defined in {_defined_in(study)})"


def _checked_cells(study, step, cells) -> list:
    """What ``step.cells`` returned, checked before any cell runs: a list of dicts, each holding the step's key
    columns; a study defined outside approxlab that gives one cell twice is named with that cell (a built-in
    study's grid comes from its options: the runner names the list option given twice)."""
    where = f"{_who(study)}: `cells` of the step writing {[table.name for table in step.tables]}"
    if not isinstance(cells, (list, tuple)) or not all(isinstance(cell, dict) for cell in cells):
        got = type(cells).__name__ if not isinstance(cells, (list, tuple)) else \
            next(type(cell).__name__ for cell in cells if not isinstance(cell, dict))
        raise StudyError(f"{where} must return a list of dicts; got {got}.")
    first = {}
    for index, cell in enumerate(cells):
        missing = [column for column in step.key if column not in cell]
        if missing:
            raise StudyError(f"{where} must give every cell the key columns {list(step.key)}; cell {index} lacks "
                             f"{missing} (it has {sorted(cell)}).")
        key = cell_key(cell, step.key)
        if key in first and not _built_in(study) and canonical(cell) == canonical(first[key]):
            shown = ", ".join(f"{column}={value!r}" for column, value in zip(step.key, key))
            raise StudyError(f"{where} must give each cell once; got the cell ({shown}) twice.")
        first.setdefault(key, cell)
    return list(cells)


def report(study, out) -> list[pathlib.Path]:
    """Write the report of ``study`` (derived tables, figures, summary) from the saved files in ``out``."""
    return write_report(study, out)


def _check_executor(study, args) -> None:
    """``--scheduler``, ``--workers`` and ``--device`` where the study runs (:attr:`~approxlab.studies.Study.executors`)."""
    note = f": {study.executor_note}" if study.executor_note else ""
    for kind, option, value in (("scheduler", "--scheduler", getattr(args, "scheduler", None)),
                                ("local", "--workers", getattr(args, "workers", None))):
        if value is not None and kind not in study.executors:
            raise UsageError(option, f"not with this study{note}", repr(value))
    if args.device not in study.devices:
        raise UsageError("--device", f"{' or '.join(study.devices)} (where {study.name} runs)", repr(args.device))


def _run_info(study, args, config) -> dict:
    import torch

    info = {"study": study.name, "command": getattr(args, "command", f"approxlab {study.name}"), "device": args.device,
            "scheduler": getattr(args, "scheduler", None), "workers": getattr(args, "workers", None),
            "torch": torch.__version__, "threads": torch.get_num_threads()}
    return {**info, **(study.run_info(args, config) if study.run_info is not None else {})}


def _defined_in(study) -> str:
    """The module that defines the cells of ``study``."""
    return getattr(study.steps[0].compute, "__module__", None) or "?"


def _built_in(study) -> bool:
    """Whether ``study`` is approxlab's own (its cells are computed by approxlab's code)."""
    module = _defined_in(study)
    return module == "approxlab" or module.startswith("approxlab.")


def saved_study(out) -> str | None:
    """The study whose results ``out`` holds, as its ``config.json`` names it (the run's ``study``, else the
    config's); None without a readable one."""
    from .engine.store import read_json

    path = pathlib.Path(out) / "config.json"
    try:
        record = read_json(path) if path.is_file() else {}
    except (CorruptResultsError, OSError):
        return None  # the runner and the report refuse it, naming what is wrong
    named = [part.get("study") for part in (record.get("run"), record.get("config")) if isinstance(part, dict)]
    return next((name for name in named if isinstance(name, str) and name), None)


def check_folder_study(study, out) -> None:
    """``out`` holds no results of another study (its ``config.json`` names the study; a folder without one
    passes): with ``--plot-only`` the report would read another study's tables, and a run (even with
    ``--restart``, which discards only this study's tables) would mix two studies' files in one folder."""
    other = saved_study(out)
    if other is not None and other != study.name:
        raise UsageError("--out", f"a folder of {study.name} results, or a new one",
                         f"{str(out)!r} (its config.json is of the study {other!r}: `approxlab {other} --out "
                         f"{out} --plot-only` redraws it)")


def run(study, args) -> int:
    """``approxlab <study>``: compute (resumable) unless ``--plot-only``, then write the report; exit status 0.

    A folder of another study is refused first (:func:`check_folder_study`). After computing, each
    method whose rows failed (a ``status`` other than ``"ok"``) gets one line on stderr. Cells or rows
    the runner cannot use (:class:`~approxlab.studies.engine.runner.CellResultError`) are a one-line
    :class:`~approxlab.errors.StudyError` naming a study defined outside approxlab (a plugin's), and keep
    their traceback for a built-in study (a bug of approxlab).
    """
    _check_executor(study, args)
    out = pathlib.Path(args.out)
    check_folder_study(study, out)
    if not args.plot_only:
        config = study.configure(args)
        if not isinstance(config, dict):
            got = "None" if config is None else type(config).__name__
            raise StudyError(f"{_who(study)}: `configure` must return the config, a dict; got {got}.")
        if study.check is not None:
            study.check(args, config)
        info = _run_info(study, args, config)
        settings = study.settings(args) if study.settings is not None else {}
        watch = Stopwatch()
        try:
            tables = compute(study, config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                             scheduler=getattr(args, "scheduler", None), workers=getattr(args, "workers", None),
                             progress=args.progress, restart=args.restart, run_info=info, **settings)
        except runner.CellResultError as error:
            if _built_in(study):
                raise  # a bug of approxlab: its traceback
            raise StudyError(f"the study {study.name!r} (defined in {_defined_in(study)}) returned what the runner "
                             f"cannot use: {error}") from None
        seconds = watch.seconds()
        for line in failure_lines(tables):
            print(f"approxlab {study.name}: {line}", file=sys.stderr)
        append_timing(out, {"command": info["command"], "wall_seconds": round(seconds, 1),
                            "workers": info["workers"], "threads": info["threads"],
                            "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        print(f"{study.name}: computed in {seconds:.1f} s -> {out}")
    for path in report(study, out):
        print(f"{study.name}: wrote {path}")
    return 0


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


ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                      errno.EIO, errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.EMFILE, errno.ENFILE, errno.ENOENT}
"""``OSError`` numbers that describe the machine (a full disk, a read-only or unreachable path), not
approxlab: reported as one error line. Any other ``OSError`` shows its traceback."""


def _where(filename, out=None, cache_dir=None) -> str:
    """``'<file>'`` and the option whose folder holds it (``--out``, ``--cache-dir``), or ``--out`` alone."""
    folders = [(option, pathlib.Path(folder)) for option, folder in (("--out", out), ("--cache-dir", cache_dir))
               if folder is not None]
    if filename is None:
        return "".join(f" files of {option} {str(folder)!r}" for option, folder in folders[:1])
    path = pathlib.Path(str(filename))
    if any(path == folder for _, folder in folders):
        return next(f" {option} {str(folder)!r}" for option, folder in folders if path == folder)
    inside = next((f" (in {option} {str(folder)!r})" for option, folder in folders if folder in path.parents), "")
    return f" {str(filename)!r}{inside}"


def error_line(error: BaseException, *, plot_only: bool = False, out=None, cache_dir=None) -> str | None:
    """The one-line message of an error the user can act on, or None for a bug (shown with its traceback).

    ``out``, ``cache_dir``: the run's ``--out`` and ``--cache-dir``, named in the message of a write the
    environment refused (a full disk) beside the file, or instead of it when the error names none.
    """
    if isinstance(error, (StudyError, CheckpointError, CachePathError)) or (
            isinstance(error, FileNotFoundError) and error.filename is None):
        return one_line(error)  # approxlab's own message (a missing results table, a folder as a cache file ...)
    if isinstance(error, CorruptResultsError):
        remedy = ("rerun without --plot-only to resume (damaged tables are refused) or with --restart to start over"
                  if plot_only else "pass --restart to discard the saved results, or a new --out directory")
        return one_line(f"{error}; {remedy}")
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS:
        where = _where(error.filename, out, cache_dir)
        name = errno.errorcode.get(error.errno, str(error.errno))
        return (f"cannot write or read{where}: {error.strerror or error} ({name}); every cell finished before it "
                "is saved, nothing is half-written. Fix this and rerun the same command to resume.")
    return None


def one_line(text: str) -> str:
    """``text`` with its line breaks (and the blanks around them) made single spaces."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


@contextlib.contextmanager
def locked_output(args):
    """Hold the lock of ``args.out`` (:func:`approxlab.studies.engine.output_lock`); a held lock is a :class:`UsageError`.

    With ``--plot-only`` and no such folder there is nothing to lock (the study reports it).
    """
    if args.plot_only and not pathlib.Path(args.out).is_dir():
        yield
        return
    try:
        with output_lock(args.out, command=getattr(args, "command", None)) as removed:
            for path in removed:
                print(f"approxlab: removed {path.name}, a temporary file left by an interrupted run",
                      file=sys.stderr)
            yield
    except OutputLockedError as error:
        raise UsageError("--out", "a folder no other run is writing to",
                         f"{str(args.out)!r} (locked by {error.describe_owner()})") from None


def missing_ancestor(path) -> pathlib.Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet; None if ``path`` exists."""
    path = pathlib.Path(path)
    missing = None
    for folder in (path, *path.parents):
        if exists(folder):
            break
        missing = folder
    return missing


def discard_output(out, created=None) -> None:
    """Remove ``out`` if it holds nothing but its lock file (a run refused before writing anything),
    then its parents up to ``created`` (:func:`missing_ancestor` before the run) that are left empty."""
    out = pathlib.Path(out)
    if exists(out) and out.is_dir() and {p.name for p in out.iterdir()} <= {LOCK_NAME}:
        (out / LOCK_NAME).unlink(missing_ok=True)
        out.rmdir()
    if created is None or not (out == pathlib.Path(created) or pathlib.Path(created) in out.parents):
        return
    for folder in out.parents:
        if folder == pathlib.Path(created).parent or not exists(folder) or any(folder.iterdir()):
            break
        folder.rmdir()
